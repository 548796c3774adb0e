"""Tests of zip_longest, zip_with_iter and zip_with_map (pipekit.pipes._zipping)."""

from __future__ import annotations

import pickle
import warnings
from operator import itemgetter

import pytest

from pipekit.pipes import (
    IterableWrapper,
    IterKeyZipper,
    MapKeyZipper,
    SequenceWrapper,
    ZipperLongest,
)
from pipekit.pipes.base import owner_of
from pipekit.testing import assert_resumes

# list() asks for len(); a header over an unsized source warns (once) that its length is a guess.
pytestmark = pytest.mark.filterwarnings("ignore:Header. the source has no length")


def first(t):
    return t[0]


def merge_values(t1, t2):
    return t1[1] + t2[1]


def merge_iter_map(tuple_from_iter, value_from_map):
    return tuple_from_iter[0], tuple_from_iter[1] + value_from_map


def three_ranges():
    return IterableWrapper(range(3)), IterableWrapper(range(10, 15)), IterableWrapper(range(20, 25))


@pytest.mark.parametrize(
    ("name", "kind", "cls"),
    [
        ("zip_longest", "iter", "zipping.ZipperLongest"),
        ("zip_with_iter", "iter", "zipping.IterKeyZipper"),
        ("zip_with_map", "iter", "zipping.MapKeyZipper"),
    ],
)
def test_functional_names_are_pipekits(name, kind, cls):
    assert owner_of(name, kind) == f"pipekit.pipes._{cls}"


# ----------------------------------------------------------------- zip_longest


class TestZipperLongest:
    def test_torchdata_example(self):
        dp1, dp2, dp3 = three_ranges()
        expected = [(0, 10, 20), (1, 11, 21), (2, 12, 22), (None, 13, 23), (None, 14, 24)]
        assert list(dp1.zip_longest(dp2, dp3)) == expected
        assert list(dp1.zip_longest(dp2, dp3, fill_value=-1)) == [
            (0, 10, 20),
            (1, 11, 21),
            (2, 12, 22),
            (-1, 13, 23),
            (-1, 14, 24),
        ]

    def test_middle_source_shorter(self):
        dp = IterableWrapper("abc").zip_longest(IterableWrapper([1]), IterableWrapper("xy"), fill_value=0)
        assert list(dp) == [("a", 1, "x"), ("b", 0, "y"), ("c", 0, 0)]

    def test_empty(self):
        assert list(IterableWrapper([]).zip_longest(IterableWrapper([]))) == []
        assert list(IterableWrapper([]).zip_longest(IterableWrapper([1]))) == [(None, 1)]

    def test_invalid_inputs(self):
        with pytest.raises(TypeError, match="input 1 must be an IterDataPipe"):
            ZipperLongest(IterableWrapper([1]), [1, 2])
        with pytest.raises(ValueError, match="at least one"):
            ZipperLongest()

    def test_length_and_pickle(self):
        dp1, dp2, dp3 = three_ranges()
        pipe = dp1.zip_longest(dp2, dp3)
        assert len(pipe) == 5
        assert list(pickle.loads(pickle.dumps(pipe))) == list(pipe)

    @pytest.mark.parametrize("n", [0, 2, 3, 4, 5])
    def test_resumes(self, n):
        assert_resumes(lambda: ZipperLongest(*three_ranges(), fill_value="-"), n)

    def test_state_names_exhausted_sources(self):
        pipe = ZipperLongest(*three_ranges())
        it = iter(pipe)
        for _ in range(4):
            next(it)
        assert pipe.state_dict() == {"finished": [0]}


# ----------------------------------------------------------------- zip_with_iter


