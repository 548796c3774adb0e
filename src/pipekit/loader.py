"""``pipekit.DataLoader``: torchdata's ``StatefulDataLoader`` with pipekit's defaults.

It is a drop-in ``torch.utils.data.DataLoader`` (same arguments, same
sharding of DataPipes across workers and ``torch.distributed`` ranks, same
seeding of shuffles) that also resumes mid-epoch:

>>> import torch
>>> from pipekit import DataLoader
>>> from pipekit.pipes import IterableWrapper
>>> pipe = IterableWrapper(range(10)).shuffle().sharding_filter().batch(2)
>>> _ = torch.manual_seed(0)
>>> loader = DataLoader(pipe)
>>> it = iter(loader)
>>> first = [next(it), next(it)]
>>> state = loader.state_dict()
>>> rest = list(it)
>>> resumed = DataLoader(pipe)
>>> resumed.load_state_dict(state)
>>> list(resumed) == rest
True

Resuming restores each pipe's position (sources, shuffle buffers,
bucketers...) instead of replaying the items already consumed; see
:mod:`pipekit.pipes.resume`.  A pipeline containing a pipe that cannot report
its position is resumed by replaying instead, and the loader logs which pipe
forced that.

Nothing is lost between the workers and the main process:

* ``loader.skip_report()`` adds up what the pipes skipped under
  ``on_error="skip"`` in every worker: each worker's state, which torchdata
  sends with each batch (only what changed since the last one), carries its
  counts per pipe and its first skipped items;
* an item holding an open stream (a file, an archive member), which cannot
  be pickled to the main process, raises a ``TypeError`` in the worker naming
  the pipe that yielded it, instead of hanging the main process;
* a worker that dies (killed by a signal, out of memory) raises
  :class:`~pipekit.errors.WorkerDiedError` naming the worker and the last
  file it reported opening.

Two more things torch's loader does silently, pipekit's does not:

* a DataPipe with no sharding point (no ``sharding_filter``) run by several
  workers or ranks gives every worker and rank every item; pipekit warns once,
  naming the pipe (``warn_unsharded=False`` when that is intended);
* torchdata's ``StatefulDataLoader`` calls torch's deprecated ``set_vital``,
  which prints ``'set_vital' is deprecated`` for every loader; pipekit
  silences exactly that warning where it creates the loader and its workers.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib
import inspect
import logging
import multiprocessing
import os
import re
import signal
import sys
import time
import types
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.utils.data
from torch.utils.data.dataloader import _InfiniteConstantSampler
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.stateful_dataloader import _StatefulMultiProcessingDataLoaderIter

from pipekit import shm
from pipekit._worker_states import StateChannel, WorkerStates, resolve_deferred
from pipekit.collate import use_shared_buffers_in_default_collate
from pipekit.errors import SkipLog, SkipReport, WorkerDiedError
from pipekit.pipes._stream_items import find_open_stream, last_opened, stream_name
from pipekit.pipes._torch import LoaderPipeWrapper, hooked_iterator_target, loader_iteration
from pipekit.pipes.base import IterDataPipe
from pipekit.pipes.resume import (
    SnapshotPlan,
    apply_seeds,
    epoch_marks,
    materialize_snapshot,
    not_snapshot_capable,
    pending_seeds,
    pipeline_pipes,
    prepare_for_resume,
    restore_pipeline,
)

__all__ = ["DataLoader", "sharding_points", "warn_if_unsharded"]

logger = logging.getLogger("pipekit")

_REPORT = "report"  # the key of a worker's state that carries its skip counts and last file to the main process
_REPORT_ITEMS = 10  # skipped items each pipe of each worker reports in full


def _skip_logs(pipes: list[Any]) -> list[tuple[int, SkipLog]]:
    return [(i, log) for i, dp in enumerate(pipes) if isinstance(log := getattr(dp, "skip_log", None), SkipLog)]


def _stage_name(pipe: Any) -> str:
    name = getattr(type(pipe), "functional_name", None)
    return f"{name} ({type(pipe).__name__})" if name else type(pipe).__name__


# torch >= 2.14 warns on every call of its deprecated set_vital, which StatefulDataLoader.__init__ makes.
_SET_VITAL = r"'set_vital' is deprecated"


def _ignore_set_vital() -> None:
    """Add a filter for torch's ``set_vital`` deprecation warning only (message and category)."""
    warnings.filterwarnings("ignore", message=_SET_VITAL, category=UserWarning)


