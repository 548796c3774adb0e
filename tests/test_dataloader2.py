"""DataLoader2 and the reading services: torchdata 0.9's API on pipekit.DataLoader.

Worker processes, a real 2-rank gloo group (two Python processes on loopback), real pickled
checkpoints; nothing under test is mocked.
"""

from __future__ import annotations

import functools
import json
import os
import pickle
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import pipekit
from pipekit import (
    DataLoader2,
    DistributedReadingService,
    InProcessReadingService,
    MultiProcessingReadingService,
    SequentialReadingService,
)
from pipekit.adapters import Adapter, Shuffle
from pipekit.dataloader2 import DataLoader2Iterator, WorkerInfo
from pipekit.pipes import IterableWrapper, SequenceWrapper

N = 40


def shuffled(n: int = N) -> Any:
    return IterableWrapper(range(n)).shuffle(buffer_size=8).sharding_filter()


def times_two(x: int) -> int:
    return 2 * x


def pid_of(x: int) -> tuple[int, int]:
    return x, os.getpid()


def tag(worker_id: int, num_workers: int, x: int) -> tuple[int, int, int]:
    return x, worker_id, num_workers


def tag_worker(datapipe: Any, info: WorkerInfo) -> Any:
    return datapipe.map(functools.partial(tag, info.worker_id, info.num_workers))


def fail_at_3(x: int) -> int:
    if x == 3:
        raise ValueError("bad item 3")
    return x


def flat(batches: list[Any]) -> list[Any]:
    return [x for b in batches for x in b]


def services(num_workers: int) -> Any:
    return MultiProcessingReadingService(num_workers=num_workers) if num_workers else InProcessReadingService()


