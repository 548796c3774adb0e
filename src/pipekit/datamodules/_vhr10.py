"""``VHR10DataModule``: NWPU VHR-10 object detection, a seeded random train/val/test split, boxes kept per image."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import random_split

from pipekit.datamodules._base import NonGeoDataModule

__all__ = ["VHR10DataModule"]


class _Then:
    """``second(first(sample))``: the datamodule's resize, then the user's ``transforms`` (picklable)."""

    def __init__(self, first: Callable[[Any], Any], second: Callable[[Any], Any]) -> None:
        self.first, self.second = first, second

    def __call__(self, sample: Any) -> Any:
        return self.second(self.first(sample))


def _resize(size: tuple[int, int]) -> Callable[[Any], Any]:
    """A sample transform resizing the image (bilinear, antialiased), its instance masks and its boxes to ``size``."""
    from torchvision.transforms import v2

    from pipekit.transforms import Augment

    return Augment([v2.Resize(list(size), antialias=True)], mask_keys=("mask",), seed=0)


class VHR10DataModule(NonGeoDataModule):
    """NWPU VHR-10 object detection and instance segmentation (TorchGeo 0.8's datamodule).

    **Split**: the dataset (``split="positive"`` by default, the images with
    objects) is split at random into train, val and test in the fractions
    ``1 - val_split_pct - test_split_pct``, ``val_split_pct`` and
    ``test_split_pct`` (``torch.utils.data.random_split`` with a generator
    seeded by ``seed``; the default ``seed=0`` gives TorchGeo 0.8's split),
    fixed for a given seed.  Every sample is resized to ``patch_size`` in the
    dataset (image, instance masks and boxes together, as TorchGeo's
    ``transforms``; a ``transforms=`` given runs after the resize).

    **Batches** (:func:`~pipekit.datasets._coco.collate_detection`, as
    TorchGeo's ``collate_fn_detection``): ``image`` stacked ``[B, 3, H, W]``,
    ``bbox_xyxy``, ``label`` and ``mask`` lists of one tensor per image (each
    image has its own number of objects).  :meth:`transfer_batch_to_device`
    normalises the images and moves those lists to the device too.
    **Statistics**: TorchGeo 0.8's ``mean=0``, ``std=255``: the 0-255 RGB values
    become 0..1 on the device.  No augmentation (``train_aug = None``):
    pipekit's batch transforms do not move boxes, and refuse a batch with them
    (TorchGeo 0.8 flips and jitters colours with kornia); augment per sample
    with :class:`pipekit.transforms.Augment` in ``transforms=`` instead.

    Args:
        batch_size: images per batch.
        patch_size: the size images are resized to, ``size`` or ``(height, width)``.
        num_workers: DataLoader worker processes.
        val_split_pct: the fraction of the images in the val split.
        test_split_pct: the fraction of the images in the test split.
        seed: seed of the split and of the training shuffle.
        **kwargs: passed to :class:`~pipekit.datasets.VHR10` (``root``,
            ``split``, ``transforms``, ``download``, ``checksum``).
    """

    def __init__(self, batch_size: int = 64, patch_size: tuple[int, int] | int = 512, num_workers: int = 0,
                 val_split_pct: float = 0.2, test_split_pct: float = 0.2, *, seed: int = 0, **kwargs: Any) -> None:
        from pipekit.datasets import VHR10
        from pipekit.datasets._coco import collate_detection

        where = type(self).__name__
        if not (0 <= val_split_pct < 1 and 0 <= test_split_pct < 1 and val_split_pct + test_split_pct < 1):
            raise ValueError(f"{where}: val_split_pct and test_split_pct must be at least 0 and sum to less than 1, "
                             f"got {val_split_pct!r} and {test_split_pct!r}")
        super().__init__(VHR10, batch_size, num_workers, seed=seed, **kwargs)
        self.patch_size = (patch_size, patch_size) if isinstance(patch_size, int) else tuple(patch_size)
        self.val_split_pct, self.test_split_pct = float(val_split_pct), float(test_split_pct)
        self.collate_fn = collate_detection
        self.train_aug = None

    def setup(self, stage: str) -> None:
        """Build the dataset (resized to ``patch_size``) and its seeded train/val/test split, once."""
        from pipekit.datasets import VHR10

        if self.dataset is not None:
            return
        user = self.kwargs.get("transforms")
        resize = _resize(self.patch_size)
        transforms = resize if user is None else _Then(resize, user)
        self.dataset = VHR10(**{**self.kwargs, "transforms": transforms})
        fractions = [1 - self.val_split_pct - self.test_split_pct, self.val_split_pct, self.test_split_pct]
        self.train_dataset, self.val_dataset, self.test_dataset = random_split(
            self.dataset, fractions, generator=torch.Generator().manual_seed(self.seed))

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Normalise the images on ``device`` and move the per-image lists (boxes, labels, masks) there too."""
        moved = super().transfer_batch_to_device(batch, device, dataloader_idx)
        if isinstance(moved, dict):
            for key, value in moved.items():
                if isinstance(value, list) and all(isinstance(v, torch.Tensor) for v in value):
                    moved[key] = [v.to(device, non_blocking=True) for v in value]
        return moved
