"""Issue 13 end to end: a damaged shard is never lost silently, with or without DataLoader workers.

The unit tests live with their modules (``tests/pipes/test_archives.py::TestTruncation``,
``tests/test_loader.py::TestNothingLostAcrossWorkers``); these run the scenarios of the
issue through ``datasets.TarShards`` (``datasets.WebDataset``) and ``pipekit.DataLoader``.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import io
import os
import pkgutil
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import pipekit
import pipekit.webdataset as wds
from pipekit import datasets
from pipekit.datasets._recipe import Recipe
from pipekit.errors import ArchiveError
from pipekit.pipes import IterableWrapper
from pipekit.pipes._resume import pipeline_pipes, prepare_for_resume
from pipekit.synthetic import write_image_folder, write_image_shards
from pipekit.webdataset._loader import LoaderSource

SHARDS, PER_SHARD = 4, 5


@pytest.fixture(scope="module")
def damaged(tmp_path_factory) -> tuple[Path, int]:
    """Four shards; shard 1 cut at a member boundary (where tarfile used to stop quietly).

    Returns the folder and how many complete samples shard 1 still holds.
    """
    root = tmp_path_factory.mktemp("shards")
    write_image_shards(root, shards=SHARDS, per_shard=PER_SHARD, size=16, progress=False)
    path = root / "shard-000001.tar"
    with tarfile.open(path) as tar:
        members = tar.getmembers()
    per_sample = len(members) // PER_SHARD
    cut = members[2 * per_sample].offset  # the header of sample 2's first member
    path.write_bytes(path.read_bytes()[:cut])
    return root, 2


def keys(loader) -> list[str]:
    return [sample["__key__"] for sample in loader]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_cut_shard_raises_naming_it(damaged, num_workers):
    root, _ = damaged
    ds = datasets.WebDataset(str(root), train=False, batch_size=None)
    with pytest.raises(ArchiveError, match=r"shard-000001\.tar.* in load_from_tar: truncated") as info:
        keys(pipekit.DataLoader(ds, num_workers=num_workers))
    assert info.value.url == str(root / "shard-000001.tar")
    assert "(4 members yielded before)" in info.value.reason


@pytest.mark.parametrize("num_workers", [0, 2])
def test_cut_shard_skipped_is_reported(damaged, num_workers):
    root, complete = damaged
    ds = datasets.TarShards(str(root), train=False, batch_size=None, on_error="skip")
    loader = pipekit.DataLoader(ds, num_workers=num_workers)
    got = keys(loader)
    assert len(got) == (SHARDS - 1) * PER_SHARD + complete
    report = loader.skip_report()
    assert report.counts == {"load_from_tar": 1}
    (skipped,) = report.skipped
    assert skipped.url == str(root / "shard-000001.tar") and skipped.stage == "load_from_tar"
    assert skipped.reason.startswith("truncated") and "(4 members yielded before)" in skipped.reason


# ---------------------------------------------------------------- checkpoints load with torch.load(weights_only=True)
#
# A checkpoint is loaded from disk later, maybe by someone else: ``torch.load(weights_only=True)`` (torch's
# default since 2.6) refuses any pickled class but builtins and tensors.  Each resumable pipe (outside geo/,
# whose samplers another change covers) gets a pipeline below; ``test_every_resumable_pipe_is_covered``
# fails when a new resumable pipe has none.


def add_one(x):
    return x + 1


async def async_add_one(x):
    return x + 1


def add_one_each(batch):
    return [x + 1 for x in batch]


def twice(x):
    return [x, x]


def first_of(pair):
    return pair[0]


def pair_sum(a, b):
    return a[1] + b[1]


def length(x):
    return len(x)


def to_path(root: str, name: str) -> str:
    return os.path.join(root, f"{name}.txt")


def fetch(name: str) -> tuple[str, str]:
    return name, name.upper()


def shuffled_pairs(n: int = 12):
    return IterableWrapper([(f"k{i}", i) for i in range(n)])


def write_text_files(root: Path) -> list[str]:
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(3):
        path = root / f"t{i}.csv"
        path.write_text("".join(f"a{i}{j},b{j}\n" for j in range(4)))
        paths.append(str(path))
    return paths


def write_archives(root: Path) -> tuple[list[str], list[str]]:
    root.mkdir(parents=True, exist_ok=True)
    tars, zips = [], []
    for i in range(2):
        tar_path, zip_path = root / f"s{i}.tar", root / f"s{i}.zip"
        with tarfile.open(tar_path, "w") as tar, zipfile.ZipFile(zip_path, "w") as zf:
            for k in range(3):
                for ext in ("txt", "cls"):
                    data = f"{i}-{k}-{ext}".encode()
                    info = tarfile.TarInfo(f"{k:04d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
                    zf.writestr(f"{k:04d}.{ext}", data)
        tars.append(str(tar_path))
        zips.append(str(zip_path))
    return tars, zips


def read_pair(item):
    url, stream = item
    try:
        return url, stream.read()
    finally:
        stream.close()


def read_sample(sample: dict) -> dict:
    return {k: (v if k.startswith("__") else v.read()) for k, v in sample.items()}


def pipelines(tmp: Path) -> dict[str, Callable[[], Any]]:
    """One pipeline (a builder) per resumable pipe, each taking a few items before the checkpoint."""
    from torchvision.transforms import v2

    from pipekit.datasets._recipe import ListSource
    from pipekit.pipes import SampleMultiplexer, SequenceWrapper
    from pipekit.transforms import BatchRandomCrop

    texts = write_text_files(tmp / "texts")
    tars, zips = write_archives(tmp / "archives")
    cache = str(tmp / "cache")
    os.makedirs(cache, exist_ok=True)
    images = tmp / "images"
    write_image_shards(images / "shards", shards=2, per_shard=4, size=8, progress=False)
    write_image_folder(images / "folder", per_class=3, size=8, progress=False)
    opened = functools.partial(IterableWrapper, texts)

    return {
        "shuffle+sharding_filter+batch": lambda: IterableWrapper(range(20)).shuffle(buffer_size=5).sharding_filter()
        .batch(3),
        "header+enumerate+add_index": lambda: IterableWrapper([{"x": i} for i in range(9)]).header(7).add_index()
        .enumerate(),
        "cycle+repeat": lambda: IterableWrapper(range(3)).cycle(2).repeat(2),
        "bucketbatch+in_batch_shuffle": lambda: IterableWrapper(range(20)).bucketbatch(batch_size=3, batch_num=2)
        .in_batch_shuffle(),
        "max_token_bucketize": lambda: IterableWrapper(["a" * (i % 5 + 1) for i in range(12)])
        .max_token_bucketize(max_token_count=6, len_fn=length, buffer_size=4),
        "lines_to_paragraphs": lambda: IterableWrapper([("f", f"l{i}" if i % 3 else "") for i in range(15)])
        .lines_to_paragraphs(),
        "to_map_datapipe+to_iter_datapipe": lambda: shuffled_pairs().to_map_datapipe()
        .to_iter_datapipe(indices=[f"k{i}" for i in range(12)]),
        "on_disk_cache+end_caching": lambda: IterableWrapper(["a", "b", "c", "d"])
        .on_disk_cache(filepath_fn=functools.partial(to_path, cache)).map(fetch)
        .end_caching(mode="w", same_filepath_fn=True),
        "fullsync": lambda: IterableWrapper(range(6)).fullsync(),
        "flatmap+shuffled_flatmap+map_batches": lambda: IterableWrapper(range(8)).flatmap(twice)
        .shuffled_flatmap(twice, buffer_size=3).map_batches(add_one_each, batch_size=2),
        "threadpool_map": lambda: IterableWrapper(range(10)).threadpool_map(add_one, max_workers=2),
        "async_map_batches": lambda: IterableWrapper(range(10)).async_map_batches(async_add_one, 3),
        "write_shards": lambda: IterableWrapper([{"__key__": f"s{i}", "cls": i} for i in range(8)])
        .write_shards(str(tmp / "written" / "s-%03d.tar"), maxcount=2, mtime=0),
        "in_memory_cache": lambda: IterableWrapper(range(8)).in_memory_cache(size=100),
        "mux_longest": lambda: IterableWrapper(range(3)).mux_longest(IterableWrapper(range(10, 15))),
        "SampleMultiplexer": lambda: SampleMultiplexer({IterableWrapper(range(5)): 0.5,
                                                        IterableWrapper(range(10, 15)): 0.5}, seed=1),
        "readlines": lambda: opened().open_files_by_fsspec().readlines(),
        "parse_csv": lambda: opened().open_files_by_fsspec().parse_csv(),
        "parse_csv_as_dict": lambda: opened().open_files_by_fsspec().parse_csv_as_dict(fieldnames=["a", "b"]),
        "prefetch+pin_memory": lambda: IterableWrapper([torch.full((2,), i) for i in range(10)]).prefetch(3)
        .pin_memory(device="cpu"),
        "augment": lambda: IterableWrapper([{"image": torch.arange(108.0).reshape(3, 6, 6)} for _ in range(5)])
        .augment([v2.RandomHorizontalFlip()]),
        "augment_batch": lambda: IterableWrapper([{"image": torch.arange(384.0).reshape(2, 3, 8, 8)}] * 4)
        .augment_batch(BatchRandomCrop(4)),
        "round_robin_demux": lambda: IterableWrapper(range(10)).round_robin_demux(2, buffer_size=10)[0],
        "unzip": lambda: IterableWrapper([(i, -i) for i in range(8)]).unzip(2, buffer_size=10)[1],
        "random_split": lambda: IterableWrapper(range(10)).random_split(
            total_length=10, weights={"a": 0.5, "b": 0.5}, seed=0, target="a"),
        "shard_expand+list_files_by_fsspec": lambda: IterableWrapper([str(tmp / "texts" / "t{0..2}.csv")])
        .shard_expand().list_files_by_fsspec(),
        "list_files": lambda: IterableWrapper([str(tmp / "texts")]).list_files(masks="*.csv"),
        "load_from_tar+webdataset": lambda: IterableWrapper(tars).open_files_by_fsspec(mode="rb").load_from_tar()
        .webdataset().map(read_sample),
        "wds.WebDataset": lambda: wds.WebDataset(tars, shardshuffle=True, seed=0, empty_check=True,
                                                 nodesplitter=wds.split_by_node, workersplitter=wds.split_by_worker)
        .batched(2).unbatched().slice(0, 5),
        "wds.WebDataset(resampled)": lambda: wds.WebDataset(tars, resampled=True, seed=0).with_epoch(6),
        "load_from_zip": lambda: IterableWrapper(zips).open_files_by_fsspec(mode="rb").load_from_zip()
        .map(read_pair),
        "zip_longest+zip_with_iter": lambda: shuffled_pairs(6).zip_with_iter(
            shuffled_pairs(8), key_fn=first_of, ref_key_fn=first_of, merge_fn=pair_sum, buffer_size=4)
        .zip_longest(IterableWrapper(range(3))),
        "ListSource": lambda: ListSource(list(range(8)), shuffle=True),
        "SequenceWrapper+to_iter_datapipe": lambda: SequenceWrapper(list(range(6))).to_iter_datapipe(),
        "datasets.TarShards": lambda: datasets.TarShards(str(images / "shards"), batch_size=2, shuffle_buffer=3),
        # training crops: the augment pipe that runs torchvision's ops on the plain image tensor
        "datasets.TarShards(size)": lambda: datasets.TarShards(str(images / "shards"), batch_size=2, shuffle_buffer=3,
                                                               size=8),
        "datasets.ImageFolder": lambda: datasets.ImageFolder(str(images / "folder"), batch_size=2),
        # encoded JPEGs with their crop and flip, decoded on the device later (JpegCropParams)
        "datasets.TarShards(decode_device)": lambda: datasets.TarShards(
            str(images / "shards"), batch_size=2, shuffle_buffer=3, size=8, decode_device="cpu"),
    }


PIPELINES = [
    "shuffle+sharding_filter+batch", "header+enumerate+add_index", "cycle+repeat", "bucketbatch+in_batch_shuffle",
    "max_token_bucketize", "lines_to_paragraphs", "to_map_datapipe+to_iter_datapipe", "on_disk_cache+end_caching",
    "fullsync", "flatmap+shuffled_flatmap+map_batches", "threadpool_map", "async_map_batches", "write_shards",
    "in_memory_cache", "mux_longest",
    "SampleMultiplexer", "readlines", "parse_csv", "parse_csv_as_dict", "prefetch+pin_memory", "augment",
    "augment_batch", "round_robin_demux", "unzip", "random_split", "shard_expand+list_files_by_fsspec",
    "list_files", "load_from_tar+webdataset", "wds.WebDataset", "wds.WebDataset(resampled)",
    "load_from_zip", "zip_longest+zip_with_iter", "ListSource",
    "SequenceWrapper+to_iter_datapipe", "datasets.TarShards", "datasets.TarShards(size)", "datasets.ImageFolder",
    "datasets.TarShards(decode_device)",
]


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def modes(state: Any) -> list[str]:
    """The ``mode`` of every pipekit worker state found in a DataLoader state."""
    if isinstance(state, dict):
        found = [state["mode"]] if isinstance(state.get("mode"), str) and "yielded" in state else []
        return found + [m for v in state.values() for m in modes(v)]
    return []


@pytest.fixture(scope="module")
def builders(tmp_path_factory) -> dict[str, Callable[[], Any]]:
    return pipelines(tmp_path_factory.mktemp("checkpoints"))


@pytest.mark.parametrize("name", PIPELINES)
def test_checkpoint_loads_with_weights_only(builders, name):
    make = builders[name]
    torch.manual_seed(0)
    loader = pipekit.DataLoader(make(), pin_memory=False)
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    state = loader.state_dict()
    rest = list(it)
    assert head and modes(state) == ["snapshot"] * len(modes(state)) and modes(state), modes(state)
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    resumed = pipekit.DataLoader(make(), pin_memory=False)
    resumed.load_state_dict(loaded)
    assert same(list(resumed), rest)


def test_checkpoint_with_workers_loads_with_weights_only(builders):
    torch.manual_seed(0)
    loader = pipekit.DataLoader(builders["datasets.TarShards"](), num_workers=2, pin_memory=False)
    it = iter(loader)
    next(it)
    buf = io.BytesIO()
    torch.save(loader.state_dict(), buf)
    buf.seek(0)
    resumed = pipekit.DataLoader(builders["datasets.TarShards"](), num_workers=2, pin_memory=False)
    resumed.load_state_dict(torch.load(buf, weights_only=True))
    assert same(list(resumed), list(it))


def resumable_classes() -> set[type]:
    """Every concrete pipekit pipe class with state_dict/load_state_dict, outside geo/.

    Not the loader's wrapper, nor the timed copies of pipes that pipekit.profiling makes at run time.
    """
    from pipekit.pipes.base import IterDataPipe, MapDataPipe

    found: set[type] = set()
    for info in pkgutil.walk_packages(pipekit.__path__, "pipekit."):
        skipped = ("pipekit.cli", "pipekit.__main__", "pipekit.geo", "pipekit._loader", "pipekit.profiling")
        if info.name.startswith(skipped):
            continue
        module = importlib.import_module(info.name)
        for obj in vars(module).values():
            if (inspect.isclass(obj) and issubclass(obj, IterDataPipe | MapDataPipe)
                    and obj.__module__.startswith("pipekit.")
                    and not obj.__module__.startswith(("pipekit.geo", "pipekit.profiling", "pipekit.pipes.state"))
                    and callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))):
                found.add(obj)
    # wds.WebLoader's source wraps a DataLoader (it is the loader's batches, not a pipe a DataLoader runs):
    # its resume is tested in tests/test_webdataset_compat.py
    found -= {LoaderSource}
    return {cls for cls in found if not any(other is not cls and issubclass(other, cls) for other in found)}


def test_every_resumable_pipe_is_covered(builders):
    covered: set[type] = set()
    for make in builders.values():
        pipe = make()
        pipe = pipe.source_datapipe if isinstance(pipe, Recipe) else pipe
        covered |= {type(dp) for dp in pipeline_pipes(prepare_for_resume(pipe))}
    assert sorted(builders) == sorted(PIPELINES)
    missing = sorted(f"{c.__module__}.{c.__qualname__}" for c in resumable_classes() - covered)
    assert missing == [], "add a pipeline for these to pipelines() above"
