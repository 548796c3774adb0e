"""Archive loaders refuse a member larger than their per-member byte limit, before reading it (issue 35).

A 3 MB ``.tar.gz`` can hold a 3 GiB member of zeros: read whole (``TarShards``, ``.read()`` in a map,
``on_error="skip"``'s read-ahead), it ended in a bare ``MemoryError`` or exhausted memory.  The member's
size is in its header (tar) or the central directory (zip), so it is checked before a byte is read.
"""

from __future__ import annotations

import gzip
import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from pipekit.errors import ArchiveError
from pipekit.pipes import FSSpecFileLister, _archives


def _tar(path: Path, members: dict[str, bytes], gz: bool = False) -> Path:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(gzip.compress(buf.getvalue(), 1) if gz else buf.getvalue())
    return path


def _bomb_header(path: Path) -> Path:
    """A .tar.gz whose member declares 3 GiB (its data cut short: the header is what the limit reads)."""
    info = tarfile.TarInfo("0001.bin")
    info.size = 3 << 30
    path.write_bytes(gzip.compress(info.tobuf() + b"\0" * 4096, 1))
    return path


def _names(pipe) -> list[tuple[str, bytes]]:
    return [(url.rsplit("/", 1)[-1], stream.read()) for url, stream in pipe]


def _load_tar(path: Path, **kwargs):
    return FSSpecFileLister(str(path)).open_files_by_fsspec(mode="rb").load_from_tar(**kwargs)


def _load_zip(path: Path, **kwargs):
    return FSSpecFileLister(str(path)).open_files_by_fsspec(mode="rb").load_from_zip(**kwargs)


class TestTar:
    def test_default_limit_refuses_a_declared_3gib_member_before_reading(self, tmp_path: Path) -> None:
        path = _bomb_header(tmp_path / "bomb.tar.gz")
        with pytest.raises(ArchiveError) as info:
            next(iter(_load_tar(path)))
        message = str(info.value)
        assert "bomb.tar.gz" in message and "0001.bin" in message and "load_from_tar" in message
        assert f"max_member_bytes={_archives.MAX_MEMBER_BYTES:,}" in message

    @pytest.mark.parametrize("gz", [False, True])
    def test_own_limit(self, tmp_path: Path, gz: bool) -> None:
        path = _tar(tmp_path / ("a.tar.gz" if gz else "a.tar"), {"small": b"x" * 10, "big": b"y" * 2000})
        pipe = _load_tar(path, max_member_bytes=1000)
        it = iter(pipe)
        url, stream = next(it)
        assert url.endswith("/small") and stream.read() == b"x" * 10
        with pytest.raises(ArchiveError, match=r"member 'big' .*2,000 bytes.*max_member_bytes=1,000"):
            next(it)
        assert _names(_load_tar(path, max_member_bytes=2000)) == [("small", b"x" * 10), ("big", b"y" * 2000)]

    def test_skip_counts_the_member_and_goes_on(self, tmp_path: Path) -> None:
        path = _tar(tmp_path / "a.tar", {"big": b"y" * 2000, "small": b"x"})
        pipe = _load_tar(path, max_member_bytes=1000, on_error="skip")
        assert _names(pipe) == [("small", b"x")]
        assert pipe.skip_log.count == 1 and "big" in pipe.skip_log.skipped[0].reason

    def test_tar_samples_loader_reads_whole_members_under_the_default(self, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(_archives, "MAX_MEMBER_BYTES", 1000)
        path = _tar(tmp_path / "a.tar", {"0.jpg": b"y" * 2000})
        pipe = FSSpecFileLister(str(path)).open_files_by_fsspec(mode="rb").load_tar_samples()
        with pytest.raises(ArchiveError, match="max_member_bytes=1,000"):
            list(pipe)

    def test_bad_limit(self, tmp_path: Path) -> None:
        with pytest.raises(ValueError, match="max_member_bytes must be"):
            _load_tar(tmp_path, max_member_bytes=0)


class TestZip:
    def test_own_limit(self, tmp_path: Path) -> None:
        path = tmp_path / "a.zip"
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
            zf.writestr("small", b"x" * 10)
            zf.writestr("big", b"\0" * 5000)
        it = iter(_load_zip(path, max_member_bytes=1000))
        assert next(it)[1].read() == b"x" * 10
        with pytest.raises(ArchiveError, match=r"a\.zip.*load_from_zip.*member 'big' .*5,000 bytes.*max_member_bytes"):
            next(it)


class TestEmptyArchive:
    """An archive without a file member yields nothing: said once, not mistaken for data (issue 35)."""

    @pytest.mark.parametrize("kind", ["tar", "zip"])
    def test_warns_once_naming_it(self, tmp_path: Path, kind: str) -> None:
        path = tmp_path / f"empty.{kind}"
        if kind == "tar":
            _tar(path, {})
        else:
            with zipfile.ZipFile(path, "w"):
                pass
        pipe = _load_tar(path) if kind == "tar" else _load_zip(path)
        with pytest.warns(UserWarning, match=rf"load_from_{kind}: '[^']*empty\.{kind}' holds no files"):
            assert list(pipe) == []
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert list(pipe) == []  # once per archive and pipe
