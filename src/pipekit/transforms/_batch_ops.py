"""Per-sample batch ops: geometric (flips, 90-degree rotations, crops, resized crops) and photometric
(brightness, contrast, Gaussian noise).

Public in :mod:`pipekit.transforms.batch_augment`, which says what the batch transforms do and how they draw.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from pipekit.transforms import functional as K
from pipekit.transforms._batch_base import BatchTransform
from pipekit.transforms._common import (
    _check_k,
    _check_noise,
    _check_p,
    _check_value_range,
    _factor_range,
)


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
