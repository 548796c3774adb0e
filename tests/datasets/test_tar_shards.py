"""Tests for datasets.TarShards (alias datasets.WebDataset) with real tar shards (synthetic.write_image_shards)."""

from __future__ import annotations

import io
import json
import pickle
import shutil
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

import pipekit
from pipekit import datasets
from pipekit.datasets._tar_shards import expand_shard_urls
from pipekit.errors import ArchiveError, DecodeError, ReadError
from pipekit.synthetic import write_image_shards

SHARDS, PER_SHARD = 4, 6


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("shards")
    write_image_shards(root, shards=SHARDS, per_shard=PER_SHARD, size=32, progress=False)
    return root


PATTERN = "shard-{000000..000003}.tar"


def _keys(root: Path) -> list[str]:
    out = []
    for s in range(SHARDS):
        path = root / f"shard-{s:06d}.tar"
        out += [f"{path}/sample{s:03d}{i:05d}" for i in range(PER_SHARD)]
    return out


class TestExpandShardUrls:
    def test_braces_files_folders_and_globs(self, shards):
        expected = [str(shards / f"shard-{i:06d}.tar") for i in range(SHARDS)]
        assert expand_shard_urls(str(shards / PATTERN)) == expected
        assert expand_shard_urls(str(shards)) == expected
        assert expand_shard_urls(str(shards / "shard-00000[12].tar")) == expected[1:3]
        assert expand_shard_urls([shards / "shard-000003.tar", str(shards / "shard-000000.tar")]) == [
            expected[3],
            expected[0],
        ]

    def test_a_shard_named_with_glob_characters_is_found_by_its_name(self, shards, tmp_path):
        """``shard[1].tar`` is a glob matching ``shard1.tar`` only: the file itself was "no tar shards in" it."""
        named = tmp_path / "shard[1].tar"
        shutil.copy(shards / "shard-000000.tar", named)
        assert expand_shard_urls(str(named)) == [str(named)]
        shutil.copy(shards / "shard-000001.tar", tmp_path / "shard1.tar")
        assert expand_shard_urls(str(named)) == [str(tmp_path / "shard1.tar")]  # what the glob matches comes first

    def test_errors(self, shards, tmp_path):
        with pytest.raises(FileNotFoundError, match="no such shard, folder or prefix"):
            expand_shard_urls(str(tmp_path / "nothing"))
        with pytest.raises(FileNotFoundError, match="no tar shards in"):
            expand_shard_urls(str(tmp_path))
        (tmp_path / "notes.txt").write_text("x")
        with pytest.raises(ValueError, match="is not a tar file"):
            expand_shard_urls(str(tmp_path / "notes.txt"))
        with pytest.raises(ValueError, match="shard_expand"):
            expand_shard_urls(str(shards / "shard-{3..1}.tar"))
        with pytest.raises(TypeError, match="urls must be"):
            expand_shard_urls([])


class TestEval:
    def test_samples_in_shard_order_decoded_by_extension(self, shards):
        ds = datasets.TarShards(str(shards / PATTERN), train=False, batch_size=None)
        assert len(ds.shards) == SHARDS
        samples = list(ds)
        assert [s["__key__"] for s in samples] == _keys(shards)
        first = samples[0]
        assert first[".jpg"].shape == (3, 32, 32) and first[".jpg"].dtype == torch.uint8
        assert isinstance(first[".cls"], int) and 0 <= first[".cls"] < 4

    def test_batches(self, shards):
        ds = datasets.TarShards(str(shards), train=False, batch_size=5)
        batches = list(ds)
        assert [len(b["__key__"]) for b in batches] == [5, 5, 5, 5, 4]
        assert batches[0][".jpg"].shape == (5, 3, 32, 32) and batches[0][".cls"].dtype == torch.int64

    def test_two_workers_each_sample_exactly_once(self, shards):
        ds = datasets.TarShards(str(shards / PATTERN), train=False, batch_size=4)
        keys = [k for b in pipekit.DataLoader(ds, num_workers=2) for k in b["__key__"]]
        assert sorted(keys) == sorted(_keys(shards))

    def test_size_resizes_and_center_crops(self, shards):
        ds = datasets.TarShards(str(shards), train=False, batch_size=3, size=16)
        assert next(iter(ds))[".jpg"].shape == (3, 3, 16, 16)

    def test_pickles_before_iteration(self, shards):
        ds = datasets.TarShards(str(shards), train=False, batch_size=None)
        copy = pickle.loads(pickle.dumps(ds))
        assert [s["__key__"] for s in copy] == _keys(shards)


