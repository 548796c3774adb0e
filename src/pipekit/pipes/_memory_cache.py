"""Caching in memory: ``in_memory_cache``.

:class:`InMemoryCacheHolder` keeps the items of the first epoch in memory (up
to a size limit) and serves later epochs from there.  ``in_memory_cache`` on
map-style pipes is :class:`pipekit.pipes._mapstyle.MapInMemoryCacheHolder`.
"""

from __future__ import annotations

import itertools
import logging
import numbers
import sys
from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

from pipekit.pipes.base import IterDataPipe, functional_datapipe
from pipekit.pipes.state import ResumablePipe

__all__ = ["InMemoryCacheHolder"]

logger = logging.getLogger("pipekit")


def _sizeof(obj: Any, seen: set[int] | None = None) -> int:
    """Approximate memory held by ``obj`` in bytes (tensor and array data included)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return sys.getsizeof(obj) + obj.element_size() * obj.nelement()
    if isinstance(obj, np.ndarray):
        return sys.getsizeof(obj) + (obj.nbytes if obj.base is not None else 0)
    if isinstance(obj, (str, bytes, bytearray, int, float, bool, type(None))):
        return sys.getsizeof(obj)
    size = sys.getsizeof(obj)
    if isinstance(obj, Mapping):
        size += sum(_sizeof(k, seen) + _sizeof(v, seen) for k, v in obj.items())
    elif isinstance(obj, (list, tuple, set, frozenset, deque)):
        size += sum(_sizeof(v, seen) for v in obj)
    elif hasattr(obj, "__dict__"):
        size += _sizeof(vars(obj), seen)
    return size


class CacheSnapshot:
    """A position of :class:`InMemoryCacheHolder` that refers to its cache: the state dict when materialized.

    ``items[start:end]`` are the cached items at the time it was taken (the
    cache's list is only appended to, or replaced), copied only by
    :meth:`materialize` or when pickled.
    """

    __slots__ = ("base", "end", "evicted", "items", "start")

    def __init__(self, base: dict[str, Any], items: list[Any], start: int, end: int, evicted: int) -> None:
        self.base, self.items, self.start, self.end, self.evicted = base, items, start, end, evicted

    def materialize(self) -> dict[str, Any]:
        """``{"mode", "pos", "pulled", "items", "evicted"}``: the state it stands for."""
        return {**self.base, "items": self.items[self.start:self.end], "evicted": self.evicted}

    def __reduce__(self) -> Any:
        return (dict, (self.materialize(),))


@functional_datapipe("in_memory_cache")
class InMemoryCacheHolder(ResumablePipe):
    """Keep the items in memory after the first epoch (functional name: ``in_memory_cache``).

    The first epoch yields the items from upstream while storing them.  When
    the stored items exceed ``size`` megabytes (tensor and array data
    included), the least recently stored ones are evicted, so the cache keeps
    the *last* items of the epoch (torchdata's policy: an LRU cache would
    thrash on sequential epochs).  Once an epoch has run to its end the cache
    is frozen, and each later epoch

    * re-reads the evicted items from upstream (it iterates upstream and stops
      after as many items as were evicted; nothing is re-read when everything
      fit), then
    * yields the cached items.

    So upstream must yield the same items in the same order every epoch when
    the cache does not hold everything: shuffle *after* this pipe.  An epoch
    stopped early caches nothing; the next one fills the cache again.  The
    cache lives in this process: a pickled copy (a DataLoader worker) starts
    empty, so use ``persistent_workers=True`` for it to last across epochs.

    Differences from torchdata: torchdata measured the size of its deque
    object only (not the items), evicted at most one item per new item, and
    pickled the cache along with the pipe.

    Length: the source's; over a source without a length, once an epoch has
    run to its end and the cache is loaded, the number of items that epoch
    had (as torchdata), and ``TypeError`` before.

    Checkpoints hold the position and the items cached so far (at most
    ``size`` megabytes: what this process holds anyway), so a restored copy
    finishes the epoch and then serves the same items as the uninterrupted
    run, also when upstream is random (a shuffle, augmentation) and would give
    other items if read again.  A checkpoint taken at the end of an epoch
    (with no workers, or persistent ones) holds the frozen cache of each
    process, so the resumed run's next epoch is served from it too.  A worker keeps its positions by reference to
    the cache (nothing is copied per batch) and pickles the items only when a
    checkpoint is sent.

    Args:
        source_dp: the items.
        size: the most megabytes to keep (``1 MB = 2**20`` bytes); None for no limit.

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> dp = IterableWrapper(range(5)).in_memory_cache(size=5)
        >>> list(dp), list(dp)
        ([0, 1, 2, 3, 4], [0, 1, 2, 3, 4])
    """

    state_keys = ("mode", "pos", "pulled")
    keeps_across_epochs = True  # the frozen cache: an end-of-epoch checkpoint carries it (carry_over)
    # a pickled copy (a DataLoader worker) starts empty
    _runtime = ("_cache", "_evicted", "_nbytes", "_store", "_head", "_sizes", "_fill_nbytes", "_fill_evicted",
                "_restored")

    def __init__(self, source_dp: IterDataPipe, size: float | None = None) -> None:
        if size is not None:
            if isinstance(size, bool) or not isinstance(size, numbers.Real):
                raise TypeError(f"in_memory_cache: size must be a number of megabytes, got {type(size).__name__}")
            if size <= 0:
                raise ValueError(f"in_memory_cache: size must be positive, got {size}")
        self.source_datapipe = source_dp
        self.size = size
        self._limit = None if size is None else int(size * 1024 * 1024)
        self._mode = "fill"
        self._pos = 0  # items of this epoch yielded (or skipped on resume)
        self._pulled = 0  # items taken from upstream's current iterator this epoch
        self._resuming = False  # this epoch continues a loaded checkpoint
        self._drop_cache()

    @property
    def source_dp(self) -> IterDataPipe:
        """The source pipe (torchdata's attribute name for ``source_datapipe``)."""
        return self.source_datapipe

    def _init_runtime(self) -> None:
        self._drop_cache()

    def _drop_cache(self) -> None:
        self._cache: list[Any] | None = None  # frozen once an epoch ran to its end
        self._evicted = 0
        self._nbytes = 0
        self._restored: tuple[list[Any], int] | None = None  # the items and evictions of a loaded state
        self._start_store([], 0)

    def _start_store(self, items: list[Any], evicted: int) -> None:
        """Begin filling with ``items`` (cached before a checkpoint) after ``evicted`` evictions.

        The epoch being filled lives in ``_store[_head:]``: the list is only appended to (eviction moves
        ``_head``; a new list replaces it when half of it is evicted), so a position can refer to it, and a
        frozen cache is never changed, so positions taken while serving refer to it as well.
        """
        self._store: list[Any] = list(items)
        self._head = 0
        self._sizes: deque[int] = deque(_sizeof(item) for item in self._store)
        self._fill_nbytes = sum(self._sizes)
        self._fill_evicted = evicted
        self._evict()

    def _evict(self) -> None:
        while self._limit is not None and self._fill_nbytes > self._limit and self._sizes:
            self._fill_nbytes -= self._sizes.popleft()
            self._head += 1
            self._fill_evicted += 1
        if self._head and self._head * 2 >= len(self._store):
            self._store, self._head = self._store[self._head:], 0

    @property
    def cached_items(self) -> int:
        """How many items the frozen cache holds (0 before an epoch completes)."""
        return len(self._cache) if self._cache is not None else 0

    @property
    def cached_bytes(self) -> int:
        """The approximate size of the frozen cache in bytes."""
        return self._nbytes if self._cache is not None else 0

    def lazy_state_dict(self) -> Any:
        """What :meth:`state_dict` returns, as an object that becomes it when materialized or pickled: O(1)."""
        if self._pending is not None:
            return self.state_dict()
        base = {"mode": self._mode, "pos": self._pos, "pulled": self._pulled}
        if self._mode == "serve" and self._cache is not None:
            return CacheSnapshot(base, self._cache, 0, len(self._cache), self._evicted)
        if self._mode == "fill":
            return CacheSnapshot(base, self._store, self._head, len(self._store), self._fill_evicted)
        return base  # continuing an old checkpoint that held no items: nothing is cached this epoch

    def state_dict(self) -> dict[str, Any]:
        state = self.lazy_state_dict()
        return state.materialize() if isinstance(state, CacheSnapshot) else dict(state)

    def restore(self, state: dict[str, Any] | None) -> None:
        self._resuming = state is not None
        self._restored = None
        if state is not None:
            self._mode, self._pos, self._pulled = state["mode"], int(state["pos"]), int(state["pulled"])
            if state.get("items") is not None:
                self._restored = (list(state["items"]), int(state.get("evicted", 0)))

    def check_state(self, state: dict[str, Any]) -> None:
        if state["mode"] not in ("fill", "serve", "stream"):
            raise ValueError(f"not an in_memory_cache state (mode {state['mode']!r}): {state!r:.200}")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._drop_cache()  # a restored copy serves nothing from a cache filled before the checkpoint

    def carry_over(self, state: dict[str, Any]) -> None:
        """Serve the next epoch from the cache ``state`` holds once it is frozen (``"serve"``), as this pipe would.

        An epoch that ended (or a checkpoint taken at its end) leaves the cache
        frozen; a position still filling it is of an epoch stopped early, which
        caches nothing.
        """
        if state.get("mode") == "serve" and state.get("items") is not None:
            items = list(state["items"])
            self._cache, self._evicted = items, int(state.get("evicted", 0))
            self._nbytes = sum(_sizeof(item) for item in items)

    def __iter__(self) -> Iterator[Any]:
        if self._resuming:
            yield from self._resume()
        elif self._cache is not None:
            yield from self._serve(self._cache, self._evicted)
        else:
            self._start_store([], 0)  # an epoch stopped early left what it had read
            yield from self._fill()

    def _fill(self, it: Iterator[Any] | None = None, skip: int = 0, pulled: int = 0) -> Iterator[Any]:
        """Read upstream (``it``, or a new iterator) into the cache; the first ``skip`` items are not yielded.

        ``pulled``: the items of this epoch already in the store (a restored position), counted as read.
        """
        self._mode, self._pos, self._pulled = "fill", pulled, pulled
        for item in self.source_datapipe if it is None else it:
            self._pulled += 1
            self._store.append(item)
            size = _sizeof(item)
            self._sizes.append(size)
            self._fill_nbytes += size
            self._evict()
            self._pos = self._pulled
            if self._pulled > skip:
                yield item
        self._cache, self._evicted, self._nbytes = self._store[self._head:], self._fill_evicted, self._fill_nbytes
        self._start_store([], 0)
        # Upstream has ended and the cache is frozen: a position taken now (a pipe downstream still yields
        # what it buffered) is the end of an epoch served from it, so the restored copy serves it next.
        self._mode = "serve"

    def _serve(self, cache: list[Any], evicted: int, pos: int = 0, pulled: int = 0) -> Iterator[Any]:
        """An epoch from the frozen ``cache``: the ``evicted`` first items re-read from upstream, then the cache.

        ``pos`` and ``pulled``: where a restored position is (items yielded, items read from upstream).
        """
        self._cache, self._evicted = cache, evicted
        self._mode, self._pos, self._pulled = "serve", pos, pulled
        if self._pulled < evicted:
            for item in self.source_datapipe:  # a restored iterator continues after the items it gave
                self._pulled += 1
                self._pos += 1
                yield item
                if self._pulled >= evicted:
                    break
        for item in itertools.islice(cache, max(0, self._pos - evicted), None):
            self._pos += 1
            yield item

    def _stream(self, skip: int) -> Iterator[Any]:
        """Continue an epoch from upstream's restored iterator, without caching."""
        self._mode = "stream"
        for item in self.source_datapipe:
            self._pulled += 1
            if skip > 0:
                skip -= 1
                continue
            self._pos += 1
            yield item

    def _resume(self) -> Iterator[Any]:
        """Continue the epoch at the restored position (``restore`` set ``_mode``, ``_pos``, ``_pulled``)."""
        mode, pos, pulled = self._mode, self._pos, self._pulled
        restored, self._restored = self._restored, None
        if restored is not None:
            items, evicted = restored
            if mode == "serve":
                self._nbytes = sum(_sizeof(item) for item in items)
                yield from self._serve(items, evicted, pos, pulled)
            else:  # filling: the items cached so far, then the rest from upstream's restored iterator
                self._start_store(items, evicted)
                yield from self._fill(iter(self.source_datapipe), pulled=pulled)
        elif mode == "serve" and pulled == 0:
            # A checkpoint without the cached items (an older pipekit's): the epoch was served from the
            # cache without touching upstream, whose restored iterator is therefore at the end of an earlier
            # epoch: drain it, then re-read the epoch from the start, rebuilding the cache on the way.
            leftover = sum(1 for _ in self.source_datapipe)
            if leftover:
                logger.warning("in_memory_cache: discarded %d stale items from upstream on resume", leftover)
            self._start_store([], 0)
            yield from self._fill(skip=pos)
        else:
            # Upstream's restored iterator continues right after the `pulled` items this
            # epoch already took from it.
            yield from self._stream(skip=pos - pulled)

    def __len__(self) -> int:
        try:
            return len(self.source_datapipe)
        except TypeError:
            if self._cache is None:
                raise TypeError(
                    f"{type(self).__name__} instance doesn't have valid length until the cache is loaded "
                    "(its source has no length)"
                ) from None
            return self._evicted + len(self._cache)  # re-read from upstream, then served from the cache
