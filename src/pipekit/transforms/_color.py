"""Colour ops that only make sense on red, green and blue, for multispectral sample dicts.

:class:`RandomHue`, :class:`RandomSaturation`, :class:`ColorJitter` and
:class:`RGBOnly` run torchvision's RGB kernels on three bands of the image:
by default an image must have exactly 3 bands (anything else is refused with an
error naming the op and the band count); told which bands are red, green and
blue (``rgb_bands=(r, g, b)``, by position, or by name with
``bands=dataset.bands``) they change those three bands only and leave the
others as they are.  :class:`ColorJitter`'s brightness and contrast apply to
every band, with the kernels of :mod:`pipekit.transforms.functional`.

The RGB ops follow torchvision's conventions (floats in 0..1, clamped).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from pipekit.transforms import functional as K
from pipekit.transforms._bands import check_band_spec, check_names, resolve_band
from pipekit.transforms._common import _check_value_range, _factor_range, _uniform
from pipekit.transforms._tv import _band_count, _ImageOp, _is_plain_tensor, _plain, _rewrap

__all__ = ["ColorJitter", "RGBOnly", "RandomHue", "RandomSaturation"]


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
