"""Opening rasters: URL resolution, the per-process handle cache, fsspec files, and S3 (GDAL and fsspec)."""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import random
import re
import threading
import time

import fsspec
import numpy as np
import pytest
import rasterio

from pipekit.datasets import RasterDataset
from pipekit.geo import BoundingBox
from pipekit.geo import io as geo_io
from pipekit.geo.io import RasterOpener


@pytest.fixture(autouse=True)
def _fresh_cache():
    geo_io.close_cached_handles()
    budget = geo_io.handle_budget()
    yield
    geo_io.set_handle_budget(**budget)
    geo_io.close_cached_handles()


class TestRasterOpener:
    def test_local_paths(self, tmp_path):
        opener = RasterOpener()
        assert opener.resolve(str(tmp_path / "a.tif")).kind == "local"
        resolved = opener.resolve(f"file://{tmp_path}/a.tif")
        assert (resolved.kind, resolved.path) == ("local", f"{tmp_path}/a.tif")

    def test_s3_with_s3fs_options_goes_to_vsis3(self):
        opener = RasterOpener({
            "key": "AK",
            "secret": "SK",
            "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1"},
        })
        resolved = opener.resolve("s3://bucket/dir/scene.tif")
        assert resolved.kind == "vsi" and resolved.path == "/vsis3/bucket/dir/scene.tif"
        assert resolved.config["AWS_S3_ENDPOINT"] == "127.0.0.1:9000"
        assert resolved.config["AWS_HTTPS"] == "NO"
        assert resolved.config["AWS_VIRTUAL_HOSTING"] == "FALSE"
        assert resolved.config["AWS_REGION"] == "eu-west-1"
        assert resolved.config["GDAL_DISABLE_READDIR_ON_OPEN"] == "EMPTY_DIR"
        assert resolved.credentials == {"AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK"}
        anonymous = RasterOpener({"anon": True}).resolve("s3://bucket/a.tif")
        assert anonymous.config["AWS_NO_SIGN_REQUEST"] == "YES" and anonymous.credentials == {}
        assert RasterOpener({"endpoint_url": "https://s3.example.com"}).resolve("s3://b/a.tif").config[
            "AWS_HTTPS"] == "YES"

    def test_everything_else_goes_through_fsspec(self):
        opener = RasterOpener()
        assert opener.resolve("memory://bucket/a.tif").kind == "fsspec"
        assert opener.resolve("https://example.com/a.tif").path == "/vsicurl/https://example.com/a.tif"
        assert RasterOpener({"headers": {"x": "y"}}).resolve("https://example.com/a.tif").kind == "fsspec"
        # options GDAL cannot express, or vsi=False
        assert RasterOpener({"key": "k", "config_kwargs": {"x": 1}}).resolve("s3://b/a.tif").kind == "fsspec"
        assert RasterOpener({"key": "k"}, vsi=False).resolve("s3://b/a.tif").kind == "fsspec"
        with pytest.raises(ValueError, match="vsi=True"):
            RasterOpener(vsi=True).resolve("memory://bucket/a.tif")

    def test_validation_pickling_and_repr(self):
        with pytest.raises(TypeError, match="storage_options"):
            RasterOpener(["key"])
        with pytest.raises(TypeError, match="vsi"):
            RasterOpener(vsi="yes")
        opener = RasterOpener({"key": "k", "secret": "hidden"}, gdal_options={"GDAL_HTTP_TIMEOUT": 5})
        assert "hidden" not in repr(opener)
        clone = pickle.loads(pickle.dumps(opener))
        assert clone == opener and hash(clone) == hash(opener)
        assert clone.resolve("s3://b/a.tif").config["GDAL_HTTP_TIMEOUT"] == 5


