"""Issue 35: a shuffle buffer's checkpoint is bounded (positions plus a bounded re-read) and plain data.

* the checkpoint of a full buffer of large items holds their positions, not the items: small, and the resumed
  run is exact, with 0 and 2 workers;
* the re-read is bounded (at most the window plus the snapshot interval); items buffered longer are inline;
* pipes above that another branch shares (``fork``) are not replayed: the buffer is kept inline, still exact;
* a buffer of batches (``batch`` then ``shuffle``) loads with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import io
from typing import Any

import pytest
import torch

import pipekit
from pipekit.pipes import IterableWrapper
from pipekit.pipes._builtin import ResumableShuffler
from pipekit.pipes._resume import prepare_for_resume
from pipekit.synthetic import write_image_shards

pytestmark = pytest.mark.timeout(60)


def saved_and_loaded(state: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """``state`` through ``torch.save`` and ``torch.load(weights_only=True)``, and its size in bytes."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    size = buffer.tell()
    buffer.seek(0)
    return torch.load(buffer, weights_only=True), size


def run_and_resume(build, take: int, num_workers: int = 0, **options: Any) -> tuple[list[Any], list[Any], int]:
    """The uninterrupted run, a run checkpointed after ``take`` items and resumed, and the checkpoint's size."""
    torch.manual_seed(0)
    full = list(pipekit.DataLoader(build(), num_workers=num_workers, **options))
    torch.manual_seed(0)
    loader = pipekit.DataLoader(build(), num_workers=num_workers, **options)
    it = iter(loader)
    head = [next(it) for _ in range(take)]
    state, size = saved_and_loaded(loader.state_dict())
    resumed = pipekit.DataLoader(build(), num_workers=num_workers, **options)
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


def blob(i: int) -> bytes:
    """A 2 kB item standing for an encoded image."""
    return i.to_bytes(4, "little") * 512


def big_items() -> Any:
    return IterableWrapper(range(600)).sharding_filter().map(blob).shuffle(buffer_size=100)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_full_buffer_of_large_items_checkpoints_positions(num_workers):
    full, resumed, size = run_and_resume(big_items, take=250, num_workers=num_workers)
    assert resumed == full and len(full) == 600
    held = 100 * 2048 * max(num_workers, 1)  # the buffers' bytes
    assert size < held / 4, (size, held)


