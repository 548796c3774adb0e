"""LandCoverAI, LandCoverAI100: chips and split lists downloaded and verified, tile archives cut into 512 px chips."""

from __future__ import annotations

import hashlib
import io
import pickle
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import rasterio
import torch
from PIL import Image
from rasterio.transform import from_origin

import pipekit
from pipekit.datasets import DatasetNotFoundError, LandCoverAI, LandCoverAI100, LandCoverAIGeo, stack_samples
from pipekit.errors import HashError
from pipekit.samplers import GridGeoSampler, RandomGeoSampler

from .test_download import FileServer

# chip id -> (image value, mask class); the split lists name them
CHIPS = {"M-33-20-D-c-4-2_0": (10, 1), "M-33-20-D-c-4-2_1": (40, 2), "N-34-97-D-c-2-4_7": (90, 3),
         "N-34-97-D-c-2-4_8": (130, 4)}
LISTS = {"train": ["M-33-20-D-c-4-2_0", "N-34-97-D-c-2-4_7"], "val": ["M-33-20-D-c-4-2_1"],
         "test": ["N-34-97-D-c-2-4_8"]}


def _png(array: np.ndarray, fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, fmt)
    return buf.getvalue()


def _chips_zip(with_lists: bool) -> bytes:
    """An archive of ``output/<id>.jpg`` (RGB 8x8) and ``output/<id>_m.png`` (gray), with the lists if asked."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for id_, (value, cls) in CHIPS.items():
            zf.writestr(f"output/{id_}.jpg", _png(np.full((8, 8, 3), value, np.uint8), "JPEG"))
            zf.writestr(f"output/{id_}_m.png", _png(np.full((8, 8), cls, np.uint8), "PNG"))
        if with_lists:
            for split, ids in LISTS.items():
                zf.writestr(f"{split}.txt", "".join(i + "\n" for i in ids))
    return buf.getvalue()


@pytest.fixture
def server() -> Iterator[FileServer]:
    """test_download's Range-serving HTTP server, polled often so that its shutdown is quick."""
    srv = FileServer()
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.fixture
def mirror(server, monkeypatch) -> FileServer:
    """LandCoverAI's output.zip and split lists, and LandCoverAI100's archive, served with their MD5s set."""
    data = _chips_zip(with_lists=False)
    server.files["/lc/output.zip"] = data
    monkeypatch.setattr(LandCoverAI, "url", server.url + "/lc/output.zip")
    monkeypatch.setattr(LandCoverAI, "md5", hashlib.md5(data).hexdigest())
    metadata = {}
    for split, ids in LISTS.items():
        text = "".join(i + "\n" for i in ids).encode()
        server.files[f"/lc/{split}.txt"] = text
        metadata[split] = {"filename": f"{split}.txt", "md5": hashlib.md5(text).hexdigest()}
    monkeypatch.setattr(LandCoverAI, "metadata", metadata)
    data100 = _chips_zip(with_lists=True)
    server.files["/lc100/mirror.zip"] = data100  # saved as landcoverai100.zip all the same
    monkeypatch.setattr(LandCoverAI100, "url", server.url + "/lc100/mirror.zip")
    monkeypatch.setattr(LandCoverAI100, "md5", hashlib.md5(data100).hexdigest())
    return server


def values(ds) -> list[tuple[int, int]]:
    return [(round(float(ds[i]["image"][0, 0, 0])), int(ds[i]["mask"][0, 0])) for i in range(len(ds))]


@pytest.mark.parametrize("cls", [LandCoverAI, LandCoverAI100])
def test_download_verify_and_splits(mirror, tmp_path, cls):
    with pytest.raises(DatasetNotFoundError, match="use `download=True`"):
        cls(tmp_path)
    for split, ids in LISTS.items():
        ds = cls(tmp_path, split, download=True, checksum=True)
        assert len(ds) == len(ids)
        got = values(ds)
        assert [m for _, m in got] == [CHIPS[i][1] for i in ids]
        assert all(abs(v - CHIPS[i][0]) <= 2 for (v, _), i in zip(got, ids))  # JPEG
    sample = ds[0]
    assert set(sample) == {"image", "mask"}
    assert sample["image"].shape == (3, 8, 8) and sample["image"].dtype == torch.float32
    assert sample["mask"].shape == (8, 8) and sample["mask"].dtype == torch.int64
    requests = len(mirror.ranges)
    assert len(cls(tmp_path, download=True, checksum=True)) == 2 and len(mirror.ranges) == requests


