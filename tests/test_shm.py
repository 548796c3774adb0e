"""pipekit._shm: shared-memory batch buffers reused in DataLoader workers, never while the main process holds them."""

from __future__ import annotations

import pickle
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from pipekit import _shm as shm
from pipekit.geo import stack_samples

SIDE = 32  # small samples: a batch of 4 is ~100 KiB


class Numbered(Dataset):
    """Sample ``i``: an image and a mask filled with ``i``, and the worker's pool counters at that time."""

    def __init__(self, n: int = 96) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return {
            "image": torch.full((3, SIDE, SIDE), float(i)),
            "mask": torch.full((SIDE, SIDE), i, dtype=torch.int64),
            "i": i,
            "stats": shm.pool_stats(),
        }


def assert_intact(batch: dict) -> None:
    for j, i in enumerate(batch["i"]):
        assert bool((batch["image"][j] == i).all()), f"image of sample {i} overwritten"
        assert bool((batch["mask"][j] == i).all()), f"mask of sample {i} overwritten"


def loader(dataset: Dataset, **kwargs) -> DataLoader:
    kwargs.setdefault("num_workers", 2)
    return DataLoader(dataset, batch_size=4, collate_fn=stack_samples, **kwargs)


def test_empty_shared_outside_a_worker_is_fresh_shared_memory():
    t = shm.empty_shared((2, 3), torch.int16)
    assert t.shape == (2, 3) and t.dtype == torch.int16 and t.is_shared()
    assert shm.empty_shared((0, 3), torch.float32).shape == (0, 3)
    assert shm.pool_stats() == {"buffers": 0, "bytes": 0, "reused": 0, "fresh": 0, "unpooled": 0, "by_reference": 0}


def test_released_buffers_are_reused_and_held_batches_are_never_overwritten():
    # the main process keeps every 3rd batch and a view of a sample of every 5th for the whole run; the
    # workers keep producing batches the whole time: without the release count they would reuse the held
    # buffers and these checks would see other samples' values
    held = []
    last_stats = []
    for _ in range(2):
        for k, batch in enumerate(loader(Numbered(), persistent_workers=False)):
            assert_intact(batch)
            if k % 3 == 0:
                held.append(batch)
            if k % 5 == 0:
                held.append({"image": batch["image"][1:2], "mask": batch["mask"][1:2], "i": batch["i"][1:2]})
            last_stats.append(batch["stats"][-1])
        for batch in held:
            assert_intact(batch)
    assert max(s["reused"] for s in last_stats) > 0, last_stats  # the released ones did come back
    assert all(s["unpooled"] == 0 for s in last_stats)


def test_buffers_come_back_across_epochs_with_persistent_workers():
    dl = loader(Numbered(48), persistent_workers=True)
    reused = []
    for _ in range(3):
        for batch in dl:
            assert_intact(batch)
            reused.append(batch["stats"][-1]["reused"])
    # 12 batches a pass, 6 per worker: only the first few of the first pass need new buffers
    assert reused[-1] >= 10


def test_a_batch_the_worker_still_references_is_not_reused():
    # a collate function that keeps the batch it returned (a view of it) in the worker: the pool must not
    # hand that buffer out again while the worker's reference lives
    kept: list[torch.Tensor] = []

    def collate_and_keep(samples):
        for t in kept:  # what the worker keeps is still what it was
            assert bool((t == t.flatten()[0]).all()), "a buffer the worker holds was reused"
        batch = stack_samples(samples)
        kept.append(batch["mask"][0])
        return batch

    for batch in DataLoader(Numbered(40), batch_size=4, num_workers=1, collate_fn=collate_and_keep):
        assert_intact(batch)


def test_pool_full_falls_back_to_fresh_memory(monkeypatch):
    monkeypatch.setattr(shm, "MAX_BUFFERS", 2)  # forked workers inherit it
    batches = list(loader(Numbered(64), multiprocessing_context="fork"))  # all held until the end
    for batch in batches:
        assert_intact(batch)
    assert max(b["stats"][-1]["unpooled"] for b in batches) > 0
    assert max(b["stats"][-1]["buffers"] for b in batches) <= 2


def test_pool_off(monkeypatch):
    monkeypatch.setenv(shm.ENV_VAR, "0")
    batches = list(loader(Numbered(32), multiprocessing_context="fork"))
    for batch in batches:
        assert_intact(batch)
    off = {"buffers": 0, "bytes": 0, "reused": 0, "fresh": 0, "unpooled": 0, "by_reference": 0}
    assert all(b["stats"][-1] == off for b in batches)


def test_spawned_workers():
    dl = loader(Numbered(24), num_workers=1, multiprocessing_context="spawn", persistent_workers=True)
    for _ in range(2):
        for batch in dl:
            assert_intact(batch)
    assert batch["stats"][-1]["reused"] > 0


