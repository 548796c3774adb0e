"""How ``load_from_tar`` reads tar archives beyond ``tarfile``: plain headers fast, member reads checked, ends checked.

Internal to :mod:`pipekit.pipes._archives` (which imports these names back, so they are importable there as
before):

* :class:`_PlainMembers`: the leading plain members of a seekable, uncompressed archive, without
  ``tarfile``'s per-header work (the ``tar_headers`` fast path);
* :class:`_MemberFile`: ``tarfile``'s member stream, whose reads raise
  :class:`~pipekit.errors.ArchiveError` naming the member;
* :class:`_EndCheckedTarInfo`, :func:`_end_problem`, :func:`_compressed_end_problem`: an archive ends at
  its end-of-archive marker, and a compressed one passes its stream's own check, or the loader says why not.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import re
import tarfile
import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pipekit.errors import ArchiveError
from pipekit.pipes._stream_items import CORRUPT, MemoryMember, note_opened, reason
from pipekit.pipes.base import StreamWrapper

if TYPE_CHECKING:
    from pipekit.pipes._archives import TarArchiveLoader


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
        if size is None or size > PLAIN_MEMBER_MAX_BYTES or size > self.loader.member_limit():
            return None  # (tarfile reads a member over the loader's limit, which refuses it)
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
