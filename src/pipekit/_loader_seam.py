"""The one seam between pipekit and the internals of torch's and torchdata's DataLoader.

Every private name of torch's and torchdata's DataLoader machinery that
pipekit relies on is imported or touched here and nowhere else: private
modules (``torch.utils.data._utils``, ``torch.utils.data.dataloader``'s
``_``-names, ``torchdata.stateful_dataloader``'s inner modules,
``torch.multiprocessing.reductions``), the private attributes and methods of
the loader and of its multi-process iterator, the layout of the states
torchdata's workers send, and torch's private shared-memory storage calls.
The rest of pipekit uses the small functions and classes below, whose names
say what they do.  ``tests/test_loader_seam.py`` enforces it by reading the
package's source, and keeps an allow-list of the private names used here.
Should torch or torchdata change their DataLoader internals, this is the
module to rewrite.  (torch's DataPipe core has its own seam,
:mod:`pipekit.pipes._torch`.)

Global changes pipekit makes to torch and torchdata
----------------------------------------------------

This is the whole list; keep it true when adding one.

1. **torchdata's** ``try_to_serialize`` (in
   ``torchdata.stateful_dataloader.worker`` and
   ``torchdata.stateful_dataloader.stateful_dataloader``) is replaced by a
   shortcut that answers at once for the objects a pipekit loader hands
   torchdata and calls torchdata's own function for everything else.  Made by
   :func:`patch_try_to_serialize` (here), which ``pipekit._loader`` calls in the
   main process when a loader with workers starts its iterator, and in every
   worker it starts.  Why: torchdata's ``isinstance(obj, Stateful)`` protocol
   check was ~30% of a worker's per-batch snapshot (see
   ``pipekit._loader._pipe.fast_try_to_serialize``).  Idempotent; the original
   stays reachable as ``__wrapped__``.
2. **torch's** ``default_collate_fn_map`` (``torch.utils.data._utils.collate``):
   its own entries for ``torch.Tensor``, ``int`` and ``float`` are replaced
   (an entry a user replaced is kept) by :func:`replace_default_collate_fns`
   (here), which :func:`pipekit.collate.use_shared_buffers_in_default_collate`
   calls: in every ``pipekit.DataLoader`` worker unless ``PIPEKIT_SHM_POOL=0``,
   and wherever a user calls it (e.g. as torch's ``worker_init_fn``).  Why:
   batches made by ``default_collate`` in a worker go to the main process in
   the worker's reused shared-memory buffers (:mod:`pipekit._shm`).
3. **torch's** reduction of ``torch.UntypedStorage`` for
   ``multiprocessing.reduction.ForkingPickler`` (registered by
   ``torch.multiprocessing.reductions``) is replaced by pipekit's, which hands
   every storage that is not a pool buffer to torch's.  Made by
   :func:`register_storage_reducer` (here), called by :mod:`pipekit._shm`: in a
   worker the first time its buffer pool is used, and in the main process the
   first time it rebuilds a pool buffer (so a buffer it sends on is a copy).
   Why: pool buffers are counted when sent and sent by reference once mapped.
4. **Warnings filter**: torch's ``'set_vital' is deprecated`` ``UserWarning``
   (raised by torchdata's ``StatefulDataLoader``) is ignored, that message
   only, by :func:`ignore_set_vital_warning` (here): process-wide in every
   ``pipekit.DataLoader`` worker (``pipekit._loader``'s worker init), and inside
   ``warnings.catch_warnings()`` (not global) while ``pipekit.DataLoader``
   creates torchdata's loader.  ``pipekit.cli.main`` adds the same filter
   process-wide for the command-line tool.  Why: it is torchdata's call of a
   deprecated torch function, printed for every loader.
5. **torch's thread count**: ``torch.set_num_threads(worker_threads)`` in each
   ``pipekit.DataLoader`` worker (``pipekit._loader``'s worker init; public
   API).  Why: workers do not oversubscribe the CPU.
6. Made by the DataPipe seam, :mod:`pipekit.pipes._torch` (listed here so the
   list is whole): ``IterDataPipe._is_child_datapipe = False`` (a class
   default torch's per-item hook asks for); the ``__iter__`` of torch's pipe
   classes is replaced once per class by ``loader_iteration`` (items pulled by
   the loader skip torch's per-item hook; elsewhere the hook runs as before);
   pipekit's pipes are registered in torch's functional-name tables
   (``IterDataPipe.functions``, ``MapDataPipe.functions``).

7. **The SIGCHLD handler** torch installs in the main process (its first
   multi-process iterator; it raises torch's ``RuntimeError`` "DataLoader
   worker (pid N) is killed by signal" from wherever the main thread is) is
   wrapped, once, by :func:`wrap_sigchld_handler` (here), which
   ``pipekit._loader._workers`` calls when a pipekit loader first takes a
   batch from its workers: the wrapper calls the handler it replaces and turns
   that error into :class:`~pipekit.errors.WorkerDiedError` naming the worker,
   its signal and its last file.  Why: a worker killed while the main process
   is busy in its training step (not waiting on the loader) raised torch's
   bare error there.
8. **torch's weights-only unpickler allow-list**
   (:func:`torch.serialization.add_safe_globals`) gains pipekit's batch list
   (``pipekit.pipes._builtin._Chunk``, when that module is imported) and the
   geo query types (:mod:`pipekit.geo._bbox`, when it is imported).  Why: a
   checkpoint holding buffered batches or geo queries loads with
   ``torch.load(weights_only=True)``.

Not global, but on torch's objects: a multi-process iterator created by a
``pipekit.DataLoader`` gets pipekit's subclass as its class
(:func:`switch_iterator_class`), the loader's dataset (torch's
serialization wrapper) is replaced after ``StatefulDataLoader.__init__``
(:meth:`LoaderBase.replace_dataset`), and in each worker the result queue
torch's worker loop sends batches on gets pipekit's handler for an item its
feeder thread cannot pickle (:func:`on_send_failure`; the queue's own hook
prints the error and drops the batch, and the main process waits for it
forever).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Mapping
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
from torch._utils import ExceptionWrapper
from torch.utils.data._utils import collate as _torch_collate
from torch.utils.data.dataloader import _InfiniteConstantSampler
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.stateful_dataloader import _StatefulMultiProcessingDataLoaderIter

__all__ = [
    "ITERATOR_FINISHED",
    "state_finished",
    "InfiniteConstantSampler",
    "LoaderBase",
    "WorkersIterBase",
    "is_workers_iterator",
    "switch_iterator_class",
    "worker_processes",
    "has_worker_states",
    "worker_dataset_states",
    "shut_down_workers",
    "patch_try_to_serialize",
    "ignore_set_vital_warning",
    "torch_collate_tensors",
    "torch_collate_ints",
    "torch_collate_floats",
    "replace_default_collate_fns",
    "have_storage_internals",
    "new_shared_storage",
    "storage_use_count",
    "torch_storage_reducer",
    "register_storage_reducer",
    "worker_result_queue",
    "on_send_failure",
    "send_now",
    "worker_exception",
    "wrap_sigchld_handler",
]

# ----------------------------------------------------------------------------------------- samplers

#: The sampler torch's DataLoader uses for an iterable dataset (it yields ``None`` forever).
InfiniteConstantSampler = _InfiniteConstantSampler


# ------------------------------------------------------------------------------------------- loader


class LoaderBase(StatefulDataLoader):
    """torchdata's ``StatefulDataLoader`` with the private hooks and fields pipekit uses named.

    torch's ``__iter__`` (and torchdata's ``load_state_dict``) create the
    iterator through the private ``_get_iterator``; here it calls
    :meth:`new_iterator`, which subclasses override, calling
    :meth:`torch_iterator` for torchdata's own.
    """

    def _get_iterator(self) -> Any:
        return self.new_iterator()

    def new_iterator(self) -> Any:
        """Create the loader's iterator (called by torch whenever it needs a new one)."""
        return self.torch_iterator()

    def torch_iterator(self) -> Any:
        """torchdata's iterator for this loader: single-process, or multi-process (its workers start here)."""
        return super()._get_iterator()

    def current_iterator(self) -> Any:
        """The iterator torch keeps for this loader (persistent workers, ``state_dict``), or ``None``."""
        return getattr(self, "_iterator", None)

    def detach_iterator(self) -> Any:
        """Forget the kept iterator, as if none had been created, and return it."""
        iterator = self._iterator
        self._iterator = None
        self._initial_iter_for_state_dict = False
        return iterator

    def replace_dataset(self, dataset: Any) -> None:
        """Set ``dataset`` after ``__init__`` (torch's ``DataLoader`` forbids plain assignment)."""
        object.__setattr__(self, "dataset", dataset)


