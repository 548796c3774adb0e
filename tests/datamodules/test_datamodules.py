"""The datamodules: TorchGeo 0.8's hooks, pipekit.DataLoaders, device-side normalisation and augmentation, splits."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("lightning")

import pipekit
from pipekit.datamodules import (
    EuroSATDataModule,
    GeoDataModule,
    LandsatCDLDataModule,
    NonGeoDataModule,
    compute_stats,
)
from pipekit.errors import ConfigurationError
from pipekit.transforms import BatchRandomHorizontalFlip

SRC = str(Path(__file__).resolve().parents[2] / "src")


def python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"})


@pytest.mark.slow  # a fresh interpreter importing pipekit: seconds
def test_import_pipekit_does_not_import_lightning_and_without_it_the_error_names_the_extra():
    done = python("""
        import sys
        import pipekit, pipekit.datasets, pipekit.transforms, pipekit.device
        print("lightning" in sys.modules, "pytorch_lightning" in sys.modules)
        sys.modules["lightning"] = None  # as if it were not installed
        from pipekit.errors import DependencyNotFoundError
        try:
            import pipekit.datamodules
        except DependencyNotFoundError as exc:
            print(isinstance(exc, ModuleNotFoundError), exc)
    """)
    assert done.returncode == 0, done.stderr
    imported, error = done.stdout.split("\n", 1)
    assert imported.split() == ["False", "False"]
    assert error.startswith("True pipekit.datamodules needs the 'lightning' package")
    assert "pip install 'pipekit[lightning]'" in error


class Ramp(torch.utils.data.Dataset):
    """Sample ``i`` of a split: a 2x2x2 uint8 image filled with ``i``, its label and id."""

    sizes = {"train": 6, "valid": 2, "test": 3}

    def __init__(self, split: str, root: str = "x") -> None:
        self.split, self.root = split, root

    def __len__(self) -> int:
        return self.sizes[self.split]

    def __getitem__(self, i: int) -> dict:
        return {"image": torch.full((2, 2, 2), i, dtype=torch.uint8), "label": torch.tensor(i), "id": i}

    def plot(self, sample: dict) -> str:
        return f"plotted {self.split}"


def fake_trainer(**flags: bool) -> SimpleNamespace:
    names = ("training", "validating", "sanity_checking", "testing", "predicting")
    return SimpleNamespace(**{n: flags.get(n, False) for n in names})


class TestNonGeoDataModule:
    def test_setup_splits_and_loaders(self):
        dm = NonGeoDataModule(Ramp, batch_size=4, split_names={"val": "valid"}, seed=1, root="r")
        with pytest.raises(ConfigurationError, match=r"NonGeoDataModule.setup must define one of \('train_dataset'"):
            dm.train_dataloader()
        dm.setup("fit")
        assert (dm.train_dataset.split, dm.val_dataset.split, dm.train_dataset.root) == ("train", "valid", "r")
        assert dm.test_dataset is None
        train, val = dm.train_dataloader(), dm.val_dataloader()
        assert isinstance(train, pipekit.DataLoader) and isinstance(val, pipekit.DataLoader)
        assert len(train) == 1  # 6 samples, batches of 4, the partial one dropped
        assert [b["label"].tolist() for b in val] == [[0, 1]]  # in order, kept whole
        # the training order comes from seed: the same every time, another with another seed
        order = [b["label"].tolist() for b in dm.train_dataloader()]
        assert order == [b["label"].tolist() for b in dm.train_dataloader()]
        other = NonGeoDataModule(Ramp, batch_size=6, split_names={"val": "valid"}, seed=2)
        other.setup("fit")
        dm.batch_size = 6
        assert next(iter(other.train_dataloader()))["label"].tolist() != next(iter(dm.train_dataloader()))[
            "label"].tolist()
        dm.setup("test")
        assert len(dm.test_dataloader().dataset) == 3

    def test_arguments_are_checked(self):
        with pytest.raises(ValueError, match="batch_size must be"):
            NonGeoDataModule(Ramp, batch_size=0)
        with pytest.raises(ValueError, match="split_names keys must be"):
            NonGeoDataModule(Ramp, split_names={"training": "x"})

    def test_normalised_on_the_device_and_augmented_only_in_training(self):
        dm = NonGeoDataModule(Ramp, batch_size=2)
        dm.mean, dm.std = torch.tensor([1.0, 2.0]), torch.tensor([2.0, 4.0])
        dm.train_aug = BatchRandomHorizontalFlip(p=1.0, seed=0)
        dm.aug = lambda batch: {**batch, "evaluated": True}
        batch = {"image": torch.tensor([[[[0, 5]], [[10, 6]]]], dtype=torch.uint8), "label": torch.tensor([3]),
                 "id": ["a"]}
        moved = dm.transfer_batch_to_device(batch, torch.device("cpu"), 0)
        assert moved["image"].dtype == torch.float32 and moved["id"] == ["a"]
        assert moved["image"].flatten().tolist() == [-0.5, 2.0, 2.0, 1.0]  # (x - mean) / std per band
        assert dm.on_after_batch_transfer(moved, 0) is moved  # no trainer: nothing
        dm.trainer = fake_trainer(training=True)
        assert dm.on_after_batch_transfer(moved, 0)["image"].flatten().tolist() == [2.0, -0.5, 1.0, 2.0]
        for flag in ("validating", "sanity_checking", "testing"):
            dm.trainer = fake_trainer(**{flag: True})
            assert dm.on_after_batch_transfer(moved, 0)["evaluated"] is True  # the split falls back to aug

    def test_plot_uses_the_dataset(self):
        dm = NonGeoDataModule(Ramp, split_names={"val": "valid"})
        assert dm.plot({}) is None
        dm.setup("validate")
        assert dm.plot({}) == "plotted valid"


def write_eurosat(root: Path) -> Path:
    """EuroSAT's layout: class folders of 13-band uint16 GeoTIFF chips (band b of chip n holds 100 * n + b)."""
    import rasterio
    from rasterio.transform import from_origin

    from pipekit.datasets import EuroSAT

    folder = root / EuroSAT.base_dir
    names = {"train": [], "val": [], "test": []}
    for n, (cls, split) in enumerate([(c, s) for s in ("train", "train", "val", "test") for c in ("Forest", "River")]):
        path = folder / cls / f"{cls}_{n}.tif"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = np.stack([np.full((8, 8), 100 * n + b, dtype=np.uint16) for b in range(13)])
        with rasterio.open(path, "w", driver="GTiff", width=8, height=8, count=13, dtype="uint16",
                           crs="EPSG:32631", transform=from_origin(500000, 5000000, 10, 10)) as f:
            f.write(data)
        names[split].append(path.name.replace(".tif", ".jpg"))
    for split, files in names.items():
        (root / f"eurosat-{split}.txt").write_text("\n".join(files) + "\n")
    return root


