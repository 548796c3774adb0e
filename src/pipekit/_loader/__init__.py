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
:mod:`pipekit.pipes._resume`.  A pipeline containing a pipe that cannot report
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

The loader's parts: :mod:`pipekit._loader._arguments` (its arguments, checked
up front), :mod:`pipekit._loader._checkpoint` (what ``state_dict()`` records and
how ``load_state_dict()`` checks and applies it: the base of ``DataLoader``),
:mod:`pipekit._loader._pipe` (the pipe the loader holds in each worker:
checkpoints, reports), :mod:`pipekit._loader._sending` (what leaves a worker
must pickle), :mod:`pipekit._loader._workers` (the main process's side of the
workers: reports, deaths), and :mod:`pipekit._loader_seam`, through which all
of them reach torch's and torchdata's DataLoader internals.
"""

from __future__ import annotations

import functools
import gc
import logging
import multiprocessing
import os
import warnings
from collections.abc import Callable
from typing import Any

import torch

from pipekit import _shm as shm
from pipekit._loader._arguments import (
    _WHERE,
    check_dataset,
    check_generator,
    check_seconds,
    check_worker_options,
    sharding_points,
    warn_if_unsharded,
    world_size,
)
from pipekit._loader._checkpoint import CHECKPOINT_KEY, CheckpointingLoader
from pipekit._loader._pipe import REPORT_ITEMS, _CheckpointedPipe, install_fast_serialize, skip_logs
from pipekit._loader._pipe import fast_try_to_serialize as _fast_try_to_serialize  # noqa: F401 -- see below
from pipekit._loader._workers import _WorkersIter, skip_summaries
from pipekit._loader_seam import (
    has_worker_states,
    ignore_set_vital_warning,
    is_workers_iterator,
    shut_down_workers,
    switch_iterator_class,
)
from pipekit._validate import check_int
from pipekit._worker_states import StateChannel
from pipekit.collate import use_shared_buffers_in_default_collate
from pipekit.errors import SkipLog, SkipReport
from pipekit.pipes._resume import pipeline_pipes, pipeline_signature
from pipekit.pipes.base import IterDataPipe

__all__ = ["CHECKPOINT_KEY", "STATE_TIMEOUT_S", "DataLoader", "sharding_points", "warn_if_unsharded"]

logger = logging.getLogger("pipekit")

#: How long ``state_dict()`` waits, by default, for the workers to send their positions (seconds).  A worker
#: answers from a thread of its own, also while its pipe is busy; the time is that of pickling its buffered
#: items (a shuffle buffer of ~1 GB of encoded images took 17-19 s), so 60 s leaves room for three times that
#: and still names a frozen worker within a minute instead of torch's silence.
STATE_TIMEOUT_S = 60.0


# Moved to pipekit._loader._pipe; kept importable here for the tests that reach them through pipekit._loader.
_install_fast_serialize = install_fast_serialize


def _worker_init(user_fn: Callable[[int], None] | None, threads: int | None, worker_id: int) -> None:
    # The worker is pipekit's process: drop torch's set_vital deprecation there too (that message only).
    ignore_set_vital_warning()
    install_fast_serialize()
    if threads is not None:
        torch.set_num_threads(threads)
    # Batches made by torch's default_collate (the collate pipe, batch_size=...) go to the main
    # process in the worker's reused shared-memory buffers, sent by reference (pipekit._shm).
    if shm.pool_enabled():
        use_shared_buffers_in_default_collate()
    if user_fn is not None:
        user_fn(worker_id)


class DataLoader(CheckpointingLoader):
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
    rather than replayed (see :mod:`pipekit.pipes._resume`).  With workers,
    each worker keeps its last few positions and sends one only when
    ``state_dict()`` asks for it (see :mod:`pipekit._worker_states`), so
    exact resume does not copy buffered items (a shuffle buffer) with every
    batch; ``state_dict()`` then takes as long as pickling those buffers,
    and at most ``state_timeout`` seconds.

    Where a checkpoint may be taken, for a DataPipe: anywhere, with any
    number of workers, persistent or not.  One taken at the end of an epoch
    (after ``for batch in loader:``) resumes to the next epoch, exactly as
    the loader that took it goes on: the checkpoint fixes the random state
    the next epoch's seeds are drawn from (that of ``generator``, or torch's
    global one), for both, so random draws between the checkpoint and the
    next epoch (an evaluation) change neither; a ``manual_seed`` of that
    generator after the checkpoint is taken, or after it is loaded (a
    training loop seeding each epoch), decides the next epoch, in both, as
    it does in a run that takes no checkpoint.  A mid-epoch checkpoint
    records the state of the loader's own ``generator`` (when one is given),
    and the resumed loader's generator goes on from it, so the epochs after
    the resumed one are the uninterrupted run's too.  ``load_state_dict()``
    refuses, with :class:`~pipekit.errors.CheckpointError`, a state that is
    empty or not a DataLoader's, one taken from another pipeline (its pipes,
    in order, differ) and, mid-epoch, one taken with another number of
    workers.

    Args:
        dataset: an ``IterDataPipe``, ``MapDataPipe`` or ``Dataset``.
        batch_size: as torch's (``None``: no batching by the loader).
        num_workers: worker processes (0: load in the main process).
        worker_threads: torch threads per worker process (``None`` leaves
            torch's default).
        warn_unsharded: warn when a DataPipe without a sharding point runs in
            workers or ranks (see above); ``False`` when every worker and rank
            is meant to read the whole pipe.
        state_timeout: how long ``state_dict()`` waits for the workers to
            send their positions, in seconds (default 60: see
            :data:`STATE_TIMEOUT_S`); a worker that has not answered by then
            (stopped, or frozen in code holding the GIL) raises
            :class:`~pipekit.errors.WorkerStateError` naming it.  A worker
            busy in its pipe still answers.
        **kwargs: as for ``StatefulDataLoader`` (``prefetch_factor``,
            ``timeout``, ``snapshot_every_n_steps``...), checked up front:
            ``prefetch_factor`` and a non-zero ``timeout`` need workers.

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
        state_timeout: float = STATE_TIMEOUT_S,
        **kwargs: Any,
    ) -> None:
        is_pipe = isinstance(dataset, IterDataPipe)
        check_dataset(dataset)
        check_generator(kwargs.get("generator"))
        if batch_size is ...:
            batch_size = None if is_pipe else 1
        batch_size = check_int(batch_size, "batch_size", _WHERE, minimum=1, allow_none=True)
        num_workers = check_int(num_workers, "num_workers", _WHERE, minimum=0)
        worker_threads = check_int(worker_threads, "worker_threads", _WHERE, minimum=1, allow_none=True)
        check_worker_options(num_workers, persistent_workers, kwargs)
        for name, fn in (("worker_init_fn", worker_init_fn), ("collate_fn", kwargs.get("collate_fn"))):
            if fn is not None and not callable(fn):
                raise TypeError(f"{_WHERE}: {name} must be a callable or None, got {type(fn).__name__} {fn!r:.50}")
        state_timeout = check_seconds(state_timeout, "state_timeout", minimum_excluded=True)
        if pin_memory is None:
            pin_memory = torch.cuda.is_available()
        if persistent_workers is None:
            persistent_workers = num_workers > 0
        if num_workers > 0:
            worker_init_fn = functools.partial(_worker_init, worker_init_fn, worker_threads)
        with warnings.catch_warnings():
            ignore_set_vital_warning()
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
            warn_if_unsharded(dataset, num_workers, world_size(), stacklevel=2)
        if is_pipe:
            # StatefulDataLoader wrapped the pipe in torch's serialization wrapper;
            # use the resumable subclass instead (DataLoader forbids plain assignment).
            self.replace_dataset(_CheckpointedPipe(dataset))
        self.state_timeout = state_timeout
        # What a checkpoint of this loader fits, worked out once: walking the graph pickles the pipes (and
        # whatever they buffer), which a checkpoint must not pay for.
        self._signature = pipeline_signature(dataset) if is_pipe else None
        # The random state the next epoch's seeds come from, fixed by a checkpoint taken at an epoch's end.
        self._next_epoch_rng: torch.Tensor | None = None
        # The generator's state when that was fixed (taken or loaded): a manual_seed since then overrides it.
        self._rng_anchor: torch.Tensor | None = None
        # Each persistent worker's global generators at the end of the epoch an end-of-epoch checkpoint loaded
        # here was taken at: the next epoch's workers start from them.
        self._worker_rngs: list[Any] | None = None
        # What the pipes of each process (each worker, or the main process) carried into the next epoch at the
        # end-of-epoch checkpoint loaded here (in_memory_cache's frozen cache): the next epoch starts with it.
        self._carries: list[Any] | None = None
        # The state of the loader's own generator when the mid-epoch checkpoint loaded here was taken.
        self._resumed_generator: torch.Tensor | None = None

    def __iter__(self) -> Any:
        # Resuming an epoch: the seeds torch draws for a new iterator were drawn when that epoch started, before
        # the checkpoint, and the checkpoint's seeds replace them; the random state a training loop restored with
        # the checkpoint goes on untouched (a shuffle's next pass under a cycle draws its seed from it).
        resuming = self.next_iter_state is not None and isinstance(self.dataset, _CheckpointedPipe)
        target = self.generator if self.generator is not None else torch.default_generator
        before = target.get_state() if resuming else None
        after, self._resumed_generator = self._resumed_generator, None
        with self._next_epoch_seeded():
            iterator = super().__iter__()
        if after is not None and self.generator is not None:
            # the loader's own generator goes on from where the checkpointed loader's was (its epoch's draws
            # made), so the epochs after the resumed one draw what the uninterrupted run's drew
            self.generator.set_state(after)
        elif before is not None:
            target.set_state(before)
        return iterator

    def new_iterator(self) -> Any:
        # Keep what the workers of the iterator being replaced reported (persistent_workers=False
        # starts new workers each epoch), then name dying workers in the new one's errors.
        old = self.current_iterator()
        if old is not None and has_worker_states(old):
            self._skip_reports_before = [*getattr(self, "_skip_reports_before", []), *skip_summaries(old)]
        dataset = self.dataset
        if isinstance(dataset, _CheckpointedPipe) and self.next_iter_state is None:
            # A new epoch, not a resumed one: a state loaded into the pipe belongs to the epoch it resumed, even
            # one that never pulled from it (torch's fetcher had ended: a checkpoint after a partial last batch).
            dataset._pending = None
        if isinstance(dataset, _CheckpointedPipe) and self.next_iter_state is None:
            dataset._start_carries, self._carries = self._carries, None
        if self.num_workers == 0 or not isinstance(dataset, _CheckpointedPipe):
            return self._wrap_iterator(self._start_iterator())
        install_fast_serialize()
        # Workers keep their positions and send them when state_dict() asks (pipekit._worker_states):
        # open the queues for that before they start, and hand them over with the pipe.
        self._close_channel()
        context = self.multiprocessing_context or multiprocessing
        channel = StateChannel(context, self.num_workers, depth=(self.prefetch_factor or 2) + 2)
        dataset._channel = channel
        if self.next_iter_state is None:
            dataset._start_rngs, self._worker_rngs = self._worker_rngs, None
        try:
            it = self._start_iterator()
        finally:
            dataset._channel = None
            dataset._start_rngs = None
            dataset._start_carries = None
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
            return self.torch_iterator()
        finally:
            if frozen_before == 0:
                gc.unfreeze()

    @staticmethod
    def _wrap_iterator(it: Any) -> Any:
        if is_workers_iterator(it):
            switch_iterator_class(it, _WorkersIter)
            it._pipekit_owner_pid = os.getpid()
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
        the tokens stand for (waiting at most ``state_timeout`` seconds), so the
        checkpoint is complete (and made of plain data: it loads with
        ``torch.load(..., weights_only=True)`` when the items buffered in the
        pipeline do).  Under :data:`CHECKPOINT_KEY` it records what it fits
        (the pipeline's pipes, the number of workers).  A worker's position
        includes its process's global generators (torch's, Python's), which
        the resumed worker continues.  At the end of an epoch it holds no
        positions: it records the random state the next epoch starts from,
        which this loader's next epoch then starts from too (and, with
        persistent workers, the generators each worker carries into it), and
        what pipes keep across epochs (``in_memory_cache``'s frozen cache, per
        worker with persistent workers).
        """
        return self._resolved(self._deferred_state())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from a :meth:`state_dict` at the next ``iter()``.

        Raises :class:`~pipekit.errors.CheckpointError` naming what does not
        fit: an empty state or one that is not a DataLoader's, one from
        another pipeline (or another kind of dataset), or, mid-epoch, one
        taken with another number of workers.
        """
        self._load_checkpoint(state_dict)

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
            if isinstance(dataset, _CheckpointedPipe):
                summaries += [log.summary(REPORT_ITEMS) for _, log in skip_logs(pipeline_pipes(dataset.pipe))]
            elif isinstance(getattr(dataset, "skip_log", None), SkipLog):
                summaries.append(dataset.skip_log.summary(REPORT_ITEMS))
        else:
            summaries += skip_summaries(self.current_iterator())
        return SkipReport.from_summaries(summaries)

    def shutdown(self) -> None:
        """Stop the worker processes now; safe to call more than once.

        Persistent workers otherwise live as long as the loader.  A later
        ``iter(loader)`` starts new workers, at the start of an epoch (or at a
        state loaded with ``load_state_dict``).
        """
        shut_down_workers(self.detach_iterator())
        self._close_channel()