class TestTrain:
    @pytest.mark.parametrize("trivial_augment", [False, True])
    def test_training_crops_pickle_mid_epoch(self, shards, trivial_augment):
        """Spawned workers (macOS, Windows) get the pipe pickled: the training crop and flip steps included."""
        ds = datasets.TarShards(str(shards), batch_size=None, size=16, trivial_augment=trivial_augment)
        it = iter(ds)
        next(it)
        copy = pickle.loads(pickle.dumps(ds))
        assert next(iter(copy))[".jpg"].shape == (3, 16, 16)

    def test_shuffled_at_shard_and_sample_level(self, shards):
        ds = datasets.TarShards(str(shards / PATTERN), batch_size=None, shuffle_buffer=5)
        torch.manual_seed(0)
        keys = [s["__key__"] for s in ds]
        assert sorted(keys) == sorted(_keys(shards))
        assert keys != _keys(shards)
        shard_order = list(dict.fromkeys(k.rsplit("/", 1)[0] for k in keys))
        within = [k for k in keys if k.startswith(shard_order[0])]
        assert shard_order != sorted(shard_order) or within != sorted(within)
        torch.manual_seed(0)
        assert [s["__key__"] for s in ds] == keys  # seeded: reproducible

    def test_no_shuffling_when_turned_off(self, shards):
        ds = datasets.TarShards(str(shards / PATTERN), batch_size=None, shuffle_shards=False, shuffle_buffer=0)
        assert [s["__key__"] for s in ds] == _keys(shards)

    def test_two_workers_each_sample_once_per_epoch(self, shards):
        ds = datasets.TarShards(str(shards / PATTERN), batch_size=4, size=16, shuffle_buffer=6)
        torch.manual_seed(0)
        loader = pipekit.DataLoader(ds, num_workers=2)
        for _ in range(2):
            batches = list(loader)
            assert sorted(k for b in batches for k in b["__key__"]) == sorted(_keys(shards))
            assert all(b[".jpg"].shape[1:] == (3, 16, 16) for b in batches)

    @pytest.mark.parametrize("change", ["added", "gone"])
    def test_a_resume_on_another_shard_list_is_refused_naming_the_shards(self, shards, tmp_path, change):
        """The shard list's positions count shards of the listing the checkpoint was taken on: a shard added to
        the folder since resumed silently with samples repeated (12 of 9 read, 3 twice) and others never read."""
        root = tmp_path / "shards"
        root.mkdir()
        for name in ("shard-000000.tar", "shard-000001.tar", "shard-000002.tar"):
            shutil.copy(shards / name, root / name)

        def loader():
            return pipekit.DataLoader(datasets.TarShards(str(root), batch_size=None, shuffle_buffer=None))

        torch.manual_seed(0)
        first = loader()
        it = iter(first)
        [next(it) for _ in range(4)]
        state = pickle.loads(pickle.dumps(first.state_dict()))
        if change == "added":
            shutil.copy(shards / "shard-000003.tar", root / "shard-000003.tar")
        else:
            (root / "shard-000002.tar").unlink()
        resumed = loader()
        resumed.load_state_dict(state)
        new_or_gone = "new" if change == "added" else "gone"
        with pytest.raises(ReadError, match=rf"TarShards.*shards.*changed since the checkpoint.*{new_or_gone} "
                                            rf"'[^']*shard-00000{3 if change == 'added' else 2}\.tar'"):
            list(resumed)

    def test_resumes_with_a_full_shuffle_buffer(self, shards):
        def loader():
            return pipekit.DataLoader(datasets.TarShards(str(shards), batch_size=2, shuffle_buffer=8), num_workers=0)

        torch.manual_seed(3)
        full = list(loader())
        torch.manual_seed(3)
        first = loader()
        it = iter(first)
        head = [next(it) for _ in range(4)]  # 8 of 24 samples: the buffer holds 8 more
        state = pickle.loads(pickle.dumps(first.state_dict()))
        resumed = loader()
        resumed.load_state_dict(state)
        got = head + list(resumed)
        assert [b["__key__"] for b in got] == [b["__key__"] for b in full]
        assert all(torch.equal(a[".jpg"], b[".jpg"]) for a, b in zip(got, full))


