"""Helpers shared by the pipes' tests."""

from __future__ import annotations

import io
import tarfile


def archive_bytes(members: list[tuple[str, bytes]], fmt: int = tarfile.USTAR_FORMAT, dirs=(), links=()) -> bytes:
    """A tar archive in ``fmt`` with ``members``, directory entries first and symbolic links (name, target) last."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in links:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return buf.getvalue()
