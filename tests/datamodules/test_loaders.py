"""The datamodules' training shuffle: each epoch's order from (seed, epoch), whatever the number of workers."""

from __future__ import annotations

import pytest

pytest.importorskip("lightning")

from pipekit.datamodules._loaders import EpochEndAwareLoader, SeededShuffle


@pytest.mark.timeout(60)
def test_the_shuffle_is_the_same_with_and_without_workers():
    # A multi-process iterator asks its sampler for an iterator twice (torch's __init__, then _reset): the
    # first one, never read, must not use up an epoch, or a run with workers sees epoch e + 1's order as epoch e's.
    def epochs(workers: int) -> list[list[list[int]]]:
        loader = EpochEndAwareLoader(list(range(8)), batch_size=2, sampler=SeededShuffle(8, seed=0),
                                     num_workers=workers, persistent_workers=workers > 0)
        return [[batch.tolist() for batch in loader] for _ in range(2)]

    assert epochs(2) == epochs(0)
