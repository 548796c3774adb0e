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


def _kept(i: int) -> bool:
    return i >= 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 2])
def test_a_lengthless_loader_resumes_at_the_batch_fetched_ahead_and_asks_no_worker_per_batch(workers, monkeypatch):
    """Over a pipeline without a length (and a shuffle buffer), the state is the one before the last batch fetched;
    the workers are asked for positions only when a checkpoint is taken, not before every batch."""
    import torch

    import pipekit
    from pipekit._loader import DataLoader
    from pipekit.pipes import IterableWrapper

    def loader(cls: type) -> pipekit.DataLoader:
        pipe = IterableWrapper(range(200)).sharding_filter().shuffle(buffer_size=20).filter(_kept)
        return cls(pipe, batch_size=4, num_workers=workers, generator=torch.Generator().manual_seed(1))

    plain = loader(DataLoader)
    full = [b.tolist() for b in plain]
    plain.shutdown()
    asked = []
    resolved = DataLoader._resolved
    monkeypatch.setattr(DataLoader, "_resolved", lambda self, state: asked.append(1) or resolved(self, state))
    first = loader(EpochEndAwareLoader)
    it = iter(first)
    fetched = [next(it).tolist() for _ in range(7)]  # Lightning trains on six while it holds the seventh
    state = first.state_dict()
    first.shutdown()
    assert len(asked) == 1
    resumed = loader(EpochEndAwareLoader)
    resumed.load_state_dict(state)
    assert fetched[:6] + [b.tolist() for b in resumed] == full
    resumed.shutdown()
