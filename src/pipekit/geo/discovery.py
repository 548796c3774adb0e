"""Finding the files of a raster dataset and what their names and headers say.

* scanning roots (directories, files, globs, fsspec URLs, lists of them)
  for ``filename_glob``, skipping hidden files and GDAL's side files
  (:class:`_Lister`, :func:`_is_sidecar`, :func:`_split_name`);
* dates from file names at their format's precision (:func:`date_interval`);
* the per-file metadata of an index, kept in arrays (:class:`_FileTable`),
  and :class:`GeoReferenceError` for a raster that cannot be placed on the map.
"""

from __future__ import annotations

import fnmatch
import glob as globlib
import math
import os
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
from affine import Affine
from rasterio.crs import CRS

from pipekit.errors import StageError
from pipekit.geo import io as geo_io
from pipekit.geo.read import apply_affine, transform_bounds_fast

__all__ = ["GeoReferenceError", "date_interval"]


class GeoReferenceError(StageError, ValueError):
    """A raster cannot be placed on the map: it has no CRS or no geotransform."""


_PRECISION_STEPS = (
    ("%f", "microsecond"),
    ("%S", "second"),
    ("%s", "second"),
    ("%T", "second"),
    ("%M", "minute"),
    ("%H", "hour"),
    ("%I", "hour"),
    ("%d", "day"),
    ("%j", "day"),
    ("%m", "month"),
    ("%b", "month"),
    ("%B", "month"),
)


def date_interval(text: str, date_format: str) -> tuple[float, float]:
    """The time interval (POSIX seconds) a date string stands for at its format's precision.

    ``"2021"`` with ``"%Y"`` is the whole year 2021; ``"20210701"`` with
    ``"%Y%m%d"`` that day.  The end is one microsecond before the next period.

    Example:
        >>> from datetime import datetime, timezone
        >>> start, end = date_interval("20210701", "%Y%m%d")
        >>> datetime.fromtimestamp(start, timezone.utc).isoformat()
        '2021-07-01T00:00:00+00:00'
        >>> round(end - start, 6)
        86399.999999
    """
    start = datetime.strptime(text, date_format)
    if start.tzinfo is None:
        start = start.replace(tzinfo=timezone.utc)
    unit = "year"
    for directive, name in _PRECISION_STEPS:
        if directive in date_format:
            unit = name
            break
    if unit == "year":
        end = start.replace(year=start.year + 1, month=1, day=1, hour=0, minute=0, second=0, microsecond=0)
    elif unit == "month":
        year, month = (start.year + 1, 1) if start.month == 12 else (start.year, start.month + 1)
        end = start.replace(year=year, month=month, day=1, hour=0, minute=0, second=0, microsecond=0)
    else:
        step = {"day": timedelta(days=1), "hour": timedelta(hours=1), "minute": timedelta(minutes=1),
                "second": timedelta(seconds=1), "microsecond": timedelta(microseconds=1)}[unit]
        end = start + step
    return start.timestamp(), end.timestamp() - 1e-6


def _as_list(root: Any) -> list[str]:
    if isinstance(root, (str, os.PathLike)):
        return [os.fspath(root)]
    if isinstance(root, Iterable):
        items = [os.fspath(r) for r in root]
        if not items:
            raise ValueError("root is an empty list")
        return items
    raise TypeError(f"root must be a path, URL, glob or a list of them, got {type(root).__name__}")


def _has_magic(path: str) -> bool:
    return any(c in path for c in "*?[")