def test_a_received_buffer_is_copied_when_sent_on():
    # the main process sends a pooled batch on to another process: that process must get its own copy, or
    # the worker would reuse the buffer as soon as the main process drops it
    batch = next(iter(loader(Numbered(8), num_workers=1)))
    image = batch["image"]
    assert image.untyped_storage().data_ptr() in shm._received
    again = pickle.loads(ForkingPickler.dumps(image))  # torch's reduction would give back the same storage
    assert torch.equal(again, image)
    assert again.untyped_storage().data_ptr() != image.untyped_storage().data_ptr()
    plain = torch.zeros(4).share_memory_()  # other storages keep torch's reduction: the same memory back
    assert pickle.loads(ForkingPickler.dumps(plain)).untyped_storage().data_ptr() == plain.untyped_storage().data_ptr()


@pytest.mark.parametrize("strategy", ["file_descriptor", "file_system"])
def test_sharing_strategies(strategy):
    previous = torch.multiprocessing.get_sharing_strategy()
    torch.multiprocessing.set_sharing_strategy(strategy)
    try:
        held = []
        dl = loader(Numbered(48), persistent_workers=True, multiprocessing_context="fork")
        for _ in range(2):
            for k, batch in enumerate(dl):
                assert_intact(batch)
                if k % 4 == 0:
                    held.append(batch)
        for batch in held:
            assert_intact(batch)
        assert batch["stats"][-1]["reused"] > 0
    finally:
        torch.multiprocessing.set_sharing_strategy(previous)


def test_reused_buffers_are_sent_by_reference():
    # after a buffer's first trip the main process holds it mapped; the worker then names it instead of
    # passing its file descriptor again, and the batches stay intact
    dl = loader(Numbered(64), num_workers=1, persistent_workers=True)
    stats = []
    for _ in range(2):
        for batch in dl:
            assert_intact(batch)
            stats.append(batch["stats"][-1])
    assert stats[-1]["by_reference"] > 0, stats[-1]
    assert stats[-1]["by_reference"] >= stats[-1]["reused"] - 4  # every reuse after the first trip


def test_a_reference_this_process_does_not_hold_is_a_clear_error():
    with pytest.raises(RuntimeError, match=r"pid 4242.*buffer 3 \(generation 2\).*PIPEKIT_SHM_POOL=0"):
        shm._rebuild_by_reference("4242-deadbeef", 3, 2)


def test_pipekit_loader_forgets_its_workers_buffers_when_it_shuts_them_down():
    import pipekit
    from pipekit.pipes import IterableWrapper

    def live_pids() -> set[int]:
        return {entry.pid for entry in shm._remote.values()}

    pipe = IterableWrapper(range(64)).sharding_filter().map(lambda i: torch.full((8,), i)).batch(8).collate()
    dl = pipekit.DataLoader(pipe, num_workers=2, persistent_workers=False)
    for _ in range(2):  # the workers end with each epoch
        it = iter(dl)
        pids = {w.pid for w in it._workers}
        batches = list(it)
        assert sorted(int(x) for b in batches for x in b[:, 0]) == list(range(64))
        assert pids and not pids & live_pids()
    assert int(batches[-1][0, 0]) >= 0  # batches still held stay readable

    dl = pipekit.DataLoader(pipe, num_workers=2)  # persistent workers: until shutdown()
    for _ in range(2):
        assert len(list(dl)) == 8
    pids = {w.pid for w in dl._iterator._workers}
    assert pids <= live_pids()
    dl.shutdown()
    assert not pids & live_pids()


class Growing(Dataset):
    """Samples that grow every 8 samples: the pool must retire buffers that no longer fit."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict:
        side = 8 * (1 + i // 8)
        return {"image": torch.full((side, side), float(i)), "i": i, "stats": shm.pool_stats()}


def test_retired_buffers_are_unmapped_by_the_receiver(monkeypatch):
    # a byte budget of ~3 of the largest batches: growing batches make the worker retire free buffers to make
    # room; the main process must not keep its mappings of them (it would hold more than the budget)
    monkeypatch.setattr(shm, "MAX_BYTES", 3 * 4 * 64 * 64 * 4)  # forked workers inherit it
    dl = DataLoader(Growing(), batch_size=4, num_workers=1, collate_fn=stack_samples, multiprocessing_context="fork")
    sizes, retired = [], 0
    for batch in dl:
        for j, i in enumerate(batch["i"]):
            assert bool((batch["image"][j] == i).all())
        sizes.append(batch["image"].numel())
        for entry in shm._remote.values():
            assert sum(data.nbytes for _, data in entry.mapped.values()) <= shm.MAX_BYTES
        retired = max(retired, batch["stats"][-1]["fresh"] - batch["stats"][-1]["buffers"])
        del batch
    assert len(set(sizes)) == 8
    assert retired > 0  # the worker did retire buffers
