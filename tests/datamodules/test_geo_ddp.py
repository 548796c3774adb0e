"""A geo datamodule under DDP: each process reads its own share of the patches, and a stopped run resumes exactly.

TorchGeo's ``GeoDataModule`` cannot run under Lightning's DDP (Lightning cannot put a DistributedSampler into
its ``RandomBatchGeoSampler``); pipekit's shares each sampler's epoch out with
:class:`~pipekit.geo.samplers.DistributedGeoSampler`. Two CPU processes over gloo, as a subprocess (``python
test_geo_ddp.py OUT CORPUS [CKPT] [STOP]``) that appends each step's patches to ``OUT/train-RANK.jsonl``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("lightning")

import lightning as L
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from pipekit.datamodules import LandsatCDLDataModule

STEPS_A_RANK = 4  # 2 epochs of 8 patches in batches of 2, shared by 2 ranks


class Recorder(L.LightningModule):
    def __init__(self, out: Path) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(()))
        self.out = out

    def _write(self, name: str, step: int, batch: dict) -> None:
        boxes = [[float(x.start), float(y.start)] for x, y, _ in batch["bounds"]]
        with open(self.out / f"{name}-{self.global_rank}.jsonl", "a") as f:
            f.write(json.dumps([step, boxes]) + "\n")

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        self._write("train", self.global_step + 1, batch)
        return (self.weight * batch["image"].float().mean() - 1) ** 2

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._write(f"val{self.current_epoch}", batch_idx, batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class StopAt(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            raise RuntimeError(f"stopped after step {self.step}")


def main(out: str, corpus: str, ckpt: str = "", stop: str = "0") -> None:
    folder = Path(out)
    callbacks: list[Callback] = [ModelCheckpoint(dirpath=folder, every_n_train_steps=1, save_top_k=-1,
                                                 filename="{step}")]
    if int(stop):
        callbacks.append(StopAt(int(stop)))
    dm = LandsatCDLDataModule(batch_size=2, patch_size=16, length=8, grid_size=3, root=corpus, corpus_size=96,
                              corpus_scenes=1)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        callbacks=callbacks)
    trainer.fit(Recorder(folder), datamodule=dm, ckpt_path=ckpt or None)


def read(path: Path) -> dict[int, list]:
    return {step: boxes for step, boxes in map(json.loads, path.read_text().splitlines())}


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(600)
@pytest.mark.filterwarnings("ignore:GridGeoSampler")
def test_each_rank_reads_its_share_and_a_stopped_run_resumes_exactly(tmp_path):
    corpus = tmp_path / "corpus"
    runs = {name: tmp_path / name for name in ("full", "first", "again")}
    for folder in runs.values():
        folder.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2] / "src"),
                                                        os.environ.get("PYTHONPATH", "")])}

    def run(name: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(Path(__file__).resolve()), str(runs[name]), str(corpus), *args],
                              env=env, timeout=300, capture_output=True, text=True)

    full = run("full")
    assert full.returncode == 0, full.stderr[-3000:]
    train = [read(runs["full"] / f"train-{rank}.jsonl") for rank in (0, 1)]
    assert [sorted(t) for t in train] == [list(range(1, STEPS_A_RANK + 1))] * 2
    for epoch in (0, 1):  # an epoch: 8 different patches, 4 in each rank
        steps = range(epoch * 2 + 1, epoch * 2 + 3)
        patches = [tuple(p) for t in train for s in steps for p in t[s]]
        assert len(patches) == 8 and len(set(patches)) == 8
    val = [read(runs["full"] / f"val0-{rank}.jsonl") for rank in (0, 1)]
    val_patches = [tuple(p) for v in val for batch in v.values() for p in batch]
    assert len(val[0]) == len(val[1]) and len(set(val_patches)) >= len(val_patches) - 1  # the grid, shared out

    assert run("first", "", "3").returncode != 0  # stopped in epoch 2, after the checkpoint at step 2
    again = run("again", str(runs["first"] / "step=2.ckpt"))
    assert again.returncode == 0, again.stderr[-3000:]
    for rank in (0, 1):
        before = read(runs["first"] / f"train-{rank}.jsonl")
        after = read(runs["again"] / f"train-{rank}.jsonl")
        assert sorted(after) == [3, 4]
        assert {s: v for s, v in before.items() if s <= 2} | after == train[rank]


if __name__ == "__main__":
    main(*sys.argv[1:])
