"""Tests of round_robin_demux, unzip and random_split (pipekit.pipes._splitting)."""

from __future__ import annotations

import pickle

import pytest

from pipekit.errors import ConfigurationError
from pipekit.pipes import (
    IterableWrapper,
    RandomSplitter,
    RoundRobinDemultiplexer,
    UnZipper,
)
from pipekit.pipes._resume import not_snapshot_capable
from pipekit.pipes.base import owner_of
from pipekit.testing import assert_resumes, resume_after

# list() asks for len(); a header over an unsized source warns (once) that its length is a guess.
pytestmark = pytest.mark.filterwarnings("ignore:Header. the source has no length")


def first(t):
    return t[0]


def is_even(x):
    return x % 2 == 0


@pytest.mark.parametrize(
    ("name", "kind", "cls"),
    [
        ("round_robin_demux", "iter", "splitting.RoundRobinDemultiplexer"),
        ("unzip", "iter", "splitting.UnZipper"),
        ("random_split", "iter", "splitting.RandomSplitter"),
    ],
)
def test_functional_names_are_pipekits(name, kind, cls):
    assert owner_of(name, kind) == f"pipekit.pipes._{cls}"


# ----------------------------------------------------------------- round_robin_demux


class TestRoundRobinDemultiplexer:
    def test_torchdata_example(self):
        dp1, dp2 = IterableWrapper(range(5)).round_robin_demux(2)
        assert list(dp1) == [0, 2, 4]
        assert len(dp1) == 3
        assert list(dp2) == [1, 3]
        assert len(dp2) == 2

    def test_children_together(self):
        a, b, c = IterableWrapper(range(8)).round_robin_demux(3)
        assert list(a.zip_longest(b, c)) == [(0, 1, 2), (3, 4, 5), (6, 7, None)]
        assert [len(a), len(b), len(c)] == [3, 3, 2]

    def test_one_instance_returns_source(self):
        src = IterableWrapper(range(3))
        with pytest.warns(UserWarning, match="num_instances=1"):
            assert RoundRobinDemultiplexer(src, 1) == [src]

    @pytest.mark.parametrize("bad", [0, -1, 2.0])
    def test_invalid_num_instances(self, bad):
        with pytest.raises(ValueError, match="num_instances"):
            IterableWrapper(range(3)).round_robin_demux(bad)

    def test_invalid_buffer_size(self):
        with pytest.raises(ValueError, match="buffer_size"):
            IterableWrapper(range(3)).round_robin_demux(2, buffer_size=-5)

    def test_buffer_overflow(self):
        dp1, _ = IterableWrapper(range(20)).round_robin_demux(2, buffer_size=3)
        with pytest.raises(BufferError, match="round_robin_demux: buffer overflow"):
            list(dp1)
        dp1, dp2 = IterableWrapper(range(20)).round_robin_demux(2, buffer_size=-1)
        assert list(dp1) == list(range(0, 20, 2))
        assert list(dp2) == list(range(1, 20, 2))

    def test_restarting_a_child_resets_all(self):
        dp1, dp2 = IterableWrapper(range(6)).round_robin_demux(2)
        it2 = iter(dp2)
        assert next(it2) == 1
        assert list(dp1) == [0, 2, 4]
        with pytest.warns(UserWarning, match="new iterator"):
            assert list(dp1) == [0, 2, 4]
        with pytest.raises(RuntimeError, match="invalid"):
            next(it2)
        assert list(dp2) == [1, 3, 5]

    def test_epochs(self):
        dp1, dp2 = IterableWrapper(range(4)).round_robin_demux(2)
        for _ in range(2):
            assert list(dp1.zip(dp2)) == [(0, 1), (2, 3)]

    def test_empty_source(self):
        dp1, dp2 = IterableWrapper([]).round_robin_demux(2)
        assert list(dp1) == list(dp2) == []

    def test_pickle(self):
        dp1, dp2 = pickle.loads(pickle.dumps(IterableWrapper(range(5)).round_robin_demux(2)))
        assert dp1.main_datapipe is dp2.main_datapipe
        assert list(dp1.zip_longest(dp2)) == [(0, 1), (2, 3), (4, None)]

    @pytest.mark.parametrize("n", [0, 1, 2, 4, 5])
    def test_resumes_with_buffered_items(self, n):
        def make():
            a, b = IterableWrapper(range(20)).round_robin_demux(2)
            return a.zip(b.batch(2))  # b reads ahead of a, so a's buffer fills

        assert_resumes(make, n)
        pipe = make()
        assert not_snapshot_capable(pipe) == []
        if n:
            head, _ = resume_after(make, n)
            assert head[-1][0] == 2 * (n - 1)

    def test_state_holds_buffers(self):
        a, b = IterableWrapper(range(20)).round_robin_demux(2)
        pipe = a.zip(b.batch(2))
        it = iter(pipe)
        assert next(it) == (0, [1, 3])
        assert a.main_datapipe.state_dict() == {"active": True, "buffers": [[2], []], "exhausted": False, "count": 4}


