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

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as nnf
from torch import Tensor, nn

from pipekit.transforms import functional as K
from pipekit.transforms._common import (
    DEFAULT_BOX_KEYS,
    _check_k,
    _check_noise,
    _check_p,
    _check_value_range,
    _factor_range,
)
from pipekit.transforms.seeding import RandomStream

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


def _size(size: Any, where: str) -> tuple[int, int]:
    if isinstance(size, numbers.Integral) and not isinstance(size, bool):
        size = (int(size), int(size))
    if not (
        isinstance(size, Sequence)
        and len(size) == 2
        and all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v > 0 for v in size)
    ):
        raise ValueError(f"{where}: size must be a positive int or an (height, width) pair, got {size!r}")
    return int(size[0]), int(size[1])


class BatchTransform(nn.Module):
    """Base class: validates the batch and hands each op a numpy generator.

    Args:
        seed: seed of the module's stream (see :mod:`pipekit.transforms.seeding`).
        image_key: the batch entry holding ``[B, C, H, W]`` images.
        mask_keys: entries holding masks ``[B, H, W]`` or ``[B, K, H, W]``,
            transformed with the image (absent keys are fine).

    ``forward(batch, rng=None)``: ``rng`` (a ``numpy.random.Generator``)
    overrides the module's own stream; :class:`BatchCompose` passes its own.
    """

    geometric = True

    def __init__(
        self, *, seed: int | None = None, image_key: str = "image", mask_keys: Sequence[str] = ("mask",)
    ) -> None:
        super().__init__()
        if not isinstance(image_key, str):
            raise TypeError(f"{type(self).__name__}: image_key must be a str, got {image_key!r}")
        self.image_key = image_key
        self.mask_keys = (mask_keys,) if isinstance(mask_keys, str) else tuple(mask_keys)
        self.stream = RandomStream(seed)

    def forward(self, batch: Any, rng: np.random.Generator | None = None) -> Any:
        rng = self.stream.numpy() if rng is None else rng
        if isinstance(batch, Tensor):
            return self._apply_batch({self.image_key: batch}, rng)[self.image_key]
        if not isinstance(batch, Mapping):
            raise TypeError(
                f"{type(self).__name__}: expects a batch dict or a [B, C, H, W] tensor, got {type(batch).__name__}"
            )
        return self._apply_batch(dict(batch), rng)

    def _apply_batch(self, batch: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        where = type(self).__name__
        if self.image_key not in batch:
            raise KeyError(f"{where}: the batch has no {self.image_key!r} entry (keys: {sorted(map(str, batch))})")
        image = batch[self.image_key]
        if not isinstance(image, Tensor) or image.dim() != 4:
            shape = tuple(image.shape) if isinstance(image, Tensor) else type(image).__name__
            raise ValueError(f"{where}: batch[{self.image_key!r}] must be a [B, C, H, W] tensor, got {shape}")
        if self.geometric:
            present = [k for k in DEFAULT_BOX_KEYS if k in batch]
            if present:
                raise ValueError(
                    f"{where}: the batch holds boxes {present}, which batch-level ops cannot move; "
                    "augment boxes per sample with pipekit.transforms.Augment"
                )
        for key in self.mask_keys:
            mask = batch.get(key)
            if mask is None:
                continue
            if (
                not isinstance(mask, Tensor)
                or mask.dim() not in (3, 4)
                or mask.shape[0] != image.shape[0]
                or mask.shape[-2:] != image.shape[-2:]
            ):
                shape = tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
                raise ValueError(
                    f"{where}: batch[{key!r}] must be [B, H, W] or [B, K, H, W] matching the image "
                    f"{tuple(image.shape)}, got {shape}"
                )
        return self._transform(batch, rng)

    def _masks(self, batch: Mapping[str, Any]) -> list[str]:
        return [k for k in self.mask_keys if isinstance(batch.get(k), Tensor)]

    def _transform(self, batch: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:  # pragma: no cover
        raise NotImplementedError


class _BatchFlip(BatchTransform):
    _kernel = staticmethod(K.hflip)

    def __init__(self, p: float = 0.5, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.p = _check_p(p, type(self).__name__)

    def _transform(self, batch: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        image = batch[self.image_key]
        chosen = rng.random(image.shape[0]) < self.p
        if not chosen.any():
            return batch
        apply = torch.from_numpy(chosen)
        for key in [self.image_key, *self._masks(batch)]:
            batch[key] = self._kernel(batch[key], apply)  # one full copy; only the chosen samples flipped into it
        return batch


class BatchRandomHorizontalFlip(_BatchFlip):
    """Flip each sample left-right with probability ``p`` (image and masks together).

    Example:
        >>> import torch
        >>> from pipekit.transforms import BatchRandomHorizontalFlip
        >>> batch = {"image": torch.arange(4.0).reshape(2, 1, 1, 2), "mask": torch.tensor([[[0, 1]], [[0, 1]]])}
        >>> out = BatchRandomHorizontalFlip(p=1.0, seed=0)(batch)
        >>> out["image"].flatten().tolist(), out["mask"].flatten().tolist()
        ([1.0, 0.0, 3.0, 2.0], [1, 0, 1, 0])
    """

    _kernel = staticmethod(K.hflip)


class BatchRandomVerticalFlip(_BatchFlip):
    """Flip each sample upside down with probability ``p`` (image and masks together).

    Example:
        >>> import torch
        >>> from pipekit.transforms import BatchRandomVerticalFlip
        >>> out = BatchRandomVerticalFlip(p=1.0, seed=0)(torch.arange(2.0).reshape(1, 1, 2, 1))
        >>> out.flatten().tolist()
        [1.0, 0.0]
    """

    _kernel = staticmethod(K.vflip)


class BatchRandomRot90(BatchTransform):
    """Rotate each sample by its own random multiple of 90 degrees (counter-clockwise), exactly.

    Args:
        k: the multiples to choose from, uniformly per sample.  Odd multiples
            need square images (a batch keeps one shape).
        seed, image_key, mask_keys: as :class:`BatchTransform`.

    Example:
        >>> import torch
        >>> from pipekit.transforms import BatchRandomRot90
        >>> x = torch.arange(4.0).reshape(1, 1, 2, 2)
        >>> BatchRandomRot90(k=(1,), seed=0)(x).flatten().tolist()
        [1.0, 3.0, 0.0, 2.0]
    """

    def __init__(self, k: Sequence[int] = (0, 1, 2, 3), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.k = _check_k(k, "BatchRandomRot90")

    def _transform(self, batch: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        image = batch[self.image_key]
        h, w = image.shape[-2:]
        if h != w and any(v % 2 for v in self.k):
            raise ValueError(
                f"BatchRandomRot90: rotating samples by 90 or 270 degrees needs square images, got {h}x{w}; "
                "use k=(0, 2)"
            )
        ks = torch.from_numpy(np.asarray(self.k)[rng.integers(0, len(self.k), image.shape[0])])
        for key in [self.image_key, *self._masks(batch)]:
            batch[key] = K.rot90(batch[key], ks)
        return batch


class BatchRandomCrop(BatchTransform):
    """Crop each sample at its own random position to ``size`` (exact, no interpolation).

    Args:
        size: output ``(height, width)`` (or one int), at most the input's.
        seed, image_key, mask_keys: as :class:`BatchTransform`.

    Example:
        >>> import torch
        >>> from pipekit.transforms import BatchRandomCrop
        >>> x = torch.arange(16.0).reshape(1, 1, 4, 4).expand(3, 5, 4, 4)
        >>> out = BatchRandomCrop(2, seed=0)(x)
        >>> out.shape
        torch.Size([3, 5, 2, 2])
    """

    def __init__(self, size: int | tuple[int, int], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.size = _size(size, "BatchRandomCrop")

    def _transform(self, batch: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        image = batch[self.image_key]
        b, (h, w) = image.shape[0], image.shape[-2:]
        ch, cw = self.size
        if ch > h or cw > w:
            raise ValueError(f"BatchRandomCrop: crop size {self.size} is larger than the images ({h}x{w})")
        top = torch.from_numpy(rng.integers(0, h - ch + 1, b))
        left = torch.from_numpy(rng.integers(0, w - cw + 1, b))
        for key in [self.image_key, *self._masks(batch)]:
            batch[key] = K.crop(batch[key], top, left, ch, cw)
        return batch


class BatchRandomResizedCrop(BatchTransform):
    """Crop a random area and aspect ratio of each sample and resize it to ``size`` (torchvision's sampling).

    Each sample gets its own crop: area fraction in ``scale``, aspect ratio
    (width/height) log-uniform in ``ratio``, 10 tries and then a centre crop,
    as ``torchvision.transforms.v2.RandomResizedCrop``.  Output pixel ``j``
    samples the input at ``left + (j + 0.5) * crop_width / width - 0.5`` (pixel
    centres, as ``grid_sample`` with ``align_corners=False``), without
    antialiasing: bilinear (``grid_sample`` in float32, or float64 for float64
    images) or nearest for the image; masks always take the nearest pixel,
    gathered by integer index (exact for any dtype, and the same pixels as a
    nearest-sampled image).

    Args:
        size: output ``(height, width)`` (or one int).
        scale: range of the crop's area as a fraction of the image's.
        ratio: range of the crop's aspect ratio.
        interpolation: ``"bilinear"`` or ``"nearest"`` for the image.
        seed, image_key, mask_keys: as :class:`BatchTransform`.

    Example:
        >>> import torch
        >>> from pipekit.transforms import BatchRandomResizedCrop
        >>> batch = {"image": torch.rand(4, 13, 32, 32), "mask": torch.zeros(4, 32, 32, dtype=torch.long)}
        >>> out = BatchRandomResizedCrop(8, seed=0)(batch)
        >>> out["image"].shape, out["mask"].shape, out["mask"].dtype
        (torch.Size([4, 13, 8, 8]), torch.Size([4, 8, 8]), torch.int64)
    """

    def __init__(
        self,
        size: int | tuple[int, int],
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        *,
        interpolation: str = "bilinear",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        where = "BatchRandomResizedCrop"
        self.size = _size(size, where)
        for name, rng in (("scale", scale), ("ratio", ratio)):
            if not (isinstance(rng, Sequence) and len(rng) == 2 and 0 < float(rng[0]) <= float(rng[1])):
                raise ValueError(f"{where}: {name} must be a (min, max) pair with 0 < min <= max, got {rng!r}")
        if float(scale[1]) > 1.0:
            raise ValueError(f"{where}: scale must not exceed 1.0, got {scale!r}")
        if interpolation not in ("bilinear", "nearest"):
            raise ValueError(f"{where}: interpolation must be 'bilinear' or 'nearest', got {interpolation!r}")
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))
        self.interpolation = interpolation

    def _crop(self, h: int, w: int, rng: np.random.Generator) -> tuple[int, int, int, int]:
        area = h * w
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target = area * rng.uniform(*self.scale)
            aspect = math.exp(rng.uniform(*log_ratio))
            cw = round(math.sqrt(target * aspect))
            ch = round(math.sqrt(target / aspect))
            if 0 < cw <= w and 0 < ch <= h:
                return int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1)), ch, cw
        in_ratio = w / h
        if in_ratio < self.ratio[0]:
            cw, ch = w, round(w / self.ratio[0])
        elif in_ratio > self.ratio[1]:
            ch, cw = h, round(h * self.ratio[1])
        else:
            cw, ch = w, h
        return (h - ch) // 2, (w - cw) // 2, ch, cw

    def _transform(self, batch: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        image = batch[self.image_key]
        b, (h, w) = image.shape[0], image.shape[-2:]
        crops = torch.tensor([self._crop(h, w, rng) for _ in range(b)], dtype=torch.float64).reshape(b, 4)
        top, left, ch, cw = crops.unbind(1)
        # Nearest sampling (masks, and images with interpolation="nearest") gathers integer indices:
        # exact for every dtype, and the same pixels for image and masks.
        batch[self.image_key] = K.resized_crop(image, top, left, ch, cw, self.size, self.interpolation)
        for key in self._masks(batch):
            batch[key] = K.resized_crop(batch[key], top, left, ch, cw, self.size, "nearest")
        return batch


class _BatchPhotometric(BatchTransform):
    """Per-sample photometric ops: image only, masks and boxes untouched."""

    geometric = False

    def __init__(
        self,
        *,
        per_band: bool = False,
        p: float = 1.0,
        value_range: tuple[float, float] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.per_band = bool(per_band)
        self.p = _check_p(p, type(self).__name__)
        self.value_range = _check_value_range(value_range, type(self).__name__)

    def _factors(self, rng: np.random.Generator, image: Tensor, lo: float, hi: float, neutral: float) -> Tensor:
        b, c = image.shape[:2]
        f = rng.uniform(lo, hi, size=(b, c if self.per_band else 1))
        skip = rng.random(b) >= self.p
        f[skip] = neutral
        return torch.from_numpy(f)  # [B, C] or [B, 1]: the kernels broadcast it over the bands and pixels


class BatchRandomBrightness(_BatchPhotometric):
    """Multiply each sample (or each band of each sample, ``per_band=True``) by its own random factor.

    Args:
        brightness: a number ``b`` draws factors from ``[max(0, 1 - b), 1 + b]``;
            a pair gives the range.
        per_band: one factor per band of each sample instead of one per sample.
        p: probability, per sample, of applying it.
        value_range: clamp the result (default: the dtype's range for
            integer images, none for floats), as :class:`~pipekit.transforms.RandomBrightness`.
        seed, image_key: as :class:`BatchTransform`.

    Example:
        >>> import torch
        >>> from pipekit.transforms import BatchRandomBrightness
        >>> out = BatchRandomBrightness((0.5, 1.5), seed=0)(torch.ones(4, 13, 2, 2))
        >>> factors = out.amax(dim=(1, 2, 3))
        >>> bool((out == factors.view(4, 1, 1, 1)).all()), len(set(factors.tolist()))
        (True, 4)
    """

    def __init__(self, brightness: float | tuple[float, float] = 0.2, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.brightness = _factor_range(brightness, "brightness", "BatchRandomBrightness") or (1.0, 1.0)

    def _transform(self, batch: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        image = batch[self.image_key]
        f = self._factors(rng, image, *self.brightness, neutral=1.0)
        batch[self.image_key] = K.adjust_brightness(image, f, self.value_range)
        return batch


class BatchRandomContrast(_BatchPhotometric):
    """Scale each band's deviation from its own mean by a random factor per sample (or per band).

    ``out = mean + factor * (x - mean)`` with the mean of each band of each
    sample, as :class:`~pipekit.transforms.RandomContrast` per sample.

    Args:
        contrast: a number ``c`` draws factors from ``[max(0, 1 - c), 1 + c]``;
            a pair gives the range.
        per_band, p, value_range, seed, image_key: as :class:`BatchRandomBrightness`.

    Example:
        >>> import torch
        >>> from pipekit.transforms import BatchRandomContrast
        >>> x = torch.tensor([0.0, 2.0]).expand(3, 7, 1, 2)
        >>> BatchRandomContrast((0.5, 0.5), seed=0)(x)[:, 0].flatten().tolist()
        [0.5, 1.5, 0.5, 1.5, 0.5, 1.5]
    """

    def __init__(self, contrast: float | tuple[float, float] = 0.2, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.contrast = _factor_range(contrast, "contrast", "BatchRandomContrast") or (1.0, 1.0)

    def _transform(self, batch: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        image = batch[self.image_key]
        f = self._factors(rng, image, *self.contrast, neutral=1.0)
        batch[self.image_key] = K.adjust_contrast(image, f, self.value_range)
        return batch


class BatchRandomGaussianNoise(_BatchPhotometric):
    """Add Gaussian noise (in the data's units) to the samples of a batch, each with probability ``p``.

    The noise is drawn on the batch's device from a generator seeded by the
    module's stream, so it is reproducible on each device (CPU and GPU draw
    different numbers for the same seed, unlike the other batch ops).

    Args:
        std: the noise's standard deviation: one number, or one per band.
        mean: the noise's mean.
        p, value_range, seed, image_key: as :class:`BatchRandomBrightness`.

    Example:
        >>> import torch
        >>> from pipekit.transforms import BatchRandomGaussianNoise
        >>> out = BatchRandomGaussianNoise(std=0.1, seed=0)(torch.zeros(8, 13, 32, 32))
        >>> round(float(out.std()), 2)
        0.1
    """

    def __init__(self, std: float | Sequence[float] = 0.05, *, mean: float = 0.0, **kwargs: Any) -> None:
        if "per_band" in kwargs:
            raise TypeError("BatchRandomGaussianNoise: give std one value per band instead of per_band")
        super().__init__(**kwargs)
        self.std, self.mean = _check_noise(std, mean, "BatchRandomGaussianNoise")

    def _transform(self, batch: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        image = batch[self.image_key]
        b, c = image.shape[:2]
        if len(self.std) not in (1, c):
            raise ValueError(f"BatchRandomGaussianNoise: std has {len(self.std)} values but the images have {c} bands")
        work = K.work_dtype(image)
        gen = torch.Generator(device=image.device)
        gen.manual_seed(int(rng.integers(0, 2**63 - 1)))
        chosen = rng.random(b) < self.p
        std = torch.tensor(self.std, dtype=work, device=image.device).view(1, -1)  # [1, C] or [1, 1]
        mean: float | Tensor = self.mean
        if not chosen.all():  # samples left out get zero noise
            keep = torch.from_numpy(chosen).to(device=image.device, dtype=work).view(b, 1)
            std = std * keep
            mean = self.mean * keep if self.mean else 0.0
        noise = torch.randn(image.shape, generator=gen, device=image.device, dtype=work)
        # the noise buffer becomes the output: one full-size allocation
        batch[self.image_key] = K.add_gaussian_noise(image, noise, std, mean, self.value_range, inplace=True)
        return batch


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
