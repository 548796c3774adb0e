"""Caching on disk: ``on_disk_cache`` ... ``end_caching``.

:class:`OnDiskCacheHolder` and :class:`EndOnDiskCacheHolder` cache the result
of expensive steps (downloads, decompression) as local files::

    urls.on_disk_cache(filepath_fn=local_path)   # items whose file exists skip the next pipes
        .map(download)                           # -> (url, bytes or stream)
        .end_caching(mode="wb", same_filepath_fn=True)   # writes the file, yields its path

Several processes (DataLoader workers, ranks, jobs) may fill the same cache at
once: each file is written to a temporary name in its directory and renamed
into place atomically (``os.replace``), so a reader never sees a partial
file; a lock file (``<path>.lock``, held with ``flock``) makes sure only one
process creates a given entry while the others wait for it.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import numbers
import os
import reprlib
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from pipekit.errors import CacheError, ReadError
from pipekit.pipes._cache_files import (
    _file_digest,
    _write_atomic,
    changed_since_written,
    read_record,
    write_record,
)
from pipekit.pipes._torch import pipe_graph
from pipekit.pipes.base import IterDataPipe, functional_datapipe
from pipekit.pipes.state import ResumablePipe

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]
try:  # Windows
    import msvcrt
except ImportError:
    msvcrt = None  # type: ignore[assignment]

__all__ = ["CacheError", "EndOnDiskCacheHolder", "OnDiskCacheHolder"]

logger = logging.getLogger("pipekit")

_LIST_SUFFIX = ".torchdata_list"  # torchdata's name, so caches written by torchdata are reused
_LOCK_SUFFIX = ".lock"
_HASH_TYPES = ("sha256", "md5")
_CHUNK = 1 << 20


def _as_path(value: Any, what: str, stage: str) -> str:
    if isinstance(value, (list, tuple)) or inspect.isgenerator(value):
        raise TypeError(
            f"{stage}: {what} must be a single file path, got a {type(value).__name__}; when one item "
            "produces several files, on_disk_cache's filepath_fn names one key path and end_caching "
            "records the files it writes"
        )
    try:
        path = os.fspath(value)
    except TypeError:
        raise TypeError(
            f"{stage}: {what} must be a file path (str or os.PathLike), got {type(value).__name__} "
            f"{reprlib.repr(value)}; pass a filepath_fn that maps it to a local path"
        ) from None
    return os.fsdecode(path)


def _expected_hash(hash_dict: Mapping[str, str], path: str) -> str | None:
    for candidate in (path, os.path.normpath(path), os.path.abspath(path)):
        if candidate in hash_dict:
            return str(hash_dict[candidate]).lower()
    return None


class _FileLock:
    """An exclusive inter-process lock on ``path`` (``flock``; released if the process dies).

    The lock file is removed on release.  A waiter that locked a file which has
    meanwhile been removed (or replaced) retries on the current one.
    """

    def __init__(self, path: str, timeout: float, key: str) -> None:
        self.path = path
        self.timeout = timeout
        self.key = key
        self.fd: int | None = None

    @staticmethod
    def _try_lock(fd: int) -> bool:
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            elif msvcrt is not None:  # pragma: no cover - Windows
                msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
            return True
        except OSError:
            return False

    @staticmethod
    def _unlock(fd: int) -> None:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
        elif msvcrt is not None:  # pragma: no cover - Windows
            os.lseek(fd, 0, os.SEEK_SET)
            msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)

    def __enter__(self) -> _FileLock:
        deadline = time.monotonic() + self.timeout
        delay = 0.002
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            except OSError as exc:
                raise ReadError("lock", self.path, "end_caching", exc) from exc
            if self._try_lock(fd):
                try:
                    current = os.stat(self.path)
                except FileNotFoundError:
                    current = None
                if current is not None and os.path.samestat(current, os.fstat(fd)):
                    self.fd = fd
                    return self
                self._unlock(fd)  # the holder removed this lock file as we got it: retry
            os.close(fd)
            if time.monotonic() >= deadline:
                raise ReadError(
                    "cache",
                    self.key,
                    "end_caching",
                    f"another process has been creating it for more than {self.timeout} s (it holds the "
                    f"lock file {self.path!r}); raise end_caching's timeout if that is expected",
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.05)

    def __exit__(self, *exc: object) -> None:
        fd, self.fd = self.fd, None
        if fd is None:
            return
        try:
            if fcntl is not None:  # POSIX: remove the file while still holding it (see the class docstring)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)
            self._unlock(fd)
        finally:
            os.close(fd)


@functional_datapipe("on_disk_cache")
class OnDiskCacheHolder(IterDataPipe):
    """Start a section of the pipeline whose results are cached as files (functional name: ``on_disk_cache``).

    Must be followed, after the pipes that produce the files, by
    :meth:`end_caching <EndOnDiskCacheHolder>`, which drives the whole
    section; iterating an ``on_disk_cache`` pipe directly raises
    ``RuntimeError``.  For each item from ``source_datapipe``,
    ``filepath_fn(item)`` (or the item itself) names its *key path*:

    * if the key path is a file that passes the checks below, or a list of the
      files the item produced earlier (``<key path>.torchdata_list``, written by
      ``end_caching`` when the files differ from the key path, e.g. an archive
      extracted to several files) whose files all pass them, the item is
      *cached*: the pipes between ``on_disk_cache`` and ``end_caching`` are
      skipped and ``end_caching`` yields the cached file path(s);
    * otherwise the item goes through those pipes and ``end_caching`` writes
      their output.

    Checks: a file ``end_caching`` wrote must still be what it wrote (its
    size, and its sha256 once its modification time moved: the record beside
    the key path, :mod:`pipekit.pipes._cache_files`), so a file cut short or
    rewritten since is created again, with a warning naming it, never served;
    with ``hash_dict``, a file must be listed there with its
    ``hash_type`` digest (a file missing from ``hash_dict`` or with another
    digest is created again, and writing a file whose data does not match
    raises :class:`CacheError`); ``extra_check_fn(path)`` must return True.
    Failed checks are logged as warnings.

    Args:
        source_datapipe: the items (often URLs).
        filepath_fn: maps an item to its key path (one path; generator
            functions are refused, as in torchdata 0.9).  None: the item is the path.
        hash_dict: expected digests by file path.
        hash_type: ``"sha256"`` or ``"md5"``.
        extra_check_fn: an extra validation of a cached file path.

    Example:
        >>> import os, tempfile
        >>> from pipekit.pipes import IterableWrapper
        >>> root = tempfile.mkdtemp()
        >>> def local(name):
        ...     return os.path.join(root, name + ".txt")
        >>> def fetch(name):
        ...     return name, name.upper()
        >>> dp = IterableWrapper(["a", "b"]).on_disk_cache(filepath_fn=local)
        >>> dp = dp.map(fetch).end_caching(mode="w", same_filepath_fn=True)
        >>> [os.path.basename(p) for p in dp]
        ['a.txt', 'b.txt']
        >>> with open(local("b")) as f:
        ...     f.read()
        'B'
        >>> import shutil; shutil.rmtree(root)
    """

    stateless = True  # the item handed to the inner pipes is always consumed before end_caching yields

    def __init__(
        self,
        source_datapipe: IterDataPipe,
        filepath_fn: Callable[[Any], Any] | None = None,
        hash_dict: Mapping[str, str] | None = None,
        hash_type: str = "sha256",
        extra_check_fn: Callable[[str], bool] | None = None,
    ) -> None:
        if filepath_fn is not None:
            if not callable(filepath_fn):
                raise TypeError(f"on_disk_cache: filepath_fn must be callable, got {type(filepath_fn).__name__}")
            if inspect.isgeneratorfunction(filepath_fn):
                raise TypeError(
                    "on_disk_cache: filepath_fn must return one path, not be a generator function "
                    "(torchdata 0.9 refused them too); end_caching records the files each item produces"
                )
        if hash_type not in _HASH_TYPES:
            raise ValueError(f"on_disk_cache: hash_type must be one of {_HASH_TYPES}, got {hash_type!r}")
        if hash_dict is not None and not isinstance(hash_dict, Mapping):
            raise TypeError(f"on_disk_cache: hash_dict must be a dict, got {type(hash_dict).__name__}")
        if extra_check_fn is not None and not callable(extra_check_fn):
            raise TypeError(f"on_disk_cache: extra_check_fn must be callable, got {type(extra_check_fn).__name__}")
        self.source_datapipe = source_datapipe
        self.filepath_fn = filepath_fn
        self.hash_dict = dict(hash_dict) if hash_dict is not None else None
        self.hash_type = hash_type
        self.extra_check_fn = extra_check_fn
        self._end_caching_flag = False
        self._todo: deque[Any] = deque()

    def __iter__(self) -> Iterator[Any]:
        if not self._end_caching_flag:
            raise RuntimeError(
                "on_disk_cache: call .end_caching() after the pipes that produce the files, and iterate "
                "the pipe it returns"
            )
        while self._todo:
            yield self._todo.popleft()

    def __add__(self, other: Any) -> Any:
        raise RuntimeError("on_disk_cache: OnDiskCacheHolder does not support '+'")

    def _key(self, item: Any) -> str:
        value = item if self.filepath_fn is None else self.filepath_fn(item)
        return _as_path(value, "the cache key path of an item (filepath_fn's result)", "on_disk_cache")

    def _file_ok(self, path: str, record: dict[str, Any] | None = None) -> bool:
        if not os.path.isfile(path):
            return False
        if record:
            changed = changed_since_written(path, record.get(path))
            if changed is not None:
                logger.warning("on_disk_cache: cached file %r %s; it is created again", path, changed)
                return False
        if self.hash_dict is not None:
            expected = _expected_hash(self.hash_dict, path)
            if expected is None:
                logger.warning("on_disk_cache: cached file %r is not in hash_dict; it is created again", path)
                return False
            actual = _file_digest(path, self.hash_type)
            if actual != expected:
                logger.warning(
                    "on_disk_cache: cached file %r has %s %s, expected %s; it is created again",
                    path,
                    self.hash_type,
                    actual,
                    expected,
                )
                return False
        if self.extra_check_fn is not None and not self.extra_check_fn(path):
            logger.warning("on_disk_cache: extra_check_fn rejected cached file %r; it is created again", path)
            return False
        return True

    def _lookup(self, key: str) -> list[str] | None:
        """The cached file paths of the item with key path ``key``, or None if it is not cached."""
        list_file = key + _LIST_SUFFIX
        record = read_record(key)
        if os.path.isfile(list_file):
            with open(list_file, encoding="utf-8") as f:
                entries = f.read().splitlines()
            return entries if all(self._file_ok(p, record) for p in entries) else None
        return [key] if self._file_ok(key, record) else None


def _find_holder(datapipe: IterDataPipe) -> OnDiskCacheHolder | None:
    """The ``on_disk_cache`` pipe closest to ``datapipe`` in its graph (breadth first)."""
    level = [pipe_graph(datapipe)]
    while level:
        for graph in level:
            for dp, _ in graph.values():
                if isinstance(dp, OnDiskCacheHolder):
                    return dp
        level = [sub for graph in level for _, sub in graph.values()]
    return None


@functional_datapipe("end_caching")
class EndOnDiskCacheHolder(ResumablePipe):
    """Write the results of an ``on_disk_cache`` section to files (functional name: ``end_caching``).

    The pipe before it must yield ``(metadata, data)`` pairs; each ``data``
    (bytes or str, a readable stream -- read in chunks and closed -- or an
    iterable of chunks) is written to ``filepath_fn(metadata)`` (or to
    ``metadata`` itself) and the path is yielded.  Items the ``on_disk_cache``
    found cached skip the section and their cached paths are yielded instead.

    Files are written to a temporary file in the target's directory, checked
    against ``hash_dict`` (a mismatch, or a file ``hash_dict`` does not list,
    raises :class:`CacheError` naming it) and renamed into place, so no reader
    ever sees a partial file and a failure leaves nothing behind.  When the
    files an item produced are not exactly its key path (e.g. the members of
    an extracted archive), their list is written to
    ``<key path>.torchdata_list`` after all of them (the format torchdata used,
    so its caches are reused), marking the item cached.  An item that
    produced no file is not cached (a warning is logged).

    Several processes can share a cache: before running the section for an
    item, a process takes the lock ``<key path>.lock``; the others wait up to
    ``timeout`` seconds for it and then use the files it wrote.

    Resumable: the snapshot holds the item whose paths are being yielded and
    how many of them were; a restored copy lets the section's restored pipes
    finish what they held, then yields that item's remaining paths.

    Differences from torchdata 0.9: paths are yielded in the order of the
    source items (torchdata yielded newly written files first, then cached
    ones); the section runs once per uncached item (each run starts a fresh
    iterator over the section's pipes, so they must derive from
    ``on_disk_cache`` only); ``data`` may be bytes whatever ``skip_read``;
    and concurrent processes coordinate through lock files rather than
    ``.promise`` files.

    Args:
        datapipe: the section's last pipe, with an ``on_disk_cache`` upstream.
        mode: ``"wb"`` (bytes) or ``"w"``/``"wt"`` (str, written as UTF-8).
        filepath_fn: maps the metadata to the file path; None: the metadata is the path.
        same_filepath_fn: use ``on_disk_cache``'s ``filepath_fn`` (exclusive with ``filepath_fn``).
        skip_read: the data is already bytes or str (streams are refused).
        timeout: seconds to wait for another process that is creating the same entry.

    Example:
        >>> import os, tempfile
        >>> from pipekit.pipes import IterableWrapper
        >>> root = tempfile.mkdtemp()
        >>> calls = []
        >>> def local(n):
        ...     return os.path.join(root, f"{n}.bin")
        >>> def make(n):
        ...     calls.append(n)
        ...     return n, bytes([n]) * 4
        >>> dp = IterableWrapper([1, 2]).on_disk_cache(filepath_fn=local).map(make)
        >>> dp = dp.end_caching(mode="wb", same_filepath_fn=True)
        >>> [os.path.basename(p) for p in dp], calls
        (['1.bin', '2.bin'], [1, 2])
        >>> [os.path.basename(p) for p in dp], calls  # the second epoch reads the cache
        (['1.bin', '2.bin'], [1, 2])
        >>> import shutil; shutil.rmtree(root)
    """

    state_keys = ("current",)

    def __init__(
        self,
        datapipe: IterDataPipe,
        mode: str = "wb",
        filepath_fn: Callable[[Any], Any] | None = None,
        *,
        same_filepath_fn: bool = False,
        skip_read: bool = False,
        timeout: float = 300,
    ) -> None:
        if filepath_fn is not None and same_filepath_fn:
            raise ValueError("end_caching: filepath_fn and same_filepath_fn=True are mutually exclusive")
        if mode not in ("wb", "w", "wt"):
            raise ValueError(f"end_caching: mode must be 'wb', 'w' or 'wt', got {mode!r}")
        if filepath_fn is not None and not callable(filepath_fn):
            raise TypeError(f"end_caching: filepath_fn must be callable, got {type(filepath_fn).__name__}")
        self._check_timeout(timeout)
        holder = _find_holder(datapipe)
        if holder is None:
            raise RuntimeError("end_caching: expected an on_disk_cache() pipe upstream of end_caching")
        if holder._end_caching_flag:
            raise RuntimeError("end_caching: end_caching can only be called once per on_disk_cache")
        holder._end_caching_flag = True
        self.source_datapipe = datapipe
        self.mode = mode
        self.filepath_fn = holder.filepath_fn if same_filepath_fn else filepath_fn
        self.same_filepath_fn = bool(same_filepath_fn)
        self.skip_read = bool(skip_read)
        self.timeout = timeout
        self._holder = holder
        self._current: dict[str, Any] | None = None  # the item whose paths are being yielded
        self._resuming = False  # this epoch continues a loaded checkpoint
        self._continue: dict[str, Any] | None = None  # the checkpoint's current item: finish it first

    @property
    def datapipe(self) -> IterDataPipe:
        """The section's last pipe (torchdata's attribute name for ``source_datapipe``)."""
        return self.source_datapipe

    @staticmethod
    def _check_timeout(timeout: Any) -> None:
        if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
            raise TypeError(f"end_caching: timeout must be a number of seconds, got {type(timeout).__name__}")
        if timeout <= 0:
            raise ValueError(f"end_caching: timeout must be positive, got {timeout}")

    def set_timeout(self, timeout: float) -> EndOnDiskCacheHolder:
        """Change how long to wait for another process creating the same entry."""
        self._check_timeout(timeout)
        self.timeout = timeout
        return self

    def state_dict(self) -> dict[str, Any]:
        current = self._current
        return {"current": None if current is None else {"item": current["item"], "done": current["done"]}}

    def restore(self, state: dict[str, Any] | None) -> None:
        self._current = None
        self._resuming = state is not None
        self._continue = None if state is None else state.get("current")

    def __iter__(self) -> Iterator[str]:
        if self._resuming:
            self._drain_section()
            current = self._continue
            if current is not None:
                yield from self._process(current["item"], skip=int(current["done"]))
        for item in self._holder.source_datapipe:
            yield from self._process(item)
        self._current = None

    def _drain_section(self) -> None:
        """Let the section's restored pipes consume their pending state (they are between items)."""
        self._holder._todo.clear()
        for out in self.source_datapipe:
            logger.warning("end_caching: discarded %s left in the pipeline by the checkpoint", reprlib.repr(out))

    def _process(self, item: Any, skip: int = 0) -> Iterator[str]:
        holder = self._holder
        key = holder._key(item)
        self._current = {"item": item, "key": key, "done": skip}
        paths = holder._lookup(key)
        if paths is None:
            paths = self._create(item, key)
        for i in range(skip, len(paths)):
            self._current["done"] = i + 1
            yield paths[i]

    def _create(self, item: Any, key: str) -> list[str]:
        try:
            os.makedirs(os.path.dirname(key) or ".", exist_ok=True)
        except OSError as exc:
            raise ReadError("cache", key, "end_caching", exc) from exc
        with _FileLock(key + _LOCK_SUFFIX, self.timeout, key):
            paths = self._holder._lookup(key)  # another process may have created it meanwhile
            if paths is not None:
                return paths
            return self._run_section(item, key)

    def _target(self, meta: Any) -> str:
        value = meta if self.filepath_fn is None else self.filepath_fn(meta)
        return _as_path(value, "the file path of an output (filepath_fn's result)", "end_caching")

    def _run_section(self, item: Any, key: str) -> list[str]:
        holder = self._holder
        holder._todo.clear()
        holder._todo.append(item)
        written: list[str] = []
        entries: dict[str, dict[str, Any]] = {}
        binary = "b" in self.mode
        try:
            for out in self.source_datapipe:
                if not isinstance(out, (tuple, list)) or len(out) != 2:
                    raise TypeError(
                        f"end_caching: expected (metadata, data) pairs from the pipe before it, got "
                        f"{reprlib.repr(out)} while creating {key!r}"
                    )
                meta, data = out
                path = self._target(meta)
                expected = None
                if holder.hash_dict is not None:
                    expected = _expected_hash(holder.hash_dict, path)
                    if expected is None:
                        raise CacheError("cache", path, "end_caching", "hash_dict has no expected hash for it")
                # the record is written before the item's last file is in place (the key path, or the list file)
                publish = functools.partial(_record_one, key) if path == key else None
                entry = _write_atomic(path, data, binary=binary, skip_read=self.skip_read, expected=expected,
                                      hash_type=holder.hash_type, before_publish=publish)
                written.append(path)
                entries[path] = entry
        finally:
            holder._todo.clear()
        if not written:
            logger.warning("end_caching: no file was produced for %r; it will be processed again next time", key)
        elif written != [key]:
            if key in written:
                raise CacheError(
                    "cache",
                    key,
                    "end_caching",
                    f"the pipeline wrote {len(written)} files for this item, one of them at its key path; "
                    "when an item produces several files, on_disk_cache's filepath_fn must name a path "
                    "that is not written (e.g. the archive's)",
                )
            bad = [p for p in written if "\n" in p or "\r" in p]
            if bad:
                raise CacheError("cache", bad[0], "end_caching", "file paths with line breaks cannot be listed")
            write_record(key, entries)
            _write_atomic(key + _LIST_SUFFIX, "".join(p + "\n" for p in written), binary=False)
        return written


def _record_one(key: str, entry: dict[str, Any]) -> None:
    write_record(key, {key: entry})
