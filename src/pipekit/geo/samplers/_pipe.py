"""A geo sampler as a resumable source pipe: :class:`GeoSamplerPipe` (what :meth:`GeoSampler.as_pipe` returns)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pipekit.geo.samplers._base import GeoSampler, _SamplerIterator
from pipekit.pipes.state import PermutationSource

__all__ = ["GeoSamplerPipe"]


class GeoSamplerPipe(PermutationSource):
    """A geo sampler's boxes as a resumable source pipe of TorchGeo 0.8's ``(slice x, slice y, slice t)`` queries.

    For pipe-native pipelines:
    ``sampler.as_pipe().sharding_filter().read_geo(dataset)``.  Random
    samplers are seeded like torch's ``shuffle``: :meth:`set_seed` (which
    torch's DataLoader calls with its shared seed, so every worker and rank
    draws the *same* sequence and ``sharding_filter`` splits it) keeps the
    seed in ``_seed`` until the next epoch starts; without one, the epoch seed
    comes from the sampler's generator (or torch's global RNG).  Deterministic
    samplers ignore seeds.

    A :class:`~pipekit.pipes.state.PermutationSource`: an epoch's boxes follow
    from its seed, so ``state_dict()`` is ``{"seed": epoch seed, "yielded":
    count}`` and :class:`pipekit.DataLoader` resumes mid-epoch exactly.

    Args:
        sampler: a :class:`GeoSampler` (batch samplers yield lists of boxes).

    Example:
        >>> from types import SimpleNamespace
        >>> from pipekit.geo._index import GeoIndex
        >>> from pipekit.geo.samplers import GridGeoSampler, RandomGeoSampler
        >>> ds = SimpleNamespace(index=GeoIndex([[0, 40, 0, 20]]), res=(1.0, 1.0))
        >>> pipe = GridGeoSampler(ds, size=10).as_pipe()
        >>> [x.start for x, y, t in pipe]
        [0.0, 10.0, 20.0, 30.0, 0.0, 10.0, 20.0, 30.0]
        >>> pipe = RandomGeoSampler(ds, size=10, length=4).as_pipe()
        >>> first = list(pipe.set_seed(7))
        >>> first == list(pipe.set_seed(7)) and len(first) == 4
        True
    """

    def __init__(self, sampler: GeoSampler) -> None:
        if not isinstance(sampler, GeoSampler):
            raise TypeError(f"GeoSamplerPipe takes a GeoSampler, got {type(sampler).__name__}")
        super().__init__()
        self.sampler = sampler

    @property
    def shuffled(self) -> bool:
        """Whether epochs need a seed: the sampler's boxes are random (``set_shuffle`` does not change it)."""
        return bool(self.sampler.random)

    def draw_epoch_seed(self) -> int:
        """An epoch seed from the sampler's ``generator`` (or torch's global generator)."""
        return self.sampler._epoch_seed()

    def epoch_items(self, epoch_seed: int | None, start: int) -> Iterator[Any]:
        return _SamplerIterator(self.sampler, epoch_seed, start, None)

    def __len__(self) -> int:
        return len(self.sampler)
