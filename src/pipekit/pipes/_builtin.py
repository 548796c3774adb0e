"""torch's own DataPipes, re-exported under torchdata 0.9's class names.

torch still ships ``map``, ``filter``, ``shuffle``, ``batch``, ``unbatch``,
``collate``, ``zip``, ``concat``, ``mux``, ``fork``, ``demux``, ``groupby`` and
``sharding_filter`` (and ``list_files``, ``open_files``, ``read_from_stream``,
``routed_decode``); pipekit does not rewrite them.  Importing them here makes
``from pipekit.pipes import Mapper`` work like
``from torchdata.datapipes.iter import Mapper`` did.

``batch``, ``shuffle``, ``unbatch``, ``groupby`` and ``sharding_filter`` are pipekit
subclasses of torch's classes (``issubclass(Batcher, torch's Batcher)``),
registered in their place with ``functional_datapipe(..., replaces=...)``:
they behave the same but check their arguments when the pipe is built, like
every pipekit pipe (a ``TypeError`` or ``ValueError`` naming the pipe and the
argument), where torch raises ``AssertionError`` (``batch(0)``,
``shuffle(buffer_size=-5)``, ``groupby(fn, group_size=0)``), a confusing comparison error (``batch("8")``),
fails only when iterated (``unbatch(unbatch_level=-3)``) or silently yields
nothing (``apply_sharding(2, -1)``).

Two of them keep a position between items (the shuffle buffer and the
sharding counter).  :mod:`pipekit.pipes._resume` swaps them for the resumable
subclasses defined at the bottom of this module when a pipeline is
checkpointed, so :class:`pipekit.DataLoader` can restore them exactly; their
behaviour is otherwise unchanged.

:class:`IterableWrapper` is torch's, extended with a resumable position.
"""

from __future__ import annotations

import array
import copy
import functools
import itertools
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from pipekit._validate import check_int
from pipekit.pipes._shuffle_replay import (
    REPLAY,
    ReplayLog,
    check_replay,
    check_stamps,
    refill,
    replay_log,
    replay_state,
    restore_upstream,
)
from pipekit.pipes._torch import (
    Batcher as TorchBatcher,
)
from pipekit.pipes._torch import (
    Collator,
    Concater,
    DataChunk,
    Demultiplexer,
    FileLister,
    FileOpener,
    Filter,
    Forker,
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
    StreamReader,
    TorchIterableWrapper,
    Zipper,
    restore_shuffler,
    shuffle_buffered,
    shuffle_replaying,
    shuffler_position,
    shuffler_snapshot,
    stop_journal,
)
from pipekit.pipes._torch import Grouper as TorchGrouper
from pipekit.pipes._torch import ShardingFilter as TorchShardingFilter
from pipekit.pipes._torch import Shuffler as TorchShuffler
from pipekit.pipes._torch import UnBatcher as TorchUnBatcher
from pipekit.pipes.base import functional_datapipe
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




class _Chunk(DataChunk):
    """torch's ``DataChunk``, iterated as the list it is.

    torch's ``DataChunk.__iter__`` is a Python generator (``yield from`` the
    list), so every pass over a batch (``default_collate`` makes two) costs a
    generator step per item; this subclass iterates at C speed.  Same items,
    same ``isinstance(batch, DataChunk)``.
    """

    __iter__ = list.__iter__

    def __reduce_ex__(self, protocol: Any) -> Any:
        # torch's DataChunk pickles its items twice (the list and its ``items`` attribute, the same list) and
        # through ``copyreg.__newobj__`` and list appends, which ``torch.load(weights_only=True)`` refuses for a
        # list subclass: a buffer of batches in a checkpoint would not load.  Rebuilt from one plain list, by
        # this class (allowed below), it does.
        return (_Chunk, (list(self),))


# Checkpoints holding batches (a shuffle or cache after ``batch``) load with ``torch.load(weights_only=True)``.
torch.serialization.add_safe_globals([_Chunk])


