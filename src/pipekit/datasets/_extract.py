"""Safe archive extraction: :func:`extract_archive` (TorchGeo's / torchvision's name and signature).

Three guarantees, each with the test that shows it (``tests/datasets/test_extract.py``,
``tests/datasets/test_download.py``):

* **Nothing outside the target.**  Every member is checked before anything is written: an absolute
  name, a ``..`` component, a link resolving outside ``to_path``, a member whose path goes through one
  of the archive's links, a device file raise.
* **Bounded output.**  The sizes the members declare (which bound what zipfile and tarfile write) are
  added up before anything is written, and the archive is refused past ``max_bytes`` (default
  :data:`MAX_EXTRACT_BYTES`, 256 GiB), ``max_members`` (:data:`MAX_EXTRACT_MEMBERS`, 10 million) or
  ``max_ratio`` (:data:`MAX_EXTRACT_RATIO`, 250: the output over the archive's size, once the output
  passes 100 MiB; deflate turns zeros into a thousandth of their size, real data rarely shrinks
  past 1/20).  A tar member is refused on its header, before its data is decompressed; a single
  compressed file (``.gz``, ``.bz2``, ``.xz``), which declares no size, is counted while it is written.
* **All or nothing.**  The members are extracted into a hidden temporary folder inside the target and
  moved into place only once every one of them was written, so an archive refused while extracting
  (a link chain that escapes once its first link exists on disk, a corrupt stream, a full disk)
  leaves the target as it was.

A refusal raises :class:`~pipekit.errors.ArchiveError` naming the archive, the member and the limit.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import posixpath
import shutil
import stat
import tarfile
import tempfile
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from typing import Any

from pipekit._validate import check_int
from pipekit.errors import ArchiveError

__all__ = ["MAX_EXTRACT_BYTES", "MAX_EXTRACT_MEMBERS", "MAX_EXTRACT_RATIO", "extract_archive"]

#: Default ``max_bytes`` of :func:`extract_archive`: the most bytes an archive may extract to (256 GiB).
MAX_EXTRACT_BYTES = 256 << 30
#: Default ``max_members``: the most members (files, folders, links) an archive may hold.
MAX_EXTRACT_MEMBERS = 10_000_000
#: Default ``max_ratio``: the most an archive may expand, its output over its own size.
MAX_EXTRACT_RATIO = 250
#: The ratio is only checked once the output is past this many bytes (a small text file may shrink 1000-fold).
RATIO_FLOOR = 100 << 20

_CHUNK = 1 << 20
_ZIP_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA)
_TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tbz", ".tar.xz", ".txz")
_COMPRESSED = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
_RAISE_IT = "if the archive is trusted, pass a larger {name}= to extract_archive"


def _refuse(archive: str, member: str, reason: str) -> ArchiveError:
    return ArchiveError("extract", archive, "extract_archive", f"member {member!r} refused: {reason}")


class _Budget:
    """The limits, and what the members declared so far."""

    def __init__(self, archive: str, max_bytes: int, max_members: int, max_ratio: int) -> None:
        self.archive = archive
        self.size = max(os.path.getsize(archive), 1)
        self.max_bytes, self.max_members, self.max_ratio = max_bytes, max_members, max_ratio
        self.total = self.members = 0

    def add(self, member: str, size: int, count: bool = True) -> None:
        """Count ``size`` more bytes (and one more member); raise once a limit is passed."""
        self.total += size
        self.members += count
        if self.members > self.max_members:
            raise _refuse(self.archive, member, f"the archive holds more than max_members={self.max_members:,} "
                          "members; " + _RAISE_IT.format(name="max_members"))
        if self.total > self.max_bytes:
            raise _refuse(self.archive, member, f"the members declare {self.total:,} bytes so far, over "
                          f"max_bytes={self.max_bytes:,}; " + _RAISE_IT.format(name="max_bytes"))
        if self.total > RATIO_FLOOR and self.total > self.max_ratio * self.size:
            raise _refuse(self.archive, member, f"the archive ({self.size:,} bytes) expands to {self.total:,} "
                          f"bytes so far, {self.total // self.size:,} times its size, over "
                          f"max_ratio={self.max_ratio:,} (a decompression bomb?); "
                          + _RAISE_IT.format(name="max_ratio"))


def _inside(dst: str, name: str, archive: str) -> str:
    """The real path ``name`` would be written to under ``dst``; refuses escapes."""
    if not name or name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise _refuse(archive, name, "absolute path")
    if ".." in name.replace("\\", "/").split("/"):
        raise _refuse(archive, name, "'..' in the path")
    target = os.path.realpath(os.path.join(dst, name))
    if os.path.commonpath([target, dst]) != dst:
        raise _refuse(archive, name, f"it would be written outside {dst!r}")
    return target


def _link_inside(dst: str, name: str, link: str, archive: str, hard: bool) -> None:
    if link.startswith(("/", "\\")):
        raise _refuse(archive, name, f"link to the absolute path {link!r}")
    base = dst if hard else os.path.dirname(os.path.join(dst, name))
    target = os.path.realpath(os.path.join(base, link))
    if os.path.commonpath([target, dst]) != dst:
        raise _refuse(archive, name, f"link to {link!r} points outside {dst!r}")


def _iter_tar(tar: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    """The members one header at a time: each is checked before the stream moves past its data."""
    while (member := tar.next()) is not None:
        yield member


def _check_tar(tar: tarfile.TarFile, dst: str, budget: _Budget) -> list[tarfile.TarInfo]:
    members = []
    links: set[str] = set()
    for m in _iter_tar(tar):
        budget.add(m.name, m.size if m.isfile() else 0)
        _inside(dst, m.name, budget.archive)
        parts = posixpath.normpath(m.name.replace("\\", "/")).split("/")
        through = next((p for p in ("/".join(parts[:i]) for i in range(1, len(parts))) if p in links), None)
        if through is not None:  # a link's target is checked lexically; chains of links could still escape
            raise _refuse(budget.archive, m.name, f"its path goes through the link {through!r}")
        if m.issym() or m.islnk():
            _link_inside(dst, m.name, m.linkname, budget.archive, hard=m.islnk())
            links.add("/".join(parts))
        elif m.isdev():
            raise _refuse(budget.archive, m.name, "device or FIFO")
        members.append(m)
    return members


def _check_zip(zf: zipfile.ZipFile, dst: str, budget: _Budget) -> None:
    for info in zf.infolist():
        budget.add(info.filename, info.file_size)
        _inside(dst, info.filename, budget.archive)
        if info.flag_bits & 0x1:
            raise _refuse(budget.archive, info.filename, "it is encrypted (a password is needed), which "
                          "extract_archive does not support")
        if info.compress_type not in _ZIP_METHODS:
            raise _refuse(budget.archive, info.filename, f"compression method {info.compress_type} is not one "
                          "Python's zipfile reads (stored, deflate, bzip2, lzma)")
        if stat.S_ISLNK(info.external_attr >> 16):
            link = zf.read(info).decode("utf-8", "replace") if info.file_size <= 4096 else "/" * 4097
            _link_inside(dst, info.filename, link, budget.archive, hard=False)


def _move_into(src: str, dst: str) -> None:
    """Move the tree under ``src`` into ``dst``, merging folders that exist, replacing files."""
    for name in os.listdir(src):
        source, target = os.path.join(src, name), os.path.join(dst, name)
        if os.path.isdir(source) and not os.path.islink(source) and os.path.isdir(target) \
                and not os.path.islink(target):
            _move_into(source, target)
        else:
            os.replace(source, target)


def _copy_counted(src: str, out: str, opener: Any, budget: _Budget, member: str) -> None:
    with opener(src, "rb") as sf, open(out, "wb") as df:
        while chunk := sf.read(_CHUNK):
            budget.add(member, len(chunk), count=False)
            df.write(chunk)


def _limits(values: Iterable[tuple[str, Any, int]]) -> list[int]:
    return [default if value is None else check_int(value, name, "extract_archive", minimum=1)
            for name, value, default in values]


def extract_archive(
    from_path: str | os.PathLike[str],
    to_path: str | os.PathLike[str] | None = None,
    remove_finished: bool = False,
    *,
    max_bytes: int | None = None,
    max_members: int | None = None,
    max_ratio: int | None = None,
) -> str:
    """Extract a tar (``.tar``, ``.tar.gz``/``.tgz``, ``.tar.bz2``, ``.tar.xz``) or zip archive, safely.

    TorchGeo 0.8's (torchvision's) signature: extracts into ``to_path``
    (default: the archive's folder) and returns it; a single compressed file
    (``.gz``, ``.bz2``, ``.xz``) is decompressed next to it (the returned path
    is the decompressed file's).  Every member is checked before anything is
    written: an absolute name, a ``..`` component, a symbolic or hard link
    resolving outside ``to_path``, a member whose path passes through one of
    the archive's links (chains of links can escape where each link alone
    does not), a device file, or an archive past a limit below raises.  The
    members are written into a temporary folder inside ``to_path`` and moved
    into place once all of them were written: a refused archive leaves
    ``to_path`` as it was (folders already there are merged, files replaced).

    Args:
        from_path: the archive.
        to_path: the destination folder (created).
        remove_finished: delete the archive after extracting it.
        max_bytes: the most bytes the archive may extract to, as its members declare them (a
            single compressed file: as it is written).  Default :data:`MAX_EXTRACT_BYTES` (256 GiB).
        max_members: the most members it may hold.  Default :data:`MAX_EXTRACT_MEMBERS` (10,000,000).
        max_ratio: the most its output may be over its own size, checked once the output passes
            100 MiB.  Default :data:`MAX_EXTRACT_RATIO` (250; a zip of zeros expands about 1000-fold).

    Raises:
        ArchiveError: a refused member or a limit passed (the message names the archive, the member
            and the limit), an encrypted zip member or one compressed with a method zipfile does not
            read (refused before anything is written), or a corrupt archive.
        ValueError: the file name's suffix is not a known archive or compression, or a limit is
            not a positive int.

    Example:
        >>> import io, os, tarfile, tempfile
        >>> tmp = tempfile.mkdtemp()
        >>> path = os.path.join(tmp, "a.tar.gz")
        >>> with tarfile.open(path, "w:gz") as tar:
        ...     info = tarfile.TarInfo("dir/x.txt"); info.size = 2
        ...     tar.addfile(info, io.BytesIO(b"hi"))
        >>> out = extract_archive(path, os.path.join(tmp, "out"))
        >>> open(os.path.join(out, "dir", "x.txt")).read()
        'hi'
        >>> extract_archive(path, os.path.join(tmp, "out2"), max_bytes=1)
        Traceback (most recent call last):
          ...
        pipekit.errors.ArchiveError: cannot extract '...a.tar.gz' in extract_archive: member 'dir/x.txt' refused: ...
    """
    limits = _limits([("max_bytes", max_bytes, MAX_EXTRACT_BYTES), ("max_members", max_members, MAX_EXTRACT_MEMBERS),
                      ("max_ratio", max_ratio, MAX_EXTRACT_RATIO)])
    src = os.fspath(from_path)
    dst = os.path.dirname(os.path.abspath(src)) if to_path is None else os.fspath(to_path)
    lower = src.lower()
    is_tar, is_zip = lower.endswith(_TAR_SUFFIXES), lower.endswith(".zip")
    suffix = None if is_tar or is_zip else next((s for s in _COMPRESSED if lower.endswith(s)), None)
    if not (is_tar or is_zip or suffix):
        raise ValueError(f"extract_archive: {src!r} is not a known archive or compressed file "
                         f"(suffixes {', '.join((*_TAR_SUFFIXES, '.zip', *_COMPRESSED))})")
    os.makedirs(dst, exist_ok=True)
    dst = os.path.realpath(dst)
    staging = None
    try:
        budget = _Budget(src, *limits)
        if suffix is not None:
            name = os.path.basename(src)[: -len(suffix)]
            out = os.path.join(dst, name)
            fd, partial = tempfile.mkstemp(prefix=f".{name}.", suffix=".part", dir=dst)
            os.close(fd)
            try:
                _copy_counted(src, partial, _COMPRESSED[suffix], budget, name)
                os.replace(partial, out)
            finally:
                if os.path.exists(partial):
                    os.remove(partial)
            dst = out
        elif is_tar:
            with tarfile.open(src, "r:*") as tar:
                members = _check_tar(tar, dst, budget)
                staging = tempfile.mkdtemp(prefix=".extracting-", dir=dst)
                if hasattr(tarfile, "data_filter"):
                    tar.extractall(staging, members=members, filter="data")  # checked above too
                else:  # pragma: no cover - Python without extraction filters
                    tar.extractall(staging, members=members)
        else:
            with zipfile.ZipFile(src) as zf:
                _check_zip(zf, dst, budget)
                staging = tempfile.mkdtemp(prefix=".extracting-", dir=dst)
                zf.extractall(staging)
        if staging is not None:
            _move_into(staging, dst)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError, lzma.LZMAError, zlib.error) as exc:
        if isinstance(exc, FileNotFoundError) and not os.path.exists(src):
            raise
        raise ArchiveError("extract", src, "extract_archive", f"{type(exc).__name__}: {exc}") from exc
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    if remove_finished:
        os.remove(src)
    return dst