def test_wrong_checksum_and_resumed_download(mirror, tmp_path, monkeypatch):
    mirror.drops["/lc100/mirror.zip"] = 64  # the first transfer stops early: it is resumed
    assert len(LandCoverAI100(tmp_path / "a", download=True, checksum=True)) == 2
    assert "bytes=64-" in mirror.ranges and (tmp_path / "a" / "landcoverai100.zip").is_file()
    monkeypatch.setattr(LandCoverAI, "md5", "0" * 32)
    with pytest.raises(HashError, match=r"output\.zip.*md5 mismatch"):
        LandCoverAI(tmp_path / "b", download=True, checksum=True)
    assert not (tmp_path / "b" / "output.zip").exists()
    with pytest.raises(ValueError, match="split must be one of train, val, test"):
        LandCoverAI(tmp_path, split="validation")


def _tif(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with rasterio.open(path, "w", driver="GTiff", width=array.shape[2], height=array.shape[1], count=array.shape[0],
                       dtype="uint8", crs="EPSG:2180", transform=from_origin(0, 0, 0.25, 0.25),
                       compress="deflate") as ds:
        ds.write(array)


def test_tile_archive_is_cut_into_512_px_chips(tmp_path, monkeypatch):
    """landcover.ai.v1.zip (tiles, masks, lists) in root: 600x1100 tiles give chips 0 and 1 (2 to 5 are cut off)."""
    src = tmp_path / "src"
    image = np.zeros((3, 600, 1100), np.uint8)
    image[:, :, 512:] = 200
    mask = np.zeros((1, 600, 1100), np.uint8)
    mask[:, :, 512:] = 3
    _tif(src / "images" / "T.tif", image)
    _tif(src / "masks" / "T.tif", mask)
    root = tmp_path / "root"
    root.mkdir()
    with zipfile.ZipFile(root / "landcover.ai.v1.zip", "w") as zf:
        for name in ("images/T.tif", "masks/T.tif"):
            zf.write(src / name, name)
        for split, ids in {"train": ["T_0"], "val": ["T_1"], "test": ["T_0", "T_1"]}.items():
            zf.writestr(f"{split}.txt", "".join(i + "\n" for i in ids))
    monkeypatch.setattr(LandCoverAI, "filename", "landcover.ai.v1.zip")
    ds = LandCoverAI(root, split="test")
    assert sorted(p.name for p in (root / "output").iterdir()) == ["T_0.jpg", "T_0_m.png", "T_1.jpg", "T_1_m.png"]
    assert ds[0]["image"].shape == (3, 512, 512) and ds[1]["mask"].shape == (512, 512)
    assert [(round(float(ds[i]["image"].mean())), int(ds[i]["mask"].max())) for i in range(2)] == [(0, 0), (200, 3)]
    assert len(LandCoverAI(root, split="val")) == 1  # cut once: the chips are there now


def test_plot(mirror, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ds = LandCoverAI100(tmp_path, download=True)
    fig = ds.plot({**ds[0], "prediction": ds[0]["mask"]}, suptitle="chip")
    assert isinstance(fig, plt.Figure) and [a.get_title() for a in fig.axes] == ["Image", "Mask", "Predictions"]
    plt.close(fig)
    plt.close(ds.plot(ds[1], show_titles=False))


def test_pipe_resumes_exactly_and_two_workers(mirror, tmp_path):
    ds = LandCoverAI100(tmp_path, split="train", download=True)

    def loader(workers: int = 0) -> pipekit.DataLoader:
        return pipekit.DataLoader(ds.pipe(train=True, batch_size=1), num_workers=workers)

    def classes(batches) -> list[int]:
        return [int(b["mask"][0, 0, 0]) for b in batches]

    torch.manual_seed(2)
    full = classes(loader())
    torch.manual_seed(2)
    first = loader()
    it = iter(first)
    head = [next(it)]
    state = pickle.loads(pickle.dumps(first.state_dict()))
    resumed = loader()
    resumed.load_state_dict(state)
    assert classes(head) + classes(resumed) == full and sorted(full) == [1, 3]
    assert sorted(classes(loader(workers=2))) == [1, 3]


# LandCoverAIGeo: the tiles themselves, queried by area


@pytest.fixture
def tiles_zip(tmp_path) -> tuple[bytes, str]:
    """landcover.ai.v1.zip's tiles: two 16x16 tiles side by side in EPSG:2180, masks = class by column; its MD5."""
    src = tmp_path / "tiles"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for n, x0 in enumerate((0.0, 4.0)):  # 16 px of 0.25 m: 4 m wide
            image = np.full((3, 16, 16), 50 + n * 100, np.uint8)
            mask = np.tile(np.arange(16, dtype=np.uint8) % 5, (1, 16, 1))
            for folder, array in (("images", image), ("masks", mask)):
                path = src / folder / f"T{n}.tif"
                path.parent.mkdir(parents=True, exist_ok=True)
                with rasterio.open(path, "w", driver="GTiff", width=16, height=16, count=array.shape[0],
                                   dtype="uint8", crs="EPSG:2180", transform=from_origin(x0, 4, 0.25, 0.25)) as ds:
                    ds.write(array)
                zf.write(path, f"{folder}/T{n}.tif")
    data = buf.getvalue()
    return data, hashlib.md5(data).hexdigest()


def test_geo_download_and_samples(server, tiles_zip, tmp_path, monkeypatch):
    data, digest = tiles_zip
    server.files["/v1/landcover.ai.v1.zip"] = data
    monkeypatch.setattr(LandCoverAIGeo, "url", server.url + "/v1/landcover.ai.v1.zip")
    monkeypatch.setattr(LandCoverAIGeo, "md5", digest)
    with pytest.raises(DatasetNotFoundError, match="use `download=True`"):
        LandCoverAIGeo(tmp_path / "geo")
    ds = LandCoverAIGeo(tmp_path / "geo", download=True, checksum=True)
    assert ds.bounds[0] == slice(0.0, 8.0, 0.25) and ds.bounds[1] == slice(0.0, 4.0, 0.25)
    sample = ds[2.0:6.0, 0.0:4.0]  # across both tiles
    assert sample["image"].shape == (3, 16, 16) and sample["image"].dtype == torch.float32
    assert sample["mask"].shape == (1, 16, 16) and sample["mask"].dtype == torch.int64
    assert sample["image"][0, 0, 0] == 50 and sample["image"][0, 0, -1] == 150
    assert sample["mask"][0, 0].tolist() == [(c + 8) % 16 % 5 for c in range(8)] + [c % 5 for c in range(8)]
    assert LandCoverAIGeo(tmp_path / "geo").crs == ds.crs  # extracted: nothing fetched again
    monkeypatch.setattr(LandCoverAIGeo, "md5", "0" * 32)
    with pytest.raises(HashError, match=r"landcover\.ai\.v1\.zip.*md5 mismatch"):
        LandCoverAIGeo(tmp_path / "bad", download=True, checksum=True)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = ds.plot({**sample, "prediction": sample["mask"][0]})
    assert [a.get_title() for a in fig.axes] == ["Image", "Mask", "Predictions"]
    plt.close(fig)


def test_geo_pipe_resumes_exactly_and_two_workers(tiles_zip, tmp_path):
    root = tmp_path / "geo"
    root.mkdir()
    (root / "landcover.ai.v1.zip").write_bytes(tiles_zip[0])
    ds = LandCoverAIGeo(root)

    def make(workers: int = 0, sampler=None) -> pipekit.DataLoader:
        sampler = sampler or RandomGeoSampler(ds, size=8, length=6)
        pipe = sampler.as_pipe().sharding_filter().read_geo(ds)
        return pipekit.DataLoader(pipe.batch(2).collate(stack_samples), num_workers=workers)

    def corners(batches) -> list[tuple[float, float]]:
        return [(b[0].start, b[1].start) for batch in batches for b in batch["bounds"]]

    torch.manual_seed(8)
    full = corners(make())
    torch.manual_seed(8)
    loader = make()
    it = iter(loader)
    head = [next(it)]
    state = pickle.loads(pickle.dumps(loader.state_dict()))
    resumed = make()
    resumed.load_state_dict(state)
    assert corners(head) + corners(resumed) == full and len(full) == 6
    batches = list(make(2, GridGeoSampler(ds, size=16)))
    assert sorted(corners(batches)) == [(0.0, 0.0), (4.0, 0.0)]
    assert all(b["mask"].shape[1:] == (1, 16, 16) for b in batches)