# -------------------------------------------------------------------------------- the workers' iterator

# torch's methods a subclass of WorkersIterBase overrides under the honest name: (honest, torch's).
_ITERATOR_HOOKS = (
    ("get_data", "_get_data"),
    ("shutdown_workers", "_shutdown_workers"),
    ("mark_worker_unavailable", "_mark_worker_as_unavailable"),
)


class WorkersIterBase(_StatefulMultiProcessingDataLoaderIter):
    """torchdata's multi-process iterator with the private methods and fields pipekit uses named.

    A subclass overrides :meth:`get_data`, :meth:`shutdown_workers` or
    :meth:`mark_worker_unavailable` (and calls ``super()`` for torch's); the
    override is installed under torch's private name too, so torch calls it,
    with no call in between.
    """

    #: Take the next batch from the workers (torch's ``_get_data``).
    get_data = _StatefulMultiProcessingDataLoaderIter._get_data
    #: Tell the workers to exit and join them (torch's ``_shutdown_workers``; also run by ``__del__``).
    shutdown_workers = _StatefulMultiProcessingDataLoaderIter._shutdown_workers
    #: ``(worker_id, shutdown=False)``: a worker's data ended or the workers stop (``_mark_worker_as_unavailable``).
    mark_worker_unavailable = _StatefulMultiProcessingDataLoaderIter._mark_worker_as_unavailable

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for honest, private in _ITERATOR_HOOKS:
            if honest in cls.__dict__:
                setattr(cls, private, cls.__dict__[honest])

    def processes(self) -> list[Any]:
        """The worker processes, by worker id (``[]`` before they start)."""
        return list(getattr(self, "_workers", None) or [])

    def persistent(self) -> bool:
        """Whether the workers live on between epochs (``persistent_workers=True``)."""
        return self._persistent_workers

    def stop_sending_work(self, worker_id: int) -> None:
        """Send no more indices to the worker, without telling it to exit (torch's status flag)."""
        self._workers_status[worker_id] = False

    def tell_worker_to_exit(self, worker_id: int) -> None:
        """Put the exit signal on the worker's index queue (raises if the queue is closed)."""
        self._index_queues[worker_id].put(None)

    def workers_done(self) -> None:
        """Tell every worker to stop working (torch's ``_workers_done_event``): a busy worker skips what is queued."""
        event = getattr(self, "_workers_done_event", None)
        if event is not None:
            event.set()


