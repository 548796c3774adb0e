"""header, set_length, cycle, repeat, enumerate and add_index (pipekit.pipes._flow)."""

from __future__ import annotations

import logging
import pickle
import warnings

import pytest
import torch

import pipekit
from pipekit.errors import UnsupportedItemError
from pipekit.pipes import Cycler, Enumerator, Header, IndexAdder, IterableWrapper, LengthSetter, Repeater
from pipekit.pipes._resume import not_snapshot_capable
from pipekit.pipes.base import owner_of, registered_names
from pipekit.testing import assert_resumes, resume_after

# list() asks for len(); a header over an unsized source warns (once) that its length is a guess.
pytestmark = pytest.mark.filterwarnings("ignore:Header. the source has no length")


def is_small(x):
    return x < 5


def explode(x):
    return list(range(x))


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
def rows():
    return [{"a": 1, "b": 2}, {"c": 3, "a": 1}, {"d": 4}]


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("header", Header),
        ("set_length", LengthSetter),
        ("cycle", Cycler),
        ("repeat", Repeater),
        ("enumerate", Enumerator),
        ("add_index", IndexAdder),
    ],
)
def test_functional_names_are_pipekits(name, cls):
    assert owner_of(name) == f"pipekit.pipes._flow.{cls.__name__}"
    assert name in registered_names()


class TestHeader:
    def test_torchdata_example(self):
        assert list(IterableWrapper(range(10)).header(3)) == [0, 1, 2]

    def test_default_limit_is_ten(self):
        assert list(IterableWrapper(range(20)).header()) == list(range(10))

    def test_limit_zero_reads_nothing(self):
        source = CountingSource(5)
        assert list(IterableWrapper(source, deepcopy=False).header(0)) == []
        assert source.pulled == 0

    def test_does_not_read_past_the_limit(self):
        source = CountingSource(100)
        assert list(IterableWrapper(source, deepcopy=False).header(4)) == [0, 1, 2, 3]
        assert source.pulled == 4

    def test_limit_none_and_larger_than_source(self):
        assert list(IterableWrapper(range(3)).header(None)) == [0, 1, 2]
        assert list(IterableWrapper(range(3)).header(10)) == [0, 1, 2]
        assert list(IterableWrapper([]).header(3)) == []

    def test_invalid_limit(self):
        with pytest.raises(ValueError, match="limit"):
            Header(IterableWrapper([1]), -1)
        with pytest.raises(TypeError, match="limit"):
            Header(IterableWrapper([1]), 2.5)

    def test_length(self):
        assert len(IterableWrapper(range(10)).header(3)) == 3
        assert len(IterableWrapper(range(2)).header(3)) == 2
        assert len(IterableWrapper(range(4)).header(None)) == 4
        unsized = IterableWrapper(range(10)).filter(is_small)
        with pytest.warns(UserWarning, match="taken to be the limit"):
            assert len(unsized.header(3)) == 3
        with pytest.raises(TypeError):
            len(unsized.header(None))

    def test_every_epoch_starts_over(self):
        pipe = IterableWrapper(range(10)).header(3)
        assert list(pipe) == [0, 1, 2]
        assert list(pipe) == [0, 1, 2]

    def test_pickle(self):
        pipe = IterableWrapper(range(10)).header(3)
        assert list(pickle.loads(pickle.dumps(pipe))) == [0, 1, 2]

    @pytest.mark.parametrize("n", [0, 1, 3, 4])
    def test_resumes(self, n):
        assert_resumes(lambda: IterableWrapper(range(10)).header(4), n)

    def test_resume_then_new_epoch(self):
        head, rest = resume_after(lambda: IterableWrapper(range(10)).header(4), 2)
        assert (head, rest) == ([0, 1], [2, 3])
        pipe = IterableWrapper(range(10)).header(4)
        pipe.load_state_dict({"count": 3})
        assert pipe.state_dict() == {"count": 3}  # pending until the next iterator starts
        assert list(pipe) == [0]  # the count continues (the source, not restored here, starts over)
        assert list(pipe) == [0, 1, 2, 3]  # the next epoch starts normally


