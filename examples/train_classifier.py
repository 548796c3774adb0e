"""Train a small image classifier from a class-per-folder image tree.

What it shows:

* ``pipekit.datasets.ImageFolder``: the folder listed once, files shuffled
  before they are read, split between DataLoader workers by
  ``sharding_filter``, decoded, cropped/flipped (training) or resized/centre-
  cropped (evaluation), batched as compact ``uint8`` tensors;
* ``pipekit.DataLoader``: multi-worker loading with pipekit's defaults;
* ``pipekit.device.DeviceLoader``: each ``uint8`` batch is copied to the
  device and converted, scaled and normalised there in one kernel, straight
  into ``channels_last`` (on a GPU the copy of batch n+1 overlaps the
  compute on batch n); on a CPU-only machine the same code runs on the CPU.

Without ``--data`` it writes a small synthetic data set (JPEGs of circles,
squares, triangles and stripes) to a cache folder and trains on that, so it
runs anywhere with no download.  Point ``--data`` at your own
``root/<class>/<image>`` tree (``root/train`` and ``root/val`` if both
exist, else ``root`` for both) or at an ``s3://`` URL.

    python examples/train_classifier.py                 # ~1 minute on a laptop CPU
    python examples/train_classifier.py --data ~/imagenette2-160 --image-size 128 --device cuda
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn

import pipekit
from pipekit import datasets
from pipekit.device import DeviceLoader
from pipekit.synthetic import default_cache_dir, write_image_folder

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="class-per-folder root (local or URL); default: a synthetic data set")
    parser.add_argument("--per-class", type=int, default=96,
                        help="synthetic images per class for training (a quarter as many for validation)")
    parser.add_argument("--image-size", type=int, default=64, help="side of the crops fed to the model")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--max-steps", type=int, default=None, help="stop each epoch after this many batches")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--min-scale", type=float, default=0.5,
                        help="RandomResizedCrop's smallest crop (fraction of the image area)")
    parser.add_argument("--trivial-augment", action="store_true", help="add TrivialAugmentWide")
    parser.add_argument("--seed", type=int, default=0)
    return parser


class SmallCNN(nn.Module):
    """Four conv blocks and a linear head: enough to tell the synthetic shapes apart."""

    def __init__(self, num_classes: int, width: int = 32) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for i in range(4):
            out = width * 2 ** min(i, 2)
            layers += [nn.Conv2d(channels, out, 3, padding=1, bias=False), nn.BatchNorm2d(out), nn.ReLU(inplace=True),
                       nn.MaxPool2d(2)]
            channels = out
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(2 * channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.features(x)
        # average and max pooling: a small shape anywhere in the image shows in the max
        return self.head(torch.cat([f.mean(dim=(2, 3)), f.amax(dim=(2, 3))], dim=1))


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {name}: CUDA is not available on this machine")
    return device


def data_roots(args: argparse.Namespace) -> tuple[str, str]:
    if args.data is None:
        base = default_cache_dir() / "examples" / f"shapes-{args.per_class}-{args.image_size}"
        size = max(32, args.image_size * 5 // 4)
        train = write_image_folder(base / "train", per_class=args.per_class, size=size, seed=0)
        val = write_image_folder(base / "val", per_class=max(1, args.per_class // 4), size=size, seed=1)
        return str(train), str(val)
    root = args.data.rstrip("/")
    if "://" not in root and (Path(root) / "train").is_dir() and (Path(root) / "val").is_dir():
        return os.path.join(root, "train"), os.path.join(root, "val")
    return root, root


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.manual_seed(args.seed)
    device = resolve_device(args.device)
    train_root, val_root = data_roots(args)

    train_set = datasets.ImageFolder(train_root, train=True, size=args.image_size, batch_size=args.batch_size,
                                     trivial_augment=args.trivial_augment, scale=(args.min_scale, 1.0), drop_last=True)
    val_set = datasets.ImageFolder(val_root, train=False, size=args.image_size, batch_size=args.batch_size)
    if val_set.classes != train_set.classes:
        raise SystemExit(f"train and val have different classes: {train_set.classes} vs {val_set.classes}")
    print(f"{train_set}\n{val_set}\ndevice: {device}")

    # The loaders yield uint8 batches; DeviceLoader normalises them on the device.
    normalize = (IMAGENET_MEAN, IMAGENET_STD)
    # uint8 images scaled to [0, 1] on the device, then normalised with ImageNet's statistics
    train_loader = DeviceLoader(
        pipekit.DataLoader(train_set, num_workers=args.workers), device, normalize=normalize, scale=255
    )
    val_loader = DeviceLoader(
        pipekit.DataLoader(val_set, num_workers=args.workers), device, normalize=normalize, scale=255
    )

    model = SmallCNN(len(train_set.classes)).to(device).to(memory_format=torch.channels_last)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
    loss_fn = nn.CrossEntropyLoss()

    accuracy = 0.0
    for epoch in range(1, args.epochs + 1):
        model.train()
        seen, total_loss, steps, start = 0, 0.0, 0, time.perf_counter()
        for batch in train_loader:
            images, labels = batch["image"], batch["label"].to(device)
            loss = loss_fn(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total_loss += loss.item()
            seen += len(labels)
            steps += 1
            if args.max_steps is not None and steps >= args.max_steps:
                break
        elapsed = time.perf_counter() - start
        schedule.step()

        model.eval()
        correct = count = 0
        with torch.no_grad():
            for batch in val_loader:
                predicted = model(batch["image"]).argmax(dim=1)
                correct += int((predicted == batch["label"].to(device)).sum())
                count += len(predicted)
        accuracy = correct / max(count, 1)
        print(f"epoch {epoch}: train loss {total_loss / max(steps, 1):.3f}, {seen / elapsed:.0f} samples/s, "
              f"val accuracy {accuracy:.1%} ({count} images)")
    print(f"final val accuracy: {accuracy:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