class TestTrainAugment:
    """Training's crop + flip run on the plain image tensor (not Augment's tv_tensors dict) with the same results."""

    @pytest.mark.parametrize("trivial_augment", [False, True])
    def test_same_images_as_the_augment_pipe(self, shards, trivial_augment):
        from pipekit.datasets._recipe import standard_image_transforms
        from pipekit.datasets._tar_shards import _ImageAugmenter
        from pipekit.pipes import IterableWrapper

        torch.manual_seed(0)
        decoded = list(datasets.TarShards(str(shards), batch_size=None, shuffle_buffer=8))
        ops = standard_image_transforms(16, True, trivial_augment=trivial_augment)
        reference = list(IterableWrapper(decoded).augment(ops, image_key=".jpg", mask_keys=()).set_seed(5))
        fast = list(_ImageAugmenter(IterableWrapper(decoded), ops, ".jpg").set_seed(5))
        assert [s["__key__"] for s in fast] == [s["__key__"] for s in reference]
        for a, b in zip(fast, reference):
            assert type(a[".jpg"]) is torch.Tensor and a[".jpg"].shape == (3, 16, 16)
            assert torch.equal(a[".jpg"], b[".jpg"]) and a[".cls"] == b[".cls"]

    def test_plain_samples_skip_the_dict_path_and_others_take_it(self, shards, monkeypatch):
        from pipekit.transforms._augment import Augment

        calls = []
        general = Augment.apply

        def counting(self, sample, stream):
            calls.append(sample.get("__key__"))
            return general(self, sample, stream)

        monkeypatch.setattr(Augment, "apply", counting)
        torch.manual_seed(0)
        batches = list(datasets.TarShards(str(shards), batch_size=4, size=16, shuffle_buffer=8))
        assert sum(len(b["__key__"]) for b in batches) == SHARDS * PER_SHARD
        assert calls == []  # {"__key__", ".jpg", ".cls"}: the plain-tensor path
        extra = datasets.TarShards(
            str(shards), batch_size=None, size=16, shuffle_buffer=8, transform=None, decode={".cls": _label_tensor}
        )
        samples = list(extra)
        assert len(calls) == len(samples) == SHARDS * PER_SHARD  # another tensor in the sample: Augment
        assert all(s[".jpg"].shape == (3, 16, 16) for s in samples)

    def test_crop_and_flip_never_swap_the_global_rng(self, shards, monkeypatch):
        from pipekit.transforms.seeding import RandomStream

        def refuse(self):
            raise AssertionError("swapped torch's global RNG")

        monkeypatch.setattr(RandomStream, "torch_global", refuse)
        ds = datasets.TarShards(str(shards), batch_size=4, size=16, shuffle_buffer=8)
        torch.manual_seed(0)
        batches = list(ds)
        assert sum(len(b["__key__"]) for b in batches) == SHARDS * PER_SHARD
        assert all(b[".jpg"].shape[1:] == (3, 16, 16) for b in batches)
        with pytest.raises(AssertionError, match="swapped"):  # TrivialAugmentWide still takes the swap
            list(datasets.TarShards(str(shards), batch_size=4, size=16, trivial_augment=True))

    def test_resumes_mid_epoch_with_the_same_crops(self, shards):
        def loader():
            ds = datasets.TarShards(str(shards), batch_size=2, size=16, shuffle_buffer=8)
            return pipekit.DataLoader(ds, num_workers=0)

        torch.manual_seed(4)
        full = list(loader())
        torch.manual_seed(4)
        first = loader()
        it = iter(first)
        head = [next(it) for _ in range(5)]
        state = pickle.loads(pickle.dumps(first.state_dict()))
        torch.manual_seed(99)  # the resumed crops come from the checkpointed stream, not from torch's seed
        resumed = loader()
        resumed.load_state_dict(state)
        got = head + list(resumed)
        assert [b["__key__"] for b in got] == [b["__key__"] for b in full]
        assert all(torch.equal(a[".jpg"], b[".jpg"]) for a, b in zip(got, full))

    def test_errors_are_noted(self, shards):
        ds = datasets.TarShards(str(shards), batch_size=None, size=64, decode={".jpg": _tiny_image})
        with pytest.raises(ZeroDivisionError) as info:
            next(iter(ds))
        if sys.version_info >= (3, 11):  # exception notes
            assert "in Augment step 0 (RandomResizedCrop), in augment" in info.value.__notes__