@functional_datapipe("batch", replaces=TorchBatcher)
class BatcherIterDataPipe(TorchBatcher):
    """Group items into lists of ``batch_size`` (functional name: ``batch``); torch's ``Batcher``, checked.

    Args:
        datapipe: the pipe to batch.
        batch_size: items per batch, a positive int.
        drop_last: drop the last batch when it is shorter.
        wrapper_class: what each list is wrapped in (a ``DataChunk``, as torch's,
            that iterates at C speed).

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> list(IterableWrapper(range(5)).batch(2))
        [[0, 1], [2, 3], [4]]
        >>> IterableWrapper(range(5)).batch(0)
        Traceback (most recent call last):
        ...
        ValueError: batch: batch_size must be a positive int, got 0
    """

    stateless = True

    def __init__(
        self, datapipe: Any, batch_size: int, drop_last: bool = False, wrapper_class: type = _Chunk
    ) -> None:
        batch_size = check_int(batch_size, "batch_size", "batch", minimum=1)
        if not isinstance(drop_last, bool):
            raise TypeError(f"batch: drop_last must be a bool, got {type(drop_last).__name__}: {drop_last!r:.50}")
        super().__init__(datapipe, batch_size, drop_last, wrapper_class=wrapper_class)


@functional_datapipe("unbatch", replaces=TorchUnBatcher)
class UnBatcherIterDataPipe(TorchUnBatcher):
    """Flatten batches (functional name: ``unbatch``); torch's ``UnBatcher``, checked when built.

    Args:
        datapipe: a pipe of batches (lists).
        unbatch_level: levels to flatten, ``1`` (default) or more, ``0`` for
            none, ``-1`` for all.

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> list(IterableWrapper([[[0, 1], [2]], [[3]]]).unbatch(unbatch_level=2))
        [0, 1, 2, 3]
    """

    def __init__(self, datapipe: Any, unbatch_level: int = 1) -> None:
        unbatch_level = check_int(unbatch_level, "unbatch_level", "unbatch", minimum=-1)
        super().__init__(datapipe, unbatch_level=unbatch_level)


@functional_datapipe("shuffle", replaces=TorchShuffler)
class ShufflerIterDataPipe(TorchShuffler):
    """Shuffle items in a buffer (functional name: ``shuffle``); torch's ``Shuffler``, checked when built.

    Seeded by torch's DataLoader (``set_seed``) or from torch's global
    generator, switched off with ``set_shuffle(False)``, as torch's.

    Args:
        datapipe: the pipe to shuffle.
        buffer_size: items held in the shuffle buffer, a positive int.
        unbatch_level: unbatch the input this many levels first (``0``: none).

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> sorted(IterableWrapper(range(5)).shuffle(buffer_size=3).set_seed(0))
        [0, 1, 2, 3, 4]
    """

    def __init__(self, datapipe: Any, *, buffer_size: int = 10000, unbatch_level: int = 0) -> None:
        buffer_size = check_int(buffer_size, "buffer_size", "shuffle", minimum=1)
        unbatch_level = check_int(unbatch_level, "unbatch_level", "shuffle", minimum=-1)
        super().__init__(datapipe, buffer_size=buffer_size, unbatch_level=unbatch_level)

    __iter__ = shuffle_buffered  # torch's loop, without three Python calls an item (see _torch)
    _journal: list[Any] | None = None  # consumed items since a lazy snapshot's base (ResumableShuffler only)

    def __del__(self) -> None:
        # torch's __del__ clears the buffer its __init__ makes: not there when the arguments were refused.
        parent = getattr(super(), "__del__", None)
        if parent is not None and "buffer_size" in self.__dict__:
            parent()


