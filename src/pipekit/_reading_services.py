"""torchdata 0.9's reading services, as :class:`pipekit.DataLoader2` reads them (public in :mod:`pipekit.dataloader2`).

A reading service here is a description: each one contributes what it asks for to a :class:`_Plan` (workers,
their start method and prefetch, the ``init_fn`` callbacks, sharding across ranks), which ``DataLoader2`` turns
into the :class:`pipekit.DataLoader` it runs.
"""

from __future__ import annotations

import multiprocessing
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

_DEFAULT_TIMEOUT_S = 30 * 60  # torchdata's default_timeout_in_s


@dataclass(frozen=True)
class WorkerInfo:
    """What torchdata passes to ``worker_init_fn``: the number of workers and this worker's id."""

    num_workers: int
    worker_id: int


# -- reading services ------------------------------------------------------------------------------


@dataclass
class _Plan:
    """How a DataLoader2 runs its pipe: what the reading services say, merged."""

    num_workers: int = 0
    multiprocessing_context: str | None = None
    prefetch_factor: int | None = None
    worker_init_fn: Callable[[Any, WorkerInfo], Any] | None = None
    main_init_fn: Callable[[Any, WorkerInfo], Any] | None = None
    distributed: bool = False
    timeout: float = _DEFAULT_TIMEOUT_S


class ReadingServiceInterface:
    """The base of pipekit's reading services (torchdata's name).

    A reading service here is a description: :class:`DataLoader2` reads it to
    configure the :class:`pipekit.DataLoader` it runs.  Reading services
    written against torchdata's interface (``initialize``,
    ``initialize_iteration``...) are not supported.
    """

    def _contribute(self, plan: _Plan) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"


def _no_reset_fn(fn: Any, name: str) -> None:
    if fn is not None:
        raise NotImplementedError(
            f"{name} is not supported by pipekit: it is called with torchdata's SeedGenerator, which pipekit does "
            "not have. Random pipes derive their own per-epoch (and, where they override derive_epoch_seed, "
            "per-worker) seeds from the DataLoader2's seed; see pipekit.pipes.state.SeededPipe"
        )


class InProcessReadingService(ReadingServiceInterface):
    """Run the pipe in the main process (torchdata's ``InProcessReadingService``).

    Args:
        prefetch_cnt: torchdata prefetched this many items in the main process.
            **Ignored** (a ``pipekit.DataLoader`` with ``num_workers=0`` has no
            prefetch buffer; add ``.prefetch(n)`` to the pipe for one); the
            items are the same either way.
        init_fn: ``init_fn(datapipe, WorkerInfo(1, 0)) -> datapipe``, called
            once, before the first epoch.
        reset_fn: not supported (raises ``NotImplementedError``): see
            :mod:`pipekit.dataloader2`.
    """

    def __init__(
        self,
        prefetch_cnt: int = 0,
        init_fn: Callable[[Any, WorkerInfo], Any] | None = None,
        reset_fn: Callable[..., Any] | None = None,
    ) -> None:
        _no_reset_fn(reset_fn, "InProcessReadingService(reset_fn=...)")
        self.prefetch_cnt = prefetch_cnt
        self.init_fn = init_fn
        self.reset_fn = reset_fn

    def _contribute(self, plan: _Plan) -> None:
        plan.main_init_fn = self.init_fn


