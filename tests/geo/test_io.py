"""``pipekit.geo.io`` end to end: a raster read through fsspec whose request fails is an error, never a crash.

docs/guides/reliability.md names these tests; the tests of each module of the package are in
``tests/geo/io/``.
"""

from __future__ import annotations

import os

# Run in a child process: before the fix, an fsspec read that raised inside rasterio's opener reached
# GDAL's C++ code and aborted the whole interpreter ("terminate called after throwing std::length_error").
_FLAKY_SCRIPT = r"""
import json, os, sys
import fsspec, numpy as np
from fsspec.implementations.memory import MemoryFileSystem
from pipekit.geo import io as geo_io
from pipekit.geo._read import SourceReadError
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
    from pipekit.geo._read import _read_window
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
from pipekit.geo._bbox import BoundingBox

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
