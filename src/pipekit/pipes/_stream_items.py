"""Helpers shared by the pipes that read ``(url, binary stream)`` items: archives and decompression.

* :func:`check_pair` validates an item (a pair, a binary stream);
* :func:`raw_stream` unwraps a :class:`StreamWrapper`, :func:`is_seekable` asks a stream safely;
* :data:`CORRUPT` lists the errors a damaged archive or compressed stream raises;
* :func:`reopen_stream` opens a URL again to resume it mid-file: through the
  ``reopen(url)`` of the nearest pipe upstream that has one
  (:func:`pipekit.pipes.state.find_reopen`), else with ``fsspec.open(url, "rb")``.
"""

from __future__ import annotations

import io
import lzma
import tarfile
import zipfile
import zlib
from typing import Any

import fsspec

from pipekit.errors import ArchiveError, StageError
from pipekit.pipes.base import StreamWrapper
from pipekit.pipes.state import find_reopen

__all__ = ["CORRUPT", "check_pair", "is_seekable", "raw_stream", "reason", "reopen_stream"]

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