def test_eurosat_datamodule(tmp_path):
    root = write_eurosat(tmp_path)
    dm = EuroSATDataModule(batch_size=2, root=root, bands=("B04", "B03", "B02"))
    assert dm.mean.tolist() == pytest.approx([947.62620298, 1042.92983953, 1118.24399958])
    dm.setup("fit")
    assert (len(dm.train_dataset), len(dm.val_dataset)) == (4, 2)
    batches = list(dm.train_dataloader())
    assert len(batches) == 2 and sorted(torch.cat([b["label"] for b in batches]).tolist()) == [0, 0, 1, 1]
    moved = dm.transfer_batch_to_device(batches[0], torch.device("cpu"), 0)
    raw = batches[0]["image"][:, 0]  # band B04
    assert torch.allclose(moved["image"][:, 0], (raw - 947.62620298) / 593.75055589)
    dm.setup("test")
    assert len(dm.test_dataset) == 2
    with pytest.raises(ValueError, match="unknown band"):
        EuroSATDataModule(root=root, bands=("B99",))


@pytest.fixture(scope="module")
def small_landsat_cdl(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("corpus")


def small(root: Path, **kwargs) -> LandsatCDLDataModule:
    return LandsatCDLDataModule(batch_size=2, patch_size=16, length=4, grid_size=3, root=root, corpus_size=96,
                                corpus_scenes=1, **kwargs)


@pytest.mark.slow  # writes a raster corpus, reads and reprojects patches: seconds
@pytest.mark.filterwarnings("ignore:GridGeoSampler")
def test_landsat_cdl_datamodule_splits_by_region(small_landsat_cdl):
    import shapely

    dm = small(small_landsat_cdl)
    dm.prepare_data()
    dm.setup("fit")
    parts = [shapely.union_all(ds.index.geometry.values) for ds in (dm.train_dataset, dm.val_dataset,
                                                                     dm.test_dataset)]
    assert all(p.area > 0 for p in parts)
    for i in range(3):
        for j in range(i + 1, 3):
            assert parts[i].intersection(parts[j]).area == 0  # no pixel in two splits
    assert sum(p.area for p in parts) == pytest.approx(shapely.union_all(dm.dataset.index.geometry.values).area)
    # fixed and seeded: the same arguments give the same split, another seed another one
    again = small(small_landsat_cdl)
    again.setup("fit")
    assert again.train_dataset.index.geometry.equals(dm.train_dataset.index.geometry)
    other = small(small_landsat_cdl, seed=1)
    other.setup("fit")
    assert not other.train_dataset.index.geometry.equals(dm.train_dataset.index.geometry)

    loader = dm.train_dataloader()
    assert isinstance(loader, pipekit.DataLoader) and len(loader) == 2
    batch = next(iter(loader))
    assert batch["image"].shape == (2, 7, 16, 16) and batch["mask"].shape == (2, 16, 16)
    assert int(batch["mask"].max()) < dm.num_classes
    moved = dm.transfer_batch_to_device(batch, torch.device("cpu"), 0)
    assert moved["mask"].dtype == torch.long and moved["image"].dtype == torch.float32
    assert len(moved["crs"]) == 2  # non-tensor entries stay
    stats = compute_stats(dm, num_samples=4)
    assert len(stats.mean) == 7 and all(s > 0 for s in stats.std)

    # the training loader resumes mid-epoch (and into the next epoch) as an uninterrupted one goes on
    def fitted() -> LandsatCDLDataModule:
        module = small(small_landsat_cdl)
        module.setup("fit")
        return module

    full = fitted().train_dataloader()
    expected = [b["bounds"] for _ in range(2) for b in full]
    for taken in (1, 2):  # mid-epoch, and at the epoch's last batch
        loader = fitted().train_dataloader()
        it = iter(loader)
        seen = [next(it)["bounds"] for _ in range(taken)]
        resumed = fitted().train_dataloader()
        resumed.load_state_dict(loader.state_dict())
        rest = [b["bounds"] for b in resumed] if taken < 2 else []
        assert seen + rest + [b["bounds"] for b in resumed] == expected


def test_geo_datamodule_arguments_are_checked():
    with pytest.raises(TypeError, match="patch_size must be"):
        GeoDataModule(object, patch_size=(1, 2, 3))
    with pytest.raises(ValueError, match="length must be"):
        GeoDataModule(object, length=0)
    with pytest.raises(ValueError, match="fractions must be"):
        LandsatCDLDataModule(fractions=(0.5, 0.5))


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:GridGeoSampler")
def test_landsat_cdl_stored_statistics_are_what_compute_stats_gives(tmp_path):
    stats = compute_stats(LandsatCDLDataModule(root=tmp_path), num_samples=200)
    assert stats.mean == pytest.approx(LandsatCDLDataModule.mean.tolist(), rel=1e-5)
    assert stats.std == pytest.approx(LandsatCDLDataModule.std.tolist(), rel=1e-5)
