"""Tests of load_from_tar, load_from_zip and decompress on real archives (local, memory:// and S3)."""

from __future__ import annotations

import bz2
import gc
import gzip
import io
import lzma
import os
import pickle
import random
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import fsspec
import pytest
from torch.utils.data.datapipes.utils.common import StreamWrapper

from pipekit import _fast
from pipekit.errors import ArchiveError
from pipekit.pipes import (
    CompressionType,
    Decompressor,
    IterableWrapper,
    TarArchiveLoader,
)
from pipekit.pipes._archives import ArchiveLoader
from pipekit.pipes._resume import restore_pipeline, snapshot_pipeline
from pipekit.pipes.base import StreamWrapper as PipekitStream
from pipekit.testing import assert_resumes, resume_after

from .conftest import archive_bytes

MEMBERS = [("0001.jpg", b"jpeg-1" * 100), ("0001.cls", b"3"), ("dir/0002.jpg", b"jpeg-2" * 50), ("0002.cls", b"5")]


def write_tar(path: Path, members: list[tuple[str, bytes]], mode: str = "w", dirs: tuple[str, ...] = ()) -> Path:
    """A tar archive with exactly these member names (unsafe ones included)."""
    with tarfile.open(path, mode) as tar:
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def write_zip(path: Path, members: list[tuple[str, bytes]], dirs: tuple[str, ...] = ()) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for d in dirs:
            zf.writestr(zipfile.ZipInfo(d), b"")
        for name, data in members:
            zf.writestr(zipfile.ZipInfo(name), data)
    return path


class NonSeekable(io.RawIOBase):
    """A read-only stream without random access, counting the bytes read from it."""

    def __init__(self, data: bytes) -> None:
        self._buf = io.BytesIO(data)
        self.bytes_read = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readinto(self, b) -> int:
        n = self._buf.readinto(b)
        self.bytes_read += n
        return n


def as_source(data: bytes, source: str) -> io.IOBase:
    """``data`` as a file (``"seekable"``) or as a stream that cannot seek (``"non-seekable"``)."""
    return io.BytesIO(data) if source == "seekable" else NonSeekable(data)


def read_item(item):
    url, stream = item
    return url, stream.read()


def keep_all(item) -> bool:
    return True


@pytest.fixture
def shards(tmp_path: Path) -> list[str]:
    """Three small tar shards (the middle one with a directory entry) of two samples each."""
    paths = []
    for i in range(3):
        members = [(f"{k:04d}.{ext}", f"{i}-{k}-{ext}".encode()) for k in range(2) for ext in ("jpg", "cls")]
        dirs = ("somedir/",) if i == 1 else ()
        paths.append(str(write_tar(tmp_path / f"shard-{i}.tar", members, dirs=dirs)))
    return paths


def tar_chain(paths, **kwargs):
    return IterableWrapper(paths).open_files_by_fsspec(mode="rb", **kwargs).load_from_tar().map(read_item)


