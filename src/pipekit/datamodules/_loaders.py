"""The datamodules' training shuffle and loader: what Lightning's checkpoints need to resume exactly.

* :class:`SeededShuffle`: epoch ``e``'s order is a permutation drawn from
  ``(seed, e)`` alone, and its iterator reports ``{"epoch", "yielded"}``, so
  a resumed run continues the epoch and every later one as the run that never
  stopped (a sampler drawing from one running generator, shared with the
  loader's worker seeds, would shift the later epochs).
* :class:`LightningDataLoader`: a :class:`pipekit.DataLoader` that counts the
  batches it yields in an epoch and records the count in its state; loading a
  state taken at the epoch's last batch (Lightning saves one after every
  step) runs out the rest of that epoch at once, because Lightning goes
  straight on to the next epoch and the loader's next ``iter()`` must be it;
  over a pipeline without a length it reports the position before the batch
  Lightning fetched ahead.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DistributedSampler, Sampler

from pipekit._loader import DataLoader
from pipekit._loader_seam import ITERATOR_FINISHED
from pipekit._seeds import mix_seed

__all__ = ["EpochEndAwareLoader", "LightningDataLoader", "SeededShuffle"]

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
    def __init__(self, it: Iterator[Any], loader: LightningDataLoader) -> None:
        self.it, self.loader = it, loader
        self.lengthless = loader._length() is None

    def __iter__(self) -> _Counting:
        return self

    def __next__(self) -> Any:
        loader = self.loader
        if self.lengthless:  # Lightning fetches this batch ahead of the step it trains: keep the position before it
            loader._behind = loader._position()
        try:
            item = next(self.it)
        except StopIteration:
            loader._behind = None  # the epoch is done: every batch fetched is trained on before a checkpoint
            raise
        loader._batches += 1
        return item


class LightningDataLoader(DataLoader):
    """A :class:`pipekit.DataLoader` for a datamodule's ``*_dataloader`` hooks: it resumes exactly with Lightning.

    It takes :class:`pipekit.DataLoader`'s arguments, and adds what Lightning's
    loop needs for a checkpoint to resume exactly:

    * a state taken at an epoch's last batch (Lightning saves one after every
      step it is asked to) resumes into the next epoch: Lightning goes
      straight on to it, so loading such a state finishes the old epoch at
      once;
    * over an iterable pipeline without a length, Lightning fetches one batch
      ahead of the step it trains (to know which batch is the last), so a
      plain loader's position at a checkpoint is one batch past what was
      trained on, and the resumed run skips that batch; this one reports the
      position before the batch fetched ahead.

    The datamodules' loaders are this class. Outside a Lightning loop, use
    :class:`pipekit.DataLoader`: over a pipeline without a length, this one's
    ``state_dict()`` is one batch behind the batches it has yielded.

    Example:
        >>> from pipekit.datamodules import LightningDataLoader
        >>> from pipekit.pipes import IterableWrapper
        >>> loader = LightningDataLoader(IterableWrapper(range(6)).filter(lambda i: i % 2 == 0), batch_size=1)
        >>> it = iter(loader)
        >>> fetched = [next(it), next(it)]  # Lightning trains on the first while it holds the second
        >>> resumed = LightningDataLoader(IterableWrapper(range(6)).filter(lambda i: i % 2 == 0), batch_size=1)
        >>> resumed.load_state_dict(loader.state_dict())
        >>> [int(b) for b in resumed]  # from the batch fetched ahead on
        [2, 4]
    """

    _batches = 0
    _resumed_batches: int | None = None
    _behind: dict[str, Any] | None = None  # the position before the batch last fetched (no length)

    def _length(self) -> int | None:
        try:
            return len(self)
        except TypeError:
            return None

    def _position(self) -> dict[str, Any]:
        # the workers' tokens, not their positions: this runs before every batch of a loader without a length
        return {**self._deferred_state(), _BATCHES: self._batches}

    def __iter__(self) -> Any:
        it = super().__iter__()
        self._batches, self._resumed_batches, self._behind = self._resumed_batches or 0, None, None
        return _Counting(it, self)

    def state_dict(self) -> dict[str, Any]:
        return self._resolved(self._behind if self._behind is not None else self._position())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        batches = state_dict.get(_BATCHES) if isinstance(state_dict, dict) else None
        if batches is not None:
            state_dict = {k: v for k, v in state_dict.items() if k != _BATCHES}
        super().load_state_dict(state_dict)
        self._resumed_batches, self._behind = batches, None
        length = self._length()
        if length is None:
            return
        if batches is not None and batches >= length > 0 and not state_dict.get(ITERATOR_FINISHED, False):
            for _ in self:  # the (empty) rest of the epoch the state was taken in
                pass
            if isinstance(self.sampler, DistributedSampler):
                # Lightning starts the next epoch's iterator before it tells the sampler the epoch's number
                self.sampler.set_epoch(self.sampler.epoch + 1)


EpochEndAwareLoader = LightningDataLoader  # its name before it was public
