"""TorchGeo 0.8's dataset splits on pipekit's geo datasets: reproducible, checked, pixel-disjoint, loadable."""

from __future__ import annotations

import itertools
import pickle
from datetime import date
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import shapely
import torch

import pipekit
from pipekit.datasets import (
    CDL,
    Landsat8,
    RasterDataset,
    random_bbox_assignment,
    random_bbox_splitting,
    random_grid_cell_assignment,
    roi_split,
    stack_samples,
    time_series_split,
)
from pipekit.geo.samplers import GridGeoSampler, RandomGeoSampler
from pipekit.synthetic.geo import landsat_scene_id, write_cdl, write_landsat_scene

X0, Y0 = 420_000.0, 4_660_000.0
PX = 64  # scene side in pixels (30 m)
BANDS = ("SR_B2", "SR_B3", "SR_B4")
SIDE = 30.0 * PX


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    """Four Landsat 8 scenes on a 2x2 grid of adjacent, non-overlapping footprints (two dates), and a CDL year."""
    root = tmp_path_factory.mktemp("splits")
    landsat = root / "landsat"
    days = [date(2023, 7, 15), date(2023, 7, 31), date(2023, 8, 16), date(2023, 9, 1)]
    for k, (i, j) in enumerate(itertools.product(range(2), range(2))):
        scene = landsat_scene_id("LC08", f"0260{31 + k}", days[k])
        write_landsat_scene(landsat, scene, (X0 + i * SIDE, Y0 - j * SIDE), PX, bands=BANDS, seed=k)
    cdl = write_cdl(root / "cdl", 2023, (X0, Y0 - 2 * SIDE, X0 + 2 * SIDE, Y0))
    return {"landsat": landsat, "cdl": cdl.parent}


def landsat(corpus) -> Landsat8:
    return Landsat8(corpus["landsat"], bands=BANDS)


def make(kind: str, corpus) -> object:
    if kind == "raster":
        return RasterDataset(corpus["cdl"])
    if kind == "landsat8":
        return landsat(corpus)
    if kind == "cdl":
        return CDL(corpus["cdl"], years=[2023])
    if kind == "and":
        return landsat(corpus) & CDL(corpus["cdl"], years=[2023])
    if kind == "or":  # two scenes | the two others
        folders = sorted(p for p in corpus["landsat"].iterdir() if p.is_dir())
        return Landsat8(folders[:2], bands=BANDS) | Landsat8(folders[2:], bands=BANDS)
    raise AssertionError(kind)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def boxes(ds, size: int = 8) -> np.ndarray:
    """Every GridGeoSampler query of ``ds`` as rows ``(minx, maxx, miny, maxy, mint, maxt)`` (times in ns)."""
    out = []
    for x, y, t in GridGeoSampler(ds, size=size):
        out.append((x.start, x.stop, y.start, y.stop, pd.Timestamp(t.start).value, pd.Timestamp(t.stop).value))
    return np.array(out, dtype=np.float64).reshape(-1, 6)


def assert_no_shared_pixel(splits) -> None:
    """No two queries from different splits cover the same pixel at the same time."""
    all_boxes = [boxes(s) for s in splits]
    assert all(len(b) for b in all_boxes), [len(b) for b in all_boxes]
    res = splits[0].res
    for (i, a), (j, b) in itertools.combinations(enumerate(all_boxes), 2):
        ox = np.minimum(a[:, None, 1], b[None, :, 1]) - np.maximum(a[:, None, 0], b[None, :, 0])
        oy = np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 2], b[None, :, 2])
        ot = (a[:, None, 4] <= b[None, :, 5]) & (b[None, :, 4] <= a[:, None, 5])
        # overlap of more than float noise in both x and y (a shared edge is no shared pixel)
        shared = (ox > 1e-6 * res[0]) & (oy > 1e-6 * res[1]) & ot
        assert not shared.any(), f"splits {i} and {j} share pixels: {a[np.nonzero(shared)[0][0]]}"