# ----------------------------------------------------------------- unzip


class TestUnZipper:
    def test_torchdata_example(self):
        source_dp = IterableWrapper([(i, i + 10, i + 20) for i in range(3)])
        dp1, dp2, dp3 = source_dp.unzip(sequence_length=3)
        assert list(dp1) == [0, 1, 2]
        assert list(dp2) == [10, 11, 12]
        assert list(dp3) == [20, 21, 22]

    def test_columns_to_skip(self):
        dps = IterableWrapper([(i, -i, str(i)) for i in range(3)]).unzip(3, columns_to_skip=[0])
        assert [list(dp) for dp in dps] == [[0, -1, -2], ["0", "1", "2"]]
        assert [len(dp) for dp in dps] == [3, 3]

    @pytest.mark.parametrize(
        ("kwargs", "match"),
        [
            ({"sequence_length": 0}, "sequence_length"),
            ({"sequence_length": 2, "columns_to_skip": [0, 1]}, "skips every column"),
            ({"sequence_length": 2, "columns_to_skip": [2]}, "columns_to_skip"),
            ({"sequence_length": 2, "buffer_size": -2}, "buffer_size"),
        ],
    )
    def test_invalid_arguments(self, kwargs, match):
        with pytest.raises(ValueError, match=match):
            UnZipper(IterableWrapper([(1, 2)]), **kwargs)

    @pytest.mark.parametrize(
        "kwargs", [{"sequence_length": 0}, {"sequence_length": 2, "columns_to_skip": [0, 1]}]
    )
    def test_no_children_is_a_runtime_error_as_torchdata(self, kwargs):
        with pytest.raises(RuntimeError, match="unzip") as info:
            IterableWrapper([(1, 2)]).unzip(**kwargs)
        assert isinstance(info.value, ConfigurationError)

    def test_child_read_out_of_order_raises_buffer_error_as_torchdata(self):
        # torchdata's children share fork's buffer: reading one child ahead of the others by more than
        # buffer_size items raises BufferError at the item that overflows it.
        dp1, dp2 = IterableWrapper([(i, -i) for i in range(10)]).unzip(2, buffer_size=3)
        it = iter(dp1)
        assert [next(it) for _ in range(3)] == [0, 1, 2]
        with pytest.raises(BufferError):
            next(it)
        dp1, dp2 = IterableWrapper([(i, -i) for i in range(10)]).unzip(2, buffer_size=3)
        it = iter(dp1)
        assert [next(it) for _ in range(3)] == [0, 1, 2]
        got = []
        with pytest.raises(BufferError):
            got.extend(dp2)  # dp2 catches up with dp1, then may run 3 items ahead of it (as torchdata)
        assert got == [0, -1, -2, -3, -4, -5]
        assert next(it) == 3  # dp1 goes on from the buffer
        dp1, dp2 = IterableWrapper([(i, -i) for i in range(10)]).unzip(2, buffer_size=-1)
        assert (list(dp1), list(dp2)) == (list(range(10)), [-i for i in range(10)])

    def test_wrong_length_item(self):
        dp1, _ = IterableWrapper([(1, 2), (1, 2, 3)]).unzip(2)
        with pytest.raises(ValueError, match="item 1 has length 3"):
            list(dp1)

    def test_lag_limit(self):
        dp1, dp2 = IterableWrapper([(i, i) for i in range(10)]).unzip(2, buffer_size=3)
        with pytest.raises(BufferError, match="unzip: buffer overflow"):
            list(dp1)
        dp1, dp2 = IterableWrapper([(i, i) for i in range(10)]).unzip(2, buffer_size=10)
        assert list(dp1) == list(dp2) == list(range(10))

    def test_pickle(self):
        dps = IterableWrapper([(1, "a"), (2, "b")]).unzip(2)
        dp1, dp2 = pickle.loads(pickle.dumps(dps))
        assert list(dp1.zip(dp2)) == [(1, "a"), (2, "b")]

    @pytest.mark.parametrize("n", [0, 1, 2, 3])
    def test_resumes(self, n):
        def make():
            a, b, c = IterableWrapper([(i, i * 10, -i) for i in range(9)]).unzip(3)
            return a.zip(b.batch(2), c.batch(3))

        assert_resumes(make, n)


