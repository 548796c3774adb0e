"""Tests of readlines, parse_csv, parse_csv_as_dict and parse_json_files."""

from __future__ import annotations

import csv
import decimal
import gzip
import io
import json
import os
import pickle
from pathlib import Path

import pytest
from torch.utils.data.datapipes.iter import FileOpener

from pipekit.errors import CSVParseError, JSONParseError, ParseError, ReadError
from pipekit.pipes import CSVDictParser, CSVParser, IterableWrapper, JsonParser, LineReader
from pipekit.pipes._resume import prepare_for_resume, restore_pipeline, snapshot_pipeline
from pipekit.testing import assert_resumes, resume_after

TEXT_FILES = {
    "a.txt": b"alpha\nbeta\r\ngamma\n",
    "b.txt": b"one\ntwo\nthree\nfour\nfive",
    "c.txt": b"",
    "d.txt": b"last\n",
}

CSV_FILES = {
    "1.csv": b"key,item\na,1\nb,2\n",
    "empty.csv": b"",
    "empty2.csv": b"\n",
}

# Rows with quoted fields spanning several lines, so rows != lines.
MULTILINE_CSV = b'id,text\n1,"first\nsecond"\n2,plain\n3,"x\r\ny\nz"\n4,end\n'


def write(root: Path, files: dict[str, bytes]) -> list[str]:
    paths = []
    for name, data in files.items():
        path = root / name
        path.write_bytes(data)
        paths.append(str(path))
    return paths


def basename(item):
    return os.path.basename(item[0]), item[1]


class PlainFileOpener(FileOpener):
    """torch's FileOpener (no ``reopen``), declared stateless so pipelines using it can be checkpointed."""

    stateless = True


class Tracking(io.BytesIO):
    """An in-memory stream that remembers it was closed."""

    closed_streams: list[Tracking] = []

    def close(self) -> None:
        Tracking.closed_streams.append(self)
        super().close()


def checkpoint_after(pipe, n: int) -> dict:
    """Take ``n`` items and return the reader's own ``current`` state."""
    pipe = prepare_for_resume(pipe)
    it = iter(pipe)
    for _ in range(n):
        next(it)
    state = snapshot_pipeline(pipe)
    (current,) = [s["current"] for s in state["states"] if isinstance(s, dict) and "current" in s]
    return current


@pytest.fixture
def text_paths(tmp_path: Path) -> list[str]:
    return write(tmp_path, TEXT_FILES)


@pytest.fixture
def csv_paths(tmp_path: Path) -> list[str]:
    return write(tmp_path, CSV_FILES)


# ---------------------------------------------------------------------------


