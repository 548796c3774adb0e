"""The grid sampler: :class:`GridGeoSampler`, patches on a regular grid covering every pixel of every footprint."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from pipekit.geo.samplers._base import _CHUNK, GeoSampler, Units, _boxes, _pair, _rows_cols, _units

__all__ = ["GridGeoSampler"]


class GridGeoSampler(GeoSampler):
    """Patches on a regular grid covering every pixel of every footprint.

    Within each footprint (clipped to ``roi``/``toi``), rows run from the top
    (``maxy``) down and columns from the left, ``stride`` apart; the last row
    and column are moved back to end exactly at the footprint's edge, so
    every pixel is covered and no patch leaves its footprint (TorchGeo 0.8
    starts at the bottom row and lets the last row and column run past the
    edge, reading fill values there).  Footprints smaller than a patch are skipped with a warning
    (their indices are in :attr:`skipped`).  The order is deterministic:
    footprints in index order, then rows, then columns.

    Args:
        dataset: a geo dataset (reads ``dataset.index`` and ``dataset.res``).
        size: patch size, a number or ``(height, width)``, in ``units``.
        stride: distance between patches (default ``size``: no overlap).
            A stride larger than the size leaves gaps.
        roi: region of interest (see :class:`~pipekit.geo.samplers.RandomGeoSampler`).
        toi: time of interest (see :class:`RandomGeoSampler`).
        units: ``"pixels"`` (default) or ``"crs"``.
        time_window: for time series datasets (``RasterDataset(time_series=True)``):
            patches span a time window instead of one footprint's time (no
            TorchGeo 0.8 sampler has this).  An int ``N``: ``N`` consecutive
            scenes of a place (footprints overlapping by half or more); a
            ``timedelta``: that long from a scene's start.  The grid then
            repeats for windows that cover each scene once (see
            :func:`~pipekit.geo.samplers._time_windows.time_windows`).

    Example:
        >>> from types import SimpleNamespace
        >>> from pipekit.geo._index import GeoIndex
        >>> from pipekit.geo.samplers import GridGeoSampler
        >>> ds = SimpleNamespace(index=GeoIndex([[0, 50, 0, 30]]), res=(1.0, 1.0))
        >>> sampler = GridGeoSampler(ds, size=20)
        >>> len(sampler)
        6
        >>> [(x.start, x.stop, y.start, y.stop) for x, y, t in sampler]  # doctest: +NORMALIZE_WHITESPACE
        [(0.0, 20.0, 10.0, 30.0), (20.0, 40.0, 10.0, 30.0), (30.0, 50.0, 10.0, 30.0),
         (0.0, 20.0, 0.0, 20.0), (20.0, 40.0, 0.0, 20.0), (30.0, 50.0, 0.0, 20.0)]
    """

    def __init__(
        self,
        dataset: Any,
        size: float | tuple[float, float],
        stride: float | tuple[float, float] | None = None,
        roi: Any = None,
        toi: Any = None,
        units: Units | str = Units.PIXELS,
        *,
        time_window: Any = None,
    ) -> None:
        super().__init__(dataset, roi, toi)
        self.units = _units(units)
        pixels = self.units is Units.PIXELS
        size = _pair(size, "size")
        stride = size if stride is None else _pair(stride, "stride")
        if pixels:
            size = (size[0] * self.res[1], size[1] * self.res[0])
            stride = (stride[0] * self.res[1], stride[1] * self.res[0])
        self.size: tuple[float, float] = size
        self.stride: tuple[float, float] = stride
        self._keep_fitting(size)
        self._apply_time_window(time_window)
        if len(self.skipped):
            warnings.warn(
                f"GridGeoSampler: {len(self.skipped)} footprint(s) smaller than the "
                f"{size[0]:g} x {size[1]:g} patch are not sampled (indices in sampler.skipped: "
                f"{self.skipped[:10].tolist()}{'...' if len(self.skipped) > 10 else ''})",
                stacklevel=2,
            )
        b = self.footprints
        self._rows = _rows_cols(b[:, 3] - b[:, 2], size[0], stride[0])
        self._cols = _rows_cols(b[:, 1] - b[:, 0], size[1], stride[1])
        counts = self._rows * self._cols
        self._ends = np.cumsum(counts)
        self.length = int(self._ends[-1]) if len(counts) else 0

    def _boxes_at(self, pos: np.ndarray) -> np.ndarray:
        """The boxes ``[n, 6]`` at epoch positions ``pos``."""
        b = self.footprints
        h, w = self.size
        sy, sx = self.stride
        f = np.searchsorted(self._ends, pos, side="right")
        k = pos - (self._ends[f] - self._rows[f] * self._cols[f])
        r, c = np.divmod(k, self._cols[f])
        fb = b[f]
        out = np.empty((len(pos), 6))
        minx = fb[:, 0] + c * sx
        last_col = c == self._cols[f] - 1
        minx[last_col] = np.maximum(fb[last_col, 0], fb[last_col, 1] - w)
        maxy = fb[:, 3] - r * sy
        last_row = r == self._rows[f] - 1
        maxy[last_row] = np.minimum(fb[last_row, 3], fb[last_row, 2] + h)
        out[:, 0], out[:, 1] = minx, minx + w
        out[:, 2], out[:, 3] = maxy - h, maxy
        out[:, 4], out[:, 5] = fb[:, 4], fb[:, 5]
        return out

    def _chunk(self, seed: int | None, c: int) -> list[tuple[slice, slice, slice]]:
        pos = np.arange(c * _CHUNK, min((c + 1) * _CHUNK, self.length), dtype=np.int64)
        return _boxes(self._boxes_at(pos))

    def __len__(self) -> int:
        return self.length
