"""The checkpoints of ``pipekit.DataLoader``: what ``state_dict()`` records and how ``load_state_dict()`` applies it.

:class:`CheckpointingLoader` is the half of :class:`pipekit.DataLoader` that assembles a checkpoint (the
workers' positions, resolved from their tokens; under :data:`CHECKPOINT_KEY` the record of what the checkpoint
fits: the pipeline's pipes, the number of workers, and at the end of an epoch the random state the next epoch
starts from, each persistent worker's generators and what the pipes carry into it), checks a checkpoint
against the loader before loading it (:class:`~pipekit.errors.CheckpointError` naming what does not fit), and
starts the next epoch from the random state an end-of-epoch checkpoint fixed.  ``DataLoader`` holds the public
methods (``state_dict``, ``load_state_dict``) and their documentation, the arguments and the iteration; the
fields used here (``_signature``, ``_next_epoch_rng``, ``_rng_anchor``, ``_worker_rngs``, ``_carries``,
``_resumed_generator``) are set in its ``__init__``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from pipekit._loader._arguments import _WHERE
from pipekit._loader._pipe import EPOCH_CARRY, WORKER_RNG, _CheckpointedPipe
from pipekit._loader_seam import ITERATOR_FINISHED, LoaderBase, state_finished, worker_dataset_states, worker_processes
from pipekit._seeds import draw_seed
from pipekit._worker_states import resolve_deferred
from pipekit.errors import CheckpointError

__all__ = ["CHECKPOINT_KEY", "CheckpointingLoader"]


#: The key of a checkpoint under which pipekit records what the checkpoint fits: the pipeline's pipes, the
#: number of workers, and (at the end of an epoch) the random state the next epoch starts from.
CHECKPOINT_KEY = "pipekit"
_RECORD_VERSION = 1


class CheckpointingLoader(LoaderBase):
    """The checkpoints of :class:`pipekit.DataLoader` (see the module docstring): its base, under its public methods."""

    @contextlib.contextmanager
    def _next_epoch_seeded(self) -> Iterator[None]:
        """Start an epoch from the random state an end-of-epoch checkpoint fixed, if there is one.

        torch draws an epoch's seeds (the pipes' shared seed, the workers' base
        seed) from ``generator`` when the epoch starts; here they are drawn
        from a copy of the state fixed by the checkpoint, and ``generator``
        (torch's global one when ``None``) advances by as many draws, as it
        would have.  Nothing happens when no epoch starts inside.
        """
        fixed = self._next_epoch_rng
        real = self.generator
        target = real if real is not None else torch.default_generator
        if fixed is not None and self._rng_anchor is not None and _reseeded(self._rng_anchor, target):
            # The user seeded the generator for the next epoch (manual_seed) after the checkpoint was taken
            # (or loaded): that seed decides the epoch, as it does in a run that takes no checkpoint.
            self._next_epoch_rng = self._rng_anchor = fixed = None
        if fixed is None:
            yield
            return
        seeded = torch.Generator(device=target.device)
        seeded.set_state(fixed)
        self.generator = seeded
        try:
            yield
        finally:
            self.generator = real
        draws = _draws_between(fixed, seeded)
        if draws:
            self._next_epoch_rng = self._rng_anchor = None
            for _ in range(draws):
                draw_seed(target)

    def _deferred_state(self) -> dict[str, Any]:
        """:meth:`state_dict` with the workers' tokens left in (cheap: the workers are not asked).

        A worker keeps the positions of its last ``prefetch_factor + 2`` batches, so such a state can be
        resolved (:meth:`_resolved`) a batch later.
        """
        with self._next_epoch_seeded():
            state = super().state_dict()
        record = self._record()
        if isinstance(self.dataset, _CheckpointedPipe) and state_finished(state):
            # The epoch ended: the workers may be gone (persistent_workers=False) and their positions
            # are those of an empty rest. What comes next is the next epoch, from these seeds.
            if self._next_epoch_rng is None:
                generator = self.generator if self.generator is not None else torch.default_generator
                self._next_epoch_rng = generator.get_state()
                self._rng_anchor = self._next_epoch_rng
            record["next_epoch_rng"] = self._next_epoch_rng.clone()
            rngs = self._persistent_worker_rngs()
            if rngs is not None:
                record["worker_rngs"] = rngs
            carries = self._epoch_carries()
            if carries is not None:
                record["carry"] = carries
            return {ITERATOR_FINISHED: True, CHECKPOINT_KEY: record}
        if self.generator is not None:
            record["generator"] = self.generator.get_state()  # where the next epoch's draws come from
        return {**state, CHECKPOINT_KEY: record}

    def _resolved(self, state: dict[str, Any]) -> dict[str, Any]:
        """``state`` with each worker token replaced by the position the worker kept for it."""
        return resolve_deferred(state, getattr(self, "_state_channel", None), self._worker_alive, self.state_timeout)

    def _persistent_worker_rngs(self) -> list[Any] | None:
        """The global generators each persistent worker ended the epoch with (as it carries them on), or None."""
        if not (self.num_workers and self.persistent_workers):
            return None
        states = worker_dataset_states(self.current_iterator())
        rngs = [states.get(i, {}).get(WORKER_RNG) if isinstance(states.get(i), dict) else None
                for i in range(self.num_workers)]
        return rngs if all(rng is not None for rng in rngs) else None

    def _epoch_carries(self) -> list[Any] | None:
        """What the pipes of each process carry into the next epoch (``in_memory_cache``'s frozen cache), or None.

        One entry per worker (persistent ones: others start the next epoch
        afresh), or one for the main process without workers.
        """
        dataset = self.dataset
        if self.num_workers == 0:
            carry = dataset.epoch_carry() if isinstance(dataset, _CheckpointedPipe) else None
            return None if carry is None else [carry]
        if not self.persistent_workers:
            return None
        states = worker_dataset_states(self.current_iterator())
        carries = [states[i].get(EPOCH_CARRY) if isinstance(states.get(i), dict) else None
                   for i in range(self.num_workers)]
        return carries if any(carry is not None for carry in carries) else None

    def _load_checkpoint(self, state_dict: dict[str, Any]) -> None:
        """What :meth:`pipekit.DataLoader.load_state_dict` does (see it)."""
        record = self._check_checkpoint(state_dict)
        state = {k: v for k, v in state_dict.items() if k != CHECKPOINT_KEY}
        self._next_epoch_rng = self._rng_anchor = self._worker_rngs = self._carries = None
        self._resumed_generator = None
        if isinstance(self.dataset, _CheckpointedPipe) and state_finished(state):
            # Taken at the end of an epoch: the next iter() starts the next epoch (from the checkpoint's
            # random state, when it has one), instead of restoring positions at the end of the old one.
            super().load_state_dict({})
            self.next_iter_state = None
            self.dataset._pending = None
            if record is not None and record.get("next_epoch_rng") is not None:
                self._next_epoch_rng = record["next_epoch_rng"].clone()
                generator = self.generator if self.generator is not None else torch.default_generator
                self._rng_anchor = generator.get_state()
            rngs = record.get("worker_rngs") if record is not None else None
            if rngs is not None and len(rngs) == self.num_workers and self.persistent_workers:
                self._worker_rngs = list(rngs)  # the same persistent workers would have gone on with them
            carries = record.get("carry") if record is not None else None
            if carries is not None and len(carries) == max(self.num_workers, 1) and (
                self.num_workers == 0 or self.persistent_workers
            ):
                self._carries = list(carries)  # the same processes would have kept it for the next epoch
            return
        super().load_state_dict(state)
        generator = record.get("generator") if record is not None else None
        if isinstance(generator, torch.Tensor):
            self._resumed_generator = generator.clone()

    def _record(self) -> dict[str, Any]:
        """What a checkpoint of this loader fits: the kind of dataset, the pipeline's pipes, the workers."""
        dataset = self.dataset
        is_pipe = isinstance(dataset, _CheckpointedPipe)
        return {
            "version": _RECORD_VERSION,
            "dataset": "pipe" if is_pipe else type(dataset).__qualname__,
            "pipeline": list(self._signature) if is_pipe and self._signature is not None else None,
            "num_workers": self.num_workers,
        }

    def _check_checkpoint(self, state: Any) -> dict[str, Any] | None:
        """The record of ``state`` (``None`` for one written before pipekit kept it), or CheckpointError."""
        where = f"{_WHERE}.load_state_dict"
        if not isinstance(state, dict):
            raise CheckpointError(
                f"{where}: got {type(state).__name__} {state!r:.80}, not a checkpoint of a DataLoader "
                "(pass what loader.state_dict() returned)"
            )
        if not state:
            raise CheckpointError(
                f"{where}: the state is empty ({{}}), not a checkpoint of a DataLoader; to start from the "
                "beginning, do not load one"
            )
        record = state.get(CHECKPOINT_KEY)
        if record is None:
            if ITERATOR_FINISHED not in state:
                raise CheckpointError(
                    f"{where}: not a checkpoint of a DataLoader (its keys: {sorted(map(str, state))[:8]}); pass "
                    "what loader.state_dict() returned"
                )
            return None  # written before pipekit kept a record: loaded as before
        if not isinstance(record, dict) or record.get("version") != _RECORD_VERSION:
            raise CheckpointError(f"{where}: the checkpoint's record is not one this pipekit writes: {record!r:.200}")
        mine = self._record()
        if record.get("dataset") != mine["dataset"]:
            raise CheckpointError(
                f"{where}: the checkpoint is of another pipeline: it was taken from a loader over a "
                f"{_kind(record.get('dataset'))}, this loader reads a {_kind(mine['dataset'])}"
            )
        if record.get("pipeline") != mine["pipeline"]:
            difference = _pipeline_difference(record, mine)
            raise CheckpointError(f"{where}: the checkpoint is of another pipeline: {difference}")
        if record.get("next_epoch_rng") is None and record.get("num_workers") != mine["num_workers"]:
            raise CheckpointError(
                f"{where}: the checkpoint was taken with num_workers={record.get('num_workers')}, this loader has "
                f"num_workers={mine['num_workers']}; mid-epoch, each worker's position is that of its own share "
                f"of the data, so resume with num_workers={record.get('num_workers')} (a checkpoint taken at the "
                "end of an epoch loads with any number)"
            )
        return record

    def _worker_alive(self, worker: int) -> bool:
        workers = worker_processes(self.current_iterator())
        return worker < len(workers) and workers[worker].is_alive()


def _kind(dataset: Any) -> str:
    return "DataPipe" if dataset == "pipe" else f"dataset of type {dataset}"


def _pipeline_difference(taken: dict[str, Any], mine: dict[str, Any]) -> str:
    """Both pipelines, from their sources, and where they first differ."""
    theirs = [name.removesuffix("IterDataPipe") for name in reversed(taken.get("pipeline") or [])]
    ours = [name.removesuffix("IterDataPipe") for name in reversed(mine.get("pipeline") or [])]
    first = next((i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b), min(len(theirs), len(ours)))
    at = theirs[first] if first < len(theirs) else "nothing"
    here = ours[first] if first < len(ours) else "nothing"
    return (
        f"it was taken from {' -> '.join(theirs) or 'no pipes'}, this loader's pipeline is "
        f"{' -> '.join(ours) or 'no pipes'} (pipe {first + 1} from the source: {at} in the checkpoint, {here} here)"
    )


def _reseeded(anchor: torch.Tensor, generator: torch.Generator) -> bool:
    """Whether ``generator`` was seeded (``manual_seed``) since it was in state ``anchor``.

    Draws since then do not count (an evaluation drawing from torch's global generator); a seed does: another
    initial seed, or the same one with the generator back at its start.  Seeding with the seed it already had,
    before any draw, cannot be told from no seeding.
    """
    now = generator.get_state()
    if torch.equal(now, anchor):
        return False
    before = torch.Generator(device=generator.device)
    before.set_state(anchor)
    seed = generator.initial_seed()
    if seed != before.initial_seed():
        return True
    fresh = torch.Generator(device=generator.device)
    fresh.manual_seed(seed)
    return torch.equal(now, fresh.get_state())


def _draws_between(start: torch.Tensor, generator: torch.Generator, most: int = 16) -> int:
    """How many int64 draws took a generator from state ``start`` to ``generator``'s state (``most`` if more)."""
    end = generator.get_state()
    probe = torch.Generator(device=generator.device)
    probe.set_state(start)
    for draws in range(most):
        if torch.equal(probe.get_state(), end):
            return draws
        draw_seed(probe)
    return most
