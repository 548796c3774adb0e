"""Feeding the device: the common float32 path against pipekit's compact, async path.

Two batch shapes, each fed two ways, side by side in one run:

* ``rgb``: 256 x 3 x 224 x 224 uint8 images (ImageNet-style);
* ``ms``:  32 x 13 x 256 x 256 uint16 patches (Sentinel-2-style).

(a) common:  samples converted to float32 and collated on the CPU, copied from
    pageable memory with a blocking ``.to(device)``, normalised on the device, NCHW;
(b) pipekit: samples collated as integers straight into pinned memory
    (``pipekit.collate.collate(pin_memory=True)``), copied asynchronously on a
    side stream by ``DeviceLoader`` while the previous batch is used, then
    converted + normalised on the device in one kernel into channels_last
    (``pipekit.device.to_device``).

Reported: batches/s, host-to-device GB/s of each path, the ratio of (b)'s
achieved copy bandwidth to the machine's measured pinned host-to-device
bandwidth, and the end-to-end step time of a small channels-last ResNet-18
(forward + backward) fed each way.  (b) collates on the calling thread, so
its rate is bound by the CPU's memory copy into pinned memory; the ``feed``
columns give (b)'s device side alone (batches already collated into pinned
memory, as DataLoader workers with ``pin_memory`` hand them over).

Without CUDA the "device" is the CPU: there is no copy, and the figures only
show the cost of the conversions (say so when recording them).

Run: ``./run bench gpu_collate`` (``--help`` for sizes).
"""

from __future__ import annotations

import argparse
import functools
import platform
import statistics
import time
from collections.abc import Callable, Iterator

import torch
import torchvision

from pipekit.collate import collate
from pipekit.device import DeviceLoader

