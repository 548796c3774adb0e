"""torchdata 0.9's ``DataLoader2`` and reading services, built on :class:`pipekit.DataLoader`.

torchdata's tutorial code runs with only its imports changed::

    from pipekit import DataLoader2, MultiProcessingReadingService   # was: from torchdata.dataloader2 import ...

    rs = MultiProcessingReadingService(num_workers=2)
    dl = DataLoader2(datapipe, reading_service=rs)
    for epoch in range(3):
        dl.seed(epoch)
        for batch in dl:
            ...
    dl.shutdown()

Each ``DataLoader2`` runs a :class:`pipekit.DataLoader` with ``batch_size=None``
(the pipe batches itself), so it inherits its worker processes, its
``torch.distributed`` seed sharing and its exact mid-epoch resume.  What the
reading services become:

======================================  ==============================================================
torchdata                               pipekit
======================================  ==============================================================
``InProcessReadingService()``           ``DataLoader(num_workers=0)``
``MultiProcessingReadingService(n)``    ``DataLoader(num_workers=n)``, persistent workers until
                                        ``shutdown()``
``DistributedReadingService()``         sharding across ranks (torchdata's layout) and a ``fullsync``
                                        after the loader, as torchdata appends one
``SequentialReadingService(a, b)``      both: ``(MultiProcessing..., Distributed...)``
``Shuffle(False)`` adapter              :class:`pipekit.adapters.Shuffle`
======================================  ==============================================================

Where pipekit differs from torchdata (deliberately):

* ``state_dict()`` / ``load_state_dict()`` / ``from_state()`` resume mid-epoch
  exactly, with any reading service (torchdata 0.9 restored only the pipe as it
  was built and the random state, so a restored loader restarted its epoch);
* the seeds: ``seed(s)`` makes every epoch that follows deterministic, as in
  torchdata, but pipekit derives the pipes' seeds with torch's generator, not
  torchdata's ``SeedGenerator``, so a shuffle seeded with ``s`` gives another
  order than torchdata's with ``s``;
* ``worker_reset_fn`` / ``reset_fn`` (called with torchdata's ``SeedGenerator``)
  raise ``NotImplementedError``: pipekit has no ``SeedGenerator`` to pass, and
  ignoring them would be silently wrong.  Per-worker randomness comes from the
  random pipes themselves (:class:`pipekit.pipes.state.SeededPipe`);
* ``DataLoader2Iterator.limit`` / ``resume`` (torchdata's experimental pausing)
  are not provided.

Example:
    >>> import torch
    >>> from pipekit import DataLoader2, InProcessReadingService
    >>> from pipekit.pipes import IterableWrapper
    >>> pipe = IterableWrapper(range(8)).shuffle().sharding_filter().batch(3)
    >>> dl = DataLoader2(pipe, reading_service=InProcessReadingService())
    >>> dl.seed(0)
    >>> first = list(dl)
    >>> dl.seed(0)
    >>> list(dl) == first, sorted(sum(first, []))
    (True, [0, 1, 2, 3, 4, 5, 6, 7])
    >>> it = iter(dl)
    >>> head = next(it)
    >>> state = dl.state_dict()
    >>> rest = list(it)
    >>> resumed = DataLoader2.from_state(state, InProcessReadingService())
    >>> list(resumed) == rest
    True
    >>> dl.shutdown()
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import pickle
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from pipekit._loader import DataLoader, warn_if_unsharded
from pipekit._reading_services import (
    DistributedReadingService,
    InProcessReadingService,
    MultiProcessingReadingService,
    ReadingServiceInterface,
    SequentialReadingService,
    WorkerInfo,
    _Plan,
)
from pipekit.adapters import Adapter
from pipekit.pipes._distributed import FullSync
from pipekit.pipes._resume import pipeline_pipes
from pipekit.pipes.base import IterDataPipe, MapDataPipe
from pipekit.pipes.state import draw_seed

try:
    import dill
except ImportError:  # pipes holding lambdas then cannot be serialized, as with torchdata
    dill = None

__all__ = [
    "DataLoader2",
    "DataLoader2Iterator",
    "DistributedReadingService",
    "InProcessReadingService",
    "MultiProcessingReadingService",
    "ReadingServiceInterface",
    "SequentialReadingService",
    "WorkerInfo",
]

SERIALIZED_DATAPIPE_KEY_NAME = "serialized_datapipe"
READING_SERVICE_STATE_KEY_NAME = "reading_service_state"
RANDOMNESS_STATE_KEY_NAME = "randomness_state"
LOADER_STATE_KEY_NAME = "loader_state"  # pipekit's: the position inside the epoch

_UINT64_UPPER_BOUND = 2**64


# -- the loader ------------------------------------------------------------------------------------


class _Root(IterDataPipe):
    """The loader's top pipe: lets a worker swap in the pipe its ``worker_init_fn`` returns."""

    stateless = True

    def __init__(self, datapipe: IterDataPipe) -> None:
        self.source_datapipe = datapipe

    def __iter__(self) -> Iterator[Any]:
        yield from self.source_datapipe