def split_with(fn: str, ds, seed: int = 0):
    if fn == "random_bbox_assignment":
        return random_bbox_assignment(ds, [0.5, 0.5], generator=gen(seed))
    if fn == "random_bbox_splitting":
        return random_bbox_splitting(ds, [0.5, 0.3, 0.2], generator=gen(seed))
    if fn == "random_grid_cell_assignment":
        return random_grid_cell_assignment(ds, [0.5, 0.25, 0.25], grid_size=4, generator=gen(seed))
    if fn == "roi_split":
        x, y, _ = ds.bounds
        mid = x.start + round((x.stop - x.start) / 2 / 30) * 30
        return roi_split(ds, [shapely.box(x.start, y.start, mid, y.stop), shapely.box(mid, y.start, x.stop, y.stop)])
    if fn == "time_series_split":
        _, _, t = ds.bounds
        cut = pd.Timestamp("2023-08-01")
        return time_series_split(ds, [pd.Interval(t.start, cut), pd.Interval(cut, t.stop)])
    raise AssertionError(fn)


DISJOINT = ["random_bbox_splitting", "random_grid_cell_assignment", "roi_split", "time_series_split"]
KINDS = ["raster", "landsat8", "cdl", "and", "or"]


def frames_equal(a, b) -> bool:
    return (
        list(a.index) == list(b.index)
        and a.geometry.geom_equals_exact(b.geometry, 1e-9).all()
        and list(a.columns) == list(b.columns)
    )


class TestReproducible:
    @pytest.mark.parametrize("fn", ["random_bbox_assignment", "random_bbox_splitting", "random_grid_cell_assignment"])
    def test_same_seed_same_split_other_seed_other_split(self, corpus, fn):
        ds = landsat(corpus)
        one, two = split_with(fn, ds, 0), split_with(fn, ds, 0)
        assert all(frames_equal(a.index, b.index) for a, b in zip(one, two))
        others = [split_with(fn, ds, s) for s in range(1, 6)]
        assert any(not all(frames_equal(a.index, b.index) for a, b in zip(one, o)) for o in others)


