"""``datasets.GeoSegmentation``: semantic segmentation patches from an image product and a label product.

The recipe behind ``pipekit demo``, written so a user swaps in their own
products::

    images & labels            an IntersectionDataset: where both have data, reprojected to the images' CRS
    -> sampler                 RandomGeoSampler (train) | GridGeoSampler (eval), as a resumable pipe
    -> sharding_filter         each patch to one DataLoader worker / distributed rank
    -> read_geo                {"image": float32 [C, H, W], "mask": int64 [H, W], "crs", "bounds", "transform"}
    -> classes                 raw label values -> 0..n-1 (optional)
    -> spectral indices        appended as channels (NDVI from the product's red and NIR bands...)
    -> normalize               per channel (optional; stats="auto" computes them)
    -> augment                 flips and 90-degree rotations of image and mask together (train)
    -> batch + stack_samples   {"image": [B, C, H, W], "mask": int64 [B, H, W], "crs": [...], ...}

Spectral indices are given by name (``indices=("ndvi", "ndwi")``); the bands
they need are found from the image product (Landsat 8/9 NDVI is
``(SR_B5 - SR_B4) / (SR_B5 + SR_B4)``, Landsat 7's ``(SR_B4 - SR_B3) / ...``,
Sentinel-2's ``(B08 - B04) / ...``) or from ``band_roles=`` for other products.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

import pipekit.pipes  # noqa: F401  (registers the functional names used below; pipekit.geo registers read_geo)
from pipekit._validate import check_callable
from pipekit.datasets._landsat import Landsat7, Landsat8
from pipekit.datasets._naip import NAIP
from pipekit.datasets._recipe import Recipe, check_positive_int, check_stage
from pipekit.datasets._sentinel2 import Sentinel2
from pipekit.geo._base import GeoDataset
from pipekit.geo._collate import stack_samples
from pipekit.geo._composition import IntersectionDataset, UnionDataset
from pipekit.geo._raster import RasterDataset
from pipekit.geo.samplers import BatchGeoSampler, GeoSampler, GridGeoSampler, RandomGeoSampler
from pipekit.pipes.base import IterDataPipe
from pipekit.transforms._normalize import Normalize
from pipekit.transforms._spectral import AppendIndex
from pipekit.transforms._stats import BandStats, compute_stats
from pipekit.transforms.indices import INDICES

__all__ = ["GeoSegmentation", "BAND_ROLES", "INDEX_ROLE_ALIASES", "MapClasses"]

#: The band playing each spectral role, per product (the roles of :data:`pipekit.transforms.indices.INDICES`).
BAND_ROLES: dict[type, dict[str, str]] = {
    Landsat8: {"coastal": "SR_B1", "blue": "SR_B2", "green": "SR_B3", "red": "SR_B4", "nir": "SR_B5",
               "swir": "SR_B6", "swir1": "SR_B6", "swir2": "SR_B7"},
    Landsat7: {"blue": "SR_B1", "green": "SR_B2", "red": "SR_B3", "nir": "SR_B4", "swir": "SR_B5",
               "swir1": "SR_B5", "swir2": "SR_B7"},
    Sentinel2: {"coastal": "B01", "blue": "B02", "green": "B03", "red": "B04", "vre1": "B05", "vre2": "B06",
                "vre3": "B07", "nir": "B08", "nir_narrow": "B8A", "swir": "B11", "swir1": "B11", "swir2": "B12"},
    NAIP: {"red": "R", "green": "G", "blue": "B", "nir": "NIR"},
}

#: Index roles read from another role of :data:`BAND_ROLES`: the burn ratio's "swir" is SWIR 2
#: (``mndwi``, ``ndbi`` and ``ndsi`` use SWIR 1, the plain ``"swir"`` role).
INDEX_ROLE_ALIASES: dict[str, dict[str, str]] = {"nbr": {"swir": "swir2"}}


def _first_raster(ds: GeoDataset) -> RasterDataset | None:
    if isinstance(ds, RasterDataset):
        return ds
    for child in getattr(ds, "datasets", ()):
        found = _first_raster(child)
        if found is not None:
            return found
    return None


def _first_mask_raster(ds: GeoDataset) -> RasterDataset | None:
    if isinstance(ds, RasterDataset):
        return None if ds.is_image else ds
    for child in getattr(ds, "datasets", ()):
        found = _first_mask_raster(child)
        if found is not None:
            return found
    return None


def _image_bands(ds: GeoDataset) -> list[Any]:
    """The names (or 1-based numbers) of the channels of ``ds``'s ``"image"``, in order."""
    if isinstance(ds, RasterDataset):
        return list(ds.bands) if ds.is_image else []
    if isinstance(ds, UnionDataset):
        return _image_bands(ds.datasets[0])
    if isinstance(ds, IntersectionDataset):
        return _image_bands(ds.datasets[0]) + _image_bands(ds.datasets[1])
    return list(getattr(ds, "bands", []) or [])