class TestReadingServices:
    def test_in_process_is_the_pipe(self) -> None:
        pipe = IterableWrapper(range(7)).map(times_two).batch(3)
        assert list(DataLoader2(pipe, reading_service=InProcessReadingService())) == list(pipe)
        assert list(DataLoader2(pipe)) == list(pipe)  # no reading service: in process too

    def test_two_workers_take_turns_as_in_torchdata(self) -> None:
        """Worker w gets items w, w + 2, ...; the main process alternates: the source order comes back."""
        pipe = IterableWrapper(range(11)).sharding_filter().map(pid_of)
        with DataLoader2(pipe, reading_service=MultiProcessingReadingService(num_workers=2)) as dl:
            got = list(dl)
        assert [x for x, _ in got] == list(range(11))
        pids = [pid for _, pid in got]
        assert len(set(pids)) == 2 and os.getpid() not in pids
        assert pids[0::2] == [pids[0]] * 6 and pids[1::2] == [pids[1]] * 5

    def test_workers_persist_across_epochs(self) -> None:
        pipe = IterableWrapper(range(6)).sharding_filter().map(pid_of)
        with DataLoader2(pipe, reading_service=MultiProcessingReadingService(num_workers=2)) as dl:
            first, second = {p for _, p in dl}, {p for _, p in dl}
        assert first == second

    def test_worker_init_fn_gets_the_pipe_and_worker_info(self) -> None:
        pipe = IterableWrapper(range(6)).sharding_filter()
        rs = MultiProcessingReadingService(num_workers=2, worker_init_fn=tag_worker)
        with DataLoader2(pipe, reading_service=rs) as dl:
            got = list(dl)
        assert got == [(x, x % 2, 2) for x in range(6)]

    @pytest.mark.parametrize("num_workers", [0, 2])
    def test_items_are_not_converted(self, num_workers: int) -> None:
        """torchdata hands out the pipe's items as they are; torch's loader would make lists and tensors of them."""
        items = [(i, np.arange(i)) for i in range(4)]
        with DataLoader2(IterableWrapper(items).sharding_filter(), reading_service=services(num_workers)) as dl:
            got = list(dl)
        assert [type(x) for x in got] == [tuple] * 4
        assert [type(a) for _, a in got] == [np.ndarray] * 4
        assert [(i, a.tolist()) for i, a in got] == [(i, list(range(i))) for i in range(4)]

    def test_in_process_init_fn(self) -> None:
        dl = DataLoader2(IterableWrapper(range(3)), reading_service=InProcessReadingService(init_fn=tag_worker))
        assert list(dl) == [(0, 0, 1), (1, 0, 1), (2, 0, 1)]

    def test_multiprocessing_with_no_workers_runs_in_process_and_says_so(self) -> None:
        with pytest.warns(UserWarning, match="InProcessReadingService"):
            rs = MultiProcessingReadingService(num_workers=0, worker_init_fn=tag_worker)
        assert list(DataLoader2(IterableWrapper(range(2)), reading_service=rs)) == [(0, 0, 1), (1, 0, 1)]

    def test_worker_prefetch_cnt_is_the_loaders_prefetch_factor(self) -> None:
        for cnt, factor in ((10, 10), (3, 3), (0, 1)):
            rs = MultiProcessingReadingService(num_workers=1, worker_prefetch_cnt=cnt, main_prefetch_cnt=0)
            dl = DataLoader2(IterableWrapper(range(3)).sharding_filter(), reading_service=rs)
            assert list(dl) == [0, 1, 2]
            assert dl._loader.prefetch_factor == factor
            dl.shutdown()

    def test_spawned_workers_run_a_pipe_with_a_lambda(self) -> None:
        """Spawned workers get the pipe pickled; with dill installed a lambda travels too, as with torchdata."""
        pipe = IterableWrapper(range(6)).sharding_filter().map(lambda x: x + 100)
        rs = MultiProcessingReadingService(num_workers=2, multiprocessing_context="spawn")
        with DataLoader2(pipe, reading_service=rs) as dl:
            assert list(dl) == list(range(100, 106))

    def test_sequential_of_multiprocessing(self) -> None:
        rs = SequentialReadingService(MultiProcessingReadingService(num_workers=2))
        with DataLoader2(shuffled(), reading_service=rs) as dl:
            assert sorted(dl) == list(range(N))

    def test_distributed_needs_an_initialized_group(self) -> None:
        dl = DataLoader2(shuffled(), reading_service=DistributedReadingService())
        with pytest.raises(RuntimeError, match="Distributed is required to be initialized"):
            iter(dl)

    def test_reset_fns_are_refused_not_ignored(self) -> None:
        with pytest.raises(NotImplementedError, match="SeedGenerator"):
            MultiProcessingReadingService(num_workers=2, worker_reset_fn=tag_worker)
        with pytest.raises(NotImplementedError, match="SeedGenerator"):
            InProcessReadingService(reset_fn=tag_worker)

    def test_bad_arguments(self) -> None:
        with pytest.raises(ValueError, match="multiprocessing_context"):
            MultiProcessingReadingService(num_workers=1, multiprocessing_context="nope")
        with pytest.raises(ValueError, match="num_workers"):
            MultiProcessingReadingService(num_workers=-1)
        with pytest.raises(ValueError, match="worker_prefetch_cnt"):
            MultiProcessingReadingService(num_workers=1, worker_prefetch_cnt=-1)
        with pytest.raises(ValueError, match="at most one"):
            SequentialReadingService(MultiProcessingReadingService(1), MultiProcessingReadingService(2))
        with pytest.raises(ValueError, match="at most one"):
            SequentialReadingService(DistributedReadingService(), DistributedReadingService())
        with pytest.raises(TypeError, match="reading services"):
            SequentialReadingService(object())
        with pytest.raises(TypeError, match="reading_service must be"):
            DataLoader2(shuffled(), reading_service=object())


