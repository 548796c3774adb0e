"""What raster headers say, and reading many of them on a thread pool.

* :func:`read_header`: one raster's header (:class:`RasterHeader`), and
  why a raster cannot be indexed (:meth:`RasterHeader.index_error`,
  :class:`~pipekit.errors.GeoReferenceError`);
* :func:`read_headers`: many headers read on a thread pool, in order, with
  a progress bar for large folders (:func:`default_workers`,
  :func:`check_workers`).

Local GeoTIFF headers are parsed without GDAL by
:mod:`pipekit.geo._tiff_header` when a dataset is indexed (see there).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from affine import Affine
from rasterio.crs import CRS

from pipekit.errors import GeoReferenceError, ReadError, StageError
from pipekit.geo import io as geo_io

__all__ = [
    "PROGRESS_MIN_FILES",
    "REMOTE_WORKERS",
    "RasterHeader",
    "check_workers",
    "default_workers",
    "read_header",
    "read_headers",
]

T = TypeVar("T")


@dataclass
class RasterHeader:
    """What a raster's header says (see :func:`read_header`).

    Attributes:
        url: the file.
        crs: its CRS (``None`` if it has none).
        transform: its geotransform (the identity if it has none).
        width, height, count: pixels and bands.
        dtype: the first band's data type (``""`` without bands).
        nodata: the nodata value, or ``None``.
        bounds: ``(left, bottom, right, top)`` in its CRS, as rasterio reports them.
        has_gcps: it has ground control points (read only when it has no CRS).
        block_shape, compression, overviews, tags: its storage layout (band 1's
            ``(rows, cols)`` blocks, the ``compress`` creation option, how many
            overviews band 1 has, the dataset tags); only read with ``layout=True``.
    """

    url: str
    crs: CRS | None
    transform: Affine
    width: int
    height: int
    count: int
    dtype: str
    nodata: float | None
    bounds: tuple[float, float, float, float]
    has_gcps: bool = False
    block_shape: tuple[int, int] | None = None
    compression: str | None = None
    overviews: int = 0
    tags: dict[str, str] = field(default_factory=dict)

    @property
    def georeferenced(self) -> bool:
        """Whether the raster can be placed on the map: it has a CRS and a geotransform."""
        return self.crs is not None and bool(_wkt(self.crs)) and self.transform != Affine.identity()

    @property
    def res(self) -> tuple[float, float]:
        """``(xres, yres)``: the pixel size along its columns and rows, in CRS units (rotation-aware)."""
        t = self.transform
        return math.hypot(t.a, t.d), math.hypot(t.b, t.e)

    def index_error(self, stage: str) -> StageError | None:
        """Why this raster cannot be indexed by a geo dataset (no CRS, no geotransform, no bands), or ``None``."""
        if self.crs is None or not _wkt(self.crs):
            extra = " (it has ground control points; warp it to a CRS first, e.g. gdalwarp)" if self.has_gcps else ""
            return GeoReferenceError(
                "index raster", self.url, stage, f"the raster has no CRS, so it cannot be placed on the map{extra}"
            )
        if self.transform == Affine.identity():
            return GeoReferenceError(
                "index raster", self.url, stage, "the raster has no geotransform (pixel coordinates only)"
            )
        if self.count < 1:
            return ReadError("index raster", self.url, stage, "the raster has no bands")
        return None


#: ``id(crs) -> (crs, its WKT)`` of recent CRS objects: headers read fast share one CRS object per
#: kind of file, and ``to_wkt`` costs ~20-100 us (the CRS is held, so its id is not reused)
_WKT_CACHE: dict[int, tuple[CRS, str]] = {}
_WKT_CACHE_SIZE = 256


def _wkt(crs: CRS) -> str:
    """``crs.to_wkt()``, remembered for the CRS object (CRSs do not change)."""
    found = _WKT_CACHE.get(id(crs))
    if found is not None and found[0] is crs:
        return found[1]
    wkt = crs.to_wkt()
    if len(_WKT_CACHE) >= _WKT_CACHE_SIZE:
        _WKT_CACHE.clear()
    _WKT_CACHE[id(crs)] = (crs, wkt)
    return wkt


def read_header(
    opener: geo_io.RasterOpener, url: str, stage: str = "read_header", layout: bool = False
) -> RasterHeader:
    """Open ``url`` with ``opener``, read its header and close it again.

    ``layout=True`` also reads the storage layout (blocks, compression,
    overviews, tags), which only reports need.

    Raises:
        ReadError: the file cannot be opened (naming ``url`` and ``stage``).

    Example:
        >>> import tempfile, numpy as np, rasterio
        >>> from affine import Affine
        >>> from pipekit.geo.io import RasterOpener
        >>> path = f"{tempfile.mkdtemp()}/a.tif"
        >>> with rasterio.open(path, "w", driver="GTiff", width=4, height=2, count=1, dtype="uint8",
        ...                    crs="EPSG:32615", transform=Affine(10, 0, 500000, 0, -10, 4000000)) as f:
        ...     f.write(np.zeros((1, 2, 4), dtype="uint8"))
        >>> header = read_header(RasterOpener(), path)
        >>> header.crs.to_epsg(), header.res, header.bounds, header.georeferenced
        (32615, (10.0, 10.0), (500000.0, 3999980.0, 500040.0, 4000000.0), True)
    """
    ds = opener.open(url, stage)
    try:
        crs = ds.crs
        header = RasterHeader(
            url=url,
            crs=crs,
            transform=ds.transform,
            width=ds.width,
            height=ds.height,
            count=ds.count,
            dtype=ds.dtypes[0] if ds.count else "",
            nodata=ds.nodata,
            bounds=tuple(ds.bounds),
            has_gcps=bool(ds.gcps[0]) if crs is None else False,
        )
        if layout:
            header.block_shape = tuple(ds.block_shapes[0]) if ds.count else (0, 0)
            header.compression = ds.profile.get("compress")
            header.overviews = len(ds.overviews(1)) if ds.count else 0
            header.tags = dict(ds.tags())
    finally:
        ds.close()
    return header


#: folders with at least this many files get a progress bar (``progress=None``)
PROGRESS_MIN_FILES = 5_000

#: the most threads that read remote headers (I/O-bound: waiting on the network)
REMOTE_WORKERS = 16

#: files one task of the thread pool reads (under one GDAL environment)
_CHUNK = 64


def default_workers(local: bool = True) -> int:
    """Threads that read headers when ``workers=None``: ``PIPEKIT_INDEX_WORKERS``, else a choice by machine.

    Remote headers: :data:`REMOTE_WORKERS` (the threads wait on the network).
    Local headers: one thread per usable core up to 8 on machines with at
    least 4 cores, else 1.  Opening a small local GeoTIFF costs ~0.5 ms of
    CPU, most of it in rasterio's Python-level code that holds the GIL; on 2
    cores threads were slower than one loop (1,000 files: 1.26 s with 2
    threads, 0.99 s in one; see ``benchmarks/index_build.py``).

    Example:
        >>> default_workers(local=False)
        16
    """
    value = os.environ.get("PIPEKIT_INDEX_WORKERS", "").strip()
    if value:
        try:
            workers = int(value)
        except ValueError:
            raise ValueError(f"PIPEKIT_INDEX_WORKERS must be a positive integer, got {value!r}") from None
        if workers < 1:
            raise ValueError(f"PIPEKIT_INDEX_WORKERS must be a positive integer, got {value!r}")
        return workers
    if not local:
        return REMOTE_WORKERS
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return min(8, cores) if cores >= 4 else 1


def check_workers(workers: Any) -> int | None:
    """``workers`` if it is ``None`` or a positive int (``TypeError``/``ValueError`` otherwise)."""
    if workers is None:
        return None
    if isinstance(workers, bool) or not isinstance(workers, int):
        raise TypeError(f"index_workers must be a positive int or None, got {workers!r}")
    if workers < 1:
        raise ValueError(f"index_workers must be a positive int or None, got {workers!r}")
    return workers


def read_headers(
    paths: Sequence[str],
    read: Callable[[str], T],
    workers: int | None = None,
    progress: bool | None = None,
    desc: str = "index",
) -> list[T]:
    """``read(path)`` for every path, in the order of ``paths``, on a pool of threads.

    Args:
        paths: local paths or URLs.
        read: what to do with one of them (its exceptions propagate: the
            first one in the order of ``paths``; make it return errors to
            handle them all).
        workers: threads (``None``: :func:`default_workers`; 1: on this
            thread, for local files).  Remote headers are read on threads
            started from pipekit's GDAL network I/O threads, never on the
            calling thread (see :mod:`pipekit.geo.io`).
        progress: show a tqdm progress bar (``None``: only for
            :data:`PROGRESS_MIN_FILES` files or more).
        desc: the progress bar's label.

    Local files are opened with ``GDAL_DISABLE_READDIR_ON_OPEN=TRUE``: GDAL
    then looks for side files (``.aux.xml``, ``.ovr``, world files...) with
    one ``stat`` each instead of listing the whole folder at every open
    (which cost ~40% of the time in a folder of 1,000 files); the same
    result as GDAL's own fallback for folders of more than 1,000 files.

    Example:
        >>> read_headers(["b", "a", "c"], str.upper, workers=2)
        ['B', 'A', 'C']
    """
    remote = not all(geo_io.is_local(p) for p in paths)
    if workers is None:
        workers = default_workers(local=not remote)
    workers = max(1, min(workers, len(paths)))
    bar = _progress_bar(len(paths), progress, desc)
    try:
        if remote:
            # on GDAL's network threads: never on this thread (see pipekit.geo.io)
            return list(geo_io.run_remote(lambda: _map_threads(read, paths, workers, bar, False)))
        return _map_threads(read, paths, workers, bar, True)
    finally:
        if bar is not None:
            bar.close()


def _progress_bar(total: int, progress: bool | None, desc: str) -> Any:
    if progress is None:
        progress = total >= PROGRESS_MIN_FILES
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="file", dynamic_ncols=True, mininterval=0.5)


def _read_chunk(read: Callable[[str], T], chunk: Sequence[str], bar: Any, local: bool) -> list[T]:
    import rasterio

    # one GDAL environment for the chunk: rasterio.open reuses it (its options are thread-local)
    env = rasterio.Env(GDAL_DISABLE_READDIR_ON_OPEN="TRUE") if local else contextlib.nullcontext()
    with env:
        out = [read(p) for p in chunk]
    if bar is not None:
        bar.update(len(chunk))
    return out


def _map_threads(read: Callable[[str], T], paths: Sequence[str], workers: int, bar: Any, local: bool) -> list[T]:
    if not paths:
        return []
    if workers <= 1 or len(paths) == 1:
        out: list[T] = []
        for start in range(0, len(paths), _CHUNK):
            out.extend(_read_chunk(read, paths[start : start + _CHUNK], bar, local))
        return out
    # remote: a file per task (each waits on the network); local: chunks (less pool overhead)
    size = _CHUNK if local else 1
    chunks = [paths[start : start + size] for start in range(0, len(paths), size)]
    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="pipekit-geo-index") as pool:
        futures = [pool.submit(_read_chunk, read, chunk, bar, local) for chunk in chunks]
        try:
            out = []
            for future in futures:  # in order: the first error of the paths' order is raised
                out.extend(future.result())
            return out
        finally:
            for future in futures:
                future.cancel()