class TestExif:
    def test_an_exif_rotated_jpeg_comes_out_upright(self, tmp_path):
        # 6 = "rotate 90 clockwise to display": stored 40 wide x 24 high, shown 24 wide x 40 high
        stored = Image.new("RGB", (40, 24), (0, 0, 255))
        stored.paste((255, 0, 0), (0, 0, 10, 24))  # red: the stored image's left columns
        exif = Image.Exif()
        exif[0x0112] = 6
        buf = io.BytesIO()
        stored.save(buf, "JPEG", quality=95, exif=exif.tobytes())
        path = tmp_path / "exif-000.tar"
        with tarfile.open(path, "w") as tar:
            for name, data in (("r.jpg", buf.getvalue()), ("r.cls", b"0")):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        image = next(iter(datasets.TarShards(str(path), train=False, batch_size=None)))[".jpg"]
        assert image.shape == (3, 40, 24)  # upright: taller than wide
        expected = torch.from_numpy(np.array(ImageOps.exif_transpose(Image.open(io.BytesIO(buf.getvalue())))))
        assert (image.permute(1, 2, 0).int() - expected.int()).abs().max() <= 2
        assert image[0, :8, 12].float().mean() > 200 and image[2, -8:, 12].float().mean() > 200  # red on top
        crops = next(iter(datasets.TarShards(str(path), batch_size=None, size=8)))[".jpg"]
        assert crops.shape == (3, 8, 8)


class TestOverrides:
    def test_decode_false_gives_bytes_and_handlers_extend_the_defaults(self, shards):
        raw = next(iter(datasets.TarShards(str(shards), train=False, batch_size=None, decode=False)))
        assert isinstance(raw[".jpg"], bytes) and raw[".jpg"][:2] == b"\xff\xd8"
        ds = datasets.TarShards(str(shards), train=False, batch_size=None, decode={".cls": _as_text})
        sample = next(iter(ds))
        assert isinstance(sample[".cls"], str) and sample[".jpg"].dtype == torch.uint8

    def test_decode_stage_and_transform(self, shards):
        ds = datasets.TarShards(
            str(shards), train=False, batch_size=2, decode=lambda p: p.decode(image_mode="GRAY"), transform=_label_only
        )
        batch = next(iter(ds))
        assert set(batch) == {"label", "channels"}
        assert batch["channels"].tolist() == [1, 1]

    def test_own_collate(self, shards):
        ds = datasets.TarShards(str(shards), train=False, batch_size=3, collate_fn=len)
        assert next(iter(ds)) == 3

    def test_argument_validation(self, shards):
        with pytest.raises(ValueError, match="decode=False"):
            datasets.TarShards(str(shards), size=16, decode=False)
        with pytest.raises(ValueError, match="shuffle_buffer must be a positive int"):
            datasets.TarShards(str(shards), shuffle_buffer=-1)
        with pytest.raises(TypeError, match="decode must be"):
            datasets.TarShards(str(shards), decode="jpg")
        with pytest.raises(TypeError, match="storage_options must be a dict"):
            datasets.TarShards(str(shards), storage_options="anon")

    def test_missing_image_key_is_named(self, shards):
        ds = datasets.TarShards(str(shards), train=False, size=16, image_key=".png")
        with pytest.raises(KeyError, match=r"has no '\.png' entry"):
            next(iter(ds))


