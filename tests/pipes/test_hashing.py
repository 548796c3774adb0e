"""Tests of check_hash (HashChecker)."""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import pickle
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipekit.errors import ReadError, StageError
from pipekit.pipes import IterableWrapper
from pipekit.pipes._hashing import HashChecker, HashError
from pipekit.pipes._http import HttpReader  # noqa: F401  (registers read_from_http)
from pipekit.testing import resume_after

BIG = bytes(range(256)) * 10_000  # 2.5 MB: several read chunks


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def files(tmp_path: Path) -> dict[str, bytes]:
    content = {"a.txt": b"alpha\nbeta\n", "big.bin": BIG, "empty": b""}
    for name, data in content.items():
        (tmp_path / name).write_bytes(data)
    return {str(tmp_path / name): data for name, data in content.items()}


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


@pytest.fixture
def http_dir(tmp_path: Path) -> Iterator[str]:
    root = tmp_path / "www"
    root.mkdir()
    (root / "big.bin").write_bytes(BIG)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(root)))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class NoSeek(io.RawIOBase):
    """A readable stream that cannot seek, like a socket."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        chunk = self._data.read(len(b))
        b[: len(chunk)] = chunk
        return len(chunk)


class LyingSeek(NoSeek):
    """Says it is seekable, but cannot go back (like fsspec's streamed HTTP file)."""

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._data.tell()

    def seek(self, pos: int, whence: int = 0) -> int:
        if whence == 0 and pos == self._data.tell():
            return pos
        raise ValueError("Cannot seek streaming file")


class Broken(NoSeek):
    def readinto(self, b) -> int:
        raise OSError("connection reset")


class TestHashChecker:
    def test_bytes_and_str_items(self) -> None:
        hash_dict = {"b": sha256(b"bytes"), "s": sha256("héllo".encode())}
        dp = IterableWrapper([("b", b"bytes"), ("s", "héllo")]).check_hash(hash_dict)
        assert list(dp) == [("b", b"bytes"), ("s", "héllo")]

    def test_files_rewound_after_hashing(self, files: dict[str, bytes]) -> None:
        hash_dict = {name: sha256(data) for name, data in files.items()}
        dp = IterableWrapper(sorted(files)).open_files_by_fsspec(mode="rb").check_hash(hash_dict)
        got = {name: stream.read() for name, stream in dp}
        assert got == files

    def test_torchdata_usage_md5_and_uppercase_digest(self, files: dict[str, bytes]) -> None:
        name = next(n for n in files if n.endswith("a.txt"))
        hash_dict = {name: hashlib.md5(files[name]).hexdigest().upper()}
        dp = IterableWrapper([name]).open_files_by_fsspec(mode="rb").check_hash(hash_dict, "md5")
        assert [stream.read() for _, stream in dp] == [files[name]]

    def test_other_algorithms(self) -> None:
        data = b"payload"
        dp = IterableWrapper([("x", data)]).check_hash({"x": hashlib.blake2b(data).hexdigest()}, hash_type="blake2b")
        assert list(dp) == [("x", data)]

    def test_mismatch_names_file_expected_and_actual(self) -> None:
        stream = io.BytesIO(b"corrupt")
        expected = sha256(b"good")
        dp = IterableWrapper([("data.tar", stream)], deepcopy=False).check_hash({"data.tar": expected})
        with pytest.raises(HashError) as info:
            list(dp)
        err = info.value
        assert str(err).startswith(
            f"cannot verify 'data.tar' in check_hash: sha256 mismatch: expected {expected}, got {sha256(b'corrupt')}"
        )
        actual = sha256(b"corrupt")
        assert (err.url, err.stage, err.expected, err.actual) == ("data.tar", "check_hash", expected, actual)
        assert isinstance(err, StageError)
        assert isinstance(err, RuntimeError)  # what torchdata raised
        assert isinstance(err, ValueError)
        assert stream.closed

    def test_unspecified_hash(self) -> None:
        stream = io.BytesIO(b"x")
        with pytest.raises(HashError, match=r"cannot verify 'other\.bin' in check_hash: Unspecified hash"):
            list(IterableWrapper([("other.bin", stream)], deepcopy=False).check_hash({"a.bin": sha256(b"x")}))
        assert stream.closed

    def test_error_pickles_with_its_fields(self) -> None:
        err = HashError("verify", "f", "check_hash", "mismatch", expected="aa", actual="bb")
        clone = pickle.loads(pickle.dumps(err))
        assert (str(clone), clone.expected, clone.actual) == (str(err), "aa", "bb")

    def test_non_seekable_stream_is_buffered(self) -> None:
        raw = NoSeek(BIG)
        [(_, out)] = list(IterableWrapper([("s", raw)], deepcopy=False).check_hash({"s": sha256(BIG)}))
        assert out.read() == BIG
        assert out.seekable()  # an in-memory copy
        assert raw.closed  # the consumed original is closed

    def test_stream_that_cannot_seek_back_is_buffered(self) -> None:
        [(_, out)] = list(IterableWrapper([("s", LyingSeek(BIG))]).check_hash({"s": sha256(BIG)}))
        assert out.read() == BIG

    def test_http_stream_is_buffered(self, http_dir: str) -> None:
        url = f"{http_dir}/big.bin"
        dp = IterableWrapper([url]).read_from_http(timeout=10).check_hash({url: sha256(BIG)})
        [(got_url, stream)] = list(dp)
        assert got_url == url
        assert stream.read() == BIG

    def test_rewind_false_yields_consumed_stream(self, files: dict[str, bytes]) -> None:
        name = next(n for n in files if n.endswith("a.txt"))
        opened = IterableWrapper([name]).open_files_by_fsspec(mode="rb")
        dp = opened.check_hash({name: sha256(files[name])}, rewind=False)
        [(_, stream)] = list(dp)
        assert stream.read() == b""

    def test_rewinds_to_where_the_stream_started(self) -> None:
        stream = io.BytesIO(b"HEADERpayload")
        stream.seek(6)
        [(_, out)] = list(IterableWrapper([("p", stream)]).check_hash({"p": sha256(b"payload")}))
        assert out.read() == b"payload"

    def test_iterable_stream_without_read(self) -> None:
        class Chunks:
            def __iter__(self):
                yield from (b"ab", b"", b"cd")

        [(_, out)] = list(IterableWrapper([("c", Chunks())]).check_hash({"c": sha256(b"abcd")}))
        assert out.read() == b"abcd"

    def test_text_stream_refused(self, files: dict[str, bytes]) -> None:
        name = next(n for n in files if n.endswith("a.txt"))
        dp = IterableWrapper([name]).open_files_by_fsspec(mode="r").check_hash({name: sha256(files[name])})
        with pytest.raises(TypeError, match=r"a\.txt' is a text-mode stream.*mode='rb'"):
            list(dp)

    def test_read_error_names_file_and_stage(self) -> None:
        with pytest.raises(ReadError, match=r"cannot read 'f' in check_hash: OSError: connection reset"):
            list(IterableWrapper([("f", Broken(b""))]).check_hash({"f": sha256(b"")}))

    def test_bad_items(self) -> None:
        with pytest.raises(TypeError, match=r"expected \(file_name, data\) tuples"):
            list(IterableWrapper([b"just bytes"]).check_hash({}))

    def test_bad_arguments(self) -> None:
        src = IterableWrapper([])
        with pytest.raises(ValueError, match="Invalid hash_type"):
            HashChecker(src, {}, hash_type="crc32")
        with pytest.raises(TypeError, match="hash_dict must be a mapping"):
            HashChecker(src, [("a", "b")])
        with pytest.raises(TypeError, match="hex digest strings"):
            HashChecker(src, {"a": b"00"})
        with pytest.raises(TypeError, match="rewind"):
            HashChecker(src, {}, rewind="yes")

    def test_stateless_len_pickle_and_resume(self) -> None:
        items = [(str(i), str(i) * 3) for i in range(6)]
        hash_dict = {k: sha256(v.encode()) for k, v in items}
        dp = IterableWrapper(items).check_hash(hash_dict)
        assert HashChecker.stateless is True
        assert len(dp) == 6
        assert list(pickle.loads(pickle.dumps(dp))) == items
        head, rest = resume_after(lambda: IterableWrapper(items).check_hash(hash_dict), 4)
        assert head + rest == items
