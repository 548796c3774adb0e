"""Crop-type segmentation: Landsat 8 surface reflectance in, Cropland Data Layer classes out.

What it shows:

* the products: ``datasets.Landsat8`` (one GeoTIFF per band, UTM) and
  ``datasets.CDL`` (one raster per year, CONUS Albers), combined with
  ``datasets.GeoSegmentation(landsat, cdl, ...)``, which intersects them
  (the CDL is reprojected on the fly onto the Landsat grid), samples random
  patches for training and a grid for evaluation, appends NDVI
  (``(SR_B5 - SR_B4) / (SR_B5 + SR_B4)``) as a ninth channel, normalises
  every channel with statistics it computes and flips/rotates image and
  mask together; ``datasets.CDL(classes=...)`` maps the CDL codes to labels
  ``0..n-1`` (TorchGeo's ordinal labels);
* training and evaluation regions kept apart with ``roi=`` (west / east half);
* a tiny U-Net trained on ``pipekit.DataLoader`` batches, with
  ``pipekit.device.DeviceLoader`` moving them to the GPU when there is one.

Without ``--data`` it writes a synthetic corpus to a cache folder: Landsat 8
Collection 2 Level-2 scenes with real file names
(``LC08_L2SP_026031_20230715_20230725_02_T1_SR_B4.TIF``...) and a CDL
``2023_30m_cdls.tif``, drawn from one land cover so that a model can learn
one from the other.  Point ``--landsat`` and ``--cdl`` at real downloads to
train on those (any folder, glob or ``s3://`` URL).

    python examples/landsat_cdl_segmentation.py                  # ~1 minute on a CPU
    python examples/landsat_cdl_segmentation.py --landsat data/landsat --cdl data/cdl --device cuda --steps 2000
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from torch import nn
from torch.nn import functional as F

import pipekit
from pipekit import datasets
from pipekit.device import DeviceLoader
from pipekit.geo import BoundingBox
from pipekit.synthetic import default_cache_dir
from pipekit.synthetic.geo import CDL_CLASSES, write_landsat_cdl_corpus


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--landsat", help="Landsat 8 scenes (folder, glob or URL); default: the synthetic corpus")
    parser.add_argument("--cdl", help="CDL raster(s); default: the synthetic corpus")
    parser.add_argument("--scene-size", type=int, default=768, help="synthetic scene side in pixels (30 m)")
    parser.add_argument("--scenes", type=int, default=2, help="synthetic Landsat scenes")
    parser.add_argument("--patch", type=int, default=64, help="patch side in pixels")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=100, help="training steps")
    parser.add_argument("--eval-patches", type=int, default=64, help="evaluation patches (grid over the east half)")
    parser.add_argument("--log-every", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    return parser


def block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
    )


class TinyUNet(nn.Module):
    """A two-level U-Net: enough for per-pixel land cover from spectra and a little context."""

    def __init__(self, in_channels: int, num_classes: int, width: int = 16) -> None:
        super().__init__()
        self.enc1 = block(in_channels, width)
        self.enc2 = block(width, 2 * width)
        self.bottom = block(2 * width, 4 * width)
        self.up2 = nn.ConvTranspose2d(4 * width, 2 * width, 2, stride=2)
        self.dec2 = block(4 * width, 2 * width)
        self.up1 = nn.ConvTranspose2d(2 * width, width, 2, stride=2)
        self.dec1 = block(2 * width, width)
        self.head = nn.Conv2d(width, num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        b = self.bottom(F.max_pool2d(e2, 2))
        d2 = self.dec2(torch.cat([self.up2(b), e2], dim=1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], dim=1))
        return self.head(d1)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {name}: CUDA is not available on this machine")
    return device


def halves(bounds: BoundingBox, patch_extent: float) -> tuple[BoundingBox, BoundingBox]:
    """West and east halves of ``bounds``, each at least one patch wide."""
    mid = (bounds.minx + bounds.maxx) / 2
    mid = min(max(mid, bounds.minx + patch_extent), bounds.maxx - patch_extent)
    west = BoundingBox(bounds.minx, mid, bounds.miny, bounds.maxy, bounds.mint, bounds.maxt)
    east = BoundingBox(mid, bounds.maxx, bounds.miny, bounds.maxy, bounds.mint, bounds.maxt)
    return west, east


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.manual_seed(args.seed)
    device = resolve_device(args.device)
    classes = [0, *CDL_CLASSES]  # CDL codes, background first: every other code becomes label 0
    if args.landsat is None or args.cdl is None:
        root = write_landsat_cdl_corpus(
            default_cache_dir() / "examples" / f"landsat-cdl-{args.scene_size}-{args.scenes}",
            size=args.scene_size, scenes=args.scenes,
        )
        landsat_root, cdl_root = args.landsat or root / "landsat8", args.cdl or root / "cdl"
    else:
        landsat_root, cdl_root = args.landsat, args.cdl

    landsat = datasets.Landsat8(landsat_root)
    cdl = datasets.CDL(cdl_root, classes=classes)  # masks hold the labels 0..len(classes)-1
    both = landsat & cdl
    west, east = halves(both.bounds, args.patch * landsat.res[0])

    train = datasets.GeoSegmentation(landsat, cdl, size=args.patch, length=args.steps * args.batch_size,
                                     batch_size=args.batch_size, stats="auto", roi=west,
                                     drop_last=True)
    val = datasets.GeoSegmentation(landsat, cdl, size=args.patch, length=args.eval_patches,
                                   batch_size=args.batch_size, train=False, stats=train.stats,
                                   roi=east)
    print(f"{train}\n{val}\nclasses: {train.class_names}\ndevice: {device}")

    loader = DeviceLoader(pipekit.DataLoader(train, num_workers=args.workers), device, mask_dtype=torch.long)
    model = TinyUNet(train.in_channels, train.num_classes).to(device).to(memory_format=torch.channels_last)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=max(args.steps, 1))

    model.train()
    start, seen, running = time.perf_counter(), 0, []
    first_loss = last_loss = None
    for step, batch in enumerate(loader, start=1):
        loss = F.cross_entropy(model(batch["image"]), batch["mask"])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        seen += batch["image"].shape[0]
        running.append(loss.item())
        if step % args.log_every == 0 or step == args.steps:
            mean = sum(running) / len(running)
            first_loss = mean if first_loss is None else first_loss
            last_loss = mean
            rate = seen / (time.perf_counter() - start)
            print(f"step {step:5d}  loss {mean:.3f}  {rate:.0f} patches/s")
            running = []
        if step >= args.steps:
            break

    model.eval()
    n = train.num_classes
    confusion = torch.zeros(n, n, dtype=torch.long)
    with torch.no_grad():
        for batch in DeviceLoader(pipekit.DataLoader(val, num_workers=args.workers), device, mask_dtype=torch.long):
            predicted = model(batch["image"]).argmax(dim=1)
            pairs = batch["mask"].flatten() * n + predicted.flatten()
            confusion += torch.bincount(pairs.cpu(), minlength=n * n).reshape(n, n)
    accuracy = confusion.diag().sum() / confusion.sum().clamp(min=1)
    present = confusion.sum(dim=1) > 0
    iou = confusion.diag() / (confusion.sum(0) + confusion.sum(1) - confusion.diag()).clamp(min=1)
    print(f"eval on the east half: pixel accuracy {accuracy:.1%}, mean IoU {iou[present].mean():.1%} "
          f"over {int(present.sum())} classes present")
    if first_loss is not None and last_loss is not None:
        print(f"loss {first_loss:.3f} -> {last_loss:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
