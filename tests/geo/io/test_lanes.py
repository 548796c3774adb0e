"""``pipekit.geo.io.lanes``: GDAL's network I/O on pipekit's own threads, and the GDAL environment each keeps entered.

``run_parts`` runs the parts of one read at once, part ``k`` on I/O thread ``k``; ``run_remote`` one
call on the idlest thread.  Entering ``rasterio.Env`` costs ~85 µs and a sample of a scene entered it
for every open and every band read; on an I/O thread it now stays entered
until a file with another environment (other options or credentials) is
read there (the fast path ``lane_env``).  The environment tests check that the environment in effect is always the
file's own: switching between datasets switches options and credentials.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import threading
import time

import numpy as np
import pytest
import rasterio
import rasterio.env

from pipekit import _fast
from pipekit.datasets import RasterDataset
from pipekit.errors import ReadError
from pipekit.geo import BoundingBox
from pipekit.geo.io import RasterOpener, handles, lanes


@pytest.fixture(autouse=True)
def _fresh_state():
    handles.close_cached_handles()
    yield
    lanes.run_parts(lambda k: (handles.close_cached_handles(), lanes.leave_lane_env()), lanes.REMOTE_IO_THREADS)
    handles.close_cached_handles()


def _options_seen(opener: RasterOpener, url: str) -> dict:
    """The GDAL options in effect on an I/O thread inside ``opener``'s environment for ``url``, and after it."""

    def probe() -> dict:
        with opener.env(opener.resolve(url)):
            inside = dict(rasterio.env.getenv()) if rasterio.env.hasenv() else {}
        after = dict(rasterio.env.getenv()) if rasterio.env.hasenv() else {}
        return {"inside": inside, "after": after, "thread": threading.current_thread().name}

    return lanes.run_remote(probe)


class TestLaneEnv:
    def test_kept_on_io_thread_and_switched_for_another_environment(self):
        a = RasterOpener(
            {"endpoint_url": "http://127.0.0.1:1", "key": "k", "secret": "s"}, gdal_options={"GDAL_HTTP_TIMEOUT": "17"}
        )
        b = RasterOpener(
            {"endpoint_url": "http://127.0.0.1:1", "key": "k", "secret": "s"}, gdal_options={"GDAL_HTTP_TIMEOUT": "23"}
        )
        seen = _options_seen(a, "s3://bucket/a.tif")
        assert seen["thread"].startswith("pipekit-geo-io")
        assert seen["inside"]["GDAL_HTTP_TIMEOUT"] == "17"
        assert seen["after"]["GDAL_HTTP_TIMEOUT"] == "17"  # kept entered for the next read
        seen = _options_seen(b, "s3://bucket/b.tif")
        assert seen["inside"]["GDAL_HTTP_TIMEOUT"] == "23"  # another dataset's options replace it
        seen = _options_seen(a, "s3://bucket/c.tif")
        assert seen["inside"]["GDAL_HTTP_TIMEOUT"] == "17"

    def test_left_on_request_and_never_kept_off_the_io_threads(self):
        opener = RasterOpener(
            {"endpoint_url": "http://127.0.0.1:1", "key": "k", "secret": "s"}, gdal_options={"GDAL_HTTP_TIMEOUT": "17"}
        )
        resolved = opener.resolve("s3://bucket/a.tif")
        with opener.env(resolved):  # the calling thread: entered and left as before
            assert rasterio.env.getenv()["GDAL_HTTP_TIMEOUT"] == "17"
        assert not rasterio.env.hasenv() or "GDAL_HTTP_TIMEOUT" not in rasterio.env.getenv()

        def enter_then_leave() -> bool:
            with opener.env(resolved):
                pass
            lanes.leave_lane_env()
            return rasterio.env.hasenv()

        assert lanes.run_remote(enter_then_leave) is False

    def test_switched_off_enters_per_block(self, monkeypatch):
        monkeypatch.setitem(_fast.state, "lane_env", False)
        opener = RasterOpener(
            {"endpoint_url": "http://127.0.0.1:1", "key": "k", "secret": "s"}, gdal_options={"GDAL_HTTP_TIMEOUT": "17"}
        )
        seen = _options_seen(opener, "s3://bucket/a.tif")
        assert seen["inside"]["GDAL_HTTP_TIMEOUT"] == "17"
        assert "GDAL_HTTP_TIMEOUT" not in seen["after"]

    def test_local_files_enter_nothing(self, tmp_path):
        opener = RasterOpener()
        seen = _options_seen(opener, str(tmp_path / "a.tif"))
        assert seen["inside"] == seen["after"] == {}


