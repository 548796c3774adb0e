"""``LineExpander``: the base of the pipes that expand a file into lines or rows, and its resume.

``readlines``, ``parse_csv`` and ``parse_csv_as_dict`` (:mod:`pipekit.pipes._parsing`, whose docstring says how a
checkpoint in the middle of a file is taken and resumed) share its iteration over ``(url, stream)`` items, its
errors and its resume: the file's cursor, getting the file again (an upstream ``reopen``, the stream's own path,
or the unread lines the checkpoint carries), and seeking or skipping to where it stopped.
"""

from __future__ import annotations

import collections
import contextlib
import csv
import io
import os
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import fsspec

from pipekit.errors import CSVParseError, ParseError, ReadError, StageError
from pipekit.pipes.base import IterDataPipe
from pipekit.pipes.state import ResumablePipe, find_reopen


def _reason(exc: BaseException) -> str:
    return exc.reason if isinstance(exc, StageError) else f"{type(exc).__name__}: {exc}"


def _split_item(item: Any, stage: str) -> tuple[str, Any]:
    if not (isinstance(item, (tuple, list)) and len(item) == 2):
        raise TypeError(f"{stage}: expected (url, stream) tuples, got {type(item).__name__}: {item!r:.80}")
    url, data = item
    if isinstance(data, (bytes, bytearray, memoryview)):
        data = io.BytesIO(bytes(data))
    elif isinstance(data, str):
        data = io.StringIO(data)
    elif not hasattr(data, "read") and not hasattr(data, "__iter__"):
        raise TypeError(f"{stage}: the data for {url!r} is not a stream: {type(data).__name__}")
    return str(url), data


def _source_of(stream: Any) -> dict[str, Any] | None:
    """Where a stream's file lives, if it can be opened again by path.

    Looks through torch's ``StreamWrapper`` and Python's text and buffered
    wrappers for an fsspec file (``.fs`` + ``.path``) or a local ``FileIO``.
    Decompressing or archive-member streams give ``None``.
    """
    obj = stream
    for _ in range(8):
        if obj is None:
            return None
        fs = getattr(obj, "fs", None)
        path = getattr(obj, "path", None)
        if isinstance(fs, fsspec.AbstractFileSystem) and isinstance(path, str):
            if getattr(obj, "compression", None):
                return None
            proto = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
            return {"protocol": proto, "path": path}
        if isinstance(obj, io.FileIO):
            name = obj.name
            return {"protocol": "file", "path": os.path.abspath(name)} if isinstance(name, str) else None
        inner = vars(obj).get("file_obj") if hasattr(obj, "__dict__") else None
        if inner is None:
            if isinstance(obj, io.TextIOWrapper):
                inner = obj.buffer
            elif isinstance(obj, (io.BufferedReader, io.BufferedRandom)):
                inner = obj.raw
        obj = inner
    return None


def _close(stream: Any) -> None:
    close = getattr(stream, "close", None)
    if callable(close):
        with contextlib.suppress(Exception):
            close()


class _LineFeed:
    """Raw lines of the current input, counted in ``cursor`` as they are consumed.

    ``drain()`` reads the rest of the stream into memory (for checkpoints of
    inputs that cannot be opened again) and closes it.
    """

    def __init__(self, stream: Any, cursor: dict[str, Any], buffer: collections.deque | None = None) -> None:
        self.stream = stream
        self.cursor = cursor
        self.buffer = buffer
        self._it = iter(stream) if stream is not None else None

    def __iter__(self) -> _LineFeed:
        return self

    def __next__(self) -> str | bytes:
        if self.buffer is not None:
            if not self.buffer:
                raise StopIteration
            line = self.buffer.popleft()
        else:
            line = next(self._it)  # type: ignore[arg-type]
        cur = self.cursor
        cur["lines"] += 1
        if cur["text"] is None:
            cur["text"] = isinstance(line, str)
            if cur["text"]:
                cur["offset"] = None
        if cur["offset"] is not None:
            cur["offset"] += len(line)
        return line

    def skip_raw(self, n: int) -> int:
        """Drop ``n`` lines without counting them; returns how many were dropped."""
        dropped = 0
        for _ in range(n):
            try:
                next(self._it)  # type: ignore[arg-type]
            except StopIteration:
                break
            dropped += 1
        return dropped

    def drain(self) -> None:
        if self.buffer is None:
            self.buffer = collections.deque(self._it)  # type: ignore[arg-type]
            self.close()

    def close(self) -> None:
        if self.stream is not None:
            _close(self.stream)
            self.stream = None
            self._it = None


