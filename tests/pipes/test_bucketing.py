"""Tests of pipekit.pipes._bucketing: bucketbatch, max_token_bucketize, in_batch_shuffle."""

from __future__ import annotations

import logging
import pickle
import random

import pytest
import torch

from pipekit.pipes import BucketBatcher, InBatchShuffler, IterableWrapper, MaxTokenBucketizer
from pipekit.pipes._resume import restore_pipeline, snapshot_pipeline
from pipekit.testing import assert_resumes


def sort_bucket(bucket: list) -> list:
    return sorted(bucket)


def sort_by_len(bucket: list) -> list:
    return sorted(bucket, key=len)


def str_len(item: dict) -> int:
    return item["n"]


@pytest.fixture
def words() -> list[str]:
    rng = random.Random(1234)
    return ["x" * rng.randint(1, 30) + str(i) for i in range(97)]


@pytest.fixture
def token_strings() -> list[str]:
    return ["1", "11", "1", "1111", "111", "1", "11", "11", "111"]


def test_source_keeps_its_torchdata_name():
    source = IterableWrapper(range(4))
    for pipe in (source.in_batch_shuffle(), source.bucketbatch(2), source.max_token_bucketize(3, len_fn=str_len)):
        assert pipe.source_datapipe is source and pipe.datapipe is source
        with pytest.raises(AttributeError):
            pipe.datapipe = source


@pytest.mark.parametrize(
    "make",
    [
        lambda: IterableWrapper(range(30)).batch(4).in_batch_shuffle(),
        lambda: IterableWrapper(range(30)).bucketbatch(batch_size=3, batch_num=2),
    ],
    ids=["in_batch_shuffle", "bucketbatch"],
)
class TestSeeding:
    def test_pending_seed_waits_while_not_shuffling(self, make):
        # as torch's Shuffler: an epoch without shuffling leaves the seed for the next shuffled one
        seeded = list(make().set_seed(4))
        pipe = make().set_seed(4).set_shuffle(False)
        assert list(pipe) == list(make().set_shuffle(False)) != seeded
        assert pipe._seed == 4
        assert list(pipe.set_shuffle(True)) == seeded
        assert pipe._seed is None

    def test_restores_a_checkpoint_without_epoch_seed(self, make):
        # checkpoints written before these pipes were SeededPipes hold the generator but no "seed"
        expected = list(make().set_seed(8))
        pipe = make().set_seed(8)
        it = iter(pipe)
        head = [next(it) for _ in range(2)]
        state = snapshot_pipeline(pipe)
        own = state["states"][0]
        assert {"seed", "rng"} <= set(own)
        del own["seed"]
        fresh = make().set_seed(8)
        restore_pipeline(fresh, pickle.loads(pickle.dumps(state)))
        assert head + list(fresh) == expected


class TestInBatchShuffler:
    def test_torchdata_example(self):
        dp = IterableWrapper(range(10)).batch(batch_size=3, drop_last=True).in_batch_shuffle()
        out = list(dp)
        assert [sorted(b) for b in out] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]

    def test_seeded_output(self):
        dp = IterableWrapper(range(10)).batch(batch_size=3, drop_last=True).in_batch_shuffle()
        dp.set_seed(0)
        assert list(dp) == [[1, 2, 0], [4, 5, 3], [7, 8, 6]]

    def test_determinism_and_seed_scope(self):
        dp = IterableWrapper(range(100)).batch(20).in_batch_shuffle()
        runs = []
        for seed in (3, 3, 4):
            dp.set_seed(seed)
            runs.append(list(dp))
        assert runs[0] == runs[1]
        assert runs[0] != runs[2]
        # set_seed applies to one epoch; the next one draws its seed from torch
        torch.manual_seed(7)
        a = list(dp)
        torch.manual_seed(7)
        assert list(dp) == a
        assert a != runs[0]

    def test_does_not_modify_input_batches(self):
        batches = [[1, 2, 3, 4, 5]]
        dp = InBatchShuffler(IterableWrapper(batches, deepcopy=False))
        dp.set_seed(1)
        list(dp)
        assert batches == [[1, 2, 3, 4, 5]]

    def test_set_shuffle_false(self):
        dp = IterableWrapper(range(6)).batch(3).in_batch_shuffle().set_shuffle(False)
        assert list(dp) == [[0, 1, 2], [3, 4, 5]]

    def test_len_and_pickle(self):
        dp = IterableWrapper(range(10)).batch(3).in_batch_shuffle()
        assert len(dp) == 4
        dp.set_seed(5)
        copy = pickle.loads(pickle.dumps(dp))
        assert list(copy) == list(dp)

    def test_not_a_batch(self):
        with pytest.raises(TypeError, match="in_batch_shuffle: expected batches"):
            list(IterableWrapper([1, 2]).in_batch_shuffle())

    @pytest.mark.parametrize("n", [0, 1, 3, 6])
    def test_resumes(self, n):
        def make():
            return IterableWrapper(range(20)).batch(3).in_batch_shuffle().set_seed(11)

        assert_resumes(make, n)


