"""Helpers for testing pipes, usable by pipekit's tests and by users writing their own pipes."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

from pipekit.pipes._resume import not_snapshot_capable, prepare_for_resume, restore_pipeline, snapshot_pipeline
from pipekit.pipes.base import IterDataPipe

__all__ = ["assert_resumes", "resume_after"]


def resume_after(make_pipe: Callable[[], IterDataPipe], n: int) -> tuple[list[Any], list[Any]]:
    """Take ``n`` items from a pipe, checkpoint it, and finish from a fresh copy.

    ``make_pipe`` must build the same pipeline each call: seed every random
    pipe in it (``set_seed``), or call ``torch.manual_seed`` inside it, since
    an unseeded pipe draws a new seed from torch for each copy.  The checkpoint goes through
    ``pickle`` like a real one.  Returns ``(first_n_items, rest_from_restored_copy)``.
    Raises ``AssertionError`` if the pipeline cannot be checkpointed.
    """
    if n == 0:
        # A checkpoint taken before the first item is the start of the epoch
        # (pipekit.DataLoader records it as such without asking the pipes).
        return [], list(make_pipe())
    pipe = prepare_for_resume(make_pipe())
    it = iter(pipe)
    head = []
    for _ in range(n):
        head.append(next(it))
    state = snapshot_pipeline(pipe)
    if state is None:
        missing = not_snapshot_capable(pipe)
        raise AssertionError(f"pipeline cannot be checkpointed; these pipes have no state: {missing}")
    state = pickle.loads(pickle.dumps(state))
    del it
    fresh = make_pipe()
    restore_pipeline(fresh, state)
    return head, list(fresh)


def assert_resumes(make_pipe: Callable[[], IterDataPipe], n: int) -> None:
    """Assert that checkpointing after ``n`` items and restoring gives exactly the rest.

    Compares ``first n + rest after restore`` with one uninterrupted epoch of a
    fresh pipe.  The checkpoint is of the whole pipeline (every pipe's own
    position), as :class:`pipekit.DataLoader` takes it.  ``make_pipe`` must
    build the same pipeline on each call: seed its random pipes (see
    :func:`resume_after`).
    """
    expected = list(make_pipe())
    head, rest = resume_after(make_pipe, n)
    got = head + rest
    if got != expected:
        raise AssertionError(
            f"resume after {n} items differs from an uninterrupted run:\n"
            f"  expected {expected!r:.500}\n  got      {got!r:.500}"
        )
