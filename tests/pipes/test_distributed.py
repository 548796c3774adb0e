"""Tests of fullsync (FullSync): a real 2-process gloo group on loopback, and the single-process pass-through.

The 2-rank job runs as two Python processes started with ``subprocess`` (each one
``init_process_group("gloo", "tcp://127.0.0.1:<free port>")``), so it does not depend
on how pytest imports this module.  All scenarios run in one job to keep the test fast.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys
import time

import pytest
import torch

from pipekit.pipes import IterableWrapper
from pipekit.pipes._distributed import FullSync
from pipekit.testing import assert_resumes

WORKER = r"""
import datetime, json, os, sys, time

import torch.distributed as dist
from torch.utils.data.graph_settings import apply_sharding

from pipekit.pipes import IterableWrapper
from pipekit.pipes._distributed import FullSync
from pipekit.pipes._resume import prepare_for_resume, restore_pipeline, snapshot_pipeline

rank, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
dist.init_process_group(
    "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=30)
)
res = {}


def sharded():
    dp = IterableWrapper(list(range(23))).sharding_filter()
    apply_sharding(dp, 2, rank)
    return dp


def run(name, pipe):
    got = []
    try:
        for x in pipe:
            got.append(x)
    except Exception as exc:
        res[name] = {"items": got, "error": type(exc).__name__, "message": str(exc).split("\nThis exception")[0]}
    else:
        res[name] = {"items": got, "error": None}


# Uneven shards (torchdata's example): 12 items on rank 0, 11 on rank 1.
res["plain"] = list(sharded())
dp = sharded().fullsync(timeout=20)
run("epoch1", dp)
run("epoch2", dp)
# Very uneven sources, and an empty one.
run("short", IterableWrapper(range(3 if rank == 0 else 7)).fullsync(timeout=20))
run("empty", IterableWrapper(range(0 if rank == 1 else 5)).fullsync(timeout=20))


def fail_on_rank1(x):
    if rank == 1 and x == 3:
        raise ValueError("bad item 3 on rank 1")
    return x


run("error", IterableWrapper(range(10)).map(fail_on_rank1).fullsync(timeout=20))


# Checkpoint after 4 items on both ranks, restore into fresh pipelines, finish.
def make():
    return sharded().fullsync(timeout=20)


pipe = prepare_for_resume(make())
it = iter(pipe)
head = [next(it) for _ in range(4)]
state = snapshot_pipeline(pipe)
del it
fresh = make()
restore_pipeline(fresh, state)
run("resumed", fresh)
res["resumed"]["head"] = head
res["resumed"]["state"] = state["states"][0]

# Ranks restored at different positions must not pair different items.
out_of_step = IterableWrapper(range(10)).fullsync(timeout=20)
out_of_step.load_state_dict({"yielded": 4 + rank})
run("out_of_step", out_of_step)


# A rank that takes longer than the timeout to fetch an item: the other rank raises instead of hanging.
def slow_on_rank1(x):
    if rank == 1 and x == 1:
        time.sleep(3)
    return x


start = time.monotonic()
run("timeout", IterableWrapper(range(4)).map(slow_on_rank1).fullsync(timeout=1))
res["timeout"]["seconds"] = time.monotonic() - start

with open(out, "w") as f:
    json.dump(res, f)
