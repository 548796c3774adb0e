"""Soak: several epochs of a geo and an image pipeline on a real S3 server, with injected faults (issue 13).

Both pipelines read from a SeaweedFS S3 server on loopback (``tests/s3server.py``) through
``pipekit.DataLoader`` with 2 workers:

* geo: ``GeoSegmentation(Landsat8 & CDL)`` (COGs on S3 read by GDAL's ``/vsis3/``, random patches,
  ``on_error="skip"``);
* image: ``TarShards`` (WebDataset tar shards on S3, ``on_error="skip"``).

Epochs cycle through these conditions: ``clean`` (the reference), ``restart`` (the server is killed
mid-epoch and started again ``--outage`` seconds later), ``corrupt`` (the geo dataset reads a copy of
the corpus where one Landsat band file has damaged tiles; the shards have two damaged JPEGs),
``kill`` (a worker is SIGKILLed mid-epoch; the loader is rebuilt from the last checkpoint, taken
every ``--checkpoint-every`` batches, and what came after that checkpoint is discarded, as a
training loop that resumes from its checkpoint would), ``epoch-end`` (a checkpoint taken after the
epoch ended, the most common place to save: a new loader resumed from it must deliver the whole next
epoch; the epoch counted is that one) and, for the image pipeline, ``replaced`` and ``deleted`` (a
checkpoint mid-epoch, then the shard being read is replaced by another shard's bytes under the same
name, or a shard not read yet is deleted, and a new loader resumes from the checkpoint: it must
deliver the rest exactly, or refuse with a pipekit error naming the shard, or say so in a warning (or
a skip) and lose nothing but that shard's samples; the shard is put back after the epoch).  Every epoch uses the
same seed, so each delivers the reference epoch's samples.  Printed per epoch: samples delivered,
duplicates (must be 0), losses (samples of the reference missing: must be 0, or the skips counted in
the loader's ``skip_report()``), skips, peak RSS of the main process and of a worker, and the time.

    PYTHONPATH=src python benchmarks/soak.py --quick     # ~2-3 min on 2 loaded cores
    PYTHONPATH=src python benchmarks/soak.py             # 8 epochs of each, larger epochs
    PYTHONPATH=src python benchmarks/soak.py --quick --only geo --range-cache   # geo through cache_dir=

Exits with status 1 if any epoch has a duplicate or an unexplained loss (or change).
"""

from __future__ import annotations

import argparse
import gc
import logging
import multiprocessing
import os
import pickle
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
import torch

import pipekit
from pipekit import datasets
from pipekit.errors import PipekitError, WorkerDiedError
from pipekit.synthetic import write_image_shards
from pipekit.synthetic.geo import CDL_CLASSES, write_landsat_cdl_corpus

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from s3server import S3Server, start_s3_server  # the tests' real S3 server

CONDITIONS = ["clean", "restart", "corrupt", "kill", "epoch-end", "replaced", "deleted"]
DATA_CHANGES = ("replaced", "deleted")  # image pipeline only (the geo pipeline skips them)


