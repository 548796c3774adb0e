"""flatmap, shuffled_flatmap, map_batches (pipekit.pipes._mapping); threadpool_map, async_map_batches
(pipekit.pipes._concurrent_map)."""

from __future__ import annotations

import asyncio
import functools
import logging
import pickle
import random
import sys
import threading
import time

import pytest
import torch
from torch.utils.data.graph_settings import apply_random_seed

import pipekit
from pipekit.pipes import (
    BatchAsyncMapper,
    BatchMapper,
    FlatMapper,
    IterableWrapper,
    ShuffledFlatMapper,
    ThreadPoolMapper,
)
from pipekit.pipes._resume import not_snapshot_capable, prepare_for_resume, restore_pipeline, snapshot_pipeline
from pipekit.pipes.base import owner_of
from pipekit.testing import assert_resumes, resume_after

# ----------------------------------------------------------------- module-level functions (picklable)


def twice(x):
    return [x, x * 10]


def explode(x):
    return list(range(x))


def pair_sum(a, b):
    return [a + b, a - b]


def add_one_batch(batch):
    return [d + 1 for d in batch]


def sum_batch(batch):
    return [sum(batch)]


def mul_ten(x):
    return x * 10


def add(a, b):
    return a + b


def jitter_square(x, seed):
    time.sleep(random.Random(seed * 1000 + x).random() * 0.004)
    return x * x


def fail_on_three(x):
    if x == 3:
        raise ValueError("three is bad")
    return x


def slow_identity(x):
    time.sleep(0.002)
    return x


async def async_mul_ten(x):
    await asyncio.sleep(0.001)
    return x * 10


async def async_add(a, b):
    await asyncio.sleep(0)
    return a + b


async def async_jitter_square(x):
    await asyncio.sleep(random.Random(x).random() * 0.004)
    return x * x


async def async_fail_on_three(x):
    await asyncio.sleep(0.001)
    if x == 3:
        raise ValueError("three is bad")
    return x


class ConcurrencyTracker:
    """Records how many calls of an async function run at once, and the loops they ran on."""

    def __init__(self):
        self.running = 0
        self.peak = 0
        self.loops = set()
        self.cancelled = 0

    async def __call__(self, x):
        self.loops.add(asyncio.get_running_loop())
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.running -= 1
        return x


async def tracked(tracker, x):
    return await tracker(x)


def pool_threads(prefix="pipekit-threadpool_map"):
    return [t for t in threading.enumerate() if t.name.startswith(prefix)]


def wait_no_pool_threads(prefix="pipekit-threadpool_map", timeout=2.0):
    deadline = time.monotonic() + timeout
    while pool_threads(prefix) and time.monotonic() < deadline:
        time.sleep(0.005)
    return pool_threads(prefix)


class CountingSource:
    """An iterable that counts how many items were pulled from it."""

    def __init__(self, n):
        self.n = n
        self.pulled = 0

    def __iter__(self):
        for i in range(self.n):
            self.pulled += 1
            yield i


@pytest.fixture
def words():
    return [[1, 2, 3, 4], "abcd", "ABCD"]


def test_functional_names_are_pipekits():
    assert owner_of("flatmap") == "pipekit.pipes._mapping.FlatMapper"
    assert owner_of("shuffled_flatmap") == "pipekit.pipes._mapping.ShuffledFlatMapper"
    assert owner_of("map_batches") == "pipekit.pipes._mapping.BatchMapper"
    assert owner_of("threadpool_map") == "pipekit.pipes._concurrent_map.ThreadPoolMapper"
    assert owner_of("async_map_batches") == "pipekit.pipes._concurrent_map.BatchAsyncMapper"


# ----------------------------------------------------------------- flatmap