class TestTarArchiveLoader:
    def test_members_streamed_with_content(self, tmp_path: Path) -> None:
        path = str(write_tar(tmp_path / "a.tar", MEMBERS, dirs=("dir/",)))
        got = list(tar_chain([path]))
        assert got == [(f"{path}/{name}", data) for name, data in MEMBERS]

    def test_member_streams_and_archive_closing(self, tmp_path: Path) -> None:
        path = str(write_tar(tmp_path / "a.tar", MEMBERS))
        opened = IterableWrapper([path]).open_files_by_fsspec(mode="rb")
        items = list(opened.load_from_tar())
        archive = items[0][1].parent_stream
        assert all(isinstance(s, StreamWrapper) and s.name == u for u, s in items)
        # random access: read in reverse order after the loader has finished
        assert [s.read() for _, s in reversed(items)] == [d for _, d in reversed(MEMBERS)]
        assert not archive.closed  # members still open
        for _, s in items:
            s.close()
        assert archive.closed  # closed with its last member

    def test_dropped_members_close_the_archive(self, tmp_path: Path) -> None:
        path = str(write_tar(tmp_path / "a.tar", MEMBERS))
        archives = []
        for _, stream in IterableWrapper([path]).open_files_by_fsspec(mode="rb").load_from_tar():
            archives.append(stream.parent_stream.file_obj)
            stream.read()
        del stream
        gc.collect()
        assert archives[0].closed

    def test_dot_slash_names_normalised(self, tmp_path: Path) -> None:
        path = str(write_tar(tmp_path / "a.tar", [("./x.txt", b"x"), ("d//y.txt", b"y")]))
        assert [u for u, _ in tar_chain([path])] == [f"{path}/x.txt", f"{path}/d/y.txt"]

    @pytest.mark.parametrize(("mode", "ext"), [("w:gz", "tar.gz"), ("w:bz2", "tar.bz2"), ("w:xz", "tar.xz")])
    def test_compressed(self, tmp_path: Path, mode: str, ext: str) -> None:
        path = str(write_tar(tmp_path / f"a.{ext}", MEMBERS, mode=mode))
        assert list(tar_chain([path])) == [(f"{path}/{n}", d) for n, d in MEMBERS]

    def test_non_seekable_stream_mode(self, tmp_path: Path) -> None:
        data = write_tar(tmp_path / "a.tar", MEMBERS).read_bytes()
        got = [(u, s.read()) for u, s in IterableWrapper([("a.tar", NonSeekable(data))]).load_from_tar()]
        assert got == [(f"a.tar/{n}", d) for n, d in MEMBERS]

    def test_member_urls_agree_with_normpath(self) -> None:
        import posixpath

        from pipekit.pipes._archives import TarArchiveLoader

        loader = TarArchiveLoader(IterableWrapper([]))
        names = ["x.jpg", "a.b.c", "d/x.jpg", "./x", "d//y", "d/./y", "d/", "x\\y.jpg", "...", ".hidden", "a..b"]
        for name in names:
            expected = "s.tar/" + posixpath.normpath(name.replace("\\", "/")).lstrip("/")
            assert loader._member_url("s.tar", name) == expected, name

    def test_unsafe_name_rules(self) -> None:
        from pipekit.pipes._archives import _unsafe_name

        assert _unsafe_name("d\\..\\..\\evil.txt") == "has a '..' path component"
        assert _unsafe_name("c:\\evil.txt") == _unsafe_name("/evil") == "has an absolute path"
        assert _unsafe_name("./") == "has an empty name"
        assert [_unsafe_name(n) for n in ("a..b", "x/..y", "C", "1:y")] == [None] * 4

    @pytest.mark.parametrize(
        ("bad", "why"),
        [
            ("../evil.txt", r"'\.\.' path component"),
            ("/etc/evil.txt", "absolute path"),
            ("C:evil.txt", "absolute path"),
        ],
    )
    def test_unsafe_names_refused(self, tmp_path: Path, bad: str, why: str) -> None:
        path = str(write_tar(tmp_path / "a.tar", [("ok.txt", b"ok"), (bad, b"evil"), ("ok2.txt", b"ok2")]))
        it = iter(tar_chain([path]))
        assert next(it) == (f"{path}/ok.txt", b"ok")
        with pytest.raises(ArchiveError, match=why) as info:
            next(it)
        assert info.value.url == path
        assert info.value.stage == "load_from_tar"
        assert bad in str(info.value)

    def test_unsafe_names_skipped_with_log(self, tmp_path: Path) -> None:
        path = str(write_tar(tmp_path / "a.tar", [("a/../../x", b"1"), ("ok.txt", b"ok"), ("/abs", b"2")]))
        loader = IterableWrapper([path]).open_files_by_fsspec(mode="rb").load_from_tar(on_error="skip")
        assert [read_item(i) for i in loader] == [(f"{path}/ok.txt", b"ok")]
        assert loader.skip_log.count == 2
        assert [s.url for s in loader.skip_log.skipped] == [path, path]
        assert "a/../../x" in loader.skip_log.skipped[0].reason

    def test_links_not_loaded_but_recorded(self, tmp_path: Path) -> None:
        path = tmp_path / "a.tar"
        with tarfile.open(path, "w") as tar:
            info = tarfile.TarInfo("real.txt")
            info.size = 4
            tar.addfile(info, io.BytesIO(b"real"))
            link = tarfile.TarInfo("link.txt")
            link.type = tarfile.SYMTYPE
            link.linkname = "real.txt"
            tar.addfile(link)
        loader = IterableWrapper([str(path)]).open_files_by_fsspec(mode="rb").load_from_tar()
        assert [read_item(i) for i in loader] == [(f"{path}/real.txt", b"real")]
        assert loader.skip_log.count == 1
        assert "link.txt" in loader.skip_log.skipped[0].reason

    def test_corrupt_archive_names_url(self, tmp_path: Path) -> None:
        bad = tmp_path / "bad.tar"
        bad.write_bytes(os.urandom(3000))
        with pytest.raises(ArchiveError, match=r"bad\.tar.*load_from_tar") as info:
            list(tar_chain([str(bad)]))
        assert info.value.url == str(bad)

    @pytest.mark.parametrize("cut", [700, 1600])  # inside member data; inside the second header
    def test_truncated_archive(self, tmp_path: Path, cut: int) -> None:
        data = write_tar(tmp_path / "full.tar", [("a.bin", b"A" * 700), ("b.bin", b"B")]).read_bytes()
        (tmp_path / "cut.tar").write_bytes(data[:cut])
        with pytest.raises(ArchiveError, match=r"cut\.tar.*load_from_tar: truncated"):
            list(tar_chain([str(tmp_path / "cut.tar")]))

    def test_corrupt_archive_skipped(self, tmp_path: Path, shards: list[str]) -> None:
        bad = tmp_path / "bad.tar"
        bad.write_bytes(b"not a tar at all" * 100)
        loader = IterableWrapper([str(bad), shards[0]]).open_files_by_fsspec(mode="rb").load_from_tar(on_error="skip")
        assert [u for u, _ in loader] == [f"{shards[0]}/{n}" for n in ("0000.jpg", "0000.cls", "0001.jpg", "0001.cls")]
        assert loader.skip_log.skipped[0].url == str(bad)

    def test_memory_filesystem(self, tmp_path: Path) -> None:
        data = write_tar(tmp_path / "a.tar", MEMBERS).read_bytes()
        fsspec.filesystem("memory").pipe("/pipekit-tar-test/a.tar", data)
        url = "memory://pipekit-tar-test/a.tar"
        assert list(tar_chain([url])) == [(f"{url}/{n}", d) for n, d in MEMBERS]

    def test_resume_mid_archive(self, shards: list[str]) -> None:
        def make():
            return tar_chain(shards)

        total = len(list(make()))
        assert total == 12
        for n in (0, 1, 2, 4, 5, 7, total - 1, total):
            assert_resumes(make, n)

    def test_resume_state_names_archive_and_position(self, shards: list[str]) -> None:
        pipe = tar_chain(shards)
        it = iter(pipe)
        for _ in range(6):  # all of shard 0, and two members of shard 1 (after its directory entry)
            next(it)
        loader = pipe.datapipe  # map -> load_from_tar
        assert isinstance(loader, TarArchiveLoader)
        state = loader.state_dict()
        assert {k: v for k, v in state.items() if k != "stamp"} == {"url": shards[1], "entries": 3}
        assert state["stamp"].startswith(f"{os.path.getsize(shards[1])}:")  # what the position depends on

    def test_a_mid_archive_stamp_that_told_the_size_alone_resumes(self, shards: list[str]) -> None:
        # HTTP archives were stamped by their size alone before their server's ETag was read: such a checkpoint,
        # taken before that upgrade, resumes where the archive still has that size, and is refused where not.
        size = os.path.getsize(shards[1])
        loader = IterableWrapper(shards).open_files_by_fsspec(mode="rb").load_from_tar()
        loader.load_state_dict({"url": shards[1], "entries": 3, "stamp": f"{size}:None"})
        assert [url for url, _ in loader][:2] == [f"{shards[1]}/0001.jpg", f"{shards[1]}/0001.cls"]
        other = IterableWrapper(shards).open_files_by_fsspec(mode="rb").load_from_tar()
        other.load_state_dict({"url": shards[1], "entries": 3, "stamp": f"{size + 512}:None"})
        with pytest.raises(ArchiveError, match="changed since the checkpoint"):
            list(other)

    def test_loaded_state_is_reported_until_the_loader_starts(self, shards: list[str]) -> None:
        # A checkpoint taken before a restored loader ran again must keep its position.
        loader = IterableWrapper(shards).open_files_by_fsspec(mode="rb").load_from_tar()
        assert isinstance(loader, ArchiveLoader) and loader.datapipe is loader.source_datapipe
        loader.load_state_dict({"url": shards[1], "entries": 3})
        assert loader.state_dict() == {"url": shards[1], "entries": 3}
        assert [url for url, _ in loader][:2] == [f"{shards[1]}/0001.jpg", f"{shards[1]}/0001.cls"]
        assert loader.state_dict() == {"url": None, "entries": 0}
        assert len(list(loader)) == 12  # the next epoch starts over
        with pytest.raises(ValueError, match="not a TarArchiveLoader state"):
            loader.load_state_dict({"url": shards[1]})

    def test_resume_reopens_through_filter(self, shards: list[str]) -> None:
        def make():
            opened = IterableWrapper(shards).open_files_by_fsspec(mode="rb").filter(keep_all)
            return opened.load_from_tar().map(read_item)

        assert_resumes(make, 3)

    def test_resume_without_opener_uses_fsspec(self, shards: list[str]) -> None:
        def make():
            items = [(p, io.BytesIO(Path(p).read_bytes())) for p in shards]  # the URLs are real local paths
            return IterableWrapper(items).load_from_tar().map(read_item)

        head, rest = resume_after(make, 3)
        assert head + rest == list(make())

    def test_resume_fails_clearly_when_archive_cannot_be_reopened(self, shards: list[str]) -> None:
        data = Path(shards[0]).read_bytes()

        def make():
            return IterableWrapper([("nowhere/x.tar", io.BytesIO(data))]).load_from_tar().map(read_item)

        pipe = make()
        it = iter(pipe)
        next(it)
        state = snapshot_pipeline(pipe)
        fresh = make()
        restore_pipeline(fresh, state)
        with pytest.raises(ArchiveError, match=r"nowhere/x\.tar.*load_from_tar.*open it again"):
            list(fresh)

    def test_length_mode_and_input_checks(self, shards: list[str]) -> None:
        assert len(IterableWrapper([]).load_from_tar(length=5)) == 5
        with pytest.raises(TypeError, match="valid length"):
            len(IterableWrapper([]).load_from_tar())
        with pytest.raises(ValueError, match="mode"):
            IterableWrapper([]).load_from_tar(mode="w")
        with pytest.raises(ValueError, match="on_error"):
            IterableWrapper([]).load_from_tar(on_error="warn")
        with pytest.raises(TypeError, match=r"load_from_tar: expected \(url, stream\)"):
            list(IterableWrapper([shards[0]]).load_from_tar())
        with pytest.raises(TypeError, match=r"load_from_tar: .*shard-0\.tar.* is a text stream.*mode=\"rb\""):
            list(IterableWrapper([shards[0]]).open_files_by_fsspec().load_from_tar())

    def test_pickle(self, shards: list[str]) -> None:
        pipe = IterableWrapper(shards).open_files_by_fsspec(mode="rb").load_from_tar(mode="r:", length=12)
        clone = pickle.loads(pickle.dumps(pipe))
        assert clone.mode == "r:"
        assert [read_item(i) for i in clone] == [read_item(i) for i in pipe]

    @pytest.mark.s3
    def test_s3_with_resume(self, s3_server, s3_bucket: str, shards: list[str]) -> None:
        fs = s3_server.fs()
        urls = []
        for p in shards:
            fs.put_file(p, f"{s3_bucket}/shards/{Path(p).name}")
            urls.append(f"s3://{s3_bucket}/shards/{Path(p).name}")
        opts = s3_server.storage_options

        def make():
            return tar_chain(urls, **opts)

        got = list(make())
        assert got[:2] == [(f"{urls[0]}/0000.jpg", b"0-0-jpg"), (f"{urls[0]}/0000.cls", b"0-0-cls")]
        assert len(got) == 12
        assert_resumes(make, 5)


