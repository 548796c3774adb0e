"""Read tar and zip archives member by member, and decompress streams.

All three pipes work on ``(url, stream)`` items, as yielded by
``open_files_by_fsspec(mode="rb")``, and never extract anything to disk:
members are read straight from the archive stream when the consumer reads
them.

Member streams are :class:`~pipekit.pipes.fsspec_io.StreamWrapper` objects
whose parent is the archive stream: the archive stream is closed once the
archive has been read through *and* every member stream has been closed (or
garbage collected).

Resume (``load_from_tar``, ``load_from_zip``): the loaders record the URL of
the archive they are reading and how many entries of it they have gone
through.  A restored loader first opens that archive again, skips the entries
already handled and yields the rest, and only then pulls the next archive
from upstream.  To open the archive again it asks the nearest pipe upstream
that offers ``reopen(url)`` (:class:`~pipekit.pipes.fsspec_io.FSSpecFileOpener`,
:class:`Decompressor`), looking through ``filter``, ``shuffle`` and
``sharding_filter``, so the same storage options and credentials are used;
without one it opens the URL with ``fsspec.open(url, "rb")``.  The
checkpoint itself never holds credentials or data.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import posixpath
import re
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from enum import Enum
from typing import IO, Any

import fsspec

from pipekit.errors import ArchiveError, SkipLog, StageError, check_on_error
from pipekit.pipes.base import IterDataPipe, StreamWrapper, functional_datapipe
from pipekit.pipes.builtin import Filter, ShardingFilter, Shuffler

__all__ = ["CompressionType", "Decompressor", "TarArchiveLoader", "ZipArchiveLoader"]

# Errors that reading a damaged archive or compressed stream can raise.
_CORRUPT = (tarfile.TarError, zipfile.BadZipFile, zlib.error, lzma.LZMAError, EOFError, OSError, ValueError)

# Pipes between an opener and a loader that pass items through unchanged.
_PASS_THROUGH = (Filter, Shuffler, ShardingFilter)

_TAR_MODES = frozenset({"r", "r:*", "r:", "r:gz", "r:bz2", "r:xz", "r|*", "r|", "r|gz", "r|bz2", "r|xz"})


def _reason(exc: BaseException) -> str:
    return exc.reason if isinstance(exc, StageError) else f"{type(exc).__name__}: {exc}"


def _unsafe_name(name: str) -> str | None:
    """Why an archive member name is refused, or ``None`` if it is safe."""
    parts = name.replace("\\", "/")
    if parts.startswith("/") or re.match(r"^[A-Za-z]:", parts):
        return "has an absolute path"
    if ".." in parts.split("/"):
        return "has a '..' path component"
    if not parts.strip("/.").strip():
        return "has an empty name"
    return None


def _raw(stream: Any) -> Any:
    return stream.file_obj if isinstance(stream, StreamWrapper) else stream


def _seekable(stream: Any) -> bool:
    try:
        return bool(stream.seekable())
    except Exception:
        return False


def _check_pair(item: Any, stage: str) -> tuple[str, Any]:
    if not isinstance(item, tuple | list) or len(item) != 2 or not isinstance(item[0], str):
        raise TypeError(f"{stage}: expected (url, stream) tuples, got {type(item).__name__}: {item!r:.200}")
    url, stream = item
    if not hasattr(stream, "read") and not isinstance(_raw(stream), tarfile.TarFile | zipfile.ZipFile):
        raise TypeError(f"{stage}: the stream for {url!r} has no read() method: {type(stream).__name__}")
    if isinstance(_raw(stream), io.TextIOBase):
        raise TypeError(
            f"{stage}: the stream for {url!r} is a text stream; open archives and compressed files in "
            'binary mode: open_files_by_fsspec(mode="rb")'
        )
    return url, stream


def _find_reopen(pipe: Any) -> Callable[[str], Any] | None:
    """The ``reopen`` method of the nearest pipe upstream able to open a URL again."""
    seen = 0
    while pipe is not None and seen < 32:
        reopen = getattr(pipe, "reopen", None)
        if callable(reopen):
            return reopen
        if not isinstance(pipe, _PASS_THROUGH):
            return None
        upstream = getattr(pipe, "source_datapipe", None)
        pipe = upstream if upstream is not None else getattr(pipe, "datapipe", None)
        seen += 1
    return None


def _reopen(upstream: Any, url: str, stage: str) -> StreamWrapper:
    """Open the archive ``url`` again to resume it (see the module docstring)."""
    reopen = _find_reopen(upstream)
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
            f"cannot open it again to resume it ({_reason(exc)}); open archives with "
            "open_files_by_fsspec so the loader can re-open them with the same storage options",
        ) from exc
    return stream if isinstance(stream, StreamWrapper) else StreamWrapper(stream, name=url)


class _ArchiveLoader(IterDataPipe[tuple[str, StreamWrapper]]):
    """Shared iteration, error handling and resume logic of the archive loaders."""

    stage = ""

    def _init_common(self, datapipe: Iterable[tuple[str, Any]], length: int, on_error: str) -> None:
        if not isinstance(length, int) or isinstance(length, bool) or length < -1:
            raise ValueError(f"length must be -1 (unknown) or a non-negative int, got {length!r}")
        self.datapipe = datapipe
        self.length = length
        self.on_error = check_on_error(on_error)
        self.skip_log = SkipLog(self.stage)
        self._url: str | None = None
        self._entries = 0
        self._restore: dict[str, Any] | None = None

    def _members(self, url: str, stream: Any, skip: int) -> Iterator[tuple[str, StreamWrapper]]:
        raise NotImplementedError

    def _fail(self, exc: ArchiveError) -> None:
        if self.on_error == "raise":
            raise exc
        self.skip_log.record(exc)

    def _member_url(self, url: str, name: str) -> str:
        return url + "/" + posixpath.normpath(name.replace("\\", "/")).lstrip("/")

    def _load(self, url: str, stream: Any, skip: int) -> Iterator[tuple[str, StreamWrapper]]:
        self._url, self._entries = url, skip
        try:
            yield from self._members(url, stream, skip)
        except ArchiveError as exc:
            self._fail(exc)
        finally:
            if isinstance(stream, StreamWrapper):
                stream.autoclose()  # closes now, or when the last member stream is closed
        self._url, self._entries = None, 0

    def reset(self) -> None:
        self._url, self._entries = None, 0

    def __iter__(self) -> Iterator[tuple[str, StreamWrapper]]:
        restore, self._restore = self._restore, None
        if restore is not None and restore["url"] is not None:
            url = restore["url"]
            try:
                stream = _reopen(self.datapipe, url, self.stage)
            except ArchiveError as exc:
                self._fail(exc)
            else:
                yield from self._load(url, stream, int(restore["entries"]))
        for item in self.datapipe:
            url, stream = _check_pair(item, self.stage)
            yield from self._load(url, stream, 0)

    def state_dict(self) -> dict[str, Any]:
        return {"url": self._url, "entries": self._entries}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._restore = {"url": state["url"], "entries": int(state["entries"])}

    def __len__(self) -> int:
        if self.length == -1:
            raise TypeError(f"{type(self).__name__} instance doesn't have valid length")
        return self.length


@functional_datapipe("load_from_tar")
class TarArchiveLoader(_ArchiveLoader):
    """Yield ``(archive_url + "/" + member_name, member_stream)`` for each file in tar archives.

    Reads ``(url, stream)`` items (``open_files_by_fsspec(mode="rb")``) and
    streams the regular-file members of each archive in archive order,
    without extracting anything to disk.  Compressed archives (``.tar.gz``,
    ``.tar.bz2``, ``.tar.xz``) are recognised with the default mode.
    Seekable streams (local, memory and S3 files) are read with ``mode``
    (random access: member streams stay readable in any order); other
    streams in tarfile's stream mode (``"r|*"``), where each member must be
    read before the next one is pulled.  A stream that already wraps a
    ``tarfile.TarFile`` (``decompress(file_type="tar")``) is read as is.

    Member names that are absolute or contain a ``..`` component are refused
    with :class:`~pipekit.errors.ArchiveError`, as are corrupt or truncated
    archives; the error names the archive URL (and the member) and
    ``load_from_tar``.  Directories are not yielded; symbolic and hard links
    are not loaded and are recorded in ``self.skip_log``.

    Args:
        datapipe: a pipe yielding ``(url, binary stream)`` tuples.
        mode: the ``tarfile.open`` mode, ``"r:*"`` (default: any compression),
            ``"r:"``, ``"r:gz"``, ``"r:bz2"``, ``"r:xz"`` or a stream mode ``"r|..."``.
        length: the nominal length reported by ``len()`` (``-1``: none).
        on_error: ``"raise"`` (default), or ``"skip"``: refused members are
            skipped and a corrupt archive's remaining members are dropped, each
            recorded in ``self.skip_log``.

    Resume: records the archive URL and the number of entries read from it;
    see the module docstring for how a restored loader continues the archive.

    Example:
        >>> import io, tarfile
        >>> from pipekit.pipes import IterableWrapper
        >>> buf = io.BytesIO()
        >>> with tarfile.open(fileobj=buf, mode="w") as tar:
        ...     for name, data in [("0001.jpg", b"jpeg bytes"), ("0001.cls", b"7")]:
        ...         info = tarfile.TarInfo(name)
        ...         info.size = len(data)
        ...         tar.addfile(info, io.BytesIO(data))
        >>> _ = buf.seek(0)
        >>> for url, stream in IterableWrapper([("shard.tar", buf)]).load_from_tar():
        ...     print(url, stream.read())
        shard.tar/0001.jpg b'jpeg bytes'
        shard.tar/0001.cls b'7'
    """

    stage = "load_from_tar"

    def __init__(
        self,
        datapipe: Iterable[tuple[str, Any]],
        mode: str = "r:*",
        length: int = -1,
        *,
        on_error: str = "raise",
    ) -> None:
        if mode not in _TAR_MODES:
            raise ValueError(f"mode must be one of {sorted(_TAR_MODES)}, got {mode!r}")
        self.mode = mode
        self._init_common(datapipe, length, on_error)

    def _open_tar(self, url: str, stream: Any) -> tarfile.TarFile:
        raw = _raw(stream)
        if isinstance(raw, tarfile.TarFile):
            return raw
        mode = "r:*" if self.mode == "r" else self.mode
        if not _seekable(raw):
            mode = mode.replace(":", "|")
        try:
            return tarfile.open(fileobj=raw, mode=mode)
        except _CORRUPT as exc:
            raise ArchiveError("read archive", url, self.stage, _reason(exc)) from exc

    def _members(self, url: str, stream: Any, skip: int) -> Iterator[tuple[str, StreamWrapper]]:
        tar = self._open_tar(url, stream)
        raw = _raw(stream)
        # For an uncompressed, seekable archive, check members against its size.
        size: int | None = None
        if tar.fileobj is raw and _seekable(raw):
            pos = raw.tell()
            size = raw.seek(0, io.SEEK_END)
            raw.seek(pos)
        parent = stream if isinstance(stream, StreamWrapper) else None
        index = 0
        while True:
            try:
                info = tar.next()
            except _CORRUPT as exc:
                raise ArchiveError("read archive", url, self.stage, _reason(exc)) from exc
            if info is None:
                break
            index += 1
            if index <= skip:
                continue
            self._entries = index
            if info.isdir():
                continue
            if info.issym() or info.islnk():
                kind = "symbolic link" if info.issym() else "hard link"
                self.skip_log.record(
                    ArchiveError("load member", url, self.stage, f"member {info.name!r} is a {kind}; not loaded")
                )
                continue
            if not info.isreg():
                continue
            problem = _unsafe_name(info.name)
            if problem is not None:
                self._fail(ArchiveError("extract member", url, self.stage, f"member {info.name!r} {problem}"))
                continue
            if size is not None and not info.issparse() and info.offset_data + info.size > size:
                raise ArchiveError(
                    "read archive",
                    url,
                    self.stage,
                    f"truncated: member {info.name!r} needs bytes up to {info.offset_data + info.size}, "
                    f"the archive has {size}",
                )
            try:
                fobj = tar.extractfile(info)
            except _CORRUPT as exc:
                raise ArchiveError("read archive", url, self.stage, _reason(exc)) from exc
            if fobj is None:
                raise ArchiveError("read archive", url, self.stage, f"member {info.name!r} cannot be extracted")
            member_url = self._member_url(url, info.name)
            yield member_url, StreamWrapper(fobj, parent, name=member_url)
        if size is not None and tar.offset < size:
            # tarfile stops quietly at a truncated header; a proper end of archive is zero blocks.
            pos = raw.tell()
            raw.seek(tar.offset)
            block = raw.read(tarfile.BLOCKSIZE)
            raw.seek(pos)
            if block.strip(b"\0"):
                raise ArchiveError(
                    "read archive", url, self.stage, f"truncated or corrupt member header at byte {tar.offset}"
                )


@functional_datapipe("load_from_zip")
class ZipArchiveLoader(_ArchiveLoader):
    """Yield ``(archive_url + "/" + member_name, member_stream)`` for each file in zip archives.

    Reads ``(url, stream)`` items (``open_files_by_fsspec(mode="rb")``) and
    yields the file members of each archive in the order of its central
    directory, without extracting anything to disk; members are decompressed
    as they are read.  zip needs random access: seekable streams (local,
    memory and S3 files) are read in place, any other stream is first read
    whole into memory.

    Member names that are absolute or contain a ``..`` component are refused
    with :class:`~pipekit.errors.ArchiveError`, as are corrupt archives; the
    error names the archive URL (and the member) and ``load_from_zip``.
    Directories are not yielded.

    Args:
        datapipe: a pipe yielding ``(url, binary stream)`` tuples.
        length: the nominal length reported by ``len()`` (``-1``: none).
        on_error: ``"raise"`` (default), or ``"skip"``: refused members are
            skipped and a corrupt archive's remaining members are dropped, each
            recorded in ``self.skip_log``.

    Resume: records the archive URL and the number of entries read from it;
    see the module docstring for how a restored loader continues the archive.

    Example:
        >>> import io, zipfile
        >>> from pipekit.pipes import IterableWrapper
        >>> buf = io.BytesIO()
        >>> with zipfile.ZipFile(buf, "w") as zf:
        ...     zf.writestr("a/x.txt", b"hello")
        ...     zf.writestr("b.txt", b"world")
        >>> for url, stream in IterableWrapper([("data.zip", buf)]).load_from_zip():
        ...     print(url, stream.read())
        data.zip/a/x.txt b'hello'
        data.zip/b.txt b'world'
    """

    stage = "load_from_zip"

    def __init__(self, datapipe: Iterable[tuple[str, Any]], length: int = -1, *, on_error: str = "raise") -> None:
        self._init_common(datapipe, length, on_error)

    def _members(self, url: str, stream: Any, skip: int) -> Iterator[tuple[str, StreamWrapper]]:
        raw = _raw(stream)
        try:
            if isinstance(raw, zipfile.ZipFile):  # from decompress(file_type="zip")
                zf = raw
            else:
                if not _seekable(raw):
                    raw = io.BytesIO(raw.read())  # zipfile needs random access
                zf = zipfile.ZipFile(raw)
        except _CORRUPT as exc:
            raise ArchiveError("read archive", url, self.stage, _reason(exc)) from exc
        parent = stream if isinstance(stream, StreamWrapper) else None
        for index, info in enumerate(zf.infolist(), start=1):
            if index <= skip:
                continue
            self._entries = index
            if info.is_dir():
                continue
            problem = _unsafe_name(info.filename)
            if problem is not None:
                self._fail(ArchiveError("extract member", url, self.stage, f"member {info.filename!r} {problem}"))
                continue
            try:
                fobj = zf.open(info)
            except (*_CORRUPT, NotImplementedError, RuntimeError) as exc:
                raise ArchiveError(
                    "read archive", url, self.stage, f"member {info.filename!r}: {_reason(exc)}"
                ) from exc
            member_url = self._member_url(url, info.filename)
            yield member_url, StreamWrapper(fobj, parent, name=member_url)


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


class _NamedErrors(io.BufferedIOBase):
    """A read-only stream that reports decompression errors with the URL and stage."""

    def __init__(self, inner: IO[bytes], url: str) -> None:
        self._inner = inner
        self._url = url

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except _CORRUPT as exc:
            if isinstance(exc, ValueError) and self._inner.closed:
                raise  # reading a closed stream is a usage error, not a corrupt file
            raise ArchiveError("decompress", self._url, "decompress", _reason(exc)) from exc

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
    :class:`~pipekit.errors.ArchiveError`.  The pipe is stateless for resume.

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
        raise ArchiveError(
            "decompress",
            url,
            "decompress",
            f"unknown compression extension {ext!r}; pass file_type= (one of "
            f"{', '.join(t.value for t in CompressionType)})",
        )

    def _decompress(self, url: str, stream: Any, kind: CompressionType) -> Any:
        raw = _raw(stream)
        try:
            if kind is CompressionType.GZIP:
                return _NamedErrors(gzip.GzipFile(fileobj=raw, mode="rb"), url)
            if kind is CompressionType.BZIP2:
                return _NamedErrors(bz2.BZ2File(raw, mode="rb"), url)
            if kind is CompressionType.LZMA:
                return _NamedErrors(lzma.LZMAFile(raw, mode="rb"), url)
            if kind is CompressionType.TAR:
                return tarfile.open(fileobj=raw, mode="r:*" if _seekable(raw) else "r|*")
            if not _seekable(raw):
                raw = io.BytesIO(raw.read())  # zipfile needs random access
            return zipfile.ZipFile(raw)
        except _CORRUPT as exc:
            raise ArchiveError("decompress", url, "decompress", _reason(exc)) from exc

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
                stream = _reopen(self.source_datapipe, in_url, "decompress")
            except ArchiveError as exc:
                error = error or exc
                continue
            kind, ext = self._detect(in_url)
            out_url = self._out_url(in_url, kind, ext)
            return StreamWrapper(self._decompress(in_url, stream, kind), stream, name=out_url)
        raise error if error is not None else ArchiveError("reopen", url, "decompress", "no candidate URL")

    def __iter__(self) -> Iterator[tuple[str, StreamWrapper]]:
        for item in self.source_datapipe:
            url, stream = _check_pair(item, "decompress")
            try:
                kind, ext = self._detect(url)
                out_url = self._out_url(url, kind, ext)
                parent = stream if isinstance(stream, StreamWrapper) else None
                yield out_url, StreamWrapper(self._decompress(url, stream, kind), parent, name=out_url)
            finally:
                if isinstance(stream, StreamWrapper):
                    stream.autoclose()
