"""Random streams for transforms: one per DataLoader worker and rank, derived from the loader's seed.

A random transform is pickled into every DataLoader worker (or copied by
``fork``), so if it kept one random generator, every worker would draw the same
"random" augmentations.  pipekit's random transforms draw from a
:class:`RandomStream` instead, which seeds itself lazily, the first time it is
used in a process, from:

* inside a DataLoader worker: ``torch.utils.data.get_worker_info().seed``,
  which torch derives from the loader's base seed (drawn from the loader's
  ``generator`` or torch's global RNG, so ``torch.manual_seed`` makes it
  reproducible) plus the worker id, and changes every epoch unless workers
  persist;
* in the main process: the transform's ``seed`` if one was given, else a seed
  drawn from torch's global RNG (so ``torch.manual_seed`` makes it reproducible);
* in both cases the distributed **rank** (``torch.distributed.get_rank()``,
  or the ``RANK`` environment variable before the process group starts), so
  ranks seeded alike still draw different streams, and a per-object *salt*
  (the ``seed`` if given, else a number drawn from torch's global RNG when the
  transform is created), so two transforms in the same worker do not draw the
  same numbers.

So a run is reproducible when torch is seeded (``torch.manual_seed``) before
the transforms and the DataLoader are built, or when the transforms get seeds
and the DataLoader a ``generator``.

The parts are mixed with :class:`numpy.random.SeedSequence`, so neighbouring
seeds give unrelated streams.

Pipes (``pipe.augment(...)``) follow pipekit's convention for random pipes
instead: ``set_seed(seed)`` (called by the DataLoader with the seed shared by
all workers) and, at the start of each iterator, a stream seeded with
``mix_seed(seed, worker id, rank)`` (see :func:`pipe_stream_seed`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from pipekit._seeds import MASK64 as _MASK64
from pipekit._seeds import draw_seed, get_rank, mix_seed, pipe_stream_seed, stream_seed, worker_id

__all__ = [
    "RandomStream",
    "get_rank",
    "mix_seed",
    "pipe_stream_seed",
    "stream_seed",
    "worker_id",
]


class RandomStream:
    """A picklable random stream: a torch CPU RNG state and a numpy ``Generator``.

    The stream seeds itself lazily with :func:`stream_seed` the first time it
    is used in a process (or after :meth:`reseed`); a copy pickled or forked
    into a DataLoader worker starts its own stream there.

    * :meth:`torch_global` runs a block with torch's global CPU RNG set to this
      stream (torchvision's random transforms draw from it), then restores
      torch's global state: the caller's random numbers are not disturbed.
    * :meth:`numpy` returns the stream's ``numpy.random.Generator``.

    Args:
        seed: fixed seed, or ``None`` to derive one as described in the module
            docstring.

    Example:
        >>> import torch
        >>> from pipekit.transforms.seeding import RandomStream
        >>> a, b = RandomStream(seed=3), RandomStream(seed=3)
        >>> with a.torch_global():
        ...     x = torch.rand(2)
        >>> with b.torch_global():
        ...     y = torch.rand(2)
        >>> bool((x == y).all()), bool(a.numpy().integers(10**6) == b.numpy().integers(10**6))
        (True, True)
    """

    def __init__(self, seed: int | None = None) -> None:
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
            raise TypeError(f"RandomStream: seed must be an int or None, got {type(seed).__name__}")
        self.seed = None if seed is None else int(seed)
        self.salt = self.seed if self.seed is not None else draw_seed()
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._owner: tuple[int, int | None] | None = None
        self._gen: torch.Generator | None = None  # the stream's torch numbers (a CPU generator)
        self._np: np.random.Generator | None = None

    @property
    def _torch_state(self) -> torch.Tensor | None:
        """The torch generator's state (a ``uint8`` tensor), ``None`` before the stream starts."""
        return None if self._gen is None else self._gen.get_state()

    @_torch_state.setter
    def _torch_state(self, state: torch.Tensor) -> None:
        gen = torch.Generator()
        gen.set_state(state)
        self._gen = gen

    def __getstate__(self) -> dict[str, Any]:
        return {"seed": self.seed, "salt": self.salt}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.seed = state["seed"]
        self.salt = state["salt"]
        self._init_runtime()

    @staticmethod
    def _process() -> tuple[int, int | None]:
        return (os.getpid(), worker_id())

    def _ensure(self) -> None:
        if self._owner != self._process():
            self.reseed(stream_seed(self.seed, self.salt))

    def reseed(self, seed: int) -> None:
        """Restart the stream from ``seed`` (exactly, without mixing anything in)."""
        g = torch.Generator()
        g.manual_seed(int(seed) & _MASK64)
        self._gen = g
        self._np = np.random.default_rng(mix_seed(int(seed), 1))
        self._owner = self._process()

    @contextlib.contextmanager
    def torch_global(self) -> Iterator[None]:
        """Run a block with torch's global CPU RNG drawing from this stream.

        Random numbers drawn on CUDA devices inside the block come from the
        device's own generator, not from this stream; pipekit's transforms
        draw their random numbers on the CPU.  Not thread-safe: two threads
        using streams at once would mix them (the numbers stay random, but
        runs are no longer reproducible).
        """
        self._ensure()
        assert self._gen is not None
        # torch.random.fork_rng(devices=[]) with less around it: this runs once per sample
        default = torch.default_generator
        saved = default.get_state()
        default.set_state(self._gen.get_state())
        try:
            yield
        finally:
            self._gen.set_state(default.get_state())
            default.set_state(saved)

    def generator(self) -> torch.Generator:
        """The stream's torch generator, for drawing with ``generator=`` (no swap of torch's global RNG).

        Numbers drawn from it and numbers drawn from torch's global RNG inside
        :meth:`torch_global` come from the same sequence: the stream moves on
        either way, and its :meth:`state_dict` records where.
        """
        self._ensure()
        assert self._gen is not None
        return self._gen

    def numpy(self) -> np.random.Generator:
        """The stream's numpy generator (for batch-level parameters)."""
        self._ensure()
        assert self._np is not None
        return self._np

    def state_dict(self) -> dict[str, Any]:
        """The stream's current position (picklable)."""
        self._ensure()
        assert self._np is not None and self._gen is not None
        return {"torch": self._gen.get_state(), "numpy": self._np.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict` position (in this process)."""
        if not isinstance(state, dict) or "torch" not in state or "numpy" not in state:
            raise ValueError("RandomStream.load_state_dict expects a dict from RandomStream.state_dict()")
        self._torch_state = torch.as_tensor(state["torch"], dtype=torch.uint8).clone()
        gen = np.random.default_rng()
        gen.bit_generator.state = state["numpy"]
        self._np = gen
        self._owner = self._process()

    def __repr__(self) -> str:
        return f"RandomStream(seed={self.seed})"
