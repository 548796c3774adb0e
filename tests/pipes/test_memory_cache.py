"""Tests of pipekit.pipes._memory_cache: in_memory_cache."""

from __future__ import annotations

import pickle

import pytest
import torch

import pipekit
from pipekit.pipes import (
    InMemoryCacheHolder,
    IterableWrapper,
    IterDataPipe,
)
from pipekit.testing import assert_resumes

# ------------------------------------------------------------------------------------------------
# helpers (module level so that pipes pickle and forked processes can use them)
# ------------------------------------------------------------------------------------------------


class Unsized(IterDataPipe):
    """Yields the given items and has no length."""

    def __init__(self, items: list) -> None:
        self.items = items

    def __iter__(self):
        yield from self.items


class Counting(IterDataPipe):
    """Yields the given items and counts how many it produced over its lifetime."""

    def __init__(self, items: list) -> None:
        self.items = items
        self.pulled = 0
        self.epochs = 0

    def __iter__(self):
        self.epochs += 1
        for x in self.items:
            self.pulled += 1
            yield x


# ------------------------------------------------------------------------------------------------
# in_memory_cache
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def tensors() -> list[torch.Tensor]:
    # 256 KiB of data each: a 1 MB cache holds three of them
    return [torch.full((65536,), float(i)) for i in range(10)]


class TestInMemoryCacheHolder:
    def test_later_epochs_come_from_the_cache(self):
        src = Counting(list(range(8)))
        dp = src.in_memory_cache()
        assert list(dp) == list(range(8))
        assert src.pulled == 8
        assert list(dp) == list(range(8))
        assert list(dp) == list(range(8))
        assert (src.pulled, src.epochs) == (8, 1)
        assert dp.cached_items == 8

    def test_eviction_by_size_keeps_the_last_items(self, tensors):
        src = Counting(tensors)
        dp = InMemoryCacheHolder(src, size=1)
        first = list(dp)
        assert all(a is b for a, b in zip(first, tensors))
        assert dp.cached_items == 3
        assert dp.cached_bytes <= 1024 * 1024
        second = list(dp)
        assert [int(t[0]) for t in second] == list(range(10))
        # the 7 evicted items were read again from the source, the last 3 came from the cache
        assert src.pulled == 10 + 7
        assert all(a is b for a, b in zip(second[7:], tensors[7:]))
        assert dp.cached_items == 3  # the cache is frozen after the first complete epoch

    def test_item_larger_than_the_cache(self, tensors):
        src = Counting(tensors[:2])
        dp = src.in_memory_cache(size=0.1)
        assert len(list(dp)) == 2
        assert dp.cached_items == 0
        assert len(list(dp)) == 2
        assert src.pulled == 4

    def test_early_stop_caches_nothing(self):
        src = Counting(list(range(5)))
        dp = src.in_memory_cache()
        it = iter(dp)
        next(it), next(it)
        it.close()
        assert dp.cached_items == 0
        assert list(dp) == list(range(5))
        assert list(dp) == list(range(5))
        assert src.pulled == 2 + 5

    def test_pickled_copy_starts_empty(self, tensors):
        dp = IterableWrapper(tensors).in_memory_cache()
        list(dp)
        assert dp.cached_items == 10
        blob = pickle.dumps(dp)
        copy = pickle.loads(blob)
        assert copy.cached_items == 0
        assert len(pickle.dumps(InMemoryCacheHolder(IterableWrapper([1]), size=1))) < 5000
        assert [int(t[0]) for t in copy] == list(range(10))

    def test_len_of_an_unsized_source_once_the_cache_is_loaded_as_torchdata(self):
        dp = Unsized(list(range(7))).in_memory_cache()
        with pytest.raises(TypeError, match="until the cache is loaded"):
            len(dp)
        it = iter(dp)
        next(it)
        with pytest.raises(TypeError, match="until the cache is loaded"):
            len(dp)  # an epoch in progress has not loaded the cache yet
        list(it)
        assert len(dp) == 7
        assert len(list(dp)) == 7

    def test_len_counts_evicted_items_too(self):
        dp = Unsized([bytes(100_000) for _ in range(30)]).in_memory_cache(size=1)
        list(dp)
        assert 0 < dp.cached_items < 30
        assert len(dp) == 30

    def test_len_and_validation(self):
        assert len(IterableWrapper(range(4)).in_memory_cache()) == 4
        with pytest.raises(ValueError, match="size must be positive"):
            IterableWrapper([1]).in_memory_cache(size=0)
        with pytest.raises(TypeError, match="size must be a number"):
            IterableWrapper([1]).in_memory_cache(size="1")

    @pytest.mark.parametrize("n", [0, 1, 5, 9])
    def test_resumes_in_first_epoch(self, n):
        def make():
            return IterableWrapper(list(range(10))).in_memory_cache(size=1)

        assert_resumes(make, n)

    @pytest.mark.parametrize("size", [None, 1])
    @pytest.mark.parametrize("n", [0, 2, 7, 9])
    def test_resumes_when_serving_from_cache(self, tensors, size, n):
        def make():
            dp = IterableWrapper(tensors, deepcopy=False).in_memory_cache(size=size)
            list(dp)  # fill the cache: the checkpoint is taken in the second epoch
            return dp.map(first_value)

        assert_resumes(make, n)


