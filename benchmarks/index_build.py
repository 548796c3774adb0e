"""Building a raster dataset's index over 1k / 10k / 100k small GeoTIFFs: pipekit vs TorchGeo 0.8.

Writes ``N`` tiny GeoTIFFs (4x4 pixels, one band, ~500 bytes each, one folder
per size) and times, on the same files, warm page cache, wall clock and this
process's CPU time (the development machine is shared: CPU time is the
steadier figure):

* ``pk build``: ``pipekit.datasets.RasterDataset(root)`` (default
  ``index_workers``; headers parsed by :mod:`pipekit.geo._tiff_header`);
* ``pk rasterio-only``: the same with ``PIPEKIT_FAST_HEADERS=0`` (every
  header read by ``rasterio.open``), up to ``--rasterio-max`` files;
* ``save``: ``dataset.save_index(<file>)`` (GeoParquet);
* ``reload``: ``RasterDataset(root, index_cache=<file>)``, ``--reloads``
  times (lists, checks sizes and times, opens nothing), in this process and
  (``new process``) in a fresh one, as when a training script starts (its
  imports not counted): this process holds the datasets built before, which
  the garbage collector walks through;
* ``TorchGeo build``: ``torchgeo.datasets.RasterDataset(paths=root)`` (0.8).

Checks that every pipekit variant indexes the same files with the same boxes,
and that TorchGeo indexes as many files over the same area.
There is no DataLoader here: an index is built once, in the main process.

Run (the bench env has TorchGeo): ``PYTHONPATH=src $VB/bin/python benchmarks/index_build.py``
(``--quick``: 1k and 10k only; ``--sizes``; ``--torchgeo-max N`` skips TorchGeo above N files;
``--profile N``: where a new process's reload of the largest size spends its time, cProfile's N costliest functions).
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
    head, tail = template[:at], template[at + len(needle) :]
    for i in range(n):
        x, y = _tile(n, i)
        with open(root / f"tile_{i:06d}.tif", "wb") as f:
            f.write(head + struct.pack("<2d", x, y) + tail)
    check = n - 1
    if (root / f"tile_{check:06d}.tif").read_bytes() != _rasterio_bytes(*_tile(n, check)):
        raise AssertionError("a copied file differs from the one GDAL writes")


def timed(fn):
    """``fn()``, its wall-clock seconds and the CPU seconds this process spent (the machine is shared)."""
    cpu, start = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start, time.process_time() - cpu


_FRESH_RELOAD = """
import sys, time
import geopandas  # noqa: F401  (a training script has imported it)
from pipekit.datasets import RasterDataset
top = int(sys.argv[3])
if top:
    import cProfile
    profile = cProfile.Profile()
    profile.enable()
cpu, start = time.process_time(), time.perf_counter()
dataset = RasterDataset(sys.argv[1], index_cache=sys.argv[2])
wall, cpu = time.perf_counter() - start, time.process_time() - cpu
if top:
    import pstats
    profile.disable()
    pstats.Stats(profile, stream=sys.stderr).sort_stats("tottime").print_stats(top)