class TestFlatMapper:
    def test_torchdata_examples(self):
        assert list(IterableWrapper(list(range(5))).flatmap(twice)) == [0, 0, 1, 10, 2, 20, 3, 30, 4, 40]
        assert list(IterableWrapper([[1, 2, 3], [4, 5, 6]]).flatmap()) == [1, 2, 3, 4, 5, 6]

    def test_input_col(self):
        rows = [{"id": 1, "words": ["a", "b"]}, {"id": 2, "words": []}, {"id": 3, "words": ["c"]}]
        assert list(IterableWrapper(rows).flatmap(input_col="words")) == ["a", "b", "c"]
        assert list(IterableWrapper([(5, 2), (1, 1)]).flatmap(pair_sum, input_col=(0, 1))) == [7, 3, 2, 0]
        # without fn, several columns are yielded side by side
        assert list(IterableWrapper([(1, 2, 3)]).flatmap(input_col=[2, 0])) == [3, 1]

    def test_empty_source_and_empty_outputs(self):
        assert list(IterableWrapper([]).flatmap(twice)) == []
        assert list(IterableWrapper([0, 0, 2, 0]).flatmap(explode)) == [0, 1]

    def test_invalid_arguments(self):
        with pytest.raises(TypeError, match="callable"):
            FlatMapper(IterableWrapper([1]), fn=3)
        with pytest.raises(ValueError, match="input_col"):
            FlatMapper(IterableWrapper([(1, 2)]), fn=twice, input_col=(0, 1))

    def test_non_iterable_output_names_the_stage(self):
        with pytest.raises(TypeError, match=r"flatmap: fn must return an iterable.*item 2"):
            list(IterableWrapper([2]).flatmap(mul_ten))

    def test_no_length(self):
        with pytest.raises(TypeError, match="length"):
            len(IterableWrapper([1]).flatmap(twice))

    def test_source_keeps_its_torchdata_name(self):
        source = IterableWrapper([1])
        for pipe in (
            source.flatmap(twice),
            source.shuffled_flatmap(),
            source.map_batches(add_one_batch, 2),
            source.threadpool_map(mul_ten),
        ):
            assert pipe.source_datapipe is source and pipe.datapipe is source
            with pytest.raises(AttributeError):
                pipe.datapipe = source

    def test_pickle(self):
        pipe = IterableWrapper(range(4)).flatmap(twice)
        assert list(pickle.loads(pickle.dumps(pipe))) == list(pipe)

    @pytest.mark.parametrize("n", [0, 1, 2, 5, 9, 10])
    def test_resumes(self, n):
        assert_resumes(lambda: IterableWrapper(range(5)).flatmap(twice), n)

    def test_resume_continues_inside_an_expansion(self):
        head, rest = resume_after(lambda: IterableWrapper([3, 4]).flatmap(explode), 2)
        assert head == [0, 1]
        assert rest == [2, 0, 1, 2, 3]

    def test_state_holds_current_input(self):
        pipe = IterableWrapper([3, 4]).flatmap(explode)
        it = iter(pipe)
        next(it)
        next(it)
        assert pipe.state_dict() == {"active": True, "item": 3, "done": 2}
        assert not_snapshot_capable(pipe) == []


# ----------------------------------------------------------------- shuffled_flatmap


def torchdata_shuffled_flatmap(items, buffer_size, seed):
    """torchdata 0.9's shuffled_flatmap draw order, written from its documented algorithm."""
    rng = random.Random(seed)
    buffer, out = [], []
    idx = rng.randint(0, buffer_size - 1)
    for x in items:
        while len(buffer) == buffer_size:
            try:
                out.append(next(buffer[idx]))
                idx = rng.randint(0, buffer_size - 1)
            except StopIteration:
                buffer.pop(idx)
        buffer.append(iter(x))
    while buffer:
        idx = rng.randint(0, len(buffer) - 1)
        try:
            out.append(next(buffer[idx]))
        except StopIteration:
            buffer.pop(idx)
    return out


