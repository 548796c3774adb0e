"""The pipelines and loaders the resume contract harness composes (``tests/test_resume_contract.py``).

A :class:`Case` is everything one example draws: a source, a chain of operations, where the
``sharding_filter`` goes, the DataLoader's arguments, the checkpoint point, how the checkpoint is
stored, and an injected fault.  :func:`build_pipe` turns it into a pipeline over the real files of a
:class:`Corpus` (a folder of binary files, WebDataset tar shards of JPEGs, an image folder of JPEGs,
all written by :func:`write_corpus`).  Every function a pipeline holds is defined here at module level,
so pipelines pickle into DataLoader workers and into checkpoints.
"""

from __future__ import annotations

import shutil
import threading
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

import pipekit
from pipekit import datasets
from pipekit.pipes import IterableWrapper
from pipekit.pipes.base import IterDataPipe
from pipekit.synthetic import write_image_folder, write_image_shards

# sources: ints, binary files (a fixed list, or listed at iteration), tar shards through load_from_tar +
# webdataset + decode (optionally with torchdata's idiom of a shuffle buffer before decode), and two recipes
SOURCES = ("ints", "files", "listed_files", "tar", "tar_shuffled_streams", "tarshards", "imagefolder")
FILE_SOURCES = SOURCES[1:]
RECIPES = ("tarshards", "imagefolder")
# the checkpoint points: before iter(), right after iter(), after k batches (k drawn as a fraction of the
# epoch), right after the last batch (before StopIteration), after the epoch ended
POINTS = ("before", "after_iter", "mid", "last", "end")
# faults injected: a file deleted / replaced between checkpoint and resume, an unpicklable item
# (a lock or a generator nested in a dict), a read error (a missing or corrupt file) with on_error raise / skip
FAULTS = (None, "delete", "replace", "lock", "generator", "read_error")
N_INTS = 30
N_FILES = 16
N_SHARDS = 3
PER_SHARD = 5
PER_CLASS = 3  # x 4 classes


@dataclass(frozen=True)
class Case:
    """One drawn example of the contract."""

    source: str
    ops: tuple[tuple[Any, ...], ...] = ()
    shard_at: int | None = 0  # sharding_filter before ops[shard_at]; -1: on the file list; None: the recipe's own
    num_workers: int = 0
    persistent: bool = True
    prefetch_factor: int | None = None
    batch_size: int | None = None  # the DataLoader's (collate); None: the pipe's items as they are
    recipe_batch: int | None = None  # the recipe's own batch_size (TarShards, ImageFolder)
    point: str = "mid"
    fraction: float = 0.5  # for "mid": k = round(fraction * batches)
    via: str = "pickle"  # or "torch_save": torch.save + torch.load(weights_only=True)
    fault: str | None = None
    victim: int = 0  # which file the fault hits
    on_error: str = "raise"
    seed: int = 0
    # the training loop seeds the DataLoader's generator= at each epoch's start (True), or once, when it is made
    # (False: the epochs after a resumed one then come only from what the checkpoint kept of the generator)
    reseed: bool = True

    def short(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if v != _DEFAULTS.get(k))


_DEFAULTS: dict[str, Any] = {}
_DEFAULTS.update({k: v for k, v in vars(Case(source="")).items() if k != "source"})


@dataclass
class Corpus:
    """The real files of one example (a fresh copy when the example changes them)."""

    root: Path
    alt: Path  # same names, other contents: what a "replace" fault writes
    files: list[Path] = field(default_factory=list)
    shards: list[Path] = field(default_factory=list)
    images: list[Path] = field(default_factory=list)


def write_corpus(root: Path) -> Corpus:
    """Binary files, tar shards of JPEGs and an image folder under ``root`` (and other contents under ``root/alt``)."""
    for base, seed in ((root / "data", 0), (root / "alt", 1)):
        (base / "files").mkdir(parents=True)
        for i in range(N_FILES):
            (base / "files" / f"f{i:03d}.bin").write_bytes(bytes([i + 16 * seed]) * (20 + i))
        write_image_shards(base / "shards", shards=N_SHARDS, per_shard=PER_SHARD, size=16, seed=seed, progress=False)
        write_image_folder(base / "images", per_class=PER_CLASS, size=16, vary_size=False, seed=seed, progress=False)
    return corpus_at(root / "data", root / "alt")


def corpus_at(data: Path, alt: Path) -> Corpus:
    return Corpus(
        data,
        alt,
        files=sorted((data / "files").glob("*.bin")),
        shards=sorted((data / "shards").glob("*.tar")),
        images=sorted((data / "images").rglob("*.jpg")),
    )


