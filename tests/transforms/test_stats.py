"""compute_stats (pipekit.transforms._stats) against numpy on the concatenated data."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch
from affine import Affine

from pipekit.geo import GridGeoSampler, RandomBatchGeoSampler, RandomGeoSampler, RasterDataset, write_geotiff
from pipekit.pipes import IterableWrapper
from pipekit.transforms import BandStats, Normalize, compute_stats

QS = (0.0, 1.0, 2.5, 25.0, 50.0, 75.0, 99.0, 100.0)


def concat(images: list[torch.Tensor]) -> np.ndarray:
    """[C, N] float64 array of all pixels, per band."""
    parts = [im.unsqueeze(0) if im.dim() == 3 else im for im in images]
    x = torch.cat(parts).transpose(0, 1).reshape(parts[0].shape[1], -1)
    return x.double().numpy()


def check_against_numpy(stats: BandStats, data: np.ndarray, exact_percentiles: bool) -> None:
    np.testing.assert_allclose(stats.mean, data.mean(1), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(stats.std, data.std(1), rtol=1e-10, atol=1e-12)
    assert stats.min == data.min(1).tolist()
    assert stats.max == data.max(1).tolist()
    assert stats.count == [data.shape[1]] * data.shape[0]
    for q in QS:
        expected = np.percentile(data, q, axis=1)
        got = np.asarray(stats.percentiles[q])
        if exact_percentiles:
            np.testing.assert_array_equal(got, expected)
        else:
            err = np.asarray(stats.percentile_error)
            assert (np.abs(got - expected) <= err + 1e-12).all(), (q, got, expected, err)


@pytest.fixture
def float_samples():
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(12):
        # each sample has its own range, so the histograms must grow both ways
        scale = 10.0 ** (i % 4 - 1)
        x = torch.randn(4, 16, 16, generator=g, dtype=torch.float64) * scale + (i - 6) * 3
        out.append({"image": x.float(), "id": i})
    return out


class TestComputeStats:
    def test_float_data_mean_std_exact_percentiles_within_bound(self, float_samples):
        stats = compute_stats(IterableWrapper(float_samples), percentiles=QS, progress=False)
        data = concat([s["image"] for s in float_samples])
        check_against_numpy(stats, data, exact_percentiles=False)
        assert stats.num_samples == 12
        ranges = data.max(1) - data.min(1)
        # the error bound is about one bin of the final range
        assert all(e <= 4 * r / 16384 for e, r in zip(stats.percentile_error, ranges))

    @pytest.mark.parametrize(
        ("dtype", "low", "high"),
        [(torch.uint8, 0, 256), (torch.int8, -128, 128), (torch.int16, -32768, 32768), (torch.uint16, 0, 65536)],
    )
    def test_integer_data_is_exact(self, dtype, low, high):
        g = torch.Generator().manual_seed(1)
        images = [torch.randint(low, high, (3, 9, 11), generator=g).to(dtype) for _ in range(7)]
        stats = compute_stats(images, percentiles=QS, progress=False)
        check_against_numpy(stats, concat(images), exact_percentiles=True)
        assert stats.percentile_error == [0.0, 0.0, 0.0]

    def test_batches_and_num_samples(self):
        g = torch.Generator().manual_seed(2)
        batches = [{"image": torch.randint(0, 1000, (4, 2, 5, 5), generator=g).to(torch.int16)} for _ in range(5)]
        stats = compute_stats(batches, num_samples=10, percentiles=QS, progress=False)
        assert stats.num_samples == 10
        firsts = torch.cat([b["image"] for b in batches])[:10]
        check_against_numpy(stats, concat([firsts]), exact_percentiles=True)

    def test_stops_reading_at_num_samples(self):
        read = []

        def gen():
            for i in range(100):
                read.append(i)
                yield torch.full((1, 2, 2), float(i))

        stats = compute_stats(gen(), num_samples=3, progress=False)
        assert read == [0, 1, 2] and stats.mean == [1.0]

    def test_numerically_stable_for_large_offsets(self):
        g = torch.Generator().manual_seed(3)
        images = [torch.randn(2, 32, 32, generator=g, dtype=torch.float64) * 1e-3 + 1e9 for _ in range(20)]
        stats = compute_stats(images, progress=False)
        data = concat(images)
        np.testing.assert_allclose(stats.std, data.std(1), rtol=1e-6)
        naive_var = (data**2).mean(1) - data.mean(1) ** 2  # what a running sum of squares would give
        assert not np.allclose(naive_var, data.var(1), rtol=1e-2)

    def test_nan_inf_and_nodata_are_left_out(self):
        a = torch.tensor([[[1.0, float("nan")], [-9.0, 3.0]], [[2.0, 2.0], [float("inf"), 4.0]]])
        stats = compute_stats([a], nodata=-9.0, percentiles=(50,), progress=False)
        assert stats.count == [2, 3]
        assert stats.mean == [2.0, pytest.approx(8 / 3)]
        assert stats.min == [1.0, 2.0] and stats.max == [3.0, 4.0]
        assert stats.percentiles[50.0][0] == pytest.approx(2.0, abs=stats.percentile_error[0])
        ints = torch.tensor([[[0, 5], [0, 7]]], dtype=torch.uint16)
        stats = compute_stats([ints], nodata=0, percentiles=(50,), progress=False)
        assert stats.count == [2] and stats.mean == [6.0] and stats.percentiles[50.0] == [6.0]

    def test_a_band_without_valid_values(self):
        x = torch.tensor([[[1.0, 2.0]], [[float("nan"), float("nan")]]])
        stats = compute_stats([x], progress=False)
        assert stats.count == [2, 0]
        assert math.isnan(stats.mean[1]) and math.isnan(stats.std[1]) and math.isnan(stats.percentiles[99.0][1])
        with pytest.raises(ValueError, match=r"band\(s\) \[1\] had no valid values"):
            stats.normalize()

    def test_constant_band_then_wider_values(self):
        images = [torch.full((1, 4, 4), 5.0)] * 3 + [torch.linspace(-100, 100, 16).reshape(1, 4, 4)]
        stats = compute_stats(images, percentiles=QS, progress=False)
        check_against_numpy(stats, concat(images), exact_percentiles=False)

    def test_item_kinds(self):
        x = torch.arange(8.0).reshape(2, 2, 2)
        by_tuple = compute_stats([(x, 0)], key=0, progress=False)
        by_array = compute_stats([x.numpy()], progress=False)
        by_tensor = compute_stats([x], progress=False)
        assert by_tuple.mean == by_array.mean == by_tensor.mean == [1.5, 5.5]

    def test_normalize_from_stats(self, float_samples):
        stats = compute_stats(float_samples, progress=False)
        norm = stats.normalize()
        assert isinstance(norm, Normalize)
        normed = torch.cat([norm(s["image"]).double().reshape(4, -1) for s in float_samples], dim=1)
        np.testing.assert_allclose(normed.mean(1).numpy(), 0.0, atol=1e-5)
        np.testing.assert_allclose(normed.std(1, unbiased=False).numpy(), 1.0, atol=1e-5)

    def test_progress_bar(self, float_samples, capsys):
        compute_stats(float_samples, num_samples=5, progress=True)
        err = capsys.readouterr().err
        assert "compute_stats" in err and "5/5" in err

    def test_warns_when_the_pipe_is_shorter(self, float_samples, caplog):
        with caplog.at_level(logging.WARNING, logger="pipekit"):
            stats = compute_stats(float_samples, num_samples=50, progress=False)
        assert stats.num_samples == 12
        assert "asked for 50 samples, the pipe had only 12" in caplog.text


# --------------------------------------------------------------------------- geo datasets

CRS = "EPSG:32615"


def write_tif(path, data: np.ndarray, nodata=None, x0: float = 500000.0, y0: float = 4000640.0) -> None:
    write_geotiff(path, data, CRS, Affine(10, 0, x0, 0, -10, y0), nodata=nodata)


@pytest.fixture
def scene(tmp_path):
    """A 3-band uint16 scene, 96 x 96 px, nodata 0: a stripe of 0 in every band, and band 1 has extra zeros."""
    g = np.random.default_rng(0)
    data = g.integers(1000, 20000, size=(3, 96, 96)).astype("uint16")
    data[:, :, :20] = 0  # no data on the left
    data[1, 40:60, 40:60] = 0  # band 1 only
    root = tmp_path / "scene"
    root.mkdir()
    write_tif(root / "scene.tif", data, nodata=0)
    return root, data


class Labels(RasterDataset):
    """Masks (is_image False) whose nodata differs from the images'."""

    is_image = False
    nodata = 255


