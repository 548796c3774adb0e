"""Tests of load_from_bz2, load_from_xz, extract and decompress's error types (pipekit.pipes._decompress).

The Decompressor's formats, streaming and archive hand-over are tested with the archive loaders in
``test_archives.py``; this file covers the single-format loaders and the exception types.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import pickle
import tarfile
import zlib
from pathlib import Path

import pytest

from pipekit.errors import ArchiveError, CorruptStreamError, TruncatedStreamError, UnknownFormatError
from pipekit.pipes import Bz2FileLoader, Decompressor, Extractor, IterableWrapper, XzFileLoader
from pipekit.pipes.base import owner_of
from pipekit.testing import assert_resumes, resume_after

PAYLOAD = b"line one\nline two\nline three\n" * 20
_GZ = gzip.compress(PAYLOAD, mtime=0)  # mtime fixed: the damaged copy below is part of a test id
LINES = PAYLOAD.decode().splitlines()


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("load_from_bz2", "Bz2FileLoader"),
        ("load_from_xz", "XzFileLoader"),
        ("extract", "Extractor"),
        ("decompress", "Decompressor"),
    ],
)
def test_functional_names_are_pipekits(name, cls):
    assert owner_of(name) == f"pipekit.pipes._decompress.{cls}"


def write(root: Path, name: str, data: bytes) -> str:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return str(path)


def read_all(pipe) -> list[tuple[str, bytes]]:
    return [(url, stream.read()) for url, stream in pipe]


def write_tar(path: Path, members: list[tuple[str, bytes]]) -> bytes:
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path.read_bytes()


LOADERS = [
    ("load_from_bz2", Bz2FileLoader, ".bz2", bz2.compress),
    ("load_from_xz", XzFileLoader, ".xz", lzma.compress),
]


@pytest.mark.parametrize(("stage", "cls", "suffix", "compress"), LOADERS)
class TestSingleFormatLoaders:
    def test_decompresses_real_files_and_strips_the_suffix(self, tmp_path, stage, cls, suffix, compress):
        path = write(tmp_path, f"notes.txt{suffix}", compress(PAYLOAD))
        pipe = getattr(IterableWrapper([path]).open_files_by_fsspec(mode="rb"), stage)()
        assert isinstance(pipe, cls)
        assert read_all(pipe) == [(path[: -len(suffix)], PAYLOAD)]

    def test_only_the_suffix_is_stripped(self, tmp_path, stage, cls, suffix, compress):
        # torchdata's rstrip(".bz2") / rstrip(".xz") also ate trailing b/z/2/x/. characters of the name
        names = ["tab", "quiz", "box", "b2.z", "plain"]
        paths = [write(tmp_path, name + suffix, compress(name.encode())) for name in names]
        paths.append(write(tmp_path, "no_suffix.bin", compress(b"kept")))
        pipe = cls(IterableWrapper(paths).open_files_by_fsspec(mode="rb"))
        got = read_all(pipe)
        assert [Path(u).name for u, _ in got] == [*names, "no_suffix.bin"]
        assert [d for _, d in got] == [n.encode() for n in names] + [b"kept"]

    def test_in_memory_streams_and_stream_names(self, stage, cls, suffix, compress):
        pipe = cls(IterableWrapper([("a/b.csv" + suffix, io.BytesIO(compress(b"1,2")))]))
        ((url, stream),) = list(pipe)
        assert (url, stream.name, stream.read()) == ("a/b.csv", "a/b.csv", b"1,2")

    def test_length_as_torchdata(self, stage, cls, suffix, compress):
        with pytest.raises(TypeError, match="doesn't have valid length"):
            len(cls(IterableWrapper([])))
        assert len(cls(IterableWrapper([]), length=3)) == 3
        with pytest.raises(ValueError, match="length"):
            cls(IterableWrapper([]), length=-2)
        with pytest.raises(TypeError, match="length"):
            cls(IterableWrapper([]), length="3")

    def test_damaged_data_is_torchdatas_error_type_with_url_and_stage(self, tmp_path, stage, cls, suffix, compress):
        path = write(tmp_path, f"bad{suffix}", b"this is not compressed data at all")
        ((_, stream),) = list(cls(IterableWrapper([path]).open_files_by_fsspec(mode="rb")))
        builtin = OSError if suffix == ".bz2" else lzma.LZMAError  # what torchdata let through
        with pytest.raises(builtin) as info:
            stream.read()
        assert isinstance(info.value, CorruptStreamError)
        assert (info.value.url, info.value.stage) == (path, stage)

    def test_truncated_data_is_an_eof_error(self, tmp_path, stage, cls, suffix, compress):
        path = write(tmp_path, f"cut{suffix}", compress(PAYLOAD)[:-8])
        ((_, stream),) = list(cls(IterableWrapper([path]).open_files_by_fsspec(mode="rb")))
        with pytest.raises(EOFError) as info:
            stream.read()
        assert isinstance(info.value, TruncatedStreamError)
        assert (info.value.url, info.value.stage) == (path, stage)

    def test_items_must_be_url_stream_pairs(self, stage, cls, suffix, compress):
        with pytest.raises(TypeError, match=stage):
            list(cls(IterableWrapper([b"raw bytes"])))
        with pytest.raises(TypeError, match="binary mode"):
            list(cls(IterableWrapper([("a" + suffix, io.StringIO("text"))])))

    def test_pickle_and_stateless(self, tmp_path, stage, cls, suffix, compress):
        path = write(tmp_path, f"n{suffix}", compress(PAYLOAD))
        pipe = cls(IterableWrapper([path]).open_files_by_fsspec(mode="rb"))
        assert cls.stateless is True
        assert read_all(pickle.loads(pickle.dumps(pipe))) == [(path[: -len(suffix)], PAYLOAD)]
        assert pipe.datapipe is pipe.source_datapipe

    @pytest.mark.parametrize("n", [0, 1, 25, 59, 60, 61, 119])
    def test_readlines_downstream_resumes_mid_file(self, tmp_path, stage, cls, suffix, compress, n):
        paths = [write(tmp_path, f"f{i}.txt{suffix}", compress(PAYLOAD)) for i in range(2)]

        def make():
            return cls(IterableWrapper(paths).open_files_by_fsspec(mode="rb")).readlines(decode=True)

        assert_resumes(make, n)
        if n == 25:
            _, rest = resume_after(make, n)
            assert rest[0] == (paths[0][: -len(suffix)], LINES[25])

    def test_reopen_finds_the_file_without_suffix_too(self, tmp_path, stage, cls, suffix, compress):
        path = write(tmp_path, "data.bin", compress(PAYLOAD))
        pipe = cls(IterableWrapper([path]).open_files_by_fsspec(mode="rb"))
        assert pipe.reopen(path).read() == PAYLOAD
        path2 = write(tmp_path, f"data2.txt{suffix}", compress(PAYLOAD))
        assert pipe.reopen(path2[: -len(suffix)]).read() == PAYLOAD
        with pytest.raises(ArchiveError, match="nothing"):
            pipe.reopen(str(tmp_path / "nothing"))


def test_tar_inside_bz2_loads_with_load_from_tar(tmp_path):
    members = [("a.txt", b"alpha"), ("b.txt", b"beta")]
    tar_bytes = write_tar(tmp_path / "plain.tar", members)
    path = write(tmp_path, "shard.tar.bz2", bz2.compress(tar_bytes))

    def make():
        return IterableWrapper([path]).open_files_by_fsspec(mode="rb").load_from_bz2().load_from_tar()

    got = [(url, stream.read()) for url, stream in make()]
    assert got == [(f"{path[: -len('.bz2')]}/{name}", data) for name, data in members]


class TestExtractor:
    def test_is_torchdatas_alias_of_decompress(self):
        source = IterableWrapper([("a.xz", io.BytesIO(lzma.compress(b"q")))])
        for pipe in (source.extract(), Extractor(source, "xz")):
            assert type(pipe) is Decompressor
        assert read_all(IterableWrapper([("a.xz", io.BytesIO(lzma.compress(b"q")))]).extract()) == [("a.xz", b"q")]


class TestDecompressorErrorTypes:
    def test_unknown_extension_is_a_runtime_error_as_torchdata(self):
        with pytest.raises(RuntimeError, match=r"blob\.bin.*decompress.*unknown compression extension") as info:
            list(IterableWrapper([("blob.bin", io.BytesIO(b""))]).decompress())
        assert isinstance(info.value, UnknownFormatError)
        assert isinstance(info.value, ArchiveError)

    @pytest.mark.parametrize(
        ("name", "data", "builtin"),
        [
            ("bad.gz", b"not gzip data at all", OSError),  # gzip.BadGzipFile
            ("bad.bz2", b"not bz2 data at all", OSError),
            ("bad.xz", b"not xz data at all", lzma.LZMAError),
            ("bad.gz", _GZ[:10] + b"\xff" * 40 + _GZ[50:], zlib.error),
        ],
    )
    def test_damaged_data_is_the_codecs_error_type(self, name, data, builtin):
        ((_, stream),) = list(IterableWrapper([(name, io.BytesIO(data))]).decompress())
        with pytest.raises(builtin) as info:
            stream.read()
        assert isinstance(info.value, CorruptStreamError)
        assert (info.value.url, info.value.stage) == (name, "decompress")

    @pytest.mark.parametrize(("name", "compress"), [("c.gz", gzip.compress), ("c.bz2", bz2.compress)])
    def test_truncated_data_is_an_eof_error(self, name, compress):
        ((_, stream),) = list(IterableWrapper([(name, io.BytesIO(compress(PAYLOAD)[:-8]))]).decompress())
        with pytest.raises(EOFError) as info:
            stream.read()
        assert isinstance(info.value, TruncatedStreamError)
