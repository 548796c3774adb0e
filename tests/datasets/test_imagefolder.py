"""Tests for datasets.ImageFolder with real JPEG folders (pipekit.synthetic.write_image_folder)."""

from __future__ import annotations

import io
import pickle
import shutil
from collections import Counter
from pathlib import Path

import fsspec
import pytest
import torch
from PIL import Image

import pipekit
from pipekit import datasets
from pipekit.datasets._imagefolder import _AspectResize, collate_by_aspect
from pipekit.errors import DecodeError
from pipekit.synthetic import CLASSES, write_image_folder

PER_CLASS = 5


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return write_image_folder(tmp_path_factory.mktemp("folder"), per_class=PER_CLASS, size=40, progress=False)


def _all_files(root: Path) -> list[str]:
    return sorted(str(p) for p in root.rglob("*.jpg"))


def _tuples(samples):
    return torch.stack([s["image"] for s in samples]), torch.tensor([s["label"] for s in samples])


class TestListing:
    def test_classes_labels_and_samples(self, folder):
        ds = datasets.ImageFolder(folder, batch_size=None)
        assert ds.classes == sorted(CLASSES)
        assert ds.class_to_idx == {name: i for i, name in enumerate(sorted(CLASSES))}
        assert len(ds.samples) == 4 * PER_CLASS == len(ds.targets)
        for url, label in ds.samples:
            assert Path(url).parent.name == ds.classes[label]
        assert [u for u, _ in ds.samples] == _all_files(folder)
        assert "4 classes, 20 images" in repr(ds)

    def test_subfolders_belong_to_their_class_and_hidden_ones_are_skipped(self, folder, tmp_path):
        root = tmp_path / "root"
        shutil.copytree(folder, root)
        (root / "circle" / "nested").mkdir()
        shutil.copy(root / "square" / "square_00000.jpg", root / "circle" / "nested" / "x.JPG")
        (root / ".cache").mkdir()
        shutil.copy(root / "square" / "square_00000.jpg", root / ".cache" / "y.jpg")
        (root / "circle" / "notes.txt").write_text("not an image")
        ds = datasets.ImageFolder(root, batch_size=None)
        assert ds.classes == sorted(CLASSES)
        nested = [label for url, label in ds.samples if url.endswith("x.JPG")]
        assert nested == [ds.class_to_idx["circle"]]
        assert not any(url.endswith(("y.jpg", ".txt")) for url, _ in ds.samples)

    def test_missing_root(self, tmp_path):
        with pytest.raises(FileNotFoundError, match=r"ImageFolder: no such directory: .*nowhere"):
            datasets.ImageFolder(tmp_path / "nowhere")

    def test_root_without_class_folders(self, tmp_path):
        Image.new("RGB", (4, 4)).save(tmp_path / "loose.jpg")
        with pytest.raises(FileNotFoundError, match="has no class folders"):
            datasets.ImageFolder(tmp_path)

    def test_empty_class_folder(self, folder, tmp_path):
        root = tmp_path / "root"
        shutil.copytree(folder, root)
        (root / "empty").mkdir()
        with pytest.raises(FileNotFoundError, match=r"class folder 'empty' of .* has no image files"):
            datasets.ImageFolder(root)
        ds = datasets.ImageFolder(root, allow_empty=True, batch_size=None, train=False)
        assert "empty" in ds.classes and len(ds.samples) == 4 * PER_CLASS

    def test_argument_validation(self, folder):
        with pytest.raises(ValueError, match="batch_size must be a positive int"):
            datasets.ImageFolder(folder, batch_size=0)
        with pytest.raises(ValueError, match="needs a batch_size"):
            datasets.ImageFolder(folder, batch_size=None, bucket_by_aspect=True)
        with pytest.raises(TypeError, match="transform must be a callable"):
            datasets.ImageFolder(folder, transform="flip")
        with pytest.raises(TypeError, match="root must be a path"):
            datasets.ImageFolder(3)
        with pytest.raises(TypeError, match="extensions"):
            datasets.ImageFolder(folder, extensions=".jpg")


