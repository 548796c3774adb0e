"""write_shards in several DataLoader workers and ranks: every sample in exactly one shard, or a clear refusal."""

from __future__ import annotations

import json
import os
import socket
import tarfile
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

import pipekit
from pipekit.errors import ConfigurationError, PipekitError
from pipekit.pipes import IterableWrapper, ShardSaver


def samples(n: int) -> IterableWrapper:
    return IterableWrapper([{"__key__": f"k{i:03d}", "cls": i, "npy": np.full(3, i)} for i in range(n)])


def keys_in(paths: list[str]) -> Counter[str]:
    """How many times each sample key is in the shards ``paths``."""
    found: Counter[str] = Counter()
    for path in paths:
        with tarfile.open(path) as tar:
            found.update({m.name.split(".", 1)[0] for m in tar.getmembers()})
    return found


def shards_in(folder: Path) -> list[str]:
    return sorted(str(folder / n) for n in os.listdir(folder) if not n.startswith("."))


@pytest.mark.timeout(120)
class TestWorkers:
    def test_one_pattern_in_two_workers_is_refused_before_writing(self, tmp_path: Path) -> None:
        pattern = str(tmp_path / "p-%03d.tar")
        pipe = samples(20).sharding_filter().write_shards(pattern, maxcount=3)
        loader = pipekit.DataLoader(pipe, batch_size=None, num_workers=2)
        with pytest.raises(ConfigurationError) as info:
            list(loader)
        message = str(info.value)
        assert pattern in message and "2 DataLoader workers" in message
        assert repr(str(tmp_path / "p-{worker}-%03d.tar")) in message  # how to fix it
        assert os.listdir(tmp_path) == []  # nothing half-written, nothing overwritten

    def test_worker_field_every_sample_in_exactly_one_shard(self, tmp_path: Path) -> None:
        pipe = samples(20).sharding_filter().write_shards(str(tmp_path / "p-{worker}-%03d.tar"), maxcount=3)
        names = list(pipekit.DataLoader(pipe, batch_size=None, num_workers=2))
        assert sorted(names) == shards_in(tmp_path)
        assert {os.path.basename(n)[:4] for n in names} == {"p-0-", "p-1-"}
        assert keys_in(names) == Counter({f"k{i:03d}": 1 for i in range(20)})

    def test_one_worker_and_the_main_process_need_no_field(self, tmp_path: Path) -> None:
        for workers, folder in ((0, tmp_path / "a"), (1, tmp_path / "b")):
            folder.mkdir()
            pipe = samples(7).sharding_filter().write_shards(str(folder / "p-%03d.tar"), maxcount=3)
            names = list(pipekit.DataLoader(pipe, batch_size=None, num_workers=workers))
            assert names == [str(folder / f"p-00{i}.tar") for i in range(3)]
            assert keys_in(names) == Counter({f"k{i:03d}": 1 for i in range(7)})

    def test_worker_field_is_zero_in_the_main_process(self, tmp_path: Path) -> None:
        names = list(samples(2).write_shards(str(tmp_path / "r{rank}-w{worker}-%d.tar")))
        assert names == [str(tmp_path / "r0-w0-0.tar")]


class TestRanks:
    def test_one_pattern_on_two_ranks_is_refused(self, tmp_path: Path, monkeypatch) -> None:
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("RANK", "1")
        pattern = str(tmp_path / "p-{worker}-%03d.tar")
        with pytest.raises(ConfigurationError, match=r"2 ranks.*\{rank\}"):
            list(samples(3).write_shards(pattern))
        assert os.listdir(tmp_path) == []

    def test_rank_field(self, tmp_path: Path, monkeypatch) -> None:
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("RANK", "1")
        assert list(samples(3).write_shards(str(tmp_path / "p-{rank}-%03d.tar"))) == [str(tmp_path / "p-1-000.tar")]

    def test_an_unknown_field_is_refused_when_the_pipe_is_built(self, tmp_path: Path) -> None:
        with pytest.raises(ValueError, match=r"\{workers\}.*\{worker\}, \{rank\}"):
            ShardSaver(samples(1), str(tmp_path / "p-{workers}-%d.tar"))
        assert issubclass(ConfigurationError, PipekitError)


