"""Sample-dict augmentation on torchvision.transforms.v2, for any number of bands.

:class:`Augment` runs torchvision v2 transforms (and the ones below) on a sample
dict: ``sample["image"]`` becomes a ``tv_tensors.Image``, ``sample["mask"]`` a
``tv_tensors.Mask`` and box entries ``tv_tensors.BoundingBoxes``, so geometric
ops move them together (masks are resampled with nearest neighbour, boxes
follow the corners).  Other entries pass through untouched: plain tensors
(``labels``...) are handed to torchvision as plain tensors, which it leaves as
they are (``SanitizeBoundingBoxes`` can still filter ``labels``), and
non-tensor values (``crs``, ``bounds``, ``transform``) never reach it.
Geometric ops do **not** update georeferencing entries such as ``bounds`` or
``transform``.

Multispectral images (7, 11, 13... bands):

* torchvision's geometric ops (``RandomHorizontalFlip``, ``RandomVerticalFlip``,
  ``RandomAffine``, ``RandomRotation``, ``RandomResizedCrop``, ``RandomCrop``,
  ``ElasticTransform``...) work for any number of bands, as do
  ``GaussianBlur`` and :class:`RandomRot90` here;
* per-band photometric ops here accept any number of bands:
  :class:`RandomBrightness`, :class:`RandomContrast`, :class:`RandomGamma`,
  :class:`RandomGaussianNoise`, :class:`RandomChannelDropout` (and
  ``torchvision``'s ``GaussianBlur``);
* ops that only make sense on RGB (hue, saturation, TrivialAugment's colour
  ops): :class:`RandomHue`, :class:`RandomSaturation`, :class:`ColorJitter`,
  :class:`TrivialAugment` and :class:`RGBOnly` refuse an image that does not
  have exactly 3 bands with an error naming the op and the band count, unless
  told which bands are red, green and blue (``rgb_bands=(r, g, b)``, by
  position, or by name with ``bands=dataset.bands``): then they change those
  three bands only.  torchvision's own RGB-only ops in an :class:`Augment`
  are refused the same way before anything runs.

Value conventions: per-band ops compute in float32 (float64 stays float64).
Integer images are rounded and clamped to their dtype's range (or
``value_range``); float images are clamped only when ``value_range`` is given,
so reflectances above 1 or normalised (negative) values survive.  The RGB ops
call torchvision's kernels on the three bands and follow torchvision's
conventions (floats in 0..1, clamped).

Randomness: an :class:`Augment` draws every random parameter from its own
:class:`~pipekit.transforms.seeding.RandomStream` (torch's global RNG is swapped
for the stream during the call and restored after), so each DataLoader worker
and rank has its own reproducible stream; see :mod:`pipekit.transforms.seeding`.
The ops used on their own draw from torch's global RNG, like torchvision's.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from pipekit.transforms import functional as K
from pipekit.transforms._bands import check_band_spec, check_names, resolve_band
from pipekit.transforms._common import (
    DEFAULT_BOX_KEYS,
    _check_k,
    _check_noise,
    _check_p,
    _check_value_range,
    _factor_range,
    _uniform,
)
from pipekit.transforms.seeding import RandomStream

__all__ = [
    "Augment",
    "ColorJitter",
    "RGBOnly",
    "RandomBrightness",
    "RandomChannelDropout",
    "RandomContrast",
    "RandomGamma",
    "RandomGaussianNoise",
    "RandomHue",
    "RandomRot90",
    "RandomSaturation",
    "TrivialAugment",
    "DEFAULT_BOX_KEYS",
]


# --------------------------------------------------------------------------- helpers


def _is_plain_tensor(x: Any) -> bool:
    return isinstance(x, Tensor) and not isinstance(x, tv_tensors.TVTensor)


def _plain(x: Tensor) -> Tensor:
    return x.as_subclass(Tensor) if isinstance(x, tv_tensors.TVTensor) else x


def _rewrap(out: Tensor, like: Any) -> Any:
    return tv_tensors.wrap(out, like=like) if isinstance(like, tv_tensors.TVTensor) else out


def _image_in(flat_inputs: list[Any]) -> Tensor | None:
    for x in flat_inputs:
        if isinstance(x, (tv_tensors.Image, tv_tensors.Video)):
            return x
    for x in flat_inputs:
        if _is_plain_tensor(x):
            return x
    return None


def _band_count(flat_inputs: list[Any], where: str) -> int:
    image = _image_in(flat_inputs)
    if image is None:
        raise ValueError(f"{where}: no image in the input")
    if image.dim() < 3:
        raise ValueError(f"{where}: the image needs a band axis at -3, got shape {tuple(image.shape)}")
    return int(image.shape[-3])


class _ImageOp(v2.Transform):
    """Base of pipekit's photometric ops: random parameters per call, applied to images only."""

    _transformed_types = (tv_tensors.Image, tv_tensors.Video, _is_plain_tensor)

    def __init__(self, p: float = 1.0) -> None:
        super().__init__()
        self.p = _check_p(p, type(self).__name__)

    def _draw(self, channels: int) -> dict[str, Any]:  # pragma: no cover - overridden
        return {}

    def _band_op(self, x: Tensor, params: dict[str, Any]) -> Tensor:  # pragma: no cover - overridden
        raise NotImplementedError

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        channels = _band_count(flat_inputs, type(self).__name__)
        if self.p < 1.0 and not bool(torch.rand(()) < self.p):
            return {"apply": False}
        params = self._draw(channels)
        params["apply"] = True
        return params

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        if not params["apply"]:
            return inpt
        return _rewrap(self._band_op(_plain(inpt), params), inpt)

    # torchvision < 0.21 calls the private names.
    _get_params = make_params
    _transform = transform