print(wall, cpu, len(dataset))
"""


def fresh_reload(root: Path, cache: Path, profile: int = 0) -> tuple[float, float]:
    """The reload timed in a new process (as when a training script starts): wall and CPU seconds.

    ``profile``: run it under cProfile and print its ``profile`` costliest
    functions (own time) to stderr (the seconds returned then include cProfile's overhead).
    """
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _FRESH_RELOAD, str(root), str(cache), str(profile)],
        check=True,
        capture_output=True,
        text=True,
        env=os.environ.copy(),
    )
    if profile:
        print(done.stderr, file=sys.stderr, flush=True)
    wall, cpu, _ = done.stdout.split()
    return float(wall), float(cpu)


def reload_only(base: Path, sizes: list[int], reloads: int) -> None:
    """``reloads`` new-process reloads of each size (files and index left by a ``--keep`` run): min / median / max.

    The pipekit timed is the one on ``PYTHONPATH``: run it with another tree's
    ``src`` (and alternate) to compare two versions on the same files.
    """
    import statistics

    print(f"new-process reloads under {base}; load average {os.getloadavg()[0]:.1f}; seconds min / median / max")
    for n in sizes:
        root, cache = base / f"n{n}", base / f"index-{n}.parquet"
        if not cache.is_file():
            raise SystemExit(f"no saved index {cache}: run once with --dir {base} --keep --sizes {n}")
        runs = [fresh_reload(root, cache) for _ in range(reloads)]
        walls, cpus = [w for w, _ in runs], [c for _, c in runs]
        print(
            f"{n:>8,} files: wall {min(walls):.2f} / {statistics.median(walls):.2f} / {max(walls):.2f}, "
            f"CPU {min(cpus):.2f} / {statistics.median(cpus):.2f} / {max(cpus):.2f}, "
            f"load {os.getloadavg()[0]:.1f}",
            flush=True,
        )


def compare_headers(root: Path, count: int) -> None:
    """CPU per header over ``count`` files: pipekit's parser, ``tifffile`` (if installed), ``rasterio.open``."""
    import rasterio

    from pipekit.geo._tiff_header import FastHeaderReader
    from pipekit.geo.catalog._headers import read_header
    from pipekit.geo.io import RasterOpener

    paths = sorted(str(p) for p in root.glob("*.tif"))[:count]
    opener = RasterOpener()
    readers = {"pipekit": FastHeaderReader(lambda p: read_header(opener, p))}
    try:
        import tifffile

        def with_tifffile(path: str):
            with tifffile.TiffFile(path) as tif:
                page = tif.pages.first
                return page.shape, page.dtype, [page.tags.get(t) for t in (33550, 33922, 34264, 34735, 42113)]

        readers["tifffile"] = with_tifffile
    except ImportError:
        print("tifffile not installed: its row is skipped")

    def with_rasterio(path: str):
        with rasterio.Env(GDAL_DISABLE_READDIR_ON_OPEN="TRUE"):
            return read_header(opener, path)

    readers["rasterio"] = with_rasterio
    for label, read in readers.items():
        cpu = time.process_time()
        for path in paths:
            read(path)
        print(f"headers: {label:9s} {1e6 * (time.process_time() - cpu) / len(paths):8.1f} us of CPU a file", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--quick", action="store_true", help="stop at 10k files")
    parser.add_argument("--torchgeo-max", type=int, default=100_000, help="skip TorchGeo above this many files")
    parser.add_argument(
        "--rasterio-max",
        type=int,
        default=10_000,
        help="skip pipekit without its fast header path (PIPEKIT_FAST_HEADERS=0) above this many",
    )
    parser.add_argument("--reloads", type=int, default=3, help="reloads timed (min and max shown)")
    parser.add_argument(
        "--headers",
        type=int,
        default=0,
        help="first time N headers read three ways (pipekit, tifffile, rasterio) on the first size",
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="then one more new-process reload of the largest size under cProfile: its N costliest functions",
    )
    parser.add_argument(
        "--reload-only",
        action="store_true",
        help="only --reloads new-process reloads of each size's files and saved index (left by --dir D --keep)",
    )
    parser.add_argument("--dir", default=None, help="where to write the files (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the files (reused by the next run with --dir)")
    args = parser.parse_args(argv)
    sizes = [n for n in args.sizes if not args.quick or n <= 10_000]

    import logging

    logging.getLogger("rasterio").setLevel(logging.ERROR)
    import geopandas  # noqa: F401  (imported before timing, as a training script has)

    from pipekit.datasets import RasterDataset
    from pipekit.geo.catalog._headers import default_workers

    try:
        import torchgeo.datasets as tgd
    except ImportError:
        tgd = None
        print("torchgeo not installed: its column is skipped (use the bench env $VB)")

    def rasterio_only(root: Path):
        os.environ["PIPEKIT_FAST_HEADERS"] = "0"
        try:
            return RasterDataset(root, progress=False)
        finally:
            del os.environ["PIPEKIT_FAST_HEADERS"]

    if args.reload_only:
        if not args.dir:
            parser.error("--reload-only reloads what a run with --dir DIR --keep left in DIR")
        reload_only(Path(args.dir), sizes, args.reloads)
        return
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="index-build-"))
    print(
        f"files under {base}; cores {len(os.sched_getaffinity(0))}, default index_workers "
        f"{default_workers()}, load average {os.getloadavg()[0]:.1f}; seconds as wall (CPU)"
    )
    header = (
        f"{'files':>8} {'pk build':>14} {'ms/file':>7} {'pk rasterio-only':>16} {'save':>6} "
        f"{'reload min-max (CPU)':>22} {'new process':>22} "
        f"{'TorchGeo build':>16} {'TG/pk wall':>10} {'TG/pk CPU':>9} {'load':>5}"
    )
    print(header)
    print("-" * len(header))
    try:
        if args.headers:
            write_files(base / f"n{sizes[0]}", sizes[0])
            compare_headers(base / f"n{sizes[0]}", args.headers)
        for n in sizes:
            root = base / f"n{n}"
            write_files(root, n)
            cache = base / f"index-{n}.parquet"
            cache.unlink(missing_ok=True)
            built, pk_s, pk_cpu = timed(lambda root=root: RasterDataset(root, progress=False))
            slow_txt = ""
            if n <= args.rasterio_max:
                slow, slow_s, slow_cpu = timed(lambda root=root: rasterio_only(root))
                if slow.files != built.files or slow.geo_index != built.geo_index:
                    raise AssertionError(f"{n} files: the index differs with and without the fast header path")
                slow_txt = f"{slow_s:.2f} ({slow_cpu:.2f})"
            _, save_s, _ = timed(lambda built=built, cache=cache: built.save_index(cache))
            reloads = []
            for _ in range(args.reloads):
                reloaded, reload_s, reload_cpu = timed(
                    lambda root=root, cache=cache: RasterDataset(root, index_cache=cache)
                )
                if reloaded.files != built.files or reloaded.geo_index != built.geo_index:
                    raise AssertionError(f"{n} files: the reloaded index differs from the built one")
                reloads.append((reload_s, reload_cpu))
            fresh = [fresh_reload(root, cache) for _ in range(args.reloads)]
            tg_s = tg_cpu = float("nan")
            if tgd is not None and n <= args.torchgeo_max:
                tg, tg_s, tg_cpu = timed(lambda root=root: tgd.RasterDataset(paths=str(root)))
                if len(tg.index) != len(built):
                    raise AssertionError(f"TorchGeo indexed {len(tg.index)} files, pipekit {len(built)}")
                if not np.allclose(np.asarray(tg.index.total_bounds), np.asarray(built.index.total_bounds)):
                    raise AssertionError("TorchGeo's index covers another area than pipekit's")
            lo, hi = min(reloads), max(reloads)
            reload_txt = f"{lo[0]:.2f}-{hi[0]:.2f} ({lo[1]:.2f}-{hi[1]:.2f})"
            lo, hi = min(fresh), max(fresh)
            fresh_txt = f"{lo[0]:.2f}-{hi[0]:.2f} ({lo[1]:.2f}-{hi[1]:.2f})"
            print(
                f"{n:>8,} {f'{pk_s:.2f} ({pk_cpu:.2f})':>14} {1e3 * pk_s / n:>7.3f} {slow_txt:>16} {save_s:>6.2f} "
                f"{reload_txt:>22} {fresh_txt:>22} "
                f"{f'{tg_s:.1f} ({tg_cpu:.1f})':>16} {tg_s / pk_s:>10.1f} {tg_cpu / pk_cpu:>9.1f} "
                f"{os.getloadavg()[0]:>5.1f}",
                flush=True,
            )
        if args.profile:
            n = sizes[-1]
            wall, cpu = fresh_reload(base / f"n{n}", base / f"index-{n}.parquet", args.profile)
            print(
                f"profiled new-process reload of {n:,} files: {wall:.2f} s ({cpu:.2f} s CPU) under cProfile, "
                f"load average {os.getloadavg()[0]:.1f}"
            )
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
