"""Tests of in_memory_cache and unzip on map-style pipes (pipekit.pipes._mapstyle)."""

from __future__ import annotations

import pickle

import pytest

from pipekit.errors import ConfigurationError
from pipekit.pipes import (
    IterableWrapper,
    MapDataPipe,
    MapInMemoryCacheHolder,
    MapUnZipper,
    SequenceWrapper,
)
from pipekit.pipes._resume import not_snapshot_capable
from pipekit.pipes.base import owner_of
from pipekit.testing import assert_resumes


class CountingMap(MapDataPipe):
    """A map-style pipe that counts the lookups of each index."""

    def __init__(self, items: list) -> None:
        self.items = items
        self.calls: dict = {}

    def __getitem__(self, index):
        self.calls[index] = self.calls.get(index, 0) + 1
        return self.items[index]

    def __len__(self) -> int:
        return len(self.items)


# ----------------------------------------------------------------- unzip


class TestMapUnZipper:
    def test_functional_name_on_map_pipes(self):
        assert owner_of("unzip", "map") == "pipekit.pipes._mapstyle.MapUnZipper"
        assert owner_of("unzip", "iter") == "pipekit.pipes._splitting.UnZipper"

    def test_torchdata_example(self):
        source_dp = SequenceWrapper([(i, i + 10, i + 20) for i in range(3)])
        dp1, dp2, dp3 = source_dp.unzip(sequence_length=3)
        assert (list(dp1), list(dp2), list(dp3)) == ([0, 1, 2], [10, 11, 12], [20, 21, 22])

    def test_children_are_map_style_and_look_up_by_key(self):
        source = SequenceWrapper({"a": ("x", 1), "b": ("y", 2)})
        names, numbers = MapUnZipper(source, 2)
        assert isinstance(numbers, MapDataPipe)
        assert (names["b"], numbers["a"], len(numbers)) == ("y", 1, 2)
        with pytest.raises(KeyError):
            numbers["z"]

    def test_columns_to_skip_and_lookups_read_the_source_each_time(self):
        calls = []

        def load(i):
            calls.append(i)
            return (i, -i, str(i))

        first_col, last_col = SequenceWrapper(range(3)).map(load).unzip(3, columns_to_skip=[1])
        assert (first_col[2], last_col[2]) == (2, "2")
        assert calls == [2, 2]

    @pytest.mark.parametrize(
        ("kwargs", "error"),
        [
            ({"sequence_length": 0}, ValueError),  # torchdata: ValueError
            ({"sequence_length": 2, "columns_to_skip": [0, 1]}, RuntimeError),  # torchdata: RuntimeError
        ],
    )
    def test_no_children_raises_torchdatas_type(self, kwargs, error):
        with pytest.raises(error) as info:
            SequenceWrapper([(1, 2)]).unzip(**kwargs)
        assert isinstance(info.value, ConfigurationError)

    def test_invalid_source_and_item(self):
        with pytest.raises(TypeError, match="MapDataPipe"):
            MapUnZipper(IterableWrapper([(1, 2)]), 2)
        (dp,) = SequenceWrapper([(1, 2, 3)]).unzip(3, columns_to_skip=[1, 2])
        assert dp[0] == 1
        (dp,) = SequenceWrapper([(1, 2)]).unzip(3, columns_to_skip=[1, 2])
        with pytest.raises(ValueError, match="item 0 has length 2"):
            dp[0]

    def test_pickle_and_convert_to_iter(self):
        dps = SequenceWrapper([(1, "a"), (2, "b")]).unzip(2)
        dp1, dp2 = pickle.loads(pickle.dumps(dps))
        assert list(dp1.to_iter_datapipe().zip(dp2.to_iter_datapipe())) == [(1, "a"), (2, "b")]
        assert not_snapshot_capable(dp1.to_iter_datapipe()) == []


# ----------------------------------------------------------------- in_memory_cache


class TestMapInMemoryCacheHolder:
    def test_functional_name_on_map_pipes(self):
        assert owner_of("in_memory_cache", "map") == "pipekit.pipes._mapstyle.MapInMemoryCacheHolder"
        assert owner_of("in_memory_cache", "iter") == "pipekit.pipes._memory_cache.InMemoryCacheHolder"
        assert isinstance(SequenceWrapper([1]).in_memory_cache(), MapDataPipe)

    def test_torchdata_example(self):
        cache_dp = SequenceWrapper(range(10)).in_memory_cache()
        assert list(cache_dp) == list(range(10))
        assert len(cache_dp) == 10

    def test_each_index_is_read_once_and_kept(self):
        source = CountingMap([[i] for i in range(4)])
        dp = MapInMemoryCacheHolder(source)
        first = dp[2]
        assert dp[2] is first
        list(dp)
        list(dp)
        assert {i: source.calls[i] for i in range(4)} == {0: 1, 1: 1, 2: 1, 3: 1}  # list() also tries index 4
        assert sorted(dp.cache) == [0, 1, 2, 3]

    def test_keys_and_missing_keys(self):
        dp = SequenceWrapper({"a": 1, "b": 2}).in_memory_cache()
        assert (dp["b"], dp["a"]) == (2, 1)
        with pytest.raises(KeyError):
            dp["z"]
        assert "z" not in dp.cache

    def test_pickled_copy_starts_empty(self):
        source = CountingMap(list(range(3)))
        dp = source.in_memory_cache()
        list(dp)
        copy = pickle.loads(pickle.dumps(dp))
        assert copy.cache == {}
        assert list(copy) == [0, 1, 2]

    def test_invalid_source_and_resume(self):
        with pytest.raises(TypeError, match="MapDataPipe"):
            MapInMemoryCacheHolder(IterableWrapper([1]))
        pipe = SequenceWrapper(list(range(5))).in_memory_cache().to_iter_datapipe()
        assert not_snapshot_capable(pipe) == []
        for n in (0, 2, 5):
            assert_resumes(lambda: SequenceWrapper(list(range(5))).in_memory_cache().to_iter_datapipe(), n)
