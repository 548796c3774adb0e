"""Argument checks and parameter draws shared by the sample and batch augmentation modules.

No torchvision import here; the arithmetic lives in :mod:`pipekit.transforms.functional`.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = ["DEFAULT_BOX_KEYS"]

DEFAULT_BOX_KEYS: dict[str, str] = {"boxes": "XYXY", "bbox_xyxy": "XYXY", "bbox_xywh": "XYWH", "bbox_cxcywh": "CXCYWH"}
"""Sample entries treated as bounding boxes by default, with their format."""


def _check_p(p: Any, where: str) -> float:
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 <= float(p) <= 1.0:
        raise ValueError(f"{where}: p must be a probability in [0, 1], got {p!r}")
    return float(p)


def _factor_range(
    value: Any, name: str, where: str, center: float = 1.0, bound: tuple[float, float] | None = None
) -> tuple[float, float] | None:
    """torchvision's convention: a number v gives [center - v, center + v] (clipped at 0), a pair is the range."""
    if value is None:
        return None
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        v = float(value)
        if v < 0:
            raise ValueError(f"{where}: {name} must be non-negative, got {v}")
        if v == 0:
            return None
        lo, hi = center - v, center + v
        if center == 1.0:
            lo = max(lo, 0.0)
    elif isinstance(value, Sequence) and len(value) == 2 and all(isinstance(v, numbers.Real) for v in value):
        lo, hi = float(value[0]), float(value[1])
    else:
        raise TypeError(f"{where}: {name} must be a number or a (min, max) pair, got {value!r}")
    if lo > hi:
        raise ValueError(f"{where}: {name} range must have min <= max, got ({lo}, {hi})")
    if bound is not None and (lo < bound[0] or hi > bound[1]):
        raise ValueError(f"{where}: {name} must lie within {bound}, got ({lo}, {hi})")
    return lo, hi


def _check_value_range(value_range: Any, where: str) -> tuple[float, float] | None:
    if value_range is None:
        return None
    if not (isinstance(value_range, Sequence) and len(value_range) == 2):
        raise TypeError(f"{where}: value_range must be a (min, max) pair or None, got {value_range!r}")
    lo, hi = float(value_range[0]), float(value_range[1])
    if not lo < hi:
        raise ValueError(f"{where}: value_range must have min < max, got {value_range!r}")
    return lo, hi


def _uniform(lo: float, hi: float, n: int | None = None) -> Tensor:
    shape = () if n is None else (n,)
    return torch.empty(shape).uniform_(lo, hi) if hi > lo else torch.full(shape, lo)


def _check_k(k: Any, where: str) -> tuple[int, ...]:
    """The multiples of 90 degrees a rot90 op chooses from, as ints in 0..3."""
    if isinstance(k, numbers.Integral):
        k = (int(k),)
    if (
        not isinstance(k, Sequence)
        or not k
        or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in k)
    ):
        raise ValueError(f"{where}: k must be a non-empty sequence of ints, got {k!r}")
    return tuple(int(v) % 4 for v in k)


def _check_noise(std: Any, mean: Any, where: str) -> tuple[tuple[float, ...], float]:
    """``std`` (one number or one per band, non-negative) and ``mean`` of a Gaussian noise op."""
    values = [std] if isinstance(std, numbers.Real) else list(std)
    if not values or any(isinstance(v, bool) or not isinstance(v, numbers.Real) or v < 0 for v in values):
        raise ValueError(f"{where}: std must be a non-negative number or one per band, got {std!r}")
    if isinstance(mean, bool) or not isinstance(mean, numbers.Real):
        raise TypeError(f"{where}: mean must be a number, got {mean!r}")
    return tuple(float(v) for v in values), float(mean)
