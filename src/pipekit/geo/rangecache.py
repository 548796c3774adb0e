"""A local disk cache of the byte ranges read from remote rasters, shared by processes and runs.

Each DataLoader worker has its own GDAL caches, so a tile that two workers
touch is fetched from the server twice (with 2 workers a first pass over
COG patches fetched 1.82x the bytes of the tiles touched, against 1.02x with
none).  A :class:`RangeCache` keeps what any process fetched in a folder on
local disk: one sparse *mirror* file per remote file, the same size as it,
and beside it one byte per block saying whether that block is there.  A read
takes the blocks already there from the mirror and fetches only the missing
ones (consecutive missing blocks in one range request, the runs of a read
together through fsspec's ``cat_ranges``), writes them into the mirror and
only then marks them present.  So:

* every byte handed to GDAL either came from the server in this read or was
  written to the mirror, in full, before it was marked (a process killed
  between the two leaves the block unmarked, and it is fetched again);
* processes share blocks through the page cache, with no lock: two that miss
  the same block at once both fetch it and write the same bytes;
* a mirror is named by the URL, the size and the version the server reports
  (ETag, else last modification), so a file replaced on the server gets a
  new mirror instead of stale bytes; without either, a file rewritten with
  the same size is not noticed (say so to users: ``RasterDataset(cache_dir=)``);
* the folder outlives the run: a later run (or epoch) reads from local disk.

Nothing is ever evicted: the folder grows to the bytes read, at most the
size of the remote files (``du`` it, or delete it between runs; a mirror in
use keeps working until it is closed).

Example:
    >>> import fsspec, tempfile
    >>> from pipekit.geo.rangecache import RangeCache
    >>> fs = fsspec.filesystem("memory")
    >>> fs.pipe("/rc/doc.bin", bytes(range(256)) * 1024)
    >>> cache = RangeCache(tempfile.mkdtemp(), block_size=4096)
    >>> f = cache.open(fs, "/rc/doc.bin", "memory://rc/doc.bin")
    >>> _ = f.seek(5000)
    >>> f.read(4) == bytes([136, 137, 138, 139])
    True
    >>> cache.stats()["fetched_bytes"]  # the one 4 KiB block holding bytes 5000-5003
    4096
    >>> _ = f.seek(4100)
    >>> f.read(8) == bytes(range(4, 12)) and cache.stats()["fetched_bytes"] == 4096
    True
    >>> f.close()
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipekit.errors import RangeCacheError

Fetch = Callable[[str, int, int], bytes]

DEFAULT_BLOCK_SIZE = 64 * 2**10

# what fsspec filesystems call a file's version in info(): s3fs, gcsfs, http (ETag), local and memory (mtime)
_VERSION_KEYS = ("ETag", "etag", "LastModified", "mtime", "last_modified", "created")

# per process: the open mirrors (data and block-map descriptors) and what was fetched / served
_lock = threading.RLock()
_mirrors: dict[tuple[int, str], _Mirror] = {}
_stats: dict[tuple[int, str], dict[str, int]] = {}
_by_url: dict[tuple[int, str, int, str], _Mirror] = {}
_pools: dict[int, Any] = {}


def _pool() -> Any:
    """This process's threads for fetching the runs of one prefetch at once."""
    pool = _pools.get(os.getpid())
    if pool is None:
        from concurrent.futures import ThreadPoolExecutor

        with _lock:
            pool = _pools.get(os.getpid())
            if pool is None:
                pool = _pools[os.getpid()] = ThreadPoolExecutor(8, thread_name_prefix="pipekit-rangecache")
    return pool


