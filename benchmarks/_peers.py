"""One loader of ``benchmarks/shards.py --peers`` in a process of its own, timed epoch by epoch on request.

``shards.py --peers`` starts one process of this module per loader: pipekit's
loaders with the ``dev``/``bench`` environment's python (pipekit's S3 needs its
s3fs), the peer loaders (webdataset, LitData, MosaicML Streaming, megatron-energon,
NVIDIA DALI's CPU pipeline) with the ``peers`` environment's (``./run bench shards
--peers`` builds it and passes its python as ``PIPEKIT_PEERS_PYTHON``: those
libraries need a botocore that s3fs refuses).  Each process builds its loader,
then answers one JSON line per command read on stdin:

* ``epoch``: one pass over the loader; ``{"n", "seconds", "cpu_us"}`` (samples,
  wall time, this process's CPU time per sample: all the work with 0 workers);
* ``memory``: the peak, so far, of the resident memory of the process and its
  children (DataLoader workers) added up, RSS and PSS (PSS shares a page between
  the processes that map it, so forked workers' shared pages count once);
* ``quit``.

The first line it writes is ``{"ready": true, "build_s": ...}`` once the loader is
built (or ``{"error": ...}``).  So the orchestrator can run the loaders of a cell
in alternating rounds (every loader's epoch 1, then every loader's epoch 2, ...)
while each keeps its persistent workers, and what each one holds in memory is
measured apart from the others.

The work is the same everywhere: the JPEG decoded to RGB uint8,
``RandomResizedCrop(size)`` and a horizontal flip (torchvision v2 ops; DALI
its own fused ``decoders.image_random_crop`` + ``resize`` + ``crop_mirror_normalize``,
as DALI users write it), batches of ``batch`` with the labels.
"""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

# ------------------------------------------------------------------------------------------ memory of a process tree


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def tree_memory(pid: int) -> tuple[int, int]:
    """RSS and PSS (bytes) of ``pid`` and all its descendants, added up."""
    rss = pss = 0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Rss:"):
                        rss += int(line.split()[1]) * 1024
                    elif line.startswith("Pss:"):
                        pss += int(line.split()[1]) * 1024
        except OSError:
            continue
        todo += _children(p)
    return rss, pss


class PeakMemory(threading.Thread):
    """Samples :func:`tree_memory` of this process every ``interval`` seconds while :meth:`active`, keeping the peaks.

    It samples only while this loader builds or runs an epoch: a sample reads ``smaps_rollup`` and the
    ``children`` of every thread of the process tree (~10 ms of CPU for a torch process), and the orchestrator
    keeps every loader's process alive between its turns, so a sampler left running in each idle process took
    ~20% of a core per process, away from the loader being timed.
    """

    def __init__(self, interval: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.interval = interval  # every 0.05 s it took ~20% of a core inside the process being timed
        self.rss = self.pss = 0
        self._on = threading.Event()

    def active(self, on: bool) -> None:
        if on:
            self._on.set()
        else:
            self._on.clear()
            self.sample()  # the state at the end of the work, whatever the sampling interval missed

    def sample(self) -> None:
        rss, pss = tree_memory(os.getpid())
        self.rss, self.pss = max(self.rss, rss), max(self.pss, pss)

    def run(self) -> None:
        while True:
            self._on.wait()
            self.sample()
            time.sleep(self.interval)


# -------------------------------------------------------------------------------------------------- the shared work


class DecodeCrop:
    """The JPEG bytes decoded (torchvision, RGB) and the recipe's ops run on it, with the label: ``(image, label)``."""

    def __init__(self, size: int, image: str = "jpg", label: str = "cls") -> None:
        from pipekit.datasets._recipe import standard_image_transforms

        self.ops = standard_image_transforms(size, train=True)
        self.image, self.label = image, label

    def __call__(self, sample: dict[str, Any]) -> tuple[torch.Tensor, int]:
        from torchvision.io import ImageReadMode, decode_image

        data = sample[self.image]
        image = decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), ImageReadMode.RGB)
        for op in self.ops:
            image = op(image)
        label = sample[self.label]
        return image, int(label.decode() if isinstance(label, bytes) else label)


def shard_samples(path: str) -> Iterator[dict[str, Any]]:
    """The ``{"jpg": bytes, "cls": int}`` samples of one tar shard, in order (the converters' input)."""
    pending: dict[str, dict[str, bytes]] = {}
    with tarfile.open(path) as tar:
        for member in tar:
            if not member.isfile():
                continue
            key, _, ext = member.name.partition(".")
            f = tar.extractfile(member)
            if f is None:
                raise ValueError(f"{path}: member {member.name} cannot be read")
            sample = pending.setdefault(key, {})
            sample[ext] = f.read()
            if "jpg" in sample and "cls" in sample:
                del pending[key]
                yield {"jpg": sample["jpg"], "cls": int(sample["cls"])}
    if pending:
        raise ValueError(f"{path}: incomplete samples {sorted(pending)[:3]}")