class TestLineReader:
    def test_torchdata_example(self) -> None:
        text1 = "Line1\nLine2"
        text2 = "Line2,1\r\nLine2,2\r\nLine2,3"
        source_dp = IterableWrapper([("file1", io.StringIO(text1)), ("file2", io.StringIO(text2))])
        assert list(source_dp.readlines()) == [
            ("file1", "Line1"),
            ("file1", "Line2"),
            ("file2", "Line2,1"),
            ("file2", "Line2,2"),
            ("file2", "Line2,3"),
        ]

    def test_binary_streams_give_bytes_unless_decode(self, text_paths: list[str]) -> None:
        dp = IterableWrapper(text_paths[:1]).open_files_by_fsspec(mode="rb")
        assert list(dp.readlines(return_path=False)) == [b"alpha", b"beta", b"gamma"]
        dp = IterableWrapper(text_paths[:1]).open_files_by_fsspec(mode="rb")
        assert list(dp.readlines(decode=True, return_path=False)) == ["alpha", "beta", "gamma"]

    def test_paths_skip_lines_and_strip(self, text_paths: list[str]) -> None:
        dp = IterableWrapper(text_paths[:2]).open_files_by_fsspec(mode="rb").map(basename)
        assert list(dp.readlines(skip_lines=2, decode=True)) == [
            ("a.txt", "gamma"),
            ("b.txt", "three"),
            ("b.txt", "four"),
            ("b.txt", "five"),
        ]
        dp = IterableWrapper(text_paths[:1]).open_files_by_fsspec(mode="rb")
        assert list(dp.readlines(strip_newline=False, return_path=False)) == [b"alpha\n", b"beta\r\n", b"gamma\n"]

    def test_errors_strict_names_file_and_line(self, tmp_path: Path) -> None:
        (path,) = write(tmp_path, {"bad.txt": b"ok\n\xff\xfe broken\n"})
        dp = IterableWrapper([path]).open_files_by_fsspec(mode="rb").readlines(decode=True, errors="strict")
        with pytest.raises(ParseError) as info:
            list(dp)
        assert info.value.url == path
        assert info.value.stage == "readlines"
        assert "line 2" in str(info.value)
        # The default, errors="ignore", drops the undecodable bytes as torchdata did.
        dp = IterableWrapper([path]).open_files_by_fsspec(mode="rb").readlines(decode=True, return_path=False)
        assert list(dp) == ["ok", " broken"]

    def test_closes_streams(self) -> None:
        Tracking.closed_streams.clear()
        streams = [Tracking(b"x\ny\n"), Tracking(b"z\n")]
        assert len(list(IterableWrapper([("a", streams[0]), ("b", streams[1])], deepcopy=False).readlines())) == 3
        assert all(s in Tracking.closed_streams for s in streams)

    def test_bytes_and_str_data(self) -> None:
        dp = IterableWrapper([("a", b"x\ny"), ("b", "z\n")]).readlines()
        assert list(dp) == [("a", b"x"), ("a", b"y"), ("b", "z")]

    def test_validation(self) -> None:
        src = IterableWrapper([])
        with pytest.raises(ValueError, match="skip_lines"):
            LineReader(src, skip_lines=-1)
        with pytest.raises(LookupError):
            LineReader(src, encoding="no-such-codec")
        with pytest.raises(LookupError):
            LineReader(src, errors="no-such-handler")
        with pytest.raises(TypeError, match="IterDataPipe"):
            LineReader([("a", io.StringIO("x"))])  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"\(url, stream\)"):
            list(IterableWrapper(["just-a-path"]).readlines())

    def test_pickle(self, text_paths: list[str]) -> None:
        dp = IterableWrapper(text_paths).open_files_by_fsspec(mode="rb").readlines(decode=True)
        clone = pickle.loads(pickle.dumps(dp))
        assert list(clone) == list(dp)

    @pytest.mark.parametrize("mode", ["rb", "r"])
    def test_resume_fsspec_mid_file(self, text_paths: list[str], mode: str) -> None:
        def make():
            return IterableWrapper(text_paths).open_files_by_fsspec(mode=mode).readlines(skip_lines=1)

        total = len(list(make()))
        assert total == 2 + 4 + 0 + 0
        for n in range(total + 1):  # every cut point: start, mid-file, file ends, the end
            assert_resumes(make, n)

    def test_resume_reopens_instead_of_storing_lines(self, text_paths: list[str]) -> None:
        def make():
            return IterableWrapper(text_paths).open_files_by_fsspec(mode="rb").readlines()

        pipe = prepare_for_resume(make())
        it = iter(pipe)
        assert [next(it) for _ in range(4)][-1] == (text_paths[1], b"one")
        state = snapshot_pipeline(pipe)
        (reader_state,) = [s for s in state["states"] if s and "current" in s]
        current = reader_state["current"]
        assert current["rest"] is None  # the file is opened again, not carried in the checkpoint
        assert (current["url"], current["lines"], current["offset"]) == (text_paths[1], 1, 4)
        fresh = make()
        restore_pipeline(fresh, pickle.loads(pickle.dumps(state)))
        assert [line for _, line in fresh] == [b"two", b"three", b"four", b"five", b"last"]

    @pytest.mark.parametrize("mode", ["b", "r"])
    def test_resume_torch_file_opener(self, text_paths: list[str], mode: str) -> None:
        # torch's FileOpener has no reopen(): the reader opens the file again by its path.
        def make():
            return PlainFileOpener(IterableWrapper(text_paths), mode=mode).readlines(decode=True)

        for n in (0, 1, 3, 5, 7):
            assert_resumes(make, n)
        current = checkpoint_after(make(), 4)
        assert current["rest"] is None
        assert current["source"] == {"protocol": "file", "path": text_paths[1]}
        assert current["text"] is (mode == "r")

    def test_resume_in_memory_streams_carry_the_rest(self) -> None:
        def make():
            items = [("m1", io.BytesIO(b"a\nb\nc\n")), ("m2", io.BytesIO(b"d\ne"))]
            return IterableWrapper(items).readlines()

        for n in range(6):
            assert_resumes(make, n)
        pipe = prepare_for_resume(make())
        it = iter(pipe)
        next(it)
        state = snapshot_pipeline(pipe)
        (current,) = [s["current"] for s in state["states"] if s and "current" in s]
        assert current["rest"] == [b"b\n", b"c\n"]
        assert [line for _, line in it] == [b"b", b"c", b"d", b"e"]  # the live iteration goes on

    def test_resume_through_decompress(self, tmp_path: Path) -> None:
        path = tmp_path / "log.txt.gz"
        path.write_bytes(gzip.compress(b"".join(b"row %d\n" % i for i in range(6))))

        def make():
            return IterableWrapper([str(path)]).open_files_by_fsspec(mode="rb").decompress().readlines()

        for n in (0, 2, 5):
            assert_resumes(make, n)
        assert checkpoint_after(make(), 2)["rest"] is None  # re-opened through decompress's reopen()

    def test_resume_fails_loudly_when_the_file_shrank(self, text_paths: list[str]) -> None:
        def make():
            return IterableWrapper(text_paths).open_files_by_fsspec(mode="rb").readlines()

        pipe = prepare_for_resume(make())
        it = iter(pipe)
        for _ in range(5):
            next(it)  # inside b.txt
        state = snapshot_pipeline(pipe)
        del it
        Path(text_paths[1]).write_bytes(b"one\n")
        fresh = make()
        restore_pipeline(fresh, state)
        with pytest.raises(ReadError) as info:
            list(fresh)
        assert info.value.url == text_paths[1]
        assert "fewer" in str(info.value)

    def test_state_before_iteration_and_bad_state(self) -> None:
        dp = IterableWrapper([("a", "x\ny")]).readlines()
        assert dp.state_dict() == {"current": None}
        dp.load_state_dict({"current": None})
        assert list(dp) == [("a", "x"), ("a", "y")]
        with pytest.raises(ValueError, match="not a state"):
            dp.load_state_dict({"position": 3})
        with pytest.raises(ValueError, match="incomplete state"):
            dp.load_state_dict({"current": {"url": "a"}})

    def test_loaded_state_is_reported_until_the_reader_starts_and_pickles_without_stream(self) -> None:
        def make():
            return IterableWrapper([("a", io.StringIO("x\ny\nz"))]).readlines()

        dp = make()
        it = iter(dp)
        assert next(it) == ("a", "x")
        state = dp.state_dict()
        clone = pickle.loads(pickle.dumps(dp))  # the open stream stays behind
        assert clone._feed is None and clone._cursor is None
        fresh = make()
        fresh.load_state_dict(state)
        assert fresh.state_dict() == state  # a checkpoint taken now keeps the position
        # the reader finishes "a", then reads its (not restored) upstream from the start
        assert list(fresh) == [("a", "y"), ("a", "z"), ("a", "x"), ("a", "y"), ("a", "z")]
        assert fresh.state_dict() == {"current": None}


