"""Opening files, shared by the pipes that open them: the loop they yield from, and HTTP opens that keep the version.

Split from :mod:`pipekit.pipes._fsspec_io` (which imports :func:`open_each` back, so it is importable there as
before): :func:`open_each` is the loop of ``open_files_by_fsspec``, ``read_from_http`` and TarShards' cache;
:func:`open_http` opens a file on fsspec's HTTP filesystem with the ``ETag`` / ``Last-Modified`` its server
told, for the file's stamp (:mod:`pipekit.pipes._stamps`).
"""

from __future__ import annotations

import io
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from pipekit.errors import ReadError, SkipLog
from pipekit.pipes._stamps import StampLog, http_version
from pipekit.pipes._stream_items import note_opened
from pipekit.pipes.base import StreamWrapper

__all__ = ["is_http", "open_each", "open_http"]


def _protocols(fs: Any) -> tuple[str, ...]:
    proto = fs.protocol
    return (proto,) if isinstance(proto, str) else tuple(proto)


# fs.open's arguments that are not request options (fsspec's HTTP open gives the others to its HEAD request)
_HTTP_OPEN_ARGS = frozenset({"block_size", "cache_type", "cache_options", "autocommit", "compression"})


def is_http(fs: Any) -> bool:
    """Whether ``fs`` is fsspec's HTTP(S) filesystem itself (not a cache or a chain around it)."""
    return type(fs).__name__ == "HTTPFileSystem" and not {"http", "https"}.isdisjoint(_protocols(fs))


# fs.open's text arguments: fsspec's open hands them to the io.TextIOWrapper it puts around a binary file
_TEXT_ARGS = ("encoding", "errors", "newline")


def open_http(fs: Any, path: str, kwargs: dict[str, Any], mode: str = "rb") -> Any:
    """``fs.open(path, mode)`` on fsspec's HTTP filesystem, the file's ``details`` telling its version.

    fsspec's open asks the server for the file's size (a ``HEAD``) and keeps the ``ETag`` and
    ``Last-Modified`` it answered to itself: here that request is made first and its answer given to the
    open (which then makes no request of its own) and kept in the file's ``details``, where
    :func:`~pipekit.pipes._stamps.file_stamp` reads them.  A text ``mode`` wraps that binary file in an
    :class:`io.TextIOWrapper` (``encoding``, ``errors``, ``newline`` of ``kwargs``), as fsspec's open does.
    """
    if "b" not in mode:
        text = {k: v for k, v in kwargs.items() if k in _TEXT_ARGS}
        binary = {k: v for k, v in kwargs.items() if k not in _TEXT_ARGS}
        return io.TextIOWrapper(open_http(fs, path, binary), **text)
    if "size" in kwargs:
        return fs.open(path, "rb", **kwargs)
    info = fs.info(path, **{k: v for k, v in kwargs.items() if k not in _HTTP_OPEN_ARGS})  # as fsspec's open asks
    if info.get("partial", True) is False:
        # the server said it takes no range requests (Accept-Ranges: none): fsspec's open streams such a file
        # (block_size=0), where a file read in ranged blocks fails past its first block
        file = fs.open(path, "rb", size=info.get("size"), **{**kwargs, "block_size": 0})
    else:
        file = fs.open(path, "rb", size=info.get("size"), **kwargs)
    details = getattr(file, "details", None)
    if isinstance(details, dict):
        if details.get("size") is None and info.get("size") is not None:  # a stream file knows no size
            details["size"] = info["size"]
        details.update(http_version(info))
    return file


# open_each keeps weak references to the streams it opened, to close those still open if the
# iteration fails; it drops the dead ones whenever the list has doubled since the last time.
_PRUNE_AT = 64


def open_each(
    urls: Iterable[str], reopen: Callable[[str], StreamWrapper], on_error: str, skip_log: SkipLog,
    stamps: StampLog | None = None,
) -> Iterator[tuple[str, StreamWrapper]]:
    """Yield ``(url, reopen(url))`` for each URL: the loop shared by the opening pipes.

    A :class:`~pipekit.errors.ReadError` from ``reopen`` is raised, or recorded
    in ``skip_log`` when ``on_error == "skip"``.  ``stamps`` (a
    :class:`~pipekit.pipes._stamps.StampLog`, or ``None``) logs each file
    opened, and raises :class:`~pipekit.errors.CheckpointError` for one that
    changed since the checkpoint a resumed run reads again.  If the iteration fails, every
    stream opened here that is still open is closed before the error
    propagates; streams handed out stay open otherwise (see
    :class:`FSSpecFileOpener`).
    """
    # A list of weak references (pruned now and then) rather than a WeakSet: the same streams,
    # without a Python-level add and removal callback per stream.
    opened: list[weakref.ref[StreamWrapper]] = []
    prune_at = _PRUNE_AT
    stage = skip_log.stage
    try:
        for url in urls:
            try:
                stream = reopen(url)
            except ReadError as exc:
                if on_error == "raise":
                    raise
                skip_log.record(exc)
                continue
            if stamps is not None:
                stamps.opened(url, stream, stage)
            opened.append(weakref.ref(stream))
            if len(opened) >= prune_at:
                opened = [ref for ref in opened if (s := ref()) is not None and not s.closed]
                prune_at = max(_PRUNE_AT, 2 * len(opened))
            note_opened(url, stage)
            yield url, stream
            del stream
    except Exception:  # the pipeline is broken: close what is still open
        for ref in opened:
            stream = ref()
            if stream is not None and not stream.closed:
                stream.close()
        raise
