"""Batch ops that mix samples of the batch and their labels: :class:`MixUp` and :class:`CutMix`.

Public in :mod:`pipekit.transforms.batch_augment`, which says what the batch transforms do and how they draw.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np
import torch
import torch.nn.functional as nnf
from torch import Tensor

from pipekit.transforms import functional as K
from pipekit.transforms._batch_base import BatchTransform


def _soft_labels(labels: Any, num_classes: int | None, batch_size: int, where: str, key: str) -> Tensor:
    if not isinstance(labels, Tensor):
        raise TypeError(f"{where}: batch[{key!r}] must be a tensor of labels, got {type(labels).__name__}")
    if labels.is_floating_point() and labels.dim() == 2:
        if labels.shape[0] != batch_size:
            raise ValueError(f"{where}: batch[{key!r}] has {labels.shape[0]} rows for {batch_size} images")
        return labels
    if labels.dim() != 1 or labels.is_floating_point() or labels.shape[0] != batch_size:
        raise ValueError(
            f"{where}: batch[{key!r}] must be [B] integer class labels or [B, num_classes] soft labels, "
            f"got {tuple(labels.shape)} {labels.dtype}"
        )
    if num_classes is None:
        raise ValueError(f"{where}: integer labels need num_classes")
    if len(labels) and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(f"{where}: labels must be within 0..{num_classes - 1}, got {labels.min()}..{labels.max()}")
    return nnf.one_hot(labels.long(), num_classes).to(torch.float32)


def _check_mix_args(alpha: Any, num_classes: Any, where: str) -> tuple[float, int | None]:
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not alpha > 0:
        raise ValueError(f"{where}: alpha must be positive, got {alpha!r}")
    if num_classes is not None and (
        isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1
    ):
        raise ValueError(f"{where}: num_classes must be a positive int, got {num_classes!r}")
    return float(alpha), num_classes


class MixUp(BatchTransform):
    """MixUp: blend each sample with the next one of the batch, and their labels alike.

    As torchvision's ``v2.MixUp``: one ``lam ~ Beta(alpha, alpha)`` per batch,
    ``image = lam * image + (1 - lam) * image.roll(1, 0)``, and the labels
    (one-hot for integer labels) mixed the same way, so the batch should be
    shuffled.  Images must be floating point; a batch with masks is refused
    (segmentation masks cannot be blended; use :class:`CutMix`).

    Args:
        alpha: the Beta distribution's parameter.
        num_classes: needed for integer labels ``[B]``; soft labels
            ``[B, num_classes]`` are mixed as they are.
        label_key: the batch entry holding the labels.
        seed, image_key, mask_keys: as :class:`BatchTransform`.

    Example:
        >>> import torch
        >>> from pipekit.transforms import MixUp
        >>> batch = {"image": torch.stack([torch.zeros(3, 2, 2), torch.ones(3, 2, 2)]), "label": torch.tensor([0, 1])}
        >>> out = MixUp(alpha=1.0, num_classes=2, seed=0)(batch)
        >>> lam = float(out["label"][0, 0])
        >>> torch.allclose(out["image"][0], torch.full((3, 2, 2), 1 - lam)), out["label"].sum(1).tolist()
        (True, [1.0, 1.0])
    """

    geometric = False

    def __init__(
        self, alpha: float = 1.0, num_classes: int | None = None, *, label_key: str = "label", **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.alpha, self.num_classes = _check_mix_args(alpha, num_classes, "MixUp")
        self.label_key = label_key

    def _transform(self, batch: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        image = batch[self.image_key]
        masks = self._masks(batch)
        if masks:
            raise ValueError(f"MixUp: the batch holds masks {masks}, which cannot be blended; use CutMix")
        if not image.is_floating_point():
            raise TypeError(f"MixUp: images must be floating point (normalise them first), got {image.dtype}")
        if self.label_key not in batch:
            raise KeyError(f"MixUp: the batch has no {self.label_key!r} entry (keys: {sorted(map(str, batch))})")
        labels = _soft_labels(batch[self.label_key], self.num_classes, image.shape[0], "MixUp", self.label_key)
        lam = float(rng.beta(self.alpha, self.alpha))
        batch[self.image_key] = K.mixup(image, lam)
        batch[self.label_key] = K.mixup(labels.to(image.device), lam)
        return batch


class CutMix(BatchTransform):
    """CutMix: paste a random box of the next sample of the batch into each sample.

    As torchvision's ``v2.CutMix``: one ``lam ~ Beta(alpha, alpha)`` and one
    box per batch (area ``1 - lam`` of the image, centred uniformly, clipped
    at the borders), pasted from ``image.roll(1, 0)``; labels are mixed by the
    box's actual area.  Masks get the same box pasted (segmentation CutMix),
    and labels are optional when the batch has none.  Works for any dtype.

    Args:
        alpha: the Beta distribution's parameter.
        num_classes: needed for integer labels.
        label_key: the batch entry holding labels (skipped when absent).
        seed, image_key, mask_keys: as :class:`BatchTransform`.

    Example:
        >>> import torch
        >>> from pipekit.transforms import CutMix
        >>> batch = {"image": torch.stack([torch.zeros(3, 8, 8), torch.ones(3, 8, 8)]), "label": torch.tensor([0, 1])}
        >>> out = CutMix(num_classes=2, seed=1)(batch)
        >>> pasted = float(out["image"][0].mean())  # the area taken from sample 1
        >>> abs(float(out["label"][0, 1]) - pasted) < 1e-6
        True
    """

    geometric = False

    def __init__(
        self, alpha: float = 1.0, num_classes: int | None = None, *, label_key: str = "label", **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.alpha, self.num_classes = _check_mix_args(alpha, num_classes, "CutMix")
        self.label_key = label_key

    def _transform(self, batch: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        image = batch[self.image_key]
        b, (h, w) = image.shape[0], image.shape[-2:]
        labels = None
        if self.label_key in batch:
            labels = _soft_labels(batch[self.label_key], self.num_classes, b, "CutMix", self.label_key)
            labels = labels.to(image.device)
        lam = float(rng.beta(self.alpha, self.alpha))
        cx, cy = int(rng.integers(0, w)), int(rng.integers(0, h))
        r = 0.5 * math.sqrt(1.0 - lam)
        half_w, half_h = int(r * w), int(r * h)
        x1, x2 = max(cx - half_w, 0), min(cx + half_w, w)
        y1, y2 = max(cy - half_h, 0), min(cy + half_h, h)
        for key in [self.image_key, *self._masks(batch)]:
            batch[key] = K.cutmix(batch[key], y1, x1, y2, x2)
        if labels is not None:
            kept = 1.0 - (x2 - x1) * (y2 - y1) / (w * h)
            batch[self.label_key] = K.mixup(labels, kept)
        return batch
