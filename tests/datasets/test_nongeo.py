"""Tests for datasets.NonGeoClassificationDataset / NonGeoDataset / ChipRecipe with real GeoTIFF, PNG and JPEG chips."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import fsspec
import numpy as np
import pytest
import rasterio
import torch
from PIL import Image
from rasterio.transform import from_origin

import pipekit
from pipekit import datasets
from pipekit.datasets import ChipRecipe, DatasetNotFoundError, NonGeoClassificationDataset, NonGeoDataset
from pipekit.errors import DecodeError, ReadError

CLASSES = ["AnnualCrop", "Forest", "River"]
PER_CLASS = 4
BANDS = 13
SIZE = 16
S2_BANDS = ("B01", "B02", "B03", "B04", "B05", "B06", "B07", "B08", "B09", "B10", "B11", "B12", "B8A")


def chip_id(label: int, n: int) -> int:
    return label * 100 + n


def write_chip(path: Path, ident: int, bands: int = BANDS, size: int = SIZE) -> None:
    """A real 13-band uint16 GeoTIFF whose band b holds ``ident * 20 + b`` everywhere."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = np.stack([np.full((size, size), ident * 20 + b, dtype=np.uint16) for b in range(bands)])
    profile = dict(driver="GTiff", width=size, height=size, count=bands, dtype="uint16", crs="EPSG:32631",
                   transform=from_origin(500000, 5000000, 10, 10))
    with rasterio.open(path, "w", **profile) as ds:
        ds.write(data)


def write_eurosat_like(root: Path) -> Path:
    for label, name in enumerate(CLASSES):
        for n in range(1, PER_CLASS + 1):
            write_chip(root / name / f"{name}_{n}.tif", chip_id(label, n))
    return root


@pytest.fixture(scope="module")
def chips(tmp_path_factory) -> Path:
    return write_eurosat_like(tmp_path_factory.mktemp("eurosat"))


def ident_of(image: torch.Tensor) -> int:
    return int(image[0, 0, 0].item()) // 20


class S2Chips(NonGeoClassificationDataset):
    all_band_names = S2_BANDS


