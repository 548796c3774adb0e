"""Read tar and zip archives member by member: ``load_from_tar`` and ``load_from_zip``.

Both pipes work on ``(url, stream)`` items, as yielded by
``open_files_by_fsspec(mode="rb")``, and never extract anything to disk:
members are read straight from the archive stream when the consumer reads
them.  Decompression (``decompress``: :class:`Decompressor`,
:class:`CompressionType`) lives in :mod:`pipekit.pipes._decompress` and is
re-exported here.

Member streams are :class:`~pipekit.pipes._fsspec_io.StreamWrapper` objects
whose parent is the archive stream: the archive stream is closed once the
archive has been read through *and* every member stream has been closed (or
garbage collected).

Resume (``load_from_tar``, ``load_from_zip``, both built on :class:`ArchiveLoader`):
the loaders record the URL of the archive they are reading and how many
entries of it they have gone through.  A restored loader first opens that
archive again, skips the entries already handled and yields the rest, and
only then pulls the next archive from upstream.  To open the archive again it
asks the nearest pipe upstream that offers ``reopen(url)``
(:class:`~pipekit.pipes._fsspec_io.FSSpecFileOpener`, :class:`Decompressor`),
looking through ``filter``, ``shuffle`` and ``sharding_filter``
(:func:`pipekit.pipes.state.find_reopen`), so the same storage options and
credentials are used; without one it opens the URL with
``fsspec.open(url, "rb")``.  The checkpoint itself never holds credentials
or data.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import posixpath
import re
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

import fsspec

from pipekit import _fast
from pipekit.errors import ArchiveError, SkipLog, check_on_error
from pipekit.pipes._decompress import CompressionType, Decompressor, tar_stream_source
from pipekit.pipes._fsspec_io import RetryingFile
from pipekit.pipes._stream_items import (
    CORRUPT,
    ChunkedReader,
    MemoryMember,
    check_pair,
    is_seekable,
    note_opened,
    raw_stream,
    reason,
    reopen_stream,
)
from pipekit.pipes.base import StreamWrapper, functional_datapipe
from pipekit.pipes.state import ResumablePipe

__all__ = ["CompressionType", "Decompressor", "TarArchiveLoader", "ZipArchiveLoader"]

_TAR_MODES = frozenset({"r", "r:*", "r:", "r:gz", "r:bz2", "r:xz", "r|*", "r|", "r|gz", "r|bz2", "r|xz"})


def _remote_fileobj(raw: Any) -> Any:
    """``raw`` itself, or a :class:`ChunkedReader` over it when it is a seekable remote file.

    Remote files (fsspec's buffered files: S3, GCS, HTTP...; pipekit's
    :class:`~pipekit.pipes._fsspec_io.RetryingFile` around them) are read in
    large sequential chunks instead of one seek and read per header and
    member, so an archive costs a few large requests, in order, and no range
    is fetched twice.  Local and in-memory files are read as they are.
    """
    if not isinstance(raw, RetryingFile | fsspec.spec.AbstractBufferedFile) or not is_seekable(raw):
        return raw
    return ChunkedReader(raw)


_DRIVE = re.compile(r"[A-Za-z]:")


def _unsafe_name(name: str) -> str | None:
    """Why an archive member name is refused, or ``None`` if it is safe."""
    parts = name.replace("\\", "/")
    if parts.startswith("/") or _DRIVE.match(parts):
        return "has an absolute path"
    if ".." in parts and ".." in parts.split("/"):
        return "has a '..' path component"
    if not parts.strip("/.").strip():
        return "has an empty name"
    return None


class ArchiveLoader(ResumablePipe):
    """Base of the archive loaders (``load_from_tar``, ``load_from_zip``): iteration, errors and resume.

    A subclass sets ``stage`` (its functional name) and implements
    ``_members(url, stream, skip)``, which yields ``(member_url,
    member_stream)`` for the entries of one archive after the first ``skip``
    and keeps ``self._entries`` at the number of entries gone through
    (directories and refused members included).

    Resume: the checkpoint is ``{"url": archive being read or None,
    "entries": entries of it gone through, "stamp": what the archive was}``
    (``"size:ETag"``, ``"size:mtime"``... from the open stream, without a
    request or ``stat`` of its own; left out where the stream tells nothing,
    a decompressed or in-memory one).  A restored loader opens that archive
    again (see the module docstring), and if the reopened file's stamp is
    not the checkpoint's (the file was replaced or rewritten) raises
    :class:`~pipekit.errors.ArchiveError` naming the archive, both stamps
    and the stage, whatever ``on_error`` says: the entry count would land
    inside another file.  Otherwise it skips those entries, yields the rest,
    then goes on with the next archives from upstream.

    Args:
        datapipe: a pipe yielding ``(url, binary stream)`` tuples.
        length: the nominal length reported by ``len()`` (``-1``: none).
        on_error: ``"raise"`` or ``"skip"`` (see the loaders).
    """

    stage: ClassVar[str] = ""
    state_keys = ("url", "entries")

    def __init__(self, datapipe: Iterable[tuple[str, Any]], length: int = -1, *, on_error: str = "raise") -> None:
        super().__init__()
        if not isinstance(length, int) or isinstance(length, bool) or length < -1:
            raise ValueError(f"length must be -1 (unknown) or a non-negative int, got {length!r}")
        self.source_datapipe = datapipe
        self.length = length
        self.on_error = check_on_error(on_error)
        self.skip_log = SkipLog(self.stage)
        self._url: str | None = None
        self._entries = 0
        self._stamp: str | None = None  # _url's stamp (see _stream_stamp)
        self._resume: tuple[str, int, str | None] | None = None

    @property
    def datapipe(self) -> Iterable[tuple[str, Any]]:
        """The upstream pipe (torchdata's attribute name; same as ``source_datapipe``)."""
        return self.source_datapipe

    # -- resume --------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        if self._stamp is None:
            return {"url": self._url, "entries": self._entries}
        return {"url": self._url, "entries": self._entries, "stamp": self._stamp}

    def check_state(self, state: dict[str, Any]) -> None:
        if state["url"] is not None and not isinstance(state["url"], str):
            raise ValueError(f"not a {type(self).__name__} state (url is not a str): {state!r:.200}")
        try:
            int(state["entries"])
        except (TypeError, ValueError):
            raise ValueError(f"not a {type(self).__name__} state (entries is not a count): {state!r:.200}") from None

    def restore(self, state: dict[str, Any] | None) -> None:
        self._url, self._entries, self._stamp = None, 0, None
        if state is None or state["url"] is None:
            self._resume = None
        else:
            stamp = state.get("stamp")
            self._resume = (state["url"], int(state["entries"]), stamp if isinstance(stamp, str) else None)

    # -- iteration -----------------------------------------------------------------------------------

    def _members(self, url: str, stream: Any, skip: int) -> Iterator[tuple[str, Any]]:
        raise NotImplementedError(f"{type(self).__name__} must implement _members(url, stream, skip)")

    def _fail(self, exc: ArchiveError) -> None:
        if self.on_error == "raise":
            raise exc
        self.skip_log.record(exc)

    def _member_url(self, url: str, name: str) -> str:
        if "/" not in name and "\\" not in name and name not in ("", ".", ".."):
            return url + "/" + name  # a plain file name: normpath would return it as it is
        return url + "/" + posixpath.normpath(name.replace("\\", "/")).lstrip("/")

    def _load(self, url: str, stream: Any, skip: int, stamp: str | None = None) -> Iterator[tuple[str, Any]]:
        self._url, self._entries = url, skip
        self._stamp = stamp if stamp is not None else _stream_stamp(stream)
        note_opened(url, self.stage)
        try:
            yield from self._members(url, stream, skip)
        except ArchiveError as exc:
            self._fail(exc)
        finally:
            if isinstance(stream, StreamWrapper):
                stream.autoclose()  # closes now, or when the last member stream is closed
        self._url, self._entries, self._stamp = None, 0, None

    def __iter__(self) -> Iterator[tuple[str, StreamWrapper]]:
        yield from self._archive_members()

    def _archive_members(self) -> Iterator[tuple[str, Any]]:
        """The members of the archive to continue (after a restore), then of each archive from upstream.

        A plain method, not ``__iter__``, so a subclass's ``__iter__`` can go
        through the members without starting a second iterator of this pipe.
        """
        resume, self._resume = self._resume, None  # the archive to continue, set by restore()
        if resume is not None:
            url, entries, stamp = resume
            try:
                stream = reopen_stream(self.source_datapipe, url, self.stage)
            except ArchiveError as exc:
                self._fail(exc)
            else:
                now = _stream_stamp(stream) if stamp is not None else None
                if now is not None and now != stamp:
                    stream.close()
                    raise ArchiveError(
                        "resume archive", url, self.stage,
                        f"the file changed since the checkpoint (size:version {stamp} then, {now} now): its "
                        f"{entries} entries gone through would be counted in another file; resume from a "
                        "checkpoint taken on this file, or start the epoch over",
                    )
                yield from self._load(url, stream, entries, now)
        for item in self.source_datapipe:
            url, stream = check_pair(item, self.stage)
            yield from self._load(url, stream, 0)

    def __len__(self) -> int:
        if self.length == -1:
            raise TypeError(f"{type(self).__name__} instance doesn't have valid length")
        return self.length


def _stream_stamp(stream: Any) -> str | None:
    """``"size:version"`` of the file under ``stream``, from what its open already knows, or ``None``.

    fsspec's remote files (s3fs, HTTP, GCS...) carry the ``info()`` their open fetched: the size and the
    ETag (else the modification time); a local file gets one ``fstat`` of its descriptor.  Wrappers
    (:class:`StreamWrapper`, buffered and text readers, :class:`RetryingFile`) are looked through.
    """
    obj = stream
    for _ in range(8):
        if isinstance(obj, StreamWrapper):
            obj = obj.file_obj
            continue
        details = getattr(obj, "details", None)
        if isinstance(details, dict):
            version = next((details[k] for k in ("ETag", "etag", "generation", "LastModified", "mtime", "updated")
                            if details.get(k) not in (None, "")), None)
            size = details.get("size")
            return None if version is None and size is None else f"{size}:{version}"
        try:
            st = os.fstat(obj.fileno())
        except (OSError, ValueError, AttributeError, TypeError):  # io.UnsupportedOperation is both
            pass
        else:
            if stat.S_ISREG(st.st_mode):
                return f"{st.st_size}:{st.st_mtime_ns}"
        inner = getattr(obj, "raw", None) or getattr(obj, "buffer", None)
        if inner is None or inner is obj:
            return None
        obj = inner
    return None


@functional_datapipe("load_from_tar")
class TarArchiveLoader(ArchiveLoader):
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
    Remote archives (fsspec files: S3, GCS, HTTP...) are read through a
    :class:`~pipekit.pipes._stream_items.ChunkedReader`: 8 MiB sequential
    reads, the last two kept in memory, so a shard costs a few large requests
    in order (not a seek and read per header and member, nor a range fetched
    again when a reader looks back at the previous sample); a resumed archive
    reads on from the member it skips to.  In a seekable, uncompressed archive
    the plain headers (regular files up to 16 MiB and directories) are read
    without ``tarfile``'s per-header work and those members are read whole
    as they are reached; from the first header that is anything else (a long
    name, a link, the end marker) ``tarfile`` reads the rest, so the members,
    their URLs and every error are the same either way.

    Member names that are absolute or contain a ``..`` component are refused
    with :class:`~pipekit.errors.ArchiveError`, as are corrupt or truncated
    archives; the error names the archive URL (and the member) and
    ``load_from_tar``.  Directories are not yielded; symbolic and hard links
    are not loaded and are recorded in ``self.skip_log``.

    Truncation: an archive must end with its end-of-archive marker (two zero
    blocks).  Where ``tarfile`` itself stops quietly (an archive cut at a
    member boundary or inside the marker, a partial or corrupt header), this
    pipe raises ``ArchiveError`` ("truncated: ..."), saying how many members
    of the archive were yielded before; with ``on_error="skip"`` the archive
    is counted once in ``self.skip_log`` instead.  A member cut short is
    refused before it is yielded when the archive is seekable and
    uncompressed; otherwise (a stream, a compressed archive) reading it
    raises ``ArchiveError`` naming the member (its URL starts with the
    archive's), and with ``on_error="skip"`` each such member is read whole
    before it is yielded (one member in memory at a time), so one cut short
    is not yielded and the archive is counted once in ``self.skip_log``.
    (torchdata and ``tarfile`` end such archives silently.)  A compressed
    archive (``.tar.gz``, ``.tar.bz2``, ``.tar.xz``), seekable or streamed, is
    read to the end of its compressed stream after the marker, so the stream's
    own check runs (gzip's CRC-32 and length, bzip2's CRCs, xz's check): an
    archive cut after its last member, or whose data was damaged in a way
    decompression does not notice, raises ``ArchiveError`` once its members
    have been yielded ("truncated: ..." or "corrupt: ..."), or is counted
    under skip.  (A streamed archive is decompressed by Python's ``gzip``,
    ``bz2`` or ``lzma`` reader, recognised by its first bytes, because
    ``tarfile``'s stream mode checks nothing.)

    Args:
        datapipe: a pipe yielding ``(url, binary stream)`` tuples.
        mode: the ``tarfile.open`` mode, ``"r:*"`` (default: any compression),
            ``"r:"``, ``"r:gz"``, ``"r:bz2"``, ``"r:xz"`` or a stream mode ``"r|..."``.
        length: the nominal length reported by ``len()`` (``-1``: none).
        on_error: ``"raise"`` (default), or ``"skip"``: refused members are
            skipped and a corrupt archive's remaining members are dropped, each
            recorded in ``self.skip_log``.

    Resume: records the archive URL and the number of entries read from it; a
    restored loader opens the archive again with the nearest upstream
    ``reopen(url)`` (or fsspec), skips those entries and continues it before
    pulling the next archive (see the module docstring).

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
    #: Yield each member as a stream (``False``: its ``bytes``, read whole; see ``TarShards``' sample reader).
    wrap_members: ClassVar[bool] = True

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
        super().__init__(datapipe, length, on_error=on_error)

    def _open_tar(self, url: str, raw: Any, mode: str | None = None) -> tarfile.TarFile:
        if isinstance(raw, tarfile.TarFile):
            return raw
        if mode is None:
            mode = "r:*" if self.mode == "r" else self.mode
        try:
            if not is_seekable(raw):
                raw, mode = tar_stream_source(raw, mode.replace(":", "|"))
            return tarfile.open(fileobj=raw, mode=mode, tarinfo=_EndCheckedTarInfo)
        except CORRUPT as exc:
            raise ArchiveError("read archive", url, self.stage, reason(exc)) from exc

    def _members(self, url: str, stream: Any, skip: int) -> Iterator[tuple[str, Any]]:
        raw = raw_stream(stream)
        if not isinstance(raw, tarfile.TarFile):
            raw = _remote_fileobj(raw)
        parent = stream if isinstance(stream, StreamWrapper) else None
        index = yielded = 0
        mode = None
        plain_ok = (  # fast path "tar_headers" (pipekit._fast)
            _fast.enabled("tar_headers") and self.mode in ("r", "r:*", "r:") and not isinstance(raw, tarfile.TarFile)
        )
        if plain_ok and is_seekable(raw):
            start = raw.tell()
            plain = _PlainMembers(url, raw, self)
            yield from plain.members(skip, parent)
            index, yielded = plain.index, plain.yielded
            if raw.tell() != start:
                mode = "r:"  # headers were read: an uncompressed archive, tarfile goes on from here
        yield from self._tar_members(url, raw, skip, parent, index, yielded, mode)

    def _tar_members(
        self, url: str, raw: Any, skip: int, parent: StreamWrapper | None, index: int, yielded: int, mode: str | None
    ) -> Iterator[tuple[str, Any]]:
        """The members from ``raw``'s position on, through ``tarfile`` (``index``/``yielded``: counts so far)."""
        tar = self._open_tar(url, raw, mode)
        tar.tarinfo = _EndCheckedTarInfo  # already so, unless decompress(file_type="tar") opened it
        tar.fileobject = _MemberFile  # public TarFile attributes: the classes extractfile() and next() use
        # For an uncompressed, seekable archive, check members against its size.
        size: int | None = None
        if tar.fileobj is raw and is_seekable(raw):
            pos = raw.tell()
            size = raw.seek(0, io.SEEK_END)
            raw.seek(pos)
        while True:
            try:
                info = tar.next()
            except CORRUPT as exc:
                raise ArchiveError("read archive", url, self.stage, _with_count(reason(exc), yielded)) from exc
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
                    _with_count(
                        f"truncated: member {info.name!r} is cut short (it needs bytes up to "
                        f"{info.offset_data + info.size}, the archive has {size})",
                        yielded,
                    ),
                )
            try:
                fobj = tar.extractfile(info)
            except CORRUPT as exc:
                raise ArchiveError("read archive", url, self.stage, _with_count(reason(exc), yielded)) from exc
            if fobj is None:
                raise ArchiveError("read archive", url, self.stage, f"member {info.name!r} cannot be extracted")
            member_url = self._member_url(url, info.name)
            fobj.where = (member_url, self.stage)
            if size is None and self.on_error == "skip":
                # a member of a compressed or streamed archive cannot be checked against the archive's
                # size: under skip it is read whole before it is yielded, so one cut short is counted
                # (once, for the archive) instead of failing in the consumer's hands
                try:
                    fobj = io.BytesIO(fobj.read())
                except ArchiveError as exc:
                    raise ArchiveError(
                        "read archive",
                        url,
                        self.stage,
                        _with_count(f"truncated: member {info.name!r} is cut short ({exc.reason})", yielded),
                    ) from exc
            note_opened(member_url, self.stage)
            yielded += 1
            if self.wrap_members:
                yield member_url, StreamWrapper(fobj, parent, name=member_url)
            else:
                data = fobj.read()  # a member cut short raises ArchiveError naming it (_MemberFile)
                fobj.close()
                yield member_url, data
        problem = _end_problem(tar)
        if problem is not None:
            raise ArchiveError("read archive", url, self.stage, _with_count(problem, yielded))


#: Members up to this size are read whole by :class:`_PlainMembers`; a larger one goes to ``tarfile`` (lazy streams).
PLAIN_MEMBER_MAX_BYTES = 16 * 2**20

#: Bytes :class:`_PlainMembers` reads from the archive at a time (more when a member is larger).
_READ_AHEAD = 64 * 2**10

_BLOCK = tarfile.BLOCKSIZE
_ENCODING = tarfile.ENCODING


def _nts(field: bytes) -> str:
    """A NUL-terminated header string, decoded as ``tarfile`` decodes names (its ``nts``)."""
    end = field.find(b"\0")
    return (field if end == -1 else field[:end]).decode(_ENCODING, "surrogateescape")


def _header_sum(block: bytes) -> int:
    """The checksum of a 512-byte tar header: the sum of its bytes with the checksum field as 8 spaces.

    The sum of a header's bytes is what ``tarfile`` computes with two ``sum``
    calls over slices (~5 µs in Python).  When every byte is ASCII (below 128:
    ASCII names, octal numbers, NUL padding, as in nearly every header) the
    sum is at most 512 * 127 = 65,024, below Adler-32's modulus 65,521, so the
    low half of ``zlib.adler32`` (1 + the sum of the bytes, modulo 65,521) is
    exactly 1 + the sum: the same number in ~0.5 µs.  Other headers are summed
    byte by byte.
    """
    if block.isascii():
        total = (zlib.adler32(block) & 0xFFFF) - 1
    else:
        total = sum(block)
    return total - sum(block[148:156]) + 256


def _octal(field: bytes) -> int | None:
    """An octal header number, or ``None`` where ``tarfile`` would need its own rules (base-256, invalid)."""
    if field[0] in (0o200, 0o377):
        return None
    end = field.find(b"\0")
    try:
        return int((field if end == -1 else field[:end]).strip() or b"0", 8)
    except ValueError:
        return None


class _MemberBytes(MemoryMember):
    """An archive member :class:`_PlainMembers` read whole: in memory, but still an archive member stream.

    Not a plain ``io.BytesIO``, so the DataLoader's open-stream check treats it
    like ``tarfile``'s member streams: a pipeline that sends member streams
    from its workers gets the same error whichever path read the archive.  A
    checkpoint holding it (a shuffle buffer of members) holds its bytes.
    """


class _PlainMembers:
    """The leading plain members of a seekable, uncompressed tar archive, without ``tarfile``'s per-header work.

    ``tarfile`` spends ~50 µs of Python on each header (every field parsed into
    a ``TarInfo``, two checksums, pax handling), which is most of what reading a
    shard of small images costs besides decoding them (issue 12).  This reads
    the headers ``tarfile`` reads the same way for the common case only:
    regular files (type ``0`` or NUL, up to :data:`PLAIN_MEMBER_MAX_BYTES`)
    and directories in ustar, GNU or v7 headers with a valid checksum, names
    decoded and joined with the ustar prefix as ``tarfile`` does.  At the
    first header that is anything else (the end-of-archive marker, a pax or
    GNU long-name header, a link, a bad checksum, a truncated block, a
    compressed archive's first bytes) it stops where that header starts, and
    :class:`TarArchiveLoader` goes on with ``tarfile`` from there, so ends,
    truncations, corrupt headers and every other member type are found and
    reported exactly as before.  Members are read whole as they are reached
    (``tarfile``'s member streams read lazily from the archive).
    """

    __slots__ = ("index", "loader", "raw", "url", "yielded")

    def __init__(self, url: str, raw: Any, loader: TarArchiveLoader) -> None:
        self.url, self.raw, self.loader = url, raw, loader
        self.index = self.yielded = 0

    def _header(self, block: bytes) -> tuple[str, int, bool] | None:
        """``(name, size, is_dir)`` of a plain header, or ``None`` where ``tarfile`` must read it."""
        if len(block) != _BLOCK:
            return None
        kind = block[156]
        if kind not in (0x30, 0, 0x35):  # "0", NUL (regular), "5" (directory)
            return None
        checksum = _octal(block[148:156])
        if checksum is None or checksum != _header_sum(block):
            return None  # (tarfile also accepts a signed sum: rare; it reads those)
        size = _octal(block[124:136])
        if size is None or size > PLAIN_MEMBER_MAX_BYTES:
            return None
        name = _nts(block[:100])
        prefix = _nts(block[345:500])
        if prefix:
            name = prefix + "/" + name
        is_dir = kind == 0x35 or (kind == 0 and name.endswith("/"))
        if is_dir:
            name = name.rstrip("/")
        return name, size, is_dir

    def members(self, skip: int, parent: StreamWrapper | None) -> Iterator[tuple[str, Any]]:
        """``(member_url, stream)`` for the leading plain members after the first ``skip`` entries.

        A loader whose ``wrap_members`` is ``False`` gets each member's ``bytes``
        instead of a stream over them (:class:`~pipekit.pipes.TarSampleLoader`).
        The archive is read in sequential pieces of :data:`_READ_AHEAD`
        bytes (at least a member's size), from which headers and members are
        cut, so a shard of small files costs one read call per piece rather
        than two per member.  On return ``raw`` is positioned at the first
        header not read here.
        """
        raw, url, loader = self.raw, self.url, self.loader
        stage, wrap = loader.stage, loader.wrap_members
        try:
            pos = raw.tell()
            total = raw.seek(0, io.SEEK_END)
            raw.seek(pos)
        except CORRUPT as exc:
            raise ArchiveError("read archive", url, stage, reason(exc)) from exc
        buf, buf_at = b"", pos  # bytes of the archive from offset buf_at on; raw is at buf_at + len(buf)

        def fill(at: int, need: int, ahead: bool = True) -> None:
            """Make ``buf`` hold the archive from ``at`` on, at least ``need`` bytes of it where the file has them.

            ``ahead=False`` reads no more than needed (headers of members a resumed archive skips).
            """
            nonlocal buf, buf_at
            have = buf_at + len(buf) - at
            if at >= buf_at and have >= need:
                return
            try:
                if 0 <= at - buf_at <= len(buf):
                    more = raw.read(max(_READ_AHEAD, need - have) if ahead else need - have)
                    buf = buf[at - buf_at :] + more
                else:  # past the buffered bytes (skipped members): start again there
                    raw.seek(at)
                    buf = raw.read(max(_READ_AHEAD, need) if ahead else need)
            except CORRUPT as exc:
                raise ArchiveError("read archive", url, stage, _with_count(reason(exc), self.yielded)) from exc
            buf_at = at

        while True:
            if pos > total:  # the last member's padding is cut: what tarfile's next() says then
                problem = reason(tarfile.ReadError("unexpected end of data"))
                raise ArchiveError("read archive", url, stage, _with_count(problem, self.yielded))
            fill(pos, _BLOCK, ahead=self.index >= skip)
            off = pos - buf_at
            header = self._header(buf[off : off + _BLOCK])
            if header is None:  # tarfile reads this header and everything after it
                try:
                    raw.seek(pos)
                except CORRUPT as exc:
                    raise ArchiveError("read archive", url, stage, reason(exc)) from exc
                return
            name, size, is_dir = header
            data_at = pos + _BLOCK
            next_at = data_at + -(-size // _BLOCK) * _BLOCK
            self.index += 1
            loader._entries = self.index
            if self.index <= skip or is_dir:
                pos = next_at
                continue
            problem = _unsafe_name(name)
            if problem is not None:
                loader._fail(ArchiveError("extract member", url, stage, f"member {name!r} {problem}"))
                pos = next_at
                continue
            if data_at + size > total:
                raise ArchiveError(
                    "read archive",
                    url,
                    stage,
                    _with_count(
                        f"truncated: member {name!r} is cut short (it needs bytes up to "
                        f"{data_at + size}, the archive has {total})",
                        self.yielded,
                    ),
                )
            fill(data_at, size)
            off = data_at - buf_at
            data = buf[off : off + size]
            if len(data) != size:  # the file shrank under us
                raise ArchiveError(
                    "read archive",
                    url,
                    stage,
                    _with_count(
                        f"truncated: member {name!r} is cut short ({len(data)} of {size} bytes)", self.yielded
                    ),
                )
            pos = next_at
            member_url = loader._member_url(url, name)
            note_opened(member_url, stage)
            self.yielded += 1
            if wrap:
                yield member_url, StreamWrapper(_MemberBytes(data), parent, name=member_url)
            else:
                yield member_url, data


class _EndCheckedTarInfo(tarfile.TarInfo):
    """A ``TarInfo`` whose reader remembers why ``tarfile`` found no next member.

    ``TarFile.next()`` returns ``None`` (the archive's end) not only at the
    end-of-archive marker but also when the data stops at a member boundary,
    inside a header, or at a corrupt header; it drops the reason.  This class,
    passed as ``tarinfo=`` (a documented ``TarFile`` argument), keeps the error
    of the last header read in ``tar._pipekit_stop`` so :func:`_end_problem`
    can tell a proper end from a truncated archive.
    """

    @classmethod
    def fromtarfile(cls, tar: tarfile.TarFile) -> tarfile.TarInfo:
        try:
            return super().fromtarfile(tar)
        except tarfile.HeaderError as exc:
            tar._pipekit_stop = exc  # type: ignore[attr-defined]
            raise


class _MemberFile(tarfile.ExFileObject):
    """A tar member stream whose read errors name the member and the stage.

    Members of a stream-mode archive are read straight from the archive
    stream, so a member cut short shows only when it is read: ``tarfile``
    raises a bare ``ReadError("unexpected end of data")`` (and ``gzip`` an
    ``EOFError``).  Here they become :class:`~pipekit.errors.ArchiveError`.
    """

    where: tuple[str, str] = ("<tar member>", "load_from_tar")


_MEMBER_READ_ERRORS = (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError)


def _checked_read(name: str) -> Any:
    method = getattr(tarfile.ExFileObject, name)

    def call(self: _MemberFile, *args: Any) -> Any:
        try:
            return method(self, *args)
        except _MEMBER_READ_ERRORS as exc:
            url, stage = self.where
            problem = f"the archive is truncated or corrupt ({reason(exc)})"
            raise ArchiveError("read member", url, stage, problem) from exc

    call.__name__ = call.__qualname__ = name
    return call


for _name in ("read", "read1", "readinto", "readinto1", "readline", "readlines", "peek", "__next__"):
    setattr(_MemberFile, _name, _checked_read(_name))


def _with_count(problem: str, yielded: int) -> str:
    return f"{problem} ({yielded} member{'' if yielded == 1 else 's'} yielded before)"


def _end_problem(tar: tarfile.TarFile) -> str | None:
    """Why the end ``tar.next()`` reached is not a proper end of archive, or ``None`` if it is.

    A tar archive ends with two zero blocks (POSIX; every writer adds them,
    usually padded further to a 10 KiB record).  Anything else where the next
    header should be means the archive was cut or damaged, and the members
    after that point are lost: no bytes at all (cut at a member boundary), a
    partial header, a corrupt header, or a single zero block.
    """
    stop = getattr(tar, "_pipekit_stop", None)
    at = tar.offset
    if stop is None:
        return None  # the TarFile's first header was read before we could watch it: nothing to tell
    if isinstance(stop, tarfile.EmptyHeaderError):
        return (
            f"truncated: the archive ends at byte {at}, where the next member header or the "
            "end-of-archive marker (two zero blocks) should be"
        )
    if isinstance(stop, tarfile.TruncatedHeaderError):
        return f"truncated: the archive ends inside the member header at byte {at}"
    if not isinstance(stop, tarfile.EOFHeaderError):
        return f"corrupt member header at byte {at} ({stop}); the members after it cannot be read"
    try:  # the first zero block was read; the second must follow it
        tar.fileobj.seek(at + tarfile.BLOCKSIZE)
        second = tar.fileobj.read(tarfile.BLOCKSIZE)
    except CORRUPT as exc:
        return f"truncated: cannot read the end-of-archive marker at byte {at} ({reason(exc)})"
    if len(second) < tarfile.BLOCKSIZE:
        return (
            f"truncated: the archive ends inside its end-of-archive marker at byte {at} (one zero block instead of two)"
        )
    if second.count(0) != tarfile.BLOCKSIZE:
        return (
            f"corrupt: a single zero block at byte {at} is followed by data; the end-of-archive marker is "
            "two zero blocks, so the members after it cannot be read"
        )
    return _compressed_end_problem(tar.fileobj)


# The compressed files tarfile reads a seekable .tar.gz, .tar.bz2 or .tar.xz through (and pipekit a
# streamed one: :func:`pipekit.pipes._decompress.tar_stream_source`).
_COMPRESSED_FILES = (gzip.GzipFile, bz2.BZ2File, lzma.LZMAFile)

# tarfile's stream class (``tarfile.open(mode="r|...")``); the object it reads from is its ``fileobj``.
_TAR_STREAM: type | tuple[type, ...] = getattr(tarfile, "_Stream", ())


def _compressed_end_problem(fileobj: Any) -> str | None:
    """Why a compressed archive's stream does not end properly after its end-of-archive marker, or ``None``.

    gzip, bzip2 and xz check what they decompressed (gzip's CRC-32 and length,
    bzip2's block and stream CRCs, xz's check) only when the stream ends, and
    ``tarfile`` stops reading at the end-of-archive marker, before that: an
    archive cut after its last member, or one whose data was damaged in a way
    the decompressor does not notice (a byte of a stored deflate block), would
    read without an error.  Reading the rest (the zero padding of the last tar
    record and the trailer, a few dozen compressed bytes) runs the check.
    A streamed archive (a non-seekable source) is read through the same
    readers (:func:`~pipekit.pipes._decompress.tar_stream_source`), inside ``tarfile``'s stream class.
    """
    if isinstance(fileobj, _TAR_STREAM):
        fileobj = getattr(fileobj, "fileobj", None)
    if not isinstance(fileobj, _COMPRESSED_FILES):
        return None
    try:
        while fileobj.read(_READ_AHEAD):
            pass
    except EOFError as exc:
        return f"truncated: the compressed stream ends before its end-of-stream marker and check ({exc})"
    except CORRUPT as exc:
        if isinstance(exc, gzip.BadGzipFile) and str(exc).startswith("Not a gzipped file"):
            # every member's check passed; what follows the last one is not gzip (``gzip -d`` warns of
            # "trailing garbage"): refused all the same, the file is not what it says it is
            return f"corrupt: the bytes after the gzip stream are not gzip data ({reason(exc)})"
        return (
            f"corrupt: the compressed stream fails its own check at its end ({reason(exc)}); "
            "the members read from it may hold wrong bytes"
        )
    return None


@functional_datapipe("load_from_zip")
class ZipArchiveLoader(ArchiveLoader):
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

    Resume: records the archive URL and the number of entries read from it; a
    restored loader opens the archive again with the nearest upstream
    ``reopen(url)`` (or fsspec), skips those entries and continues it before
    pulling the next archive (see the module docstring).

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
        super().__init__(datapipe, length, on_error=on_error)

    def _members(self, url: str, stream: Any, skip: int) -> Iterator[tuple[str, StreamWrapper]]:
        raw = raw_stream(stream)
        try:
            if isinstance(raw, zipfile.ZipFile):  # from decompress(file_type="zip")
                zf = raw
            else:
                if not is_seekable(raw):
                    raw = io.BytesIO(raw.read())  # zipfile needs random access
                zf = zipfile.ZipFile(raw)
        except CORRUPT as exc:
            raise ArchiveError("read archive", url, self.stage, reason(exc)) from exc
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
            except (*CORRUPT, NotImplementedError, RuntimeError) as exc:
                raise ArchiveError("read archive", url, self.stage, f"member {info.filename!r}: {reason(exc)}") from exc
            member_url = self._member_url(url, info.filename)
            note_opened(member_url, self.stage)
            yield member_url, StreamWrapper(fobj, parent, name=member_url)