class TestDataLoader2:
    def test_map_style_pipe_is_iterated(self) -> None:
        assert list(DataLoader2(SequenceWrapper([5, 6, 7]))) == [5, 6, 7]

    def test_the_pipe_is_copied(self) -> None:
        pipe = IterableWrapper(range(3))
        dl = DataLoader2(pipe)
        assert dl.datapipe is not pipe
        assert list(dl) == list(pipe) == [0, 1, 2]

    def test_a_new_iterator_invalidates_the_old_one(self) -> None:
        dl = DataLoader2(IterableWrapper(range(4)))
        old = iter(dl)
        assert next(old) == 0
        new = iter(dl)
        assert isinstance(new, DataLoader2Iterator)
        with pytest.raises(RuntimeError, match="invalidated"):
            next(old)
        assert list(new) == [0, 1, 2, 3]  # a new epoch: an item was taken since the last iter()

    def test_iter_twice_before_an_item_is_one_epoch(self) -> None:
        dl = DataLoader2(shuffled())
        iter(dl)
        assert sorted(iter(dl)) == list(range(N))

    def test_an_error_shuts_the_loader_down(self) -> None:
        dl = DataLoader2(IterableWrapper(range(6)).map(fail_at_3))
        it = iter(dl)
        assert [next(it), next(it), next(it)] == [0, 1, 2]
        with pytest.raises(ValueError, match="bad item 3"):
            next(it)
        with pytest.raises(RuntimeError, match="shut down"):
            iter(dl)
        with pytest.raises(RuntimeError, match="position is lost"):
            dl.state_dict()

    def test_datapipe_none_needs_a_state(self) -> None:
        with pytest.raises(RuntimeError, match="load_state_dict"):
            iter(DataLoader2(None))


class TestSeed:
    @pytest.mark.parametrize("num_workers", [0, 2])
    def test_seed_fixes_the_following_epochs(self, num_workers: int) -> None:
        with DataLoader2(shuffled(), reading_service=services(num_workers)) as dl:
            dl.seed(3)
            a1, a2 = list(dl), list(dl)
            dl.seed(3)
            b1, b2 = list(dl), list(dl)
            dl.seed(4)
            c1 = list(dl)
        assert (a1, a2) == (b1, b2)
        assert a1 != a2 and a1 != c1
        assert sorted(a1) == sorted(c1) == list(range(N))

    def test_same_seed_same_order_in_another_loader_and_worker_count(self) -> None:
        orders = []
        for rs in (InProcessReadingService(), InProcessReadingService()):
            with DataLoader2(IterableWrapper(range(N)).shuffle(buffer_size=8), reading_service=rs) as dl:
                dl.seed(11)
                orders.append(list(dl))
        assert orders[0] == orders[1] != list(range(N))

    def test_without_seed_torch_manual_seed_decides(self) -> None:
        def run() -> list[int]:
            torch.manual_seed(0)
            dl = DataLoader2(shuffled())
            return list(dl) + list(dl)

        assert run() == run()

    def test_seed_must_be_uint64(self) -> None:
        dl = DataLoader2(shuffled())
        with pytest.raises(ValueError, match="uint64"):
            dl.seed(2**64)
        with pytest.raises(ValueError, match="uint64"):
            dl.seed(-1)
        with pytest.raises(TypeError):
            dl.seed(1.5)
        dl.seed(2**64 - 1)
        assert sorted(dl) == list(range(N))


class TestShutdown:
    def test_workers_are_stopped(self) -> None:
        dl = DataLoader2(IterableWrapper(range(6)).sharding_filter().map(pid_of), reading_service=services(2))
        pids = {pid for _, pid in dl}
        assert len(pids) == 2
        for pid in pids:
            os.kill(pid, 0)  # alive between epochs (persistent workers)
        dl.shutdown()
        deadline = time.monotonic() + 10
        for pid in pids:
            while True:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                assert time.monotonic() < deadline, f"worker {pid} still runs after shutdown()"
                time.sleep(0.05)
        dl.shutdown()  # idempotent
        with pytest.raises(RuntimeError, match="shut down"):
            iter(dl)

    def test_context_manager_shuts_down(self) -> None:
        with DataLoader2(shuffled(), reading_service=services(2)) as dl:
            it = iter(dl)
            next(it)
        with pytest.raises(RuntimeError, match="shut down"):
            iter(dl)
        with pytest.raises(StopIteration):
            next(it)  # the epoch ended with the loader

    def test_state_dict_after_shutdown_keeps_the_position(self) -> None:
        dl = DataLoader2(shuffled(), reading_service=services(2))
        dl.seed(1)
        it = iter(dl)
        head = [next(it) for _ in range(5)]
        expected_rest = list(it)
        dl2 = DataLoader2(shuffled(), reading_service=services(2))
        dl2.seed(1)
        it2 = iter(dl2)
        assert [next(it2) for _ in range(5)] == head
        dl2.shutdown()
        resumed = DataLoader2.from_state(dl2.state_dict(), services(2))
        assert list(resumed) == expected_rest
        resumed.shutdown()
        dl.shutdown()