class TestShuffledFlatMapper:
    def test_seeded_example(self, words):
        dp = IterableWrapper(words).shuffled_flatmap(buffer_size=2)
        assert list(dp.set_seed(0)) == ["a", "b", 1, "c", "d", "A", "B", "C", 2, 3, "D", 4]

    @pytest.mark.parametrize("buffer_size", [1, 2, 3, 7])
    @pytest.mark.parametrize("seed", [0, 1, 123])
    def test_same_draws_as_torchdata(self, buffer_size, seed):
        items = [list(range(i * 10, i * 10 + (i % 4) + 1)) for i in range(9)]
        dp = IterableWrapper(items).shuffled_flatmap(buffer_size=buffer_size).set_seed(seed)
        assert list(dp) == torchdata_shuffled_flatmap(items, buffer_size, seed)

    def test_keeps_every_output_and_per_input_order(self, words):
        out = list(IterableWrapper(words).shuffled_flatmap(buffer_size=3).set_seed(5))
        assert sorted(map(str, out)) == sorted(map(str, [1, 2, 3, 4, *"abcdABCD"]))
        for source in words:
            assert [x for x in out if x in list(source)] == list(source)

    def test_shuffles(self):
        items = [list(range(i * 5, i * 5 + 5)) for i in range(10)]
        flat = [x for chunk in items for x in chunk]
        outs = {tuple(IterableWrapper(items).shuffled_flatmap(buffer_size=10).set_seed(s)) for s in range(5)}
        assert len(outs) > 1
        assert all(sorted(o) == flat for o in outs)

    def test_set_shuffle_false_is_flatmap(self, words):
        dp = IterableWrapper(words).shuffled_flatmap(buffer_size=2).set_shuffle(False)
        assert list(dp) == [1, 2, 3, 4, *"abcdABCD"]

    def test_seed_from_torch_without_set_seed(self, words):
        dp = IterableWrapper(words).shuffled_flatmap(buffer_size=3)
        torch.manual_seed(7)
        first = list(dp)
        torch.manual_seed(7)
        assert list(dp) == first

    def test_dataloader_seeding_reaches_it(self, words):
        dp = IterableWrapper(words).shuffled_flatmap(buffer_size=3)
        apply_random_seed(dp, torch.Generator().manual_seed(3))
        first = list(dp)
        apply_random_seed(dp, torch.Generator().manual_seed(3))
        assert list(dp) == first

    def test_fn_and_input_col(self):
        rows = [{"n": 2}, {"n": 3}]
        dp = IterableWrapper(rows).shuffled_flatmap(explode, input_col="n", buffer_size=1)
        assert list(dp) == [0, 1, 0, 1, 2]

    def test_empty(self):
        assert list(IterableWrapper([]).shuffled_flatmap().set_seed(0)) == []
        assert list(IterableWrapper([[], []]).shuffled_flatmap().set_seed(0)) == []

    @pytest.mark.parametrize("bad", [0, -1, 1.5, True])
    def test_invalid_buffer_size(self, bad):
        with pytest.raises(ValueError, match="buffer_size"):
            ShuffledFlatMapper(IterableWrapper([]), buffer_size=bad)

    def test_length_with_fn_is_unknown_without_reading_the_source(self):
        source = CountingSource(3)
        with pytest.raises(TypeError, match="length"):
            len(IterableWrapper(source, deepcopy=False).shuffled_flatmap(explode))
        assert source.pulled == 0

    def test_length_without_fn_sums_the_item_lengths_as_torchdata(self, words):
        # torchdata: ``sum(map(len, datapipe))`` when fn is None (pipekit used to refuse).
        dp = IterableWrapper(words).shuffled_flatmap(buffer_size=2)
        assert len(dp) == 12 == len(list(dp.set_seed(0)))
        assert len(IterableWrapper([[1, 2], [], "abc"]).shuffled_flatmap()) == 5

    def test_length_counts_the_selected_columns(self):
        rows = [{"id": 1, "words": ["a", "b"]}, {"id": 2, "words": ["c"]}]
        assert len(IterableWrapper(rows).shuffled_flatmap(input_col="words")) == 3

    def test_length_of_unsized_items_is_unknown(self):
        with pytest.raises(TypeError, match="item 1 has no length"):
            len(IterableWrapper([[1], 5]).shuffled_flatmap())

    def test_length_leaves_a_running_epoch_alone(self, words):
        dp = IterableWrapper(words).shuffled_flatmap(buffer_size=2).set_seed(3)
        expected = list(dp.set_seed(3))
        it = iter(dp.set_seed(3))
        head = [next(it) for _ in range(4)]
        assert len(dp) == 12
        assert head + list(it) == expected

    def test_length_leaves_a_loaded_checkpoint_alone(self, words):
        def make():
            return IterableWrapper(words).shuffled_flatmap(buffer_size=2).set_seed(5)

        pipe = prepare_for_resume(make())
        it = iter(pipe)
        head = [next(it) for _ in range(5)]
        state = snapshot_pipeline(pipe)
        fresh = make()
        restore_pipeline(fresh, state)
        assert len(fresh) == 12  # reads a fresh copy: the pending checkpoints stay pending
        assert head + list(fresh) == list(make())

    def test_pickle(self, words):
        dp = IterableWrapper(words).shuffled_flatmap(buffer_size=2).set_seed(4)
        clone = pickle.loads(pickle.dumps(dp))
        assert list(clone) == list(dp)

    @pytest.mark.parametrize("n", [0, 1, 3, 6, 11, 12])
    def test_resumes(self, words, n):
        assert_resumes(lambda: IterableWrapper(words).shuffled_flatmap(buffer_size=2).set_seed(9), n)

    def test_pending_seed_waits_while_not_shuffling(self, words):
        # as torch's Shuffler: an epoch without shuffling leaves the seed for the next shuffled one
        dp = IterableWrapper(words).shuffled_flatmap(buffer_size=2).set_seed(0).set_shuffle(False)
        assert list(dp) == [1, 2, 3, 4, *"abcdABCD"]
        assert dp._seed == 0
        assert list(dp.set_shuffle(True)) == ["a", "b", 1, "c", "d", "A", "B", "C", 2, 3, "D", 4]
        assert dp._seed is None

    def test_restores_a_checkpoint_without_epoch_seed(self, words):
        # checkpoints written before the pipe was a SeededPipe hold the generator but no "seed"
        def make():
            return IterableWrapper(words).shuffled_flatmap(buffer_size=2).set_seed(9)

        expected = list(make())
        pipe = make()
        it = iter(pipe)
        head = [next(it) for _ in range(5)]
        state = snapshot_pipeline(pipe)
        own = state["states"][0]
        assert {"seed", "rng"} <= set(own)
        del own["seed"]
        fresh = make()
        restore_pipeline(fresh, state)
        assert head + list(fresh) == expected

    @pytest.mark.parametrize("n", [4, 17, 30])
    def test_resumes_with_full_buffer_and_pending_input(self, n):
        items = [list(range(i * 10, i * 10 + 4)) for i in range(10)]

        def make():
            return IterableWrapper(items).shuffled_flatmap(buffer_size=4).set_seed(2)

        pipe = make()
        it = iter(pipe)
        for _ in range(n):
            next(it)
        state = pipe.state_dict()
        assert state["buffer"]  # items are in flight in the buffer
        assert_resumes(make, n)


