"""Tests of drop, slice, flatten, rows2columnar and lines_to_paragraphs (pipekit.pipes._columns)."""

from __future__ import annotations

import pickle
from collections import defaultdict
from pathlib import Path

import pytest

from pipekit.pipes import IterableWrapper
from pipekit.pipes._columns import Dropper, Flattener, ParagraphAggregator, Rows2Columnar, Slicer
from pipekit.pipes._resume import not_snapshot_capable
from pipekit.pipes.base import owner_of
from pipekit.testing import assert_resumes, resume_after


def space_join(lines):
    return " ".join(lines)


@pytest.fixture
def zipped():
    return IterableWrapper(range(5)).zip(IterableWrapper(range(10, 15)))


@pytest.fixture
def triples():
    return IterableWrapper([(0, 10, 100), (1, 11, 111), (2, 12, 122), (3, 13, 133), (4, 14, 144)])


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("drop", Dropper),
        ("slice", Slicer),
        ("flatten", Flattener),
        ("rows2columnar", Rows2Columnar),
        ("lines_to_paragraphs", ParagraphAggregator),
    ],
)
def test_functional_names(name, cls):
    assert owner_of(name) == f"pipekit.pipes._columns.{cls.__name__}"


class TestDropper:
    def test_torchdata_example(self, zipped) -> None:
        assert list(zipped) == [(0, 10), (1, 11), (2, 12), (3, 13), (4, 14)]
        assert list(zipped.drop(1)) == [(0,), (1,), (2,), (3,), (4,)]

    def test_several_and_negative_indices_keep_type(self) -> None:
        dp = IterableWrapper([(0, 1, 2, 3), [4, 5, 6, 7]])
        assert list(dp.drop([0, -1])) == [(1, 2), [5, 6]]
        assert list(dp.drop([1, -3])) == [(0, 2, 3), [4, 6, 7]]  # the same column twice

    def test_dict_keys(self) -> None:
        dp = IterableWrapper([{"a": 1, "b": 2, "c": 3}, {"c": 0, "a": 1, "b": 2}])
        assert list(dp.drop(["a", "c"])) == [{"b": 2}, {"b": 2}]
        assert list(IterableWrapper([{("x", 1): 1, "y": 2}]).drop(("x", 1))) == [{"y": 2}]  # a tuple is one key

    def test_missing_index_raises(self) -> None:
        with pytest.raises(IndexError, match=r"drop: index 2 is out of range for a tuple of length 2"):
            list(IterableWrapper([(0, 1)]).drop(2))
        with pytest.raises(KeyError, match=r"drop: key 'z' is not in the item"):
            list(IterableWrapper([{"a": 1}]).drop("z"))
        with pytest.raises(TypeError, match=r"drop: tuple items are indexed by int, got 'a'"):
            list(IterableWrapper([(0, 1)]).drop("a"))

    def test_non_container_item_raises(self) -> None:
        with pytest.raises(TypeError, match=r"drop: items must be tuples, lists or dicts, got int: 3"):
            list(IterableWrapper([3]).drop(0))

    def test_bad_arguments(self) -> None:
        with pytest.raises(TypeError, match="hashable"):
            IterableWrapper([]).drop([[0]])
        with pytest.raises(ValueError, match="empty list"):
            IterableWrapper([]).drop([])

    def test_len_pickle_stateless(self, zipped) -> None:
        dp = zipped.drop(0)
        assert len(dp) == 5
        assert list(pickle.loads(pickle.dumps(dp))) == [(10,), (11,), (12,), (13,), (14,)]
        assert Dropper.stateless is True
        head, rest = resume_after(lambda: IterableWrapper([(i, -i) for i in range(6)]).drop(1), 3)
        assert head + rest == [(i,) for i in range(6)]