def rss_mib(pid: int | str = "self") -> float:
    """Resident memory of a process in MiB (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class Peaks:
    """Peak RSS of this process and of its DataLoader workers, sampled at each batch."""

    def __init__(self) -> None:
        self.main = self.worker = 0.0

    def sample(self) -> None:
        self.main = max(self.main, rss_mib())
        for child in multiprocessing.active_children():
            self.worker = max(self.worker, rss_mib(child.pid))


def restart_later(server: S3Server, outage: float) -> threading.Thread:
    """Kill the server now; start it again on the same port and data ``outage`` seconds later."""
    server.kill()
    thread = threading.Thread(target=lambda: (time.sleep(outage), server.start_again()), daemon=True)
    thread.start()
    return thread


def kill_a_worker() -> bool:
    workers = multiprocessing.active_children()
    if not workers:
        return False
    os.kill(workers[0].pid, signal.SIGKILL)
    return True


class _ResumeNowError(Exception):
    """Raised inside the epoch loop: rebuild the loader from the last checkpoint now."""


class _Notices(logging.Handler):
    """Warnings and pipekit log records seen in this process (what a changed shard must be named in)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def run_epoch(make_loader: Callable[[], Any], keys_of: Callable[[Any], list[str]],
              dropped_of: Callable[[Any], int], condition: str, server: S3Server, args: argparse.Namespace,
              seed: int, change: Callable[[str, list[str]], str] | None = None) -> dict[str, Any]:
    """One epoch under ``condition``: the committed keys, the skips counted, peaks and time.

    ``change(condition, committed_keys)`` changes a shard for ``replaced`` / ``deleted`` and returns its name.
    """
    peaks = Peaks()
    committed: list[str] = []  # samples up to the last checkpoint
    pending: list[str] = []  # samples after it
    skips = skips_at_checkpoint = 0  # samples dropped (and counted) by earlier loaders / up to the checkpoint
    fault_at = 3  # batches into the epoch
    restart: threading.Thread | None = None
    killed = False
    died: list[str] = []  # how the death of the killed worker was reported
    reasons: list[str] = []  # why items were skipped
    changed: str | None = None  # the shard changed between checkpoint and resume
    refused: str | None = None  # the pipekit error that refused a resume (epoch-end, changed data)
    notices = _Notices()
    logging.getLogger("pipekit").addHandler(notices)
    start = time.monotonic()
    torch.manual_seed(seed)
    loader = make_loader()
    checkpoint = pickle.dumps(loader.state_dict())
    batches = 0
    epoch_end_done = False
    while True:
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for batch in loader:
                    batches += 1
                    pending += keys_of(batch)
                    peaks.sample()
                    if batches % args.checkpoint_every == 0 or (batches == fault_at and condition in DATA_CHANGES):
                        checkpoint = pickle.dumps(loader.state_dict())
                        committed += pending
                        pending = []
                        skips_at_checkpoint = skips + dropped_of(loader.skip_report())
                    if batches == fault_at and condition == "restart" and restart is None:
                        restart = restart_later(server, args.outage)
                    if batches == fault_at and condition == "kill" and not killed:
                        killed = kill_a_worker()
                    if batches == fault_at and condition in DATA_CHANGES and change is not None and not changed:
                        changed = change(condition, committed)
                        raise _ResumeNowError
            notices.messages += [str(w.message) for w in caught]
            skips += dropped_of(loader.skip_report())
            reasons += [f"{item.stage}: {item.reason}" for item in loader.skip_report().skipped]
            committed += pending
            if condition == "epoch-end" and not epoch_end_done:
                # the epoch ended: checkpoint now, resume a new loader from it, and count the epoch it delivers
                epoch_end_done = True
                checkpoint = pickle.dumps(loader.state_dict())
                committed, pending, skips = [], [], 0
                raise _ResumeNowError
            break
        except _ResumeNowError:
            pending = []
            skips = skips_at_checkpoint if condition in DATA_CHANGES else skips
        except (PipekitError, RuntimeError, ConnectionError) as exc:
            if condition in ("epoch-end", *DATA_CHANGES):
                # a refusal (the caller checks that it is a pipekit error naming the cause), or state_dict()
                # failing after the epoch ended
                refused = f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
                break
            if not isinstance(exc, (WorkerDiedError, RuntimeError, ConnectionError)):
                raise
            if not killed or len(died) >= 3:  # only the death this epoch caused is resumed from
                raise
            # torch reports a worker killed while it hands over a batch's shared memory as a broken
            # connection (or from its SIGCHLD handler), not always as pipekit's WorkerDiedError
            died.append(type(exc).__name__)
            # resume from the last checkpoint: what came after it was never committed
            pending = []
            skips = skips_at_checkpoint
        # the dead loader's iterator is freed before the new workers fork (see the end of this function)
        loader = None
        gc.collect()
        loader = make_loader()
        try:
            loader.load_state_dict(pickle.loads(checkpoint))
        except PipekitError as exc:  # a resume refused (changed data): the caller checks the message
            refused = f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
            break
    if restart is not None:
        restart.join()
    # free this epoch's loaders now: one left for the garbage collector (held by a caught exception's
    # traceback) would be collected inside the next epoch's forked workers, where torch's iterator
    # cannot shut down workers that are not its children ("can only test a child process")
    del loader
    gc.collect()
    logging.getLogger("pipekit").removeHandler(notices)
    injected = {"clean": True, "corrupt": True, "restart": restart is not None, "kill": killed,
                "epoch-end": epoch_end_done}.get(condition, changed is not None)
    return {"keys": committed, "skips": skips, "peaks": peaks, "seconds": time.monotonic() - start,
            "injected": injected, "died": died, "reasons": reasons, "changed": changed, "refused": refused,
            "notices": notices.messages}


