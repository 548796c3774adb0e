"""The headers of a catalog's files: read on threads and in order, reused from a saved index, saved again.

:class:`CachedHeaders` is what a :class:`~pipekit.geo.catalog.FileCatalog`
does with ``index_cache=``, ``index_workers=`` and ``progress=``: each file's
header (CRS, transform, size, bands, data type, nodata) is read once -- local
GeoTIFFs parsed directly, anything else opened with rasterio, on a thread pool
-- unless a saved index (:mod:`pipekit.geo.catalog._saved_index`) holds it
with the file's current fingerprint.  It remembers the fingerprints of the
files it indexed, so that the dataset can save its index (``save_index()``);
they are not pickled (a DataLoader worker's copy holds none).
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from rasterio.crs import CRS

from pipekit.errors import ReadError, StageError
from pipekit.geo import io as geo_io
from pipekit.geo._tiff_header import FastHeaderReader
from pipekit.geo.catalog._fingerprints import MtimeStamps, _fingerprint_columns
from pipekit.geo.catalog._headers import RasterHeader, check_workers, read_header, read_headers
from pipekit.geo.catalog._listing import gc_paused
from pipekit.geo.catalog._saved_index import DEFAULT_NAME, IndexCacheError, SavedIndex, read_index, write_index
from pipekit.geo.catalog._table import HeaderColumns, _FileTable

__all__ = ["CachedHeaders"]

logger = logging.getLogger("pipekit.geo")


class CachedHeaders:
    """The headers of files, reused from a saved index where the files did not change, and that index saved.

    Args:
        root: the dataset's root (``index_cache=True`` keeps the index in it: one folder).
        opener: how files are opened (:class:`pipekit.geo.io.RasterOpener`).
        name: the dataset's name (errors, logs).
        index_cache: ``True`` (``<root>/.pipekit-index.parquet``), a path or fsspec URL, or ``None``.
        index_workers: threads that read headers (``None``: :func:`pipekit.geo.catalog._headers.default_workers`).
        progress: a tqdm bar while headers are read (``None``: for 5,000 files or more).

    Raises:
        TypeError: ``index_cache`` or ``progress`` is of another type.
    """

    def __init__(
        self, root: Any, opener: geo_io.RasterOpener, name: str, index_cache: Any, index_workers: Any, progress: Any
    ) -> None:
        if index_cache is not None and not isinstance(index_cache, (bool, str, os.PathLike)):
            raise TypeError(f"index_cache must be True, a path or URL, or None, got {index_cache!r}")
        if progress is not None and not isinstance(progress, bool):
            raise TypeError(f"progress must be a bool or None, got {progress!r}")
        self.root = root
        self.opener = opener
        self.name = name
        self.index_cache = None if index_cache is False else index_cache
        self.index_workers = check_workers(index_workers)
        self.progress = progress
        self.record: tuple[list[str], np.ndarray, Sequence[str]] | None = None  # paths, sizes, stamps
        self.pending_save: str | None = None  # where the index found out of date is to be saved

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["record"] = None  # only save needs it: never sent to DataLoader workers
        return state

    # -- where ------------------------------------------------------------------------------
    def url(self) -> str | None:
        """Where the saved index is read and written (``None`` without ``index_cache``)."""
        choice = self.index_cache
        if choice is None:
            return None
        if choice is not True:
            return os.fspath(choice)
        root = self.root
        if isinstance(root, (str, os.PathLike)):
            root = os.fspath(root)
            if geo_io.is_local(root):
                folder = geo_io.local_path(root)
                if os.path.isdir(folder):
                    return os.path.join(folder, DEFAULT_NAME)
            elif not any(c in root for c in "*?["):
                return root.rstrip("/") + "/" + DEFAULT_NAME
        raise ValueError(
            f"{self.name}: index_cache=True keeps the index next to the data, so the root must be one folder "
            f"(got {root!r}); pass index_cache='path/to/index.parquet' instead"
        )

    # -- reading headers ---------------------------------------------------------------------
    def _header_or_error(
        self, path: str, changed: frozenset[str] = frozenset(), reader: FastHeaderReader | None = None
    ) -> RasterHeader | StageError:
        opener = self.opener
        if path in changed and not geo_io.is_local(path):
            # a remote file that changed since it was saved: GDAL's /vsis3/ and /vsicurl/ keep what they
            # read of a URL for the life of the process, so read the new bytes through fsspec instead
            opener = geo_io.RasterOpener(opener.storage_options, False, opener.gdal_options)
            reader = None
        try:
            if reader is not None:  # local GeoTIFFs parsed directly, anything else by rasterio
                header = reader(path)
            else:
                header = read_header(opener, path, self.name)
        except ReadError as exc:
            return exc
        error = header.index_error(self.name)
        return header if error is None else error

    def _load_saved(self, url: str) -> SavedIndex | None:
        try:
            return read_index(url, self.opener.storage_options, f"{self.name}.index_cache")
        except IndexCacheError as exc:
            warnings.warn(f"{exc}; building the index from the files and saving it again", UserWarning, stacklevel=4)
            return None

    def read(self, paths: list[str], skip_or_raise: Callable[[StageError], None]) -> tuple[HeaderColumns, list[int]]:
        """The headers of the files that can be indexed (in columns) and their positions in ``paths``.

        Reuses a saved index (``index_cache``) for the files that did not
        change, reads the others on a thread pool, and reports the files
        that cannot be indexed in the order of ``paths`` (``skip_or_raise``),
        as reading them one by one would.
        """
        with gc_paused():  # many long-lived small objects: see gc_paused
            return self._read_now(paths, skip_or_raise)

    def _read_now(
        self, paths: list[str], skip_or_raise: Callable[[StageError], None]
    ) -> tuple[HeaderColumns, list[int]]:
        name = self.name
        url = self.url()
        sizes, stamps = _fingerprint_columns(paths, self.opener.storage_options, stage=f"{name}.index_cache")
        saved = self._load_saved(url) if url is not None else None
        found = saved.rows_of(paths, sizes, stamps) if saved is not None else np.full(len(paths), -1, dtype=np.int64)
        misses = np.flatnonzero(found < 0).tolist()
        changed = frozenset(paths[i] for i in misses if saved is not None and paths[i] in saved.rows)
        opener = self.opener
        reader = FastHeaderReader(lambda p: read_header(opener, p, name))
        workers = self.index_workers
        if misses and not geo_io.is_local(paths[misses[0]]) and opener.resolve(paths[misses[0]]).kind != "vsi":
            # fsspec file objects through rasterio's Python-file handler: kept on one thread. An abort once
            # blamed on concurrent opens was a read raising into GDAL (fixed: see geo_io.OpenerReadError).
            # rasterio keeps that handler's open files per thread (rasterio#3636: a file used from another
            # thread is not found); reads through the range cache run on the I/O lanes, each file opened,
            # read and closed on one lane, but headers are few and stay serial here
            workers = 1
        results = read_headers(
            [paths[i] for i in misses],
            lambda p: self._header_or_error(p, changed, reader),
            workers,
            self.progress,
            desc=f"{name}: reading headers",
        )
        if misses:
            logger.info("%s: %d header(s) parsed directly, %d read with rasterio", name, reader.fast, reader.slow)
        # the files kept: those reused, and those read whose headers can be indexed (errors reported in order)
        keep = found >= 0
        fresh: list[RasterHeader] = []
        fresh_at: list[int] = []
        for i, result in zip(misses, results):
            if isinstance(result, StageError):
                skip_or_raise(result)
                continue
            keep[i] = True
            fresh_at.append(i)
            fresh.append(result)
        position = np.cumsum(keep) - 1  # each kept file's row in the index
        cached_at = np.flatnonzero(found >= 0)
        cached_from = found[cached_at]
        ok = np.flatnonzero(keep).tolist()
        parts = []
        if fresh:
            parts.append((HeaderColumns.from_headers(fresh), position[np.array(fresh_at, dtype=np.int64)]))
        if saved is not None and len(cached_from):
            # every saved row, in order (nothing changed, the reload's common case): no copy
            unchanged = len(cached_from) == len(saved) and bool((cached_from == np.arange(len(saved))).all())
            parts.append((saved.columns if unchanged else saved.columns.take(cached_from), position[cached_at]))
        columns = _merge(parts, len(ok))
        if len(ok) == len(paths):  # every file kept (the common case): no copies
            self.record = (list(paths), sizes, stamps)
        else:
            kept_stamps = stamps.take(ok) if isinstance(stamps, MtimeStamps) else [stamps[i] for i in ok]
            self.record = ([paths[i] for i in ok], sizes[ok], kept_stamps)
        if url is not None:
            removed = len(saved) - len(cached_from) if saved is not None else 0
            changed = len(fresh) > 0 or removed > 0 or saved is None
            logger.info(
                "%s: saved index %s: %d file(s) reused, %d read, %d no longer there",
                name,
                url,
                len(cached_from),
                len(misses),
                removed,
            )
            if changed and ok:
                self.pending_save = url
        return columns, ok

    # -- saving -------------------------------------------------------------------------------
    def save(self, path: Any, files: _FileTable, crs: CRS) -> str:
        """Save the headers of the files indexed (``files``, footprints in ``crs``) and return where.

        ``path``: a local path or fsspec URL (``None``: ``index_cache``'s
        location, ``<root>/.pipekit-index.parquet`` for ``index_cache=True`` or
        when none was given and the root is one folder).

        Raises:
            RuntimeError: this copy was unpickled (it holds no fingerprints).
        """
        record = self.record
        if record is None:
            raise RuntimeError(
                f"{self.name}.save_index: this copy of the dataset was unpickled and holds no file "
                "fingerprints; save the index from the dataset that was built"
            )
        if path is None:
            previous = self.index_cache
            self.index_cache = previous if previous not in (None, False) else True
            try:
                url = self.url()
            finally:
                self.index_cache = previous
        else:
            url = os.fspath(path)
        paths, sizes, stamps = record
        columns = HeaderColumns(
            files.crs_list,
            files.crs_ids,
            files.dtypes,
            files.dtype_ids,
            files.transforms,
            files.shapes,
            files.counts,
            files.nodata,
            files.has_nodata,
        )
        write_index(url, paths, sizes, stamps, columns, crs, self.opener.storage_options)
        return url


def _merge(parts: Sequence[tuple[HeaderColumns, np.ndarray]], n: int) -> HeaderColumns:
    """Columns of ``n`` rows gathered from ``parts``: ``(columns, their target rows)``, CRSs and dtypes merged.

    One part that fills every row in order (a reload where nothing changed)
    is taken as it is, its codes renumbered only if needed.
    """
    crs_list: list[CRS] = []
    keys: dict[str, int] = {}
    dtypes: list[str] = []
    maps = []
    for columns, _ in parts:
        crs_map = np.empty(len(columns.crs_list), dtype=np.int32)
        for k, crs in enumerate(columns.crs_list):
            wkt = crs.to_wkt()
            if wkt not in keys:
                keys[wkt] = len(crs_list)
                crs_list.append(crs)
            crs_map[k] = keys[wkt]
        dtype_map = np.empty(len(columns.dtypes), dtype=np.int16)
        for k, dtype in enumerate(columns.dtypes):
            if dtype not in dtypes:
                dtypes.append(dtype)
            dtype_map[k] = dtypes.index(dtype)
        maps.append((crs_map, dtype_map))
    whole = len(parts) == 1 and len(parts[0][1]) == n and bool((parts[0][1] == np.arange(n)).all())
    if whole:  # every row from one part, in order: its arrays as they are
        (columns, _), (crs_map, dtype_map) = parts[0], maps[0]
        crs_ids = _mapped(crs_map, columns.crs_ids)
        dtype_ids = _mapped(dtype_map, columns.dtype_ids)
        transforms, shapes, counts = columns.transforms, columns.shapes, columns.counts
        nodata, has_nodata = columns.nodata, columns.has_nodata
    else:
        crs_ids = np.zeros(n, dtype=np.int32)
        dtype_ids = np.zeros(n, dtype=np.int16)
        transforms = np.zeros((n, 6))
        shapes = np.zeros((n, 2), dtype=np.int64)
        counts = np.zeros(n, dtype=np.int32)
        nodata = np.full(n, np.nan)
        has_nodata = np.zeros(n, dtype=bool)
        for (columns, rows), (crs_map, dtype_map) in zip(parts, maps):
            if len(rows):
                crs_ids[rows] = crs_map[columns.crs_ids]
                dtype_ids[rows] = dtype_map[columns.dtype_ids]
                transforms[rows] = columns.transforms
                shapes[rows] = columns.shapes
                counts[rows] = columns.counts
                nodata[rows] = columns.nodata
                has_nodata[rows] = columns.has_nodata
    # CRS and dtype codes in order of first use, as reading the headers one by one gives them
    order_c = _first_use_order(crs_ids, len(crs_list))
    order_d = _first_use_order(dtype_ids, len(dtypes))
    return HeaderColumns(
        [crs_list[k] for k in order_c[0]],
        _mapped(order_c[1], crs_ids),
        [dtypes[k] for k in order_d[0]],
        _mapped(order_d[1], dtype_ids),
        transforms,
        shapes,
        counts,
        nodata,
        has_nodata,
    )


def _mapped(code_map: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``code_map[ids]``, or ``ids`` itself where the map changes nothing."""
    if len(code_map) and (code_map == np.arange(len(code_map))).all():
        return ids
    return code_map[ids].astype(ids.dtype, copy=False)


def _first_use_order(ids: np.ndarray, count: int) -> tuple[list[int], np.ndarray]:
    """The codes in order of first appearance in ``ids`` (dropping unused ones), and old code -> new code."""
    if len(ids) == 0:
        return [], np.zeros(count, dtype=ids.dtype)
    if count <= 64:  # a few CRSs or dtypes: one comparison per code (faster than sorting 100,000 codes)
        firsts = []
        for code in range(count):
            where = ids == code
            if where.any():
                firsts.append((int(where.argmax()), code))
        used = [code for _, code in sorted(firsts)]
    else:
        _, first_at = np.unique(ids, return_index=True)
        used = [int(ids[i]) for i in sorted(first_at.tolist())]
    remap = np.zeros(max(count, 1), dtype=ids.dtype)
    for new, old in enumerate(used):
        remap[old] = new
    return used, remap
