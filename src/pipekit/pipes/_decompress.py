"""Decompress ``(url, stream)`` items: torchdata's ``Decompressor`` (``decompress``, and its old
alias ``Extractor``/``extract``), ``Bz2FileLoader`` (``load_from_bz2``) and ``XzFileLoader`` (``load_from_xz``).

gzip, bz2 and xz streams are decompressed lazily as they are read; ``tar``
and ``zip`` yield an open ``tarfile.TarFile`` / ``zipfile.ZipFile`` for
``load_from_tar`` / ``load_from_zip`` (:mod:`pipekit.pipes._archives`, which
also re-exports the names of this module).  The pipes are stateless; their
:meth:`Decompressor.reopen` lets pipes downstream that resume in the middle
of a file (archive loaders, ``readlines``) open that file again,
decompressed, with the same upstream options.

Errors name the URL and the stage, and are also the built-in errors torchdata
let through: damaged data raises :class:`~pipekit.errors.CorruptStreamError`
(an ``OSError``, ``lzma.LZMAError`` and ``zlib.error``), a stream cut short
:class:`~pipekit.errors.TruncatedStreamError` (an ``EOFError``), and an
unknown extension :class:`~pipekit.errors.UnknownFormatError` (a
``RuntimeError``); all three are :class:`~pipekit.errors.ArchiveError`.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import posixpath
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from enum import Enum
from typing import IO, Any

from pipekit.errors import ArchiveError, CorruptStreamError, TruncatedStreamError, UnknownFormatError
from pipekit.pipes._stream_items import CORRUPT, check_pair, is_seekable, raw_stream, reason, reopen_stream
from pipekit.pipes.base import IterDataPipe, StreamWrapper, functional_datapipe

__all__ = ["Bz2FileLoader", "CompressionType", "Decompressor", "Extractor", "XzFileLoader"]


class CompressionType(Enum):
    """The formats :class:`Decompressor` handles (torchdata's ``CompressionType``)."""

    GZIP = "gzip"
    LZMA = "lzma"
    TAR = "tar"
    ZIP = "zip"
    BZIP2 = "bz2"


_TYPE_ALIASES = {"gz": "gzip", "xz": "lzma", "bzip2": "bz2"}

# Multi-part extensions first: a compressed tar is opened as a tar.
_EXTENSIONS: list[tuple[str, CompressionType]] = [
    (".tar.gz", CompressionType.TAR),
    (".tgz", CompressionType.TAR),
    (".tar.xz", CompressionType.TAR),
    (".txz", CompressionType.TAR),
    (".tar.bz2", CompressionType.TAR),
    (".tbz2", CompressionType.TAR),
    (".tar", CompressionType.TAR),
    (".gz", CompressionType.GZIP),
    (".xz", CompressionType.LZMA),
    (".lzma", CompressionType.LZMA),
    (".bz2", CompressionType.BZIP2),
    (".zip", CompressionType.ZIP),
]


_STRIPPABLE = (CompressionType.GZIP, CompressionType.BZIP2, CompressionType.LZMA)


def _stream_error(exc: BaseException, url: str, stage: str) -> ArchiveError:
    """The pipekit error for ``exc``, raised while decompressing ``url``: also of ``exc``'s built-in kind."""
    if isinstance(exc, ArchiveError):
        return exc
    if isinstance(exc, EOFError):
        return TruncatedStreamError("decompress", url, stage, reason(exc))
    if isinstance(exc, (OSError, lzma.LZMAError, zlib.error)):
        return CorruptStreamError("decompress", url, stage, reason(exc))
    return ArchiveError("decompress", url, stage, reason(exc))


class _NamedErrors(io.BufferedIOBase):
    """A read-only stream that reports decompression errors with the URL and stage."""

    def __init__(self, inner: IO[bytes], url: str, stage: str = "decompress") -> None:
        self._inner = inner
        self._url = url
        self._stage = stage

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except CORRUPT as exc:
            if isinstance(exc, ValueError) and self._inner.closed:
                raise  # reading a closed stream is a usage error, not a corrupt file
            raise _stream_error(exc, self._url, self._stage) from exc

    def read(self, size: int | None = -1) -> bytes:
        return self._call(self._inner.read, size)

    def read1(self, size: int = -1) -> bytes:
        return self._call(self._inner.read1, size)  # type: ignore[attr-defined]

    def readinto(self, buffer: Any) -> int:
        return self._call(self._inner.readinto, buffer)  # type: ignore[attr-defined]

    def readline(self, size: int | None = -1) -> bytes:
        return self._call(self._inner.readline, size)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._call(self._inner.seek, offset, whence)

    def tell(self) -> int:
        return self._inner.tell()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self._inner.seekable()

    def close(self) -> None:
        if not self.closed:
            self._inner.close()
        super().close()


@functional_datapipe("decompress")
class Decompressor(IterDataPipe[tuple[str, StreamWrapper]]):
    """Decompress ``(url, stream)`` items, yielding ``(url, decompressed_stream)``.

    The format is ``file_type`` or, when it is ``None``, guessed from the URL's
    extension: ``.gz`` (gzip), ``.bz2``, ``.xz``/``.lzma``, ``.zip``, and
    ``.tar``/``.tar.gz``/``.tgz``/``.tar.bz2``/``.tar.xz``.  gzip, bz2 and xz are
    decompressed lazily as the stream is read (nothing is read up front);
    errors from a damaged stream name the URL and ``decompress``.  As in
    torchdata, ``"tar"`` yields an open ``tarfile.TarFile`` and ``"zip"`` a
    ``zipfile.ZipFile`` (``load_from_tar``/``load_from_zip`` yield their
    members), and the URL is passed on unchanged unless ``strip_extension``.

    Args:
        source_datapipe: a pipe yielding ``(url, binary stream)`` tuples.
        file_type: ``None`` (by extension), a :class:`CompressionType` or one of
            ``"gzip"``/``"gz"``, ``"bz2"``, ``"lzma"``/``"xz"``, ``"tar"``, ``"zip"``.
        strip_extension: yield the URL without its compression extension
            (``a.txt.gz`` -> ``a.txt``); only for gzip, bz2 and xz.

    An unknown extension without ``file_type`` raises
    :class:`~pipekit.errors.UnknownFormatError` (an ``ArchiveError`` that is
    also the ``RuntimeError`` torchdata raised); damaged data raises
    :class:`~pipekit.errors.CorruptStreamError` or
    :class:`~pipekit.errors.TruncatedStreamError` when it is read (see the
    module docstring).  The pipe is stateless for resume.

    Example:
        >>> import gzip, io
        >>> from pipekit.pipes import IterableWrapper
        >>> item = ("notes.txt.gz", io.BytesIO(gzip.compress(b"hello")))
        >>> [(url, s.read()) for url, s in IterableWrapper([item]).decompress()]
        [('notes.txt.gz', b'hello')]
        >>> item = ("notes.txt.gz", io.BytesIO(gzip.compress(b"hello")))
        >>> [(url, s.read()) for url, s in IterableWrapper([item]).decompress(strip_extension=True)]
        [('notes.txt', b'hello')]
    """

    types = CompressionType
    stateless = True
    stage = "decompress"  # the functional name errors name

    def __init__(
        self,
        source_datapipe: IterDataPipe[tuple[str, Any]],
        file_type: str | CompressionType | None = None,
        *,
        strip_extension: bool = False,
    ) -> None:
        if isinstance(file_type, str):
            name = _TYPE_ALIASES.get(file_type.lower(), file_type.lower())
            try:
                file_type = CompressionType(name)
            except ValueError:
                allowed = sorted({t.value for t in CompressionType} | set(_TYPE_ALIASES))
                raise ValueError(f"file_type must be one of {allowed} or None, got {file_type!r}") from None
        elif file_type is not None and not isinstance(file_type, CompressionType):
            raise TypeError(f"file_type must be a str, a CompressionType or None, got {type(file_type).__name__}")
        if not isinstance(strip_extension, bool):
            raise TypeError(f"strip_extension must be a bool, got {type(strip_extension).__name__}")
        self.source_datapipe = source_datapipe
        self.file_type: CompressionType | None = file_type
        self.strip_extension = strip_extension

    def _detect(self, url: str) -> tuple[CompressionType, str]:
        """The format of ``url`` and the extension it was recognised by ('' if given)."""
        lower = url.lower()
        for ext, kind in _EXTENSIONS:
            if lower.endswith(ext) and (self.file_type is None or self.file_type is kind):
                return kind, ext
        if self.file_type is not None:
            return self.file_type, ""
        ext = os.path.splitext(posixpath.basename(url))[1]
        raise UnknownFormatError(
            "decompress",
            url,
            self.stage,
            f"unknown compression extension {ext!r}; pass file_type= (one of "
            f"{', '.join(t.value for t in CompressionType)})",
        )

    def _decompress(self, url: str, stream: Any, kind: CompressionType) -> Any:
        raw = raw_stream(stream)
        try:
            if kind is CompressionType.GZIP:
                return _NamedErrors(gzip.GzipFile(fileobj=raw, mode="rb"), url, self.stage)
            if kind is CompressionType.BZIP2:
                return _NamedErrors(bz2.BZ2File(raw, mode="rb"), url, self.stage)
            if kind is CompressionType.LZMA:
                return _NamedErrors(lzma.LZMAFile(raw, mode="rb"), url, self.stage)
            if kind is CompressionType.TAR:
                if is_seekable(raw):
                    return tarfile.open(fileobj=raw, mode="r:*")
                source, mode = tar_stream_source(raw, "r|*")
                return tarfile.open(fileobj=source, mode=mode)
            if not is_seekable(raw):
                raw = io.BytesIO(raw.read())  # zipfile needs random access
            return zipfile.ZipFile(raw)
        except CORRUPT as exc:
            if kind in _STRIPPABLE:
                raise _stream_error(exc, url, self.stage) from exc
            raise ArchiveError("decompress", url, self.stage, reason(exc)) from exc

    def _out_url(self, url: str, kind: CompressionType, ext: str) -> str:
        if self.strip_extension and ext and kind in _STRIPPABLE:
            return url[: -len(ext)]
        return url

    def reopen(self, url: str) -> StreamWrapper:
        """Open ``url`` (as this pipe yielded it) again upstream and decompress it.

        Archive loaders downstream call this to resume a partly read archive.
        With ``strip_extension`` the upstream URL is found by trying the
        stripped extensions (``.gz``, ``.bz2``, ``.xz``, ``.lzma``) in turn.
        """
        candidates = [url]
        if self.strip_extension:
            candidates = [
                url + ext
                for ext, kind in _EXTENSIONS
                if kind in _STRIPPABLE and (self.file_type is None or self.file_type is kind)
            ]
        error: ArchiveError | None = None
        for in_url in candidates:
            try:
                stream = reopen_stream(self.source_datapipe, in_url, self.stage)
            except ArchiveError as exc:
                error = error or exc
                continue
            kind, ext = self._detect(in_url)
            out_url = self._out_url(in_url, kind, ext)
            return StreamWrapper(self._decompress(in_url, stream, kind), stream, name=out_url)
        raise error if error is not None else ArchiveError("reopen", url, self.stage, "no candidate URL")

    def __iter__(self) -> Iterator[tuple[str, StreamWrapper]]:
        for item in self.source_datapipe:
            url, stream = check_pair(item, self.stage)
            try:
                kind, ext = self._detect(url)
                out_url = self._out_url(url, kind, ext)
                parent = stream if isinstance(stream, StreamWrapper) else None
                yield out_url, StreamWrapper(self._decompress(url, stream, kind), parent, name=out_url)
            finally:
                if isinstance(stream, StreamWrapper):
                    stream.autoclose()


@functional_datapipe("extract")
class Extractor(IterDataPipe):
    """torchdata's old name of :class:`Decompressor` (functional name: ``extract``): use ``decompress``.

    ``Extractor(dp, file_type)`` and ``dp.extract(file_type)`` return a
    :class:`Decompressor`, as in torchdata.

    Example:
        >>> import gzip, io
        >>> from pipekit.pipes import IterableWrapper
        >>> dp = IterableWrapper([("a.gz", io.BytesIO(gzip.compress(b"hi")))]).extract()
        >>> type(dp).__name__, [s.read() for _, s in dp]
        ('Decompressor', [b'hi'])
    """

    def __new__(  # type: ignore[misc]
        cls, source_datapipe: IterDataPipe[tuple[str, Any]], file_type: str | CompressionType | None = None
    ) -> Decompressor:
        return Decompressor(source_datapipe, file_type)


class _SingleFormatLoader(Decompressor):
    """A :class:`Decompressor` for one format that strips its suffix from the URL and takes ``length``."""

    kind: CompressionType = CompressionType.BZIP2
    suffix = ".bz2"

    def _detect(self, url: str) -> tuple[CompressionType, str]:
        return self.kind, self.suffix if url.lower().endswith(self.suffix) else ""

    def reopen(self, url: str) -> StreamWrapper:
        """Open ``url`` (as this pipe yielded it) again upstream, as ``url`` + suffix or ``url``, and decompress it."""
        error: ArchiveError | None = None
        for in_url in (url + self.suffix, url):
            if self._out_url(in_url, *self._detect(in_url)) != url:
                continue  # e.g. a.bz2 for a.bz2: it came from a.bz2.bz2
            try:
                stream = reopen_stream(self.source_datapipe, in_url, self.stage)
            except ArchiveError as exc:
                error = error or exc
                continue
            return StreamWrapper(self._decompress(in_url, stream, self.kind), stream, name=url)
        raise error if error is not None else ArchiveError("reopen", url, self.stage, "no candidate URL")

    def __init__(self, datapipe: IterDataPipe[tuple[str, Any]], length: int = -1) -> None:
        super().__init__(datapipe, self.kind, strip_extension=True)
        if isinstance(length, bool) or not isinstance(length, int):
            raise TypeError(f"{self.stage}: length must be an int (-1: unknown), got {type(length).__name__}")
        if length < -1:
            raise ValueError(f"{self.stage}: length must be >= 0, or -1 when unknown, got {length}")
        self.length = length

    @property
    def datapipe(self) -> IterDataPipe:
        """The source pipe (torchdata's attribute name for ``source_datapipe``)."""
        return self.source_datapipe

    def __len__(self) -> int:
        if self.length == -1:
            raise TypeError(f"{type(self).__name__} instance doesn't have valid length")
        return self.length


@functional_datapipe("load_from_bz2")
class Bz2FileLoader(_SingleFormatLoader):
    """Decompress bz2 ``(url, stream)`` items, yielding ``(url without .bz2, stream)`` (functional name:
    ``load_from_bz2``).

    The stream is decompressed lazily as it is read.  The ``.bz2`` suffix is
    removed from the URL (``notes.txt.bz2`` -> ``notes.txt``; a URL without it
    is kept).  torchdata removed it with ``str.rstrip(".bz2")``, which also ate
    trailing ``b``, ``z``, ``2`` and ``.`` characters of the name (``tab.bz2``
    became ``ta``): pipekit removes the suffix only.  Damaged data raises
    :class:`~pipekit.errors.CorruptStreamError` (an ``OSError``, as torchdata
    raised), a stream cut short :class:`~pipekit.errors.TruncatedStreamError`
    (an ``EOFError``), naming the URL and ``load_from_bz2``.  Stateless; its
    ``reopen(url)`` lets archive and line readers downstream resume in the
    middle of a file.

    Args:
        datapipe: yields ``(url, binary stream)`` tuples of bz2 data.
        length: the length ``len()`` reports; ``-1`` (default): no length
            (``TypeError``), as in torchdata.

    Example:
        >>> import bz2, io
        >>> from pipekit.pipes import IterableWrapper
        >>> dp = IterableWrapper([("notes.txt.bz2", io.BytesIO(bz2.compress(b"0123456789abcdef")))])
        >>> [(url, stream.read()) for url, stream in dp.load_from_bz2()]
        [('notes.txt', b'0123456789abcdef')]
    """

    kind = CompressionType.BZIP2
    stage = "load_from_bz2"


@functional_datapipe("load_from_xz")
class XzFileLoader(_SingleFormatLoader):
    """Decompress xz (lzma) ``(url, stream)`` items, yielding ``(url without .xz, stream)`` (functional name:
    ``load_from_xz``).

    The stream is decompressed lazily as it is read.  The ``.xz`` suffix is
    removed from the URL (``notes.txt.xz`` -> ``notes.txt``; a URL without it,
    ``.lzma`` included, is kept).  torchdata removed it with
    ``str.rstrip(".xz")``, which also ate trailing ``x``, ``z`` and ``.``
    characters of the name (``index.xz`` became ``inde``): pipekit removes the
    suffix only.  Damaged data raises :class:`~pipekit.errors.CorruptStreamError`
    (an ``lzma.LZMAError``, as torchdata raised), a stream cut short
    :class:`~pipekit.errors.TruncatedStreamError` (an ``EOFError``), naming
    the URL and ``load_from_xz``.  Stateless; its ``reopen(url)`` lets archive
    and line readers downstream resume in the middle of a file.

    Args:
        datapipe: yields ``(url, binary stream)`` tuples of xz data.
        length: the length ``len()`` reports; ``-1`` (default): no length
            (``TypeError``), as in torchdata.

    Example:
        >>> import io, lzma
        >>> from pipekit.pipes import IterableWrapper
        >>> dp = IterableWrapper([("notes.txt.xz", io.BytesIO(lzma.compress(b"0123456789abcdef")))])
        >>> [(url, stream.read()) for url, stream in dp.load_from_xz()]
        [('notes.txt', b'0123456789abcdef')]
    """

    kind = CompressionType.LZMA
    suffix = ".xz"
    stage = "load_from_xz"


# How a compressed stream starts, the stream-mode suffix that names it, and Python's reader for it.
_STREAM_FORMATS = (
    (b"\x1f\x8b", "gz", lambda f: gzip.GzipFile(fileobj=f, mode="rb")),
    (b"BZh", "bz2", bz2.BZ2File),
    (b"\xfd7zXZ\x00", "xz", lzma.LZMAFile),
)


class _Prepended(io.RawIOBase):
    """The bytes already read from the start of a stream, then the rest of the stream (read as it is)."""

    def __init__(self, head: bytes, raw: Any) -> None:
        self._head = head
        self._raw = raw

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        if not self._head:
            return self._raw.read(-1 if size is None else size)  # no copy on the way
        if size is None or size < 0:
            head, self._head = self._head, b""
            return head + self._raw.read()
        head, self._head = self._head[:size], self._head[size:]
        return head


def tar_stream_source(raw: Any, mode: str) -> tuple[Any, str]:
    """What ``tarfile`` reads a non-seekable archive from, and in which stream mode.

    ``tarfile``'s stream mode decompresses gzip, bzip2 and xz itself and
    checks nothing at their end (no CRC, no length): a damaged or cut
    ``.tar.gz`` read from a pipe or an HTTP stream would end quietly.  A
    compressed stream is therefore opened with Python's own reader
    (``gzip.GzipFile``, ``bz2.BZ2File``, ``lzma.LZMAFile``, which read
    sequentially and check the data when their stream ends), recognised by its
    first bytes, and ``tarfile`` reads the decompressed bytes (``"r|"``);
    :class:`~pipekit.pipes._archives.TarArchiveLoader` runs the check after the last member.  An
    explicit mode whose compression the bytes do not show is left to
    ``tarfile``, which names the mismatch.
    """
    compression = mode.split("|", 1)[1]
    if compression == "":
        return raw, mode
    head = b""
    while len(head) < 6:
        chunk = raw.read(6 - len(head))
        if not chunk:
            break
        head += chunk
    source = _Prepended(head, raw)
    for magic, name, reader in _STREAM_FORMATS:
        if head.startswith(magic) and compression in ("*", name):
            return reader(source), "r|"
    return source, ("r|" if compression == "*" else mode)
