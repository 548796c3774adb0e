"""Tests for datasets.UCMerced: a small UC Merced archive (real GeoTIFF chips) and split lists served from loopback."""

from __future__ import annotations

import hashlib
import io
import zipfile

import numpy as np
import pytest
import rasterio
import torch

import pipekit
from mirror_server import serve
from pipekit.datasets import DatasetNotFoundError, UCMerced
from pipekit.errors import HashError, ReadError

CLASSES = ["agricultural", "airplane", "beach"]
# chip (class, n) is filled with 10 * (3 * class + n + 1); airplane02 is 12x16 (the real set has a few off-size
# chips); every split has every class, as the real lists do
SPLITS = {split: [(c, n) for c in CLASSES] for n, split in enumerate(("train", "val", "test"))}


def _fill(name: str, n: int) -> int:
    return 10 * (3 * CLASSES.index(name) + n + 1)


def _tif(value: int, height: int = 16, width: int = 16) -> bytes:
    with rasterio.MemoryFile() as mem:
        with mem.open(driver="GTiff", width=width, height=height, count=3, dtype="uint8") as dst:
            dst.write(np.full((3, height, width), value, np.uint8))
        return mem.read()


@pytest.fixture(scope="module")
def files() -> dict[str, bytes]:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name in CLASSES:
            for n in range(3):
                size = (12, 16) if (name, n) == ("airplane", 2) else (16, 16)
                zf.writestr(f"UCMerced_LandUse/Images/{name}/{name}{n:02d}.tif", _tif(_fill(name, n), *size))
    out = {"/uc/UCMerced_LandUse.zip": buf.getvalue()}
    for split, chips in SPLITS.items():
        out[f"/uc/uc_merced-{split}.txt"] = "".join(f"{c}{n:02d}.tif\n" for c, n in chips).encode()
    return out


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


@pytest.fixture
def mirror(files, monkeypatch):
    with serve() as server:
        server.files.update(files)
        monkeypatch.setattr(UCMerced, "url", server.url + "/uc/")
        monkeypatch.setattr(UCMerced, "md5", md5(files["/uc/UCMerced_LandUse.zip"]))
        monkeypatch.setattr(UCMerced, "split_md5s", {s: md5(files[f"/uc/uc_merced-{s}.txt"]) for s in SPLITS})
        yield server


def fill_of(image: torch.Tensor) -> int:
    return round(float(image.mean()))


@pytest.fixture
def downloaded(mirror, tmp_path) -> UCMerced:
    return UCMerced(tmp_path, download=True, checksum=True)


class TestUCMerced:
    def test_download_checksum_splits_and_samples(self, mirror, tmp_path):
        ds = UCMerced(tmp_path, download=True, checksum=True)
        assert sorted(p.name for p in tmp_path.iterdir()) == [
            "UCMerced_LandUse", "UCMerced_LandUse.zip", "uc_merced-test.txt", "uc_merced-train.txt",
            "uc_merced-val.txt"]
        assert ds.classes == CLASSES and len(ds) == 3
        sample = ds[1]
        assert set(sample) == {"image", "label"}
        assert sample["image"].dtype == torch.float32 and sample["image"].shape == (3, 256, 256)
        assert sample["label"].dtype == torch.int64 and sample["label"].shape == () and int(sample["label"]) == 1
        n = len(mirror.requests)
        for split, chips in SPLITS.items():  # already downloaded: no request
            part = UCMerced(tmp_path, split=split)
            assert sorted(fill_of(part[i]["image"]) for i in range(len(part))) == sorted(_fill(*c) for c in chips)
        assert len(mirror.requests) == n
        resized = UCMerced(tmp_path, split="test")[1]  # airplane02, 12x16 on disk
        assert resized["image"].shape == (3, 256, 256) and fill_of(resized["image"]) == _fill("airplane", 2)
        with pytest.raises(ValueError, match="train, val, test"):
            UCMerced(tmp_path, split="validation")

    def test_archive_found_is_extracted(self, downloaded, tmp_path):
        import shutil

        shutil.rmtree(tmp_path / "UCMerced_LandUse")
        assert len(UCMerced(tmp_path, split="val", checksum=True)) == 3

    def test_checksum_mismatch(self, mirror, tmp_path):
        mirror.files["/uc/uc_merced-train.txt"] = b"tampered\n"
        with pytest.raises(HashError, match=r"uc_merced-train\.txt' in UCMerced: md5 mismatch.*by hand"):
            UCMerced(tmp_path, download=True, checksum=True)
        assert not (tmp_path / "uc_merced-train.txt").exists()

    def test_partial_download_is_resumed(self, mirror, files, tmp_path):
        (tmp_path / "UCMerced_LandUse.zip.part").write_bytes(files["/uc/UCMerced_LandUse.zip"][:700])
        assert len(UCMerced(tmp_path, download=True, checksum=True)) == 3
        assert ("/uc/UCMerced_LandUse.zip", "bytes=700-") in mirror.requests

    def test_failed_download_says_what_to_fetch_by_hand(self, mirror, tmp_path):
        mirror.status["/uc/UCMerced_LandUse.zip"] = 503
        with pytest.raises(ReadError, match=r"HTTP 503.*download http://\S+/uc/UCMerced_LandUse\.zip \(md5 \w+\) "
                                            r"to '.*UCMerced_LandUse\.zip' and extract it there"):
            UCMerced(tmp_path, download=True)

    def test_not_downloaded(self, tmp_path):
        with pytest.raises(DatasetNotFoundError, match=r"Dataset not found.*by hand.*UCMerced_LandUse\.zip.*"
                                                       r"uc_merced-train\.txt"):
            UCMerced(tmp_path)

    def test_transforms_not_callable_is_refused_naming_it(self, tmp_path):
        # refused when the dataset is made, as LandCoverAI and VHR10 do, not at its first sample
        with pytest.raises(TypeError, match="UCMerced: transforms must be callable or None, got 5"):
            UCMerced(tmp_path, transforms=5)

    def test_plot(self, downloaded):
        import matplotlib.pyplot as plt
        from matplotlib.figure import Figure

        sample = downloaded[0]
        assert isinstance(downloaded.plot(sample, suptitle="Test"), Figure)
        assert isinstance(downloaded.plot({**sample, "prediction": sample["label"]}, show_titles=False), Figure)
        plt.close("all")

    @pytest.mark.timeout(60)
    def test_two_workers(self, downloaded):
        batches = list(pipekit.DataLoader(downloaded.pipe(train=False, batch_size=2), num_workers=2))
        assert sorted(fill_of(img) for b in batches for img in b["image"]) == sorted(
            _fill(*c) for c in SPLITS["train"])

    def test_pipe_resumes_exactly(self, downloaded):
        def loader():
            return pipekit.DataLoader(downloaded.pipe(batch_size=1), num_workers=0,
                                      generator=torch.Generator().manual_seed(3))

        first = loader()
        it = iter(first)
        seen = [fill_of(next(it)["image"][0])]
        state = first.state_dict()
        rest = [fill_of(b["image"][0]) for b in it]
        resumed = loader()
        resumed.load_state_dict(state)
        assert [fill_of(b["image"][0]) for b in resumed] == rest
        assert sorted(seen + rest) == sorted(_fill(*c) for c in SPLITS["train"])
