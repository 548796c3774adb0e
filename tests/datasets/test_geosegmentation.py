"""Tests for datasets.GeoSegmentation on the synthetic Landsat 8 + CDL corpus (real tiled GeoTIFFs)."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

import pipekit
from pipekit import datasets
from pipekit.datasets._geosegmentation import MapClasses
from pipekit.geo import GridGeoSampler, RandomBatchGeoSampler, RandomGeoSampler
from pipekit.geo._bbox import from_slices
from pipekit.synthetic.geo import CDL_CLASSES, write_landsat_cdl_corpus
from pipekit.transforms import AppendIndex, Normalize

CLASSES = [0, *CDL_CLASSES]  # background, then the 7 CDL codes the synthetic land cover uses


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_landsat_cdl_corpus(tmp_path_factory.mktemp("corpus"), size=512, scenes=2, progress=False)


@pytest.fixture
def images(corpus):
    return datasets.Landsat8(corpus / "landsat8")


@pytest.fixture
def labels(corpus):
    return datasets.CDL(corpus / "cdl")


class TestTrain:
    def test_batches(self, images, labels):
        recipe = datasets.GeoSegmentation(images, labels, size=32, length=12, batch_size=4, classes=CLASSES)
        assert recipe.bands == [*datasets.Landsat8.default_bands, "ndvi"]
        assert recipe.in_channels == 8 and recipe.num_classes == 8
        assert recipe.class_names[:3] == ["Background", "Corn", "Soybeans"]
        torch.manual_seed(0)
        batches = list(recipe)
        assert len(batches) == 3
        for b in batches:
            assert b["image"].shape == (4, 8, 32, 32) and b["image"].dtype == torch.float32
            assert b["mask"].shape == (4, 32, 32) and b["mask"].dtype == torch.int64
            assert int(b["mask"].min()) >= 0 and int(b["mask"].max()) < 8
            assert len(b["bounds"]) == 4 and all(c.to_epsg() == 32615 for c in b["crs"])

    def test_ndvi_is_the_landsat8_formula(self, images, labels):
        recipe = datasets.GeoSegmentation(images, labels, size=16, length=4, batch_size=None, augment=False)
        torch.manual_seed(0)
        for sample in recipe:
            red, nir = sample["image"][3], sample["image"][4]  # SR_B4, SR_B5
            expected = (nir - red) / (nir + red)
            torch.testing.assert_close(sample["image"][7], expected)
            raw = images[sample["bounds"]]["image"]
            torch.testing.assert_close(sample["image"][:7], raw)

    def test_augmentation_moves_image_and_mask_together(self, images, labels):
        def recipe(augment):
            return datasets.GeoSegmentation(images, labels, size=24, length=16, batch_size=None, augment=augment,
                                            sampler=RandomGeoSampler(images & labels, 24, length=16, seed=4))

        plain = list(recipe(False))
        torch.manual_seed(0)
        augmented = list(recipe(True))
        changed = 0
        for p, a in zip(plain, augmented):
            assert p["bounds"] == a["bounds"]
            matches = [
                (k, flip)
                for k in range(4)
                for flip in (False, True)
                if torch.equal(_dihedral(p["image"], k, flip), a["image"])
            ]
            assert matches, "the augmented image is not a flip/rotation of the patch"
            k, flip = matches[0]
            assert torch.equal(_dihedral(p["mask"], k, flip), a["mask"])
            changed += (k, flip) != (0, False)
        assert changed >= 8  # 7 of 8 dihedral transforms change the patch

    def test_two_workers_draw_each_patch_once(self, images, labels):
        recipe = datasets.GeoSegmentation(images, labels, size=16, length=20, batch_size=3)
        torch.manual_seed(0)
        bounds = [b for batch in pipekit.DataLoader(recipe, num_workers=2) for b in batch["bounds"]]
        assert len(bounds) == 20
        torch.manual_seed(0)
        again = [b for batch in pipekit.DataLoader(recipe, num_workers=2) for b in batch["bounds"]]
        assert again == bounds

    def test_resumes_mid_epoch(self, images, labels):
        def loader():
            recipe = datasets.GeoSegmentation(images, labels, size=16, length=12, batch_size=2, classes=CLASSES)
            return pipekit.DataLoader(recipe, num_workers=0)

        torch.manual_seed(2)
        full = list(loader())
        torch.manual_seed(2)
        first = loader()
        it = iter(first)
        head = [next(it) for _ in range(2)]
        state = pickle.loads(pickle.dumps(first.state_dict()))
        resumed = loader()
        resumed.load_state_dict(state)
        got = head + list(resumed)
        assert [b["bounds"] for b in got] == [b["bounds"] for b in full]
        assert all(torch.equal(a["image"], b["image"]) and torch.equal(a["mask"], b["mask"])
                   for a, b in zip(got, full))


class TestEval:
    def test_grid_patches_each_exactly_once_with_two_workers(self, images, labels):
        recipe = datasets.GeoSegmentation(images, labels, size=64, batch_size=5, train=False, classes=CLASSES)
        # TorchGeo 0.8's slices (unhashable before Python 3.12): compared as BoundingBoxes
        expected = [from_slices(q) for q in GridGeoSampler(images & labels, 64)]
        seen = [from_slices(b) for batch in pipekit.DataLoader(recipe, num_workers=2) for b in batch["bounds"]]
        assert len(seen) == len(expected) == len(set(seen))
        assert set(seen) == set(expected)

    def test_deterministic_no_augmentation_and_length(self, images, labels):
        recipe = datasets.GeoSegmentation(images, labels, size=32, length=6, batch_size=None, train=False)
        first = list(recipe)
        assert len(first) == 6
        assert [s["bounds"] for s in first] == list(GridGeoSampler(images & labels, 32))[:6]
        for s in first:
            torch.testing.assert_close(s["image"][:7], images[s["bounds"]]["image"])
        assert [s["bounds"] for s in recipe] == [s["bounds"] for s in first]

    def test_stride(self, images, labels):
        recipe = datasets.GeoSegmentation(images, labels, size=64, stride=32, train=False)
        assert len(recipe.sampler) == len(GridGeoSampler(images & labels, 64, stride=32))

    def test_pickles_before_iteration(self, images, labels):
        recipe = datasets.GeoSegmentation(images, labels, size=32, length=3, batch_size=None, train=False)
        copy = pickle.loads(pickle.dumps(recipe))
        assert [s["bounds"] for s in copy] == [s["bounds"] for s in recipe]


class TestNormalisationAndClasses:
    def test_auto_stats_normalise_every_channel_and_carry_to_eval(self, images, labels):
        train = datasets.GeoSegmentation(images, labels, size=32, length=16, batch_size=16, stats="auto",
                                         stats_samples=16, augment=False)
        assert len(train.stats.mean) == 8
        torch.manual_seed(0)
        batch = next(iter(train))
        per_channel = batch["image"].transpose(0, 1).reshape(8, -1)
        assert per_channel.mean(dim=1).abs().max() < 1.0
        assert ((per_channel.std(dim=1) > 0.3) & (per_channel.std(dim=1) < 3)).all()
        val = datasets.GeoSegmentation(images, labels, size=32, length=2, batch_size=None, train=False,
                                       stats=train.stats)
        sample = next(iter(val))
        raw = images[sample["bounds"]]["image"][4]
        torch.testing.assert_close(sample["image"][4], ((raw - train.stats.mean[4]) / train.stats.std[4]).float())

    def test_stats_as_mean_std_or_normalize(self, images, labels):
        mean, std = [0.0] * 8, [10000.0] * 7 + [1.0]
        for stats in ((mean, std), Normalize(mean, std)):
            recipe = datasets.GeoSegmentation(images, labels, size=16, length=1, batch_size=None, train=False,
                                              stats=stats)
            sample = next(iter(recipe))
            raw = images[sample["bounds"]]["image"]
            torch.testing.assert_close(sample["image"][:7], raw / 10000.0)

    def test_stats_with_the_wrong_channel_count(self, images, labels):
        with pytest.raises(ValueError, match="stats have 7 channels but the samples have 8"):
            datasets.GeoSegmentation(images, labels, size=16, stats=([0.0] * 7, [1.0] * 7))
        with pytest.raises(ValueError, match="stats must be None, 'auto'"):
            datasets.GeoSegmentation(images, labels, size=16, stats="yes")

    def test_classes_map_raw_values(self, images, corpus):
        labels = datasets.CDL(corpus / "cdl", ordinal=False)  # raw codes: a label product that maps nothing
        raw = datasets.GeoSegmentation(images, labels, size=32, length=4, batch_size=None, train=False)
        mapped = datasets.GeoSegmentation(images, labels, size=32, length=4, batch_size=None, train=False,
                                          classes=[0, 1, 24])
        assert raw.num_classes is None and mapped.num_classes == 3
        assert mapped.class_names == ["Background", "Corn", "Winter Wheat"]
        for r, m in zip(raw, mapped):
            expected = torch.zeros_like(r["mask"])
            expected[r["mask"] == 1] = 1
            expected[r["mask"] == 24] = 2
            assert torch.equal(m["mask"], expected)

    def test_classes_are_cdl_codes_with_an_ordinal_cdl(self, images, corpus, labels):
        """CDL masks hold ordinal labels (24 -> 15): the recipe's classes= still names CDL codes."""
        codes = [0, 1, 24, 141]
        kwargs = {"size": 64, "length": 12, "batch_size": None, "train": False}
        by_recipe = datasets.GeoSegmentation(images, labels, classes=codes, **kwargs)
        by_cdl = datasets.GeoSegmentation(images, datasets.CDL(corpus / "cdl", classes=codes), **kwargs)
        by_codes = datasets.GeoSegmentation(images, datasets.CDL(corpus / "cdl", ordinal=False), classes=codes,
                                            **kwargs)
        names = ["Background", "Corn", "Winter Wheat", "Deciduous Forest"]
        assert by_recipe.num_classes == by_cdl.num_classes == by_codes.num_classes == 4
        assert by_recipe.class_names == by_cdl.class_names == by_codes.class_names == names
        seen = set()
        for a, b, c in zip(by_recipe, by_cdl, by_codes):
            assert torch.equal(a["mask"], b["mask"]) and torch.equal(a["mask"], c["mask"])
            seen |= set(torch.unique(a["mask"]).tolist())
        assert seen == {0, 1, 2, 3}
        default = datasets.GeoSegmentation(images, labels, **kwargs)
        assert default.num_classes == 134 and default.class_names[15] == "Winter Wheat"
        with pytest.raises(ValueError, match=r"CDL code\(s\) \[24\] are not among the dataset's classes"):
            datasets.GeoSegmentation(images, datasets.CDL(corpus / "cdl", classes=[0, 1]), classes=[0, 24], **kwargs)

    def test_a_label_product_with_its_own_classes(self, corpus, images):
        labels = datasets.CDL(corpus / "cdl", classes=CLASSES)
        recipe = datasets.GeoSegmentation(images, labels, size=16, length=2)
        assert recipe.num_classes == 8 and recipe.class_names[1] == "Corn"

    def test_map_classes(self):
        out = MapClasses([0, 3, 7])({"mask": torch.tensor([[3, 7, 9], [0, 300, -1]]), "x": 1})
        assert out["mask"].tolist() == [[1, 2, 0], [0, 0, 0]] and out["x"] == 1
        with pytest.raises(ValueError, match="must not repeat"):
            MapClasses([0, 1, 1])
        with pytest.raises(ValueError, match="non-negative ints"):
            MapClasses([0, -2])


