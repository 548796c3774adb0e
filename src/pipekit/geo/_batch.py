"""A DataLoader batch of geo samples read straight into its batch tensors, and stacked without a copy.

torch's DataLoader asks a map-style dataset that has ``__getitems__`` for a
whole batch of queries at once.  :func:`read_batch` (the ``__getitems__`` of
raster datasets and their compositions) reads each sample's pixels as
``dataset[query]`` does, but converts them (``uint16`` -> ``float32``,
``uint8`` -> ``int64``...) into slot ``i`` of one ``[B, ...]`` tensor per key
instead of into a tensor of their own; each sample's tensors are views of
those slots.  :func:`stacked`, which :func:`~pipekit.geo.stack_samples` asks
first, recognises such views, in order and complete, and returns the batch
tensor itself instead of copying every sample into a new one with
``torch.stack``.  A batch of eight 6-band 256 px float32 patches is 12.6 MB:
the per-sample tensors and the stacked copy were the largest memory traffic
of a warm ``landsat8 & cdl`` batch at 0 workers (``benchmarks/geo_sampling.py``).

Samples are the same, value for value, dtype and shape, as ``dataset[query]``
gives (``tests/geo/test_batch.py``).  Whatever the plan does not cover reads
sample by sample, as before: a dataset with ``transforms`` (its own or an
operand's), a ``__getitem__`` or ``_getitem`` of its own, ``time_series``, a
``collate_fn``, ``dtype="native"`` (or a torch dtype numpy lacks), operands
whose dtypes differ for one key, or queries of different sizes.  Inside a
DataLoader worker the batch tensors are shared memory from the worker's pool
(:func:`pipekit.collate.empty_host`), as ``stack_samples`` makes them.

Example:
    >>> import torch
    >>> batch = torch.arange(6.0).reshape(2, 3)
    >>> _register(batch)
    >>> stacked([batch[0], batch[1]]) is batch, stacked([batch[1], batch[0]]) is None
    (True, True)
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from pipekit import _fast
from pipekit._batch_memory import empty_host
from pipekit.geo._base import GeoDataset, Sample, _numpy_dtype
from pipekit.geo._bbox import BoundingBox
from pipekit.geo._read import Grid

__all__ = ["read_batch", "stacked", "stacked_samples"]

#: Batch tensors made by :func:`read_batch`, by data pointer (weakly: a batch dropped leaves no entry).
_batches: dict[int, weakref.ref] = {}


def _register(batch: torch.Tensor) -> None:
    ptr = batch.data_ptr()
    if batch.numel() == 0 or ptr == 0:
        return

    def forget(ref: weakref.ref, ptr: int = ptr) -> None:
        if _batches.get(ptr) is ref:
            del _batches[ptr]

    _batches[ptr] = weakref.ref(batch, forget)


def stacked(tensors: Sequence[Any]) -> torch.Tensor | None:
    """The batch tensor whose slots ``0..n-1`` are exactly ``tensors`` (views :func:`read_batch` made), else None."""
    first = tensors[0]
    if type(first) is not torch.Tensor:
        return None
    ref = _batches.get(first.data_ptr())
    batch = ref() if ref is not None else None
    if batch is None or batch.shape[0] != len(tensors) or batch.shape[1:] != first.shape or batch.dtype != first.dtype:
        return None
    step = first.numel() * first.element_size()
    base = batch.data_ptr()
    for i, t in enumerate(tensors):
        if (
            type(t) is not torch.Tensor
            or t.data_ptr() != base + i * step
            or t.shape != first.shape
            or t.dtype != batch.dtype
            or not t.is_contiguous()
        ):
            return None
    return batch


def stacked_samples(samples: list[Any]) -> dict[str, Any] | None:
    """``stack_samples(samples)`` without copying, when every tensor key's values are one :func:`read_batch` batch.

    ``None`` when they are not (then ``stack_samples`` stacks them as usual).
    """
    if not _batches:
        return None  # nothing read by read_batch is alive (also when the geo_batch fast path is off)
    first = samples[0] if samples else None
    if not isinstance(first, Mapping) or not any(type(v) is torch.Tensor and v.data_ptr() in _batches
                                                 for v in first.values()):
        return None  # the usual case, decided at once: no tensor of a batch read by read_batch
    keys = first.keys()
    if not all(isinstance(s, Mapping) and s.keys() == keys for s in samples):
        return None
    out: dict[str, Any] = {}
    for key, value in first.items():
        if isinstance(value, torch.Tensor):
            batch = stacked([s[key] for s in samples])
            if batch is None:
                return None
            out[key] = batch
        else:
            out[key] = [s[key] for s in samples]
    return out


# -- reading a batch ------------------------------------------------------------------------


def _leaf_dtypes(dataset: GeoDataset, top: bool, found: dict[str, torch.dtype]) -> bool:
    """Whether ``dataset``'s samples can be read by :func:`_pieces` (collecting each key's dtype in ``found``)."""
    from pipekit.geo._composition import IntersectionDataset, UnionDataset
    from pipekit.geo._raster import RasterDataset
    from pipekit.geo._raster_sample import RasterSampling

    cls = type(dataset)
    if dataset.transforms is not None or cls._finish is not GeoDataset._finish:
        return False
    if top and cls.__getitem__ is not GeoDataset.__getitem__:
        return False
    if isinstance(dataset, IntersectionDataset):
        return (
            cls._getitem is IntersectionDataset._getitem
            and dataset.collate_fn is None
            and not dataset.time_series
            and all(not d._reads_itself() and _leaf_dtypes(d, False, found) for d in dataset.datasets)
        )
    if isinstance(dataset, UnionDataset):
        ok = cls._getitem is UnionDataset._getitem and dataset.collate_fn is None
    elif isinstance(dataset, RasterDataset):
        ok = cls._getitem is RasterSampling._getitem and not dataset.time_series
    else:
        return False
    if not ok:
        return False
    for key, dtype in dataset._dtypes().items():
        if dtype is None or _numpy_dtype(dtype) is None or found.setdefault(key, dtype) != dtype:
            return False
    return True


def _pieces(dataset: GeoDataset, bbox: BoundingBox, grid: Grid) -> list[tuple[str, np.ndarray]]:
    """The arrays of a sample before conversion, ``(key, [C, H, W])`` in the order their channels are joined.

    Raises what ``dataset._getitem`` raises where nothing covers the query.
    """
    from pipekit.geo._composition import IntersectionDataset

    if isinstance(dataset, IntersectionDataset):
        if len(dataset.geo_index.query(bbox)) == 0:
            raise dataset._missing(bbox)
        query = dataset._child_query(bbox)
        return [piece for d in dataset.datasets for piece in _pieces(d, query, grid)]
    arrays = dataset._read(bbox, grid, track_valid=False)
    if arrays is None:
        raise dataset._missing(bbox)
    return [(key, array) for key, (array, _) in arrays.items()]


def _layout(pieces: list[tuple[str, np.ndarray]]) -> dict[str, tuple[int, ...]]:
    """Each key's sample shape: its pieces' channels joined; a mask of one channel from one piece is ``[H, W]``."""
    channels: dict[str, list[np.ndarray]] = {}
    for key, array in pieces:
        channels.setdefault(key, []).append(array)
    layout = {}
    for key, arrays in channels.items():
        h, w = arrays[0].shape[1:]
        if any(a.ndim != 3 or a.shape[1:] != (h, w) for a in arrays):
            return {}
        c = sum(a.shape[0] for a in arrays)
        layout[key] = (h, w) if key == "mask" and len(arrays) == 1 and c == 1 else (c, h, w)
    return layout


def read_batch(dataset: GeoDataset, keys: Sequence[Any]) -> list[Sample]:
    """``[dataset[key] for key in keys]``, each sample's tensors a slot of one batch tensor per key.

    Falls back to ``dataset[key]`` one by one where the module docstring says.
    """
    keys = list(keys)
    dtypes: dict[str, torch.dtype] = {}
    if not keys or not _fast.enabled("geo_batch") or not _leaf_dtypes(dataset, True, dtypes):
        return [dataset[key] for key in keys]
    queries = [dataset._query(key) for key in keys]
    grids = [dataset.grid(bbox, res) for bbox, res, _ in queries]
    if any(g.shape != grids[0].shape for g in grids[1:]):
        return [dataset[key] for key in keys]
    crs = dataset.crs
    layout: dict[str, tuple[int, ...]] | None = None
    batches: dict[str, tuple[torch.Tensor, np.ndarray]] = {}
    samples: list[Sample] = []
    for i, ((bbox, _, bounds), grid) in enumerate(zip(queries, grids)):
        pieces = _pieces(dataset, bbox, grid)
        if layout is None:
            layout = _layout(pieces)
            if not layout or layout.keys() != dtypes.keys():
                layout = {}
            for key, shape in layout.items():
                batch = empty_host((len(keys), *shape), dtypes[key])
                _register(batch)
                batches[key] = (batch, batch.numpy())
        if not layout or _layout(pieces) != layout:  # not what the batch holds: this sample on its own, as before
            samples.append(dataset._getitem(bbox, grid, bounds))
            continue
        offsets = dict.fromkeys(layout, 0)
        for key, array in pieces:
            target = batches[key][1][i]
            if target.ndim == 2:
                np.copyto(target, array[0], casting="unsafe")
            else:
                c = array.shape[0]
                np.copyto(target[offsets[key]:offsets[key] + c], array, casting="unsafe")
                offsets[key] += c
        sample: Sample = {key: batches[key][0][i] for key in layout}
        sample["crs"] = crs
        sample["bounds"] = bounds
        sample["transform"] = grid.transform
        samples.append(sample)
    return samples
