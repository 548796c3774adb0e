"""The stamps of the files a pipeline opened in an epoch (pipekit.pipes._stamps): bounded, and checked on resume."""

from __future__ import annotations

import io
import os
import pickle
import zlib
from collections.abc import Iterator

import pytest

import pipekit
from mirror_server import QuietFolderHandler, serve_folder
from pipekit.errors import CheckpointError
from pipekit.pipes import IterableWrapper
from pipekit.pipes._stamps import StampLog, file_stamp, stamp_record


def _log_of(entries: list[tuple[str, str]]) -> StampLog:
    log = StampLog()
    for url, stamp in entries:
        log.note(url, stamp, "open_files_by_fsspec")
    return log


def test_a_record_of_10000_files_stays_small():
    entries = [(f"/data/train/sample-{i:06d}.jpg", f"{1000 + i % 977}:17643500{i:011d}") for i in range(10_000)]
    record = stamp_record(entries)
    assert record["count"] == 10_000 and len(record["names"]) < 200_000
    assert len(pickle.dumps(record)) < 200_000


def test_past_the_limit_a_record_keeps_its_digest_and_count_only():
    entries = [(f"/d/{i}.bin", f"{i}:1") for i in range(100)]
    record = stamp_record(entries, limit=64)
    assert sorted(record) == ["count", "digest"]


def test_a_log_is_not_pickled_with_its_pipe():
    assert pickle.loads(pickle.dumps(_log_of([("/d/a.bin", "1:1")]))) is None


def test_a_file_opened_again_with_another_stamp_is_refused_naming_it():
    record = _log_of([("/d/a.bin", "3:1"), ("/d/b.bin", "4:1")]).at(lazy=False)
    log = StampLog()
    log.expect(record, carry=False)
    log.note("/d/a.bin", "3:1", "open_files_by_fsspec")  # unchanged
    log.note("/d/c.bin", "9:9", "open_files_by_fsspec")  # not read before the checkpoint: anything goes
    with pytest.raises(CheckpointError, match=r"open_files_by_fsspec: '/d/b\.bin' changed.*4:1 then, 5:2 now"):
        log.note("/d/b.bin", "5:2", "open_files_by_fsspec")


def test_a_stamp_that_told_the_size_alone_matches_a_version_of_that_size():
    """HTTP files were stamped ``size:None`` before their servers' ETag was read: a checkpoint taken then still
    resumes on the same size, and refuses another."""
    log = StampLog()
    log.expect(stamp_record([("http://h/a.bin", "3:None"), ("http://h/b.bin", "4:None")]), carry=False)
    log.note("http://h/a.bin", '3:"etag-1"', "open_files_by_fsspec")
    with pytest.raises(CheckpointError, match=r"b\.bin' changed.*4:None then, 5:"):
        log.note("http://h/b.bin", '5:"etag-2"', "open_files_by_fsspec")


def test_a_refused_stream_is_closed(tmp_path):
    path = tmp_path / "a.bin"
    path.write_bytes(b"abc")
    log = StampLog()
    log.expect(stamp_record([(str(path), "3:0")]), carry=False)
    stream = open(path, "rb")  # noqa: SIM115 - the log closes it
    with pytest.raises(CheckpointError):
        log.opened(str(path), stream, "open_files_by_fsspec")
    assert stream.closed


def test_the_stamp_of_a_local_file_is_its_size_and_mtime(tmp_path):
    path = tmp_path / "a.bin"
    path.write_bytes(b"abcd")
    with open(path, "rb") as f:
        assert file_stamp(f) == f"4:{path.stat().st_mtime_ns}"
    assert file_stamp(io.BytesIO(b"x")) is None


def test_without_names_a_replay_is_checked_by_digest():
    entries = [(f"/d/{i}.bin", f"{i}:1") for i in range(5)]
    log = StampLog()
    log.expect(stamp_record(entries, limit=8), carry=False)
    for url, stamp in entries:
        log.note(url, stamp, "open_files_by_fsspec")
    log.check_replayed(5)  # the same files: fine
    log = StampLog()
    log.expect(stamp_record(entries, limit=8), carry=False)
    for url, stamp in [*entries[:2], ("/d/2.bin", "7:7"), *entries[3:]]:
        log.note(url, stamp, "open_files_by_fsspec")
    with pytest.raises(CheckpointError, match="too many to name"):
        log.check_replayed(5)


def test_after_a_replay_a_local_file_not_read_again_is_looked_at(tmp_path):
    kept, gone = tmp_path / "kept.bin", tmp_path / "gone.bin"
    kept.write_bytes(b"k")
    gone.write_bytes(b"g")
    with open(kept, "rb") as a, open(gone, "rb") as b:
        record = stamp_record([(str(kept), file_stamp(a)), (str(gone), file_stamp(b))])
    log = StampLog()
    log.expect(record, carry=False)
    log.check_replayed(2)  # neither read again (a read-ahead the replay did not repeat), both unchanged: fine
    gone.unlink()
    with pytest.raises(CheckpointError, match=r"gone\.bin' is gone"):
        log.check_replayed(2)