def run_and_checkpoint(make_dl: Any, stop_after: int, epochs_after: int = 1) -> tuple[list[Any], dict, list[Any]]:
    """Take ``stop_after`` items, checkpoint (through pickle), then finish this epoch and ``epochs_after`` more."""
    dl = make_dl()
    dl.seed(2024)
    it = iter(dl)
    head = [next(it) for _ in range(stop_after)]
    state = pickle.loads(pickle.dumps(dl.state_dict()))
    rest = [list(it)] + [list(dl) for _ in range(epochs_after)]
    dl.shutdown()
    return head, state, rest


class TestState:
    @pytest.mark.parametrize("num_workers", [0, 2])
    @pytest.mark.parametrize("stop_after", [0, 1, 7, 13])
    def test_from_state_resumes_exactly_and_goes_on(self, num_workers: int, stop_after: int) -> None:
        def make() -> DataLoader2:
            pipe = shuffled().map(times_two).batch(3)
            return DataLoader2(pipe, reading_service=services(num_workers))

        head, state, rest = run_and_checkpoint(make, stop_after)
        assert sorted(flat(head + rest[0])) == list(range(0, 2 * N, 2))
        resumed = DataLoader2.from_state(state, services(num_workers))
        got = [list(resumed), list(resumed)]
        resumed.shutdown()
        assert got == rest

    def test_load_state_dict_into_an_empty_loader(self) -> None:
        _, state, rest = run_and_checkpoint(lambda: DataLoader2(shuffled(), reading_service=services(2)), 9)
        dl = DataLoader2(None, reading_service=services(2))
        dl.load_state_dict(state)
        assert dl.state_dict() is state  # untouched until an iterator starts
        assert [list(dl), list(dl)] == rest
        dl.shutdown()

    def test_load_state_dict_after_iterating_is_refused(self) -> None:
        dl = DataLoader2(shuffled())
        state = dl.state_dict()
        list(dl)
        with pytest.raises(RuntimeError, match="already been created"):
            dl.load_state_dict(state)

    def test_state_at_epoch_end_starts_the_next_epoch(self) -> None:
        dl = DataLoader2(shuffled())
        dl.seed(5)
        list(dl)
        state = dl.state_dict()
        second = list(dl)
        assert DataLoader2.from_state(state, None).__iter__().__class__ is DataLoader2Iterator
        assert list(DataLoader2.from_state(state, None)) == second

    def test_state_before_the_first_epoch(self) -> None:
        dl = DataLoader2(shuffled())
        dl.seed(8)
        state = dl.state_dict()
        first = list(dl)
        assert list(DataLoader2.from_state(state, None)) == first

    def test_pipe_with_a_lambda_is_serialized_with_dill(self) -> None:
        pytest.importorskip("dill")
        make = lambda: DataLoader2(shuffled().map(lambda x: -x))  # noqa: E731
        _, state, rest = run_and_checkpoint(make, 4)
        assert state["serialized_datapipe"][0] == "dill"
        assert list(DataLoader2.from_state(state, None)) == rest[0]

    def test_state_is_plain_data(self) -> None:
        dl = DataLoader2(shuffled(), reading_service=services(2))
        it = iter(dl)
        next(it)
        state = dl.state_dict()
        dl.shutdown()
        assert pickle.loads(pickle.dumps(state)).keys() == state.keys()
        with pytest.raises(ValueError, match=r"not a pipekit\.DataLoader2 state"):
            DataLoader2.from_state({"x": 1}, None)


