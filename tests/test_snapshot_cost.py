"""The per-batch snapshot path of pipekit.DataLoader's workers: shortcuts that must answer as the long way does."""

from __future__ import annotations

import contextlib
import sys

import pytest
import torch
from torch.utils.data.dataloader import _InfiniteConstantSampler
from torchdata.stateful_dataloader import worker as td_worker

import pipekit
from pipekit._loader import _CheckpointedPipe, _fast_try_to_serialize, _install_fast_serialize
from pipekit.pipes import IterableWrapper
from pipekit.pipes import _resume as resume
from pipekit.pipes._resume import (
    SnapshotPlan,
    epoch_marks,
    pending_seeds,
    pipeline_pipes,
    prepare_for_resume,
    snapshot_pipeline,
)
from pipekit.pipes.base import IterDataPipe
from pipekit.pipes.state import ResumablePipe

TD_LOADER = sys.modules["torchdata.stateful_dataloader.stateful_dataloader"]


class _UserStateful:
    def state_dict(self):
        return {"user": 1}

    def load_state_dict(self, state):
        pass


class _Plain:
    pass


def _samples():
    pipe = _CheckpointedPipe(IterableWrapper(range(10)).shuffle(buffer_size=4).sharding_filter())
    hooked = iter(pipe)  # torch's iterator wrapper around the pipe, as the fetcher holds it
    next(hooked)
    sampler = _InfiniteConstantSampler()
    with_attr = _InfiniteConstantSampler()
    with_attr.state_dict = lambda: {"instance": 1}
    with_attr.load_state_dict = lambda state: None
    return [pipe, hooked, sampler, iter(sampler), with_attr, _UserStateful(), _Plain(), None, 3, [1]]


class TestFastTryToSerialize:
    def test_answers_as_torchdata_does(self):
        original = td_worker.try_to_serialize
        original = getattr(original, "__wrapped__", original)
        calls = []

        def counting(obj):
            calls.append(type(obj))
            return original(obj)

        fast = _fast_try_to_serialize(counting)
        for obj in _samples():
            assert fast(obj) == original(obj), obj

    def test_skips_the_protocol_check_for_pipekit_and_torch_sampler_objects(self):
        calls = []
        fast = _fast_try_to_serialize(lambda obj: calls.append(obj))
        pipe, hooked, sampler, sampler_iter, *_ = _samples()
        for obj in (pipe, hooked, sampler, sampler_iter):
            fast(obj)
        assert calls == []
        fast(_Plain())
        assert len(calls) == 1

    def test_a_subclass_or_an_instance_attribute_takes_the_long_way(self):
        calls = []
        fast = _fast_try_to_serialize(lambda obj: calls.append(obj) or "orig")
        with_attr = _samples()[4]
        assert fast(with_attr) == "orig"

        class Sub(_CheckpointedPipe):
            pass

        assert fast(Sub(IterableWrapper([]))) == "orig"
        assert len(calls) == 2

    def test_install_is_idempotent(self):
        _install_fast_serialize()
        first = (td_worker.try_to_serialize, TD_LOADER.try_to_serialize)
        _install_fast_serialize()
        assert (td_worker.try_to_serialize, TD_LOADER.try_to_serialize) == first
        assert all(getattr(fn, "_pipekit_fast", False) for fn in first)
        assert not getattr(first[0].__wrapped__, "_pipekit_fast", False)


def _require_fast_in_worker(worker_id: int) -> None:
    from torchdata.stateful_dataloader import worker

    if not getattr(worker.try_to_serialize, "_pipekit_fast", False):
        raise RuntimeError("the worker's try_to_serialize is torchdata's")


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_and_main_process_use_the_shortcut(context):
    torch.manual_seed(0)
    pipe = IterableWrapper(list(range(64))).shuffle(buffer_size=8).sharding_filter().batch(4)
    loader = pipekit.DataLoader(
        pipe, num_workers=2, worker_init_fn=_require_fast_in_worker, multiprocessing_context=context
    )
    got = sorted(int(x) for batch in loader for x in batch)
    loader.shutdown()
    assert got == list(range(64))
    assert getattr(TD_LOADER.try_to_serialize, "_pipekit_fast", False)


