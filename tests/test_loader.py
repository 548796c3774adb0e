"""DataLoader integration: sharding across workers and ranks, seeding, and exact resume."""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import socket
import time
import warnings
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.utils.data

import pipekit
import pipekit.errors
from pipekit.pipes import IterableWrapper
from pipekit.pipes.base import IterDataPipe

N = 60


class CountCalls:
    """A picklable map function that appends each argument to a log file (works across workers)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __call__(self, x):
        with open(self.path, "a") as f:
            f.write(f"{x}\n")
        return x

    def calls(self) -> list[int]:
        if not os.path.exists(self.path):
            return []
        return [int(line) for line in Path(self.path).read_text().split()]


def record_threads(x):
    return (x, torch.get_num_threads())


def shuffled(n: int = N, buffer_size: int = 16):
    return IterableWrapper(range(n)).shuffle(buffer_size=buffer_size).sharding_filter()


def flatten(batches):
    out = []
    for b in batches:
        out.extend(b.tolist() if isinstance(b, torch.Tensor) else b)
    return out


class TestShardingAcrossWorkers:
    @pytest.mark.parametrize("loader_cls", [torch.utils.data.DataLoader, pipekit.DataLoader])
    def test_exactly_once_with_two_workers(self, loader_cls):
        loader = loader_cls(shuffled(), batch_size=None, num_workers=2)
        items = list(loader)
        assert sorted(items) == list(range(N))

    def test_batched_in_pipe(self):
        loader = pipekit.DataLoader(shuffled().batch(4), num_workers=2)
        assert sorted(flatten(loader)) == list(range(N))


class TestSeeding:
    def epoch_orders(self, seed, epochs=2, num_workers=0):
        torch.manual_seed(seed)
        loader = pipekit.DataLoader(shuffled(), num_workers=num_workers)
        return [list(loader) for _ in range(epochs)]

    @pytest.mark.parametrize("num_workers", [0, 2])
    def test_fixed_seed_same_order_each_run(self, num_workers):
        assert self.epoch_orders(3, num_workers=num_workers) == self.epoch_orders(3, num_workers=num_workers)

    def test_each_epoch_differs(self):
        first, second = self.epoch_orders(3)
        assert sorted(first) == sorted(second) == list(range(N))
        assert first != second

    def test_different_seeds_differ(self):
        assert self.epoch_orders(3, epochs=1) != self.epoch_orders(4, epochs=1)


class TestDefaults:
    def test_pipe_is_not_rebatched(self):
        assert list(pipekit.DataLoader(IterableWrapper(range(3)))) == [0, 1, 2]

    def test_map_style_keeps_torch_batch_size(self):
        loader = pipekit.DataLoader(list(range(4)))
        assert [b.tolist() for b in loader] == [[0], [1], [2], [3]]

    def test_workers_persist_and_use_one_thread(self):
        pipe = IterableWrapper(range(4)).sharding_filter().map(record_threads)
        loader = pipekit.DataLoader(pipe, num_workers=2)
        assert loader.persistent_workers is True
        assert loader.pin_memory is torch.cuda.is_available()
        assert {threads for _, threads in loader} == {1}

    def test_bad_num_workers(self):
        with pytest.raises(ValueError, match="num_workers"):
            pipekit.DataLoader(IterableWrapper(range(3)), num_workers=-1)


class SelfSharding(IterDataPipe):
    """A source that shards itself (has ``apply_sharding``): a sharding point without sharding_filter."""

    def __init__(self, n: int) -> None:
        self.n, self.instances, self.instance = n, 1, 0

    def apply_sharding(self, num_of_instances: int, instance_id: int) -> None:
        self.instances, self.instance = num_of_instances, instance_id

    def __iter__(self):
        yield from range(self.instance, self.n, self.instances)


def unsharded_warnings(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if "has no sharding point" in str(w.message)]


class TestUnshardedWarning:
    """Without a sharding point, every worker and rank yields every item; torch says nothing, pipekit warns."""

    def test_torch_repeats_items_silently(self):
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            items = list(torch.utils.data.DataLoader(IterableWrapper(range(5)), batch_size=None, num_workers=2))
        assert sorted(items) == sorted(2 * list(range(5)))
        assert unsharded_warnings(record) == []

    def test_workers_warn_once_naming_the_pipe(self):
        pipe = IterableWrapper(range(5)).map(str)
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            loader = pipekit.DataLoader(pipe, num_workers=2)
            first, second = list(loader), list(loader)
        assert sorted(first) == sorted(second) == sorted(2 * [str(i) for i in range(5)])
        [message] = unsharded_warnings(record)
        assert message.startswith("pipekit.DataLoader: the DataPipe IterableWrapper -> Mapper has no sharding point")
        assert "every item comes 2 times per epoch" in message
        assert "warn_unsharded=False" in message
        [warning] = [w for w in record if "has no sharding point" in str(w.message)]
        assert warning.category is UserWarning and warning.filename == __file__  # points at the caller

    def test_one_worker_warns_too(self):
        with pytest.warns(UserWarning, match="cannot be split: with more workers or ranks"):
            pipekit.DataLoader(IterableWrapper(range(3)), num_workers=1)

    def test_opt_out(self):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            loader = pipekit.DataLoader(IterableWrapper(range(3)), num_workers=2, warn_unsharded=False)
        assert sorted(loader) == [0, 0, 1, 1, 2, 2]

    @pytest.mark.parametrize(
        ("make", "num_workers"),
        [
            (lambda: shuffled(), 2),  # sharding_filter
            (lambda: IterableWrapper(range(4)).sharding_filter().map(str).batch(2), 2),  # deeper in the graph
            (lambda: SelfSharding(6).map(str), 2),  # a pipe that applies sharding itself
            (lambda: IterableWrapper(range(4)), 0),  # the main process only
        ],
    )
    def test_no_warning_when_sharded_or_single_process(self, make, num_workers):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            loader = pipekit.DataLoader(make(), num_workers=num_workers)
            list(loader)

    def test_self_sharding_source_is_split(self):
        assert sorted(pipekit.DataLoader(SelfSharding(6), num_workers=2)) == list(range(6))

    def test_sharding_points(self):
        from pipekit._loader import sharding_points

        assert [type(p).__name__ for p in sharding_points(shuffled().batch(2))] == ["ShardingFilterIterDataPipe"]
        assert sharding_points(IterableWrapper(range(3)).map(str)) == []


def log_warning(path, message, category, filename, lineno, file=None, line=None):
    with open(path, "a") as f:
        f.write(f"{category.__name__}: {message}\n")


def warn_in_worker(path, worker_id):
    """A worker_init_fn that logs the warnings shown in the worker, calls torch's set_vital, then warns itself."""
    warnings.showwarning = functools.partial(log_warning, path)
    torch.set_vital("Dataloader", "worker", "True")
    warnings.warn(f"worker {worker_id} says hello", UserWarning, stacklevel=1)


