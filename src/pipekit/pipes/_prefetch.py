"""Background prefetching: ``prefetch`` and ``pin_memory``.

A :class:`Prefetcher` runs its upstream pipeline in a background thread that
stays up to ``buffer_size`` items ahead of the consumer.  The thread is
created when iteration starts (never in ``__init__``, so the pipe pickles into
DataLoader workers) and stops when the epoch ends, when the consumer stops
early (the iterator is closed or garbage-collected), when a new epoch starts
and on error.

Checkpointing: :meth:`Prefetcher.pause` parks the thread between two items,
and the items it fetched that the consumer has not received yet are part of
``state_dict()``, so a restored pipe yields them again before pulling more
from upstream (whose own state is taken at the same moment).
"""

from __future__ import annotations

import collections.abc
import contextlib
import logging
import numbers
import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import torch

from pipekit.pipes.base import IterDataPipe, functional_datapipe
from pipekit.pipes.state import ResumablePipe

__all__ = ["PinMemory", "Prefetcher"]

logger = logging.getLogger("pipekit")

_ITEM = 0
_ERROR = 1

_told_no_cuda = False  # PinMemory logs the absence of CUDA once per process


class _Run:
    """The state shared by one epoch's consumer and its background thread."""

    def __init__(self, buffer_size: int, restored: list[Any]) -> None:
        self.cond = threading.Condition()
        self.buffer: deque[tuple[int, Any]] = deque()  # fetched, not yet consumed
        self.restored: deque[Any] = deque(restored)  # restored items the thread has not re-fetched yet
        self.buffer_size = buffer_size
        self.stop = False  # asked to stop
        self.done = False  # the thread finished (exhausted, error or stopped)
        self.busy = False  # the thread is inside upstream's next() or the transform
        self.pauses = 0
        self.thread: threading.Thread | None = None


def _worker(run: _Run, source: IterDataPipe, transform: Callable[[Any], Any] | None) -> None:
    it: Iterator[Any] | None = None
    try:
        while True:
            with run.cond:
                while not run.stop and (run.pauses or len(run.buffer) >= run.buffer_size):
                    run.cond.wait()
                if run.stop:
                    return
                run.busy = True
                from_restored = bool(run.restored)
                item = run.restored.popleft() if from_restored else None
            entry: tuple[int, Any] | None
            try:
                if not from_restored:
                    if it is None:
                        it = iter(source)
                    item = next(it)
                entry = (_ITEM, transform(item) if transform is not None else item)
            except StopIteration:
                entry = None
            except BaseException as exc:  # forwarded to the consumer, in order
                entry = (_ERROR, exc)
            with run.cond:
                run.busy = False
                if entry is not None:
                    run.buffer.append(entry)
                if entry is None or entry[0] == _ERROR:
                    run.done = True
                run.cond.notify_all()
                if run.done:
                    return
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            try:
                close()  # run upstream generators' cleanup in the thread that iterated them
            except Exception:  # cleanup must not mask the consumer's outcome
                logger.exception("prefetch: error while closing the upstream iterator")
        with run.cond:
            run.busy = False
            run.done = True
            run.cond.notify_all()


