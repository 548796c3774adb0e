"""UCMercedDataModule: UC Merced's own lists, 0-255 scaled to 0..1 on the device, flipped in training."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("lightning")

import pipekit
from pipekit.datamodules import UCMercedDataModule

from .conftest import train_batch


def test_ucmerced_datamodule(benchmark_root):
    dm = UCMercedDataModule(batch_size=2, root=benchmark_root("ucmerced"))
    assert (float(dm.mean), float(dm.std)) == (0.0, 255.0)  # TorchGeo 0.8's: its base's defaults
    dm.setup("fit")
    assert (len(dm.train_dataset), len(dm.val_dataset)) == (4, 2)
    assert isinstance(dm.train_dataloader(), pipekit.DataLoader) and len(dm.train_dataloader()) == 2
    raw, moved, augmented = train_batch(dm)
    assert raw["image"].shape == (2, 3, 256, 256)  # the dataset resizes every chip to 256x256
    assert torch.allclose(moved["image"], raw["image"] / 255)
    assert augmented["image"].shape == (2, 3, 256, 256) and augmented["label"].shape == (2,)
    assert len(dm.val_dataloader()) == 1
    dm.setup("test")
    assert sorted(b for batch in dm.test_dataloader() for b in batch["label"].tolist()) == [0, 1]
