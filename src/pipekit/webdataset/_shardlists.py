"""The library's shard lists: ``SimpleShardList`` (in order, or permuted each epoch) and ``ResampledShards``."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from pipekit.pipes._shard_sources import ResampledShardList
from pipekit.pipes.state import PermutationSource

__all__ = ["ResampledShards", "SimpleShardList", "expand_urls"]


class SimpleShardList(PermutationSource):
    """The shard URLs, in order, or shuffled as a whole each epoch (``shardshuffle``).

    Brace patterns are expanded (``"s-{000..009}.tar"``); globs and folders are listed.  The permutation is
    drawn from the epoch seed shared by all workers and ranks, before the split by node and worker, so every
    shard is read once per epoch.  Resume: ``{"seed", "yielded"}``.

    Example:
        >>> list(SimpleShardList("s-{0..2}.tar"))
        ['s-0.tar', 's-1.tar', 's-2.tar']
    """

    def __init__(self, urls: str | Sequence[str], seed: int | None = None, shuffle: bool = False) -> None:
        super().__init__(expand_urls(urls), shuffle=shuffle)
        if seed is not None:
            self.set_seed(seed)


class ResampledShards(ResampledShardList):
    """An endless stream of shards drawn at random, with replacement (``resampled=True``).

    Each worker and rank draws its own stream (the epoch seed is mixed with the worker id and rank), so no
    split is needed and every process reads as many samples as ``with_epoch`` asks for: equal-length epochs
    across ranks.  Resume: the draws made, and the generator's state.  The URLs are expanded as
    :class:`SimpleShardList`'s are.

    Example:
        >>> shards = ResampledShards("s-{0..3}.tar", nshards=5).set_seed(0)
        >>> len(list(shards)), set(shards) <= {"s-0.tar", "s-1.tar", "s-2.tar", "s-3.tar"}
        (5, True)
    """

    def __init__(self, urls: str | Sequence[str], nshards: int = sys.maxsize, seed: int | None = None,
                 deterministic: bool = False) -> None:
        super().__init__(expand_urls(urls), nshards=nshards, seed=seed)


def expand_urls(urls: str | Sequence[str]) -> list[str]:
    """Shard URLs from a brace pattern, a ``::``-separated string or a list; ``pipe:`` URLs are only brace-expanded."""
    from pipekit.datasets._tar_shards import expand_shard_urls
    from pipekit.pipes._shard_sources import check_pipe_url
    from pipekit.pipes._webdataset import shard_expand

    if isinstance(urls, str | os.PathLike):
        urls = os.fspath(urls).split("::")
    if not isinstance(urls, Sequence) or not urls:
        raise TypeError(f"pipekit.webdataset: urls must be a shard URL, brace pattern or list of them, got {urls!r}")
    out: list[str] = []
    for url in map(os.fspath, urls):
        if url.startswith("pipe:"):
            out.extend(shard_expand(url))
            check_pipe_url(url)  # shell syntax is refused now, naming the URL, not when a worker opens it
        else:
            out.extend(expand_shard_urls([url]))
    return out
