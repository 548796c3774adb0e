"""STACDataset(time_series=True): the items a query's time overlaps stacked [T, C, H, W], oldest first, with dates."""

from __future__ import annotations

import datetime as dt
import pickle

import pandas as pd
import pytest
import torch

from pipekit.datasets import RasterDataset, STACDataset, stack_samples
from pipekit.geo.samplers import GridGeoSampler
from pipekit.synthetic.stac import sentinel2_items, write_geoparquet, write_label_raster, write_sentinel2_cogs

SIZE = 128
UTM31 = "EPSG:32631"  # the items come newest first, a zone-32 tile first: the query CRS is given
N_DATES = 4
X0, Y0 = 722_000.0, 5_271_000.0  # T31TGN's top-left corner (EPSG:32631)
#: inside T31TGN only
WEST = (slice(X0 + 100, X0 + 420), slice(Y0 - 500, Y0 - 180))


def posix(day: dt.date) -> float:
    return dt.datetime(day.year, day.month, day.day, 10, 36, 29, tzinfo=dt.timezone.utc).timestamp()


DAYS = [dt.date(2024, 5, 1) + dt.timedelta(days=5 * k) for k in range(N_DATES)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """4 tiles (both sides of the UTM 31/32 seam) x 4 dates, each date's COGs different (seeded per date)."""
    root = tmp_path_factory.mktemp("stac-series")
    items = []
    for k, day in enumerate(DAYS):
        cogs = write_sentinel2_cogs(root / f"cogs{k}", size=SIZE, seed=k)
        items += sentinel2_items(cogs, str(root / f"cogs{k}"), 4, size=SIZE, start=day, seed=k)
    items.reverse()  # newest first: the stack must still be oldest first
    labels = write_label_raster(root / "labels.tif", size=SIZE)
    return {"items": items, "parquet": write_geoparquet(items, str(root / "items.parquet")), "labels": labels}


def _of(items, day):
    return [i for i in items if i["properties"]["datetime"].startswith(day.isoformat())]


class TestStack:
    def test_every_date_oldest_first_with_its_date(self, corpus):
        ds = STACDataset(corpus["items"], assets=["red", "nir"], crs=UTM31, time_series=True)
        assert ds.time_series
        sample = ds[WEST]
        assert sample["image"].shape == (N_DATES, 2, 32, 32) and sample["image"].dtype == torch.float32
        assert sample["dates"].dtype == torch.float64
        assert sample["dates"].tolist() == [posix(d) for d in DAYS]
        for k, day in enumerate(DAYS):  # each step is that date's items alone, as a plain STACDataset reads them
            alone = STACDataset(_of(corpus["items"], day), assets=["red", "nir"], crs=ds.crs, res=ds.res)
            assert torch.equal(sample["image"][k], alone[WEST]["image"]), day
        steps = sample["image"].flatten(1)
        assert all(not torch.equal(steps[a], steps[b]) for a in range(N_DATES) for b in range(a + 1, N_DATES))

    def test_one_date_tiles_across_utm_zones_are_one_step(self, corpus):
        ds = STACDataset(corpus["parquet"], assets=["red"], crs=UTM31, time_series=True)
        # T31TGN's east part (x < 723,280), a gap, then zone 32's T32TKT (x > ~724,910 once reprojected)
        seam = (slice(723_000, 725_200), slice(5_270_400, 5_270_720))
        sample = ds[seam]
        assert sample["image"].shape == (N_DATES, 1, 32, 220)
        first = STACDataset(_of(corpus["items"], DAYS[0]), assets=["red"], crs=ds.crs, res=ds.res)[seam]
        assert torch.equal(sample["image"][0], first["image"])
        step = sample["image"][0, 0]
        assert (step[:, :28] > 0).all() and (step[:, -20:] > 0).all()  # both zones in the one step
        assert (step[:, 40:180] == 0).all()  # nodata between the tiles

    def test_query_time_selects_dates(self, corpus):
        ds = STACDataset(corpus["items"], assets=["red"], crs=UTM31, time_series=True)
        two = ds[(*WEST, slice(pd.Timestamp("2024-05-04"), pd.Timestamp("2024-05-12")))]
        assert two["dates"].tolist() == [posix(DAYS[1]), posix(DAYS[2])]
        assert torch.equal(two["image"], ds[WEST]["image"][1:3])
        with pytest.raises(IndexError):
            ds[(*WEST, slice(pd.Timestamp("2024-05-02"), pd.Timestamp("2024-05-03")))]

    def test_mask_series_and_without_time_series(self, corpus):
        masks = STACDataset(corpus["items"], assets=["red"], crs=UTM31, is_image=False, time_series=True)
        sample = masks[WEST]
        assert sample["mask"].shape == (N_DATES, 32, 32) and sample["mask"].dtype == torch.int64
        plain = STACDataset(corpus["items"], assets=["red"], crs=UTM31)[WEST]
        assert plain["image"].shape == (1, 32, 32) and "dates" not in plain
        with pytest.raises(TypeError, match="time_series must be a bool"):
            STACDataset(corpus["items"], assets=["red"], time_series="yes")

    def test_with_labels_samplers_batches_and_pickle(self, corpus):
        labels = RasterDataset(corpus["labels"])
        labels.is_image = False
        ds = STACDataset(
            corpus["items"], assets=["red", "nir"], crs=UTM31, time_series=True, datetime="2024-05-01/2024-05-20"
        )
        both = pickle.loads(pickle.dumps(ds)) & labels
        assert both.time_series
        sample = both[WEST]
        assert sample["image"].shape == (N_DATES, 2, 32, 32) and sample["mask"].shape == (32, 32)
        queries = list(GridGeoSampler(both, size=16, time_window=2))[:4]
        batch = stack_samples([both[q] for q in queries])
        assert batch["image"].shape == (4, 2, 2, 16, 16) and batch["dates"].shape == (4, 2)
        assert (batch["dates"][:, 0] < batch["dates"][:, 1]).all()
