"""Compositions of geo datasets: ``a & b`` (:class:`IntersectionDataset`) and ``a | b`` (:class:`UnionDataset`).

Both operands are brought into one CRS and resolution (:func:`_align`: the
left one's unless given; the other is reprojected on read).  An
intersection reads both on the same grid and concatenates their channels;
a union mosaics them first-valid.  As in TorchGeo 0.8, ``collate_fn=``
replaces how the operands' samples are combined, and ``dataset.index`` is a
``GeoDataFrame`` (an intersection's with ``filepath_1``/``filepath_2``
columns, a union's the rows of both).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from rasterio.crs import CRS

from pipekit.errors import EmptyIntersectionError, NotGeoDatasetError
from pipekit.geo._base import (
    Arrays,
    GeoDataset,
    Sample,
    _crs_name,
    _default_res,
    _reads_itself,
    _reproject_index,
    _to_crs,
    _to_res,
)
from pipekit.geo._batch import read_batch
from pipekit.geo._bbox import BoundingBox
from pipekit.geo._collate import concat_samples, merge_samples
from pipekit.geo._index import GeoIndex
from pipekit.geo._read import Grid

if TYPE_CHECKING:
    from geopandas import GeoDataFrame

Collate = Callable[[Sequence[Sample]], Sample]

__all__ = ["IntersectionDataset", "UnionDataset"]

logger = logging.getLogger("pipekit.geo")


def _align(
    kind: str, dataset1: GeoDataset, dataset2: GeoDataset, crs: Any, res: Any
) -> tuple[GeoDataset, GeoDataset, CRS, tuple[float, float]]:
    """Both operands in one CRS and resolution: the left one's unless ``crs``/``res`` are given."""
    _check_operands(kind, dataset1, dataset2)
    target_crs = dataset1._crs if crs is None else _to_crs(crs)
    if res is not None:
        target_res = _to_res(res)
    elif target_crs == dataset1._crs:
        target_res = dataset1.res
    else:
        target_res = _default_res(dataset1._crs, target_crs, dataset1.res, dataset1._extent())
    moved = []
    out = []
    for d in (dataset1, dataset2):
        if d._crs != target_crs or d.res != target_res:
            moved.append(f"{d.name} ({_crs_name(d._crs)}, res {d.res})")
            d = d._retargeted(target_crs, target_res)
        out.append(d)
    source = "given" if crs is not None or res is not None else f"from {dataset1.name}"
    logger.info(
        "%s(%s, %s): CRS %s, res %s (%s)%s",
        kind, dataset1.name, dataset2.name, _crs_name(target_crs), target_res, source,
        f"; reprojected on read: {', '.join(moved)}" if moved else "",
    )
    return out[0], out[1], target_crs, target_res


def _check_operands(kind: str, *datasets: Any) -> None:
    for d in datasets:
        if not isinstance(d, GeoDataset):
            raise NotGeoDatasetError(f"{kind} only supports GeoDatasets (it combines them), got {type(d).__name__}")


def _operand_sample(d: GeoDataset, query: BoundingBox, grid: Grid, bounds: Any) -> Sample:
    """An operand's sample of a query: read onto ``grid``, or (a dataset written the TorchGeo way) ``d[bounds]``."""
    if _reads_itself(d):
        return d[bounds]
    sample = d._getitem(query, grid, bounds)
    return d.transforms(sample) if d.transforms is not None else sample


