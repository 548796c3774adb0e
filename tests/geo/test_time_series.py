"""Time series: RasterDataset(time_series=True) stacks the scenes of a query's time, oldest first, with their dates."""

from __future__ import annotations

import pickle
from datetime import date, datetime, timedelta, timezone

import numpy as np
import pandas as pd
import pytest
import torch
from pyproj import Transformer

import pipekit
from pipekit.datasets import CDL, Landsat8, RasterDataset, stack_samples
from pipekit.device import to_device
from pipekit.geo.samplers import GridGeoSampler, RandomGeoSampler
from pipekit.synthetic.geo import landsat_scene_id, write_cdl, write_landsat_scene

UTM = "EPSG:32615"
ALBERS = "EPSG:5070"
X0, Y0 = 420_000.0, 4_660_000.0
PX = 48
SIDE = 30.0 * PX
BANDS = ("SR_B2", "SR_B3", "SR_B4")
# acquisition dates; path/rows chosen so that file names do not sort by date
SCENES = [("026033", date(2023, 6, 13)), ("026031", date(2023, 7, 15)), ("026034", date(2023, 5, 28)),
          ("026032", date(2023, 7, 31))]
ALBERS_SCENE = 3  # this one is written in CONUS Albers, reprojected on read


def posix(d: date) -> float:
    return datetime(d.year, d.month, d.day, tzinfo=timezone.utc).timestamp()


@pytest.fixture(scope="module")
def series(tmp_path_factory) -> dict[str, object]:
    """Four Landsat 8 scenes over one place on four dates (one in Albers), and a single-date CDL layer."""
    root = tmp_path_factory.mktemp("series")
    folders = {}
    for k, (path_row, day) in enumerate(SCENES):
        scene = landsat_scene_id("LC08", path_row, day)
        if k == ALBERS_SCENE:
            # the Albers grid around the same place, a little larger so that it covers the UTM footprint
            x, y = Transformer.from_crs(UTM, ALBERS, always_xy=True).transform(X0, Y0)
            origin = (np.floor(x / 30) * 30 - 300, np.ceil(y / 30) * 30 + 300)
            folders[day] = write_landsat_scene(root / "landsat", scene, origin, PX + 30, crs=ALBERS, bands=BANDS,
                                               seed=k)
        else:
            folders[day] = write_landsat_scene(root / "landsat", scene, (X0, Y0), PX, bands=BANDS, seed=k)
    cdl = write_cdl(root / "cdl", 2023, (X0, Y0 - SIDE, X0 + SIDE, Y0))
    return {"landsat": root / "landsat", "folders": folders, "cdl": cdl.parent}


def ts(series, **kwargs) -> Landsat8:
    return Landsat8(series["landsat"], bands=BANDS, crs=UTM, res=30.0, time_series=True, **kwargs)


DAYS = sorted(day for _, day in SCENES)


def query(t0=None, t1=None, size: int = 16):
    x, y = X0 + 30 * 8, Y0 - 30 * 8
    return slice(x, x + 30 * size), slice(y - 30 * size, y), slice(t0, t1)