def _product_roles(ds: GeoDataset) -> dict[str, str]:
    raster = _first_raster(ds)
    if raster is None:
        return {}
    own = getattr(type(raster), "band_roles", None)
    if isinstance(own, Mapping):
        return dict(own)
    for product, roles in BAND_ROLES.items():
        if isinstance(raster, product):
            return dict(roles)
    return {}


class MapClasses:
    """Map the raw values of ``sample["mask"]`` to labels ``0..n-1``: ``classes[i] -> i``, anything else -> 0.

    ``classes[0]`` is the background, which takes every value not listed.

    Example:
        >>> import torch
        >>> from pipekit.datasets._geosegmentation import MapClasses
        >>> MapClasses([0, 1, 5, 176])({"mask": torch.tensor([[1, 5], [176, 24]])})["mask"].tolist()
        [[1, 2], [3, 0]]
    """

    def __init__(self, classes: Sequence[int]) -> None:
        if isinstance(classes, (str, bytes)) or not isinstance(classes, Sequence) or not classes:
            raise TypeError(f"GeoSegmentation: classes must be a non-empty list of label values, got {classes!r}")
        bad = [c for c in classes if isinstance(c, bool) or not isinstance(c, numbers.Integral) or c < 0]
        if bad:
            raise ValueError(f"GeoSegmentation: classes must be non-negative ints, got {bad}")
        if len(set(classes)) != len(classes):
            raise ValueError(f"GeoSegmentation: classes must not repeat, got {list(classes)}")
        self.classes = [int(c) for c in classes]
        lut = torch.zeros(max(self.classes) + 1, dtype=torch.long)
        for label, value in enumerate(self.classes):
            lut[value] = label
        self.lut = lut

    def __call__(self, sample: Mapping[str, Any]) -> dict[str, Any]:
        mask = sample["mask"]
        lut = self.lut.to(mask.device)
        inside = (mask >= 0) & (mask < len(lut))
        mapped = torch.where(inside, lut[mask.long().clamp(0, len(lut) - 1)], torch.zeros((), dtype=torch.long))
        return {**sample, "mask": mapped}

    def __repr__(self) -> str:
        return f"MapClasses({self.classes})"


def _default_augment() -> list[Any]:
    from torchvision.transforms import v2

    from pipekit.transforms._augment import RandomRot90

    return [v2.RandomHorizontalFlip(), v2.RandomVerticalFlip(), RandomRot90()]