class TestHandleCache:
    def _files(self, tmp_path, rasters, n):
        paths = []
        for k in range(n):
            transform = rasterio.Affine(30.0, 0.0, rasters.X0 + k * 600, 0.0, -30.0, rasters.Y0)
            paths.append(str(rasters.write_tif(tmp_path / f"f{k}.tif", rasters.pattern(20, 20), rasters.UTM15,
                                               transform)))
        return paths

    def test_lru_closes_beyond_the_count_budget(self, tmp_path, rasters):
        paths = self._files(tmp_path, rasters, 3)
        opener = RasterOpener()
        geo_io.set_handle_budget(max_files=2)
        first = geo_io.cached_handle(opener, paths[0])
        assert geo_io.cached_handle(opener, paths[0]) is first
        second = geo_io.cached_handle(opener, paths[1])
        geo_io.cached_handle(opener, paths[0])  # paths[1] is now the least recently used
        geo_io.cached_handle(opener, paths[2])
        assert geo_io.cached_handle_count() == 2
        assert second.ds.closed and not first.ds.closed

    def test_byte_budget(self, tmp_path, rasters):
        paths = self._files(tmp_path, rasters, 3)
        opener = RasterOpener()
        cost = geo_io.cached_handle(opener, paths[0]).cost
        geo_io.set_handle_budget(max_bytes=2 * cost)
        for p in paths:
            geo_io.cached_handle(opener, p)
        assert geo_io.cached_handle_count() == 2
        with pytest.raises(ValueError, match="max_bytes"):
            geo_io.set_handle_budget(max_bytes=0)
        with pytest.raises(ValueError, match="max_files"):
            geo_io.set_handle_budget(max_files=True)

    def test_threads_have_their_own_handles(self, utm_scene):
        opener = RasterOpener()
        mine = geo_io.cached_handle(opener, str(utm_scene["path"]))
        theirs = []
        thread = threading.Thread(target=lambda: theirs.append(geo_io.cached_handle(opener, str(utm_scene["path"]))))
        thread.start()
        thread.join()
        assert theirs[0] is not mine and not mine.ds.closed

    @pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")
    def test_forked_child_never_uses_the_parents_handles(self, utm_scene):
        ds = RasterDataset(utm_scene["root"])
        q = BoundingBox(utm_scene["transform"].c, utm_scene["transform"].c + 300,
                        utm_scene["transform"].f - 300, utm_scene["transform"].f)
        expected = ds[q]["image"].numpy()
        parent = geo_io.cached_handle(ds._opener, ds.files[0])
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        child = ctx.Process(target=_child_reads, args=(ds, q, id(parent), queue))
        child.start()
        result = queue.get(timeout=60)
        child.join(timeout=60)
        assert result["count_before"] == 0
        assert result["same_handle"] is False
        np.testing.assert_array_equal(result["image"], expected)
        # the parent's handle is intact after the child read and exited
        assert geo_io.cached_handle(ds._opener, ds.files[0]) is parent
        np.testing.assert_array_equal(ds[q]["image"].numpy(), expected)


def _child_reads(ds, q, parent_handle_id, queue):
    before = geo_io.cached_handle_count()
    image = ds[q]["image"].numpy()
    handle = geo_io.cached_handle(ds._opener, ds.files[0])
    queue.put({"count_before": before, "same_handle": id(handle) == parent_handle_id, "image": image})


