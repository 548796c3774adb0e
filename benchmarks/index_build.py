"""Building a raster dataset's index over 1k / 10k / 100k small GeoTIFFs: pipekit vs TorchGeo 0.8.

Writes ``N`` tiny GeoTIFFs (4x4 pixels, one band, ~500 bytes each, one folder
per size) and times, on the same files, warm page cache:

* ``pk 1 thr``: ``pipekit.datasets.RasterDataset(root, index_workers=1)``;
* ``pk``: the same with the default ``index_workers``
  (:func:`pipekit.geo.discovery.default_workers`; where that is 1, one run
  fills both columns);
* ``save``: ``dataset.save_index(<file>)`` (GeoParquet);
* ``reload``: ``index_cache=<file>`` again (lists, checks sizes and times,
  opens nothing);
* ``torchgeo``: ``torchgeo.datasets.RasterDataset(paths=root)`` (0.8).

Checks that every pipekit variant indexes the same files with the same boxes.
There is no DataLoader here: an index is built once, in the main process.

Run (the bench env has TorchGeo): ``PYTHONPATH=src $VB/bin/python benchmarks/index_build.py``
(``--quick``: 1k and 10k only; ``--sizes``; ``--torchgeo-max N`` skips TorchGeo above N files).
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import tempfile
import time
from pathlib import Path

import numpy as np
import rasterio
from affine import Affine


def _tile(n: int, i: int) -> tuple[float, float]:
    side = int(np.ceil(np.sqrt(n)))
    return 500_000 + (i % side) * 120.0, 4_000_000 + (i // side) * 120.0


def _rasterio_bytes(x: float, y: float) -> bytes:
    """One 4x4 uint8 GeoTIFF in UTM 15N with its upper-left corner at ``(x, y)``, as GDAL writes it."""
    from rasterio.io import MemoryFile

    profile = {"driver": "GTiff", "width": 4, "height": 4, "count": 1, "dtype": "uint8", "crs": "EPSG:32615"}
    with MemoryFile() as memory:
        with memory.open(transform=Affine(30, 0, x, 0, -30, y), **profile) as f:
            f.write(np.ones((1, 4, 4), dtype="uint8"))
        return memory.read()


def write_files(root: Path, n: int) -> None:
    """``n`` tiny GeoTIFFs: GDAL's bytes for the first, the others that file with its tiepoint moved.

    Writing 100,000 files through GDAL takes minutes on a loaded machine; the
    files differ only in the tiepoint's X and Y doubles, so the template's
    bytes are copied with those 16 bytes replaced (checked: a file written
    this way is byte-identical to GDAL's for the same corner).
    """
    root.mkdir(parents=True, exist_ok=True)
    existing = len([e for e in os.scandir(root) if e.name.endswith(".tif")])
    if existing == n:
        return
    x0, y0 = _tile(n, 0)
    template = _rasterio_bytes(x0, y0)
    needle = struct.pack("<2d", x0, y0)
    if template.count(needle) != 1:
        raise AssertionError("the template's tiepoint is not found exactly once")
    at = template.index(needle)
    head, tail = template[:at], template[at + len(needle):]
    for i in range(n):
        x, y = _tile(n, i)
        with open(root / f"tile_{i:06d}.tif", "wb") as f:
            f.write(head + struct.pack("<2d", x, y) + tail)
    check = n - 1
    if (root / f"tile_{check:06d}.tif").read_bytes() != _rasterio_bytes(*_tile(n, check)):
        raise AssertionError("a copied file differs from the one GDAL writes")


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--quick", action="store_true", help="stop at 10k files")
    parser.add_argument("--torchgeo-max", type=int, default=100_000, help="skip TorchGeo above this many files")
    parser.add_argument("--dir", default=None, help="where to write the files (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the files (reused by the next run with --dir)")
    args = parser.parse_args(argv)
    sizes = [n for n in args.sizes if not args.quick or n <= 10_000]

    import logging

    logging.getLogger("rasterio").setLevel(logging.ERROR)
    import geopandas  # noqa: F401  (imported before timing, as a training script has)

    from pipekit.datasets import RasterDataset
    from pipekit.geo.discovery import default_workers

    try:
        import torchgeo.datasets as tgd
    except ImportError:
        tgd = None
        print("torchgeo not installed: its column is skipped (use the bench env $VB)")

    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="index-build-"))
    print(f"files under {base}; cores {len(os.sched_getaffinity(0))}, default index_workers "
          f"{default_workers()}; machine shared with other jobs (timings are noisy)")
    header = (f"{'files':>8} {'write s':>8} {'pk 1 thr s':>10} {'pk s':>7} {'save s':>9} {'reload s':>8} "
              f"{'torchgeo s':>10} {'tg/pk':>6} {'ms/file pk':>10} {'ms/file tg':>10}")
    print(header)
    print("-" * len(header))
    try:
        for n in sizes:
            root = base / f"n{n}"
            _, write_s = timed(lambda root=root, n=n: write_files(root, n))
            cache = base / f"index-{n}.parquet"
            cache.unlink(missing_ok=True)
            pooled, pooled_s = timed(lambda root=root: RasterDataset(root, progress=False))
            if default_workers() > 1:
                serial, serial_s = timed(lambda root=root: RasterDataset(root, index_workers=1, progress=False))
            else:  # the default is one thread here: the same run
                serial, serial_s = pooled, pooled_s
            _, save_s = timed(lambda pooled=pooled, cache=cache: pooled.save_index(cache))
            reloaded, reload_s = timed(lambda root=root, cache=cache: RasterDataset(root, index_cache=cache))
            for other in (pooled, reloaded):
                if other.files != serial.files or other.geo_index != serial.geo_index:
                    raise AssertionError(f"{n} files: the index differs between pipekit's variants")
            tg_s = float("nan")
            if tgd is not None and n <= args.torchgeo_max:
                tg, tg_s = timed(lambda root=root: tgd.RasterDataset(paths=str(root)))
                if len(tg.index) != len(serial):
                    raise AssertionError(f"TorchGeo indexed {len(tg.index)} files, pipekit {len(serial)}")
            best = min(serial_s, pooled_s)
            print(f"{n:>8,} {write_s:>8.1f} {serial_s:>10.2f} {pooled_s:>7.2f} {save_s:>9.2f} {reload_s:>8.3f} "
                  f"{tg_s:>10.2f} {tg_s / best:>6.1f} {1e3 * best / n:>10.3f} {1e3 * tg_s / n:>10.3f}", flush=True)
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
