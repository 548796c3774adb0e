"""LandCover.ai's datamodules: :class:`~pipekit.datasets.LandCoverAI`'s and ``LandCoverAI100``'s own splits."""

from __future__ import annotations

from typing import Any

from pipekit.datamodules._base import NonGeoDataModule
from pipekit.transforms.batch_augment import (
    BatchCompose,
    BatchRandomHorizontalFlip,
    BatchRandomRot90,
    BatchRandomVerticalFlip,
)

__all__ = ["LandCoverAI100DataModule", "LandCoverAIDataModule"]


class LandCoverAIDataModule(NonGeoDataModule):
    """LandCover.ai land-cover segmentation: the dataset's own train/val/test lists (TorchGeo 0.8's datamodule).

    The splits are the fixed lists ``train.txt``, ``val.txt`` and
    ``test.txt`` of the 512x512 chips, so every run sees the same chips; the
    training order is shuffled with ``seed``.  **Statistics**: TorchGeo 0.8
    keeps its base's ``mean=0``, ``std=255`` for LandCover.ai, and so does this
    datamodule: the 0-255 RGB values become 0..1 on the device.  Training
    batches (image and mask together) are rotated by a multiple of 90 degrees
    and flipped at random on the device (TorchGeo 0.8 also rotates by any
    angle up to 90 degrees, sharpens and jitters colours with kornia).

    Args:
        batch_size: chips per batch.
        num_workers: DataLoader worker processes.
        seed: seed of the training shuffle and of the augmentation.
        **kwargs: passed to :class:`~pipekit.datasets.LandCoverAI` (``root``,
            ``download``, ``checksum``).
    """

    def __init__(self, batch_size: int = 64, num_workers: int = 0, *, seed: int = 0, **kwargs: Any) -> None:
        from pipekit.datasets import LandCoverAI

        super().__init__(LandCoverAI, batch_size, num_workers, seed=seed, **kwargs)
        self.train_aug = BatchCompose(
            [BatchRandomRot90(), BatchRandomHorizontalFlip(), BatchRandomVerticalFlip()], seed=seed)


class LandCoverAI100DataModule(NonGeoDataModule):
    """LandCover.ai's 100-chip subset, for tutorials and tests (TorchGeo 0.8's datamodule).

    :class:`~pipekit.datasets.LandCoverAI100`'s own train/val/test lists (in
    its archive); ``mean=0``, ``std=255`` as TorchGeo 0.8 (0..1 on the
    device); no augmentation, as TorchGeo 0.8.

    Args:
        batch_size: chips per batch.
        num_workers: DataLoader worker processes.
        seed: seed of the training shuffle.
        **kwargs: passed to :class:`~pipekit.datasets.LandCoverAI100` (``root``,
            ``download``, ``checksum``).
    """

    def __init__(self, batch_size: int = 64, num_workers: int = 0, *, seed: int = 0, **kwargs: Any) -> None:
        from pipekit.datasets import LandCoverAI100

        super().__init__(LandCoverAI100, batch_size, num_workers, seed=seed, **kwargs)