def sharding_points(pipe: IterDataPipe) -> list[Any]:
    """The pipes of ``pipe``'s graph that split it across workers and ranks.

    A sharding point is a pipe with an ``apply_sharding`` method (torch's
    criterion): ``sharding_filter``, or a source that shards itself.
    """
    return [dp for dp in pipeline_pipes(pipe) if inspect.ismethod(getattr(dp, "apply_sharding", None))]


def _describe(pipe: IterDataPipe) -> str:
    """``IterableWrapper -> Mapper -> Batcher``: the pipe's graph, from its sources, for messages."""
    names = [type(dp).__name__.removesuffix("IterDataPipe") for dp in reversed(pipeline_pipes(pipe))]
    if len(names) > 8:
        names = [*names[:3], "...", *names[-4:]]
    return " -> ".join(names)


def warn_if_unsharded(
    pipe: IterDataPipe,
    num_workers: int,
    world_size: int,
    stacklevel: int = 2,
    loader: str = "pipekit.DataLoader",
    opt_out: str = "pass warn_unsharded=False",
) -> bool:
    """Warn (``UserWarning``) when ``pipe`` runs in workers or ranks but has no sharding point.

    Without one, each of the ``num_workers`` worker processes (at least one
    process) of each of the ``world_size`` ranks yields every item of the pipe.
    Returns whether it warned.  ``stacklevel`` is counted from the caller;
    ``loader`` and ``opt_out`` (how to silence it) go into the message.
    """
    if num_workers == 0 and world_size <= 1:
        return False
    if sharding_points(pipe):
        return False
    copies = max(num_workers, 1) * world_size
    if copies > 1:
        where = (
            f"runs in {max(num_workers, 1)} process(es) on each of {world_size} rank(s), and each yields every item: "
            f"every item comes {copies} times per epoch"
        )
    else:
        where = "runs in a worker process, and cannot be split: with more workers or ranks each would yield every item"
    warnings.warn(
        f"{loader}: the DataPipe {_describe(pipe)} has no sharding point (no sharding_filter, nor a pipe that applies "
        f"sharding) but {where}. Add .sharding_filter() after the source (after its shuffle), or {opt_out} if every "
        "worker and rank is meant to read it all.",
        UserWarning,
        stacklevel=stacklevel + 1,
    )
    return True


def _world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


