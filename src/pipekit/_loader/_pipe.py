"""The pipe a ``pipekit.DataLoader`` holds: the user's pipeline, its checkpoints and its reports.

torch's DataLoader wraps a DataPipe in a serialization wrapper, which goes to
every worker and is the iterator its fetcher pulls items from.
:class:`_CheckpointedPipe` is pipekit's subclass of it: it restores a pipeline's
position instead of replaying items, keeps a worker's positions for
:mod:`pipekit._worker_states`, sends each worker's skip counts and last file
with its state (:data:`REPORT`), and refuses items holding open streams in a
worker.  A position leaves the pipeline as plain data
(:func:`~pipekit._loader._sending.plain_position`): in-memory archive members a
buffer holds as their bytes, and anything else that cannot be pickled refused,
naming the pipe and the key path (with workers, each says so with its batches:
:data:`REFUSED`).  In a worker, an item its result queue cannot pickle raises
in the main process (:func:`~pipekit._loader._sending._watch_sending`) instead
of being dropped.

:func:`fast_try_to_serialize` is the shortcut pipekit puts in front of
torchdata's ``try_to_serialize`` for the objects a pipekit loader hands it
(installed by :func:`install_fast_serialize`, through
:func:`pipekit._loader_seam.patch_try_to_serialize`).
"""

from __future__ import annotations

import functools
import logging
import random
import types
from collections.abc import Callable
from typing import Any

import torch

from pipekit._fs import redact_secrets
from pipekit._loader._carry import apply_carry, find_streams, load_streams, process_carry, stream_states
from pipekit._loader._replay_check import ENDED, STAMPS, check_replay, replay_check, replay_end, start_stamps
from pipekit._loader._sending import _materialize_state, _watch_sending, plain_position
from pipekit._loader_seam import InfiniteConstantSampler, patch_try_to_serialize
from pipekit._worker_states import StateChannel, WorkerStates
from pipekit.errors import SkipLog, UnsupportedItemError
from pipekit.pipes._resume import (
    SnapshotPlan,
    apply_seeds,
    drop_pending,
    epoch_marks,
    not_snapshot_capable,
    pending_seeds,
    pipeline_pipes,
    prepare_for_resume,
    restore_pipeline,
)
from pipekit.pipes._stream_items import find_open_stream, last_opened, stream_name, streams_from_bytes
from pipekit.pipes._torch import LoaderPipeWrapper, hooked_iterator_target, loader_iteration
from pipekit.pipes.base import IterDataPipe
from pipekit.pipes.state import PendingState
from pipekit.profiling import stage_name

__all__ = [
    "EPOCH_CARRY",
    "REFUSED",
    "REPORT",
    "REPORT_ITEMS",
    "fast_try_to_serialize",
    "install_fast_serialize",
    "skip_logs",
]

logger = logging.getLogger("pipekit")

REPORT = "report"  # the key of a worker's state that carries its skip counts and last file to the main process
REPORT_ITEMS = 10  # skipped items each pipe of each worker reports in full
REFUSED = "refused"  # the key of a worker's state saying why its position cannot be checkpointed
WORKER_RNG = "worker_rng"  # the key of a worker's state holding its global generators' states (torch's, Python's)
EPOCH_RNG = "epoch_rng"  # the key of a replayed (count) state: the global generators' states the epoch started with
# the key of a worker's state at the end of its epoch: what it carries into the next (in_memory_cache's frozen
# cache, its transforms' random streams), as plain data (:mod:`pipekit._loader._carry`); absent when nothing is carried
EPOCH_CARRY = "epoch_carry"
CHECK = "check"  # the key of a counted position holding what its replay must reach (_replay_check.py)
STREAMS = "streams"  # the key of a position holding the random streams of the pipeline's transforms (_carry.py)


def worker_rng_state() -> dict[str, Any]:
    """The global random generators of this (worker) process: what its pipes and maps draw from, at a position.

    A persistent worker's generators advance through the epochs (a shuffle under ``cycle`` draws each later
    pass's seed from torch's; augmentations draw from them): a worker resumed from a checkpoint continues them.
    """
    return {"torch": torch.get_rng_state(), "random": random.getstate()}


def set_worker_rng_state(state: dict[str, Any]) -> None:
    """Put back a :func:`worker_rng_state` (from a checkpoint: lists may stand for tuples)."""
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["random"]
    random.setstate((version, tuple(internal), gauss))