SET_VITAL = "'set_vital' is deprecated"


def _torch_deprecates_set_vital() -> bool:
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        torch.set_vital("Dataloader", "enabled", "True")
    return any(SET_VITAL in str(w.message) for w in record)


needs_set_vital_warning = pytest.mark.skipif(
    not _torch_deprecates_set_vital(), reason=f"this torch ({torch.__version__}) does not deprecate set_vital"
)


class TestSetVitalWarning:
    """torchdata's StatefulDataLoader calls torch's deprecated set_vital: one warning per loader in users' logs."""

    @needs_set_vital_warning
    def test_torchdatas_loader_prints_it(self):
        from torchdata.stateful_dataloader import StatefulDataLoader

        with pytest.warns(UserWarning, match=SET_VITAL):
            StatefulDataLoader(IterableWrapper(range(3)))

    @pytest.mark.parametrize("num_workers", [0, 2])
    def test_pipekit_loader_does_not(self, num_workers):
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            loader = pipekit.DataLoader(shuffled(), num_workers=num_workers)
            assert sorted(loader) == list(range(N))
            loader.shutdown()
        assert [str(w.message) for w in record if SET_VITAL in str(w.message)] == []

    def test_other_warnings_raised_while_creating_the_loader_get_through(self):
        """torch's too-many-workers warning comes from the same constructor call as set_vital's."""
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            pipekit.DataLoader(shuffled(), num_workers=64)
        messages = [str(w.message) for w in record]
        assert any("64 worker processes" in m for m in messages), messages
        assert not any(SET_VITAL in m for m in messages)

    @needs_set_vital_warning
    def test_the_filter_does_not_outlive_the_constructor(self):
        pipekit.DataLoader(shuffled())
        with pytest.warns(UserWarning, match=SET_VITAL):
            torch.set_vital("Dataloader", "enabled", "True")

    def test_in_workers_only_set_vital_is_dropped(self, tmp_path):
        log = tmp_path / "warnings.txt"
        loader = pipekit.DataLoader(
            shuffled(), num_workers=2, worker_init_fn=functools.partial(warn_in_worker, str(log))
        )
        assert sorted(loader) == list(range(N))
        loader.shutdown()
        shown = sorted(log.read_text().splitlines())
        assert shown == ["UserWarning: worker 0 says hello", "UserWarning: worker 1 says hello"]


