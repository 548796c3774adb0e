"""Pipes that combine several sources into one, or split one source into several.

torchdata 0.9's ``zip_longest``, ``mux_longest``, ``zip_with_iter``,
``zip_with_map``, ``SampleMultiplexer``, ``round_robin_demux``, ``unzip``,
``random_split``, ``to_map_datapipe`` and ``to_iter_datapipe`` under the same
class names, arguments and outputs.

Resume: the combining pipes record which sources are exhausted, whose turn is
next, their key buffer or RNG state.  The splitting pipes (``round_robin_demux``,
``unzip``, ``random_split``) keep their state in one shared container that the
child pipes reference: the container is resumable (its snapshot holds the
items buffered for each child), the children themselves hold nothing.
"""

from __future__ import annotations

import random
import warnings
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any

from pipekit.pipes._callables import _check_callable, _fn_name
from pipekit.pipes.base import IterDataPipe, MapDataPipe, functional_datapipe
from pipekit.pipes.transform import _Resumable, _torch_seed

__all__ = [
    "IterKeyZipper",
    "IterToMapConverter",
    "MapKeyZipper",
    "MapToIterConverter",
    "MultiplexerLongest",
    "RandomSplitter",
    "RoundRobinDemultiplexer",
    "SampleMultiplexer",
    "UnZipper",
    "ZipperLongest",
]


def _check_pipes(datapipes: Sequence[Any], stage: str) -> None:
    if not datapipes:
        raise ValueError(f"{stage}: expected at least one IterDataPipe")
    for i, dp in enumerate(datapipes):
        if not isinstance(dp, IterDataPipe):
            raise TypeError(f"{stage}: input {i} must be an IterDataPipe, got {type(dp).__name__}")


def _check_buffer_size(buffer_size: Any, stage: str) -> int:
    """``-1`` (unlimited) or a non-negative int, as torch's ``fork``/``demux`` accept."""
    if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size < -1:
        raise ValueError(f"{stage}: buffer_size must be a non-negative int or -1 (unlimited), got {buffer_size!r}")
    return buffer_size


# --------------------------------------------------------------------------- zip_longest / mux_longest


@functional_datapipe("zip_longest")
class ZipperLongest(_Resumable, IterDataPipe):
    """Zip the sources into tuples until all of them are exhausted (functional name: ``zip_longest``).

    Once a source is exhausted its place in the tuples is taken by
    ``fill_value``.  Like :func:`itertools.zip_longest`.

    Resumable: the snapshot is the set of exhausted sources.

    Args:
        *datapipes: the sources.
        fill_value: stands in for the items of exhausted sources (keyword only).

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> dp1, dp2, dp3 = IterableWrapper(range(3)), IterableWrapper(range(10, 15)), IterableWrapper(range(20, 25))
        >>> list(dp1.zip_longest(dp2, dp3))
        [(0, 10, 20), (1, 11, 21), (2, 12, 22), (None, 13, 23), (None, 14, 24)]
        >>> list(dp1.zip_longest(dp2, dp3, fill_value=-1))
        [(0, 10, 20), (1, 11, 21), (2, 12, 22), (-1, 13, 23), (-1, 14, 24)]
    """

    _runtime = ("_finished",)

    def __init__(self, *datapipes: IterDataPipe, fill_value: Any = None) -> None:
        super().__init__()
        _check_pipes(datapipes, "zip_longest")
        self.datapipes = datapipes
        self.fill_value = fill_value
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._finished: set[int] = set()

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        state = self._take_restore()
        self._finished = set(state["finished"]) if state is not None else set()
        n = len(self.datapipes)
        iterators = [None if i in self._finished else iter(dp) for i, dp in enumerate(self.datapipes)]
        while len(self._finished) < n:
            values = []
            for i, it in enumerate(iterators):
                value = self.fill_value
                if i not in self._finished:
                    try:
                        value = next(it)  # type: ignore[arg-type]
                    except StopIteration:
                        self._finished.add(i)
                        if len(self._finished) == n:
                            return
                values.append(value)
            yield tuple(values)

    def state_dict(self) -> dict[str, Any]:
        if self._restore is not None:
            return self._restore
        return {"finished": sorted(self._finished)}

    def __len__(self) -> int:
        return max(len(dp) for dp in self.datapipes)


