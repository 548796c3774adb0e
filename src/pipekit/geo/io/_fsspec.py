"""fsspec files handed to rasterio's ``opener=``: read-only, one position per handle, never raising into GDAL.

:class:`_FsspecOpener` is the filesystem-like object rasterio asks for files; it serves them
from the range cache (``cache_dir=``) or as :class:`_PositionedFile` views of fsspec's own files.
One opener per filesystem and process (:func:`_shared_opener`).  A failed read is recorded
(:mod:`pipekit.geo.io._errors`) and GDAL sees a short read.
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
from collections.abc import Callable
from typing import Any

from pipekit.geo.io._errors import _record_opener_failure
from pipekit.geo.rangecache import PositionedReader, RangeCache
from pipekit.geo.rangefetch import RangeFetcher

# fsspec file objects handed to rasterio's opener: each read fetches what GDAL
# asks for (a header, a tile) plus a small read-ahead for the header's many
# small reads, instead of s3fs's default 5 MB read-ahead.
_FSSPEC_BLOCK_SIZE = 64 * 2**10


class _PositionedFile(PositionedReader):
    """A read-only view of an fsspec file with its own position.

    Some filesystems (``memory://``) hand out the *same* file object for
    every ``open``; rasterio and GDAL need one object (and position) per
    handle.  Reads seek and read under the underlying file's lock.
    """

    def __init__(self, raw: Any, lock: threading.Lock, size: int | None) -> None:
        super().__init__()
        self._raw = raw
        self._lock = lock
        self._size = size

    def _end(self) -> int | None:
        if self._size is None:
            try:
                with self._lock:
                    self._size = self._raw.seek(0, 2)
            except Exception as exc:  # never into GDAL: see OpenerReadError
                _record_opener_failure(exc)
                return None
        return self._size

    def read(self, size: int = -1) -> bytes:
        try:
            with self._lock:
                self._raw.seek(self._pos)
                data = self._raw.read(size)
        except Exception as exc:  # never into GDAL (it can abort the process): a short read, raised later
            _record_opener_failure(exc)
            return b""
        self._pos += len(data)
        return data

    def close(self) -> None:
        if not self.closed:
            with contextlib.suppress(Exception):
                if not getattr(self._raw, "_pipekit_shared", False):
                    self._raw.close()
        super().close()


class _FsspecOpener:
    """The filesystem-like object rasterio's ``opener=`` receives (one per filesystem and process)."""

    def __init__(self, fs: Any, cache: RangeCache | None = None, fetch: RangeFetcher | None = None) -> None:
        self.fs = fs
        self.cache = cache
        self.fetch = fetch
        self._locks: dict[int, threading.Lock] = {}
        self._guard = threading.Lock()
        self.shared_files = type(fs).__name__ == "MemoryFileSystem"

    def open(self, path: str, mode: str = "rb", **kwargs: Any) -> io.RawIOBase:
        if "r" not in mode or "+" in mode or "w" in mode:
            raise PermissionError(f"pipekit opens rasters read-only, not with mode {mode!r}: {path}")
        if self.cache is not None:
            try:  # a failed read: a short read for GDAL, raised by surfacing_opener_errors
                url = self.fs.unstrip_protocol(path)
                return self.cache.open(self.fs, path, url, self.fetch, _record_opener_failure)
            except Exception as exc:  # rasterio keeps only the errno: surfacing_opener_errors raises this one
                _record_opener_failure(exc)
                raise
        try:
            raw = self.fs.open(path, "rb", block_size=_FSSPEC_BLOCK_SIZE, cache_type="readahead")
        except TypeError:
            raw = self.fs.open(path, "rb")
        if self.shared_files:
            raw._pipekit_shared = True
        with self._guard:
            lock = self._locks.setdefault(id(raw), threading.Lock()) if self.shared_files else threading.Lock()
        return _PositionedFile(raw, lock, getattr(raw, "size", None))

    def isfile(self, path: str) -> bool:
        return self.fs.isfile(path)

    def isdir(self, path: str) -> bool:
        return self.fs.isdir(path)

    def ls(self, path: str) -> list[str]:
        return self.fs.ls(path, detail=False)

    def mtime(self, path: str) -> int:
        return 0

    def modified(self, path: str) -> Any:
        # rasterio's stat asks for it (its mtime); not worth a request: GDAL reads the file regardless
        raise NotImplementedError

    def size(self, path: str) -> int:
        if self.cache is not None and self.fetch is not None and self.fetch.base:
            # S3 read through the cache: rasterio asks for the size of "test" before every open (a check of
            # the opener); the answer comes from the lean fetcher, so a DataLoader worker never starts an s3fs
            # session (~0.5 s of CPU) just for that
            if "/" not in path.strip("/"):
                raise FileNotFoundError(path)  # a bucket, not a file
            return self.cache.mirror(self.fs, path, self.fs.unstrip_protocol(path), self.fetch).size
        return self.fs.size(path)


# one opener per filesystem object (and range cache) in each process
_fsspec_openers: dict[tuple[int, str], _FsspecOpener] = {}


def _shared_opener(
    fs: Any, cache: RangeCache | None, fetcher: Callable[[], RangeFetcher | None]
) -> _FsspecOpener:
    """This process's opener of ``fs`` (and ``cache``), made with ``fetcher()`` the first time."""
    key = (os.getpid(), f"{id(fs)} {cache!r}")
    opener = _fsspec_openers.get(key)
    if opener is None or opener.fs is not fs:
        opener = _fsspec_openers[key] = _FsspecOpener(fs, cache, fetcher())
    return opener