@functional_datapipe("prefetch")
class Prefetcher(ResumablePipe):
    """Fetch items ahead of time in a background thread (functional name: ``prefetch``).

    The upstream pipeline (its I/O, decoding...) runs in a thread that keeps up
    to ``buffer_size`` items ready; items come out in upstream order.  An
    exception raised upstream is re-raised to the consumer after the items
    fetched before it.  The thread is started lazily by the first ``next()``
    and stopped at the end of the epoch, on error, and when the consumer
    stops early (closing or dropping the iterator); a new epoch stops the
    previous epoch's thread first.

    For checkpointing, :meth:`pause` parks the thread between two items, and
    ``state_dict()`` holds the fetched items not yet consumed: a restored copy
    yields them first, then continues upstream.  Those items are pickled into
    the checkpoint, so prefetch before expensive decoding to keep it small.

    Args:
        source_datapipe: the pipe to read ahead of.
        buffer_size: the most items held ready.

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> list(IterableWrapper(range(5)).prefetch(buffer_size=2))
        [0, 1, 2, 3, 4]
    """

    _thread_name = "pipekit-prefetch"
    state_keys = ("buffer",)
    _runtime = ("_run",)  # the epoch's thread and buffer stay in this process

    def __init__(self, source_datapipe: IterDataPipe, buffer_size: int = 10) -> None:
        if isinstance(buffer_size, bool) or not isinstance(buffer_size, numbers.Integral):
            raise TypeError(f"{self._stage()}: buffer_size must be an int, got {type(buffer_size).__name__}")
        if buffer_size <= 0:
            raise ValueError(f"{self._stage()}: buffer_size must be positive, got {buffer_size}")
        self.source_datapipe = source_datapipe
        self.buffer_size = int(buffer_size)
        self._restored: list[Any] = []  # a checkpoint's fetched items, yielded before upstream's next ones
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._run: _Run | None = None

    @classmethod
    def _stage(cls) -> str:
        return getattr(cls, "functional_name", "prefetch")

    def _transform(self) -> Callable[[Any], Any] | None:
        """A function applied to each item in the thread (None: items pass unchanged)."""
        return None

    def restore(self, state: dict[str, Any] | None) -> None:
        self._shutdown()  # a new epoch stops the previous epoch's thread
        self._restored = list(state["buffer"]) if state is not None else []

    def _shutdown(self, run: _Run | None = None) -> None:
        run = run if run is not None else self._run
        if run is None:
            return
        with run.cond:
            run.stop = True
            run.cond.notify_all()
        thread = run.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=60)
            if thread.is_alive():
                logger.warning(
                    "%s: the background thread is still inside upstream's next() after 60 s; "
                    "it will exit when that call returns",
                    self._stage(),
                )
        if self._run is run:
            self._run = None

    def __iter__(self) -> Iterator[Any]:
        self._shutdown()
        run = _Run(self.buffer_size, self._restored)
        self._restored = []  # the run holds them now
        run.thread = threading.Thread(
            target=_worker, args=(run, self.source_datapipe, self._transform()), name=self._thread_name, daemon=True
        )
        self._run = run
        run.thread.start()
        try:
            while True:
                with run.cond:
                    while not run.buffer and not run.done:
                        run.cond.wait()
                    if not run.buffer:
                        return
                    kind, value = run.buffer.popleft()
                    run.cond.notify_all()
                if kind == _ERROR:
                    raise value
                yield value
        finally:
            self._shutdown(run)

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """Park the background thread between two items while the block runs.

        Waits for an upstream ``next()`` in progress to return.  Re-entrant; a
        no-op when no epoch is running.
        """
        run = self._run
        if run is None:
            yield
            return
        with run.cond:
            run.pauses += 1
            while run.busy:
                run.cond.wait()
        try:
            yield
        finally:
            with run.cond:
                run.pauses -= 1
                run.cond.notify_all()

    def state_dict(self) -> dict[str, Any]:
        run = self._run
        if run is None:
            return {"buffer": []}
        with self.pause(), run.cond:
            items = [value for kind, value in run.buffer if kind == _ITEM]
            items.extend(run.restored)
        return {"buffer": items}

    def __len__(self) -> int:
        return len(self.source_datapipe)


def _pin_tensor(tensor: torch.Tensor, device: torch.device | str | int | None) -> torch.Tensor:
    if tensor.is_cuda or tensor.is_pinned():
        return tensor
    return tensor.pin_memory() if device is None else tensor.pin_memory(device)