# --------------------------------------------------------------------------- per-band photometric ops


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


# --------------------------------------------------------------------------- RGB-only ops


class _RGBSelection:
    """Which three bands are red, green and blue."""

    def _init_rgb(self, rgb_bands: Sequence[int | str] | None, bands: Sequence[str] | None) -> None:
        where = type(self).__name__
        self.bands = check_names(bands, where)
        if rgb_bands is None:
            self.rgb_bands: tuple[int | str, ...] | None = None
        else:
            if isinstance(rgb_bands, str) or not isinstance(rgb_bands, Sequence) or len(rgb_bands) != 3:
                raise TypeError(f"{where}: rgb_bands must be three bands (red, green, blue), got {rgb_bands!r}")
            self.rgb_bands = tuple(
                check_band_spec(b, role, where) for b, role in zip(rgb_bands, ("red", "green", "blue"))
            )
            if any(isinstance(b, str) for b in self.rgb_bands) and self.bands is None:
                raise ValueError(
                    f"{where}: rgb_bands {list(rgb_bands)} are names; pass bands=[...] (e.g. dataset.bands)"
                )

    def _rgb_positions(self, channels: int, what: str) -> list[int]:
        where = type(self).__name__
        if self.rgb_bands is None:
            if channels != 3:
                raise ValueError(
                    f"{where}: {what} needs an RGB image (3 bands) but the image has {channels} bands; "
                    "pass rgb_bands=(red, green, blue) to apply it to those three bands"
                )
            return [0, 1, 2]
        positions = [
            resolve_band(b, self.bands, role, where) for b, role in zip(self.rgb_bands, ("red", "green", "blue"))
        ]
        for p in positions:
            if not -channels <= p < channels:
                raise IndexError(f"{where}: rgb band {p} is out of range for an image with {channels} bands")
        return [p % channels for p in positions]


def _on_bands(x: Tensor, positions: list[int], fn: Callable[[Tensor], Tensor]) -> Tensor:
    sub = tv_tensors.Image(x[..., positions, :, :])
    done = _plain(fn(sub))
    out = x.clone()
    out[..., positions, :, :] = done.to(x.dtype)
    return out


class RandomHue(_ImageOp, _RGBSelection):
    """Shift the hue of the RGB bands by a random amount (torchvision's ``adjust_hue``).

    Args:
        hue: a number ``h`` in [0, 0.5] draws the shift from ``[-h, h]``; a pair
            within [-0.5, 0.5] gives the range.
        rgb_bands: the (red, green, blue) bands, by position or name; needed
            unless the image has exactly 3 bands.
        bands: band names, to resolve ``rgb_bands`` given by name.
        p: probability of applying it.

    Example:
        >>> import torch
        >>> from pipekit.transforms import RandomHue
        >>> RandomHue(0.1)(torch.rand(7, 4, 4))
        Traceback (most recent call last):
        ...
        ValueError: RandomHue: hue needs an RGB image (3 bands) but the image has 7 bands; pass rgb_bands=...
        >>> RandomHue(0.1, rgb_bands=(3, 2, 1))(torch.rand(7, 4, 4)).shape
        torch.Size([7, 4, 4])
    """

    def __init__(
        self,
        hue: float | tuple[float, float] = 0.1,
        *,
        rgb_bands: Sequence[int | str] | None = None,
        bands: Sequence[str] | None = None,
        p: float = 1.0,
    ) -> None:
        super().__init__(p)
        self.hue = _factor_range(hue, "hue", type(self).__name__, center=0.0, bound=(-0.5, 0.5)) or (0.0, 0.0)
        self._init_rgb(rgb_bands, bands)

    def _draw(self, channels: int) -> dict[str, Any]:
        return {"rgb": self._rgb_positions(channels, "hue"), "hue": float(_uniform(*self.hue))}

    def _band_op(self, x: Tensor, params: dict[str, Any]) -> Tensor:
        return _on_bands(x, params["rgb"], lambda s: F.adjust_hue(s, params["hue"]))


