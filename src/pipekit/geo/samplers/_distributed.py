"""A geo sampler's epoch shared out between the processes of a distributed (DDP) run.

TorchGeo's samplers cannot be given to Lightning's DDP: it can inject a
``DistributedSampler`` only into a plain index sampler or a ``BatchSampler``,
so a run with ``RandomBatchGeoSampler`` fails at its first loader (or, with
``use_distributed_sampler=False``, every process reads the same patches).
:class:`DistributedGeoSampler` shares the epoch out instead: every process
draws the same epoch (the same seed, from the same generator state) and
keeps the items at its own positions, so the processes read disjoint
patches and the same number of batches.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DistributedSampler

from pipekit.geo.samplers._base import _CHUNK, BatchGeoSampler

__all__ = ["DistributedGeoSampler"]


class DistributedGeoSampler(DistributedSampler):
    """Each process of a distributed run takes its share of a geo sampler's epoch: positions ``rank, rank + n...``.

    Every process iterates the same epoch of ``sampler`` (seed it the same in
    every process: ``seed=`` or a seeded ``generator``) and keeps the items
    at positions ``rank, rank + num_replicas, ...``. As torch's
    ``DistributedSampler``, the epoch is padded by wrapping around to a
    multiple of ``num_replicas``, so every process gets ``ceil(len(sampler) /
    num_replicas)`` items and a DDP run does not wait on a process with
    fewer batches.

    A :class:`BatchGeoSampler`'s batches are shared out whole and yielded box
    by box: use ``DataLoader(dataset, sampler=s, batch_size=s.batch_size)``
    and each batch is one of the sampler's batches (its patches from one
    footprint). It is a ``DistributedSampler``, so Lightning leaves it in
    place under DDP and calls :meth:`set_epoch`; the epochs themselves come
    from ``sampler``'s generator, which every process advances alike.
    :class:`pipekit.DataLoader` resumes it exactly: its iterator's state is
    the epoch's seed and the count yielded, the same in every process.

    Args:
        sampler: a pipekit geo sampler (or any sampler of boxes: one without
            pipekit's random access is drawn whole at each epoch's start, and
            resumes exactly only if its epochs are reproducible).
        num_replicas: processes in the run (default: ``torch.distributed``'s
            world size).
        rank: this process's rank (default: ``torch.distributed``'s rank).

    Example:
        >>> from types import SimpleNamespace
        >>> from pipekit.geo._index import GeoIndex
        >>> from pipekit.geo.samplers import DistributedGeoSampler, GridGeoSampler
        >>> ds = SimpleNamespace(index=GeoIndex([[0, 50, 0, 10]]), res=(1.0, 1.0))
        >>> grid = GridGeoSampler(ds, size=10, stride=10)
        >>> shares = [list(DistributedGeoSampler(grid, num_replicas=2, rank=r)) for r in (0, 1)]
        >>> [[int(x.start) for x, y, t in share] for share in shares]  # 5 patches, the 6th wraps around
        [[0, 20, 40], [10, 30, 0]]
    """

    def __init__(self, sampler: Any, num_replicas: int | None = None, rank: int | None = None) -> None:
        if num_replicas is None or rank is None:
            import torch.distributed as dist

            if not dist.is_available() or not dist.is_initialized():
                raise RuntimeError(
                    "DistributedGeoSampler: torch.distributed is not initialized; pass num_replicas= and rank="
                )
            num_replicas = dist.get_world_size() if num_replicas is None else num_replicas
            rank = dist.get_rank() if rank is None else rank
        for name, value in (("num_replicas", num_replicas), ("rank", rank)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"DistributedGeoSampler: {name} must be an int, got {value!r}")
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(
                f"DistributedGeoSampler: rank must be in [0, num_replicas - 1] and num_replicas >= 1, got "
                f"rank={rank}, num_replicas={num_replicas}"
            )
        # a DistributedSampler by type (what Lightning and users check), not over a dataset's indices: its
        # __init__ needs len(dataset), which a geo dataset's index is not
        self.sampler, self.num_replicas, self.rank = sampler, num_replicas, rank
        self.dataset = getattr(sampler, "dataset", None)
        self.epoch, self.seed, self.shuffle, self.drop_last = 0, 0, bool(getattr(sampler, "random", False)), False
        self.num_samples = math.ceil(len(sampler) / num_replicas)
        self.total_size = self.num_samples * num_replicas
        self.batch_size = getattr(sampler, "batch_size", None) if isinstance(sampler, BatchGeoSampler) else None

    def __len__(self) -> int:
        """Items this process yields an epoch: boxes (a batch sampler's batches, all full, times its batch size)."""
        return self.num_samples * (self.batch_size or 1)

    def set_epoch(self, epoch: int) -> None:
        """Record the epoch number (Lightning calls it); the epochs' draws come from the sampler's generator."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[Any]:
        inner = iter(self.sampler)
        return _ShareIterator(self, inner)

    def __repr__(self) -> str:
        return f"DistributedGeoSampler({self.sampler!r}, rank {self.rank} of {self.num_replicas})"


class _ShareIterator(Iterator[Any]):
    """One process's share of one epoch, from its position in it; resumable."""

    def __init__(self, share: DistributedGeoSampler, inner: Iterator[Any]) -> None:
        self.share, self.inner = share, inner
        self.n = len(share.sampler)
        self.pos = 0  # items of this share taken
        self.sub: list[Any] = []  # the boxes of the batch being yielded, box by box
        self._chunk: tuple[int, list[Any]] | None = None
        self._all: list[Any] | None = None
        if not hasattr(inner, "state_dict") or not hasattr(share.sampler, "_chunk"):
            self._all = list(inner)  # a sampler without random access: its epoch, drawn whole

    def _item(self, g: int) -> Any:
        if self._all is not None:
            return self._all[g]
        c, offset = divmod(g, _CHUNK)
        if self._chunk is None or self._chunk[0] != c:
            self._chunk = (c, self.share.sampler._chunk(self.inner.seed, c))  # type: ignore[attr-defined]
        return self._chunk[1][offset]

    def __iter__(self) -> _ShareIterator:
        return self

    def __next__(self) -> Any:
        if not self.sub:
            if self.pos >= self.share.num_samples or self.n == 0:
                raise StopIteration
            item = self._item((self.share.rank + self.pos * self.share.num_replicas) % self.n)
            self.pos += 1
            if self.share.batch_size is None:
                return item
            self.sub = list(item)
        return self.sub.pop(0)

    def state_dict(self) -> dict[str, Any]:
        state = self.inner.state_dict() if self._all is None else {}
        return {**state, "share_taken": self.pos, "share_pending": len(self.sub)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = dict(state)
        taken, pending = int(state.pop("share_taken")), int(state.pop("share_pending"))
        if self._all is None:
            self.inner.load_state_dict(state)  # type: ignore[attr-defined]
            self._chunk = None
        self.pos, self.sub = taken, []
        if pending:
            item = self._item((self.share.rank + (taken - 1) * self.share.num_replicas) % self.n)
            self.sub = list(item)[len(item) - pending :]
