"""Reused shared-memory batch buffers for DataLoader workers.

A DataLoader worker hands each batch to the main process in shared memory.
Allocating that memory fresh for every batch is what makes workers slow for
large samples: a new shared-memory segment per tensor, its pages allocated and
zeroed in the worker, mapped in the main process and freed again when the
batch is dropped -- about 1 ms per MiB on the development machine, more than
reading a warm 256 px geo patch (``benchmarks/geo_worker_cpu.py``).

:func:`empty_shared` gives a worker's collate function an uninitialised tensor
in shared memory that comes, where it can, from a per-worker pool of buffers
that the main process has released, so their pages are written again instead
of allocated again.  :func:`pipekit.collate.empty_host` (hence
:func:`pipekit.collate.collate`, :func:`pipekit.collate.pad_collate` and
:func:`pipekit.geo.stack_samples`) uses it inside workers.

A buffer is reused only when both hold:

* no tensor in the worker refers to it any more (its storage's use count is
  the pool's own reference), and
* every time it was sent to another process, that process has released it.

The second is counted: the worker's pickler (installed in
``multiprocessing.reduction.ForkingPickler`` for ``torch.UntypedStorage``, in
the worker process only, the first time the pool is used) counts each send of
a pool buffer, and the receiving process, when it rebuilds the buffer, attaches
a finalizer that counts the release when the last tensor viewing it is gone.
The release counts live in a small shared segment of the worker's that travels
with the batches until the receiving process acknowledges it.

A buffer is *sent by reference* after its first trip: the receiving process
keeps the buffers it has mapped (by worker and slot) and marks them in the
shared segment; when the worker sends a marked buffer again it sends its slot
number instead of its file descriptor, and the receiver wraps its mapping in a
new storage whose release is counted as before.  torch's own transport passes
the file descriptor over a socket with an authentication handshake for every
tensor of every batch (about 0.1-0.2 ms of CPU a tensor, split between the two
processes); a buffer sent by reference costs a dictionary lookup.  The
receiver drops its mappings of a worker's buffers when pipekit's DataLoader
shuts that worker down, or, for other loaders, when the next worker's pool
registers and the old worker is found dead.  A batch that is
pickled but never unpickled (a queue dropped at shutdown) keeps its buffers out
of the pool for good: the failure mode is a buffer never reused, never one
reused too early.  When the pool has no free buffer of the size and is full
(:data:`MAX_BUFFERS`, :data:`MAX_BYTES` per worker), or torch lacks the
private functions this relies on, the tensor is fresh shared memory, as
:func:`torch.utils.data.default_collate` makes it.

Set ``PIPEKIT_SHM_POOL=0`` in the environment to turn the pool off (every
batch then gets fresh shared memory).

Example:
    >>> import torch
    >>> from pipekit import _shm as shm
    >>> t = shm.empty_shared((2, 3), torch.float32)   # outside a worker: fresh shared memory
    >>> t.shape, t.dtype, t.is_shared()
    (torch.Size([2, 3]), torch.float32, True)
"""

from __future__ import annotations

import math
import os
import sys
import threading
import uuid
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from pipekit._loader_seam import (
    have_storage_internals,
    new_shared_storage,
    register_storage_reducer,
    storage_use_count,
    torch_storage_reducer,
)

__all__ = ["MAX_BUFFERS", "MAX_BYTES", "ENV_VAR", "empty_shared", "pool_enabled", "pool_stats", "forget_workers"]

#: Most buffers one worker keeps (a batch of ``image`` and ``mask`` uses two; the DataLoader keeps
#: ``prefetch_factor`` batches per worker in flight, and the main process holds one or two more).
MAX_BUFFERS = 32
#: Most bytes of buffers one worker keeps.
MAX_BYTES = 1 << 30
#: Environment variable that turns the pool off when set to ``0``, ``false`` or ``no``.
ENV_VAR = "PIPEKIT_SHM_POOL"

_HEADER = 1  # counters[0]: set to 1 by the receiving process once it holds the release counters
# counters[_HEADER:_HEADER + n]: the releases of each slot (counted by the receiver);
# counters[_HEADER + n:_HEADER + 2 * n]: the generation of the buffer the receiver holds mapped in each slot
# (0: none), n being the number of slots the pool was made with.


