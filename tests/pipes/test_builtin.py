"""torch's own pipes as re-exported by pipekit, and their resumable variants."""

from __future__ import annotations

import pickle
import re

import pytest
import torch

import pipekit.pipes as pp
from pipekit.pipes import IterableWrapper
from pipekit.pipes._builtin import ResumableShardingFilter, ResumableShuffler
from pipekit.testing import assert_resumes


class TestReexports:
    @pytest.mark.parametrize(
        ("name", "torch_name"),
        [
            ("Mapper", "Mapper"),
            ("Filter", "Filter"),
            ("Shuffler", "Shuffler"),
            ("Batcher", "Batcher"),
            ("UnBatcher", "UnBatcher"),
            ("Collator", "Collator"),
            ("Zipper", "Zipper"),
            ("Concater", "Concater"),
            ("Multiplexer", "Multiplexer"),
            ("Forker", "Forker"),
            ("Demultiplexer", "Demultiplexer"),
            ("Grouper", "Grouper"),
            ("ShardingFilter", "ShardingFilter"),
        ],
    )
    def test_is_torchs_class(self, name, torch_name):
        """torch's class, or (batch, shuffle, unbatch, sharding_filter) pipekit's checked subclass of it."""
        import torch.utils.data.datapipes.iter as torch_iter

        assert issubclass(getattr(pp, name), getattr(torch_iter, torch_name))
        assert getattr(pp, name).__name__ == getattr(torch_iter, torch_name).__name__  # checkpoints name classes

    def test_functional_names_chain(self):
        pipe = IterableWrapper(range(10)).filter(lambda x: x % 2 == 0).map(lambda x: x * 10).batch(2)
        assert list(pipe) == [[0, 20], [40, 60], [80]]
        assert list(IterableWrapper([[1, 2], [3]]).unbatch()) == [1, 2, 3]
        a, b = IterableWrapper(range(4)).fork(2)
        assert list(a.zip(b)) == [(0, 0), (1, 1), (2, 2), (3, 3)]
        assert list(IterableWrapper([1, 2]).concat(IterableWrapper([3]))) == [1, 2, 3]
        assert list(IterableWrapper([1, 2]).mux(IterableWrapper([10, 20]))) == [1, 10, 2, 20]
        even, odd = IterableWrapper(range(5)).demux(2, lambda x: x % 2)
        assert list(even) == [0, 2, 4]
        assert list(odd) == [1, 3]