class IntersectionDataset(GeoDataset):
    """``a & b``: where both datasets have data; samples hold both products' keys.

    The index holds the intersection of every pair of intersecting entries
    (footprints, and time intervals unless ``spatial_only``).  A query reads
    both datasets on the same grid; ``"image"`` channels are concatenated
    (``a``'s first), as are masks.  The left operand's CRS and resolution
    are used unless ``crs``/``res`` are given; the other is reprojected on
    the fly (the operands themselves are left as they are, unlike TorchGeo,
    which changes the right one's CRS and resolution in place).

    Time-correct: the index pairs footprints that meet in space *and* time,
    each with the time both share, and a query reads each operand only within
    the query's time -- so a 2022 Landsat 7 scene never lands in a 2023 CDL
    patch (TorchGeo 0.8 mixes it in where the footprints overlap).

    Args:
        dataset1: the left operand.
        dataset2: the right operand.
        spatial_only: match footprints regardless of time (each dataset is
            then queried over all its times).
        collate_fn: how the two operands' samples are combined (TorchGeo's
            argument; default: channels concatenated, as ``concat_samples``).
        transforms: applied to the merged sample.
        crs: the CRS of both (default: ``dataset1``'s).
        res: the resolution of both (default: ``dataset1``'s).

    Raises:
        EmptyIntersectionError: the datasets do not intersect (a ``ValueError``
            and, as TorchGeo's, a ``RuntimeError``; it names both).
        NotGeoDatasetError: an operand is not a ``GeoDataset`` (a
            ``TypeError`` and, as TorchGeo's, a ``ValueError``).
    """

    def __init__(
        self,
        dataset1: GeoDataset,
        dataset2: GeoDataset,
        spatial_only: bool = False,
        collate_fn: Collate | None = None,
        transforms: Callable[[Sample], Sample] | None = None,
        *,
        crs: Any = None,
        res: Any = None,
    ) -> None:
        if transforms is not None and not callable(transforms):
            raise TypeError(f"transforms must be callable, got {type(transforms).__name__}")
        if collate_fn is not None and not callable(collate_fn):
            raise TypeError(f"collate_fn must be callable, got {type(collate_fn).__name__}")
        self.spatial_only = bool(spatial_only)
        self.transforms = transforms
        self.collate_fn = None if collate_fn is concat_samples else collate_fn
        d1, d2, self._crs, self._res = _align("IntersectionDataset", dataset1, dataset2, crs, res)
        self.datasets = [d1, d2]
        self._names = (dataset1.name, dataset2.name)
        self.geo_index = self._build_index()

    @property
    def name(self) -> str:
        return f"({self._names[0]} & {self._names[1]})" if hasattr(self, "_names") else "IntersectionDataset"

    def __getitems__(self, keys: Sequence[Any]) -> list[Sample]:
        """``[self[key] for key in keys]`` (a DataLoader's batch), read into one tensor per key (``_batch``)."""
        return read_batch(self, keys)

    def _build_index(self) -> GeoIndex:
        d1, d2 = self.datasets
        i, j = d1.geo_index.intersect_pairs(d2.geo_index, spatial_only=self.spatial_only)
        a, b = d1.geo_index.bounds[i], d2.geo_index.bounds[j]
        boxes = np.empty((len(i), 6), dtype=np.float64)
        boxes[:, 0::2] = np.maximum(a[:, 0::2], b[:, 0::2])
        boxes[:, 1::2] = np.minimum(a[:, 1::2], b[:, 1::2])
        if self.spatial_only:
            boxes[:, 4] = np.minimum(a[:, 4], b[:, 4])
            boxes[:, 5] = np.maximum(a[:, 5], b[:, 5])
        area = (boxes[:, 1] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 2])
        keep = area > 0
        boxes = boxes[keep]
        if len(boxes) == 0:
            where = "in space" if self.spatial_only else "in space and time"
            if self.spatial_only or not _meet_in_space(d1.geo_index, d2.geo_index):
                torchgeo = "Datasets have no spatial intersection"
            else:
                torchgeo = "Datasets have no temporal intersection; pass spatial_only=True to ignore time"
            raise EmptyIntersectionError(
                f"{self._names[0]} & {self._names[1]}: the datasets do not intersect {where}: {torchgeo} "
                f"({self._names[0]} covers {d1._extent()!r}, {self._names[1]} covers {d2._extent()!r}, "
                f"in {_crs_name(self._crs)})"
            )
        self._pairs: tuple[np.ndarray, np.ndarray] | None = (i[keep], j[keep])
        return GeoIndex(boxes)

    def _frame(self) -> GeoDataFrame:
        """TorchGeo's ``gpd.overlay`` of both indexes: each operand's columns (``_1``/``_2`` where both have one)."""
        from pipekit.geo._frame import frame_from_index

        pairs = getattr(self, "_pairs", None)
        if pairs is None:
            return frame_from_index(self.geo_index, self._crs)
        frames = [d.index for d in self.datasets]
        names = [[c for c in f.columns if c != f.geometry.name] for f in frames]
        columns: dict[str, Any] = {}
        for k, (frame, rows) in enumerate(zip(frames, pairs)):
            for name in names[k]:
                key = f"{name}_{k + 1}" if name in names[1 - k] else name
                columns[key] = frame[name].to_numpy()[rows]
        return frame_from_index(self.geo_index, self._crs, columns)

    def _set_frame(self, frame: Any) -> None:
        super()._set_frame(frame)
        self._pairs = None

    @property
    def time_series(self) -> bool:  # type: ignore[override]
        """Whether an operand stacks scenes in time (its keys are then ``[T, ...]``; the other's are not stacked)."""
        return any(d.time_series for d in self.datasets)

    def _child_query(self, bbox: BoundingBox) -> BoundingBox:
        return bbox.with_time() if self.spatial_only else bbox

    def _getitem(self, bbox: BoundingBox, grid: Grid, bounds: Any) -> Sample:
        if len(self.geo_index.query(bbox)) == 0:
            raise self._missing(bbox)
        query = self._child_query(bbox)
        samples = [_operand_sample(d, query, grid, bounds) for d in self.datasets]
        if self.collate_fn is not None:
            return self.collate_fn(samples)
        merged: Sample = {}
        for sample in samples:
            for key, value in sample.items():
                if key in ("crs", "bounds", "transform"):
                    continue
                if key in merged and key == "dates":
                    if not torch.equal(merged[key], value):
                        raise ValueError(
                            f"{self.name}: both operands are time series, with different dates at this query "
                            f"({merged[key].tolist()} vs {value.tolist()}); their channels cannot be stacked"
                        )
                elif key in merged and key in ("image", "mask") and isinstance(value, torch.Tensor):
                    if self.time_series:
                        merged[key] = _concat_series(self.name, key, merged[key], value)
                    else:
                        merged[key] = _concat(merged[key], value)
                else:
                    merged[key] = value
        merged["crs"] = self.crs
        merged["bounds"] = bounds
        merged["transform"] = grid.transform
        return merged

    def _read(self, bbox: BoundingBox, grid: Grid, track_valid: bool) -> Arrays | None:
        if self.collate_fn is not None:
            raise ValueError(f"{self.name} has a collate_fn, so it cannot be mosaicked inside a union")
        if self.time_series:
            raise ValueError(f"{self.name} holds a time_series dataset, so it cannot be mosaicked inside a union")
        if any(_reads_itself(d) for d in self.datasets):
            raise ValueError(f"{self.name} holds a dataset that reads itself (its own __getitem__), so it cannot be "
                             "mosaicked inside a union")
        if len(self.geo_index.query(bbox)) == 0:
            return None
        query = self._child_query(bbox)
        parts = [d._read(query, grid, track_valid) for d in self.datasets]
        if any(p is None for p in parts):
            return None
        merged: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
        for part in parts:
            for key, (array, valid) in part.items():
                if key not in merged:
                    merged[key] = (array, valid)
                    continue
                a, va = merged[key]
                dtype = np.result_type(a.dtype, array.dtype)
                joined = np.concatenate([a.astype(dtype, copy=False), array.astype(dtype, copy=False)])
                if va is None and valid is None:
                    jv = None
                else:
                    va = np.ones(a.shape, bool) if va is None else va
                    vb = np.ones(array.shape, bool) if valid is None else valid
                    jv = np.concatenate([va, vb])
                merged[key] = (joined, jv)
        return merged

    def _layers(self) -> dict[str, int]:
        layers: dict[str, int] = {}
        for d in self.datasets:
            for key, n in d._layers().items():
                layers[key] = layers.get(key, 0) + n
        return layers

    def _dtypes(self) -> dict[str, torch.dtype]:
        dtypes: dict[str, torch.dtype] = {}
        for d in self.datasets:
            for key, dt in d._dtypes().items():
                dtypes[key] = torch.promote_types(dtypes[key], dt) if key in dtypes else dt
        return dtypes

    def _has_transforms(self) -> bool:
        return self.transforms is not None or any(d._has_transforms() for d in self.datasets)

    def _reads_itself(self) -> bool:
        return any(_reads_itself(d) for d in self.datasets)

    def _retargeted(self, crs: CRS, res: tuple[float, float]) -> IntersectionDataset:
        clone = copy.copy(self)
        clone.__dict__.pop("_crs_key", None)
        clone.datasets = [d._retargeted(crs, res) for d in self.datasets]
        clone._crs, clone._res = crs, res
        if self.__dict__.get("_cut"):  # an assigned index (a split): its boxes, moved
            clone.geo_index = _reproject_index(self.geo_index, self._crs, crs) if crs != self._crs else self.geo_index
        else:
            clone.geo_index = clone._build_index()
        return clone

    def _plot_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {}
        offset = 0
        for d in self.datasets:
            sub = d._plot_spec()
            layers = d._layers()
            if "rgb" in sub and "rgb" not in spec:
                spec["rgb"] = [offset + k for k in sub["rgb"]]
            for key in ("cmap", "class_names"):
                if key in sub and key not in spec:
                    spec[key] = sub[key]
            offset += layers.get("image", 0)
        return spec


