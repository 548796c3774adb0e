"""``import pipekit.webdataset as wds``: the webdataset library's interface, on shards made in a fixture.

The first tests port the library's README examples with only the import changed (``webdataset`` ->
``pipekit.webdataset``), on local shards instead of the README's Google Cloud URL.
"""

from __future__ import annotations

import io
import json
import socket
from itertools import islice
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from PIL import Image

import pipekit
import pipekit.webdataset as wds
from pipekit.errors import DecodeError, ParseError, ReadError, StageError
from pipekit.pipes._missing import REPLACEMENTS

N_SHARDS, PER_SHARD = 3, 4
N = N_SHARDS * PER_SHARD


def _png(i: int, size: tuple[int, int] = (8, 6)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (10 * i, 255 - 10 * i, 7 * i)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("wds")
    with wds.ShardWriter(str(root / "train-%06d.tar"), maxcount=PER_SHARD, verbose=0) as sink:
        for i in range(N):
            sink.write({"__key__": f"sample{i:04d}", "png": _png(i), "json": {"i": i}, "cls": i % 3})
    return str(root / "train-{000000..000002}.tar")


def _label(data: dict) -> int:
    return data["i"]


def preprocess(sample):
    image, data = sample
    return torch.from_numpy(np.array(image)).permute(2, 0, 1), data["i"]


# ------------------------------------------------------------------------------------------------ README port


class TestReadmePort:
    def test_shuffle_decode_to_tuple(self, shards):
        url = shards
        dataset = wds.WebDataset(url).shuffle(1000).decode("rgb").to_tuple("png", "json")
        for image, data in islice(dataset, 0, 3):
            assert image.shape == (6, 8, 3) and image.dtype == np.float32 and type(data) is dict
        assert sorted(d["i"] for _, d in dataset) == list(range(N))

    def test_pil_and_map(self, shards):
        dataset = wds.WebDataset(shards).shuffle(1000).decode("pil").to_tuple("png", "json").map(preprocess)
        image, i = next(iter(dataset))
        assert image.shape == (3, 6, 8) and image.dtype == torch.uint8
        assert image[:, 0, 0].tolist() == [10 * i, 255 - 10 * i, 7 * i]

    def test_torch_dataloader_batched(self, shards):
        dataset = wds.WebDataset(shards).shuffle(1000).decode("rgb").to_tuple("png", "json")
        dataloader = torch.utils.data.DataLoader(dataset.batched(5), num_workers=0, batch_size=None)
        images, targets = next(iter(dataloader))
        assert images.shape == (5, 6, 8, 3) and len(targets) == 5

    @pytest.mark.timeout(60)
    def test_torch_dataloader_workers_split_the_shards(self, shards):
        dataset = wds.WebDataset(shards).decode().to_tuple("json", "cls").map_tuple(_label).batched(2)
        loader = torch.utils.data.DataLoader(dataset, num_workers=2, batch_size=None)
        assert sorted(int(i) for ids, _ in loader for i in ids) == list(range(N))

    def test_generator_function_stages(self, shards):
        def labels(samples):
            for sample in samples:
                yield int(sample["cls"])

        assert sorted(wds.DataPipeline(wds.SimpleShardList(shards), wds.tarfile_to_samples(), labels)) == sorted(
            i % 3 for i in range(N)
        )

    def test_data_pipeline(self, shards):
        dataset = wds.DataPipeline(
            wds.SimpleShardList(shards),
            wds.shuffle(100),
            wds.split_by_worker,
            wds.tarfile_to_samples(),
            wds.shuffle(1000),
            wds.decode("torchrgb"),
            wds.to_tuple("png", "json"),
            wds.batched(4),
        )
        batches = list(dataset)
        assert [len(b[1]) for b in batches] == [4, 4, 4]
        assert batches[0][0].shape == (4, 3, 6, 8) and batches[0][0].dtype == torch.float32
        assert sorted(d["i"] for b in batches for d in b[1]) == list(range(N))

    def test_resampled_with_epoch_and_webloader(self, shards):
        dataset = wds.WebDataset(shards, resampled=True).shuffle(100).decode("torchrgb8").to_tuple("png", "cls")
        assert len(list(dataset.with_epoch(10))) == 10
        loader = wds.WebLoader(dataset.batched(3).with_epoch(2), batch_size=None, num_workers=0)
        loader = loader.unbatched().shuffle(100).batched(4)
        assert [len(labels) for _, labels in loader] == [4, 2]

    def test_the_librarys_submodules_are_namespaces(self):
        assert wds.handlers.warn_and_continue is wds.warn_and_continue
        assert wds.shardlists.split_by_node is wds.split_by_node and wds.filters.to_tuple is wds.to_tuple
        assert wds.autodecode.ImageHandler is wds.ImageHandler and wds.writer.ShardWriter is wds.ShardWriter

    def test_samples_are_the_librarys_dicts(self, shards):
        sample = next(iter(wds.WebDataset(shards)))
        assert sample["__key__"] == "sample0000" and sample["__url__"].endswith("train-000000.tar")
        assert sorted(k for k in sample if not k.startswith("__")) == ["cls", "json", "png"]
        assert sample["cls"] == b"0" and json.loads(sample["json"]) == {"i": 0}


# ------------------------------------------------------------------------------------------------ resume


def _pipeline(shards: str, resampled: bool = False):
    return (
        wds.WebDataset(shards, shardshuffle=True, resampled=resampled)
        .shuffle(6)
        .decode("torchrgb8")
        .to_tuple("png", "json")
        .map_tuple(None, _label)
        .batched(3)
    )


def _labels(batches) -> list[int]:
    return [int(x) for _, labels in batches for x in labels]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_resumes_mid_epoch_exactly(shards, workers):
    torch.manual_seed(7)
    loader = pipekit.DataLoader(_pipeline(shards), num_workers=workers)
    it = iter(loader)
    head = [next(it) for _ in range(2)]
    state = loader.state_dict()
    rest = list(it)
    torch.manual_seed(99)  # the checkpoint, not the global RNG, decides what follows
    resumed = pipekit.DataLoader(_pipeline(shards), num_workers=workers)
    resumed.load_state_dict(state)
    assert _labels(resumed) == _labels(rest)
    assert sorted(_labels(head) + _labels(rest)) == list(range(N))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 2])
