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

__all__ = [
    "RandomStream",
    "get_rank",
    "mix_seed",
    "pipe_stream_seed",
    "stream_seed",
    "worker_id",
]

_MASK64 = (1 << 64) - 1
_TAG_TRANSFORM = 0x7472616E  # "tran": streams of transform objects
_TAG_PIPE = 0x70697065  # "pipe": streams of random pipes


def mix_seed(*parts: int) -> int:
    """Mix integers into one 63-bit seed (``numpy.random.SeedSequence``).

    Equal parts give equal seeds; any difference gives an unrelated seed.

    Example:
        >>> from pipekit.transforms.seeding import mix_seed
        >>> mix_seed(1, 2) == mix_seed(1, 2), mix_seed(1, 2) == mix_seed(2, 1)
        (True, False)
    """
    entropy = [int(p) & _MASK64 for p in parts]
    state = np.random.SeedSequence(entropy).generate_state(2, dtype=np.uint32)
    return ((int(state[0]) << 32) | int(state[1])) >> 1


def get_rank() -> int:
    """This process's distributed rank: the process group's, else ``$RANK``, else 0."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return int(torch.distributed.get_rank())
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def worker_id() -> int | None:
    """The DataLoader worker id of this process, or ``None`` in the main process."""
    info = torch.utils.data.get_worker_info()
    return None if info is None else int(info.id)


def stream_seed(seed: int | None = None, salt: int = 0) -> int:
    """The seed of a transform's stream in this process (see the module docstring).

    Args:
        seed: the transform's own seed, or ``None``.
        salt: tells apart transforms in the same process.

    In a DataLoader worker the result depends on the worker's seed (the
    loader's seed and the worker id), the rank, ``seed`` and ``salt``; in the
    main process on ``seed`` (or a draw from torch's global RNG when it is
    ``None``), the rank and ``salt``.
    """
    from pipekit.pipes.state import draw_seed  # not at the top: pipekit.pipes imports this module

    info = torch.utils.data.get_worker_info()
    rank = get_rank()
    own = -1 if seed is None else int(seed)
    if info is not None:
        return mix_seed(_TAG_TRANSFORM, int(info.seed), rank, own, salt)
    base = draw_seed() if seed is None else int(seed)
    return mix_seed(_TAG_TRANSFORM, base, rank, own, salt)


def pipe_stream_seed(seed: int | None) -> int:
    """The seed of a random pipe's stream for one epoch.

    ``seed`` is the pipe's pending ``set_seed`` value (the DataLoader's shared
    seed, equal in all workers), or ``None`` to draw one from torch's global
    RNG.  The worker id and rank are mixed in, so workers and ranks differ
    while a seeded run stays reproducible.
    """
    from pipekit.pipes.state import draw_seed  # not at the top: pipekit.pipes imports this module

    base = draw_seed() if seed is None else int(seed)
    wid = worker_id()
    return mix_seed(_TAG_PIPE, base, -1 if wid is None else wid, get_rank())


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
        from pipekit.pipes.state import draw_seed  # not at the top: pipekit.pipes imports this module

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