def _meet_in_space(a: GeoIndex, b: GeoIndex) -> bool:
    """Whether some footprints of ``a`` and ``b`` share an area (whatever their times)."""
    i, j = a.intersect_pairs(b, spatial_only=True)
    x, y = a.bounds[i], b.bounds[j]
    width = np.minimum(x[:, 1], y[:, 1]) - np.maximum(x[:, 0], y[:, 0])
    height = np.minimum(x[:, 3], y[:, 3]) - np.maximum(x[:, 2], y[:, 2])
    return bool(((width > 0) & (height > 0)).any())


def _concat(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.ndim == 2:
        a = a.unsqueeze(0)
    if b.ndim == 2:
        b = b.unsqueeze(0)
    dtype = torch.promote_types(a.dtype, b.dtype)
    return torch.cat([a.to(dtype), b.to(dtype)], dim=0)


def _concat_series(name: str, key: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Channels of two images of an intersection with a time series: ``[T, C, H, W]`` (a single date is repeated)."""
    if key != "image":
        raise ValueError(
            f"{name}: both operands hold a {key!r}, and one is a time series; stacked masks cannot be joined "
            "(give the labels as the only mask)"
        )
    if a.ndim == 3:
        a = a.unsqueeze(0).expand(b.shape[0], *a.shape)
    if b.ndim == 3:
        b = b.unsqueeze(0).expand(a.shape[0], *b.shape)
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"{name}: the operands' time series have {a.shape[0]} and {b.shape[0]} time steps here")
    dtype = torch.promote_types(a.dtype, b.dtype)
    return torch.cat([a.to(dtype), b.to(dtype)], dim=1)


class UnionDataset(GeoDataset):
    """``a | b``: where either dataset has data; overlaps are mosaicked first-valid (``a`` first).

    Both operands must produce the same sample keys and channel counts
    (e.g. ``Landsat7() | Landsat8(bands=Landsat8.all_bands[1:-2])``, six
    bands each).  The index is the concatenation of both indexes.  The left
    operand's CRS and resolution are used unless ``crs``/``res`` are given;
    the other is reprojected on the fly.

    Args:
        dataset1: the left operand (wins where both have valid pixels).
        dataset2: the right operand.
        collate_fn: TorchGeo's argument: combine the samples of the operands
            that cover a query with it (e.g. ``merge_samples``, TorchGeo's
            default, the pixelwise maximum) instead of pipekit's first-valid
            mosaic (the default, and ``merge_samples`` where an operand is
            written the TorchGeo way: it reads itself in its own ``__getitem__``).
        transforms: applied to the mosaicked sample.
        crs: the CRS of both (default: ``dataset1``'s).
        res: the resolution of both (default: ``dataset1``'s).

    Raises:
        NotGeoDatasetError: an operand is not a ``GeoDataset``.
        ValueError: without ``collate_fn``, the operands' sample keys or band
            counts differ.

    An operand with its own ``transforms`` (TorchGeo's ``ds | ds``) makes the
    union TorchGeo's: each operand's sample goes through its transforms, then
    they are merged by :func:`~pipekit.datasets.utils.merge_samples` (the
    pixelwise maximum), since the first-valid mosaic reads raw pixels before
    any transform could run.
    """

    def __init__(
        self,
        dataset1: GeoDataset,
        dataset2: GeoDataset,
        collate_fn: Collate | None = None,
        transforms: Callable[[Sample], Sample] | None = None,
        *,
        crs: Any = None,
        res: Any = None,
    ) -> None:
        if transforms is not None and not callable(transforms):
            raise TypeError(f"transforms must be callable, got {type(transforms).__name__}")
        if collate_fn is not None and not callable(collate_fn):
            raise TypeError(f"collate_fn must be callable, got {type(collate_fn).__name__}")
        _check_operands("UnionDataset", dataset1, dataset2)
        if collate_fn is None and (_reads_itself(dataset1) or _reads_itself(dataset2)):
            collate_fn = merge_samples  # TorchGeo's default: datasets that read themselves cannot be mosaicked
        self.collate_fn = collate_fn
        l1, l2 = (dataset1._layers(), dataset2._layers()) if collate_fn is None else ({}, {})
        if l1 != l2:
            raise ValueError(
                f"{dataset1.name} | {dataset2.name}: cannot mosaic samples of different layouts "
                f"({l1} vs {l2}); choose bands= so that both read the same number of bands"
            )
        if collate_fn is None and (dataset1._has_transforms() or dataset2._has_transforms()):
            # pipekit's first-valid mosaic reads raw pixels, before any operand's transforms could run: an
            # operand with its own transforms makes the union TorchGeo's, each operand's sample after its
            # transforms, merged by merge_samples (the pixelwise maximum)
            self.collate_fn = merge_samples
        self.transforms = transforms
        d1, d2, self._crs, self._res = _align("UnionDataset", dataset1, dataset2, crs, res)
        self.datasets = [d1, d2]
        self._names = (dataset1.name, dataset2.name)
        self.geo_index = d1.geo_index.concat(d2.geo_index)

    @property
    def name(self) -> str:
        return f"({self._names[0]} | {self._names[1]})" if hasattr(self, "_names") else "UnionDataset"

    def __getitems__(self, keys: Sequence[Any]) -> list[Sample]:
        """``[self[key] for key in keys]`` (a DataLoader's batch), read into one tensor per key (``_batch``)."""
        return read_batch(self, keys)

    def _frame(self) -> GeoDataFrame:
        """TorchGeo's ``pd.concat`` of both indexes (when nobody filtered the union's own rows)."""
        import pandas as pd

        d1, d2 = self.datasets
        if len(self.geo_index) != len(d1.geo_index) + len(d2.geo_index):
            return super()._frame()
        return pd.concat([d1.index, d2.index])

    def _getitem(self, bbox: BoundingBox, grid: Grid, bounds: Any) -> Sample:
        if self.collate_fn is None:
            return super()._getitem(bbox, grid, bounds)
        samples = []
        for d in self.datasets:
            try:
                samples.append(_operand_sample(d, bbox, grid, bounds))
            except IndexError:
                continue
        if not samples:
            raise self._missing(bbox)
        return self.collate_fn(samples)

    def _read(self, bbox: BoundingBox, grid: Grid, track_valid: bool) -> Arrays | None:
        if self.collate_fn is not None:
            raise ValueError(f"{self.name} has a collate_fn, so it cannot be mosaicked inside another union")
        parts = [d._read(bbox, grid, True) for d in self.datasets]
        parts = [p for p in parts if p is not None]
        if not parts:
            return None
        if len(parts) == 1:
            return parts[0]
        first, second = parts
        merged: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
        for key, (a, va) in first.items():
            b, vb = second[key]
            dtype = np.result_type(a.dtype, b.dtype)
            out = a.astype(dtype, copy=False)
            va = np.ones(a.shape, bool) if va is None else va
            vb = np.ones(b.shape, bool) if vb is None else vb
            write = vb & ~va
            np.copyto(out, b, where=write, casting="unsafe")
            merged[key] = (out, va | vb)
        return merged

    def _layers(self) -> dict[str, int]:
        return self.datasets[0]._layers()

    def _reads_itself(self) -> bool:
        return any(_reads_itself(d) for d in self.datasets)

    def _dtypes(self) -> dict[str, torch.dtype]:
        return self.datasets[0]._dtypes()

    def _retargeted(self, crs: CRS, res: tuple[float, float]) -> UnionDataset:
        clone = copy.copy(self)
        clone.__dict__.pop("_crs_key", None)
        clone.datasets = [d._retargeted(crs, res) for d in self.datasets]
        clone._crs, clone._res = crs, res
        if self.__dict__.get("_cut"):  # an assigned index (a split): its boxes, moved
            clone.geo_index = _reproject_index(self.geo_index, self._crs, crs) if crs != self._crs else self.geo_index
        else:
            clone.geo_index = clone.datasets[0].geo_index.concat(clone.datasets[1].geo_index)
        return clone

    def _plot_spec(self) -> dict[str, Any]:
        return self.datasets[0]._plot_spec()