def _spend_epoch_seeds(pipes: list[Any]) -> None:
    """Forget the seed the resumed epoch gave the random pipes a checkpoint restores: they spent theirs.

    torch's DataLoader seeds every random pipe (``set_seed``) when an epoch starts; a pipe that holds a loaded
    position had started its epoch in the checkpointed run, with that run's seed.  A cycle that drops the
    position (the pass it was in had ended) starts the pipe afresh: it must draw its seed from torch's
    generator, as the uninterrupted run's next pass did, not take the resumed epoch's seed.
    """
    for dp in pipes:
        if isinstance(dp, PendingState) and dp._pending is not None and getattr(dp, "_seed", None) is not None:
            dp._seed = None


def skip_logs(pipes: list[Any]) -> list[tuple[int, SkipLog]]:
    """The skip logs of ``pipes`` (those that keep one), with each pipe's index."""
    return [(i, log) for i, dp in enumerate(pipes) if isinstance(log := getattr(dp, "skip_log", None), SkipLog)]


def _stage_name(pipe: Any) -> str:
    """``"batch (BatcherIterDataPipe)"``, ``"map(decode_fn) (MapperIterDataPipe)"``: a pipe in messages."""
    cls = type(pipe).__name__
    name = getattr(type(pipe), "functional_name", None) or stage_name(pipe)
    return f"{name} ({cls})" if name and name != cls else cls


