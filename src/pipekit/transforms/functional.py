"""Pure augmentation kernels on tensors, shared by the sample and the batch transforms.

This is the ``torchvision.transforms.v2.functional`` pattern: the transform
classes (:mod:`~pipekit.transforms._augment` for sample dicts,
:mod:`~pipekit.transforms.batch_augment` for collated batches) validate their
arguments and draw the random parameters; the kernels here take those
parameters explicitly and do the arithmetic.  No kernel draws a random number
or modifies its input (``add_gaussian_noise(..., inplace=True)`` aside, on
request), and none imports torchvision, so batch code on the GPU does not pay
for it.

Shapes: an image is ``[..., C, H, W]``: one image ``[C, H, W]`` or a batch
``[B, C, H, W]`` (masks ``[H, W]``, ``[B, H, W]`` or ``[B, K, H, W]`` for the
geometric kernels).

* Per-band parameters (``factor``, ``gamma``, ``std``, ``mean``) broadcast
  against the image's leading dimensions ``x.shape[:-2]``: a number (or 0-d
  tensor) for everything, ``[C]`` one per band, ``[B, 1]`` one per image of a
  batch, ``[B, C]`` one per band of each image.
* Geometric parameters (``k`` of :func:`rot90`, ``apply`` of the flips,
  ``top``/``left``... of the crops) are numbers, the same for every image, or
  ``[B]`` sequences (tensors, NumPy arrays, lists), one per image of a batch
  ``[B, ...]``.

Value conventions: the photometric kernels compute in float32 (float64 stays
float64) and return the input's dtype: integer images are rounded and clamped
to their dtype's range (or ``value_range``), float images are clamped only when
``value_range`` is given.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as nnf
from torch import Tensor

__all__ = [
    "add_gaussian_noise",
    "adjust_brightness",
    "adjust_contrast",
    "adjust_gamma",
    "channel_dropout",
    "crop",
    "cutmix",
    "hflip",
    "mixup",
    "resized_crop",
    "rot90",
    "rot90_boxes",
    "vflip",
    "work_dtype",
]

Param = float | Tensor
"""A per-band parameter: a number, or a tensor broadcasting against ``x.shape[:-2]``."""


# --------------------------------------------------------------------------- dtype helpers


def work_dtype(x: Tensor) -> torch.dtype:
    """The dtype the photometric kernels compute ``x`` in: float64 for float64, float32 for everything else.

    Example:
        >>> import torch
        >>> from pipekit.transforms.functional import work_dtype
        >>> work_dtype(torch.zeros(1, dtype=torch.uint8)), work_dtype(torch.zeros(1, dtype=torch.float64))
        (torch.float32, torch.float64)
    """
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _finish(y: Tensor, like: Tensor, value_range: tuple[float, float] | None) -> Tensor:
    """Back to ``like``'s dtype: integers rounded and clamped, floats clamped only to ``value_range``."""
    if like.is_floating_point():
        if value_range is not None:
            y = y.clamp(value_range[0], value_range[1])
        return y.to(like.dtype)
    info = torch.iinfo(like.dtype)
    lo, hi = (
        (info.min, info.max) if value_range is None else (max(value_range[0], info.min), min(value_range[1], info.max))
    )
    return y.round().clamp(lo, hi).to(like.dtype)


def _plane_param(value: Param, like: Tensor, dtype: torch.dtype | None = None) -> float | Tensor:
    """A per-band parameter ready to broadcast over ``[..., C, H, W]``.

    Numbers (and 0-d tensors, as Python numbers) stay scalars; other tensors move to ``like``'s device
    in ``dtype`` (default: the work dtype of ``like``) and get two trailing unit axes for ``H`` and ``W``.
    """
    if isinstance(value, Tensor):
        if value.dim() == 0:
            return value.item()
        dtype = work_dtype(like) if dtype is None else dtype
        return value.to(device=like.device, dtype=dtype).reshape(*value.shape, 1, 1)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"expected a number or a tensor of parameters, got {type(value).__name__}")
    return float(value)


