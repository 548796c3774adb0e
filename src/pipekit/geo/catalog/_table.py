"""The per-file metadata of a raster index, in arrays: :class:`HeaderColumns` and ``_FileTable``.

:class:`HeaderColumns` holds the index-relevant fields of many
:class:`~pipekit.geo.catalog._headers.RasterHeader`\\ s (CRSs and dtypes as
codes); ``_FileTable`` adds the paths (their common prefix stored once),
times and band spans, and answers per-file questions (path, band path,
bounds, footprints in a CRS).  Saved and reloaded by
:mod:`pipekit.geo.catalog._saved_index`.
"""

from __future__ import annotations

import math
import operator
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from affine import Affine
from rasterio.crs import CRS

from pipekit.geo._antimeridian import footprint_parts
from pipekit.geo._read import apply_affine
from pipekit.geo.catalog._headers import RasterHeader, _wkt

__all__ = ["HeaderColumns", "join_parts"]


def _strip_prefix(paths: list[str]) -> tuple[str, list[str]]:
    """The leading string all ``paths`` share (not path components), and the paths without it.

    Sorted paths (a listing) share the prefix of their first and last: that
    is checked and the rest cut in one pass over the joined paths (``str``
    methods, no slice per path); anything else takes ``os.path.commonprefix``.

    Example:
        >>> _strip_prefix(["/data/t_01.tif", "/data/t_02.tif"])
        ('/data/t_0', ['1.tif', '2.tif'])
    """
    if len(paths) < 2:
        return "", list(paths)
    # the paths' common prefix is that of the first and last when every path starts with it (always if sorted)
    prefix = os.path.commonprefix([paths[0], paths[-1]])  # noqa: RUF071
    if not prefix:
        return "", list(paths)
    joined = "\0".join(paths)
    cut = "\0" + prefix
    # no path holds NUL (so each one follows a separator) and each separator is followed by the prefix
    if joined.count("\0") == len(paths) - 1 and joined.startswith(prefix) and joined.count(cut) == len(paths) - 1:
        return prefix, joined[len(prefix) :].split(cut)
    prefix = os.path.commonprefix(paths)  # noqa: RUF071
    return prefix, (list(map(operator.itemgetter(slice(len(prefix), None)), paths)) if prefix else list(paths))