def pin_memory_fn(data: Any, device: torch.device | str | int | None = None) -> Any:
    """Copy the tensors in ``data`` to pinned (page-locked) memory.

    Walks dicts, namedtuples, tuples and lists, keeping their types; objects
    with a ``pin_memory()`` method (e.g. custom batch classes) are asked to pin
    themselves; strings, bytes and other objects are returned unchanged.
    Needs an accelerator (CUDA): :class:`PinMemory` only calls it when
    ``torch.cuda.is_available()``.
    """
    if isinstance(data, torch.Tensor):
        return _pin_tensor(data, device)
    if isinstance(data, (str, bytes)):
        return data
    if isinstance(data, collections.abc.Mapping):
        pinned = {k: pin_memory_fn(v, device) for k, v in data.items()}
        try:
            return type(data)(pinned)  # type: ignore[call-arg]
        except TypeError:
            return pinned
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # namedtuple
        return type(data)(*(pin_memory_fn(v, device) for v in data))
    if isinstance(data, (tuple, list)):
        items = [pin_memory_fn(v, device) for v in data]
        try:
            return type(data)(items)
        except TypeError:
            return items
    pin = getattr(data, "pin_memory", None)
    if callable(pin):
        return pin() if device is None else pin(device)
    return data


class _Pinner:
    """The picklable transform of :class:`PinMemory`."""

    def __init__(self, fn: Callable[..., Any], device: Any) -> None:
        self.fn = fn
        self.device = device

    def __call__(self, item: Any) -> Any:
        return self.fn(item, self.device)


@functional_datapipe("pin_memory")
class PinMemory(Prefetcher):
    """Prefetch items and copy their tensors to pinned memory (functional name: ``pin_memory``).

    A :class:`Prefetcher` with a buffer of 2 items whose background thread
    applies ``pin_memory_fn(item, device)`` to each item, so host-to-GPU copies
    with ``non_blocking=True`` overlap with compute.  The default function pins
    every tensor in (nested) dicts, tuples, namedtuples and lists.

    Pinning needs CUDA.  Unlike torchdata (which raised in the constructor),
    on a machine where ``torch.cuda.is_available()`` is False the default
    ``pin_memory_fn`` is not called and items pass through unchanged (logged
    once per process at INFO level), so the same pipeline runs on CPU-only machines.  A
    custom ``pin_memory_fn`` is always called, with ``device`` as given.

    Keep this pipe in the process that feeds the GPU: pinned memory does not
    survive the transfer from a DataLoader worker process, so use it with
    ``num_workers=0`` or prefer ``DataLoader(pin_memory=True)``.

    Args:
        source_datapipe: the pipe whose items are pinned.
        device: passed to ``pin_memory_fn``; None pins for the current accelerator.
        pin_memory_fn: ``fn(item, device) -> item``.

    Example:
        >>> import torch
        >>> from pipekit.pipes import IterableWrapper
        >>> batches = list(IterableWrapper([{"x": torch.ones(2)}]).pin_memory())
        >>> batches[0]["x"].is_pinned() == torch.cuda.is_available()
        True
    """

    _thread_name = "pipekit-pin-memory"

    def __init__(
        self,
        source_datapipe: IterDataPipe,
        device: torch.device | str | int | None = None,
        pin_memory_fn: Callable[[Any, Any], Any] = pin_memory_fn,
    ) -> None:
        if not callable(pin_memory_fn):
            raise TypeError(f"pin_memory: pin_memory_fn must be callable, got {type(pin_memory_fn).__name__}")
        super().__init__(source_datapipe, buffer_size=2)
        self.device = device
        self.pin_memory_fn = pin_memory_fn

    def is_replicable(self) -> bool:
        return False

    def _transform(self) -> Callable[[Any], Any] | None:
        global _told_no_cuda
        if self.pin_memory_fn is pin_memory_fn and not torch.cuda.is_available():
            if not _told_no_cuda:
                _told_no_cuda = True
                logger.info("pin_memory: CUDA is not available; items pass through unpinned")
            return None
        return _Pinner(self.pin_memory_fn, self.device)
