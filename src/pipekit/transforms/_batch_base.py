"""The base of the batch transforms (:class:`BatchTransform`): batch checks and the random stream.

Public in :mod:`pipekit.transforms.batch_augment`, which says what the batch transforms do and how they draw.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from torch import Tensor, nn

from pipekit.transforms._common import (
    DEFAULT_BOX_KEYS,
)
from pipekit.transforms.seeding import RandomStream


class BatchTransform(nn.Module):
    """Base class: validates the batch and hands each op a numpy generator.

    Args:
        seed: seed of the module's stream (see :mod:`pipekit.transforms.seeding`).
        image_key: the batch entry holding ``[B, C, H, W]`` images.
        mask_keys: entries holding masks ``[B, H, W]`` or ``[B, K, H, W]``,
            transformed with the image (absent keys are fine).

    ``forward(batch, rng=None)``: ``rng`` (a ``numpy.random.Generator``)
    overrides the module's own stream; :class:`BatchCompose` passes its own.
    """

    geometric = True

    def __init__(
        self, *, seed: int | None = None, image_key: str = "image", mask_keys: Sequence[str] = ("mask",)
    ) -> None:
        super().__init__()
        if not isinstance(image_key, str):
            raise TypeError(f"{type(self).__name__}: image_key must be a str, got {image_key!r}")
        self.image_key = image_key
        self.mask_keys = (mask_keys,) if isinstance(mask_keys, str) else tuple(mask_keys)
        self.stream = RandomStream(seed)

    def forward(self, batch: Any, rng: np.random.Generator | None = None) -> Any:
        rng = self.stream.numpy() if rng is None else rng
        if isinstance(batch, Tensor):
            return self._apply_batch({self.image_key: batch}, rng)[self.image_key]
        if not isinstance(batch, Mapping):
            raise TypeError(
                f"{type(self).__name__}: expects a batch dict or a [B, C, H, W] tensor, got {type(batch).__name__}"
            )
        return self._apply_batch(dict(batch), rng)

    def _apply_batch(self, batch: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
        where = type(self).__name__
        if self.image_key not in batch:
            raise KeyError(f"{where}: the batch has no {self.image_key!r} entry (keys: {sorted(map(str, batch))})")
        image = batch[self.image_key]
        if not isinstance(image, Tensor) or image.dim() != 4:
            shape = tuple(image.shape) if isinstance(image, Tensor) else type(image).__name__
            raise ValueError(f"{where}: batch[{self.image_key!r}] must be a [B, C, H, W] tensor, got {shape}")
        if self.geometric:
            present = [k for k in DEFAULT_BOX_KEYS if k in batch]
            if present:
                raise ValueError(
                    f"{where}: the batch holds boxes {present}, which batch-level ops cannot move; "
                    "augment boxes per sample with pipekit.transforms.Augment"
                )
        for key in self.mask_keys:
            mask = batch.get(key)
            if mask is None:
                continue
            if (
                not isinstance(mask, Tensor)
                or mask.dim() not in (3, 4)
                or mask.shape[0] != image.shape[0]
                or mask.shape[-2:] != image.shape[-2:]
            ):
                shape = tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
                raise ValueError(
                    f"{where}: batch[{key!r}] must be [B, H, W] or [B, K, H, W] matching the image "
                    f"{tuple(image.shape)}, got {shape}"
                )
        return self._transform(batch, rng)

    def _masks(self, batch: Mapping[str, Any]) -> list[str]:
        return [k for k in self.mask_keys if isinstance(batch.get(k), Tensor)]

    def _transform(self, batch: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:  # pragma: no cover
        raise NotImplementedError