@functional_datapipe("groupby", replaces=TorchGrouper)
class GrouperIterDataPipe(TorchGrouper):
    """Group items by key into batches (functional name: ``groupby``); torch's ``Grouper``, checked when built.

    torch raised ``AssertionError`` for a ``group_size`` of 0 or above ``buffer_size`` and a comparison
    error for a ``group_size`` that is not a number; here each is a ``ValueError`` or ``TypeError`` naming
    the pipe and the argument.

    Args:
        datapipe: the items.
        group_key_fn: the key of an item.
        keep_key: yield ``(key, group)`` pairs.
        buffer_size: items buffered while groups fill up, a positive int (or ``None``: no bound).
        group_size: items per group (or ``None``: a group ends when the buffer is full or the source ends).
        guaranteed_group_size: the smallest group yielded early when the buffer is full (needs ``group_size``).
        drop_remaining: drop groups smaller than ``guaranteed_group_size`` at the end.

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> list(IterableWrapper(["a", "bb", "c", "dd", "e"]).groupby(len, group_size=2))
        [['a', 'c'], ['bb', 'dd'], ['e']]
    """

    def __init__(
        self,
        datapipe: Any,
        group_key_fn: Any,
        *,
        keep_key: bool = False,
        buffer_size: int | None = 10000,
        group_size: int | None = None,
        guaranteed_group_size: int | None = None,
        drop_remaining: bool = False,
    ) -> None:
        where = "groupby"
        if not callable(group_key_fn):
            raise TypeError(f"{where}: group_key_fn must be a callable, got {type(group_key_fn).__name__} "
                            f"{group_key_fn!r:.50}")
        buffer_size = check_int(buffer_size, "buffer_size", where, minimum=1, allow_none=True)
        group_size = check_int(group_size, "group_size", where, minimum=1, allow_none=True)
        guaranteed_group_size = check_int(guaranteed_group_size, "guaranteed_group_size", where, minimum=1,
                                          allow_none=True)
        if group_size is not None and buffer_size is not None and group_size > buffer_size:
            raise ValueError(f"{where}: group_size must not exceed buffer_size ({buffer_size}), got {group_size}")
        if guaranteed_group_size is not None:
            if group_size is None:
                raise ValueError(f"{where}: guaranteed_group_size needs a group_size, got guaranteed_group_size="
                                 f"{guaranteed_group_size} and group_size=None")
            if guaranteed_group_size > group_size:
                raise ValueError(f"{where}: guaranteed_group_size must not exceed group_size ({group_size}), "
                                 f"got {guaranteed_group_size}")
        super().__init__(datapipe, group_key_fn, keep_key=keep_key, buffer_size=buffer_size,  # type: ignore[arg-type]
                         group_size=group_size, guaranteed_group_size=guaranteed_group_size,
                         drop_remaining=drop_remaining)

    def __del__(self) -> None:
        # torch's __del__ clears the buffer its __init__ makes: not there when the arguments were refused.
        parent = getattr(super(), "__del__", None)
        if parent is not None and "buffer_elements" in self.__dict__:
            parent()


@functional_datapipe("sharding_filter", replaces=TorchShardingFilter)
class ShardingFilterIterDataPipe(TorchShardingFilter):
    """Keep every n-th item for this worker/rank (functional name: ``sharding_filter``); torch's, checked.

    torch's DataLoader (and ``torch.distributed``) call ``apply_sharding``;
    a shard number outside ``0 .. num_of_instances - 1`` is refused with a
    ``ValueError`` instead of yielding nothing.

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> pipe = IterableWrapper(range(7)).sharding_filter()
        >>> pipe.apply_sharding(3, 1)
        >>> list(pipe)
        [1, 4]
    """

    def apply_sharding(self, num_of_instances: int, instance_id: int, *args: Any, **kwargs: Any) -> None:
        num_of_instances = check_int(num_of_instances, "num_of_instances", "sharding_filter", minimum=1)
        instance_id = check_int(instance_id, "instance_id", "sharding_filter", minimum=0)
        if instance_id >= num_of_instances:
            raise ValueError(
                f"sharding_filter: instance_id must be below num_of_instances ({num_of_instances}), got {instance_id}"
            )
        super().apply_sharding(num_of_instances, instance_id, *args, **kwargs)


# torchdata 0.9's class names.
Batcher = BatcherIterDataPipe
UnBatcher = UnBatcherIterDataPipe
Shuffler = ShufflerIterDataPipe
ShardingFilter = ShardingFilterIterDataPipe
Grouper = GrouperIterDataPipe


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