class MultiProcessingReadingService(ReadingServiceInterface):
    """Run the pipe in worker processes (torchdata's ``MultiProcessingReadingService``).

    The pipe runs in ``num_workers`` persistent worker processes of a
    :class:`pipekit.DataLoader`, each sharded by ``sharding_filter`` as in
    torchdata; the main process takes their items round-robin.

    Args:
        num_workers: worker processes (``0``: the main process, with torchdata's
            warning to use :class:`InProcessReadingService`).
        multiprocessing_context: ``"fork"``, ``"spawn"`` or ``"forkserver"``
            (``None``: the platform's default).
        worker_prefetch_cnt: items each worker fetches ahead; mapped to the
            DataLoader's ``prefetch_factor`` (its smallest value, 1, for 0).
        main_prefetch_cnt: items torchdata prefetched in the main process.
            **Ignored**: the DataLoader has no main-process buffer beyond
            ``worker_prefetch_cnt`` per worker; the items are the same.
        worker_init_fn: ``worker_init_fn(datapipe, WorkerInfo) -> datapipe``,
            called in each worker after sharding, before its first item; the
            pipe it returns is the one the worker runs.
        worker_reset_fn: not supported (raises ``NotImplementedError``): see
            :mod:`pipekit.dataloader2`.
    """

    def __init__(
        self,
        num_workers: int = 0,
        multiprocessing_context: str | None = None,
        worker_prefetch_cnt: int = 10,
        main_prefetch_cnt: int = 10,
        worker_init_fn: Callable[[Any, WorkerInfo], Any] | None = None,
        worker_reset_fn: Callable[..., Any] | None = None,
    ) -> None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers must be a non-negative int, got {num_workers!r}")
        if num_workers == 0:
            warnings.warn("Please use `InProcessReadingService` for num_workers=0", UserWarning, stacklevel=2)
        methods = multiprocessing.get_all_start_methods()
        if multiprocessing_context is not None and multiprocessing_context not in methods:
            raise ValueError(f"multiprocessing_context must be one of {methods}, got {multiprocessing_context!r}")
        for name, value in (("worker_prefetch_cnt", worker_prefetch_cnt), ("main_prefetch_cnt", main_prefetch_cnt)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        _no_reset_fn(worker_reset_fn, "MultiProcessingReadingService(worker_reset_fn=...)")
        self.num_workers = num_workers
        self.multiprocessing_context = multiprocessing_context
        self.worker_prefetch_cnt = worker_prefetch_cnt
        self.main_prefetch_cnt = main_prefetch_cnt
        self.worker_init_fn = worker_init_fn
        self.worker_reset_fn = worker_reset_fn

    def _contribute(self, plan: _Plan) -> None:
        plan.num_workers = self.num_workers
        plan.multiprocessing_context = self.multiprocessing_context
        if self.num_workers > 0:
            plan.prefetch_factor = max(1, self.worker_prefetch_cnt)
            plan.worker_init_fn = self.worker_init_fn
        else:
            plan.main_init_fn = self.worker_init_fn  # torchdata calls it in the main process then


class DistributedReadingService(ReadingServiceInterface):
    """Shard the pipe across ``torch.distributed`` ranks (torchdata's ``DistributedReadingService``).

    ``torch.distributed`` must be initialized before the first epoch
    (``RuntimeError`` otherwise).  As in torchdata:

    * the ``sharding_filter`` splits items across ranks, and with a
      :class:`MultiProcessingReadingService` across each rank's workers too:
      item ``i`` goes to rank ``(i // num_workers) % world_size``, worker
      ``i % num_workers`` (torchdata's layout; torch's DataLoader alone would
      interleave ranks first);
    * every rank uses rank 0's seed, so a ``shuffle`` before the
      ``sharding_filter`` orders the items the same way on every rank;
    * a ``fullsync`` (:class:`pipekit.pipes.FullSync`) runs after the
      loader in the main process, so all ranks stop after the same number of
      items (the shortest rank's).

    Args:
        timeout: seconds a rank waits for the others at each item (the
            ``fullsync`` timeout); 30 minutes by default.
    """

    def __init__(self, timeout: float = _DEFAULT_TIMEOUT_S) -> None:
        if not dist.is_available():
            raise RuntimeError("Torch Distributed is required to be available")
        self.timeout = timeout

    def _contribute(self, plan: _Plan) -> None:
        plan.distributed = True
        plan.timeout = self.timeout


class SequentialReadingService(ReadingServiceInterface):
    """Combine reading services (torchdata's ``SequentialReadingService``).

    ``SequentialReadingService(MultiProcessingReadingService(2), DistributedReadingService())``
    runs 2 workers on each rank.  At most one multiprocessing (or in-process)
    service and one distributed service.
    """

    def __init__(self, *reading_services: ReadingServiceInterface) -> None:
        for rs in reading_services:
            if not isinstance(rs, ReadingServiceInterface):
                raise TypeError(f"SequentialReadingService takes pipekit reading services, got {type(rs).__name__}")
        flat = _flatten(reading_services)
        local = [rs for rs in flat if isinstance(rs, InProcessReadingService | MultiProcessingReadingService)]
        distributed = [rs for rs in flat if isinstance(rs, DistributedReadingService)]
        if len(local) > 1 or len(distributed) > 1:
            raise ValueError(
                "SequentialReadingService: at most one InProcessReadingService or MultiProcessingReadingService, "
                f"and one DistributedReadingService; got {list(flat)}"
            )
        self.reading_services = reading_services

    def _contribute(self, plan: _Plan) -> None:
        for rs in self.reading_services:
            rs._contribute(plan)


def _flatten(services: tuple[ReadingServiceInterface, ...]) -> list[ReadingServiceInterface]:
    out: list[ReadingServiceInterface] = []
    for rs in services:
        out.extend(_flatten(rs.reading_services) if isinstance(rs, SequentialReadingService) else [rs])
    return out