class TestStack:
    def test_every_scene_oldest_first_with_its_date(self, series):
        ds = ts(series)
        sample = ds[query()]
        assert sample["image"].shape == (4, 3, 16, 16) and sample["image"].dtype == torch.float32
        assert sample["dates"].dtype == torch.float64
        assert sample["dates"].tolist() == [posix(d) for d in DAYS]
        # each time step is that scene alone, as the single-date dataset reads it (the Albers one reprojected)
        for k, day in enumerate(DAYS):
            alone = Landsat8(series["folders"][day], bands=BANDS, crs=UTM, res=30.0)
            assert torch.equal(sample["image"][k], alone[query()[:2]]["image"]), day
        assert (sample["image"] > 0).all()  # every step covers the query: no fill (the Albers scene included)
        steps = sample["image"].flatten(1)
        assert all(not torch.equal(steps[a], steps[b]) for a in range(4) for b in range(a + 1, 4))

    def test_query_time_overlaps_zero_one_or_several_scenes(self, series):
        ds = ts(series)
        with pytest.raises(IndexError):
            ds[query(pd.Timestamp("2023-06-01"), pd.Timestamp("2023-06-10"))]
        one = ds[query(pd.Timestamp("2023-06-13 10:00"), pd.Timestamp("2023-06-13 11:00"))]
        assert one["image"].shape == (1, 3, 16, 16) and one["dates"].tolist() == [posix(date(2023, 6, 13))]
        two = ds[query(pd.Timestamp("2023-06-01"), pd.Timestamp("2023-07-20"))]
        assert two["dates"].tolist() == [posix(date(2023, 6, 13)), posix(date(2023, 7, 15))]
        assert torch.equal(two["image"], ds[query()]["image"][1:3])

    def test_same_date_tiles_are_one_mosaicked_step(self, tmp_path, rasters):
        # two adjacent tiles of one date and one tile of another: a query across the seam has two steps
        a = rasters.pattern(32, 32, 1, seed=1)
        b = rasters.pattern(32, 32, 1, seed=2)
        from affine import Affine

        for name, arr, dx in (("tile_20230101_a.tif", a, 0), ("tile_20230101_b.tif", b, 32 * 30),
                              ("tile_20230201_a.tif", a + 1, 0)):
            rasters.write_tif(tmp_path / name, arr, UTM, Affine(30, 0, X0 + dx, 0, -30, Y0), nodata=0)

        class Tiles(RasterDataset):
            filename_regex = r"tile_(?P<date>\d{8})_"

        ds = Tiles(tmp_path, time_series=True)
        sample = ds[X0 + 30 * 16 : X0 + 30 * 48, Y0 - 30 * 8 : Y0]
        assert sample["image"].shape == (2, 1, 8, 32)
        mosaic = Tiles(tmp_path / "tile_20230101_a.tif")  # not a series: the plain read of each tile
        assert torch.equal(sample["image"][0, 0, :, :16], mosaic[X0 + 30 * 16 : X0 + 30 * 32, Y0 - 30 * 8 : Y0][
            "image"][0])
        assert torch.equal(sample["image"][0, 0, :, 16:], torch.from_numpy(b[0, :8, :16].astype(np.float32)))
        assert (sample["image"][1, 0, :, 16:] == 0).all()  # the second date has no tile there: fill

    def test_without_time_series_nothing_changes(self, series):
        plain = Landsat8(series["landsat"], bands=BANDS, crs=UTM, res=30.0)
        sample = plain[query()]
        assert sample["image"].shape == (3, 16, 16) and "dates" not in sample
        assert set(sample) == {"image", "crs", "bounds", "transform"}

    def test_mask_series_and_bad_arguments(self, series):
        class Masks(RasterDataset):
            is_image = False
            filename_regex = r"(?P<date>\d{4})_30m_cdls"
            date_format = "%Y"

        masks = Masks(series["cdl"], crs=UTM, res=30.0, time_series=True)
        sample = masks[query()]
        assert sample["mask"].shape == (1, 16, 16) and sample["mask"].dtype == torch.int64
        with pytest.raises(TypeError, match="time_series must be a bool"):
            Landsat8(series["landsat"], bands=BANDS, time_series="yes")
        with pytest.raises(ValueError, match=r"time_series=True.*cannot be mosaicked into a union"):
            (ts(series) | Landsat8(series["landsat"], bands=BANDS, crs=UTM, res=30.0))[query()]


class TestIntersection:
    def test_labels_are_not_stacked(self, series):
        ds = ts(series) & CDL(series["cdl"], years=[2023])
        assert ds.time_series
        sample = ds[query()]
        assert sample["image"].shape == (4, 3, 16, 16)
        assert sample["mask"].shape == (16, 16) and sample["mask"].dtype == torch.int64
        assert sample["dates"].tolist() == [posix(d) for d in DAYS]
        alone = CDL(series["cdl"], years=[2023], crs=UTM, res=30.0)[query()[:2]]
        assert torch.equal(sample["mask"], alone["mask"])

    def test_a_single_date_image_is_repeated_along_time(self, series):
        day = DAYS[0]
        single = Landsat8(series["folders"][day], bands=("SR_B2",), crs=UTM, res=30.0)
        ds = ts(series) & single
        sample = ds[query(pd.Timestamp("2023-05-01"), pd.Timestamp("2023-08-30"))]
        assert sample["image"].shape == (4, 4, 16, 16)
        assert all(torch.equal(sample["image"][k, 3], sample["image"][0, 0]) for k in range(4))


