"""Every exported pipe round-trips through ``pickle`` (and ``dill`` when it is installed).

torch's DataLoader pickles a pipeline into each worker, ``DataLoader2.state_dict()`` pickles the
pipeline itself, and torchdata's pipes holding lambdas pickled with ``dill``.  Each exported pipe
class has a factory below that builds it on real data (files written to ``tmp_path``, a tar
archive, a PNG, an HTTP server on loopback); the tests pickle it before, during and after an
epoch and check that the copy yields the same epoch.  ``test_every_exported_pipe_has_a_factory``
fails when a new pipe is exported without one.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import pickle
import tarfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

import pipekit.pipes as pipes
from pipekit.pipes import IterableWrapper, SequenceWrapper
from pipekit.pipes.base import IterDataPipe, MapDataPipe
from pipekit.transforms import BatchRandomHorizontalFlip, RandomRot90

try:
    import dill
except ImportError:  # dill is a dev dependency; without it only the pickle tests run
    dill = None

BASES = {"IterDataPipe", "MapDataPipe"}
PIPE_NAMES = sorted(
    name
    for name in pipes.__all__
    if name not in BASES
    and isinstance(getattr(pipes, name), type)
    and issubclass(getattr(pipes, name), IterDataPipe | MapDataPipe)
)


# -- module-level callables (picklable by reference) -----------------------------------------------


def add_one(x: int) -> int:
    return x + 1


def is_even(x: int) -> bool:
    return x % 2 == 0


def parity(x: int) -> int:
    return x % 2


def pair(x: int) -> tuple[int, int]:
    return x, x * 10


def twice(x: int) -> list[int]:
    return [x, x]


def sum_batch(batch: list[int]) -> list[int]:
    return [sum(batch)]


def first(x: Any) -> Any:
    return x[0]


def merge(a: Any, b: Any) -> tuple[Any, Any]:
    return a, b


def decode_txt(key: str, data: bytes) -> str | None:
    return data.decode() if key.endswith(".txt") else None


# -- real data -----------------------------------------------------------------------------------


def png_bytes() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (3, 2), (0, 128, 255)).save(buf, "PNG")
    return buf.getvalue()


def tar_bytes(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class Data:
    """Files the factories read: a few text files, a CSV, JSON, a tar, a zip, a gzip and a PNG."""

    def __init__(self, root: Path, http_url: str) -> None:
        import bz2
        import gzip
        import lzma
        import zipfile

        self.root = root
        self.http_url = http_url
        (root / "a.txt").write_text("alpha\nbeta\n\ngamma\n")
        (root / "b.txt").write_text("delta\n")
        (root / "t.csv").write_text("x,y\n1,2\n3,4\n")
        (root / "j.json").write_text('{"k": [1, 2]}')
        members = {"s0.txt": b"zero", "s0.cls": b"0", "s1.txt": b"one", "s1.cls": b"1"}
        (root / "w.tar").write_bytes(tar_bytes(members))
        with zipfile.ZipFile(root / "z.zip", "w") as zf:
            zf.writestr("in.txt", "zipped")
        (root / "g.txt.gz").write_bytes(gzip.compress(b"gzipped"))
        (root / "g.txt.bz2").write_bytes(bz2.compress(b"bzipped"))
        (root / "g.txt.xz").write_bytes(lzma.compress(b"xzipped"))
        (root / "i.png").write_bytes(png_bytes())
        self.out = root / "out"
        self.out.mkdir()

    def path(self, name: str) -> str:
        return str(self.root / name)

    def opened(self, *names: str, mode: str = "b") -> IterDataPipe:
        return pipes.FileOpener(IterableWrapper([self.path(n) for n in names]), mode=mode)

    def out_path(self, item: Any) -> str:
        return str(self.out / Path(str(item[0])).name)


def out_name(root: str, name: str) -> str:
    return str(Path(root) / f"{name}.cache")


def fetch(name: str) -> tuple[str, bytes]:
    return name, name.encode()


async def async_add_one(x: int) -> int:
    return x + 1


def nums(n: int = 6) -> IterableWrapper:
    return IterableWrapper(list(range(n)))


def samples(n: int = 3) -> IterableWrapper:
    gen = torch.Generator().manual_seed(0)
    return IterableWrapper([{"image": torch.rand(3, 4, 4, generator=gen), "mask": torch.eye(4)} for _ in range(n)])


# -- one factory per exported pipe class -----------------------------------------------------------

Factory = Callable[[Data], Any]

FACTORIES: dict[str, Factory] = {
    "Augmenter": lambda d: samples().augment([RandomRot90()]),
    "BatchAugmenter": lambda d: IterableWrapper([{"image": torch.arange(32.0).reshape(2, 1, 4, 4)}]).augment_batch(
        BatchRandomHorizontalFlip()
    ),
    "BatchAsyncMapper": lambda d: nums().async_map_batches(async_add_one, batch_size=2),
    "BatchMapper": lambda d: nums().map_batches(sum_batch, batch_size=2),
    "Batcher": lambda d: nums().batch(4),
    "BucketBatcher": lambda d: nums(10).bucketbatch(batch_size=2, batch_num=2, sort_key=sorted),
    "CSVDictParser": lambda d: d.opened("t.csv", mode="r").parse_csv_as_dict(),
    "CSVParser": lambda d: d.opened("t.csv", mode="r").parse_csv(),
    "Collator": lambda d: IterableWrapper([[1, 2], [3, 4]]).collate(),
    "Concater": lambda d: nums(3).concat(nums(2)),
    "Cycler": lambda d: nums(3).cycle(2),
    "Decoder": lambda d: IterableWrapper([("d/1.json", b'{"x": [1, 2]}'), ("d/1.cls", b"3\n")]).decode(),
    "Bz2FileLoader": lambda d: d.opened("g.txt.bz2").load_from_bz2(),
    "Decompressor": lambda d: d.opened("g.txt.gz").decompress(),
    "Extractor": lambda d: pipes.Extractor(d.opened("g.txt.gz")),
    "MapInMemoryCacheHolder": lambda d: SequenceWrapper(list(range(4))).in_memory_cache(),
    "MapUnZipper": lambda d: SequenceWrapper([(i, -i) for i in range(4)]).unzip(sequence_length=2)[1],
    "ShardSaver": lambda d: IterableWrapper([{"__key__": f"s{i}", "cls": i} for i in range(4)]).write_shards(
        str(d.out / "shard-%03d.tar"), maxcount=2, mtime=0
    ),
    "XzFileLoader": lambda d: d.opened("g.txt.xz").load_from_xz(),
    "Demultiplexer": lambda d: nums().demux(2, parity)[1],
    "Dropper": lambda d: IterableWrapper([(1, 2, 3), (4, 5, 6)]).drop(1),
    "EndOnDiskCacheHolder": lambda d: (
        IterableWrapper(["a", "b"])
        .on_disk_cache(filepath_fn=functools.partial(out_name, str(d.out)))
        .map(fetch)
        .end_caching(mode="wb", filepath_fn=functools.partial(out_name, str(d.out)))
    ),
    "Enumerator": lambda d: nums(3).enumerate(),
    "FSSpecFileLister": lambda d: pipes.FSSpecFileLister(str(d.root), masks="*.txt"),
    "FSSpecFileOpener": lambda d: IterableWrapper([d.path("a.txt")]).open_files_by_fsspec(mode="rb"),
    "FSSpecSaver": lambda d: IterableWrapper([("x1", b"X1"), ("x2", b"X2")]).save_by_fsspec(
        mode="wb", filepath_fn=functools.partial(out_name, str(d.out))
    ),
    "FileLister": lambda d: pipes.FileLister(str(d.root), masks="*.txt"),
    "FileOpener": lambda d: d.opened("a.txt", "b.txt"),
    "Filter": lambda d: nums().filter(is_even),
    "FlatMapper": lambda d: nums(3).flatmap(twice),
    "Flattener": lambda d: IterableWrapper([(1, (2, 3)), (4, (5, 6))]).flatten(),
    "Forker": lambda d: nums().fork(2)[1],
    "FullSync": lambda d: nums().fullsync(),
    "Grouper": lambda d: nums().groupby(parity, group_size=3),
    "HTTPReader": lambda d: IterableWrapper([d.http_url + "/a.txt"]).read_from_http(timeout=10),
    "HashChecker": lambda d: d.opened("b.txt").check_hash({d.path("b.txt"): hashlib.sha256(b"delta\n").hexdigest()}),
    "Header": lambda d: nums().header(4),
    "HttpReader": lambda d: pipes.HttpReader(IterableWrapper([d.http_url + "/b.txt"])),
    "ImageDecoder": lambda d: d.opened("i.png").decode_image(mode="RGB"),
    "InBatchShuffler": lambda d: nums().batch(3).in_batch_shuffle(),
    "InMemoryCacheHolder": lambda d: nums().in_memory_cache(),
    "IndexAdder": lambda d: IterableWrapper([{"a": 1}, {"a": 2}]).add_index("i"),
    "IndexAppender": lambda d: samples(2).append_index("ndvi", nir=1, red=0),
    "IterKeyZipper": lambda d: nums(4).zip_with_iter(nums(4), key_fn=add_one, ref_key_fn=add_one),
    "IterToMapConverter": lambda d: nums(4).map(pair).to_map_datapipe(),
    "IterableWrapper": lambda d: nums(),
    "JsonParser": lambda d: d.opened("j.json", mode="r").parse_json_files(),
    "LengthSetter": lambda d: nums().set_length(6),
    "LineReader": lambda d: d.opened("a.txt", "b.txt", mode="r").readlines(),
    "MapBatcher": lambda d: SequenceWrapper(list(range(6))).batch(4),
    "MapConcater": lambda d: SequenceWrapper([1, 2]).concat(SequenceWrapper([3])),
    "MapKeyZipper": lambda d: nums(4).zip_with_map(
        SequenceWrapper(list(range(10, 20))), key_fn=add_one, merge_fn=merge
    ),
    "MapMapper": lambda d: SequenceWrapper(list(range(4))).map(add_one),
    "MapShuffler": lambda d: SequenceWrapper(list(range(6))).shuffle(),
    "MapToIterConverter": lambda d: SequenceWrapper(list(range(4))).to_iter_datapipe(),
    "MapZipper": lambda d: SequenceWrapper([1, 2]).zip(SequenceWrapper([3, 4])),
    "Mapper": lambda d: nums().map(add_one),
    "MaxTokenBucketizer": lambda d: IterableWrapper(["a", "bb", "ccc", "d"]).max_token_bucketize(4),
    "Multiplexer": lambda d: nums(3).mux(nums(2)),
    "MultiplexerLongest": lambda d: nums(3).mux_longest(nums(2)),
    "Normalizer": lambda d: samples(2).normalize([0.5, 0.5, 0.5], [0.2, 0.2, 0.2]),
    "OnDiskCacheHolder": lambda d: IterableWrapper(["a", "b"]).on_disk_cache(
        filepath_fn=functools.partial(out_name, str(d.out))
    ),
    "PadCollator": lambda d: IterableWrapper([[torch.ones(2), torch.ones(3)]]).pad_collate(),
    "ParagraphAggregator": lambda d: d.opened("a.txt", mode="r").readlines(return_path=True).lines_to_paragraphs(),
    "PinMemory": lambda d: nums().map(torch.tensor).pin_memory(),
    "Prefetcher": lambda d: nums().prefetch(2),
    "RandomSplitter": lambda d: nums(10).random_split(weights={"a": 0.5, "b": 0.5}, seed=0, total_length=10)[0],
    "Repeater": lambda d: nums(3).repeat(2),
    "RoundRobinDemultiplexer": lambda d: nums().round_robin_demux(2)[1],
    "RoutedDecoder": lambda d: d.opened("a.txt").routed_decode(decode_txt),
    "Rows2Columnar": lambda d: IterableWrapper([[{"a": 1}, {"a": 2}]]).rows2columnar(),
    "SampleMultiplexer": lambda d: pipes.SampleMultiplexer({nums(3): 0.5, nums(2).map(add_one): 0.5}, seed=0),
    "Sampler": lambda d: pipes.Sampler(nums()),
    "Saver": lambda d: IterableWrapper([("y1", b"Y1")]).save_to_disk(
        mode="wb", filepath_fn=functools.partial(out_name, str(d.out))
    ),
    "SequenceWrapper": lambda d: SequenceWrapper(list(range(4))),
    "ShardExpander": lambda d: IterableWrapper(["ds-{00..03}.tar"]).shard_expand(),
    "ShardingFilter": lambda d: nums().sharding_filter(),
    "ShuffledFlatMapper": lambda d: nums(4).shuffled_flatmap(twice, buffer_size=3),
    "Shuffler": lambda d: nums().shuffle(buffer_size=3),
    "Slicer": lambda d: IterableWrapper([(1, 2, 3), (4, 5, 6)]).slice(0, 2),
    "StreamReader": lambda d: d.opened("b.txt").read_from_stream(),
    "TarArchiveLoader": lambda d: d.opened("w.tar").load_from_tar(),
    "TarSampleLoader": lambda d: d.opened("w.tar").load_tar_samples(),
    "ThreadPoolMapper": lambda d: nums().threadpool_map(add_one, max_workers=2),
    "UnBatcher": lambda d: nums().batch(4).unbatch(),
    "UnZipper": lambda d: nums().map(pair).unzip(sequence_length=2)[1],
    "WebDataset": lambda d: d.opened("w.tar").load_from_tar().webdataset(),
    "ZipArchiveLoader": lambda d: d.opened("z.zip").load_from_zip(),
    "Zipper": lambda d: nums(3).zip(nums(3)),
    "ZipperLongest": lambda d: nums(3).zip_longest(nums(2)),
}

# OnDiskCacheHolder only runs inside its on_disk_cache ... end_caching chain.
CHAINS: dict[str, Callable[[Any, Data], Any]] = {
    "OnDiskCacheHolder": lambda p, d: p.map(fetch).end_caching(
        mode="wb", filepath_fn=functools.partial(out_name, str(d.out))
    ),
}

# these constructors return their children (or, for Extractor, a Decompressor, as torchdata's did)
SPLITTER_CLASSES = {
    "Demultiplexer",
    "Forker",
    "RandomSplitter",
    "RoundRobinDemultiplexer",
    "UnZipper",
    "MapUnZipper",
    "Extractor",
}

# The children of splitting pipes share one container: pickled together they must stay linked.
SPLITTERS: dict[str, Callable[[], tuple[Any, ...]]] = {
    "unzip": lambda: tuple(nums().map(pair).unzip(sequence_length=2)),
    "fork": lambda: tuple(nums().fork(2)),
    "demux": lambda: tuple(nums().demux(2, parity)),
    "round_robin_demux": lambda: tuple(nums(7).round_robin_demux(3)),
    "random_split": lambda: tuple(
        nums(10).random_split(weights={"a": 0.5, "b": 0.3, "c": 0.2}, seed=0, total_length=10)
    ),
}


# -- fixtures and helpers --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Data]:
    """The files and the HTTP server, shared by the module (pipes only read them, or rewrite the same outputs)."""
    root = tmp_path_factory.mktemp("data")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))

    class Quiet(handler.func):  # type: ignore[name-defined,misc]
        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield Data(root, f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()


def plain(x: Any) -> Any:
    """A comparable form of an item: streams read, tensors and arrays listed, images as bytes."""
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return type(x)(plain(v) for v in x)
    if isinstance(x, torch.Tensor):
        return ("tensor", x.dtype, x.tolist())
    if isinstance(x, np.ndarray):
        return ("array", x.dtype.str, x.tolist())
    if isinstance(x, Image.Image):
        return ("image", x.mode, x.size, x.tobytes())
    if hasattr(x, "read") and callable(x.read):
        try:
            return ("stream", x.read())
        finally:
            if hasattr(x, "close"):
                x.close()
    return x


def epoch(pipe: Any) -> list[Any]:
    """One epoch of ``pipe``, from the same global random state each time (random pipes draw their seed from it)."""
    torch.manual_seed(0)
    if isinstance(pipe, MapDataPipe):
        return [plain(pipe[i]) for i in range(len(pipe))]
    return [plain(item) for item in pipe]


def round_trip(obj: Any, module: Any) -> Any:
    return module.loads(module.dumps(obj))


SERIALIZERS = [pytest.param(pickle, id="pickle")]
if dill is not None:
    SERIALIZERS.append(pytest.param(dill, id="dill"))


# -- tests -----------------------------------------------------------------------------------------


def test_every_exported_pipe_has_a_factory() -> None:
    assert sorted(set(PIPE_NAMES) - set(FACTORIES)) == []
    assert sorted(set(FACTORIES) - set(PIPE_NAMES)) == []


def test_dill_is_installed() -> None:
    """dill is a dev dependency: without it the dill half of this file would silently not run."""
    assert dill is not None


@pytest.mark.parametrize("module", SERIALIZERS)
@pytest.mark.parametrize("name", PIPE_NAMES)
class TestRoundTrip:
    @staticmethod
    def make(name: str, data: Data) -> Any:
        pipe = FACTORIES[name](data)
        return CHAINS[name](pipe, data) if name in CHAINS else pipe

    def test_before_iterating(self, name: str, module: Any, data: Data) -> None:
        pipe = FACTORIES[name](data)
        if name not in SPLITTER_CLASSES:  # these constructors return their children
            assert isinstance(pipe, getattr(pipes, name))
        copy = round_trip(pipe, module)
        assert type(copy) is type(pipe)
        if name in CHAINS:
            pipe, copy = CHAINS[name](pipe, data), CHAINS[name](copy, data)
        expected = epoch(pipe)
        assert expected, f"{name}'s factory yields nothing: the comparison would prove nothing"
        assert epoch(copy) == expected

    def test_after_an_epoch(self, name: str, module: Any, data: Data) -> None:
        """The copy's next epoch is the original's next epoch (a seeded stream goes on in both)."""
        pipe = self.make(name, data)
        epoch(pipe)
        copy = round_trip(pipe, module)
        assert epoch(copy) == epoch(pipe)

    def test_during_an_epoch(self, name: str, module: Any, data: Data) -> None:
        """Pickled with an iterator open (threads running, buffers full), it starts a new epoch like the original."""
        pipe = self.make(name, data)
        if isinstance(pipe, MapDataPipe):
            pytest.skip("map-style pipes are indexed: they have no open iterator")
        it = iter(pipe)
        next(it)
        copy = round_trip(pipe, module)
        del it
        assert epoch(copy) == epoch(pipe)


@pytest.mark.parametrize("module", SERIALIZERS)
@pytest.mark.parametrize("split", sorted(SPLITTERS))
class TestSplitChildren:
    def test_children_pickled_together_stay_linked(self, split: str, module: Any) -> None:
        expected = [list(child) for child in SPLITTERS[split]()]
        children = round_trip(SPLITTERS[split](), module)
        containers = {id(getattr(child, "main_datapipe", None) or child.source_datapipe) for child in children}
        assert len(containers) == 1, "the children share their container"
        assert [list(child) for child in children] == expected

    def test_each_child_alone(self, split: str, module: Any) -> None:
        expected = [list(child) for child in SPLITTERS[split]()]
        for i, child in enumerate(SPLITTERS[split]()):
            assert list(round_trip(child, module)) == expected[i]

    def test_children_after_an_epoch(self, split: str, module: Any) -> None:
        expected = [list(child) for child in SPLITTERS[split]()]
        children = SPLITTERS[split]()
        for child in children:
            list(child)
        assert [list(child) for child in round_trip(children, module)] == expected


# Pipes that take a function, built with a lambda: torchdata pickled these with dill.
LAMBDA_PIPES: dict[str, Callable[[], Any]] = {
    "map": lambda: nums().map(lambda x: x + 1),
    "filter": lambda: nums().filter(lambda x: x % 2 == 0),
    "flatmap": lambda: nums(3).flatmap(lambda x: [x, x]),
    "shuffled_flatmap": lambda: nums(3).shuffled_flatmap(lambda x: [x, -x], buffer_size=2),
    "map_batches": lambda: nums().map_batches(lambda b: [sum(b)], batch_size=2),
    "threadpool_map": lambda: nums().threadpool_map(lambda x: x * 3, max_workers=2),
    "groupby": lambda: nums().groupby(lambda x: x % 3, group_size=2),
    "demux": lambda: nums().demux(2, lambda x: x % 2)[0],
    "zip_with_iter": lambda: nums(4).zip_with_iter(nums(4), key_fn=lambda x: x, ref_key_fn=lambda x: x),
    "zip_with_map": lambda: nums(3).zip_with_map(SequenceWrapper([7, 8, 9]), key_fn=lambda x: x),
    "to_map_datapipe": lambda: nums(3).to_map_datapipe(key_value_fn=lambda x: (x, -x)),
    "map (map-style)": lambda: SequenceWrapper([1, 2]).map(lambda x: x * 2),
    "bucketbatch": lambda: nums(8).bucketbatch(batch_size=2, batch_num=2, sort_key=lambda b: sorted(b)),
    "max_token_bucketize": lambda: IterableWrapper(["a", "bb", "c"]).max_token_bucketize(3, len_fn=lambda s: len(s)),
    "collate": lambda: IterableWrapper([[1, 2]]).collate(collate_fn=lambda b: sum(b)),
}


@pytest.mark.parametrize("name", sorted(LAMBDA_PIPES))
class TestLambdas:
    def test_dill_round_trips(self, name: str) -> None:
        assert dill is not None
        expected = epoch(LAMBDA_PIPES[name]())
        assert epoch(round_trip(LAMBDA_PIPES[name](), dill)) == expected

    def test_pickle_refuses_with_pickles_error(self, name: str) -> None:
        """Plain pickle cannot serialize a lambda (as with torchdata); it must say so, not pickle something wrong."""
        with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
            pickle.dumps(LAMBDA_PIPES[name]())
