"""Seeds: drawing them from torch, mixing them, and the per-worker, per-rank seeds of random streams.

The one module both halves of pipekit's randomness build on, importing neither:

* :mod:`pipekit.pipes.state` (random pipes, ``set_seed``) draws epoch seeds
  with :func:`draw_seed` and mixes a worker's into them with
  :func:`pipe_stream_seed`;
* :mod:`pipekit.transforms.seeding` (:class:`~pipekit.transforms.seeding.RandomStream`
  of the random transforms) seeds its streams with :func:`stream_seed`.

Users import these names from those two modules, which re-export them
(``pipekit.pipes.state.draw_seed``, ``pipekit.transforms.seeding.mix_seed``...).
"""

from __future__ import annotations

import os

import numpy as np
import torch

__all__ = [
    "draw_seed",
    "get_rank",
    "mix_seed",
    "pipe_stream_seed",
    "stream_seed",
    "worker_id",
]

MASK64 = (1 << 64) - 1
_TAG_TRANSFORM = 0x7472616E  # "tran": streams of transform objects
_TAG_PIPE = 0x70697065  # "pipe": streams of random pipes


def draw_seed(generator: torch.Generator | None = None) -> int:
    """A seed drawn from torch's global CPU generator (or ``generator``), as torch's ``Shuffler`` draws its own.

    ``torch.manual_seed`` makes the draws reproducible; each call advances the
    generator, so successive epochs get different seeds.
    """
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


def mix_seed(*parts: int) -> int:
    """Mix integers into one 63-bit seed (``numpy.random.SeedSequence``).

    Equal parts give equal seeds; any difference gives an unrelated seed.

    Example:
        >>> from pipekit.transforms.seeding import mix_seed
        >>> mix_seed(1, 2) == mix_seed(1, 2), mix_seed(1, 2) == mix_seed(2, 1)
        (True, False)
    """
    entropy = [int(p) & MASK64 for p in parts]
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
    """The seed of a transform's stream in this process (see :mod:`pipekit.transforms.seeding`).

    Args:
        seed: the transform's own seed, or ``None``.
        salt: tells apart transforms in the same process.

    In a DataLoader worker the result depends on the worker's seed (the
    loader's seed and the worker id), the rank, ``seed`` and ``salt``; in the
    main process on ``seed`` (or a draw from torch's global RNG when it is
    ``None``), the rank and ``salt``.
    """
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
    base = draw_seed() if seed is None else int(seed)
    wid = worker_id()
    return mix_seed(_TAG_PIPE, base, -1 if wid is None else wid, get_rank())
