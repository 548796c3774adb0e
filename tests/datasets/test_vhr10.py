"""Tests for datasets.VHR10: a small NWPU VHR-10 archive laid out like the real one, served from loopback."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile

import numpy as np
import pytest
import torch
from PIL import Image

import pipekit
from mirror_server import serve
from pipekit.datasets import VHR10, DatasetNotFoundError
from pipekit.errors import HashError, ReadError

H, W = 12, 16
DIR = "NWPU VHR-10 dataset"
ZIP_PATH = "/vhr10/NWPU VHR-10 dataset.zip"
ANN_PATH = "/vhr10/annotations.json"
# three positive images; image i is filled with FILL[i] and holds objects of category i + 1
FILL = (40, 120, 200)


def _jpeg(value: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((H, W, 3), value, np.uint8)).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def _annotations() -> dict:
    images = [{"id": i, "file_name": f"{i + 1:03d}.jpg", "width": W, "height": H} for i in range(3)]
    anns = [{"id": i, "image_id": i, "category_id": i + 1, "bbox": [2, 3, 4, 5], "iscrowd": 0,
             "segmentation": [[2, 3, 6, 3, 6, 8, 2, 8]]} for i in range(3)]
    # TorchGeo's own fixture polygon: 9 values; pycocotools reads its first 4 points
    anns.append({"id": 3, "image_id": 2, "category_id": 10, "bbox": [1, 1, 4, 4], "iscrowd": 0,
                 "segmentation": [[1, 1, 2, 2, 3, 3, 4, 5, 5]]})
    return {"images": images, "annotations": anns,
            "categories": [{"id": c, "name": n} for c, n in enumerate(VHR10.categories) if c]}


@pytest.fixture(scope="module")
def files() -> dict[str, bytes]:
    ann = json.dumps(_annotations()).encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for i, value in enumerate(FILL):
            zf.writestr(f"{DIR}/positive image set/{i + 1:03d}.jpg", _jpeg(value))
        for i in range(2):
            zf.writestr(f"{DIR}/negative image set/{i + 1:03d}.jpg", _jpeg(90))
    return {ZIP_PATH: buf.getvalue(), ANN_PATH: ann}


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


@pytest.fixture
def mirror(files, monkeypatch):
    with serve() as server:
        server.files.update(files)
        monkeypatch.setitem(VHR10.image_meta, "url", server.url + "/vhr10/NWPU%20VHR-10%20dataset.zip")
        monkeypatch.setitem(VHR10.image_meta, "md5", md5(files[ZIP_PATH]))
        monkeypatch.setitem(VHR10.target_meta, "url", server.url + ANN_PATH)
        monkeypatch.setitem(VHR10.target_meta, "md5", md5(files[ANN_PATH]))
        yield server


def fill_of(image: torch.Tensor) -> int:
    return min(FILL, key=lambda v: abs(v - float(image.mean())))


@pytest.fixture
def downloaded(mirror, tmp_path) -> VHR10:
    return VHR10(tmp_path, download=True, checksum=True)


class TestVHR10:
    def test_download_checksum_and_samples(self, mirror, tmp_path):
        ds = VHR10(tmp_path, download=True, checksum=True)
        assert (tmp_path / "NWPU VHR-10 dataset.zip").is_file() and (tmp_path / DIR / "annotations.json").is_file()
        assert len(ds) == 3 and isinstance(ds, pipekit.datasets.NonGeoDataset)
        sample = ds[0]
        assert set(sample) == {"image", "label", "bbox_xyxy", "mask"}
        assert sample["image"].dtype == torch.float32 and sample["image"].shape == (3, H, W)
        assert sample["label"].tolist() == [1] and sample["label"].dtype == torch.int64
        assert sample["bbox_xyxy"].tolist() == [[2.0, 3.0, 6.0, 8.0]] and sample["bbox_xyxy"].dtype == torch.float32
        assert sample["mask"].dtype == torch.bool and sample["mask"].shape == (1, H, W)
        # the COCO rule (pycocotools', TorchGeo's reader): the 4 x 5 polygon covers 20 pixels, not 5 x 6
        assert sample["mask"][0, 3:8, 2:6].all() and sample["mask"].sum() == 20
        assert [fill_of(ds[i]["image"]) for i in range(3)] == list(FILL) and ds[-1]["label"].tolist() == [3, 10]
        with pytest.raises(IndexError):
            ds[3]
        n = len(mirror.requests)
        again = VHR10(tmp_path, checksum=True, transforms=lambda s: {**s, "seen": True})  # found: no request
        assert len(mirror.requests) == n and again[1]["seen"] and len(again) == 3

    def test_negative_split(self, downloaded, tmp_path):
        ds = VHR10(tmp_path, split="negative")
        assert len(ds) == VHR10.negative_size == 150  # TorchGeo's count, whatever the folder holds
        sample = ds[1]
        assert sample["image"].shape == (3, H, W) and sample["label"].shape == (0,)
        assert sample["bbox_xyxy"].shape == (0, 4) and sample["mask"].shape == (0, H, W)
        with pytest.raises(ReadError, match=r"003\.jpg.*in VHR10"):
            ds[2]
        with pytest.raises(ValueError, match="positive, negative"):
            VHR10(tmp_path, split="train")

    def test_odd_length_polygon_is_read_like_pycocotools(self, downloaded):
        # [1, 1, 2, 2, 3, 3, 4, 5, 5]: pycocotools (TorchGeo's reader) uses the first 4 points, not no mask at all
        mask = downloaded[2]["mask"][1]
        assert torch.nonzero(mask).tolist() == [[1, 1], [2, 2]]  # what pycocotools 2.0.10 gives

    def test_checksum_mismatch_names_the_url_and_what_to_do(self, mirror, tmp_path):
        mirror.files[ZIP_PATH] = b"not the archive"
        with pytest.raises(HashError, match=r"NWPU%20VHR-10%20dataset\.zip' in VHR10: md5 mismatch.*by hand") as err:
            VHR10(tmp_path, download=True, checksum=True)
        assert err.value.expected == VHR10.image_meta["md5"]
        assert not list(tmp_path.iterdir())  # nothing kept

    def test_partial_download_is_resumed(self, mirror, files, tmp_path):
        (tmp_path / "NWPU VHR-10 dataset.zip.part").write_bytes(files[ZIP_PATH][:500])
        ds = VHR10(tmp_path, download=True, checksum=True)
        assert (ZIP_PATH, "bytes=500-") in mirror.requests and len(ds) == 3

    def test_refused_download_says_what_to_fetch_by_hand(self, mirror, tmp_path):
        mirror.status[ANN_PATH] = 401  # the host wants a login
        with pytest.raises(ReadError, match=r"HTTP 401.*download http://\S+/annotations\.json \(md5 \w+\) to '.*"
                                            r"NWPU VHR-10 dataset/annotations\.json'"):
            VHR10(tmp_path, download=True)

    def test_not_downloaded(self, tmp_path):
        with pytest.raises(DatasetNotFoundError, match=r"Dataset not found.*download=True.*by hand.*"
                                                       r"NWPU%20VHR-10%20dataset\.zip.*annotations\.json"):
            VHR10(tmp_path)

    def test_plot(self, downloaded, tmp_path):
        import matplotlib.pyplot as plt
        from matplotlib.figure import Figure

        sample = downloaded[2]
        sample.update(prediction_label=sample["label"], prediction_bbox_xyxy=sample["bbox_xyxy"],
                      prediction_mask=sample["mask"], prediction_score=torch.tensor([0.9, 0.2]))
        for kwargs in ({"suptitle": "Test"}, {"show_titles": False, "show_feats": "masks"}):
            assert isinstance(downloaded.plot(sample, **kwargs), Figure)
            plt.close("all")
        assert isinstance(VHR10(tmp_path, split="negative").plot(VHR10(tmp_path, "negative")[0]), Figure)
        plt.close("all")
        with pytest.raises(ValueError, match="show_feats"):
            downloaded.plot(sample, show_feats="labels")

    @pytest.mark.timeout(60)
    def test_two_workers(self, downloaded):
        loader = pipekit.DataLoader(downloaded.pipe(train=False, batch_size=2), num_workers=2)
        batches = list(loader)
        assert sorted(fill_of(img) for b in batches for img in b["image"]) == list(FILL)
        assert all(isinstance(b["bbox_xyxy"], list) for b in batches)

    def test_pipe_resumes_exactly(self, downloaded):
        def loader():
            return pipekit.DataLoader(downloaded.pipe(batch_size=1), num_workers=0,
                                      generator=torch.Generator().manual_seed(5))

        first = loader()
        it = iter(first)
        seen = [fill_of(next(it)["image"][0])]
        state = first.state_dict()
        rest = [fill_of(b["image"][0]) for b in it]
        resumed = loader()
        resumed.load_state_dict(state)
        assert [fill_of(b["image"][0]) for b in resumed] == rest and sorted(seen + rest) == list(FILL)