class TestIterKeyZipper:
    def test_torchdata_example(self):
        dp1 = IterableWrapper([("a", 100), ("b", 200), ("c", 300)])
        dp2 = IterableWrapper([("a", 1), ("b", 2), ("c", 3), ("d", 4)])
        res = dp1.zip_with_iter(
            dp2, key_fn=itemgetter(0), ref_key_fn=itemgetter(0), keep_key=True, merge_fn=merge_values
        )
        assert list(res) == [("a", 101), ("b", 202), ("c", 303)]

    def test_out_of_order_reference_and_default_merge(self):
        src = IterableWrapper([("c", 3), ("a", 1), ("b", 2)])
        ref = IterableWrapper([("a", "A"), ("b", "B"), ("c", "C")])
        out = list(src.zip_with_iter(ref, key_fn=first))
        assert out == [(("c", 3), ("c", "C")), (("a", 1), ("a", "A")), (("b", 2), ("b", "B"))]

    def test_missing_key_raises_buffer_error(self):
        src = IterableWrapper([("a", 1), ("z", 2)])
        ref = IterableWrapper([("a", 0), ("b", 0)])
        with pytest.raises(BufferError, match=r"no item with key 'z'"):
            list(src.zip_with_iter(ref, key_fn=first))

    def test_duplicate_reference_key(self):
        src = IterableWrapper([("c", 1)])
        ref = IterableWrapper([("a", 0), ("a", 1), ("c", 2)])
        with pytest.raises(ValueError, match="duplicate key 'a'"):
            list(src.zip_with_iter(ref, key_fn=first))

    def test_full_buffer_drops_oldest_with_warning(self):
        src = IterableWrapper([("c", 1), ("a", 2)])
        ref = IterableWrapper([("a", 0), ("b", 0), ("c", 0)])
        with pytest.warns(UserWarning, match="buffer is full"), pytest.raises(BufferError, match="dropped"):
            list(src.zip_with_iter(ref, key_fn=first, buffer_size=1))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert len(list(src.zip_with_iter(ref, key_fn=first, buffer_size=3))) == 2

    def test_buffer_holds_buffer_size_plus_one_as_torchdata(self):
        # torchdata drops the oldest reference item only when the buffer holds *more* than buffer_size
        # before the next is added: with buffer_size=2, "a" and "b" wait while "c" is found.
        src = IterableWrapper([("c", 1), ("a", 2), ("b", 3)])
        ref = IterableWrapper([("a", 10), ("b", 20), ("c", 30)])
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            out = list(src.zip_with_iter(ref, key_fn=first, buffer_size=2))
        assert out == [(("c", 1), ("c", 30)), (("a", 2), ("a", 10)), (("b", 3), ("b", 20))]
        with pytest.warns(UserWarning, match="buffer is full"), pytest.raises(BufferError, match=r"'a'.*dropped"):
            list(src.zip_with_iter(ref, key_fn=first, buffer_size=1))

    def test_invalid_arguments(self):
        src = IterableWrapper([1])
        with pytest.raises(TypeError, match="ref_datapipe"):
            IterKeyZipper(src, [1], key_fn=first)
        with pytest.raises(ValueError, match="buffer_size"):
            IterKeyZipper(src, src, key_fn=first, buffer_size=0)
        with pytest.raises(TypeError, match="key_fn"):
            IterKeyZipper(src, src, key_fn=None)

    def test_length_and_pickle(self):
        src = IterableWrapper([("b", 1), ("a", 2)])
        ref = IterableWrapper([("a", 0), ("b", 0)])
        pipe = src.zip_with_iter(ref, key_fn=first, keep_key=True)
        assert len(pipe) == 2
        expected = [("b", (("b", 1), ("b", 0))), ("a", (("a", 2), ("a", 0)))]
        assert list(pickle.loads(pickle.dumps(pipe))) == list(pipe) == expected

    @pytest.mark.parametrize("n", [0, 1, 3, 5, 8])
    def test_resumes_with_buffered_references(self, n):
        keys = list("abcdefgh")
        src_keys = [keys[i] for i in (3, 0, 7, 1, 2, 6, 4, 5)]

        def make():
            src = IterableWrapper([(k, i) for i, k in enumerate(src_keys)])
            ref = IterableWrapper([(k, k.upper()) for k in keys])
            return src.zip_with_iter(ref, key_fn=first)

        assert_resumes(make, n)
        if n == 1:
            pipe = make()
            it = iter(pipe)
            next(it)
            assert [k for k, _ in pipe.state_dict()["buffer"]] == ["a", "b", "c"]


# ----------------------------------------------------------------- zip_with_map


class TestMapKeyZipper:
    def test_torchdata_example(self):
        dp1 = IterableWrapper([("a", 1), ("b", 2), ("c", 3)])
        mapdp = SequenceWrapper({"a": 100, "b": 200, "c": 300, "d": 400})
        res = dp1.zip_with_map(map_datapipe=mapdp, key_fn=itemgetter(0), merge_fn=merge_iter_map)
        assert list(res) == [("a", 101), ("b", 202), ("c", 303)]

    def test_keep_key_and_default_merge(self):
        out = list(IterableWrapper([1, 0]).zip_with_map(SequenceWrapper(["x", "y"]), key_fn=int, keep_key=True))
        assert out == [(1, (1, "y")), (0, (0, "x"))]

    def test_missing_key(self):
        with pytest.raises(KeyError, match="'q'"):
            list(IterableWrapper([("q", 1)]).zip_with_map(SequenceWrapper({"a": 1}), key_fn=first))

    def test_invalid_map(self):
        with pytest.raises(TypeError, match="MapDataPipe"):
            MapKeyZipper(IterableWrapper([1]), {"a": 1}, key_fn=first)

    def test_stateless_length_pickle(self):
        pipe = IterableWrapper([("a", 1)]).zip_with_map(SequenceWrapper({"a": 5}), key_fn=first)
        assert MapKeyZipper.stateless is True
        assert len(pipe) == 1
        assert list(pickle.loads(pickle.dumps(pipe))) == [(("a", 1), 5)]

    @pytest.mark.parametrize("n", [0, 1, 3])
    def test_resumes(self, n):
        def make():
            table = IterableWrapper(list(enumerate("abc"))).to_map_datapipe()
            return IterableWrapper([0, 2, 1]).zip_with_map(table, key_fn=int)

        assert_resumes(make, n)