class RangeCache:
    """Where remote files' byte ranges are kept on local disk; picklable, holds no descriptor.

    Args:
        directory: the cache folder (created when missing).  Give every
            process that reads the same files the same folder: DataLoader
            workers get it with the dataset.
        block_size: bytes fetched and marked at a time (default 64 KiB: a
            read fetches at most a block too much at each end; COG tiles
            lie end to end, so the next tile usually uses those bytes).

    Raises:
        ValueError: for a block size under 512 bytes.
        RangeCacheError: the folder cannot be created or written.
    """

    def __init__(self, directory: str | os.PathLike[str], block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        if not isinstance(block_size, int) or block_size < 512:
            raise ValueError(f"block_size must be an int >= 512, got {block_size!r}")
        self.directory = os.path.abspath(os.fspath(directory))
        self.block_size = block_size
        try:  # a folder that cannot be used is reported now, not at the first read of a worker
            Path(self.directory).mkdir(parents=True, exist_ok=True)
            if not os.access(self.directory, os.W_OK | os.X_OK):
                raise PermissionError(f"not writable by user {os.getuid() if hasattr(os, 'getuid') else '?'}")
        except OSError as exc:
            raise RangeCacheError(f"range cache folder {self.directory}: cannot be used: {exc}") from exc

    def __repr__(self) -> str:
        return f"RangeCache({self.directory!r}, block_size={self.block_size})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RangeCache) and (other.directory, other.block_size) == (
            self.directory,
            self.block_size,
        )

    def __hash__(self) -> int:
        return hash((self.directory, self.block_size))

    def open(
        self,
        fs: Any,
        path: str,
        url: str,
        fetch: Fetch | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> CachedFile:
        """A read-only file object over ``path`` of ``fs`` (``url`` names it in the mirror and in errors).

        ``fetch(path, start, end)``, when given, fetches missing bytes
        instead of ``fs.cat_file`` (:mod:`pipekit.geo.rangefetch`);
        ``on_error``: see :class:`CachedFile`.
        """
        return CachedFile(self.mirror(fs, path, url, fetch), fs, path, fetch, on_error)

    def mirror(self, fs: Any, path: str, url: str, fetch: Fetch | None = None) -> _Mirror:
        """This process's mirror of ``url`` (its size and version asked once per process).

        Asked of ``fetch.info(path)`` where the fetcher has one and it reports
        a version (:meth:`pipekit.geo.rangefetch.RangeFetcher.info`: one HEAD
        request), else of ``fs.info(path)``.
        """
        by_url = (os.getpid(), self.directory, self.block_size, url)
        mirror = _by_url.get(by_url)
        if mirror is not None:
            return mirror
        info = _file_info(fs, path, fetch)
        if info.get("size") is None:
            raise OSError(f"{url}: the store does not report the file's size, which the range cache needs (cache_dir=)")
        size = int(info["size"])
        version = next((str(info[k]) for k in _VERSION_KEYS if info.get(k)), "")
        key = hashlib.sha256(json.dumps([url, size, version, self.block_size]).encode()).hexdigest()[:32]
        mirror_key = (os.getpid(), os.path.join(self.directory, key))
        with _lock:
            mirror = _mirrors.get(mirror_key)
            if mirror is None:
                mirror = _mirrors[mirror_key] = _Mirror(self, key, url, size, version)
            _by_url[by_url] = mirror
        return mirror

    def stats(self) -> dict[str, int]:
        """What this process fetched into the cache and read from it (bytes and requests); zeros if nothing."""
        with _lock:
            return dict(_stats.get((os.getpid(), self.directory), _empty_stats()))


def _file_info(fs: Any, path: str, fetch: Fetch | None) -> dict[str, Any]:
    lean = getattr(fetch, "info", None)
    if lean is not None:
        info = lean(path)
        if info.get("size") is not None and info.get("ETag"):
            return info
    return fs.info(path)


def _empty_stats() -> dict[str, int]:
    return {"fetched_bytes": 0, "fetch_requests": 0, "read_bytes": 0, "reads": 0}


class _Mirror:
    """One remote file's mirror in this process: the data and block-map descriptors (position-free I/O)."""

    def __init__(self, cache: RangeCache, key: str, url: str, size: int, version: str) -> None:
        self.url, self.size, self.version, self.block_size = url, size, version, cache.block_size
        self.nblocks = -(-size // self.block_size)
        self.directory = cache.directory
        base = os.path.join(cache.directory, key)
        try:
            Path(cache.directory).mkdir(parents=True, exist_ok=True)
            self.data = os.open(base + ".data", os.O_RDWR | os.O_CREAT, 0o644)
            self.have = os.open(base + ".blocks", os.O_RDWR | os.O_CREAT, 0o644)
            # idempotent: every process sizes them the same (the name carries the size)
            if os.fstat(self.data).st_size != size:
                os.ftruncate(self.data, size)
            if os.fstat(self.have).st_size != self.nblocks:
                os.ftruncate(self.have, self.nblocks)
            meta = base + ".json"
            if not os.path.exists(meta):
                tmp = f"{meta}.{os.getpid()}.tmp"
                with open(tmp, "w") as f:
                    json.dump({"url": url, "size": size, "version": version, "block_size": self.block_size}, f)
                os.replace(tmp, meta)
        except OSError as exc:
            raise RangeCacheError(
                f"range cache folder {cache.directory}: cannot hold a mirror of {url}: {exc}"
            ) from exc
        with _lock:
            self.stats = _stats.setdefault((os.getpid(), cache.directory), _empty_stats())

    def read(self, fs: Any, path: str, start: int, end: int, fetch: Fetch | None = None) -> bytes:
        """Bytes ``[start, end)`` (``end`` clipped to the size), fetching the blocks not yet present."""
        end = min(end, self.size)
        if start >= end:
            return b""
        bs = self.block_size
        first, last = start // bs, (end - 1) // bs
        present = os.pread(self.have, last - first + 1, first)
        if len(present) < last - first + 1 or 0 in present:
            self.ensure(fs, path, [(start, end)], fetch)
        data = os.pread(self.data, end - start, start)
        with _lock:
            self.stats["read_bytes"] += len(data)
            self.stats["reads"] += 1
        return data

    def ensure(self, fs: Any, path: str, ranges: list[tuple[int, int]], fetch: Fetch | None = None) -> None:
        """Fetch the blocks of byte ``ranges`` ``(start, end)`` that are not present, the runs at once."""
        bs = self.block_size
        wanted: set[int] = set()
        for start, end in ranges:
            end = min(end, self.size)
            if start < end:
                wanted.update(range(start // bs, (end - 1) // bs + 1))
        blocks = sorted(wanted)
        if not blocks:
            return
        present = os.pread(self.have, blocks[-1] - blocks[0] + 1, blocks[0])
        missing = [b for b in blocks if b - blocks[0] >= len(present) or present[b - blocks[0]] == 0]
        runs: list[tuple[int, int]] = []
        for b in missing:
            if runs and runs[-1][1] == b:
                runs[-1] = (runs[-1][0], b + 1)
            else:
                runs.append((b, b + 1))
        if runs:
            self._fetch_runs(fs, path, runs, fetch)

    def _fetch_runs(self, fs: Any, path: str, runs: list[tuple[int, int]], fetch: Fetch | None) -> None:
        bs = self.block_size
        starts = [b0 * bs for b0, _ in runs]
        ends = [min(b1 * bs, self.size) for _, b1 in runs]
        if fetch is not None and len(runs) == 1:
            chunks: list[Any] = [fetch(path, starts[0], ends[0])]
        elif fetch is not None:
            chunks = list(_pool().map(lambda se: fetch(path, *se), zip(starts, ends, strict=True)))
        elif len(runs) == 1:
            chunks = [fs.cat_file(path, start=starts[0], end=ends[0])]
        else:
            chunks = fs.cat_ranges([path] * len(runs), starts, ends, on_error="return")
        for (b0, b1), s, e, chunk in zip(runs, starts, ends, chunks, strict=True):
            if isinstance(chunk, BaseException):
                raise chunk
            if len(chunk) != e - s:
                raise OSError(f"{self.url}: asked for bytes {s}-{e - 1}, the server sent {len(chunk)} bytes")
            try:
                _pwrite_all(self.data, chunk, s)
                _pwrite_all(self.have, b"\x01" * (b1 - b0), b0)  # only after the data is there
            except OSError as exc:
                raise RangeCacheError(
                    f"range cache folder {self.directory}: cannot write the bytes of {self.url}: {exc}"
                ) from exc
        with _lock:
            self.stats["fetched_bytes"] += sum(e - s for s, e in zip(starts, ends, strict=True))
            self.stats["fetch_requests"] += len(runs)


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


class PositionedReader(io.RawIOBase):
    """A read-only, seekable file object with its own position: subclasses give ``read`` and ``_end``.

    The shared part of the file objects pipekit hands rasterio's ``opener=``
    (this module's :class:`CachedFile`, ``pipekit.geo.io``'s fsspec view).
    """

    _pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def _end(self) -> int | None:
        """The file's size for ``seek(..., 2)``; ``None`` leaves the position where it is."""
        raise NotImplementedError

    def seek(self, offset: int, whence: int = 0) -> int:
        if whence == 0:
            self._pos = offset
        elif whence == 1:
            self._pos += offset
        elif whence == 2:
            end = self._end()
            if end is not None:
                self._pos = end + offset
        else:
            raise ValueError(f"invalid whence {whence}")
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        memoryview(buffer).cast("B")[: len(data)] = data
        return len(data)


class CachedFile(PositionedReader):
    """A read-only, seekable view of a remote file through its mirror (one position per object).

    ``on_error``, when given, is called with a failed read's exception and the
    read returns ``b""`` (GDAL must not see Python exceptions: ``pipekit.geo.io``
    raises it once the rasterio call returns).
    """

    def __init__(
        self,
        mirror: _Mirror,
        fs: Any,
        path: str,
        fetch: Fetch | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        super().__init__()
        self._mirror, self._fs, self._path, self._fetch, self._on_error = mirror, fs, path, fetch, on_error
        self.size = mirror.size

    def _end(self) -> int:
        return self.size

    def read(self, size: int | None = -1) -> bytes:
        end = self.size if size is None or size < 0 else self._pos + size
        try:
            data = self._mirror.read(self._fs, self._path, self._pos, end, self._fetch)
        except Exception as exc:
            if self._on_error is None:
                raise
            self._on_error(exc)
            return b""
        self._pos += len(data)
        return data