class TestLengths:
    def test_counts_and_fractions(self, corpus):
        ds = landsat(corpus)
        assert [len(s) for s in random_bbox_assignment(ds, [3, 1], generator=gen())] == [3, 1]
        assert [len(s) for s in random_bbox_assignment(ds, [0.5, 0.25, 0.25], generator=gen())] == [2, 1, 1]
        # fractions that do not divide evenly: the remainder goes to the first splits, all entries used once
        parts = random_bbox_assignment(ds, [0.34, 0.33, 0.33], generator=gen())
        assert [len(p) for p in parts] == [2, 1, 1]
        files = sorted(f for p in parts for f in p.index.filepath)
        assert files == sorted(ds.index.filepath)

    def test_grid_cells_follow_the_fractions(self, corpus):
        ds = landsat(corpus)
        parts = random_grid_cell_assignment(ds, [0.75, 0.25], grid_size=2, generator=gen())
        assert [len(p) for p in parts] == [12, 4]
        area = sum(p.index.geometry.area.sum() for p in parts)
        assert area == pytest.approx(ds.index.geometry.area.sum())

    def test_bbox_splitting_areas(self, corpus):
        ds = landsat(corpus)
        parts = random_bbox_splitting(ds, [0.5, 0.3, 0.2], generator=gen())
        total = ds.index.geometry.area.sum()
        assert [p.index.geometry.area.sum() / total for p in parts] == pytest.approx([0.5, 0.3, 0.2])
        assert all(len(p) == len(ds) for p in parts)

    def test_time_split_by_fraction_and_duration(self, corpus):
        ds = landsat(corpus)
        _, _, t = ds.bounds
        total = pd.Timestamp(t.stop) - pd.Timestamp(t.start)
        by_fraction = time_series_split(ds, [0.5, 0.5])
        by_duration = time_series_split(ds, [total / 2, total - total / 2])
        for a, b in zip(by_fraction, by_duration):
            assert frames_equal(a.index, b.index)
        first, second = by_fraction
        assert first.index.index.right.max() < second.index.index.left.min()

    @pytest.mark.parametrize(
        ("lengths", "error", "match"),
        [
            ([0.5, 0.4], ValueError, "must equal 1 or .* fractions summing to 1 or counts summing to the 4"),
            ([2, 1], ValueError, "counts summing to the 4"),
            ([0.5, 0.5, 0.0], ValueError, "greater than 0"),
            ([3, -1, 2], ValueError, "greater than 0"),
            ([], TypeError, "non-empty"),
            (["a", "b"], TypeError, "numbers"),
            ([1.5, 2.5], ValueError, "counts"),
        ],
    )
    def test_bad_lengths_raise_clearly(self, corpus, lengths, error, match):
        with pytest.raises(error, match=match):
            random_bbox_assignment(landsat(corpus), lengths, generator=gen())

    def test_bad_fractions_raise_clearly(self, corpus):
        ds = landsat(corpus)
        with pytest.raises(ValueError, match="random_bbox_splitting: Sum of input fractions must equal 1"):
            random_bbox_splitting(ds, [0.5, 0.6])
        with pytest.raises(ValueError, match="random_grid_cell_assignment: Input grid_size must be greater than 1"):
            random_grid_cell_assignment(ds, [0.5, 0.5], grid_size=1)
        with pytest.raises(ValueError, match="greater than 0"):
            random_grid_cell_assignment(ds, [1.0, 0.0])
        with pytest.raises(TypeError, match="splits a GeoDataset"):
            random_bbox_assignment([1, 2], [1, 1])

    def test_bad_time_lengths_raise_clearly(self, corpus):
        ds = landsat(corpus)
        _, _, t = ds.bounds
        start, stop = pd.Timestamp(t.start), pd.Timestamp(t.stop)
        mid = start + (stop - start) / 2
        with pytest.raises(ValueError, match="Sum of input lengths must equal 1 or the dataset's time length"):
            time_series_split(ds, [0.5, 0.4])
        with pytest.raises(ValueError, match="overlap"):
            time_series_split(ds, [pd.Interval(start, mid + pd.Timedelta(days=1)), pd.Interval(mid, stop)])
        with pytest.raises(ValueError, match="can't be out of dataset's time bounds: interval 0"):
            time_series_split(ds, [pd.Interval(start - pd.Timedelta(days=1), mid), pd.Interval(mid, stop)])
        with pytest.raises(ValueError, match="must cover dataset's time bounds: lengths cover"):
            time_series_split(ds, [pd.Interval(start, mid - pd.Timedelta(days=1)), pd.Interval(mid, stop)])
        with pytest.raises(TypeError, match=r"all fractions, all pandas\.Timedelta or all pandas\.Interval"):
            time_series_split(ds, [0.5, pd.Timedelta(days=1)])
        undated = RasterDataset(corpus["cdl"])  # "2023_30m_cdls.tif" has no date group in the default regex
        with pytest.raises(ValueError, match="without dates"):
            time_series_split(undated, [0.5, 0.5])

    def test_overlapping_rois_raise(self, corpus):
        ds = landsat(corpus)
        with pytest.raises(ValueError, match="can't overlap: rois 0 and 1 do"):
            roi_split(ds, [shapely.box(X0, Y0 - SIDE, X0 + SIDE, Y0), shapely.box(X0 + 10, Y0 - SIDE, X0 + SIDE, Y0)])


class TestNoSharedPixel:
    @pytest.mark.parametrize("kind", KINDS)
    @pytest.mark.parametrize("fn", DISJOINT)
    def test_splits_share_no_pixel(self, corpus, kind, fn):
        ds = make(kind, corpus)
        if fn == "time_series_split" and kind in ("raster", "cdl"):
            pytest.skip("one CDL year: a single date, nothing to split in time")
        splits = split_with(fn, ds)
        assert_no_shared_pixel(splits)

    def test_random_assignment_of_overlapping_entries_can_share_pixels(self, corpus):
        # what random_bbox_assignment does not promise: a union lists every scene twice (both operands),
        # and the two copies of a scene landing in different splits share all its pixels
        ds = landsat(corpus) | landsat(corpus)
        found = False
        for seed in range(10):
            a, b = random_bbox_assignment(ds, [0.5, 0.5], generator=gen(seed))
            if set(a.index.filepath) & set(b.index.filepath):
                found = True
                with pytest.raises(AssertionError, match="share pixels"):
                    assert_no_shared_pixel([a, b])
                break
        assert found

    def test_the_disjointness_check_can_fail(self, corpus):
        ds = landsat(corpus)
        with pytest.raises(AssertionError, match="share pixels"):
            assert_no_shared_pixel([ds, ds])