def members_of(n: int) -> list[tuple[str, bytes]]:
    """``n`` small members of varied sizes (some exactly one block, some empty)."""
    return [(f"{i:04d}.{'bin' if i % 3 else 'txt'}", bytes([65 + i % 26]) * ((i * 37) % 700)) for i in range(n)]


def end_of_members(data: bytes) -> int:
    """Where the end-of-archive marker of a well-formed tar begins."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        last = tar.getmembers()[-1]
    return last.offset_data + -(-last.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE


def read_all_or_error(pipe):
    """The (url, bytes) items a pipe yields, read whole, before it ends or fails, and its error.

    A member of a non-seekable archive that is cut short raises when it is read: it is not in the list.
    """
    got = []
    try:
        for url, stream in pipe:
            got.append((url, stream.read()))
    except ArchiveError as exc:
        return got, exc
    return got, None


class TestTruncation:
    """Issue 13.1: a tar cut anywhere either yields every member or says so; never ends silently."""

    def test_four_one_byte_members_cut_at_2048(self, tmp_path: Path) -> None:
        data = write_tar(tmp_path / "a.tar", [(f"{i}.txt", b"x") for i in range(4)]).read_bytes()
        for mode, stream in (("r:*", io.BytesIO(data[:2048])), ("r|*", NonSeekable(data[:2048]))):
            got, err = read_all_or_error(IterableWrapper([("s.tar", stream)]).load_from_tar(mode=mode))
            assert len(got) == 2
            assert err is not None, mode
            assert (err.url, err.stage) == ("s.tar", "load_from_tar")
            assert "truncated" in err.reason and "byte 2048" in err.reason and "2 members yielded" in err.reason

    @pytest.mark.parametrize("source", ["file", "non-seekable"])
    def test_every_block_cut_of_a_150_member_shard(self, tmp_path: Path, source: str) -> None:
        members = members_of(150)
        data = write_tar(tmp_path / "full.tar", members).read_bytes()
        end = end_of_members(data)
        cut_path = tmp_path / "cut.tar"
        complete = 0
        for cut in range(0, len(data) + 1, tarfile.BLOCKSIZE):
            if source == "file":
                cut_path.write_bytes(data[:cut])
                url = str(cut_path)
                pipes = [
                    IterableWrapper([url]).open_files_by_fsspec(mode="rb").load_from_tar(on_error=e)
                    for e in ("raise", "skip")
                ]
            else:
                url = "cut.tar"
                pipes = [
                    IterableWrapper([(url, NonSeekable(data[:cut]))]).load_from_tar(on_error=e)
                    for e in ("raise", "skip")
                ]
            raising, skipping = pipes
            got, err = read_all_or_error(raising)
            assert got == [(f"{url}/{n}", d) for n, d in members[: len(got)]], cut
            kept, skip_err = read_all_or_error(skipping)
            assert kept == got, cut
            if cut >= end + 2 * tarfile.BLOCKSIZE:  # every member and the two zero blocks are there
                assert err is None and skip_err is None and len(got) == 150, cut
                assert skipping.skip_log.count == 0
                complete += 1
                continue
            assert err is not None, f"cut at {cut} ({len(got)} of 150 members) ended silently"
            assert err.stage == "load_from_tar"
            if err.action == "read member":  # stream mode: the member cut short fails when it is read
                assert source == "non-seekable"
                assert err.url == f"{url}/{members[len(got)][0]}" and "truncated" in err.reason
                # under skip it is read before it is yielded: the archive is counted once, no error
                assert skip_err is None and skipping.skip_log.count == 1, cut
                assert skipping.skip_log.skipped[0].url == url
                assert f"member {members[len(got)][0]!r} is cut short" in skipping.skip_log.skipped[0].reason
                continue
            assert err.url == url
            assert cut == 0 or f"({len(got)} member" in err.reason  # cut 0: "empty file"
            assert skip_err is None and skipping.skip_log.count == 1, cut  # the damaged shard is counted
            assert skipping.skip_log.skipped[0].url == url
            assert skipping.skip_log.skipped[0].reason == err.reason
        assert complete == (len(data) - end) // tarfile.BLOCKSIZE - 1  # cuts in the record padding

    def test_every_cut_of_a_compressed_shard(self, tmp_path: Path) -> None:
        members = members_of(20)
        data = write_tar(tmp_path / "full.tar.gz", members, mode="w:gz").read_bytes()
        for cut in range(0, len(data), 53):
            got, err = read_all_or_error(IterableWrapper([("c.tar.gz", io.BytesIO(data[:cut]))]).load_from_tar())
            assert got == [(f"c.tar.gz/{n}", d) for n, d in members[: len(got)]]
            assert err is not None, f"cut at {cut} ({len(got)} of 20 members) ended silently"

    @pytest.mark.parametrize("source", ["seekable", "non-seekable"])
    @pytest.mark.parametrize("mode", ["w:gz", "w:bz2", "w:xz"])
    def test_every_cut_of_a_compressed_archives_tail(self, tmp_path: Path, mode: str, source: str) -> None:
        """A compressed archive cut after its last member (in the compressed zero padding or the stream's
        trailer) has every member, but its own check never ran: it says so instead of ending quietly,
        whether it is read from a file or streamed (tarfile's stream mode)."""
        members = members_of(5)
        data = write_tar(tmp_path / "t.tar.x", members, mode=mode).read_bytes()
        for cut in range(max(0, len(data) - 80), len(data)):
            stream = as_source(data[:cut], source)
            got, err = read_all_or_error(IterableWrapper([("t.tar.x", stream)]).load_from_tar())
            assert got == [(f"t.tar.x/{n}", d) for n, d in members[: len(got)]], cut
            assert err is not None, f"{mode}: cut at {cut} of {len(data)} ended silently"
            assert err.url.startswith("t.tar.x") and err.stage == "load_from_tar"
        got, err = read_all_or_error(IterableWrapper([("t.tar.x", as_source(data, source))]).load_from_tar())
        assert err is None and got == [(f"t.tar.x/{n}", d) for n, d in members]

    @pytest.mark.parametrize("source", ["seekable", "non-seekable"])
    def test_a_gzip_checksum_mismatch_is_not_silent(self, tmp_path: Path, source: str) -> None:
        """Deflate has no checksum of its own: a damaged byte in a stored block decodes to a wrong byte, and
        only the gzip trailer's CRC-32 tells. It is checked once the archive's end is reached."""
        members = [("0000.bin", b"A" * 3000), ("0001.bin", b"B" * 3000)]
        buf = io.BytesIO()
        with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=0, mtime=0) as gz:  # stored blocks
            gz.write(archive_bytes(members))
        data = bytearray(buf.getvalue())
        at = data.index(b"B" * 100) + 50
        data[at] ^= 0x01  # "B" -> "C" inside the second member's data
        got, err = read_all_or_error(IterableWrapper([("d.tar.gz", as_source(bytes(data), source))]).load_from_tar())
        assert [url for url, _ in got] == ["d.tar.gz/0000.bin", "d.tar.gz/0001.bin"]
        assert isinstance(err, ArchiveError) and err.url == "d.tar.gz" and err.stage == "load_from_tar"
        assert "CRC" in err.reason and "2 members yielded before" in err.reason, err.reason
        skipping = IterableWrapper([("d.tar.gz", as_source(bytes(data), source))]).load_from_tar(on_error="skip")
        assert len([s.read() for _, s in skipping]) == 2
        assert skipping.skip_log.count == 1 and "CRC" in skipping.skip_log.skipped[0].reason

    @pytest.mark.parametrize("source", ["seekable", "non-seekable"])
    def test_bytes_after_the_gzip_stream(self, tmp_path: Path, source: str) -> None:
        """Zero padding after a gzip stream is allowed (gzip's own rule); anything else is refused, named."""
        members = members_of(3)
        data = write_tar(tmp_path / "p.tar.gz", members, mode="w:gz").read_bytes()
        padded = as_source(data + bytes(700), source)
        got, err = read_all_or_error(IterableWrapper([("p.tar.gz", padded)]).load_from_tar())
        assert err is None and len(got) == 3
        junk = as_source(data + b"junk" * 9, source)
        got, err = read_all_or_error(IterableWrapper([("p.tar.gz", junk)]).load_from_tar())
        assert len(got) == 3 and isinstance(err, ArchiveError) and err.url == "p.tar.gz"
        assert "the bytes after the gzip stream are not gzip data" in err.reason

    @pytest.mark.parametrize("source", ["tar.gz", "non-seekable"])
    def test_member_cut_short_is_counted_once_under_skip(self, tmp_path: Path, source: str) -> None:
        """Issue 13, item 3: a member cut short in an archive that cannot be checked up front (compressed,
        or streamed) is counted once under skip, not raised when read; under raise, the error names it."""
        # seeded incompressible members: the compressed stream's offsets follow the tar's closely, so the
        # cut lands inside the fourth member's data (a cut in a header is a different case, tested above)
        members = [(f"{i:04d}.bin", random.Random(i).randbytes(3000)) for i in range(6)]
        if source == "tar.gz":
            data = write_tar(tmp_path / "a.tar.gz", members, mode="w:gz").read_bytes()
            cut = data[: 3 * (512 + 3072) + 512 + 1500]

            def stream() -> io.IOBase:
                return io.BytesIO(cut)
        else:
            data = write_tar(tmp_path / "a.tar", members).read_bytes()
            cut = data[: 4 * (512 + 3072) + 512 + 1000]  # inside the fifth member's data

            def stream() -> io.IOBase:
                return NonSeekable(cut)

        skipping = IterableWrapper([("a.tar", stream())]).load_from_tar(on_error="skip")
        got = [(url, s.read()) for url, s in skipping]  # no error raised while reading
        assert 0 < len(got) < len(members)
        assert got == [(f"a.tar/{n}", d) for n, d in members[: len(got)]]
        assert skipping.skip_log.count == 1
        skipped = skipping.skip_log.skipped[0]
        assert (skipped.url, skipped.stage) == ("a.tar", "load_from_tar")
        assert f"member {members[len(got)][0]!r} is cut short" in skipped.reason
        assert f"({len(got)} members yielded before)" in skipped.reason
        kept, err = read_all_or_error(IterableWrapper([("a.tar", stream())]).load_from_tar())
        assert kept == got and err is not None
        assert err.url == f"a.tar/{members[len(got)][0]}" and "truncated" in err.reason  # the archive in the URL

    def test_single_zero_block_and_data_after_it(self, tmp_path: Path) -> None:
        data = write_tar(tmp_path / "a.tar", [("a.txt", b"a"), ("b.txt", b"b")]).read_bytes()
        end = end_of_members(data)
        one_block = data[: end + tarfile.BLOCKSIZE]
        got, err = read_all_or_error(IterableWrapper([("a.tar", io.BytesIO(one_block))]).load_from_tar())
        assert len(got) == 2 and err is not None and "one zero block instead of two" in err.reason
        # A zero block in the middle hides the members after it from tarfile: refused, not ignored.
        first = data[: 2 * tarfile.BLOCKSIZE]
        hidden = first + bytes(tarfile.BLOCKSIZE) + data[2 * tarfile.BLOCKSIZE :]
        got, err = read_all_or_error(IterableWrapper([("h.tar", io.BytesIO(hidden))]).load_from_tar())
        assert len(got) == 1 and err is not None and "single zero block" in err.reason

    def test_corrupt_header_after_the_first_member(self, tmp_path: Path) -> None:
        data = bytearray(write_tar(tmp_path / "a.tar", [("a.txt", b"a"), ("b.txt", b"b")]).read_bytes())
        data[2 * tarfile.BLOCKSIZE + 148 : 2 * tarfile.BLOCKSIZE + 156] = b"9999999\0"  # bad checksum
        got, err = read_all_or_error(IterableWrapper([("a.tar", io.BytesIO(bytes(data)))]).load_from_tar())
        assert len(got) == 1 and err is not None and "corrupt member header at byte 1024" in err.reason

    def test_empty_archive_is_not_an_error(self, tmp_path: Path) -> None:
        with tarfile.open(tmp_path / "empty.tar", "w"):
            pass
        data = (tmp_path / "empty.tar").read_bytes()
        assert list(IterableWrapper([("e.tar", io.BytesIO(data))]).load_from_tar()) == []
        assert list(IterableWrapper([("e.tar", io.BytesIO(data[:1024]))]).load_from_tar()) == []
        with pytest.raises(ArchiveError, match="one zero block instead of two"):
            list(IterableWrapper([("e.tar", io.BytesIO(data[:512]))]).load_from_tar())

    def test_decompressed_tar_object_is_checked_too(self, tmp_path: Path) -> None:
        data = write_tar(tmp_path / "a.tar", [(f"{i}.txt", b"x") for i in range(4)], mode="w:gz").read_bytes()
        raw = gzip.decompress(data)[:2048]
        (tmp_path / "cut.tar.gz").write_bytes(gzip.compress(raw))
        pipe = IterableWrapper([str(tmp_path / "cut.tar.gz")]).open_files_by_fsspec(mode="rb")
        pipe = pipe.decompress(file_type="tar").load_from_tar()
        got, err = read_all_or_error(pipe)
        assert len(got) == 2 and err is not None and "truncated" in err.reason

    @pytest.mark.parametrize("source", ["seekable", "non-seekable"])
    def test_a_checksum_mismatch_through_decompress_into_tar(self, source: str) -> None:
        members = [("0000.bin", b"A" * 3000), ("0001.bin", b"B" * 3000)]
        buf = io.BytesIO()
        with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=0, mtime=0) as gz:  # stored blocks
            gz.write(archive_bytes(members))
        data = bytearray(buf.getvalue())
        data[data.index(b"B" * 100) + 50] ^= 0x01
        pipe = IterableWrapper([("d.tar.gz", as_source(bytes(data), source))]).decompress(file_type="tar")
        got, err = read_all_or_error(pipe.load_from_tar())
        assert len(got) == 2 and isinstance(err, ArchiveError) and err.url == "d.tar.gz"
        assert "CRC" in err.reason, err.reason

    def test_every_cut_of_a_zip_raises(self, tmp_path: Path) -> None:
        members = members_of(30)
        data = write_zip(tmp_path / "full.zip", members).read_bytes()
        for cut in range(0, len(data), 61):
            for stream in (io.BytesIO(data[:cut]), NonSeekable(data[:cut])):
                got, err = read_all_or_error(IterableWrapper([("z.zip", stream)]).load_from_zip())
                assert got == [] and err is not None and err.stage == "load_from_zip", cut
        skipping = IterableWrapper([("z.zip", io.BytesIO(data[:-1]))]).load_from_zip(on_error="skip")
        assert list(skipping) == [] and skipping.skip_log.count == 1


