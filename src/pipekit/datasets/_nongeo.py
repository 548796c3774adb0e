"""Datasets of pre-cut chips: TorchGeo 0.8's ``NonGeoDataset`` and ``NonGeoClassificationDataset``.

Many benchmarks ship as chips rather than scenes: EuroSAT-style class
folders of multispectral GeoTIFFs, PNG or JPEG tiles.  These classes are
map-style ``torch.utils.data.Dataset``s with TorchGeo's interface (samples
``{"image": float32 [C, H, W], "label": int64 []}``, ``transforms=`` applied
to the sample dict, ``loader=`` / ``is_valid_file=`` as torchvision's
``ImageFolder``), on a local disk or any fsspec URL (``s3://bucket/eurosat``
with ``storage_options``), plus pipekit's additions:

* ``bands=``: select bands by name (the class's :attr:`all_band_names`, or
  ``band_names=``) or by index; any band count;
* :meth:`NonGeoDataset.pipe`: the same dataset as a pipe for
  :class:`pipekit.DataLoader` (a :class:`ChipRecipe`): indices shuffled as a
  whole per epoch, sharded between workers, read, batched, with exact
  mid-epoch resume (a checkpoint holds the epoch's seed and position) and
  ``on_error="skip"`` counting unreadable chips.

Reading (the default loader) goes through pipekit's decoders: a TIFF/GeoTIFF
by its signature with :func:`pipekit.decoders.decode_tiff` (rasterio; every
band, any dtype), anything else with
:func:`pipekit.decoders.decode_image_bytes` (the file's own channels: a gray
PNG gives one channel, where TorchGeo's PIL loader converts to RGB).  A chip
that cannot be read raises :class:`~pipekit.errors.ReadError`, one that cannot
be decoded :class:`~pipekit.errors.DecodeError`, naming the file.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

import pipekit.pipes  # noqa: F401  (registers the functional names used below)
from pipekit._fs import list_class_folders, local_path
from pipekit._validate import check_callable
from pipekit.collate import collate
from pipekit.datasets._recipe import ListSource, Recipe, check_positive_int
from pipekit.decoders import decode_image_bytes, decode_tiff
from pipekit.errors import DatasetNotFoundError, DecodeError, ReadError, SkipLog, StageError, check_on_error
from pipekit.pipes.base import IterDataPipe

__all__ = ["NonGeoDataset", "NonGeoClassificationDataset", "ChipRecipe", "CHIP_EXTENSIONS", "read_chip",
           "resolve_bands", "select_bands"]

#: file extensions read as chips by default (compared case-insensitively): torchvision's
#: ``IMG_EXTENSIONS`` and ``.tif``/``.tiff`` GeoTIFFs.
CHIP_EXTENSIONS = (".tif", ".tiff", ".png", ".jpg", ".jpeg", ".ppm", ".bmp", ".pgm", ".webp")

_TIFF_SIGNATURES = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")


def _read_bytes(url: str, storage_options: Mapping[str, Any], stage: str) -> bytes:
    try:
        path = local_path(url)
        if path is not None:
            with open(path, "rb") as f:
                return f.read()
        import fsspec

        with fsspec.open(url, "rb", **storage_options) as f:
            return f.read()
    except Exception as exc:
        raise ReadError("read", url, stage, f"{type(exc).__name__}: {exc}") from exc


def read_chip(
    url: str, storage_options: Mapping[str, Any] | None = None, stage: str = "read_chip"
) -> torch.Tensor:
    """Read one chip (GeoTIFF, PNG, JPEG...) into a float32 ``[C, H, W]`` tensor, every band.

    TIFFs (recognised by their signature, not their name) are read with
    rasterio through :func:`pipekit.decoders.decode_tiff`, other images with
    :func:`pipekit.decoders.decode_image_bytes` (the file's own channels).

    Args:
        url: a local path or any fsspec URL.
        storage_options: fsspec options for remote URLs.
        stage: the stage named in error messages.

    Raises:
        ReadError: the file cannot be opened or read.
        DecodeError: the bytes are not a readable image.

    Example:
        >>> import os, tempfile
        >>> import numpy as np
        >>> from PIL import Image
        >>> path = os.path.join(tempfile.mkdtemp(), "chip.png")
        >>> Image.fromarray(np.full((4, 5), 7, dtype=np.uint8)).save(path)
        >>> chip = read_chip(path)
        >>> chip.shape, chip.dtype, chip.max().item()
        (torch.Size([1, 4, 5]), torch.float32, 7.0)
    """
    data = _read_bytes(url, storage_options or {}, stage)
    if data[:4] in _TIFF_SIGNATURES:
        try:
            image = decode_tiff(data)
        except Exception as exc:
            raise DecodeError("decode TIFF", url, stage, f"{type(exc).__name__}: {exc}") from exc
    else:
        image = decode_image_bytes(data, url=url, stage=stage)
    return image.to(torch.float32)


def _loaded_to_tensor(value: Any, url: str, stage: str) -> torch.Tensor:
    """A custom loader's result (TorchGeo's convention: PIL image or ``[H, W(, C)]`` array) as float32 CHW."""
    if isinstance(value, torch.Tensor):
        array = value.numpy()
    else:
        array = np.asarray(value)
    if array.ndim == 2:
        array = array[:, :, None]
    if array.ndim != 3:
        raise DecodeError("load", url, stage, f"the loader returned an array of shape {array.shape}, "
                                               "expected [H, W] or [H, W, C]")
    return torch.from_numpy(np.ascontiguousarray(array.transpose(2, 0, 1))).to(torch.float32)


def resolve_bands(
    bands: Sequence[str | int] | None, band_names: Sequence[str], where: str
) -> tuple[tuple[Any, ...] | None, list[int] | None]:
    """``(bands, indices)``: ``bands`` (names from ``band_names`` or 0-based indices) as indices; ``None``: all.

    Example:
        >>> resolve_bands(["B04", 0], ("B02", "B03", "B04"), "here")
        (('B04', 0), [2, 0])
    """
    if bands is None:
        return (tuple(band_names) or None), None
    if isinstance(bands, (str, bytes)) or not isinstance(bands, Sequence) or not bands:
        raise TypeError(f"{where}: bands must be a non-empty sequence of band names or indices, got {bands!r}")
    indices = []
    for band in bands:
        if isinstance(band, str):
            if band not in band_names:
                known = ", ".join(band_names) or "none (pass band_names=)"
                raise ValueError(f"{where}: {band!r} is an invalid band name; the bands are: {known}")
            indices.append(list(band_names).index(band))
        elif isinstance(band, (int, np.integer)) and not isinstance(band, bool) and band >= 0:
            indices.append(int(band))
        else:
            raise TypeError(f"{where}: a band is a name or an index >= 0, got {band!r}")
    return tuple(bands), indices


def select_bands(image: torch.Tensor, bands: Any, indices: list[int] | None, url: str, stage: str) -> torch.Tensor:
    """``image[indices]`` (all bands when ``indices`` is ``None``); a chip with too few bands raises ``DecodeError``."""
    if indices is None:
        return image
    count = int(image.shape[0])
    if max(indices) >= count:
        raise DecodeError("select bands of", url, stage,
                          f"the chip has {count} bands, bands={list(bands)} needs {max(indices) + 1}")
    return image[indices]


class NonGeoDataset(Dataset[dict[str, Any]], abc.ABC):
    """Base class of chip datasets without geospatial indexing (TorchGeo 0.8's ``NonGeoDataset``).

    A map-style dataset: subclasses implement ``__getitem__(index) -> dict``
    and ``__len__``.  :meth:`pipe` turns any of them into a pipe for
    :class:`pipekit.DataLoader` with exact mid-epoch resume.

    Example:
        >>> import torch
        >>> from pipekit.datasets import NonGeoDataset
        >>> class Squares(NonGeoDataset):
        ...     def __getitem__(self, index):
        ...         return {"image": torch.full((1, 2, 2), float(index)), "label": torch.tensor(index % 2)}
        ...     def __len__(self):
        ...         return 5
        >>> print(Squares())
        Squares Dataset
            type: NonGeoDataset
            size: 5
        >>> [b["label"].tolist() for b in Squares().pipe(train=False, batch_size=2)]
        [[0, 1], [0, 1], [0]]
    """

    @abc.abstractmethod
    def __getitem__(self, index: int) -> dict[str, Any]:
        """The sample at ``index`` (``IndexError`` when out of range)."""

    @abc.abstractmethod
    def __len__(self) -> int:
        """The number of samples."""

    def __str__(self) -> str:
        return f"{type(self).__name__} Dataset\n    type: NonGeoDataset\n    size: {len(self)}"

    @staticmethod
    def collate_fn(samples: Sequence[Mapping[str, Any]]) -> Any:
        """How :meth:`pipe` batches samples by default: :func:`pipekit.collate.collate` (stacks tensors)."""
        return collate(samples)

    def pipe(
        self,
        *,
        train: bool = True,
        batch_size: int | None = 32,
        shuffle: bool | None = None,
        drop_last: bool = False,
        on_error: str = "raise",
        collate_fn: Callable[[list[Any]], Any] | None = None,
    ) -> ChipRecipe:
        """This dataset as a pipe for :class:`pipekit.DataLoader` (a :class:`ChipRecipe`; see its arguments)."""
        return ChipRecipe(self, train=train, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last,
                          on_error=on_error, collate_fn=collate_fn)


class _LoadSamples(IterDataPipe):
    """``index -> dataset[index]``; with ``on_error="skip"`` unreadable samples are counted in ``skip_log``."""

    stateless = True

    def __init__(self, datapipe: IterDataPipe, dataset: NonGeoDataset, on_error: str, stage: str) -> None:
        super().__init__()
        self.source_datapipe = datapipe
        self.dataset = dataset
        self.on_error = check_on_error(on_error)
        self.skip_log = SkipLog(stage)

    def __iter__(self):
        for index in self.source_datapipe:
            try:
                sample = self.dataset[index]
            except StageError as exc:
                if self.on_error == "raise":
                    raise
                self.skip_log.record(exc)
                continue
            yield sample

    def __len__(self) -> int:
        return len(self.source_datapipe)  # type: ignore[arg-type]


class ChipRecipe(Recipe):
    """A map-style chip dataset as a pipe for :class:`pipekit.DataLoader`, with exact mid-epoch resume.

    The chain::

        ListSource(range(len(dataset)))   all indices, a new permutation each epoch when shuffling
        -> sharding_filter                each index to one DataLoader worker / distributed rank
        -> dataset[index]                 (skipping unreadable samples with on_error="skip")
        -> batch + collate                (none with batch_size=None)

    A checkpoint (``loader.state_dict()``) holds the epoch's seed and the
    number of indices yielded, so resuming continues with exactly the
    samples that were not delivered, with any number of workers.  Random
    ``transforms`` of the dataset draw from torch's global RNG in each worker,
    which checkpoints do not record.

    Args:
        dataset: a map-style dataset (any ``NonGeoDataset``, or anything with
            ``__getitem__`` and ``__len__``; it is pickled to each worker).
        train: shuffle (unless ``shuffle`` says otherwise).
        batch_size: samples per batch; ``None`` yields samples.
        shuffle: shuffle the indices each epoch (default: ``train``).
        drop_last: drop each worker's last, shorter batch.
        on_error: ``"raise"`` or ``"skip"`` samples whose file cannot be read
            or decoded (a :class:`~pipekit.errors.StageError`); skips are
            counted in the loading pipe's ``skip_log`` and reported by
            ``DataLoader.skip_report()``.
        collate_fn: list of samples -> batch (default: the dataset's
            ``collate_fn``, else :func:`pipekit.collate.collate`).

    Example:
        >>> import torch
        >>> import pipekit
        >>> from pipekit.datasets import ChipRecipe
        >>> data = [{"image": torch.zeros(1, 2, 2), "label": torch.tensor(i)} for i in range(6)]
        >>> pipe = ChipRecipe(data, train=True, batch_size=2)
        >>> loader = pipekit.DataLoader(pipe, num_workers=0, generator=torch.Generator().manual_seed(0))
        >>> it = iter(loader)
        >>> first = next(it)["label"].tolist()
        >>> state = loader.state_dict()
        >>> rest = [b["label"].tolist() for b in it]
        >>> resumed = pipekit.DataLoader(ChipRecipe(data, train=True, batch_size=2), num_workers=0)
        >>> resumed.load_state_dict(state)
        >>> [b["label"].tolist() for b in resumed] == rest
        True
    """

    def __init__(
        self,
        dataset: Any,
        *,
        train: bool = True,
        batch_size: int | None = 32,
        shuffle: bool | None = None,
        drop_last: bool = False,
        on_error: str = "raise",
        collate_fn: Callable[[list[Any]], Any] | None = None,
    ) -> None:
        super().__init__()
        where = "ChipRecipe"
        if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
            raise TypeError(f"{where}: dataset must be map-style (__getitem__ and __len__), "
                            f"got {type(dataset).__name__}")
        batch_size = check_positive_int(batch_size, "batch_size", where, allow_none=True)
        check_on_error(on_error)
        check_callable(collate_fn, "collate_fn", where)
        if len(dataset) == 0:
            raise ValueError(f"{where}: the dataset is empty")
        self.dataset = dataset
        self.train = bool(train)
        self.batch_size = batch_size
        source = ListSource(list(range(len(dataset))), shuffle=self.train if shuffle is None else bool(shuffle))
        pipe: IterDataPipe = source.sharding_filter()
        pipe = _LoadSamples(pipe, dataset, on_error, f"{type(dataset).__name__}.pipe")
        if batch_size is not None:
            fn = collate_fn or getattr(dataset, "collate_fn", None) or collate
            pipe = pipe.batch(batch_size, drop_last=drop_last).collate(collate_fn=fn)
        self.source_datapipe = pipe


class _ValidFile:
    """The default ``is_valid_file``: a name ending in one of ``extensions`` (picklable)."""

    def __init__(self, extensions: Sequence[str]) -> None:
        self.extensions = tuple(e.lower() if e.startswith(".") else "." + e.lower() for e in extensions)

    def __call__(self, path: str) -> bool:
        return path.lower().endswith(self.extensions)


class NonGeoClassificationDataset(NonGeoDataset):
    """Class-per-folder chip classification (TorchGeo 0.8's ``NonGeoClassificationDataset``).

    The layout is torchvision's ``ImageFolder``'s (``root/<class>/<chip>``,
    sub-folders belonging to their top folder's class), local or at any
    fsspec URL.  Labels are the indices of the sorted class names.  A sample
    is ``{"image": float32 [C, H, W], "label": int64 []}`` (a 0-d tensor, as
    TorchGeo's), passed through ``transforms``.

    Args:
        root: the folder of class folders: a local path or an fsspec URL.
        transforms: a callable ``sample dict -> sample dict``.
        loader: ``path -> image`` replacing pipekit's reader (TorchGeo's
            convention: a PIL image or an ``[H, W(, C)]`` array, such as
            TorchGeo's ``rasterio_loader`` returns); ``None`` reads with
            :func:`read_chip` (GeoTIFF any band count, PNG, JPEG...).
        is_valid_file: ``path -> bool`` choosing the chips (replaces the
            ``extensions`` check, as in torchvision).
        bands: the bands to load, in this order: names from
            :attr:`all_band_names` (or ``band_names``), or 0-based band
            indices; ``None`` loads every band.
        band_names: the names of the files' bands, in file order (default:
            the class attribute :attr:`all_band_names`).
        extensions: the file extensions that are chips (without ``is_valid_file``).
        storage_options: fsspec options for a remote ``root``.

    Attributes:
        classes: the class names, sorted; ``class_to_idx`` maps them to labels.
        samples: ``[(path, label)]`` of every chip (``imgs`` is the same list);
            ``targets`` their labels.
        band_indices: the band indices loaded (``None``: all).

    Raises:
        DatasetNotFoundError: ``root`` does not exist, has no class folders,
            or a class folder has no chip (naming them).
        ValueError: an unknown band name.

    Example:
        >>> import os, tempfile
        >>> import numpy as np
        >>> from PIL import Image
        >>> from pipekit.datasets import NonGeoClassificationDataset
        >>> root = tempfile.mkdtemp()
        >>> for name in ("Forest", "River"):
        ...     os.makedirs(os.path.join(root, name))
        ...     Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(os.path.join(root, name, f"{name}_1.png"))
        >>> ds = NonGeoClassificationDataset(root, band_names=("R", "G", "B"), bands=("B", "G"))
        >>> ds.classes, len(ds)
        (['Forest', 'River'], 2)
        >>> sample = ds[1]
        >>> sample["image"].shape, sample["image"].dtype, sample["label"]
        (torch.Size([2, 8, 8]), torch.float32, tensor(1))
    """

    #: the names of the chips' bands in file order (subclasses set it; ``band_names=`` overrides it)
    all_band_names: tuple[str, ...] = ()

    def __init__(
        self,
        root: str | os.PathLike[str] = "data",
        transforms: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        loader: Callable[[str], Any] | None = None,
        is_valid_file: Callable[[str], bool] | None = None,
        *,
        bands: Sequence[str | int] | None = None,
        band_names: Sequence[str] | None = None,
        extensions: Sequence[str] = CHIP_EXTENSIONS,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        where = type(self).__name__
        if not isinstance(root, (str, os.PathLike)):
            raise TypeError(f"{where}: root must be a path or URL, got {type(root).__name__}")
        for name, fn in (("transforms", transforms), ("loader", loader), ("is_valid_file", is_valid_file)):
            check_callable(fn, name, where)
        if storage_options is not None and not isinstance(storage_options, Mapping):
            raise TypeError(f"{where}: storage_options must be a dict, got {type(storage_options).__name__}")
        if isinstance(extensions, str) or not extensions or not all(isinstance(e, str) for e in extensions):
            raise TypeError(f"{where}: extensions must be a non-empty list of strings such as '.tif'")
        self.root = os.fspath(root)
        self.transforms = transforms
        self.loader = loader
        self.storage_options = dict(storage_options or {})
        if band_names is not None:
            if isinstance(band_names, str) or not all(isinstance(b, str) for b in band_names):
                raise TypeError(f"{where}: band_names must be a sequence of strings, got {band_names!r}")
            self.all_band_names = tuple(band_names)
        self.bands, self.band_indices = self._resolve_bands(bands, where)

        valid = is_valid_file if is_valid_file is not None else _ValidFile(extensions)
        listing = list_class_folders(self.root, self.storage_options, where, DatasetNotFoundError)
        classes, found = listing.classes, listing.files
        if not classes:
            raise DatasetNotFoundError(f"{where}: no class folders in {self.root!r} (expected root/<class>/<chip>)")
        self.classes: list[str] = classes
        self.class_to_idx: dict[str, int] = {name: i for i, name in enumerate(classes)}
        self.samples: list[tuple[str, int]] = []
        empty = []
        for label, name in enumerate(classes):
            chips = [p for p in found[name] if valid(p)]
            if not chips:
                empty.append(name)
            self.samples.extend((p, label) for p in chips)
        if empty:
            what = "is_valid_file" if is_valid_file is not None else f"extensions {', '.join(valid.extensions)}"
            raise DatasetNotFoundError(f"{where}: found no valid chip ({what}) for the classes "
                                       f"{', '.join(empty)} in {self.root!r}")
        self.imgs = self.samples
        self.targets: list[int] = [label for _, label in self.samples]

    def _resolve_bands(self, bands: Sequence[str | int] | None, where: str) -> tuple[Any, list[int] | None]:
        return resolve_bands(bands, self.all_band_names, where)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict[str, Any]:
        image, label = self._load_image(index)
        sample: dict[str, Any] = {"image": image, "label": label}
        if self.transforms is not None:
            sample = self.transforms(sample)
        return sample

    def _load_image(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The chip at ``index`` (float32 ``[C, H, W]``, selected bands) and its label (int64 0-d tensor)."""
        path, label = self.samples[index]
        stage = type(self).__name__
        if self.loader is None:
            image = read_chip(path, self.storage_options, stage)
        else:
            try:
                loaded = self.loader(path)
            except StageError:
                raise
            except Exception as exc:
                raise DecodeError("load", path, stage, f"{type(exc).__name__}: {exc}") from exc
            image = _loaded_to_tensor(loaded, path, stage)
        image = select_bands(image, self.bands, self.band_indices, path, stage)
        return image, torch.tensor(label, dtype=torch.int64)
