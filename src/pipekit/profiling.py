"""Where does a pipeline spend its time?  Per-stage timing of a pipe graph.

:func:`profile_pipeline` pulls batches from a pipe in this process and
reports, for every pipe of its graph, the time spent in that pipe's own code:
the time inside its ``__next__`` *minus* the time inside the ``__next__`` of
the pipes it pulled from.  The stage that holds the most time is the one to
speed up (or to parallelise)::

    >>> from pipekit.pipes import IterableWrapper
    >>> from pipekit.profiling import profile_pipeline
    >>> pipe = IterableWrapper(range(64)).map(str).batch(8)
    >>> report = profile_pipeline(pipe, batches=4, warmup=0)
    >>> [s.name for s in report.stages]
    ['IterableWrapper', 'map(str)', 'batch']
    >>> report.batches, report.samples, [s.items for s in report.stages]
    (4, 32, [32, 32, 4])

How it works: :func:`instrument_pipeline` walks the graph
(:func:`pipekit.pipes._resume.pipeline_pipes`) and switches each pipe's class,
for the duration of the ``with`` block, to a subclass whose ``__iter__``
wraps the iterator in a timer (map-style pipes: ``__getitem__``).  Calls nest
the way pipes pull from each other, so a per-thread stack separates a pipe's
own time from its upstream's.  Nothing else about the pipes changes, and the
classes are restored on exit.

Caveats: the timings are of one process.  In a multi-worker ``DataLoader``
each worker runs its own copy of the pipeline; profile with the pipe itself
(as here) to find the slow stage, and measure the end-to-end rate with workers
separately (``pipekit bench`` does both).  Pipes that pull from their
upstream on threads of their own (``prefetch``, ``threadpool_map``) count
their waiting time as their own, and their upstream's time is measured on
those threads, so the per-stage times can add up to more than the wall time.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from pipekit.pipes._resume import pipeline_pipes
from pipekit.pipes.base import IterDataPipe, MapDataPipe

__all__ = ["StageProfile", "PipelineProfile", "instrument_pipeline", "profile_pipeline", "stage_name"]


@dataclass
class StageProfile:
    """The time one pipe of a pipeline spent producing its items.

    Attributes:
        name: the stage's name: its functional name (``"map(decode)"`` with the
            function for ``map``/``filter``/``collate``), or its class name for
            source pipes that have none.
        pipe: the pipe's class name.
        items: items the pipe produced (``__next__`` calls that returned an item,
            or ``__getitem__`` calls for map-style pipes).
        self_seconds: time in the pipe's own code, excluding the pipes it pulled from.
        total_seconds: time in the pipe including its upstream.
        depth: the pipe's distance from the pipeline's last pipe (0 for the last).
    """

    name: str
    pipe: str
    items: int = 0
    self_seconds: float = 0.0
    total_seconds: float = 0.0
    depth: int = 0

    @property
    def ms_per_item(self) -> float:
        """Own time per item produced, in milliseconds (NaN before any item)."""
        return 1000.0 * self.self_seconds / self.items if self.items else float("nan")

    def _reset(self) -> None:
        self.items = 0
        self.self_seconds = 0.0
        self.total_seconds = 0.0


@dataclass
class PipelineProfile:
    """What :func:`profile_pipeline` measured.

    Attributes:
        stages: one :class:`StageProfile` per pipe, from the sources to the last pipe.
        batches: items (batches) taken from the last pipe, after the warm-up.
        samples: samples in those batches (the length of each batch's first
            tensor or list; equal to ``batches`` when batches have no length).
        seconds: wall time of those batches.
        epochs: how many times the pipe was (re)started.
    """

    stages: list[StageProfile] = field(default_factory=list)
    batches: int = 0
    samples: int = 0
    seconds: float = 0.0
    epochs: int = 0

    @property
    def batches_per_second(self) -> float:
        return self.batches / self.seconds if self.seconds > 0 else float("nan")

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else float("nan")

    @property
    def slowest(self) -> StageProfile | None:
        """The stage with the most own time (``None`` if nothing was timed)."""
        timed = [s for s in self.stages if s.self_seconds > 0]
        return max(timed, key=lambda s: s.self_seconds) if timed else None

    def table(self) -> str:
        """The per-stage breakdown as a text table, sources first, the slowest stage marked."""
        total = sum(s.self_seconds for s in self.stages)
        slowest = self.slowest
        rows = [("#", "stage", "pipe", "items", "own s", "share", "ms/item", "")]
        for i, s in enumerate(self.stages, 1):
            share = 100.0 * s.self_seconds / total if total > 0 else 0.0
            per = f"{s.ms_per_item:.3f}" if s.items else "-"
            mark = "<- slowest" if s is slowest else ""
            rows.append((str(i), s.name, s.pipe, str(s.items), f"{s.self_seconds:.3f}", f"{share:.1f}%", per, mark))
        return format_table(rows, align="rllrrrrl")

    def summary(self) -> str:
        """One line: batches, samples, time and rates."""
        return (
            f"{self.batches} batches ({self.samples} samples) in {self.seconds:.3f} s: "
            f"{self.batches_per_second:.2f} batches/s, {self.samples_per_second:.1f} samples/s"
        )

    def as_dict(self) -> dict[str, Any]:
        """Plain data (for JSON)."""
        return {
            "batches": self.batches,
            "samples": self.samples,
            "seconds": self.seconds,
            "epochs": self.epochs,
            "stages": [
                {"name": s.name, "pipe": s.pipe, "items": s.items, "self_seconds": s.self_seconds,
                 "total_seconds": s.total_seconds, "depth": s.depth}
                for s in self.stages
            ],
        }

    def __str__(self) -> str:
        return f"{self.summary()}\n{self.table()}"


def format_table(rows: Sequence[Sequence[str]], align: str | None = None) -> str:
    """Rows of strings as aligned columns (``align``: ``l``/``r`` per column); the first row is the header.

    Example:
        >>> print(format_table([("name", "n"), ("a", "1"), ("bb", "22")], align="lr"))
        name   n
        ----  --
        a      1
        bb    22
    """
    if not rows:
        return ""
    ncols = max(len(r) for r in rows)
    rows = [list(r) + [""] * (ncols - len(r)) for r in rows]
    widths = [max(len(r[c]) for r in rows) for c in range(ncols)]
    align = (align or "l" * ncols).ljust(ncols, "l")

    def line(r: Sequence[str]) -> str:
        cells = [r[c].rjust(widths[c]) if align[c] == "r" else r[c].ljust(widths[c]) for c in range(ncols)]
        return "  ".join(cells).rstrip()

    out = [line(rows[0]), "  ".join("-" * w for w in widths).rstrip()]
    out.extend(line(r) for r in rows[1:])
    return "\n".join(out)


# --------------------------------------------------------------------------------------- names


def _registry_names() -> dict[type, str]:
    names: dict[type, str] = {}
    for registry in (IterDataPipe.functions, MapDataPipe.functions):
        for name, fn in registry.items():
            for arg in getattr(fn, "args", ()):
                if isinstance(arg, type):
                    names.setdefault(arg, name)
                    break
    return names


def _callable_name(fn: Any) -> str | None:
    if fn is None:
        return None
    if isinstance(fn, torch.nn.Module) or not hasattr(fn, "__name__"):
        target = getattr(fn, "func", None)  # functools.partial
        if target is not None and not isinstance(fn, torch.nn.Module):
            return _callable_name(target)
        return type(fn).__name__
    return getattr(fn, "__qualname__", None) or fn.__name__


def stage_name(pipe: Any, names: Mapping[type, str] | None = None) -> str:
    """A readable name for a pipe: its functional name (with its function for map/filter/collate).

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> stage_name(IterableWrapper([1]).map(abs).batch(2))
        'batch'
        >>> stage_name(IterableWrapper([1]).map(abs))
        'map(abs)'
        >>> stage_name(IterableWrapper([1]))
        'IterableWrapper'
    """
    names = _registry_names() if names is None else names
    cls = type(pipe)
    name = None
    for klass in cls.__mro__:
        if klass in names:
            name = names[klass]
            break
        if klass in (IterDataPipe, MapDataPipe, object):
            break
    if name is None:  # a private subclass (a recipe's own source) shows as its first public ancestor
        return next((k.__name__ for k in cls.__mro__ if not k.__name__.startswith("_")), cls.__name__)
    if name in ("map", "filter", "collate", "flatmap", "map_batches", "threadpool_map"):
        fn = next((getattr(pipe, a) for a in ("fn", "filter_fn", "collate_fn") if getattr(pipe, a, None)), None)
        fn_name = _callable_name(fn)
        if fn_name and fn_name != "default_collate":
            return f"{name}({fn_name})"
    return name


# --------------------------------------------------------------------------------- instrumenting

_local = threading.local()
_records: dict[int, StageProfile] = {}
_records_lock = threading.Lock()
_subclasses: dict[type, type] = {}


def _stack() -> list[float]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def _timed_call(record: StageProfile, fn: Callable[[], Any], counts: bool) -> Any:
    """Run ``fn()``, adding its time (minus nested timed calls) to ``record``."""
    stack = _stack()
    stack.append(0.0)
    start = time.perf_counter()
    ok = False
    try:
        out = fn()
        ok = True
        return out
    finally:
        elapsed = time.perf_counter() - start
        nested = stack.pop()
        record.self_seconds += elapsed - nested
        record.total_seconds += elapsed
        if ok and counts:
            record.items += 1
        if stack:
            stack[-1] += elapsed


class _TimedIterator(Iterator[Any]):
    """An iterator of an instrumented pipe: times each ``__next__``."""

    __slots__ = ("_it", "_record")

    def __init__(self, it: Iterator[Any], record: StageProfile) -> None:
        self._it = it
        self._record = record

    def __iter__(self) -> _TimedIterator:
        return self

    def __next__(self) -> Any:
        return _timed_call(self._record, self._it.__next__, True)

    def __getattr__(self, name: str) -> Any:  # send(), close()... of the wrapped iterator
        return getattr(self._it, name)


def _record_of(pipe: Any) -> StageProfile | None:
    return _records.get(id(pipe))


def _timed_subclass(cls: type) -> type:
    """A subclass of ``cls`` whose iterators (or ``__getitem__``) are timed; same layout, same name."""
    sub = _subclasses.get(cls)
    if sub is not None:
        return sub
    # Created without __iter__ in the namespace so torch's metaclass does not hook it a second
    # time (its iterator-validity bookkeeping stays with the original __iter__), then given one.
    # It is named in this module, so an instrumented pipe still pickles in this process (torch
    # walks a pipeline's graph by pickling it).
    qualname = f"_Timed_{cls.__module__.replace('.', '_')}_{cls.__qualname__.replace('.', '_')}_{len(_subclasses)}"
    sub = type(cls)(cls.__name__, (cls,), {"__slots__": (), "__module__": __name__, "__qualname__": qualname})
    globals()[qualname] = sub
    if issubclass(cls, IterDataPipe):
        original_iter = cls.__iter__

        def timed_iter(self: Any) -> Iterator[Any]:
            record = _record_of(self)
            if record is None:
                return original_iter(self)
            it = _timed_call(record, lambda: original_iter(self), False)
            return _TimedIterator(it, record)

        sub.__iter__ = timed_iter
    else:
        original_getitem = cls.__getitem__

        def timed_getitem(self: Any, index: Any) -> Any:
            record = _record_of(self)
            if record is None:
                return original_getitem(self, index)
            return _timed_call(record, lambda: original_getitem(self, index), True)

        sub.__getitem__ = timed_getitem
    sub._pipekit_timed_original = cls
    _subclasses[cls] = sub
    return sub


def _depths(pipe: Any) -> dict[int, int]:
    """Each pipe's distance from ``pipe`` (the last pipe), by the graph torch reports."""
    from pipekit.pipes._torch import pipe_graph

    depth: dict[int, int] = {}

    def walk(graph: dict[int, Any], level: int) -> None:
        for key, (_dp, sub) in graph.items():
            if key not in depth or depth[key] > level:
                depth[key] = level
            walk(sub, level + 1)

    walk(pipe_graph(pipe), 0)
    return depth