def outcome(data: bytes, fast: bool, monkeypatch: pytest.MonkeyPatch, **kwargs):
    """What ``load_from_tar`` yields for ``data`` (read whole), the error it ends with, and what it skipped."""

    monkeypatch.setitem(_fast.state, "tar_headers", fast)
    pipe = IterableWrapper([("s.tar", io.BytesIO(data))]).load_from_tar(**kwargs)
    got, err = read_all_or_error(pipe)
    skipped = [(item.url, item.stage, item.reason) for item in pipe.skip_log.skipped]
    return got, (None if err is None else (err.url, err.stage, err.action, err.reason)), skipped


class TestPlainHeaders:
    """Plain headers are read without tarfile's per-header work, with tarfile's results (issue 12)."""

    LONG = "a-directory-name-of-sixty-characters-to-need-the-prefix-field/" * 2 + "image.jpg"

    def cases(self) -> dict[str, bytes]:
        small = members_of(40)
        mixed = [*small[:5], (self.LONG, b"long" * 300), ("x" * 120 + ".bin", b"gnu long name"), *small[5:9]]
        big = [*small[:3], ("big.bin", bytes(range(256)) * 400), *small[3:6]]
        return {
            "ustar": archive_bytes(small),
            "gnu": archive_bytes(small, tarfile.GNU_FORMAT),
            "pax": archive_bytes(small, tarfile.PAX_FORMAT),
            "v7 names joined with the ustar prefix": archive_bytes([(self.LONG, b"p" * 10), *small[:3]]),
            "long names mid-archive (pax)": archive_bytes(mixed, tarfile.PAX_FORMAT),
            "long names mid-archive (gnu)": archive_bytes(mixed, tarfile.GNU_FORMAT),
            "dirs and links": archive_bytes(small[:6], dirs=("d/", "d/e/"), links=(("ln", "0001.bin"),)),
            "a member over the size limit": archive_bytes(big),
            "gzip": gzip.compress(archive_bytes(small)),
            "unsafe names": archive_bytes([("ok.txt", b"1"), ("../evil.txt", b"2"), ("/abs.txt", b"3"), ("z", b"4")]),
        }

    def test_same_members_urls_and_bytes_as_tarfile(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import pipekit.pipes._tar_headers as archives  # the plain-header reader lives there

        monkeypatch.setattr(archives, "PLAIN_MEMBER_MAX_BYTES", 64 * 1024)
        for name, data in self.cases().items():
            for on_error in ("raise", "skip"):
                plain = outcome(data, True, monkeypatch, on_error=on_error)
                reference = outcome(data, False, monkeypatch, on_error=on_error)
                assert plain == reference, (name, on_error)
                assert plain[0] or plain[1], name

    def test_small_read_ahead_pieces_give_the_same_results(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Pieces smaller than a member, across headers, and skipped members past the piece read: same as tarfile."""
        import pipekit.pipes._tar_headers as archives  # the plain-header reader lives there

        monkeypatch.setattr(archives, "PLAIN_MEMBER_MAX_BYTES", 64 * 1024)
        for piece in (512, 700, 3000):
            monkeypatch.setattr(archives, "_READ_AHEAD", piece)
            for name, data in self.cases().items():
                cuts = [data, data[: len(data) // 2], data[: len(data) - 700]]
                for variant in cuts:
                    plain = outcome(variant, True, monkeypatch, on_error="skip")
                    assert plain == outcome(variant, False, monkeypatch, on_error="skip"), (piece, name, len(variant))

    def test_a_shard_is_read_in_few_large_reads(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import pipekit.pipes._tar_headers as archives  # the plain-header reader lives there

        class Counting(io.BytesIO):
            reads = 0

            def read(self, n=-1):
                Counting.reads += 1
                return super().read(n)

        monkeypatch.setitem(_fast.state, "tar_headers", True)
        data = archive_bytes([(f"{i:04d}.bin", bytes([i % 256]) * 3000) for i in range(300)])  # ~1.1 MB
        got = [read_item(i) for i in IterableWrapper([("s.tar", Counting(data))]).load_from_tar()]
        assert len(got) == 300 and got[7] == ("s.tar/0007.bin", b"\x07" * 3000)
        # one read per piece, and tarfile's few at the end-of-archive marker; not two per member (600)
        assert Counting.reads <= len(data) // archives._READ_AHEAD + 8

    def test_header_checksum_matches_the_byte_sum(self) -> None:
        import random

        from pipekit.pipes._archives import _header_sum

        def reference(block: bytes) -> int:
            return 256 + sum(block[:148]) + sum(block[156:])

        rng = random.Random(0)
        names = ["a.jpg", "dir/" * 20 + "x.cls", "caf\u00e9/\u00fcber.png", "\u65e5\u672c.txt"]
        blocks = []
        for fmt in (tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT):
            for name in names:
                info = tarfile.TarInfo(name)
                info.size = rng.randrange(10**6)
                info.mtime = rng.randrange(2**33)
                blocks.append(info.tobuf(fmt, "utf-8", "surrogateescape")[:512])
        blocks += [bytes(rng.randrange(256) for _ in range(512)) for _ in range(200)]  # garbage, high bytes
        blocks += [bytes(rng.randrange(128) for _ in range(512)) for _ in range(200)]  # garbage, all ASCII
        blocks += [b"\x7f" * 512, b"\xff" * 512, bytes(512)]
        for block in blocks:
            assert _header_sum(block) == reference(block)

    def test_every_cut_and_a_corrupt_header_give_tarfiles_errors(self, monkeypatch: pytest.MonkeyPatch) -> None:
        data = archive_bytes(members_of(12))
        corrupt = bytearray(data)
        corrupt[5 * tarfile.BLOCKSIZE + 3] ^= 0xFF  # a name byte of a later header: its checksum fails
        variants = [data[:cut] for cut in range(0, len(data) + 1, 97)] + [bytes(corrupt)]
        for variant in variants:
            for on_error in ("raise", "skip"):
                plain = outcome(variant, True, monkeypatch, on_error=on_error)
                assert plain == outcome(variant, False, monkeypatch, on_error=on_error), (len(variant), on_error)

    def test_resume_mid_archive_on_either_path(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:

        small = members_of(8)
        path = tmp_path / "s.tar"
        path.write_bytes(
            archive_bytes([*small[:3], ("y" * 150, b"long"), *small[3:]], tarfile.GNU_FORMAT, dirs=("d/",))
        )

        def chain():
            return IterableWrapper([str(path)]).open_files_by_fsspec(mode="rb").load_from_tar().map(read_item)

        monkeypatch.setitem(_fast.state, "tar_headers", True)
        whole = list(chain())
        assert len(whole) == 9
        for stop in range(len(whole) + 1):
            for fast_after in (True, False):
                pipe = chain()
                it = iter(pipe)
                first = [next(it) for _ in range(stop)]
                state = snapshot_pipeline(pipe)
                monkeypatch.setitem(_fast.state, "tar_headers", fast_after)
                again = chain()
                restore_pipeline(again, state)
                rest = list(again)
                monkeypatch.setitem(_fast.state, "tar_headers", True)
                assert first + rest == whole, (stop, fast_after)

    def test_tarfile_reads_only_what_is_not_plain(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import pipekit.pipes._tar_headers as archives  # the plain-header reader lives there

        calls = []
        real = archives._EndCheckedTarInfo.fromtarfile.__func__

        def counting(cls, tar):
            calls.append(tar.offset)
            return real(cls, tar)

        monkeypatch.setattr(archives._EndCheckedTarInfo, "fromtarfile", classmethod(counting))
        got, err, _ = outcome(archive_bytes(members_of(50)), True, monkeypatch)
        assert len(got) == 50 and err is None
        assert len(calls) <= 2  # the end-of-archive marker only (tarfile reads it once to open, once to end)
        calls.clear()
        outcome(archive_bytes(members_of(50)), False, monkeypatch)
        assert len(calls) > 50


class TestZipArchiveLoader:
    def zip_chain(self, paths, **kwargs):
        return IterableWrapper(paths).open_files_by_fsspec(mode="rb", **kwargs).load_from_zip().map(read_item)

    def test_members_with_content(self, tmp_path: Path) -> None:
        path = str(write_zip(tmp_path / "a.zip", MEMBERS, dirs=("dir/",)))
        assert list(self.zip_chain([path])) == [(f"{path}/{n}", d) for n, d in MEMBERS]

    def test_member_streams_close_archive(self, tmp_path: Path) -> None:
        path = str(write_zip(tmp_path / "a.zip", MEMBERS))
        items = list(IterableWrapper([path]).open_files_by_fsspec(mode="rb").load_from_zip())
        archive = items[0][1].parent_stream
        assert [s.read() for _, s in reversed(items)] == [d for _, d in reversed(MEMBERS)]
        for _, s in items:
            s.close()
        assert archive.closed

    def test_non_seekable_is_buffered(self, tmp_path: Path) -> None:
        data = write_zip(tmp_path / "a.zip", MEMBERS).read_bytes()
        got = [(u, s.read()) for u, s in IterableWrapper([("a.zip", NonSeekable(data))]).load_from_zip()]
        assert got == [(f"a.zip/{n}", d) for n, d in MEMBERS]

    @pytest.mark.parametrize(
        ("bad", "why"), [("../evil.txt", r"'\.\.' path component"), ("/abs/evil.txt", "absolute path")]
    )
    def test_unsafe_names_refused(self, tmp_path: Path, bad: str, why: str) -> None:
        path = str(write_zip(tmp_path / "a.zip", [(bad, b"evil"), ("ok.txt", b"ok")]))
        with pytest.raises(ArchiveError, match=why) as info:
            list(self.zip_chain([path]))
        assert info.value.url == path
        assert info.value.stage == "load_from_zip"
        loader = IterableWrapper([path]).open_files_by_fsspec(mode="rb").load_from_zip(on_error="skip")
        assert [read_item(i) for i in loader] == [(f"{path}/ok.txt", b"ok")]
        assert loader.skip_log.count == 1

    def test_corrupt_names_url(self, tmp_path: Path) -> None:
        bad = tmp_path / "bad.zip"
        bad.write_bytes(write_zip(tmp_path / "good.zip", MEMBERS).read_bytes()[:-30])  # cut the directory
        with pytest.raises(ArchiveError, match=r"bad\.zip.*load_from_zip") as info:
            list(self.zip_chain([str(bad)]))
        assert info.value.url == str(bad)

    @staticmethod
    def damaged_zip(tmp_path: Path, damage: str) -> Path:
        """A deflated zip of three members whose middle one's compressed data is damaged: ``"data"`` (deflate
        fails: ``zlib.error``) or ``"crc"`` (one byte of a stored member changed: zipfile's ``Bad CRC-32``)."""
        path = tmp_path / f"{damage}.zip"
        kind = zipfile.ZIP_DEFLATED if damage == "data" else zipfile.ZIP_STORED
        with zipfile.ZipFile(path, "w", compression=kind) as zf:
            for name, data in (("a.txt", b"a" * 300), ("b.txt", bytes(range(256)) * 4), ("c.txt", b"c" * 300)):
                zf.writestr(name, data)
        with zipfile.ZipFile(path) as zf:
            info = zf.getinfo("b.txt")
        raw = bytearray(path.read_bytes())
        start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
        if damage == "data":
            raw[start:start + 8] = b"\xff" * 8  # an invalid deflate block type
        else:
            raw[start + 100] ^= 0x01
        path.write_bytes(bytes(raw))
        return path

    @pytest.mark.parametrize("damage", ["data", "crc"])
    def test_a_corrupt_member_raises_naming_archive_member_and_stage(self, tmp_path: Path, damage: str) -> None:
        """Reading a damaged member raised a bare ``zlib.error`` (deflate) or ``BadZipFile`` (CRC)."""
        path = str(self.damaged_zip(tmp_path, damage))
        it = iter(self.zip_chain([path]))
        assert next(it)[0] == f"{path}/a.txt"
        with pytest.raises(ArchiveError) as info:
            next(it)
        err = info.value
        assert err.stage == "load_from_zip" and err.url == f"{path}/b.txt", (err.url, err.stage)
        assert "b.txt" in str(err) and "corrupt" in err.reason

    @pytest.mark.parametrize("damage", ["data", "crc"])
    def test_a_corrupt_member_is_skipped_and_counted(self, tmp_path: Path, damage: str) -> None:
        path = str(self.damaged_zip(tmp_path, damage))
        loader = IterableWrapper([path]).open_files_by_fsspec(mode="rb").load_from_zip(on_error="skip")
        assert [read_item(i) for i in loader] == [(f"{path}/a.txt", b"a" * 300), (f"{path}/c.txt", b"c" * 300)]
        assert loader.skip_log.count == 1
        (skipped,) = loader.skip_log.skipped
        assert "b.txt" in skipped.url and skipped.stage == "load_from_zip"

    def test_resume_mid_archive(self, tmp_path: Path) -> None:
        paths = [str(write_zip(tmp_path / f"z{i}.zip", MEMBERS, dirs=("d/",))) for i in range(2)]

        def make():
            return self.zip_chain(paths)

        for n in (0, 1, 3, 4, 5, 7, 8):
            assert_resumes(make, n)

    def test_length_and_pickle(self, tmp_path: Path) -> None:
        path = str(write_zip(tmp_path / "a.zip", MEMBERS))
        pipe = IterableWrapper([path]).open_files_by_fsspec(mode="rb").load_from_zip(length=4)
        assert len(pipe) == 4
        clone = pickle.loads(pickle.dumps(pipe))
        assert [read_item(i) for i in clone] == [(f"{path}/{n}", d) for n, d in MEMBERS]

    @pytest.mark.s3
    def test_s3(self, s3_server, s3_bucket: str, tmp_path: Path) -> None:
        path = write_zip(tmp_path / "a.zip", MEMBERS)
        s3_server.fs().put_file(str(path), f"{s3_bucket}/a.zip")
        url = f"s3://{s3_bucket}/a.zip"

        def make():
            return self.zip_chain([url], **s3_server.storage_options)

        assert list(make()) == [(f"{url}/{n}", d) for n, d in MEMBERS]
        assert_resumes(make, 2)


PAYLOAD = b"line one\nline two\n" * 50
COMPRESSORS = {"gz": gzip.compress, "bz2": bz2.compress, "xz": lzma.compress}


class TestDecompressor:
    @pytest.fixture
    def compressed(self, tmp_path: Path) -> dict[str, str]:
        out = {}
        for ext, fn in COMPRESSORS.items():
            path = tmp_path / f"notes.txt.{ext}"
            path.write_bytes(fn(PAYLOAD))
            out[ext] = str(path)
        return out

    def test_by_extension(self, compressed: dict[str, str]) -> None:
        urls = list(compressed.values())
        got = [(u, s.read()) for u, s in IterableWrapper(urls).open_files_by_fsspec(mode="rb").decompress()]
        assert got == [(u, PAYLOAD) for u in urls]  # torchdata passes the URL on unchanged

    @pytest.mark.parametrize(
        ("ext", "file_type"),
        [("gz", "gzip"), ("gz", "gz"), ("bz2", "bz2"), ("xz", "xz"), ("xz", "lzma"), ("xz", CompressionType.LZMA)],
    )
    def test_explicit_type(self, tmp_path: Path, ext: str, file_type) -> None:
        path = tmp_path / "blob.bin"  # an extension that says nothing
        path.write_bytes(COMPRESSORS[ext](PAYLOAD))
        pipe = IterableWrapper([str(path)]).open_files_by_fsspec(mode="rb").decompress(file_type=file_type)
        assert [(u, s.read()) for u, s in pipe] == [(str(path), PAYLOAD)]

    def test_unknown_extension_is_an_error(self, tmp_path: Path) -> None:
        path = tmp_path / "blob.bin"
        path.write_bytes(gzip.compress(PAYLOAD))
        with pytest.raises(ArchiveError, match=r"blob\.bin.*decompress.*unknown compression extension '\.bin'"):
            list(IterableWrapper([str(path)]).open_files_by_fsspec(mode="rb").decompress())

    def test_strip_extension(self, compressed: dict[str, str]) -> None:
        pipe = IterableWrapper([compressed["gz"]]).open_files_by_fsspec(mode="rb").decompress(strip_extension=True)
        assert [(u, s.read()) for u, s in pipe] == [(compressed["gz"][: -len(".gz")], PAYLOAD)]

    def test_streamed_not_read_up_front(self) -> None:
        data = os.urandom(1 << 20)  # incompressible: the compressed stream is ~1 MiB too
        raw = NonSeekable(gzip.compress(data))
        ((_, stream),) = list(IterableWrapper([("big.bin.gz", raw)]).decompress())
        assert raw.bytes_read < 64 * 1024
        assert stream.read(100) == data[:100]
        assert raw.bytes_read < 256 * 1024
        assert stream.read() == data[100:]

    def test_corrupt_stream_error_names_url(self, tmp_path: Path) -> None:
        path = tmp_path / "bad.txt.gz"
        path.write_bytes(b"this is not gzip data at all")
        ((_, stream),) = list(IterableWrapper([str(path)]).open_files_by_fsspec(mode="rb").decompress())
        with pytest.raises(ArchiveError, match=r"bad\.txt\.gz.*decompress") as info:
            stream.read()
        assert info.value.url == str(path)

    def test_parent_closed_with_child(self, compressed: dict[str, str]) -> None:
        ((_, stream),) = list(IterableWrapper([compressed["bz2"]]).open_files_by_fsspec(mode="rb").decompress())
        parent = stream.parent_stream
        assert stream.read() == PAYLOAD
        assert not parent.closed
        stream.close()
        assert parent.closed

    def test_tar_and_zip_types_yield_archive_objects(self, tmp_path: Path) -> None:
        tgz = str(write_tar(tmp_path / "a.tar.gz", MEMBERS, mode="w:gz"))
        zpath = str(write_zip(tmp_path / "a.zip", MEMBERS))
        items = list(IterableWrapper([tgz, zpath]).open_files_by_fsspec(mode="rb").decompress())
        assert isinstance(items[0][1].file_obj, tarfile.TarFile)
        assert isinstance(items[1][1].file_obj, zipfile.ZipFile)
        assert items[0][1].file_obj.getnames() == [n for n, _ in MEMBERS]
        # the archive loaders accept them
        pipe = IterableWrapper([tgz]).open_files_by_fsspec(mode="rb").decompress().load_from_tar()
        assert [read_item(i) for i in pipe] == [(f"{tgz}/{n}", d) for n, d in MEMBERS]
        pipe = IterableWrapper([zpath]).open_files_by_fsspec(mode="rb").decompress().load_from_zip()
        assert [read_item(i) for i in pipe] == [(f"{zpath}/{n}", d) for n, d in MEMBERS]

    def test_resume_through_decompress_into_tar(self, tmp_path: Path) -> None:
        paths = []
        for i in range(2):
            tar_bytes = write_tar(tmp_path / f"s{i}.tar", [(f"{k}.txt", f"{i}{k}".encode()) for k in range(3)])
            gz = tmp_path / f"s{i}.tar.gz"
            gz.write_bytes(gzip.compress(tar_bytes.read_bytes()))
            paths.append(str(gz))

        def make():
            opened = IterableWrapper(paths).open_files_by_fsspec(mode="rb")
            return opened.decompress(file_type="gzip", strip_extension=True).load_from_tar().map(read_item)

        assert next(iter(make())) == (paths[0][: -len(".gz")] + "/0.txt", b"00")
        for n in (1, 3, 4):
            assert_resumes(make, n)

    def test_arguments_and_pickle(self, compressed: dict[str, str]) -> None:
        with pytest.raises(ValueError, match="file_type"):
            IterableWrapper([]).decompress(file_type="rar")
        with pytest.raises(TypeError, match="file_type"):
            IterableWrapper([]).decompress(file_type=3)
        assert Decompressor.stateless is True
        assert Decompressor.types is CompressionType
        pipe = IterableWrapper([compressed["xz"]]).open_files_by_fsspec(mode="rb").decompress("xz")
        clone = pickle.loads(pickle.dumps(pipe))
        assert clone.file_type is CompressionType.LZMA
        assert [s.read() for _, s in clone] == [PAYLOAD]

    @pytest.mark.s3
    def test_s3(self, s3_server, s3_bucket: str, compressed: dict[str, str]) -> None:
        fs = s3_server.fs()
        fs.put_file(compressed["gz"], f"{s3_bucket}/notes.txt.gz")
        url = f"s3://{s3_bucket}/notes.txt.gz"
        pipe = IterableWrapper([url]).open_files_by_fsspec(mode="rb", **s3_server.storage_options).decompress()
        assert [(u, s.read()) for u, s in pipe] == [(url, PAYLOAD)]


class CountingRemote(io.BytesIO):
    """An in-memory 'remote' file counting its reads; ``fail_at`` makes the read at that offset fail once."""

    def __init__(self, data: bytes, log: list[int], fail_at: int | None = None) -> None:
        super().__init__(data)
        self.log = log
        self.fail_at = fail_at

    def read(self, size: int | None = -1) -> bytes:
        if self.fail_at is not None and self.tell() <= self.fail_at < self.tell() + (size or 0):
            self.fail_at = None
            raise ConnectionResetError(104, "Connection reset by peer")
        self.log.append(self.tell())
        return super().read(size)


def remote_tar(data: bytes, log: list[int], url: str = "s3://b/remote.tar", **kw) -> tuple[str, PipekitStream]:
    """``(url, stream)`` as ``open_files_by_fsspec`` yields it for a remote file: a RetryingFile."""
    from pipekit.pipes._fsspec_io import RetryingFile
    from pipekit.retry import RetryPolicy

    state = {"fail_at": kw.get("fail_at")}

    def open_fn():
        f = CountingRemote(data, log, state["fail_at"])
        state["fail_at"] = None  # fails once, not again after the reopen
        return f

    return url, PipekitStream(RetryingFile(open_fn, url, "open_files_by_fsspec", RetryPolicy(base_delay=0.001)))


def read_samples(items) -> list[tuple[str, dict]]:
    """``load_from_tar -> webdataset`` read as TarShards reads it: a sample's members after the next header."""
    pipe = IterableWrapper(items, deepcopy=False).load_from_tar().webdataset()
    return [{k: (v.read() if hasattr(v, "read") else v) for k, v in s.items()} for s in pipe]


class TestRemoteTar:
    """Remote archives are read in large sequential chunks, not one seek and read per header and member."""

    def members(self) -> list[tuple[str, bytes]]:
        rng = random.Random(0)
        return [(f"{i:04d}.{ext}", rng.randbytes(rng.randrange(1, 3000))) for i in range(300) for ext in ("jpg", "cls")]

    def test_one_sequential_read_per_chunk(self, tmp_path: Path) -> None:
        data = write_tar(tmp_path / "a.tar", self.members()).read_bytes()
        log: list[int] = []
        got = read_samples([remote_tar(data, log)])
        expected = read_samples([("s3://b/remote.tar", PipekitStream(io.BytesIO(data)))])
        assert got == expected and len(got) == 300
        assert log == [0]  # < 8 MiB: one read of the whole archive (before: a read per header and member)

    def test_a_failed_read_is_retried_and_an_exhausted_one_named(self, tmp_path: Path) -> None:
        data = write_tar(tmp_path / "a.tar", self.members()).read_bytes()
        log: list[int] = []
        expected = read_samples([("s3://b/remote.tar", PipekitStream(io.BytesIO(data)))])
        assert read_samples([remote_tar(data, log, fail_at=0)]) == expected  # the read fails once, then reopens

        from pipekit.pipes._fsspec_io import RetryingFile
        from pipekit.retry import RetryPolicy

        class Down(io.BytesIO):
            def read(self, size=-1):
                raise ConnectionResetError(104, "Connection reset by peer")

        policy = RetryPolicy(attempts=2, base_delay=0.001)
        stream = RetryingFile(lambda: Down(data), "s3://b/gone.tar", "open_files_by_fsspec", policy)
        with pytest.raises(ArchiveError, match=r"s3://b/gone\.tar.*ConnectionResetError.*gave up after 2 attempts"):
            read_samples([("s3://b/gone.tar", PipekitStream(stream))])

    def test_resume_mid_archive(self, tmp_path: Path) -> None:
        data = write_tar(tmp_path / "a.tar", self.members()).read_bytes()

        from pipekit.pipes import IterDataPipe

        class RemoteOpener(IterDataPipe):
            """Yields ``remote_tar`` streams and reopens them, as open_files_by_fsspec does for S3 URLs."""

            stateless = True

            def __init__(self, source_datapipe):
                self.source_datapipe = source_datapipe

            def __iter__(self):
                for url in self.source_datapipe:
                    yield remote_tar(data, [], url)

            def reopen(self, url):
                return remote_tar(data, [], url)[1]

        def make():
            urls = IterableWrapper(["s3://b/a.tar", "s3://b/b.tar"])
            return RemoteOpener(urls).load_from_tar().map(read_item)

        for n in (7, 401, 600, 601, 1000):
            assert_resumes(make, n)

    @pytest.mark.s3
    def test_s3_requests(self, s3_server, s3_bucket: str, tmp_path: Path, caplog) -> None:
        """With s3fs blocks smaller than the shard, each shard is still fetched in sequential requests, none twice."""
        import logging

        path = write_tar(tmp_path / "big.tar", self.members())  # ~1 MB
        s3_server.fs().put_file(str(path), f"{s3_bucket}/big.tar")
        url = f"s3://{s3_bucket}/big.tar"
        opts = {**s3_server.storage_options, "default_block_size": 64 * 1024, "skip_instance_cache": True}
        caplog.set_level(logging.DEBUG, logger="s3fs")
        samples = read_samples(IterableWrapper([url]).open_files_by_fsspec(mode="rb", **opts))
        gets = [r for r in caplog.records if r.name == "s3fs" and r.getMessage().startswith("CALL: get_object")]
        expected = read_samples([(url, PipekitStream(io.BytesIO(path.read_bytes())))])
        assert samples == expected
        assert len(gets) == 1  # before: ~2 per 64 KiB block (the look-back fetched blocks again): 43 here


LEFT_OPEN_AT_EXIT = """
import sys
import pipekit
from pipekit.pipes import IterableWrapper
loader = pipekit.DataLoader(IterableWrapper(sys.argv[1:]).open_files_by_fsspec(mode="rb").load_from_tar())
it = iter(loader)
item = next(it)  # the archive loader's generator is left inside an archive, finalised at interpreter exit
"""


@pytest.mark.slow  # a fresh interpreter importing torch: about 3 s
@pytest.mark.timeout(60)
def test_a_loader_left_inside_an_archive_exits_quietly(tmp_path: Path) -> None:
    """Finalised at exit, once module globals are None, it printed "Exception ignored in ...: isinstance() arg 2
    must be a type" (its cleanup looked up module globals)."""
    paths = [str(write_tar(tmp_path / f"s{i}.tar", members_of(3))) for i in range(2)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", LEFT_OPEN_AT_EXIT, *paths], capture_output=True, text=True,
                          env=env, timeout=50)
    assert done.returncode == 0 and done.stderr == "", done.stderr


SECRET = "wJalrXUtnFEMIsecret"


@pytest.mark.parametrize("workers", [0, 2])
def test_a_checkpoint_inside_an_archive_holds_no_credentials_and_resumes_exactly(workers: int) -> None:
    """The loader's position named the archive by its URL, credentials and all; it holds the URL without them
    and a digest of the whole, and finds the URL again among the pipeline's own (the source's list)."""
    import pipekit

    root = f"memory://AKIAEXAMPLE:{SECRET}@bucket-{workers}"
    urls = []
    for i in range(2):
        urls.append(f"{root}/s{i}.tar")
        with fsspec.open(urls[-1], "wb") as f:
            f.write(archive_bytes([(f"{i}-{k}.bin", bytes([k]) * 9) for k in range(3)]))

    def build() -> Any:
        return IterableWrapper(urls).open_files_by_fsspec(mode="rb").load_from_tar().map(read_item)

    options: dict[str, Any] = {"num_workers": workers, "warn_unsharded": False}  # each worker reads both
    full = list(pipekit.DataLoader(build(), **options))
    loader = pipekit.DataLoader(build(), **options)
    it = iter(loader)
    head = [next(it) for _ in range(4 * max(1, workers))]  # inside the second archive
    state = loader.state_dict()
    loader.shutdown()
    assert SECRET.encode() not in pickle.dumps(state)  # the positions, and the report of the last file read
    resumed = pipekit.DataLoader(build(), **options)
    resumed.load_state_dict(pickle.loads(pickle.dumps(state)))
    assert head + list(resumed) == full and len(full) == 6 * max(1, workers)
