"""Crop-type segmentation with PyTorch Lightning: a LightningModule over pipekit's LandsatCDLDataModule.

What it shows:

* ``pipekit.datamodules.LandsatCDLDataModule``: Landsat 8 & CDL patches,
  split by region (seeded blocks: no pixel in two splits), normalised with
  its stored statistics and flipped/rotated on the device;
* a small segmentation ``LightningModule`` written here (pipekit ships no
  models or trainers: use TorchGeo's ``SemanticSegmentationTask`` or
  segmentation-models-pytorch for real ones) trained by ``lightning.Trainer``;
* checkpoints that hold the loader's position: stop the run at any step
  (Ctrl-C, a crash, a killed job) and ``--resume last`` goes on with the next
  batch of the same epoch, no patch repeated or skipped.

Without ``--landsat``/``--cdl`` it trains on the synthetic corpus that
``pipekit.synthetic.geo.write_landsat_cdl_corpus`` writes to the cache folder.

    python examples/lightning_segmentation.py                       # ~30 s on a CPU
    python examples/lightning_segmentation.py --steps 40 --resume last   # 20 more steps from the last checkpoint
    python examples/lightning_segmentation.py --landsat data/landsat --cdl data/cdl --accelerator gpu --steps 2000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.nn import functional as F

from pipekit.datamodules import LandsatCDLDataModule
from pipekit.synthetic import default_cache_dir


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--landsat", help="Landsat 8 scenes (folder, glob or URL); default: the synthetic corpus")
    parser.add_argument("--cdl", help="CDL raster(s); default: the synthetic corpus")
    parser.add_argument("--scene-size", type=int, default=256, help="synthetic scene side in pixels (30 m)")
    parser.add_argument("--scenes", type=int, default=1, help="synthetic Landsat scenes")
    parser.add_argument("--patch", type=int, default=32, help="patch side in pixels")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20, help="training steps in all (epochs follow one another)")
    parser.add_argument("--epoch-patches", type=int, default=80, help="random training patches per epoch")
    parser.add_argument("--val-batches", type=int, default=4, help="validation batches per check")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--accelerator", default="cpu", help="cpu, gpu or auto")
    parser.add_argument("--checkpoints", type=Path, default=None,
                        help="checkpoint folder (default: the cache folder); one is written every 5 steps")
    parser.add_argument("--resume", default=None, help="a checkpoint to resume from, or 'last'")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    return parser


def block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class Segmenter(L.LightningModule):
    """A two-level encoder-decoder, its loss, metrics and optimiser: what a LightningModule holds."""

    def __init__(self, in_channels: int, num_classes: int, lr: float = 3e-3, width: int = 16) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.enc1, self.enc2 = block(in_channels, width), block(width, 2 * width)
        self.up = nn.ConvTranspose2d(2 * width, width, 2, stride=2)
        self.dec = block(2 * width, width)
        self.head = nn.Conv2d(width, num_classes, 1)
        self.num_classes = num_classes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        return self.head(self.dec(torch.cat([self.up(e2), e1], dim=1)))

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        # the batch arrives normalised (float32) and augmented, its mask int64: the datamodule did it on the device
        loss = F.cross_entropy(self(batch["image"]), batch["mask"])
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        logits = self(batch["image"])
        self.log("val_loss", F.cross_entropy(logits, batch["mask"]))
        self.log("val_accuracy", (logits.argmax(dim=1) == batch["mask"]).float().mean())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=1e-4)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    L.seed_everything(args.seed, verbose=False)
    datamodule = LandsatCDLDataModule(
        args.landsat, args.cdl, batch_size=args.batch_size, patch_size=args.patch,
        length=args.epoch_patches, num_workers=args.workers, seed=args.seed,
        corpus_size=args.scene_size, corpus_scenes=args.scenes, grid_size=4,
    )
    model = Segmenter(len(datamodule.mean), datamodule.num_classes, lr=args.lr)
    folder = args.checkpoints or default_cache_dir() / "examples" / "lightning-segmentation"
    every = ModelCheckpoint(dirpath=folder, every_n_train_steps=5, save_last=True)
    trainer = L.Trainer(accelerator=args.accelerator, devices=1, max_steps=args.steps, max_epochs=-1,
                        limit_val_batches=args.val_batches, num_sanity_val_steps=0, callbacks=[every],
                        logger=False, enable_progress_bar=False, enable_model_summary=False)
    start = time.perf_counter()
    trainer.fit(model, datamodule=datamodule, ckpt_path=args.resume)
    seconds = time.perf_counter() - start
    print(f"train: {len(datamodule.train_dataset.index)} footprints, val: {len(datamodule.val_dataset.index)}, "
          f"test: {len(datamodule.test_dataset.index)} (regions; seed {args.seed})")
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    print(f"{trainer.global_step} steps in {seconds:.1f} s, train loss {metrics.get('train_loss', float('nan')):.3f}, "
          f"val loss {metrics.get('val_loss', float('nan')):.3f}, "
          f"val pixel accuracy {metrics.get('val_accuracy', float('nan')):.1%}")
    print(f"checkpoints in {folder} (resume with --resume last)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
