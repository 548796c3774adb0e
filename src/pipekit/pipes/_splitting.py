"""Pipes that split one source into several: ``round_robin_demux``, ``unzip`` and ``random_split``.

torchdata 0.9's ``round_robin_demux`` (:class:`RoundRobinDemultiplexer`),
``unzip`` (:class:`UnZipper`) and ``random_split`` (:class:`RandomSplitter`)
under the same class names, arguments and outputs: each returns child pipes
(a list of them, or one with ``random_split``'s ``target``).  The map-style
``unzip`` (torchdata's ``torchdata.datapipes.map.UnZipper``) is
:class:`pipekit.pipes._mapstyle.MapUnZipper`.

Resume: the children of one split keep their state in one shared container
that they reference (their upstream): the container is resumable (its snapshot
holds the items buffered for each child, or the random draws' state), the
children themselves hold nothing.  Containers are never iterated: each child's
iterator starts through the container's ``start()``, which applies a loaded
checkpoint the way every :class:`~pipekit.pipes.state.ResumablePipe` does.
"""

from __future__ import annotations

import random
import warnings
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

from pipekit.errors import ConfigurationError
from pipekit.pipes.base import IterDataPipe, functional_datapipe
from pipekit.pipes.state import ResumablePipe

__all__ = ["RandomSplitter", "RoundRobinDemultiplexer", "UnZipper"]


def _check_buffer_size(buffer_size: Any, stage: str) -> int:
    """``-1`` (unlimited) or a non-negative int, as torch's ``fork``/``demux`` accept."""
    if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size < -1:
        raise ValueError(f"{stage}: buffer_size must be a non-negative int or -1 (unlimited), got {buffer_size!r}")
    return buffer_size


class _SplitContainer(ResumablePipe):
    """The shared state behind the children of ``round_robin_demux`` and ``unzip``.

    Reads the source on demand and routes each item to per-child buffers.  A
    child that starts a second iterator in the same epoch starts a new epoch
    for all children (older iterators of the other children then raise
    ``RuntimeError``), as torch's ``fork``/``demux`` do.  Not meant to be
    iterated itself: each child's iterator calls :meth:`start`, which applies
    a loaded checkpoint (``reset()``, as for any iterator of a
    :class:`~pipekit.pipes.state.ResumablePipe`).

    Resumable: the snapshot holds the items buffered for each child, whether
    the source is exhausted and how many items were read from it.
    """

    state_keys = ("active",)
    _runtime = ("_buffers", "_source_it", "_exhausted", "_count", "_started", "_epoch", "_active")
    stage = "split"
    overflow = "sum"  # how buffered items count against buffer_size: "sum" of children or "max" lag

    def __init__(self, source_datapipe: IterDataPipe, num_children: int, buffer_size: int) -> None:
        super().__init__()
        self.source_datapipe = source_datapipe
        self.num_children = num_children
        self.buffer_size = buffer_size
        self._init_runtime()

    @property
    def main_datapipe(self) -> IterDataPipe:
        """The source pipe (the name torch's ``fork``/``demux`` containers use)."""
        return self.source_datapipe

    def _init_runtime(self) -> None:
        self._buffers: list[deque[Any]] = [deque() for _ in range(self.num_children)]
        self._source_it: Iterator[Any] | None = None
        self._exhausted = False
        self._count = 0
        self._started = [False] * self.num_children
        self._epoch = getattr(self, "_epoch", 0)
        self._active = False

    def _route(self, index: int, item: Any) -> list[tuple[int, Any]]:  # pragma: no cover - overridden
        raise NotImplementedError

    def child_length(self, child_id: int) -> int:  # pragma: no cover - overridden
        raise NotImplementedError

    def __iter__(self) -> Iterator[Any]:
        raise TypeError(f"{self.stage}: iterate the child pipes it returned, not their shared container")

    def _all_done(self) -> bool:
        return self._exhausted and not any(self._buffers)

    def _new_epoch(self) -> None:
        epoch = self._epoch + 1
        self._init_runtime()
        self._epoch, self._active = epoch, True

    def _warn_restart(self, who: str, stacklevel: int) -> None:
        if self._active and not self._all_done():
            warnings.warn(
                f"{self.stage}: {who} started a new iterator before all children finished; "
                "the buffers are reset and every child reads from the start again",
                stacklevel=stacklevel + 1,
            )

    def start(self, child_id: int) -> int:
        """Begin iterating child ``child_id``; returns the epoch the child's iterator belongs to."""
        epoch = self._epoch
        self.reset()  # a loaded checkpoint begins a new epoch at its position (see restore)
        if self._epoch == epoch and (not self._active or self._started[child_id]):
            self._warn_restart(f"child {child_id}", stacklevel=3)
            self._new_epoch()
        self._started[child_id] = True
        return self._epoch

    def state_dict(self) -> dict[str, Any]:
        if not self._active:
            return {"active": False}
        return {
            "active": True,
            "buffers": [list(b) for b in self._buffers],
            "exhausted": self._exhausted,
            "count": self._count,
        }

    def restore(self, state: dict[str, Any] | None) -> None:
        """Begin a new epoch at a checkpoint's position (``None``: :meth:`start` decides).

        Called whenever a child's iterator starts, which is not always the start
        of an epoch: the children of one epoch start one after the other.
        """
        if state is None:
            return
        if not state.get("active"):
            self._warn_restart("a restored child", stacklevel=5)
        self._new_epoch()
        if state.get("active"):
            self._buffers = [deque(b) for b in state["buffers"]]
            self._exhausted = bool(state["exhausted"])
            self._count = int(state["count"])

    def next_for(self, child_id: int, epoch: int) -> tuple[bool, Any]:
        """``(True, item)`` for child ``child_id``, or ``(False, None)`` at its end."""
        if epoch != self._epoch:
            raise RuntimeError(
                f"{self.stage}: this iterator of child {child_id} is invalid, because a child started a new "
                "iterator (a new epoch) since"
            )
        buf = self._buffers[child_id]
        while not buf:
            if self._exhausted:
                return False, None
            if self._source_it is None:
                self._source_it = iter(self.source_datapipe)
            try:
                item = next(self._source_it)
            except StopIteration:
                self._exhausted = True
                self._source_it = None
                continue
            index, self._count = self._count, self._count + 1
            for target, value in self._route(index, item):
                self._buffers[target].append(value)
            self._check_overflow(child_id)
        return True, buf.popleft()

    def _check_overflow(self, child_id: int) -> None:
        if self.buffer_size < 0:
            return
        others = [len(b) for i, b in enumerate(self._buffers) if i != child_id]
        held = (sum(others) if self.overflow == "sum" else max(others)) if others else 0
        if held > self.buffer_size:
            raise BufferError(
                f"{self.stage}: buffer overflow: more than buffer_size={self.buffer_size} items are waiting "
                f"for the other children while child {child_id} reads ahead; iterate the children together "
                "(e.g. zip them) or raise buffer_size (-1 for no limit)"
            )


