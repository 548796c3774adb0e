"""The shuffle buffer's lazy positions (base + journal): rebuilt, they equal the eager copy taken at the same item."""

from __future__ import annotations

import multiprocessing
import pickle
import threading

import pytest
import torch

import pipekit
from pipekit._loader import _CheckpointedPipe
from pipekit._worker_states import DEFERRED, StateChannel, resolve_deferred
from pipekit.pipes import IterableWrapper
from pipekit.pipes._builtin import ResumableShuffler
from pipekit.pipes._resume import (
    SnapshotPlan,
    epoch_marks,
    materialize_snapshot,
    pending_seeds,
    pipeline_pipes,
    prepare_for_resume,
    restore_pipeline,
    snapshot_pipeline,
)
from pipekit.pipes._torch import ShufflerSnapshot, _journal_cap


def make(n: int, buffer_size: int):
    return prepare_for_resume(IterableWrapper(range(n)).shuffle(buffer_size=buffer_size))


def run_with_snapshots(n: int, buffer_size: int, seed: int, every: int):
    """Iterate a shuffle, taking lazy and eager pipeline snapshots after every ``every``-th item."""
    pipe = make(n, buffer_size).set_seed(seed)
    assert isinstance(pipe, ResumableShuffler)
    pipes = pipeline_pipes(pipe)
    marks, seeds = epoch_marks(pipes), pending_seeds(pipes)
    plan = SnapshotPlan(pipes, marks, seeds)
    out, snaps = [], []
    for k, x in enumerate(pipe):
        out.append(x)
        if k % every == 0:
            lazy = plan.snapshot(lazy=True)
            eager = snapshot_pipeline(pipe, pipes, marks, seeds)
            snaps.append((len(out), lazy, eager))
    return out, snaps


CASES = [
    # (source length, buffer size): fill, full and drain phases; buffer larger than the epoch; buffer of 1;
    # journals and drains longer than the cap (256 for these buffers)
    (0, 4),
    (1, 1),
    (2, 1),
    (7, 1),
    (7, 3),
    (5, 5),
    (5, 6),
    (20, 100),
    (100, 7),
    (333, 8),
    (700, 5),
    (400, 300),
    (600, 600),
]


@pytest.mark.parametrize(("n", "buffer_size"), CASES)
@pytest.mark.parametrize("seed", [0, 1, 7])
@pytest.mark.parametrize("every", [1, 3, 97, 300])
def test_rebuilt_positions_equal_the_eager_ones_and_resume(n, buffer_size, seed, every):
    out, snaps = run_with_snapshots(n, buffer_size, seed, every)
    assert sorted(out) == list(range(n))
    assert len(snaps) == (n + every - 1) // every
    for count, lazy, eager in snaps:
        states = lazy["states"]
        assert isinstance(states[0], (ShufflerSnapshot, dict))
        plain = materialize_snapshot(lazy)
        assert plain == eager
        assert pickle.loads(pickle.dumps(states[0])) == eager["states"][0]  # sending rebuilds it too
        resumed = make(n, buffer_size)
        restore_pipeline(resumed, plain)
        assert list(resumed) == out[count:]


def test_lazy_positions_are_o1_between_bases():
    """Snapshots in a row share their base: no copy of the buffer per snapshot."""
    _, snaps = run_with_snapshots(2000, 10_000, 0, 1)  # the whole epoch is the drain
    cap = _journal_cap(10_000)
    bases = {id(lazy["states"][0]._base) for _, lazy, _ in snaps}
    assert len(snaps) == 2000
    assert 1 < len(bases) <= 2000 // cap + 1
    for _, lazy, _ in snaps:  # what a rebuild replays stays under the cap: journal items and drain pops
        snap = lazy["states"][0]
        assert snap._count <= cap + 1
        assert min(snap._size, len(snap._base) + snap._count) - snap._live <= cap


def test_the_journal_is_bounded_without_snapshots():
    pipe = make(5000, 10).set_seed(0)
    lengths = []
    for _ in pipe:
        lengths.append(-1 if pipe._journal is None else len(pipe._journal))
    assert set(lengths) == {-1}  # nobody took a lazy snapshot: no journal at all

    pipe = make(5000, 10).set_seed(0)
    it = iter(pipe)
    next(it)
    pipe.lazy_state_dict()  # one snapshot starts a journal...
    lengths = []
    for _ in it:
        lengths.append(-1 if pipe._journal is None else len(pipe._journal))
    cap = _journal_cap(10)
    assert max(lengths) <= cap
    assert lengths[-1] == -1  # ...which is dropped past the cap
    assert pipe._journal_base is not None  # (the next snapshot replaces it)
    fresh = pipe.lazy_state_dict()
    assert fresh._base is pipe._journal_base[0] and pipe._journal == []


