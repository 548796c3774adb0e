"""Zip member streams whose read errors name the member and the stage (``load_from_zip``).

``zipfile`` finds a member's damaged data (deflate data that does not decompress, a CRC-32 that does not
match) only when the member is read, and raises a bare ``zlib.error`` or ``BadZipFile`` in the reader's
hands; :class:`ZipMember` turns them into :class:`~pipekit.errors.ArchiveError`.  (The tar counterpart is
``_MemberFile`` in :mod:`pipekit.pipes._tar_headers`.)
"""

from __future__ import annotations

import lzma
import zipfile
import zlib
from typing import Any

from pipekit.errors import ArchiveError, PipekitError
from pipekit.pipes._stream_items import reason

__all__ = ["ZipMember"]


class ZipMember(zipfile.ZipExtFile):
    """A zip member stream whose read errors (damaged deflate data, a bad CRC-32) name the member and the stage.

    ``zipfile`` raises a bare ``zlib.error`` or ``BadZipFile`` only when the member is read; here they
    become :class:`~pipekit.errors.ArchiveError` (the class of the stream ``ZipFile.open`` returns is set).
    """

    where: tuple[str, str] = ("<zip member>", "load_from_zip")


def _checked_zip_read(name: str) -> Any:
    method = getattr(zipfile.ZipExtFile, name)

    def call(self: ZipMember, *args: Any) -> Any:
        try:
            return method(self, *args)
        except PipekitError:
            raise  # the archive's own read failed (a ReadError naming its URL): not a damaged member
        except (zipfile.BadZipFile, zlib.error, EOFError, lzma.LZMAError, OSError) as exc:  # bz2: OSError
            url, stage = self.where
            raise ArchiveError("read member", url, stage, f"the member is corrupt ({reason(exc)})") from exc

    call.__name__ = call.__qualname__ = name
    return call


for _name in ("read", "read1", "readinto", "readinto1", "readline", "readlines", "peek", "__next__", "seek"):
    setattr(ZipMember, _name, _checked_zip_read(_name))
