"""Tar shards: pipekit's ``datasets.TarShards`` vs the ``webdataset`` library, local disk and S3.

The same shards (JPEGs of 320x256 with a ``.cls`` label, in tar files) and the
same work on both sides: a shuffle buffer of 1,000 samples, torchvision JPEG
decoding to RGB uint8, ``RandomResizedCrop(224)`` + horizontal flip (the same
torchvision v2 ops), batches of 64, in a DataLoader with 0 and 2 workers:

(a) ``pipekit.DataLoader(datasets.TarShards(urls, batch_size=64, size=224).pipe)``,
    exact resume on (its default): each worker keeps its position and sends it
    only when ``state_dict()`` asks;
(b) the same with resume snapshots off (``snapshot_every_n_steps`` larger than
    an epoch), to show what exact resume costs (workers only);
(c) ``webdataset.WebDataset(urls).shuffle(1000).map(decode + ops).to_tuple().batched(64)``
    in ``torch.utils.data.DataLoader(batch_size=None)``;
(d) LitData (Lightning AI's ``litdata``), when installed (the ``bench`` extra):
    its users convert data once with ``litdata.optimize`` into binary chunks,
    so the same samples (the JPEG bytes untouched, the label) are converted
    into as many chunks as there are shards, and read with
    ``StreamingDataLoader(StreamingDataset(dir, shuffle=True, transform=decode +
    ops), batch_size=64)``.  LitData shuffles the chunk order and the samples
    within each chunk rather than through a buffer, and copies each remote chunk
    whole into a local cache before reading it: from S3, its timed epochs after
    the warm-up read that local cache (its first pass is printed separately);
(e) from S3 also pipekit with ``TarShards(cache_dir=...)``, which does the same
    (each shard copied whole into a fresh local folder on first use, then read
    from it);
(f) random access: ``datasets.IndexedShards(urls, transform=decode + ops)``
    (the shards indexed once with ``datasets.index_shards``, one ranged read
    per sample) in ``pipekit.DataLoader(sampler=RandomSampler(ds), batch_size=64)``:
    a true global shuffle instead of a buffer, and the same work per sample
    as (c) (torchvision decode + the same ops).  ``--random-access-only`` times
    it against (a) alone.

``--decode-ab`` (issue 34) times pipekit's 0-worker loader alone, epochs alternating
between its JPEG decoders: torchvision's (the reference) and the optional ``simplejpeg``
(where installed; the same pixels).

``--peers`` (issues 33 and 34; ``./run bench shards --peers``) is the side by side
against every peer loader instead, each loader in a process of its own
(``benchmarks/_peers.py``; the peers with the ``peers`` environment's python,
``PIPEKIT_PEERS_PYTHON``, since they need a botocore that s3fs refuses):
pipekit's ``TarShards`` against webdataset, LitData (its own chunks), MosaicML
Streaming (MDS, converted once), megatron-energon and DALI's CPU pipeline, 0 and
2 workers (DALI: 1 and 2 threads), steady-state epochs in alternating rounds after
a first epoch, with each loader's first-epoch time (construction to the end of
its first epoch) and peak memory (RSS and PSS of its process and workers);
then random access (issue 33): ``IndexedShards`` against LitData's
``StreamingDataset`` read by index (``ds[i]`` under ``RandomSampler``), local and
from S3.  Each cell prints the machine's load average around its rounds.

One difference in what the two sides do: pipekit applies a JPEG's EXIF
orientation (``decode_jpeg(..., apply_exif_orientation=True)``) and the
webdataset side, as a webdataset user would write it, decodes with
``decode_image`` without it.  The shards' JPEGs carry no EXIF block, and for
those torchvision's orientation check made no difference we could measure
(decode_jpeg with and without it within ~10 µs of each other, of ~800 µs), so
the work timed is the same.

Shards are read from local disk and from a real S3 server (SeaweedFS on
loopback, ``tests/s3server.py``; webdataset opens ``s3://`` through an fsspec
handler registered in its ``gopen_schemes``, pipekit through its own
``storage_options``).  The loaders of one cell are timed alternately (ABC ABC)
after a warm-up epoch, so load on the shared machine hits them alike; the
median epoch is printed as samples/s with ratios against webdataset, and with
0 workers also the process CPU time per sample (all the work is in the
process then; steadier than wall-clock rates on a loaded machine).

Run: ``PYTHONPATH=src python benchmarks/shards.py`` (``--quick`` for a shorter
run, ``--help`` for options).  Needs the ``bench`` extra (``webdataset``) and,
for S3, the ``weed`` binary of the ``dev`` extra.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import io
import json
import os
import platform
import shutil
import statistics
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.utils.data
from torchvision.io import ImageReadMode
from torchvision.io import decode_image as tv_decode_image

import pipekit
from pipekit import datasets
from pipekit.datasets._recipe import standard_image_transforms
from pipekit.synthetic import CLASSES, default_cache_dir
from pipekit.synthetic.images import make_image

sys.path.insert(0, str(Path(__file__).parent))  # run as a script or imported: _peers sits beside it
from _peers import shard_samples

NEVER = 10**9  # snapshot_every_n_steps larger than any epoch: resume snapshots off


def write_shards(root: Path, samples: int, shards: int, size: tuple[int, int], seed: int = 0) -> list[Path]:
    """``shards`` tar files of ``.jpg`` (``size`` = width, height) + ``.cls`` samples, written once."""
    root.mkdir(parents=True, exist_ok=True)
    paths = [root / f"shard-{i:06d}.tar" for i in range(shards)]
    if (root / ".complete").exists():
        return paths
    rng = np.random.default_rng(seed)
    per_shard = -(-samples // shards)
    n = 0
    for s, path in enumerate(paths):
        with tarfile.open(path, "w") as tar:
            for i in range(min(per_shard, samples - n)):
                label = int(rng.integers(0, len(CLASSES)))
                buf = io.BytesIO()
                make_image(label, rng, size).save(buf, format="JPEG", quality=90)
                for ext, data in ((".jpg", buf.getvalue()), (".cls", str(label).encode())):
                    info = tarfile.TarInfo(f"sample{s:03d}{i:05d}{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                n += 1
    (root / ".complete").touch()
    return paths


class WdsSample:
    """webdataset's and LitData's side of the work: decode the JPEG (torchvision, RGB) and run the same ops."""

    def __init__(self, size: int) -> None:
        self.ops = standard_image_transforms(size, train=True)

    def __call__(self, sample: dict[str, Any]) -> tuple[torch.Tensor, int]:
        image = tv_decode_image(torch.frombuffer(bytearray(sample["jpg"]), dtype=torch.uint8), ImageReadMode.RGB)
        for op in self.ops:
            image = op(image)
        return image, int(sample["cls"])


class IndexedSample(WdsSample):
    """(f)'s work: the same decode and ops as webdataset's side, on IndexedShards' samples (``".jpg"``, ``".cls"``)."""

    def __call__(self, sample: dict[str, Any]) -> tuple[torch.Tensor, int]:  # type: ignore[override]
        return super().__call__({"jpg": sample[".jpg"], "cls": sample[".cls"]})