def _per_image(value: Any, name: str) -> Tensor | None:
    """``value`` as a 1-d tensor when it gives one value per image, ``None`` when it is one number."""
    if isinstance(value, numbers.Number) or (isinstance(value, Tensor) and value.dim() == 0):
        return None
    t = torch.as_tensor(value)
    if t.dim() != 1:
        raise ValueError(f"{name} must be a number or one value per image ([B]), got shape {tuple(t.shape)}")
    return t


def _check_batch(x: Tensor, n: int, name: str) -> None:
    if x.dim() < 3 or x.shape[0] != n:
        raise ValueError(f"{name}: {n} per-image values need a batch [B={n}, ..., H, W], got shape {tuple(x.shape)}")


# --------------------------------------------------------------------------- photometric kernels


def adjust_brightness(x: Tensor, factor: Param, value_range: tuple[float, float] | None = None) -> Tensor:
    """Multiply the image by ``factor``: ``x * factor``.

    Args:
        x: image ``[..., C, H, W]``, any dtype.
        factor: a number, or a tensor broadcasting against ``x.shape[:-2]``
            (``[C]`` per band, ``[B, 1]`` per image, ``[B, C]``).
        value_range: clamp the result to ``(min, max)``; default: the dtype's
            range for integer images, no clamping for floats.

    Example:
        >>> import torch
        >>> from pipekit.transforms import functional as K
        >>> K.adjust_brightness(torch.full((2, 1, 1), 100, dtype=torch.uint8), 3.0).flatten().tolist()
        [255, 255]
        >>> K.adjust_brightness(torch.ones(2, 2, 1, 1), torch.tensor([[1.0], [2.0]])).flatten().tolist()
        [1.0, 1.0, 2.0, 2.0]
    """
    y = x.to(work_dtype(x)) * _plane_param(factor, x)
    return _finish(y, x, value_range)


def adjust_contrast(x: Tensor, factor: Param, value_range: tuple[float, float] | None = None) -> Tensor:
    """Scale each band's deviation from its own mean: ``mean + factor * (x - mean)``.

    The mean is taken over the ``H, W`` pixels of each band of each image, so
    this works for any number of bands (torchvision's RGB contrast blends
    towards the mean grey level instead).

    Args:
        x: image ``[..., C, H, W]``, any dtype.
        factor, value_range: as :func:`adjust_brightness`.

    Example:
        >>> import torch
        >>> from pipekit.transforms import functional as K
        >>> K.adjust_contrast(torch.tensor([[[0.0, 2.0]]]), 0.5).tolist()
        [[[0.5, 1.5]]]
    """
    xf = x.to(work_dtype(x))
    mean = xf.mean(dim=(-2, -1), keepdim=True)
    y = (xf - mean).mul_(_plane_param(factor, x)).add_(mean)  # one full-size temporary
    return _finish(y, x, value_range)


def adjust_gamma(x: Tensor, gamma: Param, value_range: tuple[float, float] | None = None) -> Tensor:
    """Gamma-correct each band: ``lo + (hi - lo) * ((x - lo) / (hi - lo)) ** gamma``.

    Args:
        x: image ``[..., C, H, W]``, any dtype.
        gamma: the (positive) exponent: a number, or a tensor broadcasting
            against ``x.shape[:-2]``.
        value_range: ``(lo, hi)`` of the data; default ``(0, 1)`` for floats
            and ``(0, dtype max)`` for integers.  Values outside it are clamped.

    Example:
        >>> import torch
        >>> from pipekit.transforms import functional as K
        >>> K.adjust_gamma(torch.tensor([[[0.5, 2.0]]]), 2.0).tolist()
        [[[0.25, 1.0]]]
        >>> K.adjust_gamma(torch.tensor([[[64]]], dtype=torch.uint8), 0.5).item()
        128
    """
    if value_range is not None:
        lo, hi = float(value_range[0]), float(value_range[1])
    elif x.is_floating_point():
        lo, hi = 0.0, 1.0
    else:
        lo, hi = 0.0, float(torch.iinfo(x.dtype).max)
    xf = x.to(work_dtype(x))
    t = ((xf - lo) / (hi - lo)).clamp(0.0, 1.0)
    y = lo + (hi - lo) * t.pow(_plane_param(gamma, x))
    return _finish(y, x, (lo, hi))


