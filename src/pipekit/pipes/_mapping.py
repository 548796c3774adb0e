"""Pipes that apply a user function and expand its results: expand items, interleave expansions, map batches.

torchdata 0.9's ``flatmap``, ``shuffled_flatmap`` and ``map_batches``, with the same class names,
arguments and outputs, made resumable on :mod:`pipekit.pipes.state`:

* ``flatmap`` and ``map_batches`` are :class:`~pipekit.pipes.state.ExpandingPipe`:
  the checkpoint holds the input (or batch) being expanded and how many of its
  outputs were yielded, and a restored copy re-runs the function on it and
  continues where it stopped;
* ``shuffled_flatmap`` is a :class:`~pipekit.pipes.state.SeededPipe` whose
  checkpoint holds its buffer of inputs (with how many outputs each gave) and
  its generator's state.

``threadpool_map`` and ``async_map_batches`` (``ThreadPoolMapper``, ``BatchAsyncMapper``), which run the function
concurrently, are in :mod:`pipekit.pipes._concurrent_map`; this module re-exports them.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from pipekit.pipes._callables import (
    InputCol,
    _apply_input_col,
    _check_callable,
    _iter_outputs,
    _unpack,
    _validate_input_col,
)
from pipekit.pipes._concurrent_map import BatchAsyncMapper, ThreadPoolMapper  # re-exported: their former home
from pipekit.pipes.base import IterDataPipe, functional_datapipe
from pipekit.pipes.state import ExpandingPipe, PendingState, ShufflingPipe

__all__ = [
    "BatchAsyncMapper",
    "BatchMapper",
    "FlatMapper",
    "ShuffledFlatMapper",
    "ThreadPoolMapper",
]


# --------------------------------------------------------------------------- flatmap


@functional_datapipe("flatmap")
class FlatMapper(ExpandingPipe):
    """Apply ``fn`` to each item and yield the items of the iterable it returns (functional name: ``flatmap``).

    With ``fn=None`` each item (which must be iterable) is flattened one level.

    Resumable: the snapshot holds the input being expanded and how many of its
    outputs were yielded; a restored copy calls ``fn`` on that input again and
    skips them, so ``fn`` must be deterministic and the input picklable.

    Args:
        datapipe: the source pipe.
        fn: returns an iterable for each item (or, with ``input_col``, for the
            selected column(s)); ``None`` flattens the items themselves.
        input_col: ``None`` applies ``fn`` to the item; an index/key applies it
            to ``item[input_col]``; a list/tuple of them passes each selected
            column as a positional argument.

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> def fn(e):
        ...     return [e, e * 10]
        >>> list(IterableWrapper(list(range(5))).flatmap(fn))
        [0, 0, 1, 10, 2, 20, 3, 30, 4, 40]
        >>> list(IterableWrapper([[1, 2, 3], [4, 5, 6]]).flatmap())
        [1, 2, 3, 4, 5, 6]
        >>> list(IterableWrapper([{"id": 1, "words": ["a", "b"]}]).flatmap(input_col="words"))
        ['a', 'b']
    """

    def __init__(
        self, datapipe: IterDataPipe, fn: Callable[..., Iterable[Any]] | None = None, input_col: InputCol = None
    ) -> None:
        super().__init__()
        self.source_datapipe = datapipe
        if fn is None:
            fn = _unpack
        _check_callable(fn, "flatmap")
        _validate_input_col(fn, input_col, "flatmap")
        self.fn = fn
        self.input_col = input_col
        self._init_runtime()

    @property
    def datapipe(self) -> IterDataPipe:
        """The source pipe (torchdata's name for :attr:`source_datapipe`)."""
        return self.source_datapipe

    def _outputs(self, item: Any) -> Iterable[Any]:
        return _apply_input_col(self.fn, item, self.input_col)

    def __iter__(self) -> Iterator[Any]:
        yield from self._expand_all(self.source_datapipe)

    def __len__(self) -> int:
        raise TypeError(f"{type(self).__name__}'s length depends on the outputs of its function")


# --------------------------------------------------------------------------- shuffled_flatmap


def _fresh_copy(pipe: IterDataPipe) -> Any:
    """A copy of ``pipe``'s pipeline that starts a new epoch, to read it without moving ``pipe``.

    Iterating ``pipe`` itself would invalidate an iterator running on it and
    consume a checkpoint loaded into it (or its upstream) and not yet applied;
    the copy's pending checkpoints are dropped.  Pipes that cannot be copied
    are read as they are (as torchdata did).
    """
    from pipekit.pipes._resume import pipeline_pipes  # resume imports the pipe modules

    try:
        fresh = copy.deepcopy(pipe)
    except Exception:
        return pipe
    for dp in pipeline_pipes(fresh):
        if isinstance(dp, PendingState):
            dp._pending = None
    return fresh


class _Entry:
    """One input in the shuffled_flatmap buffer: the input, how many outputs were taken, its iterator."""

    __slots__ = ("consumed", "item", "iterator")

    def __init__(self, item: Any, consumed: int = 0, iterator: Iterator[Any] | None = None) -> None:
        self.item = item
        self.consumed = consumed
        self.iterator = iterator


@functional_datapipe("shuffled_flatmap")
class ShuffledFlatMapper(ShufflingPipe):
    """Like ``flatmap``, but interleaves the outputs of up to ``buffer_size`` inputs at random.

    (functional name: ``shuffled_flatmap``).  ``fn`` is applied to each input
    and the iterables it returns are kept in a buffer; once the buffer is full,
    each step yields the next output of a randomly chosen iterable, and a new
    input joins the buffer when one runs out.  The outputs of one input keep
    their order.  The same algorithm and random draws as torchdata, so a seeded
    run gives torchdata's output.

    Seeding: ``set_seed(seed)`` (called by the DataLoader with its shared seed)
    fixes the next epoch's order; otherwise a seed is drawn from ``torch`` at
    the start of each epoch, like torch's ``Shuffler``.  ``set_shuffle(False)``
    turns it into a plain ``flatmap`` (a pending seed then waits for the next
    shuffled epoch).

    Resumable: the snapshot holds the buffered inputs with the number of
    outputs taken from each and the RNG state; a restored copy re-applies
    ``fn`` to the buffered inputs and skips the outputs already yielded.

    Length: with ``fn=None``, ``len()`` is the sum of the lengths of the items
    (of their ``input_col`` columns), as in torchdata; it reads the whole source
    to find it (a copy of it, so a running epoch or a pending resume is not
    disturbed).  torchdata summed the lengths of the whole items even with
    ``input_col``.  With a function the length is unknown (``TypeError``).

    Args:
        datapipe: the source pipe.
        fn: returns an iterable for each item; ``None`` flattens the items.
        input_col: as for ``flatmap``.
        buffer_size: how many inputs' iterables are interleaved (> 0; otherwise
            ``ValueError``, where torchdata used an ``assert``).

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> dp = IterableWrapper([[1, 2, 3, 4], "abcd", "ABCD"]).shuffled_flatmap(buffer_size=2)
        >>> list(dp.set_seed(0))
        ['a', 'b', 1, 'c', 'd', 'A', 'B', 'C', 2, 3, 'D', 4]
        >>> sorted(map(str, dp)) == sorted(map(str, [1, 2, 3, 4, *"abcdABCD"]))
        True
    """

    state_keys = ("buffer", "has_pending", "pending", "idx", "source_done", "enabled")
    _runtime = ("_buffer", "_held", "_has_held", "_idx", "_source_done")

    def __init__(
        self,
        datapipe: IterDataPipe,
        fn: Callable[..., Iterable[Any]] | None = None,
        input_col: InputCol = None,
        buffer_size: int = 100,
    ) -> None:
        super().__init__()
        self.source_datapipe = datapipe
        if fn is None:
            fn = _unpack
        _check_callable(fn, "shuffled_flatmap")
        _validate_input_col(fn, input_col, "shuffled_flatmap")
        if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size <= 0:
            raise ValueError(f"shuffled_flatmap: buffer_size must be a positive int, got {buffer_size!r}")
        self.fn = fn
        self.input_col = input_col
        self.buffer_size = buffer_size
        self._enabled = True
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._buffer: list[_Entry] = []
        self._held: Any = None  # the input read from upstream that waits for room in the buffer
        self._has_held = False
        self._idx = 0  # the buffered input the next output is taken from
        self._source_done = False

    @property
    def datapipe(self) -> IterDataPipe:
        """The source pipe (torchdata's name for :attr:`source_datapipe`)."""
        return self.source_datapipe

    def state_dict(self) -> dict[str, Any]:
        return {
            "buffer": [(e.item, e.consumed) for e in self._buffer],
            "has_pending": self._has_held,
            "pending": self._held,
            "idx": self._idx,
            "source_done": self._source_done,
            "enabled": self._enabled,
        }

    def restore(self, state: dict[str, Any] | None) -> None:
        self._init_runtime()
        if state is None:
            self._idx = self._randint(self._capacity() - 1)
            return
        self._buffer = [_Entry(item, int(consumed)) for item, consumed in state["buffer"]]
        self._has_held = bool(state["has_pending"])
        self._held = state["pending"]
        self._idx = int(state["idx"])
        self._source_done = bool(state["source_done"])
        self._enabled = bool(state["enabled"])

    def _randint(self, high: int) -> int:
        return self.rng.randint(0, high) if self._enabled else 0

    def _capacity(self) -> int:
        return self.buffer_size if self._enabled else 1

    def _entry_iter(self, entry: _Entry) -> Iterator[Any]:
        if entry.iterator is None:
            it = _iter_outputs(_apply_input_col(self.fn, entry.item, self.input_col), "shuffled_flatmap", entry.item)
            for _ in itertools.islice(it, entry.consumed):
                pass
            entry.iterator = it
        return entry.iterator

    def __iter__(self) -> Iterator[Any]:
        source = iter(self.source_datapipe) if not self._source_done else iter(())
        while True:
            if not self._source_done:
                if not self._has_held:
                    try:
                        self._held = next(source)
                    except StopIteration:
                        self._source_done = True
                        continue
                    self._has_held = True
                if len(self._buffer) >= self._capacity():
                    entry = self._buffer[self._idx]
                    try:
                        value = next(self._entry_iter(entry))
                    except StopIteration:
                        self._buffer.pop(self._idx)
                        continue
                    entry.consumed += 1
                    self._idx = self._randint(self._capacity() - 1)
                    yield value
                    continue
                item, self._held, self._has_held = self._held, None, False
                self._buffer.append(_Entry(item))
                self._entry_iter(self._buffer[-1])  # apply fn now, as torchdata does
            else:
                if not self._buffer:
                    return
                self._idx = self._randint(len(self._buffer) - 1)
                entry = self._buffer[self._idx]
                try:
                    value = next(self._entry_iter(entry))
                except StopIteration:
                    self._buffer.pop(self._idx)
                    continue
                entry.consumed += 1
                yield value

    def __len__(self) -> int:
        if self.fn is not _unpack:
            raise TypeError(f"{type(self).__name__}'s length depends on the outputs of its function")
        total = 0
        for i, item in enumerate(_fresh_copy(self.source_datapipe)):
            outputs = _apply_input_col(self.fn, item, self.input_col)
            try:
                total += len(outputs)
            except TypeError:
                raise TypeError(
                    f"{type(self).__name__}'s length is unknown: item {i} has no length ({type(outputs).__name__})"
                ) from None
        return total


# --------------------------------------------------------------------------- map_batches


@functional_datapipe("map_batches")
class BatchMapper(ExpandingPipe):
    """Group items into batches, apply ``fn`` to each batch, and yield the items it returns.

    (functional name: ``map_batches``).  ``fn`` receives a list of up to
    ``batch_size`` items (the last batch may be smaller) and returns an
    iterable of outputs, not necessarily as many as it received; use it for
    vectorised functions.

    Resumable: the snapshot holds the current batch's inputs and how many of
    its outputs were yielded; a restored copy calls ``fn`` on that batch again.

    Args:
        datapipe: the source pipe.
        fn: maps a list of items to an iterable of outputs.
        batch_size: items per call (> 0; otherwise ``ValueError``, where torchdata
            used an ``assert``).
        input_col: ``None`` passes the items; an index/key passes
            ``[item[input_col] for item in batch]``; a list/tuple passes
            ``[[item[c] for c in input_col] for item in batch]``.

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> def fn(batch):
        ...     return [d + 1 for d in batch]
        >>> list(IterableWrapper(list(range(5))).map_batches(fn, batch_size=3))
        [1, 2, 3, 4, 5]
    """

    def __init__(
        self,
        datapipe: IterDataPipe,
        fn: Callable[[list[Any]], Iterable[Any]],
        batch_size: int,
        input_col: InputCol = None,
    ) -> None:
        super().__init__()
        self.source_datapipe = datapipe
        _check_callable(fn, "map_batches")
        _validate_input_col(fn, input_col, "map_batches", nargs=1)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"map_batches: batch_size must be a positive int, got {batch_size!r}")
        self.fn = fn
        self.batch_size = batch_size
        self.input_col = input_col
        self._init_runtime()

    @property
    def datapipe(self) -> IterDataPipe:
        """The source pipe (torchdata's name for :attr:`source_datapipe`)."""
        return self.source_datapipe

    def _outputs(self, batch: list[Any]) -> Iterable[Any]:
        if self.input_col is None:
            return self.fn(batch)
        if isinstance(self.input_col, (list, tuple)):
            return self.fn([[data[col] for col in self.input_col] for data in batch])
        return self.fn([data[self.input_col] for data in batch])

    def _batches(self) -> Iterator[list[Any]]:
        batch: list[Any] = []
        for item in self.source_datapipe:
            batch.append(item)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch:
            yield batch

    def __iter__(self) -> Iterator[Any]:
        yield from self._expand_all(self._batches())

    def __len__(self) -> int:
        raise TypeError(f"{type(self).__name__}'s length depends on the outputs of its function")
