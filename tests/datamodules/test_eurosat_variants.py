"""EuroSATSpatialDataModule and EuroSAT100DataModule: their own lists, TorchGeo 0.8's statistics per band."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("lightning")

from pipekit.datamodules import EuroSAT100DataModule, EuroSATSpatialDataModule
from pipekit.datasets import EuroSAT100, EuroSATSpatial

from .conftest import train_batch


@pytest.mark.parametrize(("module", "dataset", "name", "b04"), [
    (EuroSATSpatialDataModule, EuroSATSpatial, "eurosatspatial", (1003.8445, 612.4237)),
    (EuroSAT100DataModule, EuroSAT100, "eurosat100", (947.62620298, 593.75055589)),
])
def test_eurosat_variant_datamodule(benchmark_root, module, dataset, name, b04):
    dm = module(batch_size=2, root=benchmark_root(name), bands=("B04", "B03", "B02"))
    assert (float(dm.mean[0]), float(dm.std[0])) == pytest.approx(b04)
    dm.setup("fit")
    assert isinstance(dm.train_dataset, dataset) and (len(dm.train_dataset), len(dm.val_dataset)) == (4, 2)
    raw, moved, augmented = train_batch(dm)
    assert torch.allclose(moved["image"][:, 0], (raw["image"][:, 0] - b04[0]) / b04[1])
    assert augmented["image"].shape == (2, 3, 8, 8)
    dm.setup("test")
    assert len(dm.test_dataloader()) == 1
    with pytest.raises(ValueError, match=rf"{module.__name__}: unknown band"):
        module(root=benchmark_root(name), bands=("B99",))
