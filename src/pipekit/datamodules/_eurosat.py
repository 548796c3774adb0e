"""``EuroSATDataModule``: :class:`~pipekit.datasets.EuroSAT`'s train/val/test lists, normalised with its statistics."""

from __future__ import annotations

from typing import Any

import torch

from pipekit.datamodules._base import NonGeoDataModule
from pipekit.transforms.batch_augment import BatchCompose, BatchRandomHorizontalFlip, BatchRandomVerticalFlip

__all__ = ["EuroSATDataModule"]

# Per-band mean and standard deviation of the EuroSAT chips (digital numbers), the statistics
# TorchGeo 0.8's EuroSATDataModule normalises with, so models trained with either see the same inputs.
MEAN = {
    "B01": 1354.40546513, "B02": 1118.24399958, "B03": 1042.92983953, "B04": 947.62620298,
    "B05": 1199.47283961, "B06": 1999.79090914, "B07": 2369.22292565, "B08": 2296.82608323,
    "B09": 732.08340178, "B10": 12.11327804, "B11": 1819.01027855, "B12": 1118.92391149,
    "B8A": 2594.14080798,
}
STD = {
    "B01": 245.71762908, "B02": 333.00778264, "B03": 395.09249139, "B04": 593.75055589,
    "B05": 566.4170017, "B06": 861.18399006, "B07": 1086.63139075, "B08": 1117.98170791,
    "B09": 404.91978886, "B10": 4.77584468, "B11": 1002.58768311, "B12": 761.30323499,
    "B8A": 1231.58581042,
}


class EuroSATDataModule(NonGeoDataModule):
    """EuroSAT land-cover classification: the dataset's own train/val/test lists (TorchGeo 0.8's datamodule).

    The splits are the fixed lists EuroSAT ships (``eurosat-train.txt``...),
    so every run sees the same chips; the training order is shuffled with
    ``seed``.  Images are normalised on the device with the per-band
    statistics of the dataset (:data:`MEAN`, :data:`STD`, for the ``bands``
    chosen); training batches are flipped at random on the device.

    Args:
        batch_size: chips per batch.
        num_workers: DataLoader worker processes.
        seed: seed of the training shuffle and of the flips.
        **kwargs: passed to :class:`~pipekit.datasets.EuroSAT` (``root``,
            ``bands``, ``download``, ``checksum``).
    """

    def __init__(self, batch_size: int = 64, num_workers: int = 0, *, seed: int = 0, **kwargs: Any) -> None:
        from pipekit.datasets import EuroSAT

        bands = kwargs.get("bands", EuroSAT.all_band_names)
        unknown = [b for b in bands if b not in MEAN]
        if unknown:
            raise ValueError(f"EuroSATDataModule: unknown band(s) {unknown}; EuroSAT's: {list(MEAN)}")
        self.mean = torch.tensor([MEAN[b] for b in bands])
        self.std = torch.tensor([STD[b] for b in bands])
        super().__init__(EuroSAT, batch_size, num_workers, seed=seed, **kwargs)
        self.train_aug = BatchCompose([BatchRandomHorizontalFlip(), BatchRandomVerticalFlip()], seed=seed)
