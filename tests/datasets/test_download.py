"""Tests for datasets.download (download_url, extract_archive, check_integrity) and EuroSAT(download=True).

HTTP goes to a real ``http.server`` on loopback (with Range support, and a mode that drops the connection
mid-file); S3 to the local SeaweedFS server.  Nothing here touches the internet.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import os
import shutil
import tarfile
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import rasterio
import torch
from rasterio.transform import from_origin

from pipekit.datasets import DatasetNotFoundError, EuroSAT
from pipekit.datasets._download import check_integrity, download_and_extract_archive, download_url, extract_archive
from pipekit.errors import ArchiveError, HashError, ReadError

PAYLOAD = bytes(range(256)) * 400  # 102,400 bytes


class FileServer(http.server.ThreadingHTTPServer):
    """Serves ``files`` (path -> bytes) with ``Range: bytes=N-[M]``; records the Range headers it got.

    ``drops[path] = n``: the next response for ``path`` announces the full length but sends ``n`` bytes
    of the body and closes the connection (one drop per entry; the entry is removed).
    ``ignore_range``: answer 200 with the whole file to every request.
    """

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), RangeHandler)
        self.files: dict[str, bytes] = {}
        self.drops: dict[str, int] = {}
        self.ranges: list[str | None] = []
        self.ignore_range = False
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class RangeHandler(http.server.BaseHTTPRequestHandler):
    server: FileServer

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "/data.bin")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = self.server.files.get(path)
        header = self.headers.get("Range")
        with self.server.lock:
            self.server.ranges.append(header)
            drop = self.server.drops.pop(path, None)
        if data is None:
            self.send_error(404, "no such file")
            return
        start, end = 0, len(data) - 1
        status = 200
        if header and not self.server.ignore_range:
            first, _, last = header.removeprefix("bytes=").partition("-")
            start = int(first)
            end = int(last) if last else len(data) - 1
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206
        body = data[start:end + 1]
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.end_headers()
        if drop is not None:
            self.wfile.write(body[:drop])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            return
        self.wfile.write(body)


@pytest.fixture
def server() -> Iterator[FileServer]:
    srv = FileServer()
    srv.files["/data.bin"] = PAYLOAD
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class TestDownloadURL:
    def test_http_download_verified_then_kept(self, server, tmp_path):
        download_url(server.url + "/data.bin", tmp_path, md5=md5(PAYLOAD), sha256=sha256(PAYLOAD))
        assert (tmp_path / "data.bin").read_bytes() == PAYLOAD and sorted(os.listdir(tmp_path)) == ["data.bin"]
        assert check_integrity(tmp_path / "data.bin", md5(PAYLOAD))
        n = len(server.ranges)
        download_url(server.url + "/data.bin", tmp_path, md5=md5(PAYLOAD))  # present and verified: no request
        assert len(server.ranges) == n
        download_url(server.url + "/redirect", tmp_path, "other.bin")
        assert (tmp_path / "other.bin").read_bytes() == PAYLOAD

    def test_dropped_connection_resumes_with_range(self, server, tmp_path):
        server.drops["/data.bin"] = 30_000
        download_url(server.url + "/data.bin", tmp_path, "x.bin", sha256=sha256(PAYLOAD))
        assert (tmp_path / "x.bin").read_bytes() == PAYLOAD
        assert server.ranges == [None, "bytes=30000-"]
        assert not (tmp_path / "x.bin.part").exists()

    def test_partial_file_is_kept_and_resumed_by_the_next_call(self, server, tmp_path):
        server.drops["/data.bin"] = 12_345
        with pytest.raises(ReadError, match=r"data\.bin.*interrupted.*12345 bytes kept"):
            download_url(server.url + "/data.bin", tmp_path, retries=0)
        assert (tmp_path / "data.bin.part").read_bytes() == PAYLOAD[:12_345]
        assert not (tmp_path / "data.bin").exists()
        download_url(server.url + "/data.bin", tmp_path, md5=md5(PAYLOAD))
        assert server.ranges[-1] == "bytes=12345-" and (tmp_path / "data.bin").read_bytes() == PAYLOAD

    def test_complete_partial_file_is_verified_and_moved(self, server, tmp_path):
        (tmp_path / "data.bin.part").write_bytes(PAYLOAD)  # e.g. a crash between the last byte and the move
        download_url(server.url + "/data.bin", tmp_path, md5=md5(PAYLOAD))
        assert server.ranges == [f"bytes={len(PAYLOAD)}-"]  # answered 416: nothing left to send
        assert (tmp_path / "data.bin").read_bytes() == PAYLOAD and not (tmp_path / "data.bin.part").exists()

    def test_server_without_range_support_restarts(self, server, tmp_path):
        server.ignore_range = True
        (tmp_path / "data.bin.part").write_bytes(b"stale bytes")
        download_url(server.url + "/data.bin", tmp_path, md5=md5(PAYLOAD))
        assert (tmp_path / "data.bin").read_bytes() == PAYLOAD and server.ranges == ["bytes=11-"]

    def test_checksum_mismatch_names_url_and_digests_and_removes_partial(self, server, tmp_path):
        wrong = "0" * 32
        with pytest.raises(HashError) as info:
            download_url(server.url + "/data.bin", tmp_path, md5=wrong)
        message = str(info.value)
        assert server.url + "/data.bin" in message and wrong in message and md5(PAYLOAD) in message
        assert info.value.expected == wrong and info.value.actual == md5(PAYLOAD)
        assert os.listdir(tmp_path) == []
        with pytest.raises(HashError, match="sha256 mismatch"):
            download_url(server.url + "/data.bin", tmp_path, sha256="1" * 64)

    def test_http_errors(self, server, tmp_path):
        with pytest.raises(ReadError, match=r"missing\.bin.*HTTP 404"):
            download_url(server.url + "/missing.bin", tmp_path)
        with pytest.raises(ValueError, match="retries"):
            download_url(server.url + "/data.bin", tmp_path, retries=-1)

    def test_fsspec_urls_and_resume(self, tmp_path):
        import fsspec

        fs = fsspec.filesystem("memory")
        fs.pipe("/dl-test/data.bin", PAYLOAD)
        try:
            download_url("memory://dl-test/data.bin", tmp_path, md5=md5(PAYLOAD))
            assert (tmp_path / "data.bin").read_bytes() == PAYLOAD
            # a .part file is continued from its length: its (wrong) prefix stays, proving the seek
            (tmp_path / "y.bin.part").write_bytes(b"\x00" * 100)
            download_url("memory://dl-test/data.bin", tmp_path, "y.bin")
            assert (tmp_path / "y.bin").read_bytes() == b"\x00" * 100 + PAYLOAD[100:]
            with pytest.raises(ReadError, match="nothing-here"):
                download_url("memory://dl-test/nothing-here", tmp_path)
        finally:
            fs.rm("/dl-test", recursive=True)

    @pytest.mark.s3
    @pytest.mark.slow
    def test_s3(self, s3_server, tmp_path):
        bucket = s3_server.create_bucket()
        s3_server.fs().pipe(f"{bucket}/d/data.bin", PAYLOAD)
        url = f"s3://{bucket}/d/data.bin"
        (tmp_path / "data.bin.part").write_bytes(PAYLOAD[:5000])
        download_url(url, tmp_path, md5=md5(PAYLOAD), storage_options=s3_server.storage_options)
        assert (tmp_path / "data.bin").read_bytes() == PAYLOAD
        with pytest.raises(HashError, match=url):
            download_url(url, tmp_path, "again.bin", sha256="2" * 64, storage_options=s3_server.storage_options)


def _tar(path: Path, members: list[tarfile.TarInfo], mode: str = "w") -> Path:
    with tarfile.open(path, mode) as tar:
        for m in members:
            tar.addfile(m, io.BytesIO(b"x" * m.size) if m.isfile() else None)
    return path


def _file(name: str, size: int = 3) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    return info


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info


class TestExtract:
    @pytest.mark.parametrize(("suffix", "mode"), [(".tar", "w"), (".tar.gz", "w:gz"), (".tgz", "w:gz"),
                                                  (".tar.bz2", "w:bz2"), (".tar.xz", "w:xz")])
    def test_tar_formats(self, tmp_path, suffix, mode):
        src = _tar(tmp_path / f"a{suffix}", [_file("dir/x.txt"), _link("dir/ln", "x.txt")], mode)
        out = extract_archive(src, tmp_path / "out")
        assert out == str((tmp_path / "out").resolve())
        assert (tmp_path / "out" / "dir" / "x.txt").read_bytes() == b"xxx"
        assert (tmp_path / "out" / "dir" / "ln").read_bytes() == b"xxx"

    def test_zip_and_single_files_and_defaults(self, tmp_path):
        with zipfile.ZipFile(tmp_path / "a.zip", "w") as zf:
            zf.writestr("d/y.txt", "hello")
        extract_archive(tmp_path / "a.zip")  # next to the archive
        assert (tmp_path / "d" / "y.txt").read_text() == "hello"
        import gzip

        with gzip.open(tmp_path / "z.bin.gz", "wb") as f:
            f.write(b"abc")
        assert extract_archive(tmp_path / "z.bin.gz", tmp_path / "o", remove_finished=True).endswith("z.bin")
        assert (tmp_path / "o" / "z.bin").read_bytes() == b"abc" and not (tmp_path / "z.bin.gz").exists()
        with pytest.raises(ValueError, match="not a known archive"):
            extract_archive(tmp_path / "d" / "y.txt")
        (tmp_path / "bad.tar.gz").write_bytes(b"not gzip at all")
        with pytest.raises(ArchiveError, match=r"bad\.tar\.gz"):
            extract_archive(tmp_path / "bad.tar.gz", tmp_path / "o2")

    @pytest.mark.parametrize(("member", "reason"), [
        (_file("../evil"), "'..'"),
        (_file("ok/../../evil"), "'..'"),
        (_file("/abs/evil"), "absolute"),
        (_link("ln", "../../outside"), "points outside"),
        (_link("ln", "/etc/passwd"), "absolute"),
        (_link("hard", "../outside", tarfile.LNKTYPE), "points outside"),
    ])
    def test_malicious_tar_members_are_refused(self, tmp_path, member, reason):
        src = _tar(tmp_path / "evil.tar", [_file("fine.txt"), member])
        dst = tmp_path / "a" / "b"
        with pytest.raises(ArchiveError, match=reason) as info:
            extract_archive(src, dst)
        assert "evil.tar" in str(info.value) and repr(member.name) in str(info.value)
        assert os.listdir(dst) == [] and not (tmp_path / "a" / "evil").exists() and not (tmp_path / "evil").exists()

    def test_symlink_then_write_through_it_is_refused(self, tmp_path):
        src = _tar(tmp_path / "evil.tar", [_link("escape", ".."), _file("escape/evil")])
        with pytest.raises(ArchiveError, match="'escape'"):
            extract_archive(src, tmp_path / "out")
        assert not (tmp_path / "evil").exists()

    def test_chained_links_escaping_at_extraction_time_are_refused(self, tmp_path):
        # each link alone stays inside (checked lexically), but l1 -> l2/.. with l2 -> . is dst's parent
        src = _tar(tmp_path / "evil.tar", [_link("l2", "."), _link("l1", "l2/.."), _file("l1/evil")])
        with pytest.raises(ArchiveError, match=r"'l1/evil'.*goes through the link 'l1'"):
            extract_archive(src, tmp_path / "out")
        assert not (tmp_path / "evil").exists()

    @pytest.mark.parametrize("name", ["../evil", "/abs/evil", "a/../../evil"])
    def test_malicious_zip_members_are_refused(self, tmp_path, name):
        with zipfile.ZipFile(tmp_path / "evil.zip", "w") as zf:
            zf.writestr("fine.txt", "ok")
            zf.writestr(zipfile.ZipInfo(name), "evil")
        with pytest.raises(ArchiveError, match=r"evil\.zip.*refused") as info:
            extract_archive(tmp_path / "evil.zip", tmp_path / "out")
        assert repr(name) in str(info.value) and os.listdir(tmp_path / "out") == []

    def test_zip_symlink_out_is_refused(self, tmp_path):
        info = zipfile.ZipInfo("ln")
        info.create_system = 3
        info.external_attr = (0o120777 << 16)
        with zipfile.ZipFile(tmp_path / "evil.zip", "w") as zf:
            zf.writestr(info, "../../outside")
        with pytest.raises(ArchiveError, match=r"'ln'.*points outside"):
            extract_archive(tmp_path / "evil.zip", tmp_path / "out")

    def test_download_and_extract(self, server, tmp_path):
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as zf:
            zf.writestr("inner/f.txt", "content")
        server.files["/a.zip"] = buf.getvalue()
        download_and_extract_archive(server.url + "/a.zip", tmp_path / "dl", tmp_path / "ex",
                                     md5=md5(buf.getvalue()))
        assert (tmp_path / "ex" / "inner" / "f.txt").read_text() == "content"
        assert (tmp_path / "dl" / "a.zip").exists()


# ---------------------------------------------------------------------------------------------
# EuroSAT from a local mirror

EUROSAT_CLASSES = ["AnnualCrop", "Forest", "River"]


def _eurosat_zip() -> tuple[bytes, dict[str, list[str]]]:
    """A small EuroSATallBands.zip (3 classes x 4 chips of 13 bands) and its split lists (``.jpg`` names)."""
    buf = io.BytesIO()
    splits: dict[str, list[str]] = {"train": [], "val": [], "test": []}
    profile = dict(driver="GTiff", width=8, height=8, count=13, dtype="uint16", crs="EPSG:32631",
                   transform=from_origin(0, 80, 10, 10))
    with zipfile.ZipFile(buf, "w") as zf:
        for label, name in enumerate(EUROSAT_CLASSES):
            for n in range(1, 5):
                mem = rasterio.MemoryFile()
                with mem.open(**profile) as ds:
                    ds.write(np.stack([np.full((8, 8), label * 1000 + n * 20 + b, np.uint16) for b in range(13)]))
                zf.writestr(f"{EuroSAT.base_dir}/{name}/{name}_{n}.tif".replace(os.sep, "/"), mem.read())
                mem.close()
                splits["train" if n <= 2 else "val" if n == 3 else "test"].append(f"{name}_{n}.jpg")
    return buf.getvalue(), splits


@pytest.fixture
def mirror(server) -> type[EuroSAT]:
    data, splits = _eurosat_zip()
    server.files["/eurosat/EuroSATallBands.zip"] = data
    md5s = {}
    for split, names in splits.items():
        text = ("\n".join(names) + "\n").encode()
        server.files[f"/eurosat/eurosat-{split}.txt"] = text
        md5s[split] = md5(text)

    class LocalEuroSAT(EuroSAT):
        url = server.url + "/eurosat/"
        md5 = hashlib.md5(data).hexdigest()
        split_md5s = md5s

    return LocalEuroSAT


class TestEuroSAT:
    def test_download_then_load_from_the_extracted_folder(self, mirror, server, tmp_path):
        ds = mirror(tmp_path, split="train", download=True, checksum=True)
        assert (tmp_path / "EuroSATallBands.zip").exists() and (tmp_path / "eurosat-train.txt").exists()
        assert ds.classes == EUROSAT_CLASSES and len(ds) == 6 and ds.targets == [0, 0, 1, 1, 2, 2]
        sample = ds[2]
        assert sample["image"].shape == (13, 8, 8) and sample["image"].dtype == torch.float32
        assert sample["label"].dtype == torch.int64 and sample["label"].item() == 1
        assert sample["image"][:, 0, 0].tolist() == [1000 + 20 + b for b in range(13)]
        n = len(server.ranges)
        (tmp_path / "EuroSATallBands.zip").rename(tmp_path / "EuroSATallBands.zip.bak")  # the folder is enough
        rgb = mirror(tmp_path, split="val", bands=EuroSAT.BAND_SETS["rgb"], download=True)
        assert len(server.ranges) == n + 1  # only the val list was fetched
        assert len(rgb) == 3 and rgb[0]["image"][:, 0, 0].tolist() == [60 + 3, 60 + 2, 60 + 1]
        again = mirror(tmp_path, split="train")
        assert torch.equal(again[5]["image"], ds[5]["image"])
        # TorchGeo's dataset.root is the class folders' parent (ImageFolder's root): removing it and
        # building again extracts the archive left in the root given
        assert again.root == os.path.join(str(tmp_path), EuroSAT.base_dir)
        shutil.copy(tmp_path / "EuroSATallBands.zip.bak", tmp_path / "EuroSATallBands.zip")
        shutil.rmtree(again.root)
        assert len(mirror(tmp_path, split="train")) == 6

    def test_plot(self, mirror, tmp_path):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        ds = mirror(tmp_path, download=True)
        sample = ds[3]
        fig = ds.plot({**sample, "prediction": torch.tensor(0)}, suptitle="chips")
        assert fig.axes[0].get_title() == "Label: Forest\nPrediction: AnnualCrop"
        assert fig.axes[0].images[0].get_array().shape == (8, 8, 3)
        plt.close(fig)
        with pytest.raises(ValueError, match=r"RGB bands.*B04"):
            mirror(tmp_path, bands=["B02", "B03"]).plot(sample)

    def test_not_found_without_download_and_bad_arguments(self, mirror, tmp_path):
        with pytest.raises(DatasetNotFoundError, match="download=True"):
            mirror(tmp_path)
        with pytest.raises(ValueError, match="split"):
            mirror(tmp_path, split="training")
        with pytest.raises(ValueError, match="'B13' is an invalid band name"):
            mirror(tmp_path, bands=["B13"], download=True)
        assert os.listdir(tmp_path) == []  # nothing was downloaded for a bad argument

    def test_transforms_not_callable_is_refused_before_any_download(self, tmp_path):
        # refused when the dataset is made, as UCMerced does, not after fetching (here: failing to fetch) its data
        class Mirrored(EuroSAT):
            url = (tmp_path / "mirror").as_uri() + "/"

        (tmp_path / "root").mkdir()
        with pytest.raises(TypeError, match="Mirrored: transforms must be callable or None, got 5"):
            Mirrored(tmp_path / "root", transforms=5, download=True)
        assert os.listdir(tmp_path / "root") == []

    def test_archive_present_is_extracted_and_checksums_are_checked(self, mirror, server, tmp_path):
        mirror(tmp_path / "a", download=True)
        root = tmp_path / "b"
        root.mkdir()
        shutil.copy(tmp_path / "a" / "EuroSATallBands.zip", root)
        shutil.copy(tmp_path / "a" / "eurosat-train.txt", root)
        assert len(mirror(root)) == 6  # no download: the archive is extracted
        server.files["/eurosat/EuroSATallBands.zip"] = b"tampered"
        with pytest.raises(HashError, match=r"EuroSATallBands\.zip"):
            mirror(tmp_path / "c", download=True, checksum=True)
        assert not (tmp_path / "c" / "EuroSATallBands.zip").exists()


def test_timeout_is_checked() -> None:
    from pipekit.datasets.utils import download_url

    for bad in (0, -1, "5", True):
        with pytest.raises(ValueError, match="download_url: timeout must be a number of seconds > 0 or None"):
            download_url("http://127.0.0.1:9/x.zip", "/nonexistent-root-r35", timeout=bad)
