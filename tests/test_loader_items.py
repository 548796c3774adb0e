"""Issue 35: items that cannot be checkpointed or cannot cross to the main process, and workers dying unseen.

* a shuffle buffer holding archive-member streams (torchdata's idiom
  ``load_from_tar().webdataset().shuffle(n).decode()``) checkpoints the members' bytes, so the resumed run
  reads the same samples and the checkpoint loads with ``torch.load(weights_only=True)``; a buffer holding
  streams that are not in memory (open files) is refused by ``state_dict()`` naming the pipe and the file;
* an item that cannot be pickled to the main process, however deep, raises a typed error naming the pipe,
  the key path and the type, in seconds, instead of hanging a loader with workers;
* a worker killed while the main process is busy elsewhere (its training step) raises
  :class:`~pipekit.errors.WorkerDiedError`, not torch's bare ``RuntimeError``.
"""

from __future__ import annotations

import functools
import io
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import pipekit
from pipekit._loader_seam import worker_processes
from pipekit.errors import UnsupportedItemError, WorkerDiedError
from pipekit.pipes import IterableWrapper
from pipekit.pipes._builtin import ResumableShuffler
from pipekit.synthetic import write_image_shards

pytestmark = pytest.mark.timeout(120)


def write_files(root: Path, count: int) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        path = root / f"f{i}.txt"
        path.write_bytes(f"file {i}".encode())
        paths.append(str(path))
    return paths


def read_pair(item: tuple[str, Any]) -> tuple[str, bytes]:
    url, stream = item
    try:
        return url, stream.read()
    finally:
        stream.close()


@pytest.fixture
def inline_buffers(monkeypatch):
    """Shuffle buffers keep their items inline in checkpoints (a replay window of 0).

    By default a checkpoint holds the buffered items' positions and re-reads them
    (tests/pipes/test_shuffle_checkpoint.py); items are kept inline only when
    buffered longer than the window, or when the pipes above cannot be replayed.
    Those are the items a checkpoint refuses when they cannot be pickled.
    """
    monkeypatch.setattr(ResumableShuffler, "replay_window", 0)  # workers are forked: they see it too


# ----------------------------------------------------------------------- a shuffle buffer holding member streams


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> list[str]:
    root = tmp_path_factory.mktemp("shards")
    write_image_shards(root, shards=2, per_shard=8, size=16, progress=False)
    return sorted(str(p) for p in root.glob("*.tar"))


def key_and_image(sample: dict[str, Any]) -> tuple[str, torch.Tensor, int]:
    return sample["__key__"], sample[".jpg"], sample[".cls"]


def shuffled_members(urls: list[str]):
    """torchdata's idiom: the shuffle buffer holds webdataset samples of undecoded member streams."""
    return (
        IterableWrapper(urls)
        .sharding_filter()
        .open_files_by_fsspec(mode="rb")
        .load_from_tar()
        .webdataset()
        .shuffle(buffer_size=5)
        .decode()
        .map(key_and_image)
    )


def loader_of(pipe, num_workers: int, **kwargs: Any) -> pipekit.DataLoader:
    """A loader whose workers must answer within 60 s (torch allows a timeout only with workers)."""
    return pipekit.DataLoader(pipe, num_workers=num_workers, timeout=60 if num_workers else 0, **kwargs)