class _Lister:
    """Lists files under local paths and fsspec URLs (one filesystem per protocol)."""

    def __init__(self, storage_options: Mapping[str, Any]) -> None:
        self.storage_options = dict(storage_options)
        self._dirs: dict[str, set[str]] = {}

    def _fs(self, url: str) -> tuple[Any, str]:
        import fsspec

        return fsspec.core.url_to_fs(url, **self.storage_options)

    def expand(self, root: str, pattern: str) -> tuple[list[str], bool]:
        """The files ``root`` stands for, and whether they were named explicitly (not found by a scan)."""
        if geo_io.is_local(root):
            path = geo_io.local_path(root)
            if os.path.isdir(path):
                found = []
                for dirpath, _, names in os.walk(path):
                    for fname in names:
                        rel = os.path.relpath(os.path.join(dirpath, fname), path)
                        if fnmatch.fnmatchcase(fname, pattern) or fnmatch.fnmatchcase(rel, pattern):
                            found.append(os.path.join(dirpath, fname))
                return found, False
            if _has_magic(path):
                return [p for p in globlib.glob(path, recursive=True) if os.path.isfile(p)], False
            if os.path.isfile(path):
                return [path], True
            raise FileNotFoundError(f"no such file or directory: {root!r}")
        fs, path = self._fs(root)
        if _has_magic(path):
            return [fs.unstrip_protocol(p) for p in fs.glob(path) if fs.isfile(p)], False
        if fs.isdir(path):
            base = path.rstrip("/")
            found = []
            for p in fs.find(base):
                fname = p.rsplit("/", 1)[-1]
                rel = p[len(base) + 1:]
                if fnmatch.fnmatchcase(fname, pattern) or fnmatch.fnmatchcase(rel, pattern):
                    found.append(fs.unstrip_protocol(p))
            return found, False
        if fs.isfile(path):
            return [fs.unstrip_protocol(path)], True
        raise FileNotFoundError(f"no such file or directory: {root!r}")

    def siblings(self, path: str) -> set[str]:
        """Names of the files in ``path``'s directory (listed once per directory)."""
        if geo_io.is_local(path):
            directory = os.path.dirname(geo_io.local_path(path)) or "."
        else:
            directory = path.rsplit("/", 1)[0]
        names = self._dirs.get(directory)
        if names is None:
            if geo_io.is_local(directory):
                try:
                    names = set(os.listdir(directory))
                except OSError:
                    names = set()
            else:
                fs, p = self._fs(directory)
                try:
                    names = {e.rstrip("/").rsplit("/", 1)[-1] for e in fs.ls(p, detail=False)}
                except OSError:
                    names = set()
            self._dirs[directory] = names
        return names


def _split_name(path: str) -> tuple[str, str]:
    """``(directory with separator, file name)`` of a local path or URL."""
    if geo_io.is_local(path):
        head, tail = os.path.split(path)
        return (head + os.sep if head else ""), tail
    head, _, tail = path.rpartition("/")
    return head + "/", tail


_SIDECAR_SUFFIXES = (".aux.xml", ".ovr", ".msk")


def _is_sidecar(name: str) -> bool:
    """Hidden files (``.complete``, ``.DS_Store``) and GDAL's side files found next to rasters."""
    return name.startswith(".") or name.lower().endswith(_SIDECAR_SUFFIXES)


class _FileTable:
    """Per-file metadata in arrays (cheap to pickle for 100,000 files)."""

    def __init__(self, paths: list[str], metas: list[dict[str, Any]], times: np.ndarray,
                 band_spans: np.ndarray | None, band_overrides: dict[tuple[int, str], str]) -> None:
        # a shared leading string (not path components): names are stored without it
        prefix = os.path.commonprefix(paths) if len(paths) > 1 else ""  # noqa: RUF071
        self.prefix = prefix
        self.names = [p[len(prefix):] for p in paths]
        crs_list: list[CRS] = []
        crs_keys: dict[str, int] = {}
        crs_ids = np.empty(len(paths), dtype=np.int32)
        dtypes: list[str] = []
        dtype_ids = np.empty(len(paths), dtype=np.int16)
        self.transforms = np.empty((len(paths), 6), dtype=np.float64)
        self.shapes = np.empty((len(paths), 2), dtype=np.int64)
        self.counts = np.empty(len(paths), dtype=np.int32)
        self.nodata = np.full(len(paths), np.nan, dtype=np.float64)
        self.has_nodata = np.zeros(len(paths), dtype=bool)
        for i, meta in enumerate(metas):
            wkt = meta["crs"].to_wkt()
            if wkt not in crs_keys:
                crs_keys[wkt] = len(crs_list)
                crs_list.append(meta["crs"])
            crs_ids[i] = crs_keys[wkt]
            if meta["dtype"] not in dtypes:
                dtypes.append(meta["dtype"])
            dtype_ids[i] = dtypes.index(meta["dtype"])
            t = meta["transform"]
            self.transforms[i] = (t.a, t.b, t.c, t.d, t.e, t.f)
            self.shapes[i] = (meta["height"], meta["width"])
            self.counts[i] = meta["count"]
            if meta["nodata"] is not None:
                self.nodata[i] = meta["nodata"]
                self.has_nodata[i] = True
        self.crs_list = crs_list
        self.crs_ids = crs_ids
        self.dtypes = dtypes
        self.dtype_ids = dtype_ids
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
        """``[N, 4]`` (minx, maxx, miny, maxy) of every file in ``crs`` (densified edge transforms)."""
        out = np.empty((len(self), 4), dtype=np.float64)
        same = {k: bool(c == crs) for k, c in enumerate(self.crs_list)}
        for i in range(len(self)):
            left, bottom, right, top = self.native_bounds(i)
            if not same[int(self.crs_ids[i])]:
                left, bottom, right, top = transform_bounds_fast(self.crs(i), crs, left, bottom, right, top)
            out[i] = (left, right, bottom, top)
        return out