class GeoSegmentation(Recipe):
    """Segmentation batches from ``images & labels``: sampled patches, spectral indices, augmentation.

    Args:
        images: the image product, e.g. ``datasets.Landsat8(root)`` (any geo
            dataset whose samples hold ``"image"``; unions and intersections
            of image products too).
        labels: the label product, e.g. ``datasets.CDL(root)`` (samples hold
            ``"mask"``), reprojected on the fly to the images' grid.  ``None``
            when ``images`` already yields both ``"image"`` and ``"mask"``.
        size: patch side in pixels (or ``(height, width)``).
        length: training: patches per epoch (default: as many as tile the
            data); evaluation: read only the first ``length`` grid patches.
        batch_size: patches per batch; ``None`` yields samples.
        train: ``RandomGeoSampler`` and augmentation (training) or
            ``GridGeoSampler`` without augmentation (evaluation).
        indices: spectral indices appended as channels, in order: names
            (``"ndvi"``, ``"ndwi"``, ``"evi"``...; see
            :data:`pipekit.transforms.indices.INDICES`) or ready
            :class:`~pipekit.transforms.AppendIndex` objects.  The bands of a
            named index come from the product (:data:`BAND_ROLES`) or ``band_roles``
            (roles as in :data:`~pipekit.transforms.indices.INDICES`; ``nbr``
            reads its SWIR band from the ``"swir2"`` role).
        augment: ``True``: random horizontal and vertical flips and 90-degree
            rotations, of image and mask together; ``False``: none; or
            transforms for :class:`~pipekit.transforms.Augment`.  Training only.
        classes: raw label values to keep, mapped to labels ``0..n-1`` in
            that order; any other value becomes label 0, so ``classes[0]`` is
            the background (see :class:`MapClasses`).  ``None`` keeps the
            label product's values.  With a :class:`~pipekit.datasets.CDL`,
            whose masks hold ordinal labels, these are CDL codes (looked up
            with ``CDL.labels_of``); ``CDL(classes=...)`` does the same alone.
        stats: normalisation of every channel (indices included): ``None``
            (none), ``"auto"`` (computed now from ``stats_samples`` random
            patches), a :class:`~pipekit.transforms.BandStats` (e.g. a
            training recipe's :attr:`stats`), a
            :class:`~pipekit.transforms.Normalize` or ``(mean, std)``.
        stride: the evaluation grid's stride (default ``size``).
        roi, toi: region / time of interest of the sampler (e.g. distinct
            regions for training and evaluation).
        sampler: replaces the sampler: a :class:`~pipekit.geo.GeoSampler`, or
            a function ``dataset -> GeoSampler`` given ``images & labels``.
        band_roles: ``{role: band name}`` for the indices (``{"nir": "B8",
            "red": "B4"}``), over the product's own.
        stats_samples: patches read to compute ``stats="auto"``.
        transform: a picklable callable ``sample -> sample`` run on each
            sample after augmentation.
        collate_fn: replaces :func:`~pipekit.geo.stack_samples`.
        drop_last: drop each worker's last, shorter batch.
        on_error: ``"raise"`` or ``"skip"`` unreadable patches (recorded in
            the ``read_geo`` pipe's ``skip_log``).

    Attributes:
        dataset: ``images & labels``.
        sampler: the geo sampler.
        bands: the names of the output channels (the image bands, then the indices).
        in_channels: ``len(bands)``.
        num_classes: ``len(classes)``, or the label product's class count
            when it maps classes itself (e.g. ``CDL``: ``len(cdl.classes)``,
            134 by default), else ``None``.
        class_names: names of the labels where known (``None`` otherwise).
        stats: the :class:`~pipekit.transforms.BandStats` used (``stats="auto"``
            or given), for the evaluation recipe.

    Raises:
        ValueError: an index needs a band the images do not have (names the
            index, the band and the bands there are), the products do not
            intersect, or the samples lack ``"image"`` or ``"mask"``.

    Example:
        >>> import tempfile
        >>> import torch
        >>> from pipekit import datasets
        >>> from pipekit.synthetic.geo import write_landsat_cdl_corpus
        >>> root = write_landsat_cdl_corpus(tempfile.mkdtemp(), size=256, scenes=1, progress=False)
        >>> images = datasets.Landsat8(root / "landsat8")
        >>> labels = datasets.CDL(root / "cdl")
        >>> train = datasets.GeoSegmentation(images, labels, size=64, length=8, batch_size=4,
        ...                                  classes=[0, 1, 5, 24, 111, 122, 141, 176])
        >>> train.bands[-1], train.in_channels, train.num_classes
        ('ndvi', 8, 8)
        >>> _ = torch.manual_seed(0)
        >>> batch = next(iter(train))
        >>> batch["image"].shape, batch["mask"].shape, batch["mask"].dtype
        (torch.Size([4, 8, 64, 64]), torch.Size([4, 64, 64]), torch.int64)
        >>> bool(batch["image"][:, -1].abs().max() <= 1)  # NDVI
        True
    """

    def __init__(
        self,
        images: GeoDataset,
        labels: GeoDataset | None,
        *,
        size: int | tuple[int, int] = 256,
        length: int | None = None,
        batch_size: int | None = 16,
        train: bool = True,
        indices: Sequence[str | AppendIndex] = ("ndvi",),
        augment: bool | Any = True,
        classes: Sequence[int] | None = None,
        stats: str | BandStats | Normalize | tuple[Sequence[float], Sequence[float]] | None = None,
        stride: int | tuple[int, int] | None = None,
        roi: Any = None,
        toi: Any = None,
        sampler: GeoSampler | Callable[[GeoDataset], GeoSampler] | None = None,
        band_roles: Mapping[str, Any] | None = None,
        stats_samples: int = 64,
        transform: Callable[[Any], Any] | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        drop_last: bool = False,
        on_error: str = "raise",
    ) -> None:
        super().__init__()
        where = "GeoSegmentation"
        if not isinstance(images, GeoDataset):
            raise TypeError(f"{where}: images must be a geo dataset (e.g. datasets.Landsat8(root)), "
                            f"got {type(images).__name__}")
        if labels is not None and not isinstance(labels, GeoDataset):
            raise TypeError(f"{where}: labels must be a geo dataset (e.g. datasets.CDL(root)) or None, "
                            f"got {type(labels).__name__}")
        batch_size = check_positive_int(batch_size, "batch_size", where, allow_none=True)
        length = check_positive_int(length, "length", where, allow_none=True)
        stats_samples = check_positive_int(stats_samples, "stats_samples", where)
        check_stage(transform, "transform", where)
        if transform is False:
            transform = None
        check_callable(collate_fn, "collate_fn", where)
        if isinstance(indices, (str, AppendIndex)):
            indices = (indices,)
        if indices is None:
            indices = ()

        self.train = bool(train)
        self.batch_size = batch_size
        self.dataset: GeoDataset = images if labels is None else images & labels
        layers = self.dataset._layers()
        missing = [key for key in ("image", "mask") if key not in layers]
        if missing:
            raise ValueError(
                f"{where}: the samples of {self.dataset.name} have no {' or '.join(repr(k) for k in missing)} "
                f"(they hold {sorted(layers)}); images must be an image product and labels a mask product"
            )

        # -- channels: the image bands, then the indices (bands resolved now, so a missing one fails here)
        band_names = _image_bands(images)
        if len(band_names) != layers["image"]:
            band_names = [f"band{i + 1}" for i in range(layers["image"])]
        roles = _product_roles(images)
        if band_roles is not None:
            if not isinstance(band_roles, Mapping):
                raise TypeError(f"{where}: band_roles must be a dict {{role: band}}, got {band_roles!r}")
            roles.update(band_roles)
        appenders = [self._index(spec, band_names, roles, images) for spec in indices]
        self.bands: list[Any] = [*band_names, *(a.name for a in appenders)]
        self.in_channels = len(self.bands)

        # -- labels
        self.classes = None if classes is None else MapClasses(classes).classes
        # a product mapping its codes to labels (CDL) says which label each code of classes= became
        labels_of = getattr(_first_mask_raster(labels if labels is not None else images), "labels_of", None)
        self._mask_classes = labels_of(self.classes) if labels_of is not None and self.classes else self.classes
        self.num_classes, self.class_names = self._describe_classes(labels if labels is not None else images)

        # -- sampler
        if sampler is None:
            if self.train:
                self.sampler: GeoSampler = RandomGeoSampler(self.dataset, size, length=length, roi=roi, toi=toi)
            else:
                self.sampler = GridGeoSampler(self.dataset, size, stride=stride, roi=roi, toi=toi)
        else:
            built = sampler if isinstance(sampler, GeoSampler) else sampler(self.dataset) if callable(sampler) else None
            if not isinstance(built, GeoSampler):
                raise TypeError(f"{where}: sampler must be a GeoSampler or a function dataset -> GeoSampler, "
                                f"got {sampler!r}")
            self.sampler = built
        if isinstance(self.sampler, BatchGeoSampler):
            raise TypeError(f"{where}: sampler must yield single boxes, not batches "
                            f"({type(self.sampler).__name__}); batching is the recipe's batch_size")
        if len(self.sampler) == 0:  # a sampler yields nothing where TorchGeo's does; a recipe has nothing to train on
            raise ValueError(f"{where}: {self.sampler.empty_reason or 'the sampler yields no patch'}")

        def read(pipe: IterDataPipe) -> IterDataPipe:
            pipe = pipe.sharding_filter().read_geo(self.dataset, on_error=on_error)
            if self._mask_classes is not None:
                pipe = pipe.map(MapClasses(self._mask_classes))
            for appender in appenders:
                pipe = pipe.append_index(appender)
            return pipe

        # -- normalisation
        self.stats: BandStats | None = None
        normalize: Normalize | None = None
        if isinstance(stats, str):
            if stats != "auto":
                raise ValueError(f"{where}: stats must be None, 'auto', BandStats, Normalize or (mean, std), "
                                 f"got {stats!r}")
            probe = RandomGeoSampler(self.dataset, size, length=stats_samples, roi=roi, toi=toi, seed=0)
            self.stats = compute_stats(read(probe.as_pipe()), num_samples=stats_samples, progress=False)
            normalize = self.stats.normalize()
        elif isinstance(stats, BandStats):
            self.stats = stats
            normalize = stats.normalize()
        elif isinstance(stats, Normalize):
            normalize = stats
        elif stats is not None:
            try:
                mean, std = stats
            except (TypeError, ValueError):
                raise TypeError(f"{where}: stats must be None, 'auto', BandStats, Normalize or (mean, std), "
                                f"got {stats!r}") from None
            normalize = Normalize(mean, std)
        if normalize is not None:
            count = max(len(normalize.mean), len(normalize.std))
            if count not in (1, self.in_channels):
                raise ValueError(
                    f"{where}: stats have {count} channels but the samples have {self.in_channels} "
                    f"({self.bands})"
                )

        # -- the chain
        source: IterDataPipe = self.sampler.as_pipe()
        self._eval_length = None if self.train else length
        if not self.train and length is not None:
            source = source.header(length)
        pipe = read(source)
        if normalize is not None:
            pipe = pipe.normalize(normalize)
        if self.train and augment is not False and augment is not None:
            pipe = pipe.augment(_default_augment() if augment is True else augment)
        if transform is not None:
            pipe = pipe.map(transform)
        if batch_size is not None:
            pipe = pipe.batch(batch_size, drop_last=drop_last).collate(collate_fn=collate_fn or stack_samples)
        self.source_datapipe = pipe

    @staticmethod
    def _index(spec: str | AppendIndex, band_names: list[Any], roles: Mapping[str, Any],
               images: GeoDataset) -> AppendIndex:
        where = "GeoSegmentation"
        if isinstance(spec, AppendIndex):
            return spec
        if not isinstance(spec, str):
            raise TypeError(f"{where}: indices must be index names or AppendIndex objects, got {spec!r}")
        name = spec.strip().lower()
        if name not in INDICES:
            raise ValueError(f"{where}: unknown index {spec!r}; known indices: {', '.join(sorted(INDICES))}")
        positions: dict[str, int] = {}
        for role in INDICES[name].roles:
            key = INDEX_ROLE_ALIASES.get(name, {}).get(role, role)
            if key not in roles:
                raise ValueError(
                    f"{where}: index {name!r} needs a {key!r} band, and which band of {images.name} that is "
                    f"is not known; pass band_roles={{{key!r}: <band name or 0-based position>}}"
                )
            band = roles[key]
            if isinstance(band, numbers.Integral) and not isinstance(band, bool):
                if not 0 <= int(band) < len(band_names):
                    raise ValueError(f"{where}: index {name!r}: {role} band position {band} is out of range "
                                     f"(the images have {len(band_names)} bands)")
                positions[role] = int(band)
            elif band in band_names:
                positions[role] = band_names.index(band)
            else:
                raise ValueError(
                    f"{where}: index {name!r} needs band {band!r} ({role}), but {images.name} reads bands "
                    f"{band_names}; add it to the product's bands="
                )
        return AppendIndex(name, **positions)

    def _describe_classes(self, labels: GeoDataset) -> tuple[int | None, list[str] | None]:
        raster = _first_mask_raster(labels)
        names_map = getattr(raster, "class_names", None) if raster is not None else None
        if self.classes is not None:
            names = [str(names_map.get(v, c)) if isinstance(names_map, Mapping) else str(c)
                     for c, v in zip(self.classes, self._mask_classes)]
            return len(self.classes), names
        own = getattr(raster, "classes", None)
        if isinstance(own, list) and own and isinstance(names_map, Mapping) and getattr(raster, "ordinal", True):
            return len(own), [str(names_map.get(i, i)) for i in range(len(own))]
        return None, None

    def __repr__(self) -> str:
        mode = "train" if self.train else "eval"
        patches = len(self.sampler) if self._eval_length is None else min(self._eval_length, len(self.sampler))
        return (f"GeoSegmentation({self.dataset.name}, {mode}, {patches} patches, "
                f"channels={self.bands}, batch_size={self.batch_size})")

    __str__ = __repr__