def indexed_loader(
    urls: list[str], args: argparse.Namespace, workers: int, storage_options: dict[str, Any] | None
) -> pipekit.DataLoader:
    ds = datasets.IndexedShards(urls, storage_options=storage_options, transform=IndexedSample(args.size))
    sampler = torch.utils.data.RandomSampler(ds)
    return pipekit.DataLoader(ds, sampler=sampler, batch_size=args.batch, num_workers=workers)


def register_wds_s3(storage_options: dict[str, Any]) -> None:
    """Let webdataset open ``s3://`` URLs with fsspec (it has no S3 handler of its own besides shell pipes)."""
    import importlib

    import fsspec

    gopen = importlib.import_module("webdataset.gopen")  # the package's `gopen` attribute is the function

    def open_s3(url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> Any:
        return fsspec.open(url, mode, **storage_options).open()

    gopen.gopen_schemes["s3"] = open_s3


def wds_loader(urls: list[str], args: argparse.Namespace, workers: int) -> torch.utils.data.DataLoader:
    import webdataset as wds

    ds = (
        wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False)
        .shuffle(args.buffer)
        .map(WdsSample(args.size))
        .batched(args.batch, partial=True)
    )
    return torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers, persistent_workers=workers > 0)


def litdata_available() -> bool:
    """Whether ``litdata`` is installed (the ``bench`` extra)."""
    try:
        import litdata  # noqa: F401
    except ImportError:
        return False
    return True