MEAN3 = [0.485, 0.456, 0.406]
STD3 = [0.229, 0.224, 0.225]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_samples(n: int, c: int, h: int, w: int, dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    high = 256 if dtype == torch.uint8 else 10000
    return [torch.randint(0, high, (c, h, w), generator=g, dtype=torch.int32).to(dtype) for _ in range(n)]


def common_batches(samples, batch, steps, device, scale, mean, std) -> Iterator[torch.Tensor]:
    m = torch.tensor(mean, device=device).view(1, -1, 1, 1)
    s = torch.tensor(std, device=device).view(1, -1, 1, 1)
    for i in range(steps):
        chunk = [samples[(i * batch + j) % len(samples)] for j in range(batch)]
        host = torch.stack([t.float().div_(scale) for t in chunk])  # float32 collate (ToTensor-style)
        x = host.to(device)  # pageable, blocking
        yield (x - m) / s


def pipekit_batches(samples, batch, steps, device, scale, mean, std) -> Iterator[torch.Tensor]:
    def host_batches():
        for i in range(steps):
            chunk = [samples[(i * batch + j) % len(samples)] for j in range(batch)]
            yield collate(chunk, pin_memory=True)

    yield from DeviceLoader(host_batches(), device, normalize=(mean, std), scale=scale)


def feed_only_batches(host, steps, device, scale, mean, std) -> Iterator[torch.Tensor]:
    """(b)'s device side alone: batches already collated into pinned memory (``host``, made before the clock
    starts, as DataLoader workers + pin_memory deliver them), copied and converted by ``DeviceLoader``."""
    yield from DeviceLoader((host[i % len(host)] for i in range(steps)), device, normalize=(mean, std), scale=scale)


def timed(fn: Callable[[], Iterator[torch.Tensor]], device: torch.device, consume=None) -> float:
    sync(device)
    t0 = time.perf_counter()
    n = 0
    for x in fn():
        if consume is not None:
            consume(x)
        n += 1
    sync(device)
    return n / (time.perf_counter() - t0)


def pinned_bandwidth(device: torch.device, nbytes: int = 256 << 20) -> float | None:
    if device.type != "cuda":
        return None
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst.copy_(src, non_blocking=True)
    sync(device)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        sync(device)
        times.append(time.perf_counter() - t0)
    return nbytes / min(times) / 1e9


def resnet(channels: int, device: torch.device) -> torch.nn.Module:
    model = torchvision.models.resnet18(num_classes=10)
    if channels != 3:
        model.conv1 = torch.nn.Conv2d(channels, 64, 7, 2, 3, bias=False)
    return model.to(device).to(memory_format=torch.channels_last)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=None, help="batches per measurement (default 50 GPU, 4 CPU)")
    parser.add_argument("--model-batch", type=int, default=None, help="ResNet batch (default 256 GPU, 8 CPU)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    steps = args.steps or (50 if on_gpu else 4)
    name = torch.cuda.get_device_name(device) if on_gpu else f"CPU ({platform.processor() or platform.machine()})"
    print(f"# gpu_collate on {name}; torch {torch.__version__}; {steps} batches per measurement")
    peak = pinned_bandwidth(device)
    if peak is not None:
        print(f"# measured pinned host-to-device bandwidth: {peak:.1f} GB/s")
    else:
        print("# no CUDA device: no host-to-device copy happens; figures show conversion cost only")

    configs = [
        ("rgb 256x3x224x224 uint8", 256, 3, 224, 224, torch.uint8, 255.0, MEAN3, STD3),
        ("ms  32x13x256x256 uint16", 32, 13, 256, 256, torch.uint16, 10000.0, [0.1] * 13, [0.05] * 13),
    ]
    print("# (b) includes collating on this thread into pinned memory; 'feed' is (b)'s copy + conversion alone,")
    print("# from batches already pinned (what DataLoader workers with pin_memory hand over)")
    print(f"{'batch':<26} | {'(a) common':>12} | {'(b) pipekit':>12} | {'b/a':>5} | {'(a) GB/s':>8} | "
          f"{'(b) GB/s':>8} | {'(b)/peak':>8} | {'feed':>12} | {'feed GB/s':>9} | {'feed/peak':>9}")
    for label, b, c, h, w, dtype, scale, mean, std in configs:
        samples = make_samples(min(b, 64), c, h, w, dtype)
        bytes_a = b * c * h * w * 4
        bytes_b = b * c * h * w * samples[0].element_size()
        rates_a, rates_b, rates_f = [], [], []
        run_a = functools.partial(common_batches, samples, b, steps, device, scale, mean, std)
        run_b = functools.partial(pipekit_batches, samples, b, steps, device, scale, mean, std)
        host = [collate([samples[(i * b + j) % len(samples)] for j in range(b)], pin_memory=True) for i in range(4)]
        run_f = functools.partial(feed_only_batches, host, steps, device, scale, mean, std)
        for _ in range(args.repeats):
            rates_a.append(timed(run_a, device))
            rates_b.append(timed(run_b, device))
            rates_f.append(timed(run_f, device))
        ra, rb, rf = statistics.median(rates_a), statistics.median(rates_b), statistics.median(rates_f)
        gba, gbb, gbf = ra * bytes_a / 1e9, rb * bytes_b / 1e9, rf * bytes_b / 1e9
        frac = f"{gbb / peak:8.2f}" if peak else f"{'n/a':>8}"
        ffrac = f"{gbf / peak:9.2f}" if peak else f"{'n/a':>9}"
        print(f"{label:<26} | {ra:>8.2f} b/s | {rb:>8.2f} b/s | {rb / ra:>5.2f} | {gba:>8.2f} | {gbb:>8.2f} | {frac} | "
              f"{rf:>8.2f} b/s | {gbf:>9.2f} | {ffrac}")

    mb = args.model_batch or (256 if on_gpu else 8)
    model = resnet(3, device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    labels = torch.randint(0, 10, (mb,), device=device)

    def step(x: torch.Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), labels)
        loss.backward()
        opt.step()

    samples = make_samples(min(mb, 64), 3, 224, 224, torch.uint8)
    model_steps = max(2, steps // 5)
    times = {}
    for way, fn in (("common", common_batches), ("pipekit", pipekit_batches)):
        timed(functools.partial(fn, samples, mb, 1, device, 255.0, MEAN3, STD3), device, step)  # warm-up
        rate = timed(functools.partial(fn, samples, mb, model_steps, device, 255.0, MEAN3, STD3), device, step)
        times[way] = 1.0 / rate
    print(f"ResNet-18 channels_last step, batch {mb}: common {times['common'] * 1e3:.1f} ms, "
          f"pipekit {times['pipekit'] * 1e3:.1f} ms, ratio {times['common'] / times['pipekit']:.2f}x")


if __name__ == "__main__":
    main()
