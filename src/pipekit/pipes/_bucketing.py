"""Batching by length: ``bucketbatch``, ``max_token_bucketize`` and ``in_batch_shuffle``.

torchdata 0.9's pipes with the same class names, functional names, arguments
and semantics, rewritten as single resumable pipes on :mod:`pipekit.pipes.state`:
each keeps its buffers (and the random ones their generator's state) in
``state_dict()`` so that a checkpointed pipeline resumes exactly (see
:mod:`pipekit.pipes._resume`).

The random pipes (``bucketbatch``, ``in_batch_shuffle``) are
:class:`~pipekit.pipes.state.SeededPipe`: they draw a fresh seed from torch's
generator at the start of each epoch, unless :meth:`set_seed` was called
(torch's DataLoader calls it with a seed shared by all workers); like torch's
``Shuffler``, a seed given with ``set_seed`` applies to the next shuffled
epoch only, and ``set_shuffle(False)`` turns the shuffling off.
"""

from __future__ import annotations

import heapq
import numbers
import reprlib
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from pipekit._validate import check_int
from pipekit.errors import SkipLog, StageError
from pipekit.pipes.base import IterDataPipe, functional_datapipe
from pipekit.pipes.state import ResumablePipe, ShufflingPipe

__all__ = ["BucketBatcher", "InBatchShuffler", "MaxTokenBucketizer"]




@functional_datapipe("in_batch_shuffle")
class InBatchShuffler(ShufflingPipe):
    """Shuffle the items inside each batch (functional name: ``in_batch_shuffle``).

    Each batch (a list) from upstream is yielded as a new list holding the
    same items in random order; the order of the batches is unchanged.

    Args:
        datapipe: a pipe yielding batches (lists or other sequences).

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> dp = IterableWrapper(range(10)).batch(batch_size=3, drop_last=True).in_batch_shuffle()
        >>> _ = dp.set_seed(0)
        >>> list(dp)
        [[1, 2, 0], [4, 5, 3], [7, 8, 6]]
    """

    def __init__(self, datapipe: IterDataPipe) -> None:
        super().__init__()
        self.source_datapipe = datapipe
        self._enabled = True

    @property
    def datapipe(self) -> IterDataPipe:
        """The source pipe (torchdata's name for :attr:`source_datapipe`)."""
        return self.source_datapipe

    def __iter__(self) -> Iterator[list[Any]]:
        for batch in self.source_datapipe:
            if not self._enabled:
                yield batch
                continue
            try:
                items = list(batch)
            except TypeError as exc:
                raise TypeError(
                    f"in_batch_shuffle: expected batches (lists of items), got a {type(batch).__name__}"
                ) from exc
            yield self.rng.sample(items, len(items))

    def __len__(self) -> int:
        return len(self.source_datapipe)