class TestSlicer:
    def test_torchdata_example(self, triples) -> None:
        assert list(triples.slice(0, 2)) == [(0, 10), (1, 11), (2, 12), (3, 13), (4, 14)]

    def test_start_stop_step_like_python(self) -> None:
        dp = IterableWrapper([(0, 1, 2, 3, 4), [5, 6, 7, 8, 9]])
        assert list(dp.slice(1)) == [(1, 2, 3, 4), [6, 7, 8, 9]]
        assert list(dp.slice(None, None, 2)) == [(0, 2, 4), [5, 7, 9]]
        assert list(dp.slice(-2)) == [(3, 4), [8, 9]]
        assert list(dp.slice(3, 100)) == [(3, 4), [8, 9]]  # slice bounds are lenient, as in Python

    def test_list_of_indices_in_item_order(self, triples) -> None:
        assert list(triples.slice([2, 0]))[:2] == [(0, 100), (1, 111)]
        assert list(IterableWrapper([[1, 2, 3]]).slice([-1])) == [[3]]

    def test_dicts(self) -> None:
        dp = IterableWrapper([{"a": 1, "b": 2, "c": 3}])
        assert list(dp.slice("b")) == [{"b": 2}]
        assert list(dp.slice(["c", "a"])) == [{"a": 1, "c": 3}]

    def test_errors(self) -> None:
        with pytest.raises(IndexError, match=r"slice: index 5 is out of range"):
            list(IterableWrapper([(0, 1)]).slice([0, 5]))
        with pytest.raises(KeyError, match=r"slice: key 'z' is not in the item"):
            list(IterableWrapper([{"a": 1}]).slice("z"))
        with pytest.raises(KeyError, match=r"slice: key 'z'"):
            list(IterableWrapper([{"a": 1}]).slice(["a", "z"]))
        with pytest.raises(ValueError, match="stop and step do not apply"):
            list(IterableWrapper([{"a": 1}]).slice("a", 2))
        with pytest.raises(TypeError, match="sliced by an int start, got 'a'"):
            list(IterableWrapper([(0, 1)]).slice("a"))
        with pytest.raises(TypeError, match="items must be tuples, lists or dicts"):
            list(IterableWrapper(["text"]).slice(0, 2))

    def test_bad_arguments(self) -> None:
        src = IterableWrapper([])
        with pytest.raises(ValueError, match="cannot be combined with stop or step"):
            src.slice([0, 1], 2)
        with pytest.raises(ValueError, match="step cannot be zero"):
            src.slice(0, 2, 0)
        with pytest.raises(TypeError, match="stop must be an int"):
            src.slice(0, "2")
        with pytest.raises(TypeError, match="index must be"):
            src.slice({"a"})

    def test_len_pickle_stateless(self, triples) -> None:
        dp = triples.slice(1)
        assert len(dp) == 5
        assert next(iter(pickle.loads(pickle.dumps(dp)))) == (10, 100)
        assert Slicer.stateless is True


class TestFlattener:
    def test_torchdata_examples(self) -> None:
        dp = IterableWrapper(
            [
                (0, 10, (100, 1000)),
                (1, 11, (111, 1001)),
                (2, 12, (122, 1002)),
                (3, 13, (133, 1003)),
                (4, 14, (144, 1004)),
            ]
        )
        assert list(dp.flatten(2)) == [
            (0, 10, 100, 1000),
            (1, 11, 111, 1001),
            (2, 12, 122, 1002),
            (3, 13, 133, 1003),
            (4, 14, 144, 1004),
        ]
        dp = IterableWrapper([(0, (1, 2)), (3, (4, 5)), (6, (7, 8))])
        assert list(dp.flatten()) == [(0, 1, 2), (3, 4, 5), (6, 7, 8)]

    def test_one_level_only_and_list_type_kept(self) -> None:
        dp = IterableWrapper([[0, [1, [2, 3]], (4,)]])
        assert list(dp.flatten()) == [[0, 1, [2, 3], 4]]

    def test_index_zero_flattens_only_column_zero(self) -> None:
        dp = IterableWrapper([((1, 2), (3, 4))])
        assert list(dp.flatten(0)) == [(1, 2, (3, 4))]  # torchdata flattened every column here
        assert list(dp.flatten(-1)) == [((1, 2), 3, 4)]
        assert list(dp.flatten([0, 1])) == [(1, 2, 3, 4)]

    def test_non_nested_column_stays(self) -> None:
        assert list(IterableWrapper([(1, "ab")]).flatten(1)) == [(1, "ab")]

    def test_dicts(self) -> None:
        dp = IterableWrapper([{"a": 1, "b": {"c": 2, "d": 3}, "e": {"f": 4}}])
        assert list(dp.flatten("b")) == [{"a": 1, "c": 2, "d": 3, "e": {"f": 4}}]
        assert list(dp.flatten()) == [{"a": 1, "c": 2, "d": 3, "f": 4}]
        assert list(IterableWrapper([{"a": {"a": 1}}]).flatten()) == [{"a": 1}]

    def test_dict_key_collision_raises(self) -> None:
        with pytest.raises(ValueError, match=r"flatten: key 'a' would appear twice"):
            list(IterableWrapper([{"a": 1, "b": {"a": 2}}]).flatten())

    def test_missing_index_raises(self) -> None:
        with pytest.raises(IndexError, match="flatten: index 3 is out of range"):
            list(IterableWrapper([(1, 2)]).flatten(3))
        with pytest.raises(KeyError, match="flatten: key 'x'"):
            list(IterableWrapper([{"a": {}}]).flatten("x"))
        with pytest.raises(TypeError, match="flatten: items must be"):
            list(IterableWrapper(["abc"]).flatten())

    def test_bad_arguments(self) -> None:
        with pytest.raises(ValueError, match=r"indices=\[\] flattens nothing"):
            IterableWrapper([]).flatten([])

    def test_len_pickle_stateless(self) -> None:
        dp = IterableWrapper([(0, (1, 2))]).flatten()
        assert len(dp) == 1
        assert list(pickle.loads(pickle.dumps(dp))) == [(0, 1, 2)]
        assert Flattener.stateless is True