class _SplitChild(IterDataPipe):
    """One output of ``round_robin_demux`` / ``unzip``: reads its items from the shared container."""

    stateless = True  # the position lives in the container

    def __init__(self, main_datapipe: _SplitContainer, child_id: int) -> None:
        super().__init__()
        self.source_datapipe = main_datapipe
        self.child_id = child_id

    @property
    def main_datapipe(self) -> _SplitContainer:
        """The shared container (the name torch's ``fork``/``demux`` children use)."""
        return self.source_datapipe

    def __iter__(self) -> Iterator[Any]:
        container = self.source_datapipe
        epoch = container.start(self.child_id)
        while True:
            ok, item = container.next_for(self.child_id, epoch)
            if not ok:
                return
            yield item

    def __len__(self) -> int:
        return self.source_datapipe.child_length(self.child_id)


class _RoundRobinContainer(_SplitContainer):
    stage = "round_robin_demux"
    overflow = "sum"

    def _route(self, index: int, item: Any) -> list[tuple[int, Any]]:
        return [(index % self.num_children, item)]

    def child_length(self, child_id: int) -> int:
        n = len(self.source_datapipe)
        return n // self.num_children + (1 if n % self.num_children > child_id else 0)


@functional_datapipe("round_robin_demux")
class RoundRobinDemultiplexer(IterDataPipe):
    """Split the source into ``num_instances`` pipes, dealing its items round-robin.

    (functional name: ``round_robin_demux``).  Returns a list of child pipes:
    child ``i`` yields items ``i``, ``i + num_instances``, ...  Items read by
    one child on behalf of another wait in a buffer of at most ``buffer_size``
    items across all children (``BufferError`` beyond), so iterate the
    children together (``zip``, ``mux``) or raise ``buffer_size``.

    Resumable: the shared container's snapshot holds the buffered items (the
    children hold no state), so a pipeline that recombines the children
    resumes exactly.

    Args:
        datapipe: the source pipe.
        num_instances: how many children (>= 1; with 1 the source itself is
            returned in a list, with a warning).
        buffer_size: the most items held for children that lag behind; ``-1``
            for no limit.

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> dp1, dp2 = IterableWrapper(range(5)).round_robin_demux(2)
        >>> list(dp1)
        [0, 2, 4]
        >>> len(dp1)
        3
        >>> list(dp2)
        [1, 3]
        >>> len(dp2)
        2
    """

    def __new__(cls, datapipe: IterDataPipe, num_instances: int, buffer_size: int = 1000) -> Any:  # type: ignore[misc]
        if isinstance(num_instances, bool) or not isinstance(num_instances, int) or num_instances < 1:
            raise ValueError(f"round_robin_demux: num_instances must be an int >= 1, got {num_instances!r}")
        _check_buffer_size(buffer_size, "round_robin_demux")
        if num_instances == 1:
            warnings.warn(
                "round_robin_demux with num_instances=1 does nothing; it returns [datapipe]", stacklevel=2
            )
            return [datapipe]
        container = _RoundRobinContainer(datapipe, num_instances, buffer_size)
        return [_SplitChild(container, i) for i in range(num_instances)]