class TestBucketBatcher:
    def test_torchdata_example_default(self):
        dp = IterableWrapper(range(10)).bucketbatch(batch_size=3, drop_last=True)
        dp.set_seed(0)
        out = list(dp)
        assert out == [[6, 9, 0], [2, 4, 3], [5, 1, 8]]
        assert all(len(b) == 3 for b in out)
        assert len({x for b in out for x in b}) == 9

    def test_torchdata_example_sorted(self):
        dp = IterableWrapper(range(10)).bucketbatch(
            batch_size=3, drop_last=True, batch_num=100, bucket_num=1, use_in_batch_shuffle=False, sort_key=sort_bucket
        )
        torch.manual_seed(1)
        out = list(dp)
        assert sorted(out) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
        dp.set_seed(0)
        assert list(dp) == [[3, 4, 5], [6, 7, 8], [0, 1, 2]]  # the order torchdata documents

    def test_sort_key_receives_whole_buckets(self):
        calls = []

        def record(bucket):
            calls.append(list(bucket))
            assert isinstance(bucket, list)
            return sorted(bucket, reverse=True)

        dp = IterableWrapper(range(25)).bucketbatch(batch_size=2, batch_num=5, sort_key=record)
        out = list(dp)
        assert [len(c) for c in calls] == [10, 10, 5]
        assert sorted(x for c in calls for x in c) == list(range(25))
        # defaults (bucket_num=1, use_in_batch_shuffle=True): no shuffling at all, as in torchdata
        assert out == [[9, 8], [7, 6], [5, 4], [3, 2], [1, 0], [19, 18], [17, 16], [15, 14], [13, 12],
                       [11, 10], [24, 23], [22, 21], [20]]

    def test_batches_are_slices_of_sorted_buckets(self, words):
        dp = IterableWrapper(words).bucketbatch(
            batch_size=4, batch_num=5, bucket_num=2, sort_key=sort_by_len, use_in_batch_shuffle=False
        )
        dp.set_seed(2)
        out = list(dp)
        assert sorted(x for b in out for x in b) == sorted(words)
        assert [len(b) for b in out].count(4) == len(out) - 1
        # pool shuffle, then each bucket of 20 is sorted by length: a batch spans a narrow length range
        spreads = [max(map(len, b)) - min(map(len, b)) for b in out]
        assert sum(spreads) / len(spreads) < 5

    def test_batch_order_shuffled_in_groups_of_bucket_num(self):
        buckets = []

        def record(bucket):
            buckets.append(sorted(bucket))
            return sorted(bucket)

        dp = IterableWrapper(range(40)).bucketbatch(
            batch_size=2, batch_num=5, bucket_num=2, sort_key=record, use_in_batch_shuffle=True
        )
        dp.set_seed(0)
        out = list(dp)
        # the pool of 20 items was shuffled before bucketing, so buckets are not ranges
        assert [len(b) for b in buckets] == [10, 10, 10, 10]
        assert buckets[0] != list(range(10))
        stream = [b[i : i + 2] for b in buckets for i in range(0, 10, 2)]
        # torchdata shuffles each run of bucket_num (=2) consecutive batches among themselves
        groups = [out[i : i + 2] for i in range(0, len(out), 2)]
        expected = [stream[i : i + 2] for i in range(0, len(stream), 2)]
        assert [sorted(g) for g in groups] == [sorted(g) for g in expected]
        assert groups != expected

    def test_drop_last(self):
        keep = list(IterableWrapper(range(10)).bucketbatch(batch_size=4, drop_last=False).set_seed(0))
        drop = list(IterableWrapper(range(10)).bucketbatch(batch_size=4, drop_last=True).set_seed(0))
        assert [len(b) for b in keep] == [4, 4, 2]
        assert sorted(x for b in keep for x in b) == list(range(10))
        assert [len(b) for b in drop] == [4, 4]
        assert drop == keep[:2]

    def test_determinism(self, words):
        def run(seed):
            dp = IterableWrapper(words).bucketbatch(batch_size=5, batch_num=3, bucket_num=3, sort_key=sort_by_len)
            dp.set_seed(seed)
            return list(dp)

        assert run(1) == run(1)
        assert run(1) != run(2)
        dp = IterableWrapper(words).bucketbatch(batch_size=5, use_in_batch_shuffle=False)
        torch.manual_seed(3)
        a = list(dp)
        torch.manual_seed(3)
        assert list(dp) == a

    def test_set_shuffle_false(self):
        dp = IterableWrapper(range(7)).bucketbatch(batch_size=3).set_shuffle(False)
        assert list(dp) == [[0, 1, 2], [3, 4, 5], [6]]

    def test_sort_key_must_return_a_list(self):
        dp = IterableWrapper(range(5)).bucketbatch(batch_size=2, sort_key=len)
        with pytest.raises(TypeError, match="sort_key must return the sorted bucket"):
            list(dp)

    def test_argument_validation(self):
        src = IterableWrapper(range(5))
        with pytest.raises(ValueError, match="batch_size must be a positive int"):
            src.bucketbatch(batch_size=0)
        with pytest.raises(TypeError, match="batch_num must be a positive int, got float"):
            src.bucketbatch(batch_size=2, batch_num=1.5)
        with pytest.raises(ValueError, match="bucket_num must be a positive int"):
            src.bucketbatch(batch_size=2, bucket_num=0)
        with pytest.raises(TypeError, match="sort_key must be callable"):
            src.bucketbatch(batch_size=2, sort_key="len")

    def test_pickle(self, words):
        dp = BucketBatcher(IterableWrapper(words), batch_size=4, batch_num=2, bucket_num=2, sort_key=sort_by_len)
        dp.set_seed(9)
        copy = pickle.loads(pickle.dumps(dp))
        assert list(copy) == list(dp.set_seed(9))

    @pytest.mark.parametrize(
        "kwargs",
        [
            {"batch_size": 3, "batch_num": 2},
            {"batch_size": 3, "batch_num": 2, "use_in_batch_shuffle": False},
            {"batch_size": 2, "batch_num": 3, "bucket_num": 2, "sort_key": sort_by_len},
            {"batch_size": 2, "batch_num": 3, "bucket_num": 2, "sort_key": sort_by_len, "use_in_batch_shuffle": False},
            {"batch_size": 4, "batch_num": 2, "sort_key": sort_by_len, "drop_last": True},
        ],
    )
    @pytest.mark.parametrize("n", [0, 1, 4, 9])
    def test_resumes(self, words, kwargs, n):
        def make():
            return IterableWrapper(words[:40]).bucketbatch(**kwargs).set_seed(5)

        assert_resumes(make, n)


