"""Random samplers: :class:`RandomGeoSampler` (patches) and :class:`RandomBatchGeoSampler` (batches from one footprint).

A footprint is drawn in proportion to its area, then a position in it, a
whole number of pixels from its top-left corner; every box of an epoch
derives from the epoch seed (see :mod:`pipekit.geo.samplers._base`).
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np
import torch

from pipekit.geo.samplers._base import (
    _CHUNK,
    _TOL,
    BatchGeoSampler,
    GeoSampler,
    Units,
    _boxes,
    _generator,
    _pair,
    _rows_cols,
    _units,
)

__all__ = ["RandomGeoSampler", "RandomBatchGeoSampler"]


class RandomGeoSampler(GeoSampler):
    """Random patches: a footprint chosen with probability proportional to its area, then a position in it.

    Yields TorchGeo 0.8's queries ``(slice(xmin, xmax), slice(ymin, ymax),
    slice(tmin, tmax))``, times as ``pandas.Timestamp``.

    Footprints are clipped to ``roi``/``toi``; those smaller than a patch are
    skipped (their indices are in :attr:`skipped`).  The patch's position is a
    whole number of pixels from the footprint's top-left corner and the patch
    lies inside the footprint; its time interval is the footprint's (clipped
    to the toi).  Patches may overlap.

    Args:
        dataset: a geo dataset (reads ``dataset.index`` and ``dataset.res``).
        size: patch size, a number or ``(height, width)``, in ``units``
            (pixels need not be whole; 0 is TorchGeo's patch of point data).
        length: patches per epoch (default: as many as would tile the
            footprints, like TorchGeo).
        roi: region of interest: a shapely ``Polygon`` (TorchGeo 0.8; each
            footprint is clipped to it), slices ``(x, y)``, or a
            :class:`~pipekit.geo.BoundingBox` (its time interval filters too).
            Default: the dataset's bounds.
        toi: time of interest: a ``pandas.Interval`` (TorchGeo 0.8),
            ``(start, stop)`` (datetimes or seconds, ``None`` for open) or a slice.
        units: ``"pixels"`` (default, converted with ``dataset.res``) or ``"crs"``.
        generator: a ``torch.Generator`` to draw each epoch's seed from
            (default: torch's global RNG, so ``torch.manual_seed`` fixes it).
        seed: shorthand for ``generator=torch.Generator().manual_seed(seed)``.
        time_window: for time series datasets (``RasterDataset(time_series=True)``):
            each patch spans a time window drawn among a place's windows (no
            TorchGeo 0.8 sampler has this).  An int ``N``: ``N`` consecutive
            scenes of a place (footprints overlapping by half or more); a
            ``timedelta``: that long from one of its scenes' start.

    Example:
        >>> from types import SimpleNamespace
        >>> from pipekit.geo._index import GeoIndex
        >>> from pipekit.geo.samplers import RandomGeoSampler
        >>> ds = SimpleNamespace(index=GeoIndex([[0, 640, 0, 320]]), res=(10.0, 10.0))
        >>> sampler = RandomGeoSampler(ds, size=16, length=3, seed=0)
        >>> len(sampler)
        3
        >>> boxes = list(sampler)
        >>> [(x.stop - x.start, y.stop - y.start) for x, y, t in boxes]
        [(160.0, 160.0), (160.0, 160.0), (160.0, 160.0)]
        >>> all(x.start % 10 == 0 and y.stop % 10 == 0 and 0 <= x.start and x.stop <= 640 for x, y, t in boxes)
        True
        >>> len(RandomGeoSampler(ds, size=16))  # default length: 2 x 4 patches tile the footprint
        8
    """

    random = True

    def __init__(
        self,
        dataset: Any,
        size: float | tuple[float, float],
        length: int | None = None,
        roi: Any = None,
        toi: Any = None,
        units: Units | str = Units.PIXELS,
        generator: torch.Generator | None = None,
        *,
        seed: int | None = None,
        time_window: Any = None,
    ) -> None:
        super().__init__(dataset, roi, toi)
        self.units = _units(units)
        size = _pair(size, "size", zero=True)
        if self.units is Units.PIXELS:
            size = (size[0] * self.res[1], size[1] * self.res[0])
        self.size: tuple[float, float] = size
        self.generator = _generator(generator, seed)
        self._keep_fitting(size)
        self._apply_time_window(time_window)
        self._prepare()
        # patches that would tile the footprints (a size of 0: one per pixel position)
        step_y, step_x = size[0] or self.res[1], size[1] or self.res[0]
        default = int(
            np.sum(
                _rows_cols(self.footprints[:, 3] - self.footprints[:, 2], size[0], step_y)
                * _rows_cols(self.footprints[:, 1] - self.footprints[:, 0], size[1], step_x)
            )
        )
        if length is None:
            length = default
        elif isinstance(length, bool) or not isinstance(length, numbers.Integral) or length < 0:
            raise ValueError(f"length must be a non-negative int, got {length!r}")
        self.length = int(length) if len(self.footprints) else 0  # nothing to sample: warned, yields nothing

    def _prepare(self) -> None:
        b = self.footprints
        h, w = self.size
        xres, yres = self.res
        # positions: whole pixels from (minx, maxy) with the patch inside the footprint
        self._nx = np.floor((b[:, 1] - b[:, 0] - w) / xres + _TOL).clip(0).astype(np.int64) + 1
        self._ny = np.floor((b[:, 3] - b[:, 2] - h) / yres + _TOL).clip(0).astype(np.int64) + 1
        areas = (b[:, 1] - b[:, 0]) * (b[:, 3] - b[:, 2])
        if areas.sum() <= 0:
            areas = np.ones_like(areas)
        self.areas = areas
        self._cum = np.cumsum(areas)

    def _pick(self, u: np.ndarray) -> np.ndarray:
        """Footprints for uniform draws ``u``, in proportion to area."""
        k = np.searchsorted(self._cum, u * self._cum[-1], side="right")
        return np.minimum(k, len(self._cum) - 1)

    def _place(self, k: np.ndarray, ux: np.ndarray, uy: np.ndarray) -> np.ndarray:
        """Boxes ``[n, 6]`` in footprints ``k`` at the positions chosen by uniform draws ``ux``, ``uy``."""
        b = self.footprints
        h, w = self.size
        xres, yres = self.res
        nx, ny = self._nx[k], self._ny[k]
        ix = np.minimum(np.floor(ux * nx).astype(np.int64), nx - 1)
        iy = np.minimum(np.floor(uy * ny).astype(np.int64), ny - 1)
        out = np.empty((len(k), 6))
        out[:, 0] = b[k, 0] + ix * xres
        out[:, 1] = out[:, 0] + w
        out[:, 3] = b[k, 3] - iy * yres
        out[:, 2] = out[:, 3] - h
        out[:, 4] = b[k, 4]
        out[:, 5] = b[k, 5]
        return out

    def _chunk(self, seed: int | None, c: int) -> list[tuple[slice, slice, slice]]:
        n = min(_CHUNK, self.length - c * _CHUNK)
        u = self._chunk_rng(seed, c).random((3, n))
        return _boxes(self._place(self._pick(u[0]), u[1], u[2]))

    def __len__(self) -> int:
        return self.length


class RandomBatchGeoSampler(BatchGeoSampler):
    """Batches of random patches, all patches of a batch from one footprint (a batch sampler).

    Reading a batch then touches one file (or a few), which is much faster
    for tiled datasets.  The footprint of each batch is chosen in proportion
    to its area, the patches within it as in :class:`RandomGeoSampler`.
    Use it as ``DataLoader(dataset, batch_sampler=sampler, collate_fn=stack_samples)``.

    Args:
        dataset: a geo dataset (reads ``dataset.index`` and ``dataset.res``).
        size: patch size, a number or ``(height, width)``, in ``units``.
        batch_size: patches per batch.
        length: patches per epoch (default: as many as would tile the
            footprints); an epoch has ``length // batch_size`` batches.
        roi, toi, units, generator, seed: as for :class:`RandomGeoSampler`.

    Example:
        >>> from types import SimpleNamespace
        >>> from pipekit.geo._index import GeoIndex
        >>> from pipekit.geo.samplers import RandomBatchGeoSampler
        >>> ds = SimpleNamespace(index=GeoIndex([[0, 100, 0, 100], [500, 600, 0, 100]]), res=(1.0, 1.0))
        >>> sampler = RandomBatchGeoSampler(ds, size=10, batch_size=4, length=12, seed=0)
        >>> batches = list(sampler)
        >>> len(batches), [len(b) for b in batches]
        (3, [4, 4, 4])
        >>> all(len({x.start >= 500 for x, y, t in batch}) == 1 for batch in batches)
        True
    """

    random = True

    def __init__(
        self,
        dataset: Any,
        size: float | tuple[float, float],
        batch_size: int,
        length: int | None = None,
        roi: Any = None,
        toi: Any = None,
        units: Units | str = Units.PIXELS,
        generator: torch.Generator | None = None,
        *,
        seed: int | None = None,
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        self._single = RandomGeoSampler(dataset, size, length, roi, toi, units, generator, seed=seed)
        # share the single-patch sampler's state
        shared = ("res", "roi_box", "_roi_shape", "_crs", "toi", "hits", "footprints", "skipped", "size", "units",
                  "empty_reason")
        for name in (*shared, "length", "areas"):
            setattr(self, name, getattr(self._single, name))
        self.batch_size = int(batch_size)

    @property  # type: ignore[override]
    def generator(self) -> torch.Generator | None:
        return self._single.generator

    @generator.setter
    def generator(self, value: torch.Generator | None) -> None:
        self._single.generator = value

    def _chunk(self, seed: int | None, c: int) -> list[list[tuple[slice, slice, slice]]]:
        n = min(_CHUNK, len(self) - c * _CHUNK)
        rng = self._chunk_rng(seed, c)
        single = self._single
        k = np.repeat(single._pick(rng.random(n)), self.batch_size)
        u = rng.random((2, n * self.batch_size))
        boxes = _boxes(single._place(k, u[0], u[1]))
        bs = self.batch_size
        return [boxes[i * bs : (i + 1) * bs] for i in range(n)]

    def __len__(self) -> int:
        return self.length // self.batch_size
