"""Tests of TarWriter, ShardWriter and write_shards: real shards read back with pipekit (local, memory, S3)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
import torch

import pipekit
from pipekit import datasets
from pipekit.encoders import EncodeError
from pipekit.errors import ReadError
from pipekit.pipes import IterableWrapper, ShardSaver, ShardWriter, TarWriter
from pipekit.testing import assert_resumes

SRC = str(Path(pipekit.__file__).resolve().parents[1])  # the folder pipekit is imported from


def make_samples(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """Samples with a field of every common kind (images, arrays, tensors, JSON, text, labels)."""
    g = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    return [
        {
            "__key__": f"sample{i:05d}",
            "png": torch.randint(0, 256, (3, 6 + i % 3, 5), dtype=torch.uint8, generator=g),
            "cls": i % 4,
            "json": {"i": i, "tags": ["a", "b"][: i % 3]},
            "txt": f"caption {i} ☃",
            "npy": rng.normal(size=(2, 3)).astype(np.float32),
            "pth": torch.randn(4, generator=g),
            "seg.png": torch.randint(0, 3, (1, 6, 5), dtype=torch.uint8, generator=g),
        }
        for i in range(n)
    ]


def read_with_pipes(urls: list[str], **storage_options: Any) -> list[dict[str, Any]]:
    pipe = IterableWrapper(urls).open_files_by_fsspec(mode="rb", **storage_options).load_from_tar()
    return list(pipe.webdataset().decode())


def short(sample: dict[str, Any]) -> dict[str, Any]:
    """A decoded sample with its key stripped of the shard URL and its fields without the dot."""
    return {("__key__" if k == "__key__" else k[1:]): (v.rsplit("/", 1)[1] if k == "__key__" else v)
            for k, v in sample.items()}


def assert_same(got: dict[str, Any], expected: dict[str, Any]) -> None:
    assert set(got) == set(expected)
    for k, v in expected.items():
        if isinstance(v, torch.Tensor):
            assert isinstance(got[k], torch.Tensor) and got[k].dtype == v.dtype and torch.equal(got[k], v), k
        elif isinstance(v, np.ndarray):
            assert isinstance(got[k], np.ndarray) and got[k].dtype == v.dtype and np.array_equal(got[k], v), k
        else:
            assert got[k] == v, k


def members(path: str | Path) -> list[tarfile.TarInfo]:
    with tarfile.open(path) as tar:
        return tar.getmembers()


def listing(folder: Path) -> list[str]:
    return sorted(os.listdir(folder))


class TestRoundTrip:
    def test_pipes_and_datasets_webdataset_read_back_identical_samples(self, tmp_path: Path) -> None:
        samples = make_samples(11)
        with ShardWriter(str(tmp_path / "shard-%06d.tar"), maxcount=4, verbose=0) as sink:
            for s in samples:
                sink.write(s)
        assert listing(tmp_path) == ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]
        assert sink.shards == [str(tmp_path / f"shard-{i:06d}.tar") for i in range(3)]

        by_pipes = [short(s) for s in read_with_pipes(sink.shards)]
        recipe = datasets.WebDataset(str(tmp_path / "shard-{000000..000002}.tar"), train=False, batch_size=None)
        by_recipe = [short(s) for s in recipe]
        assert len(by_pipes) == len(by_recipe) == len(samples)
        for got_p, got_r, expected in zip(by_pipes, by_recipe, samples):
            assert_same(got_p, expected)
            assert_same(got_r, expected)

    def test_fields_with_a_dot_as_the_webdataset_pipe_yields_them(self, tmp_path: Path) -> None:
        """Samples read with pipekit (``".jpg"`` keys) can be written again: the copy reads back the same."""
        src = make_samples(3)
        with ShardWriter(str(tmp_path / "a-%d.tar"), verbose=0) as sink:
            for s in src:
                sink.write(s)
        raw = IterableWrapper(sink.shards).open_files_by_fsspec(mode="rb").load_from_tar().webdataset()
        with ShardWriter(str(tmp_path / "b-%d.tar"), verbose=0) as copy:
            for s in raw:  # values are streams, keys start with the shard's path
                copy.write({**s, "__key__": s["__key__"].rsplit("/", 1)[1]})
        assert [m.name for m in members(copy.shards[0])] == [m.name for m in members(sink.shards[0])]
        for got, expected in zip(read_with_pipes(copy.shards), src):
            assert_same(short(got), expected)

    def test_tar_layout_is_webdatasets(self, tmp_path: Path) -> None:
        path = tmp_path / "s-0.tar"
        with ShardWriter(str(tmp_path / "s-%d.tar"), verbose=0, mtime=1234) as sink:
            sink.write({"__key__": "dir/k1", "txt": "x", "cls": 1, "json": [1]})
        infos = members(path)
        assert [m.name for m in infos] == ["dir/k1.cls", "dir/k1.json", "dir/k1.txt"]  # sorted fields
        for m in infos:
            assert (m.uname, m.gname, m.mode, m.mtime, m.type) == ("bigdata", "bigdata", 0o444, 1234, tarfile.REGTYPE)
        with open(path, "rb") as f:
            assert f.read(512)[257:263] == b"ustar\x00"  # POSIX ustar headers

    def test_options_reach_the_tar_writer(self, tmp_path: Path) -> None:
        with ShardWriter(str(tmp_path / "s-%d.tar"), verbose=0, user="u", group="g", mode=0o640) as sink:
            sink.write({"__key__": "k", "txt": "x"})
        (info,) = members(tmp_path / "s-0.tar")
        assert (info.uname, info.gname, info.mode) == ("u", "g", 0o640)
        assert abs(info.mtime - time.time()) < 60  # default: the time of writing

    def test_gz_pattern_writes_gzipped_shards(self, tmp_path: Path) -> None:
        with ShardWriter(str(tmp_path / "s-%d.tar.gz"), verbose=0) as sink:
            for s in make_samples(2):
                sink.write(s)
        data = (tmp_path / "s-0.tar.gz").read_bytes()
        assert data[:2] == b"\x1f\x8b"
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            assert len(tar.getmembers()) == 2 * 7

    def test_memory_filesystem(self) -> None:
        fs = fsspec.filesystem("memory")
        with ShardWriter("memory://shard-writer-test/s-%02d.tar", maxcount=2, verbose=0) as sink:
            for s in make_samples(3):
                sink.write(s)
        assert sorted(p.rsplit("/", 1)[1] for p in fs.ls("/shard-writer-test", detail=False)) == [
            "s-00.tar", "s-01.tar"]
        got = read_with_pipes(sink.shards)
        for g, e in zip(got, make_samples(3)):
            assert_same(short(g), e)
        fs.rm("/shard-writer-test", recursive=True)

    @pytest.mark.s3
    def test_s3(self, s3_server, s3_bucket: str) -> None:
        options = s3_server.storage_options
        samples = make_samples(7)
        with ShardWriter(f"s3://{s3_bucket}/train/shard-%06d.tar", maxcount=3, verbose=0,
                         storage_options=options) as sink:
            for s in samples:
                sink.write(s)
        fs = s3_server.fs()
        fs.invalidate_cache()
        # only the finished shards under their names: no temporary object is left behind
        assert sorted(fs.ls(f"{s3_bucket}/train", detail=False)) == [
            f"{s3_bucket}/train/shard-00000{i}.tar" for i in range(3)]
        recipe = datasets.WebDataset(f"s3://{s3_bucket}/train/shard-{{000000..000002}}.tar", train=False,
                                     batch_size=None, storage_options=options)
        got = [short(s) for s in recipe]
        assert len(got) == 7
        for g, e in zip(got, samples):
            assert_same(g, e)
        for g, e in zip(read_with_pipes(sink.shards, **options), samples):
            assert_same(short(g), e)


class TestShardBoundaries:
    def test_maxcount(self, tmp_path: Path) -> None:
        with ShardWriter(str(tmp_path / "s-%d.tar"), maxcount=3, verbose=0) as sink:
            for i in range(7):
                sink.write({"__key__": f"k{i}", "cls": i})
        counts = [len(members(p)) for p in sink.shards]
        assert counts == [3, 3, 1]
        assert sink.total == 7

    def test_maxsize_counts_member_bytes_and_closes_once_reached(self, tmp_path: Path) -> None:
        """As webdataset: a shard ends once its members' contents reach maxsize (it may pass it by one sample)."""
        with ShardWriter(str(tmp_path / "s-%d.tar"), maxsize=2500, verbose=0) as sink:
            for i in range(7):
                sink.write({"__key__": f"k{i}", "bin": bytes(1000)})
        assert [len(members(p)) for p in sink.shards] == [3, 3, 1]

    def test_a_full_shard_is_published_before_the_next_sample(self, tmp_path: Path) -> None:
        sink = ShardWriter(str(tmp_path / "s-%d.tar"), maxcount=2, verbose=0)
        sink.write({"__key__": "a", "cls": 1})
        assert listing(tmp_path)[0].startswith(".s-0.tar.tmp-")  # written under a hidden temporary name
        sink.write({"__key__": "b", "cls": 2})
        assert listing(tmp_path) == ["s-0.tar"]  # full: moved into place now, not at the next write
        sink.close()
        assert listing(tmp_path) == ["s-0.tar"]

    def test_start_shard_post_and_verbose(self, tmp_path: Path, capsys) -> None:
        seen = []

        def post(name: str) -> None:
            seen.append((name, os.path.exists(name)))

        with ShardWriter(str(tmp_path / "s-%03d.tar"), maxcount=2, post=post, start_shard=5) as sink:
            for i in range(3):
                sink.write({"__key__": f"k{i}", "cls": i})
        assert seen == [(str(tmp_path / "s-005.tar"), True), (str(tmp_path / "s-006.tar"), True)]
        out, err = capsys.readouterr()
        assert out == ""
        assert err.splitlines() == [f"# writing {tmp_path / 's-005.tar'} 0 0.0 GB 0",
                                    f"# writing {tmp_path / 's-006.tar'} 2 0.0 GB 2"]

    def test_no_sample_writes_one_empty_shard_as_webdataset(self, tmp_path: Path) -> None:
        with ShardWriter(str(tmp_path / "s-%d.tar"), verbose=0) as sink:
            pass
        assert listing(tmp_path) == ["s-0.tar"] and members(tmp_path / "s-0.tar") == []
        assert sink.shards == [str(tmp_path / "s-0.tar")]

    def test_opener(self, tmp_path: Path) -> None:
        opened: list[Any] = []

        def opener(name: str):
            f = open(name + ".via-opener", "wb")  # noqa: SIM115 (the writer closes it)
            opened.append(f)
            return f

        with ShardWriter(str(tmp_path / "s-%d.tar"), maxcount=1, opener=opener, verbose=0) as sink:
            sink.write({"__key__": "a", "cls": 1})
            sink.write({"__key__": "b", "cls": 2})
        assert listing(tmp_path) == ["s-0.tar.via-opener", "s-1.tar.via-opener"]
        assert all(f.closed for f in opened)
        assert [m.name for m in members(tmp_path / "s-1.tar.via-opener")] == ["b.cls"]

    def test_argument_checks(self, tmp_path: Path) -> None:
        with pytest.raises(ValueError, match="%d-style field"):
            ShardWriter(str(tmp_path / "shards.tar"))
        with pytest.raises(ValueError, match="%d-style field"):
            ShardWriter(str(tmp_path / "s-%s-%d.tar"))
        with pytest.raises(ValueError, match="maxcount"):
            ShardWriter(str(tmp_path / "s-%d.tar"), maxcount=0)
        with pytest.raises(ValueError, match="maxsize"):
            ShardWriter(str(tmp_path / "s-%d.tar"), maxsize=0)
        with pytest.raises(ValueError, match="start_shard"):
            ShardWriter(str(tmp_path / "s-%d.tar"), start_shard=-1)
        with pytest.raises(TypeError, match="unexpected arguments \\['compression'\\]"):
            ShardWriter(str(tmp_path / "s-%d.tar"), compression="gz")
        with pytest.raises(TypeError, match="encoder must be"):
            ShardWriter(str(tmp_path / "s-%d.tar"), encoder=3)
        assert listing(tmp_path) == []  # nothing is opened before the first sample

    def test_pathlike_pattern(self, tmp_path: Path) -> None:
        with ShardWriter(tmp_path / "s-%d.tar", verbose=0) as sink:
            sink.write({"__key__": "k", "cls": 0})
        assert listing(tmp_path) == ["s-0.tar"]


