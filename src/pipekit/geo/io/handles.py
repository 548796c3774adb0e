"""Open rasters (:class:`RasterHandle`) and the per-process, per-thread cache that keeps them open.

A geo dataset never keeps an open file in itself (it is pickled to every DataLoader worker): it
asks :func:`cached_handle` for a handle when it reads.  Handles live in a per-process, per-thread
LRU cache:

* created lazily, in the process (and thread) that reads, so a forked
  DataLoader worker never touches a handle of its parent: the cache is keyed
  by ``os.getpid()``, and a child that inherits its parent's cache leaves
  those handles alone (closing them could move the file offset the parent
  shares with it);
* bounded by a count and an estimated byte budget (see
  :func:`set_handle_budget`), closing the least recently used handles;
* closed at exit while fsspec and GDAL are still alive, those of an I/O
  thread on that thread (:mod:`pipekit.geo.io.lanes`).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import numpy as np

from pipekit import _fast
from pipekit.geo.io._errors import surfacing_opener_errors
from pipekit.geo.io._fsspec import _FSSPEC_BLOCK_SIZE
from pipekit.geo.io._prefetch import _TilePrefetcher
from pipekit.geo.io.lanes import current_lane, lane_alive, run_on_lane
from pipekit.geo.io.opener import RasterOpener, _Resolved

__all__ = [
    "RasterHandle",
    "cached_handle",
    "cached_handle_count",
    "close_cached_handles",
    "evict_handle",
    "handle_budget",
    "open_handle",
    "set_handle_budget",
]

_LOCAL_HANDLE_COST = 64 * 2**10

_handle_tokens = itertools.count()


class RasterHandle:
    """An open raster and the metadata a read needs, looked up once when it was opened."""

    __slots__ = (
        "__weakref__",
        "cost",
        "count",
        "crs",
        "ds",
        "dtype",
        "height",
        "nodata",
        "np_dtype",
        "opener",
        "prefetch",
        "remote",
        "resolved",
        "reusable",
        "same_crs",
        "token",
        "transform",
        "url",
        "width",
    )

    def __init__(self, url: str, ds: Any, opener: RasterOpener, resolved: _Resolved) -> None:
        self.url = url
        self.ds = ds
        self.opener = opener
        self.resolved = resolved
        self.crs = ds.crs
        self.transform = ds.transform
        self.width = ds.width
        self.height = ds.height
        self.count = ds.count
        self.dtype = ds.dtypes[0] if ds.count else "uint8"
        self.np_dtype = np.dtype(self.dtype)
        self.nodata = ds.nodata
        self.remote = resolved.kind != "local"
        self.same_crs: dict[str, bool] = {}
        # identifies this opening in per-process caches of derived data (pipekit.geo.warpcache);
        # ``reusable``: held by the handle cache, so such data may be used again
        self.token = next(_handle_tokens)
        self.reusable = False
        if resolved.kind == "local":
            self.cost = _LOCAL_HANDLE_COST
        elif resolved.kind == "vsi":
            cache = str(resolved.config.get("VSI_CACHE", "FALSE")).upper() in ("TRUE", "YES", "ON", "1")
            self.cost = _LOCAL_HANDLE_COST + (int(resolved.config.get("VSI_CACHE_SIZE", 25 * 2**20)) if cache else 0)
        else:
            self.cost = _LOCAL_HANDLE_COST + 4 * _FSSPEC_BLOCK_SIZE
        self.prefetch: _TilePrefetcher | None = None
        cached = resolved.kind == "fsspec" and opener.cache is not None
        if cached and _fast.enabled("prefetch_tiles") and ds.driver == "GTiff":
            self.prefetch = _TilePrefetcher(self, *opener.fsspec_opener(url))

    def env(self) -> contextlib.AbstractContextManager[Any]:
        """The GDAL environment reads of this handle run in (a no-op for local files)."""
        if not self.remote:
            return contextlib.nullcontext()
        if self.resolved.kind == "fsspec":
            return _fsspec_read_env(self.opener.env(self.resolved), self.url)
        return self.opener.env(self.resolved)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ds.close()

    def __repr__(self) -> str:
        return f"RasterHandle({self.url!r})"


@contextlib.contextmanager
def _fsspec_read_env(env: contextlib.AbstractContextManager[Any], url: str) -> Iterator[None]:
    with env, surfacing_opener_errors(url):
        yield


def open_handle(opener: RasterOpener, url: str, stage: str = "RasterOpener") -> RasterHandle:
    """Open ``url`` and wrap it in a :class:`RasterHandle` (uncached; call ``close()``)."""
    ds = opener.open(url, stage)
    return RasterHandle(url, ds, opener, opener.resolve(url))


# -- the per-process, per-thread handle cache -----------------------------------------------

_budget = {
    "max_files": int(os.environ.get("PIPEKIT_GEO_MAX_OPEN_FILES", "128")),
    "max_bytes": int(os.environ.get("PIPEKIT_GEO_MAX_HANDLE_BYTES", str(1 << 30))),
}


def set_handle_budget(max_files: int | None = None, max_bytes: int | None = None) -> None:
    """Bound the open raster handles of each reading thread (in each process).

    Args:
        max_files: most open files (default 128, or ``PIPEKIT_GEO_MAX_OPEN_FILES``).
        max_bytes: most estimated memory held by their caches (default 1 GiB,
            or ``PIPEKIT_GEO_MAX_HANDLE_BYTES``): a local file counts 64 KiB,
            a remote one its ``VSI_CACHE_SIZE`` or fsspec block cache as well.
    """
    for name, value in (("max_files", max_files), ("max_bytes", max_bytes)):
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
            _budget[name] = value


def handle_budget() -> dict[str, int]:
    """The current budget, ``{"max_files": ..., "max_bytes": ...}``."""
    return dict(_budget)


class _HandleCache:
    __slots__ = ("__weakref__", "entries", "lane", "nbytes", "pid")

    def __init__(self) -> None:
        self.pid = os.getpid()
        # the I/O lane this cache belongs to (None: another thread); its handles are closed there
        self.lane: int | None = current_lane()
        self.entries: OrderedDict[tuple[str, str], RasterHandle] = OrderedDict()
        self.nbytes = 0

    def get(self, opener: RasterOpener, url: str, stage: str) -> RasterHandle:
        key = (opener.key, url)
        handle = self.entries.get(key)
        if handle is not None:
            self.entries.move_to_end(key)
            return handle
        handle = open_handle(opener, url, stage)
        handle.reusable = True
        self.entries[key] = handle
        self.nbytes += handle.cost
        self._shrink()
        return handle

    def evict(self, opener: RasterOpener, url: str) -> None:
        handle = self.entries.pop((opener.key, url), None)
        if handle is not None:
            self.nbytes -= handle.cost
            handle.close()

    def _shrink(self) -> None:
        while len(self.entries) > 1 and (
            len(self.entries) > _budget["max_files"] or self.nbytes > _budget["max_bytes"]
        ):
            _, old = self.entries.popitem(last=False)
            self.nbytes -= old.cost
            old.close()

    def clear(self) -> None:
        while self.entries:
            _, old = self.entries.popitem(last=False)
            old.close()
        self.nbytes = 0


_local = threading.local()
# Caches inherited from a parent process through fork: kept referenced and never
# closed in the child (closing would touch file descriptions the parent shares).
_inherited: list[_HandleCache] = []
# Every cache of this process, closed at exit while fsspec and GDAL are still alive.
_caches: weakref.WeakSet[_HandleCache] = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    pid = os.getpid()
    for cache in list(_caches):
        if cache.pid == pid:
            with contextlib.suppress(Exception):
                if (
                    cache.lane is not None
                    and lane_alive(cache.lane)
                    and any(h.resolved.kind == "fsspec" for h in list(cache.entries.values()))
                ):
                    # on the lane that opened them: rasterio keeps the Python file objects of a dataset
                    # opened with opener= per thread, and closing one elsewhere fails ("I/O error");
                    # a lane stuck in a read is not waited for long: the process is ending
                    if run_on_lane(cache.lane, cache.clear, timeout=5.0):
                        continue
                else:
                    cache.clear()


def _cache() -> _HandleCache:
    cache = getattr(_local, "cache", None)
    pid = os.getpid()
    if cache is None or cache.pid != pid:
        if cache is not None:
            _inherited.append(cache)
        cache = _local.cache = _HandleCache()
        _caches.add(cache)
    return cache


def cached_handle(opener: RasterOpener, url: str, stage: str = "RasterOpener") -> RasterHandle:
    """The open handle of ``url`` for this process and thread, opening it if needed."""
    return _cache().get(opener, url, stage)


def evict_handle(opener: RasterOpener, url: str) -> None:
    """Close and forget this thread's handle of ``url`` (after a failed read)."""
    _cache().evict(opener, url)


def cached_handle_count() -> int:
    """How many handles this process and thread hold open."""
    return len(_cache().entries)


def close_cached_handles() -> None:
    """Close every handle this process and thread holds."""
    _cache().clear()