class TestShutdown:
    def test_shutdown_stops_the_workers(self):
        pipe = IterableWrapper(range(4)).sharding_filter().map(record_pid)
        loader = pipekit.DataLoader(pipe, num_workers=2)
        pids = {pid for _, pid in loader}
        assert len(pids) == 2
        loader.shutdown()
        deadline = time.monotonic() + 10
        for pid in pids:
            while True:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                assert time.monotonic() < deadline, f"worker {pid} still runs after shutdown()"
                time.sleep(0.05)
        loader.shutdown()  # idempotent
        assert sorted(x for x, _ in loader) == [0, 1, 2, 3]  # a new iterator starts new workers
        loader.shutdown()


def record_pid(x):
    return (x, os.getpid())


def run_with_checkpoint(make_pipe, num_workers, stop_after, seed=0, **kw):
    """Take ``stop_after`` batches, checkpoint, finish; then resume a new loader from the checkpoint."""
    torch.manual_seed(seed)
    loader = pipekit.DataLoader(make_pipe(), num_workers=num_workers, **kw)
    it = iter(loader)
    head = [next(it) for _ in range(stop_after)]
    state = loader.state_dict()
    rest = list(it)
    del it, loader
    resumed = pipekit.DataLoader(make_pipe(), num_workers=num_workers, **kw)
    resumed.load_state_dict(state)
    return head, rest, list(resumed)


class TestResume:
    @pytest.mark.parametrize("num_workers", [0, 2])
    @pytest.mark.parametrize("stop_after", [1, 4, 9])
    def test_resume_gives_exactly_the_rest(self, num_workers, stop_after):
        head, rest, resumed = run_with_checkpoint(lambda: shuffled().batch(3), num_workers, stop_after)
        assert resumed == rest
        assert sorted(flatten(head) + flatten(resumed)) == list(range(N))

    @pytest.mark.parametrize("num_workers", [0, 2])
    def test_resume_does_not_reread_consumed_items(self, tmp_path, num_workers):
        counter = CountCalls(tmp_path / "calls.txt")

        def make():
            return IterableWrapper(range(N)).shuffle(buffer_size=8).sharding_filter().map(counter).batch(5)

        head, rest, resumed = run_with_checkpoint(make, num_workers, 4)
        assert resumed == rest
        seen_before_resume = len(flatten(head)) + len(flatten(rest))
        calls = counter.calls()
        # First run: every item once (plus the workers' prefetch, all consumed by `rest`).
        # Resumed run: only the items after the checkpoint, never the 20 consumed before it.
        assert len(calls) == seen_before_resume + len(flatten(resumed))
        assert Counter(calls).most_common(1)[0][1] <= 2

    def test_resume_with_dataloader_batching(self):
        _, rest, resumed = run_with_checkpoint(shuffled, 2, 3, batch_size=4)
        assert [b.tolist() for b in resumed] == [b.tolist() for b in rest]

    def test_checkpoint_before_first_batch(self):
        torch.manual_seed(0)
        loader = pipekit.DataLoader(shuffled(), num_workers=2)
        state = loader.state_dict()
        resumed = pipekit.DataLoader(shuffled(), num_workers=2)
        resumed.load_state_dict(state)
        assert sorted(resumed) == list(range(N))

    def test_checkpoint_of_a_resumed_run(self):
        """A second checkpoint taken right after resuming still resumes exactly."""
        torch.manual_seed(0)
        make = lambda: shuffled().batch(2)  # noqa: E731
        loader = pipekit.DataLoader(make())
        it = iter(loader)
        head = [next(it) for _ in range(3)]
        state1 = loader.state_dict()
        rest = list(it)
        second = pipekit.DataLoader(make())
        second.load_state_dict(state1)
        state2 = second.state_dict()
        third = pipekit.DataLoader(make())
        third.load_state_dict(state2)
        assert list(third) == rest
        assert len(head) == 3

    def test_unsupported_pipe_falls_back_to_replay(self, caplog):
        def make():  # unbatch keeps the rest of a batch in a local variable: no snapshot
            return IterableWrapper(range(N)).batch(7).unbatch().sharding_filter()

        with caplog.at_level(logging.WARNING, logger="pipekit"):
            _, rest, resumed = run_with_checkpoint(make, 0, 10)
        assert resumed == rest
        assert "UnBatcherIterDataPipe" in caplog.text

    def test_changed_pipeline_is_refused(self):
        torch.manual_seed(0)
        loader = pipekit.DataLoader(shuffled())
        it = iter(loader)
        next(it)
        state = loader.state_dict()
        other = pipekit.DataLoader(IterableWrapper(range(N)).sharding_filter().batch(2).shuffle())
        # refused when loaded, naming both pipelines (a CheckpointError is a ValueError)
        with pytest.raises(pipekit.errors.CheckpointError, match="another pipeline: it was taken from IterableWrapper"):
            other.load_state_dict(state)