def add_gaussian_noise(
    x: Tensor,
    noise: Tensor,
    std: Param = 1.0,
    mean: Param = 0.0,
    value_range: tuple[float, float] | None = None,
    *,
    inplace: bool = False,
) -> Tensor:
    """Add scaled noise to the image: ``x + (noise * std + mean)``.

    The noise is scaled in its own dtype and on its own device (so noise drawn
    on the CPU in float32 gives the same numbers on any device), then moved to
    the image's device in the work dtype and added.

    Args:
        x: image ``[..., C, H, W]``, any dtype.
        noise: standard-normal draws, shaped like ``x`` (any device, float dtype).
        std, mean: the noise's standard deviation and mean: numbers, or tensors
            broadcasting against ``x.shape[:-2]`` (``[C]`` per band, ``[B, C]``
            per image and band; a zero ``std`` and ``mean`` leave an image as it is).
        value_range: clamp the result (default: the dtype's range for integers,
            none for floats).
        inplace: scale ``noise`` in place and use it as the output buffer
            (saves one image-sized allocation; ``noise`` is garbage afterwards).

    Example:
        >>> import torch
        >>> from pipekit.transforms import functional as K
        >>> K.add_gaussian_noise(torch.zeros(2, 1, 2), torch.ones(2, 1, 2), std=torch.tensor([0.5, 2.0])).tolist()
        [[[0.5, 0.5]], [[2.0, 2.0]]]
        >>> K.add_gaussian_noise(torch.full((1, 1, 1), 250, dtype=torch.uint8), torch.ones(1, 1, 1), std=10.0).item()
        255
    """
    if noise.shape != x.shape:
        raise ValueError(f"add_gaussian_noise: noise has shape {tuple(noise.shape)}, the image {tuple(x.shape)}")
    scale = _plane_param(std, noise, noise.dtype)
    y = noise.mul_(scale) if inplace else noise * scale
    if isinstance(mean, Tensor) or mean:
        y.add_(_plane_param(mean, y, y.dtype))
    y = y.to(device=x.device, dtype=work_dtype(x))
    return _finish(y.add_(x), x, value_range)


def channel_dropout(x: Tensor, channels: Sequence[int] | Tensor, fill: float = 0.0) -> Tensor:
    """Set whole bands to ``fill``: ``out[..., channels, :, :] = fill`` (the same bands of every image).

    Args:
        x: image ``[..., C, H, W]``, any dtype.
        channels: positions of the bands to overwrite.
        fill: the value written; must be a valid value of an integer dtype.

    Example:
        >>> import torch
        >>> from pipekit.transforms import functional as K
        >>> K.channel_dropout(torch.ones(3, 1, 1), [0, 2], fill=-1.0).flatten().tolist()
        [-1.0, 1.0, -1.0]
    """
    if not x.is_floating_point():
        info = torch.iinfo(x.dtype)
        if not (info.min <= fill <= info.max and float(fill).is_integer()):
            raise ValueError(f"channel_dropout: fill {fill} is not a valid {x.dtype} value")
    out = x.clone()
    out[..., channels, :, :] = fill
    return out


def mixup(x: Tensor, lam: float) -> Tensor:
    """Blend each item of a batch with the previous one: ``lam * x + (1 - lam) * x.roll(1, 0)``.

    Works for images ``[B, C, H, W]`` and (soft, one-hot) labels ``[B, K]`` alike.

    Example:
        >>> import torch
        >>> from pipekit.transforms import functional as K
        >>> K.mixup(torch.tensor([0.0, 10.0]), 0.75).tolist()
        [2.5, 7.5]
    """
    return x * lam + x.roll(1, 0) * (1.0 - lam)