class TestAtomicity:
    def test_exception_in_the_block_discards_the_current_shard_only(self, tmp_path: Path) -> None:
        sink = ShardWriter(str(tmp_path / "s-%d.tar"), maxcount=2, verbose=0)

        def write_then_fail() -> None:
            with sink:
                for i in range(3):
                    sink.write({"__key__": f"k{i}", "cls": i})
                raise RuntimeError("boom")

        with pytest.raises(RuntimeError, match="boom"):
            write_then_fail()
        assert listing(tmp_path) == ["s-0.tar"]  # no s-1.tar, and no temporary file left
        assert [m.name for m in members(tmp_path / "s-0.tar")] == ["k0.cls", "k1.cls"]
        with pytest.raises(ValueError, match="closed"):
            sink.write({"__key__": "k9", "cls": 9})

    def test_a_sample_that_fails_to_encode_leaves_the_shard_intact(self, tmp_path: Path) -> None:
        with ShardWriter(str(tmp_path / "s-%d.tar"), verbose=0) as sink:
            sink.write({"__key__": "a", "cls": 1})
            with pytest.raises(EncodeError, match=r"cannot encode 'b\.png' in ShardWriter"):
                sink.write({"__key__": "b", "cls": 2, "png": np.zeros((2, 2), dtype=np.int64)})
            sink.write({"__key__": "c", "cls": 3})
        assert [m.name for m in members(tmp_path / "s-0.tar")] == ["a.cls", "c.cls"]
        assert sink.total == 2

    def test_tar_writer_to_a_path_is_atomic(self, tmp_path: Path) -> None:
        target = tmp_path / "one.tar"
        writer = TarWriter(str(target))
        writer.write({"__key__": "k", "bin": bytes(50_000)})
        (tmp,) = listing(tmp_path)
        assert tmp.startswith(".one.tar.tmp-") and not target.exists()
        writer.close()
        assert listing(tmp_path) == ["one.tar"]
        assert members(target)[0].size == 50_000

    def test_tar_writer_abort_and_exception(self, tmp_path: Path) -> None:
        writer = TarWriter(str(tmp_path / "a.tar"))
        writer.write({"__key__": "k", "cls": 1})
        writer.abort()

        def write_then_fail() -> None:
            with TarWriter(str(tmp_path / "b.tar")) as w:
                w.write({"__key__": "k", "cls": 1})
                raise ValueError("boom")

        with pytest.raises(ValueError, match="boom"):
            write_then_fail()
        assert listing(tmp_path) == []

    def test_unwritable_target(self, tmp_path: Path) -> None:
        blocker = tmp_path / "file"
        blocker.write_text("not a folder")
        sink = ShardWriter(str(blocker / "s-%d.tar"), verbose=0)
        with pytest.raises(ReadError, match=r"cannot write '.*/file/s-0\.tar' in ShardWriter: FileExistsError"):
            sink.write({"__key__": "k", "cls": 1})