class TestErrors:
    def test_corrupt_image_is_named_or_skipped(self, tmp_path):
        path = tmp_path / "bad-000.tar"
        with tarfile.open(path, "w") as tar:
            for name, data in (("a.jpg", b"\xff\xd8\xff nope"), ("a.json", json.dumps({"x": 1}).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        with pytest.raises(DecodeError, match=r"bad-000\.tar/a\.jpg"):
            list(datasets.TarShards(str(path), train=False, batch_size=None))
        samples = list(datasets.TarShards(str(path), train=False, batch_size=None, on_error="skip"))
        assert samples == []

    def test_corrupt_image_named_with_url_and_stage_when_training(self, tmp_path):
        path = tmp_path / "bad-001.tar"
        good = io.BytesIO()
        Image.new("RGB", (8, 6), (1, 2, 3)).save(good, "JPEG")
        with tarfile.open(path, "w") as tar:
            for name, data in (
                ("a.jpg", good.getvalue()),
                ("a.cls", b"1"),
                ("b.jpg", b"\xff\xd8\xff nope"),
                ("b.cls", b"2"),
            ):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        with pytest.raises(DecodeError, match=r"bad-001\.tar/b\.jpg.*decode") as info:
            list(datasets.TarShards(str(path), batch_size=None, size=4))
        assert info.value.stage == "decode"
        ds = datasets.TarShards(str(path), batch_size=None, size=4, on_error="skip")
        assert [s["__key__"].rsplit("/", 1)[1] for s in ds] == ["a"]

    def test_truncated_shard_with_two_workers_is_named_or_counted(self, shards, tmp_path):
        """The error reaches the main process naming the shard and stage; skipped, it is counted there."""
        import shutil

        for s in range(1, SHARDS):
            shutil.copy(shards / f"shard-{s:06d}.tar", tmp_path)
        data = (shards / "shard-000000.tar").read_bytes()
        (tmp_path / "cut.tar").write_bytes(data[: len(data) // 2 + 100])
        urls = [str(tmp_path / "cut.tar"), *(str(tmp_path / f"shard-{s:06d}.tar") for s in range(1, SHARDS))]
        loader = pipekit.DataLoader(datasets.TarShards(urls, train=False, batch_size=2), num_workers=2)
        with pytest.raises(ArchiveError, match=r"cut\.tar") as info:
            list(loader)
        assert info.value.stage == "load_from_tar"
        loader.shutdown()
        skipping = pipekit.DataLoader(
            datasets.TarShards(urls, train=False, batch_size=2, on_error="skip"), num_workers=2
        )
        keys = [k for b in skipping for k in b["__key__"]]
        report = skipping.skip_report()
        skipping.shutdown()
        assert report.count == 1 and report.skipped[0].url == str(tmp_path / "cut.tar")
        good = [k for k in keys if "/cut.tar/" not in k]
        assert len(good) == (SHARDS - 1) * PER_SHARD == len(set(good))
        assert 0 < len(keys) - len(good) < PER_SHARD  # the samples before the cut, the rest counted above

    def test_truncated_shard_is_named(self, shards, tmp_path):
        data = (shards / "shard-000000.tar").read_bytes()
        (tmp_path / "cut.tar").write_bytes(data[: len(data) // 2 + 100])
        with pytest.raises(ArchiveError, match=r"cut\.tar"):
            list(datasets.TarShards(str(tmp_path / "cut.tar"), train=False, batch_size=None))


@pytest.mark.s3
def test_s3_shards(s3_server, shards):
    bucket = s3_server.create_bucket()
    fs = s3_server.fs()
    for s in range(SHARDS):
        fs.put(str(shards / f"shard-{s:06d}.tar"), f"{bucket}/train/shard-{s:06d}.tar")
    ds = datasets.TarShards(
        f"s3://{bucket}/train/{PATTERN}", batch_size=4, shuffle_buffer=4, storage_options=s3_server.storage_options
    )
    torch.manual_seed(0)
    keys = [k for b in pipekit.DataLoader(ds, num_workers=2) for k in b["__key__"]]
    assert len(keys) == SHARDS * PER_SHARD == len(set(keys))
    assert all(k.startswith(f"s3://{bucket}/train/shard-") for k in keys)
    listed = datasets.TarShards(f"s3://{bucket}/train/", storage_options=s3_server.storage_options)
    assert listed.shards == [f"s3://{bucket}/train/shard-{s:06d}.tar" for s in range(SHARDS)]


@pytest.mark.s3
def test_s3_shards_resume_mid_shard_with_small_blocks(s3_server, shards):
    """Exact mid-epoch resume over S3 shards read in chunks (s3fs blocks far smaller than a shard)."""
    bucket = s3_server.create_bucket()
    fs = s3_server.fs()
    for s in range(SHARDS):
        fs.put(str(shards / f"shard-{s:06d}.tar"), f"{bucket}/shard-{s:06d}.tar")
    opts = {**s3_server.storage_options, "default_block_size": 4096}

    def loader():
        ds = datasets.TarShards(
            f"s3://{bucket}/{PATTERN}", batch_size=2, shuffle_buffer=4, size=16, storage_options=opts
        )
        return pipekit.DataLoader(ds, num_workers=0)

    torch.manual_seed(7)
    full = list(loader())
    torch.manual_seed(7)
    first = loader()
    it = iter(first)
    head = [next(it) for _ in range(5)]  # 10 of 24 samples, mid-shard
    state = pickle.loads(pickle.dumps(first.state_dict()))
    resumed = loader()
    resumed.load_state_dict(state)
    got = head + list(resumed)
    assert [b["__key__"] for b in got] == [b["__key__"] for b in full]
    assert all(torch.equal(a[".jpg"], b[".jpg"]) for a, b in zip(got, full))


def _label_tensor(data: bytes) -> torch.Tensor:
    return torch.tensor(int(data))


def _tiny_image(data: bytes) -> torch.Tensor:
    return torch.zeros(3, 0, 4, dtype=torch.uint8)  # no pixels: RandomResizedCrop cannot crop it


def _as_text(data: bytes) -> str:
    return data.decode()


def _label_only(sample: dict) -> dict:
    return {"label": sample[".cls"], "channels": sample[".jpg"].shape[0]}


def test_webdataset_is_the_same_recipe():
    """``datasets.WebDataset`` (the webdataset library's name) is TarShards; the pipe of that name is another class."""
    from pipekit.pipes import WebDataset as GroupingPipe

    assert datasets.WebDataset is datasets.TarShards
    assert GroupingPipe is not datasets.WebDataset


@pytest.mark.s3
class TestCacheDir:
    """``cache_dir=``: remote shards copied whole once, read locally afterwards, checked against the object."""

    def upload(self, s3_server, shards) -> str:
        bucket = s3_server.create_bucket()
        fs = s3_server.fs()
        for s in range(SHARDS):
            fs.put(str(shards / f"shard-{s:06d}.tar"), f"{bucket}/shard-{s:06d}.tar")
        return bucket

    def eval_keys(self, ds) -> list[str]:
        return [s["__key__"] for s in ds]

    def test_same_samples_and_keys_from_the_copies(self, s3_server, shards, tmp_path):
        bucket = self.upload(s3_server, shards)
        url = f"s3://{bucket}/{PATTERN}"
        opts = s3_server.storage_options
        plain = datasets.TarShards(url, train=False, batch_size=None, storage_options=opts)
        cached = datasets.TarShards(url, train=False, batch_size=None, storage_options=opts, cache_dir=tmp_path)
        expected = list(plain)
        got = list(cached)
        assert [s["__key__"] for s in got] == [s["__key__"] for s in expected]
        assert all(k.startswith(f"s3://{bucket}/shard-") for k in (s["__key__"] for s in got))
        assert all(torch.equal(a[".jpg"], b[".jpg"]) and a[".cls"] == b[".cls"] for a, b in zip(got, expected))
        copies = sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".tar")
        assert len(copies) == SHARDS and all(name.endswith(".tar") for name in copies)
        for s in range(SHARDS):  # byte for byte the objects
            local = next(tmp_path.glob(f"*-shard-{s:06d}.tar"))
            assert local.read_bytes() == (shards / f"shard-{s:06d}.tar").read_bytes()
        assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]

    def test_second_epoch_reads_the_copies_not_the_objects(self, s3_server, shards, tmp_path, monkeypatch):
        bucket = self.upload(s3_server, shards)
        ds = datasets.TarShards(
            f"s3://{bucket}/{PATTERN}", train=False, batch_size=None,
            storage_options=s3_server.storage_options, cache_dir=tmp_path,
        )
        first = self.eval_keys(ds)
        from pipekit.pipes._fsspec_io import FSSpecFileOpener

        opened = []
        real = FSSpecFileOpener.reopen

        def counting(self, url):
            opened.append(url)
            return real(self, url)

        monkeypatch.setattr(FSSpecFileOpener, "reopen", counting)
        assert self.eval_keys(ds) == first
        assert opened == []  # no object opened again: the copies were up to date

    def test_a_replaced_object_is_copied_again(self, s3_server, shards, tmp_path):
        bucket = self.upload(s3_server, shards)
        opts = s3_server.storage_options
        url = f"s3://{bucket}/shard-000000.tar"
        ds = datasets.TarShards(url, train=False, batch_size=None, storage_options=opts, cache_dir=tmp_path)
        assert len(self.eval_keys(ds)) == PER_SHARD
        smaller = tmp_path / "other"
        write_image_shards(smaller, shards=1, per_shard=2, size=32, progress=False)
        s3_server.fs().put(str(smaller / "shard-000000.tar"), f"{bucket}/shard-000000.tar")
        assert len(self.eval_keys(ds)) == 2  # not the stale copy's 6

    def test_a_missing_object_is_named(self, s3_server, shards, tmp_path):
        bucket = self.upload(s3_server, shards)
        url = f"s3://{bucket}/shard-000009.tar"
        ds = datasets.TarShards(
            url, train=False, batch_size=None, storage_options=s3_server.storage_options, cache_dir=tmp_path
        )
        with pytest.raises(ReadError, match=r"shard-000009\.tar") as info:
            list(ds)
        assert "TarShards cache" in str(info.value)

    def test_an_unusable_cache_dir_is_named_with_the_shard(self, s3_server, shards, tmp_path):
        bucket = self.upload(s3_server, shards)
        not_a_folder = tmp_path / "file"
        not_a_folder.write_text("x")
        ds = datasets.TarShards(
            f"s3://{bucket}/shard-000000.tar", train=False, batch_size=None,
            storage_options=s3_server.storage_options, cache_dir=not_a_folder,
        )
        with pytest.raises(ReadError, match=r"shard-000000\.tar") as info:
            list(ds)
        assert info.value.stage == "TarShards cache" and str(not_a_folder) in str(info.value)

    def test_resume_mid_shard_with_workers(self, s3_server, shards, tmp_path):
        bucket = self.upload(s3_server, shards)

        def loader():
            ds = datasets.TarShards(
                f"s3://{bucket}/{PATTERN}", batch_size=2, shuffle_buffer=4, size=16,
                storage_options=s3_server.storage_options, cache_dir=tmp_path / "cache",
            )
            return pipekit.DataLoader(ds, num_workers=2)

        torch.manual_seed(3)
        full = [k for b in loader() for k in b["__key__"]]
        torch.manual_seed(3)
        first = loader()
        it = iter(first)
        head = [k for _ in range(4) for k in next(it)["__key__"]]
        state = pickle.loads(pickle.dumps(first.state_dict()))
        del it
        resumed = loader()
        resumed.load_state_dict(state)
        rest = [k for b in resumed for k in b["__key__"]]
        assert head + rest == full
        assert len(set(full)) == SHARDS * PER_SHARD

    def test_local_shards_are_read_in_place(self, shards, tmp_path):
        ds = datasets.TarShards(str(shards / PATTERN), train=False, batch_size=None, cache_dir=tmp_path / "c")
        assert self.eval_keys(ds) == _keys(shards)
        assert not (tmp_path / "c").exists()
        with pytest.raises(TypeError, match="cache_dir must be a folder path"):
            datasets.TarShards(str(shards / PATTERN), cache_dir=3)


class TestWebDatasetHabits:
    """The ``webdataset`` library's arguments on the recipe: ``shardshuffle=``, ``resampled=``, ``pipe:`` URLs."""

    def test_shardshuffle_is_shuffle_shards(self, shards):
        ordered = datasets.WebDataset(str(shards / PATTERN), batch_size=None, shardshuffle=False, shuffle_buffer=0)
        assert [s["__key__"] for s in ordered] == _keys(shards)
        torch.manual_seed(0)
        # the library's buffer size is accepted: any true value shuffles the whole list
        shuffled = datasets.WebDataset(str(shards / PATTERN), batch_size=None, shardshuffle=100, shuffle_buffer=0)
        orders = [[s["__key__"] for s in shuffled][::PER_SHARD] for _ in range(3)]
        assert any(o != _keys(shards)[::PER_SHARD] for o in orders)

    def test_resampled_draws_shards_endlessly_and_resumes(self, shards):
        def loader():
            ds = datasets.WebDataset(str(shards / PATTERN), batch_size=None, resampled=True, shuffle_buffer=0)
            return pipekit.DataLoader(ds.header(40), num_workers=0, batch_size=None)

        torch.manual_seed(1)
        full = [s["__key__"] for s in loader()]
        assert len(full) == 40  # more than the 24 samples: shards are drawn with replacement
        assert set(full) <= set(_keys(shards))
        torch.manual_seed(1)
        first = loader()
        it = iter(first)
        head = [next(it)["__key__"] for _ in range(9)]
        resumed = loader()
        resumed.load_state_dict(pickle.loads(pickle.dumps(first.state_dict())))
        assert head + [s["__key__"] for s in resumed] == full

    @pytest.mark.timeout(60)
    def test_resampled_with_two_workers_gives_each_worker_its_own_draws(self, shards):
        ds = datasets.WebDataset(str(shards / PATTERN), batch_size=None, resampled=True, shuffle_buffer=0)
        got = [s["__key__"] for s in pipekit.DataLoader(ds.header(12), num_workers=2, batch_size=None)]
        assert len(got) == 24  # no sharding_filter: each worker reads 12
        assert got[0::2] != got[1::2]

    def test_pipe_urls_run_the_command_without_a_shell(self, shards):
        local = list(datasets.WebDataset(str(shards / PATTERN), train=False, batch_size=None))
        piped = list(datasets.WebDataset(f"pipe:cat {shards}/{PATTERN}", train=False, batch_size=None))
        assert [s["__key__"] for s in piped] == [f"pipe:cat {k}" for k in _keys(shards)]
        assert all(torch.equal(a[".jpg"], b[".jpg"]) and a[".cls"] == b[".cls"] for a, b in zip(local, piped))

    def test_pipe_url_errors_name_the_url(self, shards, tmp_path):
        with pytest.raises(ValueError, match=r"pipe:cat a\.tar \| gunzip.*shell syntax"):
            datasets.WebDataset("pipe:cat a.tar | gunzip")
        with pytest.raises(ValueError, match="mixes pipe: and other URLs"):
            datasets.WebDataset([f"pipe:cat {shards}/shard-000000.tar", str(shards / "shard-000001.tar")])
        with pytest.raises(ValueError, match="cache_dir"):
            datasets.WebDataset(f"pipe:cat {shards}/shard-000000.tar", cache_dir=tmp_path)
        missing = datasets.WebDataset(f"pipe:cat {tmp_path}/none.tar", train=False, batch_size=None)
        with pytest.raises((ArchiveError, ReadError), match=r"pipe:cat .*none\.tar.*status 1"):
            list(missing)


class TestDecodeThreads:
    """``decode_threads=``: images decoded on a thread pool (a 0-worker loader's idle cores), nothing else changed."""

    def test_same_batches_as_decoding_in_the_loop(self, shards):
        def batches(threads):
            torch.manual_seed(7)
            ds = datasets.TarShards(str(shards), batch_size=4, size=16, shuffle_buffer=8, decode_threads=threads)
            return list(ds)

        plain, threaded = batches(0), batches(2)
        assert [b["__key__"] for b in threaded] == [b["__key__"] for b in plain]
        assert all(torch.equal(a[".jpg"], b[".jpg"]) and torch.equal(a[".cls"], b[".cls"])
                   for a, b in zip(threaded, plain))

    def test_resumes_mid_epoch_with_images_in_flight(self, shards):
        def loader():
            ds = datasets.TarShards(str(shards), batch_size=2, size=16, shuffle_buffer=8, decode_threads=2)
            return pipekit.DataLoader(ds, num_workers=0)

        torch.manual_seed(4)
        full = list(loader())
        torch.manual_seed(4)
        first = loader()
        it = iter(first)
        head = [next(it) for _ in range(5)]
        state = pickle.loads(pickle.dumps(first.state_dict()))
        resumed = loader()
        resumed.load_state_dict(state)
        got = head + list(resumed)
        assert [b["__key__"] for b in got] == [b["__key__"] for b in full]
        assert all(torch.equal(a[".jpg"], b[".jpg"]) for a, b in zip(got, full))

    def test_a_corrupt_image_is_named_or_skipped_as_without_threads(self, tmp_path):
        path = tmp_path / "bad-002.tar"
        good = io.BytesIO()
        Image.new("RGB", (8, 6), (1, 2, 3)).save(good, "JPEG")
        with tarfile.open(path, "w") as tar:
            members = (("a.jpg", good.getvalue()), ("a.cls", b"1"), ("b.jpg", b"\xff\xd8\xff no"), ("b.cls", b"2"))
            for name, data in members:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        with pytest.raises(DecodeError, match=r"bad-002\.tar/b\.jpg.*decode"):
            list(datasets.TarShards(str(path), batch_size=None, size=4, decode_threads=2))
        ds = datasets.TarShards(str(path), batch_size=None, size=4, on_error="skip", decode_threads=2)
        assert [s["__key__"].rsplit("/", 1)[1] for s in ds] == ["a"]

    def test_argument_checks(self, shards):
        with pytest.raises(ValueError, match="decode_threads"):
            datasets.TarShards(str(shards), decode_threads=-1)
        with pytest.raises(ValueError, match="decode_threads"):
            datasets.TarShards(str(shards), decode=False, decode_threads=2)