def cutmix(x: Tensor, top: int, left: int, bottom: int, right: int) -> Tensor:
    """Paste the window ``[top:bottom, left:right]`` of the previous item of the batch into each item.

    Args:
        x: a batch ``[B, ..., H, W]`` (images or masks), any dtype.
        top, left, bottom, right: the window (clipped to the image by slicing).

    Example:
        >>> import torch
        >>> from pipekit.transforms import functional as K
        >>> K.cutmix(torch.stack([torch.zeros(2, 2), torch.ones(2, 2)]), 0, 0, 1, 2)[0].tolist()
        [[1.0, 1.0], [0.0, 0.0]]
    """
    out = x.clone()
    out[..., top:bottom, left:right] = x.roll(1, 0)[..., top:bottom, left:right]
    return out


# --------------------------------------------------------------------------- geometric kernels


def _per_image_apply(x: Tensor, apply: Any, fn: Any, name: str) -> Tensor:
    """``fn`` on the images of a batch where ``apply`` is true, the others copied as they are."""
    mask = torch.as_tensor(apply, dtype=torch.bool).reshape(-1)
    _check_batch(x, len(mask), name)
    out = x.clone()
    idx = mask.nonzero().flatten()
    if len(idx):
        sel = idx.to(x.device)
        out[sel] = fn(x[sel])
    return out


def hflip(x: Tensor, apply: Any = None) -> Tensor:
    """Flip left-right (the last axis).

    Args:
        x: image or mask ``[..., H, W]``, any dtype.
        apply: ``None`` flips everything; a ``[B]`` boolean sequence flips
            only those images of the batch ``[B, ..., H, W]``.

    Example:
        >>> import torch
        >>> from pipekit.transforms import functional as K
        >>> x = torch.tensor([[[[0, 1]]], [[[2, 3]]]])
        >>> K.hflip(x).flatten().tolist(), K.hflip(x, apply=[False, True]).flatten().tolist()
        ([1, 0, 3, 2], [0, 1, 3, 2])
    """
    if apply is None:
        return x.flip(-1)
    return _per_image_apply(x, apply, lambda t: t.flip(-1), "hflip")


def vflip(x: Tensor, apply: Any = None) -> Tensor:
    """Flip upside down (the second last axis); ``apply`` as :func:`hflip`.

    Example:
        >>> import torch
        >>> from pipekit.transforms import functional as K
        >>> K.vflip(torch.tensor([[0], [1]])).flatten().tolist()
        [1, 0]
    """
    if apply is None:
        return x.flip(-2)
    return _per_image_apply(x, apply, lambda t: t.flip(-2), "vflip")


def rot90(x: Tensor, k: Any) -> Tensor:
    """Rotate by ``k`` multiples of 90 degrees counter-clockwise, exactly (``torch.rot90`` on the last two axes).

    Args:
        x: image or mask ``[..., H, W]``, any dtype.
        k: an int for every image, or ``[B]`` ints, one per image of the batch
            ``[B, ..., H, W]`` (odd multiples then need square images, as a
            batch keeps one shape).

    Example:
        >>> import torch
        >>> from pipekit.transforms import functional as K
        >>> K.rot90(torch.arange(4).reshape(2, 2), 1).tolist()
        [[1, 3], [0, 2]]
        >>> K.rot90(torch.arange(8).reshape(2, 1, 2, 2), [0, 2]).flatten().tolist()
        [0, 1, 2, 3, 7, 6, 5, 4]
    """
    ks = _per_image(k, "rot90: k")
    if ks is None:
        return torch.rot90(x, int(k), dims=(-2, -1))
    _check_batch(x, len(ks), "rot90")
    ks = ks.long() % 4
    if x.shape[-2] != x.shape[-1] and bool((ks % 2 == 1).any()):
        raise ValueError(f"rot90: odd multiples per image need square images, got {x.shape[-2]}x{x.shape[-1]}")
    out = x.clone()
    for kk in (1, 2, 3):
        idx = (ks == kk).nonzero().flatten()
        if len(idx):
            sel = idx.to(x.device)
            out[sel] = torch.rot90(x[sel], kk, dims=(-2, -1))
    return out