class FailingStream(io.BytesIO):
    """A file that fails once ``limit`` bytes were written, as a full disk does."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def write(self, data: Any) -> int:
        if self.tell() + len(data) > self.limit:
            raise OSError(28, "No space left on device")
        return super().write(data)


class TestWriteFailures:
    def test_a_failed_write_ends_the_shard_without_publishing_it(self, tmp_path: Path) -> None:
        published: list[str] = []
        streams: list[FailingStream] = []

        def opener(name: str) -> FailingStream:
            streams.append(FailingStream(limit=30_000))
            return streams[-1]

        sink = ShardWriter(str(tmp_path / "s-%d.tar"), opener=opener, post=published.append, verbose=0)
        sink.write({"__key__": "a", "bin": bytes(5_000)})
        with pytest.raises(ReadError, match=r"cannot write .* in ShardWriter: OSError: \[Errno 28\]"):
            sink.write({"__key__": "b", "bin": bytes(50_000)})
        assert sink.closed and streams[0].closed
        with pytest.raises(ValueError, match="closed"):
            sink.write({"__key__": "c", "cls": 1})
        sink.close()
        assert published == [] and sink.shards == []

    def test_tar_writer_to_a_path_discards_the_file(self, tmp_path: Path) -> None:
        writer = TarWriter(str(tmp_path / "a.tar"))
        writer.write({"__key__": "a", "cls": 1})
        writer.stream.close()  # the file goes away under the writer, as on a lost connection
        with pytest.raises(ReadError, match=r"cannot write '.*a\.tar' in TarWriter: ValueError"):
            writer.write({"__key__": "b", "bin": bytes(50_000)})
        assert writer.closed and listing(tmp_path) == []


CRASH_SCRIPT = r"""
import json, sys, time
import numpy as np
from pipekit.pipes import ShardWriter