# -- SnapshotPlan: the loader's per-batch snapshot, classified once an epoch --------------------------


class _Pausing(IterDataPipe):
    """A stateless pass-through with a pause() that counts how often the snapshot entered it."""

    stateless = True

    def __init__(self, source):
        self.source = source
        self.paused = 0

    def __iter__(self):
        yield from self.source

    @contextlib.contextmanager
    def pause(self):
        self.paused += 1
        yield


class _Chain(ResumablePipe):
    """Two sources one after the other (the second starts only when the first ends), counting the first's."""

    def __init__(self, first, second):
        self.first, self.second = first, second
        self._part = 0

    def state_dict(self):
        return {"part": self._part}

    def restore(self, state):
        self._part = 0 if state is None else state["part"]

    def __iter__(self):
        yield from self.first
        self._part = 1
        yield from self.second


def _concat_pipeline():
    chained = _Chain(IterableWrapper(range(5)), IterableWrapper(range(10, 14)))
    return _Pausing(chained.shuffle(buffer_size=3).sharding_filter().map(_plus_one))


def _plus_one(x):
    return x + 1


def test_plan_snapshots_equal_snapshot_pipeline_at_every_item():
    torch.manual_seed(0)
    pipe = prepare_for_resume(_concat_pipeline())
    pipes = pipeline_pipes(pipe)
    marks, seeds = epoch_marks(pipes), pending_seeds(pipes)
    plan = SnapshotPlan(pipes, marks, seeds)
    fresh_seen = started_seen = 0
    for _ in pipe:
        got = plan.snapshot()
        assert got == snapshot_pipeline(pipe, pipes, marks, seeds)
        second = got["states"][len(pipes) - 1 - [type(dp).__name__ for dp in pipes][::-1].index("IterableWrapper")]
        if second.get("__pipekit_fresh__"):
            fresh_seen += 1
        else:
            started_seen += 1
    assert fresh_seen and started_seen  # the concat's second source was recorded fresh, then asked
    assert pipe.paused == 2 * 9  # one pause per snapshot, each way


def test_plan_classifies_the_pipes_once(monkeypatch):
    torch.manual_seed(0)
    pipe = prepare_for_resume(_concat_pipeline())
    pipes = pipeline_pipes(pipe)
    plan = SnapshotPlan(pipes, epoch_marks(pipes), pending_seeds(pipes))

    def refuse(dp):
        raise AssertionError("classified again")

    it = iter(pipe)  # the shuffle plans the snapshots of the pipes above it when its pass starts
    next(it)
    monkeypatch.setattr(resume, "_is_stateless", refuse)
    monkeypatch.setattr(resume, "_is_resumable", refuse)
    assert plan.snapshot()["classes"] == [type(dp).__qualname__ for dp in pipes]


def test_plan_of_a_pipeline_that_cannot_snapshot():
    class Opaque(IterDataPipe):
        def __init__(self, source):
            self.source = source

        def __iter__(self):
            yield from self.source

    pipe = Opaque(IterableWrapper(range(3)))
    pipes = pipeline_pipes(pipe)
    plan = SnapshotPlan(pipes)
    assert not plan.capable
    assert plan.snapshot() is None
    assert snapshot_pipeline(pipe) is None


def test_loader_snapshots_with_the_epoch_plan():
    loader_pipe = _CheckpointedPipe(IterableWrapper(range(8)).shuffle(buffer_size=3).sharding_filter())
    torch.manual_seed(0)
    it = iter(loader_pipe)
    next(it)
    plan = loader_pipe._plan
    assert isinstance(plan, SnapshotPlan)
    state = loader_pipe.state_dict()
    assert state["pipes"] == snapshot_pipeline(
        loader_pipe.pipe, loader_pipe._pipes, loader_pipe._marks, loader_pipe._seeds
    )
    iter(loader_pipe)  # a new epoch, a new plan
    assert loader_pipe._plan is not plan
