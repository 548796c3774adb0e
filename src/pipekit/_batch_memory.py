"""Where a batch's memory comes from: pinned host memory, or a DataLoader worker's pool of shared buffers.

:func:`empty_host` allocates the batches :mod:`pipekit.collate` stacks; :func:`use_shared_buffers_in_default_collate`
makes torch's own ``default_collate`` stack into the worker's pool too.  Both are public in :mod:`pipekit.collate`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from pipekit import _shm as shm
from pipekit._loader_seam import (
    replace_default_collate_fns,
    torch_collate_floats,
    torch_collate_ints,
    torch_collate_tensors,
)


def empty_host(shape: Sequence[int], dtype: torch.dtype, pin_memory: bool = False) -> torch.Tensor:
    """An uninitialised CPU tensor for a batch.

    * ``pin_memory`` and CUDA available: page-locked, from torch's caching host
      allocator (blocks are reused after the tensors that held them are freed);
    * inside a DataLoader worker: in shared memory, as
      :func:`torch.utils.data.default_collate` does, so the batch reaches the
      main process without being copied into shared memory on the way; the
      memory is a buffer of an earlier batch once the main process has
      released it (:func:`pipekit._shm.empty_shared`), instead of fresh pages;
    * otherwise ordinary memory.
    """
    shape = tuple(shape)
    if pin_memory and torch.cuda.is_available():
        return torch.empty(shape, dtype=dtype, pin_memory=True)
    if torch.utils.data.get_worker_info() is not None:
        return _empty_shared(shape, dtype)
    return torch.empty(shape, dtype=dtype)


def _empty_shared(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    try:
        return shm.empty_shared(shape, dtype)
    except (AttributeError, RuntimeError):  # private API: fall back to the copy torch would make anyway
        return torch.empty(shape, dtype=dtype)


# -- torch's default_collate in pipekit's DataLoader workers: batches in reused shared memory ------------


def _collate_tensors_shared(batch: Sequence[torch.Tensor], *, collate_fn_map: Any = None) -> torch.Tensor:
    """torch's ``collate_tensor_fn``, stacking into a buffer of the worker's pool (:func:`empty_host`)."""
    elem = batch[0]
    if (
        torch.utils.data.get_worker_info() is None
        or elem.layout != torch.strided
        or elem.is_nested
        or elem.device.type != "cpu"
        or not all(type(t) is torch.Tensor for t in batch)  # subclasses: torch's own path, as they expect
    ):
        return torch_collate_tensors(batch, collate_fn_map=collate_fn_map)
    return torch.stack(batch, 0, out=_empty_shared((len(batch), *elem.shape), elem.dtype))


def _to_shared(t: torch.Tensor) -> torch.Tensor:
    if torch.utils.data.get_worker_info() is None:
        return t
    out = _empty_shared(tuple(t.shape), t.dtype)
    out.copy_(t)
    return out


def _collate_ints_shared(batch: Sequence[int], *, collate_fn_map: Any = None) -> torch.Tensor:
    return _to_shared(torch_collate_ints(batch, collate_fn_map=collate_fn_map))


def _collate_floats_shared(batch: Sequence[float], *, collate_fn_map: Any = None) -> torch.Tensor:
    return _to_shared(torch_collate_floats(batch, collate_fn_map=collate_fn_map))


_SHARED_COLLATE = {torch.Tensor: _collate_tensors_shared, int: _collate_ints_shared, float: _collate_floats_shared}


def use_shared_buffers_in_default_collate(worker_id: int | None = None) -> None:
    """In this DataLoader worker, make torch's ``default_collate`` build batches in reused shared memory.

    ``default_collate`` already stacks tensors into fresh shared memory in a
    worker (so the batch is not copied on its way to the main process), and
    returns numbers as ordinary tensors that torch copies into fresh shared
    memory when it sends them.  pipekit's workers take both from the worker's
    pool of buffers instead (:func:`pipekit._shm.empty_shared`), which the main
    process keeps mapped, so a batch costs neither new pages nor a file
    descriptor passed per tensor.  Only torch's own entries of
    ``torch.utils.data._utils.collate.default_collate_fn_map`` are replaced
    (an entry a user replaced is kept), the values, dtypes and shapes are
    torch's, and tensor subclasses, non-strided and non-CPU tensors keep torch's
    path.  :class:`pipekit.DataLoader` calls this in each worker it starts
    (``PIPEKIT_SHM_POOL=0`` turns it off); with torch's own DataLoader, pass it
    as ``worker_init_fn`` (``worker_id`` is accepted and unused).

    Example:
        >>> import torch
        >>> from pipekit.collate import use_shared_buffers_in_default_collate
        >>> loader = torch.utils.data.DataLoader(
        ...     list(range(8)), batch_size=4, num_workers=1, worker_init_fn=use_shared_buffers_in_default_collate
        ... )
        >>> [batch.tolist() for batch in loader]
        [[0, 1, 2, 3], [4, 5, 6, 7]]
    """
    replace_default_collate_fns(_SHARED_COLLATE)
