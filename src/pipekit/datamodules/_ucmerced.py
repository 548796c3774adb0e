"""``UCMercedDataModule``: :class:`~pipekit.datasets.UCMerced`'s train/val/test lists, scaled to 0..1 on the device."""

from __future__ import annotations

from typing import Any

from pipekit.datamodules._base import NonGeoDataModule
from pipekit.transforms.batch_augment import BatchCompose, BatchRandomHorizontalFlip, BatchRandomVerticalFlip

__all__ = ["UCMercedDataModule"]


class UCMercedDataModule(NonGeoDataModule):
    """UC Merced land use: the dataset's own train/val/test lists (TorchGeo 0.8's datamodule).

    The splits are the fixed lists UC Merced's mirror ships
    (``uc_merced-<split>.txt``), so every run sees the same chips; the
    training order is shuffled with ``seed``.  The chips are 256x256 (the
    dataset resizes the few off-size ones, as TorchGeo's).  **Statistics**:
    TorchGeo 0.8 keeps its base's ``mean=0``, ``std=255`` for UC Merced, and
    so does this datamodule: the 0-255 RGB values become 0..1 on the device.
    Training batches are flipped at random on the device (TorchGeo 0.8 does
    not augment UC Merced: set ``train_aug = None`` for its behaviour).

    Args:
        batch_size: chips per batch.
        num_workers: DataLoader worker processes.
        seed: seed of the training shuffle and of the flips.
        **kwargs: passed to :class:`~pipekit.datasets.UCMerced` (``root``,
            ``download``, ``checksum``).
    """

    def __init__(self, batch_size: int = 64, num_workers: int = 0, *, seed: int = 0, **kwargs: Any) -> None:
        from pipekit.datasets import UCMerced

        super().__init__(UCMerced, batch_size, num_workers, seed=seed, **kwargs)
        self.train_aug = BatchCompose([BatchRandomHorizontalFlip(), BatchRandomVerticalFlip()], seed=seed)
