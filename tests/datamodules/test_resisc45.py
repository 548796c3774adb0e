"""RESISC45DataModule: RESISC45's own lists, normalised with TorchGeo 0.8's statistics, rotated and flipped."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("lightning")

from pipekit.datamodules import RESISC45DataModule

from .conftest import train_batch


def test_resisc45_datamodule(benchmark_root):
    dm = RESISC45DataModule(batch_size=2, root=benchmark_root("resisc45"))
    assert dm.mean.tolist() == pytest.approx([93.89391792, 97.11226906, 87.56775284])
    dm.setup("fit")
    assert (len(dm.train_dataset), len(dm.val_dataset)) == (4, 2)
    raw, moved, augmented = train_batch(dm)
    assert raw["image"].shape == (2, 3, 16, 16) and raw["image"].dtype == torch.float32  # 0-255 values
    expected = (raw["image"] - dm.mean[:, None, None]) / dm.std[:, None, None]
    assert torch.allclose(moved["image"], expected, atol=1e-5)
    assert augmented["image"].shape == (2, 3, 16, 16)
    # rotations and flips only move pixels: each chip keeps its values
    assert torch.allclose(augmented["image"].mean((1, 2, 3)), moved["image"].mean((1, 2, 3)), atol=1e-5)
    dm.setup("test")
    assert len(dm.test_dataset) == 2 and len(dm.test_dataloader()) == 1
