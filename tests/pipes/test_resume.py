"""Checkpointing a whole pipeline: which pipes are capable, snapshot/restore, structure checks."""

from __future__ import annotations

import contextlib
import pickle

import pytest

from pipekit.pipes import IterableWrapper
from pipekit.pipes._builtin import ResumableShardingFilter, ResumableShuffler
from pipekit.pipes._resume import (
    epoch_marks,
    not_snapshot_capable,
    pending_seeds,
    pipeline_pipes,
    prepare_for_resume,
    register_stateless,
    restore_pipeline,
    snapshot_pipeline,
)
from pipekit.pipes.base import IterDataPipe


def double(x):
    return 2 * x


class TestGraph:
    def test_pipes_listed_from_the_end(self):
        pipe = IterableWrapper(range(3)).map(double).batch(2)
        names = [type(p).__name__ for p in pipeline_pipes(pipe)]
        assert names == ["BatcherIterDataPipe", "MapperIterDataPipe", "IterableWrapper"]

    def test_prepare_swaps_torch_pipes(self):
        pipe = IterableWrapper(range(3)).shuffle().sharding_filter()
        assert sorted(not_snapshot_capable(pipe)) == ["ShardingFilterIterDataPipe", "ShufflerIterDataPipe"]
        prepare_for_resume(pipe)
        classes = {type(p) for p in pipeline_pipes(pipe)}
        assert {ResumableShuffler, ResumableShardingFilter} <= classes
        assert not_snapshot_capable(pipe) == []
        prepare_for_resume(pipe)  # idempotent

    def test_unknown_pipes_are_reported(self):
        pipe = IterableWrapper([[1, 2], [3]]).unbatch()
        assert not_snapshot_capable(pipe) == ["UnBatcherIterDataPipe"]
        assert snapshot_pipeline(pipe) is None


class TestSnapshotRestore:
    def make(self):
        return prepare_for_resume(IterableWrapper(range(20)).shuffle(buffer_size=5).set_seed(3).map(double).batch(3))

    def test_round_trip_through_pickle(self):
        pipe = self.make()
        it = iter(pipe)
        head = [next(it) for _ in range(2)]
        state = pickle.loads(pickle.dumps(snapshot_pipeline(pipe)))
        rest = list(it)
        fresh = self.make()
        restore_pipeline(fresh, state)
        assert list(fresh) == rest
        assert sorted(v for b in head + rest for v in b) == [2 * i for i in range(20)]
        assert list(fresh) != []  # the next epoch starts over

    def test_changed_structure_is_refused(self):
        pipe = self.make()
        it = iter(pipe)
        next(it)
        state = snapshot_pipeline(pipe)
        with pytest.raises(ValueError, match="pipeline has changed"):
            restore_pipeline(prepare_for_resume(IterableWrapper(range(20)).batch(3)), state)
        with pytest.raises(ValueError, match="not a pipekit pipeline state"):
            restore_pipeline(self.make(), {"version": 999})

    def test_fresh_pipes_keep_their_seed(self):
        """Pipes that have not started in the epoch are recorded as fresh, with their pending seed."""
        pipe = prepare_for_resume(IterableWrapper(range(10)).shuffle().set_seed(7))
        pipes = pipeline_pipes(pipe)
        marks, seeds = epoch_marks(pipes), pending_seeds(pipes)
        assert seeds == [7, None]
        iter(pipe)  # created, not started: torch resets pipes lazily at the first item
        state = snapshot_pipeline(pipe, pipes, marks, seeds)
        assert all(s is not None and s.get("__pipekit_fresh__") for s in state["states"])
        fresh = prepare_for_resume(IterableWrapper(range(10)).shuffle())  # no seed of its own
        restore_pipeline(fresh, state)
        assert list(fresh) == list(IterableWrapper(range(10)).shuffle().set_seed(7))


class TestPipesTorchDoesNotStart:
    """Map-style pipes and split containers never get a torch iterator: a snapshot must still ask them.

    Their iterator ids stay the same all epoch, so the fresh-pipe check (made for a ``concat``'s second
    source) took them for not started and dropped their position: pipekit.DataLoader resumed
    ``round_robin_demux`` on the other child's items and ``to_map_datapipe`` with an empty map.
    """

    def snapshot_after(self, make, n):
        pipe = prepare_for_resume(make())
        pipes = pipeline_pipes(pipe)
        marks, seeds = epoch_marks(pipes), pending_seeds(pipes)  # what pipekit.DataLoader records
        it = iter(pipe)
        head = [next(it) for _ in range(n)]
        state = snapshot_pipeline(pipe, pipes, marks, seeds)
        rest = list(it)
        fresh = prepare_for_resume(make())
        restore_pipeline(fresh, state)
        return head, rest, list(fresh)

    @pytest.mark.parametrize(
        "make",
        [
            lambda: IterableWrapper(range(10)).round_robin_demux(2, buffer_size=10)[0],
            lambda: IterableWrapper([(i, -i) for i in range(8)]).unzip(2, buffer_size=10)[1],
            lambda: IterableWrapper(range(10)).random_split(
                total_length=10, weights={"a": 0.5, "b": 0.5}, seed=0, target="a"
            ),
            lambda: (
                IterableWrapper([(f"k{i}", i) for i in range(8)])
                .to_map_datapipe()
                .to_iter_datapipe(indices=[f"k{i}" for i in range(8)])
            ),
        ],
    )
    def test_their_position_is_kept(self, make):
        head, rest, resumed = self.snapshot_after(make, 2)
        assert len(head) == 2 and rest
        assert resumed == rest


class Passthrough(IterDataPipe):
    def __init__(self, source):
        self.source = source

    def __iter__(self):
        yield from self.source


def test_register_stateless():
    pipe = Passthrough(IterableWrapper(range(3)))
    assert not_snapshot_capable(pipe) == ["Passthrough"]
    register_stateless(Passthrough)
    assert not_snapshot_capable(pipe) == []


class CountsLookups(IterDataPipe):
    """A stateless pipe that records the attributes missed on its instances (torch's ``__getattr__`` path)."""

    stateless = True
    missed: list[str] = []

    def __init__(self, source):
        self.source = source

    def __iter__(self):
        yield from self.source

    def __getattr__(self, name):
        CountsLookups.missed.append(name)
        return super().__getattr__(name)


class Pausable(IterDataPipe):
    stateless = True
    paused = 0

    def __init__(self, source):
        self.source = source

    def __iter__(self):
        yield from self.source

    @contextlib.contextmanager
    def pause(self):
        Pausable.paused += 1
        yield


def test_snapshot_looks_for_pause_on_the_class():
    # A pipe without pause() is not asked for it on the instance: there torch's IterDataPipe.__getattr__
    # raises an AttributeError, once per pipe with every checkpoint (every batch in DataLoader workers).
    CountsLookups.missed.clear()
    Pausable.paused = 0
    pipe = Pausable(CountsLookups(IterableWrapper(range(4))))
    it = iter(pipe)
    next(it)
    assert snapshot_pipeline(pipe) is not None
    assert "pause" not in CountsLookups.missed
    assert Pausable.paused == 1  # pipes that have one are still paused
