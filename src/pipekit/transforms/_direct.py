"""torchvision's random crop and flips run straight on a plain image tensor, drawing from a generator.

:func:`direct_image_ops` turns a list of ops that are exactly torchvision v2's
``RandomResizedCrop``, ``RandomHorizontalFlip`` and ``RandomVerticalFlip``
(the training ops of :func:`pipekit.datasets._recipe.standard_image_transforms`)
into steps ``step(image, generator) -> image``.  They draw the same random
numbers, in the same order and with the same dtypes, as those transforms draw
from torch's global RNG, but from ``generator`` (a
:class:`~pipekit.transforms.seeding.RandomStream`'s own), and call the kernels
the transforms dispatch a plain tensor to (``F.resized_crop_image``,
``F.horizontal_flip_image``, ``F.vertical_flip_image``) with the same
arguments.  So for a generator in the state the global RNG would be in, the
image and the generator's next state are the same, bit for bit, as running
the transforms inside :meth:`RandomStream.torch_global`.

What it saves, per sample, is the swap of torch's global RNG state (four
copies of its 5 KB state: ~13 µs alone, 60-100 µs measured with a resize
after it) and the transforms' input flattening and dispatch: 60-150 µs of a
320x256 JPEG's ~2 ms decode + crop on a shared 2-core machine (issue 12).
The crop of a uint8 image that torchvision resizes with torch's antialiased
bilinear uint8 kernel (the training recipe's case) goes to that kernel through
``torch.nn.functional.interpolate`` with the same arguments, without
``resized_crop_image``'s and ``resize_image``'s Python layers: ~20 µs of a
crop's ~220 µs (issue 34), the same pixels and layout.
Ops of any other type (or subclasses) make :func:`direct_image_ops` return
``None``: the caller runs them as transforms.

Imports torchvision (from :mod:`pipekit.datasets._tar_shards`' training pipe only).
"""

from __future__ import annotations

import functools
import math
import platform
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.nn.functional import interpolate
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

__all__ = ["direct_image_ops"]

Step = Callable[[torch.Tensor, torch.Generator], torch.Tensor]


class _ResizedCropStep:
    """``RandomResizedCrop`` on a plain image tensor: ``make_params`` (torchvision 0.2x) drawing from a generator."""

    def __init__(self, op: v2.RandomResizedCrop) -> None:
        self.scale = (op.scale[0], op.scale[1])
        # uniform_ takes its bounds as doubles: the float32 log-ratios, as floats, draw the same numbers
        self.log_ratio = (float(op._log_ratio[0]), float(op._log_ratio[1]))
        self.ratio = (min(op.ratio), max(op.ratio))
        self.size, self.interpolation, self.antialias = op.size, op.interpolation, op.antialias
        # the uint8 crops torchvision's resize hands straight to torch's antialiased bilinear kernel
        # (torchvision 0.29 keeps the mode as the string "bilinear"; earlier ones as the enum, whose value it is)
        mode = getattr(self.interpolation, "value", self.interpolation)
        self.native_uint8 = mode == "bilinear" and self.antialias is True and len(self.size) == 2
        self.hw = tuple(self.size)

    def params(self, height: int, width: int, g: torch.Generator) -> tuple[int, int, int, int]:
        area = height * width
        draw = torch.empty(1)  # float32, as torch.empty(1) in make_params
        for _ in range(10):
            target_area = area * draw.uniform_(self.scale[0], self.scale[1], generator=g).item()
            aspect_ratio = torch.exp(draw.uniform_(self.log_ratio[0], self.log_ratio[1], generator=g)).item()
            w = round(math.sqrt(target_area * aspect_ratio))
            h = round(math.sqrt(target_area / aspect_ratio))
            if 0 < w <= width and 0 < h <= height:
                i = int(torch.randint(0, height - h + 1, size=(1,), generator=g).item())
                j = int(torch.randint(0, width - w + 1, size=(1,), generator=g).item())
                return i, j, h, w
        in_ratio = float(width) / float(height)  # fallback: a central crop
        if in_ratio < self.ratio[0]:
            w = width
            h = round(w / self.ratio[0])
        elif in_ratio > self.ratio[1]:
            h = height
            w = round(h * self.ratio[1])
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def __call__(self, image: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        top, left, h, w = self.params(image.shape[-2], image.shape[-1], g)
        if (
            self.native_uint8 and image.dtype == torch.uint8 and image.dim() == 3 and image.device.type == "cpu"
            and _native_uint8_resize()
        ):
            crop = image[None, :, top : top + h, left : left + w]
            if (h, w) != self.hw and not crop.is_contiguous(memory_format=torch.channels_last):
                # resize_image's one kernel call for this case, without its Python layers (~20 µs a sample):
                # the same uint8 kernel and arguments, so the same pixels and layout (a contiguous CHW tensor);
                # a channels-last contiguous crop (a whole channels-last image) is restrided there: not here
                return interpolate(crop, size=self.hw, mode="bilinear", align_corners=False, antialias=True)[0]
        # the kernel F.resized_crop dispatches a plain tensor to
        return F.resized_crop_image(
            image, top, left, h, w, size=self.size, interpolation=self.interpolation, antialias=self.antialias
        )


@functools.cache
def _native_uint8_resize() -> bool:
    """Whether torchvision's ``resize_image`` resizes uint8 images with the uint8 bilinear kernel on this CPU.

    Its own test (``_do_native_uint8_resize_on_cpu`` for bilinear, outside ``torch.compile``): AVX2, AVX512
    or an ARM machine; elsewhere it converts to float32 and back, which only torchvision's path does.
    """
    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") or platform.machine() in ("aarch64", "arm64")


class _FlipStep:
    """``RandomHorizontalFlip`` / ``RandomVerticalFlip`` on a plain image tensor (a class: pipes are pickled)."""

    def __init__(self, p: float, kernel: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.p, self.kernel = p, kernel

    def __call__(self, image: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        if torch.rand(1, generator=g) >= self.p:  # _RandomApplyTransform.forward's test
            return image
        return self.kernel(image)


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
            steps.append(_ResizedCropStep(op))
        elif kind is v2.RandomHorizontalFlip:
            steps.append(_FlipStep(op.p, F.horizontal_flip_image))
        elif kind is v2.RandomVerticalFlip:
            steps.append(_FlipStep(op.p, F.vertical_flip_image))
        else:
            return None
    return steps