pattern, options, pause = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] == "pause"
with ShardWriter(pattern, maxcount=4, verbose=0, storage_options=options) as sink:
    for i in range(100000):
        sink.write({"__key__": f"k{i:06d}", "npy": np.full(30000, i % 251, dtype=np.uint8), "cls": i})
        print(i + 1, flush=True)
        if pause and i + 1 == 6:  # shard 0 is finished, shard 1 holds two samples
            time.sleep(300)
"""


def run_and_kill(pattern: str, options: dict[str, Any], pause: bool, after: int) -> None:
    """Run CRASH_SCRIPT, SIGKILL it once it reported ``after`` samples written."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", CRASH_SCRIPT, pattern, json.dumps(options),
                             "pause" if pause else "busy"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        written = 0
        deadline = time.monotonic() + 120
        while written < after:
            line = proc.stdout.readline()  # type: ignore[union-attr]
            if not line:
                raise AssertionError(f"the writer exited early: {proc.wait()} {proc.stderr.read()}")  # type: ignore[union-attr]
            written = int(line)
            assert time.monotonic() < deadline
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=30)
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]
    assert proc.returncode == -signal.SIGKILL


def check_finished_shards(paths: list[str], **options: Any) -> None:
    """Every shard under a final name is complete: 4 samples with the right contents, in order."""
    assert paths, "no shard was finished before the kill"
    samples = read_with_pipes(paths, **options)
    assert len(samples) == 4 * len(paths)
    for i, s in enumerate(samples):
        assert s["__key__"].endswith(f"/k{i:06d}")
        assert s[".cls"] == i and s[".npy"].shape == (30000,) and (s[".npy"] == i % 251).all()