class TestIndicesAndBands:
    def test_several_indices_by_name(self, images, labels):
        recipe = datasets.GeoSegmentation(images, labels, size=16, length=2, batch_size=None, augment=False,
                                          indices=("ndvi", "ndwi", "nbr"))
        assert recipe.bands[-3:] == ["ndvi", "ndwi", "nbr"]
        torch.manual_seed(0)
        sample = next(iter(recipe))
        green, nir, swir2 = sample["image"][2], sample["image"][4], sample["image"][6]
        torch.testing.assert_close(sample["image"][8], (green - nir) / (green + nir))
        torch.testing.assert_close(sample["image"][9], (nir - swir2) / (nir + swir2))

    def test_no_indices(self, images, labels):
        recipe = datasets.GeoSegmentation(images, labels, size=16, length=1, indices=())
        assert recipe.in_channels == 7

    def test_missing_band_for_an_index(self, corpus, labels):
        rgb = datasets.Landsat8(corpus / "landsat8", bands=["SR_B2", "SR_B3", "SR_B4"])
        with pytest.raises(ValueError, match=r"index 'ndvi' needs band 'SR_B5' \(nir\), but Landsat8 reads bands"):
            datasets.GeoSegmentation(rgb, labels, size=16)
        recipe = datasets.GeoSegmentation(rgb, labels, size=16, length=1, indices=())
        assert recipe.bands == ["SR_B2", "SR_B3", "SR_B4"]

    def test_unknown_index(self, images, labels):
        with pytest.raises(ValueError, match="unknown index 'ndxx'"):
            datasets.GeoSegmentation(images, labels, size=16, indices=("ndxx",))

    def test_product_without_roles_needs_band_roles(self, corpus, labels):
        generic = datasets.RasterDataset(str(corpus / "landsat8" / "*" / "*_SR_B5.TIF"))  # bands without names
        with pytest.raises(ValueError, match="pass band_roles="):
            datasets.GeoSegmentation(generic, labels, size=16)
        recipe = datasets.GeoSegmentation(generic, labels, size=16, length=2, batch_size=None, augment=False,
                                          band_roles={"nir": 0, "red": 0})
        assert recipe.bands == ["band1", "ndvi"]
        sample = next(iter(recipe))
        assert sample["image"].shape == (2, 16, 16) and torch.all(sample["image"][1] == 0)  # ND(b, b) = 0
        with pytest.raises(ValueError, match="position 3 is out of range"):
            datasets.GeoSegmentation(generic, labels, size=16, band_roles={"nir": 3, "red": 0})

    def test_band_roles_override_and_ready_appenders(self, images, labels):
        recipe = datasets.GeoSegmentation(images, labels, size=16, length=1, batch_size=None, augment=False,
                                          band_roles={"nir": "SR_B6"},
                                          indices=("ndvi", AppendIndex("ndvi", nir=4, red=3, name="ndvi_b5")))
        assert recipe.bands[-2:] == ["ndvi", "ndvi_b5"]
        torch.manual_seed(0)
        s = next(iter(recipe))
        red, swir = s["image"][3], s["image"][5]
        torch.testing.assert_close(s["image"][7], (swir - red) / (swir + red))