class TestArgumentChecks:
    """Issue 13: torch's batch/shuffle/unbatch/sharding_filter raised AssertionError, odd errors, or nothing."""

    @pytest.mark.parametrize(
        ("build", "error", "message"),
        [
            (lambda p: p.batch(0), ValueError, "batch: batch_size must be a positive int, got 0"),
            (lambda p: p.batch(-1), ValueError, "batch: batch_size must be a positive int, got -1"),
            (lambda p: p.batch("8"), TypeError, "batch: batch_size must be a positive int, got str '8'"),
            (lambda p: p.batch(True), TypeError, "batch: batch_size"),
            (lambda p: p.batch(2.0), TypeError, "batch: batch_size"),
            (lambda p: p.batch(2, drop_last="no"), TypeError, "batch: drop_last must be a bool"),
            (lambda p: p.shuffle(buffer_size=-5), ValueError, "shuffle: buffer_size must be a positive int, got -5"),
            (lambda p: p.shuffle(buffer_size=0), ValueError, "shuffle: buffer_size"),
            (lambda p: p.shuffle(buffer_size="10"), TypeError, "shuffle: buffer_size"),
            (lambda p: p.shuffle(unbatch_level=-2), ValueError, "shuffle: unbatch_level must be an int >= -1"),
            (lambda p: p.unbatch(unbatch_level=-3), ValueError, "unbatch: unbatch_level must be an int >= -1"),
            (lambda p: p.unbatch(unbatch_level="1"), TypeError, "unbatch: unbatch_level"),
            (lambda p: p.sharding_filter().apply_sharding(2, -1), ValueError, "sharding_filter: instance_id"),
            (lambda p: p.sharding_filter().apply_sharding(2, 2), ValueError, "instance_id must be below"),
            (lambda p: p.sharding_filter().apply_sharding(0, 0), ValueError, "sharding_filter: num_of_instances"),
            (lambda p: p.sharding_filter().apply_sharding(2.0, 0), TypeError, "sharding_filter: num_of_instances"),
            (lambda p: p.groupby(None), TypeError, "groupby: group_key_fn must be a callable, got NoneType None"),
            (lambda p: p.groupby(len, group_size=0), ValueError, "groupby: group_size must be a positive int or None"),
            (lambda p: p.groupby(len, group_size="3"), TypeError, "groupby: group_size must be a positive int"),
            (lambda p: p.groupby(len, buffer_size=0), ValueError, "groupby: buffer_size must be a positive int"),
            (lambda p: p.groupby(len, buffer_size=2, group_size=3), ValueError,
             "groupby: group_size must not exceed buffer_size (2), got 3"),
            (lambda p: p.groupby(len, guaranteed_group_size=2), ValueError,
             "groupby: guaranteed_group_size needs a group_size"),
            (lambda p: p.groupby(len, group_size=2, guaranteed_group_size=3), ValueError,
             "groupby: guaranteed_group_size must not exceed group_size (2), got 3"),
            (lambda p: p.groupby(len, group_size=2, guaranteed_group_size=0), ValueError,
             "groupby: guaranteed_group_size must be a positive int or None, got 0"),
        ],
    )
    def test_bad_arguments_name_the_pipe(self, build, error, message):
        with pytest.raises(error, match=re.escape(message)):
            build(IterableWrapper([[1, 2], [3]]))

    def test_good_arguments_behave_as_torchs(self):
        import numpy as np

        assert list(IterableWrapper(range(5)).batch(np.int64(2), drop_last=True)) == [[0, 1], [2, 3]]
        assert list(IterableWrapper([[[0], [1]], [[2]]]).unbatch(-1)) == [0, 1, 2]
        assert sorted(IterableWrapper([[0, 1], [2]]).shuffle(buffer_size=2, unbatch_level=1)) == [0, 1, 2]
        pipe = IterableWrapper(range(7)).sharding_filter()
        pipe.apply_sharding(3, 2)
        assert list(pipe) == [2, 5]
        groups = IterableWrapper(["a", "bb", "c", "dd", "e"]).groupby(len, group_size=2, guaranteed_group_size=1)
        assert list(groups) == [["a", "c"], ["bb", "dd"], ["e"]]

    def test_functional_names_build_pipekits_classes(self):
        source = IterableWrapper([[1]])
        assert type(source.batch(1)) is pp.Batcher
        assert type(source.shuffle()) is pp.Shuffler
        assert type(source.unbatch()) is pp.UnBatcher
        assert type(source.sharding_filter()) is pp.ShardingFilter
        assert type(source.groupby(len)) is pp.Grouper

    def test_torchs_own_classes_still_resume(self):
        """A pipe built from torch's classes directly is swapped and snapshotted as before."""
        import torch.utils.data.datapipes.iter as torch_iter

        def make():
            pipe = torch_iter.Shuffler(IterableWrapper(range(20)), buffer_size=4).set_seed(1)
            return torch_iter.Batcher(torch_iter.ShardingFilter(pipe), 3)

        for n in (0, 2, 6):
            assert_resumes(make, n)


class TestIterableWrapper:
    def test_yields_items_every_epoch(self):
        pipe = IterableWrapper([1, 2, 3])
        assert list(pipe) == [1, 2, 3]
        assert list(pipe) == [1, 2, 3]
        assert len(pipe) == 3

    def test_deepcopy_protects_source(self):
        data = [[1], [2]]
        pipe = IterableWrapper(data)
        for item in pipe:
            item.append(0)
        assert data == [[1], [2]]

    @pytest.mark.parametrize("n", [0, 1, 5, 9])
    def test_resumes(self, n):
        assert_resumes(lambda: IterableWrapper(range(10)), n)

    def test_restore_applies_once(self):
        pipe = IterableWrapper(range(5))
        pipe.load_state_dict({"yielded": 3})
        assert list(pipe) == [3, 4]
        assert list(pipe) == [0, 1, 2, 3, 4]

    def test_pickles(self):
        pipe = IterableWrapper(range(3))
        assert list(pickle.loads(pickle.dumps(pipe))) == [0, 1, 2]


