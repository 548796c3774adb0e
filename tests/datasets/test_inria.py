"""InriaAerialImageLabeling: the manual-download archive checked and extracted, the city-index splits, samples."""

from __future__ import annotations

import hashlib
import os
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest
import rasterio
import torch
from rasterio.transform import from_origin

import pipekit
from pipekit.datasets import DatasetNotFoundError, InriaAerialImageLabeling
from pipekit.errors import HashError

# tile name -> the value of its image's pixels (the masks: 255 on the left half, 0 on the right, as Inria's gt)
TRAIN = {"austin1.tif": 11, "austin6.tif": 16, "chicago2.tif": 22, "chicago7.tif": 27, "vienna10.tif": 40}
TEST = {"bellingham1.tif": 51, "innsbruck30.tif": 63}


def _tif(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with rasterio.open(path, "w", driver="GTiff", width=array.shape[2], height=array.shape[1], count=array.shape[0],
                       dtype=array.dtype, crs="EPSG:26914", transform=from_origin(616500, 3345000, 0.3, 0.3)) as ds:
        ds.write(array)


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> tuple[Path, str]:
    """NEW2-AerialImageDataset.zip laid out as Inria's (RGB uint8 tiles 6x8, single-band 0/255 masks), its MD5."""
    src = tmp_path_factory.mktemp("inria_src")
    top = src / "AerialImageDataset"
    mask = np.zeros((1, 6, 8), np.uint8)
    mask[:, :, :4] = 255
    for name, value in TRAIN.items():
        _tif(top / "train" / "images" / name, np.full((3, 6, 8), value, np.uint8))
        _tif(top / "train" / "gt" / name, mask)
    for name, value in TEST.items():
        _tif(top / "test" / "images" / name, np.full((3, 6, 8), value, np.uint8))
    path = src / "NEW2-AerialImageDataset.zip"
    with zipfile.ZipFile(path, "w") as zf:
        for file in sorted(top.rglob("*.tif")):
            zf.write(file, file.relative_to(src).as_posix())
    return path, hashlib.md5(path.read_bytes()).hexdigest()


@pytest.fixture
def root(tmp_path, archive, monkeypatch) -> Path:
    """A root holding the archive, with the class's md5 set to the archive's; the path has a "test...0" folder."""
    path, digest = archive
    monkeypatch.setattr(InriaAerialImageLabeling, "md5", digest)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / path.name).write_bytes(path.read_bytes())
    return tmp_path / "data"


def values(ds) -> list[int]:
    return [int(ds[i]["image"][0, 0, 0]) for i in range(len(ds))]


def test_checksum_extract_and_city_index_splits(root):
    train = InriaAerialImageLabeling(root, checksum=True)
    assert (root / "AerialImageDataset" / "train" / "gt").is_dir()
    # val: city index 1-5; train: from 6 on (the file name's index: the path's "test_...0" folder is not a city)
    assert values(train) == [16, 27, 40]
    assert values(InriaAerialImageLabeling(root, split="val")) == [11, 22]
    test = InriaAerialImageLabeling(root, split="test")
    assert values(test) == [51, 63] and set(test[0]) == {"image"}
    sample = train[0]
    assert set(sample) == {"image", "mask"}
    assert sample["image"].shape == (3, 6, 8) and sample["image"].dtype == torch.float32
    assert sample["mask"].shape == (6, 8) and sample["mask"].dtype == torch.int64
    assert sample["mask"][:, :4].eq(1).all() and sample["mask"][:, 4:].eq(0).all()


def test_not_found_says_what_to_download_and_bad_checksum(root, tmp_path, monkeypatch):
    with pytest.raises(DatasetNotFoundError, match=r"Dataset not found.*aerialimagelabeling.*NEW2-AerialImageDataset"):
        InriaAerialImageLabeling(tmp_path / "empty")
    monkeypatch.setattr(InriaAerialImageLabeling, "md5", "0" * 32)
    with pytest.raises(HashError, match=r"NEW2-AerialImageDataset\.zip.*InriaAerialImageLabeling: Dataset corrupted") \
            as info:
        InriaAerialImageLabeling(root, checksum=True)
    assert isinstance(info.value, RuntimeError) and not (root / "AerialImageDataset").exists()
    with pytest.raises(ValueError, match="InriaAerialImageLabeling: split must be one of train, val, test, "
                                         "got 'validation'"):
        InriaAerialImageLabeling(root, split="validation")
    # refused before the archive is looked for, not as a missing dataset
    with pytest.raises(TypeError, match="InriaAerialImageLabeling: transforms must be callable or None, got 5"):
        InriaAerialImageLabeling(tmp_path / "empty", transforms=5)


def test_plot(root):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ds = InriaAerialImageLabeling(root)
    fig = ds.plot({**ds[0], "prediction": ds[0]["mask"]}, suptitle="tile")
    assert isinstance(fig, plt.Figure) and [ax.get_title() for ax in fig.axes] == ["Image", "Label", "Prediction"]
    plt.close(fig)
    test = InriaAerialImageLabeling(root, split="test")
    fig = test.plot(test[1], show_titles=False)
    assert len(fig.axes) == 1
    plt.close(fig)


def test_pipe_resumes_exactly_and_two_workers(root):
    ds = InriaAerialImageLabeling(root, split="train")

    def loader(workers: int = 0) -> pipekit.DataLoader:
        return pipekit.DataLoader(ds.pipe(train=True, batch_size=1), num_workers=workers)

    def firsts(batches) -> list[int]:
        return [int(b["image"][0, 0, 0, 0]) for b in batches]

    torch.manual_seed(3)
    full = firsts(loader())
    torch.manual_seed(3)
    first = loader()
    it = iter(first)
    head = [next(it)]
    state = pickle.loads(pickle.dumps(first.state_dict()))
    resumed = loader()
    resumed.load_state_dict(state)
    assert firsts(head) + firsts(resumed) == full and sorted(full) == [16, 27, 40]
    batches = list(loader(workers=2))
    assert sorted(firsts(batches)) == [16, 27, 40] and all(b["mask"].shape == (1, 6, 8) for b in batches)
    assert os.path.basename(ds.files[0]["image"]) == "austin6.tif"
