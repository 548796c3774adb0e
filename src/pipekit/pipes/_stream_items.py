"""Helpers shared by the pipes that read ``(url, binary stream)`` items: archives and decompression.

* :func:`check_pair` validates an item (a pair, a binary stream);
* :func:`raw_stream` unwraps a :class:`StreamWrapper`, :func:`is_seekable` asks a stream safely;
* :data:`CORRUPT` lists the errors a damaged archive or compressed stream raises;
* :func:`reopen_stream` opens a URL again to resume it mid-file: through the
  ``reopen(url)`` of the nearest pipe upstream that has one
  (:func:`pipekit.pipes.state.find_reopen`), else with ``fsspec.open(url, "rb")``;
* :class:`ChunkedReader` reads a remote file in large sequential chunks for
  readers that seek and read it in small pieces (``load_from_tar``);
* :func:`find_open_stream` finds an open stream in an item (DataLoader workers
  refuse to hand those to the main process);
* :func:`streams_as_bytes` / :func:`streams_from_bytes`: a checkpoint holds an
  in-memory stream (an archive member read whole) as its bytes, and a resumed
  pipeline gets the stream back;
* :func:`note_opened` / :func:`last_opened`: the last file or member this
  process's file pipes opened, which ``pipekit.DataLoader`` reports when a
  worker dies.
"""

from __future__ import annotations

import io
import lzma
import tarfile
import zipfile
import zlib
from typing import Any

import fsspec
import numpy as np
import torch

from pipekit.errors import ArchiveError, StageError
from pipekit.pipes.base import StreamWrapper
from pipekit.pipes.state import find_reopen

__all__ = [
    "CORRUPT",
    "ChunkedReader",
    "MemoryMember",
    "check_pair",
    "find_open_stream",
    "is_seekable",
    "last_opened",
    "note_opened",
    "raw_stream",
    "reason",
    "reopen_stream",
    "stream_name",
    "streams_as_bytes",
    "streams_from_bytes",
]

# Errors that reading a damaged archive or compressed stream can raise.
CORRUPT: tuple[type[BaseException], ...] = (
    tarfile.TarError,
    zipfile.BadZipFile,
    zlib.error,
    lzma.LZMAError,
    EOFError,
    OSError,
    ValueError,
)


def reason(exc: BaseException) -> str:
    """The reason an error gives: a pipekit error's own, else ``"Type: message"``."""
    return exc.reason if isinstance(exc, StageError) else f"{type(exc).__name__}: {exc}"


def raw_stream(stream: Any) -> Any:
    """The file object inside a :class:`StreamWrapper` (or ``stream`` itself)."""
    return stream.file_obj if isinstance(stream, StreamWrapper) else stream


def is_seekable(stream: Any) -> bool:
    """Whether ``stream`` says it can seek (``False`` when asking fails)."""
    try:
        return bool(stream.seekable())
    except Exception:
        return False


def check_pair(item: Any, stage: str) -> tuple[str, Any]:
    """``item`` as ``(url, binary stream)``, or a ``TypeError`` naming ``stage``."""
    if not isinstance(item, tuple | list) or len(item) != 2 or not isinstance(item[0], str):
        raise TypeError(f"{stage}: expected (url, stream) tuples, got {type(item).__name__}: {item!r:.200}")
    url, stream = item
    if not hasattr(stream, "read") and not isinstance(raw_stream(stream), tarfile.TarFile | zipfile.ZipFile):
        raise TypeError(f"{stage}: the stream for {url!r} has no read() method: {type(stream).__name__}")
    if isinstance(raw_stream(stream), io.TextIOBase):
        raise TypeError(
            f"{stage}: the stream for {url!r} is a text stream; open archives and compressed files in "
            'binary mode: open_files_by_fsspec(mode="rb")'
        )
    return url, stream