# ---------------------------------------------------------------- distributed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world_size: int, port: int, out_dir: str, loader_kind: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        torch.manual_seed(1234)
        pipe = IterableWrapper(range(N)).shuffle(buffer_size=16).sharding_filter()
        if loader_kind == "pipekit":
            loader = pipekit.DataLoader(pipe, num_workers=2)
        else:
            loader = torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=2)
        items = list(loader)
        Path(out_dir, f"rank{rank}.txt").write_text(" ".join(map(str, items)))
    finally:
        dist.destroy_process_group()


def _rank_warns(rank: int, world_size: int, port: int, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            unsharded = pipekit.DataLoader(IterableWrapper(range(6)).map(str))
            sharded = pipekit.DataLoader(IterableWrapper(range(6)).sharding_filter())
            items = [list(unsharded), list(sharded)]
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps([items, unsharded_warnings(record)]))
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_ranks_without_sharding_point_warn(tmp_path):
    mp.spawn(_rank_warns, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        items, messages = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert items == [[str(i) for i in range(6)], list(range(rank, 6, 2))]
        assert len(messages) == 1
        assert "IterableWrapper -> Mapper" in messages[0] and "1 process(es) on each of 2 rank(s)" in messages[0]


@pytest.mark.distributed
@pytest.mark.parametrize("loader_kind", ["pipekit", "torch"])
def test_exactly_once_across_two_ranks_and_workers(tmp_path, loader_kind):
    mp.spawn(_rank_main, args=(2, _free_port(), str(tmp_path), loader_kind), nprocs=2, join=True)
    per_rank = [list(map(int, (tmp_path / f"rank{r}.txt").read_text().split())) for r in range(2)]
    assert all(per_rank), "each rank gets a share"
    assert sorted(per_rank[0] + per_rank[1]) == list(range(N))
    assert not set(per_rank[0]) & set(per_rank[1])


# ---------------------------------------------------------------- issue 13: nothing lost between workers and main


def read_pair(item):
    url, stream = item
    try:
        return url, stream.read()
    finally:
        stream.close()


def write_files(root: Path, names: list[str]) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in names:
        path = root / name
        path.write_bytes(name.encode())
        paths.append(str(path))
    return paths


def kill_self_at(flag: str, victim: str, wait_for: str):
    """A map function that SIGKILLs its worker when it meets ``victim``, once ``wait_for`` exists."""
    return functools.partial(_kill_self_at, flag, victim, wait_for)


def _kill_self_at(flag: str, victim: str, wait_for: str, item):
    if item[0] == victim:
        deadline = time.monotonic() + 60
        while not os.path.exists(wait_for) and time.monotonic() < deadline:
            time.sleep(0.01)
        Path(flag).write_text("dying")
        os.kill(os.getpid(), signal.SIGKILL)
    return read_pair(item)


def _numbered_batches():
    return IterableWrapper(list(range(400))).sharding_filter().map(torch.tensor).batch(2)


def _collect_garbage_logging(log: str, _worker_id: int) -> None:
    """Collect garbage in a worker, appending what finalizers raised there to ``log``."""
    import gc
    import sys

    def record(unraisable) -> None:
        with open(log, "a") as f:
            f.write(f"{unraisable.err_msg}: {unraisable.exc_value!r}\n")

    sys.unraisablehook = record
    with open(log, "a"):
        pass
    gc.collect()


def _die_once_and_checkpoint():
    loader = pipekit.DataLoader(_numbered_batches(), num_workers=2, timeout=60)
    it = iter(loader)
    next(it)
    checkpoint = loader.state_dict()  # the last checkpoint before the death is what a run resumes from
    os.kill(it._workers[1].pid, signal.SIGKILL)
    try:
        list(it)
    except pipekit.errors.WorkerDiedError as exc:
        caught = exc  # noqa: F841  (frame -> exception -> traceback -> frame: only the collector frees it)
        return checkpoint
    raise AssertionError("the worker did not die")


class TestNothingLostAcrossWorkers:
    """Issue 13 (items 2, 3, 4): skip counts, open streams and dead workers, with DataLoader workers."""

    def urls(self, tmp_path: Path) -> tuple[list[str], list[str]]:
        """Six files, two of them missing: workers get urls[0::2] and urls[1::2] (sharding before opening)."""
        ok = write_files(tmp_path / "files", [f"f{i}.txt" for i in range(4)])
        missing = [str(tmp_path / "files" / "gone0.txt"), str(tmp_path / "files" / "gone1.txt")]
        return [missing[0], ok[0], missing[1], ok[1], ok[2], ok[3]], missing

    def pipe(self, urls: list[str]):
        return IterableWrapper(urls).sharding_filter().open_files_by_fsspec(mode="rb", on_error="skip").map(read_pair)

    @pytest.mark.parametrize("num_workers", [0, 2])
    def test_skip_report_adds_up_the_workers(self, tmp_path, num_workers):
        urls, missing = self.urls(tmp_path)
        loader = pipekit.DataLoader(self.pipe(urls), num_workers=num_workers)
        assert loader.skip_report().count == 0
        assert len(list(loader)) == 4
        report = loader.skip_report()
        assert report.count == 2 and report.counts == {"open_files_by_fsspec": 2}
        assert sorted(s.url for s in report.skipped) == missing
        assert all("No such file" in s.reason or "no such file" in s.reason.lower() for s in report.skipped)
        assert "2 items skipped (open_files_by_fsspec: 2)" in str(report)

    def test_report_arrives_with_the_batches(self, tmp_path):
        urls, _ = self.urls(tmp_path)
        loader = pipekit.DataLoader(self.pipe(urls), num_workers=2)
        it = iter(loader)
        first = next(it)  # worker 0 skipped both missing files before this batch
        assert first[0] == urls[4]
        assert loader.skip_report().count == 2
        rest = list(it)
        assert len(rest) == 3 and loader.skip_report().count == 2

    @pytest.mark.parametrize(("num_workers", "persistent"), [(0, False), (2, True), (2, False)])
    def test_counts_add_up_over_epochs(self, tmp_path, num_workers, persistent):
        urls, _ = self.urls(tmp_path)
        loader = pipekit.DataLoader(self.pipe(urls), num_workers=num_workers, persistent_workers=persistent)
        for _ in range(2):
            assert len(list(loader)) == 4
        assert loader.skip_report().count == 4

    def test_report_sent_with_each_batch_is_small(self, tmp_path):
        missing = [str(tmp_path / f"gone{i}.txt") for i in range(50)]
        urls = missing + write_files(tmp_path / "ok", ["a.txt"])
        loader = pipekit.DataLoader(self.pipe(urls), num_workers=2)
        assert len(list(loader)) == 1
        report = loader.skip_report()
        assert report.count == 50
        assert len(report.skipped) == 20  # the first 10 of each worker, not the whole log

    def test_checkpoint_does_not_carry_old_counts(self, tmp_path):
        urls, _ = self.urls(tmp_path)
        loader = pipekit.DataLoader(self.pipe(urls), num_workers=2)
        it = iter(loader)
        next(it)
        state = loader.state_dict()
        resumed = pipekit.DataLoader(self.pipe(urls), num_workers=2)
        resumed.load_state_dict(state)
        assert len(list(resumed)) == 3
        assert resumed.skip_report().count == 0  # its own run skipped nothing; the first run's skips were its own

    @pytest.mark.parametrize("on_error", ["raise", "skip"])
    def test_open_stream_raises_in_the_worker_instead_of_hanging(self, tmp_path, on_error):
        urls = write_files(tmp_path / "files", ["a.txt", "b.txt"])
        pipe = IterableWrapper(urls).sharding_filter().open_files_by_fsspec(mode="rb", on_error=on_error)
        loader = pipekit.DataLoader(pipe, num_workers=2, timeout=60)  # a hang fails with a timeout, not forever
        with pytest.raises(TypeError, match=r"open_files_by_fsspec .*yielded an item holding an open stream") as info:
            list(loader)
        assert "read the stream inside the worker" in str(info.value)
        assert "DataLoader timed out" not in str(info.value)
        assert len(list(pipekit.DataLoader(IterableWrapper(urls).open_files_by_fsspec(mode="rb")))) == 2  # 0 workers

    @pytest.mark.parametrize("plain_headers", [True, False])
    def test_archive_members_crossing_workers_raise(self, tmp_path, monkeypatch, plain_headers):
        """Whichever path read the archive (plain headers or tarfile), member streams must be read in the worker."""
        import io
        import tarfile

        from pipekit import _fast

        monkeypatch.setitem(_fast.state, "tar_headers", plain_headers)  # the forked workers inherit it

        shard = tmp_path / "s.tar"
        with tarfile.open(shard, "w") as tar:
            for name in ("0.jpg", "0.cls"):
                info = tarfile.TarInfo(name)
                info.size = 1
                tar.addfile(info, io.BytesIO(b"x"))
        pipe = IterableWrapper([str(shard)]).sharding_filter().open_files_by_fsspec(mode="rb")
        loader = pipekit.DataLoader(pipe.load_from_tar(on_error="skip").batch(2), num_workers=2, timeout=60)
        with pytest.raises(TypeError, match=r"batch .*open stream '.*s\.tar/0\.jpg' \((_MemberFile|_MemberBytes)\)"):
            list(loader)
        readable = pipe.load_from_tar().map(read_pair)
        assert sorted(tuple(pair) for pair in pipekit.DataLoader(readable, num_workers=2)) == [
            (f"{shard}/0.cls", b"x"),
            (f"{shard}/0.jpg", b"x"),
        ]

    def test_killed_worker_is_named_with_its_last_file(self, tmp_path):
        urls = write_files(tmp_path / "files", [f"f{i}.txt" for i in range(6)])  # worker 1: f1, f3, f5
        flag, go = str(tmp_path / "dying"), str(tmp_path / "go")
        pipe = IterableWrapper(urls).sharding_filter().open_files_by_fsspec(mode="rb")
        loader = pipekit.DataLoader(pipe.map(kill_self_at(flag, urls[5], go)), num_workers=2)
        got = []

        def consume():
            for url, _ in loader:
                got.append(url)
                if url == urls[3]:  # worker 1's last batch has arrived: let it die on f5
                    Path(go).write_text("go")

        with pytest.raises(pipekit.errors.WorkerDiedError) as info:
            consume()
        err = info.value
        assert isinstance(err, RuntimeError) and os.path.exists(flag)
        assert (err.worker_id, err.signal) == (1, "SIGKILL") and err.pid > 0
        assert (err.url, err.stage) == (urls[3], "open_files_by_fsspec")
        assert f"worker 1 (pid {err.pid}) killed by SIGKILL" in str(err)
        assert repr(urls[3]) in str(err) and "exited unexpectedly" in str(err)
        assert urls[3] in got

    def test_worker_killed_mid_transfer_is_named_not_a_connection_error(self, tmp_path, monkeypatch):
        # A worker killed while the main process rebuilds a batch it sent (the tensor's fd is
        # fetched from the worker's socket) surfaces as ConnectionResetError / EOFError before
        # torch has reaped the worker; it must still read as the worker's death.
        batches = IterableWrapper(list(range(40))).sharding_filter().map(torch.tensor).batch(2)
        loader = pipekit.DataLoader(batches, num_workers=2, timeout=60)
        it = iter(loader)
        next(it)
        real_get = it._data_queue.get

        def get_after_killing_a_worker(*args, **kwargs):
            os.kill(it._workers[1].pid, signal.SIGKILL)
            raise ConnectionResetError(104, "Connection reset by peer")

        monkeypatch.setattr(it._data_queue, "get", get_after_killing_a_worker)
        with pytest.raises(pipekit.errors.WorkerDiedError) as info:
            list(it)
        err = info.value
        assert (err.worker_id, err.signal) == (1, "SIGKILL")
        causes = [err.__cause__, getattr(err.__cause__, "__cause__", None)]
        # Usually the ConnectionResetError is what pipekit sees; when the worker's SIGCHLD reaches torch's
        # handler first (it raises from inside get, at the next bytecode after the kill), the cause is
        # torch's "killed by signal" RuntimeError: either way the error names the worker and the signal.
        assert any(isinstance(c, ConnectionResetError) for c in causes) or (
            isinstance(err.__cause__, RuntimeError) and "killed by signal" in str(err.__cause__)
        ), causes
        monkeypatch.setattr(it._data_queue, "get", real_get)

    def test_resume_after_a_worker_death_is_quiet_in_the_new_workers(self, tmp_path):
        # The dead run's iterator is only freed by the garbage collector (a caught exception's
        # traceback holds it). Collected inside the new loader's forked workers, torch's iterator
        # tried to shut down workers that are not theirs ("can only test a child process") and
        # torch's temporary files were unlinked twice: each worker printed tracebacks.
        import gc

        log = tmp_path / "unraisable.log"
        gc.disable()  # the dead iterator must still be uncollected when the new workers fork
        try:
            state = _die_once_and_checkpoint()
            loader = pipekit.DataLoader(
                _numbered_batches(),
                num_workers=2,
                timeout=60,
                worker_init_fn=functools.partial(_collect_garbage_logging, str(log)),
            )
            loader.load_state_dict(state)
            got = [int(x) for batch in loader for x in batch]
        finally:
            gc.enable()
        assert len(got) == len(set(got)) and max(got) == 399
        assert log.exists() and log.read_text() == ""  # both workers collected, nothing to report

    def test_connection_error_with_every_worker_alive_is_raised_as_is(self, monkeypatch):
        loader = pipekit.DataLoader(IterableWrapper(list(range(8))).sharding_filter(), num_workers=2, timeout=60)
        it = iter(loader)
        next(it)

        def refused(*args, **kwargs):
            raise ConnectionRefusedError(111, "Connection refused")

        monkeypatch.setattr(it._data_queue, "get", refused)
        with pytest.raises(ConnectionRefusedError):
            list(it)
        assert all(w.is_alive() for w in it._workers)
        it._shutdown_workers()


class _StallsAfter:
    """Items below ``after`` pass; the others stall ``seconds`` (a slow read the worker is inside), each leaving a
    file named after it in ``marks`` as it starts to."""

    def __init__(self, after: int, seconds: float, marks: Path) -> None:
        self.after, self.seconds, self.marks = after, seconds, marks

    def __call__(self, x: int) -> int:
        if x >= self.after:
            (self.marks / str(x)).touch()
            time.sleep(self.seconds)
        return x


@pytest.mark.timeout(60)
def test_an_abandoned_iterator_stops_its_busy_workers_within_a_second(tmp_path):
    """An iterator dropped mid-epoch (its last reference gone) does not wait on busy workers.

    torch joins each worker for 5 s before it terminates it, inside whatever code dropped the last reference
    (often a garbage collection in an unrelated place); pipekit gives an abandoned iterator's workers one second
    together, then terminates them.
    """
    pipe = IterableWrapper(range(40)).sharding_filter().map(_StallsAfter(4, 30.0, tmp_path))
    loader = pipekit.DataLoader(pipe, num_workers=2, batch_size=None, prefetch_factor=1)
    it = iter(loader)
    assert [next(it) for _ in range(4)] == [0, 1, 2, 3]
    deadline = time.monotonic() + 30
    while len(list(tmp_path.iterdir())) < 2 and time.monotonic() < deadline:  # both workers inside their stall
        time.sleep(0.01)
    workers = list(it._workers)
    start = time.monotonic()
    del it, loader  # the loader keeps its iterator (for state_dict): the two go together
    took = time.monotonic() - start
    for w in workers:
        w.join(timeout=5)
    assert all(not w.is_alive() for w in workers)
    assert took < 3.0, f"the abandoned iterator's shutdown took {took:.1f} s"
