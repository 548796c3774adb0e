"""Exact resume with workers that keep their positions and send them on request (pipekit._worker_states)."""

from __future__ import annotations

import io
import multiprocessing
import pickle

import pytest
import torch

import pipekit
from pipekit._loader_seam import worker_dataset_states
from pipekit._worker_states import DEFERRED, StateChannel, WorkerStates, resolve_deferred
from pipekit.errors import WorkerStateError
from pipekit.pipes import IterableWrapper

ITEM_BYTES = 4096
N = 400


def blob(i: int) -> bytes:
    return i.to_bytes(4, "little") * (ITEM_BYTES // 4)


def blobs_pipe(buffer_size: int = 100):
    """Bytes items through a shuffle buffer before the sharding: each worker buffers ``buffer_size`` items."""
    return IterableWrapper([blob(i) for i in range(N)]).shuffle(buffer_size=buffer_size).sharding_filter().batch(8)


def ids(batches) -> list[int]:
    return [int.from_bytes(b[:4], "little") for batch in batches for b in batch]


def uninterrupted(make, num_workers: int, seed: int = 0, **kw):
    torch.manual_seed(seed)
    loader = pipekit.DataLoader(make(), num_workers=num_workers, **kw)
    out = list(loader)
    loader.shutdown()
    return out


def resumed_at(make, num_workers: int, stop_after: int, seed: int = 0, through=None, **kw):
    """Take ``stop_after`` batches, checkpoint (through ``through(state)``), resume in a new loader."""
    torch.manual_seed(seed)
    loader = pipekit.DataLoader(make(), num_workers=num_workers, **kw)
    it = iter(loader)
    head = [next(it) for _ in range(stop_after)]
    state = loader.state_dict()
    loader.shutdown()
    if through is not None:
        state = through(state)
    second = pipekit.DataLoader(make(), num_workers=num_workers, **kw)
    second.load_state_dict(state)
    rest = list(second)
    second.shutdown()
    return head, rest


def via_torch_save(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


class TestTwoWorkersShuffleBuffer:
    @pytest.mark.parametrize("stop_after", [1, 2, 7, 20, 40])
    def test_resume_equals_the_uninterrupted_run(self, stop_after):
        full = uninterrupted(blobs_pipe, 2)
        head, rest = resumed_at(blobs_pipe, 2, stop_after)
        assert head + rest == full
        assert sorted(ids(full)) == list(range(N))

    def test_checkpoint_loads_with_weights_only(self):
        full = uninterrupted(blobs_pipe, 2)
        head, rest = resumed_at(blobs_pipe, 2, 9, through=via_torch_save)
        assert head + rest == full

    def test_checkpoint_of_a_resumed_run(self):
        """The workers of a resumed run keep positions too: a second checkpoint resumes exactly."""
        full = uninterrupted(blobs_pipe, 2)
        torch.manual_seed(0)
        first = pipekit.DataLoader(blobs_pipe(), num_workers=2)
        it = iter(first)
        head = [next(it) for _ in range(5)]
        state = first.state_dict()
        first.shutdown()
        second = pipekit.DataLoader(blobs_pipe(), num_workers=2)
        second.load_state_dict(state)
        it = iter(second)
        middle = [next(it) for _ in range(6)]
        state2 = second.state_dict()
        second.shutdown()
        third = pipekit.DataLoader(blobs_pipe(), num_workers=2)
        third.load_state_dict(via_torch_save(state2))
        assert head + middle + list(third) == full
        third.shutdown()

    def test_state_sent_with_each_batch_does_not_carry_the_buffer(self):
        """Workers send a token with each batch; state_dict() holds the buffer's positions, not its bytes."""
        torch.manual_seed(0)
        loader = pipekit.DataLoader(blobs_pipe(buffer_size=100), num_workers=2)
        it = iter(loader)
        for _ in range(6):
            next(it)
        sent = worker_dataset_states(loader._iterator)
        assert sorted(sent) == [0, 1]
        for state in sent.values():
            assert state["mode"] == DEFERRED
            assert len(pickle.dumps(state)) < 2000  # 100 buffered items of 4 KB would be 400 KB
        checkpoint = loader.state_dict()
        loader.shutdown()
        size = len(pickle.dumps(checkpoint))
        assert size < 2 * 100 * ITEM_BYTES / 4  # positions: the buffered items are re-read on resume
        assert DEFERRED not in _modes(checkpoint)

    def test_checkpoint_after_the_epoch_ended(self):
        torch.manual_seed(0)
        loader = pipekit.DataLoader(blobs_pipe(), num_workers=2)
        assert len(list(loader)) == N // 8
        state = via_torch_save(loader.state_dict())
        loader.shutdown()
        assert DEFERRED not in _modes(state)
        again = pipekit.DataLoader(blobs_pipe(), num_workers=2)
        again.load_state_dict(state)
        assert sorted(ids(list(again))) == list(range(N))  # the epoch had ended: the next one is whole
        again.shutdown()

    def test_workers_restarted_each_epoch(self):
        """persistent_workers=False: each epoch's workers get a new channel."""
        torch.manual_seed(0)
        loader = pipekit.DataLoader(blobs_pipe(), num_workers=2, persistent_workers=False)
        assert sorted(ids(list(loader))) == list(range(N))
        it = iter(loader)
        head = [next(it) for _ in range(4)]
        state = loader.state_dict()
        rest = list(it)
        resumed = pipekit.DataLoader(blobs_pipe(), num_workers=2, persistent_workers=False)
        resumed.load_state_dict(state)
        assert list(resumed) == rest
        assert sorted(ids(head + rest)) == list(range(N))

    def test_spawned_workers(self):
        """With the spawn start method the channel is pickled into the workers with the pipe."""
        make = lambda: blobs_pipe(buffer_size=20)  # noqa: E731
        full = uninterrupted(make, 2)  # the order follows from the seed, not from how workers start
        head, rest = resumed_at(make, 2, 5, multiprocessing_context="spawn")
        assert head + rest == full

    @pytest.mark.parametrize("every", [3, 1000])
    def test_snapshot_every_n_steps(self, every):
        full = uninterrupted(blobs_pipe, 2)
        head, rest = resumed_at(blobs_pipe, 2, 7, snapshot_every_n_steps=every)
        assert head + rest == full


def _modes(obj, out=None) -> list[str]:
    out = [] if out is None else out
    if isinstance(obj, dict):
        if "mode" in obj:
            out.append(obj["mode"])
        for value in obj.values():
            _modes(value, out)
    return out


class TestChannel:
    def channel(self, depth: int = 2) -> StateChannel:
        return StateChannel(multiprocessing.get_context("fork"), 1, depth)

    def test_a_kept_position_is_sent_and_an_old_one_is_refused(self):
        channel = self.channel(depth=2)
        kept = WorkerStates(channel, 0)
        tokens = [kept.keep(1, seq, {"mode": "snapshot", "seq": seq}) for seq in range(4)]
        state = {"workers": {"w0": {**tokens[3], "report": {"skips": {}}}}}
        resolved = resolve_deferred(state, channel, lambda w: True)
        assert resolved == {"workers": {"w0": {"mode": "snapshot", "seq": 3, "report": {"skips": {}}}}}
        assert state["workers"]["w0"]["mode"] == DEFERRED  # the input is left as it was
        expected = r"worker 0: the position of batch 0 of iterator 1 is no longer kept"
        with pytest.raises(WorkerStateError, match=expected):
            resolve_deferred({"w0": tokens[0]}, channel, lambda w: True)
        kept.stop()
        channel.close()

    def test_kept_states_are_materialized_in_the_answer_and_a_failure_is_reported(self):
        channel = self.channel(depth=3)

        def materialize(state):
            if state["seq"] == 2:
                raise ValueError("broken")
            return {**state, "materialized": True}

        kept = WorkerStates(channel, 0, materialize)
        tokens = [kept.keep(1, seq, {"mode": "snapshot", "seq": seq}) for seq in range(3)]
        resolved = resolve_deferred({"w0": tokens[1]}, channel, lambda w: True)
        assert resolved == {"w0": {"mode": "snapshot", "seq": 1, "materialized": True}}
        expected = r"worker 0: rebuilding the position of batch 2 .*ValueError\('broken'\)"
        with pytest.raises(WorkerStateError, match=expected):
            resolve_deferred({"w0": tokens[2]}, channel, lambda w: True)
        kept.stop()
        channel.close()

    def test_a_dead_worker_is_named(self):
        channel = self.channel()
        token = {"mode": DEFERRED, "worker": 0, "run": 1, "seq": 5}  # no worker answers
        expected = r"worker 0 exited before sending its position.*resume from the last checkpoint"
        with pytest.raises(WorkerStateError, match=expected) as info:
            resolve_deferred({"w0": token}, channel, lambda w: False)
        assert info.value.workers == [0]
        channel.close()

    def test_no_answer_within_the_timeout_names_the_worker(self):
        channel = StateChannel(multiprocessing.get_context("fork"), 2, 2)
        tokens = {f"w{w}": {"mode": DEFERRED, "worker": w, "run": 1, "seq": 3} for w in (0, 1)}  # nobody answers
        expected = r"workers 0, 1 did not answer within 0.5 s \(state_timeout\)"
        with pytest.raises(WorkerStateError, match=expected) as info:
            resolve_deferred(tokens, channel, lambda w: True, timeout=0.5)
        assert info.value.workers == [0, 1]
        channel.close()

    def test_states_without_tokens_pass_through(self):
        state = {"a": {"mode": "snapshot"}}
        assert resolve_deferred(state, None, lambda w: True) is state

    def test_pickled_outside_a_process_start_it_is_left_behind(self):
        channel = self.channel()
        assert pickle.loads(pickle.dumps(channel)) is None
        channel.close()


def test_pipes_answer_is_child_datapipe_without_a_lookup_miss():
    """torch's iterator hook asks every pipe at every next(); a class default answers (fork children: True)."""
    pipe = IterableWrapper(range(3)).map(abs)
    assert "_is_child_datapipe" not in vars(pipe)
    assert pipe._is_child_datapipe is False
    a, b = IterableWrapper(range(4)).fork(2)
    assert a._is_child_datapipe is True
    assert list(a) == [0, 1, 2, 3] and list(b) == [0, 1, 2, 3]


def _read_and_close(item):
    url, stream = item
    data = stream.read()
    stream.close()
    return url, data


class TestLocalFilesChain:
    """The chain of ``benchmarks/pipes_overhead.py`` (local folder listed with os.scandir, opened with open())."""

    @pytest.fixture
    def folder(self, tmp_path):
        for i in range(120):
            sub = tmp_path / "files" / f"class{i % 3}"
            sub.mkdir(parents=True, exist_ok=True)
            (sub / f"{i:04d}.bin").write_bytes(blob(i))
        return tmp_path / "files"

    @pytest.mark.parametrize("num_workers", [0, 2])
    def test_resume_is_exact(self, folder, num_workers):
        def make():
            return (
                IterableWrapper([str(folder)])
                .list_files_by_fsspec(masks="*.bin", recursive=True)
                .shuffle()
                .sharding_filter()
                .open_files_by_fsspec(mode="rb")
                .map(_read_and_close)
                .batch(8)
            )

        full = uninterrupted(make, num_workers)
        assert sorted(url for batch in full for url, _ in batch) == sorted(str(p) for p in folder.rglob("*.bin"))
        for stop_after in (1, 6):
            head, rest = resumed_at(make, num_workers, stop_after, through=via_torch_save)
            assert head + rest == full


class _SlowOnWorker1:
    """Worker 1 sleeps on every item, so worker 0 runs out first while its last batches wait behind worker 1's."""

    def __call__(self, x: bytes) -> bytes:
        info = torch.utils.data.get_worker_info()
        if info is not None and info.id == 1:
            import time

            time.sleep(0.02)
        return x


def test_checkpoints_while_a_finished_worker_has_batches_in_flight():
    """A worker whose data ended early, its StopIteration received ahead of its last batch, still answers.

    torch tells such a worker to exit as soon as its StopIteration arrives, while the main process
    still holds (and has not yet yielded) its last batches; the checkpoint after one of those names a
    position only that worker holds. pipekit keeps the worker, paused, until the epoch ends.
    """

    def make():
        return IterableWrapper([blob(i) for i in range(64)]).sharding_filter().map(_SlowOnWorker1()).batch(4)

    torch.manual_seed(0)
    loader = pipekit.DataLoader(make(), num_workers=2, persistent_workers=False)
    expected = ids(uninterrupted(make, 2))
    got, states = [], []
    for batch in loader:
        got += ids([batch])
        states.append(pickle.dumps(loader.state_dict()))  # every batch: the soak's pattern
    loader.shutdown()
    assert sorted(got) == sorted(expected) == list(range(64))
    # resuming from each checkpoint gives the rest of the epoch exactly
    for k in (len(states) // 2, len(states) - 2):
        second = pipekit.DataLoader(make(), num_workers=2, persistent_workers=False)
        second.load_state_dict(pickle.loads(states[k]))
        rest = ids(list(second))
        second.shutdown()
        assert sorted(got[: 4 * (k + 1)] + rest) == list(range(64)), k


def _with_draws(x: int) -> tuple[int, int, float]:
    """An item with a draw from torch's global generator and one from Python's, as augmentations make in a worker."""
    import random

    return x, int(torch.randint(0, 1 << 30, ()).item()), random.random()


@pytest.mark.timeout(60)
def test_a_worker_resumes_its_global_random_state():
    """Draws from a worker's global generators after the checkpoint are the uninterrupted run's."""

    def make():
        return IterableWrapper(range(12)).sharding_filter().map(_with_draws).batch(2)

    full = uninterrupted(make, 1)
    head, rest = resumed_at(make, 1, 3, through=via_torch_save)
    assert head + rest == full


def _forked_cycle_of_a_shuffle():
    """fork cannot report its position (the loader replays), and the shuffle's second pass draws its seed."""
    a, b = IterableWrapper(range(6)).shuffle(buffer_size=6).cycle(2).fork(2)
    return a.zip(b)


@pytest.mark.timeout(60)
def test_a_replayed_epoch_draws_what_the_uninterrupted_one_drew():
    """Resumed by replaying, the pipes draw from the random state the epoch started with, not the checkpoint's."""
    torch.manual_seed(0)
    full = list(pipekit.DataLoader(_forked_cycle_of_a_shuffle()))
    torch.manual_seed(0)
    loader = pipekit.DataLoader(_forked_cycle_of_a_shuffle())
    it = iter(loader)
    head = [next(it) for _ in range(8)]  # into the second pass
    state, rng = loader.state_dict(), torch.get_rng_state()  # a training checkpoint keeps torch's RNG too
    torch.manual_seed(99)
    torch.set_rng_state(rng)
    resumed = pipekit.DataLoader(_forked_cycle_of_a_shuffle())
    resumed.load_state_dict(state)
    assert head + list(resumed) == full


def _pair(sample: tuple) -> tuple:
    (url, stream), _ = sample
    return url, stream.read()


@pytest.mark.timeout(60)
def test_a_replayed_resume_refuses_an_archive_replaced_since_the_checkpoint(tmp_path):
    """``fork`` cannot report its position, so the resume replays the items; a shard replaced since the checkpoint
    must not be replayed into the old count (items repeated or lost): refused, naming it."""
    import pipekit
    from pipekit.errors import CheckpointError
    from pipekit.synthetic import write_image_shards

    root, other = tmp_path / "shards", tmp_path / "other"
    write_image_shards(root, shards=3, per_shard=4, size=8, progress=False)
    write_image_shards(other, shards=2, per_shard=6, size=8, seed=1, progress=False)

    def make():
        members = IterableWrapper(sorted(str(p) for p in root.glob("*.tar"))).open_files_by_fsspec(
            mode="rb").load_from_tar()
        a, b = members.fork(2)
        return a.zip(b).map(_pair)

    loader = pipekit.DataLoader(make())
    it = iter(loader)
    head = [next(it) for _ in range(10)]  # in shard 1 (8 members a shard: .jpg and .cls)
    state = loader.state_dict()
    assert "shard-000001" in head[-1][0]
    victim = sorted(root.glob("*.tar"))[1]
    victim.write_bytes(sorted(other.glob("*.tar"))[1].read_bytes())
    resumed = pipekit.DataLoader(make())
    resumed.load_state_dict(state)
    with pytest.raises(CheckpointError, match=r"shard-000001\.tar.*changed since the checkpoint"):
        list(resumed)


# -- files read before a checkpoint and read again after it (a replay, a later pass of a cycle) ---------------


def _read_file(item: tuple) -> tuple:
    url, stream = item
    data = stream.read()
    stream.close()
    return url.rsplit("/", 1)[-1], data


def _bin_files(root, n: int = 6) -> list[str]:
    root.mkdir()
    for i in range(n):
        (root / f"f{i}.bin").write_bytes(bytes([i]) * (10 + i))
    return sorted(str(p) for p in root.glob("*.bin"))


def _forked_files(urls):
    """fork cannot report its position: the loader replays the items, opening the files read before again."""
    a, b = urls.open_files_by_fsspec(mode="rb").map(_read_file).fork(2)
    return a.zip(b)


def _checkpointed(make, take: int, num_workers: int = 0) -> tuple[list, dict]:
    loader = pipekit.DataLoader(make(), num_workers=num_workers)
    it = iter(loader)
    head = [next(it) for _ in range(take)]
    state = loader.state_dict()
    loader.shutdown()
    return head, pickle.loads(pickle.dumps(state))


def _resume(make, state: dict, num_workers: int = 0) -> list:
    loader = pipekit.DataLoader(make(), num_workers=num_workers)
    loader.load_state_dict(state)
    try:
        return list(loader)
    finally:
        loader.shutdown()


def _other_contents(path) -> None:
    """The same name, other bytes (and size): what a dataset update does to a file."""
    path.write_bytes(b"\xff" * (path.stat().st_size + 3))


@pytest.mark.timeout(60)
def test_a_replayed_resume_refuses_a_plain_file_replaced_since_the_checkpoint(tmp_path):
    """A plain file read before the checkpoint and replaced since used to be replayed with its new contents silently."""
    from pipekit.errors import CheckpointError

    urls = _bin_files(tmp_path / "files")

    def make():
        return _forked_files(IterableWrapper(urls))

    _, state = _checkpointed(make, 3)
    _other_contents(tmp_path / "files" / "f1.bin")
    with pytest.raises(CheckpointError, match=r"f1\.bin.*changed since the checkpoint"):
        _resume(make, state)


@pytest.mark.timeout(60)
def test_a_replayed_resume_names_a_listed_file_deleted_since_the_checkpoint(tmp_path):
    """A listed file read before the checkpoint and deleted since: the replay is refused naming it, not by counts."""
    from pipekit.errors import CheckpointError

    root = tmp_path / "files"
    _bin_files(root)

    def make():
        return _forked_files(IterableWrapper([str(root)]).list_files_by_fsspec(masks="*.bin"))

    _, state = _checkpointed(make, 4)
    (root / "f1.bin").unlink()
    with pytest.raises(CheckpointError, match=r"f1\.bin"):
        _resume(make, state)


@pytest.mark.timeout(60)
def test_a_replayed_resume_of_unchanged_files_is_exact(tmp_path):
    urls = _bin_files(tmp_path / "files")

    def make():
        return _forked_files(IterableWrapper(urls))

    full = list(pipekit.DataLoader(make()))
    head, state = _checkpointed(make, 3)
    assert head + _resume(make, state) == full


def _cycled_files(urls):
    return IterableWrapper(urls).open_files_by_fsspec(mode="rb").map(_read_file).cycle(2)


@pytest.mark.timeout(60)
def test_a_later_cycle_pass_refuses_a_file_replaced_since_the_checkpoint(tmp_path):
    """The next pass of a cycle reads a file again: replaced since the checkpoint, it used to give its new contents
    where the uninterrupted run read the old ones."""
    from pipekit.errors import CheckpointError

    urls = _bin_files(tmp_path / "files")
    full = list(pipekit.DataLoader(_cycled_files(urls)))
    head, state = _checkpointed(lambda: _cycled_files(urls), 2)
    _other_contents(tmp_path / "files" / "f0.bin")
    loader = pipekit.DataLoader(_cycled_files(urls))
    loader.load_state_dict(state)
    rest = []
    with pytest.raises(CheckpointError, match=r"f0\.bin.*changed since the checkpoint.*cycle"):
        rest.extend(loader)
    assert head + rest == full[:6]  # the first pass ends as it would have; the second is refused at its first file


@pytest.mark.timeout(60)
def test_a_cycle_resumed_twice_still_knows_the_files_read_before_the_first_checkpoint(tmp_path):
    from pipekit.errors import CheckpointError

    urls = _bin_files(tmp_path / "files")

    def make():
        return _cycled_files(urls)

    _, state = _checkpointed(make, 2)
    loader = pipekit.DataLoader(make())
    loader.load_state_dict(state)
    it = iter(loader)
    next(it)
    state = pickle.loads(pickle.dumps(loader.state_dict()))  # taken in the resumed epoch: f0 and f1 were read
    _other_contents(tmp_path / "files" / "f0.bin")
    with pytest.raises(CheckpointError, match=r"f0\.bin"):
        _resume(make, state)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_replayed_resume_with_a_worker_refuses_a_file_replaced_since_the_checkpoint(tmp_path):
    """A worker keeps its counted positions (and the stamps of the files opened by each) until a checkpoint asks."""
    from pipekit.errors import CheckpointError

    urls = _bin_files(tmp_path / "files")

    def make():
        return _forked_files(IterableWrapper(urls).sharding_filter())

    full = list(pipekit.DataLoader(make(), num_workers=1))
    head, state = _checkpointed(make, 2, num_workers=1)
    assert head + _resume(make, state, num_workers=1) == full  # unchanged: exact
    _other_contents(tmp_path / "files" / "f0.bin")
    with pytest.raises(CheckpointError, match=r"f0\.bin.*changed since the checkpoint"):
        _resume(make, state, num_workers=1)


def _unbatched_shares():
    """unbatch cannot report its position.  Worker 0 gets batches 0 and 2, worker 1 batch 1: after its last item,
    worker 1 pulls batch 2 (worker 0's) to find the end, and ends while worker 0 still has an item to give."""
    return IterableWrapper(range(6)).batch(2).sharding_filter().unbatch()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_replayed_worker_checkpointed_after_its_last_item_resumes_to_the_end():
    """Found by a deep run: the position of a worker whose epoch had ended was checked after a replay that stopped
    at its last item, short of the pulls that found the end, and the resume was refused as if the data changed."""
    kw = {"batch_size": None, "prefetch_factor": 1, "persistent_workers": False}
    full = uninterrupted(_unbatched_shares, 2, **kw)
    assert full == [0, 2, 1, 3, 4, 5]
    head, rest = resumed_at(_unbatched_shares, 2, len(full), **kw)
    assert head + rest == full and rest == []


def _shuffles_under_nested_cycles():
    """A shuffle above an inner cycle, another between it and an outer cycle: later passes draw their seeds."""
    return IterableWrapper(range(5)).shuffle(buffer_size=3).cycle(2).shuffle(buffer_size=3).cycle(2)


@pytest.mark.timeout(60)
def test_a_checkpoint_at_the_end_of_an_outer_pass_resumes_the_next_pass_exactly():
    """Checkpointed as the outer cycle's first pass yields its last item, the inner cycle has ended and the first
    shuffle's position is dropped when the outer cycle starts its next pass.  That pass must draw the first
    shuffle's seed from torch's generator, as the uninterrupted run did, not take the seed the resumed loader
    gave the epoch (spent in the checkpointed run, at the epoch's first pass)."""
    generator = torch.Generator()
    torch.manual_seed(0)
    generator.manual_seed(0)
    full = list(pipekit.DataLoader(_shuffles_under_nested_cycles(), generator=generator))
    torch.manual_seed(0)
    generator.manual_seed(0)
    loader = pipekit.DataLoader(_shuffles_under_nested_cycles(), generator=generator)
    it = iter(loader)
    head = [next(it) for _ in range(10)]  # the outer cycle's first pass, to its last item
    state, rng = loader.state_dict(), torch.get_rng_state()  # a training checkpoint keeps torch's RNG too
    torch.manual_seed(99)
    torch.set_rng_state(rng)
    generator.manual_seed(12345)  # the resumed epoch's order comes from the checkpoint
    resumed = pipekit.DataLoader(_shuffles_under_nested_cycles(), generator=generator)
    resumed.load_state_dict(state)
    assert head + list(resumed) == full