#: The key of a StatefulDataLoader state saying its iterator had finished (the epoch had ended).
ITERATOR_FINISHED = "_iterator_finished"


def state_finished(state: Any) -> bool:
    """Whether a StatefulDataLoader ``state`` was taken after its iterator finished (torchdata's own key)."""
    return isinstance(state, dict) and state.get(ITERATOR_FINISHED) is True


def is_workers_iterator(iterator: Any) -> bool:
    """Whether ``iterator`` is exactly torchdata's multi-process iterator (not a subclass)."""
    return type(iterator) is _StatefulMultiProcessingDataLoaderIter


def switch_iterator_class(iterator: Any, cls: type[WorkersIterBase]) -> None:
    """Make torchdata's multi-process ``iterator`` an instance of ``cls`` (which adds no fields of torch's)."""
    iterator.__class__ = cls


def worker_processes(iterator: Any) -> list[Any]:
    """The worker processes of a multi-process iterator, by worker id (``[]`` for any other iterator)."""
    return list(getattr(iterator, "_workers", None) or [])


def shut_down_workers(iterator: Any) -> None:
    """Stop ``iterator``'s worker processes, if it has any (``None`` and single-process iterators: nothing)."""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


def has_worker_states(iterator: Any) -> bool:
    """Whether ``iterator``'s workers have sent states (torchdata keeps the latest of each worker)."""
    return bool(getattr(iterator, "_worker_snapshots", None))


def worker_dataset_states(iterator: Any) -> dict[int, Any]:
    """The latest dataset (or dataset iterator) state each worker of a multi-process iterator sent, by worker id.

    torchdata keeps, per worker (keyed ``worker_<id>``), the state dict its
    worker sent last; the dataset's part is its fetcher's
    ``dataset_iter_state`` or its ``dataset_state``.  Only dict states are
    returned; a snapshot torchdata has not filled in yet is left out.
    """
    out: dict[int, Any] = {}
    for key, snapshot in (getattr(iterator, "_worker_snapshots", None) or {}).items():
        try:
            state = snapshot.get_state() or {}
        except Exception:  # a snapshot torchdata has not filled in yet
            continue
        fetcher = state.get("fetcher_state") or {}
        mine = fetcher.get("dataset_iter_state") or state.get("dataset_state")
        if isinstance(mine, dict):
            out[int(str(key).rsplit("_", 1)[-1])] = mine
    return out


