"""A raster dataset's index saved to GeoParquet and reloaded, checked against the files' sizes and times.

Building a :class:`~pipekit.geo.raster.RasterDataset` reads every file's header
once (CRS, transform, size, bands, data type, nodata): local GeoTIFFs are
parsed directly (:mod:`pipekit.geo.tiff_header`, ~0.1 ms a small file, checked
against rasterio once per kind of file), anything else opened with rasterio
(~0.5 ms a small local file, much more on S3).  The headers can be kept in a GeoParquet
file and reused the next time the dataset is built:

* ``RasterDataset(root, index_cache=True)`` keeps them next to the data
  (``<root>/.pipekit-index.parquet``; ``root`` must be one folder, local
  or remote, and hidden files are never indexed); ``index_cache="path"``
  (or ``"s3://bucket/key"``) anywhere.  The file is read if it is there and
  written (again) when the dataset is built and anything changed;
* ``dataset.save_index(path)`` writes it explicitly, and
  ``RasterDataset(root, index_cache=path)`` reloads it.

The files are always listed again (cheap: one listing, no file opened) and
each file is checked against the size and modification time (local:
``os.stat``'s ``st_mtime_ns``; remote: fsspec's ``ls(detail=True)``, the
ETag where the store gives one) saved with it: a file that changed or was
added is opened again, a removed one dropped; only those are re-read and
the cache rewritten.  Everything the file names say (dates, bands, scenes)
is derived again, so a cache never disagrees with the dataset class.  Files
that could not be indexed are not saved (they fail, or are skipped, again).

A cache that cannot be read (corrupt, truncated, another format or version)
is reported with a ``UserWarning`` naming it and the dataset is built from
the files and the cache rewritten -- never used half-way.

The file is a GeoParquet table (``geopandas.read_parquet`` opens it): one row
per file with ``filepath``, ``size``, ``stamp``, the header columns and a
``geometry`` column of footprints in the dataset CRS, for a look at the data
on a map.  Its schema metadata ``pipekit`` holds the format and version.
"""

from __future__ import annotations

import functools
import io
import itertools
import json
import logging
import operator
import os
import uuid
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from rasterio.crs import CRS

from pipekit.errors import ReadError, StageError
from pipekit.geo import io as geo_io
from pipekit.geo.discovery import (
    HeaderColumns,
    RasterHeader,
    _FileTable,
    _is_local,
    check_workers,
    gc_paused,
    read_header,
    read_headers,
)
from pipekit.geo.tiff_header import FastHeaderReader

__all__ = [
    "DEFAULT_NAME",
    "IndexCacheError",
    "IndexCacheMixin",
    "MtimeStamps",
    "SavedIndex",
    "fingerprint_columns",
    "fingerprints",
    "read_index",
    "write_index",
]

logger = logging.getLogger("pipekit.geo")

#: the file ``index_cache=True`` keeps next to the data (hidden: never indexed itself)
DEFAULT_NAME = ".pipekit-index.parquet"
FORMAT = "pipekit-raster-index"
VERSION = 1

_HEADER_COLUMNS = (
    "filepath",
    "size",
    "stamp",
    "crs",
    "a",
    "b",
    "c",
    "d",
    "e",
    "f",
    "height",
    "width",
    "count",
    "dtype",
    "nodata",
    "has_nodata",
)


class IndexCacheError(StageError, ValueError):
    """A saved index cannot be used: unreadable, corrupt, or not a pipekit index of this version."""


# ---------------------------------------------------------------------------------------------
# fingerprints


def _stamp(entry: Mapping[str, Any]) -> str:
    for key in ("ETag", "etag", "md5", "LastModified", "last_modified", "mtime", "updated", "created"):
        value = entry.get(key)
        if value is not None:
            return f"{key}={value}"
    return ""