@contextlib.contextmanager
def instrument_pipeline(pipe: Any) -> Iterator[list[StageProfile]]:
    """Time every pipe of ``pipe``'s graph while the ``with`` block runs.

    Yields the list of :class:`StageProfile` records (sources first, the last
    pipe last), which fill in as the pipeline is iterated in this process.
    The pipes' classes are restored when the block exits.

    Raises:
        TypeError: ``pipe`` is not a DataPipe.
        RuntimeError: the pipeline is already being instrumented.

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> def even(x):
        ...     return x % 2 == 0
        >>> pipe = IterableWrapper(range(6)).filter(even)
        >>> with instrument_pipeline(pipe) as stages:
        ...     out = list(pipe)
        >>> out, [(s.name, s.items) for s in stages]
        ([0, 2, 4], [('IterableWrapper', 6), ('filter(even)', 3)])
    """
    if not isinstance(pipe, (IterDataPipe, MapDataPipe)):
        raise TypeError(f"instrument_pipeline takes an IterDataPipe or MapDataPipe, got {type(pipe).__name__}")
    pipes = [dp for dp in pipeline_pipes(pipe) if isinstance(dp, (IterDataPipe, MapDataPipe))]
    depth = _depths(pipe)
    names = _registry_names()
    # sources first: the reverse of the walk from the last pipe (deepest first, stable)
    order = sorted(range(len(pipes)), key=lambda i: (-depth.get(id(pipes[i]), 0), -i))
    pipes = [pipes[i] for i in order]
    records = [StageProfile(stage_name(dp, names), type(dp).__name__, depth=depth.get(id(dp), 0)) for dp in pipes]
    with _records_lock:
        busy = [type(dp).__name__ for dp in pipes if id(dp) in _records]
        if busy:
            raise RuntimeError(f"instrument_pipeline: the pipeline is already instrumented ({busy[0]})")
        for dp, record in zip(pipes, records):
            _records[id(dp)] = record
    swapped: list[tuple[Any, type]] = []
    try:
        for dp in pipes:
            cls = type(dp)
            if getattr(cls, "_pipekit_timed_original", None) is not None:
                continue
            dp.__class__ = _timed_subclass(cls)
            swapped.append((dp, cls))
        yield records
    finally:
        for dp, cls in swapped:
            dp.__class__ = cls
        with _records_lock:
            for dp in pipes:
                _records.pop(id(dp), None)