class TestCrash:
    def test_killed_mid_shard_leaves_no_partial_file_under_a_final_name(self, tmp_path: Path) -> None:
        run_and_kill(str(tmp_path / "shard-%04d.tar"), {}, pause=True, after=6)
        names = listing(tmp_path)
        assert [n for n in names if not n.startswith(".")] == ["shard-0000.tar"]
        (tmp,) = [n for n in names if n.startswith(".")]
        assert tmp.startswith(".shard-0001.tar.tmp-")
        assert (tmp_path / tmp).stat().st_size > 30000  # the kill really came in the middle of shard 1
        check_finished_shards([str(tmp_path / "shard-0000.tar")])

    def test_killed_while_writing_fast(self, tmp_path: Path) -> None:
        run_and_kill(str(tmp_path / "shard-%04d.tar"), {}, pause=False, after=30)
        finals = [n for n in listing(tmp_path) if not n.startswith(".")]
        assert finals == [f"shard-{i:04d}.tar" for i in range(len(finals))]
        check_finished_shards([str(tmp_path / n) for n in finals])

    @pytest.mark.s3
    def test_killed_mid_shard_on_s3(self, s3_server, s3_bucket: str) -> None:
        options = s3_server.storage_options
        run_and_kill(f"s3://{s3_bucket}/crash/shard-%04d.tar", options, pause=True, after=6)
        fs = s3_server.fs()
        fs.invalidate_cache()
        names = [p.rsplit("/", 1)[1] for p in fs.find(f"{s3_bucket}/crash")]
        assert [n for n in names if not n.startswith(".")] == ["shard-0000.tar"]
        check_finished_shards([f"s3://{s3_bucket}/crash/shard-0000.tar"], **options)