class TestRows2Columnar:
    def test_torchdata_dict_example(self) -> None:
        dp = IterableWrapper([[{"a": 1}, {"b": 2, "a": 1}], [{"a": 1, "b": 200}, {"b": 2, "c": 3, "a": 100}]])
        got = list(dp.rows2columnar())
        assert got == [{"a": [1, 1], "b": [2]}, {"a": [1, 100], "b": [200, 2], "c": [3]}]
        assert all(type(d) is defaultdict for d in got)
        assert list(dp.rows2columnar(column_names=["a"])) == [{"a": [1, 1]}, {"a": [1, 100]}]

    def test_torchdata_list_example(self) -> None:
        dp = IterableWrapper([[[0, 1, 2, 3], [4, 5, 6, 7]]])
        names = ["1st_in_batch", "2nd_in_batch", "3rd_in_batch", "4th_in_batch"]
        assert list(dp.rows2columnar(column_names=names)) == [
            {"1st_in_batch": [0, 4], "2nd_in_batch": [1, 5], "3rd_in_batch": [2, 6], "4th_in_batch": [3, 7]}
        ]

    def test_torchdata_tests(self) -> None:
        expected = [{"a": [0, 0], "b": [1, 10], "c": [2, 20]}, {"a": [100, 1000], "b": [101, 1010], "c": [102, 1020]}]
        dicts = IterableWrapper(
            [
                [{c: i for i, c in enumerate("abc")}, {c: i * 10 for i, c in enumerate("abc")}],
                [{c: i + 100 for i, c in enumerate("abc")}, {c: (i + 100) * 10 for i, c in enumerate("abc")}],
            ]
        )
        assert list(dicts.rows2columnar({"a", "b", "c"})) == expected  # a set filters dict rows
        lists = IterableWrapper(
            [
                [[0, 1, 2], [0, 10, 20]],
                [[100, 101, 102], [1000, 1010, 1020]],
            ]
        )
        dp = Rows2Columnar(lists, ["a", "b", "c"])
        assert list(dp) == expected
        assert len(dp) == 2

    def test_batches_from_batch(self) -> None:
        rows = IterableWrapper([{"x": i, "y": -i} for i in range(5)]).batch(2).rows2columnar(["x"])
        assert list(rows) == [{"x": [0, 1]}, {"x": [2, 3]}, {"x": [4]}]

    def test_errors(self) -> None:
        with pytest.raises(KeyError, match=r"row 1 of the batch has no column 'a'"):
            list(IterableWrapper([[{"a": 1}, {"b": 2}]]).rows2columnar(["a"]))
        with pytest.raises(ValueError, match="list rows need column_names"):
            list(IterableWrapper([[[1, 2]]]).rows2columnar())
        with pytest.raises(ValueError, match="row 0 has 3 values but there are only 2 column_names"):
            list(IterableWrapper([[[1, 2, 3]]]).rows2columnar(["a", "b"]))
        with pytest.raises(TypeError, match="must be ordered"):
            list(IterableWrapper([[[1, 2]]]).rows2columnar({"a", "b"}))
        with pytest.raises(TypeError, match="rows must be dicts or lists, row 0 is int"):
            list(IterableWrapper([[1]]).rows2columnar(["a"]))
        with pytest.raises(TypeError, match="each item must be a batch"):
            list(IterableWrapper([{"a": 1}]).rows2columnar())

    def test_bad_arguments(self) -> None:
        with pytest.raises(TypeError, match="column_names must be a list"):
            IterableWrapper([]).rows2columnar("abc")

    def test_pickle_stateless(self) -> None:
        dp = IterableWrapper([[{"a": 1}]]).rows2columnar()
        assert list(pickle.loads(pickle.dumps(dp))) == [{"a": [1]}]
        assert Rows2Columnar.stateless is True


LINES = [("file1", "Line1"), ("file1", "Line2"), ("file2", "Line2,1"), ("file2", "Line2,2"), ("file2", "Line2,3")]