def _unzip_columns(sequence_length: Any, columns_to_skip: Sequence[int] | None) -> list[int]:
    """The columns ``unzip`` makes children for; ``ConfigurationError`` when there are none."""
    if isinstance(sequence_length, bool) or not isinstance(sequence_length, int):
        raise TypeError(f"unzip: sequence_length must be an int, got {type(sequence_length).__name__}")
    if sequence_length < 1:
        raise ConfigurationError(f"unzip: sequence_length must be a positive int, got {sequence_length!r}")
    skips = set(columns_to_skip or ())
    bad = [c for c in skips if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < sequence_length]
    if bad:
        raise ValueError(f"unzip: columns_to_skip must be ints in [0, {sequence_length}), got {sorted(bad)}")
    columns = [i for i in range(sequence_length) if i not in skips]
    if not columns:
        raise ConfigurationError(
            f"unzip: columns_to_skip={sorted(skips)} skips every column of sequence_length={sequence_length}"
        )
    return columns


def _check_sequence(item: Any, sequence_length: int, where: str) -> None:
    try:
        length = len(item)
    except TypeError:
        raise TypeError(f"unzip: {where} is not a sequence: {item!r:.200}") from None
    if length != sequence_length:
        raise ValueError(
            f"unzip: {where} has length {length}, expected sequence_length={sequence_length}: {item!r:.200}"
        )


class _UnZipContainer(_SplitContainer):
    stage = "unzip"
    overflow = "max"

    def __init__(
        self, source_datapipe: IterDataPipe, sequence_length: int, columns: list[int], buffer_size: int
    ) -> None:
        self.sequence_length = sequence_length
        self.columns = columns
        super().__init__(source_datapipe, len(columns), buffer_size)

    def _route(self, index: int, item: Any) -> list[tuple[int, Any]]:
        _check_sequence(item, self.sequence_length, f"item {index}")
        return [(child, item[col]) for child, col in enumerate(self.columns)]

    def child_length(self, child_id: int) -> int:
        return len(self.source_datapipe)


