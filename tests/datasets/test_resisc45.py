"""Tests for datasets.RESISC45: a small NWPU-RESISC45 archive (real JPEG chips) and split lists served from loopback."""

from __future__ import annotations

import hashlib
import io
import shutil
import zipfile

import numpy as np
import pytest
import torch
from PIL import Image

import pipekit
from mirror_server import serve
from pipekit.datasets import RESISC45, DatasetNotFoundError
from pipekit.errors import HashError, ReadError

CLASSES = ["airplane", "airport", "baseball_diamond"]
SIZE = 16
# chip (class, n) is filled with 20 * (3 * class + n + 1); chip n of each class is in split n, as the real lists
# hold every class in every split
SPLITS = {split: [(c, n) for c in CLASSES] for n, split in enumerate(("train", "val", "test"))}


def _fill(name: str, n: int) -> int:
    return 20 * (3 * CLASSES.index(name) + n + 1)


def _jpeg(value: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((SIZE, SIZE, 3), value, np.uint8)).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


@pytest.fixture(scope="module")
def files() -> dict[str, bytes]:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name in CLASSES:
            for n in range(3):
                zf.writestr(f"NWPU-RESISC45/{name}/{name}_{n + 1:03d}.jpg", _jpeg(_fill(name, n)))
    out = {"/r45/NWPU-RESISC45.zip": buf.getvalue()}
    for split, chips in SPLITS.items():
        out[f"/r45/resisc45-{split}.txt"] = "".join(f"{c}_{n + 1:03d}.jpg\n" for c, n in chips).encode()
    return out


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


@pytest.fixture
def mirror(files, monkeypatch):
    with serve() as server:
        server.files.update(files)
        monkeypatch.setattr(RESISC45, "url", server.url + "/r45/NWPU-RESISC45.zip")
        monkeypatch.setattr(RESISC45, "md5", md5(files["/r45/NWPU-RESISC45.zip"]))
        monkeypatch.setattr(RESISC45, "split_urls", {s: f"{server.url}/r45/resisc45-{s}.txt" for s in SPLITS})
        monkeypatch.setattr(RESISC45, "split_md5s", {s: md5(files[f"/r45/resisc45-{s}.txt"]) for s in SPLITS})
        yield server


def fill_of(image: torch.Tensor) -> int:
    return min((_fill(c, n) for c in CLASSES for n in range(3)), key=lambda v: abs(v - float(image.mean())))


@pytest.fixture
def downloaded(mirror, tmp_path) -> RESISC45:
    return RESISC45(tmp_path, download=True, checksum=True)


class TestRESISC45:
    def test_download_checksum_splits_and_samples(self, mirror, tmp_path):
        ds = RESISC45(tmp_path, download=True, checksum=True)
        assert sorted(p.name for p in tmp_path.iterdir()) == [
            "NWPU-RESISC45", "NWPU-RESISC45.zip", "resisc45-test.txt", "resisc45-train.txt", "resisc45-val.txt"]
        assert ds.classes == CLASSES and len(ds) == 3
        sample = ds[2]
        assert set(sample) == {"image", "label"}
        assert sample["image"].dtype == torch.float32 and sample["image"].shape == (3, SIZE, SIZE)
        assert sample["label"].dtype == torch.int64 and sample["label"].shape == () and int(sample["label"]) == 2
        n = len(mirror.requests)
        for split, chips in SPLITS.items():  # already downloaded: no request
            part = RESISC45(tmp_path, split=split)
            assert sorted(fill_of(part[i]["image"]) for i in range(len(part))) == sorted(_fill(*c) for c in chips)
        assert len(mirror.requests) == n
        with pytest.raises(ValueError, match="train, val, test"):
            RESISC45(tmp_path, split="all")

    def test_archive_found_is_extracted(self, downloaded, tmp_path):
        shutil.rmtree(tmp_path / "NWPU-RESISC45")
        assert len(RESISC45(tmp_path, split="test", checksum=True)) == 3

    def test_checksum_mismatch(self, mirror, tmp_path):
        mirror.files["/r45/NWPU-RESISC45.zip"] = b"PK\x03\x04 truncated"
        with pytest.raises(HashError, match=r"NWPU-RESISC45\.zip' in RESISC45: md5 mismatch.*by hand"):
            RESISC45(tmp_path, download=True, checksum=True)
        assert not list(tmp_path.iterdir())

    def test_partial_download_is_resumed(self, mirror, files, tmp_path):
        (tmp_path / "NWPU-RESISC45.zip.part").write_bytes(files["/r45/NWPU-RESISC45.zip"][:300])
        assert len(RESISC45(tmp_path, download=True, checksum=True)) == 3
        assert ("/r45/NWPU-RESISC45.zip", "bytes=300-") in mirror.requests

    def test_refused_download_says_what_to_fetch_by_hand(self, mirror, tmp_path):
        mirror.status["/r45/resisc45-val.txt"] = 403  # the host wants a login
        with pytest.raises(ReadError, match=r"HTTP 403.*download http://\S+/r45/resisc45-val\.txt \(md5 \w+\) "
                                            r"to '.*resisc45-val\.txt'"):
            RESISC45(tmp_path, download=True)

    def test_login_page_instead_of_the_archive(self, mirror, tmp_path):
        mirror.files["/r45/NWPU-RESISC45.zip"] = b"<html><body>Sign in to continue</body></html>"
        with pytest.raises(pipekit.errors.ArchiveError, match=r"NWPU-RESISC45\.zip.*in RESISC45.*by hand"):
            RESISC45(tmp_path, download=True)  # without checksum=True: the extraction finds it out

    def test_not_downloaded(self, tmp_path):
        with pytest.raises(DatasetNotFoundError, match=r"Dataset not found.*by hand.*NWPU-RESISC45\.zip.*"
                                                       r"resisc45-train\.txt"):
            RESISC45(tmp_path)

    def test_transforms_not_callable_is_refused_naming_it(self, tmp_path):
        with pytest.raises(TypeError, match="RESISC45: transforms must be callable or None, got 5"):
            RESISC45(tmp_path, transforms=5)  # refused as such, not as a dataset not found

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
                                      generator=torch.Generator().manual_seed(4))

        first = loader()
        it = iter(first)
        seen = [fill_of(next(it)["image"][0])]
        state = first.state_dict()
        rest = [fill_of(b["image"][0]) for b in it]
        resumed = loader()
        resumed.load_state_dict(state)
        assert [fill_of(b["image"][0]) for b in resumed] == rest
        assert sorted(seen + rest) == sorted(_fill(*c) for c in SPLITS["train"])