def _slots_of(counters: np.ndarray) -> int:
    return (len(counters) - _HEADER) // 2


def pool_enabled() -> bool:
    """Whether :func:`empty_shared` may reuse buffers (``PIPEKIT_SHM_POOL`` not ``0``/``false``/``no``, and
    torch has the private functions the pool needs)."""
    if os.environ.get(ENV_VAR, "1").strip().lower() in ("0", "false", "no"):
        return False
    return have_storage_internals()


_fresh = new_shared_storage  # a fresh storage of ``nbytes`` in shared memory


def _view(storage: torch.UntypedStorage, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(0, dtype=dtype).set_(storage, 0, shape)


@dataclass
class _Slot:
    storage: torch.UntypedStorage
    nbytes: int  # 0: a retired slot (its counters carry on with the next buffer put in it)
    sent: int = 0  # times the worker's pickler sent it
    gen: int = 0  # which buffer of this slot it is (1, 2, ...): the receiver's mapping names it


@dataclass
class _Pool:
    """One worker's buffers; ``counters`` (shared) holds, per slot, the releases counted by the receiver."""

    pid: int
    token: str
    counters_storage: torch.UntypedStorage
    counters: np.ndarray  # int64 [1 + 2 * MAX_BUFFERS]: the header, the releases, the mapped generations
    slots: list[_Slot] = field(default_factory=list)
    by_ptr: dict[int, int] = field(default_factory=dict)
    reused: int = 0
    fresh: int = 0
    unpooled: int = 0
    by_reference: int = 0  # sends of a buffer the receiver had mapped already

    def free(self, i: int) -> bool:
        """Whether buffer ``i`` is held by the pool alone and every send of it has been released."""
        slot = self.slots[i]
        return (
            slot.nbytes > 0
            and sys.getrefcount(slot.storage) == 2  # the slot's reference and the argument's
            and storage_use_count(slot.storage) == 1
            and slot.sent == int(self.counters[_HEADER + i])
        )

    def take(self, nbytes: int) -> torch.UntypedStorage:
        best = -1
        for i, slot in enumerate(self.slots):  # the smallest free buffer that fits, at most twice the size
            fits = nbytes <= slot.nbytes <= 2 * nbytes and (best < 0 or slot.nbytes < self.slots[best].nbytes)
            if fits and self.free(i):
                best = i
                if slot.nbytes == nbytes:
                    break
        if best >= 0:
            self.reused += 1
            return self.slots[best].storage
        # a new buffer: in a retired slot or a new one, making room by retiring free buffers that do not fit
        total = sum(s.nbytes for s in self.slots)
        place = next((i for i, s in enumerate(self.slots) if s.nbytes == 0), None)
        if place is None and len(self.slots) < min(MAX_BUFFERS, _slots_of(self.counters)):
            place = len(self.slots)
        for i in range(len(self.slots)):
            if place is not None and total + nbytes <= MAX_BYTES:
                break
            if self.free(i):
                total -= self.slots[i].nbytes
                self._retire(i)
                place = i if place is None else place
        storage = _fresh(nbytes)
        if place is None or total + nbytes > MAX_BYTES:
            self.unpooled += 1
            return storage
        self.fresh += 1
        if place == len(self.slots):
            self.slots.append(_Slot(storage, nbytes, gen=1))
        else:
            old = self.slots[place]
            self.slots[place] = _Slot(storage, nbytes, sent=old.sent, gen=old.gen + 1)
        self.by_ptr[storage.data_ptr()] = place
        return storage

    def _retire(self, i: int) -> None:
        slot = self.slots[i]
        del self.by_ptr[slot.storage.data_ptr()]
        self.slots[i] = _Slot(_EMPTY, 0, sent=slot.sent, gen=slot.gen)
        # Every send of it is released, so no batch of it is on its way: the receiver may unmap it
        # (it does when the next new buffer arrives).
        self.counters[_HEADER + _slots_of(self.counters) + i] = 0


_EMPTY = torch.UntypedStorage(0)
_pool: _Pool | None = None
_pool_lock = threading.Lock()
_take_lock = threading.Lock()


def _worker_pool() -> _Pool:
    global _pool
    pid = os.getpid()
    if _pool is None or _pool.pid != pid:
        with _pool_lock:
            if _pool is None or _pool.pid != pid:
                n = _HEADER + 2 * MAX_BUFFERS
                counters_storage = _fresh(n * 8)
                counters = _view(counters_storage, (n,), torch.int64).numpy()
                counters[:] = 0
                _install_reducer()
                _pool = _Pool(pid, f"{pid}-{uuid.uuid4().hex}", counters_storage, counters)
    return _pool


def empty_shared(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised tensor in shared memory, from the worker's pool of released buffers where it can.

    Inside a DataLoader worker (with the pool on) the memory is a pool buffer
    once the main process has released it, else fresh; elsewhere it is fresh
    shared memory.  Write a batch into it and return it from the collate
    function: it reaches the main process without a copy.

    Args:
        shape: the tensor's shape.
        dtype: its dtype.
    """
    shape = tuple(int(n) for n in shape)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0 or not pool_enabled() or torch.utils.data.get_worker_info() is None:
        return _view(_fresh(max(nbytes, 1)), shape, dtype) if nbytes else torch.empty(shape, dtype=dtype)
    pool = _worker_pool()
    with _take_lock:  # the buffer is free until the view exists: one taker at a time
        return _view(pool.take(nbytes), shape, dtype)


def pool_stats() -> dict[str, int]:
    """This process's pool: ``buffers`` and ``bytes`` held, tensors served from ``reused`` buffers, from
    ``fresh`` buffers added to the pool, ``unpooled`` (the pool full), and the sends of a buffer the
    receiving process had mapped already (``by_reference``: no file descriptor passed)."""
    pool = _pool if _pool is not None and _pool.pid == os.getpid() else None
    if pool is None:
        return {"buffers": 0, "bytes": 0, "reused": 0, "fresh": 0, "unpooled": 0, "by_reference": 0}
    live = [s for s in pool.slots if s.nbytes]
    return {
        "buffers": len(live),
        "bytes": sum(s.nbytes for s in live),
        "reused": pool.reused,
        "fresh": pool.fresh,
        "unpooled": pool.unpooled,
        "by_reference": pool.by_reference,
    }


# ------------------------------------------------------------------------------------------ pickling

_torch_reduce_storage: Callable[[Any], Any] | None = None
_install_lock = threading.Lock()


def _install_reducer() -> None:
    """Route this process's ``ForkingPickler`` reduction of ``torch.UntypedStorage`` through
    :func:`_reduce_storage` (which hands every other storage to torch's own reduction)."""
    global _torch_reduce_storage
    with _install_lock:
        if _torch_reduce_storage is None:
            _torch_reduce_storage = torch_storage_reducer()
        register_storage_reducer(_reduce_storage)


def _reduce_storage(storage: torch.UntypedStorage) -> Any:
    """Count a send of one of this worker's pool buffers (by reference where the receiver holds it mapped);
    send a copy of a buffer received from a worker's pool (its release here would let the worker reuse it
    under the next receiver); else torch's reduction."""
    assert _torch_reduce_storage is not None
    if storage.device.type == "cpu":
        ptr = storage.data_ptr()
        received = _received.get(ptr)
        if received is not None and received() is storage:
            copy = _fresh(storage.nbytes())
            copy.copy_(storage)
            return _torch_reduce_storage(copy)
        pool = _pool
        if pool is not None and pool.pid == os.getpid():
            i = pool.by_ptr.get(ptr)
            if i is not None and pool.slots[i].storage is storage:
                slot = pool.slots[i]
                mapped = int(pool.counters[_HEADER + _slots_of(pool.counters) + i])
                slot.sent += 1
                if mapped == slot.gen:  # the receiver holds this very buffer mapped: name it
                    pool.by_reference += 1
                    return (_rebuild_by_reference, (pool.token, i, slot.gen))
                reduced = _torch_reduce_storage(storage)
                counters = pool.counters_storage if pool.counters[0] == 0 else None  # until acknowledged
                return (_rebuild_pooled, (reduced[0], reduced[1], pool.token, i, counters, slot.gen))
    return _torch_reduce_storage(storage)


@dataclass
class _Remote:
    """A worker's pool as a receiving process sees it."""

    pid: int
    counters: np.ndarray  # the worker's shared counters (see _HEADER)
    mapped: dict[int, tuple[int, np.ndarray]] = field(default_factory=dict)  # slot -> (generation, its bytes)


_remote: dict[str, _Remote] = {}  # worker token -> its pool
_received: dict[int, weakref.ref] = {}  # data_ptr -> a live pool buffer received from a worker
_remote_lock = threading.Lock()


def _rebuild_pooled(
    rebuild: Callable[..., torch.UntypedStorage],
    args: tuple[Any, ...],
    token: str,
    slot: int,
    counters_storage: torch.UntypedStorage | None,
    gen: int,
) -> torch.UntypedStorage:
    """Rebuild a pool buffer sent by a worker (its file descriptor); keep it mapped, so that the worker's
    next sends of it come by reference, and count its release when the last view of this send is gone."""
    storage = rebuild(*args)
    entry = _remote.get(token)
    if entry is None and counters_storage is not None:
        with _remote_lock:
            entry = _remote.get(token)
            if entry is None:
                _forget_dead_workers()
                counters = _view(counters_storage, (counters_storage.nbytes() // 8,), torch.int64).numpy()
                entry = _Remote(int(token.split("-", 1)[0]), counters)
                _remote[token] = entry
                counters[0] = 1  # acknowledged: the worker stops sending them
    if entry is None:  # the counters never came: the worker never reuses this buffer
        return storage
    if _torch_reduce_storage is None:
        _install_reducer()  # a re-send from this process must be a copy
    data = _view(storage, (storage.nbytes(),), torch.uint8).numpy()
    with _remote_lock:
        base = _HEADER + _slots_of(entry.counters)
        for other, (other_gen, _) in list(entry.mapped.items()):  # buffers the worker has retired
            if int(entry.counters[base + other]) != other_gen:
                del entry.mapped[other]
        entry.mapped[slot] = (gen, data)
        entry.counters[base + slot] = gen  # the worker may name it from now on
    return _alias(entry, slot, data)


def _rebuild_by_reference(token: str, slot: int, gen: int) -> torch.UntypedStorage:
    """A pool buffer a worker sent by reference: a new storage over this process's mapping of it."""
    entry = _remote.get(token)
    hit = entry.mapped.get(slot) if entry is not None else None
    if entry is None or hit is None or hit[0] != gen:
        raise RuntimeError(
            f"pipekit._shm: DataLoader worker (pid {token.split('-', 1)[0]}) sent its shared-memory batch buffer "
            f"{slot} (generation {gen}) by reference, but this process does not hold that buffer mapped "
            f"(it holds {None if hit is None else hit[0]}); a batch from a pipekit worker can only be unpickled "
            f"by the process that started the worker. Set {ENV_VAR}=0 to send every batch in fresh memory"
        )
    return _alias(entry, slot, hit[1])


def _alias(entry: _Remote, slot: int, data: np.ndarray) -> torch.UntypedStorage:
    """A storage of its own over ``data`` (a mapped pool buffer), whose release is counted when it is gone."""
    view = data.view()  # a new array object: it lives exactly as long as the storage made from it
    storage = torch.frombuffer(view, dtype=torch.uint8).untyped_storage()
    ptr = storage.data_ptr()
    _received[ptr] = weakref.ref(storage)
    release = weakref.finalize(view, _count_release, entry.counters, _HEADER + slot, ptr)
    release.atexit = False  # at exit the workers are gone: nothing to count
    return storage


def _count_release(counters: np.ndarray, index: int, ptr: int) -> None:
    ref = _received.get(ptr)
    if ref is not None and ref() is None:
        del _received[ptr]
    # one ufunc call, not interleaved with another thread's finalizer (a lost count would only keep the
    # buffer out of the pool)
    np.add(counters[index : index + 1], 1, out=counters[index : index + 1])


def forget_workers(pids: Iterable[int]) -> None:
    """Drop this process's mappings of the pool buffers of the workers ``pids`` (they have exited).

    pipekit's DataLoader calls it when it shuts its workers down; batches still
    held keep their own buffers alive.  Other loaders' dead workers are
    forgotten when the next worker's pool registers.
    """
    pids = set(pids)
    with _remote_lock:
        for token, entry in list(_remote.items()):
            if entry.pid in pids:
                del _remote[token]


def _forget_dead_workers() -> None:
    for token, entry in list(_remote.items()):
        try:
            os.kill(entry.pid, 0)
        except ProcessLookupError:
            del _remote[token]  # the finalizers of its buffers hold the counters they need
        except PermissionError:
            pass
