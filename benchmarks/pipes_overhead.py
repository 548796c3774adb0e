"""Pipeline overhead: a pipekit chain against a plain Dataset + DataLoader doing the same work.

Both sides read the same JPEG files, decode them with torchvision, resize them to
a fixed size, shuffle, and batch them; only the plumbing differs:

(a) a hand-written map-style ``Dataset`` in ``torch.utils.data.DataLoader``
    (``shuffle=True, batch_size=B``);
(b) ``list_files_by_fsspec -> shuffle -> sharding_filter -> open_files_by_fsspec
    -> decode_image -> map(resize) -> batch -> collate`` in ``pipekit.DataLoader``.

with 0 and 2 workers, side by side in one run, printing samples/s, the ratio
b/a (target: pipekit >= 0.98x the plain loader) and the CPU time per sample of
each (the loader's process and its workers, read from ``/proc``), which moves
less than wall time when the machine is shared.  Then the plumbing alone: CPU
µs per item of a 5-pipe chain of ints.  Then JPEG decoding alone:
pipekit's ``decode_image`` against the plain side's ``torchvision.io.decode_image``
call and against PIL (``Image.open(...).convert("RGB")`` to a tensor), which is
what most hand-written datasets use.

One difference in the work: pipekit's ``decode_image`` applies the EXIF
orientation of each JPEG (``apply_exif_orientation=True``), the plain side's
``decode_image`` call does not (torchvision's default).  The synthetic JPEGs
have no EXIF block, so both give the same tensors; parsing for the tag costs
about 2 µs a JPEG (measured in ``benchmarks/README.md``, issue 12 section).

Run: ``./run bench pipes_overhead`` (``--help`` for options).
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader as TorchDataLoader
from torch.utils.data import Dataset
from torchvision.io import decode_image as tv_decode_image
from torchvision.transforms.v2 import functional as F

import pipekit
from pipekit.pipes import IterableWrapper
from pipekit.synthetic import CLASSES, default_cache_dir, write_image_folder


def resize(image: torch.Tensor, size: int) -> torch.Tensor:
    return F.resize(image, [size, size], antialias=True)


class PlainFolder(Dataset):
    """What a user writes by hand: a list of files, read + decode + resize in __getitem__.

    ``size=None`` (``--read-only``): read the file and return its length, no decoding.
    """

    def __init__(self, files: list[str], size: int | None) -> None:
        self.files = files
        self.size = size
        self.index = {name: i for i, name in enumerate(CLASSES)}

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        path = self.files[i]
        with open(path, "rb") as f:
            raw = f.read()
        label = self.index[Path(path).parent.name]
        if self.size is None:
            return len(raw), label
        image = tv_decode_image(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
        return resize(image, self.size), label


class ResizeAndLabel:
    def __init__(self, size: int) -> None:
        self.size = size
        self.index = {name: i for i, name in enumerate(CLASSES)}

    def __call__(self, item):
        url, image = item
        return resize(image, self.size), self.index[Path(url).parent.name]


class ReadAndLabel:
    """``--read-only``: what ``PlainFolder(size=None)`` returns, from ``(url, stream)``."""

    def __init__(self) -> None:
        self.index = {name: i for i, name in enumerate(CLASSES)}

    def __call__(self, item):
        url, stream = item
        raw = stream.read()
        stream.close()
        return len(raw), self.index[Path(url).parent.name]


def plain_loader(files, size, batch, workers):
    return TorchDataLoader(
        PlainFolder(files, size), batch_size=batch, shuffle=True, num_workers=workers, persistent_workers=workers > 0
    )


def pipekit_loader(root, size, batch, workers):
    pipe = (
        IterableWrapper([str(root)])
        .list_files_by_fsspec(masks="*.jpg", recursive=True)
        .shuffle()
        .sharding_filter()
        .open_files_by_fsspec(mode="rb")
    )
    pipe = pipe.map(ReadAndLabel()) if size is None else pipe.decode_image().map(ResizeAndLabel(size))
    return pipekit.DataLoader(pipe.batch(batch).collate(), num_workers=workers)


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _process_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process has used, from ``/proc`` (0 where there is no ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def _workers_cpu(loader) -> float:
    workers = getattr(getattr(loader, "_iterator", None), "_workers", None) or []
    return sum(_process_cpu(w.pid) for w in workers)


def epoch_rate(loader) -> tuple[float, float]:
    """Samples/s of one epoch, and CPU µs per sample: this process's plus its (persistent) workers'."""
    n = 0
    workers0 = _workers_cpu(loader)
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    for _, labels in loader:
        n += len(labels)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0 + _workers_cpu(loader) - workers0
    return n / wall, cpu / n * 1e6


def compare(plain, ours, epochs: int) -> tuple[float, float, float, float]:
    """Median samples/s and CPU µs/sample of each loader, measuring their epochs alternately (ABAB).

    Alternating lets drift in the machine's load hit both.  CPU time counts the
    workers' (from ``/proc``, clock ticks of 10 ms: epochs of a few hundred ms
    are coarse, the median over epochs steadies them) and is steadier than wall
    time on a shared machine.
    """
    for loader in (plain, ours):  # warm-up epoch: worker start-up, page cache
        for _ in loader:
            pass
    a, b = [], []
    for _ in range(epochs):
        a.append(epoch_rate(plain))
        b.append(epoch_rate(ours))
    return (
        statistics.median(r for r, _ in a),
        statistics.median(r for r, _ in b),
        statistics.median(c for _, c in a),
        statistics.median(c for _, c in b),
    )


def decode_rates(files: list[str], repeats: int) -> tuple[float, float, float]:
    """Images/s of pipekit's ``decode_image``, the plain side's torchvision call, and PIL (median of ``repeats``)."""
    blobs = [Path(f).read_bytes() for f in files]

    def with_pipekit() -> None:
        items = [(f, io.BytesIO(b)) for f, b in zip(files, blobs)]  # fresh streams: no deep copy needed
        for _ in IterableWrapper(items, deepcopy=False).decode_image(mode="RGB"):
            pass

    def with_torchvision() -> None:  # what PlainFolder.__getitem__ calls
        for b in blobs:
            tv_decode_image(torch.frombuffer(bytearray(b), dtype=torch.uint8))

    def with_pil() -> None:
        for b in blobs:
            torch.from_numpy(np.asarray(Image.open(io.BytesIO(b)).convert("RGB"))).permute(2, 0, 1)

    fns = (with_pipekit, with_torchvision, with_pil)
    times: list[list[float]] = [[] for _ in fns]
    for fn in fns:
        fn()
    for _ in range(repeats):  # alternated, so that drift in the machine's load hits all three
        for fn, out in zip(fns, times):
            t0 = time.process_time()
            fn()
            out.append(time.process_time() - t0)
    pk, tv, pil = (len(blobs) / statistics.median(t) for t in times)
    return pk, tv, pil


def chain_cost(items: int = 100_000, repeats: int = 3) -> float:
    """CPU µs per item of the plumbing alone: ``IterableWrapper -> shuffle -> sharding_filter -> map -> batch(32)``.

    Through ``pipekit.DataLoader`` with 0 workers, items are ints and the map is
    ``abs``: what is left is what the five pipes and the loader cost per item.
    Best of ``repeats`` epochs, in process CPU time (steadier than wall time on a
    shared machine).
    """
    pipe = IterableWrapper(range(items)).shuffle().sharding_filter().map(abs).batch(32)
    loader = pipekit.DataLoader(pipe)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        for _ in loader:
            pass
        best = min(best, time.process_time() - t0)
    return best / items * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-class", type=int, default=150, help="images per class (4 classes)")
    parser.add_argument("--source-size", type=int, default=256, help="side of the JPEGs written (about)")
    parser.add_argument("--size", type=int, default=128, help="output side in pixels")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=5, help="timed epochs per configuration (median)")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument(
        "--read-only",
        action="store_true",
        help="both sides read the files but do not decode them: the plumbing's cost per sample, unmasked",
    )
    args = parser.parse_args()

    torch.set_num_threads(1)
    name = f"bench-images-{args.per_class}" + ("" if args.source_size == 256 else f"-{args.source_size}")
    root = write_image_folder(default_cache_dir() / name, per_class=args.per_class, size=args.source_size)
    files = sorted(str(p) for p in root.rglob("*.jpg"))
    size = None if args.read_only else args.size
    work = "read only, no decoding" if args.read_only else f"resize to {args.size}"
    print(f"# pipes_overhead: {len(files)} JPEGs (~{args.source_size} px), {work}, batch {args.batch}")
    print(
        f"# machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch thread(s), "
        f"torch {torch.__version__}, python {platform.python_version()}"
    )
    header = (
        "workers",
        "plain DataLoader",
        "pipekit",
        "pipekit/plain",
        "overhead/sample",
        "CPU/sample plain",
        "pipekit",
        "CPU overhead",
    )
    widths = (7, 17, 12, 13, 15, 16, 9, 12)
    print(" | ".join(f"{h:>{w}}" for h, w in zip(header, widths)))
    for workers in args.workers:
        plain, ours, plain_cpu, ours_cpu = compare(
            plain_loader(files, size, args.batch, workers),
            pipekit_loader(root, size, args.batch, workers),
            args.epochs,
        )
        overhead_us = (1 / ours - 1 / plain) * 1e6 * max(workers, 1)
        print(
            f"{workers:>7} | {plain:>11.1f} smp/s | {ours:>6.1f} smp/s | {ours / plain:>13.3f} | "
            f"{overhead_us:>12.0f} us | {plain_cpu:>13.0f} us | {ours_cpu:>6.0f} us | {ours_cpu - plain_cpu:>9.0f} us"
        )
    print(f"5-pipe chain (shuffle, sharding_filter, map, batch) in pipekit.DataLoader: {chain_cost():.1f} µs CPU/item")
    if args.read_only:
        return
    pk, tv, pil = decode_rates(files, args.epochs)
    print(
        f"JPEG decode (CPU time): pipekit decode_image {pk:.1f} img/s ({1e6 / pk:.0f} us), torchvision "
        f"decode_image as the plain side calls it {tv:.1f} img/s ({1e6 / tv:.0f} us, no EXIF orientation), "
        f"PIL {pil:.1f} img/s; pipekit/torchvision {pk / tv:.3f}x, pipekit/PIL {pk / pil:.2f}x"
    )


if __name__ == "__main__":
    main()
