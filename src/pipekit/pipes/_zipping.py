"""Pipes that join sources item by item: ``zip_longest``, ``zip_with_iter``, ``zip_with_map``.

torchdata 0.9's ``zip_longest`` (:class:`ZipperLongest`), ``zip_with_iter``
(:class:`IterKeyZipper`) and ``zip_with_map`` (:class:`MapKeyZipper`) under
the same class names, arguments and outputs.

Resume: ``zip_longest`` records which sources are exhausted, ``zip_with_iter``
the reference items waiting in its key buffer; ``zip_with_map`` holds nothing
between items.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any

from pipekit.pipes._callables import _check_callable, _fn_name
from pipekit.pipes.base import IterDataPipe, MapDataPipe, functional_datapipe
from pipekit.pipes.state import ResumablePipe

__all__ = ["IterKeyZipper", "MapKeyZipper", "ZipperLongest"]


def _check_pipes(datapipes: Sequence[Any], stage: str) -> None:
    if not datapipes:
        raise ValueError(f"{stage}: expected at least one IterDataPipe")
    for i, dp in enumerate(datapipes):
        if not isinstance(dp, IterDataPipe):
            raise TypeError(f"{stage}: input {i} must be an IterDataPipe, got {type(dp).__name__}")


@functional_datapipe("zip_longest")
class ZipperLongest(ResumablePipe):
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

    state_keys = ("finished",)
    _runtime = ("_finished",)

    def __init__(self, *datapipes: IterDataPipe, fill_value: Any = None) -> None:
        super().__init__()
        _check_pipes(datapipes, "zip_longest")
        self.datapipes = datapipes
        self.fill_value = fill_value
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._finished: set[int] = set()

    def state_dict(self) -> dict[str, Any]:
        return {"finished": sorted(self._finished)}

    def restore(self, state: dict[str, Any] | None) -> None:
        self._finished = set(state["finished"]) if state is not None else set()

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
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

    def __len__(self) -> int:
        return max(len(dp) for dp in self.datapipes)


@functional_datapipe("zip_with_iter")
class IterKeyZipper(ResumablePipe):
    """Join each source item with the item of ``ref_datapipe`` that has the same key.

    (functional name: ``zip_with_iter``).  Output follows the order of the
    source.  For each source item, ``ref_datapipe`` is read until the item with
    a matching key turns up; reference items read on the way wait in a buffer.
    Once it holds more than ``buffer_size`` items, the oldest is dropped (with
    a warning, once) before the next one is added, so it holds up to
    ``buffer_size + 1`` items while searching, exactly as torchdata's (whose
    results this keeps).  A source key that never turns up raises
    ``BufferError``, as in torchdata; a key seen twice in the buffer raises
    ``ValueError``.

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

    state_keys = ("buffer", "warned")
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

    def state_dict(self) -> dict[str, Any]:
        return {"buffer": list(self._buffer.items()), "warned": self._warned}

    def restore(self, state: dict[str, Any] | None) -> None:
        # A new buffer for each iterator: an older iterator's cleanup must not clear it.
        self._buffer = OrderedDict(state["buffer"]) if state is not None else OrderedDict()
        self._warned = bool(state["warned"]) if state is not None else False

    def __iter__(self) -> Iterator[Any]:
        buffer = self._buffer
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
                    if self.buffer_size is not None and len(buffer) > self.buffer_size:
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
        self.source_datapipe = source_iterdatapipe
        self.map_datapipe = map_datapipe
        self.key_fn = key_fn
        self.merge_fn = merge_fn
        self.keep_key = keep_key

    @property
    def source_iterdatapipe(self) -> IterDataPipe:
        """The source pipe (torchdata's attribute name for ``source_datapipe``)."""
        return self.source_datapipe

    def __iter__(self) -> Iterator[Any]:
        for item in self.source_datapipe:
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
        return len(self.source_datapipe)