def _patch(ds: RasterDataset) -> BoundingBox:
    b = ds.bounds
    return BoundingBox(b.minx + 10, b.minx + 10 + 64 * ds.res[0], b.maxy - 10 - 64 * ds.res[1], b.maxy - 10)


@pytest.mark.s3
class TestLaneEnvOnS3:
    def test_same_pixels_and_each_dataset_reads_with_its_own_credentials(self, s3_server, data_dir):
        good_bucket, bad_bucket = s3_server.create_bucket(), s3_server.create_bucket()
        for bucket in (good_bucket, bad_bucket):
            s3_server.fs().put(str(data_dir / "cogeo.tif"), f"{bucket}/cogs/cogeo.tif")
        local = RasterDataset(data_dir / "cogeo.tif")
        q = _patch(local)
        good = RasterDataset(f"s3://{good_bucket}/cogs", storage_options=s3_server.storage_options)
        np.testing.assert_array_equal(good[q]["image"].numpy(), local[q]["image"].numpy())
        # a dataset with a wrong secret, read on the same I/O threads right after: the kept environment
        # (with good credentials) must not sign its requests
        wrong = RasterOpener({**s3_server.storage_options, "secret": "not-the-secret"})
        url = f"s3://{bad_bucket}/cogs/cogeo.tif"
        opened = lanes.run_remote(lambda: _try_open(wrong, url))
        assert isinstance(opened, ReadError) and url in str(opened)
        # and the good dataset reads again (the environment switched back), equal to local disk
        b = local.bounds
        corner = BoundingBox(b.maxx - 30, b.maxx, b.miny, b.miny + 30)
        np.testing.assert_array_equal(good[corner]["image"].numpy(), local[corner]["image"].numpy())

    def test_switched_off_reads_the_same_pixels(self, s3_server, data_dir, monkeypatch):
        bucket = s3_server.create_bucket()
        s3_server.fs().put(str(data_dir / "cogeo.tif"), f"{bucket}/cogs/cogeo.tif")
        local = RasterDataset(data_dir / "cogeo.tif")
        q = _patch(local)
        ds = RasterDataset(f"s3://{bucket}/cogs", storage_options=s3_server.storage_options)
        kept = ds[q]["image"].numpy()
        lanes.run_parts(lambda k: (handles.close_cached_handles(), lanes.leave_lane_env()), lanes.REMOTE_IO_THREADS)
        monkeypatch.setitem(_fast.state, "lane_env", False)
        np.testing.assert_array_equal(ds[q]["image"].numpy(), kept)
        np.testing.assert_array_equal(kept, local[q]["image"].numpy())


def _try_open(opener: RasterOpener, url: str) -> object:
    try:
        handle = handles.open_handle(opener, url, "test")
    except ReadError as exc:
        return exc
    handle.close()
    return handle