class TestCSVParser:
    def test_torchdata_example(self, csv_paths: list[str]) -> None:
        dp = FileOpener(IterableWrapper(csv_paths), mode="b").map(basename)
        assert list(dp.parse_csv()) == [["key", "item"], ["a", "1"], ["b", "2"], []]

    def test_options(self, csv_paths: list[str]) -> None:
        dp = IterableWrapper(csv_paths).open_files_by_fsspec(mode="rb").map(basename)
        assert list(dp.parse_csv(skip_lines=1, return_path=True, as_tuple=True)) == [
            ("1.csv", ("a", "1")),
            ("1.csv", ("b", "2")),
        ]
        semi = IterableWrapper([("s.csv", b"a;'b;c'\n")]).parse_csv(delimiter=";", quotechar="'")
        assert list(semi) == [["a", "b;c"]]

    def test_text_streams(self, csv_paths: list[str]) -> None:
        dp = IterableWrapper(csv_paths[:1]).open_files_by_fsspec(mode="r")
        assert list(dp.parse_csv()) == [["key", "item"], ["a", "1"], ["b", "2"]]

    def test_multiline_fields(self) -> None:
        rows = list(IterableWrapper([("m.csv", MULTILINE_CSV)]).parse_csv())
        assert rows == [["id", "text"], ["1", "first\nsecond"], ["2", "plain"], ["3", "x\r\ny\nz"], ["4", "end"]]

    def test_malformed_names_file_and_line(self) -> None:
        data = b'a,b\n1,2\n3,"unterminated\n'
        dp = IterableWrapper([("bad.csv", data)]).parse_csv(strict=True)
        with pytest.raises(ParseError) as info:
            list(dp)
        assert (info.value.url, info.value.stage) == ("bad.csv", "parse_csv")
        assert "line 3" in str(info.value)

    def test_malformed_csv_is_a_csv_error_as_in_torchdata(self) -> None:
        data = b'a,b\n1,2\n3,"unterminated\n'
        for dp in (
            IterableWrapper([("bad.csv", data)]).parse_csv(strict=True),
            IterableWrapper([("bad.csv", data)]).parse_csv_as_dict(strict=True),
        ):
            with pytest.raises(csv.Error) as info:
                list(dp)
            assert isinstance(info.value, CSVParseError)
            assert info.value.url == "bad.csv"

    def test_undecoded_bytes_are_a_parse_error(self) -> None:
        dp = IterableWrapper([("raw.csv", b"a,b\n")]).parse_csv(decode=False)
        with pytest.raises(ParseError, match=r"raw\.csv"):
            list(dp)

    def test_validation(self) -> None:
        with pytest.raises(TypeError, match="format parameters"):
            CSVParser(IterableWrapper([]), no_such_param=1)
        with pytest.raises(TypeError, match="format parameters"):
            CSVParser(IterableWrapper([]), delimiter="too long")
        with pytest.raises(ValueError, match="skip_lines"):
            CSVParser(IterableWrapper([]), skip_lines=True)

    def test_pickle(self, csv_paths: list[str]) -> None:
        dp = IterableWrapper(csv_paths).open_files_by_fsspec(mode="rb").parse_csv(delimiter=",")
        assert list(pickle.loads(pickle.dumps(dp))) == list(dp)

    def test_resume_multiline_rows(self, tmp_path: Path) -> None:
        paths = write(tmp_path, {"m.csv": MULTILINE_CSV, "n.csv": b"k\n1\n2\n"})

        def make():
            return IterableWrapper(paths).open_files_by_fsspec(mode="rb").parse_csv(return_path=True)

        total = len(list(make()))
        for n in range(total + 1):
            assert_resumes(make, n)

    def test_resume_text_mode_and_in_memory(self) -> None:
        def make():
            return IterableWrapper([("m.csv", io.StringIO(MULTILINE_CSV.decode()))]).parse_csv(skip_lines=1)

        for n in range(5):
            assert_resumes(make, n)