class _FileTable:
    """Per-file metadata in arrays (cheap to pickle for 100,000 files)."""

    def __init__(
        self,
        paths: list[str],
        headers: list[RasterHeader],
        times: np.ndarray,
        band_spans: np.ndarray | None,
        band_overrides: dict[tuple[int, str], str],
    ) -> None:
        columns = HeaderColumns.from_headers(headers)
        self._set(paths, columns, times, band_spans, band_overrides)

    @classmethod
    def from_columns(
        cls,
        paths: list[str],
        columns: HeaderColumns,
        times: np.ndarray,
        band_spans: np.ndarray | None,
        band_overrides: dict[tuple[int, str], str],
    ) -> _FileTable:
        """A table from headers already in columns (a saved index, :mod:`pipekit.geo.catalog._saved_index`)."""
        table = cls.__new__(cls)
        table._set(paths, columns, times, band_spans, band_overrides)
        return table

    def _set(
        self,
        paths: list[str],
        columns: HeaderColumns,
        times: np.ndarray,
        band_spans: np.ndarray | None,
        band_overrides: dict[tuple[int, str], str],
    ) -> None:
        self.prefix, self.names = _strip_prefix(paths)
        self.crs_list = columns.crs_list
        self.crs_ids = columns.crs_ids
        self.dtypes = columns.dtypes
        self.dtype_ids = columns.dtype_ids
        self.transforms = columns.transforms
        self.shapes = columns.shapes
        self.counts = columns.counts
        self.nodata = columns.nodata
        self.has_nodata = columns.has_nodata
        self.times = times
        self.band_spans = band_spans
        self.band_overrides = band_overrides

    def __len__(self) -> int:
        return len(self.names)

    def path(self, i: int) -> str:
        return self.prefix + self.names[i]

    def band_path(self, i: int, band: str) -> str:
        override = self.band_overrides.get((i, band))
        if override is not None:
            return override
        path = self.path(i)
        start, stop = self.band_spans[i]
        return path[:start] + band + path[stop:]

    def crs(self, i: int) -> CRS:
        return self.crs_list[int(self.crs_ids[i])]

    def transform(self, i: int) -> Affine:
        return Affine(*self.transforms[i])

    def native_bounds(self, i: int) -> tuple[float, float, float, float]:
        """``(left, bottom, right, top)`` of file ``i`` in its own CRS (rotation-aware)."""
        t = self.transform(i)
        h, w = self.shapes[i]
        xs, ys = zip(*(apply_affine(t, c, r) for c, r in ((0, 0), (w, 0), (0, h), (w, h))))
        return min(xs), min(ys), max(xs), max(ys)

    def file_nodata(self, i: int) -> float | None:
        return float(self.nodata[i]) if self.has_nodata[i] else None

    def res(self, i: int) -> tuple[float, float]:
        t = self.transform(i)
        return math.hypot(t.a, t.d), math.hypot(t.b, t.e)

    def footprints(self, crs: CRS) -> np.ndarray:
        """``[N, 4]`` (minx, maxx, miny, maxy) of every file in ``crs`` (densified edge transforms).

        A file whose footprint is split at the antimeridian (see :meth:`footprint_entries`) gives its first part.
        """
        return self.footprint_entries(crs)[0][: len(self)]

    def footprint_entries(self, crs: CRS) -> tuple[np.ndarray, np.ndarray | None]:
        """``([M, 4] footprints, [M] file rows)`` in ``crs``: one per file, then the second parts of those split.

        A file whose bounds cross the antimeridian in a CRS cut there
        (``EPSG:4326``, ``EPSG:3857``) has two footprints, one on each side
        (:func:`~pipekit.geo._antimeridian.footprint_parts`): its first in row
        order, its second after the ``N`` rows.  ``rows`` is ``None`` when no
        footprint is split (footprint ``i`` is file ``i``'s).
        """
        out = np.empty((len(self), 4), dtype=np.float64)
        if not len(self):
            return out, None
        a, b, c, d, e, f = (np.ascontiguousarray(column) for column in self.transforms.T)
        h, w = self.shapes[:, 0].astype(np.float64), self.shapes[:, 1].astype(np.float64)
        zero = np.zeros_like(w)
        # the four corners (0, 0), (w, 0), (0, h), (w, h) of every file, vectorised (rotation-aware); one
        # elementwise min/max per pair of corners (reducing along a short axis of [N, 4] cost 4x as much)
        corners = ((zero, zero), (w, zero), (zero, h), (w, h))
        xs = [a * col + b * row + c for col, row in corners]
        ys = [d * col + e * row + f for col, row in corners]
        out[:, 0] = np.minimum(np.minimum(xs[0], xs[1]), np.minimum(xs[2], xs[3]))
        out[:, 1] = np.maximum(np.maximum(xs[0], xs[1]), np.maximum(xs[2], xs[3]))
        out[:, 2] = np.minimum(np.minimum(ys[0], ys[1]), np.minimum(ys[2], ys[3]))
        out[:, 3] = np.maximum(np.maximum(ys[0], ys[1]), np.maximum(ys[2], ys[3]))
        extra_rows: list[int] = []
        extra: list[tuple[float, float, float, float]] = []
        for k, file_crs in enumerate(self.crs_list):
            if file_crs == crs:
                continue
            for i in np.flatnonzero(self.crs_ids == k).tolist():
                minx, maxx, miny, maxy = out[i]
                first, *rest = footprint_parts(file_crs, crs, minx, miny, maxx, maxy)
                out[i] = (first[0], first[2], first[1], first[3])
                for left, bottom, right, top in rest:
                    extra_rows.append(i)
                    extra.append((left, right, bottom, top))
        return join_parts(out, extra_rows, extra)


def join_parts(
    boxes: np.ndarray, extra_rows: list[int], extra: list[tuple[float, float, float, float]]
) -> tuple[np.ndarray, np.ndarray | None]:
    """``boxes`` (one per row) followed by the ``extra`` parts of rows ``extra_rows``, and each box's row.

    Example:
        >>> boxes, rows = join_parts(np.zeros((2, 4)), [1], [(-180.0, -179.5, -17.9, -17.0)])
        >>> boxes.shape, rows.tolist()
        ((3, 4), [0, 1, 1])
        >>> join_parts(np.zeros((2, 4)), [], [])[1] is None
        True
    """
    if not extra_rows:
        return boxes, None
    rows = np.concatenate([np.arange(len(boxes)), np.asarray(extra_rows, dtype=np.int64)])
    return np.concatenate([boxes, np.asarray(extra, dtype=np.float64).reshape(-1, 4)]), rows