def damage_tiles(path: Path) -> None:
    """Overwrite bytes in the middle of a GeoTIFF's tile data (its header stays readable)."""
    data = bytearray(path.read_bytes())
    n = len(data)
    rng = np.random.default_rng(1)
    data[n // 2: n // 2 + n // 5] = rng.integers(0, 256, n // 5, dtype=np.uint8).tobytes()
    path.write_bytes(bytes(data))


def damage_jpegs(shard: Path, count: int) -> list[str]:
    """Replace the bytes of ``count`` JPEG members of a tar shard with garbage of the same length."""
    import tarfile

    data = bytearray(shard.read_bytes())
    damaged = []
    with tarfile.open(shard) as tar:
        for member in tar:
            if member.name.endswith(".jpg") and len(damaged) < count:
                data[member.offset_data: member.offset_data + member.size] = b"\x00" * member.size
                damaged.append(member.name)
    shard.write_bytes(bytes(data))
    return damaged


def upload(server: S3Server, bucket: str, local: Path, prefix: str) -> None:
    fs = server.fs()
    for path in sorted(local.rglob("*")):
        if path.is_file() and not path.name.startswith("."):
            fs.put_file(str(path), f"{bucket}/{prefix}/{path.relative_to(local).as_posix()}")


def geo_pipeline(server: S3Server, work: Path, args: argparse.Namespace) -> dict[str, Callable[[], Any]]:
    corpus = write_landsat_cdl_corpus(work / "corpus", size=args.scene, scenes=2, progress=False)
    broken = work / "corpus-corrupt"
    shutil.copytree(corpus, broken)
    band = sorted((broken / "landsat8").rglob("*_SR_B4.TIF"))[-1]
    damage_tiles(band)
    with rasterio.open(band) as f:  # the header still opens: reads of the damaged tiles fail
        assert f.count == 1
    bucket = server.create_bucket()
    upload(server, bucket, corpus, "clean")
    upload(server, bucket, broken, "corrupt")
    options = server.storage_options

    def make(prefix: str) -> Callable[[], Any]:
        # --range-cache: the workers share one range cache (cache_dir=), kept across epochs
        extra = {"cache_dir": work / f"rangecache-{prefix}"} if args.range_cache else {}
        images = datasets.Landsat8(f"s3://{bucket}/{prefix}/landsat8", storage_options=options, on_error="skip",
                                   **extra)
        labels = datasets.CDL(f"s3://{bucket}/{prefix}/cdl", storage_options=options, on_error="skip", **extra)

        def loader() -> Any:
            recipe = datasets.GeoSegmentation(images, labels, size=args.patch, length=args.geo_samples,
                                              batch_size=8, augment=False, classes=[0, *CDL_CLASSES],
                                              on_error="skip")
            return pipekit.DataLoader(recipe, num_workers=2, persistent_workers=False)
        return loader

    return {"clean": make("clean"), "corrupt": make("corrupt")}


def image_pipeline(server: S3Server, work: Path, args: argparse.Namespace) -> dict[str, Callable[[], Any]]:
    shards = write_image_shards(work / "shards", shards=args.shards, per_shard=args.per_shard, size=64,
                                progress=False)
    broken = work / "shards-corrupt"
    shutil.copytree(work / "shards", broken)
    damage_jpegs(broken / shards[-1].name, 2)
    bucket = server.create_bucket()
    upload(server, bucket, work / "shards", "clean")
    upload(server, bucket, broken, "corrupt")
    last = args.shards - 1
    fs = server.fs()

    def change(condition: str, committed: list[str]) -> str:
        """Replace the shard being read (another shard's bytes, same name) or delete one not read yet."""
        read = {key.split("/", 1)[0] for key in committed}  # image_keys: "shard-000001.tar/sample..."
        names = [p.name for p in shards]
        if condition == "replaced":
            name = sorted(read)[-1] if read else names[0]
            other = names[(names.index(name) + 1) % len(names)]
            fs.pipe(f"{bucket}/clean/{name}", (work / "shards" / other).read_bytes())
        else:
            name = next((n for n in reversed(names) if n not in read), names[-1])
            fs.rm(f"{bucket}/clean/{name}")
        return name

    def put_back(name: str) -> None:
        fs.put_file(str(work / "shards" / name), f"{bucket}/clean/{name}")

    def make(prefix: str) -> Callable[[], Any]:
        def loader() -> Any:
            ds = datasets.TarShards(f"s3://{bucket}/{prefix}/shard-{{000000..{last:06d}}}.tar", batch_size=8,
                                    shuffle_buffer=16, size=64, storage_options=server.storage_options,
                                    on_error="skip")
            return pipekit.DataLoader(ds, num_workers=2, persistent_workers=False)
        return loader

    return {"clean": make("clean"), "corrupt": make("corrupt"), "change": change, "put_back": put_back}


def geo_dropped(report: Any) -> int:
    """Queries dropped: read_geo counts each once (the dataset that failed counts it too)."""
    return report.counts.get("read_geo", 0)


def image_dropped(report: Any) -> int:
    return report.count


def geo_keys(batch: Any) -> list[str]:
    return [repr(b) for b in batch["bounds"]]


def image_keys(batch: Any) -> list[str]:
    # the key holds the shard's URL: compare the samples by their path under the clean / corrupt prefix
    return [re.sub(r"^.*?/(?:clean|corrupt)/", "", key) for key in batch["__key__"]]


def soak(name: str, loaders: dict[str, Callable[[], Any]], keys_of: Callable[[Any], list[str]],
         dropped_of: Callable[[Any], int], server: S3Server, args: argparse.Namespace) -> bool:
    conditions = [c for c in CONDITIONS if "change" in loaders or c not in DATA_CHANGES]
    epochs = len(conditions) if args.quick else args.epochs
    print(f"\n{name}: {epochs} epochs, 2 workers, checkpoint every {args.checkpoint_every} batches")
    print(f"{'epoch':>5} {'fault':>8} {'delivered':>9} {'dupes':>5} {'losses':>6} {'skips':>5} "
          f"{'RSS main':>8} {'RSS wkr':>8} {'s':>6}")
    reference: set[str] | None = None
    ok = True
    for epoch in range(epochs):
        condition = conditions[epoch % len(conditions)]
        make = loaders["corrupt" if condition == "corrupt" else "clean"]
        out = run_epoch(make, keys_of, dropped_of, condition, server, args, seed=1234, change=loaders.get("change"))
        if out["changed"] is not None:
            loaders["put_back"](out["changed"])
        keys = out["keys"]
        if reference is None:
            reference = set(keys)
        dupes = len(keys) - len(set(keys))
        losses = len(reference - set(keys))
        extra = len(set(keys) - reference)
        good = dupes == 0 and extra == 0 and losses == (out["skips"] if condition == "corrupt" else 0)
        if condition == "epoch-end" and out["refused"]:
            good = False  # a checkpoint at the end of an epoch must resume (to the next epoch)
        if condition in DATA_CHANGES and out["changed"] is not None and not good:
            # not exact: acceptable only when a pipekit error or a warning names the shard, and nothing but
            # that shard's samples is lost, duplicated or unexpected
            name = out["changed"]
            said = any(name in m for m in [out["refused"] or "", *out["notices"], *out["reasons"]])
            typed = out["refused"] is None or out["refused"].startswith("pipekit.")
            others = {k for k in (reference ^ set(keys)) if not k.startswith(name)}
            good = said and typed and dupes == 0 and not others
        ok &= good
        fault = condition if out["injected"] else f"{condition}?"  # "?": the epoch ended before the fault
        print(f"{epoch:>5} {fault:>8} {len(keys):>9} {dupes:>5} {losses:>6} {out['skips']:>5} "
              f"{out['peaks'].main:>7.0f}M {out['peaks'].worker:>7.0f}M {out['seconds']:>6.1f}"
              f"{'' if good else '  <-- FAILED'}{f'  ({extra} unexpected)' if extra else ''}"
              f"{'  (reported as ' + ', '.join(out['died']) + '; resumed)' if out['died'] else ''}")
        if out["refused"]:
            print(f"      refused: {out['refused'][:400]}")
        if out["changed"] is not None:
            print(f"      {condition}: {out['changed']}; warnings, logs or skips naming it: "
                  f"{sum(out['changed'] in m for m in out['notices'] + out['reasons'])}")
        if not good:
            for reason in out["reasons"][:4]:
                print(f"      skipped: {reason[:400]}")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one small epoch per condition (~2-3 min)")
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--outage", type=float, default=None, help="seconds the server stays down")
    parser.add_argument("--checkpoint-every", type=int, default=2)
    parser.add_argument("--only", choices=["geo", "image"], default=None, help="run one pipeline")
    parser.add_argument("--range-cache", action="store_true",
                        help="geo: read the COGs through a range cache shared by the workers (cache_dir=)")
    args = parser.parse_args(argv)
    if args.quick:  # one epoch of each condition
        defaults = {"epochs": len(CONDITIONS), "outage": 8.0, "scene": 384, "patch": 32, "geo_samples": 64,
                    "shards": 4, "per_shard": 16}
    else:
        defaults = {"epochs": 2 * len(CONDITIONS), "outage": 20.0, "scene": 768, "patch": 64, "geo_samples": 256,
                    "shards": 8, "per_shard": 48}
    for key, value in defaults.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    # skips and retries are counted in the table; their per-item warnings would drown it
    logging.getLogger("pipekit").setLevel(logging.ERROR)
    print(f"soak: {'quick' if args.quick else 'full'}; outage {args.outage:g} s; torch {torch.__version__}; "
          f"{os.cpu_count()} cores (shared with other work: times are indicative)")
    with tempfile.TemporaryDirectory(prefix="pipekit-soak-") as tmp:
        work = Path(tmp)
        server = start_s3_server()
        try:
            ok = True
            if args.only in (None, "geo"):
                title = "geo (GeoSegmentation: Landsat8 & CDL COGs on S3"
                title += ", range cache)" if args.range_cache else ")"
                ok &= soak(title, geo_pipeline(server, work, args),
                           geo_keys, geo_dropped, server, args)
            if args.only in (None, "image"):
                ok &= soak("image (TarShards on S3)", image_pipeline(server, work, args), image_keys,
                       image_dropped, server, args)
        finally:
            if not server.alive():
                server.start_again()
            server.stop(timeout=3.0)
    print("\nall epochs: no duplicates, no unexplained losses" if ok else "\nFAILED: see the marked epochs")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