class TestCSVDictParser:
    def test_torchdata_example(self, csv_paths: list[str]) -> None:
        dp = FileOpener(IterableWrapper(csv_paths), mode="b").map(basename)
        assert list(dp.parse_csv_as_dict()) == [{"key": "a", "item": "1"}, {"key": "b", "item": "2"}]

    def test_fieldnames_and_path(self) -> None:
        dp = IterableWrapper([("f.csv", b"1,2,3\n4,5\n")]).parse_csv_as_dict(
            fieldnames=["x", "y"], restkey="more", return_path=True
        )
        assert list(dp) == [("f.csv", {"x": "1", "y": "2", "more": ["3"]}), ("f.csv", {"x": "4", "y": "5"})]

    def test_validation(self) -> None:
        with pytest.raises(TypeError, match="format parameters"):
            CSVDictParser(IterableWrapper([]), as_tuple=True)

    def test_pickle(self, csv_paths: list[str]) -> None:
        dp = IterableWrapper(csv_paths).open_files_by_fsspec(mode="rb").parse_csv_as_dict()
        assert list(pickle.loads(pickle.dumps(dp))) == list(dp)

    def test_resume_keeps_the_header(self, tmp_path: Path) -> None:
        paths = write(tmp_path, {"m.csv": MULTILINE_CSV, "p.csv": b"k,v\n1,a\n\n2,b\n"})

        def make():
            return IterableWrapper(paths).open_files_by_fsspec(mode="rb").parse_csv_as_dict()

        rows = list(make())
        assert rows[-2:] == [{"k": "1", "v": "a"}, {"k": "2", "v": "b"}]  # the blank row is skipped
        for n in range(len(rows) + 1):
            assert_resumes(make, n)

        _, rest = resume_after(make, 2)
        assert rest[0] == {"id": "3", "text": "x\r\ny\nz"}

    def test_resume_skip_lines_in_memory(self) -> None:
        def make():
            return IterableWrapper([("p.csv", b"# comment\nk,v\n1,a\n\n2,b\n3,c\n")]).parse_csv_as_dict(skip_lines=1)

        assert list(make()) == [{"k": "1", "v": "a"}, {"k": "2", "v": "b"}, {"k": "3", "v": "c"}]
        for n in range(4):
            assert_resumes(make, n)


