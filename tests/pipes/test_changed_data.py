"""Data changed between a checkpoint and its resume is refused, naming what changed (issue 35).

A checkpoint's positions depend on the files: the listing's order (the lister's position, and the
shuffles and worker sharding downstream count items of it) and the content of the archive being
read (the archive loader's position is a count of its entries).  A shard deleted before it was
read used to give one shard's samples twice and another's never, and a shard replaced while it
was being read resumed inside the new file at the old position, all without a word.
"""

from __future__ import annotations

import io
import os
import shutil
import tarfile
from pathlib import Path

import pytest

import pipekit
from pipekit.errors import StageError
from pipekit.pipes import FSSpecFileLister
from pipekit.synthetic import write_image_shards

SHARDS, PER_SHARD = 4, 5  # 10 members a shard (.jpg + .cls)


@pytest.fixture
def shards(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> Path:
    made = tmp_path_factory.getbasetemp() / "changed-data-shards"
    if not made.exists():
        write_image_shards(made, shards=SHARDS, per_shard=PER_SHARD, size=16, progress=False)
    root = tmp_path / "shards"
    shutil.copytree(made, root)
    return root


def _read(item: tuple[str, object]) -> tuple[str, bytes]:
    url, stream = item
    data = stream.read()
    stream.close()
    return os.path.basename(os.path.dirname(url)) + "/" + os.path.basename(url), data


def _pipe(root: Path, sharded: bool = False):
    pipe = FSSpecFileLister(str(root), masks="*.tar")
    if sharded:
        pipe = pipe.sharding_filter()
    return pipe.open_files_by_fsspec(mode="rb").load_from_tar().map(_read)


def _loader(root: Path, workers: int = 0) -> pipekit.DataLoader:
    return pipekit.DataLoader(_pipe(root, sharded=workers > 0), batch_size=None, num_workers=workers)


def _checkpoint(loader: pipekit.DataLoader, n: int) -> tuple[list, dict]:
    it = iter(loader)
    head = [next(it) for _ in range(n)]
    return head, loader.state_dict()


def _resumed(root: Path, state: dict, workers: int = 0) -> list:
    loader = _loader(root, workers)
    loader.load_state_dict(state)
    return list(loader)


def _replace(path: Path, members: dict[str, bytes]) -> None:
    tmp = path.with_suffix(".new")
    with tarfile.open(tmp, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    os.replace(tmp, path)


class TestUnchanged:
    def test_resumes_exactly(self, shards: Path) -> None:
        expected = list(_loader(shards))
        head, state = _checkpoint(_loader(shards), 13)
        assert head + _resumed(shards, state) == expected

    def test_touched_but_not_changed_still_resumes(self, shards: Path) -> None:
        # the listing's names and the archive's size and mtime are what positions depend on
        expected = list(_loader(shards))
        head, state = _checkpoint(_loader(shards), 13)
        later = shards / "shard-000003.tar"
        st = later.stat()
        os.utime(later, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a shard not being read: no matter
        assert head + _resumed(shards, state) == expected


class TestChanged:
    def test_shard_being_read_replaced(self, shards: Path) -> None:
        head, state = _checkpoint(_loader(shards), 13)  # inside shard 1
        assert head[-1][0].startswith("shard-000001.tar/")
        _replace(shards / "shard-000001.tar", {f"{i:04d}.cls": b"9" for i in range(40)})
        with pytest.raises(StageError) as info:
            _resumed(shards, state)
        message = str(info.value)
        assert "shard-000001.tar" in message and "load_from_tar" in message and "changed" in message

    def test_shard_being_read_rewritten_same_size(self, shards: Path) -> None:
        _, state = _checkpoint(_loader(shards), 13)
        path = shards / "shard-000001.tar"
        data = bytearray(path.read_bytes())
        data[-2000] ^= 1  # same size, new content (and a new mtime)
        st = path.stat()
        path.write_bytes(bytes(data))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        with pytest.raises(StageError, match=r"shard-000001\.tar.*changed"):
            _resumed(shards, state)

    def test_unread_shard_deleted(self, shards: Path) -> None:
        _, state = _checkpoint(_loader(shards), 13)
        (shards / "shard-000003.tar").unlink()
        with pytest.raises(StageError) as info:
            _resumed(shards, state)
        message = str(info.value)
        assert str(shards) in message and "list_files_by_fsspec" in message and "changed" in message
        assert "4 files" in message and "3 now" in message

    def test_shard_added(self, shards: Path) -> None:
        _, state = _checkpoint(_loader(shards), 13)
        shutil.copy(shards / "shard-000000.tar", shards / "shard-000000a.tar")
        with pytest.raises(StageError, match="changed"):
            _resumed(shards, state)

    @pytest.mark.slow
    @pytest.mark.timeout(120)
    def test_unread_shard_deleted_two_workers(self, shards: Path) -> None:
        # the case that lost one shard and repeated another: workers shard the listing by position
        _, state = _checkpoint(_loader(shards, workers=2), 6)
        (shards / "shard-000003.tar").unlink()
        with pytest.raises(StageError, match=r"list_files_by_fsspec.*changed"):
            _resumed(shards, state, workers=2)


class TestLister:
    def test_state_holds_a_digest_not_the_listing(self, shards: Path) -> None:
        # (and, compressed and bounded, the names: a refusal names the files; the name is the guide's)
        import zlib

        lister = FSSpecFileLister(str(shards), masks="*.tar")
        it = iter(lister)
        next(it)
        state = lister.state_dict()
        assert state["root"] == str(shards) and state["count"] == SHARDS
        assert isinstance(state["digest"], str) and len(state["digest"]) == 32
        assert zlib.decompress(state["names"]).decode().splitlines() == sorted(str(p) for p in shards.glob("*.tar"))
        assert lister.state_dict() is not state and lister.state_dict() == state

    def test_a_listing_past_the_names_limit_keeps_digest_and_count(self) -> None:
        from pipekit._fs import listing_change, listing_record

        urls = [f"s3://b/train/{i:08d}.tar" for i in range(2000)]
        record = listing_record(urls, limit=100)
        assert "names" not in record and record["count"] == 2000
        assert listing_change(record, urls) is None
        assert listing_change(record, urls[1:]) == "2000 files then, 1999 now"
        full = listing_record(urls)
        assert len(full["names"]) < 10_000  # sorted paths compress well
        assert listing_change(full, [*urls[1:], "s3://b/train/x.tar"]) == (
            "2000 files then, 2000 now: gone 's3://b/train/00000000.tar'; new 's3://b/train/x.tar'")

    def test_old_checkpoint_without_digest_still_loads(self, shards: Path) -> None:
        lister = FSSpecFileLister(str(shards), masks="*.tar")
        lister.load_state_dict({"root": str(shards), "last": str(shards / "shard-000001.tar")})
        # by name, as before: the rest of the root, then the roots upstream (not restored here) from the start
        names = [os.path.basename(u) for u in lister]
        assert names == ["shard-000002.tar", "shard-000003.tar"] + [f"shard-{i:06d}.tar" for i in range(SHARDS)]


class TestStamp:
    """What the archive loader records of the file it is inside, from what the open already knows."""

    def test_remote_file_details(self) -> None:
        from pipekit.pipes._archives import _stream_stamp
        from pipekit.pipes._fsspec_io import RetryingFile
        from pipekit.pipes.base import StreamWrapper
        from pipekit.retry import RetryPolicy

        class S3Like(io.BytesIO):  # s3fs's files carry the info() of their open as .details
            details = {"size": 4, "ETag": '"0cc175b9c0f1b6a831c399e269772661"', "LastModified": "2026-11-28"}

        stream = StreamWrapper(RetryingFile(lambda: S3Like(b"abcd"), "s3://b/k.tar", "test", RetryPolicy()))
        assert _stream_stamp(stream) == '4:"0cc175b9c0f1b6a831c399e269772661"'

    def test_local_file_and_unknowns(self, tmp_path: Path) -> None:
        from pipekit.pipes._archives import _stream_stamp
        from pipekit.pipes.base import StreamWrapper

        path = tmp_path / "a.tar"
        path.write_bytes(b"x" * 7)
        with open(path, "rb") as f:
            assert _stream_stamp(StreamWrapper(f)) == f"7:{path.stat().st_mtime_ns}"
        assert _stream_stamp(StreamWrapper(io.BytesIO(b"abc"))) is None  # nothing to tell: no check


@pytest.mark.s3
@pytest.mark.slow
@pytest.mark.timeout(120)
class TestOnS3:
    """The same through s3fs: the stamp is the object's size and ETag, from the open's own HEAD."""

    def test_object_replaced_while_read(self, s3_server, shards: Path) -> None:
        from pipekit.pipes._fsspec_io import _S3_FILESYSTEMS

        bucket = s3_server.create_bucket()
        fs = s3_server.fs()
        for i in range(SHARDS):
            fs.put(str(shards / f"shard-{i:06d}.tar"), f"{bucket}/train/shard-{i:06d}.tar")
        options = s3_server.storage_options
        root = f"s3://{bucket}/train"

        def make():
            pipe = FSSpecFileLister(root, masks="*.tar", **options)
            return pipe.open_files_by_fsspec(mode="rb", **options).load_from_tar().map(_read)

        expected = list(pipekit.DataLoader(make(), batch_size=None))
        loader = pipekit.DataLoader(make(), batch_size=None)
        it = iter(loader)
        head = [next(it) for _ in range(13)]
        state = loader.state_dict()
        resumed = pipekit.DataLoader(make(), batch_size=None)
        resumed.load_state_dict(state)
        assert head + list(resumed) == expected  # unchanged: exact
        fs.put(str(shards / "shard-000002.tar"), f"{bucket}/train/shard-000001.tar")  # same name, other data
        fs.invalidate_cache()
        again = pipekit.DataLoader(make(), batch_size=None)
        again.load_state_dict(state)
        # in this process the open may trust the listing cached by the first run, whose ETag s3fs then
        # finds expired; either way the resume is refused, naming the object
        with pytest.raises(StageError, match=r"shard-000001\.tar' in load_from_tar: .*(the file changed|no longer "
                                             r"exists)"):
            list(again)
        _S3_FILESYSTEMS.clear()  # as in a new process: nothing cached
        fresh = pipekit.DataLoader(make(), batch_size=None)
        fresh.load_state_dict(state)
        with pytest.raises(StageError, match=r"shard-000001\.tar' in load_from_tar: the file changed since the "
                                             r"checkpoint \(size:version \d+:\"\w+\" then"):
            list(fresh)


class TestListingNamesTheFiles:
    """A changed listing is refused naming the files added or gone, not only the counts."""

    def test_unread_shard_deleted_is_named(self, shards: Path) -> None:
        _, state = _checkpoint(_loader(shards), 13)
        (shards / "shard-000003.tar").unlink()
        with pytest.raises(StageError, match=r"gone '[^']*shard-000003\.tar'"):
            _resumed(shards, state)

    def test_shard_added_is_named(self, shards: Path) -> None:
        _, state = _checkpoint(_loader(shards), 13)
        shutil.copy(shards / "shard-000000.tar", shards / "shard-000000a.tar")
        with pytest.raises(StageError, match=r"new '[^']*shard-000000a\.tar'"):
            _resumed(shards, state)


def _image_loader(root: Path, workers: int = 0) -> pipekit.DataLoader:
    from pipekit import datasets

    pipe = datasets.ImageFolder(root, train=False, size=8, batch_size=None, transform=False, decode=_no_decode)
    return pipekit.DataLoader(pipe, batch_size=None, num_workers=workers, collate_fn=_urls)


def _no_decode(pipe):
    return pipe.map(read_url)


def read_url(item: tuple[str, object]) -> tuple[str, bytes]:
    url, stream = item
    stream.close()
    return url, b""


def _urls(sample: dict) -> str:
    return os.path.basename(sample["url"])


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    for c in ("a", "b"):
        (tmp_path / "images" / c).mkdir(parents=True)
        for i in range(4):
            (tmp_path / "images" / c / f"{c}{i}.jpg").write_bytes(b"x")
    return tmp_path / "images"


class TestImageFolder:
    """ImageFolder lists its files when built: a resumed run's new listing must be the checkpointed one."""

    def test_unchanged_resumes_exactly(self, image_folder: Path) -> None:
        expected = list(_image_loader(image_folder))
        head, state = _checkpoint(_image_loader(image_folder), 3)
        assert head + _resumed_images(image_folder, state) == expected

    def test_unread_file_deleted_refused_naming_it(self, image_folder: Path) -> None:
        head, state = _checkpoint(_image_loader(image_folder), 3)
        assert head == ["a0.jpg", "a1.jpg", "a2.jpg"]
        (image_folder / "b" / "b1.jpg").unlink()
        with pytest.raises(StageError, match=r"ImageFolder.*changed.*gone '[^']*b1\.jpg'"):
            _resumed_images(image_folder, state)

    def test_file_added_refused_naming_it(self, image_folder: Path) -> None:
        _, state = _checkpoint(_image_loader(image_folder), 3)
        (image_folder / "a" / "a00.jpg").write_bytes(b"x")
        with pytest.raises(StageError, match=r"new '[^']*a00\.jpg'"):
            _resumed_images(image_folder, state)

    def test_content_replaced_is_read_afresh(self, image_folder: Path) -> None:
        # positions count names, and each file is read whole: new contents under the same names lose nothing
        expected = list(_image_loader(image_folder))
        head, state = _checkpoint(_image_loader(image_folder), 3)
        (image_folder / "b" / "b1.jpg").write_bytes(b"other")
        assert head + _resumed_images(image_folder, state) == expected


def _resumed_images(root: Path, state: dict) -> list:
    loader = _image_loader(root)
    loader.load_state_dict(state)
    return list(loader)


def _listed(root: Path, workers: int = 0) -> pipekit.DataLoader:
    from pipekit.pipes import IterableWrapper

    pipe = IterableWrapper([str(root)]).list_files(masks="*.bin")
    if workers:
        pipe = pipe.sharding_filter()
    return pipekit.DataLoader(pipe.map(os.path.basename), batch_size=None, num_workers=workers)


@pytest.fixture
def bin_files(tmp_path: Path) -> Path:
    for i in range(8):
        (tmp_path / f"f{i}.bin").write_bytes(b"x")
    return tmp_path


class TestTorchListFiles:
    """torch's ``list_files`` (FileLister): resumed exactly, and refused when its listing changed."""

    def test_resumes_exactly(self, bin_files: Path) -> None:
        expected = list(_listed(bin_files))
        loader = _listed(bin_files)
        head, state = _checkpoint(loader, 3)
        resumed = _listed(bin_files)
        resumed.load_state_dict(state)
        assert head + list(resumed) == expected

    def test_unread_file_deleted_refused_naming_it(self, bin_files: Path) -> None:
        head, state = _checkpoint(_listed(bin_files), 3)
        assert head == ["f0.bin", "f1.bin", "f2.bin"]
        (bin_files / "f5.bin").unlink()
        resumed = _listed(bin_files)
        resumed.load_state_dict(state)
        with pytest.raises(StageError, match=r"list_files: .*changed.*gone '[^']*f5\.bin'"):
            list(resumed)