class RandomSaturation(_ImageOp, _RGBSelection):
    """Scale the saturation of the RGB bands by a random factor (torchvision's ``adjust_saturation``).

    Args:
        saturation: a number ``s`` draws the factor from ``[max(0, 1 - s), 1 + s]``;
            a pair gives the range.
        rgb_bands, bands, p: as :class:`RandomHue`.

    Example:
        >>> import torch
        >>> from pipekit.transforms import RandomSaturation
        >>> x = torch.rand(13, 4, 4)
        >>> out = RandomSaturation((0.0, 0.0), rgb_bands=(3, 2, 1))(x)
        >>> torch.allclose(out[1], out[2]), torch.equal(out[4:], x[4:])  # greyscale RGB, others untouched
        (True, True)
    """

    def __init__(
        self,
        saturation: float | tuple[float, float] = 0.2,
        *,
        rgb_bands: Sequence[int | str] | None = None,
        bands: Sequence[str] | None = None,
        p: float = 1.0,
    ) -> None:
        super().__init__(p)
        self.saturation = _factor_range(saturation, "saturation", type(self).__name__) or (1.0, 1.0)
        self._init_rgb(rgb_bands, bands)

    def _draw(self, channels: int) -> dict[str, Any]:
        return {"rgb": self._rgb_positions(channels, "saturation"), "factor": float(_uniform(*self.saturation))}

    def _band_op(self, x: Tensor, params: dict[str, Any]) -> Tensor:
        return _on_bands(x, params["rgb"], lambda s: F.adjust_saturation(s, params["factor"]))


class ColorJitter(_ImageOp, _RGBSelection):
    """torchvision's ColorJitter for multispectral images: brightness and contrast on every band,
    saturation and hue on the RGB bands, in a random order.

    Args:
        brightness, contrast: as :class:`RandomBrightness` / :class:`RandomContrast`
            (per band mean for contrast), applied to all bands; 0 or ``None``: off.
        saturation, hue: as :class:`RandomSaturation` / :class:`RandomHue`,
            applied to ``rgb_bands`` (or the image if it has 3 bands); 0 or
            ``None``: off, and then no RGB bands are needed.
        rgb_bands, bands: which bands are red, green, blue (by position, or by
            name with ``bands``).
        per_band: draw brightness/contrast factors per band.
        value_range: clamp after brightness/contrast (see :class:`RandomBrightness`).

    Example:
        >>> import torch
        >>> from pipekit.transforms import ColorJitter
        >>> ColorJitter(brightness=0.2, contrast=0.2)(torch.rand(11, 8, 8)).shape
        torch.Size([11, 8, 8])
        >>> ColorJitter(saturation=0.2)(torch.rand(11, 8, 8))
        Traceback (most recent call last):
        ...
        ValueError: ColorJitter: saturation needs an RGB image (3 bands) but the image has 11 bands; pass rgb_bands=...
    """

    def __init__(
        self,
        brightness: float | tuple[float, float] | None = None,
        contrast: float | tuple[float, float] | None = None,
        saturation: float | tuple[float, float] | None = None,
        hue: float | tuple[float, float] | None = None,
        *,
        rgb_bands: Sequence[int | str] | None = None,
        bands: Sequence[str] | None = None,
        per_band: bool = False,
        value_range: tuple[float, float] | None = None,
    ) -> None:
        super().__init__(1.0)
        where = type(self).__name__
        self.brightness = _factor_range(brightness, "brightness", where)
        self.contrast = _factor_range(contrast, "contrast", where)
        self.saturation = _factor_range(saturation, "saturation", where)
        self.hue = _factor_range(hue, "hue", where, center=0.0, bound=(-0.5, 0.5))
        self.per_band = bool(per_band)
        self.value_range = _check_value_range(value_range, where)
        self._init_rgb(rgb_bands, bands)

    def _draw(self, channels: int) -> dict[str, Any]:
        params: dict[str, Any] = {"order": torch.randperm(4).tolist()}
        n = channels if self.per_band else None
        if self.saturation is not None or self.hue is not None:
            params["rgb"] = self._rgb_positions(channels, "saturation" if self.saturation is not None else "hue")
        if self.brightness is not None:
            params["brightness"] = _uniform(*self.brightness, n)
        if self.contrast is not None:
            params["contrast"] = _uniform(*self.contrast, n)
        if self.saturation is not None:
            params["saturation"] = float(_uniform(*self.saturation))
        if self.hue is not None:
            params["hue"] = float(_uniform(*self.hue))
        return params

    def _band_op(self, x: Tensor, params: dict[str, Any]) -> Tensor:
        out = x
        for step in params["order"]:
            if step == 0 and "brightness" in params:
                out = K.adjust_brightness(out, params["brightness"], self.value_range)
            elif step == 1 and "contrast" in params:
                out = K.adjust_contrast(out, params["contrast"], self.value_range)
            elif step == 2 and "saturation" in params:
                out = _on_bands(out, params["rgb"], lambda s: F.adjust_saturation(s, params["saturation"]))
            elif step == 3 and "hue" in params:
                out = _on_bands(out, params["rgb"], lambda s: F.adjust_hue(s, params["hue"]))
        return out


