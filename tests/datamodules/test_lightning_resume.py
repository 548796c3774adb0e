"""A Lightning run stopped mid-epoch resumes exactly: the samples seen equal an uninterrupted run's.

Real ``lightning.Trainer`` runs on the CPU over a :class:`pipekit.datamodules.NonGeoDataModule`: the
model records the id (and the augmented first pixel) of every sample it trains on; a run is stopped
after a checkpoint, by a callback that raises or by SIGKILL, and resumed with ``ckpt_path=``.  The
steps up to the checkpoint, then the resumed run's, must be exactly the uninterrupted run's: no sample
repeated or skipped, the same shuffle and the same augmentation.

Run as a script (``python test_lightning_resume.py OUT_DIR WORKERS [CKPT]``) it is the subprocess the
SIGKILL test kills: it appends each step's ids to ``OUT_DIR/seen.jsonl`` as it trains.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("lightning")

import lightning as L
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from pipekit import DataLoader
from pipekit.datamodules import LightningDataLoader, NonGeoDataModule
from pipekit.pipes import IterableWrapper
from pipekit.transforms import BatchRandomHorizontalFlip

N, BATCH, EPOCHS, EVERY = 12, 2, 2, 3  # 6 steps an epoch, 12 in all, a checkpoint every 3 steps


class Numbered(torch.utils.data.Dataset):
    """Sample ``i``: a 1x2x2 uint8 ramp starting at ``2 * i`` (so a flip shows), its id and a label."""

    def __init__(self, split: str, n: int = N) -> None:
        self.n = n if split == "train" else 2

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        image = torch.tensor([[[2 * i, 2 * i + 1], [2 * i, 2 * i + 1]]], dtype=torch.uint8)
        return {"image": image, "label": torch.tensor(i % 2), "id": torch.tensor(i)}


def datamodule(workers: int) -> NonGeoDataModule:
    dm = NonGeoDataModule(Numbered, batch_size=BATCH, num_workers=workers, seed=3)
    dm.mean, dm.std = torch.tensor(0.0), torch.tensor(1.0)
    dm.train_aug = BatchRandomHorizontalFlip(seed=5)
    return dm


class Recorder(L.LightningModule):
    """Records ``(id, first pixel after augmentation)`` per sample, per step; optionally to a file."""

    def __init__(self, out: Path | None = None) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(()))
        self.seen: dict[int, list[list[float]]] = {}
        self.out = out

    def on_fit_start(self) -> None:
        if self.out is not None and self.trainer.world_size > 1:  # one file per rank
            self.out = self.out.with_name(f"{self.out.stem}-{self.global_rank}{self.out.suffix}")

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        step = [[int(i), float(p)] for i, p in zip(batch["id"], batch["image"][:, 0, 0, 0])]
        self.seen[self.global_step + 1] = step
        if self.out is not None:
            with open(self.out, "a") as f:
                f.write(json.dumps([self.global_step + 1, step]) + "\n")
        return (self.weight * batch["image"].mean() - 1) ** 2

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class StopAt(Callback):
    """Raises after training step ``step`` (a crash Lightning does not handle)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            raise RuntimeError(f"stopped after step {self.step}")


def trainer(tmp: Path | None = None, *callbacks: Callback, **kwargs) -> L.Trainer:
    if tmp is not None:
        callbacks = (ModelCheckpoint(dirpath=tmp, every_n_train_steps=EVERY, save_top_k=-1,
                                     filename="{step}"), *callbacks)
    kwargs.setdefault("devices", 1)
    return L.Trainer(accelerator="cpu", max_epochs=EPOCHS, logger=False, enable_progress_bar=False,
                     enable_model_summary=False, enable_checkpointing=tmp is not None, limit_val_batches=0,
                     num_sanity_val_steps=0, callbacks=list(callbacks), **kwargs)