def patches_of(dataset, sampler, key="image") -> list[torch.Tensor]:
    out = []
    for drawn in sampler:
        for query in drawn if isinstance(drawn, list) else [drawn]:
            out.append(dataset[query][key])
    return out


def valid_values(images: list[torch.Tensor], nodata: float | None) -> list[np.ndarray]:
    data = concat(images)
    return [band[band != nodata] if nodata is not None else band for band in data]


class TestGeoDatasets:
    """compute_stats(dataset, n) on a GeoDataset: seeded random patches, nodata left out per band (issue 15)."""

    def test_draws_n_seeded_random_patches_and_leaves_nodata_out(self, scene):
        root, _ = scene
        ds = RasterDataset(root, nodata=0)
        stats = compute_stats(ds, 12, size=32, percentiles=(50,), progress=False)
        assert stats.num_samples == 12
        # the same patches as the documented default sampler draws
        images = patches_of(ds, RandomGeoSampler(ds, size=32, length=12, seed=0))
        assert all(im.shape == (3, 32, 32) for im in images)
        bands = valid_values(images, 0)
        assert stats.count == [len(b) for b in bands]
        assert stats.count[1] < stats.count[0] == stats.count[2]  # per band: band 1 has more nodata
        np.testing.assert_allclose(stats.mean, [b.mean() for b in bands], rtol=1e-12)
        np.testing.assert_allclose(stats.std, [b.std() for b in bands], rtol=1e-10)
        assert stats.min == [b.min() for b in bands] and min(stats.min) >= 1000
        assert compute_stats(ds, 12, size=32, percentiles=(50,), progress=False) == stats  # seeded
        assert compute_stats(ds, 12, size=32, seed=1, progress=False).mean != stats.mean

    def test_nodata_from_the_product_class_and_explicit_values(self, scene):
        root, _ = scene

        class Product(RasterDataset):
            nodata = 0

        auto = compute_stats(Product(root), 6, size=32, progress=False)
        everything = compute_stats(Product(root), 6, size=32, nodata=None, progress=False)
        assert auto.min[0] >= 1000 and everything.min[0] == 0.0
        assert everything.count == [6 * 32 * 32] * 3 and auto.count[0] < everything.count[0]
        explicit = compute_stats(RasterDataset(root), 6, size=32, nodata=0, progress=False)
        assert explicit == auto

    def test_a_composition_uses_the_nodata_of_its_images(self, scene, tmp_path):
        root, data = scene
        labels = (data[0] % 5).astype("uint8")
        labels[:10] = 255
        (tmp_path / "labels").mkdir()
        write_tif(tmp_path / "labels" / "labels.tif", labels[None], nodata=255)
        ds = RasterDataset(root, nodata=0) & Labels(tmp_path / "labels")
        stats = compute_stats(ds, 5, size=24, progress=False)
        images = patches_of(ds, RandomGeoSampler(ds, size=24, length=5, seed=0))
        assert stats.count == [len(b) for b in valid_values(images, 0)]
        assert stats.min[0] >= 1000

    def test_images_with_different_nodata_need_an_explicit_value(self, scene, tmp_path):
        root, data = scene
        other = tmp_path / "other"
        other.mkdir()
        write_tif(other / "other.tif", data, nodata=65535, x0=500960.0)
        ds = RasterDataset(root, nodata=0) | RasterDataset(other, nodata=65535)
        with pytest.raises(ValueError, match=r"different nodata values \[0\.0, 65535\.0\]; pass nodata="):
            compute_stats(ds, 2, size=16, progress=False)
        assert compute_stats(ds, 2, size=16, nodata=0, progress=False).num_samples == 2

    def test_any_sampler(self, scene):
        root, _ = scene
        ds = RasterDataset(root, nodata=0)
        grid = GridGeoSampler(ds, size=32)
        stats = compute_stats(ds, sampler=grid, progress=False)
        assert stats.num_samples == len(grid) == 9
        assert stats.count == [len(b) for b in valid_values(patches_of(ds, grid), 0)]
        batches = RandomBatchGeoSampler(ds, size=16, batch_size=4, length=12, seed=0)  # 3 batches of 4
        assert compute_stats(ds, sampler=batches, progress=False).num_samples == 12
        assert compute_stats(ds, 5, sampler=batches, progress=False).num_samples == 5

    def test_default_length_is_the_default_samplers(self, scene):
        root, _ = scene
        ds = RasterDataset(root, nodata=0)
        stats = compute_stats(ds, size=48, progress=False)
        assert stats.num_samples == len(RandomGeoSampler(ds, size=48)) == 4

    def test_progress_bar_counts_patches(self, scene, capsys):
        root, _ = scene
        compute_stats(RasterDataset(root, nodata=0), 3, size=16, progress=True)
        assert "3/3" in capsys.readouterr().err

    def test_errors(self, scene):
        root, _ = scene
        ds = RasterDataset(root, nodata=0)
        with pytest.raises(TypeError, match="with sampler=, leave it out"):
            compute_stats(ds, sampler=GridGeoSampler(ds, size=32), size=32, progress=False)
        with pytest.raises(TypeError, match="apply to a geo dataset"):
            compute_stats([torch.ones(1, 2, 2)], size=32, progress=False)
        with pytest.raises(TypeError, match="nodata must be a number, None or 'auto'"):
            compute_stats(ds, 2, size=16, nodata="zero", progress=False)
        with pytest.raises(ValueError):  # no footprint holds a 200 px patch: the sampler says so
            compute_stats(ds, 2, size=200, progress=False)