def reopen_stream(upstream: Any, url: str, stage: str) -> StreamWrapper:
    """Open ``url`` again to resume it: through ``upstream``'s ``reopen(url)``, else with fsspec.

    Raises :class:`~pipekit.errors.ArchiveError` naming ``url`` and ``stage``
    when it cannot be opened.
    """
    reopen = find_reopen(upstream)
    try:
        if reopen is not None:
            stream = reopen(url)
        else:
            stream = fsspec.open(url, "rb").open()
    except Exception as exc:
        raise ArchiveError(
            "reopen archive",
            url,
            stage,
            f"cannot open it again to resume it ({reason(exc)}); open archives with "
            "open_files_by_fsspec so the loader can re-open them with the same storage options",
        ) from exc
    return stream if isinstance(stream, StreamWrapper) else StreamWrapper(stream, name=url)


class ChunkedReader(io.RawIOBase):
    """A seekable binary reader over ``raw`` that reads it in large sequential chunks.

    ``tarfile`` reads an archive in pieces of 512 bytes (headers) and one
    member's size, seeking before each; on a remote file (an fsspec or
    :class:`~pipekit.pipes._fsspec_io.RetryingFile` stream) each of those
    goes through the file's Python layers, and a reader that looks ahead
    (``webdataset`` reads the next sample's first header before the current
    sample's data) seeks back behind the file's read-ahead cache, which
    then fetches the same range again.  Here ``raw`` is read ``chunk_size``
    bytes at a time, in order, and the last ``keep`` chunks stay in memory:
    reads and seeks within them (the look-back included) touch ``raw`` not
    at all, so the file is read as one sequential stream of large reads.  A
    seek outside the kept chunks (a resumed archive skipping to a member, a
    check of the end) moves ``raw`` there and the chunks go on from that
    offset.  Errors and retries are ``raw``'s own (a :class:`RetryingFile`
    retries transient failures and names the URL and stage).  ``raw`` is not
    closed here: its owner closes it.

    Args:
        raw: a seekable binary file.
        chunk_size: bytes per read of ``raw``.
        keep: chunks kept in memory (at least 2, so a look-back across a
            chunk boundary stays in memory).

    Example:
        >>> import io
        >>> raw = io.BytesIO(b"abcdefghij")
        >>> f = ChunkedReader(raw, chunk_size=4)
        >>> f.read(3), f.read(3), f.seek(1), f.read(2), raw.tell()  # raw read twice: 0-4, 4-8
        (b'abc', b'def', 1, b'bc', 8)
    """

    def __init__(self, raw: Any, chunk_size: int = 8 * 2**20, keep: int = 2) -> None:
        super().__init__()
        if chunk_size < 1 or keep < 2:
            raise ValueError(f"ChunkedReader: chunk_size must be >= 1 and keep >= 2, got {chunk_size}, {keep}")
        self.raw = raw
        self.chunk_size = chunk_size
        self.keep = keep
        self.name = getattr(raw, "name", None)
        self._pos = raw.tell()
        self._raw_pos: int | None = self._pos  # where raw is; None: not known
        self._chunks: list[tuple[int, bytes]] = []  # (offset, data), oldest first
        self._end: int | None = None  # the file's size, once known

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self.raw.seek(offset, io.SEEK_END)
            self._raw_pos = pos
            self._end = pos - offset
        else:
            raise ValueError(f"ChunkedReader: invalid whence {whence!r}")
        if pos < 0:
            raise ValueError(f"ChunkedReader: negative seek position {pos}")
        self._pos = pos
        return pos

    def _chunk_at(self, pos: int) -> tuple[int, bytes] | None:
        for start, data in reversed(self._chunks):
            if start <= pos < start + len(data):
                return start, data
        if self._end is not None and pos >= self._end:
            return None
        if self._raw_pos != pos:
            self.raw.seek(pos)
        data = self.raw.read(self.chunk_size)
        self._raw_pos = pos + len(data)
        if not data:
            self._end = pos
            return None
        self._chunks.append((pos, data))
        del self._chunks[: -self.keep]
        return pos, data

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            size = 1 << 62
        parts = []
        while size > 0:
            found = self._chunk_at(self._pos)
            if found is None:
                break
            start, data = found
            offset = self._pos - start
            piece = data[offset : offset + size]
            parts.append(piece)
            self._pos += len(piece)
            size -= len(piece)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._chunks = []
        super().close()


# -- open streams in items ---------------------------------------------------------------------------