def first_value(t: torch.Tensor) -> float:
    return float(t[0])


def shuffled_then_cached():
    """A random pipe before the cache: the cache replays the first epoch's order, whatever later seeds are."""
    return IterableWrapper(list(range(12))).shuffle(buffer_size=12).in_memory_cache()


def epochs_of(loader, epochs: int) -> list[list[int]]:
    return [[int(x) for x in loader] for _ in range(epochs)]


@pytest.mark.parametrize("epoch", [0, 1], ids=["filling", "serving"])
@pytest.mark.parametrize("take", [1, 5])
def test_resumed_after_a_random_pipe_replays_the_same_first_epoch(epoch, take):
    """The restored cache holds what was cached: the rest of the epoch and the next are the uninterrupted run's."""
    torch.manual_seed(0)
    expected = epochs_of(pipekit.DataLoader(shuffled_then_cached()), epoch + 2)
    assert expected[0] == expected[-1] != sorted(expected[0])
    torch.manual_seed(0)
    loader = pipekit.DataLoader(shuffled_then_cached())
    done = epochs_of(loader, epoch)
    it = iter(loader)
    head = [int(next(it)) for _ in range(take)]
    state = pickle.loads(pickle.dumps(loader.state_dict()))
    torch.manual_seed(1)  # the resumed process's random state differs
    resumed = pipekit.DataLoader(shuffled_then_cached())
    resumed.load_state_dict(state)
    assert [*done, head + [int(x) for x in resumed], *epochs_of(resumed, 1)] == expected


def test_resumed_after_its_upstream_ended_serves_the_next_epoch_whole():
    """Checkpointed while a shuffle after the cache still empties its buffer: the cache had frozen already."""
    def make():
        return IterableWrapper(list(range(12))).in_memory_cache().shuffle(buffer_size=4)

    loader = pipekit.DataLoader(make())
    it = iter(loader)
    head = [int(next(it)) for _ in range(10)]
    state = pickle.loads(pickle.dumps(loader.state_dict()))
    resumed = pipekit.DataLoader(make())
    resumed.load_state_dict(state)
    assert sorted(head + [int(x) for x in resumed]) == list(range(12))
    assert sorted(int(x) for x in resumed) == list(range(12))


def sharded_shuffled_then_cached():
    return IterableWrapper(list(range(12))).shuffle(buffer_size=12).sharding_filter().in_memory_cache()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 2], ids=["0-workers", "2-persistent-workers"])
@pytest.mark.parametrize("where", ["end", "after-the-partial-last-batch"])
def test_a_checkpoint_at_the_end_of_an_epoch_keeps_the_cache_for_the_next(num_workers, where):
    """The next epoch is served from the cache the first one filled (its order), in the resumed run too."""
    def loader_for():
        return pipekit.DataLoader(sharded_shuffled_then_cached(), batch_size=5, num_workers=num_workers)

    def ints(batches):
        return [int(x) for batch in batches for x in batch]

    torch.manual_seed(0)
    loader = loader_for()
    if where == "end":
        first = ints(loader)
    else:  # every batch taken, the loader not yet run out
        it = iter(loader)
        first = ints([next(it) for _ in range(3 if num_workers == 0 else 4)])
    state = pickle.loads(pickle.dumps(loader.state_dict()))
    if where != "end":
        assert list(it) == []
    second = ints(loader)
    loader.shutdown()
    assert sorted(first) == sorted(second) == list(range(12)) and first == second  # served from the cache
    torch.manual_seed(1)  # the resumed process's random state differs: the upstream shuffle would too
    resumed = loader_for()
    resumed.load_state_dict(state)
    if where != "end":
        assert list(resumed) == []
    assert ints(resumed) == second
    resumed.shutdown()