def run_and_resume(build, num_workers: int, take: int) -> tuple[list[Any], list[Any]]:
    """The uninterrupted run's items, and a run checkpointed after ``take`` items (saved, loaded with
    ``weights_only=True``) and resumed in a new loader."""
    torch.manual_seed(0)
    full = list(loader_of(build(), num_workers))
    torch.manual_seed(0)
    loader = loader_of(build(), num_workers)
    it = iter(loader)
    head = [next(it) for _ in range(take)]
    buffer = io.BytesIO()
    torch.save(loader.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    resumed = loader_of(build(), num_workers)
    resumed.load_state_dict(state)
    return full, head + list(resumed)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_shuffled_member_streams_resume_with_their_bytes(shards, num_workers):
    full, resumed = run_and_resume(lambda: shuffled_members(shards), num_workers, take=3)
    assert len(full) == 16
    assert [k for k, _, _ in resumed] == [k for k, _, _ in full]
    for (key, image, label), (_, want_image, want_label) in zip(resumed, full, strict=True):
        assert torch.equal(image, want_image), key
        assert label == want_label, key


@pytest.mark.parametrize("num_workers", [0, 2])
def test_shuffled_member_streams_kept_inline_resume_with_their_bytes(inline_buffers, shards, num_workers):
    full, resumed = run_and_resume(lambda: shuffled_members(shards), num_workers, take=3)
    assert [k for k, _, _ in resumed] == [k for k, _, _ in full] and len(full) == 16
    for (key, image, _), (_, want_image, _) in zip(resumed, full, strict=True):
        assert torch.equal(image, want_image), key


def test_member_streams_kept_inline_by_workers_after_they_were_decoded(inline_buffers, tmp_path):
    """A worker's kept position refers to buffered samples that its pipeline decoded (and closed) since."""
    write_image_shards(tmp_path, shards=2, per_shard=40, size=16, progress=False)
    urls = sorted(str(p) for p in tmp_path.glob("*.tar"))
    loader = loader_of(shuffled_members(urls), 2)
    it = iter(loader)
    for _ in range(16):
        next(it)
    state = loader.state_dict()
    loader.shutdown()
    assert state


@pytest.mark.parametrize("num_workers", [0, 2])
def test_shuffled_open_files_are_reopened_on_resume(tmp_path, num_workers):
    """Positions, not the open files, are checkpointed: the resumed run opens the buffered files again."""
    urls = write_files(tmp_path / "files", 12)

    def build():
        pipe = IterableWrapper(urls).sharding_filter().open_files_by_fsspec(mode="rb").shuffle(buffer_size=4)
        return pipe.map(read_pair)

    full, resumed = run_and_resume(build, num_workers, take=3)
    assert resumed == full and sorted(full) == sorted([u, f"file {i}".encode()] for i, u in enumerate(urls))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_shuffled_open_files_are_refused_at_state_dict(inline_buffers, tmp_path, num_workers):
    urls = write_files(tmp_path / "files", 12)
    pipe = IterableWrapper(urls).sharding_filter().open_files_by_fsspec(mode="rb").shuffle(buffer_size=4)
    loader = loader_of(pipe.map(read_pair), num_workers)
    it = iter(loader)
    next(it)
    started = time.monotonic()
    with pytest.raises(UnsupportedItemError) as info:
        loader.state_dict()
    assert time.monotonic() - started < 30
    message = str(info.value)
    assert "shuffle" in message and "open stream" in message
    assert any(repr(url) in message for url in urls), message
    assert "before shuffling" in message or "before the shuffle" in message
    # The run itself goes on: only the checkpoint is refused.
    assert len([next(it), *it]) == 11


# ------------------------------------------------------------------- items that cannot cross to the main process


def sample_with_stream(path: str, i: int) -> dict[str, Any]:
    """Sample 6 holds an open file: the last of worker 0's batch [0, 2, 4, 6], not its first."""
    return {"__key__": str(i), ".jpg": open(path, "rb") if i == 6 else b"jpeg"}


def sample_with_generator(i: int) -> dict[str, Any]:
    return {"__key__": str(i), "pixels": (j for j in range(i))}


def sample_with_lock(i: int) -> dict[str, Any]:
    return {"__key__": str(i), "meta": {"lock": threading.Lock()}}


CASES = {
    # (builds the pipe from a file path, the stage named, the key path, the type named)
    "stream_in_batch": (
        lambda path: (
            IterableWrapper(range(8)).sharding_filter().map(functools.partial(sample_with_stream, path)).batch(4)
        ),
        "batch",
        "[3]['.jpg']",
        "BufferedReader",
    ),
    "generator": (
        lambda path: IterableWrapper(range(8)).sharding_filter().map(sample_with_generator),
        "map",
        "['pixels']",
        "generator",
    ),
    "lock_in_dict": (
        lambda path: IterableWrapper(range(8)).sharding_filter().map(sample_with_lock),
        "map",
        "['meta']['lock']",
        "lock",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_item_that_cannot_cross_raises_naming_it(tmp_path, case):
    build, stage, path, kind = CASES[case]
    file = tmp_path / "x.jpg"
    file.write_bytes(b"jpeg")
    loader = pipekit.DataLoader(build(str(file)), num_workers=2, timeout=60)
    started = time.monotonic()
    with pytest.raises(UnsupportedItemError) as info:
        list(loader)
    assert time.monotonic() - started < 30, "no error in 30 s: the item was lost on its way"
    message = str(info.value)
    assert "DataLoader timed out" not in message
    assert stage in message and path in message and kind in message, message
    assert isinstance(info.value, TypeError)


def test_items_that_cross_are_unchanged(tmp_path):
    pipe = IterableWrapper(range(8)).sharding_filter().map(lambda i: {"x": [i, (i, str(i))], "t": torch.tensor(i)})
    got = sorted(pipekit.DataLoader(pipe, num_workers=2, timeout=60), key=lambda s: s["x"][0])
    assert [(s["x"][0], tuple(s["x"][1])) for s in got] == [(i, (i, str(i))) for i in range(8)]
    assert [int(s["t"]) for s in got] == list(range(8))


# ----------------------------------------------------------------- a worker killed while the main process is busy


def kill_and_train(pid: int, seconds: float) -> None:
    """Kill ``pid``, then compute for ``seconds`` (a training step: busy, not waiting on the loader)."""
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sum(i * i for i in range(1000))


def test_worker_killed_during_the_training_step_is_named(tmp_path):
    urls = write_files(tmp_path / "files", 8)  # worker 1 reads f1, f3, f5, f7
    pipe = IterableWrapper(urls).sharding_filter().open_files_by_fsspec(mode="rb").map(read_pair)
    loader = pipekit.DataLoader(pipe, num_workers=2, prefetch_factor=1, timeout=60)
    it = iter(loader)
    assert [next(it)[0], next(it)[0]] == urls[:2]  # worker 1's batch (f1) has arrived
    victim = worker_processes(it)[1]
    with pytest.raises(WorkerDiedError) as info:
        kill_and_train(victim.pid, seconds=30)
    err = info.value
    assert isinstance(err, RuntimeError)
    assert (err.worker_id, err.signal, err.pid) == (1, "SIGKILL", victim.pid)
    assert (err.url, err.stage) == (urls[1], "open_files_by_fsspec")
    assert f"worker 1 (pid {victim.pid}) killed by SIGKILL" in str(err)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_shuffled_unpicklable_items_are_refused_at_state_dict(inline_buffers, num_workers):
    pipe = IterableWrapper(range(12)).sharding_filter().map(sample_with_lock).shuffle(buffer_size=4)
    loader = loader_of(pipe.map(lambda s: s["__key__"]), num_workers)
    it = iter(loader)
    next(it)
    started = time.monotonic()
    with pytest.raises(UnsupportedItemError) as info:
        loader.state_dict()
    assert time.monotonic() - started < 30
    message = str(info.value)
    assert "shuffle" in message and "['meta']['lock']" in message and "lock" in message, message
    assert len([next(it), *it]) == 11


def lock_from_20(i: int) -> dict[str, Any]:
    return sample_with_lock(i) if i >= 20 else {"__key__": str(i)}


def test_unpicklable_items_arriving_later_fail_the_checkpoint_in_seconds(inline_buffers):
    """Workers check an iterator's first position only; a later one that cannot be sent still fails, bounded."""
    pipe = IterableWrapper(range(40)).sharding_filter().map(lock_from_20).shuffle(buffer_size=4)
    loader = loader_of(pipe.map(lambda s: s["__key__"]), 2)
    it = iter(loader)
    for _ in range(24):
        next(it)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"shuffle .*\['meta'\]\['lock'\], a lock that cannot be pickled"):
        loader.state_dict()
    assert time.monotonic() - started < 30


def test_stream_records_round_trip():
    from pipekit.pipes._archives import _MemberBytes
    from pipekit.pipes._stream_items import streams_as_bytes, streams_from_bytes
    from pipekit.pipes.base import StreamWrapper

    member = StreamWrapper(_MemberBytes(b"jpeg bytes"), name="s.tar/0.jpg")
    member.read()
    member.close()  # read and closed downstream since the position was kept: its bytes are still there
    plain = {"keep": [1, "a"], "buffer": [("s.tar/0.jpg", member), {"raw": io.BytesIO(b"raw")}]}
    converted, found = streams_as_bytes(plain)
    assert found is None
    assert converted["keep"] is plain["keep"]  # nothing copied where there is no stream
    buffer = io.BytesIO()
    torch.save(converted, buffer)
    buffer.seek(0)
    back = streams_from_bytes(torch.load(buffer, weights_only=True))
    url, stream = back["buffer"][0]
    assert url == "s.tar/0.jpg" and isinstance(stream, StreamWrapper) and stream.name == "s.tar/0.jpg"
    assert type(stream.file_obj) is _MemberBytes and stream.read() == b"jpeg bytes"
    assert type(back["buffer"][1]["raw"]) is io.BytesIO and back["buffer"][1]["raw"].read() == b"raw"
    with open(__file__, "rb") as f:
        _, found = streams_as_bytes({"buffer": [f]}, root="shuffle")
    assert found is not None and found[0] == "shuffle['buffer'][0]" and found[1] is f