def write_litdata(shards: list[Path], out: Path, samples: int) -> Path:
    """The shards' samples in LitData's format under ``out`` (one chunk per shard), converted once and reused."""
    from litdata import optimize

    stamp = json.dumps([[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in shards])
    marker = out / "converted-from.json"
    if marker.exists() and marker.read_text() == stamp and (out / "index.json").exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    optimize(
        fn=shard_samples,
        inputs=[str(p) for p in shards],
        output_dir=str(out),
        chunk_size=-(-samples // len(shards)),
        num_workers=1,
        reorder_files=False,
        verbose=False,
    )
    if not (out / "index.json").exists():
        raise RuntimeError(f"litdata.optimize wrote no index.json under {out}")
    marker.write_text(stamp)
    return out


def litdata_loader(
    input_dir: str, args: argparse.Namespace, workers: int, storage_options: dict[str, Any] | None
) -> Any:
    """``StreamingDataLoader(StreamingDataset(input_dir, shuffle=True, transform=...), batch_size=B)``."""
    from litdata import StreamingDataLoader, StreamingDataset

    options = None
    if storage_options:
        # litdata 0.2.76 fetches remote chunks with obstore when it is installed, but builds the obstore
        # store without ``allow_http``, so an ``http://`` endpoint (this loopback server) fails with
        # "builder error: BadScheme".  Its boto3 path (a real S3 client on a thread) reads the same chunks.
        import litdata.streaming.downloader as downloader

        downloader._OBSTORE_AVAILABLE = False
        client = storage_options["client_kwargs"]
        options = {
            "aws_access_key_id": storage_options["key"],
            "aws_secret_access_key": storage_options["secret"],
            "endpoint_url": client["endpoint_url"],
            "region_name": client.get("region_name", "us-east-1"),
        }
    cache = tempfile.mkdtemp(prefix="bench-litdata-cache-")  # a cold chunk cache for each loader
    atexit.register(shutil.rmtree, cache, ignore_errors=True)
    ds = StreamingDataset(
        input_dir, cache_dir=cache, shuffle=True, transform=WdsSample(args.size), storage_options=options
    )
    return StreamingDataLoader(ds, batch_size=args.batch, num_workers=workers, persistent_workers=workers > 0)


def pipekit_loader(
    urls: list[str],
    args: argparse.Namespace,
    workers: int,
    resume: bool,
    storage_options: dict[str, Any] | None,
    cache: bool = False,
) -> pipekit.DataLoader:
    cache_dir = None
    if cache:  # a cold local copy of the shards for each loader, as LitData's chunk cache
        cache_dir = tempfile.mkdtemp(prefix="bench-pipekit-cache-")
        atexit.register(shutil.rmtree, cache_dir, ignore_errors=True)
    ds = datasets.TarShards(
        urls,
        batch_size=args.batch,
        shuffle_buffer=args.buffer,
        size=args.size,
        image_mode="RGB",
        storage_options=storage_options,
        cache_dir=cache_dir,
    )
    kw = {} if resume or workers == 0 else {"snapshot_every_n_steps": NEVER}
    return pipekit.DataLoader(ds.pipe, num_workers=workers, **kw)


def batch_len(batch: Any) -> int:
    if isinstance(batch, dict):
        return len(batch[".cls"])
    return len(batch[1])


def epoch_rate(loader: Any) -> tuple[float, float]:
    """Samples/s of one epoch, and this process's CPU time per sample in µs (all of it with 0 workers)."""
    n = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for batch in loader:
        n += batch_len(batch)
    return n / (time.perf_counter() - t0), (time.process_time() - c0) / max(n, 1) * 1e6


def compare(loaders: dict[str, Any], epochs: int) -> dict[str, tuple[float, float, float]]:
    """Median samples/s and CPU µs/sample of each loader, epochs taken in turn (ABC ABC) after a warm-up epoch each.

    Also the warm-up epoch's samples/s (the first pass: cold caches, LitData's chunk downloads).
    """
    first = {name: epoch_rate(loader)[0] for name, loader in loaders.items()}
    rates: dict[str, list[tuple[float, float]]] = {name: [] for name in loaders}
    for _ in range(epochs):
        for name, loader in loaders.items():
            rates[name].append(epoch_rate(loader))
    for loader in loaders.values():
        if isinstance(loader, pipekit.DataLoader):
            loader.shutdown()
    return {
        name: (statistics.median(r for r, _ in runs), statistics.median(c for _, c in runs), first[name])
        for name, runs in rates.items()
    }


def checkpoint_cost(urls: list[str], args: argparse.Namespace, storage_options: dict[str, Any] | None) -> None:
    """One ``state_dict()`` with 2 workers mid-epoch: how long it takes and how big it is."""
    loader = pipekit_loader(urls, args, 2, True, storage_options)
    it = iter(loader)
    for _ in range(5):
        next(it)
    t0 = time.perf_counter()
    state = loader.state_dict()
    took = time.perf_counter() - t0
    buf = io.BytesIO()
    torch.save(state, buf)
    loader.shutdown()
    print(
        f"  a checkpoint (2 workers, after 5 batches): state_dict() {took * 1e3:.0f} ms, "
        f"torch.save {buf.tell() / 2**20:.1f} MiB (both workers' shuffle buffers)"
    )


COMPETITORS = ("webdataset", "litdata")


def run_cell(
    where: str,
    urls: list[str],
    args: argparse.Namespace,
    workers: int,
    storage_options: dict[str, Any] | None,
    litdata_dir: str | None,
) -> None:
    loaders: dict[str, Callable[[], Any]] = {
        "pipekit": lambda: pipekit_loader(urls, args, workers, True, storage_options),
    }
    if workers > 0 and not args.random_access_only:
        loaders["pipekit, resume off"] = lambda: pipekit_loader(urls, args, workers, False, storage_options)
    if where != "local" and not args.resume_cost_only and not args.random_access_only:
        loaders["pipekit, cache_dir"] = lambda: pipekit_loader(urls, args, workers, True, storage_options, cache=True)
    if not args.resume_cost_only:
        loaders["pipekit, random access"] = lambda: indexed_loader(urls, args, workers, storage_options)
    if not args.resume_cost_only and not args.random_access_only:
        loaders["webdataset"] = lambda: wds_loader(urls, args, workers)
        if litdata_dir is not None:
            loaders["litdata"] = lambda: litdata_loader(litdata_dir, args, workers, storage_options)
    measured = compare({name: make() for name, make in loaders.items()}, args.epochs)
    rates = {name: rate for name, (rate, _, _) in measured.items()}
    best = max((n for n in rates if n in COMPETITORS), key=rates.__getitem__, default=None)
    cells = [f"{name} {rates[name]:7.1f}/s" for name in COMPETITORS if name in rates]
    for name, rate in rates.items():
        if name not in COMPETITORS:
            cells.append(f"{name} {rate:7.1f}/s" + (f" ({rate / rates[best]:.2f}x {best})" if best else ""))
    if "pipekit, random access" in rates:
        cells.append(f"random access/streaming {rates['pipekit, random access'] / rates['pipekit']:.2f}")
    if "pipekit, resume off" in rates:
        cells.append(f"resume on/off {rates['pipekit'] / rates['pipekit, resume off']:.3f}")
    if workers == 0 and best:  # all the work is in this process: its CPU time per sample, steadier under load
        cpu = {name: c for name, (_, c, _) in measured.items()}
        shown = ", ".join(f"{name} {cpu[name]:.0f} µs" for name in (*COMPETITORS, "pipekit") if name in cpu)
        cells.append(f"CPU/sample {shown} ({best}/pipekit {cpu[best] / cpu['pipekit']:.2f})")
    print(f"{where:>5} | {workers} workers | {' | '.join(cells)}", flush=True)
    if where != "local":
        firsts = ", ".join(f"{name} {first:.1f}/s" for name, (_, _, first) in measured.items())
        print(f"{'':>5} | first pass (warm-up epoch): {firsts}", flush=True)


class LoaderProcess:
    """One loader in a process of its own (``benchmarks/_peers.py``), driven by JSON lines."""

    def __init__(self, python: str, spec: dict[str, Any]) -> None:
        import os
        import subprocess

        src = str(Path(__file__).resolve().parents[1] / "src")
        env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.name = spec["loader"]
        self.proc = subprocess.Popen(
            [python, str(Path(__file__).with_name("_peers.py")), json.dumps(spec)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )
        self.ready = self._read()

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            return {"error": f"exited with {self.proc.wait()}"}
        return json.loads(line)

    def ask(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(BrokenPipeError, ValueError):
                self.ask("quit")
            try:
                self.proc.wait(30)
            except Exception:
                self.proc.kill()


PEER_ORDER = ("pipekit", "webdataset", "litdata", "mosaicml-streaming", "energon", "dali")
PIPEKIT_SIDE = ("pipekit", "pipekit, decode_threads=2", "pipekit, random access")


def peers_cell(
    title: str, names: list[str], spec: dict[str, Any], peers_python: str, rounds: int, profile: bool = False
) -> dict[str, dict[str, Any]]:
    """Every loader of ``names`` in its own process: a first epoch each, then ``rounds`` alternating rounds."""
    import os

    procs: dict[str, LoaderProcess] = {}
    for name in names:
        python = sys.executable if name in PIPEKIT_SIDE else peers_python
        proc = LoaderProcess(python, {**spec, "loader": name})
        if "error" in proc.ready:
            print(f"  {name}: not measured ({proc.ready['error']})", flush=True)
            proc.close()
            continue
        procs[name] = proc
    first = {name: p.ask("epoch") for name, p in procs.items()}
    loads = [os.getloadavg()[0]]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in procs}
    for _ in range(rounds):
        for name, p in procs.items():
            runs[name].append(p.ask("epoch"))
        loads.append(os.getloadavg()[0])
    if profile and "pipekit" in procs:
        print(procs["pipekit"].ask("profile")["profile"], flush=True)
    out: dict[str, dict[str, Any]] = {}
    for name, p in procs.items():
        mem = p.ask("memory")
        p.close()
        out[name] = {
            "rate": statistics.median(r["n"] / r["seconds"] for r in runs[name]),
            "cpu_us": statistics.median(r["cpu_us"] for r in runs[name]),
            "first_s": p.ready["build_s"] + first[name]["seconds"],
            "rss": mem["rss"] / 2**20,
            "pss": mem["pss"] / 2**20,
        }
    rows = [f"| {title} | load {min(loads):.1f}-{max(loads):.1f} |"]
    best = max((n for n in out if n not in PIPEKIT_SIDE), key=lambda n: out[n]["rate"], default=None)
    for name, m in out.items():
        ratio = ""
        if name in PIPEKIT_SIDE and best:
            ratio = f" ({m['rate'] / out[best]['rate']:.2f}x {best})"
        elif name not in PIPEKIT_SIDE and "pipekit" in out:
            ratio = f" (pipekit {out['pipekit']['rate'] / m['rate']:.2f}x)"
        rows.append(
            f"| {name} | {m['rate']:7.1f}/s{ratio} | CPU {m['cpu_us']:.0f} µs/sample "
            f"| first epoch {m['first_s']:.1f} s | peak RSS {m['rss']:.0f} MiB, PSS {m['pss']:.0f} MiB |"
        )
    print("\n".join(rows), flush=True)
    return out


def peer_versions(peers_python: str) -> str:
    import subprocess

    code = (
        "import importlib.metadata as m\n"
        "for d in ('torch', 'torchvision', 'webdataset', 'litdata', 'mosaicml-streaming', 'megatron-energon',"
        " 'nvidia-dali-cuda130'):\n"
        "    try: print(d, m.version(d))\n"
        "    except m.PackageNotFoundError: print(d, 'not installed')\n"
    )
    found = subprocess.run([peers_python, "-c", code], capture_output=True, text=True, check=False).stdout
    return ", ".join(found.split("\n")).strip(", ")


def profile_stages(paths: list[Path], args: argparse.Namespace) -> None:
    """Where a 0-worker sample's CPU time goes: each stage of pipekit's image path timed apart, in this process."""
    from pipekit.collate import collate
    from pipekit.decoders import decode_image_bytes

    samples = []
    t0 = time.process_time()
    for path in paths:
        with tarfile.open(path) as tar:
            members = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]
        samples += [(v, members[k[:-4] + ".cls"]) for k, v in members.items() if k.endswith(".jpg")]
    n = len(samples)
    times = {"tar read (tarfile, for scale)": time.process_time() - t0}
    from pipekit._image_backends import _simplejpeg_decoder
    from pipekit.transforms._direct import direct_image_ops

    decoder = "simplejpeg" if _simplejpeg_decoder() is not None else "torchvision decode_jpeg"
    t0 = time.process_time()
    images = [decode_image_bytes(jpg, mode="RGB") for jpg, _ in samples]
    times[f"decode (decode_image_bytes RGB: {decoder})"] = time.process_time() - t0
    # the steps TarShards runs (its direct path: torchvision's draws and kernels, from a generator)
    steps = direct_image_ops(standard_image_transforms(args.size, train=True))
    assert steps is not None
    crop, flip = steps
    g = torch.Generator().manual_seed(0)
    t0 = time.process_time()
    cropped = [crop(im, g) for im in images]
    times["RandomResizedCrop (direct step)"] = time.process_time() - t0
    t0 = time.process_time()
    flipped = [flip(im, g) for im in cropped]
    times["RandomHorizontalFlip (direct step)"] = time.process_time() - t0
    t0 = time.process_time()
    for i in range(0, n, args.batch):
        part = zip(flipped[i:i + args.batch], samples[i:i + args.batch])
        collate([{".jpg": im, ".cls": int(c)} for im, (_, c) in part])
    times["collate (batches of dicts)"] = time.process_time() - t0
    print(f"# --profile: pipekit's image path by stage, CPU µs a sample over {n} samples (one pass each)")
    for name, t in times.items():
        print(f"#   {name}: {t / n * 1e6:.0f} µs")


def decode_ab(paths: list[Path], args: argparse.Namespace) -> None:
    """``--decode-ab``: pipekit's 0-worker loader, epochs alternating between its JPEG decoders (issue 34).

    torchvision's ``decode_jpeg`` (the reference) and ``simplejpeg`` (the optional package, where installed:
    the fast path ``"simplejpeg"`` switched between epochs), in one process and one loader, so the machine's
    load and the process's warm caches are alike for both; CPU µs a sample (the process's own CPU time: all
    the work at 0 workers) and samples/s, medians of ``--epochs`` rounds after a warm-up epoch.
    """
    from pipekit import _fast
    from pipekit._image_backends import _simplejpeg_module

    variants = {"torchvision decode_jpeg": False}
    if _simplejpeg_module() is not None:
        variants["simplejpeg"] = True
    else:
        print("# simplejpeg not installed (pip install simplejpeg): torchvision's decoder only")
    loader = pipekit_loader([str(p) for p in paths], args, 0, True, None)
    before = _fast.state.get("simplejpeg", True)
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    loads = [os.getloadavg()[0]]
    try:
        epoch_rate(loader)
        for _ in range(args.epochs):
            for name, on in variants.items():
                _fast.state["simplejpeg"] = on
                runs[name].append(epoch_rate(loader))
            loads.append(os.getloadavg()[0])
    finally:
        _fast.state["simplejpeg"] = before
        loader.shutdown()
    print(f"# --decode-ab: 0 workers, {args.epochs} alternating rounds, load {min(loads):.1f}-{max(loads):.1f}")
    base = statistics.median(c for _, c in runs["torchvision decode_jpeg"])
    for name, r in runs.items():
        cpu = statistics.median(c for _, c in r)
        print(f"| {name} | {statistics.median(x for x, _ in r):7.1f}/s | CPU {cpu:.0f} µs/sample "
              f"(torchvision's / this: {base / cpu:.3f}) | rounds {[round(c) for _, c in r]} |", flush=True)


def run_peers(args: argparse.Namespace, paths: list[Path], root: Path) -> None:
    """``--peers``: the image table against every peer loader, then random access against LitData."""
    import os

    peers_python = args.peers_python or os.environ.get("PIPEKIT_PEERS_PYTHON")
    if not peers_python:
        raise SystemExit("--peers needs the peers environment's python: ./run bench shards --peers, or --peers-python")
    print(f"# peers ({peers_python}): {peer_versions(peers_python)}", flush=True)
    spec: dict[str, Any] = {
        "shards": [str(p) for p in paths], "samples": args.samples, "batch": args.batch, "buffer": args.buffer,
        "size": args.size, "convert_root": str(root.with_name(root.name + "-peers")),
    }
    names = [n for n in PEER_ORDER if n not in args.skip_peer]
    if not args.random_access_only:
        for workers in args.workers:
            # at 0 workers also pipekit decoding on 2 threads (a second core: shown as its own row)
            cell = [*names[:1], "pipekit, decode_threads=2", *names[1:]] if workers == 0 else names
            peers_cell(f"local, {workers} workers", cell, {**spec, "workers": workers}, peers_python, args.epochs,
                       profile=args.profile and workers == 0)
    ra = ["pipekit, random access", "litdata, random access"]
    for workers in args.workers:
        peers_cell(f"random access, local, {workers} workers", ra, {**spec, "workers": workers}, peers_python,
                   args.epochs)
    if args.skip_s3:
        return
    server, fs, remote = shards_on_s3(paths)
    try:
        fs.put(f"{spec['convert_root']}/litdata/", "shards/litdata/", recursive=True)
        s3 = {**spec, "shards": remote, "storage_options": server.storage_options, "litdata_url": "s3://shards/litdata"}
        for workers in args.workers:
            peers_cell(f"random access, S3, {workers} workers", ra, {**s3, "workers": workers}, peers_python,
                       args.epochs)
    finally:
        server.stop()


def shards_on_s3(paths: list[Path]) -> tuple[Any, Any, list[str]]:
    """The tests' real S3 server (SeaweedFS on loopback) holding ``paths`` under ``s3://shards/``, indexed.

    Returns the server (the caller stops it), an s3fs filesystem on it and the shards' URLs.
    """
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import s3fs

    from s3server import start_s3_server

    server = start_s3_server()
    try:
        fs = s3fs.S3FileSystem(**server.storage_options, skip_instance_cache=True)
        fs.mkdir("shards")
        for p in paths:
            fs.put_file(str(p), f"shards/{p.name}")
        remote = [f"s3://shards/{p.name}" for p in paths]
        datasets.index_shards(remote, server.storage_options)  # a scan of the shards' headers on S3
    except BaseException:
        server.stop()
        raise
    return server, fs, remote


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--buffer", type=int, default=1000, help="shuffle buffer (samples)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--size", type=int, default=224, help="RandomResizedCrop size")
    parser.add_argument("--epochs", type=int, default=2, help="timed epochs per loader (median)")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--skip-s3", action="store_true", help="local disk only")
    parser.add_argument("--skip-local", action="store_true", help="S3 only")
    parser.add_argument("--quick", action="store_true", help="2,000 samples, 1 timed epoch")
    parser.add_argument(
        "--resume-cost-only",
        action="store_true",
        help="only pipekit with resume on and off (more epochs for less noise)",
    )
    parser.add_argument("--skip-litdata", action="store_true", help="leave LitData out even where it is installed")
    parser.add_argument("--random-access-only", action="store_true",
                        help="only pipekit streaming (a) against random access (f)")
    parser.add_argument("--peers", action="store_true",
                        help="side by side against every peer loader, each in its own process (see above)")
    parser.add_argument("--peers-python", help="the peers environment's python (default: $PIPEKIT_PEERS_PYTHON)")
    parser.add_argument("--skip-peer", nargs="*", default=[], choices=PEER_ORDER[1:], help="with --peers")
    parser.add_argument("--decode-ab", action="store_true",
                        help="only pipekit at 0 workers, epochs alternating torchvision's and simplejpeg's decoder")
    parser.add_argument("--profile", action="store_true",
                        help="with --peers: a cProfile of pipekit's 0-worker epoch, and its stages timed apart")
    args = parser.parse_args()
    if args.quick:
        args.samples, args.epochs = 2000, 1

    torch.set_num_threads(1)
    root = default_cache_dir() / f"bench-shards-{args.samples}-{args.shards}"
    paths = write_shards(root, args.samples, args.shards, (320, 256))
    datasets.index_shards([str(p) for p in paths])  # for (f); indexes that match their shards are kept
    mib = sum(p.stat().st_size for p in paths) / 2**20
    print(
        f"# shards: {args.samples} JPEGs 320x256 in {args.shards} shards ({mib:.0f} MiB); "
        f"shuffle buffer {args.buffer}; decode + RandomResizedCrop({args.size}) + flip; batch {args.batch}"
    )
    against = "the fastest peer" if args.peers else "the faster of webdataset and LitData"
    print(
        f"# machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, "
        f"python {platform.python_version()}; samples/s, median of {args.epochs} epoch(s) after a warm-up, "
        f"ratios against {against}"
    )
    if args.decode_ab:
        decode_ab(paths, args)
        return
    if args.peers:
        if args.profile:
            profile_stages(paths, args)
        run_peers(args, paths, root)
        return
    lit_dir = None
    if args.skip_litdata or args.resume_cost_only or args.random_access_only:
        pass
    elif litdata_available():
        lit_dir = write_litdata(paths, root.with_name(root.name + "-litdata"), args.samples)
    else:
        print("# LitData not installed (pip install litdata, or the bench extra): not compared")
    local = [str(p) for p in paths]
    if not args.skip_local:
        for workers in args.workers:
            run_cell("local", local, args, workers, None, str(lit_dir) if lit_dir else None)
        if 2 in args.workers and not args.random_access_only:
            checkpoint_cost(local, args, None)
    if args.skip_s3:
        return
    server, fs, remote = shards_on_s3(paths)
    try:
        remote_lit = None
        if lit_dir is not None:
            fs.put(f"{lit_dir}/", "shards/litdata/", recursive=True)
            remote_lit = "s3://shards/litdata"
        if not args.random_access_only:
            register_wds_s3(server.storage_options)
        for workers in args.workers:
            run_cell("s3", remote, args, workers, server.storage_options, remote_lit)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
