"""Keep the ranks of a ``torch.distributed`` job in step: torchdata's ``FullSync`` (``fullsync``).

When data is sharded across ranks, the shards rarely have the same length: 23
samples over 2 ranks give 12 and 11.  The rank with more data then enters one
more training step than the other, and waits forever in that step's
collective (the gradient ``all_reduce``) for a peer that has left the loop.
``fullsync`` stops every rank as soon as the first one runs out.

How: before yielding each item, every rank takes part in one small CPU
``all_reduce`` (gloo) saying whether it got an item.  If any rank did not, all
ranks stop at the same point.  The same collective carries each rank's item
count, so ranks that got out of step (one restored from another checkpoint,
one that stopped iterating early) fail with an error instead of silently
pairing different steps, and a rank whose source raised makes every rank
raise rather than the others finishing a short epoch as if nothing happened.

Cost: one blocking collective of four integers per item, on a dedicated gloo
group (created once per pipe, on the first epoch, by every rank), so each item
waits for the slowest rank to fetch its own.  On one machine this is tens of
microseconds; across machines, a network round trip.  Put ``fullsync`` at the
end of the pipeline, after batching, so it runs once per batch.
"""

from __future__ import annotations

import datetime
import logging
import os
from collections.abc import Iterator
from typing import Any

import torch

from pipekit.pipes.base import IterDataPipe, functional_datapipe
from pipekit.pipes.state import ResumablePipe

__all__ = ["FullSync"]

logger = logging.getLogger("pipekit")

_STATUS_ITEM, _STATUS_DONE, _STATUS_ERROR = 1, 0, -1


def _dist() -> Any:
    import torch.distributed as dist

    return dist