class TestClassification:
    def test_classes_samples_dtypes(self, chips):
        ds = NonGeoClassificationDataset(chips)
        assert isinstance(ds, NonGeoDataset) and isinstance(ds, torch.utils.data.Dataset)
        assert ds.classes == CLASSES and ds.class_to_idx == {"AnnualCrop": 0, "Forest": 1, "River": 2}
        assert len(ds) == len(CLASSES) * PER_CLASS and ds.imgs is ds.samples
        assert ds.targets == [i // PER_CLASS for i in range(len(ds))]
        assert Path(ds.samples[0][0]).relative_to(chips).as_posix() == "AnnualCrop/AnnualCrop_1.tif"
        sample = ds[PER_CLASS + 2]  # Forest_3
        assert set(sample) == {"image", "label"}
        image, label = sample["image"], sample["label"]
        assert image.shape == (BANDS, SIZE, SIZE) and image.dtype == torch.float32
        assert label.dtype == torch.int64 and label.ndim == 0 and label.item() == 1
        assert image[:, 5, 5].tolist() == [chip_id(1, 3) * 20 + b for b in range(BANDS)]
        assert "size: 12" in str(ds)
        with pytest.raises(IndexError):
            ds[len(ds)]

    def test_bands_by_name_and_index(self, chips):
        ds = S2Chips(chips, bands=("B04", "B03", "B02"))
        assert ds.bands == ("B04", "B03", "B02") and ds.band_indices == [3, 2, 1]
        assert ds[0]["image"][:, 0, 0].tolist() == [chip_id(0, 1) * 20 + b for b in (3, 2, 1)]
        ds = NonGeoClassificationDataset(chips, bands=[12, 0])
        assert ds[1]["image"][:, 0, 0].tolist() == [chip_id(0, 2) * 20 + 12, chip_id(0, 2) * 20]
        named = NonGeoClassificationDataset(chips, band_names=S2_BANDS, bands=["B8A"])
        assert named[0]["image"].shape == (1, SIZE, SIZE) and named[0]["image"][0, 0, 0] == chip_id(0, 1) * 20 + 12
        with pytest.raises(ValueError, match="'B13' is an invalid band name"):
            S2Chips(chips, bands=["B13"])
        with pytest.raises(ValueError, match="pass band_names"):
            NonGeoClassificationDataset(chips, bands=["B01"])
        with pytest.raises(TypeError):
            NonGeoClassificationDataset(chips, bands="B01")
        too_many = NonGeoClassificationDataset(chips, bands=[13])
        with pytest.raises(DecodeError, match=r"AnnualCrop_1\.tif.*13 bands"):
            too_many[0]

    def test_png_and_jpeg_chips(self, tmp_path):
        (tmp_path / "a").mkdir()
        Image.fromarray(np.full((8, 9, 3), (10, 20, 30), np.uint8)).save(tmp_path / "a" / "x.png")
        Image.fromarray(np.full((8, 9), 77, np.uint8)).save(tmp_path / "a" / "gray.png")
        (tmp_path / "b").mkdir()
        Image.fromarray(np.full((8, 9, 3), 200, np.uint8)).save(tmp_path / "b" / "y.jpg", quality=95)
        (tmp_path / "b" / "notes.txt").write_text("not a chip")
        ds = NonGeoClassificationDataset(tmp_path)
        assert [Path(p).name for p, _ in ds.samples] == ["gray.png", "x.png", "y.jpg"]
        gray, rgb, jpeg = ds[0]["image"], ds[1]["image"], ds[2]["image"]
        assert gray.shape == (1, 8, 9) and gray.unique().tolist() == [77.0]
        assert rgb.shape == (3, 8, 9) and rgb[:, 0, 0].tolist() == [10.0, 20.0, 30.0]
        assert jpeg.shape == (3, 8, 9) and jpeg.dtype == torch.float32 and abs(jpeg.mean().item() - 200) < 3

    def test_transforms_loader_and_is_valid_file(self, chips):
        def rasterio_loader(path):  # TorchGeo's convention: [H, W, C] int32
            with rasterio.open(path) as f:
                return f.read().astype(np.int32).transpose(1, 2, 0)

        default = NonGeoClassificationDataset(chips)
        custom = NonGeoClassificationDataset(chips, loader=rasterio_loader)
        assert torch.equal(default[5]["image"], custom[5]["image"]) and custom[5]["image"].dtype == torch.float32
        only_1 = NonGeoClassificationDataset(chips, is_valid_file=lambda p: p.endswith("_1.tif"))
        assert len(only_1) == len(CLASSES) and only_1.targets == [0, 1, 2]

        def double(sample):
            return {**sample, "image": sample["image"] * 2, "extra": 1}

        ds = NonGeoClassificationDataset(chips, transforms=double)
        assert ds[0]["extra"] == 1 and torch.equal(ds[0]["image"], default[0]["image"] * 2)

        def broken_loader(path):
            raise RuntimeError("boom")

        with pytest.raises(DecodeError, match=r"AnnualCrop_1\.tif.*boom"):
            NonGeoClassificationDataset(chips, loader=broken_loader)[0]

    def test_missing_or_empty_roots_raise_clearly(self, tmp_path, chips):
        with pytest.raises(DatasetNotFoundError, match="no such directory"):
            NonGeoClassificationDataset(tmp_path / "nope")
        (tmp_path / "empty").mkdir()
        with pytest.raises(DatasetNotFoundError, match="no class folders"):
            NonGeoClassificationDataset(tmp_path / "empty")
        root = tmp_path / "root"
        shutil.copytree(chips, root)
        (root / "Highway").mkdir()
        (root / "Highway" / "readme.txt").write_text("x")
        with pytest.raises(DatasetNotFoundError, match="Highway"):
            NonGeoClassificationDataset(root)

    def test_corrupt_chip_names_file_and_skip_is_counted(self, tmp_path, chips):
        root = tmp_path / "root"
        shutil.copytree(chips, root)
        bad = root / "Forest" / "Forest_9.tif"
        bad.write_bytes(b"II*\x00" + b"\x00" * 50)
        ds = NonGeoClassificationDataset(root)
        index = [p for p, _ in ds.samples].index(str(bad))
        with pytest.raises(DecodeError, match=r"Forest_9\.tif.*NonGeoClassificationDataset"):
            ds[index]
        with pytest.raises(DecodeError, match=r"Forest_9\.tif"):
            list(ds.pipe(train=False, batch_size=4))
        pipe = ds.pipe(train=False, batch_size=None, on_error="skip")
        samples = list(pipe)
        assert len(samples) == len(CLASSES) * PER_CLASS
        loader_pipe = next(p for p in pipekit.pipes._resume.pipeline_pipes(pipe) if hasattr(p, "skip_log"))
        assert loader_pipe.skip_log.count == 1 and loader_pipe.skip_log.skipped[0].url == str(bad)
        loader = pipekit.DataLoader(ds.pipe(train=False, batch_size=5, on_error="skip"), num_workers=0)
        assert sum(len(b["label"]) for b in loader) == len(CLASSES) * PER_CLASS
        assert loader.skip_report().count == 1
        bad.unlink()
        with pytest.raises(ReadError, match=r"Forest_9\.tif"):
            ds[index]


class TestRemote:
    def test_memory_filesystem(self, chips):
        fs = fsspec.filesystem("memory")
        fs.put(str(chips), "/nongeo-test", recursive=True)
        try:
            ds = S2Chips("memory://nongeo-test", bands=["B02"])
            assert ds.classes == CLASSES and ds.samples[0][0] == "memory:///nongeo-test/AnnualCrop/AnnualCrop_1.tif"
            assert ds[PER_CLASS]["image"][0, 0, 0] == chip_id(1, 1) * 20 + 1
        finally:
            fs.rm("/nongeo-test", recursive=True)

    @pytest.mark.s3
    @pytest.mark.slow
    def test_s3_folder(self, s3_server, chips):
        bucket = s3_server.create_bucket()
        s3_server.fs().put(str(chips), f"{bucket}/eurosat", recursive=True)
        ds = S2Chips(f"s3://{bucket}/eurosat", bands=["B04", "B8A"], storage_options=s3_server.storage_options)
        local = S2Chips(chips, bands=["B04", "B8A"])
        assert ds.classes == CLASSES and len(ds) == len(local)
        assert all(u.startswith(f"s3://{bucket}/eurosat/") for u, _ in ds.samples)
        assert torch.equal(ds[7]["image"], local[7]["image"]) and ds[7]["label"] == local[7]["label"]
        batches = list(pipekit.DataLoader(ds.pipe(train=False, batch_size=4), num_workers=2))
        assert sorted(ident_of(img) for b in batches for img in b["image"]) == sorted(
            chip_id(lab, n) for lab in range(len(CLASSES)) for n in range(1, PER_CLASS + 1))


class TestLoading:
    @pytest.mark.slow
    def test_torch_dataloader_two_workers(self, chips):
        ds = S2Chips(chips, bands=["B02", "B03"])
        loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, shuffle=False)
        batches = list(loader)
        assert [b["image"].shape for b in batches] == [torch.Size([4, 2, SIZE, SIZE])] * 3
        labels = torch.cat([b["label"] for b in batches])
        assert labels.dtype == torch.int64 and labels.tolist() == ds.targets

    def test_pipe_batches_and_shuffles(self, chips):
        ds = NonGeoClassificationDataset(chips)
        pipe = ds.pipe(train=False, batch_size=5)
        assert isinstance(pipe, ChipRecipe)
        batches = list(pipe)
        assert [len(b["label"]) for b in batches] == [5, 5, 2]
        assert torch.cat([b["label"] for b in batches]).tolist() == ds.targets
        assert batches[0]["image"].shape == (5, BANDS, SIZE, SIZE)
        torch.manual_seed(3)
        train = list(ds.pipe(train=True, batch_size=None))
        assert sorted(ident_of(s["image"]) for s in train) == sorted(ident_of(ds[i]["image"]) for i in range(len(ds)))
        assert [ident_of(s["image"]) for s in train] != [ident_of(ds[i]["image"]) for i in range(len(ds))]
        with pytest.raises(ValueError, match="batch_size"):
            ds.pipe(batch_size=0)
        pickle.loads(pickle.dumps(ds.pipe()))

    @pytest.mark.parametrize("num_workers", [0, pytest.param(2, marks=pytest.mark.slow)])
    def test_resume_exact(self, chips, num_workers):
        def loader():
            return pipekit.DataLoader(S2Chips(chips, bands=["B01"]).pipe(train=True, batch_size=2),
                                      num_workers=num_workers)

        def idents(batches):
            return [[ident_of(img) for img in b["image"]] for b in batches]

        torch.manual_seed(7)
        full = idents(loader())
        torch.manual_seed(7)
        first = loader()
        it = iter(first)
        head = [next(it) for _ in range(2)]
        state = pickle.loads(pickle.dumps(first.state_dict()))
        del it
        resumed = loader()
        resumed.load_state_dict(state)
        rest = list(resumed)
        assert idents(head) + idents(rest) == full
        assert sorted(i for b in full for i in b) == sorted(
            chip_id(lab, n) for lab in range(len(CLASSES)) for n in range(1, PER_CLASS + 1))
        assert all(b["label"].dtype == torch.int64 for b in rest)