def rot90_boxes(boxes: Tensor, k: int, canvas_size: tuple[int, int]) -> tuple[Tensor, tuple[int, int]]:
    """Rotate ``XYXY`` boxes ``[N, 4]`` with their ``(height, width)`` canvas as :func:`rot90` rotates the image.

    Returns:
        ``(boxes, canvas_size)``: the rotated ``XYXY`` boxes and the new canvas
        (height and width swapped for odd ``k``).

    Example:
        >>> import torch
        >>> from pipekit.transforms import functional as K
        >>> boxes, canvas = K.rot90_boxes(torch.tensor([[0, 0, 1, 2]]), 1, (2, 3))
        >>> boxes.tolist(), canvas
        ([[0, 2, 2, 3]], (3, 2))
    """
    h, w = canvas_size
    k = int(k) % 4
    x1, y1, x2, y2 = boxes.unbind(-1)
    if k == 0:
        return boxes.clone(), (h, w)
    if k == 1:
        return torch.stack((y1, w - x2, y2, w - x1), dim=-1), (w, h)
    if k == 2:
        return torch.stack((w - x2, h - y2, w - x1, h - y1), dim=-1), (h, w)
    return torch.stack((h - y2, x1, h - y1, x2), dim=-1), (w, h)


def _gather(x: Tensor, rows: Tensor, cols: Tensor) -> Tensor:
    """Per-image windows: ``out[b, ..., i, j] = x[b, ..., rows[b, i], cols[b, j]]`` (one gather kernel)."""
    b, (h, w) = x.shape[0], x.shape[-2:]
    oh, ow = rows.shape[1], cols.shape[1]
    flat = (rows[:, :, None] * w + cols[:, None, :]).reshape(b, 1, oh * ow)
    src = x.reshape(b, -1, h * w)
    out = src.gather(-1, flat.expand(b, src.shape[1], oh * ow))
    return out.reshape(*x.shape[:-2], oh, ow)


def crop(x: Tensor, top: Any, left: Any, height: int, width: int) -> Tensor:
    """Cut the window ``[top:top + height, left:left + width]`` out of each image, exactly.

    Args:
        x: image or mask ``[..., H, W]``, any dtype.
        top, left: the window's corner: ints for every image (the result is a
            view), or ``[B]`` ints, one per image of the batch ``[B, ..., H, W]``.
        height, width: the window's size.  The window must lie inside the image.

    Example:
        >>> import torch
        >>> from pipekit.transforms import functional as K
        >>> x = torch.arange(16).reshape(1, 4, 4).expand(2, 4, 4)
        >>> K.crop(x, 1, 2, 2, 2)[0].tolist()
        [[6, 7], [10, 11]]
        >>> K.crop(x, torch.tensor([0, 2]), torch.tensor([0, 1]), 1, 2).tolist()
        [[[0, 1]], [[9, 10]]]
    """
    h, w = x.shape[-2:]
    tops, lefts = _per_image(top, "crop: top"), _per_image(left, "crop: left")
    if tops is None and lefts is None:
        top, left = int(top), int(left)
        if top < 0 or top + height > h or left < 0 or left + width > w:
            raise ValueError(f"crop: the window ({top}, {left}, {height}x{width}) is outside the {h}x{w} image")
        return x[..., top : top + height, left : left + width]
    n = len(tops if tops is not None else lefts)
    _check_batch(x, n, "crop")
    tops = torch.full((n,), int(top)) if tops is None else tops.long()
    lefts = torch.full((n,), int(left)) if lefts is None else lefts.long()
    if n and tops.device.type == "cpu" and lefts.device.type == "cpu":  # checked without a device sync
        outside_rows = int(tops.min()) < 0 or int(tops.max()) + height > h
        outside_cols = int(lefts.min()) < 0 or int(lefts.max()) + width > w
        if outside_rows or outside_cols:
            raise ValueError(f"crop: a {height}x{width} window is outside the {h}x{w} images")
    rows = tops.to(x.device)[:, None] + torch.arange(height, device=x.device)  # [B, height]
    cols = lefts.to(x.device)[:, None] + torch.arange(width, device=x.device)  # [B, width]
    return _gather(x, rows, cols)