class TestMaxTokenBucketizer:
    def test_torchdata_examples(self, token_strings):
        source = IterableWrapper(token_strings)
        assert list(source.max_token_bucketize(max_token_count=5)) == [
            ["1", "1", "1", "11"], ["11", "11"], ["111"], ["111"], ["1111"],
        ]
        assert list(source.max_token_bucketize(max_token_count=4, buffer_size=4)) == [
            ["1", "1", "1"], ["11", "11"], ["11"], ["111"], ["111"], ["1111"],
        ]

    def test_include_padding(self, token_strings):
        source = IterableWrapper(token_strings)
        plain = list(source.max_token_bucketize(max_token_count=6, buffer_size=None))
        padded = list(source.max_token_bucketize(max_token_count=6, buffer_size=None, include_padding=True))
        assert plain == [["1", "1", "1", "11"], ["11", "11"], ["111", "111"], ["1111"]]
        assert padded == [["1", "1", "1"], ["11", "11", "11"], ["111", "111"], ["1111"]]
        assert all(max(map(len, b)) * len(b) <= 6 for b in padded)

    def test_budget_respected(self, words):
        out = list(IterableWrapper(words).max_token_bucketize(max_token_count=100, buffer_size=20))
        assert sorted(x for b in out for x in b) == sorted(words)
        assert all(sum(map(len, b)) <= 100 for b in out)

    def test_len_fn(self):
        items = [{"n": n} for n in (3, 1, 2, 2)]
        out = list(IterableWrapper(items).max_token_bucketize(max_token_count=4, len_fn=str_len))
        assert out == [[{"n": 1}, {"n": 2}], [{"n": 2}], [{"n": 3}]]

    def test_out_of_range_items_are_skipped_and_recorded(self, token_strings, caplog):
        dp = IterableWrapper(token_strings).max_token_bucketize(max_token_count=5, min_len=2, max_len=3)
        with caplog.at_level(logging.WARNING, logger="pipekit"):
            out = list(dp)
        assert out == [["11", "11"], ["11", "111"], ["111"]]
        assert dp.skip_log.count == 4
        urls = [s.url for s in dp.skip_log.skipped]
        assert urls == ["item 0 ('1')", "item 2 ('1')", "item 3 ('1111')", "item 5 ('1')"]
        assert all(s.stage == "max_token_bucketize" for s in dp.skip_log.skipped)
        assert "length 4 is outside [min_len, max_len] = [2, 3]" in dp.skip_log.skipped[2].reason
        assert sum("max_token_bucketize: skipped" in r.getMessage() for r in caplog.records) == 4

    def test_item_longer_than_budget_is_an_error(self, token_strings):
        with pytest.raises(ValueError, match=r"item 3 \('1111'\) has length 4, more than max_token_count=3"):
            list(IterableWrapper(token_strings).max_token_bucketize(max_token_count=3))

    def test_bad_len_fn_result(self):
        with pytest.raises(ValueError, match="len_fn must return a non-negative number"):
            list(IterableWrapper([1]).max_token_bucketize(max_token_count=3, len_fn=str))

    @pytest.mark.parametrize(("name", "value"), [("min_len", None), ("min_len", "3"), ("max_len", "3"),
                                                 ("max_len", [3])])
    def test_a_length_bound_that_is_not_a_number_is_refused_naming_it(self, name, value):
        """A bare comparison error (``'<' not supported between instances of 'NoneType' and 'int'``) before."""
        with pytest.raises(TypeError, match=rf"max_token_bucketize: {name} must be a number"):
            IterableWrapper(["a"]).max_token_bucketize(max_token_count=5, **{name: value})

    def test_argument_validation(self):
        src = IterableWrapper(["a"])
        with pytest.raises(ValueError, match="min_len"):
            src.max_token_bucketize(max_token_count=5, min_len=4, max_len=3)
        with pytest.raises(ValueError, match="min_len"):
            src.max_token_bucketize(max_token_count=5, min_len=-1)
        with pytest.raises(ValueError, match="must not exceed max_token_count"):
            src.max_token_bucketize(max_token_count=5, max_len=6)
        with pytest.raises(ValueError, match="buffer_size must be a positive int"):
            src.max_token_bucketize(max_token_count=5, buffer_size=0)
        with pytest.raises(ValueError, match="max_token_count must be positive"):
            src.max_token_bucketize(max_token_count=0)
        with pytest.raises(TypeError, match="len_fn must be callable"):
            src.max_token_bucketize(max_token_count=5, len_fn=3)

    def test_pickle(self, words):
        dp = MaxTokenBucketizer(IterableWrapper(words), max_token_count=60, buffer_size=8)
        copy = pickle.loads(pickle.dumps(dp))
        assert list(copy) == list(dp)

    @pytest.mark.parametrize("include_padding", [False, True])
    @pytest.mark.parametrize("n", [0, 2, 7, 15])
    def test_resumes(self, words, include_padding, n):
        def make():
            return IterableWrapper(words[:60]).max_token_bucketize(
                max_token_count=80, buffer_size=10, include_padding=include_padding, max_len=40
            )

        assert_resumes(make, n)
