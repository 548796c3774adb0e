"""Issue 35: a shuffle buffer's checkpoint is bounded (positions plus a bounded re-read) and plain data.

* a buffer of batches (``batch`` then ``shuffle``) loads with ``torch.load(weights_only=True)``;
"""

from __future__ import annotations

import io
from typing import Any

import pytest
import torch

import pipekit
from pipekit.pipes import IterableWrapper

pytestmark = pytest.mark.timeout(60)


def saved_and_loaded(state: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """``state`` through ``torch.save`` and ``torch.load(weights_only=True)``, and its size in bytes."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    size = buffer.tell()
    buffer.seek(0)
    return torch.load(buffer, weights_only=True), size


def run_and_resume(build, take: int, num_workers: int = 0) -> tuple[list[Any], list[Any], int]:
    """The uninterrupted run, a run checkpointed after ``take`` items and resumed, and the checkpoint's size."""
    torch.manual_seed(0)
    full = list(pipekit.DataLoader(build(), num_workers=num_workers))
    torch.manual_seed(0)
    loader = pipekit.DataLoader(build(), num_workers=num_workers)
    it = iter(loader)
    head = [next(it) for _ in range(take)]
    state, size = saved_and_loaded(loader.state_dict())
    resumed = pipekit.DataLoader(build(), num_workers=num_workers)
    resumed.load_state_dict(state)
    return full, head + list(resumed), size


def batches_shuffled() -> Any:
    return IterableWrapper(range(40)).batch(2).shuffle(buffer_size=6)


def test_buffered_batches_load_with_weights_only():
    full, resumed, _ = run_and_resume(batches_shuffled, take=5)
    assert resumed == full
    assert len(full) == 20



def test_a_batch_round_trips_through_weights_only():
    from pipekit.pipes._builtin import _Chunk

    state, _ = saved_and_loaded({"b": [_Chunk([1, "a"])]})
    (batch,) = state["b"]
    assert type(batch) is _Chunk and batch == [1, "a"] and list(batch) == batch.items
