"""A raster dataset's index saved to GeoParquet and reloaded, checked against the files' sizes and times.

Building a :class:`~pipekit.geo._raster.RasterDataset` reads every file's header
once (CRS, transform, size, bands, data type, nodata): local GeoTIFFs are
parsed directly (:mod:`pipekit.geo._tiff_header`, ~0.1 ms a small file, checked
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
import os
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from rasterio.crs import CRS

from pipekit._fs import url_to_fs
from pipekit.errors import IndexCacheError, ReadError
from pipekit.geo import io as geo_io
from pipekit.geo.catalog._fingerprints import MtimeStamps
from pipekit.geo.catalog._table import HeaderColumns, _FileTable

__all__ = ["DEFAULT_NAME", "IndexCacheError", "SavedIndex", "read_index", "write_index"]

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

    return url_to_fs(url, storage_options)


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
    box, rows = table.footprint_entries(crs) if n else (np.empty((0, 4)), None)
    geometry = shapely.box(box[:n, 0], box[:n, 2], box[:n, 1], box[:n, 3])
    if rows is not None:  # a file split at the antimeridian: a MultiPolygon of its parts, as STAC writes one
        for k, row in enumerate(rows[n:].tolist(), start=n):
            parts = [*getattr(geometry[row], "geoms", [geometry[row]]), shapely.box(*box[k, [0, 2, 1, 3]])]
            geometry[row] = shapely.MultiPolygon(parts)
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
        geometry=geometry,
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