class TestEval:
    def test_samples_in_file_order_resized_and_center_cropped(self, folder):
        ds = datasets.ImageFolder(folder, train=False, size=32, batch_size=None)
        samples = list(ds)
        assert [s["url"] for s in samples] == [u for u, _ in ds.samples]
        assert [s["label"] for s in samples] == ds.targets
        for s in samples:
            assert s["image"].shape == (3, 32, 32) and s["image"].dtype == torch.uint8
        # Resize(32 / 0.875 = 37) then CenterCrop(32) equals torchvision's own on the decoded file
        from torchvision.io import decode_image
        from torchvision.transforms import v2

        raw = decode_image(samples[0]["url"])
        expected = v2.CenterCrop(32)(v2.Resize(37, antialias=True)(raw))
        assert torch.equal(samples[0]["image"], expected)

    def test_batches(self, folder):
        ds = datasets.ImageFolder(folder, train=False, size=24, batch_size=6)
        batches = list(ds)
        assert [len(b["url"]) for b in batches] == [6, 6, 6, 2]
        assert batches[0]["image"].shape == (6, 3, 24, 24) and batches[0]["image"].dtype == torch.uint8
        assert batches[0]["label"].dtype == torch.int64
        assert torch.cat([b["label"] for b in batches]).tolist() == ds.targets

    def test_two_workers_read_every_file_exactly_once(self, folder):
        ds = datasets.ImageFolder(folder, train=False, size=16, batch_size=3)
        urls = [u for batch in pipekit.DataLoader(ds, num_workers=2) for u in batch["url"]]
        assert sorted(urls) == _all_files(folder)

    def test_pickles_before_iteration(self, folder):
        ds = datasets.ImageFolder(folder, train=False, size=16, batch_size=4)
        copy = pickle.loads(pickle.dumps(ds))
        assert copy.classes == ds.classes
        assert [b["label"].tolist() for b in copy] == [b["label"].tolist() for b in ds]


class TestTrain:
    def test_each_epoch_is_a_new_permutation_of_the_files(self, folder):
        ds = datasets.ImageFolder(folder, size=16, batch_size=None)
        torch.manual_seed(0)
        first = [s["url"] for s in ds]
        second = [s["url"] for s in ds]
        assert sorted(first) == sorted(second) == _all_files(folder)
        assert first != second and first != _all_files(folder)

    def test_random_resized_crops_and_labels(self, folder):
        ds = datasets.ImageFolder(folder, size=20, batch_size=8, trivial_augment=True)
        torch.manual_seed(0)
        batch = next(iter(ds))
        assert batch["image"].shape == (8, 3, 20, 20) and batch["image"].dtype == torch.uint8
        for url, label in zip(batch["url"], batch["label"].tolist()):
            assert Path(url).parent.name == ds.classes[label]

    def test_two_workers_each_file_once_per_epoch(self, folder):
        ds = datasets.ImageFolder(folder, size=16, batch_size=4)
        torch.manual_seed(0)
        loader = pipekit.DataLoader(ds, num_workers=2)
        for _ in range(2):
            urls = [u for batch in loader for u in batch["url"]]
            assert sorted(urls) == _all_files(folder)

    def test_resumes_mid_epoch_without_repeating_or_losing(self, folder):
        def loader():
            return pipekit.DataLoader(datasets.ImageFolder(folder, size=16, batch_size=3), num_workers=0)

        torch.manual_seed(1)
        full = list(loader())
        torch.manual_seed(1)
        first = loader()
        it = iter(first)
        head = [next(it) for _ in range(3)]
        state = pickle.loads(pickle.dumps(first.state_dict()))
        resumed = loader()
        resumed.load_state_dict(state)
        rest = list(resumed)
        got = head + rest
        assert [b["url"] for b in got] == [b["url"] for b in full]
        assert all(torch.equal(a["image"], b["image"]) for a, b in zip(got, full))  # same augmentations too

    def test_resumes_under_nested_cycles_at_the_end_of_an_outer_pass(self, tmp_path):
        """Found by the resume contract harness: checkpointed as the outer cycle's first pass yields its last
        item, the next pass restarted the recipe's file order and augmentation with the resumed loader's seed
        (spent in the checkpointed run) instead of drawing them from torch's generator: other orders and crops."""
        folder = write_image_folder(tmp_path, per_class=1, size=8, progress=False)
        generator = torch.Generator()

        def loader():
            recipe = datasets.ImageFolder(folder, size=8, batch_size=None)
            return pipekit.DataLoader(recipe.cycle(2).shuffle(buffer_size=3).cycle(2), generator=generator)

        torch.manual_seed(0)
        generator.manual_seed(0)
        full = list(loader())
        torch.manual_seed(0)
        generator.manual_seed(0)
        first = loader()
        it = iter(first)
        head = [next(it) for _ in range(2 * 4)]  # the outer cycle's first pass, to its last item
        state, rng = pickle.loads(pickle.dumps(first.state_dict())), torch.get_rng_state()
        torch.manual_seed(99)
        resumed = loader()  # built, then the checkpoint loaded: torch's RNG state, kept with the loader's
        torch.set_rng_state(rng)
        generator.manual_seed(12345)  # the resumed epoch's order comes from the checkpoint only
        resumed.load_state_dict(state)
        got = head + list(resumed)
        assert [s["url"] for s in got] == [s["url"] for s in full]
        assert all(torch.equal(a["image"], b["image"]) for a, b in zip(got, full))