class RGBOnly(v2.Transform, _RGBSelection):
    """Run a torchvision colour transform on three chosen bands of a multispectral image.

    The wrapped transform sees a 3-band ``tv_tensors.Image`` made of
    ``rgb_bands`` and its output is written back into those bands; the other
    bands, masks and boxes are untouched.  Only photometric transforms make
    sense here (``ColorJitter``, ``RandomGrayscale``, ``RandomPosterize``,
    ``RandomAutocontrast``...): a geometric one would move the RGB bands away
    from the others, so a transform that changes the bands' shape is refused.

    Args:
        transform: the torchvision (or any) transform for 3-band images.
        rgb_bands: the (red, green, blue) bands, by position or name; needed
            unless the image has exactly 3 bands.
        bands: band names, to resolve ``rgb_bands`` given by name.

    Example:
        >>> import torch
        >>> from torchvision.transforms import v2
        >>> from pipekit.transforms import RGBOnly
        >>> x = torch.rand(7, 4, 4)
        >>> out = RGBOnly(v2.RandomGrayscale(p=1.0), rgb_bands=(3, 2, 1))(x)
        >>> torch.allclose(out[1], out[3]), torch.equal(out[4:], x[4:])
        (True, True)
    """

    _transformed_types = (tv_tensors.Image, tv_tensors.Video, _is_plain_tensor)

    def __init__(
        self,
        transform: Callable[[Any], Any],
        rgb_bands: Sequence[int | str] | None = None,
        *,
        bands: Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        if not callable(transform):
            raise TypeError(f"RGBOnly: transform must be callable, got {type(transform).__name__}")
        self.inner = transform
        self._init_rgb(rgb_bands, bands)

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        name = getattr(type(self.inner), "__name__", "transform")
        return {"rgb": self._rgb_positions(_band_count(flat_inputs, "RGBOnly"), name)}

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        x = _plain(inpt)
        rgb = params["rgb"]
        sub = tv_tensors.Image(x[..., rgb, :, :])
        done = self.inner(sub)
        if not isinstance(done, Tensor) or done.shape != sub.shape:
            got = tuple(done.shape) if isinstance(done, Tensor) else type(done).__name__
            raise ValueError(
                f"RGBOnly: {type(self.inner).__name__} changed the RGB bands from {tuple(sub.shape)} to {got}; "
                "only photometric transforms can run on some of the bands (put geometric ones in Augment directly)"
            )
        out = x.clone()
        out[..., rgb, :, :] = _plain(done).to(x.dtype)
        return _rewrap(out, inpt)

    _get_params = make_params
    _transform = transform


# --------------------------------------------------------------------------- geometric ops


class RandomRot90(v2.Transform):
    """Rotate image, masks and boxes by a random multiple of 90 degrees (counter-clockwise), exactly.

    Images and masks are rotated with ``torch.rot90`` (no interpolation, any
    dtype and band count); boxes are mapped exactly and their canvas size
    swapped for odd multiples.

    Args:
        k: the multiples of 90 degrees to choose from, uniformly.
        p: probability of rotating at all.

    Example:
        >>> import torch
        >>> from torchvision import tv_tensors
        >>> from pipekit.transforms import RandomRot90
        >>> x = torch.arange(6.0).reshape(1, 2, 3)
        >>> RandomRot90(k=(1,))(x).tolist()
        [[[2.0, 5.0], [1.0, 4.0], [0.0, 3.0]]]
        >>> boxes = tv_tensors.BoundingBoxes([[0, 0, 1, 2]], format="XYXY", canvas_size=(2, 3))
        >>> out = RandomRot90(k=(1,))(boxes)
        >>> out.tolist(), out.canvas_size
        ([[0, 2, 2, 3]], (3, 2))
    """

    def __init__(self, k: Sequence[int] = (0, 1, 2, 3), *, p: float = 1.0) -> None:
        super().__init__()
        self.k = _check_k(k, "RandomRot90")
        self.p = _check_p(p, "RandomRot90")

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        if self.p < 1.0 and not bool(torch.rand(()) < self.p):
            return {"k": 0}
        return {"k": self.k[int(torch.randint(len(self.k), ()))]}

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        k = params["k"]
        if k == 0:
            return inpt
        if isinstance(inpt, tv_tensors.BoundingBoxes):
            return _rot90_boxes(inpt, k)
        if isinstance(inpt, Tensor) and inpt.dim() >= 2:
            return _rewrap(K.rot90(_plain(inpt), k), inpt)
        return inpt

    _get_params = make_params
    _transform = transform


def _rot90_boxes(boxes: tv_tensors.BoundingBoxes, k: int) -> tv_tensors.BoundingBoxes:
    fmt = boxes.format
    if fmt.name not in ("XYXY", "XYWH", "CXCYWH"):
        raise ValueError(f"RandomRot90: boxes in format {fmt.name} are not supported (axis-aligned formats only)")
    h, w = boxes.canvas_size
    xyxy = _plain(F.convert_bounding_box_format(boxes, new_format=tv_tensors.BoundingBoxFormat.XYXY))
    out, canvas = K.rot90_boxes(xyxy, k, (h, w))
    result = tv_tensors.BoundingBoxes(out, format="XYXY", canvas_size=canvas)
    if fmt.name != "XYXY":
        result = F.convert_bounding_box_format(result, new_format=fmt)
    return result


class TrivialAugment(v2.Transform, _RGBSelection):
    """TrivialAugment (wide) for multispectral samples: geometric ops on everything, colour ops on RGB bands.

    Each call picks one op uniformly and a magnitude uniformly from
    ``num_magnitude_bins`` bins (with a random sign where it applies), with
    TrivialAugmentWide's ranges: Identity; ShearX/ShearY (0..0.99);
    TranslateX/TranslateY (0..32 pixels); Rotate (0..135 degrees) -- applied
    to the image (all bands), masks and boxes together -- and, when
    ``color=True``, Brightness, Color (saturation), Contrast, Sharpness
    (factor 1 +- 0..0.99), Posterize (8..2 bits), Solarize, AutoContrast and
    Equalize, applied with torchvision's kernels to the RGB bands only.

    Args:
        rgb_bands: the (red, green, blue) bands by position or name; needed
            with ``color=True`` unless the image has exactly 3 bands.
        bands: band names, to resolve ``rgb_bands`` given by name.
        num_magnitude_bins: magnitude bins (31 in TrivialAugmentWide).
        interpolation: for the image in geometric ops (masks always use nearest).
        fill: value for pixels outside the input after a geometric op: a
            number (images), or a dict ``{tv_tensors.Image: v, tv_tensors.Mask: m}``.
        color: include the colour ops (``False``: geometric ops only, any band count).

    Example:
        >>> import torch
        >>> from pipekit.transforms import Augment, TrivialAugment
        >>> aug = Augment([TrivialAugment(rgb_bands=(3, 2, 1))], seed=0)
        >>> out = aug({"image": torch.rand(13, 32, 32), "mask": torch.zeros(32, 32, dtype=torch.long)})
        >>> out["image"].shape, out["mask"].shape
        (torch.Size([13, 32, 32]), torch.Size([32, 32]))
    """

    _GEOMETRIC = ("Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")
    _COLOR = ("Brightness", "Color", "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize")
    _SIGNED = {"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color", "Contrast", "Sharpness"}

    def __init__(
        self,
        rgb_bands: Sequence[int | str] | None = None,
        *,
        bands: Sequence[str] | None = None,
        num_magnitude_bins: int = 31,
        interpolation: v2.InterpolationMode = v2.InterpolationMode.NEAREST,
        fill: float | Mapping[type, float] | None = None,
        color: bool = True,
    ) -> None:
        super().__init__()
        if isinstance(num_magnitude_bins, bool) or not isinstance(num_magnitude_bins, int) or num_magnitude_bins < 2:
            raise ValueError(f"TrivialAugment: num_magnitude_bins must be an int >= 2, got {num_magnitude_bins!r}")
        if fill is not None and not isinstance(fill, (numbers.Real, Mapping)):
            raise TypeError(f"TrivialAugment: fill must be a number, a dict by tv_tensor type, or None, got {fill!r}")
        self.num_magnitude_bins = num_magnitude_bins
        self.interpolation = interpolation
        self.fill = fill
        self.color = bool(color)
        self.ops = self._GEOMETRIC + (self._COLOR if self.color else ())
        self._init_rgb(rgb_bands, bands)

    def _magnitude(self, op: str, b: int) -> float | None:
        n = self.num_magnitude_bins
        t = b / (n - 1)
        if op in ("ShearX", "ShearY", "Brightness", "Color", "Contrast", "Sharpness"):
            return 0.99 * t
        if op in ("TranslateX", "TranslateY"):
            return 32.0 * t
        if op == "Rotate":
            return 135.0 * t
        if op == "Posterize":
            return float(8 - round(b / ((n - 1) / 6)))
        if op == "Solarize":
            return 1.0 - t
        return None

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        params: dict[str, Any] = {}
        if self.color:
            params["rgb"] = self._rgb_positions(
                _band_count(flat_inputs, "TrivialAugment"), "TrivialAugment's colour ops"
            )
        op = self.ops[int(torch.randint(len(self.ops), ()))]
        magnitude = self._magnitude(op, int(torch.randint(self.num_magnitude_bins, ())))
        if magnitude is not None and op in self._SIGNED and bool(torch.rand(()) < 0.5):
            magnitude = -magnitude
        params.update(op=op, magnitude=magnitude)
        return params

    def _fill_for(self, inpt: Any) -> float | None:
        if isinstance(self.fill, Mapping):
            for cls, value in self.fill.items():
                if isinstance(inpt, cls):
                    return value
            return None
        if isinstance(inpt, tv_tensors.Mask):
            return None
        return self.fill

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        op, m = params["op"], params["magnitude"]
        if op == "Identity":
            return inpt
        if op in self._GEOMETRIC:
            fill = self._fill_for(inpt)
            if op == "Rotate":
                return F.rotate(inpt, angle=m, interpolation=self.interpolation, fill=fill)
            shear, translate = [0.0, 0.0], [0, 0]
            if op == "ShearX":
                shear[0] = math.degrees(math.atan(m))
            elif op == "ShearY":
                shear[1] = math.degrees(math.atan(m))
            elif op == "TranslateX":
                translate[0] = int(m)
            else:
                translate[1] = int(m)
            return F.affine(
                inpt, angle=0.0, translate=translate, scale=1.0, shear=shear, interpolation=self.interpolation,
                fill=fill, center=[0.0, 0.0],
            )  # fmt: skip
        if not isinstance(inpt, (tv_tensors.Image, tv_tensors.Video)) and not _is_plain_tensor(inpt):
            return inpt  # colour ops leave masks and boxes alone
        x = _plain(inpt)

        def colour(s: Tensor) -> Tensor:
            if op == "Brightness":
                return F.adjust_brightness(s, 1.0 + m)
            if op == "Color":
                return F.adjust_saturation(s, 1.0 + m)
            if op == "Contrast":
                return F.adjust_contrast(s, 1.0 + m)
            if op == "Sharpness":
                return F.adjust_sharpness(s, 1.0 + m)
            if op == "Posterize":
                return F.posterize(s, bits=int(m))
            if op == "Solarize":
                bound = 1.0 if s.is_floating_point() else float(torch.iinfo(s.dtype).max)
                return F.solarize(s, threshold=bound * m)
            if op == "AutoContrast":
                return F.autocontrast(s)
            return F.equalize(s)

        return _rewrap(_on_bands(x, params["rgb"], colour), inpt)

    _get_params = make_params
    _transform = transform


# --------------------------------------------------------------------------- Augment

_TV_RGB_ONLY: dict[str, str] = {
    "ColorJitter": "pipekit.transforms.ColorJitter (brightness/contrast per band, saturation/hue on rgb_bands)",
    "RandomPhotometricDistort": "pipekit.transforms.ColorJitter, or RGBOnly(...)",
    "TrivialAugmentWide": "pipekit.transforms.TrivialAugment(rgb_bands=...)",
    "RandAugment": "pipekit.transforms.TrivialAugment(rgb_bands=...)",
    "AutoAugment": "pipekit.transforms.TrivialAugment(rgb_bands=...)",
    "AugMix": "pipekit.transforms.TrivialAugment(rgb_bands=...)",
    "RandomGrayscale": "pipekit.transforms.RGBOnly(RandomGrayscale(...), rgb_bands=...)",
    "Grayscale": "pipekit.transforms.RGBOnly(Grayscale(3), rgb_bands=...)",
    "RandomAutocontrast": "pipekit.transforms.RGBOnly(RandomAutocontrast(...), rgb_bands=...)",
    "RandomAdjustSharpness": "pipekit.transforms.RGBOnly(RandomAdjustSharpness(...), rgb_bands=...)",
    "RGB": "nothing: the image is already multi-band",
}


def _rgb_only_ops(transform: Any) -> list[str]:
    """Names of torchvision ops inside ``transform`` that accept only 1- or 3-band images."""
    if isinstance(transform, RGBOnly):
        return []
    found: list[str] = []
    cls = type(transform)
    if cls.__module__.startswith("torchvision.") and cls.__name__ in _TV_RGB_ONLY:
        found.append(cls.__name__)
    inner = getattr(transform, "transforms", None)
    if isinstance(inner, (list, tuple, nn.ModuleList)):
        for t in inner:
            found.extend(_rgb_only_ops(t))
    return found


def _op_name(op: Any) -> str:
    return type(op).__name__ if not isinstance(op, type) else op.__name__


class Augment(nn.Module):
    """Apply transforms to a sample dict with its image, masks and boxes moving together.

    Args:
        transforms: a transform or a list of them, applied in order:
            torchvision v2 transforms, the ops of this module, or any callable
            taking and returning the dict of ``tv_tensors``.
        image_key: the entry holding the image ``[C, H, W]`` (or a batch
            ``[B, C, H, W]``: then every image of it gets the same parameters;
            use :mod:`pipekit.transforms.batch_augment` for per-sample ones).
        mask_keys: entries holding masks (``[H, W]`` or ``[K, H, W]``).
        box_keys: entries holding boxes ``[N, 4]``, with their format
            (``"XYXY"``, ``"XYWH"``, ``"CXCYWH"``); default
            :data:`DEFAULT_BOX_KEYS`.
        seed: the stream's seed (see :mod:`pipekit.transforms.seeding`);
            ``None`` derives one from the DataLoader worker's seed, or from
            torch's global RNG in the main process.

    Called with a dict, returns a new dict with the image, masks and boxes
    transformed (as plain tensors) and every other entry as it was.  Called
    with a tensor, treats it as the image and returns a tensor.

    Example:
        >>> import torch
        >>> from torchvision.transforms import v2
        >>> from pipekit.transforms import Augment, RandomBrightness, RandomRot90
        >>> aug = Augment([v2.RandomHorizontalFlip(p=1.0), RandomRot90(k=(2,)), RandomBrightness(0.1)], seed=0)
        >>> image = torch.arange(4.0).reshape(1, 2, 2).expand(7, 2, 2) / 10  # 7 bands
        >>> mask = (image[0] > 0.15).long()
        >>> mask.tolist()
        [[0, 0], [1, 1]]
        >>> out = aug({"image": image, "mask": mask, "crs": "EPSG:32632"})
        >>> out["mask"].tolist(), out["image"].shape, out["crs"]
        ([[1, 1], [0, 0]], torch.Size([7, 2, 2]), 'EPSG:32632')
    """

    def __init__(
        self,
        transforms: Callable[[Any], Any] | Sequence[Callable[[Any], Any]],
        *,
        image_key: str = "image",
        mask_keys: Sequence[str] = ("mask",),
        box_keys: Mapping[str, str] | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        ops = list(transforms) if isinstance(transforms, (list, tuple, nn.ModuleList)) else [transforms]
        for i, op in enumerate(ops):
            if not callable(op):
                raise TypeError(f"Augment: transform {i} is not callable ({type(op).__name__})")
        if not isinstance(image_key, str):
            raise TypeError(f"Augment: image_key must be a str, got {image_key!r}")
        if isinstance(mask_keys, str):
            mask_keys = (mask_keys,)
        box_keys = dict(DEFAULT_BOX_KEYS if box_keys is None else box_keys)
        for k, fmt in box_keys.items():
            if str(fmt).upper() not in ("XYXY", "XYWH", "CXCYWH"):
                raise ValueError(f"Augment: box format of {k!r} must be XYXY, XYWH or CXCYWH, got {fmt!r}")
        self.ops = ops
        self.image_key = image_key
        self.mask_keys = tuple(mask_keys)
        self.box_keys = {k: str(v).upper() for k, v in box_keys.items()}
        self.stream = RandomStream(seed)
        self._rgb_only = [name for op in ops for name in _rgb_only_ops(op)]

    def extra_repr(self) -> str:
        return "\n".join(repr(op) for op in self.ops)

    def forward(self, sample: Any) -> Any:
        return self.apply(sample, self.stream)

    def apply(self, sample: Any, stream: RandomStream) -> Any:
        """Transform ``sample`` drawing random parameters from ``stream`` (used by the ``augment`` pipe)."""
        if isinstance(sample, Tensor):
            return self.apply({self.image_key: sample}, stream)[self.image_key]
        if not isinstance(sample, Mapping):
            raise TypeError(f"Augment: expects a sample dict or an image tensor, got {type(sample).__name__}")
        if self.image_key not in sample:
            raise KeyError(f"Augment: the sample has no {self.image_key!r} entry (keys: {sorted(map(str, sample))})")
        image = sample[self.image_key]
        if not isinstance(image, Tensor) or image.dim() < 3:
            shape = tuple(image.shape) if isinstance(image, Tensor) else type(image).__name__
            raise ValueError(f"Augment: sample[{self.image_key!r}] must be a [C, H, W] tensor, got {shape}")
        channels = int(image.shape[-3])
        if self._rgb_only and channels not in (1, 3):
            names = sorted(set(self._rgb_only))
            hints = "; ".join(f"for {n} use {_TV_RGB_ONLY[n]}" for n in names)
            raise ValueError(
                f"Augment: torchvision's {', '.join(names)} only accept(s) 1- or 3-band images, but "
                f"sample[{self.image_key!r}] has {channels} bands; {hints}"
            )
        height, width = int(image.shape[-2]), int(image.shape[-1])
        data: dict[str, Any] = {self.image_key: tv_tensors.Image(image)}
        for key, value in sample.items():
            if key == self.image_key or not isinstance(value, Tensor):
                continue
            if key in self.mask_keys:
                data[key] = tv_tensors.Mask(value)
            elif key in self.box_keys:
                if value.dim() != 2 or value.shape[-1] != 4:
                    raise ValueError(f"Augment: sample[{key!r}] must hold boxes as [N, 4], got {tuple(value.shape)}")
                data[key] = tv_tensors.BoundingBoxes(value, format=self.box_keys[key], canvas_size=(height, width))
            else:
                data[key] = value  # plain tensors pass through torchvision untouched
        with stream.torch_global():
            for i, op in enumerate(self.ops):
                try:
                    data = op(data)
                except (TypeError, ValueError) as exc:
                    text = str(exc)
                    if "channel" in text and ("1 or 3" in text or "must be 1 or 3" in text):
                        raise ValueError(
                            f"Augment: step {i} ({_op_name(op)}) accepts only 1- or 3-band images, but the image "
                            f"has {channels} bands: {text}"
                        ) from exc
                    _note(exc, f"in Augment step {i} ({_op_name(op)})")
                    raise
                except Exception as exc:
                    _note(exc, f"in Augment step {i} ({_op_name(op)})")
                    raise
                if not isinstance(data, Mapping) or self.image_key not in data:
                    raise TypeError(f"Augment: step {i} ({_op_name(op)}) did not return the sample dict")
        out = dict(sample)
        for key, value in data.items():
            out[key] = _plain(value) if isinstance(value, Tensor) else value
        return out


def _note(exc: BaseException, message: str) -> None:
    if hasattr(exc, "add_note"):
        exc.add_note(message)
