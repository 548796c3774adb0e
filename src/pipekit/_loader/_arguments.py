"""The arguments of ``pipekit.DataLoader``, checked up front, and the warning for a DataPipe it cannot split.

Torch and torchdata check some of their arguments with ``assert`` or inside
the workers; :func:`check_worker_options` and :func:`check_seconds` check
them when the loader is made, with messages naming them.
:func:`warn_if_unsharded` warns when a DataPipe without a sharding point
(:func:`sharding_points`) runs in several processes or ranks.
"""

from __future__ import annotations

import inspect
import numbers
import warnings
from typing import Any

import torch
import torch.distributed as dist

from pipekit._validate import check_int
from pipekit.pipes._resume import pipeline_pipes
from pipekit.pipes.base import IterDataPipe

__all__ = [
    "check_dataset",
    "check_generator",
    "check_seconds",
    "check_worker_options",
    "sharding_points",
    "warn_if_unsharded",
    "world_size",
]

_WHERE = "pipekit.DataLoader"


def sharding_points(pipe: IterDataPipe) -> list[Any]:
    """The pipes of ``pipe``'s graph that split it across workers and ranks.

    A sharding point is a pipe with an ``apply_sharding`` method (torch's
    criterion): ``sharding_filter``, or a source that shards itself.
    """
    return [dp for dp in pipeline_pipes(pipe) if inspect.ismethod(getattr(dp, "apply_sharding", None))]


def _describe(pipe: IterDataPipe) -> str:
    """``IterableWrapper -> Mapper -> Batcher``: the pipe's graph, from its sources, for messages."""
    names = [type(dp).__name__.removesuffix("IterDataPipe") for dp in reversed(pipeline_pipes(pipe))]
    if len(names) > 8:
        names = [*names[:3], "...", *names[-4:]]
    return " -> ".join(names)


def warn_if_unsharded(
    pipe: IterDataPipe,
    num_workers: int,
    world_size: int,
    stacklevel: int = 2,
    loader: str = "pipekit.DataLoader",
    opt_out: str = "pass warn_unsharded=False",
) -> bool:
    """Warn (``UserWarning``) when ``pipe`` runs in workers or ranks but has no sharding point.

    Without one, each of the ``num_workers`` worker processes (at least one
    process) of each of the ``world_size`` ranks yields every item of the pipe.
    Returns whether it warned.  ``stacklevel`` is counted from the caller;
    ``loader`` and ``opt_out`` (how to silence it) go into the message.
    """
    if num_workers == 0 and world_size <= 1:
        return False
    if sharding_points(pipe):
        return False
    copies = max(num_workers, 1) * world_size
    if copies > 1:
        where = (
            f"runs in {max(num_workers, 1)} process(es) on each of {world_size} rank(s), and each yields every item: "
            f"every item comes {copies} times per epoch"
        )
    else:
        where = "runs in a worker process, and cannot be split: with more workers or ranks each would yield every item"
    warnings.warn(
        f"{loader}: the DataPipe {_describe(pipe)} has no sharding point (no sharding_filter, nor a pipe that applies "
        f"sharding) but {where}. Add .sharding_filter() after the source (after its shuffle), or {opt_out} if every "
        "worker and rank is meant to read it all.",
        UserWarning,
        stacklevel=stacklevel + 1,
    )
    return True


def world_size() -> int:
    """The number of ``torch.distributed`` ranks (1 without a process group)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def check_seconds(value: Any, name: str, minimum_excluded: bool = False) -> float:
    """A number of seconds, ``>= 0`` (``> 0`` with ``minimum_excluded``), as a float; messages as _validate's."""
    what = "a number of seconds > 0" if minimum_excluded else "a number of seconds >= 0"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{_WHERE}: {name} must be {what}, got {type(value).__name__} {value!r:.50}")
    if value < 0 or (minimum_excluded and value == 0):
        raise ValueError(f"{_WHERE}: {name} must be {what}, got {value}")
    return float(value)


def check_dataset(dataset: Any) -> None:
    """A dataset torch can load from: iterable (``__iter__``) or indexable (``__getitem__``).

    torch accepts any object when the loader is made and fails at the first ``iter()`` with a message that
    names neither the loader nor the argument (``object of type 'int' has no len()``).
    """
    kind = type(dataset)
    if not (callable(getattr(kind, "__iter__", None)) or callable(getattr(kind, "__getitem__", None))):
        raise TypeError(
            f"{_WHERE}: dataset must be a DataPipe, an IterableDataset or a Dataset (an object with __iter__ or "
            f"__getitem__), got {kind.__name__} {dataset!r:.50}"
        )


def check_generator(generator: Any) -> None:
    """``generator=`` as torch's DataLoader uses it: a ``torch.Generator`` or ``None``.

    torch takes anything and fails at the first ``iter()`` inside its draw of the epoch's seeds
    (``random_() received an invalid combination of arguments``).
    """
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(
            f"{_WHERE}: generator must be a torch.Generator or None, got {type(generator).__name__} {generator!r:.50}"
        )


def check_worker_options(num_workers: int, persistent_workers: bool | None, kwargs: dict[str, Any]) -> None:
    """torch's and torchdata's worker options, checked before they become asserts or worker tracebacks."""
    prefetch = kwargs.get("prefetch_factor")
    if prefetch is not None:
        if num_workers == 0:
            raise ValueError(
                f"{_WHERE}: prefetch_factor applies to worker processes only (batches each worker loads "
                f"ahead); pass num_workers > 0, or leave prefetch_factor None, got {prefetch!r} with num_workers=0"
            )
        check_int(prefetch, "prefetch_factor", _WHERE, minimum=1)
    timeout = kwargs.get("timeout", 0)
    check_seconds(timeout, "timeout")
    if timeout > 0 and num_workers == 0:
        raise ValueError(
            f"{_WHERE}: timeout applies to worker processes only (how long to wait for a worker's batch); pass "
            f"num_workers > 0, or timeout=0, got timeout={timeout} with num_workers=0"
        )
    if persistent_workers and num_workers == 0:
        raise ValueError(
            f"{_WHERE}: persistent_workers=True needs worker processes (num_workers > 0), got num_workers=0"
        )
    if "snapshot_every_n_steps" in kwargs:
        check_int(kwargs["snapshot_every_n_steps"], "snapshot_every_n_steps", _WHERE, minimum=1)
