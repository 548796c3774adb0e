"""What leaves a ``pipekit.DataLoader`` worker must pickle: positions made plain data, items refused by name.

A checkpoint holds each worker's pipeline position as plain data (:func:`plain_position`): in-memory archive
members a buffer holds become their bytes, and anything else that cannot be pickled is refused with
:class:`~pipekit.errors.UnsupportedItemError` naming the pipe and the key path (a worker's kept position is
made plain when it is sent: :func:`_materialize_state`).  An item a worker's result queue cannot pickle raises
in the main process, naming the pipe that yielded it (:func:`_watch_sending`), instead of being dropped while
the main process waits.  :func:`find_unpicklable` finds the part that does not pickle, for both.  Used by the
pipe the loader holds in each worker (:mod:`pipekit._loader._pipe`).
"""

from __future__ import annotations

import os
import traceback
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import torch

from pipekit._loader._replay_check import STAMPS
from pipekit._loader_seam import on_send_failure, send_now, worker_exception, worker_result_queue
from pipekit.errors import UnsupportedItemError
from pipekit.pipes._resume import materialize_snapshot
from pipekit.pipes._stream_items import stream_name, streams_as_bytes

__all__ = ["find_unpicklable", "plain_position"]


# -- positions as plain data ---------------------------------------------------------------------

def plain_position(snapshot: dict[str, Any], stages: list[str]) -> dict[str, Any]:
    """A pipeline position (:meth:`SnapshotPlan.snapshot`, lazy or not) as plain data a checkpoint can hold.

    Lazy states are rebuilt; an in-memory stream a pipe holds (a shuffle buffer
    of archive members, which ``load_from_tar`` reads whole) becomes a record of
    its bytes (:func:`~pipekit.pipes._stream_items.streams_as_bytes`), turned
    back into the stream on resume.  A stream that is not in memory (an open
    file, a lazily read member), or anything else that cannot be pickled (a
    lock), raises :class:`~pipekit.errors.UnsupportedItemError` naming the pipe
    (``stages``, by the snapshot's pipe index), the key path and the stream's
    URL or the object's type.
    """
    snapshot = materialize_snapshot(snapshot)
    states = snapshot.get("states")
    if not isinstance(states, list):
        return snapshot
    plain = list(states)
    for i, state in enumerate(states):
        if state is None:
            continue
        stage = stages[i] if i < len(stages) else f"pipe {i}"
        root = stage.split(" ", 1)[0]
        plain[i], found = streams_as_bytes(state, root=root)
        if found is not None:
            raise UnsupportedItemError(_refusal(stage, *found))
        bad = find_unpicklable(plain[i], root, once_per_type=True)
        if bad is not None:
            path, value, why = bad
            raise UnsupportedItemError(
                f"pipekit.DataLoader.state_dict: cannot checkpoint the pipeline: {stage} holds {path}, a "
                f"{type(value).__name__} that cannot be pickled ({why}); a checkpoint holds what buffering pipes "
                "hold: make the items plain data (bytes, tensors, arrays, numbers, strings, lists, dicts) before them"
            )
    if all(a is b for a, b in zip(plain, states, strict=True)):
        return snapshot
    return {**snapshot, "states": plain}


def _refusal(stage: str, path: str, stream: Any) -> str:
    return (
        f"pipekit.DataLoader.state_dict: cannot checkpoint the pipeline: {stage} holds an open stream "
        f"{stream_name(stream)} (at {path}), which a checkpoint cannot hold (it is plain data; streams read "
        "whole into memory, such as load_from_tar's members, are kept as their bytes, open files are not). "
        "Read or decode the items before shuffling or buffering them: e.g. .read_from_stream() or .decode() "
        "before the shuffle, so its buffer holds bytes or tensors"
    )


# -- items a worker cannot send ------------------------------------------------------------------

_watched_pid: int | None = None  # the worker process whose result queue has pipekit's handler