def batch_length(batch: Any) -> int:
    """How many samples a batch holds: the length of its first tensor, array or list (1 if none).

    Example:
        >>> import torch
        >>> batch_length({"image": torch.zeros(8, 3, 4, 4), "crs": ["EPSG:4326"] * 8})
        8
        >>> batch_length((torch.zeros(5, 2), torch.zeros(5)))
        5
        >>> batch_length("not a batch")
        1
    """
    if isinstance(batch, (torch.Tensor, np.ndarray)):
        return int(batch.shape[0]) if batch.ndim else 1
    if isinstance(batch, Mapping):
        for value in batch.values():
            if isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim:
                return int(value.shape[0])
        for value in batch.values():
            if isinstance(value, (list, tuple)):
                return len(value)
        return 1
    if isinstance(batch, (list, tuple)):
        if batch and all(isinstance(v, (torch.Tensor, np.ndarray)) for v in batch):
            first = batch[0]
            return int(first.shape[0]) if first.ndim else len(batch)
        return len(batch)
    return 1


def profile_pipeline(
    pipe: Any,
    batches: int = 20,
    *,
    warmup: int = 1,
    on_batch: Callable[[Any], None] | None = None,
) -> PipelineProfile:
    """Pull ``batches`` items from ``pipe`` in this process and time every stage.

    Args:
        pipe: the pipeline's last pipe (usually yielding batches).
        batches: items to time from the last pipe.  The pipe is restarted
            (a new epoch) if it ends sooner.
        warmup: items taken first and left out of the timings (file listing,
            first opens, lazy imports).
        on_batch: called with every timed item (e.g. to move it to a device,
            or a training step, whose time then counts in the wall time but in
            no stage).

    Returns:
        a :class:`PipelineProfile`; ``print(report)`` shows the summary and the table.

    Raises:
        ValueError: ``batches`` is not positive, ``warmup`` is negative, or
            the pipe yields nothing.
    """
    if isinstance(batches, bool) or not isinstance(batches, int) or batches < 1:
        raise ValueError(f"batches must be a positive int, got {batches!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    report = PipelineProfile()
    with instrument_pipeline(pipe) as stages:
        report.stages = stages
        taken = 0
        counted = 0
        start = time.perf_counter()
        it: Iterator[Any] | None = None
        while counted < batches:
            if it is None:
                it = iter(pipe)
                report.epochs += 1
            try:
                batch = next(it)
            except StopIteration:
                it = None
                if taken == 0:
                    raise ValueError(f"profile_pipeline: the pipe {type(pipe).__name__} yielded nothing") from None
                continue
            taken += 1
            if taken <= warmup:
                if taken == warmup:
                    for s in stages:
                        s._reset()
                    start = time.perf_counter()
                continue
            counted += 1
            report.samples += batch_length(batch)
            if on_batch is not None:
                on_batch(batch)
        report.seconds = time.perf_counter() - start
        report.batches = counted
    return report
