"""Reshape the columns of items: drop, slice, flatten, rows2columnar, lines_to_paragraphs.

torchdata's ``Dropper``, ``Slicer``, ``Flattener``, ``Rows2Columnar`` and
``ParagraphAggregator``, with their functional names and arguments.  Items
are tuples and lists (indexed by position; negative positions count from the
end) or dicts (indexed by key).  Where torchdata only warned (an index the
item does not have, an item that is not a tuple, list or dict, two values
flattened onto the same key) pipekit raises an error naming the stage, the
index and the item, so a wrong column is never dropped or kept silently.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from typing import Any

from pipekit.pipes.base import IterDataPipe, functional_datapipe
from pipekit.pipes.state import ResumablePipe

__all__ = ["Dropper", "Flattener", "ParagraphAggregator", "Rows2Columnar", "Slicer"]


def _short(item: Any) -> str:
    text = repr(item)
    return text if len(text) <= 80 else text[:77] + "..."


def _check_item(item: Any, stage: str) -> None:
    if not isinstance(item, tuple | list | dict):
        raise TypeError(f"{stage}: items must be tuples, lists or dicts, got {type(item).__name__}: {_short(item)}")


def _position(index: Any, item: Sequence, stage: str) -> int:
    """The non-negative position ``index`` names in the tuple or list ``item``."""
    if isinstance(index, bool) or not isinstance(index, int):
        raise TypeError(f"{stage}: {type(item).__name__} items are indexed by int, got {index!r} for {_short(item)}")
    n = len(item)
    if not -n <= index < n:
        raise IndexError(
            f"{stage}: index {index} is out of range for a {type(item).__name__} of length {n}: {_short(item)}"
        )
    return index % n


def _check_keys(keys: Iterable[Any], item: dict, stage: str) -> None:
    for key in keys:
        if key not in item:
            raise KeyError(f"{stage}: key {key!r} is not in the item (keys {list(item)!r})")


def _index_set(indices: Any, name: str, stage: str, allow_empty: bool = False) -> list[Hashable]:
    """torchdata's convention: a list holds several indices; anything else is one (a tuple is one dict key)."""
    values = list(indices) if isinstance(indices, list) else [indices]
    for v in values:
        if not isinstance(v, Hashable):
            raise TypeError(f"{stage}: {name} must be hashable indices or keys, got {v!r}")
    if not values and not allow_empty:
        raise ValueError(f"{stage}: {name} is an empty list")
    return list(dict.fromkeys(values))


@functional_datapipe("drop")
class Dropper(IterDataPipe):
    """Drop columns of each item by position or key (functional name: ``drop``).

    Tuples stay tuples and lists stay lists; dicts lose the given keys.

    Args:
        datapipe: a pipe yielding tuples, lists or dicts.
        indices: one index or key, or a list of them.  Positions may be
            negative.  An index the item does not have raises ``IndexError``
            or ``KeyError`` naming it (torchdata warned and went on).

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> dp1 = IterableWrapper(range(5))
        >>> dp2 = IterableWrapper(range(10, 15))
        >>> dp = dp1.zip(dp2)
        >>> list(dp)
        [(0, 10), (1, 11), (2, 12), (3, 13), (4, 14)]
        >>> drop_dp = dp.drop(1)
        >>> list(drop_dp)
        [(0,), (1,), (2,), (3,), (4,)]
        >>> list(IterableWrapper([{"a": 1, "b": 2, "c": 3}]).drop(["a", "c"]))
        [{'b': 2}]
    """

    stateless = True

    def __init__(self, datapipe: IterDataPipe, indices: Hashable | list[Hashable]) -> None:
        super().__init__()
        self.source_datapipe = datapipe
        self.indices = _index_set(indices, "indices", "drop")

    def _drop(self, item: Any) -> Any:
        _check_item(item, "drop")
        if isinstance(item, dict):
            _check_keys(self.indices, item, "drop")
            dropped = set(self.indices)
            return {k: v for k, v in item.items() if k not in dropped}
        positions = {_position(i, item, "drop") for i in self.indices}
        kept = [x for i, x in enumerate(item) if i not in positions]
        return tuple(kept) if isinstance(item, tuple) else kept

    def __iter__(self) -> Iterator[Any]:
        for item in self.source_datapipe:
            yield self._drop(item)

    def __len__(self) -> int:
        return len(self.source_datapipe)  # type: ignore[arg-type]


