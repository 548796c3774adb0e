"""DistributedGeoSampler: a geo sampler's epoch shared out between the processes of a DDP run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import Dataset, DistributedSampler

import pipekit
from pipekit.geo._index import GeoIndex
from pipekit.geo.samplers import DistributedGeoSampler, GridGeoSampler, RandomBatchGeoSampler, RandomGeoSampler


def dataset() -> SimpleNamespace:
    return SimpleNamespace(index=GeoIndex([[0, 100, 0, 100], [500, 600, 0, 100]]), res=(1.0, 1.0))


def key(box) -> tuple[float, float]:
    x, y, _ = box
    return float(x.start), float(y.start)


class Boxes(Dataset):
    """Returns the box it is asked for (a stand-in for a geo dataset's ``__getitem__``)."""

    def __getitem__(self, box):
        return torch.tensor(key(box))


@pytest.mark.parametrize("world", [2, 3])
def test_the_shares_partition_an_epoch_padded_to_equal_lengths(world):
    grid = GridGeoSampler(dataset(), size=30, stride=30)
    shares = [list(DistributedGeoSampler(grid, num_replicas=world, rank=r)) for r in range(world)]
    everything = [key(b) for b in grid]
    assert len({len(s) for s in shares}) == 1 and len(shares[0]) == -(-len(everything) // world)
    taken = [key(b) for i in range(len(shares[0])) for s in shares for b in s[i : i + 1]]
    assert taken[: len(everything)] == everything  # interleaved, in the sampler's order
    assert taken[len(everything) :] == everything[: len(taken) - len(everything)]  # the padding wraps around


def test_random_batches_are_shared_whole_and_differ_between_ranks():
    def share(rank: int) -> DistributedGeoSampler:
        return DistributedGeoSampler(RandomBatchGeoSampler(dataset(), 10, batch_size=4, length=40, seed=7),
                                     num_replicas=2, rank=rank)

    single = [[key(b) for b in batch] for batch in RandomBatchGeoSampler(dataset(), 10, batch_size=4, length=40,
                                                                         seed=7)]
    loaders = [pipekit.DataLoader(Boxes(), sampler=share(r), batch_size=4) for r in (0, 1)]
    got = [[[tuple(p) for p in b.tolist()] for b in loader] for loader in loaders]
    assert got[0] == single[0::2] and got[1] == single[1::2]
    assert isinstance(share(0), DistributedSampler) and len(share(0)) == 20 and len(loaders[0]) == 5


@pytest.mark.parametrize("workers", [0, 2])
def test_a_share_resumes_exactly_mid_batch_and_into_the_next_epoch(workers):
    def loader() -> pipekit.DataLoader:
        sampler = RandomBatchGeoSampler(dataset(), 10, batch_size=3, length=30, seed=1)
        return pipekit.DataLoader(Boxes(), sampler=DistributedGeoSampler(sampler, num_replicas=2, rank=1),
                                  batch_size=3, num_workers=workers)

    uninterrupted = loader()
    full = [b.tolist() for _ in range(2) for b in uninterrupted]
    for taken in (2, 5):  # mid-epoch; the epoch's last batch
        first = loader()
        it = iter(first)
        seen = [next(it).tolist() for _ in range(taken)]
        state = first.state_dict()
        del it
        again = loader()
        again.load_state_dict(state)
        rest = [b.tolist() for b in again]  # at the last batch: the epoch's (empty) rest
        assert seen + rest + [b.tolist() for b in again] == full


def test_rank_one_resumes_from_rank_zeros_state():
    """Lightning saves rank 0's loader state and every rank loads it: the state holds no rank."""

    def share(rank: int) -> DistributedGeoSampler:
        return DistributedGeoSampler(RandomGeoSampler(dataset(), 10, length=12, seed=2), num_replicas=2, rank=rank)

    zero, one = iter(share(0)), iter(share(1))
    for _ in range(3):
        next(zero), next(one)
    resumed = iter(share(1))
    resumed.load_state_dict(zero.state_dict())
    assert [key(b) for b in resumed] == [key(b) for b in one]


def test_a_sampler_without_random_access_is_drawn_whole_per_epoch():
    class Listed(torch.utils.data.Sampler):
        def __iter__(self):
            return iter([(slice(i, i + 1), slice(0, 1), slice(0, 1)) for i in range(5)])

        def __len__(self) -> int:
            return 5

    assert [key(b)[0] for b in DistributedGeoSampler(Listed(), num_replicas=2, rank=1)] == [1, 3, 0]


def test_arguments_are_checked():
    grid = GridGeoSampler(dataset(), size=30)
    with pytest.raises(RuntimeError, match="not initialized; pass num_replicas= and rank="):
        DistributedGeoSampler(grid)
    with pytest.raises(ValueError, match="rank must be in"):
        DistributedGeoSampler(grid, num_replicas=2, rank=2)
    with pytest.raises(TypeError, match="num_replicas must be an int"):
        DistributedGeoSampler(grid, num_replicas=2.0, rank=0)