# ----------------------------------------------------------------- random_split


class TestRandomSplitter:
    def test_torchdata_example(self):
        dp = IterableWrapper(range(10))
        train, valid = dp.random_split(total_length=10, weights={"train": 0.5, "valid": 0.5}, seed=0)
        assert list(train) == [2, 3, 5, 7, 8]
        assert list(valid) == [0, 1, 4, 6, 9]
        train = dp.random_split(total_length=10, weights={"train": 0.5, "valid": 0.5}, seed=0, target="train")
        assert list(train) == [2, 3, 5, 7, 8]
        valid = dp.random_split(total_length=10, weights={"train": 0.5, "valid": 0.5}, seed=0, target="valid")
        assert list(valid) == [0, 1, 4, 6, 9]

    def test_class_form(self):
        train = RandomSplitter(IterableWrapper(range(10)), {"train": 0.5, "valid": 0.5}, 0, target="train")
        assert list(train) == [2, 3, 5, 7, 8]

    def test_same_split_every_epoch_and_override_seed(self):
        train, valid = IterableWrapper(range(30)).random_split({"t": 2, "v": 1}, seed=5, total_length=30)
        first = list(train)
        assert list(train) == first
        assert sorted(first + list(valid)) == list(range(30))
        train.override_seed(6)
        other = list(train)
        assert other != first
        assert sorted(other + list(valid)) == list(range(30))

    def test_integer_weights_give_exact_sizes(self):
        splits = IterableWrapper(range(20)).random_split({"a": 12, "b": 5, "c": 3}, seed=1)
        assert [len(s) for s in splits] == [12, 5, 3]
        assert [len(list(s)) for s in splits] == [12, 5, 3]

    def test_fractional_weights_have_no_length(self):
        train, _ = IterableWrapper(range(10)).random_split({"t": 1, "v": 2}, seed=1)
        with pytest.raises(TypeError, match="set_length"):
            len(train)

    def test_errors(self):
        src = IterableWrapper(range(10))
        with pytest.raises(KeyError, match="target='x'"):
            src.random_split({"t": 1}, seed=0, target="x")
        with pytest.raises(TypeError, match="total_length"):
            src.filter(is_even).random_split({"t": 1, "v": 1}, seed=0)
        with pytest.raises(ValueError, match="weights"):
            src.random_split({}, seed=0)
        with pytest.raises(ValueError, match="positive"):
            src.random_split({"t": 1, "v": 0}, seed=0)
        with pytest.raises(ValueError, match="total_length"):
            src.random_split({"t": 1}, seed=0, total_length=-1)
        short, _ = src.random_split({"t": 1, "v": 1}, seed=0, total_length=4)
        with pytest.raises(ValueError, match="more items than total_length=4"):
            list(short)

    def test_one_split_at_a_time(self):
        train, valid = IterableWrapper(range(50)).random_split({"t": 1, "v": 1}, seed=0)
        it = iter(train)
        next(it)
        assert list(valid)
        with pytest.raises(RuntimeError, match="one split at a time"):
            list(it)

    def test_pickle(self):
        train, valid = pickle.loads(pickle.dumps(IterableWrapper(range(10)).random_split({"t": 1, "v": 1}, seed=0)))
        assert list(train) == [2, 3, 5, 7, 8]
        assert train.main_datapipe is valid.main_datapipe

    @pytest.mark.parametrize("n", [0, 1, 4, 7])
    def test_resumes(self, n):
        assert_resumes(
            lambda: IterableWrapper(range(20)).random_split({"t": 14, "v": 6}, seed=3, target="t"),
            n,
        )