class TestBucketByAspect:
    def test_aspect_buckets(self):
        resize = _AspectResize(32)
        assert resize.shape(40, 40) == (32, 32)
        assert resize.shape(30, 45) == (32, 48)
        assert resize.shape(45, 30) == (48, 32)
        assert resize.shape(10, 100) == (32, 64)  # clamped to 2:1
        assert resize(torch.zeros(3, 30, 45, dtype=torch.uint8)).shape == (3, 32, 48)

    def test_batches_keep_aspect_and_cover_every_file(self, folder):
        ds = datasets.ImageFolder(folder, train=False, size=32, batch_size=4, bucket_by_aspect=True)
        batches = list(ds)
        urls = [u for b in batches for u in b["url"]]
        assert sorted(urls) == _all_files(folder)
        shapes = {tuple(b["image"].shape[-2:]) for b in batches}
        assert shapes <= {(32, 32), (32, 48), (48, 32)}
        assert len(shapes) > 1  # the synthetic images vary in aspect
        resize = _AspectResize(32)
        straddling = 0
        for b in batches:
            assert b["image"].dtype == torch.uint8
            buckets = [resize.shape(*Image.open(u).size[::-1]) for u in b["url"]]
            assert tuple(b["image"].shape[-2:]) == Counter(buckets).most_common(1)[0][0]
            straddling += len(set(buckets)) > 1
        # one sorting bucket (20 files <= 4 * 8): only batches at a boundary between shapes mix shapes
        distinct = {resize.shape(*Image.open(u).size[::-1]) for u in urls}
        assert straddling <= len(distinct) - 1

    def test_train_mode_shuffles_batches(self, folder):
        ds = datasets.ImageFolder(folder, size=32, batch_size=4, bucket_by_aspect=True)
        torch.manual_seed(0)
        urls = [u for b in pipekit.DataLoader(ds, num_workers=2) for u in b["url"]]
        assert sorted(urls) == _all_files(folder)

    def test_collate_resizes_the_odd_one(self):
        samples = [{"image": torch.zeros(3, 32, 48, dtype=torch.uint8), "label": 0},
                   {"image": torch.full((3, 48, 32), 7, dtype=torch.uint8), "label": 1},
                   {"image": torch.zeros(3, 32, 48, dtype=torch.uint8), "label": 2}]
        batch = collate_by_aspect(samples)
        assert batch["image"].shape == (3, 3, 32, 48)
        assert int(batch["image"][1].float().mean().round()) == 7
        with pytest.raises(ValueError, match="empty batch"):
            collate_by_aspect([])


