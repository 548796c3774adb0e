"""What a process carries from an epoch that ran to its end into the next: the part of an end-of-epoch checkpoint.

A checkpoint taken at the end of an epoch holds no positions (the next
``iter()`` starts a new epoch), but a process that goes on into the next epoch
(the main process without workers, or a persistent worker) keeps two kinds of
things from the last one, which a resumed run's new processes must start from
to give the same next epoch (the streams' positions are in mid-epoch positions too:
:func:`stream_states`):

* pipes that keep something across epochs (``keeps_across_epochs``:
  ``in_memory_cache``'s frozen cache; :func:`pipekit.pipes._resume.epoch_carry`);
* the random streams of transforms held by the pipeline's functions
  (:class:`pipekit.transforms.seeding.RandomStream`: an augmentation in a
  ``map``), which seed themselves once per process from the worker's seed
  (:func:`pipekit._seeds.stream_seed`) and go on drawing through the epochs.

:func:`process_carry` takes both as plain data, :func:`apply_carry` puts them
into a fresh copy of the pipeline before its first epoch.  (The global
generators of a persistent worker travel beside them: ``WORKER_RNG``.)
"""

from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np
import torch

from pipekit._seeds import worker_id
from pipekit.pipes._resume import epoch_carry, restore_pipeline
from pipekit.pipes._stream_items import streams_from_bytes
from pipekit.pipes.base import IterDataPipe, MapDataPipe

__all__ = ["apply_carry", "find_streams", "load_streams", "process_carry", "stream_states"]

_DEPTH = 6  # how deep into a pipe's attributes (a transform inside a Compose inside a function) streams are looked for
_WIDE = 64  # containers with more entries are not looked into (a dataset's file table, a buffer)
_LEAVES = (str, bytes, bytearray, int, float, bool, type(None), torch.Tensor, np.ndarray, IterDataPipe, MapDataPipe)


def _is_stream(obj: Any) -> bool:
    """A per-process random stream: ``RandomStream``'s protocol (``reseed``, ``state_dict``, ``load_state_dict``).

    Known by what it does rather than by class: the loader sits below :mod:`pipekit.transforms`.
    """
    cls = type(obj)
    return all(callable(getattr(cls, name, None)) for name in ("reseed", "state_dict", "load_state_dict")) and hasattr(
        obj, "salt"
    )


def _started_here(stream: Any) -> bool:
    """Whether ``stream`` has seeded itself in this process (its state is this process's: asking does not seed it)."""
    return getattr(stream, "_owner", None) == (os.getpid(), worker_id())


def find_streams(pipes: list[Any]) -> list[Any]:
    """The random streams the pipes' attributes hold (their functions, transforms...), in a fixed order.

    The same pipeline built the same way gives the same streams in the same
    order, in any process (what :func:`apply_carry` relies on).
    """
    found: list[Any] = []
    seen: set[int] = set()

    def visit(obj: Any, depth: int) -> None:
        if id(obj) in seen or isinstance(obj, _LEAVES) or depth > _DEPTH:
            return
        seen.add(id(obj))
        if _is_stream(obj):
            found.append(obj)
            return
        if isinstance(obj, dict):
            if len(obj) <= _WIDE:
                for value in obj.values():
                    visit(value, depth + 1)
            return
        if isinstance(obj, list | tuple | set | frozenset):
            if len(obj) <= _WIDE:
                for value in obj:
                    visit(value, depth + 1)
            return
        if isinstance(obj, functools.partial):
            visit(obj.func, depth + 1)
            visit(obj.args, depth + 1)
            visit(obj.keywords, depth + 1)
            return
        attributes = getattr(obj, "__dict__", None)
        if isinstance(attributes, dict):
            visit(attributes, depth)

    for dp in pipes:
        seen.add(id(dp))
        for value in vars(dp).values() if hasattr(dp, "__dict__") else ():
            visit(value, 1)
    return found


def process_carry(pipes: list[Any], streams: list[Any], stages: list[str],
                  plain: Any) -> dict[str, Any] | None:
    """What this process carries into the next epoch, as plain data, or ``None`` when nothing.

    ``{"pipes": pipeline state of the pipes that keep something across epochs, "streams": [each stream's
    state, or None for one not started in this process]}`` (either key absent when empty); ``plain``
    turns a pipeline state into plain data (:func:`pipekit._loader._sending.plain_position`, with ``stages``).
    """
    carry: dict[str, Any] = {}
    kept = epoch_carry(pipes)
    if kept is not None:
        carry["pipes"] = plain(kept, stages)
    states = stream_states(streams)
    if states is not None:
        carry["streams"] = states
    return carry or None


def stream_states(streams: list[Any]) -> list[Any] | None:
    """Each stream's position (``None`` for one not started in this process), or ``None`` when none has started.

    A checkpoint's position holds them too (mid-epoch, the items after it get the draws they got), beside the
    process's global generators.
    """
    if not streams:
        return None
    states = [stream.state_dict() if _started_here(stream) else None for stream in streams]
    return states if any(state is not None for state in states) else None


def load_streams(streams: list[Any], states: Any) -> None:
    """Put back :func:`stream_states` into the same streams of a fresh copy (another count of streams: nothing)."""
    if isinstance(states, list) and len(states) == len(streams):
        for stream, state in zip(streams, states, strict=True):
            if state is not None:
                stream.load_state_dict(state)


def apply_carry(pipe: IterDataPipe, streams: list[Any], carry: dict[str, Any]) -> None:
    """Start a fresh copy of the pipeline (before its first epoch) from what :func:`process_carry` took."""
    if carry.get("pipes") is not None:
        # loaded as the pipes' positions at the end of the last epoch; the epoch's start drops them, and pipes that
        # keep something across epochs keep it (pipekit.pipes._resume.drop_pending)
        restore_pipeline(pipe, streams_from_bytes(carry["pipes"]))
    load_streams(streams, carry.get("streams"))
