"""Tests of to_map_datapipe and to_iter_datapipe (pipekit.pipes._conversion)."""

from __future__ import annotations

import pickle

import pytest

from pipekit.pipes import (
    IterableWrapper,
    IterDataPipe,
    IterToMapConverter,
    MapToIterConverter,
    SequenceWrapper,
)
from pipekit.pipes._resume import not_snapshot_capable
from pipekit.pipes.base import owner_of
from pipekit.testing import assert_resumes

# list() asks for len(); a header over an unsized source warns (once) that its length is a guess.
pytestmark = pytest.mark.filterwarnings("ignore:Header. the source has no length")


def row_to_tuple(row):
    return row[0], row[1:]


class NoLengthYet(IterDataPipe):
    """A source whose len() raises NotImplementedError, as some torchdata-era pipes' did."""

    def __init__(self, items):
        self.items = items

    def __iter__(self):
        yield from self.items

    def __len__(self):
        raise NotImplementedError("no length")


@pytest.mark.parametrize(
    ("name", "kind", "cls"),
    [
        ("to_map_datapipe", "iter", "conversion.IterToMapConverter"),
        ("to_iter_datapipe", "map", "conversion.MapToIterConverter"),
    ],
)
def test_functional_names_are_pipekits(name, kind, cls):
    assert owner_of(name, kind) == f"pipekit.pipes._{cls}"


# ----------------------------------------------------------------- map <-> iter


class TestIterToMapConverter:
    def test_torchdata_examples(self):
        assert list(IterableWrapper([(i, i) for i in range(10)]).to_map_datapipe()) == list(range(10))
        assert IterableWrapper([("a", 1), ("b", 2), ("c", 1)]).to_map_datapipe()["a"] == 1
        src = IterableWrapper([("a", 1, 1, 1, 1, 1, 1), ("b", 2, 2, 2, 2, 2, 2), ("c", 3, 3, 3, 3, 3, 3)])
        assert src.to_map_datapipe(key_value_fn=row_to_tuple)["a"] == (1, 1, 1, 1, 1, 1)

    def test_duplicate_key_warns_and_later_wins(self):
        map_dp = IterableWrapper([("a", 1), ("a", 2)]).to_map_datapipe()
        with pytest.warns(UserWarning, match="duplicate key 'a'"):
            assert map_dp["a"] == 2

    def test_errors(self):
        with pytest.raises(ValueError, match="item 0 has 3 elements"):
            IterableWrapper([(1, 2, 3)]).to_map_datapipe()[1]
        with pytest.raises(TypeError, match="item 0 is not a"):
            IterableWrapper([5]).to_map_datapipe()[5]
        with pytest.raises(IndexError, match="no key 'z'"):
            IterableWrapper([("a", 1)]).to_map_datapipe()["z"]
        with pytest.raises(TypeError, match="IterDataPipe"):
            IterToMapConverter([("a", 1)])

    def test_length_and_pickle(self):
        map_dp = IterableWrapper([("a", 1), ("b", 2)]).filter(bool).to_map_datapipe()
        assert len(map_dp) == 2
        clone = pickle.loads(pickle.dumps(map_dp))
        assert clone["b"] == 2

    def test_length_when_the_source_raises_not_implemented_error(self):
        # torchdata caught TypeError and NotImplementedError from the source's len() and loaded the table.
        map_dp = NoLengthYet([("a", 1), ("b", 2), ("a", 3)]).to_map_datapipe()
        with pytest.warns(UserWarning, match="duplicate key"):
            assert len(map_dp) == 2
        assert map_dp["a"] == 3

    @pytest.mark.parametrize("n", [0, 1, 2])
    def test_resume_rebuilds_the_table(self, n):
        def make():
            table = IterableWrapper([("x", 10), ("y", 20)]).to_map_datapipe()
            return IterableWrapper(["y", "x", "y"]).zip_with_map(table, key_fn=str)

        pipe = make()
        it = iter(pipe)
        next(it)
        assert pipe.map_datapipe.state_dict() == {"loaded": True}
        assert_resumes(make, n)

    def test_round_trip_with_zip_with_map(self):
        table = IterableWrapper([("x", 10), ("y", 20)]).to_map_datapipe()
        pipe = IterableWrapper(["y", "x"]).zip_with_map(table, key_fn=str)
        assert list(pipe) == [("y", 20), ("x", 10)]
        assert not_snapshot_capable(pipe) == []


class TestMapToIterConverter:
    def test_torchdata_examples(self):
        assert list(SequenceWrapper(range(10)).to_iter_datapipe()) == list(range(10))
        source = SequenceWrapper({"a": 1, "b": 2, "c": 3})
        assert list(source.to_iter_datapipe(indices=["a", "b", "c"])) == [1, 2, 3]

    def test_indices_order_and_empty(self):
        assert list(SequenceWrapper("abc").to_iter_datapipe(indices=[2, 0])) == ["c", "a"]
        assert list(SequenceWrapper("abc").to_iter_datapipe(indices=[])) == []

    def test_invalid_source(self):
        with pytest.raises(TypeError, match="MapDataPipe"):
            MapToIterConverter(IterableWrapper([1]))

    def test_length_and_pickle(self):
        pipe = SequenceWrapper("abcd").to_iter_datapipe()
        assert len(pipe) == 4
        assert list(pickle.loads(pickle.dumps(pipe))) == list("abcd")

    @pytest.mark.parametrize("n", [0, 2, 4])
    def test_resumes(self, n):
        # (torch's SequenceWrapper has no resume state of its own; a converted table does)
        assert_resumes(lambda: IterableWrapper(list(enumerate("abcd"))).to_map_datapipe().to_iter_datapipe(), n)