def test_eager_state_dict_stays_a_plain_dict():
    pipe = make(50, 8).set_seed(0)
    it = iter(pipe)
    next(it)
    pipe.lazy_state_dict()
    next(it)
    state = pipe.state_dict()
    assert type(state) is dict and set(state) == {"buffer", "rng", "replay"}
    assert snapshot_pipeline(pipe)["states"][0] == state


def test_a_new_epoch_or_restore_drops_the_journal():
    pipe = make(30, 4).set_seed(0)
    it = iter(pipe)
    next(it)
    old = pipe.lazy_state_dict()
    expected = old.materialize()
    list(it)
    pipe.set_seed(1)
    it = iter(pipe)
    next(it)
    assert pipe._journal is None and pipe._journal_base is None
    assert old.materialize() == expected  # the older snapshot keeps its own base and journal


def test_rebuilding_in_another_thread_while_the_pipe_runs():
    """Rebuilding reads the base and the journal's prefix only: the pipe may go on meanwhile."""
    n, buffer_size = 3000, 50
    pipe = make(n, buffer_size).set_seed(3)
    pending: list = []
    results: list = []
    done = threading.Event()

    def rebuild():
        while not done.is_set() or pending:
            if pending:
                lazy, eager = pending.pop(0)
                results.append(lazy.materialize() == eager)

    worker = threading.Thread(target=rebuild)
    worker.start()
    try:
        for k, _ in enumerate(pipe):
            if k % 5 == 0:
                pending.append((pipe.lazy_state_dict(), pipe.state_dict()))
    finally:
        done.set()
        worker.join()
    assert len(results) == n // 5 and all(results)


def test_a_subclass_with_its_own_state_gets_eager_positions():
    class Extra(ResumableShuffler):
        def state_dict(self):
            return {**super().state_dict(), "extra": 1}

    pipe = make(10, 3).set_seed(0)
    pipe.__class__ = Extra
    it = iter(pipe)
    next(it)
    assert pipe.lazy_state_dict() == pipe.state_dict()
    assert pipe.lazy_state_dict()["extra"] == 1


def _ids(batches):
    return [int(x) for batch in batches for x in batch]


@pytest.mark.parametrize("buffer_size", [3, 64, 1000])
def test_loader_with_workers_resumes_at_several_points(buffer_size):
    """Two workers, a shuffle before the sharding: checkpoints at several batches resume the uninterrupted run."""

    def build():
        return IterableWrapper(list(range(600))).shuffle(buffer_size=buffer_size).sharding_filter().batch(5)

    torch.manual_seed(0)
    loader = pipekit.DataLoader(build(), num_workers=2)
    full = [list(map(int, b)) for b in loader]
    loader.shutdown()
    assert sorted(_ids(full)) == list(range(600))

    torch.manual_seed(0)
    loader = pipekit.DataLoader(build(), num_workers=2)
    it = iter(loader)
    states = {}
    for k in range(1, 100):
        next(it)
        if k in (1, 2, 13, 56, 90, 99):
            states[k] = loader.state_dict()
    loader.shutdown()
    for k, state in states.items():
        resumed = pipekit.DataLoader(build(), num_workers=2)
        resumed.load_state_dict(pickle.loads(pickle.dumps(state)))
        rest = [list(map(int, b)) for b in resumed]
        resumed.shutdown()
        assert rest == full[k:], k


def test_a_worker_keeps_lazy_positions_and_sends_them_plain():
    """What the loader keeps in a worker is lazy; what it sends for a checkpoint is the eager position."""
    channel = StateChannel(multiprocessing.get_context("fork"), 1, depth=4)
    wrapper = _CheckpointedPipe(IterableWrapper(list(range(100))).shuffle(buffer_size=10).sharding_filter())
    torch.manual_seed(0)
    it = iter(wrapper)
    wrapper._channel, wrapper._in_worker = channel, True  # as in a DataLoader worker
    try:
        for _ in range(20):
            next(it)
        token = wrapper.state_dict()
        assert token["mode"] == DEFERRED
        kept = wrapper._kept._kept[(token["run"], token["seq"])]
        assert any(isinstance(s, ShufflerSnapshot) for s in kept["pipes"]["states"])
        eager = snapshot_pipeline(wrapper.pipe, wrapper._pipes, wrapper._marks, wrapper._seeds)
        for _ in range(30):
            next(it)  # the pipe moves on before the checkpoint asks
        resolved = resolve_deferred({"w0": token}, channel, lambda w: True)["w0"]
        assert resolved["pipes"] == eager
        assert all(type(s) is dict or s is None for s in resolved["pipes"]["states"])
    finally:
        if wrapper._kept is not None:
            wrapper._kept.stop()
        channel.close()