# Objects holding an open file or archive: they cannot be pickled to another process.
_STREAM_TYPES: tuple[type, ...] = (io.IOBase, StreamWrapper, tarfile.TarFile, zipfile.ZipFile)
# In-memory buffers pickle with their content: they may cross.
_IN_MEMORY: frozenset[type] = frozenset({io.BytesIO, io.StringIO})
# Exact types looked at no further: most items are made of these.
_PLAIN: frozenset[type] = frozenset(
    {torch.Tensor, np.ndarray, int, float, bool, str, bytes, bytearray, type(None), np.float32, np.int64}
)


def _open_stream(value: Any) -> Any:
    if not isinstance(value, _STREAM_TYPES):
        return None
    inner = value.file_obj if isinstance(value, StreamWrapper) else value
    return None if type(inner) in _IN_MEMORY else value


_SEQUENCES: frozenset[type] = frozenset({tuple, list})


def find_open_stream(item: Any) -> Any:
    """The first open stream (file, archive member, fsspec file, ``StreamWrapper``) in ``item``, else ``None``.

    A shallow look, cheap enough to run on every item (measured at about
    0.05 µs for a tensor and 0.2 µs for a dict of three tensors): ``item`` itself, the members of a
    tuple/list/dict ``item``, and, for a tuple/list (a batch), the members
    of its first element when that is a tuple/list/dict (a batch of
    ``(url, stream)`` pairs or of sample dicts).  ``io.BytesIO`` and
    ``io.StringIO`` (whose content pickles with them) do not count.
    """
    kind = type(item)
    if kind in _PLAIN:
        return None
    if kind is dict or (kind not in _SEQUENCES and isinstance(item, dict)):
        members: Any = item.values()
        batch = False
    elif kind in _SEQUENCES or isinstance(item, tuple | list):
        members, batch = item, True
    else:
        return _open_stream(item)
    for value in members:
        kind = type(value)
        if kind in _PLAIN:
            pass
        elif kind in _SEQUENCES or kind is dict or isinstance(value, tuple | list | dict):
            if batch:
                for sub in value.values() if isinstance(value, dict) else value:
                    if type(sub) not in _PLAIN and _open_stream(sub) is not None:
                        return sub
        elif _open_stream(value) is not None:
            return value
        batch = False  # only the first element of a batch is looked into
    return None


# -- streams in checkpoints ----------------------------------------------------------------------------


class MemoryMember(io.BytesIO):
    """An archive member read whole into memory, as a stream (``load_from_tar``'s members).

    Keeps its ``content`` after it is read and closed, so a checkpoint that
    still refers to it (a position a DataLoader worker kept) can hold its bytes.
    Not a plain ``io.BytesIO``: a DataLoader worker refuses to send it to the
    main process unread, as it refuses any open stream.
    """

    def __init__(self, content: bytes) -> None:
        super().__init__(content)
        self.content = content


#: The key of the plain record that stands for an in-memory stream in a checkpoint.
STREAM_RECORD = "__pipekit_stream__"


def _path(path: tuple[Any, ...], root: str) -> str:
    return root + "".join(f"[{key!r}]" for key in path)


def streams_as_bytes(value: Any, root: str = "state") -> tuple[Any, tuple[str, Any] | None]:
    """``value`` with every in-memory stream in it replaced by a plain record of its bytes.

    A checkpoint must be plain data (it loads with ``torch.load(weights_only=True)``),
    and a stream buffered in a pipe (a shuffle buffer of archive members, which
    ``load_from_tar`` reads whole into memory) is not: it becomes
    ``{STREAM_RECORD: name, "bytes": content, "wrapped": ..., "member": ...}``,
    which :func:`streams_from_bytes` turns back into the same stream, to be
    read from its start (a buffered stream has not been read yet).  The bytes
    are already in memory: the record holds a reference to them until it is
    pickled, no more.  A :class:`MemoryMember` keeps its content after it was
    read and closed downstream (a DataLoader worker's kept position refers to
    items its pipeline has consumed since); a plain ``io.BytesIO`` must still
    be open.

    Looks into dicts, lists and tuples (and their subclasses, rebuilt as their
    base type when they cannot be rebuilt as their own); containers holding no
    stream are returned as they are, not copied.

    Returns:
        the converted value, and ``(key path, stream)`` of the first stream that
        is not in memory (an open file, a lazy archive member): it is left as it
        is, and the caller refuses the checkpoint.
    """
    found: list[tuple[str, Any]] = []
    out = _as_bytes(value, (), root, found)
    return out, (found[0] if found else None)


