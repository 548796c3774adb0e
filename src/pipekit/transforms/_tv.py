"""torchvision glue shared by the sample-dict ops: plain tensors vs ``tv_tensors``, and the photometric base class.

Imports torchvision: only the sample-path modules (:mod:`~pipekit.transforms._augment`
and the op modules it re-exports) import this one.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torchvision import tv_tensors
from torchvision.transforms import v2

from pipekit.transforms._common import _check_p

__all__: list[str] = []


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