def fingerprints(
    paths: Sequence[str],
    storage_options: Mapping[str, Any] | None = None,
    retry: Any = None,
    stage: str = "index_cache",
) -> list[tuple[int, str] | None]:
    """``(size, stamp)`` of every path (``None`` where it cannot be had), in order.

    Local files: ``os.stat`` (the stamp is ``st_mtime_ns``).  Remote ones: one
    ``ls(detail=True)`` per folder (the ETag where the store gives one, else
    its modification time), retried through transient failures.

    Example:
        >>> import tempfile
        >>> path = f"{tempfile.mkdtemp()}/a.bin"
        >>> _ = open(path, "wb").write(b"12345")
        >>> size, stamp = fingerprints([path])[0]
        >>> size, stamp.startswith("mtime_ns=")
        (5, True)
    """
    sizes, stamps = fingerprint_columns(paths, storage_options, retry, stage)
    return [(size, stamp) if size >= 0 else None for size, stamp in zip(sizes.tolist(), stamps)]


def fingerprint_columns(
    paths: Sequence[str],
    storage_options: Mapping[str, Any] | None = None,
    retry: Any = None,
    stage: str = "index_cache",
) -> tuple[np.ndarray, list[str]]:
    """:func:`fingerprints` as columns: sizes (``int64``, ``-1`` where unknown) and stamps (``""`` there).

    Example:
        >>> import tempfile
        >>> path = f"{tempfile.mkdtemp()}/a.bin"
        >>> _ = open(path, "wb").write(b"12345")
        >>> sizes, stamps = fingerprint_columns([path, path + ".gone"])
        >>> sizes.tolist(), stamps[0].startswith("mtime_ns="), stamps[1]
        ([5, -1], True, '')
    """
    sizes, stamps = _fingerprint_columns(paths, storage_options, retry, stage)
    return sizes, stamps.tolist() if isinstance(stamps, MtimeStamps) else stamps


#: files stat'ed per batch by :func:`_stat_plain_paths` (their ``stat_result``\ s are dropped after each)
_STAT_BATCH = 2048


def _fingerprint_columns(
    paths: Sequence[str],
    storage_options: Mapping[str, Any] | None = None,
    retry: Any = None,
    stage: str = "index_cache",
) -> tuple[np.ndarray, Sequence[str]]:
    """:func:`fingerprint_columns`, with the stamps of plain local paths as :class:`MtimeStamps` (integers)."""
    joined = "\n".join(paths)
    if "://" not in joined and "::" not in joined:  # plain local paths only (the common case)
        return _stat_plain_paths(paths)
    n = len(paths)
    sizes = np.full(n, -1, dtype=np.int64)
    stamps = [""] * n
    folders: dict[str, list[int]] = {}
    stat = os.stat
    for i, path in enumerate(paths):
        if "://" not in path and "::" not in path:  # a plain local path
            try:
                st = stat(path)
            except OSError:
                continue
        elif _is_local(path):
            try:
                st = stat(geo_io.local_path(path))
            except OSError:
                continue
        else:
            folders.setdefault(path.rsplit("/", 1)[0], []).append(i)
            continue
        sizes[i] = st.st_size
        stamps[i] = f"mtime_ns={st.st_mtime_ns}"
    if folders:
        import fsspec

        from pipekit.retry import resolve_retry

        policy = resolve_retry(retry)
        for folder, rows in folders.items():
            fs, p = fsspec.core.url_to_fs(folder, **dict(storage_options or {}))
            fs.invalidate_cache(p)  # sizes and ETags as they are now, not from an earlier listing fsspec kept
            entries = policy.call(lambda fs=fs, p=p: fs.ls(p, detail=True), action="list", url=folder, stage=stage)
            by_name = {str(e.get("name", "")).rstrip("/").rsplit("/", 1)[-1]: e for e in entries}
            for i in rows:
                entry = by_name.get(paths[i].rsplit("/", 1)[-1])
                if entry is not None and entry.get("type", "file") != "directory" and entry.get("size") is not None:
                    sizes[i] = int(entry["size"])
                    stamps[i] = _stamp(entry)
    return sizes, stamps