class TestJsonParser:
    @pytest.fixture
    def json_paths(self, tmp_path: Path) -> list[str]:
        return write(
            tmp_path,
            {
                "empty.json": b"",
                "1.json": b'["foo", {"bar":["baz", null, 1.0, 2]}]',
                "2.json": b'{"__complex__": true, "real": 1, "imag": 2}',
            },
        )

    def test_torchdata_example(self, json_paths: list[str]) -> None:
        dp = FileOpener(IterableWrapper(json_paths[1:]), mode="b").map(basename)
        assert list(dp.parse_json_files()) == [
            ("1.json", ["foo", {"bar": ["baz", None, 1.0, 2]}]),
            ("2.json", {"__complex__": True, "real": 1, "imag": 2}),
        ]

    def test_empty_file_is_a_parse_error(self, json_paths: list[str]) -> None:
        dp = IterableWrapper(json_paths[:1]).open_files_by_fsspec(mode="rb").parse_json_files()
        with pytest.raises(ParseError) as info:
            list(dp)
        assert (info.value.url, info.value.stage) == (json_paths[0], "parse_json_files")
        assert "line 1 column 1" in str(info.value)

    def test_error_position(self) -> None:
        dp = IterableWrapper([("x.json", b'{\n  "a": 1,\n  "b": ]\n}')]).parse_json_files()
        with pytest.raises(ParseError, match=r"'x.json' in parse_json_files: line 3 column 8"):
            list(dp)

    def test_bad_json_is_a_json_decode_error_as_in_torchdata(self, json_paths: list[str]) -> None:
        # torchdata let json.loads' JSONDecodeError through: code catching it must still catch ours.
        text = '{\n  "a": 1,\n  "b": ]\n}'
        dp = IterableWrapper(json_paths[:2]).open_files_by_fsspec(mode="rb").parse_json_files()
        with pytest.raises(json.JSONDecodeError) as info:
            list(dp)
        assert isinstance(info.value, JSONParseError)
        assert (info.value.url, info.value.stage) == (json_paths[0], "parse_json_files")
        assert (info.value.doc, info.value.pos, info.value.lineno, info.value.colno) == ("", 0, 1, 1)
        with pytest.raises(json.JSONDecodeError) as info:
            list(IterableWrapper([("x.json", text)]).parse_json_files())
        expected = json.JSONDecodeError("Expecting value", text, text.index("]"))
        got = info.value
        assert (got.msg, got.doc, got.pos, got.lineno, got.colno) == (
            expected.msg,
            expected.doc,
            expected.pos,
            expected.lineno,
            expected.colno,
        )
        assert str(got).startswith("cannot parse JSON 'x.json' in parse_json_files: line 3 column 8: Expecting value")

    def test_json_error_survives_pickling(self) -> None:
        with pytest.raises(JSONParseError) as info:
            list(IterableWrapper([("x.json", "[1,")]).parse_json_files())
        clone = pickle.loads(pickle.dumps(info.value))
        assert isinstance(clone, json.JSONDecodeError)
        assert (clone.url, clone.stage, clone.reason, clone.doc, clone.pos, clone.msg) == (
            "x.json",
            "parse_json_files",
            info.value.reason,
            info.value.doc,
            info.value.pos,
            info.value.msg,
        )

    def test_kwargs_text_streams_and_close(self) -> None:
        Tracking.closed_streams.clear()
        stream = Tracking(b'{"p": 0.1}')
        dp = IterableWrapper([("a", stream), ("b", io.StringIO("[1.5]"))], deepcopy=False)
        out = list(dp.parse_json_files(parse_float=decimal.Decimal))
        assert out == [("a", {"p": decimal.Decimal("0.1")}), ("b", [decimal.Decimal("1.5")])]
        assert stream in Tracking.closed_streams

    def test_validation_len_and_pickle(self, json_paths: list[str]) -> None:
        with pytest.raises(TypeError, match=r"json\.loads"):
            JsonParser(IterableWrapper([]), no_such_option=True)
        dp = IterableWrapper(json_paths[1:]).open_files_by_fsspec(mode="rb").parse_json_files()
        assert len(dp) == 2
        assert list(pickle.loads(pickle.dumps(dp))) == list(dp)

    def test_stateless_resume(self, json_paths: list[str]) -> None:
        def make():
            return IterableWrapper(json_paths[1:]).open_files_by_fsspec(mode="rb").parse_json_files()

        for n in range(3):
            assert_resumes(make, n)