# ----------------------------------------------------------------- map_batches


class TestBatchMapper:
    def test_torchdata_example(self):
        assert list(IterableWrapper(list(range(5))).map_batches(add_one_batch, batch_size=3)) == [1, 2, 3, 4, 5]

    def test_output_size_may_differ(self):
        assert list(IterableWrapper(range(7)).map_batches(sum_batch, batch_size=3)) == [3, 12, 6]

    def test_input_col(self):
        rows = [{"x": 1, "y": 2}, {"x": 3, "y": 4}, {"x": 5, "y": 6}]
        assert list(IterableWrapper(rows).map_batches(sum_batch, 2, input_col="x")) == [4, 5]
        pairs = list(IterableWrapper([(1, 2), (3, 4)]).map_batches(list, 2, input_col=[1, 0]))
        assert pairs == [[2, 1], [4, 3]]

    def test_empty(self):
        assert list(IterableWrapper([]).map_batches(add_one_batch, 4)) == []

    @pytest.mark.parametrize("bad", [0, -2, 2.0, None])
    def test_invalid_batch_size(self, bad):
        with pytest.raises(ValueError, match="batch_size"):
            BatchMapper(IterableWrapper([1]), add_one_batch, bad)

    def test_invalid_fn(self):
        with pytest.raises(TypeError, match="callable"):
            BatchMapper(IterableWrapper([1]), "nope", 2)
        with pytest.raises(ValueError, match="positional"):
            BatchMapper(IterableWrapper([1]), add, 2)

    def test_no_length(self):
        with pytest.raises(TypeError):
            len(IterableWrapper([1]).map_batches(add_one_batch, 1))

    def test_pickle(self):
        pipe = IterableWrapper(range(5)).map_batches(add_one_batch, 2)
        assert list(pickle.loads(pickle.dumps(pipe))) == [1, 2, 3, 4, 5]

    @pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 6])
    def test_resumes(self, n):
        assert_resumes(lambda: IterableWrapper(range(7)).map_batches(add_one_batch, 3), n)

    def test_state_holds_current_batch(self):
        pipe = IterableWrapper(range(7)).map_batches(add_one_batch, 3)
        it = iter(pipe)
        next(it)
        assert pipe.state_dict() == {"active": True, "item": [0, 1, 2], "done": 1}