def _stat_plain_paths(paths: Sequence[str]) -> tuple[np.ndarray, MtimeStamps]:
    """Sizes and :class:`MtimeStamps` of local paths (``-1`` and no stamp where ``os.stat`` fails).

    ``os.stat`` is mapped over batches of paths and only the two fields kept
    as integers: no loop step, no stamp text and no numpy item assignment per
    file (100,000 files: the ``stat`` calls themselves are most of the time).
    """
    n = len(paths)
    sizes = np.empty(n, dtype=np.int64)
    mtimes = np.empty(n, dtype=np.int64)
    size_of, mtime_of, stat = operator.attrgetter("st_size"), operator.attrgetter("st_mtime_ns"), os.stat
    for start in range(0, n, _STAT_BATCH):
        batch = paths[start : start + _STAT_BATCH]
        stop = start + len(batch)
        try:
            found = list(map(stat, batch))
        except OSError:  # a file gone (or unreadable) since it was listed: one by one
            for i, path in enumerate(batch, start):
                try:
                    st = stat(path)
                except OSError:
                    sizes[i], mtimes[i] = -1, 0
                    continue
                sizes[i], mtimes[i] = st.st_size, st.st_mtime_ns
            continue
        sizes[start:stop] = np.fromiter(map(size_of, found), dtype=np.int64, count=len(found))
        mtimes[start:stop] = np.fromiter(map(mtime_of, found), dtype=np.int64, count=len(found))
    return sizes, MtimeStamps(mtimes, sizes >= 0)


class MtimeStamps(Sequence[str]):
    """The stamps of local files, ``"mtime_ns=<st_mtime_ns>"`` (``""`` where unknown), kept as integers.

    A saved index is checked against them without a string per file
    (:meth:`SavedIndex.rows_of` compares them as Arrow strings built at
    once); the texts are made when the index is saved.

    Example:
        >>> import numpy as np
        >>> stamps = MtimeStamps(np.array([1700000000123456789, 0]), np.array([True, False]))
        >>> list(stamps), stamps[0], len(stamps)
        (['mtime_ns=1700000000123456789', ''], 'mtime_ns=1700000000123456789', 2)
    """

    def __init__(self, mtimes: np.ndarray, known: np.ndarray) -> None:
        self.mtimes = np.asarray(mtimes, dtype=np.int64)
        self.known = np.asarray(known, dtype=bool)

    def __len__(self) -> int:
        return len(self.mtimes)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return self.tolist()[i]
        return f"mtime_ns={int(self.mtimes[i])}" if self.known[i] else ""

    def __iter__(self) -> Any:
        return iter(self.tolist())

    def tolist(self) -> list[str]:
        """The stamps as text (as :func:`fingerprint_columns` gives them)."""
        return [f"mtime_ns={m}" if k else "" for m, k in zip(self.mtimes.tolist(), self.known.tolist())]

    def take(self, rows: Any) -> MtimeStamps:
        """The stamps of ``rows`` (an int array), in that order."""
        rows = np.asarray(rows, dtype=np.int64)
        return MtimeStamps(self.mtimes[rows], self.known[rows])

    def arrow(self) -> Any:
        """The stamps as a ``pyarrow`` string array (null where unknown), built without a Python string each."""
        import pyarrow as pa
        import pyarrow.compute as pc

        digits = pc.cast(pa.array(self.mtimes, type=pa.int64(), mask=~self.known), pa.string())
        return pc.binary_join_element_wise("mtime_ns=", digits, "")


# ---------------------------------------------------------------------------------------------
# the file


