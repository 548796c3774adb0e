"""JPEG decode + RandomResizedCrop + flip + normalise: pipekit's CPU path, its device path, and DALI's GPU pipeline.

The same shards (``--samples`` JPEGs of ``--image-size`` with a ``.cls`` label, in ``--shards`` tar files), a
shuffle buffer of 1,000 samples, ``RandomResizedCrop(--size)`` + horizontal flip, ImageNet normalisation to
float32 channels_last on the device, batches of ``--batch``:

(a) ``cpu``: ``pipekit.DataLoader(datasets.TarShards(urls, batch_size=B, size=S))``: decode and crop in the
    workers (libjpeg-turbo), then ``DeviceLoader(..., scale=255, normalize=...)`` (copy + fused conversion);
(b) ``device``: ``TarShards(urls, batch_size=None, decode=lambda p: jpeg_crop_stage(p, S, batch_size=B))``: the
    workers keep the JPEGs encoded and draw the crop boxes; ``DeviceLoader(..., decode="jpeg", size=S)``
    decodes the batch with torchvision's batched ``decode_jpeg(device=...)`` (nvJPEG on CUDA) and crops,
    resizes (antialiased bilinear), flips and normalises on the device;
(c) ``dali``: when ``nvidia.dali`` imports and the device is CUDA: ``fn.readers.webdataset`` (random shuffle,
    initial fill 1,000) + ``fn.decoders.image_random_crop(device="mixed")`` + ``fn.resize`` +
    ``fn.crop_mirror_normalize`` (random mirror, float, CHW), read with ``DALIGenericIterator``
    (``--dali-threads`` CPU threads).

Two measurements per path and worker count, each the median of ``--repeats`` epochs after a warm-up epoch,
the paths alternating (ABC ABC) so load hits them alike:

* ``feed``: images/s with nothing consuming the batches (the loader's own ceiling);
* ``train`` (CUDA only, ``--model resnet50``): images/s with a ResNet-50 training step (channels_last, bf16
  autocast, SGD) on each batch, and **GPU busy %**: the time between CUDA events recorded around each
  model step (the step's kernels, on the current stream) over the epoch's wall time; ``model_only`` gives
  the step's rate on one synthetic batch, the ceiling.

Without CUDA the "device" is the CPU: (b) then decodes with libjpeg on the CPU (the same call as (a)), there is
no model step, and the figures only prove the paths run (label them CPU when recording them).

Writes a JSON report (``--json``).  Run: ``PYTHONPATH=src python benchmarks/gpu_decode.py --quick`` here;
on a GPU machine ``bash benchmarks/gpu_run.sh`` (one command: wheels, timeouts, JSON to ``$OUT``).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

import pipekit
from pipekit import datasets
from pipekit.device import DeviceLoader, jpeg_crop_stage

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


def write_shards(root: Path, samples: int, shards: int, width: int, height: int, seed: int = 0) -> list[str]:
    """Photo-like JPEGs (smooth gradients + noise, quality 90) of ``width`` x ``height`` with a label."""
    root.mkdir(parents=True, exist_ok=True)
    done = root / f".complete-{samples}-{shards}-{width}x{height}"
    paths = [root / f"shard-{i:06d}.tar" for i in range(shards)]
    if done.exists():
        return [str(p) for p in paths]
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    per = -(-samples // shards)
    n = 0
    for s, path in enumerate(paths):
        with tarfile.open(path, "w") as tar:
            for i in range(min(per, samples - n)):
                a = rng.uniform(0.2, 1.0, 3)
                img = (a[None, None] * (xx[..., None] / width * 160 + yy[..., None] / height * 80)
                       + rng.normal(0, 12, (height, width, 3)))
                buf = io.BytesIO()
                Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
                key = f"sample{s:03d}{i:05d}"
                # labels of a fixed width ("007"): DALI's iterator stacks the raw label bytes into one tensor
                label = f"{int(rng.integers(0, 1000)):03d}".encode()
                for ext, data in ((".jpg", buf.getvalue()), (".cls", label)):
                    info = tarfile.TarInfo(key + ext)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                n += 1
    done.touch()
    return [str(p) for p in paths]


def _device_stage(size: int, batch: int) -> Callable[[Any], Any]:
    def stage(pipe: Any) -> Any:
        return jpeg_crop_stage(pipe, size, batch_size=batch)

    return stage


def cpu_path(urls: list[str], args: argparse.Namespace, workers: int, device: torch.device) -> Iterable[Any]:
    shards = datasets.TarShards(urls, batch_size=args.batch, size=args.size, shuffle_buffer=args.buffer)
    loader = pipekit.DataLoader(shards, num_workers=workers, persistent_workers=workers > 0,
                                pin_memory=device.type == "cuda")
    feed = DeviceLoader(loader, device, keys=".jpg", scale=255, normalize=(MEAN, STD))
    return _Batches(feed, ".jpg", ".cls")


def device_path(urls: list[str], args: argparse.Namespace, workers: int, device: torch.device) -> Iterable[Any]:
    shards = datasets.TarShards(urls, batch_size=None, shuffle_buffer=args.buffer,
                                decode=_device_stage(args.size, args.batch))
    loader = pipekit.DataLoader(shards, num_workers=workers, persistent_workers=workers > 0)
    feed = DeviceLoader(loader, device, decode="jpeg", size=args.size, keys=".jpg", scale=255,
                        normalize=(MEAN, STD))
    return _Batches(feed, ".jpg", ".cls")


class _Batches:
    """``(images, labels)`` of each batch of a loader; iterable once per epoch."""

    def __init__(self, loader: Iterable[Any], image: str, label: str) -> None:
        self.loader, self.image, self.label = loader, image, label

    def __iter__(self) -> Any:
        for b in self.loader:
            yield b[self.image], b[self.label]


def dali_path(urls: list[str], args: argparse.Namespace, workers: int, device: torch.device) -> Iterable[Any]:
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    @pipeline_def(batch_size=args.batch, num_threads=args.dali_threads, device_id=device.index or 0, seed=0)
    def pipe() -> Any:
        jpegs, labels = fn.readers.webdataset(paths=urls, ext=["jpg", "cls"], random_shuffle=True,
                                              initial_fill=args.buffer, name="reader",
                                              missing_component_behavior="error")
        images = fn.decoders.image_random_crop(jpegs, device="mixed", output_type=types.RGB,
                                               random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3])
        images = fn.resize(images, resize_x=args.size, resize_y=args.size, antialias=True)
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                          mean=[m * 255 for m in MEAN], std=[s * 255 for s in STD],
                                          mirror=fn.random.coin_flip(probability=0.5))
        return images, labels.gpu()

    p = pipe()
    p.build()
    it = DALIGenericIterator([p], ["image", "label"], reader_name="reader",
                             last_batch_policy=LastBatchPolicy.PARTIAL, auto_reset=True)

    class _Dali:
        def __iter__(self) -> Any:
            for out in it:
                yield out[0]["image"].contiguous(memory_format=torch.channels_last), out[0]["label"]

    return _Dali()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_model(device: torch.device) -> tuple[Callable[[torch.Tensor], None], Callable[[], float]]:
    """A ResNet-50 training step, and a function giving the step's rate alone (images/s, synthetic batch)."""
    import torchvision

    model = torchvision.models.resnet50().to(device, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    target_cache: dict[int, torch.Tensor] = {}

    def step(x: torch.Tensor) -> None:
        n = x.shape[0]
        if n not in target_cache:
            target_cache[n] = torch.zeros(n, dtype=torch.long, device=device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), target_cache[n])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def alone(batch: int, size: int, steps: int = 20) -> float:
        x = torch.randn(batch, 3, size, size, device=device).contiguous(memory_format=torch.channels_last)
        for _ in range(3):
            step(x)
        sync(device)
        t = time.perf_counter()
        for _ in range(steps):
            step(x)
        sync(device)
        return batch * steps / (time.perf_counter() - t)

    return step, alone  # type: ignore[return-value]


