"""InriaAerialImageLabelingDataModule: the city-index split, whole tiles cropped to patches on the device."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("lightning")

from pipekit.datamodules import InriaAerialImageLabelingDataModule, compute_stats
from pipekit.errors import ConfigurationError

from .conftest import train_batch
from .test_datamodules import fake_trainer


def test_inria_datamodule(benchmark_root):
    dm = InriaAerialImageLabelingDataModule(batch_size=2, patch_size=4, root=benchmark_root("inria"))
    dm.setup("fit")
    assert (len(dm.train_dataset), len(dm.val_dataset)) == (3, 2)  # city index 6 on / 1-5
    raw, moved, augmented = train_batch(dm)
    assert raw["image"].shape == (2, 3, 6, 8) and raw["mask"].shape == (2, 6, 8)  # whole tiles
    assert torch.allclose(moved["image"], raw["image"] / 255)
    assert augmented["image"].shape == (2, 3, 4, 4) and augmented["mask"].shape == (2, 4, 4)  # random crops
    val = dm.transfer_batch_to_device(next(iter(dm.val_dataloader())), torch.device("cpu"), 0)
    dm.trainer = fake_trainer(validating=True)
    centre = dm.on_after_batch_transfer(val, 0)
    assert torch.equal(centre["mask"], val["mask"][:, 1:5, 2:6])  # the centre 4x4 of the 6x8 tiles
    # the test tiles have no masks: they are the predict split, and there is no test split
    dm.setup("predict")
    predict = next(iter(dm.predict_dataloader()))
    assert "mask" not in predict and predict["image"].shape == (2, 3, 6, 8)
    dm.setup("test")
    with pytest.raises(ConfigurationError, match="test_dataset"):
        dm.test_dataloader()


def test_compute_stats_of_a_chip_datamodule_with_a_patch_size(benchmark_root):
    # Inria's and VHR10's datamodules have a patch_size, as TorchGeo's, but their datasets are chips, not geo
    dm = InriaAerialImageLabelingDataModule(patch_size=4, root=benchmark_root("inria"))
    stats = compute_stats(dm, None)
    assert stats.mean == pytest.approx([83 / 3] * 3)  # the 3 training tiles are filled with 16, 27, 40
