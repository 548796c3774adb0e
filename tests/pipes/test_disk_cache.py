"""Tests of pipekit.pipes._disk_cache: on_disk_cache and end_caching."""

from __future__ import annotations

import functools
import hashlib
import io
import logging
import multiprocessing
import os
import pickle
import threading
import time

import pytest

from pipekit.errors import ReadError
from pipekit.pipes import (
    CacheError,
    EndOnDiskCacheHolder,
    IterableWrapper,
    IterDataPipe,
    OnDiskCacheHolder,
)
from pipekit.pipes._disk_cache import _FileLock
from pipekit.testing import assert_resumes

# ------------------------------------------------------------------------------------------------
# helpers (module level so that pipes pickle and forked processes can use them)
# ------------------------------------------------------------------------------------------------


def payload(name: str) -> bytes:
    return hashlib.sha256(name.encode()).digest() * 64 + name.encode()


def local_path(root: str, name: str) -> str:
    return os.path.join(root, "files", name + ".bin")


def log_call(log: str, name: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{os.getpid()} {name}\n".encode())
    finally:
        os.close(fd)


def calls(log: str) -> list[str]:
    if not os.path.exists(log):
        return []
    with open(log) as f:
        return [line.split()[1] for line in f]


class SlowStream(io.RawIOBase):
    """A readable stream that hands out its data in small pieces, slowly."""

    def __init__(self, data: bytes, piece: int = 4096, delay: float = 0.0, fail_after: int | None = None) -> None:
        self.data = data
        self.pos = 0
        self.piece = piece
        self.delay = delay
        self.fail_after = fail_after
        self.reads = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if self.fail_after is not None and self.reads >= self.fail_after:
            raise ConnectionError("connection reset")
        self.reads += 1
        if self.delay:
            time.sleep(self.delay)
        n = self.piece if size < 0 else min(size, self.piece)
        out = self.data[self.pos : self.pos + n]
        self.pos += len(out)
        return out


def download(log: str, delay: float, name: str):
    log_call(log, name)
    return name, SlowStream(payload(name), piece=512, delay=delay)


def fetch_bytes(log: str, name: str):
    log_call(log, name)
    return name, payload(name)


def build(root: str, names: list[str], delay: float = 0.0, **holder_kwargs) -> IterDataPipe:
    dp = IterableWrapper(names).on_disk_cache(filepath_fn=functools.partial(local_path, root), **holder_kwargs)
    dp = dp.map(functools.partial(download, os.path.join(root, "calls.log"), delay))
    return dp.end_caching(mode="wb", same_filepath_fn=True)


class Explode(IterDataPipe):
    """A 1-to-many step (like extracting an archive): name -> (member path, bytes) for `parts` members."""

    stateless = True

    def __init__(self, source: IterDataPipe, root: str, parts: dict[str, int]) -> None:
        self.source = source
        self.root = root
        self.parts = parts

    def __iter__(self):
        for name in self.source:
            log_call(os.path.join(self.root, "calls.log"), name)
            for i in range(self.parts.get(name, 2)):
                yield os.path.join(self.root, "extracted", name, f"part{i}.txt"), f"{name}-{i}"


def archive_key(root: str, name: str) -> str:
    return os.path.join(root, "archives", name + ".tar")


def build_exploding(root: str, names: list[str], parts: dict[str, int] | None = None) -> IterDataPipe:
    dp = IterableWrapper(names).on_disk_cache(filepath_fn=functools.partial(archive_key, root))
    return Explode(dp, root, parts or {}).end_caching(mode="w")


def clear(root: str) -> None:
    """Remove every file under root (the cache starts empty)."""
    for d, _, files in os.walk(root):
        for f in files:
            os.remove(os.path.join(d, f))


def leftovers(root: str) -> list[str]:
    """Temporary and lock files left anywhere under root."""
    out = []
    for d, _, files in os.walk(root):
        out += [os.path.join(d, f) for f in files if f.endswith((".tmp", ".lock"))]
    return out


@pytest.fixture
def names() -> list[str]:
    return [f"file{i}" for i in range(6)]


@pytest.fixture
def root(tmp_path) -> str:
    return str(tmp_path / "cache")


# ------------------------------------------------------------------------------------------------
# on_disk_cache / end_caching
# ------------------------------------------------------------------------------------------------


class TestOnDiskCacheHolder:
    def test_iterating_without_end_caching_fails(self, names):
        with pytest.raises(RuntimeError, match=r"call \.end_caching\(\)"):
            list(IterableWrapper(names).on_disk_cache())

    def test_argument_validation(self, names, root):
        src = IterableWrapper(names)

        def gen_fn(x):
            yield x

        with pytest.raises(TypeError, match="generator function"):
            src.on_disk_cache(filepath_fn=gen_fn)
        with pytest.raises(ValueError, match="hash_type"):
            src.on_disk_cache(hash_type="sha1")
        with pytest.raises(TypeError, match="hash_dict must be a dict"):
            src.on_disk_cache(hash_dict=["x"])
        with pytest.raises(TypeError, match="extra_check_fn must be callable"):
            src.on_disk_cache(extra_check_fn=1)

    def test_filepath_fn_must_return_one_path(self, names, root):
        dp = IterableWrapper(names).on_disk_cache(filepath_fn=two_paths).map(identity_pair).end_caching()
        with pytest.raises(TypeError, match="must be a single file path, got a list"):
            list(dp)

    def test_pickle(self, names, root):
        holder = OnDiskCacheHolder(IterableWrapper(names), filepath_fn=functools.partial(local_path, root))
        copy = pickle.loads(pickle.dumps(holder))
        assert copy.filepath_fn("x") == local_path(root, "x")


def two_paths(name):
    return [name, name]


def identity_pair(x):
    return x, b""


class TestEndOnDiskCacheHolder:
    def test_writes_then_reads_from_cache(self, names, root):
        dp = build(root, names)
        out = list(dp)
        assert out == [local_path(root, n) for n in names]
        for n in names:
            with open(local_path(root, n), "rb") as f:
                assert f.read() == payload(n)
        assert calls(os.path.join(root, "calls.log")) == names
        assert list(dp) == out
        assert calls(os.path.join(root, "calls.log")) == names  # cached items skip the section
        assert leftovers(root) == []

    def test_only_missing_items_go_through_the_section(self, names, root):
        list(build(root, names))
        os.remove(local_path(root, names[2]))
        out = list(build(root, names))
        assert out == [local_path(root, n) for n in names]  # source order, cached or not
        assert calls(os.path.join(root, "calls.log")) == [*names, names[2]]

    def test_bytes_and_text(self, root):
        log = os.path.join(root, "calls.log")
        os.makedirs(root)
        dp = IterableWrapper(["a"]).on_disk_cache(filepath_fn=functools.partial(local_path, root))
        dp = dp.map(functools.partial(fetch_bytes, log)).end_caching(same_filepath_fn=True, skip_read=True)
        (path,) = list(dp)
        with open(path, "rb") as f:
            assert f.read() == payload("a")
        txt = IterableWrapper([os.path.join(root, "t.txt")]).on_disk_cache().map(text_pair).end_caching(mode="wt")
        (tpath,) = list(txt)
        with open(tpath, encoding="utf-8") as f:
            assert f.read() == "héllo\nwörld\n"

    def test_stream_is_read_and_closed(self, root):
        streams = []
        dp = IterableWrapper(["s"]).on_disk_cache(filepath_fn=functools.partial(local_path, root))
        dp = dp.map(functools.partial(record_stream, streams)).end_caching(same_filepath_fn=True)
        list(dp)
        assert streams[0].closed

    def test_wrong_data_type_is_a_clear_error(self, root):
        dp = IterableWrapper([os.path.join(root, "x.bin")]).on_disk_cache().map(text_pair).end_caching(mode="wb")
        with pytest.raises(TypeError, match=r"cannot write a str to .*x\.bin.* in binary mode.*use mode='w'"):
            list(dp)
        dp = IterableWrapper([os.path.join(root, "y.bin")]).on_disk_cache().map(stream_pair)
        with pytest.raises(TypeError, match="skip_read=True"):
            list(dp.end_caching(skip_read=True))
        assert leftovers(root) == []

    def test_hash_dict(self, names, root):
        good = {local_path(root, n): hashlib.sha256(payload(n)).hexdigest() for n in names}
        out = list(build(root, names, hash_dict=good))
        assert len(out) == 6
        # a corrupted cached file is detected and created again
        with open(out[1], "wb") as f:
            f.write(b"corrupt")
        assert list(build(root, names, hash_dict=good)) == out
        with open(out[1], "rb") as f:
            assert f.read() == payload(names[1])
        assert calls(os.path.join(root, "calls.log")) == [*names, names[1]]

    def test_hash_mismatch_names_the_file(self, names, root):
        bad = {local_path(root, n): hashlib.sha256(payload(n)).hexdigest() for n in names}
        bad[local_path(root, names[3])] = "0" * 64
        dp = build(root, names, hash_dict=bad)
        with pytest.raises(CacheError, match=r"cannot cache '.*file3\.bin' in end_caching: sha256 mismatch") as err:
            list(dp)
        assert isinstance(err.value, RuntimeError)
        assert err.value.url == local_path(root, names[3])
        assert not os.path.exists(local_path(root, names[3]))
        assert leftovers(root) == []

    def test_file_missing_from_hash_dict(self, names, root):
        dp = build(root, names, hash_dict={}, hash_type="md5")
        with pytest.raises(CacheError, match=r"file0\.bin.*hash_dict has no expected hash"):
            list(dp)

    def test_extra_check_fn(self, names, root):
        list(build(root, names))
        list(build(root, names, extra_check_fn=reject_file4))
        assert calls(os.path.join(root, "calls.log")) == [*names, "file4"]

    def test_failure_mid_write_leaves_nothing(self, root):
        dp = IterableWrapper(["bad"]).on_disk_cache(filepath_fn=functools.partial(local_path, root))
        dp = dp.map(broken_download).end_caching(same_filepath_fn=True)
        with pytest.raises(ConnectionError):
            list(dp)
        assert not os.path.exists(local_path(root, "bad"))
        assert leftovers(root) == []
        os.makedirs(root, exist_ok=True)
        assert list(build(root, ["bad"])) == [local_path(root, "bad")]  # the lock was released

    def test_reader_never_sees_a_partial_file(self, root):
        target = local_path(root, "slow")
        seen = []
        absent = 0

        def watch(stop):
            nonlocal absent
            deadline = time.monotonic() + 10
            while not (stop.is_set() and seen) and time.monotonic() < deadline:
                if os.path.exists(target):
                    with open(target, "rb") as f:
                        seen.append(f.read())
                else:
                    absent += 1

        stop = threading.Event()
        watcher = threading.Thread(target=watch, args=(stop,))
        watcher.start()
        try:
            list(build(root, ["slow"], delay=0.002))
        finally:
            stop.set()
            watcher.join()
        assert absent > 0  # the watcher polled while the file was being written
        assert seen
        assert all(s == payload("slow") for s in seen)

    def test_one_to_many(self, root):
        os.makedirs(root)
        dp = build_exploding(root, ["a", "b"], {"a": 3})
        out = list(dp)
        members = [(n, i) for n, k in (("a", 3), ("b", 2)) for i in range(k)]
        expected = [os.path.join(root, "extracted", n, f"part{i}.txt") for n, i in members]
        assert out == expected
        with open(archive_key(root, "a") + ".torchdata_list") as f:
            assert f.read().splitlines() == expected[:3]
        assert list(dp) == expected
        assert calls(os.path.join(root, "calls.log")) == ["a", "b"]
        os.remove(expected[4])  # a member disappeared: that item is produced again
        assert list(build_exploding(root, ["a", "b"])) == expected
        assert calls(os.path.join(root, "calls.log")) == ["a", "b", "b"]

    @pytest.mark.parametrize("change", ["shortened", "same-size-other-bytes"])
    def test_a_cached_file_changed_on_disk_is_fetched_again(self, names, root, change, caplog):
        """A cached file cut short (a run killed while writing it in place, a disk full) or rewritten since it was
        written is not served: it is fetched again, with a warning naming it; never short or other bytes."""
        list(build(root, names[:2]))
        victim = local_path(root, names[1])
        with open(victim, "r+b") as f:
            if change == "shortened":
                f.truncate(len(payload(names[1])) // 2)
            else:
                f.write(b"X" * 16)
        if change != "shortened":  # a later rewrite has a later time (two writes within a clock tick may not)
            written = os.stat(victim).st_mtime_ns
            os.utime(victim, ns=(written, written + 10**9))
        with caplog.at_level(logging.WARNING, logger="pipekit"):
            out = list(build(root, names[:2]))
        assert out == [local_path(root, n) for n in names[:2]]
        with open(victim, "rb") as f:
            assert f.read() == payload(names[1])
        assert calls(os.path.join(root, "calls.log")) == [*names[:2], names[1]]
        assert os.path.basename(victim) in caplog.text
        assert list(build(root, names[:2])) == out  # cached again, whole
        assert calls(os.path.join(root, "calls.log")) == [*names[:2], names[1]]

    def test_a_member_of_a_one_to_many_item_shortened_is_produced_again(self, root):
        os.makedirs(root)
        expected = list(build_exploding(root, ["a"], {"a": 3}))
        with open(expected[1], "r+b") as f:
            f.truncate(1)
        assert list(build_exploding(root, ["a"], {"a": 3})) == expected
        assert calls(os.path.join(root, "calls.log")) == ["a", "a"]
        with open(expected[1]) as f:
            assert f.read() == "a-1"

    def test_item_without_files_is_not_cached(self, root, caplog):
        os.makedirs(root)
        dp = build_exploding(root, ["a", "empty"], {"empty": 0})
        with caplog.at_level(logging.WARNING, logger="pipekit"):
            assert len(list(dp)) == 2
            assert len(list(dp)) == 2
        assert calls(os.path.join(root, "calls.log")) == ["a", "empty", "empty"]
        assert "no file was produced" in caplog.text

    def test_several_files_including_the_key_path(self, root):
        src = IterableWrapper([os.path.join(root, "k")]).on_disk_cache()
        dp = KeyAndMore(src).end_caching(mode="w")
        with pytest.raises(CacheError, match="one of them at its key path"):
            list(dp)

    def test_output_must_be_pairs(self, root):
        dp = IterableWrapper([os.path.join(root, "k")]).on_disk_cache().map(str).end_caching()
        with pytest.raises(TypeError, match=r"expected \(metadata, data\) pairs"):
            list(dp)

    def test_construction_errors(self, names, root):
        src = IterableWrapper(names)
        with pytest.raises(RuntimeError, match="expected an on_disk_cache"):
            src.end_caching()
        holder = src.on_disk_cache()
        with pytest.raises(ValueError, match="mutually exclusive"):
            holder.end_caching(filepath_fn=str, same_filepath_fn=True)
        with pytest.raises(ValueError, match="mode"):
            holder.end_caching(mode="ab")
        with pytest.raises(ValueError, match="timeout"):
            holder.end_caching(timeout=0)
        holder.map(identity_pair).end_caching()
        with pytest.raises(RuntimeError, match="only be called once"):
            holder.end_caching()

    def test_pickle(self, names, root):
        dp = build(root, names)
        copy = pickle.loads(pickle.dumps(dp))
        assert isinstance(copy, EndOnDiskCacheHolder)
        assert list(copy) == [local_path(root, n) for n in names]

    def test_lock_timeout_names_the_entry(self, root):
        key = local_path(root, "busy")
        os.makedirs(os.path.dirname(key))
        with _FileLock(key + ".lock", 1, key):
            dp = build(root, ["busy"]).set_timeout(0.2)
            with pytest.raises(ReadError, match=r"cannot cache '.*busy\.bin' in end_caching: another process"):
                list(dp)
        assert calls(os.path.join(root, "calls.log")) == []

    def test_waits_for_another_writer_and_uses_its_file(self, root):
        key = local_path(root, "shared")
        os.makedirs(os.path.dirname(key))
        lock = _FileLock(key + ".lock", 1, key).__enter__()

        def finish():
            time.sleep(0.1)
            with open(key, "wb") as f:
                f.write(payload("shared"))
            lock.__exit__(None, None, None)

        t = threading.Thread(target=finish)
        t.start()
        assert list(build(root, ["shared"])) == [key]
        t.join()
        assert calls(os.path.join(root, "calls.log")) == []
        assert leftovers(root) == []

    @pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")
    def test_two_processes_fill_the_same_cache(self, root):
        names = [f"f{i}" for i in range(8)]
        os.makedirs(root)
        ctx = multiprocessing.get_context("fork")
        barrier = ctx.Barrier(2)
        results = ctx.Queue()
        procs = [
            ctx.Process(target=fill_cache, args=(root, names if i == 0 else names[::-1], barrier, results, i))
            for i in range(2)
        ]
        for p in procs:
            p.start()
        partial = []
        while any(p.is_alive() for p in procs):  # meanwhile, read whatever is visible
            for n in names:
                path = local_path(root, n)
                if os.path.exists(path):
                    with open(path, "rb") as f:
                        if f.read() != payload(n):
                            partial.append(path)
        for p in procs:
            p.join(timeout=30)
        out = dict(results.get(timeout=5) for _ in procs)
        assert [p.exitcode for p in procs] == [0, 0]
        assert out[0] == [local_path(root, n) for n in names]
        assert out[1] == [local_path(root, n) for n in names[::-1]]
        assert partial == []
        log = calls(os.path.join(root, "calls.log"))
        assert sorted(log) == sorted(names)  # every file was downloaded exactly once
        for n in names:
            with open(local_path(root, n), "rb") as f:
                assert f.read() == payload(n)
        assert leftovers(root) == []

    @pytest.mark.parametrize("n", [0, 2, 5])
    def test_resumes_from_cache(self, names, root, n):
        list(build(root, names))
        assert_resumes(lambda: build(root, names), n)

    @pytest.mark.parametrize("n", [0, 1, 4])
    def test_resumes_while_writing(self, names, root, n):
        def make():
            clear(root)
            return build(root, names)

        assert_resumes(make, n)

    @pytest.mark.parametrize("n", [0, 1, 2, 4])
    def test_resumes_one_to_many(self, root, n):
        os.makedirs(root)
        assert_resumes(lambda: build_exploding(root, ["a", "b", "c"], {"a": 3}), n)

    def test_restored_section_pipes_start_from_scratch(self, names, root):
        """A resumable pipe inside the section gets its pending state drained before the next item."""
        made = []

        def make():
            made.append(1)
            if len(made) < 3:  # the restored copy (3rd) finds the files the interrupted run wrote
                clear(root)
            dp = IterableWrapper(names).on_disk_cache(filepath_fn=functools.partial(local_path, root))
            return SkipOnResume(dp).map(identity_payload).end_caching(same_filepath_fn=True)

        assert_resumes(make, 2)
        assert len(made) == 3


def text_pair(path):
    return path, "héllo\nwörld\n"


def stream_pair(path):
    return path, io.BytesIO(b"x")


def record_stream(streams, name):
    s = io.BytesIO(payload(name))
    streams.append(s)
    return name, s


def reject_file4(path):
    return not path.endswith("file4.bin")


def broken_download(name):
    return name, SlowStream(payload(name), piece=256, fail_after=2)


def identity_payload(name):
    return name, payload(name)


class KeyAndMore(IterDataPipe):
    stateless = True

    def __init__(self, source):
        self.source = source

    def __iter__(self):
        for key in self.source:
            yield key, "a"
            yield key + ".other", "b"


class SkipOnResume(IterDataPipe):
    """Counts the items it passed; a restored copy skips that many (like a sharding counter would)."""

    def __init__(self, source):
        self.source = source
        self.seen = 0
        self._skip = 0

    def __iter__(self):
        skip, self._skip = self._skip, 0
        for x in self.source:
            self.seen += 1
            if skip:
                skip -= 1
                continue
            yield x

    def state_dict(self):
        return {"seen": self.seen}

    def load_state_dict(self, state):
        self._skip = state["seen"]


def fill_cache(root, names, barrier, results, rank):
    dp = build(root, names, delay=0.001)
    barrier.wait()
    results.put((rank, list(dp)))