def test_resampled_epochs_resume_exactly(shards, workers):
    def make():
        return pipekit.DataLoader(_pipeline(shards, resampled=True).with_epoch(3), num_workers=workers)

    torch.manual_seed(5)
    loader = make()
    first = list(loader)
    it = iter(loader)  # the second epoch: other draws
    head = [next(it) for _ in range(2)]
    state = loader.state_dict()
    rest = list(it)
    assert len(first) == len(head) + len(rest) == 3 * max(workers, 1)
    assert _labels(first) != _labels(head + rest)
    resumed = make()
    resumed.load_state_dict(state)
    assert _labels(resumed) == _labels(rest)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("buffer", [5, 100])  # 100: the main-process shuffle holds the loader's whole epoch
def test_webloader_with_main_process_stages_resumes_exactly(shards, workers, buffer):
    def make():
        torch.manual_seed(3)
        return wds.WebLoader(_pipeline(shards), num_workers=workers).unbatched().shuffle(buffer).batched(4)

    loader = make()
    it = iter(loader)
    head = [next(it) for _ in range(1)]
    state = loader.state_dict()
    rest = list(it)
    resumed = make()
    resumed.load_state_dict(state)
    assert _labels(resumed) == _labels(rest)
    assert sorted(_labels(head) + _labels(rest)) == list(range(N))


def test_webloader_with_epoch_cuts_the_loaders_batches_into_epochs(shards):
    dataset = wds.WebDataset(shards).decode().to_tuple("cls", "json").batched(5)  # 3 batches per pass
    loader = wds.WebLoader(dataset, batch_size=None).with_epoch(4).with_length(4)
    epochs = [[b[0].tolist() for b in loader] for _ in range(2)]
    assert len(loader) == 4 and [len(e) for e in epochs] == [4, 4]
    for epoch in epochs:  # each epoch starts the loader over, as the library's does: a pass, then its first batch
        assert [x for batch in epoch for x in batch] == [i % 3 for i in range(N)] + [i % 3 for i in range(5)]


# ------------------------------------------------------------------------------------------------ sharding