class _LoaderSource(IterDataPipe):
    """The loader's output as a pipe, for ``fullsync`` in the main process; the loader keeps its own position."""

    stateless = True

    def __init__(self, loader: DataLoader) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[Any]:
        yield from self.loader


def _as_is(item: Any) -> Any:
    """The pipe's items, unconverted (torch's loader would make lists of tuples and tensors of arrays)."""
    return item


def _shard(pipe: Any, num_instances: int, instance_id: int) -> None:
    for dp in pipeline_pipes(pipe):
        apply_sharding = getattr(dp, "apply_sharding", None)
        if inspect.ismethod(apply_sharding):
            apply_sharding(num_instances, instance_id)


@dataclass
class _WorkerSetup:
    num_workers: int
    world_size: int
    rank: int
    distributed: bool
    init_fn: Callable[[Any, WorkerInfo], Any] | None


def _worker_init(setup: _WorkerSetup, worker_id: int) -> None:
    """In each worker: torchdata's sharding layout, then the user's ``worker_init_fn``."""
    root: _Root = torch.utils.data.get_worker_info().dataset.pipe
    if setup.distributed:
        _shard(root, setup.num_workers * setup.world_size, worker_id + setup.num_workers * setup.rank)
    else:  # torchdata shards across ranks only with a DistributedReadingService
        _shard(root, setup.num_workers, worker_id)
    if setup.init_fn is not None:
        root.source_datapipe = setup.init_fn(root.source_datapipe, WorkerInfo(setup.num_workers, worker_id))


def _clone(obj: Any) -> Any:
    try:
        return copy.deepcopy(obj)
    except TypeError:
        return _deserialize(_serialize(obj))


def _serialize(pipe: Any) -> tuple[str, bytes]:
    """``pickle``, or ``dill`` for pipes holding lambdas (as torchdata and torch's DataLoader do)."""
    try:
        return "pickle", pickle.dumps(pipe)
    except (pickle.PicklingError, AttributeError, TypeError):
        if dill is None:
            raise
        return "dill", dill.dumps(pipe)


def _deserialize(data: tuple[str, bytes]) -> Any:
    kind, payload = data
    if kind == "dill":
        if dill is None:
            raise RuntimeError("this DataLoader2 state holds a pipe serialized with dill; install dill to load it")
        return dill.loads(payload)
    return pickle.loads(payload)


def _generator_state(gen: torch.Generator) -> bytes:
    return bytes(gen.get_state().tolist())


def _set_generator_state(gen: torch.Generator, state: bytes) -> None:
    gen.set_state(torch.tensor(list(state), dtype=torch.uint8))


class DataLoader2Iterator(Iterator[Any]):
    """The iterator ``iter(DataLoader2)`` returns (torchdata's name).

    Only the newest iterator of a ``DataLoader2`` is valid: taking an item
    from an older one raises ``RuntimeError``, as in torchdata.  An error
    raised by the pipe shuts the ``DataLoader2`` down before propagating.
    """

    def __init__(self, dataloader: DataLoader2, iterator_id: int) -> None:
        self.dataloader = dataloader
        self.iterator_id = iterator_id

    def __iter__(self) -> DataLoader2Iterator:
        return self

    def __next__(self) -> Any:
        dl = self.dataloader
        if self.iterator_id != dl.valid_iterator_id:
            raise RuntimeError(
                "This iterator has been invalidated because another iterator has been created from the same "
                "DataLoader2."
            )
        if dl._stream_iter is None:
            raise StopIteration
        dl._reset_iter = True
        try:
            item = next(dl._stream_iter)
        except StopIteration:
            dl._end_epoch()
            raise
        except Exception:
            dl._shutdown(save_position=False)
            raise
        dl._taken += 1
        return item


