"""``InriaAerialImageLabelingDataModule``: building footprints, whole tiles cropped to patches on the device."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from pipekit.datamodules._base import NonGeoDataModule
from pipekit.transforms.batch_augment import (
    BatchCompose,
    BatchRandomCrop,
    BatchRandomHorizontalFlip,
    BatchRandomVerticalFlip,
)

__all__ = ["CenterCrop", "InriaAerialImageLabelingDataModule"]


def _pair(size: int | tuple[int, int]) -> tuple[int, int]:
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


class CenterCrop:
    """The centre ``size`` of a batch's images and masks (``[..., H, W]``), the same window for every sample.

    Example:
        >>> import torch
        >>> from pipekit.datamodules._inria import CenterCrop
        >>> batch = {"image": torch.arange(16.0).reshape(1, 1, 4, 4), "mask": torch.zeros(1, 4, 4), "id": [7]}
        >>> out = CenterCrop(2)(batch)
        >>> out["image"].flatten().tolist(), out["mask"].shape, out["id"]
        ([5.0, 6.0, 9.0, 10.0], torch.Size([1, 2, 2]), [7])
    """

    def __init__(self, size: int | tuple[int, int], keys: tuple[str, ...] = ("image", "mask")) -> None:
        self.size, self.keys = _pair(size), keys

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        out = dict(batch)
        ch, cw = self.size
        for key in self.keys:
            value = batch.get(key)
            if not isinstance(value, Tensor):
                continue
            h, w = value.shape[-2:]
            if ch > h or cw > w:
                raise ValueError(f"CenterCrop: crop size {self.size} is larger than the batch's {key!r} ({h}x{w})")
            top, left = (h - ch) // 2, (w - cw) // 2
            out[key] = value[..., top:top + ch, left:left + cw]
        return out


class InriaAerialImageLabelingDataModule(NonGeoDataModule):
    """Inria Aerial Image Labeling building segmentation (TorchGeo 0.8's datamodule).

    **Splits**, TorchGeo's: the dataset's training tiles whose city index is
    6 or more are ``train``, those of index 1-5 ``val`` (fixed, by file name);
    the test tiles have no public masks, so they are the ``predict`` split
    (``setup("predict")``) and there is no ``test`` split.  Batches hold whole
    tiles; on the device each training sample is flipped at random and cropped
    at a random position to ``patch_size``, validation and prediction batches
    are centre-cropped to it.  Unlike TorchGeo's, the crop does not pad: a
    ``patch_size`` larger than the tiles raises ``ValueError``.
    **Statistics**: TorchGeo 0.8 keeps its base's ``mean=0``, ``std=255``, and
    so does this datamodule: the 0-255 RGB values become 0..1 on the device.

    Args:
        batch_size: tiles per batch.
        patch_size: the side of the crops, or ``(height, width)`` (a multiple of
            32 suits most segmentation networks).
        num_workers: DataLoader worker processes.
        seed: seed of the training shuffle, flips and crops.
        **kwargs: passed to :class:`~pipekit.datasets.InriaAerialImageLabeling`
            (``root``, ``checksum``).
    """

    def __init__(self, batch_size: int = 64, patch_size: tuple[int, int] | int = 64, num_workers: int = 0, *,
                 seed: int = 0, **kwargs: Any) -> None:
        from pipekit.datasets import InriaAerialImageLabeling

        super().__init__(InriaAerialImageLabeling, batch_size, num_workers, seed=seed, **kwargs)
        self.patch_size = _pair(patch_size)
        self.train_aug = BatchCompose(
            [BatchRandomHorizontalFlip(), BatchRandomVerticalFlip(), BatchRandomCrop(self.patch_size)], seed=seed)
        self.aug = CenterCrop(self.patch_size)
        self.predict_aug = CenterCrop(self.patch_size)

    def setup(self, stage: str) -> None:
        """``"fit"``: train and val; ``"validate"``: val; ``"predict"``: the test tiles (without masks)."""
        if stage == "fit":
            self.train_dataset = self._make("train")
        if stage in ("fit", "validate"):
            self.val_dataset = self._make("val")
        if stage == "predict":
            self.predict_dataset = self._make("test")
