"""LandCoverAIDataModule and LandCoverAI100DataModule: the dataset's own lists, masks moved with the images."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("lightning")

from pipekit.datamodules import LandCoverAI100DataModule, LandCoverAIDataModule

from .conftest import train_batch


def test_landcoverai_datamodule(benchmark_root):
    dm = LandCoverAIDataModule(batch_size=2, root=benchmark_root("landcoverai"))
    dm.setup("fit")
    assert (len(dm.train_dataset), len(dm.val_dataset)) == (2, 1)
    raw, moved, augmented = train_batch(dm)
    assert raw["image"].shape == (2, 3, 8, 8) and raw["mask"].dtype == torch.int64
    assert torch.allclose(moved["image"], raw["image"] / 255)
    assert augmented["image"].shape == (2, 3, 8, 8) and augmented["mask"].shape == (2, 8, 8)
    # rotations and flips move the mask with the image: class i + 1 covers the same half's pixels in both
    for mask in augmented["mask"]:
        assert sorted(torch.unique(mask).tolist())[0] == 0 and int((mask > 0).sum()) == 32
    dm.setup("test")
    assert len(dm.test_dataloader()) == 1


def test_landcoverai100_datamodule_does_not_augment(benchmark_root):
    dm = LandCoverAI100DataModule(batch_size=2, root=benchmark_root("landcoverai"))
    dm.setup("fit")
    _raw, moved, augmented = train_batch(dm)
    assert dm.train_aug is None and dm.aug is None and torch.equal(augmented["image"], moved["image"])
