"""What every spectral index kernel of :mod:`pipekit.transforms.index_kernels` shares: checks and numerics.

The image and band checks, reading the bands (nodata, ``scale`` and ``offset``), the compute and output dtypes,
division without NaN or Inf, and the finishing of a result (``fill``, ``nodata_out``, clamping for half-precision
outputs), as :mod:`pipekit.transforms.index_kernels` documents them; and the two-band and three-band normalized
differences the named indices are made of.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

_NAN = float("nan")


_HALF = (torch.float16, torch.bfloat16)


def _check_image(image: Any, fn: str) -> None:
    if not isinstance(image, Tensor):
        raise TypeError(f"{fn}: image must be a torch.Tensor, got {type(image).__name__}")
    if image.dim() < 3:
        raise ValueError(
            f"{fn}: image must have its band axis at -3 ([C, H, W] or [B, C, H, W]), got shape {tuple(image.shape)}"
        )
    if image.dtype == torch.bool or image.is_complex():
        raise TypeError(f"{fn}: image must be a real number tensor, got dtype {image.dtype}")


def _band_position(image: Tensor, band: Any, role: str, fn: str) -> int:
    if isinstance(band, bool) or not hasattr(band, "__index__"):
        raise TypeError(f"{fn}: band {role} must be an integer position, got {band!r}")
    i = operator.index(band)
    channels = image.shape[-3]
    if not -channels <= i < channels:
        raise IndexError(f"{fn}: band {role}={i} is out of range for an image with {channels} bands")
    return i % channels


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _output_dtype(dtype: torch.dtype) -> torch.dtype:
    return dtype if dtype.is_floating_point else torch.float32


def _check_number(value: Any, name: str, fn: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            value = float(value)  # numpy scalars, 0-d tensors
        except (TypeError, ValueError):
            raise TypeError(f"{fn}: {name} must be a number, got {type(value).__name__}") from None
    return float(value)


def _read_bands(
    image: Tensor,
    bands: Mapping[str, Any],
    fn: str,
    nodata: float | None,
    scale: float,
    offset: float,
) -> tuple[dict[str, Tensor], Tensor | None]:
    """The bands as ``[..., 1, H, W]`` compute-dtype tensors, and the nodata mask (or None)."""
    _check_image(image, fn)
    scale = _check_number(scale, "scale", fn)
    offset = _check_number(offset, "offset", fn)
    if nodata is not None:
        nodata = _check_number(nodata, "nodata", fn)
    ct = _compute_dtype(image.dtype)
    out: dict[str, Tensor] = {}
    invalid: Tensor | None = None
    for role, band in bands.items():
        i = _band_position(image, band, role, fn)
        raw = image.narrow(-3, i, 1)
        bad: Tensor | None = None
        if raw.is_floating_point():
            bad = (raw - raw) != 0  # NaN and +-inf; several times faster than ~torch.isfinite on CPU
        if nodata is not None and not math.isnan(nodata):
            eq = raw == nodata
            bad = eq if bad is None else bad | eq
        if bad is not None:
            invalid = bad if invalid is None else invalid | bad
        x = raw.to(ct)
        if scale != 1.0:
            x = x * scale
        if offset != 0.0:
            x = x + offset
        out[role] = x
    return out, invalid


def _safe_div(num: Tensor, den: Tensor) -> tuple[Tensor, Tensor]:
    """``num / den`` with zero denominators replaced by 1, and the zero mask."""
    zero = den == 0
    return num / torch.where(zero, torch.ones_like(den), den), zero


def _finish(
    out: Tensor,
    zero: Tensor | None,
    invalid: Tensor | None,
    fill: float,
    nodata_out: float,
    dtype: torch.dtype,
    fn: str,
) -> Tensor:
    fill = _check_number(fill, "fill", fn)
    nodata_out = _check_number(nodata_out, "nodata_out", fn)
    if not math.isfinite(fill):
        raise ValueError(f"{fn}: fill must be finite (it replaces zero denominators), got {fill}")
    if zero is not None:
        out = out.masked_fill(zero, fill)
    # x / 0 is +-inf and 0 / 0 is NaN: one pass turns zero denominators (and any overflow) into fill.
    out = torch.nan_to_num(out, nan=fill, posinf=fill, neginf=fill)
    out_dtype = _output_dtype(dtype)
    if out_dtype in _HALF:
        info = torch.finfo(out_dtype)
        out = out.clamp_(info.min, info.max)
    if invalid is not None:
        out = out.masked_fill_(invalid, nodata_out)
    return out.to(out_dtype)


def _nd(
    image: Tensor,
    a: Any,
    b: Any,
    fn: str,
    roles: tuple[str, str],
    fill: float,
    nodata: float | None,
    nodata_out: float,
    scale: float,
    offset: float,
) -> Tensor:
    bands, invalid = _read_bands(image, {roles[0]: a, roles[1]: b}, fn, nodata, scale, offset)
    x, y = bands[roles[0]], bands[roles[1]]
    out = (x - y) / (x + y)
    return _finish(out, None, invalid, fill, nodata_out, image.dtype, fn)


def _tri(
    image: Tensor,
    a: Any,
    b: Any,
    c: Any,
    fn: str,
    roles: tuple[str, str, str],
    fill: float,
    nodata: float | None,
    nodata_out: float,
    scale: float,
    offset: float,
) -> Tensor:
    bands, invalid = _read_bands(image, {roles[0]: a, roles[1]: b, roles[2]: c}, fn, nodata, scale, offset)
    x, d = bands[roles[0]], bands[roles[1]] + bands[roles[2]]
    out = (x - d) / (x + d)
    return _finish(out, None, invalid, fill, nodata_out, image.dtype, fn)