def _stamp(shards: list[str]) -> str:
    return json.dumps([[Path(p).name, Path(p).stat().st_size, Path(p).stat().st_mtime_ns] for p in shards])


def _converted(out: Path, shards: list[str]) -> bool:
    marker = out / "converted-from.json"
    return marker.exists() and marker.read_text() == _stamp(shards)


def _mark(out: Path, shards: list[str]) -> None:
    (out / "converted-from.json").write_text(_stamp(shards))


# ------------------------------------------------------------------------------------------------------ the loaders


def pipekit_streaming(spec: dict[str, Any], decode_threads: int = 0) -> Any:
    import pipekit
    from pipekit import datasets

    ds = datasets.TarShards(
        spec["shards"], batch_size=spec["batch"], shuffle_buffer=spec["buffer"], size=spec["size"],
        image_mode="RGB", storage_options=spec.get("storage_options"), decode_threads=decode_threads,
    )
    return pipekit.DataLoader(ds.pipe, num_workers=spec["workers"])


def pipekit_decode_threads(spec: dict[str, Any]) -> Any:
    """``TarShards(decode_threads=2)``: the JPEGs decoded on 2 threads beside the loop (uses a second core)."""
    return pipekit_streaming(spec, decode_threads=2)


class _IndexedSample(DecodeCrop):
    def __call__(self, sample: dict[str, Any]) -> tuple[torch.Tensor, int]:  # type: ignore[override]
        return super().__call__({"jpg": sample[".jpg"], "cls": sample[".cls"]})


def pipekit_indexed(spec: dict[str, Any]) -> Any:
    import pipekit
    from pipekit import datasets

    ds = datasets.IndexedShards(spec["shards"], storage_options=spec.get("storage_options"),
                                transform=_IndexedSample(spec["size"]))
    sampler = torch.utils.data.RandomSampler(ds)
    return pipekit.DataLoader(ds, sampler=sampler, batch_size=spec["batch"], num_workers=spec["workers"])


def webdataset_loader(spec: dict[str, Any]) -> Any:
    import webdataset as wds

    urls = spec["shards"]
    ds = (
        wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False)
        .shuffle(spec["buffer"])
        .map(DecodeCrop(spec["size"]))
        .batched(spec["batch"], partial=True)
    )
    w = spec["workers"]
    return torch.utils.data.DataLoader(ds, batch_size=None, num_workers=w, persistent_workers=w > 0)