class _CheckpointedPipe(LoaderPipeWrapper):
    """Holds the user's pipe inside the loader and checkpoints its position.

    torch's DataLoader wraps a DataPipe in a serialization wrapper (which is
    also the iterator it hands to the fetcher); this subclass of it adds
    ``state_dict``/``load_state_dict`` so ``StatefulDataLoader`` asks it for the
    pipeline's position in each worker instead of replaying items.
    """

    def __init__(self, datapipe: IterDataPipe) -> None:
        super().__init__(datapipe)
        self._init_resume_fields()

    def _init_resume_fields(self) -> None:
        self._pipes: list[Any] | None = None
        self._marks: list[Any] | None = None
        self._seeds: list[Any] | None = None
        self._plan: SnapshotPlan | None = None  # how this epoch's snapshots are taken (made in _start)
        self._pending: dict[str, Any] | None = None
        self._base_state: dict[str, Any] | None = None
        self._yielded = 0
        self._since_start = 0
        self._warned = False
        self._cache: tuple[Any, dict[str, Any]] | None = None
        self._run = 0  # iterators started, to tell their checkpoints apart
        self._logs: list[tuple[int, SkipLog]] = []  # the pipes' skip logs, reported with each state
        self._in_worker = False  # items are checked for open streams only in DataLoader workers
        self._exhausted = False  # the current iterator has ended (its last state is sent in full)
        self._channel: StateChannel | None = None  # set by the loader while it starts workers
        self._kept: WorkerStates | None = None  # a worker's last positions, sent on request
        self._stages: list[str] = []  # each pipe's name for messages, by snapshot index
        self._checked_run = 0  # the iterator whose kept positions were checked for streams
        self._refused: str | None = None  # why this iterator's positions cannot be checkpointed
        # Each worker's global generators to start from (by worker id), from an end-of-epoch checkpoint of
        # persistent workers: set by the loader while it starts workers, used by the first epoch only.
        self._start_rngs: list[Any] | None = None
        # What each worker carries into the epoch (by worker id; [main process] without workers), from an
        # end-of-epoch checkpoint (pipekit._loader._carry): set by the loader, used by the next start.
        self._start_carries: list[Any] | None = None
        self._streams: list[Any] | None = None  # the random streams the pipes hold (found once)
        self._epoch_rng: dict[str, Any] | None = None  # this process's generators when the epoch started
        self._stamps: Any = None  # the epoch's StampLog where a resume reads files again (_replay_check.py)

    def __getstate__(self) -> Any:
        # The channel travels to the workers with the pipe (it is only set while the loader starts them).
        return (super().__getstate__(), self._channel, self._start_rngs, self._start_carries)

    def __setstate__(self, state: Any) -> None:
        base, channel, start_rngs, start_carries = state
        super().__setstate__(base)
        self._init_resume_fields()
        self._channel = channel
        self._start_rngs = start_rngs
        self._start_carries = start_carries

    def __iter__(self) -> _CheckpointedPipe:
        self._start()
        return self

    def _start(self) -> None:
        """(Re)create the pipeline's iterator, restoring a pending state if there is one.

        A loaded state stays pending until the first item is taken, because
        StatefulDataLoader may load it into the dataset, then create the
        iterator, then load it into the iterator again.
        """
        if self._pipes is None:  # the graph (and the swapped classes) stay the same across epochs
            prepare_for_resume(self.pipe)
            self._pipes = pipeline_pipes(self.pipe)
            loader_iteration(self._pipes)  # items pulled here skip torch's per-item hook
            self._logs = skip_logs(self._pipes)
            self._stages = [_stage_name(dp) for dp in self._pipes]
        self._in_worker = torch.utils.data.get_worker_info() is not None
        if self._in_worker:
            _watch_sending(_stage_name(self.pipe))
        pending = self._pending
        self._cache = None
        self._base_state = pending
        self._since_start = 0
        self._yielded = 0
        self._exhausted = False
        carries, self._start_carries = self._start_carries, None
        if pending is None and carries is not None:
            # A new epoch after an end-of-epoch checkpoint: what the pipes of this process (worker) carried into
            # it, loaded as their positions at the end of the last epoch and handed over by drop_pending.
            info = torch.utils.data.get_worker_info()
            index = info.id if info is not None else 0
            if index < len(carries) and carries[index] is not None:
                apply_carry(self.pipe, self._random_streams(), carries[index])
        # A state the last epoch loaded into a pipe it never pulled from belongs to that epoch, not this one
        # (pipes that keep something across epochs keep it from that state: an epoch that ended hands it on).
        drop_pending(self._pipes)
        if pending is not None and self._in_worker and pending.get(WORKER_RNG) is not None:
            set_worker_rng_state(pending[WORKER_RNG])
        elif self._start_rngs is not None and self._in_worker:
            # The first epoch of workers resumed from an end-of-epoch checkpoint of persistent workers: go on
            # from the generators those workers had, as they would have into that epoch.
            info = torch.utils.data.get_worker_info()
            rng = self._start_rngs[info.id] if info is not None and info.id < len(self._start_rngs) else None
            if rng is not None:
                set_worker_rng_state(rng)
        self._start_rngs = None
        if pending is not None and pending["mode"] == "snapshot":
            restore_pipeline(self.pipe, streams_from_bytes(pending["pipes"]))
            _spend_epoch_seeds(self._pipes)
            self._yielded = int(pending["yielded"])
        elif pending is not None and pending.get("seeds") is not None:
            apply_seeds(self._pipes, pending["seeds"])
        # What a checkpoint needs to describe pipes that have not started yet.
        self._marks = epoch_marks(self._pipes)
        self._seeds = pending_seeds(self._pipes)
        self._plan = SnapshotPlan(self._pipes, self._marks, self._seeds)
        self._stamps = start_stamps(self._pipes, self._plan.capable, pending)
        self._run += 1
        self.restart()
        # A replay draws what the epoch drew from the start (a shuffle under cycle seeds its next pass from
        # torch's generator): from the random state the epoch started with, then the process's state goes on
        # as it was (the checkpoint's, which a training loop restores, or a worker's from its position).
        self._epoch_rng = worker_rng_state()
        if pending is not None and pending["mode"] == "count":
            replay_rng = pending.get(EPOCH_RNG) if int(pending["yielded"]) else None
            after = worker_rng_state() if replay_rng is not None else None
            if replay_rng is not None:
                set_worker_rng_state(replay_rng)
                self._epoch_rng = replay_rng
            self._skip(int(pending["yielded"]))
            if pending.get(ENDED):
                replay_end(self.next_item, int(pending["yielded"]))
            if after is not None:
                set_worker_rng_state(after)
            check_replay(pending.get(CHECK), self._pipes, self._stages, int(pending["yielded"]), self._stamps)
        if pending is not None and pending.get(STREAMS) is not None:
            load_streams(self._random_streams(), pending[STREAMS])  # after a replay, which drew from them

    def _skip(self, count: int) -> None:
        if count:
            logger.info("pipekit.DataLoader: resuming by replaying %d items", count)
        for _ in range(count):
            try:
                self.next_item()
            except StopIteration:
                break
            self._yielded += 1

    def __next__(self) -> Any:
        self._pending = None
        try:
            item = self.next_item()
        except StopIteration:
            self._exhausted = True
            raise
        if self._in_worker and (stream := find_open_stream(item)) is not None:
            self._refuse_stream(stream)
        self._yielded += 1
        self._since_start += 1
        return item

    def _refuse_stream(self, stream: Any) -> None:
        """An open stream cannot be pickled to the main process: torch would hang; say what to do instead."""
        raise TypeError(
            f"pipekit.DataLoader: {_stage_name(self.pipe)} yielded an item holding an open stream "
            f"{redact_secrets(stream_name(stream))}, which a DataLoader worker cannot send to the main process; "
            "read the stream inside the worker, at the end of the pipeline: e.g. .read_from_stream() for (url, stream) "
            "pairs, .map(read_fn) with a function returning the stream's bytes (stream.read()), or a decoder "
            "(.decode(), .decode_image())"
        )

    def _report(self) -> dict[str, Any]:
        """The skip counts and last file of this process, as plain data (see :meth:`DataLoader.skip_report`)."""
        skips = {i: log.summary(REPORT_ITEMS) for i, log in self._logs if log.count}
        last = last_opened()
        # a message (which file a dead worker read last): its URL without secrets, as every message has it
        return {"skips": skips, "last": [redact_secrets(str(last[0])), *last[1:]] if last is not None else None}

    def state_dict(self) -> dict[str, Any]:
        # StatefulDataLoader asks twice per batch (for the dataset and for its iterator, which
        # are this object): hand out the same dict, so it is built once and pickled once.
        key = (
            self._run,
            self._yielded,
            self._since_start,
            self._exhausted,
            sum(log.count for _, log in self._logs),
            last_opened(),
        )
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        # Keep the position here and send a token: the main process asks for the position
        # itself only when it makes a checkpoint (see pipekit._worker_states). A kept position
        # may be lazy (the shuffle buffer's is rebuilt when sent): it never leaves the worker as such.
        keep = self._in_worker and self._channel is not None and not self._exhausted
        state = self._make_state(lazy=keep)
        if keep and state["mode"] == "snapshot" and self._checked_run != self._run:
            # Once an iterator: can its positions be sent? The main process refuses a checkpoint
            # (typed, at once) if not, rather than learn it from the answering thread.
            self._checked_run = self._run
            self._refused = self._refusal_of(state)
        if keep:  # a counted position too: its check and stamps name files (kilobytes), sent when asked
            state = self._worker_states().keep(self._run, self._yielded, state)
        state = {**state, REPORT: self._report()}
        if keep and self._refused is not None:
            state[REFUSED] = self._refused
        self._cache = (key, state)
        return state

    def _worker_states(self) -> WorkerStates:
        if self._kept is None:
            assert self._channel is not None
            info = torch.utils.data.get_worker_info()
            materialize = functools.partial(_materialize_state, list(self._stages))
            self._kept = WorkerStates(self._channel, info.id if info is not None else 0, materialize)
        return self._kept

    def _refusal_of(self, state: dict[str, Any]) -> str | None:
        """Why ``state`` (a kept position) cannot be checkpointed, or ``None``."""
        try:
            _materialize_state(self._stages, state)
        except UnsupportedItemError as exc:
            return str(exc)
        return None

    def _make_state(self, lazy: bool = False) -> dict[str, Any]:
        state = self._position(lazy)
        if self._in_worker and WORKER_RNG not in state:
            state = {**state, WORKER_RNG: worker_rng_state()}
        if STREAMS not in state and (streams := stream_states(self._random_streams())) is not None:
            state = {**state, STREAMS: streams}
        if self._in_worker and self._exhausted:
            carry = self.epoch_carry(refuse=False)
            if carry is not None:
                state = {**state, EPOCH_CARRY: carry}
        return state

    def _random_streams(self) -> list[Any]:
        if self._streams is None:
            self._streams = find_streams(self._pipes) if self._pipes is not None else []
        return self._streams

    def epoch_carry(self, refuse: bool = True) -> dict[str, Any] | None:
        """What this process carries into the next epoch (:func:`~pipekit._loader._carry.process_carry`), plain.

        ``None`` when nothing is carried.  What a checkpoint cannot hold (an open
        stream in a cache) raises :class:`~pipekit.errors.UnsupportedItemError`
        naming the pipe, or with ``refuse=False`` (a worker's last state, sent
        whether or not a checkpoint is taken) is logged and left out: the next
        epoch of a resumed run then reads what the pipe would have kept again.
        """
        if self._pipes is None:
            return None
        try:
            return process_carry(self._pipes, self._random_streams(), self._stages, plain_position)
        except UnsupportedItemError as exc:
            if refuse:
                raise
            logger.warning("pipekit.DataLoader: an end-of-epoch checkpoint will not hold what the pipes keep for "
                           "the next epoch: %s", exc)
            return None

    def _position(self, lazy: bool = False) -> dict[str, Any]:
        if self._since_start == 0:
            # Nothing consumed since the iterator started: the position is the start
            # (or the state it was restored to), whatever stale buffers the pipes hold.
            # The seeds matter: torchdata restores a different shared seed than the one
            # its workers started with, so a fresh worker must be re-seeded explicitly.
            if self._base_state is not None:
                return self._base_state
            return {"mode": "count", "yielded": 0, "seeds": self._seeds}
        snap = self._plan.snapshot(lazy) if self._plan is not None else None
        if snap is None:
            if not self._warned:
                self._warned = True
                logger.warning(
                    "pipekit.DataLoader: pipes %s cannot report their position; a resumed run will "
                    "replay the items already consumed",
                    sorted(set(not_snapshot_capable(self.pipe))),
                )
            # what the replay must reach: the positions of the pipes that report one (pipekit._loader._replay_check)
            check = replay_check(self._pipes or [], self._stages)
            state = {"mode": "count", "yielded": self._yielded, "seeds": self._seeds, EPOCH_RNG: self._epoch_rng,
                     CHECK: check, ENDED: self._exhausted}
        else:
            state = {"mode": "snapshot", "pipes": snap if lazy else plain_position(snap, self._stages),
                     "yielded": self._yielded}
        if self._stamps is not None:  # the files opened before this position (kept lazily in a worker)
            state[STAMPS] = self._stamps.at(lazy)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("mode") not in ("snapshot", "count"):
            raise ValueError(f"not a pipekit.DataLoader worker state: {state!r:.200}")
        # The report described the run that wrote the checkpoint; this run reports its own.
        self._pending = {k: v for k, v in state.items() if k != REPORT}
        # The fetcher may already hold an iterator over this object: restart it in place.
        self._start()