@pytest.mark.timeout(120)
def test_two_workers_resume_every_sample_in_exactly_one_shard(tmp_path: Path) -> None:
    def build() -> ShardSaver:
        return samples(30).sharding_filter().write_shards(str(tmp_path / "p-{worker}-%03d.tar"), maxcount=4)

    loader = pipekit.DataLoader(build(), batch_size=None, num_workers=2)
    it = iter(loader)
    head = [next(it), next(it), next(it)]
    state = loader.state_dict()
    del it, loader
    resumed = pipekit.DataLoader(build(), batch_size=None, num_workers=2)
    resumed.load_state_dict(state)
    names = head + list(resumed)
    assert len(names) == len(set(names)) and sorted(names) == shards_in(tmp_path)
    assert keys_in(names) == Counter({f"k{i:03d}": 1 for i in range(30)})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_writes(rank: int, world_size: int, port: int, out: str, context: str | None) -> None:
    """One rank of a gloo group (no RANK/WORLD_SIZE in the environment) writing through a 1-worker loader."""
    early = samples(10).sharding_filter().write_shards(f"{out}/early/p-{{rank}}-%03d.tar")  # before the group
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        result: dict[str, object] = {}
        for name, pattern in (("shared", f"{out}/shared/p-%03d.tar"), ("own", f"{out}/own/p-{{rank}}-%03d.tar"),
                              ("early", None)):
            pipe = early if pattern is None else samples(10).sharding_filter().write_shards(pattern, maxcount=3)
            loader = pipekit.DataLoader(pipe, batch_size=None, num_workers=1, multiprocessing_context=context)
            try:
                result[name] = list(loader)
            except ConfigurationError as exc:
                result[name] = str(exc)
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("context", [None, "spawn"])
def test_ranks_of_a_process_group_write_their_own_shards(tmp_path: Path, context: str | None) -> None:
    for folder in ("shared", "own", "early"):
        (tmp_path / folder).mkdir()
    mp.spawn(_rank_writes, args=(2, _free_port(), str(tmp_path), context), nprocs=2, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for result in results:
        assert "2 ranks" in result["shared"] and "{rank}" in result["shared"]
        assert "cannot tell its rank: build the pipe after torch.distributed.init_process_group()" in result["early"]
    assert os.listdir(tmp_path / "shared") == os.listdir(tmp_path / "early") == []
    names = results[0]["own"] + results[1]["own"]
    assert sorted(names) == shards_in(tmp_path / "own")
    assert keys_in(names) == Counter({f"k{i:03d}": 1 for i in range(10)})


class TestEarlierRun:
    def test_shards_of_an_earlier_longer_run_are_named(self, tmp_path: Path) -> None:
        pattern = str(tmp_path / "p-%03d.tar")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a first run warns about nothing
            assert len(list(samples(7).write_shards(pattern, maxcount=2))) == 4
        with pytest.warns(UserWarning, match="earlier run") as record:
            names = list(samples(7).write_shards(pattern, maxcount=4))
        assert names == [str(tmp_path / "p-000.tar"), str(tmp_path / "p-001.tar")]
        (message,) = [str(w.message) for w in record]
        assert message.startswith(f"write_shards: 2 shard(s) of {pattern!r} after the ones this epoch wrote are left "
                                  f"from an earlier run: {tmp_path / 'p-002.tar'}, {tmp_path / 'p-003.tar'}")
        assert "read them too" in message
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a shorter run after the start shard is not about them
            list(samples(3).write_shards(pattern, maxcount=4, start_shard=4))

    def test_another_jobs_range_past_a_gap_is_not_an_earlier_run(self, tmp_path: Path) -> None:
        pattern = str(tmp_path / "p-%03d.tar")
        list(samples(3).write_shards(pattern, start_shard=5))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert len(list(samples(7).write_shards(pattern, maxcount=4))) == 2  # shards 0 and 1; 5 is past a gap
        assert sorted(os.listdir(tmp_path)) == ["p-000.tar", "p-001.tar", "p-005.tar"]