class TestLengthSetter:
    def test_torchdata_example(self):
        dp = IterableWrapper(range(10)).filter(is_small).set_length(3)
        assert list(dp) == [0, 1, 2, 3, 4]
        assert len(dp) == 3

    def test_zero_length(self):
        assert len(IterableWrapper([]).set_length(0)) == 0

    def test_invalid_length(self):
        with pytest.raises(ValueError, match="length"):
            LengthSetter(IterableWrapper([1]), -1)
        with pytest.raises(TypeError, match="length"):
            LengthSetter(IterableWrapper([1]), "3")

    def test_stateless_and_pickle(self):
        pipe = IterableWrapper(range(3)).set_length(3)
        assert LengthSetter.stateless is True
        assert not_snapshot_capable(pipe) == []
        assert list(pickle.loads(pickle.dumps(pipe))) == [0, 1, 2]
        assert_resumes(lambda: IterableWrapper(range(5)).set_length(5), 2)


class TestCycler:
    def test_torchdata_example(self):
        assert list(IterableWrapper(range(3)).cycle(2)) == [0, 1, 2, 0, 1, 2]

    def test_forever(self):
        assert list(IterableWrapper(range(3)).cycle().header(8)) == [0, 1, 2, 0, 1, 2, 0, 1]

    def test_count_zero_and_one(self):
        assert list(IterableWrapper(range(3)).cycle(0)) == []
        assert list(IterableWrapper(range(3)).cycle(1)) == [0, 1, 2]

    def test_empty_source_ends_even_when_endless(self):
        assert list(IterableWrapper([]).cycle()) == []
        assert list(IterableWrapper([]).cycle(5)) == []

    def test_invalid_count(self):
        with pytest.raises(ValueError, match="count"):
            Cycler(IterableWrapper([1]), -1)
        with pytest.raises(TypeError, match="count"):
            Cycler(IterableWrapper([1]), 1.0)

    def test_length(self):
        assert len(IterableWrapper(range(3)).cycle(4)) == 12
        with pytest.raises(TypeError, match="forever"):
            len(IterableWrapper(range(3)).cycle())

    def test_pickle(self):
        pipe = IterableWrapper(range(3)).cycle(2)
        assert list(pickle.loads(pickle.dumps(pipe))) == [0, 1, 2, 0, 1, 2]

    @pytest.mark.parametrize("n", [0, 2, 3, 4, 8, 9])
    def test_resumes(self, n):
        assert_resumes(lambda: IterableWrapper(range(3)).cycle(3), n)

    @pytest.mark.parametrize("n", [0, 5, 7])
    def test_resumes_endless(self, n):
        assert_resumes(lambda: IterableWrapper(range(3)).cycle().header(10), n)

    def test_state_counts_passes(self):
        pipe = IterableWrapper(range(3)).cycle(3)
        it = iter(pipe)
        for _ in range(4):
            next(it)
        assert pipe.state_dict() == {"passes": 1}


class TestRepeater:
    def test_torchdata_example(self):
        assert list(IterableWrapper(range(3)).repeat(2)) == [0, 0, 1, 1, 2, 2]

    def test_same_object_repeated(self):
        item = {"x": 1}
        out = list(IterableWrapper([item], deepcopy=False).repeat(3))
        assert all(o is item for o in out)

    @pytest.mark.parametrize("bad", [1, 0, -3])
    def test_times_must_exceed_one(self, bad):
        with pytest.raises(ValueError, match="times"):
            Repeater(IterableWrapper([1]), bad)

    def test_empty_and_length(self):
        assert list(IterableWrapper([]).repeat(3)) == []
        assert len(IterableWrapper(range(4)).repeat(3)) == 12

    def test_pickle(self):
        pipe = IterableWrapper(range(2)).repeat(2)
        assert list(pickle.loads(pickle.dumps(pipe))) == [0, 0, 1, 1]

    @pytest.mark.parametrize("n", [0, 1, 2, 4, 5, 9])
    def test_resumes(self, n):
        assert_resumes(lambda: IterableWrapper(range(3)).repeat(3), n)

    def test_state_holds_element(self):
        pipe = IterableWrapper(["a", "b"]).repeat(3)
        it = iter(pipe)
        next(it)
        assert pipe.state_dict() == {"active": True, "item": "a", "done": 1}