# ------------------------------------------------------------------------------- the worker's result queue


def worker_result_queue() -> Any | None:
    """In a DataLoader worker, the queue its worker loop sends batches to the main process on; else ``None``.

    torch's (and torchdata's) worker loop holds it as ``data_queue``; pipekit's
    pipe is iterated from inside that loop, so it is found on the call stack.
    """
    frame = inspect.currentframe()
    try:
        while frame is not None:
            if frame.f_code.co_name == "_worker_loop" and "data_queue" in frame.f_code.co_varnames:
                return frame.f_locals.get("data_queue")
            frame = frame.f_back
    finally:
        del frame
    return None


def on_send_failure(queue: Any, handler: Callable[[BaseException, Any], None]) -> None:
    """Make ``handler(error, obj)`` what ``queue``'s feeder thread calls when pickling ``obj`` fails.

    A ``multiprocessing`` queue pickles what is put on it in a feeder thread;
    when that fails its hook prints the traceback and drops the object, so the
    process waiting for it waits forever.  Takes effect when the feeder thread
    starts (the queue's first put): call it before.
    """
    queue._on_queue_feeder_error = handler


def send_now(queue: Any, obj: Any) -> None:
    """Send ``obj`` on ``queue`` at once, ahead of everything it still holds unsent.

    For a handler of :func:`on_send_failure` (it runs in the queue's feeder
    thread): what replaces the object that could not be sent must arrive
    before what the process put after it (a worker's end-of-data message would
    otherwise reach the main process first, and torch would skip the batch it
    still waits for from that worker).  Sent as the feeder sends, under the
    queue's write lock (other processes write to it too).
    """
    data = ForkingPickler.dumps(obj)
    queue._sem.acquire(False)  # what put() takes for each object (the feeder gave back the failed one's)
    lock = queue._wlock
    if lock is None:
        queue._send_bytes(data)
        return
    with lock:
        queue._send_bytes(data)


def worker_exception(error: BaseException, worker_id: int) -> Any:
    """``error`` as torch's workers send an exception, which the main process re-raises as ``type(error)``."""
    return ExceptionWrapper(
        exc_info=(type(error), error, error.__traceback__), where=f"in DataLoader worker process {worker_id}"
    )


# --------------------------------------------------------------------------------- torch's SIGCHLD handler

_sigchld_wrapped = False


def wrap_sigchld_handler(convert: Callable[[RuntimeError], BaseException | None]) -> None:
    """Wrap the process's SIGCHLD handler (torch's, once a multi-process iterator started), once.

    Global change 7 of the module docstring.  The wrapper calls the handler it
    replaces; a ``RuntimeError`` it raises (torch's: a worker died) becomes
    ``convert(error)``, raised from it, unless that is ``None``.  Does nothing
    outside the main thread (where signal handlers cannot be set) or while the
    handler is not a Python function (torch has not installed its handler).
    """
    global _sigchld_wrapped
    if _sigchld_wrapped or threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGCHLD)
    if not callable(previous):
        return

    def handler(signum: int, frame: Any) -> None:
        try:
            previous(signum, frame)
        except RuntimeError as exc:
            typed = convert(exc)
            if typed is None:
                raise
            raise typed from exc

    signal.signal(signal.SIGCHLD, handler)
    _sigchld_wrapped = True


# ------------------------------------------------------------------------ torchdata's try_to_serialize

# The modules that call torchdata's try_to_serialize: the worker loop and the main process's iterator.
_TORCHDATA_SERIALIZERS = ("torchdata.stateful_dataloader.worker", "torchdata.stateful_dataloader.stateful_dataloader")