def _bilinear(x: Tensor, grid: Tensor, work: torch.dtype) -> Tensor:
    out = nnf.grid_sample(x.to(work), grid, mode="bilinear", padding_mode="border", align_corners=False)
    if not x.is_floating_point():
        info = torch.iinfo(x.dtype)
        out = out.round().clamp(info.min, info.max)
    return out.to(x.dtype)


def resized_crop(
    x: Tensor,
    top: Any,
    left: Any,
    height: Any,
    width: Any,
    size: tuple[int, int],
    interpolation: str = "bilinear",
) -> Tensor:
    """Cut a window out of each image and resize it to ``size``, without antialiasing.

    Output pixel ``j`` samples the input at ``left + (j + 0.5) * width / out_width - 0.5``
    (pixel centres, as ``grid_sample`` with ``align_corners=False``).
    ``"bilinear"`` interpolates with ``grid_sample`` (in float32, float64 for
    float64 images; integer images are rounded back, border pixels repeated);
    ``"nearest"`` gathers the nearest pixel by integer index (exact for any
    dtype: use it for masks).

    Args:
        x: image or mask ``[..., H, W]`` (bilinear: image ``[B, C, H, W]`` or ``[C, H, W]``).
        top, left, height, width: the window (may be fractional): numbers for
            every image, or ``[B]`` values, one per image of the batch ``[B, ..., H, W]``.
        size: output ``(height, width)``.
        interpolation: ``"bilinear"`` or ``"nearest"``.

    Example:
        >>> import torch
        >>> from pipekit.transforms import functional as K
        >>> x = torch.arange(16.0).reshape(1, 4, 4)
        >>> K.resized_crop(x, 0, 0, 2, 2, (4, 4), "nearest")[0, 0].tolist()
        [0.0, 0.0, 1.0, 1.0]
        >>> K.resized_crop(x, 0, 0, 4, 4, (2, 2))[0].tolist()
        [[2.5, 4.5], [10.5, 12.5]]
    """
    if interpolation not in ("bilinear", "nearest"):
        raise ValueError(f"resized_crop: interpolation must be 'bilinear' or 'nearest', got {interpolation!r}")
    oh, ow = int(size[0]), int(size[1])
    params = [_per_image(v, f"resized_crop: {name}") for v, name in zip((top, left, height, width), "tlhw")]
    shared = all(p is None for p in params)
    n = 1 if shared else next(len(p) for p in params if p is not None)
    top, left, ch, cw = (
        torch.full((n,), float(v), dtype=torch.float64) if p is None else p.to(device="cpu", dtype=torch.float64)
        for v, p in zip((top, left, height, width), params)
    )
    if shared:
        lead = x.shape[:-2]
        out = resized_crop(x.reshape(1, -1, *x.shape[-2:]), top, left, ch, cw, (oh, ow), interpolation)
        return out.reshape(*lead, oh, ow)
    _check_batch(x, n, "resized_crop")
    h, w = x.shape[-2:]
    if interpolation == "nearest":
        ys = top[:, None] + (torch.arange(oh, dtype=torch.float64) + 0.5) * (ch / oh)[:, None] - 0.5
        xs = left[:, None] + (torch.arange(ow, dtype=torch.float64) + 0.5) * (cw / ow)[:, None] - 0.5
        rows = torch.floor(ys + 0.5).clamp(0, h - 1).long().to(x.device)
        cols = torch.floor(xs + 0.5).clamp(0, w - 1).long().to(x.device)
        return _gather(x, rows, cols)
    if x.dim() != 4:
        raise ValueError(f"resized_crop: bilinear interpolation needs [B, C, H, W] images, got {tuple(x.shape)}")
    theta = torch.zeros((n, 2, 3), dtype=torch.float64)
    theta[:, 0, 0] = cw / w
    theta[:, 0, 2] = (2 * left + cw) / w - 1
    theta[:, 1, 1] = ch / h
    theta[:, 1, 2] = (2 * top + ch) / h - 1
    work = x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32
    grid = nnf.affine_grid(theta.to(device=x.device), [n, 1, oh, ow], align_corners=False).to(work)
    return _bilinear(x, grid, work)