class TestResumableShuffler:
    def make(self):
        return IterableWrapper(range(30)).shuffle(buffer_size=8).set_seed(7)

    def test_same_order_as_torch_shuffler(self):
        plain = list(self.make())
        pipe = self.make()
        pipe.__class__ = ResumableShuffler
        assert list(pipe) == plain

    @pytest.mark.parametrize("n", [0, 3, 8, 20, 29])
    def test_resumes_with_buffer(self, n):
        assert_resumes(self.make, n)

    def test_buffer_positions_are_in_state(self):
        pipe = self.make()
        pipe.__class__ = ResumableShuffler
        it = iter(pipe)
        next(it)
        state = pipe.state_dict()
        # positions, not the items (the first pull comes before the first snapshot of the pipes above: inline)
        assert len(state["replay"]["pulls"]) == 8 and len(state["buffer"]) <= 1


class TestResumableShardingFilter:
    def make(self, instance):
        def build():
            pipe = IterableWrapper(range(23)).sharding_filter()
            pipe.apply_sharding(3, instance)
            return pipe

        return build

    @pytest.mark.parametrize("instance", [0, 1, 2])
    @pytest.mark.parametrize("n", [0, 2, 5])
    def test_resumes_keeping_shard_alignment(self, instance, n):
        assert_resumes(self.make(instance), n)

    def test_same_items_as_torch(self):
        pipe = self.make(1)()
        expected = list(pipe)
        pipe.__class__ = ResumableShardingFilter
        assert list(pipe) == expected == list(range(1, 23, 3))


def test_shuffle_follows_torch_seed():
    def order(seed):
        torch.manual_seed(seed)
        return list(torch.utils.data.DataLoader(IterableWrapper(range(20)).shuffle(), batch_size=None))

    assert order(1) == order(1)
    assert order(1) != order(2)


@pytest.mark.parametrize(("n", "buffer_size"), [(1, 1), (30, 8), (300, 64), (257, 256), (100, 1000), (0, 4)])
@pytest.mark.parametrize("seed", [0, 7, 12345])
def test_shuffle_order_is_torchs(n, buffer_size, seed):
    """pipekit's shuffle draws buffer positions without random.randint's Python calls: same order as torch's."""
    from torch.utils.data.datapipes.iter import IterableWrapper as TorchWrapper
    from torch.utils.data.datapipes.iter import Shuffler as TorchShuffler

    expected = list(TorchShuffler(TorchWrapper(range(n)), buffer_size=buffer_size).set_seed(seed))
    assert list(IterableWrapper(range(n)).shuffle(buffer_size=buffer_size).set_seed(seed)) == expected


def test_shuffle_with_another_generator_calls_its_randint():
    """A generator that is not a plain random.Random (set by a user or a library) is drawn from by randint."""
    import random

    from torch.utils.data.datapipes.iter import IterableWrapper as TorchWrapper
    from torch.utils.data.datapipes.iter import Shuffler as TorchShuffler

    class Last(random.Random):
        def randint(self, a, b):
            return b

    ours = IterableWrapper(range(10)).shuffle(buffer_size=4)
    theirs = TorchShuffler(TorchWrapper(range(10)), buffer_size=4)
    for pipe in (ours, theirs):
        pipe._rng = Last()
    assert list(ours) == list(theirs) == [3, 4, 5, 6, 7, 8, 9, 2, 1, 0]


def test_batches_are_datachunks_iterated_at_c_speed():
    import pickle

    from torch.utils.data.datapipes.datapipe import DataChunk

    batches = list(IterableWrapper(range(5)).batch(2))
    assert batches == [[0, 1], [2, 3], [4]]
    assert all(isinstance(batch, DataChunk) for batch in batches)
    assert type(batches[0]).__iter__ is list.__iter__  # no Python generator step per item
    assert [list(iter(batch)) for batch in batches] == [[0, 1], [2, 3], [4]]
    copy = pickle.loads(pickle.dumps(batches[0]))
    assert copy == [0, 1] and type(copy) is type(batches[0])
    assert [type(b) for b in IterableWrapper(range(3)).batch(2, wrapper_class=list)] == [list, list]
