"""Read text files line by line, parse CSV and JSON: ``readlines``, ``parse_csv``,
``parse_csv_as_dict`` and ``parse_json_files``, with torchdata 0.9's arguments and outputs.

All four take ``(url, stream)`` items as yielded by ``open_files_by_fsspec`` (or
torch's ``open_files``); ``bytes``/``str`` data is accepted too.  Each stream is
closed once it has been read through (or when the iteration stops).  Malformed
input raises :class:`~pipekit.errors.ParseError` naming the URL, the stage and,
for line-based formats, the line number; a failing read raises
:class:`~pipekit.errors.ReadError`.

Resume
------
``readlines``, ``parse_csv`` and ``parse_csv_as_dict`` turn one file into many
items, so a checkpoint can fall in the middle of a file.  Their
``state_dict()`` holds the file's URL, how many raw lines of it were consumed
(for binary streams also how many bytes), and the CSV header.  A restored pipe
first finishes that file, then pulls the next one from upstream (whose own
state already points after it).  To get the file again it uses, in order:

1. the ``reopen(url)`` method of the nearest pipe upstream that has one
   (``open_files_by_fsspec``, ``decompress``), looking through ``filter``,
   ``shuffle`` and ``sharding_filter`` (:func:`pipekit.pipes.state.find_reopen`),
   so the same storage options, credentials and decompression apply;
2. the path of the original stream, when it was an fsspec file (``.fs`` and
   ``.path``, e.g. from ``fsspec.open``) or a local file (torch's
   ``open_files``), opened with fsspec;
3. otherwise (in-memory streams, archive members, bytes): the checkpoint
   itself carries the file's unread lines, read into memory when the
   checkpoint is taken.

It then seeks to the recorded byte offset (binary, seekable streams) or reads
and drops the lines already consumed, so resuming costs at most one pass over
the part of the file already read; a CSV row spanning several lines is never
cut.  The checkpoint never holds credentials.  The three pipes share this
through their base, :class:`LineExpander` (a
:class:`~pipekit.pipes.state.ResumablePipe`).
"""

from __future__ import annotations

import collections
import contextlib
import csv
import io
import json
import os
from collections.abc import Iterator, Mapping
from typing import IO, Any, ClassVar

import fsspec

from pipekit.errors import CSVParseError, JSONParseError, ParseError, ReadError, StageError
from pipekit.pipes.base import IterDataPipe, functional_datapipe
from pipekit.pipes.state import ResumablePipe, find_reopen

__all__ = ["CSVDictParser", "CSVParser", "JsonParser", "LineReader"]


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


@functional_datapipe("readlines")
class LineReader(LineExpander):
    """Yield the lines of each ``(url, stream)`` item, as ``(url, line)`` (functional name: ``readlines``).

    Args:
        source_datapipe: yields ``(url, stream)`` tuples (text or binary streams).
        skip_lines: number of lines to skip at the beginning of each file.
        strip_newline: if ``True``, ``"\\r"`` and ``"\\n"`` are stripped from both ends
            of each line.
        decode: if ``True``, lines of binary streams are decoded with ``encoding``
            (by default they stay ``bytes``, as in torchdata).
        encoding: the character encoding of the files (default ``"utf-8"``).
        errors: the decoding error handler (default ``"ignore"``; ``"strict"``
            raises :class:`~pipekit.errors.ParseError` naming the line).
        return_path: if ``True``, yield ``(url, line)`` tuples, else just lines.

    Resumable in the middle of a file (see the module docstring).

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> import io
        >>> text1 = "Line1\\nLine2"
        >>> text2 = "Line2,1\\r\\nLine2,2\\r\\nLine2,3"
        >>> source_dp = IterableWrapper([("file1", io.StringIO(text1)), ("file2", io.StringIO(text2))])
        >>> line_reader_dp = source_dp.readlines()
        >>> list(line_reader_dp)
        [('file1', 'Line1'), ('file1', 'Line2'), ('file2', 'Line2,1'), ('file2', 'Line2,2'), ('file2', 'Line2,3')]
    """

    stage = "readlines"
    action = "read lines of"

    def __init__(
        self,
        source_datapipe: IterDataPipe[tuple[str, IO]],
        *,
        skip_lines: int = 0,
        strip_newline: bool = True,
        decode: bool = False,
        encoding: str = "utf-8",
        errors: str = "ignore",
        return_path: bool = True,
    ) -> None:
        super().__init__(source_datapipe, skip_lines, decode, encoding, errors, return_path)
        self.strip_newline = bool(strip_newline)

    def _outputs(self, url: str, feed: _LineFeed, cursor: dict[str, Any]) -> Iterator[Any]:
        for raw in feed:
            if cursor["lines"] <= self.skip_lines:
                continue
            line: str | bytes = raw
            if self.strip_newline:
                line = line.strip("\r\n") if isinstance(line, str) else line.strip(b"\r\n")
            if self.decode and isinstance(line, bytes):
                line = line.decode(self.encoding, self.errors)
            yield (url, line) if self.return_path else line