class HeaderColumns:
    """The index-relevant fields of many :class:`RasterHeader`\\ s, in arrays (CRSs and dtypes as codes).

    Attributes:
        crs_list, crs_ids: the distinct CRSs and each file's position in that list.
        dtypes, dtype_ids: the distinct data types and each file's.
        transforms: ``[N, 6]`` ``(a, b, c, d, e, f)``; shapes: ``[N, 2]`` ``(height, width)``;
        counts: bands; nodata, has_nodata: the nodata value (``NaN`` where it has none).
    """

    def __init__(
        self,
        crs_list: list[CRS],
        crs_ids: np.ndarray,
        dtypes: list[str],
        dtype_ids: np.ndarray,
        transforms: np.ndarray,
        shapes: np.ndarray,
        counts: np.ndarray,
        nodata: np.ndarray,
        has_nodata: np.ndarray,
    ) -> None:
        self.crs_list = crs_list
        self.crs_ids = np.asarray(crs_ids, dtype=np.int32)
        self.dtypes = dtypes
        self.dtype_ids = np.asarray(dtype_ids, dtype=np.int16)
        self.transforms = np.asarray(transforms, dtype=np.float64).reshape(-1, 6)
        self.shapes = np.asarray(shapes, dtype=np.int64).reshape(-1, 2)
        self.counts = np.asarray(counts, dtype=np.int32)
        self.nodata = np.asarray(nodata, dtype=np.float64)
        self.has_nodata = np.asarray(has_nodata, dtype=bool)

    def __len__(self) -> int:
        return len(self.crs_ids)

    @classmethod
    def from_headers(cls, headers: Sequence[RasterHeader]) -> HeaderColumns:
        n = len(headers)
        crs_list: list[CRS] = []
        crs_keys: dict[str, int] = {}
        crs_ids = np.empty(n, dtype=np.int32)
        dtypes: list[str] = []
        dtype_ids = np.empty(n, dtype=np.int16)
        transforms = np.empty((n, 6), dtype=np.float64)
        shapes = np.empty((n, 2), dtype=np.int64)
        counts = np.empty(n, dtype=np.int32)
        nodata = np.full(n, np.nan, dtype=np.float64)
        has_nodata = np.zeros(n, dtype=bool)
        for i, header in enumerate(headers):
            wkt = _wkt(header.crs)
            if wkt not in crs_keys:
                crs_keys[wkt] = len(crs_list)
                crs_list.append(header.crs)
            crs_ids[i] = crs_keys[wkt]
            if header.dtype not in dtypes:
                dtypes.append(header.dtype)
            dtype_ids[i] = dtypes.index(header.dtype)
            t = header.transform
            transforms[i] = (t.a, t.b, t.c, t.d, t.e, t.f)
            shapes[i] = (header.height, header.width)
            counts[i] = header.count
            if header.nodata is not None:
                nodata[i] = header.nodata
                has_nodata[i] = True
        return cls(crs_list, crs_ids, dtypes, dtype_ids, transforms, shapes, counts, nodata, has_nodata)

    def take(self, rows: Any) -> HeaderColumns:
        """The columns of ``rows`` (an int array), in that order (the CRS and dtype lists are kept)."""
        rows = np.asarray(rows, dtype=np.int64)
        return HeaderColumns(
            self.crs_list,
            self.crs_ids[rows],
            self.dtypes,
            self.dtype_ids[rows],
            self.transforms[rows],
            self.shapes[rows],
            self.counts[rows],
            self.nodata[rows],
            self.has_nodata[rows],
        )

    def header(self, i: int, url: str) -> RasterHeader:
        """Row ``i`` as a :class:`RasterHeader` (the fields an index needs; the bounds computed)."""
        t = Affine(*self.transforms[i].tolist())
        h, w = (int(v) for v in self.shapes[i])
        xs, ys = zip(*(apply_affine(t, c, r) for c, r in ((0, 0), (w, 0), (0, h), (w, h))))
        return RasterHeader(
            url=url,
            crs=self.crs_list[int(self.crs_ids[i])],
            transform=t,
            width=w,
            height=h,
            count=int(self.counts[i]),
            dtype=self.dtypes[int(self.dtype_ids[i])],
            nodata=float(self.nodata[i]) if self.has_nodata[i] else None,
            bounds=(min(xs), min(ys), max(xs), max(ys)),
        )
