"""TrivialAugment (wide) for multispectral sample dicts.

:class:`TrivialAugment` picks one op per call: a geometric one (shear,
translate, rotate: torchvision's kernels on the image, all bands, its masks
and boxes) or, with ``color=True``, a colour one (torchvision's kernels on the
red, green and blue bands only).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from pipekit.transforms._color import _on_bands, _RGBSelection
from pipekit.transforms._tv import _band_count, _is_plain_tensor, _plain, _rewrap

__all__ = ["TrivialAugment"]


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
