"""The files of ``on_disk_cache``: written whole under a temporary name, and recorded, so a cut one is not served.

:func:`_write_atomic` writes a file to a temporary name beside it and renames
it into place, so a reader never sees a partial file and a run killed while
writing leaves nothing at the final name.  A file can still be shorter than it
was written, or other bytes: a disk that filled, a copy cut short, a file
truncated or rewritten in place by something else, a process killed while
writing in place (torchdata's cache did that).  So ``end_caching`` keeps, for
each item, a *record* of the files it wrote: a hidden JSON file beside the
item's key path, ``.<key name>.pipekit-cache``, with each file's size,
sha256 and modification time, written before the item is marked cached.
:func:`changed_since_written` compares a cached file with its record: another
size, or another modification time and another sha256 (a file only touched is
hashed again, at each lookup), makes ``on_disk_cache`` produce the
item again, with a warning naming the file.  A file without a record (a cache
written by torchdata or an older pipekit) is served as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from pipekit.errors import CacheError, ReadError

__all__: list[str] = []

logger = logging.getLogger("pipekit")

_CHUNK = 1 << 20
RECORD_HASH = "sha256"  # the digest a record keeps of each file
_RECORD_SUFFIX = ".pipekit-cache"


def _file_digest(path: str, hash_type: str) -> str:
    digest = hashlib.new(hash_type)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()




def _chunks(data: Any, binary: bool, skip_read: bool, path: str) -> Iterator[Any]:
    """The pieces of ``data`` to write: bytes/str as is, streams read in chunks, iterables of chunks."""
    kind = bytes if binary else str

    def check(chunk: Any) -> Any:
        if binary and isinstance(chunk, (bytes, bytearray, memoryview)):
            return chunk
        if not binary and isinstance(chunk, str):
            return chunk
        hint = f"; use mode={'w' if binary else 'wb'!r}" if isinstance(chunk, (str, bytes)) else ""
        raise TypeError(
            f"end_caching: cannot write a {type(chunk).__name__} to {path!r} in "
            f"{'binary' if binary else 'text'} mode (expected {kind.__name__}){hint}"
        )

    if isinstance(data, (bytes, bytearray, memoryview, str)):
        yield check(data)
        return
    if skip_read:
        raise TypeError(
            f"end_caching: with skip_read=True the data for {path!r} must be bytes or str, "
            f"got {type(data).__name__}"
        )
    read = getattr(data, "read", None)
    if callable(read):
        try:
            while chunk := read(_CHUNK):
                yield check(chunk)
        finally:
            close = getattr(data, "close", None)
            if callable(close):
                close()
        return
    try:
        pieces = iter(data)
    except TypeError:
        raise TypeError(
            f"end_caching: cannot write a {type(data).__name__} to {path!r}: expected bytes, str, a "
            "readable stream or an iterable of chunks"
        ) from None
    for chunk in pieces:
        yield check(chunk)


def _write_atomic(
    path: str,
    data: Any,
    *,
    binary: bool,
    skip_read: bool = False,
    expected: str | None = None,
    hash_type: str = "sha256",
    stage: str = "end_caching",
    before_publish: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Write ``data`` to a temporary file next to ``path``, check its hash, rename it to ``path``.

    Returns what the file is (:func:`file_entry`: its size, sha256 and modification time), which
    ``before_publish`` (if given) also gets before the rename: a record of it written there is never
    older than the file.  Errors name ``path`` and ``stage`` (the pipe or recipe writing).
    """
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    digest = hashlib.new(hash_type) if expected is not None else None
    content = digest if hash_type == RECORD_HASH and digest is not None else hashlib.new(RECORD_HASH)
    try:
        try:
            os.makedirs(directory, exist_ok=True)
            f = open(tmp, "wb") if binary else open(tmp, "w", encoding="utf-8", newline="")  # noqa: SIM115
        except OSError as exc:
            raise ReadError("write", path, stage, exc) from exc
        with f:
            for chunk in _chunks(data, binary, skip_read, path):
                try:
                    f.write(chunk)
                except OSError as exc:
                    raise ReadError("write", path, stage, exc) from exc
                raw = chunk if binary else chunk.encode("utf-8")
                if digest is not None:
                    digest.update(raw)
                if content is not digest:
                    content.update(raw)
            try:
                f.flush()
                os.fsync(f.fileno())
            except OSError as exc:
                raise ReadError("write", path, stage, exc) from exc
        if digest is not None and digest.hexdigest() != expected:
            raise CacheError(
                "cache", path, stage, f"{hash_type} mismatch: expected {expected}, got {digest.hexdigest()}"
            )
        st = os.stat(tmp)
        entry = {"size": st.st_size, RECORD_HASH: content.hexdigest(), "mtime_ns": st.st_mtime_ns}
        if before_publish is not None:
            before_publish(entry)
        try:
            os.replace(tmp, path)
        except OSError as exc:
            raise ReadError("write", path, stage, exc) from exc
        return entry
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def record_path(key: str) -> str:
    """Where the record of the item with key path ``key`` is: a hidden file beside it."""
    directory, name = os.path.split(key)
    return os.path.join(directory, f".{name}{_RECORD_SUFFIX}")


def write_record(key: str, files: dict[str, dict[str, Any]]) -> None:
    """Record what each of the files the item ``key`` produced is (``{path: file entry}``), atomically."""
    _write_atomic(record_path(key), json.dumps({"version": 1, "files": files}), binary=False)


def read_record(key: str) -> dict[str, dict[str, Any]]:
    """The files the record of ``key`` describes (``{}`` when there is none, or it cannot be read)."""
    try:
        with open(record_path(key), encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return {}
    files = record.get("files") if isinstance(record, dict) else None
    return files if isinstance(files, dict) else {}


def changed_since_written(path: str, entry: Any) -> str | None:
    """Why the cached file ``path`` is not what its record ``entry`` says was written, or ``None``.

    Another size; or, when its modification time moved, another sha256.  A
    file whose bytes are the same (only touched) is fine.
    """
    if not isinstance(entry, dict) or not isinstance(entry.get("size"), int):
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None  # gone: the caller's own check says so
    if st.st_size != entry["size"]:
        return (f"is {st.st_size:,} bytes, {entry['size']:,} when it was written (cut short or changed since: a "
                "disk that filled, a copy or write that stopped)")
    if st.st_mtime_ns == entry.get("mtime_ns") or not isinstance(entry.get(RECORD_HASH), str):
        return None
    actual = _file_digest(path, RECORD_HASH)
    if actual != entry[RECORD_HASH]:
        return f"was rewritten since it was written ({RECORD_HASH} {actual}, {entry[RECORD_HASH]} then)"
    return None