@functional_datapipe("unzip")
class UnZipper(IterDataPipe):
    """Split a pipe of sequences into one pipe per position (functional name: ``unzip``).

    Returns a list of child pipes, one per column not in ``columns_to_skip``.
    Every item must have ``sequence_length`` elements (``ValueError``
    otherwise).

    The children share one buffer, as torchdata's (built on ``fork``): read
    them together (``zip`` them).  A child read out of order, ahead of the
    slowest child by more than ``buffer_size`` items (``list(dp1)`` before
    ``dp2`` is read, on a source longer than ``buffer_size``), raises
    ``BufferError`` at that item, as in torchdata; ``buffer_size=-1`` lets
    it buffer everything instead.  A child that starts a new iterator before
    the others finished restarts all of them, with a warning, and the older
    iterators then raise ``RuntimeError``, as torchdata's children do.

    Arguments that leave no child (``sequence_length < 1``, every column
    skipped) raise :class:`~pipekit.errors.ConfigurationError`, a
    ``ValueError`` that is also the ``RuntimeError`` torchdata raised; a
    column to skip outside ``[0, sequence_length)`` raises ``ValueError``
    (torchdata ignored it).

    Resumable through the shared container, like ``round_robin_demux``.

    Args:
        source_datapipe: a pipe of sequences (tuples, lists).
        sequence_length: the length of every sequence (> 0).
        buffer_size: how far a child may read ahead of the slowest one; ``-1``
            for no limit.
        columns_to_skip: positions that get no child.

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> source_dp = IterableWrapper([(i, i + 10, i + 20) for i in range(3)])
        >>> dp1, dp2, dp3 = source_dp.unzip(sequence_length=3)
        >>> list(dp1)
        [0, 1, 2]
        >>> list(dp2)
        [10, 11, 12]
        >>> list(dp3)
        [20, 21, 22]
        >>> [list(dp) for dp in source_dp.unzip(sequence_length=3, columns_to_skip=[1])]
        [[0, 1, 2], [20, 21, 22]]
    """

    def __new__(  # type: ignore[misc]
        cls,
        source_datapipe: IterDataPipe,
        sequence_length: int,
        buffer_size: int = 1000,
        columns_to_skip: Sequence[int] | None = None,
    ) -> Any:
        _check_buffer_size(buffer_size, "unzip")
        columns = _unzip_columns(sequence_length, columns_to_skip)
        container = _UnZipContainer(source_datapipe, sequence_length, columns, buffer_size)
        return [_SplitChild(container, i) for i in range(len(columns))]


# --------------------------------------------------------------------------- random_split


class _RandomSplitContainer(ResumablePipe):
    """The shared draw state behind the children of ``random_split``.

    Not meant to be iterated itself: each split's iterator calls :meth:`start`,
    which applies a loaded checkpoint (``reset()``, as for any iterator of a
    :class:`~pipekit.pipes.state.ResumablePipe`) and restarts the draws.

    Resumable: the snapshot holds the RNG state and the remaining weights.
    """

    state_keys = ("active",)
    _runtime = ("_epoch", "_active")

    def __init__(self, source_datapipe: IterDataPipe, total_length: int, weights: dict[Any, float], seed: Any) -> None:
        super().__init__()
        self.source_datapipe = source_datapipe
        self.total_length = total_length
        self.remaining_length = total_length
        self._seed = seed
        self.keys = list(weights.keys())
        self.key_to_index = {k: i for i, k in enumerate(self.keys)}
        self.norm_weights = self.normalize_weights([weights[k] for k in self.keys], total_length)
        self.weights = self.norm_weights.copy()
        self._rng = random.Random(self._seed)
        self._lengths: list[int] = []
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._epoch = getattr(self, "_epoch", 0)
        self._active = False

    @staticmethod
    def normalize_weights(weights: list[float], total_length: int) -> list[float]:
        total_weight = sum(weights)
        if total_weight <= 0:
            raise ValueError(f"random_split: cannot normalize weights {weights} (their sum is not positive)")
        return [float(w) * total_length / total_weight for w in weights]

    def __iter__(self) -> Iterator[Any]:
        raise TypeError("random_split: iterate the split pipes it returned, not their shared container")

    def override_seed(self, seed: Any) -> _RandomSplitContainer:
        self._seed = seed
        return self

    def start(self) -> int:
        """Begin iterating a split (the draws restart, or continue a loaded checkpoint); returns its epoch."""
        self.reset()  # restore(): a loaded checkpoint's position, or the draws' start
        self._epoch += 1
        self._active = True
        return self._epoch

    def state_dict(self) -> dict[str, Any]:
        if not self._active:
            return {"active": False}
        return {
            "active": True,
            "rng": self._rng.getstate(),
            "weights": list(self.weights),
            "remaining": self.remaining_length,
        }

    def restore(self, state: dict[str, Any] | None) -> None:
        if state is not None and state.get("active"):
            self._rng.setstate(state["rng"])
            self.weights = list(state["weights"])
            self.remaining_length = int(state["remaining"])
        else:
            self._rng = random.Random(self._seed)
            self.weights = self.norm_weights.copy()
            self.remaining_length = self.total_length

    def check(self, epoch: int) -> None:
        if epoch != self._epoch:
            raise RuntimeError(
                "random_split: another split started iterating; iterate one split at a time "
                "(the splits share one sequence of random draws)"
            )

    def draw(self) -> Any:
        if self.remaining_length <= 0:
            raise ValueError(
                f"random_split: the source has more items than total_length={self.total_length}; "
                "pass the source's true length"
            )
        selected_key = self._rng.choices(self.keys, self.weights)[0]
        index = self.key_to_index[selected_key]
        self.weights[index] -= 1
        self.remaining_length -= 1
        if self.weights[index] < 0:
            self.weights[index] = 0
            if self.remaining_length > 0:
                self.weights = self.normalize_weights(self.weights, self.remaining_length)
        return selected_key

    def get_length(self, target: Any) -> int:
        if not self._lengths:
            if all(w.is_integer() for w in self.norm_weights) and sum(self.norm_weights) == self.total_length:
                self._lengths = [int(w) for w in self.norm_weights]
            else:
                raise TypeError(
                    "random_split: the lengths of the splits are not known in advance; pass integer weights "
                    "that sum to total_length, or declare a length with set_length()"
                )
        return self._lengths[self.key_to_index[target]]


