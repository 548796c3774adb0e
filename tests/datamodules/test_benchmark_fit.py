"""Every benchmark datamodule in a real ``lightning.Trainer``: one training and one validation step each (one test)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytest.importorskip("lightning")

import lightning as L

from pipekit.datamodules import (
    EuroSAT100DataModule,
    EuroSATSpatialDataModule,
    InriaAerialImageLabelingDataModule,
    LandCoverAI100DataModule,
    LandCoverAIDataModule,
    RESISC45DataModule,
    So2SatDataModule,
    UCMercedDataModule,
    VHR10DataModule,
)


class Recorder(L.LightningModule):
    """A one-weight model recording the image batches it is given, as they arrive (on the device, augmented)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(()))
        self.seen: dict[str, list[torch.Tensor]] = {"train": [], "val": []}

    def _step(self, split: str, batch: dict) -> torch.Tensor:
        self.seen[split].append(batch["image"])
        return (self.weight * batch["image"].mean() - 1) ** 2

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        return self._step("train", batch)

    def validation_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        return self._step("val", batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.mark.timeout(120)
def test_every_benchmark_datamodule_fits(benchmark_root):
    cases = [
        (UCMercedDataModule(batch_size=2, root=benchmark_root("ucmerced")), (3, 256, 256)),
        (RESISC45DataModule(batch_size=2, root=benchmark_root("resisc45")), (3, 16, 16)),
        (EuroSATSpatialDataModule(batch_size=2, root=benchmark_root("eurosatspatial")), (13, 8, 8)),
        (EuroSAT100DataModule(batch_size=2, root=benchmark_root("eurosat100")), (13, 8, 8)),
        (InriaAerialImageLabelingDataModule(batch_size=2, patch_size=4, root=benchmark_root("inria")), (3, 4, 4)),
        (LandCoverAIDataModule(batch_size=2, root=benchmark_root("landcoverai")), (3, 8, 8)),
        (LandCoverAI100DataModule(batch_size=2, root=benchmark_root("landcoverai")), (3, 8, 8)),
        (VHR10DataModule(batch_size=2, patch_size=8, root=benchmark_root("vhr10")), (3, 8, 8)),
    ]
    if importlib.util.find_spec("h5py") is not None:  # So2Sat reads HDF5 (the hdf5 extra)
        cases.append((So2SatDataModule(batch_size=2, band_set="s2", root=benchmark_root("so2sat")), (10, 4, 4)))
    for dm, shape in cases:
        model = Recorder()
        trainer = L.Trainer(fast_dev_run=True, accelerator="cpu", logger=False, enable_progress_bar=False,
                            enable_model_summary=False)
        trainer.fit(model, datamodule=dm)
        name = type(dm).__name__
        assert [tuple(x.shape) for x in model.seen["train"]] == [(2, *shape)], name  # augmented (Inria: cropped)
        assert model.seen["train"][0].dtype == torch.float32, name  # converted (and normalised) on the device
        assert len(model.seen["val"]) == 1 and model.seen["val"][0].dtype == torch.float32, name