class ResumableShuffler(ResumablePipe, ShufflerIterDataPipe):
    """``shuffle`` (torch's ``Shuffler``) with ``state_dict``/``load_state_dict``.

    Not registered under a functional name: :mod:`pipekit.pipes._resume`
    switches ``shuffle`` pipes to this class when a pipeline is checkpointed.
    The checkpoint holds positions, not the buffered items: the pull number of
    each buffered item, a snapshot of the pipes above taken at most
    ``replay_window`` buffers of pulls earlier, and the RNG state; a restored
    copy re-reads from that snapshot (reading, not decoding: shuffle before
    decoding) and keeps the buffered pulls (:mod:`pipekit.pipes._shuffle_replay`).
    Items buffered longer than the window, and every item when the pipes above
    cannot be snapshotted on their own (shared with another branch by ``fork``,
    running threads), are kept inline: :class:`pipekit.DataLoader` keeps
    buffered archive members that ``load_from_tar`` read into memory as their
    bytes (the resumed buffer gets the same member streams back), and refuses
    at ``state_dict()`` an inline item holding an open file or anything else
    that cannot be pickled, naming this pipe: read or decode before shuffling
    those.

    :class:`pipekit.DataLoader`'s workers, which take a position after every
    batch and send one only for a checkpoint, take it with
    :meth:`lazy_state_dict` instead: O(1), rebuilt into the same dict when it
    is sent (see :func:`pipekit.pipes._torch.shuffler_snapshot`).
    """

    #: How many buffers' worth of pulls a checkpoint may re-read (0: keep every buffered item inline).
    replay_window: float = 4

    _runtime = ("_buffer", "_journal", "_journal_base", "_pulls", "_pulled", "_log", "_replaying", "_new_epoch")
    _runtime += ("_upstream_pipes",)
    # The base the journal starts from (none until a lazy snapshot asks; the journal is the parent's).
    _journal_base: tuple[Any, ...] | None = None
    _log: ReplayLog | None = None
    # Until the first pass starts (a torch Shuffler switched to this class in place has no runtime fields yet).
    _pulled = 0
    _replaying: dict[str, Any] | None = None
    _new_epoch = True

    __iter__ = shuffle_replaying

    def _init_runtime(self) -> None:
        self._buffer = []
        # The pull number of each buffer slot's item: a typed array, so replacing one frees no Python int (a
        # list of ints cost ~85 ns an item in the loop, freeing the replaced number at a random place in memory).
        self._pulls = array.array("q")
        self._pulled = 0
        self._log = None
        self._replaying = None  # a restored replay record, refilled when the pass starts
        self._new_epoch = True  # the pass starts an epoch (not a restore)
        stop_journal(self)

    def _snapshots(self) -> tuple[Any, ...] | None:
        log = self._log
        return log.snapshots if log is not None else None

    def state_dict(self) -> dict[str, Any]:
        position = shuffler_position(self)
        pulls = list(self.__dict__.get("_pulls", ()))
        return replay_state(position["buffer"], pulls, position["rng"], self._pulled, self._snapshots())

    def lazy_state_dict(self) -> Any:
        """What :meth:`state_dict` returns, as an object that becomes it when materialized or pickled."""
        cls = type(self)
        if (
            self._pending is not None
            or cls.state_dict is not ResumableShuffler.state_dict
            or cls._base_state is not ResumableShuffler._base_state
        ):
            return self.state_dict()  # a pending restore, or a subclass's own fields
        return shuffler_snapshot(self, functools.partial(replay_state, snapshots=self._snapshots()))

    def check_state(self, state: dict[str, Any]) -> None:
        if not {"buffer", "rng"} <= set(state):
            raise ValueError(f"not a ResumableShuffler state (missing buffer or rng): {state!r:.200}")
        if REPLAY in state:
            check_replay(state)

    def restore(self, state: dict[str, Any] | None) -> None:
        self._replaying = None
        self._new_epoch = state is None
        if state is None:
            TorchShuffler.reset(self)
            self._pulls, self._pulled = array.array("q"), 0
        elif REPLAY in state:
            restore_shuffler(self, {"buffer": [], "rng": state["rng"]})
            self._stamps = restore_upstream(self, state[REPLAY]["upstream"])
            self._replaying = state
        else:
            restore_shuffler(self, state)
            self._pulls, self._pulled = array.array("q", [-1] * len(self._buffer)), 0  # inline: before any snapshot
        stop_journal(self)

    def _start_replay(self) -> Iterator[Any]:
        """Start the pass's iterator on the pipes above, refilling the buffer from a restored replay record."""
        state, self._replaying = self._replaying, None
        self._log = log = replay_log(self, start=self._new_epoch) if self._enabled else None
        it = iter(self.datapipe)
        if state is not None:
            self._buffer, pulls, self._pulled = refill(it, state, log)
            self._pulls = array.array("q", pulls)
            stamps, self._stamps = self.__dict__.get("_stamps", []), []
            check_stamps(stamps)
        return it


class ResumableShardingFilter(ResumablePipe, ShardingFilterIterDataPipe):
    """``sharding_filter`` (torch's ``ShardingFilter``) that remembers how many items it has seen.

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