class TestKeysAndFields:
    @pytest.mark.parametrize(("key", "reason"), [
        ("img.001", "has a dot"),
        ("/abs/k", "relative path"),
        ("a/../k", "relative path"),
        ("a//k", "relative path"),
        ("dir/", "relative path"),
        ("", "non-empty str"),
        (7, "non-empty str"),
    ])
    def test_keys_that_would_not_read_back_are_refused(self, key, reason) -> None:
        writer = TarWriter(io.BytesIO())
        with pytest.raises(EncodeError, match=reason):
            writer.write({"__key__": key, "cls": 1})

    def test_hint_for_keys_read_with_pipekit(self) -> None:
        with pytest.raises(EncodeError, match=r"keep the part after it"):
            TarWriter(io.BytesIO()).write({"__key__": "/data/shard-000000.tar/k1", "cls": 1})

    def test_dotted_folders_are_fine(self) -> None:
        buf = io.BytesIO()
        with TarWriter(buf) as w:
            w.write({"__key__": "v1.2/k", "cls": 1})
        got = list(IterableWrapper([("mem.tar", io.BytesIO(buf.getvalue()))]).load_from_tar().webdataset().decode())
        assert [(s["__key__"], s[".cls"]) for s in got] == [("mem.tar/v1.2/k", 1)]

    def test_consecutive_samples_need_distinct_keys(self) -> None:
        w = TarWriter(io.BytesIO())
        w.write({"__key__": "k", "cls": 1})
        with pytest.raises(EncodeError, match="same key"):
            w.write({"__key__": "k", "txt": "x"})

    def test_missing_key_and_non_dict(self) -> None:
        w = TarWriter(io.BytesIO())
        with pytest.raises(ValueError, match="__key__"):
            w.write({"cls": 1})
        with pytest.raises(TypeError, match="must be a dict"):
            w.write([1, 2])

    def test_long_names_need_pax(self) -> None:
        key = "k" * 120
        with pytest.raises(EncodeError, match="PAX_FORMAT"):
            TarWriter(io.BytesIO()).write({"__key__": key, "cls": 1})
        buf = io.BytesIO()
        with TarWriter(buf, format="PAX_FORMAT") as w:
            w.write({"__key__": key, "cls": 1})
        with tarfile.open(fileobj=io.BytesIO(buf.getvalue())) as tar:
            assert tar.getnames() == [key + ".cls"]

    def test_meta_fields(self) -> None:
        for keep, expected in ((False, ["k.cls"]), (True, ["k.__url__", "k.cls"])):
            buf = io.BytesIO()
            with TarWriter(buf, keep_meta=keep) as w:
                w.write({"__key__": "k", "cls": 1, "__url__": "src.tar"})
            with tarfile.open(fileobj=io.BytesIO(buf.getvalue())) as tar:
                assert tar.getnames() == expected

    def test_encoder_false_takes_bytes_only(self) -> None:
        w = TarWriter(io.BytesIO(), encoder=False)
        assert w.write({"__key__": "a", "bin": b"xyz"}) == 3
        with pytest.raises(EncodeError, match="not bytes, after encoding"):
            w.write({"__key__": "b", "cls": 1})

    def test_encoder_dict_adds_to_the_defaults(self) -> None:
        buf = io.BytesIO()
        with TarWriter(buf, encoder={"cls": lambda v: f"label-{v}".encode()}) as w:
            w.write({"__key__": "k", "cls": 1, "json": {"a": 1}})
        with tarfile.open(fileobj=io.BytesIO(buf.getvalue())) as tar:
            assert {m.name: tar.extractfile(m).read() for m in tar} == {"k.cls": b"label-1", "k.json": b'{"a": 1}'}

    def test_encoder_function(self) -> None:
        def encode(sample: dict[str, Any]) -> dict[str, Any]:
            return {"__key__": sample["__key__"], "txt": str(sample["value"] * 2).encode()}

        buf = io.BytesIO()
        with TarWriter(buf, encoder=encode) as w:
            w.write({"__key__": "k", "value": 21})
        with tarfile.open(fileobj=io.BytesIO(buf.getvalue())) as tar:
            assert tar.extractfile("k.txt").read() == b"42"

    def test_stream_target_is_left_open(self) -> None:
        buf = io.BytesIO()
        with TarWriter(buf) as w:
            w.write({"__key__": "k", "cls": 1})
        assert not buf.closed and len(buf.getvalue()) % 512 == 0
        with pytest.raises(ValueError, match="closed writer"):
            w.write({"__key__": "j", "cls": 1})

    def test_bad_arguments(self) -> None:
        with pytest.raises(TypeError, match="binary stream"):
            TarWriter(3)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="tar format"):
            TarWriter(io.BytesIO(), format="ZIP_FORMAT")
        with pytest.raises(ValueError, match="compress"):
            TarWriter(io.BytesIO(), compress="zstd")


def write_pipe(tmp: Path, n: int, **kwargs: Any) -> ShardSaver:
    samples = IterableWrapper([{"__key__": f"k{i:03d}", "cls": i, "npy": np.full(3, i)} for i in range(n)])
    return samples.write_shards(str(tmp / "p-%03d.tar"), mtime=0, **kwargs)