def test_exported():
    for name in ("NonGeoDataset", "NonGeoClassificationDataset", "ChipRecipe", "EuroSAT", "COCODetection"):
        assert name in datasets.__all__ and hasattr(datasets, name)


@pytest.mark.parametrize(("make", "name"), [
    (lambda p, fn: ChipRecipe([0], collate_fn=fn), "ChipRecipe: collate_fn"),
    (lambda p, fn: datasets.ImageFolder(p, collate_fn=fn), "ImageFolder: collate_fn"),
    (lambda p, fn: datasets.TarShards(f"{p}/s-{{0..1}}.tar", collate_fn=fn), "TarShards: collate_fn"),
    (lambda p, fn: NonGeoClassificationDataset(p, loader=fn), "NonGeoClassificationDataset: loader"),
    (lambda p, fn: datasets.IndexedShards(f"{p}/s-{{0..1}}.tar", transform=fn), "IndexedShards: transform"),
], ids=["ChipRecipe", "ImageFolder", "TarShards", "NonGeoClassificationDataset", "IndexedShards"])
def test_a_function_argument_not_callable_is_refused_naming_it(tmp_path, make, name):
    # one sentence for every dataset and recipe, which says that None is accepted too; before any file is looked for
    with pytest.raises(TypeError, match=f"^{name} must be callable or None, got 5$"):
        make(tmp_path / "missing", 5)
