"""So2SatDataModule: version 2's own splits, version 3's seeded validation split, per-version band statistics."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("lightning")
pytest.importorskip("h5py")

from pipekit.datamodules import So2SatDataModule

from .conftest import train_batch


def test_so2sat_datamodule(benchmark_root):
    root = benchmark_root("so2sat")
    dm = So2SatDataModule(batch_size=2, root=root)
    assert dm.mean.shape == (18,) and dm.std[5] == pytest.approx(8.32480061)  # band_set="all", version 2
    dm.setup("fit")
    assert (dm.train_dataset.split, dm.val_dataset.split) == ("train", "validation")
    raw, moved, augmented = train_batch(dm)
    assert raw["image"].shape == (2, 18, 4, 4)
    expected = (raw["image"] - dm.mean[:, None, None]) / dm.std[:, None, None]
    assert torch.allclose(moved["image"], expected, rtol=1e-4) and augmented is not None
    dm.setup("test")
    assert len(dm.test_dataloader()) == 2  # 3 patches, batches of 2, the last kept

    # the rgb band set: the samples' bands S2_B04, S2_B03, S2_B02 and their statistics, in that order
    rgb = So2SatDataModule(batch_size=2, band_set="rgb", root=root)
    assert rgb.mean.tolist() == pytest.approx([0.10108552032678, 0.10927746363683, 0.12375696117681])
    rgb.setup("fit")
    assert rgb.train_dataset[0]["image"][:, 0, 0].tolist() == [10.0, 9.0, 8.0]  # band b holds b (fixture)


def test_so2sat_version_3_splits_train_into_train_and_val_with_the_seed(benchmark_root):
    root = benchmark_root("so2sat")

    def split(seed: int) -> list[int]:
        dm = So2SatDataModule(batch_size=1, root=root, version="3_block", val_split_pct=0.34, seed=seed)
        dm.setup("fit")
        assert len(dm.train_dataset) + len(dm.val_dataset) == 3 and len(dm.val_dataset) == 1
        return list(dm.val_dataset.indices)

    assert split(0) == split(0)  # fixed for a seed
    assert {tuple(split(s)) for s in range(6)} != {tuple(split(0))}  # and drawn from it
    with pytest.raises(ValueError, match="band_set must be one of"):
        So2SatDataModule(root=root, band_set="thermal")
