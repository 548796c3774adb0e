"""Checkpoint and restore the position of a whole pipeline.

A pipeline is a graph of pipes pulled synchronously from its last pipe.  Right
after the last pipe yields an item, every pipe is paused at a ``yield``, so
the pipeline's position is the set of positions of its pipes:

* *stateless* pipes (``map``, ``filter``, ``batch``, ``collate``, decoders...)
  hold nothing between items and need no state;
* *resumable* pipes (:class:`~pipekit.pipes.base.Resumable`: sources, shuffle
  buffers, bucketers, counters) report their own position with
  ``state_dict()`` and restore it with ``load_state_dict()`` (most are built
  on :class:`~pipekit.pipes.state.ResumablePipe`; the whole contract is in
  :mod:`pipekit.pipes.state`);
* any other pipe makes the pipeline *not snapshot-capable*.  Then
  :class:`pipekit.DataLoader` falls back to counting items and replaying them
  on resume (what ``StatefulDataLoader`` does by default), and logs which pipes
  forced that.

Pipes that run background threads (``prefetch``, ``threadpool_map``) also
offer ``pause()``, a context manager that parks their threads at a safe point
while the snapshot is taken.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from pipekit.errors import CheckpointError
from pipekit.pipes._builtin import (
    Batcher,
    Collator,
    FileOpener,
    Filter,
    MapBatcher,
    MapConcater,
    MapMapper,
    Mapper,
    MapShuffler,
    MapZipper,
    ResumableShardingFilter,
    ResumableShuffler,
    SequenceWrapper,
    ShardingFilter,
    Shuffler,
    Zipper,
)
from pipekit.pipes._splitting import _RandomSplitContainer, _SplitContainer
from pipekit.pipes._torch import Batcher as TorchBatcher
from pipekit.pipes._torch import ShardingFilter as TorchShardingFilter
from pipekit.pipes._torch import Shuffler as TorchShuffler
from pipekit.pipes._torch import iterator_id, pipe_graph
from pipekit.pipes.base import IterDataPipe, MapDataPipe, Resumable
from pipekit.pipes.state import PendingState

__all__ = [
    "pipeline_pipes",
    "pipeline_signature",
    "not_snapshot_capable",
    "prepare_for_resume",
    "snapshot_pipeline",
    "SnapshotPlan",
    "materialize_snapshot",
    "restore_pipeline",
    "register_stateless",
    "epoch_marks",
    "pending_seeds",
    "apply_seeds",
    "drop_pending",
    "epoch_carry",
]

logger = logging.getLogger("pipekit")

# torch pipes that hold nothing between two items (see the module docstring).
# Map-style pipes are indexed, not iterated: they hold no position either.
_STATELESS: set[type] = {
    FileOpener,
    Mapper,
    Filter,
    Collator,
    Batcher,
    TorchBatcher,  # built from torch's class directly
    Zipper,
    SequenceWrapper,
    MapMapper,
    MapBatcher,
    MapConcater,
    MapZipper,
    MapShuffler,
}

# torch pipes replaced by resumable subclasses that behave the same.
# pipekit's checked subclasses (what ``shuffle()``/``sharding_filter()`` build) and torch's own classes.
_SWAPS: dict[type, type] = {
    Shuffler: ResumableShuffler,
    ShardingFilter: ResumableShardingFilter,
    TorchShuffler: ResumableShuffler,
    TorchShardingFilter: ResumableShardingFilter,
}

# Pipes torch never starts an iterator on, so their iterator ids say nothing about the epoch: map-style
# pipes (they start a pass themselves, at their first lookup) and the containers behind round_robin_demux,
# unzip and random_split (their children start them).  A snapshot always asks them for their state.
_STARTED_BY_CONSUMERS: tuple[type, ...] = (MapDataPipe, _SplitContainer, _RandomSplitContainer)

_VERSION = 1
_FRESH = "__pipekit_fresh__"


def register_stateless(cls: type) -> type:
    """Declare that pipes of ``cls`` hold no position between items.

    Usable as a class decorator for pipes written outside pipekit.  A pipe
    class can also declare it with the class attribute ``stateless = True``.
    """
    _STATELESS.add(cls)
    return cls


def pipeline_pipes(pipe: IterDataPipe) -> list[IterDataPipe]:
    """All pipes of the graph ending at ``pipe``, in a deterministic order.

    The order is a depth-first walk from ``pipe`` over the pipes each one
    references, so two copies of the same pipeline list their pipes in the
    same order.
    """
    out: list[IterDataPipe] = []
    seen: set[int] = set()

    def walk(graph: dict[int, Any]) -> None:
        for key, (dp, sub) in graph.items():
            if key in seen:
                continue
            seen.add(key)
            out.append(dp)
            walk(sub)

    walk(pipe_graph(pipe))
    return out


def pipeline_signature(pipe: IterDataPipe) -> list[str]:
    """The class of every pipe of ``pipe``'s graph, in :func:`pipeline_pipes` order: what a checkpoint fits.

    torch's ``shuffle``/``sharding_filter`` classes are named as the resumable
    subclasses :func:`prepare_for_resume` turns them into, so a pipeline gives
    the same signature before and after it first runs.  Nothing is changed.
    """
    return [_SWAPS.get(type(dp), type(dp)).__qualname__ for dp in pipeline_pipes(pipe)]


def _is_stateless(dp: Any) -> bool:
    return type(dp) in _STATELESS or getattr(type(dp), "stateless", False) is True


def _is_resumable(dp: Any) -> bool:
    return isinstance(dp, Resumable) and not isinstance(dp, type)


def not_snapshot_capable(pipe: IterDataPipe) -> list[str]:
    """Names of the pipes that keep ``pipe`` from being checkpointed exactly.

    An empty list means :func:`snapshot_pipeline` will capture the full
    position.  Call :func:`prepare_for_resume` first: before it, torch's
    ``shuffle`` and ``sharding_filter`` are listed here.
    """
    bad = []
    for dp in pipeline_pipes(pipe):
        if isinstance(dp, type):
            continue
        if not (_is_stateless(dp) or _is_resumable(dp)):
            bad.append(type(dp).__name__)
    return bad


def prepare_for_resume(pipe: IterDataPipe) -> IterDataPipe:
    """Switch torch's ``shuffle``/``sharding_filter`` pipes to resumable subclasses.

    Changes the classes of the pipes in place (their behaviour is identical)
    and returns ``pipe``.  Safe to call several times.
    """
    for dp in pipeline_pipes(pipe):
        swap = _SWAPS.get(type(dp))
        if swap is not None:
            dp.__class__ = swap
    return pipe


def _pause_all(pipes: list[Any]) -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    for dp in pipes:  # top-down: downstream threads stop pulling first
        # Looked up on the class: on the instance, torch's IterDataPipe.__getattr__ raises (and
        # formats) an AttributeError for each pipe without one, with every checkpoint.
        if callable(getattr(type(dp), "pause", None)):
            stack.enter_context(dp.pause())
    return stack


def _is_random(dp: Any) -> bool:
    return callable(getattr(type(dp), "set_seed", None))


def epoch_marks(pipes: list[Any]) -> list[Any]:
    """Record, before an epoch's first item, which iterator each pipe is on.

    torch numbers each pipe's iterators when they start, lazily at their
    first item (:func:`pipekit.pipes._torch.iterator_id`).  Comparing with these marks later
    tells which pipes have not started in this epoch (a ``concat``'s second
    source, say): their own state is stale, so a snapshot records them as
    *fresh* instead of asking them.  Pipes torch starts no iterator on
    (map-style pipes, the containers behind ``round_robin_demux``, ``unzip``
    and ``random_split``) are always asked.
    """
    return [iterator_id(dp) for dp in pipes]


def pending_seeds(pipes: list[Any]) -> list[int | None]:
    """The seeds that random pipes will draw from at their next start.

    torch's DataLoader gives random pipes (those with ``set_seed``) the shared
    seed before an epoch; they keep it in ``_seed`` until their iterator
    starts.  A checkpoint records them so a pipe that had not started yet is
    seeded the same way after a restore.
    """
    return [getattr(dp, "_seed", None) if _is_random(dp) else None for dp in pipes]


def snapshot_pipeline(
    pipe: IterDataPipe,
    pipes: list[IterDataPipe] | None = None,
    marks: list[Any] | None = None,
    seeds: list[int | None] | None = None,
) -> dict[str, Any] | None:
    """The position of every resumable pipe of ``pipe``, or ``None``.

    Returns ``None`` when some pipe is neither stateless nor resumable (see
    :func:`not_snapshot_capable`).  ``pipes`` may pass a cached
    :func:`pipeline_pipes` list to skip walking the graph again; ``marks`` and
    ``seeds`` (from :func:`epoch_marks` and :func:`pending_seeds`, taken at
    the start of the epoch) let pipes that have not started yet be recorded as
    fresh.  To snapshot the same pipeline many times (every batch), make a
    :class:`SnapshotPlan` once instead.
    """
    pipes = pipeline_pipes(pipe) if pipes is None else pipes
    return SnapshotPlan(pipes, marks, seeds).snapshot()


_NO_MARK = object()  # a plan entry whose pipe is always asked (no mark, or started by its consumers)


class SnapshotPlan:
    """What :func:`snapshot_pipeline` does to each pipe of a pipeline, worked out once.

    :class:`pipekit.DataLoader` snapshots its pipeline after every batch in
    each worker; which pipes are stateless (skipped), which are resumable
    (asked), which have threads to pause and which classes the pipeline has
    do not change within an epoch, so the loader makes a plan when an epoch
    starts (with that epoch's marks and seeds) and :meth:`snapshot` only asks
    the resumable pipes.  The result is the same as :func:`snapshot_pipeline`'s
    for the same arguments.

    Args:
        pipes: the pipeline's :func:`pipeline_pipes`.
        marks: :func:`epoch_marks` of ``pipes`` (``None``: every pipe is asked).
        seeds: :func:`pending_seeds` of ``pipes``.
    """

    __slots__ = ("_classes", "_entries", "_pausable", "_size", "capable")

    def __init__(self, pipes: list[Any], marks: list[Any] | None = None, seeds: list[int | None] | None = None):
        self._classes = [type(dp).__qualname__ for dp in pipes]
        self._size = len(pipes)
        self._pausable = [dp for dp in pipes if callable(getattr(type(dp), "pause", None))]
        # [index, pipe, mark or _NO_MARK, seed, lazy state_dict or None] for each resumable pipe, in order.
        self._entries: list[list[Any]] = []
        self.capable = True  # every pipe is stateless or resumable
        for i, dp in enumerate(pipes):
            if _is_stateless(dp):
                continue
            if not _is_resumable(dp):
                self.capable = False
                break
            mark = marks[i] if marks is not None and not isinstance(dp, _STARTED_BY_CONSUMERS) else _NO_MARK
            has_lazy = callable(getattr(type(dp), "lazy_state_dict", None))  # on the class: no __getattr__ miss
            lazy = dp.lazy_state_dict if has_lazy else None
            self._entries.append([i, dp, mark, seeds[i] if seeds is not None else None, lazy])

    def snapshot(self, lazy: bool = False) -> dict[str, Any] | None:
        """The pipeline's position now (as :func:`snapshot_pipeline`), or ``None`` if it is not capable.

        ``lazy=True`` lets pipes with a ``lazy_state_dict()`` (the shuffle
        buffer) return an object that stands for their state and becomes it
        when pickled or passed to :func:`materialize_snapshot`: for positions
        that are kept and rarely sent (a DataLoader worker's).  Never hand a
        lazy snapshot to a user.
        """
        if not self.capable:
            return None
        states: list[Any] = [None] * self._size
        if self._pausable:
            with _pause_all(self._pausable):
                self._fill(states, lazy)
        else:
            self._fill(states, lazy)
        return {"version": _VERSION, "classes": list(self._classes), "states": states}

    def _fill(self, states: list[Any], lazy: bool) -> None:
        for entry in self._entries:
            i, dp, mark, seed, lazy_state = entry
            if mark is not _NO_MARK:
                if iterator_id(dp) == mark:
                    states[i] = {_FRESH: True, "seed": seed}
                    continue
                entry[2] = _NO_MARK  # started in this epoch: it stays started until the next plan
            states[i] = lazy_state() if lazy and lazy_state is not None else dp.state_dict()


def _is_lazy(state: Any) -> bool:
    return type(state) is not dict and state is not None and callable(getattr(type(state), "materialize", None))


def materialize_snapshot(snapshot: dict[str, Any]) -> dict[str, Any]:
    """A :meth:`SnapshotPlan.snapshot` taken with ``lazy=True``, as plain data (the same as an eager one).

    Returns ``snapshot`` itself when nothing in it is lazy, else a copy; the
    lazy snapshot is left as it was.
    """
    states = snapshot["states"]
    if not any(_is_lazy(state) for state in states):
        return snapshot
    plain = [state.materialize() if _is_lazy(state) else state for state in states]
    return {**snapshot, "states": plain}


def apply_seeds(pipes: list[Any], seeds: list[int | None]) -> None:
    """Give random pipes the seeds recorded by :func:`pending_seeds`."""
    for dp, seed in zip(pipes, seeds, strict=True):
        if seed is not None and _is_random(dp):
            dp.set_seed(seed)


def drop_pending(pipes: list[Any]) -> None:
    """Forget the loaded states that ``pipes`` still hold, not yet applied by an iterator.

    A state loaded into a pipe waits for the pipe's next iterator; a pipe the
    resumed epoch never pulls from (upstream of a ``header`` at its limit, the
    second input of a ``zip`` whose first ended) would otherwise apply it to
    the *next* epoch, which would start mid-way.  :class:`pipekit.DataLoader`
    calls this when an epoch starts, before restoring a checkpoint, if any.
    A pipe that keeps something across epochs (``keeps_across_epochs``:
    ``in_memory_cache``) keeps it from the dropped state (``carry_over``), as
    the uninterrupted run's pipe did when that epoch ended.
    """
    for dp in pipes:
        if isinstance(dp, PendingState):
            state, dp._pending = dp._pending, None
            if state is not None and dp.keeps_across_epochs:
                dp.carry_over(state)


def epoch_carry(pipes: list[Any]) -> dict[str, Any] | None:
    """What ``pipes`` carry from an epoch that ran to its end into the next, or ``None`` when nothing.

    A pipeline state (for :func:`restore_pipeline`) holding the positions of
    the pipes that keep something across epochs (``keeps_across_epochs``:
    ``in_memory_cache``'s frozen cache) and nothing for the others; restored
    into a fresh copy and dropped by :func:`drop_pending`, it hands each of
    those pipes what it keeps (its ``carry_over``).
    """
    states: list[Any] = [None] * len(pipes)
    for i, dp in enumerate(pipes):
        if isinstance(dp, PendingState) and dp.keeps_across_epochs:
            states[i] = dp.state_dict()
    if all(state is None for state in states):
        return None
    return {"version": _VERSION, "classes": [type(dp).__qualname__ for dp in pipes], "states": states}


def restore_pipeline(pipe: IterDataPipe, state: dict[str, Any]) -> None:
    """Load a :func:`snapshot_pipeline` state into a fresh copy of the same pipeline.

    The next iterator created on ``pipe`` resumes where the snapshot was
    taken.  Raises :class:`~pipekit.errors.CheckpointError` (a ``ValueError``)
    if the pipeline's structure differs from the one the state was taken from.
    """
    if not isinstance(state, dict) or state.get("version") != _VERSION:
        raise CheckpointError(f"not a pipekit pipeline state (version {_VERSION}): {type(state).__name__}")
    prepare_for_resume(pipe)
    pipes = pipeline_pipes(pipe)
    classes = [type(dp).__qualname__ for dp in pipes]
    if classes != state["classes"]:
        raise CheckpointError(
            "cannot restore pipeline state: the pipeline has changed since the checkpoint "
            f"(checkpoint pipes {state['classes']}, current pipes {classes})"
        )
    for dp, dp_state in zip(pipes, state["states"], strict=True):
        if dp_state is None:
            continue
        if dp_state.get(_FRESH):
            if dp_state.get("seed") is not None:
                dp.set_seed(dp_state["seed"])
            continue
        dp.load_state_dict(dp_state)