def digests(folder: Path) -> dict[str, str]:
    return {n: hashlib.sha256((folder / n).read_bytes()).hexdigest() for n in listing(folder)}


class TestWriteShardsPipe:
    def test_yields_each_shard_once_it_is_in_place(self, tmp_path: Path) -> None:
        it = iter(write_pipe(tmp_path, 5, maxcount=2))
        first = next(it)
        assert first == str(tmp_path / "p-000.tar") and listing(tmp_path) == ["p-000.tar"]
        assert list(it) == [str(tmp_path / "p-001.tar"), str(tmp_path / "p-002.tar")]
        got = read_with_pipes([str(tmp_path / f"p-00{i}.tar") for i in range(3)])
        assert [s[".cls"] for s in got] == [0, 1, 2, 3, 4]

    def test_same_files_as_shard_writer(self, tmp_path: Path) -> None:
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        list(write_pipe(tmp_path / "a", 5, maxcount=2))
        with ShardWriter(str(tmp_path / "b" / "p-%03d.tar"), maxcount=2, mtime=0, verbose=0) as sink:
            for i in range(5):
                sink.write({"__key__": f"k{i:03d}", "cls": i, "npy": np.full(3, i)})
        assert digests(tmp_path / "a") == digests(tmp_path / "b")

    def test_empty_epoch_writes_one_empty_shard(self, tmp_path: Path) -> None:
        assert list(write_pipe(tmp_path, 0)) == [str(tmp_path / "p-000.tar")]
        assert members(tmp_path / "p-000.tar") == []

    @pytest.mark.parametrize("n", [0, 1, 2, 3])
    def test_resumes(self, tmp_path: Path, n: int) -> None:
        (tmp_path / "ref").mkdir()
        (tmp_path / "run").mkdir()
        list(write_pipe(tmp_path / "ref", 7, maxcount=2))  # 4 shards
        assert_resumes(lambda: write_pipe(tmp_path / "run", 7, maxcount=2), n)
        assert digests(tmp_path / "run") == digests(tmp_path / "ref")

    def test_resume_with_the_loader(self, tmp_path: Path) -> None:
        loader = pipekit.DataLoader(write_pipe(tmp_path, 7, maxcount=2), batch_size=None)
        it = iter(loader)
        head = [next(it)]
        state = loader.state_dict()
        del it
        resumed = pipekit.DataLoader(write_pipe(tmp_path, 7, maxcount=2), batch_size=None)
        resumed.load_state_dict(state)
        assert head + list(resumed) == [str(tmp_path / f"p-00{i}.tar") for i in range(4)]
        got = read_with_pipes([str(tmp_path / f"p-00{i}.tar") for i in range(4)])
        assert [s[".cls"] for s in got] == list(range(7))

    def test_on_error_skip(self, tmp_path: Path) -> None:
        samples = IterableWrapper([{"__key__": "a", "cls": 1}, {"__key__": "b", "png": np.zeros((2, 2), np.int64)},
                                   {"__key__": "c", "cls": 3}])
        pipe = samples.write_shards(str(tmp_path / "s-%d.tar"), on_error="skip")
        assert list(pipe) == [str(tmp_path / "s-0.tar")]
        assert [m.name for m in members(tmp_path / "s-0.tar")] == ["a.cls", "c.cls"]
        assert pipe.skip_log.count == 1 and pipe.skip_log.skipped[0].url == "b.png"
        with pytest.raises(EncodeError):
            list(samples.write_shards(str(tmp_path / "t-%d.tar")))
        assert not any(n.startswith("t-") or n.startswith(".t-") for n in listing(tmp_path))

    def test_stopping_early_leaves_no_temporary_file(self, tmp_path: Path) -> None:
        it = iter(write_pipe(tmp_path, 7, maxcount=2))
        next(it)
        del it
        assert listing(tmp_path) == ["p-000.tar"]

    def test_pickles_and_checks_arguments_early(self, tmp_path: Path) -> None:
        pipe = write_pipe(tmp_path, 3)
        assert list(pickle.loads(pickle.dumps(pipe))) == [str(tmp_path / "p-000.tar")]
        with pytest.raises(ValueError, match="%d-style field"):
            IterableWrapper([]).write_shards(str(tmp_path / "x.tar"))
        with pytest.raises(TypeError, match="unexpected arguments"):
            IterableWrapper([]).write_shards(str(tmp_path / "x-%d.tar"), post=print)
