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

Resume (``load_from_tar``, ``load_from_zip``, both built on :class:`ArchiveLoader`, which
:mod:`pipekit.pipes._archive_base` holds with the rest the loaders share: the walk over the archives from
upstream, the errors, the member limit):
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

import io
import tarfile
import zipfile
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

import fsspec

from pipekit import _fast
from pipekit.errors import ArchiveError
from pipekit.pipes._archive_base import ArchiveLoader
from pipekit.pipes._decompress import CompressionType, Decompressor, tar_stream_source
from pipekit.pipes._fsspec_io import RetryingFile
from pipekit.pipes._stamps import file_stamp
from pipekit.pipes._stream_items import (
    CORRUPT,
    ChunkedReader,
    is_seekable,
    note_opened,
    raw_stream,
    reason,
)
from pipekit.pipes._tar_headers import (  # noqa: F401  (importable here, as before the split)
    _BLOCK,
    PLAIN_MEMBER_MAX_BYTES,
    _compressed_end_problem,
    _end_problem,
    _EndCheckedTarInfo,
    _header_sum,
    _MemberBytes,
    _MemberFile,
    _octal,
    _PlainMembers,
    _unsafe_name,
    _with_count,
)
from pipekit.pipes._zip_members import ZipMember
from pipekit.pipes.base import StreamWrapper, functional_datapipe

__all__ = ["CompressionType", "Decompressor", "TarArchiveLoader", "ZipArchiveLoader"]

#: The default per-member byte limit of the archive loaders (``max_member_bytes=None``): 1 GiB.  A member
#: declaring more (its tar header, its zip directory entry) is refused before a byte of it is read: a 3 MB
#: ``.tar.gz`` can hold a 3 GiB member of zeros, which a reader of whole members (``TarShards``, a ``map``
#: calling ``.read()``, ``on_error="skip"``'s read-ahead) would try to hold in memory.  Read when an
#: archive is opened, so setting ``pipekit.pipes._archives.MAX_MEMBER_BYTES`` changes the default.
MAX_MEMBER_BYTES = 1 << 30

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


#: ``"size:version"`` of the file under a stream, or ``None`` (:func:`pipekit.pipes._stamps.file_stamp`).
_stream_stamp = file_stamp


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
        max_member_bytes: the most bytes a member may declare in its header
            (default :data:`MAX_MEMBER_BYTES`, 1 GiB): a larger one is refused
            before a byte of it is read, with :class:`~pipekit.errors.ArchiveError`
            naming the archive, the member and the limit (under ``on_error="skip"``
            it is counted in ``self.skip_log`` and the archive goes on).

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
        max_member_bytes: int | None = None,
    ) -> None:
        if mode not in _TAR_MODES:
            raise ValueError(f"mode must be one of {sorted(_TAR_MODES)}, got {mode!r}")
        self.mode = mode
        super().__init__(datapipe, length, on_error=on_error, max_member_bytes=max_member_bytes)

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
            if self._too_large(url, info.name, info.size):
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
    Directories are not yielded.  A member whose data is damaged (deflate
    data that does not decompress, a CRC-32 that does not match) raises
    ``ArchiveError`` naming the member's URL when it is read; with
    ``on_error="skip"`` each member is read whole before it is yielded, so a
    damaged one is counted in ``self.skip_log`` and the others still come.

    Args:
        datapipe: a pipe yielding ``(url, binary stream)`` tuples.
        length: the nominal length reported by ``len()`` (``-1``: none).
        on_error: ``"raise"`` (default), or ``"skip"``: refused and damaged
            members are skipped and a corrupt archive's remaining members are
            dropped, each recorded in ``self.skip_log``.
        max_member_bytes: the most bytes a member may declare in the central
            directory (default :data:`MAX_MEMBER_BYTES`, 1 GiB; ``zipfile`` reads
            no more than a member declares): a larger one is refused before it
            is read, as ``load_from_tar`` does.

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

    def __init__(self, datapipe: Iterable[tuple[str, Any]], length: int = -1, *, on_error: str = "raise",
                 max_member_bytes: int | None = None) -> None:
        super().__init__(datapipe, length, on_error=on_error, max_member_bytes=max_member_bytes)

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
            if self._too_large(url, info.filename, info.file_size):
                continue
            try:
                fobj = zf.open(info)
            except (*CORRUPT, NotImplementedError, RuntimeError) as exc:
                raise ArchiveError("read archive", url, self.stage, f"member {info.filename!r}: {reason(exc)}") from exc
            member_url = self._member_url(url, info.filename)
            fobj.__class__, fobj.where = ZipMember, (member_url, self.stage)  # read errors name the member
            if self.on_error == "skip":
                # a damaged member shows only when it is decompressed: under skip it is read whole before it
                # is yielded (one member in memory at a time), so it is counted instead of failing in the
                # consumer's hands; zip members are independent, the archive goes on
                try:
                    fobj = io.BytesIO(fobj.read())
                except ArchiveError as exc:
                    self.skip_log.record(exc)
                    continue
            note_opened(member_url, self.stage)
            yield member_url, StreamWrapper(fobj, parent, name=member_url)