class DataLoader2:
    """torchdata 0.9's ``DataLoader2``, running a :class:`pipekit.DataLoader`.

    Args:
        datapipe: the pipe (a map-style pipe is turned into an iterable one
            with ``to_iter_datapipe()``, as in torchdata).  A deep copy is
            taken, so the same pipe can feed several loaders.  ``None`` only if
            :meth:`load_state_dict` follows.
        datapipe_adapter_fn: an :class:`pipekit.adapters.Adapter` (such as
            ``Shuffle(False)``) or a list of them, applied to the copy.
        reading_service: :class:`InProcessReadingService` (the default, also
            for ``None``), :class:`MultiProcessingReadingService`,
            :class:`DistributedReadingService` or a
            :class:`SequentialReadingService` of them; copied, too.

    ``seed(seed)`` fixes the random pipes' seeds from the next epoch on (see
    :meth:`seed`); ``shutdown()`` stops the workers (also on ``with`` exit);
    ``state_dict()`` / ``load_state_dict()`` / ``from_state()`` checkpoint and
    resume mid-epoch exactly.  The rest of the semantics, and where pipekit
    differs from torchdata, are in :mod:`pipekit.dataloader2`.
    """

    def __init__(
        self,
        datapipe: IterDataPipe | MapDataPipe | None,
        datapipe_adapter_fn: Iterable[Adapter] | Adapter | None = None,
        reading_service: ReadingServiceInterface | None = None,
    ) -> None:
        if reading_service is not None and not isinstance(reading_service, ReadingServiceInterface):
            raise TypeError(
                "reading_service must be one of pipekit's reading services (InProcessReadingService, "
                f"MultiProcessingReadingService, DistributedReadingService, SequentialReadingService), got "
                f"{type(reading_service).__name__}"
            )
        if isinstance(datapipe, MapDataPipe):
            datapipe = datapipe.to_iter_datapipe()
        self.datapipe: Any = _clone(datapipe) if datapipe is not None else None
        if datapipe_adapter_fn is None:
            self.datapipe_adapter_fns: list[Adapter] | None = None
        elif isinstance(datapipe_adapter_fn, Iterable):
            self.datapipe_adapter_fns = list(datapipe_adapter_fn)
        else:
            self.datapipe_adapter_fns = [datapipe_adapter_fn]
        self.reading_service = _clone(reading_service)
        self._plan = _Plan()
        if self.reading_service is not None:
            self.reading_service._contribute(self._plan)
        self._apply_adapters()
        self._datapipe_before_reading_service_adapt: Any = _clone(self.datapipe)
        # Randomness: seed() restarts the sequence of epoch seeds; without it, each epoch draws from torch.
        self._seed: int | None = None
        self._reset_seed = True
        self._seeds = torch.Generator()
        self._epoch_seed: int | None = None
        # Loader and the current epoch.
        self._loader: DataLoader | None = None
        self._sync: FullSync | None = None
        self._stream: Any = None
        self._stream_iter: Iterator[Any] | None = None
        self._reset_iter = True  # the next __iter__ starts an epoch (False between __iter__ and the first item)
        self._taken = 0
        self._pending: dict[str, Any] | None = None  # a loaded state, applied when the next epoch starts
        self._state_dict: dict[str, Any] | None = None  # the loaded state, returned until an iterator starts
        self._final_state: dict[str, Any] | None = None
        self._terminated = False
        self.valid_iterator_id: int | None = None

    def _apply_adapters(self) -> None:
        if self.datapipe is not None and self.datapipe_adapter_fns is not None:
            for adapter_fn in self.datapipe_adapter_fns:
                self.datapipe = adapter_fn(self.datapipe)

    # -- iteration ---------------------------------------------------------------------------------

    def __iter__(self) -> DataLoader2Iterator:
        """Start an epoch (or, if no item was taken since the last ``iter()``, hand out that epoch again)."""
        if self.datapipe is None:
            raise RuntimeError("Please provide datapipe or use load_state_dict to load datapipe from state")
        if self._terminated:
            raise RuntimeError("Cannot iterate over the DataLoader as it has already been shut down")
        if self._reset_iter:
            self._start_epoch()
            self._reset_iter = False
        self.valid_iterator_id = 0 if self.valid_iterator_id is None else self.valid_iterator_id + 1
        return DataLoader2Iterator(self, self.valid_iterator_id)

    def _build(self) -> None:
        """Create the loader, once (torchdata's ``ReadingService.initialize``)."""
        plan = self._plan
        world_size, rank = 1, 0
        if plan.distributed:
            if not (dist.is_available() and dist.is_initialized()):
                raise RuntimeError("Torch Distributed is required to be initialized")
            world_size, rank = dist.get_world_size(), dist.get_rank()
        if plan.main_init_fn is not None:
            self.datapipe = plan.main_init_fn(self.datapipe, WorkerInfo(1, 0))
        warn_if_unsharded(
            self.datapipe,
            plan.num_workers,
            world_size,
            stacklevel=4,
            loader="pipekit.DataLoader2",
            opt_out='filter this warning (warnings.filterwarnings("ignore", "pipekit.DataLoader2: the DataPipe"))',
        )
        kwargs: dict[str, Any] = {}
        if plan.num_workers > 0:
            setup = _WorkerSetup(plan.num_workers, world_size, rank, plan.distributed, plan.worker_init_fn)
            kwargs.update(
                worker_init_fn=functools.partial(_worker_init, setup),
                prefetch_factor=plan.prefetch_factor,
                multiprocessing_context=plan.multiprocessing_context,
            )
        self._loader = DataLoader(
            _Root(self.datapipe),
            batch_size=None,
            num_workers=plan.num_workers,
            pin_memory=False,  # DataLoader2 does not pin; the pipe's .pin_memory() does
            collate_fn=_as_is,
            generator=torch.Generator(),
            warn_unsharded=False,  # warned above, counting ranks only with a DistributedReadingService
            **kwargs,
        )
        self._stream = self._loader
        if plan.distributed:
            self._sync = FullSync(_LoaderSource(self._loader), timeout=plan.timeout)
            self._stream = self._sync

    def _next_epoch_seed(self) -> int:
        if self._seed is None:
            return draw_seed()  # torch's global generator: torch.manual_seed makes runs repeat
        if self._reset_seed:
            self._seeds.manual_seed(self._seed)
            self._reset_seed = False
        return draw_seed(self._seeds)

    def _start_epoch(self) -> None:
        if self._loader is None:
            self._build()
        assert self._loader is not None
        pending, self._pending = self._pending, None
        self._state_dict = None
        loader_state = pending[LOADER_STATE_KEY_NAME] if pending is not None else None
        if loader_state is not None and loader_state["epoch_seed"] is not None:
            # The interrupted epoch goes on: same seed, and the loader's and fullsync's positions.
            self._epoch_seed = loader_state["epoch_seed"]
            if loader_state["loader"] is not None:
                self._loader.load_state_dict(loader_state["loader"])
            if self._sync is not None and loader_state["fullsync"] is not None:
                self._sync.load_state_dict(loader_state["fullsync"])
            self._taken = int(loader_state["taken"])
        else:
            self._epoch_seed = self._next_epoch_seed()
            self._taken = 0
        self._loader.generator.manual_seed(self._epoch_seed)
        self._stream_iter = iter(self._stream)
        plan = self._plan
        if plan.num_workers == 0 and not plan.distributed and dist.is_available() and dist.is_initialized():
            # torch's loader shards across ranks; torchdata does so only with a DistributedReadingService.
            _shard(self._loader.dataset.pipe, 1, 0)

    def _end_epoch(self) -> None:
        self._stream_iter = None
        self._taken = 0
        self._epoch_seed = None

    def seed(self, seed: int) -> None:
        """Make the epochs from the next one on deterministic.

        The next epoch's seeds (the ``shuffle`` order, every random pipe's
        generator) follow from ``seed``, and so do those of the epochs after it,
        as long as ``seed`` is not called again.  Without ``seed``, each epoch
        draws its seed from torch's global generator.  In a distributed job
        rank 0's seed is used on every rank.

        Args:
            seed: an unsigned 64-bit integer.
        """
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"Expected an int seed, but got {type(seed).__name__}.")
        if not 0 <= seed < _UINT64_UPPER_BOUND:
            raise ValueError(f"Expected an uint64 seed, but got {seed}.")
        self._seed = seed
        self._reset_seed = True

    # -- shutdown ----------------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop the worker processes and end the current epoch; safe to call more than once.

        The loader cannot be iterated afterwards (``RuntimeError``), but
        ``state_dict()`` still returns the position it had.
        """
        self._shutdown(save_position=True)

    def _shutdown(self, save_position: bool) -> None:
        if self._terminated:
            return
        if save_position and self._stream_iter is not None and self._taken:
            self._final_state = self.state_dict()
        self._terminated = True
        self._stream_iter = None
        self._reset_iter = True
        if self._loader is not None:
            self._loader.shutdown()

    def __del__(self) -> None:
        with contextlib.suppress(AttributeError):  # a half-constructed object
            self._shutdown(save_position=False)

    def __enter__(self) -> DataLoader2:
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        self.shutdown()

    # -- checkpoints -------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The loader's state: the pipe (as built, serialized), the random state and the position in the epoch.

        Taken mid-epoch, a loader restored from it (:meth:`from_state`,
        :meth:`load_state_dict`) yields exactly the items this one has not
        yielded yet, then goes on with the same epochs.  The state is plain
        picklable data.
        """
        if self._final_state is not None:
            return self._final_state
        if self.valid_iterator_id is None and self._state_dict is not None:
            return self._state_dict
        if self._terminated and self._taken:
            raise RuntimeError(
                "this DataLoader2 was shut down by an error in the middle of an epoch; its position is lost"
            )
        position = None
        if self._stream_iter is not None and self._taken:
            assert self._loader is not None
            position = {
                "epoch_seed": self._epoch_seed,
                "taken": self._taken,
                "loader": self._loader.state_dict(),
                "fullsync": self._sync.state_dict() if self._sync is not None else None,
            }
        elif self._stream_iter is not None:  # an epoch started, nothing taken: replay its start, same seed
            position = {"epoch_seed": self._epoch_seed, "taken": 0, "loader": None, "fullsync": None}
        return {
            SERIALIZED_DATAPIPE_KEY_NAME: _serialize(self._datapipe_before_reading_service_adapt),
            READING_SERVICE_STATE_KEY_NAME: None,
            RANDOMNESS_STATE_KEY_NAME: {
                "seed": self._seed,
                "reset_seed": self._reset_seed,
                "seeds": _generator_state(self._seeds),
            },
            LOADER_STATE_KEY_NAME: position,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], reading_service: ReadingServiceInterface | None) -> DataLoader2:
        """A new ``DataLoader2`` with the pipe and position of ``state`` (from :meth:`state_dict`)."""
        loader = cls(datapipe=None, reading_service=reading_service)
        loader._load(state)
        return loader

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Replace this loader's pipe and position with ``state_dict``'s; before its first ``iter()`` only.

        The adapters given to this loader are applied to the restored pipe.
        """
        if self._stream_iter is not None or self._loader is not None:
            raise RuntimeError(
                "DataLoaderV2 iterator has already been created, `load_state_dict()` can't be called. "
                "Please create a new dataloader in order to use load state dict."
            )
        self._load(state_dict)
        self._apply_adapters()
        self._datapipe_before_reading_service_adapt = _clone(self.datapipe)

    def _load(self, state: dict[str, Any]) -> None:
        missing = {SERIALIZED_DATAPIPE_KEY_NAME, RANDOMNESS_STATE_KEY_NAME, LOADER_STATE_KEY_NAME} - set(state)
        if missing:
            raise ValueError(f"not a pipekit.DataLoader2 state (missing {sorted(missing)})")
        self.datapipe = _deserialize(state[SERIALIZED_DATAPIPE_KEY_NAME])
        self._datapipe_before_reading_service_adapt = _clone(self.datapipe)
        randomness = state[RANDOMNESS_STATE_KEY_NAME]
        self._seed = randomness["seed"]
        self._reset_seed = randomness["reset_seed"]
        _set_generator_state(self._seeds, randomness["seeds"])
        self._pending = state
        self._state_dict = state