class TestAdapters:
    def test_shuffle_false_disables_shuffles(self) -> None:
        pipe = IterableWrapper(range(12)).shuffle()
        assert list(DataLoader2(pipe, [Shuffle(False)])) == list(range(12))
        assert list(DataLoader2(pipe, Shuffle(False))) == list(range(12))

    def test_shuffle_true_enables_them_again(self) -> None:
        pipe = IterableWrapper(range(12)).shuffle().set_shuffle(False)
        dl = DataLoader2(pipe, [Shuffle(True)])
        dl.seed(0)
        out = list(dl)
        assert sorted(out) == list(range(12)) and out != list(range(12))

    def test_shuffle_true_adds_a_shuffle_with_a_warning(self) -> None:
        with pytest.warns(UserWarning, match="does not contain a `Shuffler`"):
            dl = DataLoader2(IterableWrapper(range(12)), [Shuffle(True)])
        dl.seed(0)
        out = list(dl)
        assert sorted(out) == list(range(12)) and out != list(range(12))

    def test_shuffle_none_changes_nothing(self) -> None:
        pipe = IterableWrapper(range(12)).shuffle().set_shuffle(False)
        assert list(DataLoader2(pipe, [Shuffle(None)])) == list(range(12))

    def test_adapters_apply_to_a_loaded_pipe(self) -> None:
        state = DataLoader2(IterableWrapper(range(12)).shuffle()).state_dict()
        dl = DataLoader2(None, [Shuffle(False)])
        dl.load_state_dict(state)
        assert list(dl) == list(range(12))

    def test_adapter_base(self) -> None:
        class Double(Adapter):
            def __call__(self, datapipe: Any) -> Any:
                return datapipe.map(times_two)

        assert list(DataLoader2(IterableWrapper(range(3)), Double())) == [0, 2, 4]


class TestUnshardedWarning:
    def test_workers_without_sharding_filter_warn_naming_the_pipe(self) -> None:
        dl = DataLoader2(IterableWrapper(range(4)).map(times_two), reading_service=services(2))
        with pytest.warns(UserWarning, match=r"pipekit.DataLoader2: the DataPipe IterableWrapper -> Mapper has no"):
            items = list(dl)
        dl.shutdown()
        assert sorted(items) == sorted(2 * [0, 2, 4, 6])  # each worker yields everything, as the warning says

    def test_sharded_or_in_process_pipes_do_not_warn(self) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with DataLoader2(shuffled(), reading_service=services(2)) as dl:
                list(dl)
            list(DataLoader2(IterableWrapper(range(4))))


def test_top_level_exports() -> None:
    assert pipekit.DataLoader2 is DataLoader2
    assert pipekit.adapters.Shuffle is Shuffle
    for name in ("MultiProcessingReadingService", "DistributedReadingService", "InProcessReadingService"):
        assert getattr(pipekit, name) is getattr(pipekit.dataloader2, name)


# ---------------------------------------------------------------- distributed: a real 2-rank gloo group