@functional_datapipe("mux_longest")
class MultiplexerLongest(_Resumable, IterDataPipe):
    """Take one item from each source in turn, skipping exhausted ones, until all are exhausted.

    (functional name: ``mux_longest``).  Unlike torch's ``mux``, which stops
    at the shortest source, every item of every source is yielded.

    Resumable: the snapshot is the set of exhausted sources and whose turn is next.

    Args:
        *datapipes: the sources.

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> dp1, dp2, dp3 = IterableWrapper(range(5)), IterableWrapper(range(10, 15)), IterableWrapper(range(20, 25))
        >>> list(dp1.mux_longest(dp2, dp3))
        [0, 10, 20, 1, 11, 21, 2, 12, 22, 3, 13, 23, 4, 14, 24]
        >>> list(IterableWrapper(range(3)).mux_longest(IterableWrapper("a")))
        [0, 'a', 1, 2]
    """

    _runtime = ("_finished", "_next")

    def __init__(self, *datapipes: IterDataPipe) -> None:
        super().__init__()
        _check_pipes(datapipes, "mux_longest")
        self.datapipes = datapipes
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._finished: set[int] = set()
        self._next = 0

    def __iter__(self) -> Iterator[Any]:
        state = self._take_restore()
        self._finished = set(state["finished"]) if state is not None else set()
        start = int(state["next"]) if state is not None else 0
        n = len(self.datapipes)
        iterators = [None if i in self._finished else iter(dp) for i, dp in enumerate(self.datapipes)]
        while len(self._finished) < n:
            for i in range(start, n):
                if i in self._finished:
                    continue
                try:
                    value = next(iterators[i])  # type: ignore[arg-type]
                except StopIteration:
                    self._finished.add(i)
                    continue
                self._next = i + 1
                yield value
            start = 0

    def state_dict(self) -> dict[str, Any]:
        if self._restore is not None:
            return self._restore
        return {"finished": sorted(self._finished), "next": self._next}

    def __len__(self) -> int:
        return sum(len(dp) for dp in self.datapipes)


# --------------------------------------------------------------------------- key zippers