os._exit(0)  # the timed-out group cannot be shut down cleanly; the results are written
"""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Run WORKER on 2 ranks; return each rank's results."""
    tmp = tmp_path_factory.mktemp("fullsync")
    script = tmp / "worker.py"
    script.write_text(WORKER)
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
    deadline = time.monotonic() + 90
    outputs = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail("the 2-rank fullsync job hung")
        outputs.append(out.decode(errors="replace"))
    for rank, proc in enumerate(procs):
        assert proc.returncode == 0, f"rank {rank} failed:\n{outputs[rank][-3000:]}"
    return [json.loads((tmp / f"rank{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.distributed
class TestFullSyncDistributed:
    def test_uneven_shards_yield_the_minimum(self, two_ranks) -> None:
        r0, r1 = two_ranks
        assert (len(r0["plain"]), len(r1["plain"])) == (12, 11)  # what would hang a training loop
        assert r0["epoch1"] == {"items": list(range(0, 22, 2)), "error": None}
        assert r1["epoch1"] == {"items": list(range(1, 23, 2)), "error": None}

    def test_second_epoch(self, two_ranks) -> None:
        for r in two_ranks:
            assert r["epoch2"] == r["epoch1"]

    def test_very_uneven_and_empty_sources(self, two_ranks) -> None:
        r0, r1 = two_ranks
        assert r0["short"]["items"] == r1["short"]["items"] == [0, 1, 2]
        assert r0["empty"]["items"] == r1["empty"]["items"] == []

    def test_error_on_one_rank_stops_all(self, two_ranks) -> None:
        r0, r1 = two_ranks
        assert r1["error"]["error"] == "ValueError"
        assert "bad item 3 on rank 1" in r1["error"]["message"]
        assert r0["error"]["error"] == "RuntimeError"
        assert r0["error"]["message"].startswith("fullsync: rank 1 failed to fetch item 3")
        assert r0["error"]["items"] == r1["error"]["items"] == [0, 1, 2]

    def test_resume(self, two_ranks) -> None:
        for rank, r in enumerate(two_ranks):
            res = r["resumed"]
            assert res["error"] is None
            assert res["state"] == {"yielded": 4}
            assert res["head"] + res["items"] == list(range(rank, 22, 2))

    def test_ranks_out_of_step_raise(self, two_ranks) -> None:
        for r in two_ranks:
            assert r["out_of_step"]["error"] == "RuntimeError"
            assert "out of step" in r["out_of_step"]["message"]
            assert r["out_of_step"]["items"] == []

    def test_timeout_raises_instead_of_hanging(self, two_ranks) -> None:
        r0 = two_ranks[0]["timeout"]
        assert r0["error"] == "RuntimeError"
        assert r0["message"].startswith("fullsync: rank 0 could not synchronize item 1")
        assert r0["items"] == [0]
        assert r0["seconds"] < 10


class TestFullSync:
    def test_single_process_passes_items_through(self) -> None:
        assert list(IterableWrapper(range(5)).fullsync()) == [0, 1, 2, 3, 4]

    def test_resumes(self) -> None:
        for n in (0, 2, 4):
            assert_resumes(lambda: IterableWrapper(range(5)).fullsync(), n)

    def test_state_dict(self) -> None:
        dp = FullSync(IterableWrapper(range(5)))
        it = iter(dp)
        next(it)
        next(it)
        assert dp.state_dict() == {"yielded": 2}
        dp.load_state_dict({"yielded": 7})
        assert dp.state_dict() == {"yielded": 7}  # pending until the next epoch starts

    def test_pickle(self) -> None:
        dp = IterableWrapper(range(3)).fullsync(timeout=5)
        clone = pickle.loads(pickle.dumps(dp))
        assert clone.timeout == 5
        assert list(clone) == [0, 1, 2]

    def test_bad_arguments(self) -> None:
        with pytest.raises(ValueError, match="timeout must be > 0"):
            IterableWrapper([]).fullsync(timeout=0)
        with pytest.raises(TypeError, match="timeout must be a number"):
            IterableWrapper([]).fullsync(timeout="30")

    def test_world_size_without_process_group(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("WORLD_SIZE", "2")
        with pytest.raises(RuntimeError, match=r"WORLD_SIZE is 2 but torch\.distributed is not initialized"):
            list(IterableWrapper(range(3)).fullsync())

    def test_refuses_to_run_in_dataloader_workers_of_a_distributed_job(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("WORLD_SIZE", "2")
        loader = torch.utils.data.DataLoader(
            IterableWrapper(range(3)).fullsync(), batch_size=None, num_workers=1, multiprocessing_context="fork"
        )
        with pytest.raises(RuntimeError, match="cannot run inside a DataLoader worker"):
            list(loader)

    def test_in_dataloader_workers_of_a_single_process_job(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.delenv("WORLD_SIZE", raising=False)
        loader = torch.utils.data.DataLoader(
            IterableWrapper(range(3)).fullsync(), batch_size=None, num_workers=1, multiprocessing_context="fork"
        )
        assert list(loader) == [0, 1, 2]
