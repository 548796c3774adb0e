"""So2Sat: HDF5 files of TorchGeo's versions and splits, band selection, checksums, h5py optional, workers, resume."""

from __future__ import annotations

import hashlib
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import pipekit
from pipekit.datasets import DatasetNotFoundError, DependencyNotFoundError, RGBBandsMissingError, So2Sat
from pipekit.errors import HashError

h5py = pytest.importorskip("h5py")

N = 3  # patches per file


def _write(path: Path, offset: int) -> str:
    """An .h5 file as So2Sat's: sen1 [N, 4, 4, 8], sen2 [N, 4, 4, 10] (float64), one-hot labels [N, 17]; its MD5.

    Patch ``i``'s band ``b`` is ``offset + 100 * i + b`` (Sentinel-2 bands from 8 on), its label ``offset + i``.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    bands = np.arange(18, dtype=np.float64)
    cube = np.stack([np.broadcast_to(offset + 100 * i + bands, (4, 4, 18)) for i in range(N)])
    with h5py.File(path, "w") as f:
        f.create_dataset("sen1", data=cube[..., :8])
        f.create_dataset("sen2", data=cube[..., 8:])
        f.create_dataset("label", data=np.eye(17, dtype=np.float64)[[offset + i for i in range(N)]])
    return hashlib.md5(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> tuple[Path, dict[str, dict[str, str]]]:
    """Version 2's three files and version 3_block's two, with their MD5s by version and split."""
    path = tmp_path_factory.mktemp("so2sat")
    md5s = {"2": {split: _write(path / name, offset) for (split, name), offset
                  in zip(So2Sat.filenames_by_version["2"].items(), (0, 3, 6))},
            "3_block": {split: _write(path / name, offset) for (split, name), offset
                        in zip(So2Sat.filenames_by_version["3_block"].items(), (9, 12))}}
    return path, md5s


def test_versions_splits_bands_and_samples(root, monkeypatch):
    path, md5s = root
    monkeypatch.setattr(So2Sat, "md5s_by_version", {**So2Sat.md5s_by_version, **md5s})
    for version, splits in md5s.items():
        for split, offset in zip(splits, (0, 3, 6) if version == "2" else (9, 12)):
            ds = So2Sat(path, version=version, split=split, checksum=True)
            assert len(ds) == N and [int(ds[i]["label"]) for i in range(N)] == [offset + i for i in range(N)]
    ds = So2Sat(path, split="validation")
    sample = ds[1]
    assert set(sample) == {"image", "label"}
    assert sample["image"].shape == (18, 4, 4) and sample["image"].dtype == torch.float32
    assert sample["label"].shape == () and sample["label"].dtype == torch.int64
    assert sample["image"][:, 0, 0].tolist() == [3 + 100 + b for b in range(18)]
    # the Sentinel-1 bands chosen come first, each group in the order given
    picked = So2Sat(path, bands=("S2_B03", "S1_B2", "S2_B02", "S1_B1"))[2]["image"][:, 3, 3].tolist()
    assert picked == [200 + 1, 200 + 0, 200 + 8 + 1, 200 + 8 + 0]
    assert ds[-1]["label"] == ds[2]["label"]
    with pytest.raises(IndexError, match="index 3 is out of range"):
        ds[3]


def test_errors(root, tmp_path, monkeypatch):
    path, _ = root
    with pytest.raises(DatasetNotFoundError, match=r"Dataset not found.*testing\.h5.*dataserv\.ub\.tum\.de"):
        So2Sat(tmp_path, split="test")
    with pytest.raises(DatasetNotFoundError, match=r"random/training\.h5.*mediatum"):
        So2Sat(tmp_path, version="3_random")
    with pytest.raises(HashError, match=r"training\.h5.*So2Sat: Dataset corrupted: md5 mismatch"):
        So2Sat(path, checksum=True)  # the real file's MD5, not the fixture's
    with pytest.raises(ValueError, match="split must be one of train, test for version '3_block'"):
        So2Sat(path, version="3_block", split="validation")
    with pytest.raises(ValueError, match="'S2_B01' is an invalid band name"):
        So2Sat(path, bands=("S2_B01",))
    with pytest.raises(ValueError, match="version"):
        So2Sat(path, version="1")
    with pytest.raises(TypeError, match="So2Sat: transforms must be callable or None, got 5"):
        So2Sat(tmp_path, transforms=5)  # refused before the file is looked for
    monkeypatch.setitem(sys.modules, "h5py", None)  # h5py not installed
    with pytest.raises(DependencyNotFoundError, match=r"pip install 'pipekit\[hdf5\]'"):
        So2Sat(path)
    # a bad argument is refused as such whether h5py is installed or not
    with pytest.raises(ValueError, match="So2Sat: split must be one of train, test for version '3_block', got 'x'"):
        So2Sat(path, version="3_block", split="x")


def test_plot(root):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path, _ = root
    ds = So2Sat(path, bands=So2Sat.BAND_SETS["s2"])
    fig = ds.plot({**ds[0], "prediction": torch.tensor(16)}, suptitle="patch")
    assert isinstance(fig, plt.Figure)
    assert fig.axes[0].get_title() == "Label: Compact high rise\nPrediction: Water"
    plt.close(fig)
    with pytest.raises(RGBBandsMissingError, match="Dataset does not contain some of the RGB bands"):
        So2Sat(path, bands=("S1_B1", "S2_B03")).plot(ds[0])


def test_pipe_resumes_exactly_and_two_workers(root):
    path, _ = root
    ds = So2Sat(path, split="test", bands=("S1_B1",))
    ds[0]  # an open file in this process is not handed to the workers

    def loader(workers: int = 0) -> pipekit.DataLoader:
        return pipekit.DataLoader(ds.pipe(train=True, batch_size=1), num_workers=workers)

    def labels(batches) -> list[int]:
        return [int(b["label"][0]) for b in batches]

    torch.manual_seed(11)
    full = labels(loader())
    torch.manual_seed(11)
    first = loader()
    it = iter(first)
    head = [next(it)]
    state = pickle.loads(pickle.dumps(first.state_dict()))
    resumed = loader()
    resumed.load_state_dict(state)
    assert labels(head) + labels(resumed) == full and sorted(full) == [6, 7, 8]
    assert sorted(labels(loader(workers=2))) == [6, 7, 8]