class SavedIndex:
    """The headers of a saved index: ``paths``, their ``sizes`` and ``stamps``, and the ``columns``.

    ``paths`` and ``stamps`` may be given as ``pyarrow`` string arrays (as
    :func:`read_index` reads them): they become lists (and ``rows`` a dict)
    only if asked for; :meth:`rows_of` compares a listing with them in Arrow.
    """

    def __init__(self, paths: Any, sizes: np.ndarray, stamps: Any, columns: HeaderColumns) -> None:
        self._paths = paths
        self._stamps = stamps
        self.sizes = sizes
        self.columns = columns

    def __len__(self) -> int:
        return len(self.sizes)

    @functools.cached_property
    def paths(self) -> list[str]:
        """The saved files' paths."""
        paths = self._paths
        return paths.to_pylist() if hasattr(paths, "to_pylist") else list(paths)

    @functools.cached_property
    def stamps(self) -> list[str]:
        """The saved files' stamps (``mtime_ns=...``, an ETag...)."""
        stamps = self._stamps
        return stamps.to_pylist() if hasattr(stamps, "to_pylist") else list(stamps)

    @functools.cached_property
    def rows(self) -> dict[str, int]:
        """``{path: row}``."""
        return {p: i for i, p in enumerate(self.paths)}

    def _arrow(self, values: Any) -> Any:
        import pyarrow as pa

        return values if isinstance(values, pa.Array) else pa.array(list(values), type=pa.string())

    def _same_paths(self, paths: Sequence[str]) -> bool:
        """Whether ``paths`` are the saved ones, in the same order (compared in Arrow, no dict per file)."""
        import pyarrow as pa

        if len(paths) != len(self):
            return False
        saved = self._arrow(self._paths)
        try:
            now = pa.array(paths, type=saved.type)
        except (pa.ArrowException, UnicodeError):  # a name Arrow cannot hold (undecodable bytes): not these
            return False
        return saved.equals(now)

    def rows_of(self, paths: Sequence[str], sizes: np.ndarray, stamps: Sequence[str]) -> np.ndarray:
        """:meth:`row` for many files at once (their :func:`fingerprint_columns`): ``-1`` where new or changed.

        When the files are the saved ones in the same order (nothing added or
        removed) no dict is looked up; local files' stamps
        (:class:`MtimeStamps`) are compared as Arrow strings.
        """
        n = len(paths)
        if not len(self) or not n:
            return np.full(n, -1, dtype=np.int64)
        if self._same_paths(paths):
            rows = np.arange(n, dtype=np.int64)
            at = rows
        else:
            rows = np.fromiter(map(self.rows.get, paths, itertools.repeat(-1)), dtype=np.int64, count=n)
            at = np.where(rows >= 0, rows, 0)
        if isinstance(stamps, MtimeStamps):
            import pyarrow as pa
            import pyarrow.compute as pc

            saved = self._arrow(self._stamps)
            if at is not rows:
                saved = saved.take(pa.array(at))
            equal = pc.equal(saved, stamps.arrow())  # null (unknown) where a file could not be stat'ed
            same_stamp = np.asarray(pc.fill_null(equal, False).to_numpy(zero_copy_only=False), dtype=bool)
        else:
            now = np.array(stamps, dtype=object)
            same_stamp = (np.array(self.stamps, dtype=object)[at] == now) & (now != "")
        same = (rows >= 0) & (sizes >= 0) & (self.sizes[at] == sizes) & same_stamp
        return np.where(same, rows, -1)

    def row(self, path: str, fingerprint: tuple[int, str] | None) -> int | None:
        """The row of ``path`` if it was saved with this fingerprint (the file did not change), else ``None``."""
        i = self.rows.get(path)
        if i is None or fingerprint is None:
            return None
        if int(self.sizes[i]) != fingerprint[0] or self.stamps[i] != fingerprint[1] or not fingerprint[1]:
            return None
        return i


def _open_fs(url: str, storage_options: Mapping[str, Any] | None) -> tuple[Any, str]:
    import fsspec

    return fsspec.core.url_to_fs(url, **dict(storage_options or {}))


def write_index(
    url: str,
    paths: Sequence[str],
    sizes: Sequence[int],
    stamps: Sequence[str],
    columns: HeaderColumns,
    crs: CRS,
    storage_options: Mapping[str, Any] | None = None,
) -> None:
    """Write the headers of ``paths`` as a GeoParquet file at ``url`` (local: atomically, via a temporary file)."""
    import geopandas
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq
    import shapely

    n = len(paths)
    if not (len(sizes) == len(stamps) == len(columns) == n):
        raise ValueError(f"write_index: {n} paths, {len(sizes)} sizes, {len(stamps)} stamps, {len(columns)} headers")
    table = _FileTable.from_columns(list(paths), columns, np.zeros((n, 2)), None, {})
    box = table.footprints(crs) if n else np.empty((0, 4))
    wkts = [c.to_wkt() for c in columns.crs_list]
    t = columns.transforms
    frame = geopandas.GeoDataFrame(
        {
            "filepath": pd.array(list(paths), dtype=object),
            "size": np.asarray(sizes, dtype=np.int64),
            "stamp": pd.array(list(stamps), dtype=object),
            "crs": pd.Categorical.from_codes(columns.crs_ids, categories=wkts),
            **{k: t[:, j] for j, k in enumerate("abcdef")},
            "height": columns.shapes[:, 0],
            "width": columns.shapes[:, 1],
            "count": columns.counts,
            "dtype": pd.Categorical.from_codes(columns.dtype_ids.astype(np.int32), categories=columns.dtypes),
            "nodata": columns.nodata,
            "has_nodata": columns.has_nodata,
        },
        geometry=shapely.box(box[:, 0], box[:, 2], box[:, 1], box[:, 3]),
        crs=crs.to_wkt(),
    )
    staged = io.BytesIO()
    frame.to_parquet(staged, index=False, compression=None)  # geopandas writes the GeoParquet "geo" metadata
    arrow = pq.read_table(pa.BufferReader(staged.getvalue()))
    meta = dict(arrow.schema.metadata or {})
    meta[b"pipekit"] = json.dumps({"format": FORMAT, "version": VERSION, "files": n}).encode()
    arrow = arrow.replace_schema_metadata(meta)
    buffer = io.BytesIO()
    pq.write_table(arrow, buffer, compression="zstd")
    data = buffer.getvalue()
    if geo_io.is_local(url):
        path = geo_io.local_path(url)
        tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        return
    fs, p = _open_fs(url, storage_options)
    fs.pipe_file(p, data)