def _as_bytes(value: Any, path: tuple[Any, ...], root: str, found: list[tuple[str, Any]]) -> Any:
    kind = type(value)
    if kind in _PLAIN:
        return value
    if isinstance(value, dict):
        items = {k: _as_bytes(v, (*path, k), root, found) for k, v in value.items()}
        if all(items[k] is v for k, v in value.items()):
            return value
        return _rebuilt(kind, items, dict)
    if isinstance(value, list | tuple):
        items_list = [_as_bytes(v, (*path, i), root, found) for i, v in enumerate(value)]
        if all(a is b for a, b in zip(items_list, value, strict=True)):
            return value
        return _rebuilt(kind, items_list, tuple if isinstance(value, tuple) else list)
    if not isinstance(value, _STREAM_TYPES):
        return value
    inner = value.file_obj if isinstance(value, StreamWrapper) else value
    data = inner.content if isinstance(inner, MemoryMember) else None
    if data is None and type(inner) is io.BytesIO and not inner.closed:
        data = inner.getvalue()
    if data is not None:
        name = getattr(value, "name", None)
        return {
            STREAM_RECORD: name if isinstance(name, str) else None,
            "bytes": data,
            "wrapped": isinstance(value, StreamWrapper),
            "member": isinstance(inner, MemoryMember),
        }
    if not found:
        found.append((_path(path, root), value))
    return value


def _rebuilt(kind: type, items: Any, base: type) -> Any:
    if kind is base:
        return items
    try:
        return kind(items)
    except Exception:
        return base(items)


def streams_from_bytes(value: Any) -> Any:
    """``value`` with every record of :func:`streams_as_bytes` turned back into its stream.

    A record of an archive member becomes the in-memory member stream
    ``load_from_tar`` yields (which a DataLoader worker still refuses to send
    to the main process unread), at its start.
    """
    kind = type(value)
    if kind in _PLAIN:
        return value
    if isinstance(value, dict):
        if STREAM_RECORD in value and isinstance(value.get("bytes"), bytes):
            return _stream_of(value)
        items = {k: streams_from_bytes(v) for k, v in value.items()}
        return value if all(items[k] is v for k, v in value.items()) else _rebuilt(kind, items, dict)
    if isinstance(value, list | tuple):
        items_list = [streams_from_bytes(v) for v in value]
        if all(a is b for a, b in zip(items_list, value, strict=True)):
            return value
        return _rebuilt(kind, items_list, tuple if isinstance(value, tuple) else list)
    return value


def _stream_of(record: dict[str, Any]) -> Any:
    if record.get("member"):
        from pipekit.pipes._archives import _MemberBytes  # here: the archives import this module

        inner: io.BytesIO = _MemberBytes(record["bytes"])
    else:
        inner = io.BytesIO(record["bytes"])
    name = record[STREAM_RECORD]
    if not record.get("wrapped"):
        return inner
    return StreamWrapper(inner, name=name) if name is not None else StreamWrapper(inner)


def stream_name(stream: Any) -> str:
    """What to call ``stream`` in a message: its URL or file name when it has one, and its type."""
    name = getattr(stream, "name", None)
    kind = type(raw_stream(stream)).__name__
    return f"{name!r} ({kind})" if isinstance(name, str) and name else kind


# -- the last file opened in this process -------------------------------------------------------------

_last_opened: tuple[str, str] | None = None


def note_opened(url: str, stage: str) -> None:
    """Record that ``stage`` just opened ``url`` (what a dying DataLoader worker was last reading)."""
    global _last_opened
    _last_opened = (url, stage)


def last_opened() -> tuple[str, str] | None:
    """``(url, stage)`` of the last :func:`note_opened` in this process, or ``None``."""
    return _last_opened