class LineExpander(ResumablePipe):
    """Base of the pipes that expand a file into lines or rows (``readlines``, ``parse_csv``, ``parse_csv_as_dict``).

    Shares their iteration, errors and resume.  A subclass sets ``stage`` (its
    functional name) and ``action`` (for error messages) and implements
    ``_outputs(url, feed, cursor)``, which yields the outputs of one file from
    ``feed``, its raw lines (``cursor`` counts them as they are consumed).

    Resume: the checkpoint is ``{"current": None}`` between files, else
    ``{"current": cursor}``: the file's URL, the raw lines (and bytes) of it
    consumed, the CSV header, and the unread lines when the file cannot be
    opened again.  A restored pipe opens the file again, seeks or skips to that
    position and finishes it before pulling the next file (see the module
    docstring).  The arguments are those of :class:`LineReader`.
    """

    stage: ClassVar[str] = ""
    action: ClassVar[str] = ""
    _runtime = ("_cursor", "_feed")  # the feed holds an open stream

    def __init__(
        self,
        source_datapipe: IterDataPipe,
        skip_lines: int = 0,
        decode: bool = False,
        encoding: str = "utf-8",
        errors: str = "ignore",
        return_path: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(source_datapipe, IterDataPipe):
            raise TypeError(f"{self.stage}: source_datapipe must be an IterDataPipe, got {type(source_datapipe)}")
        if not isinstance(skip_lines, int) or isinstance(skip_lines, bool) or skip_lines < 0:
            raise ValueError(f"{self.stage}: skip_lines must be an integer >= 0, got {skip_lines!r}")
        if not isinstance(encoding, str):
            raise TypeError(f"{self.stage}: encoding must be a str, got {encoding!r}")
        import codecs

        codecs.lookup(encoding)  # LookupError for an unknown encoding
        codecs.lookup_error(errors)  # LookupError for an unknown error handler
        self.source_datapipe = source_datapipe
        self.skip_lines = skip_lines
        self.decode = bool(decode)
        self.encoding = encoding
        self.errors = errors
        self.return_path = bool(return_path)
        self._resume: dict[str, Any] | None = None
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._cursor: dict[str, Any] | None = None
        self._feed: _LineFeed | None = None

    # -- to implement ------------------------------------------------------

    def _outputs(self, url: str, feed: _LineFeed, cursor: dict[str, Any]) -> Iterator[Any]:
        raise NotImplementedError

    # -- iteration -----------------------------------------------------------

    def _decoded(self, lines: Iterator[str | bytes]) -> Iterator[str | bytes]:
        if not self.decode:
            yield from lines
            return
        for line in lines:
            yield line.decode(self.encoding, self.errors) if isinstance(line, bytes) else line

    def _run(self, url: str, feed: _LineFeed, cursor: dict[str, Any]) -> Iterator[Any]:
        self._cursor, self._feed = cursor, feed
        outputs = self._outputs(url, feed, cursor)
        try:
            while True:
                try:
                    out = next(outputs)
                except StopIteration:
                    break
                except csv.Error as exc:  # also a csv.Error, as torchdata let it through
                    raise CSVParseError(
                        self.action, url, self.stage, f"line {cursor['lines']}: {type(exc).__name__}: {exc}"
                    ) from exc
                except UnicodeError as exc:
                    raise ParseError(
                        self.action, url, self.stage, f"line {cursor['lines']}: {type(exc).__name__}: {exc}"
                    ) from exc
                except OSError as exc:
                    raise ReadError("read", url, self.stage, f"after line {cursor['lines']}: {_reason(exc)}") from exc
                yield out
        finally:
            outputs.close()
            feed.close()
            if self._feed is feed:
                self._cursor = self._feed = None

    def _start(self, url: str, stream: Any) -> Iterator[Any]:
        cursor = {
            "url": url,
            "source": _source_of(stream),
            "text": None,
            "encoding": getattr(stream, "encoding", None),
            "text_errors": getattr(stream, "errors", None),
            "lines": 0,
            "offset": 0,
            "fieldnames": None,
        }
        if not isinstance(cursor["encoding"], str):
            cursor["encoding"] = None
        if not isinstance(cursor["text_errors"], str):
            cursor["text_errors"] = None
        return self._run(url, _LineFeed(stream, cursor), cursor)

    def _reopen(self, cursor: dict[str, Any]) -> Any:
        url = cursor["url"]
        reopen = find_reopen(self.source_datapipe)
        try:
            if reopen is not None:
                return reopen(url)
            source = cursor["source"]
            if source is None:
                raise ValueError("the stream had no path to open it again by")
            binary = fsspec.filesystem(source["protocol"]).open(source["path"], "rb")
            if cursor["text"]:
                return io.TextIOWrapper(
                    binary, encoding=cursor["encoding"] or "utf-8", errors=cursor["text_errors"] or "strict"
                )
            return binary
        except Exception as exc:
            raise ReadError(
                "reopen", url, self.stage, f"cannot open it again to resume in the middle of it: {_reason(exc)}"
            ) from exc

    def _continue(self, state: dict[str, Any]) -> Iterator[Any]:
        cursor = dict(state)
        rest = cursor.pop("rest", None)
        url = cursor["url"]
        if rest is not None:
            return self._run(url, _LineFeed(None, cursor, collections.deque(rest)), cursor)
        stream = self._reopen(cursor)
        feed = _LineFeed(stream, cursor)
        try:
            offset = cursor["offset"]
            if not cursor["text"] and offset is not None and stream.seekable():
                size = stream.seek(0, io.SEEK_END)
                if size is not None and size < offset:
                    raise ValueError(f"it has {size} bytes, fewer than the {offset} read before the checkpoint")
                stream.seek(offset)
                feed = _LineFeed(stream, cursor)  # a fresh line iterator after the seek
            elif feed.skip_raw(cursor["lines"]) < cursor["lines"]:
                raise ValueError(f"it has fewer than the {cursor['lines']} lines read before the checkpoint")
        except Exception as exc:
            feed.close()
            raise ReadError("resume", url, self.stage, f"cannot resume it: {_reason(exc)}") from exc
        return self._run(url, feed, cursor)

    def __iter__(self) -> Iterator[Any]:
        resume, self._resume = self._resume, None  # the file to finish, set by restore()
        if resume is not None:
            yield from self._continue(resume)
        for item in self.source_datapipe:
            url, stream = _split_item(item, self.stage)
            yield from self._start(url, stream)

    # -- checkpointing -------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        cursor, feed = self._cursor, self._feed
        if cursor is None or feed is None:
            return {"current": None}
        if feed.buffer is None and cursor["source"] is None and find_reopen(self.source_datapipe) is None:
            try:
                feed.drain()
            except Exception as exc:
                raise ReadError(
                    "read", cursor["url"], self.stage, f"cannot buffer the rest for a checkpoint: {_reason(exc)}"
                ) from exc
        state = dict(cursor)
        state["rest"] = list(feed.buffer) if feed.buffer is not None else None
        return {"current": state}

    def check_state(self, state: dict[str, Any]) -> None:
        if "current" not in state:
            raise ValueError(f"{self.stage}: not a state of this pipe: {state!r:.200}")
        current = state["current"]
        if current is not None and not (
            isinstance(current, Mapping) and {"url", "lines", "offset", "text"} <= set(current)
        ):
            raise ValueError(f"{self.stage}: incomplete state: {current!r:.200}")

    def restore(self, state: dict[str, Any] | None) -> None:
        self._init_runtime()
        self._resume = None if state is None else state["current"]
