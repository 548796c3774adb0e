"""The sampler of datasets already cut into chips: :class:`PreChippedGeoSampler`, one box per footprint."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from pipekit.geo.samplers._base import _CHUNK, _SEED_MASK, GeoSampler, _boxes, _generator

__all__ = ["PreChippedGeoSampler"]


class PreChippedGeoSampler(GeoSampler):
    """One box per footprint: for datasets already cut into chips.

    Yields each footprint (clipped to ``roi``/``toi``) once per epoch, in
    index order or shuffled.

    Args:
        dataset: a geo dataset (reads ``dataset.index`` and ``dataset.res``).
        roi: region of interest (see :class:`~pipekit.geo.samplers.RandomGeoSampler`).
        toi: time of interest (see :class:`RandomGeoSampler`).
        shuffle: a new order every epoch.
        generator: a ``torch.Generator`` for the shuffle (default: torch's
            global RNG).
        seed: shorthand for ``generator=torch.Generator().manual_seed(seed)``.

    Example:
        >>> from types import SimpleNamespace
        >>> from pipekit.geo._index import GeoIndex
        >>> from pipekit.geo.samplers import PreChippedGeoSampler
        >>> ds = SimpleNamespace(index=GeoIndex([[0, 1, 0, 1], [1, 2, 0, 1], [2, 3, 0, 1]]), res=(0.1, 0.1))
        >>> [x.start for x, y, t in PreChippedGeoSampler(ds)]
        [0.0, 1.0, 2.0]
        >>> sorted(x.start for x, y, t in PreChippedGeoSampler(ds, shuffle=True, seed=0))
        [0.0, 1.0, 2.0]
    """

    def __init__(
        self,
        dataset: Any,
        roi: Any = None,
        toi: Any = None,
        shuffle: bool = False,
        generator: torch.Generator | None = None,
        *,
        seed: int | None = None,
    ) -> None:
        super().__init__(dataset, roi, toi)
        if not isinstance(shuffle, bool):
            raise TypeError(f"shuffle must be a bool, got {shuffle!r}")
        self.shuffle = shuffle
        self.random = shuffle
        self.generator = _generator(generator, seed)
        self._perm: tuple[int, np.ndarray] | None = None

    def _chunk(self, seed: int | None, c: int) -> list[tuple[slice, slice, slice]]:
        pos = np.arange(c * _CHUNK, min((c + 1) * _CHUNK, len(self)), dtype=np.int64)
        if self.shuffle:
            if seed is None:
                raise RuntimeError("PreChippedGeoSampler(shuffle=True) needs an epoch seed")
            cached = self._perm
            if cached is None or cached[0] != seed:
                cached = self._perm = (seed, np.random.default_rng([seed & _SEED_MASK]).permutation(len(self)))
            pos = cached[1][pos]
        return _boxes(self.footprints[pos])

    def __len__(self) -> int:
        return len(self.hits)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_perm"] = None
        return state