class TestParagraphAggregator:
    def test_torchdata_tests(self) -> None:
        source_dp = IterableWrapper(LINES)
        assert list(source_dp.lines_to_paragraphs()) == [
            ("file1", "Line1\nLine2"),
            ("file2", "Line2,1\nLine2,2\nLine2,3"),
        ]
        para = source_dp.lines_to_paragraphs(joiner=space_join)
        assert list(para) == [("file1", "Line1 Line2"), ("file2", "Line2,1 Line2,2 Line2,3")]
        with pytest.raises(TypeError, match="has no len"):
            len(ParagraphAggregator(source_dp))

    def test_reset_mid_epoch_starts_over(self) -> None:
        dp = ParagraphAggregator(IterableWrapper(LINES))
        it = iter(dp)
        assert next(it) == ("file1", "Line1\nLine2")
        assert list(dp) == [("file1", "Line1\nLine2"), ("file2", "Line2,1\nLine2,2\nLine2,3")]

    def test_empty_lines_split_paragraphs(self) -> None:
        items = [("f", ""), ("f", "a"), ("f", "b"), ("f", ""), ("f", ""), ("f", "c"), ("g", ""), ("g", "d")]
        assert list(IterableWrapper(items).lines_to_paragraphs()) == [("f", "a\nb"), ("f", "c"), ("g", "d")]

    def test_bytes_lines_from_files(self, tmp_path: Path) -> None:
        (tmp_path / "a.txt").write_bytes(b"one\ntwo\n\nthree\n")
        (tmp_path / "b.txt").write_bytes(b"four\n")
        urls = [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]
        dp = IterableWrapper(urls).open_files_by_fsspec(mode="rb").readlines().lines_to_paragraphs()
        assert list(dp) == [(urls[0], b"one\ntwo"), (urls[0], b"three"), (urls[1], b"four")]

    def test_file_names_may_be_none(self) -> None:
        items = [(None, "a"), (None, "b"), ("x", "c")]
        assert list(IterableWrapper(items).lines_to_paragraphs()) == [(None, "a\nb"), ("x", "c")]

    def test_bad_items_and_arguments(self) -> None:
        with pytest.raises(TypeError, match=r"expected \(file_name, line\) tuples"):
            list(IterableWrapper(["line"]).lines_to_paragraphs())
        with pytest.raises(TypeError, match="joiner must be callable"):
            IterableWrapper([]).lines_to_paragraphs(joiner="\n")

    def test_pickle_before_and_during_iteration(self) -> None:
        dp = IterableWrapper(LINES).lines_to_paragraphs(joiner=space_join)
        assert list(pickle.loads(pickle.dumps(dp))) == [("file1", "Line1 Line2"), ("file2", "Line2,1 Line2,2 Line2,3")]
        it = iter(dp)
        next(it)
        clone = pickle.loads(pickle.dumps(dp))
        assert list(clone) == [("file1", "Line1 Line2"), ("file2", "Line2,1 Line2,2 Line2,3")]

    @pytest.mark.parametrize("n", [0, 1, 2, 3, 4])
    def test_resumes(self, n: int) -> None:
        items = [
            ("a", "1"), ("a", "2"), ("a", ""), ("a", "3"),
            ("b", "4"), ("b", ""), ("b", ""), ("b", "5"), ("b", "6"),
            ("c", "7"),
        ]  # fmt: skip

        def make():
            return IterableWrapper(items).lines_to_paragraphs()

        assert list(make()) == [("a", "1\n2"), ("a", "3"), ("b", "4"), ("b", "5\n6"), ("c", "7")]
        assert_resumes(make, n)

    def test_snapshot_holds_the_partial_paragraph(self) -> None:
        dp = IterableWrapper([("a", "x"), ("b", "y1"), ("b", "y2"), ("b", "y3")]).lines_to_paragraphs()
        it = iter(dp)
        assert next(it) == ("a", "x")  # yielded when ("b", "y1") arrived: "y1" is buffered
        assert dp.state_dict() == {"buffer": ["y1"], "file": "b", "started": True}
        assert not_snapshot_capable(dp) == []

    def test_resume_from_readlines_mid_file(self, tmp_path: Path) -> None:
        (tmp_path / "a.txt").write_text("p1\np1b\n\np2\n\n\np3\np3b\np3c\n")
        (tmp_path / "b.txt").write_text("q1\n\nq2\n")
        urls = [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]

        def make():
            return IterableWrapper(urls).open_files_by_fsspec().readlines().lines_to_paragraphs()

        assert len(list(make())) == 5
        for n in range(6):
            assert_resumes(make, n)

    def test_state_of_fresh_restored_pipe(self) -> None:
        dp = ParagraphAggregator(IterableWrapper([("f", "y"), ("g", "z")]))
        state = {"buffer": ["x"], "file": "f", "started": True}
        dp.load_state_dict(state)
        assert dp.state_dict() == state  # a snapshot before the restored pipe starts keeps the position
        assert list(dp) == [("f", "x\ny"), ("g", "z")]
        assert list(dp) == [("f", "y"), ("g", "z")]  # the next epoch starts over