def test_the_re_read_is_bounded_and_older_items_are_inline():
    pipe = prepare_for_resume(IterableWrapper(range(3000)).map(blob).shuffle(buffer_size=20)).set_seed(3)
    assert isinstance(pipe, ResumableShuffler)
    it = iter(pipe)
    out = [next(it) for _ in range(2000)]
    state = pipe.state_dict()
    replay = state["replay"]
    window = int(ResumableShuffler.replay_window * 20)
    assert replay["to"] == 2020 and replay["to"] - replay["from"] <= window + max(1, window // 32)
    pulls = replay["pulls"]
    assert len(pulls) == 20 and len(state["buffer"]) == pulls.count(-1)
    assert all(p == -1 or replay["from"] <= p < replay["to"] for p in pulls)
    restored = prepare_for_resume(IterableWrapper(range(3000)).map(blob).shuffle(buffer_size=20))
    restored.load_state_dict(state)
    assert out + list(restored) == list(prepare_for_resume(IterableWrapper(range(3000)).map(blob)
                                                           .shuffle(buffer_size=20)).set_seed(3))


def forked() -> Any:
    a, b = IterableWrapper(range(60)).fork(2)
    return a.shuffle(buffer_size=8).zip(b)


def test_pipes_shared_with_another_branch_keep_the_buffer_inline():
    full, resumed, _ = run_and_resume(forked, take=20)
    assert resumed == full and len(full) == 60
    loader = pipekit.DataLoader(forked())
    it = iter(loader)
    for _ in range(20):
        next(it)
    states = loader.state_dict()
    list(it)
    assert "'replay'" not in repr(states)


@pytest.fixture(scope="module")
def shard_folder(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("shards")
    write_image_shards(root, shards=4, per_shard=12, size=8, progress=False)
    return str(root)


def getting_started(root: str) -> Any:
    """Getting started's pipeline with the buffer before decode: a shard-order shuffle above the sample shuffle."""
    return (
        IterableWrapper([root])
        .list_files_by_fsspec(masks="*.tar")
        .shuffle()
        .sharding_filter()
        .open_files_by_fsspec(mode="rb")
        .load_from_tar()
        .webdataset()
        .shuffle(buffer_size=6)
        .decode()
        .map(key_and_label)
    )


def key_and_label(sample: dict[str, Any]) -> tuple[str, int, int]:
    return sample["__key__"], sample[".cls"], int(sample[".jpg"].sum())


@pytest.mark.parametrize(("num_workers", "take"), [(0, 7), (0, 40), (2, 9)])
def test_getting_started_pipeline_resumes_exactly_from_positions(shard_folder, num_workers, take):
    full, resumed, size = run_and_resume(lambda: getting_started(shard_folder), take, num_workers)
    assert len(full) == 48 and resumed == full
    assert size < 60_000  # positions: the buffered JPEGs (6 per worker) and the listing are not in it


def test_an_archive_replaced_under_the_re_read_is_refused_naming_it(tmp_path):
    """The re-read starts from an older snapshot, before the archive being read was opened: its stamp at the
    checkpoint is still checked, so the replaced file is refused instead of read afresh in the old positions."""
    root, other = tmp_path / "shards", tmp_path / "other"
    write_image_shards(root, shards=2, per_shard=12, size=8, progress=False)
    write_image_shards(other, shards=1, per_shard=10, size=8, progress=False)

    def build() -> Any:
        return (IterableWrapper([str(root)]).list_files_by_fsspec(masks="*.tar").open_files_by_fsspec(mode="rb")
                .load_from_tar().webdataset().shuffle(buffer_size=6).map(lambda s: s["__key__"]))

    torch.manual_seed(0)
    loader = pipekit.DataLoader(build())
    it = iter(loader)
    head = [next(it) for _ in range(2)]
    state, _ = saved_and_loaded(loader.state_dict())
    assert len(head) == 2 and state
    first = sorted(root.glob("*.tar"))[0]
    first.write_bytes(sorted(other.glob("*.tar"))[0].read_bytes())  # replaced: another size and mtime
    resumed = pipekit.DataLoader(build())
    resumed.load_state_dict(state)
    with pytest.raises(pipekit.errors.ArchiveError, match=first.name):
        list(resumed)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_archive_read_through_in_the_re_read_window_replaced_is_refused_naming_it(tmp_path, num_workers):
    """An archive opened after the re-read's snapshot and read through before the checkpoint (its members still
    buffered) is re-read on resume: replaced, it is refused, not read into the old positions with other bytes."""
    root, other = tmp_path / "shards", tmp_path / "other"
    write_image_shards(root, shards=3, per_shard=3, size=8, progress=False)
    write_image_shards(other, shards=2, per_shard=3, size=8, seed=1, progress=False)

    def build() -> Any:  # each worker reads every shard (no sharding): the same positions as without workers
        return (IterableWrapper(sorted(str(p) for p in root.glob("*.tar"))).open_files_by_fsspec(mode="rb")
                .load_from_tar().webdataset().shuffle(buffer_size=4).map(key_and_jpeg))

    torch.manual_seed(0)
    loader = pipekit.DataLoader(build(), num_workers=num_workers, warn_unsharded=False)
    it = iter(loader)
    head = [next(it) for _ in range(4 * max(1, num_workers))]  # 8 pulls: shard 1 read through, shard 2 open
    state, _ = saved_and_loaded(loader.state_dict())
    loader.shutdown()
    assert any("shard-000001" in key for key, _ in head)
    victim = sorted(root.glob("*.tar"))[1]
    victim.write_bytes(sorted(other.glob("*.tar"))[1].read_bytes())
    resumed = pipekit.DataLoader(build(), num_workers=num_workers, warn_unsharded=False)
    resumed.load_state_dict(state)
    with pytest.raises(pipekit.errors.ArchiveError, match=victim.name):
        list(resumed)
    resumed.shutdown()


def key_and_jpeg(sample: dict[str, Any]) -> tuple[str, bytes]:
    return sample["__key__"], sample[".jpg"].read()



def one_token(sample: dict[str, Any]) -> int:
    return 1


def bucket_keys(bucket: list[dict[str, Any]]) -> list[str]:
    return [sample["__key__"].rsplit("/", 1)[-1] for sample in bucket]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_header_that_stopped_the_archive_loader_before_the_re_read_resumes_exactly(tmp_path, num_workers):
    """``header`` has taken its items before the shuffle's oldest snapshot: the re-read never pulls the archive
    loader, which stays at its restored position in the archive; that is the checkpoint's archive, not a
    changed file (was refused: "reached the checkpoint in None, not in this archive")."""
    write_image_shards(tmp_path, shards=2, per_shard=4, size=8, progress=False)

    def build() -> Any:  # the bucketizer's buffer takes all of header's items before the shuffle's first pull
        return (IterableWrapper(sorted(str(p) for p in tmp_path.glob("*.tar"))).open_files_by_fsspec(mode="rb")
                .load_from_tar().webdataset().header(5)
                .max_token_bucketize(max_token_count=2, len_fn=one_token, buffer_size=6)
                .shuffle(buffer_size=4).map(bucket_keys))

    full, resumed, _ = run_and_resume(build, take=3 * max(1, num_workers), num_workers=num_workers,
                                      warn_unsharded=False)  # each worker reads both shards
    assert resumed == full and len(full) == 3 * max(1, num_workers)


def in_the_first_shard(sample: dict[str, Any]) -> bool:
    return "shard-000000" in sample["__key__"]


def test_a_checkpoint_after_the_shuffle_input_ended_resumes_exactly(tmp_path):
    """The last pull ran the pipes above to their end (a filter dropping the items of the later shards), past
    where the re-read of the buffer stops: the archive loader's position at the checkpoint is not the re-read's,
    and the files have not changed (was refused: "reached the checkpoint in ..., not in this archive")."""
    write_image_shards(tmp_path, shards=3, per_shard=2, size=8, progress=False)

    def build() -> Any:
        return (IterableWrapper(sorted(str(p) for p in tmp_path.glob("*.tar"))).open_files_by_fsspec(mode="rb")
                .load_from_tar().webdataset().header(5).filter(in_the_first_shard)
                .shuffle(buffer_size=4).map(sample_key))

    full, resumed, _ = run_and_resume(build, take=2)
    assert resumed == full and len(full) == 2


def sample_key(sample: dict[str, Any]) -> str:
    return sample["__key__"].rsplit("/", 1)[-1]
