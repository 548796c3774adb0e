"""Tests of load_tar_samples: the samples of load_from_tar().webdataset() with the members read, in one pipe."""

from __future__ import annotations

import gzip
import os
import pickle
import tarfile
from pathlib import Path

import pytest

from pipekit import _fast
from pipekit.errors import ArchiveError, ParseError
from pipekit.pipes import IterableWrapper, TarSampleLoader
from pipekit.testing import assert_resumes

from .conftest import archive_bytes


def samples(n: int, start: int = 0, long: bool = False) -> list[tuple[str, bytes]]:
    """``n`` WebDataset samples (.jpg, .cls and, every third one, .seg.png); long file names when ``long``."""
    out = []
    for i in range(start, start + n):
        key = ("k" * 120 if long else "") + f"{i:05d}"
        out += [(f"{key}.jpg", bytes([i % 256]) * (300 + 37 * i)), (f"{key}.cls", str(i % 7).encode())]
        if i % 3 == 0:
            out.append((f"{key}.seg.png", b"png" * i))
    return out


def reference(urls: list[str], **kwargs) -> list[dict]:
    """What load_from_tar().webdataset() gives, each member stream read into bytes."""
    pipe = IterableWrapper(urls).open_files_by_fsspec(mode="rb").load_from_tar(**kwargs).webdataset()
    out = []
    for sample in pipe:
        out.append({k: (v if k.startswith("__") else v.read()) for k, v in sample.items()})
    return out


def ours(urls: list[str], **kwargs) -> TarSampleLoader:
    return IterableWrapper(urls).open_files_by_fsspec(mode="rb").load_tar_samples(**kwargs)


@pytest.fixture
def shards(tmp_path: Path) -> list[str]:
    """Four shards: ustar, GNU long names, pax with directories, and a gzip-compressed one."""
    files = {
        "a.tar": archive_bytes(samples(12)),
        "b.tar": archive_bytes(samples(5, 12, long=True), tarfile.GNU_FORMAT),
        "c.tar": archive_bytes(samples(6, 17), tarfile.PAX_FORMAT, dirs=("d/",)),
        "d.tar.gz": gzip.compress(archive_bytes(samples(7, 23))),
    }
    paths = []
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        paths.append(str(tmp_path / name))
    return paths


class TestSamples:
    def test_same_samples_as_load_from_tar_and_webdataset(self, shards: list[str]) -> None:
        got = list(ours(shards))
        assert got == reference(shards)
        assert len(got) == 30
        assert all(isinstance(v, bytes) for s in got for k, v in s.items() if k != "__key__")
        assert got[0] == {"__key__": f"{shards[0]}/00000", ".jpg": b"\x00" * 300, ".cls": b"0", ".seg.png": b""}

    def test_plain_headers_off_gives_the_same(self, shards: list[str], monkeypatch: pytest.MonkeyPatch) -> None:

        fast = list(ours(shards))
        monkeypatch.setitem(_fast.state, "tar_headers", False)
        assert list(ours(shards)) == fast

    def test_a_member_without_extension_is_counted_not_lost_silently(self, tmp_path: Path) -> None:
        path = tmp_path / "s.tar"
        path.write_bytes(archive_bytes([*samples(2), ("README", b"x"), *samples(1, 2)]))
        pipe = ours([str(path)])
        assert [s["__key__"].rsplit("/", 1)[1] for s in pipe] == ["00000", "00001", "00002"]
        assert pipe.skip_log.count == 1
        assert pipe.skip_log.skipped[0].url == f"{path}/README"
        assert "no extension" in pipe.skip_log.skipped[0].reason

    def test_a_repeated_extension_raises_naming_the_member(self, tmp_path: Path) -> None:
        path = tmp_path / "s.tar"
        path.write_bytes(archive_bytes([("0001.jpg", b"a"), ("0001.jpg", b"b")]))
        with pytest.raises(ParseError, match=r"already has a '\.jpg' field") as info:
            list(ours([str(path)]))
        assert info.value.url == f"{path}/0001.jpg"

    def test_a_truncated_shard_raises_or_is_counted(self, tmp_path: Path) -> None:
        data = archive_bytes(samples(6))
        path = tmp_path / "cut.tar"
        path.write_bytes(data[: len(data) // 2])
        with pytest.raises(ArchiveError, match="truncated") as info:
            list(ours([str(path)]))
        assert info.value.url == str(path) and info.value.stage == "load_from_tar"
        skipping = ours([str(path)], on_error="skip")
        assert list(skipping) == reference([str(path)], on_error="skip")
        assert skipping.skip_log.count == 1

    def test_pickles_and_has_no_open_streams(self, shards: list[str]) -> None:
        pipe = ours(shards)
        it = iter(pipe)
        next(it)
        again = pickle.loads(pickle.dumps(pipe))
        assert isinstance(again, TarSampleLoader)


class TestResume:
    @pytest.mark.parametrize("n", [0, 1, 5, 11, 12, 13, 16, 17, 18, 22, 23, 29, 30])
    def test_resume_at_every_kind_of_boundary(self, shards: list[str], n: int) -> None:
        """Mid-shard, at the first and last sample of a shard, in the compressed one, at the end."""
        assert_resumes(lambda: ours(shards), n)

    def test_resume_with_the_tarfile_path(self, shards: list[str], monkeypatch: pytest.MonkeyPatch) -> None:

        monkeypatch.setitem(_fast.state, "tar_headers", False)
        for n in (3, 12, 14):
            assert_resumes(lambda: ours(shards), n)

    def test_checkpoint_is_the_archive_and_its_entries_at_a_sample_boundary(self, shards: list[str]) -> None:
        pipe = ours(shards)
        it = iter(pipe)
        for _ in range(2):
            next(it)
        # samples 0 and 1 of a.tar hold 3 + 2 members; the member looked at ahead (sample 2's first) is not counted
        state = pipe.state_dict()
        assert (state["url"], state["entries"]) == (shards[0], 5)
        size = os.path.getsize(shards[0])
        assert state["stamp"] == f"{size}:{os.stat(shards[0]).st_mtime_ns}"  # what the archive was: size and mtime
        for _ in range(10):
            next(it)  # the last sample of a.tar: the look-ahead member is b.tar's first
        state = pipe.state_dict()
        assert (state["url"], state["entries"]) == (shards[1], 0)

    def test_a_replaced_archive_is_refused_on_resume(self, shards: list[str], tmp_path) -> None:
        import shutil

        (tmp_path / "copies").mkdir()
        copies = [shutil.copy(s, tmp_path / "copies" / os.path.basename(s)) for s in shards]
        pipe = ours([str(c) for c in copies])
        it = iter(pipe)
        next(it)
        state = pipe.state_dict()
        shutil.copy(shards[1], copies[0])  # the archive being read, replaced by another
        resumed = ours([str(c) for c in copies])
        resumed.load_state_dict(state)
        with pytest.raises(ArchiveError, match="changed since the checkpoint"):
            list(resumed)
