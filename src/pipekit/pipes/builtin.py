"""torch's own DataPipes, re-exported under torchdata 0.9's class names.

torch still ships ``map``, ``filter``, ``shuffle``, ``batch``, ``unbatch``,
``collate``, ``zip``, ``concat``, ``mux``, ``fork``, ``demux``, ``groupby`` and
``sharding_filter`` (and ``list_files``, ``open_files``, ``read_from_stream``,
``routed_decode``); pipekit does not rewrite them.  Importing them here makes
``from pipekit.pipes import Mapper`` work like
``from torchdata.datapipes.iter import Mapper`` did.

Two of them keep a position between items (the shuffle buffer and the
sharding counter).  :mod:`pipekit.pipes.resume` swaps them for the resumable
subclasses defined at the bottom of this module when a pipeline is
checkpointed, so :class:`pipekit.DataLoader` can restore them exactly; their
behaviour is otherwise unchanged.

:class:`IterableWrapper` is torch's, extended with a resumable position.
"""

from __future__ import annotations

import copy
import itertools
import warnings
from collections.abc import Iterator
from typing import Any

from pipekit.pipes._torch import (
    Batcher,
    Collator,
    Concater,
    Demultiplexer,
    FileLister,
    FileOpener,
    Filter,
    Forker,
    Grouper,
    MapBatcher,
    MapConcater,
    MapMapper,
    Mapper,
    MapShuffler,
    MapZipper,
    Multiplexer,
    RoutedDecoder,
    Sampler,
    SequenceWrapper,
    ShardingFilter,
    Shuffler,
    StreamReader,
    TorchIterableWrapper,
    UnBatcher,
    Zipper,
    restore_shuffler,
    shuffler_position,
)
from pipekit.pipes.state import ResumablePipe

__all__ = [
    "Batcher",
    "Collator",
    "Concater",
    "Demultiplexer",
    "FileLister",
    "FileOpener",
    "Filter",
    "Forker",
    "Grouper",
    "IterableWrapper",
    "MapBatcher",
    "MapConcater",
    "MapMapper",
    "MapShuffler",
    "MapZipper",
    "Mapper",
    "Multiplexer",
    "RoutedDecoder",
    "Sampler",
    "SequenceWrapper",
    "ShardingFilter",
    "Shuffler",
    "StreamReader",
    "UnBatcher",
    "Zipper",
]


class IterableWrapper(ResumablePipe, TorchIterableWrapper):
    """Wrap an iterable (a list, a range, a generator factory's output) as a pipe.

    torch's ``IterableWrapper`` with a resumable position: ``state_dict()``
    records how many items were yielded, and a restored copy skips them
    without re-yielding.

    Args:
        iterable: the items.  Re-iterable containers (lists, ranges) give the
            same items every epoch.
        deepcopy: copy the iterable at the start of each epoch so in-place
            changes to yielded items do not leak into the next epoch.

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> list(IterableWrapper(range(5)).map(lambda x: x * 10))
        [0, 10, 20, 30, 40]
    """

    state_keys = ("yielded",)

    def __init__(self, iterable: Any, deepcopy: bool = True) -> None:
        super().__init__(iterable, deepcopy=deepcopy)
        self._yielded = 0
        self._skip = 0

    def state_dict(self) -> dict[str, Any]:
        return {"yielded": self._yielded}

    def restore(self, state: dict[str, Any] | None) -> None:
        self._skip = 0 if state is None else int(state["yielded"])
        self._yielded = self._skip

    def __iter__(self) -> Iterator[Any]:
        source: Any = self.iterable
        if self.deepcopy:
            try:
                source = copy.deepcopy(self.iterable)
            except TypeError:
                warnings.warn(
                    "IterableWrapper: the iterable cannot be deep-copied; in-place changes to its "
                    "items will show in later epochs",
                    stacklevel=2,
                )
        if self._skip:
            source = itertools.islice(source, self._skip, None)
        for item in source:
            self._yielded += 1
            yield item


class ResumableShuffler(ResumablePipe, Shuffler):
    """torch's ``Shuffler`` with ``state_dict``/``load_state_dict``.

    Not registered under a functional name: :mod:`pipekit.pipes.resume`
    switches ``shuffle`` pipes to this class when a pipeline is checkpointed.
    The snapshot holds the buffer's items and the RNG state, so shuffle
    *before* expensive decoding to keep checkpoints small.
    """

    _runtime = ("_buffer",)

    def _init_runtime(self) -> None:
        self._buffer = []

    def state_dict(self) -> dict[str, Any]:
        return shuffler_position(self)

    def restore(self, state: dict[str, Any] | None) -> None:
        if state is None:
            Shuffler.reset(self)
        else:
            restore_shuffler(self, state)


class ResumableShardingFilter(ResumablePipe, ShardingFilter):
    """torch's ``ShardingFilter`` that remembers how many items it has seen.

    The position matters on resume: item ``i`` of the source goes to shard
    ``i % num_of_instances``, so a restored filter must continue counting
    where it stopped.
    """

    state_keys = ("seen",)
    _seen: int = 0

    def state_dict(self) -> dict[str, Any]:
        return {"seen": self._seen}

    def restore(self, state: dict[str, Any] | None) -> None:
        self._seen = 0 if state is None else int(state["seen"])

    def __iter__(self) -> Iterator[Any]:
        for item in self.source_datapipe:
            i = self._seen
            self._seen += 1
            if i % self.num_of_instances == self.instance_id:
                yield item