# torchdata asks ``isinstance(obj, Stateful)`` (a runtime-checkable ``typing.Protocol``) through its
# ``try_to_serialize`` of the dataset and of its iterator in every worker with every batch
# (``worker._make_state_dict``), and of the sampler and its iterator in the main process with every
# batch (``_get_main_state``).  On Python 3.11 each such check re-derives the protocol's members
# (``typing._get_protocol_attrs``, twice) and, for torch's iterator wrapper, forwards through its
# ``__getattr__``: measured at ~30% of a worker's per-batch snapshot (~70 of 230 us after decoding a
# batch of 32 JPEGs, caches cold) and ~4 checks per batch in the main process.  For the objects a
# pipekit loader hands torchdata, the answer is known from the exact type: pipekit's
# ``_CheckpointedPipe`` (and torch's iterator wrapper around it) is Stateful; the sampler torch uses for
# iterable datasets, and the generator it iterates, are not (neither their class nor the instance
# has a ``state_dict``).  Those go straight to the answer; every other object gets torchdata's own
# function, so its behaviour is unchanged for everything else.


def fast_try_to_serialize(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """torchdata's ``try_to_serialize`` (``original``) with the shortcut above in front of it."""

    def try_to_serialize(obj: Any) -> Any:
        cls = type(obj)
        if cls is _CheckpointedPipe:
            return obj.state_dict()
        if cls is types.GeneratorType:  # no attributes of its own, and its class has no state_dict
            return None
        if cls is InfiniteConstantSampler and not obj.__dict__ and not hasattr(cls, "state_dict"):
            return None
        inner = hooked_iterator_target(obj)
        if inner is not None and type(inner) is _CheckpointedPipe:
            return inner.state_dict()  # what the wrapper's forwarded state_dict() returns
        return original(obj)

    try_to_serialize.__wrapped__ = original  # type: ignore[attr-defined]
    return try_to_serialize


def install_fast_serialize() -> None:
    """Route torchdata's ``try_to_serialize`` (worker and main process) through the shortcut above, once."""
    patch_try_to_serialize(fast_try_to_serialize)
