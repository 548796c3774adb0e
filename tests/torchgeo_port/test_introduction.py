"""TorchGeo 0.8's "Introduction to TorchGeo" tutorial (docs/tutorials/torchgeo.ipynb), ported by its imports.

The tutorial's data-loading cells, in order, as the tutorial has them; the
only changes are the imports (``torchgeo`` -> ``pipekit``) and the paths:
the download cells are replaced by the session's synthetic data in the same
file layout (``conftest.py``).  Assertions follow the tutorial's code.
"""

from __future__ import annotations

import os
import shutil

import pandas as pd
import pytest
import torch


@pytest.fixture
def tempdir(tutorial_data, tmp_path, monkeypatch):
    """A temporary folder holding the tutorial's extracted downloads, as ``tempfile.gettempdir()``."""
    shutil.copytree(tutorial_data["landsat"], tmp_path / "landsat")
    shutil.copytree(tutorial_data["cdl"], tmp_path / "cdl")
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    return tmp_path


def test_introduction_to_torchgeo(tempdir):
    # -- Imports (torchgeo -> pipekit)
    import tempfile

    from matplotlib import pyplot as plt
    from pandas import Timestamp
    from torch.utils.data import DataLoader

    from pipekit.datasets import CDL, Landsat7, Landsat8, stack_samples
    from pipekit.datasets.utils import download_and_extract_archive  # noqa: F401  (the downloads are replaced)
    from pipekit.samplers import GridGeoSampler, RandomGeoSampler

    # -- Landsat (the download_and_extract_archive calls replaced by the fixture's files)
    landsat_root = os.path.join(tempfile.gettempdir(), "landsat")

    landsat7_bands = ["SR_B1", "SR_B2", "SR_B3", "SR_B4", "SR_B5", "SR_B7"]
    landsat8_bands = ["SR_B2", "SR_B3", "SR_B4", "SR_B5", "SR_B6", "SR_B7"]

    landsat7 = Landsat7(paths=landsat_root, bands=landsat7_bands)
    landsat8 = Landsat8(paths=landsat_root, bands=landsat8_bands)

    print(landsat7)
    print(landsat8)

    print(landsat7.crs)
    print(landsat8.crs)

    # -- CDL
    cdl_root = os.path.join(tempfile.gettempdir(), "cdl")

    cdl = CDL(paths=cdl_root)

    print(cdl)
    print(cdl.crs)

    # -- Composing datasets
    landsat = landsat7 | landsat8
    print(landsat)
    print(landsat.crs)

    dataset = landsat & cdl
    print(dataset)
    print(dataset.crs)

    # -- Spatiotemporal indexing
    size = 256

    xmin = 925000
    xmax = xmin + size * 30
    xres = 30
    ymin = 4470000
    ymax = ymin + size * 30
    yres = 30
    tmin = Timestamp(2023, 1, 1)
    tmax = Timestamp(2023, 12, 31)
    tres = 1

    sample = dataset[xmin:xmax:xres, ymin:ymax:yres]
    sample = dataset[:, :, tmin:tmax:tres]
    sample = dataset[xmin:xmax, ymin:ymax, tmin:tmax]

    landsat8.plot(sample)
    cdl.plot(sample)
    plt.show()

    # -- Samplers
    train_sampler = RandomGeoSampler(dataset, size=size, length=1000)
    next(iter(train_sampler))

    test_sampler = GridGeoSampler(dataset, size=size, stride=size)
    next(iter(test_sampler))

    # -- Data Loaders
    train_dataloader = DataLoader(
        dataset, batch_size=128, sampler=train_sampler, collate_fn=stack_samples
    )
    test_dataloader = DataLoader(
        dataset, batch_size=128, sampler=test_sampler, collate_fn=stack_samples
    )

    # ---- what the tutorial shows, checked
    assert len(landsat7) == 1 and len(landsat8) == 1  # one scene each, from one folder holding both
    assert landsat7.crs.to_epsg() == 32616 and landsat8.crs.to_epsg() == 32617
    assert cdl.crs.to_epsg() == 5070
    assert landsat.crs == dataset.crs == landsat7.crs and dataset.res == (30.0, 30.0)
    assert sample["image"].shape == (6, 256, 256) and sample["image"].dtype == torch.float32
    assert sample["mask"].shape == (256, 256) and sample["mask"].dtype == torch.int64
    x, y, t = sample["bounds"]
    assert (x, y, t) == (slice(xmin, xmax), slice(ymin, ymax), slice(tmin, tmax))
    assert (sample["image"] > 0).all()  # inside the Landsat 7 scene
    # CDL masks carry TorchGeo's ordinal labels of the corpus's codes
    labels = {int(cdl.ordinal_map[code]) for code in (1, 5, 24, 111, 122, 141, 176)}
    assert set(sample["mask"].unique().tolist()) <= labels
    whole = dataset[:, :, tmin:tmax:tres]
    assert whole["image"].shape[1:] == (round(dataset.bounds[1].stop - dataset.bounds[1].start) // 30,
                                        round(dataset.bounds[0].stop - dataset.bounds[0].start) // 30)
    stepped = dataset[xmin:xmax:xres, ymin:ymax:yres]
    assert torch.equal(stepped["image"], sample["image"])
    query = next(iter(train_sampler))
    assert isinstance(query, tuple) and [type(s) for s in query] == [slice] * 3
    assert isinstance(query[2].start, pd.Timestamp)
    assert (query[0].stop - query[0].start, query[1].stop - query[1].start) == (size * 30, size * 30)
    batch = next(iter(test_dataloader))
    assert batch["image"].shape[1:] == (6, 256, 256) and batch["mask"].shape[1:] == (256, 256)
    assert len(batch["bounds"]) == len(batch["image"]) == min(128, len(test_sampler))
    first = next(iter(DataLoader(dataset, batch_size=4, sampler=train_sampler, collate_fn=stack_samples)))
    assert first["image"].shape == (4, 6, 256, 256)
    assert len(train_dataloader) == 8  # 1000 patches in batches of 128
    assert os.path.isdir(landsat_root)
