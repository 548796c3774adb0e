"""Exact geometric ops for sample dicts: :class:`RandomRot90`.

torchvision's own geometric ops (``RandomHorizontalFlip``, ``RandomAffine``,
``RandomResizedCrop``...) already work for any number of bands and move
masks and boxes with the image; this module adds the exact 90-degree
rotations, with the kernels :func:`~pipekit.transforms.functional.rot90` and
:func:`~pipekit.transforms.functional.rot90_boxes` that
:class:`~pipekit.transforms.BatchRandomRot90` shares.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from pipekit.transforms import functional as K
from pipekit.transforms._common import _check_k, _check_p
from pipekit.transforms._tv import _plain, _rewrap

__all__ = ["RandomRot90"]


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