def patch_try_to_serialize(shortcut: Callable[[Callable[[Any], Any]], Callable[[Any], Any]]) -> None:
    """Replace torchdata's ``try_to_serialize`` (worker and main process) with ``shortcut(original)``, once.

    Global change 1 of the module docstring.  The replacement is marked
    (``_pipekit_fast``) so a second call leaves it alone; ``shortcut`` must
    keep the original as ``__wrapped__``.
    """
    for name in _TORCHDATA_SERIALIZERS:
        module = sys.modules.get(name) or importlib.import_module(name)
        current = getattr(module, "try_to_serialize", None)
        if current is not None and not getattr(current, "_pipekit_fast", False):
            fast = shortcut(current)
            fast._pipekit_fast = True  # type: ignore[attr-defined]
            module.try_to_serialize = fast


# ------------------------------------------------------------------------------------------ warnings

# torch >= 2.14 warns on every call of its deprecated set_vital, which StatefulDataLoader.__init__ makes.
_SET_VITAL = r"'set_vital' is deprecated"


def ignore_set_vital_warning() -> None:
    """Add a filter for torch's ``set_vital`` deprecation warning only (message and category).

    Global change 4 of the module docstring (process-wide unless called
    inside ``warnings.catch_warnings()``).
    """
    warnings.filterwarnings("ignore", message=_SET_VITAL, category=UserWarning)


# ------------------------------------------------------------------------------ torch's default_collate

# torch's own entry of default_collate_fn_map for each kind, by the function's name in its module.
_TORCH_COLLATE_FNS = {torch.Tensor: "collate_tensor_fn", int: "collate_int_fn", float: "collate_float_fn"}


def torch_collate_tensors(batch: Any, *, collate_fn_map: Any = None) -> torch.Tensor:
    """torch's ``collate_tensor_fn``: stack the tensors (into fresh shared memory inside a worker)."""
    return _torch_collate.collate_tensor_fn(batch, collate_fn_map=collate_fn_map)


def torch_collate_ints(batch: Any, *, collate_fn_map: Any = None) -> torch.Tensor:
    """torch's ``collate_int_fn``: the ints as an int64 tensor."""
    return _torch_collate.collate_int_fn(batch, collate_fn_map=collate_fn_map)


def torch_collate_floats(batch: Any, *, collate_fn_map: Any = None) -> torch.Tensor:
    """torch's ``collate_float_fn``: the floats as a float64 tensor."""
    return _torch_collate.collate_float_fn(batch, collate_fn_map=collate_fn_map)


def replace_default_collate_fns(replacements: Mapping[type, Callable[..., Any]]) -> None:
    """Put ``replacements[kind]`` in torch's ``default_collate_fn_map`` where torch's own entry for it still is.

    Global change 2 of the module docstring.  Kinds: ``torch.Tensor``,
    ``int``, ``float``; an entry a user replaced is kept.
    """
    collate_map = _torch_collate.default_collate_fn_map
    for kind, fn in replacements.items():
        if collate_map.get(kind) is getattr(_torch_collate, _TORCH_COLLATE_FNS[kind], None):
            collate_map[kind] = fn


# ------------------------------------------------------------------ shared-memory storages and pickling


@functools.cache
def have_storage_internals() -> bool:
    """Whether torch has the private storage functions :mod:`pipekit._shm`'s buffer pool needs."""
    try:
        storage = torch.UntypedStorage._new_shared(8)
        torch._C._storage_Use_Count(storage._cdata)
        from torch.multiprocessing import reductions

        reductions.reduce_storage  # noqa: B018 -- present in torch >= 1.x
    except (AttributeError, RuntimeError, ImportError):
        return False
    return True


def new_shared_storage(nbytes: int) -> torch.UntypedStorage:
    """A fresh storage of ``nbytes`` in shared memory."""
    return torch.UntypedStorage._new_shared(nbytes)


def storage_use_count(storage: torch.UntypedStorage) -> int:
    """How many references torch's C++ side holds to ``storage``'s memory (1: only this storage)."""
    return torch._C._storage_Use_Count(storage._cdata)


def torch_storage_reducer() -> Callable[[Any], Any]:
    """torch's reduction of a storage for ``ForkingPickler`` (a file descriptor or file name, and how to rebuild)."""
    from torch.multiprocessing import reductions

    return reductions.reduce_storage


def register_storage_reducer(reduce: Callable[[Any], Any]) -> None:
    """Make ``reduce`` this process's ``ForkingPickler`` reduction of ``torch.UntypedStorage`` (global change 3)."""
    from multiprocessing.reduction import ForkingPickler

    ForkingPickler.register(torch.UntypedStorage, reduce)