def test_a_record_holds_no_secret_of_the_urls_and_still_checks_them():
    url = "s3://AKIAEXAMPLE:wJalrXUtnFEMIsecret@bucket/a.tar"
    signed = "https://h/b.tar?X-Amz-Signature=deadbeef0123"
    record = _log_of([(url, "3:1"), (signed, "4:1")]).at(lazy=False)
    raw = pickle.dumps(record) + zlib.decompress(record["names"])
    assert b"wJalrXUtnFEMIsecret" not in raw and b"deadbeef0123" not in raw
    log = StampLog()
    log.expect(record, carry=False)
    log.note(signed, "4:1", "open_files_by_fsspec")  # unchanged
    with pytest.raises(CheckpointError, match=r"'s3://AKIAEXAMPLE:\*\*\*@bucket/a\.tar.*changed") as info:
        log.note(url, "5:2", "load_from_tar")
    assert "wJalrXUtnFEMIsecret" not in str(info.value)


# -- files read over HTTP by open_files_by_fsspec: stamped by the version the server tells --------------------


@pytest.fixture
def web_folder(tmp_path) -> Iterator[tuple[object, str]]:
    """Three files served by Python's file server (Content-Length and Last-Modified, no ETag), and its URL."""
    for i in range(3):
        (tmp_path / f"f{i}.bin").write_bytes(bytes([i]) * (10 + i))
    with serve_folder(tmp_path) as url:
        yield tmp_path, url


def _read(item: tuple) -> tuple:
    url, stream = item
    try:
        return url, stream.read()
    finally:
        stream.close()


def _forked_over_http(urls: list[str], retry: int | None, mode: str = "rb"):
    a, b = IterableWrapper(urls).open_files_by_fsspec(mode=mode, retry=retry).map(_read).fork(2)
    return a.zip(b)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("mode", "retry"), [("rb", None), ("rb", 1), ("r", None), ("r", 1)])
def test_a_replayed_resume_refuses_a_file_replaced_on_a_web_server_by_one_of_the_same_size(web_folder, mode, retry):
    """open_files_by_fsspec's HTTP files were stamped by their size alone (fsspec keeps the Last-Modified of the
    request it opens with to itself): a file replaced by one of the same size was replayed with its new bytes.
    Text files opened without retries (``mode="r", retry=1``) still were, after binary ones no longer were."""
    folder, base = web_folder
    urls = [f"{base}/f{i}.bin" for i in range(3)]
    full = list(pipekit.DataLoader(_forked_over_http(urls, retry, mode)))
    loader = pipekit.DataLoader(_forked_over_http(urls, retry, mode))
    it = iter(loader)
    head = [next(it) for _ in range(2)]
    state = pickle.loads(pickle.dumps(loader.state_dict()))
    resumed = pipekit.DataLoader(_forked_over_http(urls, retry, mode))
    resumed.load_state_dict(state)
    assert head + list(resumed) == full  # unchanged: exact
    path = folder / "f1.bin"
    path.write_bytes(b"z" * path.stat().st_size)  # text too: read as it is where nothing refuses it
    os.utime(path, (path.stat().st_atime, path.stat().st_mtime + 10))  # Last-Modified counts whole seconds
    resumed = pipekit.DataLoader(_forked_over_http(urls, retry, mode))
    resumed.load_state_dict(state)
    with pytest.raises(CheckpointError, match=r"f1\.bin' changed since the checkpoint"):
        list(resumed)


class _NoRanges(QuietFolderHandler):
    """A web server that says it takes no range requests (``Accept-Ranges: none``) and sends whole files."""

    def end_headers(self):
        self.send_header("Accept-Ranges", "none")
        super().end_headers()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("retry", [None, 1])
def test_a_file_on_a_server_that_takes_no_ranges_is_read_whole(tmp_path, retry):
    """fsspec opens such a file as a stream; the open that keeps the server's version must too, not as a file read
    in ranged blocks (past its first block fsspec then raises "doesn't appear to support range requests")."""
    data = bytes(range(256)) * 20  # 5,120 bytes: five blocks of 1,024
    (tmp_path / "big.bin").write_bytes(data)
    with serve_folder(tmp_path, _NoRanges) as base:
        url = f"{base}/big.bin"
        pipe = IterableWrapper([url]).open_files_by_fsspec(mode="rb", retry=retry, block_size=1024)
        for got, stream in pipe:
            stamp = file_stamp(stream)
            assert stamp is not None and stamp.startswith("5120:") and not stamp.endswith(":None")  # its version
            pieces = [stream.read(1000) for _ in range(6)]  # as a decoder or tarfile reads: piece by piece
            stream.close()
            assert (got, b"".join(pieces)) == (url, data)
