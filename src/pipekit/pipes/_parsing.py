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
:class:`~pipekit.pipes.state.ResumablePipe`, in :mod:`pipekit.pipes._line_expander`).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from typing import IO, Any

from pipekit.errors import JSONParseError, ParseError, ReadError
from pipekit.pipes._line_expander import LineExpander, _close, _LineFeed, _reason, _split_item
from pipekit.pipes.base import IterDataPipe, functional_datapipe

__all__ = ["CSVDictParser", "CSVParser", "JsonParser", "LineReader"]


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