# ----------------------------------------------------------------- threadpool_map


class TestThreadPoolMapper:
    def test_torchdata_examples(self):
        dp = IterableWrapper([(i, i) for i in range(50)])
        out = list(dp.threadpool_map(mul_ten, input_col=1))
        assert out[:4] == [(0, 0), (1, 10), (2, 20), (3, 30)]
        assert out == [(i, i * 10) for i in range(50)]
        out = list(dp.threadpool_map(mul_ten, input_col=1, output_col=-1))
        assert out == [(i, i, i * 10) for i in range(50)]

    def test_plain_and_multi_column(self):
        assert list(IterableWrapper(range(5)).threadpool_map(mul_ten)) == [0, 10, 20, 30, 40]
        rows = [[1, 2, 3], [4, 5, 6]]
        assert list(IterableWrapper(rows).threadpool_map(add, input_col=[0, 2])) == [[4, 2], [10, 5]]
        assert list(IterableWrapper(rows).threadpool_map(add, input_col=[0, 2], output_col=1)) == [
            [1, 4, 3],
            [4, 10, 6],
        ]

    def test_dict_items_are_copied_not_modified(self):
        rows = [{"x": 1}, {"x": 2}]
        out = list(IterableWrapper(rows, deepcopy=False).threadpool_map(mul_ten, input_col="x", output_col="y"))
        assert out == [{"x": 1, "y": 10}, {"x": 2, "y": 20}]
        assert rows == [{"x": 1}, {"x": 2}]

    def test_order_kept_under_random_delays(self):
        fn = functools.partial(jitter_square, seed=11)
        dp = IterableWrapper(range(60)).threadpool_map(fn, scheduled_tasks=16, max_workers=8)
        assert list(dp) == [x * x for x in range(60)]

    def test_bounded_number_in_flight(self):
        source = CountingSource(100)
        dp = IterableWrapper(source, deepcopy=False).threadpool_map(mul_ten, scheduled_tasks=5, max_workers=2)
        it = iter(dp)
        for consumed in range(1, 20):
            next(it)
            assert source.pulled <= consumed + 5
        it.close()

    def test_threads_created_lazily(self):
        before = len(pool_threads())
        dp = IterableWrapper(range(10)).threadpool_map(slow_identity, max_workers=3)
        assert len(pool_threads()) == before
        assert dp._executor is None

    def test_early_stop_shuts_threads_down(self):
        assert wait_no_pool_threads() == []
        dp = IterableWrapper(range(200)).threadpool_map(slow_identity, scheduled_tasks=32, max_workers=4)
        it = iter(dp)
        assert [next(it) for _ in range(3)] == [0, 1, 2]
        assert pool_threads()
        it.close()
        assert dp._executor is None
        assert wait_no_pool_threads() == []

    def test_dropped_iterator_shuts_threads_down(self):
        dp = IterableWrapper(range(200)).threadpool_map(slow_identity, max_workers=4)
        it = iter(dp)
        next(it)
        del it
        assert wait_no_pool_threads() == []

    def test_exception_propagates_with_item_and_shuts_down(self):
        dp = IterableWrapper(range(10)).threadpool_map(fail_on_three, max_workers=2)
        with pytest.raises(ValueError, match="three is bad") as info:
            list(dp)
        if sys.version_info >= (3, 11):
            assert any("failed on item 3" in note for note in info.value.__notes__)
        assert wait_no_pool_threads() == []

    def test_source_error_propagates_and_shuts_down(self):
        def broken():
            yield 1
            raise OSError("disk gone")

        dp = IterableWrapper(broken(), deepcopy=False).threadpool_map(mul_ten, max_workers=2)
        with pytest.raises(OSError, match="disk gone"):
            list(dp)
        assert wait_no_pool_threads() == []

    def test_thread_name_prefix_and_kwargs(self):
        seen = []

        def fn(x):
            seen.append(threading.current_thread().name)
            return x

        dp = IterableWrapper(range(4)).threadpool_map(fn, max_workers=1, thread_name_prefix="mypool")
        assert list(dp) == [0, 1, 2, 3]
        assert all(name.startswith("mypool") for name in seen)

    @pytest.mark.parametrize(
        ("kwargs", "error", "match"),
        [
            ({"scheduled_tasks": 0}, ValueError, "scheduled_tasks"),
            ({"max_workers": 0}, ValueError, "max_workers"),
            ({"output_col": 1}, ValueError, "output_col"),
            ({"input_col": 0, "output_col": [1, 2]}, ValueError, "output_col"),
            ({"bogus": 1}, TypeError, "bogus"),
        ],
    )
    def test_invalid_arguments(self, kwargs, error, match):
        with pytest.raises(error, match=match):
            ThreadPoolMapper(IterableWrapper([(1, 2)]), mul_ten, **kwargs)

    def test_length(self):
        assert len(IterableWrapper(range(7)).threadpool_map(mul_ten)) == 7

    def test_pickle_before_and_during_iteration(self):
        dp = IterableWrapper(range(6)).threadpool_map(mul_ten, max_workers=2)
        assert list(pickle.loads(pickle.dumps(dp))) == [0, 10, 20, 30, 40, 50]
        it = iter(dp)
        next(it)
        assert list(pickle.loads(pickle.dumps(dp))) == [0, 10, 20, 30, 40, 50]
        it.close()

    @pytest.mark.parametrize("n", [0, 1, 5, 18, 20])
    def test_resumes(self, n):
        assert_resumes(
            lambda: IterableWrapper(range(20)).threadpool_map(mul_ten, scheduled_tasks=4, max_workers=2), n
        )

    def test_state_holds_inflight_inputs(self):
        dp = IterableWrapper(range(20)).threadpool_map(mul_ten, scheduled_tasks=4, max_workers=2)
        it = iter(dp)
        assert [next(it), next(it)] == [0, 10]
        with dp.pause():
            assert dp.state_dict() == {"inflight": [2, 3, 4, 5]}
        it.close()

    def test_pause_holds_a_background_consumer(self):
        dp = IterableWrapper(range(10_000)).threadpool_map(mul_ten, scheduled_tasks=4, max_workers=2)
        count = [0]
        stop = threading.Event()

        def consume():
            for _ in dp:
                count[0] += 1
                if stop.is_set():
                    return

        worker = threading.Thread(target=consume)
        worker.start()
        try:
            while count[0] < 5:
                time.sleep(0.001)
            with dp.pause():
                c1 = count[0]
                state = dp.state_dict()
                time.sleep(0.05)
                c2 = count[0]
            assert c2 - c1 <= 1
            assert len(state["inflight"]) <= 4
        finally:
            stop.set()
            worker.join(timeout=5)
        assert not worker.is_alive()