class _ResumablePipe(LoaderPipeWrapper):
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

    def __getstate__(self) -> Any:
        # The channel travels to the workers with the pipe (it is only set while the loader starts them).
        return (super().__getstate__(), self._channel)

    def __setstate__(self, state: Any) -> None:
        base, channel = state
        super().__setstate__(base)
        self._init_resume_fields()
        self._channel = channel

    def __iter__(self) -> _ResumablePipe:
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
            self._logs = _skip_logs(self._pipes)
        self._in_worker = torch.utils.data.get_worker_info() is not None
        pending = self._pending
        self._cache = None
        self._base_state = pending
        self._since_start = 0
        self._yielded = 0
        self._exhausted = False
        if pending is not None and pending["mode"] == "snapshot":
            restore_pipeline(self.pipe, pending["pipes"])
            self._yielded = int(pending["yielded"])
        elif pending is not None and pending.get("seeds") is not None:
            apply_seeds(self._pipes, pending["seeds"])
        # What a checkpoint needs to describe pipes that have not started yet.
        self._marks = epoch_marks(self._pipes)
        self._seeds = pending_seeds(self._pipes)
        self._plan = SnapshotPlan(self._pipes, self._marks, self._seeds)
        self._run += 1
        self.restart()
        if pending is not None and pending["mode"] == "count":
            self._skip(int(pending["yielded"]))

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
            f"{stream_name(stream)}, which a DataLoader worker cannot send to the main process; read the "
            "stream inside the worker, at the end of the pipeline: e.g. .read_from_stream() for (url, stream) "
            "pairs, .map(read_fn) with a function returning the stream's bytes (stream.read()), or a decoder "
            "(.decode(), .decode_image())"
        )

    def _report(self) -> dict[str, Any]:
        """The skip counts and last file of this process, as plain data (see :meth:`DataLoader.skip_report`)."""
        skips = {i: log.summary(_REPORT_ITEMS) for i, log in self._logs if log.count}
        last = last_opened()
        return {"skips": skips, "last": list(last) if last is not None else None}

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
        if keep and state["mode"] == "snapshot":
            state = self._worker_states().keep(self._run, self._yielded, state)
        state = {**state, _REPORT: self._report()}
        self._cache = (key, state)
        return state

    def _worker_states(self) -> WorkerStates:
        if self._kept is None:
            assert self._channel is not None
            info = torch.utils.data.get_worker_info()
            self._kept = WorkerStates(self._channel, info.id if info is not None else 0, _materialize_state)
        return self._kept

    def _make_state(self, lazy: bool = False) -> dict[str, Any]:
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
            return {"mode": "count", "yielded": self._yielded, "seeds": self._seeds}
        return {"mode": "snapshot", "pipes": snap, "yielded": self._yielded}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("mode") not in ("snapshot", "count"):
            raise ValueError(f"not a pipekit.DataLoader worker state: {state!r:.200}")
        # The report described the run that wrote the checkpoint; this run reports its own.
        self._pending = {k: v for k, v in state.items() if k != _REPORT}
        # The fetcher may already hold an iterator over this object: restart it in place.
        self._start()


def _materialize_state(state: dict[str, Any]) -> dict[str, Any]:
    """A worker's kept position as plain data (a lazy snapshot's pipes rebuilt), before it is sent."""
    pipes = state.get("pipes")
    if state.get("mode") == "snapshot" and isinstance(pipes, dict):
        plain = materialize_snapshot(pipes)
        if plain is not pipes:
            return {**state, "pipes": plain}
    return state


def _worker_states(iterator: Any) -> dict[int, dict[str, Any]]:
    """The latest state each worker of a multi-process iterator sent, by worker id (torchdata's bookkeeping)."""
    out: dict[int, dict[str, Any]] = {}
    for key, snapshot in (getattr(iterator, "_worker_snapshots", None) or {}).items():
        try:
            state = snapshot.get_state() or {}
        except Exception:  # a snapshot torchdata has not filled in yet
            continue
        fetcher = state.get("fetcher_state") or {}
        mine = fetcher.get("dataset_iter_state") or state.get("dataset_state")
        if isinstance(mine, dict):
            out[int(str(key).rsplit("_", 1)[-1])] = mine
    return out


def _worker_reports(iterator: Any) -> dict[int, dict[str, Any]]:
    states = _worker_states(iterator)
    return {wid: state[_REPORT] for wid, state in states.items() if isinstance(state.get(_REPORT), dict)}