@functional_datapipe("bucketbatch")
class BucketBatcher(ShufflingPipe):
    """Batch items that are similar according to ``sort_key`` (functional name: ``bucketbatch``).

    The stream is processed in the stages torchdata 0.9 chained together, with
    ``bucket_size = batch_size * batch_num`` and ``pool_size = bucket_size * bucket_num``:

    1. **pool shuffle** (only when ``bucket_num > 1`` or ``sort_key`` is None):
       with ``use_in_batch_shuffle=True`` the stream is cut into pools of
       ``pool_size`` items and each pool is shuffled; otherwise a shuffle buffer
       of ``pool_size`` items (torch's ``shuffle``) is used.
    2. **sort** (only with ``sort_key``): the stream is cut into buckets of
       ``bucket_size`` items (the last one may be shorter) and ``sort_key`` is
       called with each bucket *as a list* and must return the list sorted
       (e.g. ``lambda bucket: sorted(bucket, key=len)``).
    3. **batch**: consecutive items form batches of ``batch_size``; the last,
       shorter batch is dropped when ``drop_last`` is True.  Bucket sizes are
       multiples of ``batch_size``, so no batch spans two buckets.
    4. **batch shuffle** (only with ``sort_key``): with
       ``use_in_batch_shuffle=True``, each run of ``bucket_num`` consecutive
       batches is shuffled; otherwise a shuffle buffer of ``bucket_size``
       batches is used.

    As in torchdata, with a ``sort_key``, ``bucket_num=1`` and
    ``use_in_batch_shuffle=True`` (the defaults) nothing is shuffled: the
    batches come out in sorted order, bucket by bucket.  Pass
    ``use_in_batch_shuffle=False`` or ``bucket_num > 1`` to shuffle them.

    Args:
        datapipe: the items.
        batch_size: items per batch.
        drop_last: drop the last batch if it is shorter than ``batch_size``.
        batch_num: batches per bucket.
        bucket_num: buckets per shuffling pool.
        sort_key: a function receiving a whole bucket (a list) and returning it sorted.
        use_in_batch_shuffle: shuffle whole chunks (True) or use a shuffle buffer (False).

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> dp = IterableWrapper(range(10)).bucketbatch(batch_size=3, drop_last=True)
        >>> _ = dp.set_seed(0)
        >>> list(dp)
        [[6, 9, 0], [2, 4, 3], [5, 1, 8]]
        >>> def sort_bucket(bucket):
        ...     return sorted(bucket)
        >>> dp = IterableWrapper(range(10)).bucketbatch(
        ...     batch_size=3, drop_last=True, batch_num=100, bucket_num=1,
        ...     use_in_batch_shuffle=False, sort_key=sort_bucket)
        >>> _ = dp.set_seed(0)
        >>> list(dp)
        [[3, 4, 5], [6, 7, 8], [0, 1, 2]]
    """

    state_keys = ("pool", "bucket", "batch", "group", "out")
    _runtime = ("_pool", "_bucket", "_batch", "_group", "_out")

    def __init__(
        self,
        datapipe: IterDataPipe,
        batch_size: int,
        drop_last: bool = False,
        batch_num: int = 100,
        bucket_num: int = 1,
        sort_key: Callable[[list[Any]], list[Any]] | None = None,
        use_in_batch_shuffle: bool = True,
    ) -> None:
        super().__init__()
        stage = "bucketbatch"
        self.batch_size = check_int(batch_size, "batch_size", stage, minimum=1)
        self.batch_num = check_int(batch_num, "batch_num", stage, minimum=1)
        self.bucket_num = check_int(bucket_num, "bucket_num", stage, minimum=1)
        if sort_key is not None and not callable(sort_key):
            raise TypeError(f"bucketbatch: sort_key must be callable or None, got {type(sort_key).__name__}")
        self.source_datapipe = datapipe
        self.drop_last = bool(drop_last)
        self.sort_key = sort_key
        self.use_in_batch_shuffle = bool(use_in_batch_shuffle)
        self.bucket_size = self.batch_size * self.batch_num
        self.pool_size = self.bucket_size * self.bucket_num
        self._enabled = True
        self._init_runtime()

    @property
    def datapipe(self) -> IterDataPipe:
        """The source pipe (torchdata's name for :attr:`source_datapipe`)."""
        return self.source_datapipe

    # -- buffers ---------------------------------------------------------------------------------
    def _init_runtime(self) -> None:
        self._pool: list[Any] = []  # stage 1: pool being filled, or the shuffle buffer
        self._bucket: list[Any] = []  # stage 2: bucket being filled
        self._batch: list[Any] = []  # stage 3: batch being filled
        self._group: list[list[Any]] = []  # stage 4: batches being grouped, or the shuffle buffer
        self._out: deque[list[Any]] = deque()  # finished batches, in output order

    def state_dict(self) -> dict[str, Any]:
        return {
            "pool": list(self._pool),
            "bucket": list(self._bucket),
            "batch": list(self._batch),
            "group": [list(b) for b in self._group],
            "out": [list(b) for b in self._out],
        }

    def restore(self, state: dict[str, Any] | None) -> None:
        self._init_runtime()
        if state is not None:
            self._pool = list(state["pool"])
            self._bucket = list(state["bucket"])
            self._batch = list(state["batch"])
            self._group = [list(b) for b in state["group"]]
            self._out = deque(list(b) for b in state["out"])

    # -- stages ----------------------------------------------------------------------------------
    @property
    def _pool_shuffle(self) -> bool:
        return self._enabled and (self.bucket_num > 1 or self.sort_key is None)

    def _chunk_shuffled(self, chunk: list[Any]) -> list[Any]:
        return self.rng.sample(chunk, len(chunk))

    def _push_item(self, item: Any) -> None:  # stage 1
        if not self._pool_shuffle:
            self._push_sorted(item)
        elif self.use_in_batch_shuffle:
            self._pool.append(item)
            if len(self._pool) == self.pool_size:
                pool, self._pool = self._pool, []
                for x in self._chunk_shuffled(pool):
                    self._push_sorted(x)
        elif len(self._pool) == self.pool_size:
            idx = self.rng.randint(0, self.pool_size - 1)
            out, self._pool[idx] = self._pool[idx], item
            self._push_sorted(out)
        else:
            self._pool.append(item)

    def _flush_pool(self) -> None:
        if self.use_in_batch_shuffle:
            pool, self._pool = self._pool, []
            for x in self._chunk_shuffled(pool) if pool else ():
                self._push_sorted(x)
        else:
            while self._pool:
                idx = self.rng.randint(0, len(self._pool) - 1)
                self._push_sorted(self._pool.pop(idx))

    def _sorted_bucket(self, bucket: list[Any]) -> list[Any]:
        assert self.sort_key is not None
        result = self.sort_key(bucket)
        try:
            return list(result)
        except TypeError as exc:
            raise TypeError(
                f"bucketbatch: sort_key must return the sorted bucket (a list), got {type(result).__name__}"
            ) from exc

    def _push_sorted(self, item: Any) -> None:  # stage 2
        if self.sort_key is None:
            self._push_batched(item)
            return
        self._bucket.append(item)
        if len(self._bucket) == self.bucket_size:
            bucket, self._bucket = self._bucket, []
            for x in self._sorted_bucket(bucket):
                self._push_batched(x)

    def _flush_bucket(self) -> None:
        if self._bucket:
            bucket, self._bucket = self._bucket, []
            for x in self._sorted_bucket(bucket):
                self._push_batched(x)

    def _push_batched(self, item: Any) -> None:  # stage 3
        self._batch.append(item)
        if len(self._batch) == self.batch_size:
            batch, self._batch = self._batch, []
            self._push_batch(batch)

    def _flush_batch(self) -> None:
        batch, self._batch = self._batch, []
        if batch and not self.drop_last:
            self._push_batch(batch)

    def _push_batch(self, batch: list[Any]) -> None:  # stage 4
        if self.sort_key is None or not self._enabled:
            self._out.append(batch)
        elif self.use_in_batch_shuffle:
            self._group.append(batch)
            if len(self._group) == self.bucket_num:
                group, self._group = self._group, []
                self._out.extend(self._chunk_shuffled(group))
        elif len(self._group) == self.bucket_size:
            idx = self.rng.randint(0, self.bucket_size - 1)
            out, self._group[idx] = self._group[idx], batch
            self._out.append(out)
        else:
            self._group.append(batch)

    def _flush_group(self) -> None:
        if self.use_in_batch_shuffle:
            group, self._group = self._group, []
            if group:
                self._out.extend(self._chunk_shuffled(group))
        else:
            while self._group:
                idx = self.rng.randint(0, len(self._group) - 1)
                self._out.append(self._group.pop(idx))

    def __iter__(self) -> Iterator[list[Any]]:
        for item in self.source_datapipe:
            self._push_item(item)
            while self._out:
                yield self._out.popleft()
        self._flush_pool()
        self._flush_bucket()
        self._flush_batch()
        self._flush_group()
        while self._out:
            yield self._out.popleft()