class TestBatchAsyncMapper:
    def test_torchdata_examples(self):
        assert list(IterableWrapper(range(50)).async_map_batches(async_mul_ten, 16)) == [x * 10 for x in range(50)]
        pairs = IterableWrapper([(i, i) for i in range(50)])
        assert list(pairs.async_map_batches(async_mul_ten, 16, input_col=1)) == [(i, i * 10) for i in range(50)]
        out = list(pairs.async_map_batches(async_mul_ten, 16, input_col=1, output_col=-1))
        assert out == [(i, i, i * 10) for i in range(50)]

    def test_class_form_and_batches_unflattened(self):
        dp = BatchAsyncMapper(IterableWrapper(range(5)), async_mul_ten, batch_size=2, flatten=False)
        assert list(dp) == [[0, 10], [20, 30], [40]]

    def test_multi_column_input_replaces_the_first_and_drops_the_others(self):
        dp = IterableWrapper([(1, 2, 3), (4, 5, 6)]).async_map_batches(async_add, 2, input_col=[0, 2])
        assert list(dp) == [(4, 2), (10, 5)]
        dp = IterableWrapper([[1, 2]]).async_map_batches(async_add, 2, input_col=(0, 1), output_col=[-1])
        assert list(dp) == [[1, 2, 3]]

    def test_dict_items_are_copied_not_modified(self):
        rows = [{"a": 1}, {"a": 2}]
        out = list(IterableWrapper(rows, deepcopy=False).async_map_batches(async_mul_ten, 2, "a", "b"))
        assert out == [{"a": 1, "b": 10}, {"a": 2, "b": 20}]
        assert rows == [{"a": 1}, {"a": 2}]

    def test_order_kept_under_random_delays(self):
        out = list(IterableWrapper(range(40)).async_map_batches(async_jitter_square, 8))
        assert out == [x * x for x in range(40)]

    @pytest.mark.parametrize(("batch_size", "max_concurrency", "peak"), [(8, 32, 8), (8, 3, 3), (2, 32, 2)])
    def test_a_batch_runs_concurrently_up_to_max_concurrency(self, batch_size, max_concurrency, peak):
        tracker = ConcurrencyTracker()
        fn = functools.partial(tracked, tracker)
        dp = IterableWrapper(range(16)).async_map_batches(fn, batch_size, max_concurrency=max_concurrency)
        assert list(dp) == list(range(16))
        assert tracker.peak == peak

    def test_one_event_loop_per_epoch_closed_at_its_end(self):
        tracker = ConcurrencyTracker()
        dp = IterableWrapper(range(6)).async_map_batches(tracker, 2)
        assert list(dp) == list(range(6))
        assert len(tracker.loops) == 1
        assert all(loop.is_closed() for loop in tracker.loops)

    def test_early_stop_closes_the_loop(self):
        tracker = ConcurrencyTracker()
        it = iter(IterableWrapper(range(6)).async_map_batches(tracker, 2))
        assert next(it) == 0
        (loop,) = tracker.loops
        assert not loop.is_closed()
        it.close()
        assert loop.is_closed()

    def test_exception_names_the_item_and_cancels_the_batch(self):
        dp = IterableWrapper(range(8)).async_map_batches(async_fail_on_three, 4)
        with pytest.raises(ValueError, match="three is bad") as info:
            list(dp)
        if sys.version_info >= (3, 11):
            assert any("failed on item 3" in note for note in info.value.__notes__)

    def test_failure_cancels_the_rest_of_the_batch(self):
        tracker = ConcurrencyTracker()

        async def fail_first(x):
            if x == 0:
                raise KeyError("boom")
            return await tracker(x)

        with pytest.raises(KeyError, match="boom"):
            list(IterableWrapper(range(4)).async_map_batches(fail_first, 4))
        assert tracker.cancelled == 3
        assert all(loop.is_closed() for loop in tracker.loops)

    def test_runs_inside_a_running_event_loop(self):
        async def main():
            return list(IterableWrapper(range(5)).async_map_batches(async_mul_ten, 2))

        assert asyncio.run(main()) == [0, 10, 20, 30, 40]

    @pytest.mark.parametrize(
        ("kwargs", "match"),
        [
            ({"async_fn": mul_ten}, "coroutine function"),
            ({"batch_size": 0}, "batch_size"),
            ({"batch_size": True}, "batch_size"),
            ({"max_concurrency": 0}, "max_concurrency"),
            ({"output_col": 1}, "output_col must be None"),
            ({"input_col": 0, "output_col": [1, 2]}, "single index"),
        ],
    )
    def test_invalid_arguments_raise_value_error_as_torchdata(self, kwargs, match):
        args = {"async_fn": async_mul_ten, "batch_size": 2, **kwargs}
        with pytest.raises(ValueError, match=match):
            IterableWrapper([(1, 2)]).async_map_batches(**args)

    def test_length(self):
        assert len(IterableWrapper(range(7)).async_map_batches(async_mul_ten, 3)) == 7
        assert len(IterableWrapper(range(7)).async_map_batches(async_mul_ten, 3, flatten=False)) == 3
        with pytest.raises(TypeError):
            len(IterableWrapper(range(7)).filter(bool).async_map_batches(async_mul_ten, 3))

    def test_pickle_before_and_during_iteration(self):
        dp = IterableWrapper(range(5)).async_map_batches(async_mul_ten, 2)
        it = iter(dp)
        next(it)
        clone = pickle.loads(pickle.dumps(dp))
        assert list(clone) == [0, 10, 20, 30, 40]
        it.close()

    @pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 6, 7])
    def test_resumes(self, n):
        assert_resumes(lambda: IterableWrapper(range(7)).async_map_batches(async_mul_ten, 3), n)

    @pytest.mark.parametrize("n", [0, 1, 2, 3])
    def test_resumes_unflattened(self, n):
        assert_resumes(lambda: IterableWrapper(range(7)).async_map_batches(async_mul_ten, 3, flatten=False), n)

    def test_state_holds_the_pending_inputs_of_the_batch(self):
        dp = IterableWrapper(range(7)).async_map_batches(async_mul_ten, 3)
        it = iter(dp)
        assert [next(it), next(it)] == [0, 10]
        assert dp.state_dict() == {"pending": [2]}
        assert [next(it), next(it)] == [20, 30]
        assert dp.state_dict() == {"pending": [4, 5]}
        it.close()

    def test_restored_pending_inputs_are_run_again(self):
        tracker = ConcurrencyTracker()
        dp = IterableWrapper(range(7)).async_map_batches(tracker, 3)
        dp.load_state_dict({"pending": [4, 5]})
        # IterableWrapper was not restored here, so it starts again after the pending inputs
        assert list(dp) == [4, 5, *range(7)]