class _WorkersIter(_StatefulMultiProcessingDataLoaderIter):
    """torchdata's multi-process iterator, naming the worker (and its last file) when one dies."""

    # Bound here: an iterator collected at interpreter exit may find the module's globals cleared.
    _getpid = staticmethod(os.getpid)
    _is_finalizing = staticmethod(sys.is_finalizing)
    _forget_workers = staticmethod(shm.forget_workers)

    def _mark_worker_as_unavailable(self, worker_id: int, shutdown: bool = False) -> None:
        # torch tells a worker whose data ended to exit as soon as its StopIteration arrives, which
        # can be ahead of that worker's last batches (still held here, in order, behind another
        # worker's). A checkpoint after one of those names a position only that worker keeps
        # (pipekit._worker_states): so it stays, paused as persistent workers are, and is told to
        # exit when the workers are shut down.
        if shutdown or self._persistent_workers:
            super()._mark_worker_as_unavailable(worker_id, shutdown)
            return
        self._workers_status[worker_id] = False
        self.__dict__.setdefault("_pipekit_paused", set()).add(worker_id)

    def _shutdown_workers(self) -> None:
        # An iterator left to the garbage collector (e.g. held by a caught WorkerDiedError's
        # traceback) can be collected inside the next loader's forked workers: there its
        # workers are not children, and torch's shutdown fails ("can only test a child process")
        # or signals the owner's queues. Only the process that started the workers shuts them down.
        if getattr(self, "_owner_pid", self._getpid()) != self._getpid():
            return
        for worker_id in self.__dict__.pop("_pipekit_paused", ()):  # done: they exit with the rest
            with contextlib.suppress(Exception):  # a queue already closed: the worker is gone
                self._index_queues[worker_id].put(None)
        workers = list(getattr(self, "_workers", None) or [])
        super()._shutdown_workers()
        # Their pool buffers stay mapped here until forgotten (batches still held keep theirs);
        # at interpreter exit there is nothing to forget.
        if workers and not self._is_finalizing():
            self._forget_workers(w.pid for w in workers if w.pid is not None and w.exitcode is not None)

    def _get_data(self) -> Any:
        try:
            return super()._get_data()
        except RuntimeError as exc:
            died = self._describe_death(exc)
            if died is None:
                raise
            raise died from exc
        except (OSError, EOFError) as exc:
            # A worker killed while this process rebuilds a batch it sent (its tensors' file
            # descriptors come over the worker's socket) surfaces as a connection error before
            # torch has reaped the worker. Give the death a moment to show, then name it.
            try:
                dead = self._dead_workers(wait=_DEATH_GRACE_S)
            except RuntimeError as signalled:  # torch's SIGCHLD handler: "DataLoader worker (pid N) is killed by ..."
                died = self._describe_death(signalled)
            else:
                if not dead:
                    raise
                pids = ", ".join(str(w.pid) for w in dead)
                message = f"DataLoader worker (pid(s) {pids}) exited unexpectedly while sending a batch ({exc!r})"
                died = self._describe_death(RuntimeError(message))
            if died is None:
                raise
            raise died from exc

    def _dead_workers(self, wait: float) -> list[Any]:
        workers = list(getattr(self, "_workers", None) or [])
        deadline = time.monotonic() + wait
        while True:
            dead = [w for w in workers if not w.is_alive()]
            if dead or time.monotonic() >= deadline:
                return dead
            time.sleep(0.05)

    def _describe_death(self, exc: RuntimeError) -> WorkerDiedError | None:
        message = str(exc)
        if isinstance(exc, WorkerDiedError) or not message.startswith("DataLoader worker (pid"):
            return None
        found = re.search(r"\(pid(?:\(s\))? ([\d, ]+)\)", message)  # "(pid(s) 12, 13)" or "(pid 12)"
        pids = {int(p) for p in re.findall(r"\d+", found.group(1))} if found else set()
        dead = [(wid, w) for wid, w in enumerate(getattr(self, "_workers", None) or []) if w.pid in pids]
        if not dead:
            return WorkerDiedError(f"{message} (pipekit cannot tell which worker)")
        reports = _worker_reports(self)
        parts = []
        fields: dict[str, Any] = {}
        for wid, proc in dead:
            code = proc.exitcode
            sig = signal.Signals(-code).name if isinstance(code, int) and -code in _SIGNALS else None
            how = f"killed by {sig}" if sig else (f"exit code {code}" if code is not None else "still exiting")
            last = (reports.get(wid) or {}).get("last")
            text = f"worker {wid} (pid {proc.pid}) {how}"
            if last:
                text += f"; with its last batch received it reported reading {last[0]!r} in {last[1]}"
            else:
                text += "; it had reported no file opened yet"
            parts.append(text)
            if not fields:
                fields = {
                    "worker_id": wid,
                    "pid": proc.pid,
                    "signal": sig,
                    "url": last[0] if last else None,
                    "stage": last[1] if last else None,
                }
        return WorkerDiedError(f"{message}: {'; '.join(parts)}", **fields)


_SIGNALS = frozenset(int(s) for s in signal.Signals)
# How long a connection error from the data queue waits for a worker's death to show.
_DEATH_GRACE_S = 2.0