def _watch_sending(stage: str) -> None:
    """In a DataLoader worker, once: a batch its result queue cannot pickle raises in the main process.

    torch's worker loop puts each batch on a queue whose feeder thread pickles
    it; a pickling error there is printed and the batch dropped, and the main
    process waits for it forever.  The handler sends the main process an
    :class:`~pipekit.errors.UnsupportedItemError` for that batch instead,
    naming ``stage`` (the pipe that yielded it), the key path of what could
    not be pickled and its type.  Called when the pipeline starts in the
    worker, before the worker's first batch.
    """
    global _watched_pid
    if _watched_pid == os.getpid():
        return
    queue = worker_result_queue()
    if queue is None:
        return
    _watched_pid = os.getpid()

    def on_failure(error: BaseException, obj: Any) -> None:
        try:
            idx, (data, worker_id, state) = obj
        except (TypeError, ValueError):  # not a batch (an acknowledgement): what the queue's own hook does
            traceback.print_exception(error)
            return
        found = find_unpicklable(data, "batch" if isinstance(data, list) else "item")
        what = "an item"
        if found is None and state is not None:
            found, what = find_unpicklable(state, "state"), "its position"
        if found is None:
            detail = f"it cannot be pickled ({type(error).__name__}: {error})"
        else:
            path, value, why = found
            detail = f"{path} is a {type(value).__name__} ({why})"
        failure = UnsupportedItemError(
            f"pipekit.DataLoader: {stage} yielded {what} that a DataLoader worker cannot send to the main "
            f"process: {detail}; items cross to the main process pickled: make them plain data inside the "
            "pipeline (bytes, tensors, arrays, numbers, strings, lists, dicts): read streams (.read_from_stream(), "
            ".decode()), and leave generators, locks and open files out of the items"
        )
        send_now(queue, (idx, (worker_exception(failure, worker_id), worker_id, None)))

    on_send_failure(queue, on_failure)


# Exact types that always pickle (tensors and arrays are not pickled here to find out: they would be copied).
_PICKLABLE = frozenset({int, float, bool, str, bytes, bytearray, type(None), torch.Tensor, np.ndarray})


def find_unpicklable(value: Any, root: str = "item", once_per_type: bool = False) -> tuple[str, Any, str] | None:
    """``(key path, object, why)`` of the first part of ``value`` that cannot be pickled, or ``None``.

    Looks into dicts, lists and tuples; every other object is pickled on its
    own (as the worker's queue pickles it).  ``once_per_type``: an object of a
    type that pickled once is taken to pickle (a checkpoint's shuffle buffer
    of 10,000 images is checked with one pickled image).
    """
    stack: list[tuple[tuple[Any, ...], Any]] = [((), value)]
    fine: set[type] = set()
    while stack:
        path, obj = stack.pop()
        kind = type(obj)
        if kind in _PICKLABLE or kind in fine:
            continue
        if isinstance(obj, dict):
            stack += reversed([((*path, k), v) for k, v in obj.items()])
            continue
        if isinstance(obj, list | tuple):
            stack += reversed([((*path, i), v) for i, v in enumerate(obj)])
            continue
        try:
            ForkingPickler.dumps(obj)
        except Exception as exc:
            return root + "".join(f"[{key!r}]" for key in path), obj, f"{type(exc).__name__}: {exc}"
        if once_per_type:
            fine.add(kind)
    return None


def _materialize_state(stages: list[str], state: dict[str, Any]) -> dict[str, Any]:
    """A worker's kept position as plain data (see :func:`plain_position`), before it is sent."""
    pipes = state.get("pipes")
    if state.get("mode") == "snapshot" and isinstance(pipes, dict):
        plain = plain_position(pipes, stages)
        if plain is not pipes:
            state = {**state, "pipes": plain}
    stamps = state.get(STAMPS)
    if stamps is not None and not isinstance(stamps, dict):  # a StampsAt (pipekit.pipes._stamps)
        state = {**state, STAMPS: stamps.materialize()}
    return state

