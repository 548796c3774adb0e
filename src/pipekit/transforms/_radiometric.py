"""Per-band radiometric ops for sample dicts, for any number of bands.

:class:`RandomBrightness`, :class:`RandomContrast`, :class:`RandomGamma`,
:class:`RandomGaussianNoise` and :class:`RandomChannelDropout` are torchvision
v2 transforms (use them in an :class:`~pipekit.transforms.Augment`, or on
their own on an image ``[C, H, W]``): they draw their random parameters and
hand them to the kernels of :mod:`pipekit.transforms.functional`, which the
batch ops of :mod:`pipekit.transforms.batch_augment` share.  They change
images only (masks and boxes pass through).

Value conventions: computed in float32 (float64 stays float64); integer images
are rounded and clamped to their dtype's range (or ``value_range``); float
images are clamped only when ``value_range`` is given.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from pipekit.transforms import functional as K
from pipekit.transforms._common import _check_noise, _check_value_range, _factor_range, _uniform
from pipekit.transforms._tv import _ImageOp

__all__ = [
    "RandomBrightness",
    "RandomChannelDropout",
    "RandomContrast",
    "RandomGamma",
    "RandomGaussianNoise",
]


class RandomBrightness(_ImageOp):
    """Multiply the image by a random factor (one for all bands, or one per band).

    Args:
        brightness: a number ``b`` draws the factor from ``[max(0, 1 - b), 1 + b]``;
            a pair ``(lo, hi)`` gives the range.
        per_band: draw an independent factor for each band.
        p: probability of applying it.
        value_range: clamp the result to ``(min, max)``; default: the dtype's
            range for integer images, no clamping for float images.

    Example:
        >>> import torch
        >>> from pipekit.transforms import RandomBrightness
        >>> _ = torch.manual_seed(0)
        >>> RandomBrightness((2.0, 2.0))(torch.ones(13, 2, 2)).unique().tolist()
        [2.0]
    """

    def __init__(
        self,
        brightness: float | tuple[float, float] = 0.2,
        *,
        per_band: bool = False,
        p: float = 1.0,
        value_range: tuple[float, float] | None = None,
    ) -> None:
        super().__init__(p)
        rng = _factor_range(brightness, "brightness", type(self).__name__)
        self.brightness = rng or (1.0, 1.0)
        self.per_band = bool(per_band)
        self.value_range = _check_value_range(value_range, type(self).__name__)

    def _draw(self, channels: int) -> dict[str, Any]:
        return {"factor": _uniform(*self.brightness, channels if self.per_band else None)}

    def _band_op(self, x: Tensor, params: dict[str, Any]) -> Tensor:
        return K.adjust_brightness(x, params["factor"], self.value_range)


class RandomContrast(_ImageOp):
    """Scale each band's deviation from its own mean by a random factor.

    ``out = mean_band + factor * (x - mean_band)``, the mean taken over each
    band's pixels (per image of a batch).  Unlike torchvision's RGB contrast
    (which blends towards the mean grey level) this works for any band count.

    Args:
        contrast: a number ``c`` draws the factor from ``[max(0, 1 - c), 1 + c]``;
            a pair gives the range.
        per_band, p, value_range: as :class:`RandomBrightness`.

    Example:
        >>> import torch
        >>> from pipekit.transforms import RandomContrast
        >>> x = torch.tensor([[[0.0, 2.0]]]).expand(7, 1, 2)
        >>> RandomContrast((0.5, 0.5))(x)[0].tolist()
        [[0.5, 1.5]]
    """

    def __init__(
        self,
        contrast: float | tuple[float, float] = 0.2,
        *,
        per_band: bool = False,
        p: float = 1.0,
        value_range: tuple[float, float] | None = None,
    ) -> None:
        super().__init__(p)
        self.contrast = _factor_range(contrast, "contrast", type(self).__name__) or (1.0, 1.0)
        self.per_band = bool(per_band)
        self.value_range = _check_value_range(value_range, type(self).__name__)

    def _draw(self, channels: int) -> dict[str, Any]:
        return {"factor": _uniform(*self.contrast, channels if self.per_band else None)}

    def _band_op(self, x: Tensor, params: dict[str, Any]) -> Tensor:
        return K.adjust_contrast(x, params["factor"], self.value_range)


class RandomGamma(_ImageOp):
    """Gamma-correct each band: ``lo + (hi - lo) * ((x - lo) / (hi - lo)) ** gamma``.

    Args:
        gamma: ``(min, max)`` range of the exponent (or one number for a fixed
            gamma); must be positive.
        per_band: draw an independent gamma for each band.
        p: probability of applying it.
        value_range: ``(lo, hi)`` of the data; default ``(0, 1)`` for floats and
            ``(0, dtype max)`` for integers.  Values outside it are clamped.

    Example:
        >>> import torch
        >>> from pipekit.transforms import RandomGamma
        >>> RandomGamma(2.0)(torch.full((11, 1, 1), 0.5)).unique().tolist()
        [0.25]
    """

    def __init__(
        self,
        gamma: float | tuple[float, float] = (0.8, 1.25),
        *,
        per_band: bool = False,
        p: float = 1.0,
        value_range: tuple[float, float] | None = None,
    ) -> None:
        super().__init__(p)
        where = type(self).__name__
        if isinstance(gamma, numbers.Real) and not isinstance(gamma, bool):
            gamma = (float(gamma), float(gamma))
        rng = _factor_range(gamma, "gamma", where)
        assert rng is not None
        if rng[0] <= 0:
            raise ValueError(f"{where}: gamma must be positive, got {gamma!r}")
        self.gamma = rng
        self.per_band = bool(per_band)
        self.value_range = _check_value_range(value_range, where)

    def _draw(self, channels: int) -> dict[str, Any]:
        return {"gamma": _uniform(*self.gamma, channels if self.per_band else None)}

    def _band_op(self, x: Tensor, params: dict[str, Any]) -> Tensor:
        return K.adjust_gamma(x, params["gamma"], self.value_range)


class RandomGaussianNoise(_ImageOp):
    """Add Gaussian noise, in the data's units, to every pixel of every band.

    Args:
        std: the noise's standard deviation: one number, or one per band.
        mean: the noise's mean.
        p: probability of applying it.
        value_range: clamp the result (default: dtype range for integers,
            none for floats).

    The noise is drawn on the CPU (from the stream of the enclosing
    :class:`Augment`) and moved to the image's device, so a seed gives the
    same noise on any device.

    Example:
        >>> import torch
        >>> from pipekit.transforms import RandomGaussianNoise
        >>> _ = torch.manual_seed(0)
        >>> noisy = RandomGaussianNoise(std=0.1)(torch.zeros(7, 64, 64))
        >>> round(float(noisy.std()), 2)
        0.1
    """

    def __init__(
        self,
        std: float | Sequence[float] = 0.05,
        *,
        mean: float = 0.0,
        p: float = 1.0,
        value_range: tuple[float, float] | None = None,
    ) -> None:
        super().__init__(p)
        where = type(self).__name__
        self.std, self.mean = _check_noise(std, mean, where)
        self.value_range = _check_value_range(value_range, where)

    def _draw(self, channels: int) -> dict[str, Any]:
        if len(self.std) not in (1, channels):
            raise ValueError(
                f"{type(self).__name__}: std has {len(self.std)} values but the image has {channels} bands"
            )
        return {}

    def _band_op(self, x: Tensor, params: dict[str, Any]) -> Tensor:
        noise = torch.randn(x.shape, dtype=torch.float32)  # on the CPU: the same numbers on any device
        std = torch.tensor(self.std) if len(self.std) > 1 else self.std[0]
        return K.add_gaussian_noise(x, noise, std, self.mean, self.value_range)


class RandomChannelDropout(_ImageOp):
    """Replace a random number of whole bands with ``fill``.

    Args:
        num_channels: how many bands to drop: a number, or an inclusive
            ``(min, max)`` range drawn uniformly.  At least one band is kept.
        fill: the value written into dropped bands.
        p: probability of applying it.

    Example:
        >>> import torch
        >>> from pipekit.transforms import RandomChannelDropout
        >>> out = RandomChannelDropout(num_channels=3, p=1.0)(torch.ones(13, 2, 2))
        >>> int((out.amax(dim=(1, 2)) == 0).sum())
        3
    """

    def __init__(self, num_channels: int | tuple[int, int] = 1, *, fill: float = 0.0, p: float = 0.5) -> None:
        super().__init__(p)
        where = type(self).__name__
        if isinstance(num_channels, numbers.Integral) and not isinstance(num_channels, bool):
            num_channels = (int(num_channels), int(num_channels))
        if not (
            isinstance(num_channels, Sequence)
            and len(num_channels) == 2
            and all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in num_channels)
            and 1 <= num_channels[0] <= num_channels[1]
        ):
            raise ValueError(f"{where}: num_channels must be an int >= 1 or a (min, max) pair, got {num_channels!r}")
        if isinstance(fill, bool) or not isinstance(fill, numbers.Real):
            raise TypeError(f"{where}: fill must be a number, got {fill!r}")
        self.num_channels = (int(num_channels[0]), int(num_channels[1]))
        self.fill = float(fill)

    def _draw(self, channels: int) -> dict[str, Any]:
        lo, hi = self.num_channels
        if hi >= channels:
            raise ValueError(
                f"{type(self).__name__}: cannot drop up to {hi} of {channels} bands (at least one must stay)"
            )
        k = int(torch.randint(lo, hi + 1, ()))
        return {"drop": torch.randperm(channels)[:k].tolist()}

    def _band_op(self, x: Tensor, params: dict[str, Any]) -> Tensor:
        if not x.is_floating_point():
            info = torch.iinfo(x.dtype)
            if not (info.min <= self.fill <= info.max and float(self.fill).is_integer()):
                raise ValueError(f"RandomChannelDropout: fill {self.fill} is not a valid {x.dtype} value")
        return K.channel_dropout(x, params["drop"], self.fill)
