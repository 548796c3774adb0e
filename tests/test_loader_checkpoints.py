"""The checkpoint contract of ``pipekit.DataLoader`` where users take checkpoints.

* at the end of an epoch (after ``for batch in loader:``), on a fresh loader, after ``iter()`` and after the
  last batch: resuming gives exactly what the uninterrupted run gives next, with 0 and 2 workers, persistent
  or not;
* a checkpoint that does not fit the loader (empty, another pipeline, another number of workers) is refused
  at ``load_state_dict()`` with a :class:`~pipekit.errors.CheckpointError` naming what differs;
* ``state_dict()`` waits at most ``state_timeout`` for the workers, then names the ones that did not answer;
* the loader's arguments are checked up front, with messages naming them.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import pickle
import signal
import time

import pytest
import torch

import pipekit
from pipekit._loader import STATE_TIMEOUT_S
from pipekit.errors import CheckpointError, WorkerStateError
from pipekit.pipes import IterableWrapper
from pipekit.transforms.seeding import RandomStream

N = 48

# (num_workers, persistent_workers): pipekit's default persistence, and both settings with workers.
CONFIGS = [(0, None), (2, True), (2, False)]
CONFIG_IDS = ["0-workers", "2-workers-persistent", "2-workers-not-persistent"]


def make():
    """Shuffled before the sharding (the same order in every worker) and after it (a buffer in each worker)."""
    return IterableWrapper(range(N)).shuffle(buffer_size=8).sharding_filter().shuffle(buffer_size=4).batch(4)


def loader_for(num_workers: int, persistent: bool | None, pipe=None, **kw) -> pipekit.DataLoader:
    if persistent is not None:
        kw["persistent_workers"] = persistent
    return pipekit.DataLoader(make() if pipe is None else pipe, num_workers=num_workers, **kw)


def items(batches) -> list[int]:
    return [int(x) for batch in batches for x in batch]


def via_torch_save(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def resume(state, num_workers: int, persistent: bool | None, seed: int = 1234) -> pipekit.DataLoader:
    """A new loader from ``state``, in a process whose random state differs from the first run's."""
    torch.manual_seed(seed)
    loader = loader_for(num_workers, persistent)
    loader.load_state_dict(via_torch_save(state))
    return loader


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("num_workers", "persistent"), CONFIGS, ids=CONFIG_IDS)
class TestWhereUsersCheckpoint:
    def test_end_of_epoch_resumes_to_the_next_epoch(self, num_workers, persistent):
        torch.manual_seed(0)
        loader = loader_for(num_workers, persistent)
        first = items(loader)
        state = loader.state_dict()
        second = items(loader)
        loader.shutdown()
        assert sorted(first) == sorted(second) == list(range(N))
        assert first != second  # each epoch is shuffled anew: the test tells the epochs apart
        resumed = resume(state, num_workers, persistent)
        assert items(resumed) == second
        resumed.shutdown()

    def test_end_of_epoch_checkpoint_fixes_the_next_epoch(self, num_workers, persistent):
        """Random draws between the checkpoint and the next epoch change neither run's next epoch."""
        torch.manual_seed(0)
        loader = loader_for(num_workers, persistent)
        items(loader)
        state = loader.state_dict()
        torch.rand(3)  # e.g. an evaluation drawing from torch's global generator
        again = loader.state_dict()
        second = items(loader)
        loader.shutdown()
        for checkpoint in (state, again):
            resumed = resume(checkpoint, num_workers, persistent)
            assert items(resumed) == second
            resumed.shutdown()

    def test_resumed_from_an_end_of_epoch_then_checkpointed_mid_epoch(self, num_workers, persistent):
        torch.manual_seed(0)
        loader = loader_for(num_workers, persistent)
        items(loader)
        state = loader.state_dict()
        second = items(loader)
        loader.shutdown()
        resumed = resume(state, num_workers, persistent)
        it = iter(resumed)
        head = items([next(it) for _ in range(3)])
        middle = resumed.state_dict()
        resumed.shutdown()
        again = resume(middle, num_workers, persistent, seed=99)
        assert head + items(again) == second
        again.shutdown()

    def test_resumed_from_an_end_of_epoch_then_checkpointed_before_iter(self, num_workers, persistent):
        """state_dict() on the resumed loader starts its epoch (as torch does): from the checkpoint's seeds."""
        torch.manual_seed(0)
        loader = loader_for(num_workers, persistent)
        items(loader)
        state = loader.state_dict()
        second = items(loader)
        loader.shutdown()
        resumed = resume(state, num_workers, persistent)
        again = resumed.state_dict()
        assert items(resumed) == second
        resumed.shutdown()
        twice = resume(again, num_workers, persistent, seed=7)
        assert items(twice) == second
        twice.shutdown()

    def test_fresh_loader(self, num_workers, persistent):
        torch.manual_seed(0)
        loader = loader_for(num_workers, persistent)
        state = loader.state_dict()
        first = items(loader)
        loader.shutdown()
        resumed = resume(state, num_workers, persistent)
        assert items(resumed) == first
        resumed.shutdown()

    def test_after_iter_before_the_first_item(self, num_workers, persistent):
        torch.manual_seed(0)
        loader = loader_for(num_workers, persistent)
        it = iter(loader)
        state = loader.state_dict()
        first = items(it)
        loader.shutdown()
        assert sorted(first) == list(range(N))
        resumed = resume(state, num_workers, persistent)
        assert items(resumed) == first
        resumed.shutdown()

    def test_after_the_last_batch_before_stop_iteration(self, num_workers, persistent):
        torch.manual_seed(0)
        loader = loader_for(num_workers, persistent)
        it = iter(loader)
        first = items([next(it) for _ in range(N // 4)])
        state = loader.state_dict()
        with pytest.raises(StopIteration):
            next(it)
        loader.shutdown()
        assert sorted(first) == list(range(N))
        resumed = resume(state, num_workers, persistent)
        assert items(resumed) == []  # the rest of that epoch: nothing
        assert sorted(items(resumed)) == list(range(N))  # then a whole epoch
        resumed.shutdown()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("num_workers", "persistent"), [(0, None), (2, False)], ids=["0-workers", "2-workers"])
def test_a_generator_reseeded_for_the_next_epoch_wins_over_an_end_of_epoch_checkpoint(num_workers, persistent):
    """A training loop seeding ``generator`` per epoch: taking the checkpoint changes nothing, resuming is exact."""

    def run(checkpoint: bool) -> tuple[list[int], dict | None]:
        generator = torch.Generator()
        loader = loader_for(num_workers, persistent, generator=generator)
        generator.manual_seed(10)
        items(loader)
        state = loader.state_dict() if checkpoint else None
        generator.manual_seed(11)
        second = items(loader)
        loader.shutdown()
        return second, state

    second, _ = run(checkpoint=False)
    assert run(checkpoint=True)[0] == second  # a checkpoint does not change the run that takes it
    _, state = run(checkpoint=True)
    generator = torch.Generator()
    resumed = loader_for(num_workers, persistent, generator=generator)
    resumed.load_state_dict(via_torch_save(state))
    generator.manual_seed(11)
    assert items(resumed) == second
    resumed.shutdown()



def _kept(i: int) -> bool:
    return i >= 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kind", ["pipe", "map-style"])
def test_a_mid_epoch_checkpoint_with_a_seeded_generator_resumes_the_later_epochs_too(kind, num_workers):
    """``generator=torch.Generator().manual_seed(s)``: the epochs after the resumed one are the uninterrupted run's.

    The resumed loader's generator went back to its seed, so the next epoch drew the first epoch's seeds again: another
    shuffle than the run that never stopped, with every item there (nothing tells)."""

    def loader() -> pipekit.DataLoader:
        pipe = IterableWrapper(range(12)).shuffle(buffer_size=5).sharding_filter().filter(_kept)
        data = pipe if kind == "pipe" else list(range(12))
        shuffle = {"shuffle": True} if kind == "map-style" else {}  # (shuffle=False would turn the pipe's off)
        generator = torch.Generator().manual_seed(3)
        return pipekit.DataLoader(data, batch_size=2, num_workers=num_workers, generator=generator, **shuffle)

    uninterrupted = loader()
    expected = [[b.tolist() for b in uninterrupted] for _ in range(3)]
    stopped = loader()
    it = iter(stopped)
    seen = [next(it).tolist() for _ in range(3)]
    state = via_torch_save(stopped.state_dict())
    del it
    resumed = loader()
    resumed.load_state_dict(state)
    epochs = [seen + [b.tolist() for b in resumed], *([b.tolist() for b in resumed] for _ in range(2))]
    assert epochs == expected
    for each in (uninterrupted, stopped, resumed):
        each.shutdown()

def header_before_a_shuffle():
    """The shuffle reads its whole input at once: the header is at its limit before the first item comes out."""
    return IterableWrapper(range(20)).sharding_filter().header(4).shuffle(buffer_size=8)


def zip_of_a_shorter_first_input():
    """The zip stops when its first input ends, without pulling its second."""
    return IterableWrapper(range(3)).zip(IterableWrapper(range(10, 20))).sharding_filter()


def plain_items(batches) -> list:
    return sorted(x if isinstance(x, int) else tuple(x) for x in batches)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("make", "take"), [(header_before_a_shuffle, 2), (zip_of_a_shorter_first_input, 3)],
                         ids=["upstream-of-a-finished-header", "second-input-of-an-ended-zip"])
def test_a_position_the_resumed_epoch_never_pulls_does_not_leak_into_the_next_epoch(make, take):
    """A pipe restored from the checkpoint but not pulled in the resumed epoch starts the next epoch afresh."""
    torch.manual_seed(0)
    loader = pipekit.DataLoader(make())
    epoch = plain_items(loader)
    it = iter(loader)
    head = [next(it) for _ in range(take)]
    state = loader.state_dict()
    resumed = pipekit.DataLoader(make())
    resumed.load_state_dict(state)
    assert plain_items(head + list(resumed)) == epoch
    assert plain_items(resumed) == epoch  # the next epoch: whole, from the start of every pipe


@pytest.mark.timeout(60)
def test_after_a_partial_last_batch_the_next_epoch_is_whole():
    """The loader's last batch (batch_size=2 over 9 items) ends the epoch: the resumed run gives nothing, then all."""
    loader = pipekit.DataLoader(IterableWrapper(range(9)), batch_size=2)
    it = iter(loader)
    assert items([next(it) for _ in range(5)]) == list(range(9))
    state = loader.state_dict()
    resumed = pipekit.DataLoader(IterableWrapper(range(9)), batch_size=2)
    resumed.load_state_dict(state)
    assert items(resumed) == []
    assert items(resumed) == list(range(9))


def _drawing(x: int) -> tuple[int, int]:
    """An item with a draw from the worker's global generator (an augmentation's)."""
    return x, int(torch.randint(0, 1 << 30, ()).item())


@pytest.mark.timeout(60)
def test_end_of_epoch_checkpoint_continues_persistent_workers_global_random_state():
    """Persistent workers carry their generators into the next epoch; workers resumed from the checkpoint too."""

    def make():
        return IterableWrapper(range(8)).sharding_filter().map(_drawing)

    torch.manual_seed(0)
    loader = pipekit.DataLoader(make(), num_workers=2)
    list(loader)
    state = loader.state_dict()
    second = list(loader)
    loader.shutdown()
    torch.manual_seed(5)
    resumed = pipekit.DataLoader(make(), num_workers=2)
    resumed.load_state_dict(via_torch_save(state))
    assert list(resumed) == second
    resumed.shutdown()


class _StreamDrawing:
    """A random transform with its own stream (seeded by stream_seed from the worker's seed), as pipekit's are."""

    def __init__(self) -> None:
        self.stream = RandomStream()

    def __call__(self, x: int) -> tuple[int, int]:
        return x, int(self.stream.numpy().integers(1 << 30))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_end_of_epoch_checkpoint_continues_the_random_streams_of_transforms(num_workers):
    """A transform's stream goes on through the epochs (persistent workers, or the main process); resumed too."""

    def make():
        return IterableWrapper(range(8)).sharding_filter().map(_StreamDrawing())

    torch.manual_seed(0)
    loader = pipekit.DataLoader(make(), num_workers=num_workers)
    first = list(loader)
    state = loader.state_dict()
    second = list(loader)
    loader.shutdown()
    assert first != second
    torch.manual_seed(0)  # the script builds its transforms as it did (their salts are drawn then)
    pipe = make()
    torch.manual_seed(5)  # and its random state differs after
    resumed = pipekit.DataLoader(pipe, num_workers=num_workers)
    resumed.load_state_dict(via_torch_save(state))
    assert list(resumed) == second
    resumed.shutdown()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_mid_epoch_checkpoint_continues_the_random_streams_of_transforms(num_workers):
    """The items after a mid-epoch checkpoint get the augmentations the uninterrupted run gave them."""

    def loader_for(seed_after: int) -> pipekit.DataLoader:
        torch.manual_seed(0)
        pipe = IterableWrapper(range(12)).sharding_filter().map(_StreamDrawing())
        torch.manual_seed(seed_after)
        return pipekit.DataLoader(pipe, num_workers=num_workers)

    loader = loader_for(0)
    full = list(loader)
    loader.shutdown()
    loader = loader_for(0)
    state = checkpoint_after(loader, 5)
    resumed = loader_for(7)
    resumed.load_state_dict(via_torch_save(state))
    assert list(resumed) == full[5:]
    resumed.shutdown()


def checkpoint_after(loader: pipekit.DataLoader, batches: int) -> dict:
    it = iter(loader)
    for _ in range(batches):
        next(it)
    state = loader.state_dict()
    loader.shutdown()
    return state


class TestRefused:
    @pytest.mark.parametrize("num_workers", [0, 2])
    def test_empty_state(self, num_workers):
        loader = pipekit.DataLoader(make(), num_workers=num_workers)
        with pytest.raises(CheckpointError, match=r"pipekit.DataLoader.load_state_dict: .*empty"):
            loader.load_state_dict({})

    @pytest.mark.parametrize("state", [None, [], "state", {"model": {}}])
    def test_not_a_loader_state(self, state):
        loader = pipekit.DataLoader(make())
        with pytest.raises(CheckpointError, match="not a checkpoint of a DataLoader"):
            loader.load_state_dict(state)

    def test_map_style_loader_refuses_an_empty_state_too(self):
        loader = pipekit.DataLoader(list(range(8)))
        with pytest.raises(CheckpointError, match="empty"):
            loader.load_state_dict({})

    @pytest.mark.parametrize("num_workers", [0, 2])
    def test_another_pipeline(self, num_workers):
        state = checkpoint_after(pipekit.DataLoader(make(), num_workers=num_workers), 2)
        other = IterableWrapper(range(N)).sharding_filter().map(abs).batch(4)
        loader = pipekit.DataLoader(other, num_workers=num_workers)
        with pytest.raises(CheckpointError) as info:
            loader.load_state_dict(state)
        message = str(info.value)
        assert "another pipeline" in message
        assert "Shuffler" in message and "Mapper" in message  # both chains, by pipe
        assert isinstance(info.value, ValueError)

    def test_another_pipelines_end_of_epoch_state(self):
        loader = pipekit.DataLoader(make())
        list(loader)
        state = loader.state_dict()
        with pytest.raises(CheckpointError, match="another pipeline"):
            pipekit.DataLoader(IterableWrapper(range(N)).batch(4)).load_state_dict(state)

    @pytest.mark.parametrize(("taken", "loaded"), [(0, 2), (2, 0), (2, 1)])
    def test_another_number_of_workers(self, taken, loaded):
        state = checkpoint_after(pipekit.DataLoader(make(), num_workers=taken), 2)
        loader = pipekit.DataLoader(make(), num_workers=loaded)
        with pytest.raises(CheckpointError, match=rf"taken with num_workers={taken}.*num_workers={loaded}"):
            loader.load_state_dict(state)

    def test_a_map_style_loaders_state_in_a_pipe_loader(self):
        map_style = pipekit.DataLoader(list(range(8)), batch_size=2)
        state = checkpoint_after(map_style, 1)
        expected = r"another pipeline: .*a loader over a dataset of type list, this loader reads a DataPipe"
        with pytest.raises(CheckpointError, match=expected):
            pipekit.DataLoader(make()).load_state_dict(state)

    def test_a_state_without_pipekits_record_still_loads(self):
        """A checkpoint written before pipekit recorded the pipeline (torchdata's keys only) loads as before."""
        torch.manual_seed(0)
        loader = pipekit.DataLoader(make())
        it = iter(loader)
        next(it)
        state = loader.state_dict()
        rest = items(it)
        legacy = {k: v for k, v in state.items() if k != "pipekit"}
        resumed = pipekit.DataLoader(make())
        resumed.load_state_dict(legacy)
        assert items(resumed) == rest


def test_an_end_of_epoch_state_written_before_pipekit_kept_a_record():
    """torchdata's own end-of-epoch state (what pipekit wrote before) resumes to a whole epoch, not to nothing."""
    loader = pipekit.DataLoader(make())
    list(loader)
    legacy = torchdata_state_dict(loader)
    assert "pipekit" not in legacy and legacy["_iterator_finished"] is True
    resumed = pipekit.DataLoader(make())
    resumed.load_state_dict(legacy)
    assert sorted(items(resumed)) == list(range(N))


def torchdata_state_dict(loader: pipekit.DataLoader) -> dict:
    return super(pipekit.DataLoader, loader).state_dict()


def test_worker_state_error_keeps_its_workers_through_pickling():
    err = pickle.loads(pickle.dumps(WorkerStateError("worker 1 did not answer", [1])))
    assert (str(err), err.workers) == ("worker 1 did not answer", [1])
    assert isinstance(err, RuntimeError) and isinstance(CheckpointError("x"), ValueError)


def test_restoring_a_pipeline_outside_a_loader_refuses_another_pipelines_state():
    """``restore_pipeline`` (the state a worker loads) raises the same typed error as the loader."""
    from pipekit.pipes._resume import prepare_for_resume, restore_pipeline, snapshot_pipeline

    pipe = prepare_for_resume(IterableWrapper(range(8)).shuffle(buffer_size=4))
    pipe.set_seed(0)
    it = iter(pipe)
    next(it)
    state = snapshot_pipeline(pipe)
    with pytest.raises(CheckpointError, match="the pipeline has changed since the checkpoint"):
        restore_pipeline(IterableWrapper(range(8)).map(abs), state)
    with pytest.raises(CheckpointError, match="not a pipekit pipeline state"):
        restore_pipeline(IterableWrapper(range(8)), {})


class _WaitOn:
    """A map that blocks on ``event`` from the item ``at`` on, in worker 1 only."""

    def __init__(self, event, at: int) -> None:
        self.event, self.at = event, at

    def __call__(self, x: int) -> int:
        info = torch.utils.data.get_worker_info()
        if info is not None and info.id == 1 and x >= self.at:
            self.event.wait()
        return x


def _freezable_pipe(event, at: int):
    return IterableWrapper(range(N)).shuffle(buffer_size=8).sharding_filter().map(_WaitOn(event, at)).batch(2)


class TestStateTimeout:
    def test_default_is_documented(self):
        assert STATE_TIMEOUT_S == 60.0
        assert pipekit.DataLoader(make()).state_timeout == STATE_TIMEOUT_S
        assert "state_timeout" in pipekit.DataLoader.__doc__ and "60" in pipekit.DataLoader.__doc__

    @pytest.mark.timeout(60)
    def test_a_frozen_worker_is_named_within_the_timeout(self):
        event = multiprocessing.get_context("fork").Event()
        event.set()
        loader = pipekit.DataLoader(_freezable_pipe(event, N), num_workers=2, state_timeout=2.0)
        it = iter(loader)
        for _ in range(4):
            next(it)
        frozen = loader._iterator._workers[1].pid
        os.kill(frozen, signal.SIGSTOP)  # every thread of the worker stops: it cannot answer
        try:
            start = time.monotonic()
            with pytest.raises(WorkerStateError, match=r"worker 1 .*did not answer within 2 s") as info:
                loader.state_dict()
            assert time.monotonic() - start < 10
            assert info.value.workers == [1]
            assert isinstance(info.value, RuntimeError)
        finally:
            os.kill(frozen, signal.SIGCONT)
            loader.shutdown()

    @pytest.mark.timeout(60)
    def test_a_worker_blocked_in_the_pipe_still_answers(self):
        """A worker waiting inside a map still sends its position: its answering thread is not blocked."""
        event = multiprocessing.get_context("fork").Event()
        torch.manual_seed(0)
        loader = pipekit.DataLoader(_freezable_pipe(event, 0), num_workers=2, state_timeout=20.0)
        it = iter(loader)
        next(it)  # worker 0's first batch; worker 1 waits on the event inside the map
        state = loader.state_dict()
        event.set()
        rest = items(it)
        loader.shutdown()
        resumed = pipekit.DataLoader(_freezable_pipe(event, 0), num_workers=2)
        resumed.load_state_dict(state)
        assert items(resumed) == rest
        resumed.shutdown()

    @pytest.mark.parametrize(("value", "error"), [(0, ValueError), (-1.0, ValueError), ("60", TypeError)])
    def test_checked(self, value, error):
        with pytest.raises(error, match=r"pipekit\.DataLoader: state_timeout must be a number of seconds > 0"):
            pipekit.DataLoader(make(), state_timeout=value)


class TestArguments:
    @pytest.mark.parametrize(
        ("kwargs", "error", "message"),
        [
            ({"num_workers": 2, "prefetch_factor": 0}, ValueError, "prefetch_factor must be a positive int, got 0"),
            ({"num_workers": 2, "prefetch_factor": 1.5}, TypeError, "prefetch_factor must be a positive int"),
            ({"prefetch_factor": 2}, ValueError, "prefetch_factor applies to worker processes only"),
            ({"num_workers": -1}, ValueError, "num_workers must be an int >= 0, got -1"),
            ({"num_workers": True}, TypeError, "num_workers must be an int >= 0, got bool"),
            ({"num_workers": 2.0}, TypeError, "num_workers must be an int >= 0, got float"),
            ({"timeout": -1}, ValueError, "timeout must be a number of seconds >= 0, got -1"),
            ({"timeout": "x"}, TypeError, "timeout must be a number of seconds >= 0, got str"),
            ({"timeout": 5}, ValueError, "timeout applies to worker processes only"),
            ({"persistent_workers": True}, ValueError, "persistent_workers=True needs worker processes"),
            ({"batch_size": 0}, ValueError, "batch_size must be a positive int or None, got 0"),
            ({"batch_size": "4"}, TypeError, "batch_size must be a positive int or None, got str"),
            ({"num_workers": 2, "worker_threads": 0}, ValueError, "worker_threads must be a positive int or None"),
            ({"snapshot_every_n_steps": 0}, ValueError, "snapshot_every_n_steps must be a positive int, got 0"),
            ({"num_workers": 2, "worker_init_fn": 3}, TypeError, "worker_init_fn must be a callable or None, got int"),
            ({"collate_fn": "stack"}, TypeError, "collate_fn must be a callable or None, got str"),
        ],
    )
    def test_refused_up_front(self, kwargs, error, message):
        with pytest.raises(error, match=rf"^pipekit.DataLoader: {message}"):
            pipekit.DataLoader(make(), **kwargs)

    def test_accepted_values(self):
        loader = pipekit.DataLoader(make(), num_workers=1, prefetch_factor=1, timeout=30, worker_threads=None)
        assert sorted(items(loader)) == list(range(N))
        loader.shutdown()
