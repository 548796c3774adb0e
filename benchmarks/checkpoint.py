"""A mid-epoch checkpoint of a pipeline with a large shuffle buffer of encoded images: its size, time and memory.

The pipeline is Getting started's, with the shuffle buffer before decoding as
torchdata's idiom has it: tar shards of JPEGs -> ``list_files`` -> ``shuffle``
(shard order) -> ``sharding_filter`` -> ``open_files_by_fsspec`` ->
``load_from_tar`` -> ``webdataset`` -> ``shuffle(buffer)`` -> ``decode`` ->
``batch`` -> ``collate``, in :class:`pipekit.DataLoader` with 0 and 2 workers.
Each configuration runs in a process of its own (so its peak memory is its
own): it reads until every shuffle buffer is full and half the epoch is
through, then times ``state_dict()`` and ``torch.save`` (to a file), and a new
loader's ``load_state_dict()`` up to its first batch.

Reported per configuration:

* the checkpoint's size (``torch.save``'d bytes) and its ratio to the JPEG
  bytes the shuffle buffers hold;
* the time of ``state_dict()`` + ``torch.save``;
* the peak resident memory of the process and its workers together (sampled
  every 5 ms from ``/proc``), before the checkpoint (reading) and while it is
  taken, and their ratio;
* the time from ``load_state_dict()`` of a new loader to its first batch
  (the resume), and the time of a batch in steady reading, for scale.

Run: ``PYTHONPATH=src python benchmarks/checkpoint.py`` (``--quick`` for a
short run, ``--full`` for a buffer near the issue's 900 MB, ``--help`` for
options).  Shards are written once under the synthetic data cache.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

import pipekit
from pipekit.pipes import IterableWrapper
from pipekit.synthetic import default_cache_dir, write_image_shards

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss(pid: int) -> int:
    """Resident bytes of ``pid`` (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


class PeakMemory:
    """Samples the resident memory of this process plus its children (DataLoader workers) every 5 ms."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        me = os.getpid()
        while not self._stop.wait(0.005):
            total = rss(me) + sum(rss(c) for c in children(me))
            self.peak = max(self.peak, total)

    def reset(self) -> int:
        """The peak since the last reset, and start a new one."""
        peak, self.peak = self.peak, 0
        return peak

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def sample_tuple(sample: dict[str, Any]) -> tuple[torch.Tensor, int]:
    return sample[".jpg"], sample[".cls"]


def build(root: str, buffer_size: int, batch: int) -> Any:
    return (
        IterableWrapper([root])
        .list_files_by_fsspec(masks="*.tar")
        .shuffle()
        .sharding_filter()
        .open_files_by_fsspec(mode="rb")
        .load_from_tar()
        .webdataset()
        .shuffle(buffer_size=buffer_size)
        .decode()
        .map(sample_tuple)
        .batch(batch)
        .collate()
    )


def one(args: argparse.Namespace) -> dict[str, Any]:
    """Run one configuration (in this process) and return its figures."""
    torch.set_num_threads(1)
    memory = PeakMemory()
    torch.manual_seed(0)
    kwargs: dict[str, Any] = {"num_workers": args.workers, "state_timeout": 600}
    if args.workers:
        kwargs["timeout"] = 600
    loader = pipekit.DataLoader(build(args.root, args.buffer, args.batch), **kwargs)
    it = iter(loader)
    take = args.take
    started = time.perf_counter()
    for _ in range(take):
        next(it)
    steady = time.perf_counter()
    for _ in range(5):
        next(it)
    batch_s = (time.perf_counter() - steady) / 5
    reading_peak = memory.reset()
    path = Path(args.scratch) / f"checkpoint-{args.workers}.pt"
    t0 = time.perf_counter()
    state = loader.state_dict()
    t1 = time.perf_counter()
    torch.save(state, path)
    t2 = time.perf_counter()
    checkpoint_peak = memory.reset()
    del state
    size = path.stat().st_size
    del it, loader
    torch.manual_seed(0)
    state = torch.load(path, weights_only=True)
    memory.reset()
    t3 = time.perf_counter()
    resumed = pipekit.DataLoader(build(args.root, args.buffer, args.batch), **kwargs)
    resumed.load_state_dict(state)
    del state
    next(iter(resumed))
    t4 = time.perf_counter()
    resume_peak = memory.reset()
    memory.stop()
    return {
        "workers": args.workers,
        "size": size,
        "state_dict_s": t1 - t0,
        "save_s": t2 - t1,
        "reading_peak": reading_peak,
        "checkpoint_peak": checkpoint_peak,
        "resume_s": t4 - t3,
        "resume_peak": resume_peak,
        "batch_s": batch_s,
        "read_s": steady - started,
    }


def _size(n: float) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a small buffer (1,000 images of 128 px)")
    parser.add_argument("--full", action="store_true", help="a buffer near the issue's 900 MB (slow, ~8 GB RAM)")
    parser.add_argument("--buffer", type=int, default=None, help="shuffle buffer size (samples)")
    parser.add_argument("--image-size", type=int, default=None, help="side of the JPEGs written")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # internal: one configuration
    parser.add_argument("--root", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--scratch", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--take", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    buffer, side = (1000, 128) if args.quick else (20000, 320) if args.full else (4000, 224)
    args.buffer = args.buffer or buffer
    args.image_size = args.image_size or side

    if args.one is not None:
        args.workers = args.one
        print(json.dumps(one(args)))
        return

    # Each worker's buffer must fill and the checkpoint come mid-epoch: 4 buffers' worth of samples per worker.
    samples = 4 * args.buffer * max(args.workers)
    shards = 8
    per_shard = -(-samples // shards)
    name = f"bench-ckpt-shards-{shards}x{per_shard}-{args.image_size}"
    root = write_image_shards(default_cache_dir() / name, shards=shards, per_shard=per_shard, size=args.image_size)
    jpeg_bytes = sum(p.stat().st_size for p in root) / (shards * per_shard)
    print(
        f"# checkpoint: {shards * per_shard} JPEGs of {args.image_size} px (~{jpeg_bytes / 1e3:.1f} kB each in the "
        f"tars), shuffle buffer {args.buffer}, batch {args.batch}"
    )
    print(
        f"# machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"python {platform.python_version()}, pipekit at {Path(pipekit.__file__).parent}"
    )
    header = ("workers", "checkpoint", "/buffer", "state_dict+save", "peak reading", "peak ckpt", "ckpt/reading",
              "resume", "batch")
    widths = (7, 10, 7, 15, 12, 9, 12, 7, 7)
    print(" | ".join(f"{h:>{w}}" for h, w in zip(header, widths, strict=True)))
    with tempfile.TemporaryDirectory() as scratch:
        for workers in args.workers:
            held = args.buffer * max(workers, 1) * jpeg_bytes  # the buffers' JPEG bytes (the .cls are tiny)
            per_worker = samples // max(workers, 1)
            take = (per_worker // 2) // args.batch * max(workers, 1)  # half an epoch, in batches
            cmd = [sys.executable, __file__, "--one", str(workers), "--root", str(root[0].parent),
                   "--scratch", scratch, "--take", str(take), "--buffer", str(args.buffer),
                   "--image-size", str(args.image_size), "--batch", str(args.batch)]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"workers={workers} failed:\n{done.stderr[-4000:]}")
            out = done.stdout
            r = json.loads(out.strip().splitlines()[-1])
            print(
                f"{workers:>7} | {_size(r['size']):>10} | {r['size'] / held:>7.3f} | "
                f"{r['state_dict_s'] + r['save_s']:>7.2f} s ({r['save_s']:.2f} save) | "
                f"{r['reading_peak'] / 2**20:>8.0f} MiB | {r['checkpoint_peak'] / 2**20:>5.0f} MiB | "
                f"{r['checkpoint_peak'] / r['reading_peak']:>12.2f} | {r['resume_s']:>5.2f} s | "
                f"{r['batch_s'] * 1e3:>4.0f} ms"
            )


if __name__ == "__main__":
    main()