class TestLoading:
    @pytest.mark.parametrize("kind", ["landsat8", "and"])
    def test_samples_stay_inside_their_split(self, corpus, kind):
        ds = make(kind, corpus)
        train, val = roi_split(ds, [shapely.box(X0, Y0 - 2 * SIDE, X0 + SIDE, Y0),
                                    shapely.box(X0 + SIDE, Y0 - 2 * SIDE, X0 + 2 * SIDE, Y0)])
        assert train.bounds[0].stop <= X0 + SIDE <= val.bounds[0].start
        for split in (train, val):
            x, _, _ = split.bounds
            sampler = RandomGeoSampler(split, size=16, length=6, generator=gen())
            for q in sampler:
                assert x.start <= q[0].start and q[0].stop <= x.stop
                sample = split[q]
                assert sample["image"].shape[-2:] == (16, 16)
                if kind == "and":
                    assert sample["mask"].shape == (16, 16)

    def test_a_split_reads_only_its_files(self, corpus):
        ds = landsat(corpus)
        a, b = random_bbox_assignment(ds, [2, 2], generator=gen())
        assert not set(a.index.filepath) & set(b.index.filepath)
        for x, y, t in GridGeoSampler(a, size=16):
            assert a[x, y, t]["image"].shape == (3, 16, 16)
        minx, miny, _, _ = b.index.geometry.iloc[0].bounds  # inside one of b's scenes, away from its edges
        with pytest.raises(IndexError):
            a[minx + 300 : minx + 600, miny + 300 : miny + 600]
        assert b[minx + 300 : minx + 600, miny + 300 : miny + 600]["image"].shape == (3, 10, 10)

    @pytest.mark.parametrize("num_workers", [0, 2])
    def test_pipekit_dataloader_on_splits_resumes_exactly(self, corpus, num_workers):
        ds = make("and", corpus)
        train, _val = random_grid_cell_assignment(ds, [0.75, 0.25], grid_size=4, generator=gen(3))

        def loader():
            sampler = RandomGeoSampler(train, size=8, length=24, generator=gen(7))
            return pipekit.DataLoader(train, batch_size=4, sampler=sampler, collate_fn=stack_samples,
                                      num_workers=num_workers)

        full = list(loader())
        assert [b["image"].shape for b in full] == [(4, 3, 8, 8)] * 6
        assert all(b["mask"].shape == (4, 8, 8) for b in full)
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
            assert torch.equal(a["image"], b["image"]) and torch.equal(a["mask"], b["mask"])


class TestPickle:
    @pytest.mark.parametrize("kind", KINDS)
    def test_splits_pickle(self, corpus, kind):
        ds = make(kind, corpus)
        for split in random_grid_cell_assignment(ds, [0.5, 0.5], grid_size=2, generator=gen()):
            clone = pickle.loads(pickle.dumps(split))
            assert len(clone) == len(split)
            assert clone.bounds == split.bounds
            q = next(iter(GridGeoSampler(split, size=16)))
            a, b = split[q], clone[q]
            key = "image" if "image" in a else "mask"
            assert torch.equal(a[key], b[key])

    def test_splits_do_not_change_the_dataset(self, corpus):
        ds = landsat(corpus)
        before = ds.index.copy()
        random_bbox_splitting(ds, [0.5, 0.5], generator=gen())
        random_grid_cell_assignment(ds, [0.5, 0.5], generator=gen())
        time_series_split(ds, [0.5, 0.5])
        assert frames_equal(ds.index, before) and len(ds) == 4