class SplitterIterator(IterDataPipe):
    """One split of ``random_split``: the source items drawn for ``target``."""

    stateless = True  # the draw state lives in the container

    def __init__(self, main_datapipe: _RandomSplitContainer, target: Any) -> None:
        super().__init__()
        self.source_datapipe = main_datapipe
        self.target = target

    @property
    def main_datapipe(self) -> _RandomSplitContainer:
        """The shared container of the splits."""
        return self.source_datapipe

    def __iter__(self) -> Iterator[Any]:
        main = self.source_datapipe
        epoch = main.start()
        source = iter(main.source_datapipe)
        while True:
            main.check(epoch)  # before the source's own single-iterator check, for a clearer message
            try:
                sample = next(source)
            except StopIteration:
                return
            if main.draw() == self.target:
                yield sample

    def override_seed(self, seed: Any) -> SplitterIterator:
        """Use ``seed`` from the next iteration on (e.g. a different split each epoch)."""
        self.source_datapipe.override_seed(seed)
        return self

    def __len__(self) -> int:
        return self.source_datapipe.get_length(self.target)


@functional_datapipe("random_split")
class RandomSplitter(IterDataPipe):
    """Split the source at random into groups with the given weights (functional name: ``random_split``).

    Each source item goes to one group, drawn with probability proportional to
    the group's remaining weight, so integer weights that sum to
    ``total_length`` give groups of exactly those sizes (and ``len()`` works).
    The split is the same every epoch (the draws restart from ``seed``); call
    ``override_seed`` on a split for a different split from the next epoch.
    The splits share one sequence of draws, so iterate one at a time
    (``RuntimeError`` otherwise); each iteration reads the whole source.

    Resumable: the shared container's snapshot holds the RNG state and
    remaining weights.

    Args:
        source_datapipe: the source pipe.
        weights: ``{group: weight}``; one split per group.
        seed: the seed of the draws (required: the split must be reproducible).
        total_length: the number of source items (default: ``len(source)``).
        target: return only this group's split instead of a list of all.

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> dp = IterableWrapper(range(10))
        >>> train, valid = dp.random_split(total_length=10, weights={"train": 0.5, "valid": 0.5}, seed=0)
        >>> list(train)
        [2, 3, 5, 7, 8]
        >>> list(valid)
        [0, 1, 4, 6, 9]
        >>> train = dp.random_split(total_length=10, weights={"train": 0.5, "valid": 0.5}, seed=0, target="train")
        >>> list(train)
        [2, 3, 5, 7, 8]
    """

    def __new__(  # type: ignore[misc]
        cls,
        source_datapipe: IterDataPipe,
        weights: dict[Any, float],
        seed: Any,
        total_length: int | None = None,
        target: Any = None,
    ) -> Any:
        if not isinstance(weights, dict) or not weights:
            raise ValueError("random_split: weights must be a non-empty dict {group: weight}")
        for key, w in weights.items():
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not w > 0:
                raise ValueError(f"random_split: weight of {key!r} must be a positive number, got {w!r}")
        if total_length is None:
            try:
                total_length = len(source_datapipe)
            except TypeError:
                raise TypeError(
                    "random_split needs total_length: it cannot be taken from the source, which has no length"
                ) from None
        if isinstance(total_length, bool) or not isinstance(total_length, int) or total_length < 0:
            raise ValueError(f"random_split: total_length must be a non-negative int, got {total_length!r}")
        if target is not None and target not in weights:
            raise KeyError(f"random_split: target={target!r} is not a key of weights {list(weights)}")
        container = _RandomSplitContainer(source_datapipe, total_length, weights, seed)
        if target is None:
            return [SplitterIterator(container, k) for k in weights]
        return SplitterIterator(container, target)
