"""The per-batch snapshot path of pipekit.DataLoader's workers: shortcuts that must answer as the long way does."""

from __future__ import annotations

import sys

import pytest
import torch
from torch.utils.data.dataloader import _InfiniteConstantSampler
from torchdata.stateful_dataloader import worker as td_worker

import pipekit
from pipekit.loader import _fast_try_to_serialize, _install_fast_serialize, _ResumablePipe
from pipekit.pipes import IterableWrapper

TD_LOADER = sys.modules["torchdata.stateful_dataloader.stateful_dataloader"]


class _UserStateful:
    def state_dict(self):
        return {"user": 1}

    def load_state_dict(self, state):
        pass


class _Plain:
    pass


def _samples():
    pipe = _ResumablePipe(IterableWrapper(range(10)).shuffle(buffer_size=4).sharding_filter())
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

        class Sub(_ResumablePipe):
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