class TestOverrides:
    def test_no_transform_keeps_decoded_sizes(self, folder):
        ds = datasets.ImageFolder(folder, train=False, transform=False, batch_size=None)
        for s in ds:
            assert s["image"].shape[-2:] == Image.open(s["url"]).size[::-1]

    def test_own_transform_and_collate(self, folder):
        from torchvision.transforms import v2

        ds = datasets.ImageFolder(folder, train=False, transform=v2.Resize((8, 12)), batch_size=5, collate_fn=_tuples)
        images, labels = next(iter(ds))
        assert images.shape == (5, 3, 8, 12) and labels.tolist() == ds.targets[:5]

    def test_own_decode_stage(self, folder):
        ds = datasets.ImageFolder(folder, train=False, size=16, batch_size=None,
                                  decode=lambda pipe: pipe.decode_image(mode="GRAY"))
        assert next(iter(ds))["image"].shape == (1, 16, 16)
        with pytest.raises(TypeError, match="decode must return a pipe"):
            datasets.ImageFolder(folder, decode=lambda pipe: [1, 2])

    def test_corrupt_image_raises_naming_it_or_is_skipped(self, folder, tmp_path):
        root = tmp_path / "root"
        shutil.copytree(folder, root)
        bad = root / "square" / "broken.jpg"
        bad.write_bytes(b"\xff\xd8\xff not really a jpeg")
        with pytest.raises(DecodeError, match=r"broken\.jpg.*decode_image"):
            list(datasets.ImageFolder(root, train=False, size=16))
        ds = datasets.ImageFolder(root, train=False, size=16, batch_size=None, on_error="skip")
        assert len(list(ds)) == 4 * PER_CLASS
        decoder = next(p for p in pipekit.pipes._resume.pipeline_pipes(ds) if type(p).__name__ == "ImageDecoder")
        assert decoder.skip_log.count == 1


class TestRemote:
    def test_memory_filesystem_url(self):
        fs = fsspec.filesystem("memory")
        root = "memory://imagefolder-test"
        for cls, color in (("cat", (255, 0, 0)), ("dog", (0, 0, 255))):
            for i in range(3):
                buf = io.BytesIO()
                Image.new("RGB", (20, 30), color).save(buf, format="PNG")
                fs.pipe(f"/imagefolder-test/{cls}/{i}.png", buf.getvalue())
        try:
            ds = datasets.ImageFolder(root, train=False, size=16, batch_size=None)
            assert ds.classes == ["cat", "dog"]
            samples = list(ds)
            assert [s["label"] for s in samples] == [0, 0, 0, 1, 1, 1]
            assert samples[0]["url"].startswith("memory://")
            assert samples[0]["image"][0].float().mean() > 200 and samples[-1]["image"][2].float().mean() > 200
        finally:
            fs.rm("/imagefolder-test", recursive=True)

    @pytest.mark.s3
    def test_s3(self, s3_server, folder):
        bucket = s3_server.create_bucket()
        s3_server.fs().put(str(folder), f"{bucket}/train", recursive=True)
        ds = datasets.ImageFolder(f"s3://{bucket}/train", train=False, size=16, batch_size=4,
                                  storage_options=s3_server.storage_options)
        assert ds.classes == sorted(CLASSES) and len(ds.samples) == 4 * PER_CLASS
        urls = [u for b in pipekit.DataLoader(ds, num_workers=2) for u in b["url"]]
        assert sorted(urls) == sorted(u for u, _ in ds.samples)
        assert all(u.startswith(f"s3://{bucket}/train/") for u in urls)
