"""Stop a training run mid-epoch, resume it from a checkpoint, and check that no sample was repeated or lost.

What it shows:

* ``loader.state_dict()`` of a :class:`pipekit.DataLoader` saved with
  ``torch.save`` next to the model and optimizer states, and
  ``loader.load_state_dict()`` in a fresh process-like restart: every pipe of
  the pipeline (the shuffled file list, the sharding across workers, the
  augmentation's random stream, the partially filled batches) continues
  where it stopped, without re-reading what was already consumed;
* the check: the samples of the interrupted run plus those of the resumed run
  are exactly the samples of an uninterrupted run with the same seed, in the
  same order, with the same augmentations.

The run is the image-folder classifier of ``train_classifier.py`` on a small
synthetic data set (written to a cache folder), with 2 DataLoader workers.

    python examples/resume_from_checkpoint.py                   # stops after 5 batches, resumes
    python examples/resume_from_checkpoint.py --stop-after 12 --checkpoint /tmp/ckpt.pt
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

import pipekit
from pipekit import datasets
from pipekit.device import to_device
from pipekit.synthetic import default_cache_dir, write_image_folder


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="class-per-folder root; default: a synthetic data set")
    parser.add_argument("--per-class", type=int, default=24, help="synthetic images per class")
    parser.add_argument("--image-size", type=int, default=48)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--stop-after", type=int, default=5, help="batches before the simulated interruption")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--checkpoint", help="checkpoint file (default: in a temporary folder)")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def make_model(num_classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(32, num_classes),
    )


class Run:
    """Model, optimizer and loader of one run; ``step`` trains on one batch and records what it saw."""

    def __init__(self, root: str, args: argparse.Namespace) -> None:
        torch.manual_seed(args.seed)  # the loader's shuffling seed and the model's initialisation
        self.dataset = datasets.ImageFolder(root, train=True, size=args.image_size, batch_size=args.batch_size)
        self.loader = pipekit.DataLoader(self.dataset, num_workers=args.workers)
        self.model = make_model(len(self.dataset.classes))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.seen: list[str] = []
        self.images: list[torch.Tensor] = []

    def step(self, batch: dict) -> float:
        images = to_device(batch, "cpu", normalize=((0.5,) * 3, (0.25,) * 3), scale=255)["image"]
        loss = nn.functional.cross_entropy(self.model(images), batch["label"])
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.seen.extend(batch["url"])
        self.images.append(batch["image"])
        return loss.item()

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "loader": self.loader.state_dict(), "seen": list(self.seen)}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.loader.load_state_dict(state["loader"])
        self.seen = list(state["seen"])


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.data:
        root = args.data
    else:
        root = str(write_image_folder(default_cache_dir() / "examples" / f"resume-{args.per_class}",
                                      per_class=args.per_class, size=max(32, args.image_size * 5 // 4)))
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = Path(args.checkpoint or Path(tmp) / "checkpoint.pt")

        # 1. An uninterrupted epoch, for reference.
        reference = Run(root, args)
        for batch in reference.loader:
            reference.step(batch)
        total = len(reference.dataset.samples)
        print(f"{reference.dataset}\nuninterrupted epoch: {len(reference.seen)} samples "
              f"in {len(reference.images)} batches")
        if args.stop_after >= len(reference.images):
            raise SystemExit(f"--stop-after {args.stop_after} must be less than the {len(reference.images)} "
                             "batches of an epoch")

        # 2. The same run, interrupted after --stop-after batches: save a checkpoint and stop.
        first = Run(root, args)
        for i, batch in enumerate(first.loader, start=1):
            loss = first.step(batch)
            if i == args.stop_after:
                torch.save(first.state_dict(), checkpoint)
                print(f"interrupted after {i} batches ({len(first.seen)} samples, loss {loss:.3f}); "
                      f"checkpoint {checkpoint} ({checkpoint.stat().st_size // 1024} KiB)")
                break
        del first  # its workers and everything it held are gone, as after a crash

        # 3. A new run restores the checkpoint and finishes the epoch.
        resumed = Run(root, args)
        resumed.load_state_dict(torch.load(checkpoint, weights_only=True))
        before = len(resumed.seen)
        for batch in resumed.loader:
            resumed.step(batch)
        print(f"resumed: {len(resumed.seen) - before} more samples in {len(resumed.images)} batches")

    # 4. The check.
    repeated = len(resumed.seen) - len(set(resumed.seen))
    lost = len({u for u, _ in reference.dataset.samples} - set(resumed.seen))
    same_order = resumed.seen == reference.seen
    same_images = all(torch.equal(a, b) for a, b in zip(resumed.images, reference.images[args.stop_after:]))
    same_weights = all(torch.allclose(a, b, atol=1e-5) for a, b in
                       zip(resumed.model.state_dict().values(), reference.model.state_dict().values()))
    ok = repeated == 0 and lost == 0 and len(resumed.seen) == total and same_order and same_images
    print(f"check: {len(resumed.seen)} of {total} samples, {repeated} repeated, {lost} lost, "
          f"order {'identical' if same_order else 'DIFFERENT'} to the uninterrupted run, "
          f"augmentations {'identical' if same_images else 'DIFFERENT'}: {'PASSED' if ok else 'FAILED'}")
    print(f"model weights after the epoch: {'the same' if same_weights else 'different'} as the uninterrupted run's")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