# torchdata asks ``isinstance(obj, Stateful)`` (a runtime-checkable ``typing.Protocol``) through its
# ``try_to_serialize`` of the dataset and of its iterator in every worker with every batch
# (``worker._make_state_dict``), and of the sampler and its iterator in the main process with every
# batch (``_get_main_state``).  On Python 3.11 each such check re-derives the protocol's members
# (``typing._get_protocol_attrs``, twice) and, for torch's iterator wrapper, forwards through its
# ``__getattr__``: measured at ~30% of a worker's per-batch snapshot (~70 of 230 us after decoding a
# batch of 32 JPEGs, caches cold) and ~4 checks per batch in the main process.  For the objects a
# pipekit loader hands torchdata, the answer is known from the exact type: pipekit's
# ``_ResumablePipe`` (and torch's iterator wrapper around it) is Stateful; the sampler torch uses for
# iterable datasets, and the generator it iterates, are not (neither their class nor the instance
# has a ``state_dict``).  Those go straight to the answer; every other object gets torchdata's own
# function, so its behaviour is unchanged for everything else.
_TORCHDATA_SERIALIZERS = ("torchdata.stateful_dataloader.worker", "torchdata.stateful_dataloader.stateful_dataloader")


def _fast_try_to_serialize(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def try_to_serialize(obj: Any) -> Any:
        cls = type(obj)
        if cls is _ResumablePipe:
            return obj.state_dict()
        if cls is types.GeneratorType:  # no attributes of its own, and its class has no state_dict
            return None
        if cls is _InfiniteConstantSampler and not obj.__dict__ and not hasattr(cls, "state_dict"):
            return None
        inner = hooked_iterator_target(obj)
        if inner is not None and type(inner) is _ResumablePipe:
            return inner.state_dict()  # what the wrapper's forwarded state_dict() returns
        return original(obj)

    try_to_serialize._pipekit_fast = True  # type: ignore[attr-defined]
    try_to_serialize.__wrapped__ = original  # type: ignore[attr-defined]
    return try_to_serialize


def _install_fast_serialize() -> None:
    """Route torchdata's ``try_to_serialize`` (worker and main process) through the shortcut above, once."""
    for name in _TORCHDATA_SERIALIZERS:
        module = sys.modules.get(name) or importlib.import_module(name)
        current = getattr(module, "try_to_serialize", None)
        if current is not None and not getattr(current, "_pipekit_fast", False):
            module.try_to_serialize = _fast_try_to_serialize(current)


def _worker_init(user_fn: Callable[[int], None] | None, threads: int | None, worker_id: int) -> None:
    # The worker is pipekit's process: drop torch's set_vital deprecation there too (that message only).
    _ignore_set_vital()
    _install_fast_serialize()
    if threads is not None:
        torch.set_num_threads(threads)
    # Batches made by torch's default_collate (the collate pipe, batch_size=...) go to the main
    # process in the worker's reused shared-memory buffers, sent by reference (pipekit.shm).
    if shm.pool_enabled():
        use_shared_buffers_in_default_collate()
    if user_fn is not None:
        user_fn(worker_id)


class DataLoader(StatefulDataLoader):
    """A resumable DataLoader for pipekit pipes (and any Dataset).

    Takes every argument of ``torch.utils.data.DataLoader`` and of torchdata's
    ``StatefulDataLoader``; differs only in these defaults:

    * ``batch_size=None`` when ``dataset`` is a DataPipe (pipes batch
      themselves with ``batch``/``bucketbatch``), torch's ``1`` otherwise;
    * ``persistent_workers=True`` when ``num_workers > 0``;
    * ``pin_memory=True`` when CUDA is available;
    * each worker runs ``torch.set_num_threads(worker_threads)`` (default 1)
      before the user's ``worker_init_fn``, so workers do not oversubscribe
      the CPU;
    * a DataPipe without a sharding point run by workers (``num_workers > 0``)
      or by several ``torch.distributed`` ranks gets a ``UserWarning`` naming
      it, once, when the loader is created: each worker and rank would yield
      every item (torch says nothing);
    * torch's ``'set_vital' is deprecated`` warning, which torchdata's
      ``StatefulDataLoader`` triggers for every loader, is not shown (that
      message only: other warnings raised while the loader and its workers
      start get through).

    ``state_dict()`` / ``load_state_dict()`` resume mid-epoch with no sample
    repeated or lost; for DataPipes the position of every pipe is restored
    rather than replayed (see :mod:`pipekit.pipes.resume`).  With workers,
    each worker keeps its last few positions and sends one only when
    ``state_dict()`` asks for it (see :mod:`pipekit._worker_states`), so
    exact resume does not copy buffered items (a shuffle buffer) with every
    batch; ``state_dict()`` then takes as long as pickling those buffers.

    Args:
        dataset: an ``IterDataPipe``, ``MapDataPipe`` or ``Dataset``.
        worker_threads: torch threads per worker process (``None`` leaves
            torch's default).
        warn_unsharded: warn when a DataPipe without a sharding point runs in
            workers or ranks (see above); ``False`` when every worker and rank
            is meant to read the whole pipe.
        **kwargs: as for ``StatefulDataLoader``.

    :meth:`shutdown` stops the (persistent) workers before the loader is
    garbage collected.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int | Any | None = ...,
        *args: Any,
        num_workers: int = 0,
        pin_memory: bool | None = None,
        persistent_workers: bool | None = None,
        worker_init_fn: Callable[[int], None] | None = None,
        worker_threads: int | None = 1,
        warn_unsharded: bool = True,
        **kwargs: Any,
    ) -> None:
        is_pipe = isinstance(dataset, IterDataPipe)
        if batch_size is ...:
            batch_size = None if is_pipe else 1
        if not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers must be a non-negative int, got {num_workers!r}")
        if pin_memory is None:
            pin_memory = torch.cuda.is_available()
        if persistent_workers is None:
            persistent_workers = num_workers > 0
        if num_workers > 0:
            worker_init_fn = functools.partial(_worker_init, worker_init_fn, worker_threads)
        with warnings.catch_warnings():
            _ignore_set_vital()
            super().__init__(
                dataset,
                batch_size,
                *args,
                num_workers=num_workers,
                pin_memory=pin_memory,
                persistent_workers=persistent_workers,
                worker_init_fn=worker_init_fn,
                **kwargs,
            )
        if is_pipe and warn_unsharded:
            warn_if_unsharded(dataset, num_workers, _world_size(), stacklevel=2)
        if is_pipe:
            # StatefulDataLoader wrapped the pipe in torch's serialization wrapper;
            # use the resumable subclass instead (DataLoader forbids plain assignment).
            object.__setattr__(self, "dataset", _ResumablePipe(dataset))

    def _get_iterator(self) -> Any:
        # Keep what the workers of the iterator being replaced reported (persistent_workers=False
        # starts new workers each epoch), then name dying workers in the new one's errors.
        old = getattr(self, "_iterator", None)
        if old is not None and getattr(old, "_worker_snapshots", None):
            self._skip_reports_before = [*getattr(self, "_skip_reports_before", []), *_skip_summaries(old)]
        dataset = self.dataset
        if self.num_workers == 0 or not isinstance(dataset, _ResumablePipe):
            return self._wrap_iterator(self._start_iterator())
        _install_fast_serialize()
        # Workers keep their positions and send them when state_dict() asks (pipekit._worker_states):
        # open the queues for that before they start, and hand them over with the pipe.
        self._close_channel()
        context = self.multiprocessing_context or multiprocessing
        channel = StateChannel(context, self.num_workers, depth=(self.prefetch_factor or 2) + 2)
        dataset._channel = channel
        try:
            it = self._start_iterator()
        finally:
            dataset._channel = None
        self._state_channel = channel
        return self._wrap_iterator(it)

    def _start_iterator(self) -> Any:
        # Workers are forked here. Garbage this process has not collected yet (say a dead run's
        # iterator, held in a cycle by a caught exception's traceback) would otherwise be
        # collected inside every worker, running its finalizers there: torch's shutdown of
        # workers that are not that process's children, torch's temporary files unlinked twice.
        # Frozen objects are never collected by the children (the gc.freeze recipe for a fork
        # without exec); this process unfreezes them once the workers have started.
        frozen_before = gc.get_freeze_count()
        gc.freeze()
        try:
            return super()._get_iterator()
        finally:
            if frozen_before == 0:
                gc.unfreeze()

    @staticmethod
    def _wrap_iterator(it: Any) -> Any:
        if type(it) is _StatefulMultiProcessingDataLoaderIter:
            it.__class__ = _WorkersIter
            it._owner_pid = os.getpid()
        return it

    def _close_channel(self) -> None:
        channel = getattr(self, "_state_channel", None)
        self._state_channel = None
        if channel is not None:
            channel.close()

    def state_dict(self) -> dict[str, Any]:
        """The loader's position, to resume from with :meth:`load_state_dict`.

        With workers, each worker sends only a token with each batch and keeps
        its pipeline's position itself; this asks the workers for the positions
        the tokens stand for, so the checkpoint is complete (and made of plain
        data: it loads with ``torch.load(..., weights_only=True)`` when the items
        buffered in the pipeline do).
        """
        state = super().state_dict()
        return resolve_deferred(state, getattr(self, "_state_channel", None), self._worker_alive)

    def _worker_alive(self, worker: int) -> bool:
        workers = getattr(getattr(self, "_iterator", None), "_workers", None) or []
        return worker < len(workers) and workers[worker].is_alive()

    def skip_report(self) -> SkipReport:
        """What the pipeline's pipes skipped under ``on_error="skip"``, added up over every worker.

        With ``num_workers=0`` it reads the pipes' own ``skip_log``; with
        workers, the reports each worker sends with every batch (its counts
        per pipe, and its first skipped items with URL and reason) and when it
        runs out, so it is up to date with the batches received (with
        ``snapshot_every_n_steps=n``, every n batches).  Counts add up over
        epochs: persistent workers keep theirs, and with
        ``persistent_workers=False`` the loader keeps what each epoch's
        workers reported.  Workers started by ``load_state_dict`` report
        only their own skips (the counts a checkpoint holds are not restored).

        Returns:
            a :class:`~pipekit.errors.SkipReport`: ``count``, ``counts`` per
            stage, ``skipped`` (the first items of each pipe and worker).

        Example:
            >>> import fsspec
            >>> from pipekit import DataLoader
            >>> from pipekit.pipes import IterableWrapper
            >>> fsspec.filesystem("memory").pipe("/skip_report_doc/a.txt", b"a")
            >>> urls = ["memory://skip_report_doc/a.txt", "memory://skip_report_doc/missing.txt"]
            >>> pipe = IterableWrapper(urls).open_files_by_fsspec(mode="rb", on_error="skip").read_from_stream()
            >>> loader = DataLoader(pipe)
            >>> [url for url, _ in loader]
            ['memory://skip_report_doc/a.txt']
            >>> report = loader.skip_report()
            >>> report.count, report.counts, report.skipped[0].url
            (1, {'open_files_by_fsspec': 1}, 'memory://skip_report_doc/missing.txt')
        """
        dataset = self.dataset
        summaries = list(getattr(self, "_skip_reports_before", []))
        if self.num_workers == 0:
            if isinstance(dataset, _ResumablePipe):
                summaries += [log.summary(_REPORT_ITEMS) for _, log in _skip_logs(pipeline_pipes(dataset.pipe))]
            elif isinstance(getattr(dataset, "skip_log", None), SkipLog):
                summaries.append(dataset.skip_log.summary(_REPORT_ITEMS))
        else:
            summaries += _skip_summaries(getattr(self, "_iterator", None))
        return SkipReport.from_summaries(summaries)

    def shutdown(self) -> None:
        """Stop the worker processes now; safe to call more than once.

        Persistent workers otherwise live as long as the loader.  A later
        ``iter(loader)`` starts new workers, at the start of an epoch (or at a
        state loaded with ``load_state_dict``).
        """
        iterator = self._iterator
        self._iterator = None
        self._initial_iter_for_state_dict = False
        shutdown_workers = getattr(iterator, "_shutdown_workers", None)
        if shutdown_workers is not None:
            shutdown_workers()
        self._close_channel()


def _skip_summaries(iterator: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for _, report in sorted(_worker_reports(iterator).items()):
        skips = report.get("skips") or {}
        out += [skips[i] for i in sorted(skips)]
    return out
