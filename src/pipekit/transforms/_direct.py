"""torchvision's random crop and flips run straight on a plain image tensor, drawing from a generator.

:func:`direct_image_ops` turns a list of ops that are exactly torchvision v2's
``RandomResizedCrop``, ``RandomHorizontalFlip`` and ``RandomVerticalFlip``
(the training ops of :func:`pipekit.datasets._recipe.standard_image_transforms`)
into one function ``run(image, generator) -> image``.  It draws the same
random numbers, in the same order and with the same dtypes, as those
transforms draw from torch's global RNG, but from ``generator`` (a
:class:`~pipekit.transforms.seeding.RandomStream`'s own), and calls the same
kernels (``F.resized_crop``, ``F.horizontal_flip``, ``F.vertical_flip``) with
the same arguments.  So for a generator in the state the global RNG would be
in, the image and the generator's next state are the same, bit for bit, as
running the transforms inside :meth:`RandomStream.torch_global`.

What it saves, per sample, is the swap of torch's global RNG state (four
5 KB state copies) and the transforms' input flattening and dispatch: about
40-60 µs of a 320x256 JPEG's ~2 ms decode + crop (issue 12).  Ops of any
other type (or subclasses) make :func:`direct_image_ops` return ``None``:
the caller runs them as transforms.

Imports torchvision (from :mod:`pipekit.datasets.tar_shards`' training pipe only).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

__all__ = ["direct_image_ops"]

Step = Callable[[torch.Tensor, torch.Generator], torch.Tensor]


def _resized_crop_params(op: v2.RandomResizedCrop, height: int, width: int, g: torch.Generator) -> tuple[int, ...]:
    """``RandomResizedCrop.make_params`` (torchvision 0.2x), drawing from ``g``."""
    area = height * width
    log_ratio = op._log_ratio
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(op.scale[0], op.scale[1], generator=g).item()
        aspect_ratio = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1], generator=g)).item()  # type: ignore[arg-type]
        w = round(math.sqrt(target_area * aspect_ratio))
        h = round(math.sqrt(target_area / aspect_ratio))
        if 0 < w <= width and 0 < h <= height:
            i = int(torch.randint(0, height - h + 1, size=(1,), generator=g).item())
            j = int(torch.randint(0, width - w + 1, size=(1,), generator=g).item())
            return i, j, h, w
    in_ratio = float(width) / float(height)  # fallback: a central crop
    if in_ratio < min(op.ratio):
        w = width
        h = round(w / min(op.ratio))
    elif in_ratio > max(op.ratio):
        h = height
        w = round(h * max(op.ratio))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def _resized_crop_step(op: v2.RandomResizedCrop) -> Step:
    size, interpolation, antialias = op.size, op.interpolation, op.antialias

    def step(image: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        top, left, h, w = _resized_crop_params(op, image.shape[-2], image.shape[-1], g)
        return F.resized_crop(image, top, left, h, w, size=size, interpolation=interpolation, antialias=antialias)

    return step


def _flip_step(p: float, kernel: Callable[[torch.Tensor], torch.Tensor]) -> Step:
    def step(image: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        if torch.rand(1, generator=g) >= p:  # _RandomApplyTransform.forward's test
            return image
        return kernel(image)

    return step


def direct_image_ops(ops: Sequence[Any]) -> list[Step] | None:
    """The steps that run ``ops`` on a plain ``[..., C, H, W]`` tensor from a generator, or ``None``.

    ``None`` when an op is not exactly ``v2.RandomResizedCrop``,
    ``v2.RandomHorizontalFlip`` or ``v2.RandomVerticalFlip`` (a subclass may
    draw differently).  Each step is ``step(image, generator) -> image``.

    Example:
        >>> import torch
        >>> from torchvision.transforms import v2
        >>> ops = [v2.RandomResizedCrop(8), v2.RandomHorizontalFlip()]
        >>> steps = direct_image_ops(ops)
        >>> image = torch.arange(3 * 16 * 20, dtype=torch.float32).reshape(3, 16, 20)
        >>> g = torch.Generator().manual_seed(0)
        >>> out = image
        >>> for step in steps:
        ...     out = step(out, g)
        >>> _ = torch.manual_seed(0)  # the same draws from the global RNG, through the transforms
        >>> ref = image
        >>> for op in ops:
        ...     ref = op(ref)
        >>> out.shape, torch.equal(out, ref)
        (torch.Size([3, 8, 8]), True)
        >>> direct_image_ops([v2.ColorJitter(0.5)]) is None
        True
    """
    steps: list[Step] = []
    for op in ops:
        kind = type(op)
        if kind is v2.RandomResizedCrop:
            steps.append(_resized_crop_step(op))
        elif kind is v2.RandomHorizontalFlip:
            steps.append(_flip_step(op.p, F.horizontal_flip))
        elif kind is v2.RandomVerticalFlip:
            steps.append(_flip_step(op.p, F.vertical_flip))
        else:
            return None
    return steps