RANK_SCRIPT = r"""
import datetime, json, os, pickle, sys

import torch.distributed as dist

from pipekit import DataLoader2, DistributedReadingService, MultiProcessingReadingService, SequentialReadingService
from pipekit.pipes import IterableWrapper

rank, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
dist.init_process_group(
    "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60)
)
res = {}


def mp_and_dist():
    return SequentialReadingService(MultiProcessingReadingService(num_workers=2), DistributedReadingService(timeout=60))


# Ranks only: item i to rank i % 2; 23 items give 12 and 11, fullsync stops both after 11.
with DataLoader2(IterableWrapper(range(23)).sharding_filter(), reading_service=DistributedReadingService(60)) as dl:
    res["ranks"] = list(dl)

# Workers and ranks: torchdata's layout.
with DataLoader2(IterableWrapper(range(40)).sharding_filter(), reading_service=mp_and_dist()) as dl:
    res["layout"] = list(dl)

# A shuffle before the sharding_filter: rank 0's seed on both ranks, so the shards do not overlap.
with DataLoader2(IterableWrapper(range(40)).shuffle().sharding_filter(), reading_service=mp_and_dist()) as dl:
    dl.seed(3 + rank)
    res["seeded"] = [list(dl), list(dl)]

# Without a DistributedReadingService torchdata does not shard across ranks: every rank reads it all.
with DataLoader2(IterableWrapper(range(10)).sharding_filter(), reading_service=MultiProcessingReadingService(2)) as dl:
    res["no_dist_workers"] = list(dl)
res["no_dist_in_process"] = list(DataLoader2(IterableWrapper(range(10)).sharding_filter()))

# Checkpoint after 3 items on both ranks, resume in a new loader, then one more epoch.
dl = DataLoader2(IterableWrapper(range(40)).shuffle().sharding_filter().batch(2), reading_service=mp_and_dist())
dl.seed(9)
it = iter(dl)
head = [next(it) for _ in range(3)]
state = pickle.loads(pickle.dumps(dl.state_dict()))
rest = [list(it), list(dl)]
dl.shutdown()
resumed = DataLoader2.from_state(state, mp_and_dist())
res["resume"] = {"head": head, "rest": rest, "resumed": [list(resumed), list(resumed)]}
resumed.shutdown()

with open(out, "w") as f:
    json.dump(res, f)
dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Run RANK_SCRIPT on 2 ranks; each rank's results."""
    tmp = tmp_path_factory.mktemp("dl2-ranks")
    script = tmp / "rank.py"
    script.write_text(RANK_SCRIPT)
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if sys.platform.startswith("linux"):
        env["GLOO_SOCKET_IFNAME"] = "lo"  # gloo would otherwise pick the interface the hostname resolves to
    env.pop("WORLD_SIZE", None)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), str(port), str(tmp / f"rank{rank}.json")],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
        )
        for rank in range(2)
    ]
    deadline = time.monotonic() + 180
    outputs = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail("the 2-rank DataLoader2 job hung")
        outputs.append(out.decode(errors="replace"))
    for rank, proc in enumerate(procs):
        assert proc.returncode == 0, f"rank {rank} failed:\n{outputs[rank][-3000:]}"
    return [json.loads(Path(tmp / f"rank{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.distributed
class TestDistributedReadingService:
    def test_ranks_split_the_items_and_stop_together(self, two_ranks: list[dict]) -> None:
        assert two_ranks[0]["ranks"] == list(range(0, 22, 2))
        assert two_ranks[1]["ranks"] == list(range(1, 22, 2))

    def test_workers_and_ranks_follow_torchdatas_layout(self, two_ranks: list[dict]) -> None:
        for rank in range(2):
            assert two_ranks[rank]["layout"] == [i for i in range(40) if (i // 2) % 2 == rank]

    def test_rank_zeros_seed_shards_one_shuffle(self, two_ranks: list[dict]) -> None:
        for epoch in range(2):
            a, b = two_ranks[0]["seeded"][epoch], two_ranks[1]["seeded"][epoch]
            assert sorted(a + b) == list(range(40)) and len(a) == len(b) == 20
        assert two_ranks[0]["seeded"][0] != two_ranks[0]["seeded"][1]

    def test_without_it_every_rank_reads_everything(self, two_ranks: list[dict]) -> None:
        for rank in range(2):
            assert two_ranks[rank]["no_dist_workers"] == list(range(10))
            assert two_ranks[rank]["no_dist_in_process"] == list(range(10))

    def test_resume(self, two_ranks: list[dict]) -> None:
        for rank in range(2):
            r = two_ranks[rank]["resume"]
            assert r["resumed"] == r["rest"]
        first_epoch = [
            flat(two_ranks[rank]["resume"]["head"] + two_ranks[rank]["resume"]["rest"][0]) for rank in (0, 1)
        ]
        assert sorted(first_epoch[0] + first_epoch[1]) == list(range(40))
