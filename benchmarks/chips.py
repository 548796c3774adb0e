"""Chip classification: EuroSAT-like 13-band GeoTIFF chips -- pipekit vs TorchGeo 0.8's NonGeoClassificationDataset.

What is measured: samples/s of one pass over ``--chips`` EuroSAT-like chips
(13 bands, 64 x 64 px, uint16 GeoTIFFs in class folders, written to a temporary
folder), batch size 64, with 0 and 2 DataLoader workers, for:

* **pipekit map-style**: ``pipekit.datasets.NonGeoClassificationDataset`` in a
  ``torch.utils.data.DataLoader``;
* **pipekit pipe**: the same dataset's ``.pipe(train=True)`` (shuffled, resumable)
  in ``pipekit.DataLoader``;
* **TorchGeo 0.8**: ``torchgeo.datasets.NonGeoClassificationDataset`` with
  ``loader=rasterio_loader`` (what TorchGeo's ``EuroSAT`` uses) in a
  ``torch.utils.data.DataLoader`` (skipped when TorchGeo is not installed).

Every contender yields float32 ``[64, 13, 64, 64]`` images and int64 labels;
the first sample of each is checked to be the same.  Each configuration
runs twice, alternating, and the better pass is reported, as samples/s and as
CPU milliseconds per sample (the process and its workers: steadier than wall
time on a loaded machine).

Run: ``PYTHONPATH=src python benchmarks/chips.py`` in the ``bench`` environment
(``--chips 1500``, about a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time

import numpy as np
import rasterio
import torch
from rasterio.transform import from_origin

import pipekit
from pipekit.datasets import NonGeoClassificationDataset

CLASSES = ["AnnualCrop", "Forest", "HerbaceousVegetation", "Highway", "Industrial", "Pasture", "PermanentCrop",
           "Residential", "River", "SeaLake"]


def write_chips(root: str, n: int) -> None:
    rng = np.random.default_rng(0)
    profile = dict(driver="GTiff", width=64, height=64, count=13, dtype="uint16", crs="EPSG:32631",
                   transform=from_origin(500000, 5000000, 10, 10))
    for i in range(n):
        name = CLASSES[i % len(CLASSES)]
        os.makedirs(os.path.join(root, name), exist_ok=True)
        with rasterio.open(os.path.join(root, name, f"{name}_{i // len(CLASSES) + 1}.tif"), "w", **profile) as f:
            f.write(rng.integers(0, 4000, (13, 64, 64), dtype=np.uint16))


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _pass(loader) -> tuple[float, float, int]:
    """(samples/s, CPU ms per sample of the process and its reaped workers, samples)."""
    start, cpu = time.perf_counter(), _cpu()
    it = iter(loader)
    n = sum(len(b["label"]) for b in it)
    del it  # workers exit and are reaped: their CPU time is counted
    wall = time.perf_counter() - start
    return n / wall, (_cpu() - cpu) / n * 1e3, n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chips", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="chips-bench-")
    write_chips(root, args.chips)
    try:
        import torchgeo.datasets as tg
        from torchgeo.datasets.utils import rasterio_loader
    except ImportError:
        tg = None
        print("TorchGeo not installed: its column is skipped")

    ours = NonGeoClassificationDataset(root)
    contenders = {
        "pipekit map-style": lambda w: torch.utils.data.DataLoader(ours, batch_size=args.batch_size, num_workers=w),
        "pipekit pipe": lambda w: pipekit.DataLoader(ours.pipe(train=True, batch_size=args.batch_size),
                                                     num_workers=w),
    }
    if tg is not None:
        theirs = tg.NonGeoClassificationDataset(root, loader=rasterio_loader)
        a, b = ours[0], theirs[0]
        assert torch.equal(a["image"], b["image"]) and a["label"] == b["label"], "different samples"
        assert a["image"].dtype == b["image"].dtype and a["label"].dtype == b["label"].dtype
        contenders["TorchGeo 0.8"] = lambda w: torch.utils.data.DataLoader(theirs, batch_size=args.batch_size,
                                                                           num_workers=w)
    print(f"{args.chips} chips of 13 x 64 x 64 uint16, batch {args.batch_size}; samples/s (best of 2 passes)")
    for workers in (0, 2):
        best: dict[str, float] = {}
        cpu: dict[str, float] = {}
        for _ in range(2):
            for name, make in contenders.items():
                rate, ms, n = _pass(make(workers))
                assert n == args.chips, (name, n)
                best[name] = max(best.get(name, 0.0), rate)
                cpu[name] = min(cpu.get(name, float("inf")), ms)
        cells = ", ".join(f"{k}: {v:.0f}/s ({cpu[k]:.2f} CPU ms)" for k, v in best.items())
        line = f"workers={workers}: {cells}"
        if "TorchGeo 0.8" in best:
            line += (f"; pipekit/TorchGeo map-style {best['pipekit map-style'] / best['TorchGeo 0.8']:.2f}x,"
                     f" pipe {best['pipekit pipe'] / best['TorchGeo 0.8']:.2f}x")
        print(line, flush=True)


if __name__ == "__main__":
    main()
