"""pipekit.malloc: glibc tuning that stops large per-sample arrays from being paged in afresh."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap

import pytest

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")

# Arrays of a geo sample (uint16 patch, its float32 copy, an int64 mask, a float64 scratch):
# ~3.7 MiB that glibc's defaults give back to the kernel at every free, then fault in again.
_CYCLE = """
import json, os, resource, sys
import numpy as np
from pipekit import malloc
{setup}
def cycle():
    a = np.ones((6, 256, 256), np.uint16); b = a.astype(np.float32)
    c = np.ones((256, 256), np.int64); d = np.ones((2, 256, 256), np.float64)
    return float(b[0, 0, 0] + c[0, 0] + d[0, 0, 0])
for _ in range(5):
    cycle()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    cycle()
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 50
print(json.dumps({{"tuned": malloc.tuned(), "faults": faults}}))
"""


def _run(setup: str, env: dict[str, str] | None = None) -> dict:
    code = textwrap.dedent(_CYCLE.format(setup=setup))
    full_env = {**os.environ, **(env or {})}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@glibc
def test_tune_stops_refaulting_large_arrays() -> None:
    result = _run("assert malloc.tune()")
    assert result["tuned"]
    # a sample's ~3.7 MiB is ~950 pages: tuned, the freed heap is reused in place
    assert result["faults"] < 20, result


@glibc
def test_env_var_disables_tuning() -> None:
    result = _run("assert not malloc.tune()", env={"PIPEKIT_TUNE_MALLOC": "0"})
    assert not result["tuned"]


@glibc
def test_reading_a_raster_tunes_the_process(tmp_path) -> None:
    import numpy as np
    import rasterio
    from rasterio.transform import from_origin

    path = tmp_path / "r.tif"
    with rasterio.open(path, "w", driver="GTiff", width=8, height=8, count=1, dtype="uint8", crs="EPSG:32615",
                       transform=from_origin(500000, 4000000, 30, 30)) as dst:
        dst.write(np.zeros((1, 8, 8), np.uint8))
    setup = f"""
from pipekit.datasets import RasterDataset
assert not malloc.tuned()
ds = RasterDataset({str(path)!r})
ds[ds.bounds]
"""
    assert _run(setup)["tuned"]


def test_tune_is_idempotent_and_reports_state() -> None:
    from pipekit import malloc

    first = malloc.tune()
    assert malloc.tune() is first
    assert malloc.tuned() is first