class _CSVBase(LineExpander):
    action = "parse CSV"
    _dict_rows = False

    def _init_csv(self, as_tuple: bool, fmtparams: dict[str, Any]) -> None:
        try:  # reject unknown or invalid format parameters now, not at the first row
            (csv.DictReader if self._dict_rows else csv.reader)([], **fmtparams)
        except (TypeError, csv.Error) as exc:
            raise TypeError(f"{self.stage}: invalid CSV format parameters {fmtparams!r}: {exc}") from exc
        self.as_tuple = bool(as_tuple)
        self.fmtparams = fmtparams

    def _outputs(self, url: str, feed: _LineFeed, cursor: dict[str, Any]) -> Iterator[Any]:
        while cursor["lines"] < self.skip_lines:
            try:
                next(feed)
            except StopIteration:
                return
        lines = self._decoded(feed)
        if self._dict_rows:
            params = dict(self.fmtparams)
            if cursor["fieldnames"] is not None and params.get("fieldnames") is None:
                params["fieldnames"] = cursor["fieldnames"]  # resumed after the header
            reader: Any = csv.DictReader(lines, **params)
        else:
            reader = csv.reader(lines, **self.fmtparams)
        for row in reader:
            if self._dict_rows and cursor["fieldnames"] is None:
                cursor["fieldnames"] = list(reader.fieldnames)
            if self.as_tuple and isinstance(row, list):
                row = tuple(row)
            yield (url, row) if self.return_path else row


@functional_datapipe("parse_csv")
class CSVParser(_CSVBase):
    """Parse CSV streams and yield their rows as lists (functional name: ``parse_csv``).

    Args:
        source_datapipe: yields ``(url, stream)`` tuples.
        skip_lines: number of lines to skip at the beginning of each file.
        decode: if ``True``, lines of binary streams are decoded with ``encoding``.
        encoding: the character encoding of the files (default ``"utf-8"``).
        errors: the decoding error handler (default ``"ignore"``).
        return_path: if ``True``, yield ``(url, row)`` tuples, else just rows.
        as_tuple: if ``True``, rows are tuples instead of lists.
        fmtparams: passed to :func:`csv.reader` (``delimiter``, ``quotechar``...).

    Malformed CSV (e.g. with ``strict=True``) raises :class:`~pipekit.errors.CSVParseError`
    naming the file and line: a :class:`~pipekit.errors.ParseError` that is also the
    :class:`csv.Error` torchdata let through.  Resumable in the middle of a file (see the module
    docstring).

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> import io
        >>> files = [("1.csv", io.BytesIO(b"key,item\\na,1\\nb,2\\n")), ("empty.csv", io.BytesIO(b"")),
        ...          ("empty2.csv", io.BytesIO(b"\\n"))]
        >>> list(IterableWrapper(files).parse_csv())
        [['key', 'item'], ['a', '1'], ['b', '2'], []]
        >>> list(IterableWrapper(files).parse_csv(skip_lines=1, return_path=True, as_tuple=True))
        [('1.csv', ('a', '1')), ('1.csv', ('b', '2'))]
    """

    stage = "parse_csv"

    def __init__(
        self,
        source_datapipe: IterDataPipe[tuple[str, IO]],
        *,
        skip_lines: int = 0,
        decode: bool = True,
        encoding: str = "utf-8",
        errors: str = "ignore",
        return_path: bool = False,
        as_tuple: bool = False,
        **fmtparams: Any,
    ) -> None:
        super().__init__(source_datapipe, skip_lines, decode, encoding, errors, return_path)
        self._init_csv(as_tuple, fmtparams)