@functional_datapipe("slice")
class Slicer(IterDataPipe):
    """Keep a slice, or some columns, of each item (functional name: ``slice``).

    With an int ``index``, tuples and lists are sliced like
    ``item[index:stop:step]``.  With a list of indices, the columns at those
    positions are kept, in the item's order (as in torchdata).  Dicts are
    selected by key: one key keeps ``{key: item[key]}``, a list of keys keeps
    those keys in the item's order.

    Args:
        datapipe: a pipe yielding tuples, lists or dicts.
        index: the slice start (an int, or ``None`` for the beginning), a
            dict key, or a list of positions or keys.
        stop: the slice stop (tuples and lists only).
        step: the slice step (tuples and lists only).

    A list of indices with ``stop`` or ``step`` raises ``ValueError``
    (torchdata ignored them with a warning), as does a ``stop`` or ``step``
    on a dict item.  Positions or keys the item does not have raise
    ``IndexError`` or ``KeyError``; slice bounds follow Python's slicing.

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> dp = IterableWrapper([(0, 10, 100), (1, 11, 111), (2, 12, 122), (3, 13, 133), (4, 14, 144)])
        >>> slice_dp = dp.slice(0, 2)
        >>> list(slice_dp)
        [(0, 10), (1, 11), (2, 12), (3, 13), (4, 14)]
        >>> list(dp.slice([0, 2]))[:2]
        [(0, 100), (1, 111)]
        >>> list(IterableWrapper([{"a": 1, "b": 2, "c": 3}]).slice(["c", "a"]))
        [{'a': 1, 'c': 3}]
    """

    stateless = True

    def __init__(
        self,
        datapipe: IterDataPipe,
        index: int | Hashable | list[Hashable] | None,
        stop: int | None = None,
        step: int | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("stop", stop), ("step", step)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise TypeError(f"slice: {name} must be an int or None, got {value!r}")
        if step == 0:
            raise ValueError("slice: step cannot be zero")
        if isinstance(index, list):
            if stop is not None or step is not None:
                raise ValueError("slice: a list of indices cannot be combined with stop or step; give one or the other")
            self._keys: list[Hashable] | None = _index_set(index, "index", "slice")
        else:
            if not isinstance(index, Hashable):
                raise TypeError(f"slice: index must be an int, a key or a list of them, got {index!r}")
            self._keys = None
        self.source_datapipe = datapipe
        self.index = index
        self.stop = stop
        self.step = step

    def _slice(self, item: Any) -> Any:
        _check_item(item, "slice")
        if isinstance(item, dict):
            if self._keys is not None:
                _check_keys(self._keys, item, "slice")
                wanted = set(self._keys)
                return {k: v for k, v in item.items() if k in wanted}
            if self.stop is not None or self.step is not None:
                raise ValueError(f"slice: dict items are selected by key, stop and step do not apply: {_short(item)}")
            _check_keys([self.index], item, "slice")
            return {self.index: item[self.index]}
        if self._keys is not None:
            positions = {_position(i, item, "slice") for i in self._keys}
            kept = [x for i, x in enumerate(item) if i in positions]
            return tuple(kept) if isinstance(item, tuple) else kept
        if self.index is not None and (isinstance(self.index, bool) or not isinstance(self.index, int)):
            raise TypeError(
                f"slice: {type(item).__name__} items are sliced by an int start, got {self.index!r} for {_short(item)}"
            )
        return item[self.index : self.stop : self.step]

    def __iter__(self) -> Iterator[Any]:
        for item in self.source_datapipe:
            yield self._slice(item)

    def __len__(self) -> int:
        return len(self.source_datapipe)  # type: ignore[arg-type]


@functional_datapipe("flatten")
class Flattener(IterDataPipe):
    """Flatten nested columns of each item by one level (functional name: ``flatten``).

    In a tuple or list, a column that is itself a tuple or list is replaced
    by its elements; in a dict, a value that is itself a dict is replaced by
    its key/value pairs.  Columns that are not nested stay as they are.

    Args:
        datapipe: a pipe yielding tuples, lists or dicts.
        indices: the position or key to flatten, or a list of them; ``None``
            (the default) flattens every nested column.  ``flatten(0)``
            flattens column 0 only (torchdata flattened everything, as for
            ``None``).

    Positions or keys the item does not have raise ``IndexError`` or
    ``KeyError``; flattening a dict onto a key that is already there raises
    ``ValueError`` naming the key (torchdata dropped the second value with a
    warning).

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> dp = IterableWrapper([(0, 10, (100, 1000)), (1, 11, (111, 1001)), (2, 12, (122, 1002))])
        >>> flatten_dp = dp.flatten(2)
        >>> list(flatten_dp)
        [(0, 10, 100, 1000), (1, 11, 111, 1001), (2, 12, 122, 1002)]
        >>> dp = IterableWrapper([(0, (1, 2)), (3, (4, 5)), (6, (7, 8))])
        >>> flatten_dp = dp.flatten()
        >>> list(flatten_dp)
        [(0, 1, 2), (3, 4, 5), (6, 7, 8)]
        >>> list(IterableWrapper([{"a": 1, "b": {"c": 2, "d": 3}}]).flatten("b"))
        [{'a': 1, 'c': 2, 'd': 3}]
    """

    stateless = True

    def __init__(self, datapipe: IterDataPipe, indices: Hashable | list[Hashable] | None = None) -> None:
        super().__init__()
        self.source_datapipe = datapipe
        if isinstance(indices, list) and not indices:
            raise ValueError("flatten: indices=[] flattens nothing; pass None to flatten every nested column")
        self.indices: list[Hashable] | None = None if indices is None else _index_set(indices, "indices", "flatten")

    def _flatten_dict(self, item: dict) -> dict:
        if self.indices is not None:
            _check_keys(self.indices, item, "flatten")
        chosen = None if self.indices is None else set(self.indices)
        out: dict = {}

        def put(key: Any, value: Any) -> None:
            if key in out:
                raise ValueError(f"flatten: key {key!r} would appear twice in the flattened item {_short(item)}")
            out[key] = value

        for key, value in item.items():
            if (chosen is None or key in chosen) and isinstance(value, dict):
                for sub_key, sub_value in value.items():
                    put(sub_key, sub_value)
            else:
                put(key, value)
        return out

    def _flatten(self, item: Any) -> Any:
        _check_item(item, "flatten")
        if isinstance(item, dict):
            return self._flatten_dict(item)
        positions = None if self.indices is None else {_position(i, item, "flatten") for i in self.indices}
        out: list = []
        for i, value in enumerate(item):
            if (positions is None or i in positions) and isinstance(value, tuple | list):
                out.extend(value)
            else:
                out.append(value)
        return tuple(out) if isinstance(item, tuple) else out

    def __iter__(self) -> Iterator[Any]:
        for item in self.source_datapipe:
            yield self._flatten(item)

    def __len__(self) -> int:
        return len(self.source_datapipe)  # type: ignore[arg-type]


@functional_datapipe("rows2columnar")
class Rows2Columnar(IterDataPipe[dict]):
    """Turn each batch of rows into one dict of columns (functional name: ``rows2columnar``).

    Each item is a batch (a list) of rows; each row is a dict or a list.
    For every batch, yields a ``defaultdict(list)`` mapping each column name
    to the list of that column's values, row by row, as torchdata did.

    Args:
        source_datapipe: a pipe yielding batches of rows.
        column_names: for dict rows, the keys to keep (a filter; every row
            must have them, else ``KeyError``); ``None`` keeps every key, and
            a column lists only the values of the rows that have the key.  For
            list rows, the names of the columns by position (required, and
            ordered: a list or tuple); a row with more values than names
            raises ``ValueError``.

    Stateless: each batch is converted on its own.

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> dp = IterableWrapper([[{'a': 1}, {'b': 2, 'a': 1}], [{'a': 1, 'b': 200}, {'b': 2, 'c': 3, 'a': 100}]])
        >>> row2col_dp = dp.rows2columnar()
        >>> list(row2col_dp)
        [defaultdict(<class 'list'>, {'a': [1, 1], 'b': [2]}),
         defaultdict(<class 'list'>, {'a': [1, 100], 'b': [200, 2], 'c': [3]})]
        >>> row2col_dp = dp.rows2columnar(column_names=['a'])
        >>> list(row2col_dp)
        [defaultdict(<class 'list'>, {'a': [1, 1]}), defaultdict(<class 'list'>, {'a': [1, 100]})]
        >>> dp = IterableWrapper([[[0, 1, 2, 3], [4, 5, 6, 7]]])
        >>> row2col_dp = dp.rows2columnar(column_names=["1st_in_batch", "2nd_in_batch", "3rd_in_batch", "4th_in_batch"])
        >>> list(row2col_dp)
        [defaultdict(<class 'list'>, {'1st_in_batch': [0, 4], '2nd_in_batch': [1, 5],
                                      '3rd_in_batch': [2, 6], '4th_in_batch': [3, 7]})]
    """

    stateless = True

    def __init__(self, source_datapipe: IterDataPipe, column_names: Iterable[Hashable] | None = None) -> None:
        is_names = isinstance(column_names, Iterable) and not isinstance(column_names, str | bytes)
        if column_names is not None and not is_names:
            raise TypeError(f"rows2columnar: column_names must be a list of names or None, got {column_names!r}")
        names = [] if column_names is None else list(column_names)
        for name in names:
            if not isinstance(name, Hashable):
                raise TypeError(f"rows2columnar: column names must be hashable, got {name!r}")
        self.source_datapipe = source_datapipe
        self.column_names: list[Hashable] = names
        self._ordered = column_names is None or isinstance(column_names, list | tuple)

    def _columns(self, batch: Any) -> defaultdict:
        if isinstance(batch, str | bytes | dict) or not isinstance(batch, Iterable):
            raise TypeError(f"rows2columnar: each item must be a batch (a list) of rows, got {type(batch).__name__}")
        columnar: defaultdict = defaultdict(list)
        for j, row in enumerate(batch):
            if isinstance(row, dict):
                if self.column_names:
                    for name in self.column_names:
                        if name not in row:
                            raise KeyError(
                                f"rows2columnar: row {j} of the batch has no column {name!r} (keys {list(row)!r})"
                            )
                        columnar[name].append(row[name])
                else:
                    for key, value in row.items():
                        columnar[key].append(value)
            elif isinstance(row, list | tuple):
                if not self.column_names:
                    raise ValueError(f"rows2columnar: row {j} is a {type(row).__name__}; list rows need column_names")
                if not self._ordered:
                    raise TypeError("rows2columnar: column_names must be ordered (a list or tuple) for list rows")
                if len(row) > len(self.column_names):
                    raise ValueError(
                        f"rows2columnar: row {j} has {len(row)} values but there are only "
                        f"{len(self.column_names)} column_names"
                    )
                for name, value in zip(self.column_names, row):
                    columnar[name].append(value)
            else:
                raise TypeError(f"rows2columnar: rows must be dicts or lists, row {j} is {type(row).__name__}")
        return columnar

    def __iter__(self) -> Iterator[dict]:
        for batch in self.source_datapipe:
            yield self._columns(batch)

    def __len__(self) -> int:
        return len(self.source_datapipe)  # type: ignore[arg-type]


def _default_line_join(lines: list) -> Any:
    """Join lines with newlines (``b"\\n"`` for ``bytes`` lines)."""
    return (b"\n" if isinstance(lines[0], bytes | bytearray) else "\n").join(lines)


class _Start:
    """Marks "no line seen yet" (a file name may be anything, even ``None``); pickles as itself."""

    def __reduce__(self) -> str:
        return "_START"

    def __repr__(self) -> str:
        return "<no file yet>"


_START = _Start()


@functional_datapipe("lines_to_paragraphs")
class ParagraphAggregator(ResumablePipe):
    """Join consecutive non-empty lines of the same file into paragraphs (functional name: ``lines_to_paragraphs``).

    Takes ``(file_name, line)`` items (as ``readlines`` yields them).  Lines
    accumulate while the file name stays the same and the lines are not
    empty; an empty line or a new file name ends the paragraph, which is
    yielded as ``(file_name, joiner(lines))``.  Empty lines never appear in a
    paragraph, and a run of them yields nothing.

    Args:
        source_datapipe: a pipe yielding ``(file_name, line)`` tuples.
        joiner: joins the list of a paragraph's lines; the default joins them
            with ``"\\n"`` (``b"\\n"`` for ``bytes`` lines).

    Resumable: the snapshot holds the lines of the paragraph being gathered
    and the current file name (lines are small; a paragraph is never longer
    than one run of non-empty lines).

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> source_dp = IterableWrapper(
        ...     [("file1", "Line1"), ("file1", "Line2"), ("file2", "Line2,1"), ("file2", "Line2,2"),
        ...      ("file2", "Line2,3")]
        ... )
        >>> para_agg_dp = source_dp.lines_to_paragraphs(joiner=lambda ls: " ".join(ls))
        >>> list(para_agg_dp)
        [('file1', 'Line1 Line2'), ('file2', 'Line2,1 Line2,2 Line2,3')]
        >>> list(IterableWrapper([("f", "a"), ("f", "b"), ("f", ""), ("f", "c")]).lines_to_paragraphs())
        [('f', 'a\\nb'), ('f', 'c')]
    """

    state_keys = ("buffer", "file", "started")
    _runtime = ("_buffer", "_file")  # the paragraph being gathered belongs to the running epoch

    def __init__(
        self,
        source_datapipe: IterDataPipe[tuple[str, Any]],
        joiner: Callable[[list], Any] = _default_line_join,
    ) -> None:
        if not callable(joiner):
            raise TypeError(f"lines_to_paragraphs: joiner must be callable, got {type(joiner).__name__}")
        self.source_datapipe = source_datapipe
        self.joiner = joiner
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._buffer: list = []
        self._file: Any = _START

    def state_dict(self) -> dict[str, Any]:
        started = self._file is not _START
        return {"buffer": list(self._buffer), "file": self._file if started else None, "started": started}

    def restore(self, state: dict[str, Any] | None) -> None:
        if state is None:
            self._init_runtime()
        else:
            self._buffer = list(state["buffer"])
            self._file = state["file"] if state["started"] else _START

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        for item in self.source_datapipe:
            if not isinstance(item, tuple | list) or len(item) != 2:
                raise TypeError(
                    f"lines_to_paragraphs: expected (file_name, line) tuples, got {type(item).__name__}: {_short(item)}"
                )
            file_name, line = item
            if self._file is _START:
                self._file = file_name
            if line and file_name == self._file:
                self._buffer.append(line)
                continue
            # The paragraph ends: record the new state before yielding, so a snapshot taken
            # right after the yield sees it.
            paragraph, previous = self._buffer, self._file
            self._buffer = [line] if line else []
            self._file = file_name
            if paragraph:
                yield previous, self.joiner(paragraph)
        if self._buffer:
            paragraph, self._buffer = self._buffer, []
            yield self._file, self.joiner(paragraph)
