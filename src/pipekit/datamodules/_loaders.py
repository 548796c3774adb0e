"""The datamodules' training shuffle and loader: what Lightning's checkpoints need to resume exactly.

* :class:`SeededShuffle`: epoch ``e``'s order is a permutation drawn from
  ``(seed, e)`` alone, and its iterator reports ``{"epoch", "yielded"}``, so
  a resumed run continues the epoch and every later one as the run that never
  stopped (a sampler drawing from one running generator, shared with the
  loader's worker seeds, would shift the later epochs).
* :class:`EpochEndAwareLoader`: a :class:`pipekit.DataLoader` that counts the
  batches it yields in an epoch and records the count in its state; loading a
  state taken at the epoch's last batch (Lightning saves one after every
  step) runs out the rest of that epoch at once, because Lightning goes
  straight on to the next epoch and the loader's next ``iter()`` must be it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DistributedSampler, Sampler

from pipekit._loader import DataLoader
from pipekit._loader_seam import ITERATOR_FINISHED
from pipekit._seeds import mix_seed

__all__ = ["EpochEndAwareLoader", "SeededShuffle"]

_BATCHES = "datamodule_batches"  # the key of the batches yielded in the epoch, in the loader's state


class SeededShuffle(Sampler[int]):
    """Indices ``0..n-1`` in a new order each epoch, epoch ``e``'s drawn from ``(seed, e)``; resumable.

    Example:
        >>> from pipekit.datamodules._loaders import SeededShuffle
        >>> shuffle = SeededShuffle(5, seed=0)
        >>> first, second = list(shuffle), list(shuffle)
        >>> sorted(first) == sorted(second) == [0, 1, 2, 3, 4], first != second
        (True, True)
        >>> list(SeededShuffle(5, seed=0)) == first
        True
    """

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed, self.epoch = n, seed, 0

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> _ShuffleIterator:
        return _ShuffleIterator(self)


class _ShuffleIterator(Iterator[int]):
    """One epoch's indices; the epoch is claimed (the sampler's count advanced) when the first index is read.

    A multi-process DataLoader iterator asks for two sampler iterators per
    first epoch (torch's ``__init__``, then ``_reset``) and reads only the
    second: claiming at creation would give a run with workers epoch e + 1's
    order as its epoch e.
    """

    def __init__(self, sampler: SeededShuffle) -> None:
        self.sampler, self.pos = sampler, 0
        self.epoch: int | None = None
        self.order: list[int] = []

    def _start(self, epoch: int) -> None:
        self.epoch = epoch
        generator = torch.Generator().manual_seed(mix_seed(self.sampler.seed, epoch) & ((1 << 63) - 1))
        self.order = torch.randperm(self.sampler.n, generator=generator).tolist()

    def __iter__(self) -> _ShuffleIterator:
        return self

    def __next__(self) -> int:
        if self.epoch is None:
            self._start(self.sampler.epoch)
            self.sampler.epoch += 1
        if self.pos >= len(self.order):
            raise StopIteration
        self.pos += 1
        return self.order[self.pos - 1]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.sampler.epoch if self.epoch is None else self.epoch, "yielded": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._start(int(state["epoch"]))
        self.pos = int(state["yielded"])
        self.sampler.epoch = self.epoch + 1


class _Counting(Iterator[Any]):
    def __init__(self, it: Iterator[Any], loader: EpochEndAwareLoader) -> None:
        self.it, self.loader = it, loader

    def __iter__(self) -> _Counting:
        return self

    def __next__(self) -> Any:
        item = next(self.it)
        self.loader._batches += 1
        return item


class EpochEndAwareLoader(DataLoader):
    """A :class:`pipekit.DataLoader` whose state taken at an epoch's last batch resumes into the next epoch."""

    _batches = 0
    _resumed_batches: int | None = None

    def __iter__(self) -> Any:
        it = super().__iter__()
        self._batches, self._resumed_batches = self._resumed_batches or 0, None
        return _Counting(it, self)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), _BATCHES: self._batches}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        batches = state_dict.get(_BATCHES) if isinstance(state_dict, dict) else None
        if batches is not None:
            state_dict = {k: v for k, v in state_dict.items() if k != _BATCHES}
        super().load_state_dict(state_dict)
        self._resumed_batches = batches
        try:
            length = len(self)
        except TypeError:
            return
        if batches is not None and batches >= length > 0 and not state_dict.get(ITERATOR_FINISHED, False):
            for _ in self:  # the (empty) rest of the epoch the state was taken in
                pass
            if isinstance(self.sampler, DistributedSampler):
                # Lightning starts the next epoch's iterator before it tells the sampler the epoch's number
                self.sampler.set_epoch(self.sampler.epoch + 1)