class TestRunParts:
    """``lanes.run_parts``: the parts of one read at once, part ``k`` on I/O thread ``k``, errors in part order."""

    def test_parts_run_at_once_on_their_own_io_threads(self):
        n = lanes.REMOTE_IO_THREADS
        barrier = threading.Barrier(n, timeout=10)  # broken unless all parts run at the same time

        def part(k: int) -> tuple[int, str]:
            barrier.wait()
            return k, threading.current_thread().name

        got = lanes.run_parts(part, n)
        assert [k for k, _ in got] == list(range(n))
        names = [name for _, name in got]
        assert all(name.startswith("pipekit-geo-io") for name in names)
        assert len(set(names)) == n
        # part k goes to the same thread every time (its handles are cached there)
        assert [name for _, name in lanes.run_parts(lambda k: (k, threading.current_thread().name), n)] == names

    def test_first_failure_in_part_order_raised_after_every_part_finished(self):
        finished: list[int] = []
        failed: list[int] = []

        def part(k: int) -> int:
            if k == 3:
                raise KeyError("part 3")
            if k == 1:
                time.sleep(0.2)  # fails after part 3 did
                raise ValueError("part 1")
            time.sleep(0.3)
            finished.append(k)
            return k

        with pytest.raises(ValueError, match="part 1"):
            lanes.run_parts(part, 4, failed.append)
        assert failed == [1]
        assert sorted(finished) == [0, 2]  # nobody still runs (and writes into the caller's arrays)

    def test_on_an_io_thread_parts_run_inline(self):
        def nested() -> list[str]:
            return lanes.run_parts(lambda k: threading.current_thread().name, 3)

        names = lanes.run_remote(nested)  # would deadlock if queued behind the running part
        assert len(set(names)) == 1 and names[0].startswith("pipekit-geo-io")
        failed: list[int] = []
        with pytest.raises(ZeroDivisionError):
            lanes.run_remote(lanes.run_parts, lambda k: 1 // (k - 1), 3, failed.append)
        assert failed == [1]

    def test_parts_sharing_a_thread_run_in_part_order_and_every_part_runs_once(self):
        n = lanes.REMOTE_IO_THREADS
        seen: list[tuple[str, int]] = []
        got = lanes.run_parts(lambda k: seen.append((threading.current_thread().name, k)) or k * k, 2 * n + 1)
        assert got == [k * k for k in range(2 * n + 1)]
        assert sorted(k for _, k in seen) == list(range(2 * n + 1))
        for name in {name for name, _ in seen}:  # on each thread, its parts one after another in order
            mine = [k for who, k in seen if who == name]
            assert mine == sorted(mine)

    def test_callers_on_several_threads_each_get_their_own_results(self):
        """Many reads at once (a thread pool over samples): no batch ends early or waits for another's parts."""
        errors: list[BaseException] = []

        def caller(c: int) -> None:
            rng = random.Random(c)
            try:
                for i in range(60):
                    count = rng.randint(1, 7)

                    def part(k: int, c: int = c, i: int = i) -> tuple[int, int, int]:
                        if rng.random() < 0.2:
                            time.sleep(0.001)
                        return c, i, k

                    assert lanes.run_parts(part, count) == [(c, i, k) for k in range(count)]
                    assert lanes.run_remote(lambda c=c, i=i: (c, i)) == (c, i)
            except BaseException as exc:  # reported below: an assertion in a thread would be lost
                errors.append(exc)

        threads = [threading.Thread(target=caller, args=(c,)) for c in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), "a caller hung waiting for its parts"
        assert errors == []

    def test_forked_child_gets_its_own_io_threads(self):
        parent = lanes.run_parts(lambda k: threading.get_ident(), 2)
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        child = ctx.Process(target=lambda: queue.put(lanes.run_parts(lambda k: os.getpid(), 2)))
        child.start()
        got = queue.get(timeout=30)
        child.join(30)
        assert got == [child.pid, child.pid] and len(parent) == 2


class TestLaneOfAThread:
    """What the handle cache asks of the lanes: which lane a thread is, whether it runs, a call on it."""

    def test_current_lane_and_on_io_thread(self):
        assert lanes.current_lane() is None and not lanes.on_io_thread()
        seen = lanes.run_parts(lambda k: (lanes.current_lane(), lanes.on_io_thread()), lanes.REMOTE_IO_THREADS)
        assert seen == [(k, True) for k in range(lanes.REMOTE_IO_THREADS)]

    def test_run_on_a_live_lane(self):
        lanes.run_remote(int)  # this process's lanes are started
        assert all(lanes.lane_alive(k) for k in range(lanes.REMOTE_IO_THREADS))
        ran: list = []
        assert lanes.run_on_lane(2, lambda: ran.append(lanes.current_lane()), timeout=10) is True
        assert ran == [2]
        assert lanes.run_on_lane(1, lambda: 1 // 0, timeout=10) is True  # its error is dropped
        gate = threading.Event()
        assert lanes.run_on_lane(3, gate.wait, timeout=0.05) is False  # still running: not waited for
        gate.set()

    @pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")
    def test_a_forked_child_has_no_lanes_until_it_reads(self):
        lanes.run_remote(int)
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()

        def child() -> None:
            before = lanes.lane_alive(0)
            try:
                lanes.run_on_lane(0, int, timeout=1)
                refused = False
            except RuntimeError:
                refused = True
            lanes.run_remote(int)
            queue.put((before, refused, lanes.lane_alive(0)))

        process = ctx.Process(target=child)
        process.start()
        got = queue.get(timeout=30)
        process.join(30)
        assert got == (False, True, True)
