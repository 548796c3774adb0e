"""Per-band normalisation of samples and batches, fused with the dtype conversion.

:class:`Normalize` computes ``(x - mean) / std`` per band (band axis -3) as
``x * (1 / std) + (-mean / std)`` with one ``addcmul`` kernel that reads the
input in its own dtype (uint8, uint16, int16...) and writes the floating point
result directly, so integer data is never first copied to float32 and then
normalised in a second pass (the approach of :func:`pipekit.device.to_device`,
which also moves batches to the device).  The result equals
``(x.double() - mean) / std`` up to float32 rounding of the two terms (an
absolute error of a few units in the last place of ``max(|x / std|, |mean / std|)``),
then the rounding of the output dtype.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["Normalize"]

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _as_values(values: Any, name: str) -> tuple[float, ...]:
    if isinstance(values, Tensor):
        values = values.detach().cpu().flatten().tolist()
    elif isinstance(values, (int, float)) and not isinstance(values, bool):
        values = [values]
    if isinstance(values, (str, bytes)) or (not isinstance(values, Sequence) and not hasattr(values, "__iter__")):
        raise TypeError(f"Normalize: {name} must be a number or a sequence of numbers, got {type(values).__name__}")
    out = []
    for v in values:
        if isinstance(v, bool):
            raise TypeError(f"Normalize: {name} must hold numbers, got {v!r}")
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise TypeError(f"Normalize: {name} must hold numbers, got {v!r}") from None
        if not math.isfinite(f):
            raise ValueError(f"Normalize: {name} must be finite, got {f}")
        out.append(f)
    if not out:
        raise ValueError(f"Normalize: {name} is empty")
    return tuple(out)


class Normalize(nn.Module):
    """``(x - mean) / std`` per band of ``sample["image"]``, of a batch, or of a tensor.

    Args:
        mean: one value per band (or one value for all bands), in the units
            of the data (e.g. reflectance DN for uint16 Landsat, as returned by
            :func:`~pipekit.transforms.compute_stats`).
        std: one positive value per band (or one for all).
        dtype: output dtype (a floating point type).  Default: float32 for
            integer input, the input's dtype for floating point input.
        key: the sample entry holding the image (other entries pass through).

    The band axis is -3, so ``[C, H, W]`` samples, ``[B, C, H, W]`` batches and
    ``[B, T, C, H, W]`` series all work, on any device; the output keeps the
    input's memory format (``channels_last`` stays ``channels_last``).
    float16/bfloat16 outputs are computed in float32 and rounded once.

    Example:
        >>> import torch
        >>> from pipekit.transforms import Normalize
        >>> norm = Normalize(mean=[100.0, 200.0], std=[8.0, 32.0])
        >>> x = torch.tensor([[[116, 84]], [[264, 200]]], dtype=torch.uint16)
        >>> norm(x)
        tensor([[[ 2., -2.]],
        <BLANKLINE>
                [[ 2.,  0.]]])
        >>> norm.inverse(norm(x)).round().to(torch.uint16).equal(x)
        True
    """

    def __init__(
        self,
        mean: Sequence[float] | float | Tensor,
        std: Sequence[float] | float | Tensor,
        *,
        dtype: torch.dtype | None = None,
        key: str = "image",
    ) -> None:
        super().__init__()
        self.mean = _as_values(mean, "mean")
        self.std = _as_values(std, "std")
        bad = [s for s in self.std if s <= 0]
        if bad:
            raise ValueError(f"Normalize: std must be positive, got {list(self.std)}")
        if len(self.mean) != len(self.std) and 1 not in (len(self.mean), len(self.std)):
            raise ValueError(
                f"Normalize: mean has {len(self.mean)} values but std has {len(self.std)}; give one per band"
            )
        if dtype is not None and dtype not in _FLOATS:
            raise TypeError(f"Normalize: dtype must be a floating point type, got {dtype}")
        if not isinstance(key, str):
            raise TypeError(f"Normalize: key must be a str, got {key!r}")
        self.dtype = dtype
        self.key = key
        self._cache: dict[tuple[Any, ...], tuple[Tensor, Tensor]] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_cache"] = {}
        return state

    def extra_repr(self) -> str:
        return f"mean={list(self.mean)}, std={list(self.std)}" + (f", dtype={self.dtype}" if self.dtype else "")

    def _coefficients(
        self, channels: int, device: torch.device, dtype: torch.dtype, inverse: bool
    ) -> tuple[Tensor, Tensor]:
        cache_key = (channels, device, dtype, inverse)
        hit = self._cache.get(cache_key)
        if hit is not None:
            return hit
        n = max(len(self.mean), len(self.std))
        if n != 1 and n != channels:
            raise ValueError(f"Normalize: mean/std have {n} values but the image has {channels} bands (band axis -3)")
        mean = torch.tensor(self.mean, dtype=torch.float64).expand(channels if n == 1 else n)
        std = torch.tensor(self.std, dtype=torch.float64).expand(channels if n == 1 else n)
        if inverse:
            a, b = std, mean
        else:
            a, b = 1.0 / std, -mean / std
        a = a.to(device=device, dtype=dtype).reshape(channels, 1, 1)
        b = b.to(device=device, dtype=dtype).reshape(channels, 1, 1)
        self._cache[cache_key] = (a, b)
        return a, b

    def _normalize(self, x: Tensor, inverse: bool = False) -> Tensor:
        if not isinstance(x, Tensor):
            raise TypeError(f"Normalize: expects a tensor image, got {type(x).__name__}")
        if x.dim() < 3:
            raise ValueError(
                f"Normalize: the image needs a band axis at -3 ([C,H,W] or [B,C,H,W]), got {tuple(x.shape)}"
            )
        if x.dtype == torch.bool or x.is_complex():
            raise TypeError(f"Normalize: unsupported image dtype {x.dtype}")
        out_dtype = self.dtype or (x.dtype if x.is_floating_point() else torch.float32)
        compute = torch.float32 if out_dtype in (torch.float16, torch.bfloat16) else out_dtype
        a, b = self._coefficients(x.shape[-3], x.device, compute, inverse)
        out = torch.empty_like(x, dtype=compute)
        try:
            torch.addcmul(b, x, a, out=out)  # one kernel: read x in its dtype, multiply-add, write float
        except (RuntimeError, NotImplementedError):  # dtypes without a mixed kernel (e.g. uint16 on some devices)
            out.copy_(x)
            out.mul_(a).add_(b)
        return out if compute == out_dtype else out.to(out_dtype)

    def inverse(self, x: Any) -> Any:
        """Undo the normalisation: ``x * std + mean`` (same arguments and outputs as calling it)."""
        return self._map(x, inverse=True)

    def forward(self, sample: Any) -> Any:
        return self._map(sample, inverse=False)

    def _map(self, sample: Any, inverse: bool) -> Any:
        if isinstance(sample, Tensor):
            return self._normalize(sample, inverse)
        if not isinstance(sample, Mapping):
            raise TypeError(f"Normalize: expects a sample dict or an image tensor, got {type(sample).__name__}")
        if self.key not in sample:
            raise KeyError(f"Normalize: the sample has no {self.key!r} entry (keys: {sorted(map(str, sample))})")
        out = dict(sample)
        out[self.key] = self._normalize(sample[self.key], inverse)
        return out