class TestValidation:
    def test_products_must_be_image_and_mask(self, images, labels):
        with pytest.raises(ValueError, match="have no 'mask'"):
            datasets.GeoSegmentation(images, None, size=16)
        with pytest.raises(TypeError, match="images must be a geo dataset"):
            datasets.GeoSegmentation("landsat/", labels)
        with pytest.raises(TypeError, match="labels must be a geo dataset"):
            datasets.GeoSegmentation(images, "cdl/")

    def test_already_intersected_dataset(self, images, labels):
        recipe = datasets.GeoSegmentation(images & labels, None, size=16, length=2, batch_size=2)
        assert recipe.bands[-1] == "ndvi"
        torch.manual_seed(0)
        assert next(iter(recipe))["mask"].shape == (2, 16, 16)

    def test_sampler_override(self, images, labels):
        recipe = datasets.GeoSegmentation(images, labels, size=16, sampler=lambda ds: GridGeoSampler(ds, 128))
        assert isinstance(recipe.sampler, GridGeoSampler) and recipe.sampler.size == (128 * 30.0, 128 * 30.0)
        with pytest.raises(TypeError, match="not batches"):
            datasets.GeoSegmentation(images, labels, sampler=lambda ds: RandomBatchGeoSampler(ds, 16, 4, length=8))
        with pytest.raises(TypeError, match="sampler must be a GeoSampler"):
            datasets.GeoSegmentation(images, labels, sampler=3)

    def test_patch_larger_than_the_data(self, images, labels):
        with pytest.raises(ValueError, match="large enough for a patch"):
            datasets.GeoSegmentation(images, labels, size=5000)

    def test_own_transform_and_collate(self, images, labels):
        recipe = datasets.GeoSegmentation(images, labels, size=16, length=4, batch_size=2, transform=_drop_meta,
                                          collate_fn=_stack_pairs)
        torch.manual_seed(0)
        x, y = next(iter(recipe))
        assert x.shape == (2, 8, 16, 16) and y.shape == (2, 16, 16)


def _drop_meta(sample):
    return {"image": sample["image"], "mask": sample["mask"]}


def _stack_pairs(samples):
    return torch.stack([s["image"] for s in samples]), torch.stack([s["mask"] for s in samples])


def _dihedral(x: torch.Tensor, k: int, flip: bool) -> torch.Tensor:
    if flip:
        x = x.flip(-1)
    return torch.rot90(x, k, dims=(-2, -1))


def test_dihedral_helper_covers_eight_transforms():
    x = torch.arange(9).reshape(3, 3)
    variants = {tuple(_dihedral(x, k, f).flatten().tolist()) for k in range(4) for f in (False, True)}
    assert len(variants) == 8
    assert np.array_equal(_dihedral(x, 0, False).numpy(), x.numpy())
