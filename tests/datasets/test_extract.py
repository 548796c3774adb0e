"""extract_archive against hostile archives: bombs (bytes, members, ratio) and link chains.

The bombs are real archives, built by streaming zeros through zipfile, tarfile and gzip (never holding
them in memory).  Each limit is shown at its default where that takes at most a few hundred MB of zeros,
and at a lower per-call value otherwise.  When an archive is refused, nothing is written to the target.
"""

from __future__ import annotations

import gzip
import io
import os
import tarfile
import zipfile
from pathlib import Path

import pytest

from pipekit.datasets import _extract
from pipekit.datasets._download import extract_archive
from pipekit.errors import ArchiveError

MiB = 1 << 20


class Zeros(io.RawIOBase):
    """``n`` zero bytes, read in chunks."""

    def __init__(self, n: int) -> None:
        self.left = n

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        n = min(len(buffer), self.left)
        buffer[:n] = bytes(n)
        self.left -= n
        return n


def zip_of_zeros(path: Path, sizes: dict[str, int]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for name, size in sizes.items():
            with zf.open(name, "w", force_zip64=size > 2**31) as out:
                reader = io.BufferedReader(Zeros(size), MiB)
                while chunk := reader.read(MiB):
                    out.write(chunk)
    return path


def tar_of_zeros(path: Path, sizes: dict[str, int], mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode) as tar:
        for name, size in sizes.items():
            info = tarfile.TarInfo(name)
            info.size = size
            tar.addfile(info, io.BufferedReader(Zeros(size), MiB))
    return path


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.fixture(scope="module")
def zip_bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 1 MB on disk, 1 GiB extracted."""
    return zip_of_zeros(tmp_path_factory.mktemp("bomb") / "bomb.zip", {"a.txt": 10, "zeros.bin": 1 << 30})


class TestDefaults:
    def test_the_defaults(self) -> None:
        assert _extract.MAX_EXTRACT_BYTES == 256 << 30
        assert _extract.MAX_EXTRACT_MEMBERS == 10_000_000
        assert _extract.MAX_EXTRACT_RATIO == 250

    @pytest.mark.slow
    @pytest.mark.timeout(120)
    def test_a_1_mb_zip_expanding_to_1_gib_is_refused_before_writing(self, zip_bomb: Path, tmp_path: Path) -> None:
        assert zip_bomb.stat().st_size < 2 * MiB
        dst = tmp_path / "out"
        with pytest.raises(ArchiveError, match="max_ratio") as info:
            extract_archive(zip_bomb, dst)
        message = str(info.value)
        assert "bomb.zip" in message and "'zeros.bin'" in message and "extract_archive" in message
        assert listing(dst) == []
        out = extract_archive(zip_bomb, dst, max_ratio=2000)  # trusted: the limit is raised per call
        assert os.path.getsize(os.path.join(out, "zeros.bin")) == 1 << 30

    @pytest.mark.timeout(120)
    def test_a_tar_gz_member_expanding_far_beyond_the_archive_is_refused(self, tmp_path: Path) -> None:
        src = tar_of_zeros(tmp_path / "bomb.tar.gz", {"ok.txt": 3, "big.bin": 128 * MiB})
        assert src.stat().st_size < MiB
        dst = tmp_path / "out"
        with pytest.raises(ArchiveError, match=r"'big\.bin'.*max_ratio"):
            extract_archive(src, dst)
        assert listing(dst) == []

    @pytest.mark.timeout(120)
    def test_a_single_gz_expanding_far_beyond_itself_is_refused_and_leaves_nothing(self, tmp_path: Path) -> None:
        src = tmp_path / "zeros.bin.gz"
        with gzip.open(src, "wb") as out:
            reader = io.BufferedReader(Zeros(128 * MiB), MiB)
            while chunk := reader.read(MiB):
                out.write(chunk)
        dst = tmp_path / "out"
        with pytest.raises(ArchiveError, match=r"zeros\.bin\.gz.*max_ratio"):
            extract_archive(src, dst)
        assert listing(dst) == []


class TestPerCallLimits:
    def test_max_bytes(self, tmp_path: Path) -> None:
        src = tar_of_zeros(tmp_path / "a.tar", {"a": 1000, "b": 1000, "c": 1000}, "w")
        with pytest.raises(ArchiveError, match=r"'c'.*max_bytes=2,500") as info:
            extract_archive(src, tmp_path / "out", max_bytes=2500)
        assert "a.tar" in str(info.value) and listing(tmp_path / "out") == []
        extract_archive(src, tmp_path / "out", max_bytes=3000)
        assert listing(tmp_path / "out") == ["a", "b", "c"]

    def test_a_3_gib_member_of_a_small_tar_gz_is_refused_on_its_header(self, tmp_path: Path) -> None:
        # the header declares the size: refused before its data is decompressed (no MemoryError, no disk filled)
        info = tarfile.TarInfo("huge.bin")
        info.size = 3 << 30
        src = tmp_path / "huge.tar.gz"
        with gzip.open(src, "wb") as out:  # the header, then the first 64 MiB of its data
            out.write(info.tobuf(tarfile.GNU_FORMAT))
            reader = io.BufferedReader(Zeros(64 * MiB), MiB)
            while chunk := reader.read(MiB):
                out.write(chunk)
        with pytest.raises(ArchiveError, match=r"'huge\.bin'.*3,221,225,472.*max_bytes=1,073,741,824"):
            extract_archive(src, tmp_path / "out", max_bytes=1 << 30)
        assert listing(tmp_path / "out") == []

    @pytest.mark.parametrize("kind", ["zip", "tar"])
    def test_max_members(self, tmp_path: Path, kind: str) -> None:
        sizes = {f"d/{i}.txt": 1 for i in range(5)}
        src = zip_of_zeros(tmp_path / "m.zip", sizes) if kind == "zip" else tar_of_zeros(tmp_path / "m.tar", sizes)
        with pytest.raises(ArchiveError, match=r"'d/4\.txt'.*max_members=4"):
            extract_archive(src, tmp_path / "out", max_members=4)
        assert listing(tmp_path / "out") == []
        extract_archive(src, tmp_path / "out", max_members=5)
        assert len(listing(tmp_path / "out" / "d")) == 5

    @pytest.mark.parametrize("bad", [0, -1, "1", 1.5])
    def test_bad_limits(self, tmp_path: Path, bad: object) -> None:
        src = tar_of_zeros(tmp_path / "a.tar", {"a": 1}, "w")
        for name in ("max_bytes", "max_members", "max_ratio"):
            with pytest.raises((TypeError, ValueError), match=name):
                extract_archive(src, tmp_path / "out", **{name: bad})


class TestNothingWrittenWhenRefused:
    def test_a_link_chain_refused_at_extraction_time_leaves_the_target_empty(self, tmp_path: Path) -> None:
        # each link alone stays inside the target (checked before extracting), but once x/y -> .. exists on
        # disk, z -> x/y/.. points out of it: the refusal comes while extracting, after a.txt and x/y were written
        members = [tarfile.TarInfo("a.txt"), tarfile.TarInfo("x/y"), tarfile.TarInfo("z")]
        members[0].size = 3
        members[1].type = members[2].type = tarfile.SYMTYPE
        members[1].linkname, members[2].linkname = "..", "x/y/.."
        src = tmp_path / "chain.tar"
        with tarfile.open(src, "w") as tar:
            for m in members:
                tar.addfile(m, io.BytesIO(b"abc") if m.isfile() else None)
        dst = tmp_path / "a" / "out"
        with pytest.raises(ArchiveError, match=r"chain\.tar.*'z'"):
            extract_archive(src, dst)
        assert listing(dst) == [] and listing(tmp_path / "a") == ["out"]

    def test_existing_files_in_the_target_stay_and_extracted_ones_merge(self, tmp_path: Path) -> None:
        dst = tmp_path / "out"
        (dst / "d").mkdir(parents=True)
        (dst / "d" / "kept.txt").write_text("kept")
        (dst / "d" / "x.txt").write_text("old")
        src = tar_of_zeros(tmp_path / "a.tar", {"d/x.txt": 2, "d/e/y.txt": 1}, "w")
        extract_archive(src, dst)
        assert listing(dst) == ["d", "d/e", "d/e/y.txt", "d/kept.txt", "d/x.txt"]
        assert (dst / "d" / "x.txt").read_bytes() == b"\0\0" and (dst / "d" / "kept.txt").read_text() == "kept"

    def test_default_target_next_to_the_archive(self, tmp_path: Path) -> None:
        src = zip_of_zeros(tmp_path / "a.zip", {"d/y.txt": 4})
        assert extract_archive(src) == str(tmp_path.resolve())
        assert listing(tmp_path) == ["a.zip", "d", "d/y.txt"]


def test_download_and_extract_archive_passes_the_limits_on(tmp_path: Path) -> None:
    from pipekit.datasets._download import download_and_extract_archive

    src = tar_of_zeros(tmp_path / "a.tar", {"a": 1, "b": 1}, "w")
    with pytest.raises(ArchiveError, match=r"'b'.*max_members=1"):
        download_and_extract_archive(str(src), tmp_path / "dl", tmp_path / "ex", max_members=1)
    assert listing(tmp_path / "ex") == []
    download_and_extract_archive(str(src), tmp_path / "dl", tmp_path / "ex", max_members=2, max_bytes=2, max_ratio=1)
    assert listing(tmp_path / "ex") == ["a", "b"]


def _zip_with(path: Path, data: bytes, compress_type: int = zipfile.ZIP_STORED) -> Path:
    with zipfile.ZipFile(path, "w", compress_type) as zf:
        zf.writestr("a.txt", data)
    return path


def _patch_both_headers(path: Path, patch) -> None:  # type: ignore[no-untyped-def]
    """Apply ``patch(data, offset)`` at the local header (0) and at the central directory entry of the one member."""
    data = bytearray(path.read_bytes())
    patch(data, 0)
    patch(data, data.find(b"PK\x01\x02") + 2)  # the central entry has one more 2-byte field before the same ones
    path.write_bytes(bytes(data))


class TestCorruptOrUnsupported:
    """Corrupt or unsupported archives raise ArchiveError naming the archive (and the member), and write nothing:
    zlib.error, RuntimeError ("password required") and NotImplementedError came through bare."""

    def test_corrupt_deflate_data_in_a_zip(self, tmp_path: Path) -> None:
        src = _zip_with(tmp_path / "corrupt.zip", os.urandom(200) + bytes(5000), zipfile.ZIP_DEFLATED)
        data = bytearray(src.read_bytes())
        start = 30 + len("a.txt") + 10
        data[start:start + 40] = bytes(b ^ 0xFF for b in data[start:start + 40])
        src.write_bytes(bytes(data))
        with pytest.raises(ArchiveError, match=r"corrupt\.zip.*extract_archive.*(zlib|error|BadZipFile)"):
            extract_archive(src, tmp_path / "out")
        assert listing(tmp_path / "out") == []

    def test_a_corrupt_single_gz(self, tmp_path: Path) -> None:
        raw = bytearray(gzip.compress(os.urandom(100) + bytes(10000)))
        raw[20:60] = bytes(b ^ 0xFF for b in raw[20:60])
        src = tmp_path / "x.gz"
        src.write_bytes(bytes(raw))
        with pytest.raises(ArchiveError, match=r"x\.gz.*extract_archive"):
            extract_archive(src, tmp_path / "out")
        assert listing(tmp_path / "out") == []

    def test_an_encrypted_zip_member_is_refused_before_writing(self, tmp_path: Path) -> None:
        src = _zip_with(tmp_path / "enc.zip", b"hello")

        def encrypted(data: bytearray, at: int) -> None:
            data[at + 6] |= 1  # general purpose flag bit 0: encrypted

        _patch_both_headers(src, encrypted)
        with pytest.raises(ArchiveError, match=r"enc\.zip.*member 'a\.txt' refused: it is encrypted"):
            extract_archive(src, tmp_path / "out")
        assert listing(tmp_path / "out") == []

    def test_an_unsupported_compression_method_is_refused_before_writing(self, tmp_path: Path) -> None:
        src = _zip_with(tmp_path / "method.zip", b"hello")

        def method_99(data: bytearray, at: int) -> None:
            data[at + 8:at + 10] = (99).to_bytes(2, "little")  # AES (WinZip): not in zipfile

        _patch_both_headers(src, method_99)
        with pytest.raises(ArchiveError, match=r"method\.zip.*member 'a\.txt' refused: compression method 99"):
            extract_archive(src, tmp_path / "out")
        assert listing(tmp_path / "out") == []
