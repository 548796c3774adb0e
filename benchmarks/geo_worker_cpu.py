"""Where the CPU goes when geo patches come through DataLoader workers: main process vs workers.

Wall-clock rates on the shared 2-core machine move 2-3x with the load (other
sessions); CPU time per sample does not depend much on it.  This runs the
``geo_sampling`` chain -- ``Landsat8 & CDL`` random 256 px patches,
``RandomGeoSampler -> dataset[...] -> stack_samples`` in a
``torch.utils.data.DataLoader(batch_size=8)`` -- with the given number of
workers and prints, per pass, samples/s, the CPU time per sample of the main
process (its own reads with 0 workers; unpickling the batches, the sampler and
the loop with workers) and of the workers (from ``/proc``, all threads).  If
the workers' total CPU per sample is close to the 0-worker process's, nothing
is lost by going through workers (no extra copy of the batch); a 2-worker run
is then faster than a 0-worker run wherever two cores are free.

``--pool on off`` runs each worker count with :mod:`pipekit._shm`'s reuse of
shared-memory batch buffers on (the default) and off (fresh shared memory
for every batch, as before), side by side.

``--main-threads 1 2`` runs the 0-worker configuration with that many torch
intra-op threads (DataLoader workers always run with one): on a loaded
machine the default threads' waiting costs the 0-worker process CPU.

``--synthetic`` replaces the reads with samples of the same shapes and
dtypes ready in memory (one copy each), which leaves the cost of building
batches and handing them over.

``--profile`` runs cProfile inside each worker (started in ``worker_init_fn``,
written when the worker exits) and prints the top functions of worker 0.

Run: ``PYTHONPATH=src python benchmarks/geo_worker_cpu.py --workers 0 2 --pool on off``.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parent))
import geo_sampling as gs  # the same corpus, dataset and process settings

PROFILE_DIR = os.environ.get("GEO_WORKER_CPU_PROFILE_DIR", "")
DEFAULT_THREADS = torch.get_num_threads()


def _profile_worker(_worker_id: int) -> None:
    """``worker_init_fn``: profile this worker until it exits."""
    from multiprocessing import util

    profile = cProfile.Profile()
    profile.enable()
    wid = torch.utils.data.get_worker_info().id

    def dump() -> None:
        profile.disable()
        profile.dump_stats(os.path.join(PROFILE_DIR, f"worker{wid}.prof"))

    util.Finalize(None, dump, exitpriority=100)  # runs when the worker process exits


class ReadySamples(torch.utils.data.Dataset):
    """``--synthetic``: samples of the geo chain's shapes and dtypes, ready in memory (a copy per sample, no
    reading): what is left is the cost of building batches and handing them to the main process."""

    def __init__(self, dtype: str) -> None:
        native = dtype == "native"
        self.image = torch.rand(len(gs.BANDS), gs.PATCH, gs.PATCH).mul(10000)
        self.image = self.image.to(torch.int16 if native else torch.float32)
        self.mask = torch.randint(0, 255, (gs.PATCH, gs.PATCH), dtype=torch.uint8 if native else torch.int64)

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: object) -> dict:
        return {"image": self.image.clone(), "mask": self.mask.clone(), "crs": "EPSG:32615", "bounds": i}


def dataset(root: Path, dtype: str) -> object:
    """``geo_sampling``'s ``Landsat8 & CDL``; ``dtype="native"`` keeps the files' integer dtypes (uint16, uint8)."""
    if dtype == "torchgeo":
        return gs.pipekit_dataset(root)
    from pipekit import datasets

    landsat = datasets.Landsat8(root=str(root / "landsat8"), bands=datasets.Landsat8.all_bands[1:-2], dtype=dtype)
    return landsat & datasets.CDL(root=str(root / "cdl"), dtype=dtype)


def run(
    root: Path,
    workers: int,
    length: int,
    passes: int,
    batch_size: int,
    cachemax: int,
    profile: bool,
    dtype: str = "torchgeo",
    pool: str = "on",
    sharing: str = "file_descriptor",
    synthetic: bool = False,
    main_threads: int = 0,
) -> None:
    from pipekit import _shm as shm

    torch.set_num_threads(main_threads or DEFAULT_THREADS)  # the main process's intra-op threads

    os.environ[shm.ENV_VAR] = "1" if pool == "on" else "0"  # workers inherit it
    torch.multiprocessing.set_sharing_strategy(sharing)
    gs.configure_gdal(cachemax)
    from pipekit.geo import RandomGeoSampler, stack_samples

    if synthetic:
        ds = ReadySamples(dtype)
        sampler = range(length)
    else:
        ds = dataset(root, dtype)
        sampler = RandomGeoSampler(ds, size=gs.PATCH, length=length, seed=0)  # fresh boxes every pass
    # Persistent workers, as in geo_sampling: their GDAL and warp caches stay warm from pass to pass.
    loader = DataLoader(
        ds,
        batch_size=batch_size,
        sampler=sampler,
        collate_fn=stack_samples,
        num_workers=workers,
        persistent_workers=workers > 0,
        worker_init_fn=_profile_worker if profile and workers else None,
    )
    for p in range(passes):
        start, cpu0 = time.perf_counter(), time.process_time()
        it = iter(loader)
        pids = [w.pid for w in getattr(it, "_workers", [])]
        worker_cpu0 = gs.cpu_seconds(pids) if pids else 0.0  # persistent workers: their CPU time so far
        n, worker_cpu = 0, 0.0
        for batch in it:
            n += batch["image"].shape[0]
            if pids and n > length - batch_size:  # the workers are still alive: read their CPU time now
                worker_cpu = gs.cpu_seconds(pids) - worker_cpu0
        wall, main_cpu = time.perf_counter() - start, time.process_time() - cpu0
        del it
        if p == 0:
            print(f"  batch: image {batch['image'].dtype} {list(batch['image'].shape)}, mask {batch['mask'].dtype}")
        label = f"{workers} worker(s)" + (f", pool {pool}, {sharing}" if workers else "")
        label += f", {torch.get_num_threads()} main torch thread(s)" if not workers else ""
        print(
            f"  pass {p + 1}, {label}: {n / wall:7.1f} samples/s; CPU ms/sample: main "
            f"{1e3 * main_cpu / n:.2f}, workers {1e3 * worker_cpu / n:.2f}, total "
            f"{1e3 * (main_cpu + worker_cpu) / n:.2f}",
            flush=True,
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    p.add_argument("--length", type=int, default=400, help="samples per pass")
    p.add_argument("--passes", type=int, default=3, help="passes (fresh boxes each; the first warms the caches)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--cachemax", type=int, default=512, help="GDAL_CACHEMAX in MiB")
    p.add_argument("--size", type=int, default=3000, help="Landsat scene side in pixels (geo_sampling's corpus)")
    p.add_argument("--scenes", type=int, default=2)
    p.add_argument("--profile", action="store_true", help="cProfile inside the workers")
    p.add_argument(
        "--pool",
        nargs="+",
        default=["on"],
        choices=["on", "off"],
        help="reuse of shared-memory batch buffers in workers (pipekit._shm): on, off or both",
    )
    p.add_argument(
        "--sharing",
        nargs="+",
        default=["file_descriptor"],
        choices=["file_descriptor", "file_system"],
        help="torch.multiprocessing sharing strategies to run (default file_descriptor, torch's)",
    )
    p.add_argument("--rounds", type=int, default=1, help="run the configurations this many times, interleaved")
    p.add_argument(
        "--dtype",
        default="torchgeo",
        choices=["torchgeo", "native"],
        help="sample dtypes: TorchGeo's (float32 image, int64 mask; the default) or the files' own",
    )
    p.add_argument(
        "--synthetic",
        action="store_true",
        help="samples of the same shapes ready in memory instead of read: the batch hand-over cost alone",
    )
    p.add_argument(
        "--main-threads",
        type=int,
        nargs="+",
        default=[0],
        help="with 0 workers: torch intra-op threads of the process (0: torch's default; workers always use 1)",
    )
    p.add_argument("--cache", default=None, help="corpus cache folder (default: pipekit's)")
    args = p.parse_args()
    from pipekit.synthetic import default_cache_dir
    from pipekit.synthetic.geo import write_landsat_cdl_corpus

    cache = Path(args.cache) if args.cache else default_cache_dir()
    root = write_landsat_cdl_corpus(
        cache / f"bench-geo-landsat-cdl-{args.size}x{args.scenes}", size=args.size, scenes=args.scenes, progress=False
    )
    print(f"# geo_worker_cpu: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; {root}")
    configs = [
        (w, pool, sharing, threads)
        for w in args.workers
        for pool in (args.pool if w else ["on"])
        for sharing in (args.sharing if w else ["file_descriptor"])
        for threads in (args.main_threads if not w else [0])
    ]
    for workers, pool, sharing, threads in configs * args.rounds:
        with tempfile.TemporaryDirectory() as tmp:
            global PROFILE_DIR
            PROFILE_DIR = os.environ["GEO_WORKER_CPU_PROFILE_DIR"] = tmp  # workers inherit it (fork or spawn)
            run(
                root,
                workers,
                args.length,
                args.passes,
                args.batch_size,
                args.cachemax,
                args.profile,
                args.dtype,
                pool,
                sharing,
                args.synthetic,
                threads,
            )
            prof = Path(tmp) / "worker0.prof"
            if args.profile and prof.exists():
                pstats.Stats(str(prof)).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
