"""A geo sampler as a resumable source pipe: :class:`GeoSamplerPipe` (what :meth:`GeoSampler.as_pipe` returns)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pipekit.geo.samplers.base import _SEED_MASK, GeoSampler, _SamplerIterator
from pipekit.pipes.base import IterDataPipe

__all__ = ["GeoSamplerPipe"]


class GeoSamplerPipe(IterDataPipe):
    """A geo sampler's boxes as a resumable source pipe of :class:`~pipekit.geo.BoundingBox` objects.

    For pipe-native pipelines:
    ``sampler.as_pipe().sharding_filter().read_geo(dataset)``.  Random
    samplers are seeded like torch's ``shuffle``: :meth:`set_seed` (which
    torch's DataLoader calls with its shared seed, so every worker and rank
    draws the *same* sequence and ``sharding_filter`` splits it) keeps the
    seed in ``_seed`` until the next epoch starts; without one, the epoch seed
    comes from the sampler's generator (or torch's global RNG).  Deterministic
    samplers ignore seeds.

    ``state_dict()`` is ``{"seed": epoch seed, "yielded": count}``, so
    :class:`pipekit.DataLoader` resumes mid-epoch exactly.

    Args:
        sampler: a :class:`GeoSampler` (batch samplers yield lists of boxes).

    Example:
        >>> from types import SimpleNamespace
        >>> from pipekit.geo.index import GeoIndex
        >>> from pipekit.geo.samplers import GridGeoSampler, RandomGeoSampler
        >>> ds = SimpleNamespace(index=GeoIndex([[0, 40, 0, 20]]), res=(1.0, 1.0))
        >>> pipe = GridGeoSampler(ds, size=10).as_pipe()
        >>> [b.minx for b in pipe]
        [0.0, 10.0, 20.0, 30.0, 0.0, 10.0, 20.0, 30.0]
        >>> pipe = RandomGeoSampler(ds, size=10, length=4).as_pipe()
        >>> first = list(pipe.set_seed(7))
        >>> first == list(pipe.set_seed(7)) and len(first) == 4
        True
    """

    def __init__(self, sampler: GeoSampler) -> None:
        if not isinstance(sampler, GeoSampler):
            raise TypeError(f"GeoSamplerPipe takes a GeoSampler, got {type(sampler).__name__}")
        self.sampler = sampler
        self._seed: int | None = None
        self._restore: dict[str, Any] | None = None
        self._epoch_seed: int | None = None
        self._start = 0
        self._yielded = 0

    def set_seed(self, seed: int) -> GeoSamplerPipe:
        """Seed the next epoch (torch's DataLoader calls this with its shared seed)."""
        self._seed = int(seed)
        return self

    def reset(self) -> None:
        restore, self._restore = self._restore, None
        if restore is not None:
            self._epoch_seed = restore["seed"]
            self._start = int(restore["yielded"])
        else:
            self._start = 0
            if self.sampler.random:
                self._epoch_seed = (
                    self._seed & _SEED_MASK if self._seed is not None else self.sampler._epoch_seed()
                )
            else:
                self._epoch_seed = None
        self._seed = None
        self._yielded = self._start

    def __iter__(self) -> Iterator[Any]:
        it = _SamplerIterator(self.sampler, self._epoch_seed, self._start, None)
        for item in it:
            self._yielded += 1
            yield item

    def __len__(self) -> int:
        return len(self.sampler)

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self._epoch_seed, "yielded": self._yielded}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or "yielded" not in state or "seed" not in state:
            raise ValueError(f"not a GeoSamplerPipe state: {state!r:.200}")
        self._restore = dict(state)