class TestFsspecFiles:
    def test_memory_files_are_independent_per_handle(self, utm_scene):
        fs = fsspec.filesystem("memory")
        fs.pipe("/geo-io-test/scene.tif", utm_scene["path"].read_bytes())
        try:
            opener = RasterOpener()
            url = "memory://geo-io-test/scene.tif"
            a = geo_io.open_handle(opener, url)
            b = geo_io.open_handle(opener, url)
            window = ((0, 8), (0, 8))
            np.testing.assert_array_equal(a.ds.read(1, window=window), b.ds.read(1, window=window))
            a.close()
            np.testing.assert_array_equal(b.ds.read(1, window=window), utm_scene["array"][0, :8, :8])
            b.close()
            errors = []

            def worker():
                try:
                    for _ in range(10):
                        h = geo_io.cached_handle(opener, url)
                        assert (h.ds.read(2, window=window) == utm_scene["array"][1, :8, :8]).all()
                except Exception as exc:  # pragma: no cover - reported below
                    errors.append(exc)

            threads = [threading.Thread(target=worker) for _ in range(3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert errors == []
        finally:
            fs.rm("/geo-io-test", recursive=True)

    def test_open_failure_names_the_url(self, tmp_path):
        from pipekit.errors import ReadError

        with pytest.raises(ReadError, match=r"cannot open raster 'memory://nowhere/missing\.tif' in X: no such file"):
            geo_io.open_handle(RasterOpener(), "memory://nowhere/missing.tif", "X")
        with pytest.raises(ReadError, match=r"missing\.tif' in RasterOpener: no such file"):
            geo_io.open_handle(RasterOpener(), str(tmp_path / "missing.tif"))


# Run in a child process: before the fix, an fsspec read that raised inside rasterio's opener reached
# GDAL's C++ code and aborted the whole interpreter ("terminate called after throwing std::length_error").
_FLAKY_SCRIPT = r"""
import json, os, sys
import fsspec, numpy as np
from fsspec.implementations.memory import MemoryFileSystem
from pipekit.geo import io as geo_io
from pipekit.geo.read import SourceReadError
from pipekit.errors import ReadError
from pipekit.retry import is_transient

failures = {"left": 0, "raised": 0}

class FlakyFile:
    def __init__(self, f):
        self._f = f
    def __getattr__(self, name):
        return getattr(self._f, name)
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        self._f.close()
    def read(self, *args):
        if failures["left"] > 0:
            failures["left"] -= 1
            failures["raised"] += 1
            raise ConnectionResetError(104, "Connection reset by peer")
        return self._f.read(*args)

class FlakyFS(MemoryFileSystem):
    protocol = "flakymem"
    @classmethod
    def _strip_protocol(cls, path):
        return super()._strip_protocol("memory://" + path[len("flakymem://"):] if path.startswith("flakymem://")
                                       else path)
    def _open(self, path, mode="rb", **kwargs):
        return FlakyFile(super()._open(path, mode, **kwargs))

fsspec.register_implementation("flakymem", FlakyFS, clobber=True)
FlakyFS().pipe("/flaky/scene.tif", open(sys.argv[1], "rb").read())
url = "flakymem://flaky/scene.tif"
opener = geo_io.RasterOpener()
out = {}
window = ((0, 8), (0, 8))

failures["left"] = 1  # the header's first read fails once: the open is retried
handle = geo_io.open_handle(opener, url, "T")
out["open_retried"] = failures["raised"]
out["window"] = handle.ds.read(1, window=window).tolist()

failures["left"] = 1  # a window read (of blocks not read yet) fails: a transient error naming the URL
far = ((290, 298), (290, 298))
raised = failures["raised"]
try:
    from pipekit.geo.read import _read_window
    _read_window(handle, [1], far)
    out["read"] = "no error"
except SourceReadError as exc:
    out["read"] = {"url": exc.url, "reason": str(exc), "transient": is_transient(exc)}
out["read_raised"] = failures["raised"] - raised
out["again"] = handle.ds.read(1, window=far).tolist()
handle.close()

failures["left"] = 10**6  # never comes back: ReadError naming the URL and the fsspec error
try:
    geo_io.open_handle(opener, url, "T")
    out["down"] = "no error"
except ReadError as exc:
    out["down"] = str(exc)
print(json.dumps(out))
"""


_FLAKY_WORKERS_SCRIPT = r"""
import json, os, sys
import fsspec
from fsspec.implementations.memory import MemoryFileSystem
import pipekit
from pipekit.datasets import RasterDataset
from pipekit.geo.bbox import BoundingBox

down = sys.argv[2]  # while this file exists, every read of the scene fails (seen by the forked workers too)

class FlakyFile:
    def __init__(self, f):
        self._f = f
    def __getattr__(self, name):
        return getattr(self._f, name)
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        self._f.close()
    def read(self, *args):
        if os.path.exists(down):
            raise ConnectionResetError(104, "Connection reset by peer")
        return self._f.read(*args)

class FlakyFS(MemoryFileSystem):
    protocol = "flakymem"
    @classmethod
    def _strip_protocol(cls, path):
        return super()._strip_protocol("memory://" + path[len("flakymem://"):] if path.startswith("flakymem://")
                                       else path)
    def _open(self, path, mode="rb", **kwargs):
        return FlakyFile(super()._open(path, mode, **kwargs))

fsspec.register_implementation("flakymem", FlakyFS, clobber=True)
FlakyFS().pipe("/flaky/scene.tif", open(sys.argv[1], "rb").read())
ds = RasterDataset(["flakymem://flaky/scene.tif"], vsi=False)
b = ds.bounds
boxes = [BoundingBox(b.minx + i * 900, b.minx + (i + 1) * 900, b.maxy - 900, b.maxy) for i in range(8)]
open(down, "w").close()
loader = pipekit.DataLoader(ds, batch_size=None, sampler=boxes, num_workers=2)
out = {"batches": 0}
try:
    for _ in loader:
        out["batches"] += 1
except Exception as exc:
    out["error"] = str(exc)
print(json.dumps(out))
"""


class TestFsspecReadFailures:
    def test_a_failed_fsspec_read_is_an_error_not_a_crash(self, utm_scene, tmp_path):
        import json
        import subprocess
        import sys

        env = {**os.environ, "PIPEKIT_RETRY_ATTEMPTS": "3", "PIPEKIT_RETRY_SECONDS": "5"}
        done = subprocess.run([sys.executable, "-c", _FLAKY_SCRIPT, str(utm_scene["path"])], capture_output=True,
                              text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        out = json.loads(done.stdout.strip().splitlines()[-1])
        expected = utm_scene["array"][0, :8, :8].tolist()
        assert out["open_retried"] == 1
        assert out["window"] == expected
        read = out["read"]
        assert read["url"] == "flakymem://flaky/scene.tif"
        assert "ConnectionResetError" in read["reason"] and read["transient"]
        assert out["read_raised"] == 1
        assert out["again"] == utm_scene["array"][0, 290:298, 290:298].tolist()  # reads once the connection is back
        assert "flakymem://flaky/scene.tif" in out["down"] and "ConnectionResetError" in out["down"]

    def test_with_dataloader_workers_the_error_reaches_the_main_process(self, utm_scene, tmp_path):
        """Two forked workers read through the failing fsspec file: an error naming the URL, no abort, no hang."""
        import json
        import subprocess
        import sys

        env = {**os.environ, "PIPEKIT_RETRY_ATTEMPTS": "2", "PIPEKIT_RETRY_SECONDS": "2"}
        args = [sys.executable, "-c", _FLAKY_WORKERS_SCRIPT, str(utm_scene["path"]), str(tmp_path / "down")]
        done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=180)
        assert done.returncode == 0, done.stderr[-3000:]
        out = json.loads(done.stdout.strip().splitlines()[-1])
        assert out["batches"] == 0
        last = out["error"].strip().splitlines()[-1]  # the worker's error as re-raised in the main process
        assert last.startswith("pipekit.errors.ReadError: cannot open raster 'flakymem://")
        assert "/flaky/scene.tif' in RasterDataset" in last and "ConnectionResetError" in last


def _cog_patch(ds):
    b = ds.bounds
    return BoundingBox(b.minx + 10, b.minx + 10 + 64 * ds.res[0], b.maxy - 10 - 64 * ds.res[1], b.maxy - 10)


@pytest.mark.s3
class TestS3:
    def _upload(self, s3_server, data_dir) -> str:
        bucket = s3_server.create_bucket()
        s3_server.fs().put(str(data_dir / "cogeo.tif"), f"{bucket}/cogs/cogeo.tif")
        return bucket

    def test_gdal_vsis3_reads_windows_by_range(self, s3_server, data_dir, caplog):
        bucket = self._upload(s3_server, data_dir)
        local = RasterDataset(data_dir / "cogeo.tif")
        ds = RasterDataset(f"s3://{bucket}/cogs", storage_options=s3_server.storage_options,
                           gdal_options={"CPL_DEBUG": "ON"})
        assert ds.files == [f"s3://{bucket}/cogs/cogeo.tif"]
        assert ds._opener.resolve(ds.files[0]).kind == "vsi"
        q = _cog_patch(local)
        with caplog.at_level(logging.DEBUG, logger="rasterio"):
            got = ds[q]["image"].numpy()
        np.testing.assert_array_equal(got, local[q]["image"].numpy())
        ranges = [tuple(map(int, m)) for m in re.findall(r"Downloading (\d+)-(\d+)", caplog.text)]
        assert ranges, "GDAL made no range request"
        size = os.path.getsize(data_dir / "cogeo.tif")
        assert sum(end - start + 1 for start, end in ranges) < size / 2
        # the bottom-right corner too, through the same cached handle
        b = local.bounds
        corner = BoundingBox(b.maxx - 30, b.maxx, b.miny, b.miny + 30)
        np.testing.assert_array_equal(ds[corner]["image"].numpy(), local[corner]["image"].numpy())

    def test_fsspec_opener_reads_windows_by_range(self, s3_server, data_dir, monkeypatch):
        import s3fs.core

        bucket = self._upload(s3_server, data_dir)
        local = RasterDataset(data_dir / "cogeo.tif")
        ds = RasterDataset(f"s3://{bucket}/cogs", storage_options=s3_server.storage_options, vsi=False)
        assert ds._opener.resolve(ds.files[0]).kind == "fsspec"
        fetched: list[tuple[int, int]] = []
        original = s3fs.core.S3File._fetch_range

        def record(self, start, end):
            fetched.append((start, end))
            return original(self, start, end)

        monkeypatch.setattr(s3fs.core.S3File, "_fetch_range", record)
        q = _cog_patch(local)
        np.testing.assert_array_equal(ds[q]["image"].numpy(), local[q]["image"].numpy())
        size = os.path.getsize(data_dir / "cogeo.tif")
        assert fetched and sum(end - start for start, end in fetched) < size * 0.75
        assert any(start > 0 for start, _ in fetched)

    def test_s3_dataset_in_dataloader_workers(self, s3_server, data_dir):
        from torch.utils.data import DataLoader

        bucket = self._upload(s3_server, data_dir)
        local = RasterDataset(data_dir / "cogeo.tif")
        ds = RasterDataset(f"s3://{bucket}/cogs", storage_options=s3_server.storage_options)
        b = local.bounds
        step = 128 * local.res[0]
        boxes = [BoundingBox(b.minx + i * step, b.minx + (i + 1) * step, b.maxy - (j + 1) * step, b.maxy - j * step)
                 for i in range(4) for j in range(2)]
        # the parent reads first: its network connections must not leak into the forked workers
        np.testing.assert_array_equal(ds[boxes[0]]["image"].numpy(), local[boxes[0]]["image"].numpy())
        loader = DataLoader(ds, batch_size=None, sampler=boxes, num_workers=2)
        for q, sample in zip(boxes, loader):
            np.testing.assert_array_equal(sample["image"].numpy(), local[q]["image"].numpy())

    def test_missing_prefix_is_reported(self, s3_server):
        bucket = s3_server.create_bucket()
        with pytest.raises(FileNotFoundError, match=f"s3://{bucket}/nothing"):
            RasterDataset(f"s3://{bucket}/nothing", storage_options=s3_server.storage_options)


class TestRunParts:
    """``geo_io.run_parts``: the parts of one read at once, part ``k`` on I/O thread ``k``, errors in part order."""

    def test_parts_run_at_once_on_their_own_io_threads(self):
        n = geo_io.REMOTE_IO_THREADS
        barrier = threading.Barrier(n, timeout=10)  # broken unless all parts run at the same time

        def part(k: int) -> tuple[int, str]:
            barrier.wait()
            return k, threading.current_thread().name

        got = geo_io.run_parts(part, n)
        assert [k for k, _ in got] == list(range(n))
        names = [name for _, name in got]
        assert all(name.startswith("pipekit-geo-io") for name in names)
        assert len(set(names)) == n
        # part k goes to the same thread every time (its handles are cached there)
        assert [name for _, name in geo_io.run_parts(lambda k: (k, threading.current_thread().name), n)] == names

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
            geo_io.run_parts(part, 4, failed.append)
        assert failed == [1]
        assert sorted(finished) == [0, 2]  # nobody still runs (and writes into the caller's arrays)

    def test_on_an_io_thread_parts_run_inline(self):
        def nested() -> list[str]:
            return geo_io.run_parts(lambda k: threading.current_thread().name, 3)

        names = geo_io.run_remote(nested)  # would deadlock if queued behind the running part
        assert len(set(names)) == 1 and names[0].startswith("pipekit-geo-io")
        failed: list[int] = []
        with pytest.raises(ZeroDivisionError):
            geo_io.run_remote(geo_io.run_parts, lambda k: 1 // (k - 1), 3, failed.append)
        assert failed == [1]

    def test_parts_sharing_a_thread_run_in_part_order_and_every_part_runs_once(self):
        n = geo_io.REMOTE_IO_THREADS
        seen: list[tuple[str, int]] = []
        got = geo_io.run_parts(lambda k: seen.append((threading.current_thread().name, k)) or k * k, 2 * n + 1)
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

                    assert geo_io.run_parts(part, count) == [(c, i, k) for k in range(count)]
                    assert geo_io.run_remote(lambda c=c, i=i: (c, i)) == (c, i)
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
        parent = geo_io.run_parts(lambda k: threading.get_ident(), 2)
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        child = ctx.Process(target=lambda: queue.put(geo_io.run_parts(lambda k: os.getpid(), 2)))
        child.start()
        got = queue.get(timeout=30)
        child.join(30)
        assert got == [child.pid, child.pid] and len(parent) == 2