def _litdata_dir(spec: dict[str, Any]) -> str:
    """The shards converted once with ``litdata.optimize`` (one chunk per shard), or ``spec["litdata_url"]``."""
    if spec.get("litdata_url"):
        return spec["litdata_url"]
    from litdata import optimize

    out = Path(spec["convert_root"]) / "litdata"
    if not _converted(out, spec["shards"]):
        import shutil

        shutil.rmtree(out, ignore_errors=True)
        optimize(fn=shard_samples, inputs=spec["shards"], output_dir=str(out),
                 chunk_size=-(-spec["samples"] // len(spec["shards"])), num_workers=1, reorder_files=False,
                 verbose=False)
        _mark(out, spec["shards"])
    return str(out)


def _litdata_dataset(spec: dict[str, Any], shuffle: bool, transform: Any) -> Any:
    import tempfile

    from litdata import StreamingDataset

    options = None
    so = spec.get("storage_options")
    if so:
        # litdata 0.2.76 fetches with obstore when installed, but without ``allow_http``: an http:// endpoint (the
        # loopback server) fails with "builder error: BadScheme".  Its boto3 path reads the same chunks.
        import litdata.streaming.downloader as downloader

        downloader._OBSTORE_AVAILABLE = False
        options = {"aws_access_key_id": so["key"], "aws_secret_access_key": so["secret"],
                   "endpoint_url": so["client_kwargs"]["endpoint_url"], "region_name": "us-east-1"}
    cache = tempfile.mkdtemp(prefix="bench-litdata-cache-")  # a cold chunk cache for each loader
    return StreamingDataset(_litdata_dir(spec), cache_dir=cache, shuffle=shuffle, transform=transform,
                            storage_options=options)


def litdata_streaming(spec: dict[str, Any]) -> Any:
    from litdata import StreamingDataLoader

    ds = _litdata_dataset(spec, True, DecodeCrop(spec["size"]))
    w = spec["workers"]
    return StreamingDataLoader(ds, batch_size=spec["batch"], num_workers=w, persistent_workers=w > 0)


class _ByIndex(torch.utils.data.Dataset):
    """A LitData ``StreamingDataset`` read by index (``ds[i]``), for torch's ``RandomSampler``."""

    def __init__(self, ds: Any) -> None:
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> Any:
        return self.ds[i]


def litdata_indexed(spec: dict[str, Any]) -> Any:
    ds = _ByIndex(_litdata_dataset(spec, False, DecodeCrop(spec["size"])))
    w = spec["workers"]
    return torch.utils.data.DataLoader(ds, sampler=torch.utils.data.RandomSampler(ds), batch_size=spec["batch"],
                                       num_workers=w, persistent_workers=w > 0)


def _mds_dir(spec: dict[str, Any]) -> str:
    from streaming import MDSWriter

    out = Path(spec["convert_root"]) / "mds"
    if not _converted(out, spec["shards"]):
        import shutil

        shutil.rmtree(out, ignore_errors=True)
        with MDSWriter(out=str(out), columns={"jpg": "bytes", "cls": "int"}, size_limit=1 << 26) as writer:
            for shard in spec["shards"]:
                for sample in shard_samples(shard):
                    writer.write(sample)
        _mark(out, spec["shards"])
    return str(out)


def mds_streaming(spec: dict[str, Any]) -> Any:
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    work = DecodeCrop(spec["size"])

    class Dataset(StreamingDataset):
        def __getitem__(self, i: int) -> Any:
            return work(super().__getitem__(i))

    ds = Dataset(local=_mds_dir(spec), shuffle=True, batch_size=spec["batch"])
    w = spec["workers"]
    return torch.utils.data.DataLoader(ds, batch_size=spec["batch"], num_workers=w, persistent_workers=w > 0)


LOADERS = {
    "pipekit": pipekit_streaming,
    "pipekit, decode_threads=2": pipekit_decode_threads,
    "pipekit, random access": pipekit_indexed,
    "webdataset": webdataset_loader,
    "litdata": litdata_streaming,
    "litdata, random access": litdata_indexed,
    "mosaicml-streaming": mds_streaming,
}


def _more_loaders() -> None:
    from _peers_more import dali_loader, energon_loader  # only the peers environment has them

    LOADERS["energon"] = energon_loader
    LOADERS["dali"] = dali_loader


# ---------------------------------------------------------------------------------------------------------- serving


def batch_len(batch: Any) -> int:
    if isinstance(batch, dict):
        return len(batch[".cls"])
    if isinstance(batch, list) and batch and isinstance(batch[0], dict):  # DALI's iterator: [{"jpg", "cls"}]
        return len(batch[0]["cls"])
    return len(batch[1])


def epoch(loader: Any) -> dict[str, float]:
    n = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for batch in loader:
        n += batch_len(batch)
    took = time.perf_counter() - t0
    return {"n": n, "seconds": took, "cpu_us": (time.process_time() - c0) / max(n, 1) * 1e6}


def serve(spec: dict[str, Any]) -> None:
    """Build ``spec["loader"]``, then answer commands on stdin (see the module's docstring)."""
    torch.set_num_threads(1)
    out = sys.stdout
    sys.stdout = sys.stderr  # the libraries' prints must not mix with the answers
    memory = PeakMemory()
    memory.start()
    memory.active(True)
    name = spec["loader"]
    try:
        if name not in LOADERS:
            _more_loaders()
        t0 = time.perf_counter()
        loader = LOADERS[name](spec)
        answer: dict[str, Any] = {"ready": True, "build_s": time.perf_counter() - t0}
    except Exception as exc:  # reported to the orchestrator, which leaves this loader out
        answer = {"error": f"{type(exc).__name__}: {exc}"}
    memory.active(False)
    out.write(json.dumps(answer) + "\n")
    out.flush()
    if "error" in answer:
        return
    for line in sys.stdin:
        command = line.strip()
        memory.active(command in ("epoch", "profile"))
        if command == "epoch":
            answer = epoch(loader)
        elif command == "memory":
            rss, pss = tree_memory(os.getpid())
            answer = {"rss": max(memory.rss, rss), "pss": max(memory.pss, pss)}
        elif command == "profile":
            import cProfile
            import pstats

            prof = cProfile.Profile()
            prof.enable()
            answer = epoch(loader)
            prof.disable()
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
            answer["profile"] = text.getvalue()
        else:
            break
        memory.active(False)
        out.write(json.dumps(answer) + "\n")
        out.flush()
    shutdown = getattr(loader, "shutdown", None)
    if callable(shutdown):
        shutdown()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    serve(json.loads(sys.argv[1]))
