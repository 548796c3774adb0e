"""Tests of pipekit.pipes._prefetch: prefetch and pin_memory."""

from __future__ import annotations

import gc
import pickle
import threading
import time
from collections import namedtuple

import pytest
import torch

from pipekit.pipes import IterableWrapper, IterDataPipe, PinMemory, Prefetcher
from pipekit.pipes import prefetch as prefetch_module
from pipekit.testing import assert_resumes


class Counting(IterDataPipe):
    """A source that records how many items were pulled and whether its generator was closed."""

    def __init__(self, n: int, delay: float = 0.0, fail_at: int | None = None) -> None:
        self.n = n
        self.delay = delay
        self.fail_at = fail_at
        self.pulled = 0
        self.closed = False
        self.threads: set[str] = set()

    def __iter__(self):
        self.pulled = 0
        self.closed = False
        try:
            for i in range(self.n):
                if self.delay:
                    time.sleep(self.delay)
                if i == self.fail_at:
                    raise ValueError(f"boom at {i}")
                self.threads.add(threading.current_thread().name)
                self.pulled += 1
                yield i
        finally:
            self.closed = True


def wait_for(cond, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("condition not reached in time")
        time.sleep(0.002)


def running_thread(dp: Prefetcher) -> threading.Thread:
    assert dp._run is not None
    assert dp._run.thread is not None
    return dp._run.thread


Pair = namedtuple("Pair", ["a", "b"])


class TestPrefetcher:
    def test_yields_in_order(self):
        assert list(IterableWrapper(range(100)).prefetch(3)) == list(range(100))

    def test_reads_ahead_up_to_buffer_size_in_a_thread(self):
        src = Counting(50)
        dp = src.prefetch(buffer_size=4)
        it = iter(dp)
        assert dp._run is None  # nothing started before the first next()
        assert next(it) == 0
        wait_for(lambda: src.pulled == 5)
        time.sleep(0.02)
        assert src.pulled == 5  # 1 consumed + 4 buffered, then it waits
        assert src.threads == {"pipekit-prefetch"}
        assert list(it) == list(range(1, 50))

    def test_early_close_stops_thread_and_closes_upstream(self):
        src = Counting(1000)
        dp = src.prefetch(buffer_size=2)
        it = iter(dp)
        next(it)
        thread = running_thread(dp)
        it.close()
        assert not thread.is_alive()
        assert src.closed
        assert dp._run is None

    def test_garbage_collected_iterator_stops_thread(self):
        src = Counting(1000)
        dp = src.prefetch(buffer_size=2)
        it = iter(dp)
        next(it)
        thread = running_thread(dp)
        del it
        gc.collect()
        thread.join(timeout=5)
        assert not thread.is_alive()
        assert src.closed

    def test_thread_ends_at_exhaustion(self):
        dp = IterableWrapper(range(5)).prefetch(2)
        it = iter(dp)
        next(it)
        thread = running_thread(dp)
        assert list(it) == [1, 2, 3, 4]
        assert not thread.is_alive()

    def test_error_reraised_after_earlier_items(self):
        src = Counting(10, fail_at=3)
        dp = src.prefetch(buffer_size=5)
        it = iter(dp)
        got = [next(it)]
        thread = running_thread(dp)
        got += [next(it), next(it)]
        with pytest.raises(ValueError, match="boom at 3"):
            next(it)
        assert got == [0, 1, 2]
        assert not thread.is_alive()

    def test_new_epoch_stops_previous_thread(self):
        dp = Counting(1000).prefetch(buffer_size=2)
        it1 = iter(dp)
        next(it1)
        old = running_thread(dp)
        it2 = iter(dp)
        assert next(it2) == 0
        assert not old.is_alive()
        assert running_thread(dp) is not old
        it2.close()

    def test_pause_parks_the_thread(self):
        src = Counting(100, delay=0.01)
        dp = src.prefetch(buffer_size=50)
        it = iter(dp)
        next(it)
        with dp.pause():
            assert not dp._run.busy
            before = src.pulled
            time.sleep(0.05)
            assert src.pulled == before
            with dp.pause():  # re-entrant
                pass
            assert src.pulled == before
        wait_for(lambda: src.pulled > before)
        it.close()

    def test_pause_without_iteration_is_a_no_op(self):
        dp = IterableWrapper(range(3)).prefetch()
        with dp.pause():
            pass
        assert dp.state_dict() == {"buffer": []}

    def test_state_holds_unconsumed_items(self):
        dp = IterableWrapper(range(10)).prefetch(buffer_size=3)
        it = iter(dp)
        assert [next(it), next(it)] == [0, 1]
        wait_for(lambda: len(dp._run.buffer) == 3)
        assert dp.state_dict() == {"buffer": [2, 3, 4]}
        it.close()

    @pytest.mark.parametrize("n", [0, 1, 5, 19])
    @pytest.mark.parametrize("buffer_size", [1, 4])
    def test_resumes(self, n, buffer_size):
        def make():
            return IterableWrapper(range(20)).map(str).prefetch(buffer_size)

        assert_resumes(make, n)

    def test_restored_items_come_first(self):
        dp = IterableWrapper(range(5, 8)).prefetch(2)
        dp.load_state_dict({"buffer": [100, 101, 102]})
        assert list(dp) == [100, 101, 102, 5, 6, 7]
        assert list(dp) == [5, 6, 7]  # the epoch after starts normally

    def test_pickle_before_and_during_iteration(self):
        dp = IterableWrapper(range(6)).prefetch(2)
        assert list(pickle.loads(pickle.dumps(dp))) == list(range(6))
        it = iter(dp)
        next(it)
        copy = pickle.loads(pickle.dumps(dp))
        assert copy._run is None
        assert list(copy) == list(range(6))
        it.close()

    def test_len(self):
        assert len(IterableWrapper(range(7)).prefetch()) == 7

    def test_argument_validation(self):
        with pytest.raises(ValueError, match="buffer_size must be positive"):
            IterableWrapper([1]).prefetch(0)
        with pytest.raises(TypeError, match="buffer_size must be an int"):
            IterableWrapper([1]).prefetch(2.5)


def fake_pin(tensor, device):
    return tensor + 1000


def tag_fn(item, device):
    return ("pinned", device, item)


class TestPinMemory:
    def test_passes_items_through_without_cuda(self, monkeypatch):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        items = [{"x": torch.ones(2)}, (torch.zeros(1), "a")]
        out = list(IterableWrapper(items, deepcopy=False).pin_memory())
        assert out[0] is items[0]
        assert out[1] is items[1]
        assert not out[0]["x"].is_pinned()

    def test_custom_fn_is_called_with_device(self):
        out = list(IterableWrapper([1, 2]).pin_memory(device="cuda:1", pin_memory_fn=tag_fn))
        assert out == [("pinned", "cuda:1", 1), ("pinned", "cuda:1", 2)]

    def test_default_fn_walks_structures_when_cuda_is_available(self, monkeypatch):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(prefetch_module, "_pin_tensor", fake_pin)
        item = {"a": torch.tensor([1]), "b": [torch.tensor([2]), "s"], "c": Pair(torch.tensor([3]), b"x"), "d": 5}
        (out,) = list(IterableWrapper([item]).pin_memory())
        assert out["a"].tolist() == [1001]
        assert out["b"][0].tolist() == [1002]
        assert out["b"][1] == "s"
        assert isinstance(out["c"], Pair)
        assert out["c"].a.tolist() == [1003]
        assert out["c"].b == b"x"
        assert out["d"] == 5

    def test_object_with_pin_memory_method(self, monkeypatch):
        class Batch:
            def pin_memory(self):
                return "pinned batch"

        assert prefetch_module.pin_memory_fn(Batch()) == "pinned batch"

    @pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
    def test_really_pins_on_cuda(self):
        (out,) = list(IterableWrapper([{"x": torch.ones(3), "y": (torch.zeros(2),)}]).pin_memory())
        assert out["x"].is_pinned()
        assert out["y"][0].is_pinned()

    def test_is_a_prefetcher_with_two_slots(self):
        dp = IterableWrapper(range(3)).pin_memory()
        assert isinstance(dp, Prefetcher)
        assert dp.buffer_size == 2
        assert not dp.is_replicable()
        it = iter(dp)
        next(it)
        assert running_thread(dp).name == "pipekit-pin-memory"
        it.close()

    def test_pickle(self):
        dp = PinMemory(IterableWrapper(range(3)), pin_memory_fn=tag_fn)
        assert [x[2] for x in pickle.loads(pickle.dumps(dp))] == [0, 1, 2]

    def test_argument_validation(self):
        with pytest.raises(TypeError, match="pin_memory_fn must be callable"):
            IterableWrapper([1]).pin_memory(pin_memory_fn=3)

    @pytest.mark.parametrize("n", [0, 2, 9])
    def test_resumes(self, n):
        def make():
            return IterableWrapper(range(10)).pin_memory()

        assert_resumes(make, n)


class TestWithDataLoader:
    def test_checkpoint_pauses_threads_and_resumes(self):
        from pipekit import DataLoader
        from pipekit.pipes._resume import not_snapshot_capable, prepare_for_resume

        def make():
            dp = IterableWrapper(range(60)).shuffle().prefetch(5)
            dp = dp.bucketbatch(batch_size=4, batch_num=2, use_in_batch_shuffle=False).in_batch_shuffle()
            return dp.pin_memory()

        assert not_snapshot_capable(prepare_for_resume(make())) == []
        torch.manual_seed(0)
        loader = DataLoader(make())
        it = iter(loader)
        head = [next(it) for _ in range(4)]
        state = loader.state_dict()
        rest = list(it)
        assert sorted(x for b in head + rest for x in b) == list(range(60))
        resumed = DataLoader(make())
        resumed.load_state_dict(state)
        assert list(resumed) == rest