class _Entry:
    """A heap entry ordered by length only (ties keep heapq's order, as in torchdata)."""

    __slots__ = ("data", "length")

    def __init__(self, length: float, data: Any) -> None:
        self.length = length
        self.data = data

    def __lt__(self, other: _Entry) -> bool:
        return self.length < other.length


@functional_datapipe("max_token_bucketize")
class MaxTokenBucketizer(ResumablePipe):
    """Batch items of similar length under a token budget (functional name: ``max_token_bucketize``).

    Items are pushed on a min-heap (by ``len_fn(item)``) of ``buffer_size``
    items; once it is full, each new item pops the shortest one into the
    current batch.  A batch is yielded when adding the next item would make its
    token count exceed ``max_token_count``.  The token count is the sum of the
    items' lengths, or with ``include_padding=True`` ``longest * len(batch)``,
    the size after padding to the longest item.  At the end the heap is
    emptied the same way.

    Items whose length is outside ``[min_len, max_len]`` are left out of the
    batches.  torchdata dropped them silently; pipekit logs each one as a
    warning and records it in :attr:`skip_log` (``skip_log.count``,
    ``skip_log.skipped``).  When ``max_len`` is None (it then defaults to
    ``max_token_count``, as in torchdata), an item longer than
    ``max_token_count`` cannot fit in any batch and raises ``ValueError``
    instead of being dropped; pass ``max_len=max_token_count`` to skip such
    items (with a record in the skip log) rather than fail.

    Batches are built from the shortest items in the buffer first, which
    limits their variety when ``buffer_size`` is large: shuffle before and
    after this pipe and keep ``buffer_size`` small.

    Args:
        datapipe: the items.
        max_token_count: the largest token count of a batch.
        len_fn: the length of an item (``len`` by default); any non-negative number.
        min_len: items shorter than this are skipped.
        max_len: items longer than this are skipped (``max_token_count`` if None;
            must not exceed it).
        buffer_size: the number of items in the heap, or None for all items (the
            whole epoch is read before the first batch).
        include_padding: count ``longest * len(batch)`` tokens instead of the sum.

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> source = IterableWrapper(['1', '11', '1', '1111', '111', '1', '11', '11', '111'])
        >>> list(source.max_token_bucketize(max_token_count=5))
        [['1', '1', '1', '11'], ['11', '11'], ['111'], ['111'], ['1111']]
        >>> list(source.max_token_bucketize(max_token_count=4, buffer_size=4))
        [['1', '1', '1'], ['11', '11'], ['11'], ['111'], ['111'], ['1111']]
    """

    state_keys = ("heap", "batch", "tokens", "longest", "seen")
    _runtime = ("_heap", "_batch", "_tokens", "_longest", "_seen")

    def __init__(
        self,
        datapipe: IterDataPipe,
        max_token_count: int,
        len_fn: Callable[[Any], float] = len,
        min_len: int = 0,
        max_len: int | None = None,
        buffer_size: int | None = 1000,
        include_padding: bool = False,
    ) -> None:
        super().__init__()
        stage = "max_token_bucketize"
        if isinstance(max_token_count, bool) or not isinstance(max_token_count, numbers.Real):
            raise TypeError(f"{stage}: max_token_count must be a number, got {type(max_token_count).__name__}")
        if max_token_count <= 0:
            raise ValueError(f"{stage}: max_token_count must be positive, got {max_token_count}")
        if not callable(len_fn):
            raise TypeError(f"{stage}: len_fn must be callable, got {type(len_fn).__name__}")
        for name, bound in (("min_len", min_len), ("max_len", max_len)):
            if bound is not None and (isinstance(bound, bool) or not isinstance(bound, numbers.Real)):
                none = " (or None: max_token_count)" if name == "max_len" else ""
                raise TypeError(f"{stage}: {name} must be a number{none}, got {type(bound).__name__} {bound!r:.50}")
        if min_len is None:
            raise TypeError(f"{stage}: min_len must be a number, got None")
        self._max_len_given = max_len is not None
        if max_len is None:
            max_len = max_token_count
        if min_len < 0 or min_len > max_len:
            raise ValueError(f"{stage}: min_len must be >= 0 and <= max_len ({max_len}), got {min_len}")
        if max_len > max_token_count:
            raise ValueError(f"{stage}: max_len ({max_len}) must not exceed max_token_count ({max_token_count})")
        if buffer_size is not None:
            check_int(buffer_size, "buffer_size", stage, minimum=1)
        self.source_datapipe = datapipe
        self.max_token_count = max_token_count
        self.len_fn = len_fn
        self.min_len = min_len
        self.max_len = max_len
        self.buffer_size = buffer_size
        self.include_padding = bool(include_padding)
        self.skip_log = SkipLog(stage)
        self._init_runtime()

    @property
    def datapipe(self) -> IterDataPipe:
        """The source pipe (torchdata's name for :attr:`source_datapipe`)."""
        return self.source_datapipe

    def _init_runtime(self) -> None:
        self._heap: list[_Entry] = []
        self._batch: list[Any] = []
        self._tokens: float = 0
        self._longest: float = 0
        self._seen = 0

    def state_dict(self) -> dict[str, Any]:
        return {
            "heap": [(e.length, e.data) for e in self._heap],
            "batch": list(self._batch),
            "tokens": self._tokens,
            "longest": self._longest,
            "seen": self._seen,
        }

    def restore(self, state: dict[str, Any] | None) -> None:
        self._init_runtime()
        if state is not None:
            self._heap = [_Entry(length, data) for length, data in state["heap"]]
            self._batch = list(state["batch"])
            self._tokens = state["tokens"]
            self._longest = state["longest"]
            self._seen = state["seen"]

    def _length(self, item: Any, index: int) -> float | None:
        """The item's length, or None if it is skipped."""
        length = self.len_fn(item)
        if isinstance(length, bool) or not isinstance(length, numbers.Real) or length < 0:
            raise ValueError(
                f"max_token_bucketize: len_fn must return a non-negative number, got {length!r} "
                f"for item {index} ({reprlib.repr(item)})"
            )
        if length > self.max_token_count and not self._max_len_given:
            raise ValueError(
                f"max_token_bucketize: item {index} ({reprlib.repr(item)}) has length {length}, more than "
                f"max_token_count={self.max_token_count}, so it fits in no batch; pass "
                f"max_len={self.max_token_count} to skip such items instead"
            )
        if length < self.min_len or length > self.max_len:
            self.skip_log.record(
                StageError(
                    "batch",
                    f"item {index} ({reprlib.repr(item)})",
                    "max_token_bucketize",
                    f"length {length} is outside [min_len, max_len] = [{self.min_len}, {self.max_len}]",
                )
            )
            return None
        return length

    def _pop(self) -> list[Any] | None:
        """Move the shortest buffered item into the batch; return the batch it completed, if any."""
        entry = heapq.heappop(self._heap)
        length = entry.length
        if self.include_padding:
            longest = max(length, self._longest)
            tokens = (len(self._batch) + 1) * longest
        else:
            longest = self._longest
            tokens = self._tokens + length
        if tokens > self.max_token_count:
            done, self._batch = self._batch, [entry.data]
            self._tokens = length
            self._longest = length
            return done
        self._batch.append(entry.data)
        self._tokens = tokens
        self._longest = longest
        return None

    def __iter__(self) -> Iterator[list[Any]]:
        for item in self.source_datapipe:
            index = self._seen
            self._seen += 1
            length = self._length(item, index)
            if length is None:
                continue
            heapq.heappush(self._heap, _Entry(length, item))
            if self.buffer_size is not None and len(self._heap) >= self.buffer_size:
                done = self._pop()
                if done:
                    yield done
        while self._heap:
            done = self._pop()
            if done:
                yield done
        if self._batch:
            done, self._batch = self._batch, []
            self._tokens = self._longest = 0
            yield done
