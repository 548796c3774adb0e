"""Pipes that control how many items flow and number them.

torchdata 0.9's ``header``, ``cycle``, ``repeat``, ``enumerate``,
``add_index`` and ``set_length`` under the same class names, arguments and
outputs.  The counting pipes are resumable: their snapshot is their counter
(items let through, passes completed, the element being repeated), while the
position inside the source is the source's own state.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Hashable, Iterator
from typing import Any

from pipekit._validate import check_int
from pipekit.errors import UnsupportedItemError
from pipekit.pipes.base import IterDataPipe, functional_datapipe
from pipekit.pipes.state import ResumablePipe

__all__ = [
    "Cycler",
    "Enumerator",
    "Header",
    "IndexAdder",
    "LengthSetter",
    "Repeater",
]




@functional_datapipe("header")
class Header(ResumablePipe):
    """Yield the first ``limit`` items of the source, then stop (functional name: ``header``).

    The source is not read past the ``limit``-th item.  To declare a length
    without limiting the items, use :class:`LengthSetter`.

    Resumable: the snapshot is the number of items let through.

    Args:
        source_datapipe: the source pipe.
        limit: how many items to yield (>= 0); ``None`` yields them all.

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> list(IterableWrapper(range(10)).header(3))
        [0, 1, 2]
    """

    state_keys = ("count",)

    def __init__(self, source_datapipe: IterDataPipe, limit: int | None = 10) -> None:
        super().__init__()
        self.source_datapipe = source_datapipe
        if limit is not None:
            check_int(limit, "limit", "header", minimum=0)
        self.limit = limit
        self._len_warned = False
        self._count = 0

    def state_dict(self) -> dict[str, Any]:
        return {"count": self._count}

    def restore(self, state: dict[str, Any] | None) -> None:
        self._count = 0 if state is None else int(state["count"])

    def _done(self) -> bool:
        return self.limit is not None and self._count >= self.limit

    def __iter__(self) -> Iterator[Any]:
        if self._done():
            return
        for value in self.source_datapipe:
            self._count += 1
            yield value
            if self._done():
                return

    def __len__(self) -> int:
        try:
            source_len = len(self.source_datapipe)
        except TypeError as exc:
            if self.limit is None:
                raise TypeError(f"{type(self).__name__}: the source has no length and there is no limit") from exc
            if not self._len_warned:  # list() asks for len() every time: say it once
                self._len_warned = True
                warnings.warn(
                    f"{type(self).__name__}: the source has no length, so the length is taken to be the "
                    f"limit ({self.limit}); it is smaller if the source has fewer items",
                    stacklevel=2,
                )
            return self.limit
        return source_len if self.limit is None else min(source_len, self.limit)


@functional_datapipe("set_length")
class LengthSetter(IterDataPipe):
    """Declare the length of a pipe, returned by ``len()`` (functional name: ``set_length``).

    Useful after pipes whose length cannot be known in advance (``filter``),
    when you know it.  The items are passed through unchanged; to limit them,
    use :class:`Header`.

    Args:
        source_datapipe: the source pipe.
        length: the length to report (>= 0).  A negative length raises
            ``ValueError`` and a non-int ``TypeError``; torchdata checked it with
            an ``assert`` (an ``AssertionError``, or nothing under ``python -O``).

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> dp = IterableWrapper(range(10)).filter(lambda x: x < 5).set_length(3)
        >>> list(dp)
        [0, 1, 2, 3, 4]
        >>> len(dp)
        3
        >>> header_dp = IterableWrapper(range(10)).filter(lambda x: x < 5).header(3)
        >>> list(header_dp)
        [0, 1, 2]
        >>> len(header_dp)
        3
    """

    stateless = True

    def __init__(self, source_datapipe: IterDataPipe, length: int) -> None:
        super().__init__()
        self.source_datapipe = source_datapipe
        self.length = check_int(length, "length", "set_length", minimum=0)

    def __iter__(self) -> Iterator[Any]:
        yield from self.source_datapipe

    def __len__(self) -> int:
        return self.length


@functional_datapipe("cycle")
class Cycler(ResumablePipe):
    """Read the source again and again, ``count`` times or forever (functional name: ``cycle``).

    Each pass starts a new iterator on the source.  To repeat each element
    before moving on, use :class:`Repeater`.  A pass that yields nothing ends
    an endless cycle (rather than spinning forever on an empty source).

    Resumable: the snapshot is the number of completed passes; the position
    inside the current pass is the source's own.

    Args:
        source_datapipe: the source pipe.
        count: how many passes (>= 0); ``None`` cycles forever.

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> list(IterableWrapper(range(3)).cycle(2))
        [0, 1, 2, 0, 1, 2]
        >>> list(IterableWrapper(range(3)).cycle().header(7))
        [0, 1, 2, 0, 1, 2, 0]
    """

    state_keys = ("passes",)
    #: a shuffle buffer after it keeps its items inline in a checkpoint: re-reading through a restart of the
    #: source (another pass, with the seeds that pass drew) is not replayed exactly yet
    replayable = False
    #: each pass opens the files of the passes before it again: pipekit.DataLoader stamps the files opened in an
    #: epoch and refuses, on resume, one read before the checkpoint and changed since (pipekit.pipes._stamps)
    rereads = True

    def __init__(self, source_datapipe: IterDataPipe, count: int | None = None) -> None:
        super().__init__()
        self.source_datapipe = source_datapipe
        if count is not None:
            check_int(count, "count", "cycle", minimum=0)
        self.count = count
        self._passes = 0
        self._partial = False

    def state_dict(self) -> dict[str, Any]:
        return {"passes": self._passes}

    def restore(self, state: dict[str, Any] | None) -> None:
        self._passes = 0 if state is None else int(state["passes"])
        self._partial = state is not None  # the first pass after a restore continues a pass

    def __iter__(self) -> Iterator[Any]:
        partial = self._partial
        while self.count is None or self._passes < self.count:
            n = 0
            for value in self.source_datapipe:
                n += 1
                yield value
            if n == 0 and not partial and self.count is None:
                return
            if partial:
                # The pass a restore continued has ended: the next one starts the pipes above afresh, also those
                # it never pulled from (a shuffle that had emptied its buffer leaves a restored cycle above it
                # pending, which would otherwise continue its old position in the new pass).
                _drop_pending_above(self.source_datapipe)
            partial = False
            self._passes += 1

    def __len__(self) -> int:
        if self.count is None:
            raise TypeError(f"{type(self).__name__} cycles forever and has no length")
        return self.count * len(self.source_datapipe)


def _drop_pending_above(pipe: IterDataPipe) -> None:
    from pipekit.pipes._resume import drop_pending, pipeline_pipes  # the resume module imports the pipes

    drop_pending(pipeline_pipes(pipe))


@functional_datapipe("repeat")
class Repeater(ResumablePipe):
    """Yield each element ``times`` times before moving to the next (functional name: ``repeat``).

    The same object is yielded each time (no copy).  To repeat the whole
    source in order, use :class:`Cycler`.

    Resumable: the snapshot holds the element being repeated (it must be
    picklable) and how many times it was yielded.

    Args:
        source_datapipe: the source pipe.
        times: how many times each element is yielded (> 1, as in torchdata).

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> list(IterableWrapper(range(3)).repeat(2))
        [0, 0, 1, 1, 2, 2]
    """

    def __init__(self, source_datapipe: IterDataPipe, times: int) -> None:
        super().__init__()
        self.source_datapipe = source_datapipe
        check_int(times, "times", "repeat")
        if times <= 1:
            raise ValueError(f"repeat: times must be > 1, got {times}")
        self.times = times
        self.restore(None)

    def state_dict(self) -> dict[str, Any]:
        if not self._active:
            return {"active": False}
        return {"active": True, "item": self._item, "done": self._done}

    def restore(self, state: dict[str, Any] | None) -> None:
        active = state is not None and bool(state["active"])
        self._item: Any = state["item"] if active else None
        self._done = int(state["done"]) if active else 0
        self._active = active

    def _repeat(self, element: Any, done: int) -> Iterator[Any]:
        self._item, self._done, self._active = element, done, True
        while self._done < self.times:
            self._done += 1
            yield element

    def __iter__(self) -> Iterator[Any]:
        if self._active:  # restored in the middle of an element
            yield from self._repeat(self._item, self._done)
        for element in self.source_datapipe:
            yield from self._repeat(element, 0)

    def __len__(self) -> int:
        return self.times * len(self.source_datapipe)


@functional_datapipe("enumerate")
class Enumerator(ResumablePipe):
    """Yield ``(index, item)`` pairs, counting from ``starting_index`` (functional name: ``enumerate``).

    Resumable: the snapshot is the next index.

    Args:
        source_datapipe: the source pipe.
        starting_index: the index of the first item.

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> list(IterableWrapper(["a", "b", "c"]).enumerate())
        [(0, 'a'), (1, 'b'), (2, 'c')]
        >>> list(IterableWrapper(["a", "b"]).enumerate(starting_index=10))
        [(10, 'a'), (11, 'b')]
    """

    state_keys = ("index",)

    def __init__(self, source_datapipe: IterDataPipe, starting_index: int = 0) -> None:
        super().__init__()
        self.source_datapipe = source_datapipe
        self.starting_index = check_int(starting_index, "starting_index", "enumerate")
        self._next = self.starting_index

    def state_dict(self) -> dict[str, Any]:
        return {"index": self._next}

    def restore(self, state: dict[str, Any] | None) -> None:
        self._next = self.starting_index if state is None else int(state["index"])

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        for item in self.source_datapipe:
            index = self._next
            self._next += 1
            yield index, item

    def __len__(self) -> int:
        return len(self.source_datapipe)


@functional_datapipe("add_index")
class IndexAdder(ResumablePipe):
    """Add the item's position under the key ``index_name`` of each dict item (functional name: ``add_index``).

    Items must be dicts (rows or batches); another type raises
    :class:`~pipekit.errors.UnsupportedItemError`, a ``TypeError`` that is
    also the ``NotImplementedError`` torchdata raised.  Each yielded dict is a
    shallow copy of the input with the index added (torchdata modified the
    input in place).

    Resumable: the snapshot is the next index.

    Args:
        source_datapipe: a pipe of dicts.
        index_name: the key that receives the index.

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> dp = IterableWrapper([{"a": 1, "b": 2}, {"c": 3, "a": 1}])
        >>> list(dp.add_index("order"))
        [{'a': 1, 'b': 2, 'order': 0}, {'c': 3, 'a': 1, 'order': 1}]
    """

    state_keys = ("index",)

    def __init__(self, source_datapipe: IterDataPipe, index_name: Hashable = "index") -> None:
        super().__init__()
        self.source_datapipe = source_datapipe
        try:
            hash(index_name)
        except TypeError:
            raise TypeError(f"add_index: index_name must be hashable, got {type(index_name).__name__}") from None
        self.index_name = index_name
        self._next = 0

    def state_dict(self) -> dict[str, Any]:
        return {"index": self._next}

    def restore(self, state: dict[str, Any] | None) -> None:
        self._next = 0 if state is None else int(state["index"])

    def __iter__(self) -> Iterator[dict[Any, Any]]:
        for row in self.source_datapipe:
            if not isinstance(row, dict):
                raise UnsupportedItemError(
                    f"add_index: items must be dicts, got {type(row).__name__} at index {self._next}: {row!r:.200}"
                )
            row = copy.copy(row)
            row[self.index_name] = self._next
            self._next += 1
            yield row

    def __len__(self) -> int:
        return len(self.source_datapipe)