def read_index(
    url: str, storage_options: Mapping[str, Any] | None = None, stage: str = "index_cache"
) -> SavedIndex | None:
    """The saved index at ``url``, or ``None`` if there is no file there.

    Raises:
        IndexCacheError: the file is there but cannot be used (names it and why).
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        if geo_io.is_local(url):
            path = geo_io.local_path(url)
            if not os.path.exists(path):
                return None
            with open(path, "rb") as f:
                data = f.read()
        else:
            fs, p = _open_fs(url, storage_options)
            try:
                data = fs.cat_file(p)
            except FileNotFoundError:
                return None
    except OSError as exc:
        raise ReadError("read saved index", url, stage, f"{type(exc).__name__}: {exc}") from exc
    try:
        # ParquetFile, not read_table: the latter imports pyarrow.dataset (~25 ms of a fresh process's reload)
        table = pq.ParquetFile(pa.BufferReader(data)).read(columns=list(_HEADER_COLUMNS))
        meta = json.loads((table.schema.metadata or {}).get(b"pipekit", b"null"))
    except Exception as exc:
        raise IndexCacheError(
            "read saved index", url, stage, f"not a readable GeoParquet index: {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise IndexCacheError("read saved index", url, stage, "not a pipekit raster index (no 'pipekit' metadata)")
    if meta.get("version") != VERSION:
        raise IndexCacheError(
            "read saved index",
            url,
            stage,
            f"saved by index format version {meta.get('version')!r}, this pipekit reads {VERSION}",
        )
    try:
        n = table.num_rows
        if meta.get("files") != n:
            raise ValueError(f"{n} rows, the metadata says {meta.get('files')}")
        crs_col = table.column("crs").combine_chunks()
        dtype_col = table.column("dtype").combine_chunks()
        crs_list = [CRS.from_wkt(w) for w in crs_col.dictionary.to_pylist()]
        dtypes = [str(np.dtype(d)) for d in dtype_col.dictionary.to_pylist()]
        crs_ids = np.asarray(crs_col.indices.to_numpy(zero_copy_only=False), dtype=np.int32)
        dtype_ids = np.asarray(dtype_col.indices.to_numpy(zero_copy_only=False), dtype=np.int16)

        def num(name: str) -> np.ndarray:
            column = table.column(name)
            if name == "nodata":  # NaN where a file has none (pandas writes it as null)
                return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.float64)
            if column.null_count:
                raise ValueError(f"column {name!r} has missing values")
            return column.to_numpy()

        transforms = np.stack([num(k) for k in "abcdef"], axis=1).astype(np.float64)
        columns = HeaderColumns(
            crs_list,
            crs_ids,
            dtypes,
            dtype_ids,
            transforms,
            np.stack([num("height"), num("width")], axis=1),
            num("count"),
            num("nodata"),
            num("has_nodata"),
        )
        paths = table.column("filepath").combine_chunks()  # kept in Arrow (see SavedIndex)
        stamps = table.column("stamp").combine_chunks()
        sizes = num("size").astype(np.int64)
        if n and (crs_ids.min() < 0 or crs_ids.max() >= len(crs_list) or dtype_ids.max() >= len(dtypes)):
            raise ValueError("a CRS or dtype code is out of range")
        for key in ("filepath", "stamp"):
            column = table.column(key)
            if column.null_count or not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
                raise ValueError(f"a {key} is missing or not text")
        sorted_paths = n < 2 or pc.all(pc.less(paths.slice(0, n - 1), paths.slice(1))).as_py()  # then unique
        if not sorted_paths and len(pc.unique(paths)) != n:
            raise ValueError("a filepath appears twice")
        if not np.isfinite(transforms).all() or (columns.shapes < 1).any() or (columns.counts < 1).any():
            raise ValueError("a transform, shape or band count is invalid")
    except Exception as exc:
        raise IndexCacheError("read saved index", url, stage, f"corrupt: {type(exc).__name__}: {exc}") from exc
    return SavedIndex(paths, sizes, stamps, columns)


# ---------------------------------------------------------------------------------------------
# the dataset side


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


class IndexCacheMixin:
    """What :class:`~pipekit.geo.raster.RasterDataset` does with ``index_cache=``, ``index_workers=``, ``progress=``.

    Header reading in parallel and in order, a saved index reused and kept up
    to date (see :mod:`pipekit.geo.index_cache`), and :meth:`save_index`.
    """

    def _init_index_options(self, index_cache: Any, index_workers: Any, progress: Any) -> None:
        if index_cache is not None and not isinstance(index_cache, (bool, str, os.PathLike)):
            raise TypeError(f"index_cache must be True, a path or URL, or None, got {index_cache!r}")
        if progress is not None and not isinstance(progress, bool):
            raise TypeError(f"progress must be a bool or None, got {progress!r}")
        self.index_cache = None if index_cache is False else index_cache
        self.index_workers = check_workers(index_workers)
        self.progress = progress
        self._index_record: tuple[list[str], np.ndarray, Sequence[str]] | None = None  # paths, sizes, stamps

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()  # type: ignore[misc]
        state.pop("_index_record", None)  # only save_index needs it: never sent to DataLoader workers
        return state

    # -- where ------------------------------------------------------------------------------
    def index_cache_url(self) -> str | None:
        """Where the saved index is read and written (``None`` without ``index_cache``)."""
        choice = self.index_cache
        if choice is None:
            return None
        if choice is not True:
            return os.fspath(choice)
        root = self.root  # type: ignore[attr-defined]
        if isinstance(root, (str, os.PathLike)):
            root = os.fspath(root)
            if geo_io.is_local(root):
                folder = geo_io.local_path(root)
                if os.path.isdir(folder):
                    return os.path.join(folder, DEFAULT_NAME)
            elif not any(c in root for c in "*?["):
                return root.rstrip("/") + "/" + DEFAULT_NAME
        raise ValueError(
            f"{self.name}: index_cache=True keeps the index next to the data, so the root must be one folder "  # type: ignore[attr-defined]
            f"(got {root!r}); pass index_cache='path/to/index.parquet' instead"
        )

    # -- reading headers ---------------------------------------------------------------------
    def _header_or_error(
        self, path: str, changed: frozenset[str] = frozenset(), reader: FastHeaderReader | None = None
    ) -> RasterHeader | StageError:
        opener = self._opener  # type: ignore[attr-defined]
        if path in changed and not geo_io.is_local(path):
            # a remote file that changed since it was saved: GDAL's /vsis3/ and /vsicurl/ keep what they
            # read of a URL for the life of the process, so read the new bytes through fsspec instead
            opener = geo_io.RasterOpener(opener.storage_options, False, opener.gdal_options)
            reader = None
        try:
            if reader is not None:  # local GeoTIFFs parsed directly, anything else by rasterio
                header = reader(path)
            else:
                header = read_header(opener, path, self.name)  # type: ignore[attr-defined]
        except ReadError as exc:
            return exc
        error = header.index_error(self.name)  # type: ignore[attr-defined]
        return header if error is None else error

    def _load_saved(self, url: str) -> SavedIndex | None:
        try:
            return read_index(url, self.storage_options, f"{self.name}.index_cache")  # type: ignore[attr-defined]
        except IndexCacheError as exc:
            warnings.warn(f"{exc}; building the index from the files and saving it again", UserWarning, stacklevel=4)
            return None

    def _read_metadata(self, paths: list[str]) -> tuple[HeaderColumns, list[int]]:
        """The headers of the files that can be indexed (in columns) and their positions in ``paths``.

        Reuses a saved index (``index_cache``) for the files that did not
        change, reads the others on a thread pool, and reports the files
        that cannot be indexed in the order of ``paths`` (``on_error``), as
        reading them one by one would.
        """
        with gc_paused():  # many long-lived small objects: see gc_paused
            return self._read_metadata_now(paths)

    def _read_metadata_now(self, paths: list[str]) -> tuple[HeaderColumns, list[int]]:
        name = self.name  # type: ignore[attr-defined]
        url = self.index_cache_url()
        sizes, stamps = _fingerprint_columns(
            paths,
            self.storage_options,  # type: ignore[attr-defined]
            stage=f"{name}.index_cache",
        )
        saved = self._load_saved(url) if url is not None else None
        found = saved.rows_of(paths, sizes, stamps) if saved is not None else np.full(len(paths), -1, dtype=np.int64)
        misses = np.flatnonzero(found < 0).tolist()
        changed = frozenset(paths[i] for i in misses if saved is not None and paths[i] in saved.rows)
        opener = self._opener  # type: ignore[attr-defined]
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
                self._skip_or_raise(result)  # type: ignore[attr-defined]
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
            self._index_record = (list(paths), sizes, stamps)
        else:
            kept_stamps = stamps.take(ok) if isinstance(stamps, MtimeStamps) else [stamps[i] for i in ok]
            self._index_record = ([paths[i] for i in ok], sizes[ok], kept_stamps)
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
                self._pending_save = url
        return columns, ok

    def _save_pending(self) -> None:
        """Write the index ``_read_metadata`` found out of date, once the dataset CRS is known."""
        url = self.__dict__.pop("_pending_save", None)
        if url is None:
            return
        try:
            self.save_index(url)
        except Exception as exc:
            warnings.warn(
                f"{self.name}: cannot save the index to {url!r}: {type(exc).__name__}: {exc}",  # type: ignore[attr-defined]
                UserWarning,
                stacklevel=3,
            )

    def save_index(self, path: Any = None) -> str:
        """Save the headers of the indexed files to a GeoParquet file and return where.

        Args:
            path: a local path or fsspec URL (default: ``index_cache``'s
                location, ``<root>/.pipekit-index.parquet`` for ``index_cache=True``
                or when none was given and the root is one folder).

        Reload it with ``RasterDataset(root, index_cache=path)``: files whose
        size or modification time changed since are read again.

        Raises:
            RuntimeError: the dataset was unpickled (a DataLoader worker's copy
                holds no fingerprints): save from the dataset that was built.

        Example:
            >>> import os, tempfile, numpy as np, rasterio
            >>> from affine import Affine
            >>> from pipekit.datasets import RasterDataset
            >>> root = tempfile.mkdtemp()
            >>> with rasterio.open(f"{root}/a.tif", "w", driver="GTiff", width=8, height=8, count=1, dtype="uint8",
            ...                    crs="EPSG:32615", transform=Affine(10, 0, 500000, 0, -10, 4000080)) as f:
            ...     f.write(np.zeros((1, 8, 8), dtype="uint8"))
            >>> where = RasterDataset(root).save_index()
            >>> os.path.basename(where)
            '.pipekit-index.parquet'
            >>> RasterDataset(root, index_cache=True).files == [f"{root}/a.tif"]
            True
        """
        record = self.__dict__.get("_index_record")
        if record is None:
            raise RuntimeError(
                f"{self.name}.save_index: this copy of the dataset was unpickled and holds no file "  # type: ignore[attr-defined]
                "fingerprints; save the index from the dataset that was built"
            )
        if path is None:
            previous = self.index_cache
            self.index_cache = previous if previous not in (None, False) else True
            try:
                url = self.index_cache_url()
            finally:
                self.index_cache = previous
        else:
            url = os.fspath(path)
        paths, sizes, stamps = record
        files = self._files  # type: ignore[attr-defined]
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
        write_index(url, paths, sizes, stamps, columns, self.crs, self.storage_options)  # type: ignore[attr-defined]
        return url
