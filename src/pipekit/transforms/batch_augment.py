"""Augmentation of collated batches, per sample, on the batch's device (GPU or CPU).

These ``torch.nn.Module`` transforms take a batch dict ``{"image": [B, C, H, W],
"mask": [B, H, W] or [B, K, H, W], "label": [B], ...}`` (or a bare ``[B, C, H, W]``
tensor) after ``collate``/``stack_samples`` and, typically, after
:func:`pipekit.device.to_device`, and draw **different random parameters for
each sample** of the batch, applied with a few batched kernels:

* :class:`BatchRandomHorizontalFlip`, :class:`BatchRandomVerticalFlip`,
  :class:`BatchRandomRot90` (exact; image and masks together),
* :class:`BatchRandomCrop` (exact, integer offsets) and
  :class:`BatchRandomResizedCrop` (bilinear or nearest for the
  image, nearest for masks; no antialiasing),
* :class:`BatchRandomBrightness`, :class:`BatchRandomContrast` and
  :class:`BatchRandomGaussianNoise` (per sample, optionally per band; any band
  count; masks untouched),
* :class:`MixUp` and :class:`CutMix` for classification labels (CutMix also
  pastes the mask region, so it works for segmentation),
* :class:`BatchCompose` and :class:`BatchRandomChoice` to combine them.

Random parameters are drawn on the CPU from a numpy generator (the module's
:class:`~pipekit.transforms.seeding.RandomStream`, or the one passed as ``rng``)
and moved to the batch's device, so a seed gives the same augmentation on CPU
and GPU, and runs are reproducible.  Any number of bands and any dtype work
(crops with interpolation compute in float32 and round integer data back).
The arithmetic is done by the kernels of :mod:`pipekit.transforms.functional`,
the same ones the sample-dict ops of :mod:`pipekit.transforms._augment` use.

Boxes (``boxes``, ``bbox_xyxy``...) vary in number per sample and are not
transformed by these ops: a batch holding them is refused instead of being
silently left out of sync; augment boxes per sample with
:class:`~pipekit.transforms.Augment`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from torch import nn

from pipekit.transforms._batch_base import BatchTransform
from pipekit.transforms._batch_mixing import CutMix, MixUp
from pipekit.transforms._batch_ops import (
    BatchRandomBrightness,
    BatchRandomContrast,
    BatchRandomCrop,
    BatchRandomGaussianNoise,
    BatchRandomHorizontalFlip,
    BatchRandomResizedCrop,
    BatchRandomRot90,
    BatchRandomVerticalFlip,
)

__all__ = [
    "BatchCompose",
    "BatchRandomBrightness",
    "BatchRandomChoice",
    "BatchRandomContrast",
    "BatchRandomCrop",
    "BatchRandomGaussianNoise",
    "BatchRandomHorizontalFlip",
    "BatchRandomResizedCrop",
    "BatchRandomRot90",
    "BatchRandomVerticalFlip",
    "BatchTransform",
    "CutMix",
    "MixUp",
]


class BatchCompose(BatchTransform):
    """Apply batch transforms in order, all drawing from this module's stream.

    Other modules (:class:`~pipekit.transforms.Normalize`,
    :class:`~pipekit.transforms.AppendIndex`...) can be part of the sequence.

    Example:
        >>> import torch
        >>> from pipekit.transforms import BatchCompose, BatchRandomHorizontalFlip, BatchRandomRot90
        >>> aug = BatchCompose([BatchRandomHorizontalFlip(), BatchRandomRot90()], seed=0)
        >>> x = torch.rand(8, 13, 16, 16)
        >>> torch.equal(aug(x), BatchCompose([BatchRandomHorizontalFlip(), BatchRandomRot90()], seed=0)(x))
        True
    """

    geometric = False

    def __init__(self, transforms: Sequence[BatchTransform], *, seed: int | None = None) -> None:
        super().__init__(seed=seed)
        self.transforms = nn.ModuleList(_check_ops(transforms, "BatchCompose"))

    def forward(self, batch: Any, rng: np.random.Generator | None = None) -> Any:
        rng = self.stream.numpy() if rng is None else rng
        for op in self.transforms:
            batch = _call(op, batch, rng)
        return batch


class BatchRandomChoice(BatchTransform):
    """Apply one of several batch transforms, chosen per batch (e.g. MixUp or CutMix).

    Args:
        transforms: the candidates.
        p: their probabilities (default: uniform).
        seed: seed of the stream.

    Example:
        >>> import torch
        >>> from pipekit.transforms import BatchRandomChoice, CutMix, MixUp
        >>> choice = BatchRandomChoice([MixUp(num_classes=10), CutMix(num_classes=10)], seed=0)
        >>> out = choice({"image": torch.rand(4, 3, 8, 8), "label": torch.tensor([1, 2, 3, 4])})
        >>> out["label"].shape
        torch.Size([4, 10])
    """

    geometric = False

    def __init__(
        self, transforms: Sequence[BatchTransform], p: Sequence[float] | None = None, *, seed: int | None = None
    ) -> None:
        super().__init__(seed=seed)
        ops = _check_ops(transforms, "BatchRandomChoice")
        if p is not None:
            probs = np.asarray([float(v) for v in p])
            if len(probs) != len(ops) or (probs < 0).any() or not probs.sum() > 0:
                raise ValueError(f"BatchRandomChoice: p must hold {len(ops)} non-negative weights, got {p!r}")
            self.p: list[float] | None = (probs / probs.sum()).tolist()
        else:
            self.p = None
        self.transforms = nn.ModuleList(ops)

    def forward(self, batch: Any, rng: np.random.Generator | None = None) -> Any:
        rng = self.stream.numpy() if rng is None else rng
        i = int(rng.choice(len(self.transforms), p=self.p))
        return _call(self.transforms[i], batch, rng)


def _call(op: nn.Module, batch: Any, rng: np.random.Generator) -> Any:
    return op(batch, rng) if isinstance(op, BatchTransform) else op(batch)


def _check_ops(transforms: Any, where: str) -> list[nn.Module]:
    if isinstance(transforms, nn.Module) or not isinstance(transforms, Sequence) or not transforms:
        raise TypeError(f"{where}: transforms must be a non-empty list of batch transforms")
    for i, op in enumerate(transforms):
        if not isinstance(op, nn.Module):
            raise TypeError(
                f"{where}: transform {i} must be a torch.nn.Module (a batch transform, Normalize, AppendIndex...), "
                f"got {type(op).__name__}"
            )
    return list(transforms)