@functional_datapipe("parse_csv_as_dict")
class CSVDictParser(_CSVBase):
    """Parse CSV streams and yield their rows as dicts (functional name: ``parse_csv_as_dict``).

    The first row of each file (after ``skip_lines``) is the header whose fields
    are the keys, unless ``fieldnames`` is given; empty rows are skipped
    (:class:`csv.DictReader`).

    Args:
        source_datapipe: yields ``(url, stream)`` tuples.
        skip_lines: number of lines to skip at the beginning of each file.
        decode: if ``True``, lines of binary streams are decoded with ``encoding``.
        encoding: the character encoding of the files (default ``"utf-8"``).
        errors: the decoding error handler (default ``"ignore"``).
        return_path: if ``True``, yield ``(url, row)`` tuples, else just rows.
        fmtparams: passed to :class:`csv.DictReader` (``fieldnames``, ``restkey``,
            ``delimiter``...).

    Resumable in the middle of a file; the checkpoint keeps the header.

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> import io
        >>> files = [("1.csv", io.BytesIO(b"key,item\\na,1\\nb,2\\n")), ("empty.csv", io.BytesIO(b"")),
        ...          ("empty2.csv", io.BytesIO(b"\\n"))]
        >>> list(IterableWrapper(files).parse_csv_as_dict())
        [{'key': 'a', 'item': '1'}, {'key': 'b', 'item': '2'}]
    """

    stage = "parse_csv_as_dict"
    _dict_rows = True

    def __init__(
        self,
        source_datapipe: IterDataPipe[tuple[str, IO]],
        *,
        skip_lines: int = 0,
        decode: bool = True,
        encoding: str = "utf-8",
        errors: str = "ignore",
        return_path: bool = False,
        **fmtparams: Any,
    ) -> None:
        super().__init__(source_datapipe, skip_lines, decode, encoding, errors, return_path)
        self._init_csv(False, fmtparams)


@functional_datapipe("parse_json_files")
class JsonParser(IterDataPipe[tuple[str, Any]]):
    """Read each ``(url, stream)`` item to the end and parse it as one JSON document (functional name:
    ``parse_json_files``).

    Yields ``(url, obj)``.  Text and binary streams both work (binary JSON may be
    UTF-8, -16 or -32).  An invalid or empty document raises
    :class:`~pipekit.errors.JSONParseError` with the URL, line and column: a
    :class:`~pipekit.errors.ParseError` that is also the
    :class:`json.JSONDecodeError` torchdata raised (with its ``doc``, ``pos``,
    ``lineno`` and ``colno``), so ``except json.JSONDecodeError`` still catches it.

    Args:
        source_datapipe: yields ``(url, stream)`` tuples.
        kwargs: passed to :func:`json.loads` (``object_hook``, ``parse_float``...).

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> import io
        >>> files = [("1.json", io.BytesIO(b'["foo", {"bar": ["baz", null, 1.0, 2]}]')),
        ...          ("2.json", io.StringIO('{"__complex__": true, "real": 1, "imag": 2}'))]
        >>> list(IterableWrapper(files).parse_json_files())
        [('1.json', ['foo', {'bar': ['baz', None, 1.0, 2]}]), ('2.json', {'__complex__': True, 'real': 1, 'imag': 2})]
    """

    stateless = True

    def __init__(self, source_datapipe: IterDataPipe[tuple[str, IO]], **kwargs: Any) -> None:
        super().__init__()
        if not isinstance(source_datapipe, IterDataPipe):
            raise TypeError(f"parse_json_files: source_datapipe must be an IterDataPipe, got {type(source_datapipe)}")
        decoder_cls = kwargs.get("cls") or json.JSONDecoder
        try:
            decoder_cls(**{k: v for k, v in kwargs.items() if k != "cls"})
        except TypeError as exc:
            raise TypeError(f"parse_json_files: invalid json.loads arguments {sorted(kwargs)}: {exc}") from exc
        self.source_datapipe = source_datapipe
        self.kwargs = kwargs

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        for item in self.source_datapipe:
            url, stream = _split_item(item, "parse_json_files")
            try:
                data = stream.read()
            except Exception as exc:
                raise ReadError("read", url, "parse_json_files", _reason(exc)) from exc
            finally:
                _close(stream)
            try:
                obj = json.loads(data, **self.kwargs)
            except json.JSONDecodeError as exc:
                raise JSONParseError.from_decode_error("parse JSON", url, "parse_json_files", exc) from exc
            except (UnicodeError, ValueError) as exc:
                raise ParseError("parse JSON", url, "parse_json_files", _reason(exc)) from exc
            yield url, obj

    def __len__(self) -> int:
        return len(self.source_datapipe)  # type: ignore[arg-type]