def test_split_by_node_and_worker_are_one_sharding_point():
    urls = [f"s{i}.tar" for i in range(8)]
    both = wds.split_by_worker(wds.split_by_node(urls))
    assert pipekit._loader.sharding_points(both) == [both]
    both.apply_sharding(4, 3)
    assert list(both) == ["s3.tar", "s7.tar"]
    only_workers = wds.split_by_worker(urls)
    only_workers.apply_sharding(2, 1)
    assert list(only_workers) == urls[1::2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_epochs(rank: int, port: int, shards: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        dataset = wds.WebDataset(shards, resampled=True).decode().to_tuple("cls", "json").batched(2).with_epoch(3)
        loader = wds.WebLoader(dataset, batch_size=None, num_workers=2)
        epochs = [sum(len(labels) for labels, _ in loader) for _ in range(2)]
        refused = ""
        try:
            list(wds.WebDataset(shards))  # single_node_only, the default nodesplitter
        except ValueError as exc:
            refused = str(exc)
        Path(out, f"rank{rank}.json").write_text(json.dumps([epochs, refused]))
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_resampled_with_epoch_gives_equal_epochs_on_two_ranks(shards, tmp_path):
    mp.spawn(_rank_epochs, args=(_free_port(), shards, str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        epochs, refused = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert epochs == [12, 12]  # 2 workers x 3 batches x 2 samples, every epoch, on every rank
        assert "nodesplitter=wds.split_by_node" in refused


# ------------------------------------------------------------------------------------------------ decoding


@pytest.mark.parametrize(
    ("spec", "kind", "shape", "dtype"),
    [
        ("pil", Image.Image, None, None),
        ("rgb8", np.ndarray, (6, 8, 3), np.uint8),
        ("l8", np.ndarray, (6, 8), np.uint8),
        ("rgb", np.ndarray, (6, 8, 3), np.float32),
        ("torchrgb8", torch.Tensor, (3, 6, 8), torch.uint8),
        ("torchl8", torch.Tensor, (6, 8), torch.uint8),
        ("torchrgb", torch.Tensor, (3, 6, 8), torch.float32),
        ("torchrgba8", torch.Tensor, (4, 6, 8), torch.uint8),
    ],
)
def test_decode_specs(shards, spec, kind, shape, dtype):
    image, label = next(iter(wds.WebDataset(shards).decode(spec).to_tuple("png", "cls")))
    assert isinstance(image, kind) and label == 0
    if shape is not None:
        assert tuple(image.shape) == shape and image.dtype == dtype
    rgb = np.asarray(image if spec == "pil" else image[..., :3] if spec.endswith(("8", "rgb")) and image.ndim == 3
                     and image.shape[-1] == 3 else image)
    if spec in ("rgb8", "pil"):
        assert rgb[0, 0].tolist() == [0, 255, 0]


def test_unknown_spec_and_missing_field_name_the_fix(shards):
    with pytest.raises(ValueError, match="unknown image specification 'rgb16'; expected one of l8, rgb8"):
        wds.WebDataset(shards).decode("rgb16")
    with pytest.raises(ParseError, match=r"no 'jpg' or 'jpeg' field \(it has \['cls', 'json', 'png'\]\)"):
        next(iter(wds.WebDataset(shards).to_tuple("jpg;jpeg", "cls")))


def test_handlers_skip_and_count_bad_samples(tmp_path):
    with wds.ShardWriter(str(tmp_path / "s-%02d.tar"), maxcount=10, verbose=0) as sink:
        for i in range(4):
            sink.write({"__key__": f"k{i}", "png": b"not a png" if i == 1 else _png(i), "cls": i})
    url = str(tmp_path / "s-00.tar")
    with pytest.raises(DecodeError, match=r"s-00\.tar"):
        list(wds.WebDataset(url).decode("torchrgb8"))
    pipe = wds.WebDataset(url).decode("torchrgb8", handler=wds.ignore_and_continue).to_tuple("png", "cls")
    assert [label for _, label in pipe] == [0, 2, 3]
    stopped = wds.WebDataset(url).decode("torchrgb8", handler=wds.ignore_and_stop).to_tuple("png", "cls")
    assert [label for _, label in stopped] == [0]
    loader = pipekit.DataLoader(wds.WebDataset(url).decode("torchrgb8", handler=wds.warn_and_continue))
    with pytest.warns(UserWarning, match="not a recognised image format"):
        assert len(list(loader)) == 3
    assert loader.skip_report().counts == {"decode": 1}


# ------------------------------------------------------------------------------------------------ pipe: URLs


def test_pipe_urls_run_without_a_shell(shards, tmp_path):
    first = shards.replace("{000000..000002}", "000000")
    assert [s["__key__"] for s in wds.WebDataset(f"pipe:cat {first}")] == [f"sample{i:04d}" for i in range(4)]
    with pytest.raises(ValueError, match=r"uses shell syntax \('\|'\).*without a shell"):
        wds.WebDataset(f"pipe:cat {first} | head")
    missing = tmp_path / "nope.tar"
    with pytest.raises(StageError, match=r"pipe:cat .*nope.tar.* exited with status 1: cat: .*No such file"):
        list(wds.WebDataset(f"pipe:cat {missing}"))
    with pytest.raises(ReadError, match="cannot start 'no-such-program-xyz'"):
        list(wds.WebDataset("pipe:no-such-program-xyz a.tar"))


@pytest.mark.timeout(60)
def test_pipe_urls_resume_mid_shard(shards):
    first = shards.replace("{000000..000002}", "000000")

    def make():
        return wds.WebDataset(f"pipe:cat {first}").to_tuple("cls")

    loader = pipekit.DataLoader(make())
    it = iter(loader)
    head = [next(it) for _ in range(2)]
    state = loader.state_dict()
    rest = list(it)
    resumed = pipekit.DataLoader(make())
    resumed.load_state_dict(state)
    assert list(resumed) == rest and head + rest == [[b"0"], [b"1"], [b"2"], [b"0"]]


# ------------------------------------------------------------------------------------------------ missing names


@pytest.mark.parametrize(("library", "name"), sorted(REPLACEMENTS))
def test_missing_names_point_to_the_replacement(library, name):
    import pipekit.pipes as dp

    modules = [dp, dp.iter, dp.map] if library == "torchdata" else [wds]
    for module in modules:
        with pytest.raises(AttributeError) as info:
            getattr(module, name)
        assert REPLACEMENTS[library, name] in str(info.value) and f"{library}'s {name}" in str(info.value)
        assert not hasattr(module, name)


# ------------------------------------------------------------------------------------------------ the recipe


def test_recipe_on_mixed_size_images_says_to_pass_size(tmp_path):
    from pipekit import datasets

    with wds.ShardWriter(str(tmp_path / "s-%02d.tar"), maxcount=10, verbose=0) as sink:
        for i, size in enumerate([(8, 6), (5, 7)]):
            sink.write({"__key__": f"k{i}", "jpg": _png(i, size), "cls": i})
    with pytest.raises(ValueError, match=r"different sizes.*datasets\.WebDataset\(urls, size=224\).*pad_collate"):
        list(datasets.WebDataset(str(tmp_path / "s-00.tar"), batch_size=2, train=False))


@pytest.mark.s3
@pytest.mark.timeout(180)
def test_training_script_on_s3_resumes_exactly(s3_server, shards, monkeypatch):
    """A library user's script (S3 shards, resampled, with_epoch, to_tuple, WebLoader, 2 workers), imports changed."""
    bucket = s3_server.create_bucket()
    fs = s3_server.fs()
    for s in range(N_SHARDS):
        fs.put(shards.replace("{000000..000002}", f"{s:06d}"), f"{bucket}/train-{s:06d}.tar")
    for name, value in [("AWS_ACCESS_KEY_ID", s3_server.key), ("AWS_SECRET_ACCESS_KEY", s3_server.secret),
                        ("AWS_ENDPOINT_URL", s3_server.endpoint_url), ("AWS_DEFAULT_REGION", s3_server.region)]:
        monkeypatch.setenv(name, value)
    url = f"s3://{bucket}/train-{{000000..000002}}.tar"

    def make():
        dataset = (
            wds.WebDataset(url, resampled=True, shardshuffle=True, nodesplitter=wds.split_by_node)
            .shuffle(8)
            .decode("torchrgb8")
            .to_tuple("png", "cls")
            .batched(2)
            .with_epoch(3)
        )
        return wds.WebLoader(dataset, batch_size=None, num_workers=2).unbatched().shuffle(4).batched(3)

    torch.manual_seed(11)
    loader = make()
    it = iter(loader)
    head = [next(it) for _ in range(2)]
    state = loader.state_dict()
    rest = list(it)
    assert sum(len(labels) for _, labels in head + rest) == 2 * 3 * 2  # workers x batches x batch size
    assert head[0][0].shape == (3, 3, 6, 8)
    resumed = make()
    resumed.load_state_dict(state)
    assert [labels.tolist() for _, labels in resumed] == [labels.tolist() for _, labels in rest]


def test_reading_handlers_on_a_truncated_shard(tmp_path):
    from pipekit.errors import ArchiveError

    with wds.ShardWriter(str(tmp_path / "s-%02d.tar"), maxcount=3, verbose=0) as sink:
        for i in range(6):
            sink.write({"__key__": f"k{i}", "txt": "x" * 2000, "cls": i})
    cut = tmp_path / "s-00.tar"
    cut.write_bytes(cut.read_bytes()[:5000])  # inside the second sample's txt member: it keeps its cls
    urls = str(tmp_path / "s-{00..01}.tar")
    with pytest.raises(ArchiveError, match=r"s-00\.tar"):
        list(wds.WebDataset(urls).to_tuple("cls"))
    skipping = wds.WebDataset(urls, handler=wds.ignore_and_continue).to_tuple("cls")
    assert [int(c) for (c,) in skipping] == [0, 1, 3, 4, 5]
    loader = pipekit.DataLoader(wds.WebDataset(urls, handler=wds.ignore_and_continue))
    assert len(list(loader)) == 5 and loader.skip_report().counts == {"load_from_tar": 1}
    stopping = wds.WebDataset(urls, handler=wds.ignore_and_stop).to_tuple("cls")
    assert [int(c) for (c,) in stopping] == [0]  # the error ends the epoch (sample 1 was incomplete)
