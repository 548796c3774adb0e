"""``RESISC45DataModule``: :class:`~pipekit.datasets.RESISC45`'s lists, normalised with its statistics."""

from __future__ import annotations

from typing import Any

import torch

from pipekit.datamodules._base import NonGeoDataModule
from pipekit.transforms.batch_augment import (
    BatchCompose,
    BatchRandomHorizontalFlip,
    BatchRandomRot90,
    BatchRandomVerticalFlip,
)

__all__ = ["RESISC45DataModule"]


class RESISC45DataModule(NonGeoDataModule):
    """NWPU-RESISC45 scene classification: the dataset's own train/val/test lists (TorchGeo 0.8's datamodule).

    The splits are the fixed lists ``resisc45-<split>.txt``, so every run
    sees the same chips; the training order is shuffled with ``seed``.
    **Statistics**: TorchGeo 0.8's per-band mean and standard deviation of the
    training split, in the 0-255 units of the samples (:attr:`mean`,
    :attr:`std`), applied on the device.  Training batches are rotated by a
    multiple of 90 degrees and flipped at random on the device (TorchGeo 0.8
    also rotates by any angle up to 90 degrees, sharpens, erases and jitters
    colours with kornia; pipekit's batch transforms do the exact, lossless part).

    Args:
        batch_size: chips per batch.
        num_workers: DataLoader worker processes.
        seed: seed of the training shuffle and of the augmentation.
        **kwargs: passed to :class:`~pipekit.datasets.RESISC45` (``root``,
            ``download``, ``checksum``).
    """

    mean = torch.tensor([93.89391792, 97.11226906, 87.56775284])
    std = torch.tensor([51.84919672, 47.2365918, 47.06308786])

    def __init__(self, batch_size: int = 64, num_workers: int = 0, *, seed: int = 0, **kwargs: Any) -> None:
        from pipekit.datasets import RESISC45

        super().__init__(RESISC45, batch_size, num_workers, seed=seed, **kwargs)
        self.train_aug = BatchCompose(
            [BatchRandomRot90(), BatchRandomHorizontalFlip(), BatchRandomVerticalFlip()], seed=seed)
