"""Pipes that apply a user function: expand items, interleave expansions, map batches, run on threads.

torchdata 0.9's ``flatmap``, ``shuffled_flatmap``, ``map_batches``,
``threadpool_map`` and ``async_map_batches``, with the same class names,
arguments and outputs, made resumable on :mod:`pipekit.pipes.state`:

* ``flatmap`` and ``map_batches`` are :class:`~pipekit.pipes.state.ExpandingPipe`:
  the checkpoint holds the input (or batch) being expanded and how many of its
  outputs were yielded, and a restored copy re-runs the function on it and
  continues where it stopped;
* ``shuffled_flatmap`` is a :class:`~pipekit.pipes.state.SeededPipe` whose
  checkpoint holds its buffer of inputs (with how many outputs each gave) and
  its generator's state;
* ``threadpool_map`` records the inputs whose results are still in flight and
  submits them again after a restore;
* ``async_map_batches`` records the inputs of the current batch whose results
  were not yielded yet and runs them again after a restore.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import itertools
import threading
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from concurrent import futures
from typing import Any

from pipekit.pipes._callables import (
    InputCol,
    _apply_input_col,
    _check_callable,
    _fn_name,
    _iter_outputs,
    _unpack,
    _validate_input_col,
)
from pipekit.pipes.base import IterDataPipe, functional_datapipe
from pipekit.pipes.state import ExpandingPipe, PendingState, ResumablePipe, ShufflingPipe

__all__ = [
    "BatchAsyncMapper",
    "BatchMapper",
    "FlatMapper",
    "ShuffledFlatMapper",
    "ThreadPoolMapper",
]


def _note(exc: BaseException, message: str) -> None:
    if hasattr(exc, "add_note"):  # Python >= 3.11
        exc.add_note(message)


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


# --------------------------------------------------------------------------- threadpool_map


def _put_result(data: Any, res: Any, input_col: InputCol, output_col: Hashable | None) -> Any:
    """``data`` with ``res`` placed by ``output_col`` (``threadpool_map``, ``async_map_batches``).

    ``None`` replaces ``input_col`` (the first of several; the others are
    removed), ``-1`` appends, a key/index sets it.  ``data`` is copied, never
    modified in place.
    """
    is_tuple = isinstance(data, tuple)
    data = list(data) if is_tuple else copy.copy(data)
    if output_col is None:
        if isinstance(input_col, (list, tuple)):
            data[input_col[0]] = res
            for idx in sorted(input_col[1:], reverse=True):
                del data[idx]
        else:
            data[input_col] = res
    elif output_col == -1:
        data.append(res)
    else:
        data[output_col] = res
    return tuple(data) if is_tuple else data


def _check_output_col(input_col: InputCol, output_col: Any, stage: str) -> Hashable | None:
    if input_col is None and output_col is not None:
        raise ValueError(f"{stage}: output_col must be None when input_col is None")
    if isinstance(output_col, (list, tuple)):
        if len(output_col) != 1:
            raise ValueError(f"{stage}: output_col must be a single index/key, got {output_col!r}")
        output_col = output_col[0]
    return output_col

_THREADPOOL_KWARGS = frozenset({"thread_name_prefix", "initializer", "initargs"})


@functional_datapipe("threadpool_map")
class ThreadPoolMapper(ResumablePipe):
    """Apply ``fn`` to each item on a thread pool, yielding results in input order.

    (functional name: ``threadpool_map``).  Up to ``scheduled_tasks`` items are
    submitted ahead of the consumer to a ``ThreadPoolExecutor`` with
    ``max_workers`` threads; results come out in the order of the inputs.  Use
    it for I/O-bound functions (downloads, remote reads) or functions that
    release the GIL.

    The pool is created when iteration starts (never in ``__init__``, so the
    pipe pickles into DataLoader workers) and shut down when the epoch ends,
    when the consumer stops early (the iterator is closed or dropped), or when
    ``fn`` raises.  An exception in ``fn`` is re-raised to the consumer when it
    reaches that item, with a note naming the item (Python >= 3.11).

    Resumable: the snapshot holds the inputs whose results were not yielded yet
    (at most ``scheduled_tasks``); a restored copy submits them again before
    reading further from its source.  ``fn`` must therefore not modify its
    input in place.  ``pause()`` is a context manager that holds the pipe at a
    safe point while a snapshot is taken.

    Args:
        source_datapipe: the source pipe.
        fn: the function; a module-level function or ``functools.partial``
            keeps the pipe picklable.
        input_col: ``None`` applies ``fn`` to the item; an index/key applies it
            to ``item[input_col]``; a list/tuple passes the selected columns as
            positional arguments.
        output_col: where the result goes when ``input_col`` is set: ``None``
            replaces ``input_col`` (the first of several; the others are
            removed), ``-1`` appends to a list/tuple, a key/index sets it.  The
            item is copied, not modified in place.
        scheduled_tasks: how many items are in flight at most (> 0); larger
            values hide more latency variance but delay the first result.
        max_workers: threads in the pool (default: ``ThreadPoolExecutor``'s).
        **threadpool_kwargs: ``thread_name_prefix``, ``initializer``,
            ``initargs`` for ``ThreadPoolExecutor``.

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> def mul_ten(x):
        ...     return x * 10
        >>> dp = IterableWrapper([(i, i) for i in range(50)])
        >>> list(dp.threadpool_map(mul_ten, input_col=1))[:4]
        [(0, 0), (1, 10), (2, 20), (3, 30)]
        >>> list(dp.threadpool_map(mul_ten, input_col=1, output_col=-1, max_workers=4))[:4]
        [(0, 0, 0), (1, 1, 10), (2, 2, 20), (3, 3, 30)]
    """

    state_keys = ("inflight",)
    _runtime = ("_lock", "_inflight", "_executor", "_resubmit")

    def __init__(
        self,
        source_datapipe: IterDataPipe,
        fn: Callable[..., Any],
        input_col: InputCol = None,
        output_col: Hashable | Sequence[Hashable] | None = None,
        scheduled_tasks: int = 128,
        max_workers: int | None = None,
        **threadpool_kwargs: Any,
    ) -> None:
        super().__init__()
        self.source_datapipe = source_datapipe
        _check_callable(fn, "threadpool_map")
        _validate_input_col(fn, input_col, "threadpool_map")
        self.fn = fn
        if isinstance(scheduled_tasks, bool) or not isinstance(scheduled_tasks, int) or scheduled_tasks <= 0:
            raise ValueError(f"threadpool_map: scheduled_tasks must be a positive int, got {scheduled_tasks!r}")
        self.scheduled_tasks = scheduled_tasks
        if max_workers is not None and (
            isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers <= 0
        ):
            raise ValueError(f"threadpool_map: max_workers must be a positive int or None, got {max_workers!r}")
        self.max_workers = max_workers
        unknown = set(threadpool_kwargs) - _THREADPOOL_KWARGS
        if unknown:
            raise TypeError(
                f"threadpool_map: unexpected ThreadPoolExecutor arguments {sorted(unknown)}; "
                f"allowed: {sorted(_THREADPOOL_KWARGS)}"
            )
        self.threadpool_kwargs = threadpool_kwargs
        self.input_col = input_col
        self.output_col = _check_output_col(input_col, output_col, "threadpool_map")
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._lock = threading.RLock()  # pause() holds it while state_dict() takes it again
        self._inflight: deque[tuple[Any, futures.Future[Any]]] = deque()
        self._executor: futures.ThreadPoolExecutor | None = None
        self._resubmit: list[Any] = []  # inputs in flight at the checkpoint, submitted again first

    @property
    def datapipe(self) -> IterDataPipe:
        """The source pipe (torchdata's name for :attr:`source_datapipe`)."""
        return self.source_datapipe

    def state_dict(self) -> dict[str, Any]:
        with self._lock:
            return {"inflight": [item for item, _ in self._inflight]}

    def restore(self, state: dict[str, Any] | None) -> None:
        self._resubmit = [] if state is None else list(state["inflight"])

    def _apply_fn(self, data: Any) -> Any:
        if self.input_col is None:
            return self.fn(data)
        return _put_result(data, _apply_input_col(self.fn, data, self.input_col), self.input_col, self.output_col)

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """Hold the pipe between two steps (no submission, no hand-over) while a snapshot is taken."""
        with self._lock:
            yield

    def __iter__(self) -> Iterator[Any]:
        kwargs = dict(self.threadpool_kwargs)
        kwargs.setdefault("thread_name_prefix", "pipekit-threadpool_map")
        executor = futures.ThreadPoolExecutor(max_workers=self.max_workers, **kwargs)
        inflight: deque[tuple[Any, futures.Future[Any]]] = deque()
        with self._lock:
            self._inflight, self._executor = inflight, executor
        try:
            for item in self._resubmit:
                with self._lock:
                    inflight.append((item, executor.submit(self._apply_fn, item)))
            source = iter(self.source_datapipe)
            exhausted = False

            def top_up() -> None:
                nonlocal exhausted
                while not exhausted and len(inflight) < self.scheduled_tasks:
                    try:
                        item = next(source)
                    except StopIteration:
                        exhausted = True
                        return
                    with self._lock:
                        inflight.append((item, executor.submit(self._apply_fn, item)))

            top_up()
            while inflight:
                item, future = inflight[0]
                try:
                    result = future.result()
                except Exception as exc:
                    _note(exc, f"threadpool_map: fn {_fn_name(self.fn)} failed on item {item!r:.200}")
                    raise
                with self._lock:
                    inflight.popleft()
                top_up()
                yield result
        finally:
            with self._lock:
                for _, future in inflight:
                    future.cancel()
                inflight.clear()
                if self._executor is executor:
                    self._executor = None
            executor.shutdown(wait=True, cancel_futures=True)

    def __len__(self) -> int:
        return len(self.source_datapipe)


# --------------------------------------------------------------------------- async_map_batches


def _is_coroutine_function(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004


def _in_running_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class _EventLoop:
    """One iterator's event loop, run in this thread or, inside a running loop (a notebook), in a helper thread."""

    def __init__(self, thread_name: str) -> None:
        self._thread_name = thread_name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._helper: futures.ThreadPoolExecutor | None = None

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        if not _in_running_loop():
            return fn(*args)
        if self._helper is None:
            self._helper = futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=self._thread_name)
        return self._helper.submit(fn, *args).result()

    def _run_now(self, coro: Any) -> Any:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(coro)

    def run(self, coro: Any) -> Any:
        """Run ``coro`` to completion on this iterator's loop and return its result."""
        return self._call(self._run_now, coro)

    def _close_now(self) -> None:
        loop, self._loop = self._loop, None
        if loop is not None:
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()

    def close(self) -> None:
        try:
            self._call(self._close_now)
        finally:
            if self._helper is not None:
                self._helper.shutdown(wait=True)
                self._helper = None


@functional_datapipe("async_map_batches")
class BatchAsyncMapper(ResumablePipe):
    """Apply a coroutine function to the items, a batch of them at a time, concurrently.

    (functional name: ``async_map_batches``; torchdata's ``BatchAsyncMapper``).
    The items are grouped into batches of ``batch_size`` (the last may be
    smaller); within a batch ``async_fn`` runs on every item concurrently on an
    :mod:`asyncio` event loop, at most ``max_concurrency`` calls at a time, and
    the results come out in the order of the inputs: one by one
    (``flatten=True``) or as one list per batch.  Use it for I/O-bound
    coroutines (HTTP requests with ``aiohttp``, async object stores).

    Each iterator creates its own event loop when it starts (never in
    ``__init__``, so the pipe pickles into DataLoader workers) and closes it at
    the end of the epoch or when the consumer stops.  Called inside a running
    loop (a notebook), the batches run on a loop in a helper thread.  An
    exception in ``async_fn`` cancels the rest of the batch and reaches the
    consumer with a note naming the item (Python >= 3.11).

    Length: ``len(source)`` with ``flatten=True``, else the number of batches.

    Differences from torchdata: with ``input_col``, each result is placed into
    a copy of the item (torchdata modified dict items in place); a
    ``batch_size`` or ``max_concurrency`` below 1 raises ``ValueError`` (torchdata
    asserted on ``batch_size`` and hung on ``max_concurrency=0``).

    Resumable: the snapshot holds the inputs of the current batch whose results
    were not yielded yet (at most ``batch_size - 1``); a restored copy runs
    ``async_fn`` on them again before reading further from its source.

    Args:
        source_datapipe: the source pipe.
        async_fn: an ``async def`` function (or a ``functools.partial`` of one);
            anything else raises ``ValueError``, as in torchdata.
        batch_size: how many items are processed concurrently (> 0).
        input_col: ``None`` passes the item; an index/key passes
            ``item[input_col]``; a list/tuple passes the selected columns as
            positional arguments.
        output_col: where the result goes when ``input_col`` is set: ``None``
            replaces ``input_col`` (the first of several; the others are
            removed), ``-1`` appends to a list/tuple, a key/index sets it.
        max_concurrency: the most calls of ``async_fn`` running at once (> 0).
        flatten: yield results one by one (``True``) or one list per batch.

    Example:
        >>> import asyncio
        >>> from pipekit.pipes import IterableWrapper
        >>> async def mul_ten(x):
        ...     await asyncio.sleep(0.001)
        ...     return x * 10
        >>> list(IterableWrapper(range(5)).async_map_batches(mul_ten, 2))
        [0, 10, 20, 30, 40]
        >>> dp = IterableWrapper([(i, i) for i in range(3)])
        >>> list(dp.async_map_batches(mul_ten, 2, input_col=1))
        [(0, 0), (1, 10), (2, 20)]
        >>> list(dp.async_map_batches(mul_ten, 2, input_col=1, output_col=-1))
        [(0, 0, 0), (1, 1, 10), (2, 2, 20)]
        >>> list(IterableWrapper(range(5)).async_map_batches(mul_ten, 2, flatten=False))
        [[0, 10], [20, 30], [40]]
    """

    state_keys = ("pending",)
    _runtime = ("_batch", "_yielded", "_resubmit")

    def __init__(
        self,
        source_datapipe: IterDataPipe,
        async_fn: Callable[..., Any],
        batch_size: int,
        input_col: InputCol = None,
        output_col: Hashable | Sequence[Hashable] | None = None,
        max_concurrency: int = 32,
        flatten: bool = True,
    ) -> None:
        super().__init__()
        self.source_datapipe = source_datapipe
        if not _is_coroutine_function(async_fn):
            raise ValueError(
                f"async_map_batches: async_fn must be a coroutine function (async def), got {type(async_fn).__name__}"
            )
        _validate_input_col(async_fn, input_col, "async_map_batches")
        self.async_fn = async_fn
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"async_map_batches: batch_size must be a positive int, got {batch_size!r}")
        self.batch_size = batch_size
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency <= 0:
            raise ValueError(f"async_map_batches: max_concurrency must be a positive int, got {max_concurrency!r}")
        self.max_concurrency = max_concurrency
        self.input_col = input_col
        self.output_col = _check_output_col(input_col, output_col, "async_map_batches")
        if not isinstance(flatten, bool):
            raise TypeError(f"async_map_batches: flatten must be a bool, got {type(flatten).__name__}")
        self.flatten = flatten
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._batch: list[Any] = []  # the inputs of the batch whose results are being yielded
        self._yielded = 0  # how many of them
        self._resubmit: list[Any] = []  # inputs whose results a checkpoint had not yielded yet

    @property
    def datapipe(self) -> IterDataPipe:
        """The source pipe (torchdata's name for :attr:`source_datapipe`)."""
        return self.source_datapipe

    def state_dict(self) -> dict[str, Any]:
        return {"pending": list(self._batch[self._yielded :])}

    def restore(self, state: dict[str, Any] | None) -> None:
        self._init_runtime()
        self._resubmit = [] if state is None else list(state["pending"])

    async def _one(self, semaphore: asyncio.Semaphore, item: Any) -> Any:
        async with semaphore:
            try:
                res = await _apply_input_col(self.async_fn, item, self.input_col)
            except Exception as exc:
                _note(exc, f"async_map_batches: async_fn {_fn_name(self.async_fn)} failed on item {item!r:.200}")
                raise
        return res if self.input_col is None else _put_result(item, res, self.input_col, self.output_col)

    async def _process(self, batch: list[Any]) -> list[Any]:
        semaphore = asyncio.Semaphore(self.max_concurrency)
        tasks = [asyncio.ensure_future(self._one(semaphore, item)) for item in batch]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    def _batches(self) -> Iterator[list[Any]]:
        if self._resubmit:
            pending, self._resubmit = self._resubmit, []
            yield pending
        batch: list[Any] = []
        for item in self.source_datapipe:
            batch.append(item)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch:
            yield batch

    def __iter__(self) -> Iterator[Any]:
        loop = _EventLoop("pipekit-async_map_batches")
        try:
            for batch in self._batches():
                results = loop.run(self._process(batch))
                if not self.flatten:
                    yield results
                    continue
                self._batch, self._yielded = batch, 0
                for res in results:
                    self._yielded += 1
                    yield res
                self._batch, self._yielded = [], 0
        finally:
            loop.close()

    def __len__(self) -> int:
        n = len(self.source_datapipe)
        return n if self.flatten else -(-n // self.batch_size)