def uninterrupted(workers: int) -> dict[int, list[list[float]]]:
    model = Recorder()
    trainer().fit(model, datamodule=datamodule(workers))
    assert sorted(model.seen) == list(range(1, N // BATCH * EPOCHS + 1))
    return model.seen


def check_resumed(full: dict, before: dict, after: dict, checkpoint_step: int) -> None:
    """Steps up to the checkpoint from the stopped run, then the resumed run's: the uninterrupted run's steps."""
    combined = {s: v for s, v in before.items() if s <= checkpoint_step} | after
    assert sorted(after) == list(range(checkpoint_step + 1, max(full) + 1))
    assert combined == full
    for epoch in range(EPOCHS):  # each epoch: every sample once
        ids = sorted(i for s in range(epoch * N // BATCH + 1, (epoch + 1) * N // BATCH + 1) for i, _ in combined[s])
        assert ids == list(range(N))


_FULL: dict[int, dict] = {}


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("workers", "checkpoint", "stop"),
    [
        pytest.param(0, 3, 5, id="mid-epoch-1"),  # the rest of epoch 1, then epoch 2's shuffle
        pytest.param(0, 6, 7, id="last-batch-of-epoch-1"),  # Lightning goes straight to epoch 2
        pytest.param(0, 9, 11, id="mid-epoch-2"),
        pytest.param(2, 3, 5, id="mid-epoch-1-two-workers"),
        pytest.param(2, 6, 7, id="last-batch-of-epoch-1-two-workers", marks=pytest.mark.slow),
    ],
)
def test_a_run_stopped_mid_epoch_resumes_exactly(workers, checkpoint, stop, tmp_path):
    full = _FULL[workers] = _FULL.get(workers) or uninterrupted(workers)
    stopped = Recorder()
    with pytest.raises(RuntimeError, match=f"stopped after step {stop}"):
        trainer(tmp_path, StopAt(stop)).fit(stopped, datamodule=datamodule(workers))
    assert max(stopped.seen) == stop  # past the checkpoint
    resumed = Recorder()
    trainer(tmp_path).fit(resumed, datamodule=datamodule(workers), ckpt_path=tmp_path / f"step={checkpoint}.ckpt")
    check_resumed(full, stopped.seen, resumed.seen, checkpoint)


def test_the_checkpoint_holds_the_loader_position_and_the_augmentation(tmp_path):
    with pytest.raises(RuntimeError):
        trainer(tmp_path, StopAt(4)).fit(Recorder(), datamodule=datamodule(0))
    ckpt = torch.load(tmp_path / "step=3.ckpt", weights_only=False)
    loaders = ckpt["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    assert len(loaders) == 1 and loaders[0]["pipekit"]["num_workers"] == 0
    assert loaders[0]["_num_yielded"] == 3  # the batches trained on, none fetched ahead
    assert set(ckpt["NonGeoDataModule"]) == {"train_aug/"}


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_run_killed_with_sigkill_resumes_exactly(tmp_path):
    full = uninterrupted(0)
    script = Path(__file__).resolve()
    env = script_env()
    out = tmp_path / "first"
    out.mkdir()
    proc = subprocess.Popen([sys.executable, str(script), str(out), "0", "", "10"], env=env)
    try:
        deadline = time.monotonic() + 120
        # the run holds still after step 10 (a checkpoint at step 9 is on disk) until it is killed
        while not (out / "ready").exists():
            assert proc.poll() is None, f"the run ended before it was killed (exit {proc.returncode})"
            assert time.monotonic() < deadline, "the run did not reach step 10"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    before = read_seen(out / "seen.jsonl")
    assert max(before) == 10
    again = tmp_path / "again"
    again.mkdir()
    done = subprocess.run([sys.executable, str(script), str(again), "0", str(out / "step=9.ckpt"), "0"], env=env,
                          timeout=120)
    assert done.returncode == 0
    check_resumed(full, before, read_seen(again / "seen.jsonl"), 9)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_a_ddp_run_stopped_mid_epoch_resumes_exactly(tmp_path):
    """Two CPU processes (gloo, strategy="ddp"): each rank's samples, stopped and resumed, are its uninterrupted ones.

    Lightning gives each rank a DistributedSampler (rebuilding the pipekit.DataLoader) and saves rank 0's
    loader position, the number of batches, which fits every rank's sampler.
    """
    runs = {name: tmp_path / name for name in ("full", "first", "again")}
    for folder in runs.values():
        folder.mkdir()

    def run(name: str, ckpt: str = "", stop: int = 0) -> int:
        return subprocess.run([sys.executable, str(Path(__file__).resolve()), str(runs[name]), "0", ckpt, "0", "2",
                               str(stop)], env=script_env(), timeout=300, capture_output=True).returncode

    assert run("full") == 0
    assert run("first", stop=5) != 0  # mid-epoch 2 (steps 5..8 of 4 a rank an epoch), past the checkpoint at 3
    assert run("again", ckpt=str(runs["first"] / "step=3.ckpt")) == 0
    steps = N // BATCH // 2 * EPOCHS
    for rank in (0, 1):
        full = read_seen(runs["full"] / f"seen-{rank}.jsonl")
        before = read_seen(runs["first"] / f"seen-{rank}.jsonl")
        after = read_seen(runs["again"] / f"seen-{rank}.jsonl")
        assert sorted(full) == list(range(1, steps + 1)) and max(before) == 5
        assert sorted(after) == list(range(4, steps + 1))
        assert {s: v for s, v in before.items() if s <= 3} | after == full
    ids = sorted(i for rank in (0, 1) for s, v in read_seen(runs["full"] / f"seen-{rank}.jsonl").items()
                 if s <= steps // 2 for i, _ in v)
    assert ids == list(range(N))  # an epoch: every sample once, across the ranks


# an iterable pipeline without a length: Lightning fetches one batch ahead of the step it trains (to know which batch
# is the last), so the loader's position at a checkpoint is one batch past what was trained on; a plain
# pipekit.DataLoader's resumed run skipped that batch, silently; LightningDataLoader reports the batches trained on


def sample(i: int) -> dict:
    image = torch.tensor([[[2 * i, 2 * i + 1], [2 * i, 2 * i + 1]]], dtype=torch.float32)
    return {"image": image, "label": torch.tensor(i % 2), "id": torch.tensor(i)}


def keep(i: int) -> bool:
    return i >= 0  # every item, but the pipe no longer knows its length


class Pipeline(L.LightningDataModule):
    def __init__(self, loader_class: type) -> None:
        super().__init__()
        self.loader_class = loader_class

    def train_dataloader(self):
        pipe = IterableWrapper(range(N)).shuffle(buffer_size=5).filter(keep).map(sample)
        loader = self.loader_class(pipe, batch_size=BATCH, generator=torch.Generator().manual_seed(3))
        with pytest.raises(TypeError):
            len(loader)
        return loader


def uninterrupted_pipeline(loader_class: type) -> dict:
    model = Recorder()
    trainer().fit(model, datamodule=Pipeline(loader_class))
    assert sorted(model.seen) == list(range(1, N // BATCH * EPOCHS + 1))
    return model.seen


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("checkpoint", "stop"), [(3, 5), (6, 8), (9, 11)], ids=["mid-epoch-1", "epoch-end",
                                                                              "mid-epoch-2"])
def test_an_iterable_pipeline_without_a_length_resumes_exactly(checkpoint, stop, tmp_path):
    full = uninterrupted_pipeline(LightningDataLoader)
    stopped = Recorder()
    with pytest.raises(RuntimeError, match=f"stopped after step {stop}"):
        trainer(tmp_path, StopAt(stop)).fit(stopped, datamodule=Pipeline(LightningDataLoader))
    resumed = Recorder()
    trainer(tmp_path).fit(resumed, datamodule=Pipeline(LightningDataLoader),
                          ckpt_path=tmp_path / f"step={checkpoint}.ckpt")
    check_resumed(full, stopped.seen, resumed.seen, checkpoint)


@pytest.mark.timeout(120)
def test_a_plain_dataloader_there_skips_a_batch(tmp_path):
    """Why the class exists: the same run with a plain pipekit.DataLoader loses the batch Lightning fetched ahead."""
    full = uninterrupted_pipeline(DataLoader)
    with pytest.raises(RuntimeError):
        trainer(tmp_path, StopAt(5)).fit(Recorder(), datamodule=Pipeline(DataLoader))
    resumed = Recorder()
    trainer(tmp_path).fit(resumed, datamodule=Pipeline(DataLoader), ckpt_path=tmp_path / "step=3.ckpt")
    assert resumed.seen[4] == full[5]  # step 4's batch was never trained on


def script_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2] / "src"),
                                                         os.environ.get("PYTHONPATH", "")])}


def read_seen(path: Path) -> dict[int, list[list[float]]]:
    return {step: ids for step, ids in map(json.loads, path.read_text().splitlines())}


class HoldAt(Callback):
    """After training step ``step``, say so with a file and wait to be killed."""

    def __init__(self, step: int, ready: Path) -> None:
        self.step, self.ready = step, ready

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            self.ready.touch()
            signal.pause()  # SIGKILL ends it here


def main(out: str, workers: str, ckpt: str, hold: str, devices: str = "1", stop: str = "0") -> None:
    folder = Path(out)
    callbacks: list[Callback] = [HoldAt(int(hold), folder / "ready")] if int(hold) else []
    if int(stop):
        callbacks.append(StopAt(int(stop)))
    kwargs = {"devices": int(devices), "strategy": "ddp"} if int(devices) > 1 else {}
    trainer(folder, *callbacks, **kwargs).fit(Recorder(folder / "seen.jsonl"), datamodule=datamodule(int(workers)),
                                              ckpt_path=ckpt or None)


if __name__ == "__main__":
    main(*sys.argv[1:])