@functional_datapipe("zip_with_iter")
class IterKeyZipper(_Resumable, IterDataPipe):
    """Join each source item with the item of ``ref_datapipe`` that has the same key.

    (functional name: ``zip_with_iter``).  Output follows the order of the
    source.  For each source item, ``ref_datapipe`` is read until the item with
    a matching key turns up; reference items read on the way wait in a buffer
    of at most ``buffer_size`` items (the oldest is dropped with a warning when
    it is full).  A source key that never turns up raises ``BufferError``; a
    key seen twice in the buffer raises ``ValueError``.

    Resumable: the snapshot holds the buffered reference items.

    Args:
        source_datapipe: the pipe whose order is kept.
        ref_datapipe: the pipe searched for matching keys.
        key_fn: computes the key of a source item.
        ref_key_fn: computes the key of a reference item (default: ``key_fn``).
        keep_key: yield ``(key, merged)`` instead of ``merged``.
        buffer_size: the most reference items held while searching (> 0), or
            ``None`` for no limit.
        merge_fn: combines ``(source_item, ref_item)``; default: a tuple.

    Example:
        >>> from operator import itemgetter
        >>> from pipekit.pipes import IterableWrapper
        >>> def merge_fn(t1, t2):
        ...     return t1[1] + t2[1]
        >>> dp1 = IterableWrapper([("a", 100), ("b", 200), ("c", 300)])
        >>> dp2 = IterableWrapper([("a", 1), ("b", 2), ("c", 3), ("d", 4)])
        >>> res_dp = dp1.zip_with_iter(dp2, key_fn=itemgetter(0), ref_key_fn=itemgetter(0),
        ...                            keep_key=True, merge_fn=merge_fn)
        >>> list(res_dp)
        [('a', 101), ('b', 202), ('c', 303)]
    """

    _runtime = ("_buffer", "_warned")

    def __init__(
        self,
        source_datapipe: IterDataPipe,
        ref_datapipe: IterDataPipe,
        key_fn: Callable[[Any], Hashable],
        ref_key_fn: Callable[[Any], Hashable] | None = None,
        keep_key: bool = False,
        buffer_size: int | None = 10000,
        merge_fn: Callable[[Any, Any], Any] | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(ref_datapipe, IterDataPipe):
            raise TypeError(f"zip_with_iter: ref_datapipe must be an IterDataPipe, got {type(ref_datapipe).__name__}")
        _check_callable(key_fn, "zip_with_iter", "key_fn")
        if ref_key_fn is not None:
            _check_callable(ref_key_fn, "zip_with_iter", "ref_key_fn")
        if merge_fn is not None:
            _check_callable(merge_fn, "zip_with_iter", "merge_fn")
        if buffer_size is not None and (
            isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size <= 0
        ):
            raise ValueError(f"zip_with_iter: buffer_size must be a positive int or None, got {buffer_size!r}")
        self.source_datapipe = source_datapipe
        self.ref_datapipe = ref_datapipe
        self.key_fn = key_fn
        self.ref_key_fn = key_fn if ref_key_fn is None else ref_key_fn
        self.keep_key = keep_key
        self.buffer_size = buffer_size
        self.merge_fn = merge_fn
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._buffer: OrderedDict[Any, Any] = OrderedDict()
        self._warned = False

    def __iter__(self) -> Iterator[Any]:
        state = self._take_restore()
        buffer: OrderedDict[Any, Any] = OrderedDict(state["buffer"]) if state is not None else OrderedDict()
        self._buffer = buffer
        self._warned = bool(state["warned"]) if state is not None else False
        ref_it = iter(self.ref_datapipe)
        try:
            for data in self.source_datapipe:
                key = self.key_fn(data)
                while key not in buffer:
                    try:
                        ref_data = next(ref_it)
                    except StopIteration:
                        dropped = " (some reference items were dropped from a full buffer)" if self._warned else ""
                        raise BufferError(
                            f"zip_with_iter: no item with key {key!r} in ref_datapipe for source item "
                            f"{data!r:.200}{dropped}; check the keys or raise buffer_size"
                        ) from None
                    ref_key = self.ref_key_fn(ref_data)
                    if ref_key in buffer:
                        raise ValueError(f"zip_with_iter: duplicate key {ref_key!r} in ref_datapipe")
                    if self.buffer_size is not None and len(buffer) >= self.buffer_size:
                        if not self._warned:
                            self._warned = True
                            warnings.warn(
                                f"zip_with_iter: the buffer is full ({self.buffer_size} reference items); the "
                                "oldest items are dropped from now on. Consider raising buffer_size.",
                                stacklevel=2,
                            )
                        buffer.popitem(last=False)
                    buffer[ref_key] = ref_data
                ref_item = buffer.pop(key)
                res = self.merge_fn(data, ref_item) if self.merge_fn is not None else (data, ref_item)
                yield (key, res) if self.keep_key else res
        finally:
            if self._buffer is buffer:  # not if a newer iterator took over
                buffer.clear()

    def state_dict(self) -> dict[str, Any]:
        if self._restore is not None:
            return self._restore
        return {"buffer": list(self._buffer.items()), "warned": self._warned}

    def __len__(self) -> int:
        return len(self.source_datapipe)


@functional_datapipe("zip_with_map")
class MapKeyZipper(IterDataPipe):
    """Join each source item with ``map_datapipe[key_fn(item)]`` (functional name: ``zip_with_map``).

    A key missing from ``map_datapipe`` raises ``KeyError`` naming the item and key.

    Args:
        source_iterdatapipe: the pipe whose items are joined.
        map_datapipe: a MapDataPipe looked up by key.
        key_fn: maps a source item to a key of ``map_datapipe``.
        merge_fn: combines ``(source_item, map_item)``; default: a tuple.
        keep_key: yield ``(key, merged)`` instead of ``merged``.

    Example:
        >>> from operator import itemgetter
        >>> from pipekit.pipes import IterableWrapper, SequenceWrapper
        >>> def merge_fn(tuple_from_iter, value_from_map):
        ...     return tuple_from_iter[0], tuple_from_iter[1] + value_from_map
        >>> dp1 = IterableWrapper([("a", 1), ("b", 2), ("c", 3)])
        >>> mapdp = SequenceWrapper({"a": 100, "b": 200, "c": 300, "d": 400})
        >>> list(dp1.zip_with_map(map_datapipe=mapdp, key_fn=itemgetter(0), merge_fn=merge_fn))
        [('a', 101), ('b', 202), ('c', 303)]
    """

    stateless = True

    def __init__(
        self,
        source_iterdatapipe: IterDataPipe,
        map_datapipe: MapDataPipe,
        key_fn: Callable[[Any], Hashable],
        merge_fn: Callable[[Any, Any], Any] | None = None,
        keep_key: bool = False,
    ) -> None:
        super().__init__()
        if not isinstance(map_datapipe, MapDataPipe):
            raise TypeError(f"zip_with_map: map_datapipe must be a MapDataPipe, got {type(map_datapipe).__name__}")
        _check_callable(key_fn, "zip_with_map", "key_fn")
        if merge_fn is not None:
            _check_callable(merge_fn, "zip_with_map", "merge_fn")
        self.source_iterdatapipe = source_iterdatapipe
        self.map_datapipe = map_datapipe
        self.key_fn = key_fn
        self.merge_fn = merge_fn
        self.keep_key = keep_key

    def __iter__(self) -> Iterator[Any]:
        for item in self.source_iterdatapipe:
            key = self.key_fn(item)
            try:
                map_item = self.map_datapipe[key]
            except (KeyError, IndexError):
                raise KeyError(
                    f"zip_with_map: key_fn {_fn_name(self.key_fn)} maps {item!r:.200} to {key!r}, "
                    "which is not a key of map_datapipe"
                ) from None
            res = self.merge_fn(item, map_item) if self.merge_fn is not None else (item, map_item)
            yield (key, res) if self.keep_key else res

    def __len__(self) -> int:
        return len(self.source_iterdatapipe)


# --------------------------------------------------------------------------- SampleMultiplexer


class SampleMultiplexer(_Resumable, IterDataPipe):
    """Draw items from several sources at random, in proportion to their weights, until all are exhausted.

    Each step picks a source with probability proportional to its weight
    among the sources not yet exhausted.  To keep the ratio forever, make the
    sources endless (``cycle()``).  The same draws as torchdata, so a seeded run
    gives torchdata's output.

    Seeding: with ``seed``, the sampling is fixed by it (later epochs continue
    the same random stream) and the DataLoader's ``set_seed`` does not change
    it.  Without ``seed``, ``set_seed(seed)`` (called by the DataLoader with its
    shared seed) fixes the next epoch, and otherwise a seed is drawn from
    ``torch`` at the start of each epoch.

    Resumable: the snapshot holds the RNG state and the weights of the sources
    not yet exhausted.

    Args:
        pipes_to_weights_dict: ``{pipe: weight}`` with positive weights.
        seed: seed of the sampling (optional).

    Example:
        >>> from pipekit.pipes import IterableWrapper, SampleMultiplexer
        >>> source_dp1 = IterableWrapper([0] * 10)
        >>> source_dp2 = IterableWrapper([1] * 10)
        >>> d = {source_dp1: 99999999, source_dp2: 0.0000001}
        >>> list(SampleMultiplexer(pipes_to_weights_dict=d, seed=0))
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]
        >>> d = {IterableWrapper("ab"): 1, IterableWrapper(range(4)): 1}
        >>> list(SampleMultiplexer(d, seed=1))
        ['a', 0, 1, 'b', 2, 3]
    """

    _runtime = ("_live",)

    def __init__(self, pipes_to_weights_dict: dict[IterDataPipe, float], seed: int | None = None) -> None:
        super().__init__()
        if not isinstance(pipes_to_weights_dict, dict) or not pipes_to_weights_dict:
            raise ValueError("SampleMultiplexer: pipes_to_weights_dict must be a non-empty dict {pipe: weight}")
        total = 0.0
        for i, (dp, weight) in enumerate(pipes_to_weights_dict.items()):
            if not isinstance(dp, IterDataPipe):
                raise TypeError(f"SampleMultiplexer: key {i} must be an IterDataPipe, got {type(dp).__name__}")
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
                raise ValueError(f"SampleMultiplexer: weights must be positive numbers, got {weight!r}")
            total += weight
        self.pipes_and_weights = [(dp, w / total) for dp, w in pipes_to_weights_dict.items()]
        self._explicit_seed = seed is not None
        self._rng = random.Random(seed)
        self._seed: int | None = None
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._live: list[tuple[int, float]] = [(i, w) for i, (_, w) in enumerate(self.pipes_and_weights)]

    def set_seed(self, seed: int) -> SampleMultiplexer:
        """Seed the next epoch (ignored when the constructor was given a ``seed``)."""
        if not self._explicit_seed:
            self._seed = int(seed)
        return self

    def reset(self) -> None:
        if self._restore is not None:
            return  # __iter__ applies the pending restore
        if not self._explicit_seed:
            self._rng.seed(self._seed if self._seed is not None else _torch_seed())
            self._seed = None

    def __iter__(self) -> Iterator[Any]:
        state = self._take_restore()
        if state is not None:
            self._rng.setstate(state["rng"])
            self._live = [(int(i), float(w)) for i, w in state["live"]]
        else:
            self._init_runtime()
        iterators = {i: iter(self.pipes_and_weights[i][0]) for i, _ in self._live}
        while len(self._live) > 1:
            r = self._rng.random()
            s = 0.0
            chosen: tuple[int, float] | None = None
            for live in self._live:
                s += live[1]
                if r < s:
                    chosen = live
                    break
            if chosen is None:
                continue  # rounding left r above the last cumulative weight: draw again
            i, weight = chosen
            try:
                item = next(iterators[i])
            except StopIteration:
                new_total = 1 - weight
                if new_total <= 0:
                    new_total = sum(w for j, w in self._live if j != i)
                self._live = [(j, w / new_total) for j, w in self._live if j != i]
                continue
            yield item
        if self._live:
            i = self._live[0][0]
            for item in iterators[i]:
                yield item
            self._live = []

    def state_dict(self) -> dict[str, Any]:
        if self._restore is not None:
            return self._restore
        return {"rng": self._rng.getstate(), "live": list(self._live)}

    def __len__(self) -> int:
        return sum(len(dp) for dp, _ in self.pipes_and_weights)


# --------------------------------------------------------------------------- splitting into children


class _SplitContainer(_Resumable, IterDataPipe):
    """The shared state behind the children of ``round_robin_demux`` and ``unzip``.

    Reads the source on demand and routes each item to per-child buffers.  A
    child that starts a second iterator in the same epoch starts a new epoch
    for all children (older iterators of the other children then raise
    ``RuntimeError``), as torch's ``fork``/``demux`` do.  Not meant to be
    iterated itself.
    """

    _runtime = ("_buffers", "_source_it", "_exhausted", "_count", "_started", "_epoch", "_active")
    stage = "split"
    overflow = "sum"  # how buffered items count against buffer_size: "sum" of children or "max" lag

    def __init__(self, source_datapipe: IterDataPipe, num_children: int, buffer_size: int) -> None:
        super().__init__()
        self.main_datapipe = source_datapipe
        self.num_children = num_children
        self.buffer_size = buffer_size
        self._init_runtime()

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

    def start(self, child_id: int) -> int:
        """Begin iterating child ``child_id``; returns the epoch the child's iterator belongs to."""
        state = self._take_restore()
        if state is not None and state.get("active"):
            epoch = self._epoch + 1
            self._init_runtime()
            self._epoch, self._active = epoch, True
            self._buffers = [deque(b) for b in state["buffers"]]
            self._exhausted = bool(state["exhausted"])
            self._count = int(state["count"])
        elif state is not None or not self._active or self._started[child_id]:
            if self._active and not self._all_done():
                warnings.warn(
                    f"{self.stage}: child {child_id} started a new iterator before all children finished; "
                    "the buffers are reset and every child reads from the start again",
                    stacklevel=3,
                )
            epoch = self._epoch + 1
            self._init_runtime()
            self._epoch, self._active = epoch, True
        self._started[child_id] = True
        return self._epoch

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
                self._source_it = iter(self.main_datapipe)
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

    def state_dict(self) -> dict[str, Any]:
        if self._restore is not None:
            return self._restore
        if not self._active:
            return {"active": False}
        return {
            "active": True,
            "buffers": [list(b) for b in self._buffers],
            "exhausted": self._exhausted,
            "count": self._count,
        }


class _SplitChild(IterDataPipe):
    """One output of ``round_robin_demux`` / ``unzip``: reads its items from the shared container."""

    stateless = True  # the position lives in the container

    def __init__(self, main_datapipe: _SplitContainer, child_id: int) -> None:
        super().__init__()
        self.main_datapipe = main_datapipe
        self.child_id = child_id

    def __iter__(self) -> Iterator[Any]:
        epoch = self.main_datapipe.start(self.child_id)
        while True:
            ok, item = self.main_datapipe.next_for(self.child_id, epoch)
            if not ok:
                return
            yield item

    def __len__(self) -> int:
        return self.main_datapipe.child_length(self.child_id)


class _RoundRobinContainer(_SplitContainer):
    stage = "round_robin_demux"
    overflow = "sum"

    def _route(self, index: int, item: Any) -> list[tuple[int, Any]]:
        return [(index % self.num_children, item)]

    def child_length(self, child_id: int) -> int:
        n = len(self.main_datapipe)
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
        try:
            length = len(item)
        except TypeError:
            raise TypeError(f"unzip: item {index} is not a sequence: {item!r:.200}") from None
        if length != self.sequence_length:
            raise ValueError(
                f"unzip: item {index} has length {length}, expected sequence_length={self.sequence_length}: "
                f"{item!r:.200}"
            )
        return [(child, item[col]) for child, col in enumerate(self.columns)]

    def child_length(self, child_id: int) -> int:
        return len(self.main_datapipe)


@functional_datapipe("unzip")
class UnZipper(IterDataPipe):
    """Split a pipe of sequences into one pipe per position (functional name: ``unzip``).

    Returns a list of child pipes, one per column not in ``columns_to_skip``.
    Every item must have ``sequence_length`` elements (``ValueError``
    otherwise).  A child that reads ahead of the slowest child by more than
    ``buffer_size`` items raises ``BufferError``.

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
        if isinstance(sequence_length, bool) or not isinstance(sequence_length, int) or sequence_length < 1:
            raise ValueError(f"unzip: sequence_length must be a positive int, got {sequence_length!r}")
        _check_buffer_size(buffer_size, "unzip")
        skips = set(columns_to_skip or ())
        bad = [c for c in skips if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < sequence_length]
        if bad:
            raise ValueError(f"unzip: columns_to_skip must be ints in [0, {sequence_length}), got {sorted(bad)}")
        columns = [i for i in range(sequence_length) if i not in skips]
        if not columns:
            raise ValueError(
                f"unzip: columns_to_skip={sorted(skips)} skips every column of sequence_length={sequence_length}"
            )
        container = _UnZipContainer(source_datapipe, sequence_length, columns, buffer_size)
        return [_SplitChild(container, i) for i in range(len(columns))]


# --------------------------------------------------------------------------- random_split


class _RandomSplitContainer(_Resumable, IterDataPipe):
    """The shared draw state behind the children of ``random_split``."""

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
        state = self._take_restore()
        if state is not None and state.get("active"):
            self._rng.setstate(state["rng"])
            self.weights = list(state["weights"])
            self.remaining_length = int(state["remaining"])
        else:
            self._rng = random.Random(self._seed)
            self.weights = self.norm_weights.copy()
            self.remaining_length = self.total_length
        self._epoch += 1
        self._active = True
        return self._epoch

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

    def state_dict(self) -> dict[str, Any]:
        if self._restore is not None:
            return self._restore
        if not self._active:
            return {"active": False}
        return {
            "active": True,
            "rng": self._rng.getstate(),
            "weights": list(self.weights),
            "remaining": self.remaining_length,
        }


class SplitterIterator(IterDataPipe):
    """One split of ``random_split``: the source items drawn for ``target``."""

    stateless = True  # the draw state lives in the container

    def __init__(self, main_datapipe: _RandomSplitContainer, target: Any) -> None:
        super().__init__()
        self.main_datapipe = main_datapipe
        self.target = target

    def __iter__(self) -> Iterator[Any]:
        main = self.main_datapipe
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
        self.main_datapipe.override_seed(seed)
        return self

    def __len__(self) -> int:
        return self.main_datapipe.get_length(self.target)


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


# --------------------------------------------------------------------------- map <-> iter converters


@functional_datapipe("to_map_datapipe", on="iter")
class IterToMapConverter(MapDataPipe):
    """Turn an IterDataPipe of key-value pairs into a MapDataPipe (functional name: ``to_map_datapipe``).

    The source is read on the first lookup (or ``len()`` when the source has
    none) and kept in a dict.  Items must be ``(key, value)`` pairs, or
    ``key_value_fn`` must turn them into pairs; a later duplicate key replaces
    the earlier value, with a warning.  A missing key raises ``IndexError``
    (so ``list(map_dp)`` works on integer keys ``0..n-1``).

    Resume: the snapshot only says whether the table was loaded.  Its source
    is restored to where it was (its end, once the table is loaded), so a
    restored converter first drains the source's restored remainder, then reads
    the source again from its start to rebuild the table.

    Args:
        datapipe: the source IterDataPipe.
        key_value_fn: maps an item to a ``(key, value)`` pair.

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> list(IterableWrapper([(i, i) for i in range(10)]).to_map_datapipe())
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
        >>> map_dp2 = IterableWrapper([("a", 1), ("b", 2), ("c", 1)]).to_map_datapipe()
        >>> map_dp2["a"]
        1
        >>> def row_to_tuple(row):
        ...     return row[0], row[1:]
        >>> dp3 = IterableWrapper([("a", 1, 1, 1), ("b", 2, 2, 2)]).to_map_datapipe(key_value_fn=row_to_tuple)
        >>> dp3["a"]
        (1, 1, 1)
    """

    _restore: dict[str, Any] | None = None

    def __init__(self, datapipe: IterDataPipe, key_value_fn: Callable[[Any], tuple[Any, Any]] | None = None) -> None:
        super().__init__()
        if not isinstance(datapipe, IterDataPipe):
            raise TypeError(f"to_map_datapipe: datapipe must be an IterDataPipe, got {type(datapipe).__name__}")
        if key_value_fn is not None:
            _check_callable(key_value_fn, "to_map_datapipe", "key_value_fn")
        self.datapipe = datapipe
        self.key_value_fn = key_value_fn
        self._map: dict[Any, Any] | None = None

    def _load_map(self) -> dict[Any, Any]:
        restore, self._restore = self._restore, None
        if restore is not None and restore.get("loaded"):
            for _ in self.datapipe:  # the restored source continues from the snapshot: skip to its end
                pass
        table: dict[Any, Any] = {}
        for i, item in enumerate(self.datapipe):
            pair = item if self.key_value_fn is None else self.key_value_fn(item)
            try:
                length = len(pair)
            except TypeError:
                raise TypeError(
                    f"to_map_datapipe: item {i} is not a (key, value) pair: {type(pair).__name__} {pair!r:.200}"
                ) from None
            if length != 2:
                raise ValueError(f"to_map_datapipe: item {i} has {length} elements, 2 are required: {pair!r:.200}")
            key, value = pair
            if key in table:
                warnings.warn(f"to_map_datapipe: duplicate key {key!r}; the later value wins", stacklevel=2)
            table[key] = value
        self._map = table
        return table

    def __getitem__(self, index: Any) -> Any:
        table = self._map if self._map is not None else self._load_map()
        try:
            return table[index]
        except KeyError:
            raise IndexError(f"to_map_datapipe: no key {index!r}") from None

    def __len__(self) -> int:
        if self._map is not None:
            return len(self._map)
        try:
            return len(self.datapipe)
        except TypeError:
            pass
        return len(self._load_map())

    def state_dict(self) -> dict[str, Any]:
        if self._restore is not None:
            return self._restore
        return {"loaded": self._map is not None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._restore = state
        self._map = None




@functional_datapipe("to_iter_datapipe", on="map")
class MapToIterConverter(_Resumable, IterDataPipe):
    """Turn a MapDataPipe into an IterDataPipe (functional name: ``to_iter_datapipe``).

    Yields ``datapipe[i]`` for each ``i`` of ``indices`` (default:
    ``range(len(datapipe))``).

    Resumable: the snapshot is the number of indices done.

    Args:
        datapipe: the source MapDataPipe.
        indices: the keys to look up, in order.

    Example:
        >>> from pipekit.pipes import SequenceWrapper
        >>> list(SequenceWrapper(range(10)).to_iter_datapipe())
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
        >>> list(SequenceWrapper({"a": 1, "b": 2, "c": 3}).to_iter_datapipe(indices=["a", "b", "c"]))
        [1, 2, 3]
    """

    _runtime = ("_pos",)

    def __init__(self, datapipe: MapDataPipe, indices: Sequence[Any] | None = None) -> None:
        super().__init__()
        if not isinstance(datapipe, MapDataPipe):
            raise TypeError(f"to_iter_datapipe: datapipe must be a MapDataPipe, got {type(datapipe).__name__}")
        self.datapipe = datapipe
        self.indices = list(indices) if indices is not None else range(len(datapipe))
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._pos = 0

    def __iter__(self) -> Iterator[Any]:
        state = self._take_restore()
        self._pos = int(state["pos"]) if state is not None else 0
        while self._pos < len(self.indices):
            index = self.indices[self._pos]
            self._pos += 1
            yield self.datapipe[index]

    def state_dict(self) -> dict[str, Any]:
        if self._restore is not None:
            return self._restore
        return {"pos": self._pos}

    def __len__(self) -> int:
        return len(self.indices)


