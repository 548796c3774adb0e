"""VHR10DataModule: a seeded random split, samples resized with their boxes and masks, per-image lists on the device."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("lightning")

from pipekit.datamodules import VHR10DataModule

from .conftest import train_batch


def test_vhr10_datamodule(benchmark_root):
    root = benchmark_root("vhr10")
    dm = VHR10DataModule(batch_size=2, patch_size=8, root=root)
    dm.setup("fit")
    assert [len(d) for d in (dm.train_dataset, dm.val_dataset, dm.test_dataset)] == [3, 1, 1]
    parts = [set(d.indices) for d in (dm.train_dataset, dm.val_dataset, dm.test_dataset)]
    assert set.union(*parts) == set(range(5))  # every image in one split
    again = VHR10DataModule(batch_size=2, patch_size=8, root=root)
    again.setup("fit")
    assert [list(d.indices) for d in (again.train_dataset, again.val_dataset)] == [
        list(d.indices) for d in (dm.train_dataset, dm.val_dataset)]  # fixed for the seed

    # the 12x16 images resized to 8x8 with their boxes (x scaled by 1/2, y by 2/3) and instance masks
    sample = dm.dataset[0]
    assert sample["image"].shape == (3, 8, 8) and sample["mask"].shape == (1, 8, 8)
    assert sample["bbox_xyxy"].tolist() == [[1.0, 2.0, 3.0, pytest.approx(16 / 3)]]  # COCO [2, 3, 4, 5]
    raw, moved, augmented = train_batch(dm)
    assert raw["image"].shape == (2, 3, 8, 8)
    assert isinstance(raw["bbox_xyxy"], list) and len(raw["bbox_xyxy"]) == 2  # one tensor of boxes per image
    assert torch.allclose(moved["image"], raw["image"] / 255)
    # to_device leaves lists alone; the datamodule moves the per-image tensors too (to "meta", a device a CPU has)
    elsewhere = dm.transfer_batch_to_device(dict(raw), torch.device("meta"), 0)
    assert elsewhere["image"].is_meta
    assert all(t.is_meta for key in ("bbox_xyxy", "label", "mask") for t in elsewhere[key])
    assert augmented is not None and dm.train_aug is None  # pipekit's batch transforms do not move boxes
    assert len(dm.val_dataloader()) == 1 and len(dm.test_dataloader()) == 1
    with pytest.raises(ValueError, match="val_split_pct and test_split_pct"):
        VHR10DataModule(root=root, val_split_pct=0.5, test_split_pct=0.5)