class TestChangeOfCrs:
    def test_a_split_keeps_its_part_in_another_crs(self, corpus):
        ds = landsat(corpus)
        # the west quarter: halves of the two western scenes
        cut = X0 + SIDE / 2
        west, _east = roi_split(ds, [shapely.box(X0, Y0 - 2 * SIDE, cut, Y0),
                                     shapely.box(cut, Y0 - 2 * SIDE, X0 + 2 * SIDE, Y0)])
        whole = ds.to_crs("EPSG:5070")
        moved = west.to_crs("EPSG:5070")
        assert len(moved) == len(west) == 2
        assert 0.2 * whole.bounds.area < moved.bounds.area < 0.35 * whole.bounds.area
        # as the right operand of an intersection with a layer in CONUS Albers, it is moved there too
        both = CDL(corpus["cdl"], years=[2023]) & west
        assert both.bounds.area < 0.35 * (CDL(corpus["cdl"], years=[2023]) & ds).bounds.area
        for q in GridGeoSampler(both, size=8):
            assert both[q]["image"].shape == (3, 8, 8)


class Footprints(pipekit.geo.GeoDataset):
    """A dataset written the TorchGeo 0.8 way: ``index`` (a GeoDataFrame) and ``res`` assigned, its own getitem."""

    def __init__(self, geometry, times=None, closed="both"):
        import geopandas

        times = times or [(pd.Timestamp(2024, 1, 1), pd.Timestamp(2024, 1, 2))] * len(geometry)
        index = pd.IntervalIndex.from_tuples(times, closed=closed, name="datetime")
        self.index = geopandas.GeoDataFrame(index=index, geometry=geometry, crs="EPSG:32631")
        self.res = 1.0

    def __getitem__(self, query):
        return {"query": query}


class TestTorchGeoStyleDatasets:
    def test_every_split_function_splits_it(self):
        ds = Footprints([shapely.box(k, 0, k + 1, 1) for k in range(4)])
        days = pd.Timestamp(2024, 1, 1), pd.Timestamp(2024, 1, 2)
        splits = {
            "assignment": random_bbox_assignment(ds, [2, 2], generator=gen()),
            "splitting": random_bbox_splitting(ds, [0.5, 0.5], generator=gen()),
            "grid": random_grid_cell_assignment(ds, [0.5, 0.5], grid_size=2, generator=gen()),
            "roi": roi_split(ds, [shapely.box(0, 0, 2, 1), shapely.box(2, 0, 4, 1)]),
            "time": time_series_split(ds, [pd.Interval(days[0], days[0] + pd.Timedelta(hours=12)),
                                           pd.Interval(days[0] + pd.Timedelta(hours=12), days[1])]),
        }
        for name, (a, b) in splits.items():
            assert type(a) is Footprints and len(a) and len(b), name
            area = a.index.geometry.area.sum() + b.index.geometry.area.sum()
            assert area == pytest.approx(8.0 if name == "time" else 4.0), name  # time: both hold every footprint
            assert a[a.bounds]["query"] == tuple(a.bounds), name
        assert len(ds) == 4  # the dataset itself is left as it was

    def test_time_split_respects_open_intervals(self):
        # four days, each (day, next day) open at both ends: the entry ending at a split's start is not in it
        day = pd.Timestamp(2024, 3, 1)
        times = [(day + pd.Timedelta(days=k), day + pd.Timedelta(days=k + 1)) for k in range(4)]
        ds = Footprints([shapely.box(0, 0, 1, 1)] * 4, times, closed="neither")
        first, second = time_series_split(ds, [pd.Interval(day, day + pd.Timedelta(days=2)),
                                               pd.Interval(day + pd.Timedelta(days=2), day + pd.Timedelta(days=4))])
        assert (len(first), len(second)) == (2, 2)
        assert first.bounds[2].start == day and second.bounds[2].stop == day + pd.Timedelta(days=4)

    def test_roi_split_keeps_point_entries(self):
        ds = Footprints([shapely.Point(0.5, 0.5), shapely.Point(2.5, 0.5), shapely.box(0, 0, 3, 1)])
        west, east = roi_split(ds, [shapely.box(0, 0, 1, 1), shapely.box(1, 0, 3, 1)])
        assert sorted(g.geom_type for g in west.index.geometry) == ["Point", "Polygon"]
        assert sorted(g.geom_type for g in east.index.geometry) == ["Point", "Polygon"]