class TestWithDataLoader:
    def test_threaded_pipeline_resumes_by_snapshot(self, caplog):
        def make():
            return IterableWrapper(range(30)).threadpool_map(mul_ten, scheduled_tasks=4, max_workers=2).flatmap(twice)

        caplog.set_level(logging.INFO, logger="pipekit")
        loader = pipekit.DataLoader(make())
        it = iter(loader)
        head = [next(it) for _ in range(11)]
        state = loader.state_dict()
        rest = list(it)
        resumed = pipekit.DataLoader(make())
        resumed.load_state_dict(state)
        assert list(resumed) == rest
        assert head + rest == [y for x in range(30) for y in (x * 10, x * 100)]
        assert "replay" not in caplog.text
        assert wait_no_pool_threads() == []

    def test_async_pipeline_resumes_by_snapshot_in_a_worker(self, caplog):
        def make():
            return IterableWrapper(range(20)).async_map_batches(async_mul_ten, 3).flatmap(twice)

        caplog.set_level(logging.INFO, logger="pipekit")
        loader = pipekit.DataLoader(make(), num_workers=1)
        it = iter(loader)
        head = [next(it) for _ in range(9)]
        state = loader.state_dict()
        rest = list(it)
        resumed = pipekit.DataLoader(make(), num_workers=1)
        resumed.load_state_dict(state)
        assert list(resumed) == rest
        assert head + rest == [y for x in range(20) for y in (x * 10, x * 100)]
        assert "replay" not in caplog.text
