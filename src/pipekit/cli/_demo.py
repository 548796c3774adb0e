"""``pipekit demo``: train a small segmentation model on a synthetic Landsat 8 + CDL corpus.

On first run the corpus is written to the cache folder (Landsat 8 Collection 2
Level-2 band files in UTM 15N, a CDL raster in CONUS Albers; tiled, compressed,
with real product file names).  Then :class:`pipekit.datasets.GeoSegmentation`
samples patches of ``Landsat8 & CDL`` (the CDL reprojected on the fly), appends
NDVI, augments, and batches them in ``pipekit.DataLoader`` workers;
:class:`pipekit.device.DeviceLoader` moves each batch to the device and
normalises it there (overlapping the copy with compute on CUDA); a tiny
U-Net learns the CDL classes from the bands.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from pipekit.cli._common import CliError, default_cache, non_negative_int, positive_int

__all__ = ["add_parser", "run", "TinyUNet", "DEMO_CLASSES"]

#: The CDL classes the demo learns (0: background), as in the synthetic corpus.
DEMO_CLASSES = [0, 1, 5, 24, 111, 122, 141, 176]
CORPUS = "landsat-cdl-v1"


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="train a small segmentation model on a synthetic Landsat 8 + CDL corpus",
        description=(
            "Writes a synthetic Landsat 8 + Cropland Data Layer corpus to the cache folder on first run (a few "
            "seconds), then trains a tiny U-Net to map the CDL classes from Landsat bands and NDVI: patches of "
            "'Landsat8 & CDL' are sampled, reprojected, augmented and batched by pipekit pipes in DataLoader "
            "workers, and moved to the device (GPU when there is one) by pipekit.device.DeviceLoader.  Prints "
            "the loss falling and the samples per second.  Needs no network and no data of yours."
        ),
    )
    p.add_argument("--steps", type=positive_int, default=60, help="training steps (default 60)")
    p.add_argument("--workers", type=non_negative_int, default=2, help="DataLoader workers (default 2)")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None,
                   help="where the model trains (default: cuda when available, else cpu)")
    p.add_argument("--size", type=positive_int, default=None,
                   help="patch side in pixels, a multiple of 4 (default 256 on CUDA, 64 on the CPU)")
    p.add_argument("--batch-size", type=positive_int, default=16, help="patches per batch (default 16)")
    p.add_argument("--lr", type=float, default=0.01, help="learning rate (default 0.01)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="random seed (default 0)")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch threads of the training process on the CPU (default: the cores the workers leave)")
    p.add_argument("--cache", type=Path, default=None,
                   help="where the corpus is written (default: $PIPEKIT_CACHE or ~/.cache/pipekit)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def _block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
    )


class TinyUNet(nn.Module):
    """A two-level U-Net: enough to learn land cover classes from spectra and a little context.

    Example:
        >>> import torch
        >>> from pipekit.cli._demo import TinyUNet
        >>> TinyUNet(7, 8)(torch.zeros(2, 7, 32, 32)).shape
        torch.Size([2, 8, 32, 32])
    """

    def __init__(self, in_channels: int, num_classes: int, width: int = 16) -> None:
        super().__init__()
        w = width
        self.enc1, self.enc2, self.mid = _block(in_channels, w), _block(w, 2 * w), _block(2 * w, 4 * w)
        self.up2, self.dec2 = nn.ConvTranspose2d(4 * w, 2 * w, 2, stride=2), _block(4 * w, 2 * w)
        self.up1, self.dec1 = nn.ConvTranspose2d(2 * w, w, 2, stride=2), _block(2 * w, w)
        self.head = nn.Conv2d(w, num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        m = self.mid(F.max_pool2d(e2, 2))
        d2 = self.dec2(torch.cat([self.up2(m), e2], dim=1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], dim=1))
        return self.head(d1)


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _chain(pipe: Any) -> str:
    from pipekit.pipes._resume import pipeline_pipes
    from pipekit.profiling import stage_name

    return " -> ".join(stage_name(dp) for dp in reversed(pipeline_pipes(pipe)))


def run(args: argparse.Namespace) -> int:
    if args.size is not None and args.size % 4:
        raise CliError(f"--size must be a multiple of 4 (the U-Net halves it twice), got {args.size}")
    if not (args.lr > 0):
        raise CliError(f"--lr must be positive, got {args.lr}")
    device_name = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device_name == "cuda" and not torch.cuda.is_available():
        raise CliError("--device cuda was given but no CUDA device is available")
    device = torch.device(device_name)
    size = args.size or (256 if device.type == "cuda" else 64)
    progress = not args.no_progress
    threads = torch.get_num_threads()
    try:
        return _train(args, device, size, progress)
    finally:
        torch.set_num_threads(threads)


def _train(args: argparse.Namespace, device: torch.device, size: int, progress: bool) -> int:
    from tqdm import tqdm

    import pipekit
    from pipekit import datasets
    from pipekit.device import DeviceLoader
    from pipekit.synthetic.geo import write_landsat_cdl_corpus
    from pipekit.transforms import compute_stats

    torch.manual_seed(args.seed)
    if device.type == "cpu":
        # The workers decode on the same cores: a main process with as many torch threads as cores
        # spins its threads against them (several times slower than one thread fewer).
        torch.set_num_threads(args.threads or max(1, _cpu_count() - args.workers))

    root = write_landsat_cdl_corpus(default_cache(args.cache) / CORPUS, progress=progress)
    bands = list(datasets.Landsat8.all_bands[1:-2])  # SR_B2..SR_B7: blue, green, red, NIR, SWIR 1, SWIR 2
    images = datasets.Landsat8(root / "landsat8", bands=bands)
    labels = datasets.CDL(root / "cdl", classes=DEMO_CLASSES)
    try:
        recipe = datasets.GeoSegmentation(images, labels, size=size, batch_size=args.batch_size,
                                          indices=("ndvi",), augment=True)
    except ValueError as exc:  # e.g. a patch larger than the scenes
        raise CliError(f"cannot sample {size}x{size} patches: {exc}") from exc
    # per-channel statistics from a few patches; DeviceLoader normalises with them on the device
    probe = datasets.GeoSegmentation(images, labels, size=size, length=32, batch_size=None, augment=False)
    stats = compute_stats(probe, num_samples=32, progress=False)

    names = ", ".join(recipe.class_names[1:])
    print(f"pipekit demo: synthetic Landsat 8 & CDL corpus in {root}")
    print(f"  pipeline: {_chain(recipe.pipe)}")
    print(f"  data:     {images.name} ({', '.join(bands)}) & {labels.name} reprojected from "
          f"EPSG:{labels.crs.to_epsg()} to EPSG:{images.crs.to_epsg()}; {len(recipe.sampler)} patches of "
          f"{size}x{size} an epoch; channels {', '.join(recipe.bands)}")
    threads = f", {torch.get_num_threads()} torch thread(s) here" if device.type == "cpu" else ""
    print(f"  loader:   pipekit.DataLoader({args.workers} workers) -> DeviceLoader({device}, normalize on the device)"
          f"{threads}")

    model = TinyUNet(recipe.in_channels, recipe.num_classes).to(device, memory_format=torch.channels_last)
    params = sum(p.numel() for p in model.parameters())
    print(f"  model:    TinyUNet, {recipe.in_channels} channels -> {recipe.num_classes} classes "
          f"(background + {names}), {params:,} parameters, on {device}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    loader = pipekit.DataLoader(recipe, num_workers=args.workers)
    batches = DeviceLoader(loader, device, normalize=(stats.mean, stats.std))
    losses: list[float] = []
    correct = total = 0
    samples = 0
    start = None
    step = 0
    bar = tqdm(total=args.steps, desc="training", unit="step", disable=not progress, leave=False)
    model.train()
    try:
        while step < args.steps:
            got = False
            for batch in batches:
                got = True
                image, mask = batch["image"], batch["mask"]
                logits = model(image)
                loss = F.cross_entropy(logits, mask, ignore_index=0)  # 0: background / unlisted classes
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                value = float(loss.item())
                losses.append(value)
                step += 1
                if step == 1:
                    tqdm.write(f"step 1: loss {value:.3f}")
                    start = time.perf_counter()  # the rate leaves out worker start-up and the first batch
                else:
                    samples += int(mask.shape[0])
                if step > args.steps - 5:
                    with torch.no_grad():
                        labelled = mask > 0
                        correct += int(((logits.argmax(dim=1) == mask) & labelled).sum())
                        total += int(labelled.sum())
                bar.update()
                if start is not None and step > 1:
                    rate = samples / max(time.perf_counter() - start, 1e-9)
                    bar.set_postfix(loss=f"{value:.3f}", samples_s=f"{rate:.0f}")
                if step >= args.steps:
                    break
            if not got:
                raise CliError("the pipeline yielded no batches")
    finally:
        bar.close()
    elapsed = time.perf_counter() - start if start is not None else 0.0
    last = losses[-min(5, len(losses)):]
    final = sum(last) / len(last)
    print(f"step {step}: loss {losses[-1]:.3f} (mean of the last {len(last)} steps: {final:.3f})")
    if len(losses) > 1:
        verdict = "fell" if final < losses[0] else "did not fall"
        print(f"loss {verdict} from {losses[0]:.3f} to {final:.3f}"
              + (f"; pixel accuracy on the last {min(5, step)} batches: {100 * correct / total:.1f}%" if total else ""))
    if samples and elapsed > 0:
        print(f"throughput: {samples / elapsed:.1f} samples/s ({samples} samples of {recipe.in_channels}x{size}x"
              f"{size} in {elapsed:.1f} s, {args.workers} workers, {device})")
    return 0