class TestSamplers:
    def test_grid_time_window_of_n_scenes(self, series):
        ds = ts(series) & CDL(series["cdl"], years=[2023])
        sampler = GridGeoSampler(ds, size=16, time_window=2)
        # the four scenes (the Albers one reprojected, a larger footprint) are one place, 3 x 3 patches:
        # two windows of two scenes cover each scene once
        assert len(sampler) == 9 * 2
        starts = set()
        for q in sampler:
            sample = ds[q]
            assert sample["image"].shape == (2, 3, 16, 16) and sample["mask"].shape == (16, 16)
            starts.add(sample["dates"][0].item())
        assert starts == {posix(DAYS[0]), posix(DAYS[2])}

    def test_random_time_window_duration(self, series):
        ds = ts(series)
        sampler = RandomGeoSampler(ds, size=8, length=20, time_window=timedelta(days=40), generator=torch.Generator(
        ).manual_seed(0))
        for x, y, t in sampler:
            assert pd.Timestamp(t.stop) - pd.Timestamp(t.start) < pd.Timedelta(days=40)
            sample = ds[x, y, t]
            assert 1 <= sample["image"].shape[0] <= 4
            assert sample["dates"].tolist() == sorted(sample["dates"].tolist())

    @pytest.mark.parametrize(("window", "error", "match"), [
        (0, ValueError, "at least 1 scene"),
        (True, TypeError, "int \\(scenes\\) or a timedelta"),
        ("2 days", TypeError, "int \\(scenes\\) or a timedelta"),
        (timedelta(0), ValueError, "positive duration"),
        (9, ValueError, "has 9 scenes"),
    ])
    def test_bad_time_window(self, series, window, error, match):
        with pytest.raises(error, match=match):
            GridGeoSampler(ts(series), size=8, time_window=window)


class TestBatches:
    def test_stack_samples_and_to_device(self, series):
        ds = ts(series)
        sampler = GridGeoSampler(ds, size=8, time_window=3)
        batch = stack_samples([ds[q] for q in list(sampler)[:4]])
        assert batch["image"].shape == (4, 3, 3, 8, 8) and batch["dates"].shape == (4, 3)
        mean, std = [100.0, 200.0, 300.0], [10.0, 20.0, 40.0]
        out = to_device(batch, "cpu", normalize=(mean, std))
        assert out["image"].shape == (4, 3, 3, 8, 8)
        assert out["image"].is_contiguous(memory_format=torch.channels_last_3d)
        expected = (batch["image"] - torch.tensor(mean).view(1, 1, 3, 1, 1)) / torch.tensor(std).view(1, 1, 3, 1, 1)
        assert torch.allclose(out["image"], expected, atol=1e-4)

    @pytest.mark.parametrize("num_workers", [0, 2])
    def test_dataloader_workers_and_exact_resume(self, series, num_workers):
        ds = ts(series) & CDL(series["cdl"], years=[2023])

        def loader():
            sampler = RandomGeoSampler(ds, size=8, length=12, time_window=2, generator=torch.Generator().manual_seed(5))
            return pipekit.DataLoader(ds, batch_size=3, sampler=sampler, collate_fn=stack_samples,
                                      num_workers=num_workers)

        full = list(loader())
        assert len(full) == 4
        assert all(b["image"].shape == (3, 2, 3, 8, 8) and b["dates"].shape == (3, 2) for b in full)
        assert all(b["mask"].shape == (3, 8, 8) for b in full)
        first = loader()
        it = iter(first)
        head = [next(it) for _ in range(2)]
        state = pickle.loads(pickle.dumps(first.state_dict()))
        resumed = loader()
        resumed.load_state_dict(state)
        got = head + list(resumed)
        assert len(got) == len(full)
        for a, b in zip(got, full):
            assert a["bounds"] == b["bounds"]
            assert torch.equal(a["image"], b["image"]) and torch.equal(a["dates"], b["dates"])
            assert torch.equal(a["mask"], b["mask"])

    def test_pickles(self, series):
        ds = ts(series)
        clone = pickle.loads(pickle.dumps(ds))
        assert clone.time_series
        assert torch.equal(clone[query()]["image"], ds[query()]["image"])