class TestEnumerator:
    def test_torchdata_example(self):
        assert list(IterableWrapper(["a", "b", "c"]).enumerate()) == [(0, "a"), (1, "b"), (2, "c")]

    def test_starting_index(self):
        assert list(IterableWrapper(["a", "b"]).enumerate(starting_index=-1)) == [(-1, "a"), (0, "b")]
        with pytest.raises(TypeError, match="starting_index"):
            Enumerator(IterableWrapper([1]), "0")

    def test_empty_and_length(self):
        assert list(IterableWrapper([]).enumerate()) == []
        assert len(IterableWrapper(range(4)).enumerate()) == 4

    def test_every_epoch_restarts(self):
        pipe = IterableWrapper("ab").enumerate(5)
        assert list(pipe) == list(pipe) == [(5, "a"), (6, "b")]

    def test_pickle(self):
        pipe = IterableWrapper("ab").enumerate()
        assert list(pickle.loads(pickle.dumps(pipe))) == [(0, "a"), (1, "b")]

    @pytest.mark.parametrize("n", [0, 1, 3, 5])
    def test_resumes(self, n):
        assert_resumes(lambda: IterableWrapper("abcde").enumerate(10), n)

    def test_resumes_after_filter(self):
        # the counter is the enumerator's own: a restored copy must not recount from the source position
        assert_resumes(lambda: IterableWrapper(range(10)).filter(is_small).enumerate(), 2)


class TestIndexAdder:
    def test_torchdata_example(self, rows):
        out = list(IterableWrapper(rows[:2]).add_index("order"))
        assert out == [{"a": 1, "b": 2, "order": 0}, {"c": 3, "a": 1, "order": 1}]

    def test_default_name_and_input_untouched(self, rows):
        out = list(IterableWrapper(rows, deepcopy=False).add_index())
        assert [r["index"] for r in out] == [0, 1, 2]
        assert all("index" not in r for r in rows)

    def test_non_dict_raises(self):
        with pytest.raises(TypeError, match=r"add_index: items must be dicts, got list at index 1"):
            list(IterableWrapper([{"a": 1}, [1, 2]]).add_index())

    def test_non_dict_raises_not_implemented_error_as_torchdata(self):
        with pytest.raises(NotImplementedError, match="items must be dicts") as info:
            list(IterableWrapper([(1, 2)]).add_index())
        assert isinstance(info.value, UnsupportedItemError)
        assert isinstance(info.value, TypeError)

    def test_unhashable_name(self):
        with pytest.raises(TypeError, match="hashable"):
            IndexAdder(IterableWrapper([]), ["x"])

    def test_length_and_pickle(self, rows):
        pipe = IterableWrapper(rows).add_index()
        assert len(pipe) == 3
        assert list(pickle.loads(pickle.dumps(pipe))) == list(pipe)

    @pytest.mark.parametrize("n", [0, 1, 3])
    def test_resumes(self, rows, n):
        assert_resumes(lambda: IterableWrapper(rows).add_index("i"), n)


class TestWithDataLoader:
    def test_pipeline_resumes_by_snapshot(self, caplog):
        def make():
            return IterableWrapper(range(6)).flatmap(explode).enumerate().cycle(2).header(25)

        caplog.set_level(logging.INFO, logger="pipekit")
        pipe = make()
        assert not_snapshot_capable(pipe) == []
        loader = pipekit.DataLoader(pipe)
        it = iter(loader)
        head = [next(it) for _ in range(9)]
        state = loader.state_dict()
        rest = list(it)
        resumed = pipekit.DataLoader(make())
        resumed.load_state_dict(state)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert list(resumed) == rest
        assert len(head) + len(rest) == 25
        assert "replay" not in caplog.text


def cycles_around_a_shuffle():
    return IterableWrapper(range(6)).cycle(2).shuffle(buffer_size=3).cycle(2)


@pytest.mark.timeout(60)
def test_a_checkpoint_between_two_passes_of_a_cycle_restarts_the_pipes_above_whole():
    """Checkpointed right after the outer cycle's first pass: the pipes above were restored at their end, and the
    second pass must start them afresh (the inner cycle's two passes), not continue their restored positions."""
    torch.manual_seed(0)
    full = [int(x) for x in pipekit.DataLoader(cycles_around_a_shuffle())]
    assert len(full) == 24
    torch.manual_seed(0)
    loader = pipekit.DataLoader(cycles_around_a_shuffle())
    it = iter(loader)
    head = [int(next(it)) for _ in range(12)]
    state, rng = loader.state_dict(), torch.get_rng_state()  # the next pass's shuffle draws its seed from torch
    torch.manual_seed(1)
    resumed = pipekit.DataLoader(cycles_around_a_shuffle())
    resumed.load_state_dict(state)
    torch.set_rng_state(rng)
    assert head + [int(x) for x in resumed] == full