@functional_datapipe("fullsync")
class FullSync(ResumablePipe):
    """Stop all ranks of a distributed job when the first one runs out of data (functional name: ``fullsync``).

    In a ``torch.distributed`` job, every rank yields the same number of
    items: as many as the rank with the fewest.  The items a longer rank
    would have yielded after that are not read (this rank logs, at INFO
    level, that it stopped because a peer ran out).  In a single process (no
    process group initialized, or a world of one) items pass through
    unchanged.

    All ranks must iterate their ``fullsync`` pipe to the end (or all break
    at the same item): a rank that stops early leaves the others waiting in
    the next collective until ``timeout``.  If a rank's source raises, that
    rank re-raises its error and every other rank raises a ``RuntimeError``
    naming it.

    ``fullsync`` must run in the process that owns the process group: with a
    ``DataLoader`` using worker processes, apply it to the loader's output
    (``IterableWrapper(loader, deepcopy=False).fullsync()``), not inside the
    workers' pipeline (that raises ``RuntimeError``).

    Args:
        datapipe: the pipe to synchronize, typically after sharding and batching.
        timeout: seconds a rank waits for the other ranks at each item (the
            time the slowest rank may take to fetch it) before raising
            ``RuntimeError``; 30 minutes by default, as in torchdata.

    Resumable: the snapshot is the number of items yielded this epoch; the
    upstream pipes restore their own positions.  After a restore the ranks
    check that they all resumed at the same count.

    See the module docstring for how it works and what it costs.

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> from torch.utils.data.graph_settings import apply_sharding
        >>> dp = IterableWrapper(list(range(23))).sharding_filter()
        >>> _ = apply_sharding(dp, 2, 0)  # rank 0 of 2: 12 items; rank 1 would have 11
        >>> # Without a process group fullsync passes the items through.  In the
        >>> # 2-rank job, both ranks would stop after 11 items.
        >>> list(dp.fullsync())
        [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22]
    """

    state_keys = ("yielded",)
    _runtime = ("_group", "_group_world")  # process groups belong to one process

    def __init__(self, datapipe: IterDataPipe, timeout: float = 30 * 60) -> None:
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            raise TypeError(f"fullsync: timeout must be a number of seconds, got {type(timeout).__name__}")
        if not timeout > 0:
            raise ValueError(f"fullsync: timeout must be > 0, got {timeout!r}")
        self.source_datapipe = datapipe
        self.timeout = timeout
        self._yielded = 0
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._group: Any = None  # the gloo group for the "got an item" flags, created lazily
        self._group_world: Any = None  # the default group it was created under

    @property
    def datapipe(self) -> IterDataPipe:
        """The pipe synchronized (torchdata's attribute name for ``source_datapipe``)."""
        return self.source_datapipe

    # -- process group -------------------------------------------------------------------------

    def _sync_group(self) -> Any:
        """The gloo group to synchronize over, or ``None`` in a single process."""
        dist = _dist()
        initialized = dist.is_available() and dist.is_initialized()
        declared_world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        if torch.utils.data.get_worker_info() is not None and (initialized or declared_world > 1):
            raise RuntimeError(
                "fullsync cannot run inside a DataLoader worker process: the workers do not own the process "
                "group. Apply it to the DataLoader's output instead: IterableWrapper(loader, deepcopy=False).fullsync()"
            )
        if not initialized:
            if declared_world > 1:
                raise RuntimeError(
                    f"fullsync: WORLD_SIZE is {declared_world} but torch.distributed is not initialized; "
                    "call torch.distributed.init_process_group() before iterating"
                )
            return None
        if dist.get_world_size() == 1:
            return None
        world = dist.group.WORLD
        if self._group is None or self._group_world is not world:
            # Every rank reaches this point in its first epoch (new_group is a collective).  A gloo
            # group keeps the flags on the CPU and off the training's (NCCL) communicator.
            self._group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=self.timeout))
            self._group_world = world
        return self._group

    # -- iteration -----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        group = self._sync_group()
        if group is None:
            for item in self.source_datapipe:
                self._yielded += 1
                yield item
            return
        dist = _dist()
        rank, world_size = dist.get_rank(), dist.get_world_size()
        source = iter(self.source_datapipe)
        while True:
            error: BaseException | None = None
            item: Any = None
            try:
                item = next(source)
                status = _STATUS_ITEM
            except StopIteration:
                status = _STATUS_DONE
            except Exception as exc:
                status, error = _STATUS_ERROR, exc
            # MIN over [status, count, -count, -failing rank]: whether all ranks have an item, the
            # smallest and largest count, and the highest rank that failed.
            flags = torch.tensor(
                [status, self._yielded, -self._yielded, -rank if error is not None else world_size],
                dtype=torch.int64,
            )
            try:
                dist.all_reduce(flags, op=dist.ReduceOp.MIN, group=group)
            except Exception as exc:
                if error is not None:
                    raise error from exc
                raise RuntimeError(
                    f"fullsync: rank {rank} could not synchronize item {self._yielded} with the other ranks "
                    f"(timeout {self.timeout} s): {type(exc).__name__}: {exc}"
                ) from exc
            all_status, lowest, highest, failed = (int(v) for v in flags.tolist())
            highest = -highest
            if all_status == _STATUS_ERROR:
                if error is not None:
                    raise error
                raise RuntimeError(
                    f"fullsync: rank {-failed} failed to fetch item {lowest}; stopping rank {rank} too (see rank "
                    f"{-failed}'s error)"
                )
            if lowest != highest:
                raise RuntimeError(
                    f"fullsync: the ranks are out of step: rank {rank} is at item {self._yielded} while others are "
                    f"between items {lowest} and {highest} (restored from different checkpoints, or a rank stopped "
                    "iterating early?)"
                )
            if all_status == _STATUS_DONE:
                if status == _STATUS_ITEM:
                    logger.info(
                        "fullsync: rank %d stops after %d items because another rank ran out of data",
                        rank,
                        self._yielded,
                    )
                return
            self._yielded += 1
            yield item
            del item

    # -- resume --------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"yielded": self._yielded}

    def restore(self, state: dict[str, Any] | None) -> None:
        self._yielded = int(state["yielded"]) if state is not None else 0