def epoch(batches: Iterable[Any], device: torch.device, step: Callable[[torch.Tensor], None] | None) -> dict:
    """One epoch: images, wall seconds and (with a model step) the GPU time spent in model steps."""
    n, events = 0, []
    sync(device)
    t0 = time.perf_counter()
    for images, _labels in batches:
        n += images.shape[0]
        if step is not None:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step(images)
            end.record()
            events.append((start, end))
    sync(device)
    wall = time.perf_counter() - t0
    busy = sum(s.elapsed_time(e) for s, e in events) / 1000.0 if events else None
    return {"images": n, "wall_s": wall, "model_gpu_s": busy}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--root", default=os.path.join(tempfile.gettempdir(), "pipekit-gpu-decode"))
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--image-size", default="320x256", help="WIDTHxHEIGHT of the JPEGs")
    parser.add_argument("--size", type=int, default=224, help="RandomResizedCrop's output size")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--buffer", type=int, default=1000, help="shuffle buffer")
    parser.add_argument("--workers", default="0,4", help="DataLoader worker counts, comma-separated")
    parser.add_argument("--dali-threads", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--paths", default="cpu,device,dali")
    parser.add_argument("--model", default="resnet50", help="'resnet50' (CUDA only) or 'none'")
    parser.add_argument("--json", default=None, help="write the report here")
    parser.add_argument("--quick", action="store_true", help="a small run that proves the paths work")
    args = parser.parse_args()
    if args.quick:
        args.samples, args.shards, args.batch, args.repeats, args.buffer = 256, 4, 32, 1, 64
        args.workers = "0"
    device = torch.device(args.device)
    width, height = (int(v) for v in args.image_size.split("x"))
    urls = write_shards(Path(args.root), args.samples, args.shards, width, height)

    paths: dict[str, Callable[..., Iterable[Any]]] = {"cpu": cpu_path, "device": device_path, "dali": dali_path}
    wanted = [p for p in args.paths.split(",") if p]
    skipped: dict[str, str] = {}
    if "dali" in wanted:
        try:
            import nvidia.dali  # noqa: F401
        except ImportError as exc:
            skipped["dali"] = f"nvidia.dali does not import ({exc})"
        else:
            if device.type != "cuda":
                skipped["dali"] = "DALI's mixed decoder needs CUDA"
    wanted = [p for p in wanted if p not in skipped]
    step = alone_rate = None
    if device.type == "cuda" and args.model == "resnet50":
        step, alone = make_model(device)
        alone_rate = alone(args.batch, args.size)

    results = []
    for workers in [int(w) for w in args.workers.split(",")]:
        loaders = {name: paths[name](urls, args, workers, device) for name in wanted}
        for batches in loaders.values():  # warm-up epoch (workers start, files cached, kernels built)
            epoch(batches, device, None)
        runs: dict[tuple[str, str], list[dict]] = {}
        for _ in range(args.repeats):
            for name, batches in loaders.items():
                runs.setdefault((name, "feed"), []).append(epoch(batches, device, None))
                if step is not None:
                    runs.setdefault((name, "train"), []).append(epoch(batches, device, step))
        for (name, mode), epochs in runs.items():
            rates = [e["images"] / e["wall_s"] for e in epochs]
            row = {"path": name, "workers": workers, "mode": mode, "images": epochs[0]["images"],
                   "images_per_s": statistics.median(rates), "rates": rates}
            if mode == "train":
                row["gpu_busy_pct"] = statistics.median(100 * e["model_gpu_s"] / e["wall_s"] for e in epochs)
            results.append(row)
            busy = f"  GPU busy {row['gpu_busy_pct']:.1f}%" if mode == "train" else ""
            print(f"{name:>6} workers={workers} {mode:>5}: {row['images_per_s']:8.1f} images/s{busy}", flush=True)
        del loaders
    for name, why in skipped.items():
        print(f"{name:>6}: skipped: {why}")
    report = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": sys.version.split()[0],
                    "torch": torch.__version__, "device": str(device),
                    "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
                    "load": os.getloadavg()},
        "config": {k: v for k, v in vars(args).items() if k not in ("json",)},
        "model_only_images_per_s": alone_rate,
        "results": results,
        "skipped": skipped,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
