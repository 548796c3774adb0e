"""Pipes that run a user function concurrently: ``threadpool_map`` on threads, ``async_map_batches`` as coroutines.

torchdata 0.9's ``threadpool_map`` and ``async_map_batches``, with the same class names, arguments and outputs,
made resumable on :mod:`pipekit.pipes.state`:

* ``threadpool_map`` records the inputs whose results are still in flight and
  submits them again after a restore;
* ``async_map_batches`` records the inputs of the current batch whose results
  were not yielded yet and runs them again after a restore.

The pipes that expand items (``flatmap``, ``shuffled_flatmap``, ``map_batches``) are in
:mod:`pipekit.pipes._mapping`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import threading
from collections import deque
from collections.abc import Callable, Hashable, Iterator, Sequence
from concurrent import futures
from typing import Any

from pipekit.pipes._callables import (
    InputCol,
    _apply_input_col,
    _check_callable,
    _fn_name,
    _validate_input_col,
)
from pipekit.pipes.base import IterDataPipe, functional_datapipe
from pipekit.pipes.state import ResumablePipe

__all__ = [
    "BatchAsyncMapper",
    "ThreadPoolMapper",
]


def _note(exc: BaseException, message: str) -> None:
    if hasattr(exc, "add_note"):  # Python >= 3.11
        exc.add_note(message)


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