class TestMaskedArrays:
    def test_masked_values_are_left_out(self):
        data = np.arange(2 * 3 * 3, dtype=np.float64).reshape(2, 3, 3)
        mask = np.zeros_like(data, dtype=bool)
        mask[0, 0, :] = True  # band 0's first row
        stats = compute_stats([np.ma.masked_array(data, mask)], progress=False)
        assert stats.count == [6, 9]
        assert stats.mean == [data[0, 1:].mean(), data[1].mean()]
        unmasked = compute_stats([np.ma.masked_array(data)], progress=False)
        assert unmasked.count == [9, 9]


class TestErrors:
    def test_empty_pipe(self):
        with pytest.raises(ValueError, match="yielded no samples"):
            compute_stats([], progress=False)

    def test_band_count_changes(self):
        with pytest.raises(ValueError, match="item 1 has 3 bands, the first item had 2"):
            compute_stats([torch.ones(2, 2, 2), torch.ones(3, 2, 2)], progress=False)

    def test_exact_dtype_changes(self):
        items = [torch.ones(2, 2, 2, dtype=torch.uint8), torch.ones(2, 2, 2, dtype=torch.int16)]
        with pytest.raises(ValueError, match=r"item 1 has dtype torch\.int16, the first item had torch\.uint8"):
            compute_stats(items, progress=False)

    def test_bad_items(self):
        with pytest.raises(KeyError, match="item 0 has no 'image' entry"):
            compute_stats([{"x": torch.ones(1, 1, 1)}], progress=False)
        with pytest.raises(TypeError, match="item 0 is a tuple"):
            compute_stats([(torch.ones(1, 1, 1),)], progress=False)
        with pytest.raises(ValueError, match=r"expected \[C, H, W\] or \[B, C, H, W\]"):
            compute_stats([torch.ones(4, 4)], progress=False)

    def test_bad_arguments(self):
        with pytest.raises(ValueError, match="num_samples must be a positive int"):
            compute_stats([torch.ones(1, 1, 1)], num_samples=0)
        with pytest.raises(ValueError, match="bins must be an even int"):
            compute_stats([torch.ones(1, 1, 1)], bins=15)
        with pytest.raises(ValueError, match=r"percentiles must be within 0\.\.100"):
            compute_stats([torch.ones(1, 1, 1)], percentiles=(101,))