def copy_corpus(corpus: Corpus, dest: Path) -> Corpus:
    shutil.copytree(corpus.root, dest)
    return corpus_at(dest, corpus.alt)


def victim_of(case: Case, corpus: Corpus) -> Path:
    """The file a fault hits: one of the files the source reads."""
    pool = {"files": corpus.files, "listed_files": corpus.files, "imagefolder": corpus.images}.get(case.source,
                                                                                                    corpus.shards)
    return pool[case.victim % len(pool)]


def change_file(case: Case, corpus: Corpus) -> Path:
    """Delete or replace (same name, other contents) the victim file; returns it."""
    victim = victim_of(case, corpus)
    if case.fault == "delete":
        victim.unlink()
    else:
        victim.write_bytes((corpus.alt / victim.relative_to(corpus.root)).read_bytes())
    return victim


def corrupt_jpeg(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 3:] = b"\x00" * (len(data) - len(data) // 3)
    path.write_bytes(bytes(data))


# --- the functions pipelines hold (module level: they pickle) -------------------------------------------


def key_of(x: Any) -> str:
    """A cheap, deterministic identity of an item (for filters, classifiers and lengths).

    A path counts by its last two parts (``files/f004.bin``, ``shard-000001.tar/sample00100001``): each example
    copies the corpus to a folder of its own, whose name must not decide what a filter keeps or a demux routes,
    else a case's outcome would depend on the folder (a failing case would not fail again when pinned).
    """
    if isinstance(x, str):
        return "/".join(x.rsplit("/", 2)[-2:])
    if isinstance(x, int):
        return str(x)
    if isinstance(x, bytes):
        return f"b{zlib.crc32(x)}"
    if isinstance(x, dict):
        return "|".join(key_of(v) for _, v in sorted(x.items(), key=lambda kv: str(kv[0])))
    if isinstance(x, (list, tuple)):
        return "|".join(key_of(v) for v in x)
    if isinstance(x, torch.Tensor):
        return f"t{tuple(x.shape)}"
    return type(x).__name__


def tag(x: Any) -> Any:
    """A 1-to-1 map (on each item of a batch: a batch stays a list)."""
    if isinstance(x, list):
        return [tag(v) for v in x]
    return ("m", x)


def keep(x: Any) -> bool:
    return zlib.crc32(key_of(x).encode()) % 4 != 0


def parity(x: Any) -> int:
    return zlib.crc32(key_of(x).encode()) % 2


def token_len(x: Any) -> int:
    return 1 + zlib.crc32(key_of(x).encode()) % 3


def read_and_close(item: tuple[str, Any]) -> tuple[str, bytes]:
    url, stream = item
    data = stream.read()
    stream.close()
    return url, data


def with_lock(x: Any) -> Any:
    """The item in a dict beside a lock, one level down (a batch stays a list of such dicts)."""
    if isinstance(x, list):
        return [with_lock(v) for v in x]
    return {"item": x, "extra": {"lock": threading.Lock()}}


def with_generator(x: Any) -> Any:
    if isinstance(x, list):
        return [with_generator(v) for v in x]
    return {"item": x, "extra": {"gen": (i for i in range(2))}}


# --- building --------------------------------------------------------------------------------------------


def _source(case: Case, corpus: Corpus) -> IterDataPipe:
    shard_files = case.shard_at == -1
    if case.source == "ints":
        return IterableWrapper(range(N_INTS))
    if case.source in ("files", "listed_files"):
        if case.source == "listed_files":
            pipe = IterableWrapper([str(corpus.root / "files")]).list_files_by_fsspec(masks="*.bin")
        else:
            paths = [str(p) for p in corpus.files]
            if case.fault == "read_error":
                paths.insert(case.victim % len(paths), str(corpus.root / "files" / "missing.bin"))
            pipe = IterableWrapper(paths)
        if shard_files:
            pipe = pipe.sharding_filter()
        return pipe.open_files_by_fsspec(mode="rb", on_error=case.on_error).map(read_and_close)
    if case.source in ("tar", "tar_shuffled_streams"):
        paths = [str(p) for p in corpus.shards]
        if case.fault == "read_error":
            paths.insert(case.victim % len(paths), str(corpus.root / "shards" / "missing.tar"))
        pipe = IterableWrapper(paths)
        if shard_files:
            pipe = pipe.sharding_filter()
        pipe = pipe.open_files_by_fsspec(mode="rb", on_error=case.on_error).load_from_tar().webdataset()
        if case.source == "tar_shuffled_streams":  # torchdata's idiom: shuffle the samples, then decode
            pipe = pipe.shuffle(buffer_size=4)
        return pipe.decode(on_error=case.on_error)
    if case.source == "tarshards":
        urls = [str(p) for p in corpus.shards]
        if case.fault == "read_error":
            urls.insert(case.victim % len(urls), str(corpus.root / "shards" / "missing.tar"))
        return datasets.TarShards(urls, batch_size=case.recipe_batch, shuffle_buffer=4, on_error=case.on_error)
    if case.source == "imagefolder":
        return datasets.ImageFolder(corpus.root / "images", train=True, size=8, batch_size=case.recipe_batch,
                                    on_error=case.on_error)
    raise ValueError(case.source)


def _apply(pipe: IterDataPipe, op: tuple[Any, ...]) -> IterDataPipe:
    name, *args = op
    if name == "shuffle":
        return pipe.shuffle(buffer_size=args[0])
    if name == "map":
        return pipe.map(tag)
    if name == "filter":
        return pipe.filter(keep)
    if name == "batch":
        return pipe.batch(args[0])
    if name == "unbatch":
        return pipe.unbatch()
    if name == "in_batch_shuffle":
        return pipe.in_batch_shuffle()
    if name == "bucketbatch":
        return pipe.bucketbatch(batch_size=args[0], batch_num=2, bucket_num=1)
    if name == "max_token":
        return pipe.max_token_bucketize(max_token_count=args[0], len_fn=token_len, buffer_size=6)
    if name == "zip":
        return pipe.zip(IterableWrapper(range(1000)))
    if name == "fork_zip":
        a, b = pipe.fork(2)
        return a.zip(b.map(tag))
    if name == "demux_mux":
        a, b = pipe.demux(2, parity)
        return a.mux(b)
    if name == "cycle":
        return pipe.cycle(args[0])
    if name == "header":
        return pipe.header(args[0])
    if name == "cache":
        return pipe.in_memory_cache()
    if name == "lock":
        return pipe.map(with_lock)
    if name == "generator":
        return pipe.map(with_generator)
    raise ValueError(name)


def build_pipe(case: Case, corpus: Corpus) -> IterDataPipe:
    pipe = _source(case, corpus)
    for i, op in enumerate(case.ops):
        if case.shard_at == i:
            pipe = pipe.sharding_filter()
        pipe = _apply(pipe, op)
    if case.shard_at is not None and case.shard_at >= len(case.ops):
        pipe = pipe.sharding_filter()
    return pipe


def make_loader(case: Case, corpus: Corpus, generator: torch.Generator) -> pipekit.DataLoader:
    kwargs: dict[str, Any] = {"num_workers": case.num_workers, "batch_size": case.batch_size, "generator": generator}
    if case.num_workers:
        kwargs.update(persistent_workers=case.persistent, prefetch_factor=case.prefetch_factor)
    return pipekit.DataLoader(build_pipe(case, corpus), **kwargs)


# --- comparing outputs -----------------------------------------------------------------------------------


def plain(x: Any) -> Any:
    """An output as plain, comparable values (tensors by dtype, shape and a digest of their bytes)."""
    if isinstance(x, torch.Tensor):
        data = x.detach().cpu().contiguous()
        return ("tensor", str(data.dtype), tuple(data.shape), zlib.crc32(data.numpy().tobytes()))
    if isinstance(x, np.ndarray):
        return ("array", str(x.dtype), x.shape, zlib.crc32(np.ascontiguousarray(x).tobytes()))
    if isinstance(x, bytes):
        return ("bytes", len(x), zlib.crc32(x))
    if isinstance(x, dict):
        return tuple(sorted((str(k), plain(v)) for k, v in x.items()))
    if isinstance(x, (list, tuple)):
        return tuple(plain(v) for v in x)
    if isinstance(x, (int, float, str, bool)) or x is None:
        return x
    return ("object", type(x).__name__)


def strings_in(x: Any, out: list[str] | None = None) -> list[str]:
    """Every string in a plain output: the identities of file-based items (paths, keys, URLs)."""
    out = [] if out is None else out
    if isinstance(x, str):
        out.append(x)
    elif isinstance(x, tuple):
        for v in x:
            strings_in(v, out)
    return out


def has_empty_bytes(x: Any) -> bool:
    if isinstance(x, tuple):
        if len(x) == 3 and x[0] == "bytes":
            return x[1] == 0
        return any(has_empty_bytes(v) for v in x)
    return False
