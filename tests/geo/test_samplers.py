"""Geo samplers: TorchGeo semantics, exact pixel sizes, grid coverage, seeding, resume."""

from __future__ import annotations

import math
import pickle
from datetime import datetime, timezone

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader as TorchDataLoader

import pipekit
from pipekit.geo._bbox import BoundingBox, from_slices
from pipekit.geo._collate import stack_samples
from pipekit.geo._index import GeoIndex
from pipekit.geo.samplers import (
    GeoSamplerPipe,
    GridGeoSampler,
    PreChippedGeoSampler,
    RandomBatchGeoSampler,
    RandomGeoSampler,
    Units,
    tile_to_chips,
)
from pipekit.testing import assert_resumes

DAY = 86400.0


class FakeGeoDataset(torch.utils.data.Dataset):
    """A stand-in geo dataset: footprints in a GeoIndex, and samples computed from the query.

    The image of a query holds the x and y coordinates of each pixel centre,
    so a sample can be checked against its box.
    """

    def __init__(self, footprints, res=(1.0, 1.0)) -> None:
        self.index = GeoIndex(np.asarray(footprints, dtype=float))
        self.res = res
        self.crs = "EPSG:32631"

    @property
    def bounds(self) -> BoundingBox:
        return self.index.total_bounds

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, query) -> dict:
        bbox = from_slices(query)
        if not len(self.index.query(bbox)):
            raise IndexError(f"query {bbox} is outside the dataset")
        xres, yres = self.res
        h, w = round(bbox.height / yres), round(bbox.width / xres)
        xs = bbox.minx + (torch.arange(w, dtype=torch.float64) + 0.5) * xres
        ys = bbox.maxy - (torch.arange(h, dtype=torch.float64) + 0.5) * yres
        image = torch.stack([xs.expand(h, w), ys[:, None].expand(h, w)])
        return {"image": image, "bounds": bbox, "crs": self.crs}


def boxes_of(items) -> list:
    """Sampler items (TorchGeo 0.8's slices, or lists of them from batch samplers) as BoundingBoxes."""
    return [boxes_of(item) if isinstance(item, list) else from_slices(item) for item in items]


def fp(minx, maxx, miny, maxy, mint=-math.inf, maxt=math.inf):
    return [minx, maxx, miny, maxy, mint, maxt]


def close_to_int(x: float, tol: float = 1e-6) -> bool:
    return abs(x - round(x)) <= tol


def assert_on_grid_and_inside(box: BoundingBox, footprint, res, size_px):
    """The box is size_px pixels, whole pixels from the footprint's (minx, maxy), and inside it."""
    xres, yres = res
    h, w = size_px
    assert round(box.width / xres) == w and abs(box.width - w * xres) <= 1e-9 * max(1.0, abs(box.maxx))
    assert round(box.height / yres) == h and abs(box.height - h * yres) <= 1e-9 * max(1.0, abs(box.maxy))
    assert close_to_int((box.minx - footprint[0]) / xres), box
    assert close_to_int((footprint[3] - box.maxy) / yres), box
    eps = 1e-9 * max(1.0, abs(footprint[1]), abs(footprint[3]))
    assert footprint[0] - eps <= box.minx and box.maxx <= footprint[1] + eps, (box, footprint)
    assert footprint[2] - eps <= box.miny and box.maxy <= footprint[3] + eps, (box, footprint)


def owner(box: BoundingBox, footprints) -> int:
    """Index of the (disjoint) footprint containing the box's centre."""
    cx, cy = (box.minx + box.maxx) / 2, (box.miny + box.maxy) / 2
    found = [i for i, f in enumerate(footprints) if f[0] <= cx <= f[1] and f[2] <= cy <= f[3]]
    assert len(found) == 1, (box, found)
    return found[0]


@pytest.fixture
def two_tiles():
    """Two disjoint footprints with areas 1:3 (pixels of 1 CRS unit)."""
    return FakeGeoDataset([fp(0, 100, 0, 100, 0, DAY), fp(1000, 1300, 0, 100, DAY, 2 * DAY)])


class TestRandomGeoSampler:
    def test_seeded_runs_repeat_and_seeds_differ(self, two_tiles):
        a = boxes_of(RandomGeoSampler(two_tiles, size=10, length=50, seed=1))
        b = boxes_of(RandomGeoSampler(two_tiles, size=10, length=50, seed=1))
        c = boxes_of(RandomGeoSampler(two_tiles, size=10, length=50, seed=2))
        assert a == b
        assert a != c

    def test_epochs_differ_with_a_generator(self, two_tiles):
        sampler = RandomGeoSampler(two_tiles, size=10, length=50, generator=torch.Generator().manual_seed(0))
        first, second = list(sampler), list(sampler)
        assert first != second
        again = RandomGeoSampler(two_tiles, size=10, length=50, generator=torch.Generator().manual_seed(0))
        assert [list(again), list(again)] == [first, second]

    def test_global_torch_seed_controls_default(self, two_tiles):
        sampler = RandomGeoSampler(two_tiles, size=10, length=20)
        torch.manual_seed(5)
        first = list(sampler)
        torch.manual_seed(5)
        assert list(sampler) == first
        assert list(sampler) != first

    def test_area_weighted_choice(self, two_tiles):
        boxes = boxes_of(RandomGeoSampler(two_tiles, size=10, length=20000, seed=3))
        in_big = sum(box.minx >= 1000 for box in boxes)
        assert abs(in_big / len(boxes) - 0.75) < 0.02  # areas 1:3

    def test_area_weighted_choice_within_roi(self, two_tiles):
        # the roi keeps 50 x 100 of the small tile and 100 x 100 of the big one: 1:2
        roi = BoundingBox(50, 1100, 0, 100)
        boxes = boxes_of(RandomGeoSampler(two_tiles, size=10, length=20000, roi=roi, seed=4))
        in_big = sum(box.minx >= 1000 for box in boxes)
        assert abs(in_big / len(boxes) - 2 / 3) < 0.02
        assert all(box.minx >= 50 and box.maxx <= 1100 for box in boxes)

    def test_every_position_reachable_and_none_outside(self):
        # 12 x 12 pixels and a 10 x 10 patch: offsets 0, 1, 2 on each axis, all equally likely
        ds = FakeGeoDataset([fp(100, 112, 200, 212)])
        boxes = boxes_of(RandomGeoSampler(ds, size=10, length=3000, seed=0))
        offsets = [(int(b.minx - 100), int(212 - b.maxy)) for b in boxes]
        counts = {o: offsets.count(o) for o in set(offsets)}
        assert set(counts) == {(i, j) for i in range(3) for j in range(3)}
        assert min(counts.values()) > 3000 / 9 * 0.75

    @pytest.mark.parametrize(
        ("res", "origin"),
        [
            ((30.000000001, 30.000000001), (500000.0, 4200000.0)),
            ((0.1, 0.1), (12.3, -45.6)),
            ((0.3, 0.7), (1234.5, 6789.1)),
            ((1 / 3, 1 / 3), (0.0, 0.0)),
            ((0.00026949458523585647, 0.00026949458523585647), (-122.5, 37.7)),
        ],
    )
    def test_exact_patch_sizes_and_grid_snapping(self, res, origin):
        xres, yres = res
        x0, y0 = origin
        footprint = fp(x0, x0 + 1000 * xres, y0, y0 + 700 * yres)
        ds = FakeGeoDataset([footprint], res=res)
        sampler = RandomGeoSampler(ds, size=(256, 128), length=300, seed=0)
        for box in boxes_of(sampler):
            assert_on_grid_and_inside(box, footprint, res, (256, 128))
            sample = ds[box]
            assert sample["image"].shape == (2, 256, 128)

    def test_patch_exactly_footprint_size(self):
        res = (0.1, 0.1)
        footprint = fp(5.0, 5.0 + 64 * 0.1, 7.0, 7.0 + 64 * 0.1)
        ds = FakeGeoDataset([footprint], res=res)
        boxes = boxes_of(RandomGeoSampler(ds, size=64, length=10, seed=0))
        assert {(b.minx, b.maxy) for b in boxes} == {(5.0, footprint[3])}

    def test_time_interval_is_the_footprints(self, two_tiles):
        for box in boxes_of(RandomGeoSampler(two_tiles, size=10, length=100, seed=0)):
            assert (box.mint_s, box.maxt_s) == ((0, DAY) if box.minx < 1000 else (DAY, 2 * DAY))

    def test_default_length_tiles_the_footprints(self):
        ds = FakeGeoDataset([fp(0, 100, 0, 100), fp(200, 260, 0, 30)])
        # ceil((100 - 30) / 30) + 1 = 4 -> 16; (ceil(30/30) + 1) * 1 = 2 x 1 -> 2
        assert len(RandomGeoSampler(ds, size=30)) == 16 + 2
        assert len(RandomGeoSampler(ds, size=30, length=7)) == 7
        assert len(boxes_of(RandomGeoSampler(ds, size=30, length=7, seed=0))) == 7
        assert tile_to_chips(BoundingBox(0, 100, 0, 100), (30, 30)) == (4, 4)

    def test_footprints_smaller_than_patch_skipped(self):
        ds = FakeGeoDataset([fp(0, 5, 0, 100), fp(10, 110, 0, 100), fp(200, 300, 0, 8)])
        sampler = RandomGeoSampler(ds, size=10, length=500, seed=0)
        assert sampler.hits.tolist() == [1]
        assert sampler.skipped.tolist() == [0, 2]
        assert all(b.minx >= 10 and b.maxx <= 110 for b in boxes_of(sampler))

    def test_no_footprint_large_enough_yields_nothing_and_says_why(self):
        ds = FakeGeoDataset([fp(0, 5, 0, 5), fp(10, 14, 0, 50)])
        with pytest.warns(UserWarning, match="RandomGeoSampler yields nothing: .*large enough") as info:
            sampler = RandomGeoSampler(ds, size=10, length=20)
        assert "50 x 5" in str(info[0].message)
        assert (len(sampler), list(sampler), sampler.skipped.tolist()) == (0, [], [0, 1])
        assert "large enough" in sampler.empty_reason
        assert RandomGeoSampler(ds, size=2).empty_reason is None

    def test_roi_clips_and_snaps_to_the_footprint_grid(self):
        res = (10.0, 10.0)
        footprint = fp(1000, 2000, 5000, 6000)
        ds = FakeGeoDataset([footprint], res=res)
        roi = BoundingBox(1234.5, 1789.9, 5111.1, 5888.8)
        sampler = RandomGeoSampler(ds, size=8, length=500, roi=roi, seed=0)
        assert sampler.footprints[0, :4].tolist() == [1240, 1780, 5120, 5880]
        for box in boxes_of(sampler):
            assert_on_grid_and_inside(box, footprint, res, (8, 8))
            assert roi.contains(box.with_time(roi.mint_s, roi.maxt_s))

    def test_roi_without_footprints_yields_nothing_and_says_why(self, two_tiles):
        with pytest.warns(UserWarning, match="the roi does not intersect any footprint"):
            assert list(RandomGeoSampler(two_tiles, size=10, roi=BoundingBox(500, 600, 0, 100))) == []
        # touches the small tile's edge only
        with pytest.warns(UserWarning, match="no whole pixel"):
            assert len(GridGeoSampler(two_tiles, size=10, roi=BoundingBox(100, 200, 0, 100))) == 0
        with pytest.raises(TypeError, match="roi"):
            RandomGeoSampler(two_tiles, size=10, roi="everywhere")

    def test_toi_filters_and_clips_time(self, two_tiles):
        toi = (datetime(1970, 1, 1, 12, tzinfo=timezone.utc), None)
        sampler = RandomGeoSampler(two_tiles, size=10, length=100, toi=toi, seed=0)
        assert sampler.hits.tolist() == [0, 1]
        times = {(b.mint_s, b.maxt_s) for b in boxes_of(sampler)}
        assert times <= {(DAY / 2, DAY), (DAY, 2 * DAY)}
        only_second = RandomGeoSampler(two_tiles, size=10, length=100, toi=slice(DAY + 1, None), seed=0)
        assert only_second.hits.tolist() == [1]
        assert all(b.minx >= 1000 and b.mint_s == DAY + 1 for b in boxes_of(only_second))
        with pytest.warns(UserWarning, match="the toi do not overlap"):
            assert list(RandomGeoSampler(two_tiles, size=10, toi=(3 * DAY, 4 * DAY))) == []
        with pytest.raises(ValueError, match="starts after"):
            RandomGeoSampler(two_tiles, size=10, toi=(2, 1))

    def test_roi_time_filters_too(self, two_tiles):
        sampler = RandomGeoSampler(two_tiles, size=10, roi=BoundingBox(0, 2000, 0, 100, 0, DAY / 2))
        assert sampler.hits.tolist() == [0]

    def test_units_crs(self):
        ds = FakeGeoDataset([fp(0, 100, 0, 100)], res=(0.5, 0.5))
        sampler = RandomGeoSampler(ds, size=(10, 20), length=100, units="crs", seed=0)
        assert sampler.size == (10.0, 20.0)
        for box in boxes_of(sampler):
            assert (box.height, box.width) == (10.0, 20.0)
            assert close_to_int(box.minx / 0.5) and close_to_int((100 - box.maxy) / 0.5)
        assert RandomGeoSampler(ds, size=10, units=Units.CRS).size == (10.0, 10.0)
        assert RandomGeoSampler(ds, size=10, units="PIXELS").size == (5.0, 5.0)

    def test_rectangular_size_in_pixels_uses_each_axis_resolution(self):
        ds = FakeGeoDataset([fp(0, 300, 0, 300)], res=(2.0, 3.0))
        sampler = RandomGeoSampler(ds, size=(10, 20), length=5, seed=0)
        assert sampler.size == (30.0, 40.0)  # (height * yres, width * xres)

    @pytest.mark.parametrize(
        ("kwargs", "error", "match"),
        [
            ({"size": float("inf")}, ValueError, "positive"),
            ({"size": -3}, ValueError, "positive"),
            ({"size": float("nan")}, ValueError, "positive"),
            ({"size": (1, 2, 3)}, ValueError, "pair"),
            ({"size": "big"}, TypeError, "number"),
            ({"size": True}, TypeError, "number"),
            ({"size": 4, "units": "meters"}, ValueError, "units"),
            ({"size": 4, "length": -1}, ValueError, "length"),
            ({"size": 4, "length": 2.5}, ValueError, "length"),
            ({"size": 4, "generator": 3}, TypeError, "torch.Generator"),
            ({"size": 4, "generator": torch.Generator(), "seed": 1}, ValueError, "either"),
            ({"size": 4, "toi": 5}, TypeError, "toi"),
        ],
    )
    def test_bad_arguments(self, two_tiles, kwargs, error, match):
        with pytest.raises(error, match=match):
            RandomGeoSampler(two_tiles, **kwargs)

    def test_empty_and_non_geo_datasets(self):
        with pytest.raises(ValueError, match="empty"):
            RandomGeoSampler(FakeGeoDataset(np.empty((0, 6))), size=4)
        with pytest.raises(TypeError, match="GeoIndex"):
            RandomGeoSampler([1, 2, 3], size=4)
        ds = FakeGeoDataset([fp(0, 10, 0, 10)], res=(0.0, 1.0))
        with pytest.raises(ValueError, match="res"):
            RandomGeoSampler(ds, size=4)

    def test_pickles_small_and_continues_the_same(self, two_tiles):
        sampler = RandomGeoSampler(two_tiles, size=10, length=30, seed=9)
        clone = pickle.loads(pickle.dumps(sampler))
        assert list(clone) == list(sampler)
        assert len(pickle.dumps(sampler)) < 20_000

    def test_torch_dataloader_with_stack_samples(self, two_tiles):
        sampler = RandomGeoSampler(two_tiles, size=16, length=10, seed=0)
        loader = TorchDataLoader(two_tiles, batch_size=4, sampler=sampler, collate_fn=stack_samples)
        batches = list(loader)
        assert [b["image"].shape for b in batches] == [(4, 2, 16, 16), (4, 2, 16, 16), (2, 2, 16, 16)]
        assert [len(b["bounds"]) for b in batches] == [4, 4, 2]
        assert batches[0]["crs"] == ["EPSG:32631"] * 4

    @pytest.mark.parametrize("num_workers", [0, 2])
    def test_pipekit_dataloader_resumes_the_sampler_exactly(self, two_tiles, num_workers):
        def make():
            sampler = RandomGeoSampler(two_tiles, size=8, length=40, generator=torch.Generator().manual_seed(1))
            return pipekit.DataLoader(
                two_tiles, batch_size=3, sampler=sampler, collate_fn=stack_samples, num_workers=num_workers
            )

        loader = make()
        it = iter(loader)
        head = [next(it)["bounds"] for _ in range(5)]
        state = loader.state_dict()
        rest = [b["bounds"] for b in it]
        resumed = make()
        resumed.load_state_dict(state)
        assert [b["bounds"] for b in resumed] == rest
        assert sum(map(len, head + rest)) == 40


class TestGridGeoSampler:
    @staticmethod
    def check_coverage(ds, sampler, footprints_px, size_px):
        """Every pixel of every footprint is covered; every patch lies in its footprint, on its grid."""
        res = ds.res
        covers = [np.zeros((rows, cols), dtype=bool) for rows, cols in footprints_px]
        foots = ds.index.bounds
        boxes = boxes_of(sampler)
        assert len(boxes) == len(sampler)
        for box in boxes:
            k = owner(box, foots)
            assert_on_grid_and_inside(box, foots[k], res, size_px)
            c0 = round((box.minx - foots[k][0]) / res[0])
            r0 = round((foots[k][3] - box.maxy) / res[1])
            covers[k][r0 : r0 + size_px[0], c0 : c0 + size_px[1]] = True
        for cover in covers:
            assert cover.all()
        return boxes

    @pytest.mark.parametrize(
        ("size", "stride"), [((16, 20), None), ((16, 20), (12, 20)), (16, 5), ((7, 9), (7, 9)), (23, 23)]
    )
    def test_covers_every_pixel(self, size, stride):
        dims = [(37, 23), (64, 100), (23, 64), (48, 48)]  # (rows, cols)
        footprints, x = [], 0.0
        for rows, cols in dims:
            footprints.append(fp(x, x + cols, 1000, 1000 + rows))
            x += cols + 50
        ds = FakeGeoDataset(footprints)
        sampler = GridGeoSampler(ds, size=size, stride=stride)
        size_px = size if isinstance(size, tuple) else (size, size)
        self.check_coverage(ds, sampler, dims, size_px)

    @pytest.mark.parametrize("res", [(0.1, 0.1), (30.000000001, 30.000000001), (0.3, 0.7), (1 / 3, 1 / 7)])
    def test_covers_every_pixel_at_awkward_resolutions(self, res):
        xres, yres = res
        dims = [(300, 257), (256, 256)]
        footprints = [
            fp(500000.0, 500000.0 + 257 * xres, 4e6, 4e6 + 300 * yres),
            fp(600000.0, 600000.0 + 256 * xres, 4e6, 4e6 + 256 * yres),
        ]
        ds = FakeGeoDataset(footprints, res=res)
        sampler = GridGeoSampler(ds, size=64, stride=60)
        boxes = self.check_coverage(ds, sampler, dims, (64, 64))
        # ceil((300 - 64) / 60) + 1 = 5 rows, ceil((257 - 64) / 60) + 1 = 5 cols; 256 -> 5 x 5
        assert len(boxes) == 25 + 25
        assert all(ds[b]["image"].shape == (2, 64, 64) for b in boxes[:5])

    def test_exact_multiple_has_no_extra_row(self):
        ds = FakeGeoDataset([fp(0, 256 * 0.1, 0, 256 * 0.1)], res=(0.1, 0.1))
        assert len(GridGeoSampler(ds, size=64)) == 16
        assert len(GridGeoSampler(ds, size=64, stride=32)) == 49

    def test_order_and_edges(self):
        ds = FakeGeoDataset([fp(0, 25, 0, 15), fp(100, 110, 0, 10)])
        boxes = [(b.minx, b.maxy) for b in boxes_of(GridGeoSampler(ds, size=10))]
        assert boxes == [(0, 15), (10, 15), (15, 15), (0, 10), (10, 10), (15, 10), (100, 10)]
        assert [(b.minx, b.maxy) for b in boxes_of(GridGeoSampler(ds, size=10))] == boxes

    def test_stride_larger_than_size_ends_at_the_edge(self):
        ds = FakeGeoDataset([fp(0, 50, 0, 10)])
        xs = [b.minx for b in boxes_of(GridGeoSampler(ds, size=10, stride=30))]
        assert xs == [0, 30, 40]

    def test_small_footprints_skipped_with_warning(self):
        ds = FakeGeoDataset([fp(0, 5, 0, 5), fp(10, 30, 0, 20)])
        with pytest.warns(UserWarning, match="1 footprint"):
            sampler = GridGeoSampler(ds, size=10)
        assert sampler.skipped.tolist() == [0]
        assert len(sampler) == 4

    def test_roi_covers_every_whole_pixel_inside(self):
        ds = FakeGeoDataset([fp(0, 100, 0, 100)], res=(1.0, 1.0))
        roi = BoundingBox(10.5, 60.2, 20.0, 77.7)
        boxes = boxes_of(GridGeoSampler(ds, size=8, roi=roi))
        cover = np.zeros((100, 100), dtype=bool)
        for b in boxes:
            assert roi.contains(b.with_time(roi.mint_s, roi.maxt_s))
            cover[round(100 - b.maxy) : round(100 - b.miny), round(b.minx) : round(b.maxx)] = True
        # whole pixels inside the roi: columns 11..59, rows (from the top) 23..79
        assert cover[23:80, 11:60].all()
        assert cover.sum() == 57 * 49

    def test_toi_and_time_intervals(self):
        ds = FakeGeoDataset([fp(0, 10, 0, 10, 0, DAY), fp(20, 30, 0, 10, 2 * DAY, 3 * DAY)])
        boxes = boxes_of(GridGeoSampler(ds, size=5, toi=(DAY / 2, 2.5 * DAY)))
        assert {(b.minx < 15, b.mint_s, b.maxt_s) for b in boxes} == {(True, DAY / 2, DAY), (False, 2 * DAY, 2.5 * DAY)}

    def test_units_crs_and_bad_stride(self):
        ds = FakeGeoDataset([fp(0, 100, 0, 100)], res=(0.5, 0.5))
        sampler = GridGeoSampler(ds, size=50, stride=25, units="crs")
        assert len(sampler) == 9
        with pytest.raises(ValueError, match="stride"):
            GridGeoSampler(ds, size=10, stride=0)
        with pytest.raises(ValueError, match="size must be positive"):
            GridGeoSampler(ds, size=0)
        assert GridGeoSampler(ds, size=10, stride=2.5).stride == (1.25, 1.25)  # pixels need not be whole

    def test_fractional_pixel_sizes_are_crs_lengths(self):
        # TorchGeo takes a size or stride that is not a whole number of pixels (2.5 pixels: 25 m at 10 m)
        ds = FakeGeoDataset([fp(0, 100, 0, 100)], res=(10.0, 10.0))
        boxes = boxes_of(GridGeoSampler(ds, size=2.5, stride=3))
        assert {(b.width, b.height) for b in boxes} == {(25.0, 25.0)}
        assert sorted({b.minx for b in boxes}) == [0.0, 30.0, 60.0, 75.0]  # the last column ends at the edge
        assert len(boxes_of(GridGeoSampler(ds, size=5, stride=2.5))) == 9  # x and y at 0, 25 and 50 m
        random = boxes_of(RandomGeoSampler(ds, size=(2.5, 1.5), length=5, seed=0))
        assert {(b.height, b.width) for b in random} == {(25.0, 15.0)}

    def test_large_grid_is_fast_and_exact(self):
        import time

        rng = np.random.default_rng(0)
        dims = rng.integers(300, 400, (400, 2))  # (rows, cols)
        footprints = [fp(k * 20_000.0, k * 20_000.0 + 30.0 * c, 0, 30.0 * r) for k, (r, c) in enumerate(dims)]
        ds = FakeGeoDataset(footprints, res=(30.0, 30.0))
        start = time.perf_counter()
        sampler = GridGeoSampler(ds, size=64)
        boxes = boxes_of(sampler)
        assert time.perf_counter() - start < 5.0
        expected = sum(math.ceil(r / 64) * math.ceil(c / 64) for r, c in dims.tolist())
        assert len(boxes) == len(sampler) == expected
        assert len(set(boxes)) == expected


class TestRandomBatchGeoSampler:
    def test_each_batch_from_one_footprint(self, two_tiles):
        sampler = RandomBatchGeoSampler(two_tiles, size=10, batch_size=8, length=800, seed=0)
        batches = boxes_of(sampler)
        assert len(batches) == len(sampler) == 100
        foots = two_tiles.index.bounds
        owners = []
        for batch in batches:
            assert len(batch) == 8
            ks = {owner(box, foots) for box in batch}
            assert len(ks) == 1
            k = ks.pop()
            owners.append(k)
            for box in batch:
                assert_on_grid_and_inside(box, foots[k], (1.0, 1.0), (10, 10))
        assert 55 <= owners.count(1) <= 95  # area weighted, 3:1
        assert len({box for batch in batches for box in batch}) > 700  # positions vary within a batch

    def test_length_and_determinism(self, two_tiles):
        assert len(RandomBatchGeoSampler(two_tiles, size=10, batch_size=3, length=10)) == 3
        default = RandomBatchGeoSampler(two_tiles, size=10, batch_size=4)
        assert len(default) == (100 + 300) // 4
        a = boxes_of(RandomBatchGeoSampler(two_tiles, size=10, batch_size=4, seed=3))
        b = boxes_of(RandomBatchGeoSampler(two_tiles, size=10, batch_size=4, seed=3))
        assert a == b

    @pytest.mark.parametrize("batch_size", [0, -1, 2.0, True])
    def test_bad_batch_size(self, two_tiles, batch_size):
        with pytest.raises(ValueError, match="batch_size"):
            RandomBatchGeoSampler(two_tiles, size=10, batch_size=batch_size)

    def test_torch_batch_sampler(self, two_tiles):
        sampler = RandomBatchGeoSampler(two_tiles, size=12, batch_size=5, length=15, seed=0)
        loader = TorchDataLoader(two_tiles, batch_sampler=sampler, collate_fn=stack_samples)
        assert [b["image"].shape for b in loader] == [(5, 2, 12, 12)] * 3

    def test_pickle(self, two_tiles):
        sampler = RandomBatchGeoSampler(two_tiles, size=10, batch_size=4, length=20, seed=1)
        assert list(pickle.loads(pickle.dumps(sampler))) == list(sampler)


class TestPreChippedGeoSampler:
    @pytest.fixture
    def chips(self):
        return FakeGeoDataset([fp(i * 10, i * 10 + 8, 0, 8, i * DAY, (i + 1) * DAY) for i in range(30)])

    def test_one_box_per_footprint_in_order(self, chips):
        boxes = boxes_of(PreChippedGeoSampler(chips))
        assert boxes == list(chips.index)
        assert len(PreChippedGeoSampler(chips)) == 30

    def test_shuffle_is_a_permutation_per_epoch(self, chips):
        sampler = PreChippedGeoSampler(chips, shuffle=True, seed=0)
        first, second = boxes_of(sampler), boxes_of(sampler)
        assert sorted(first, key=lambda b: b.minx) == list(chips.index)
        assert first != second and first != list(chips.index)
        again = PreChippedGeoSampler(chips, shuffle=True, generator=torch.Generator().manual_seed(0))
        assert boxes_of(again) == first

    def test_roi_and_toi(self, chips):
        sampler = PreChippedGeoSampler(chips, roi=BoundingBox(14, 52, 0, 8), toi=(3 * DAY, None))
        boxes = boxes_of(sampler)
        assert sampler.hits.tolist() == [3, 4, 5]
        assert [(b.minx, b.maxx) for b in boxes] == [(30, 38), (40, 48), (50, 52)]
        assert boxes[0].mint_s == 3 * DAY

    def test_bad_shuffle(self, chips):
        with pytest.raises(TypeError, match="shuffle"):
            PreChippedGeoSampler(chips, shuffle="yes")


class TestGeoSamplerPipe:
    def make_samplers(self):
        ds = FakeGeoDataset([fp(0, 500, 0, 300, 0, DAY), fp(1000, 1400, 0, 400, DAY, 2 * DAY)])
        return {
            "random": RandomGeoSampler(ds, size=10, length=2500),
            "grid": GridGeoSampler(ds, size=10, stride=8),
            "batch": RandomBatchGeoSampler(ds, size=10, batch_size=3, length=3300),
            "prechipped": PreChippedGeoSampler(FakeGeoDataset([fp(i, i + 1, 0, 1) for i in range(50)]), shuffle=True),
        }

    @pytest.mark.parametrize("kind", ["random", "grid", "batch", "prechipped"])
    def test_resumes_exactly(self, kind):
        sampler = self.make_samplers()[kind]

        def make():
            return sampler.as_pipe().set_seed(123)

        n = len(sampler)
        assert len(list(make())) == n
        for cut in sorted({0, 1, n // 2, 1024 % n, 1025 % n, n - 1}):
            assert_resumes(make, cut)

    def test_set_seed_semantics(self):
        sampler = self.make_samplers()["random"]
        pipe = sampler.as_pipe()
        a = list(pipe.set_seed(1))
        assert pipe._seed is None  # consumed at the start of the epoch
        assert list(pipe.set_seed(1)) == a
        assert list(pipe.set_seed(2)) != a
        torch.manual_seed(0)
        unseeded = list(pipe)
        torch.manual_seed(0)
        assert list(pipe) == unseeded
        assert pipe.set_seed(5)._seed == 5  # pending until the next epoch

    def test_grid_pipe_ignores_seeds(self):
        sampler = self.make_samplers()["grid"]
        assert list(sampler.as_pipe().set_seed(1)) == list(sampler.as_pipe().set_seed(2)) == list(sampler)

    def test_sampler_seed_used_without_set_seed(self):
        ds = FakeGeoDataset([fp(0, 100, 0, 100)])
        first = boxes_of(RandomGeoSampler(ds, size=10, length=20, seed=4).as_pipe())
        assert first == boxes_of(RandomGeoSampler(ds, size=10, length=20, seed=4).as_pipe())

    def test_pickle_before_iteration_and_len(self):
        for sampler in self.make_samplers().values():
            pipe = sampler.as_pipe().set_seed(3)
            clone = pickle.loads(pickle.dumps(pipe))
            assert len(clone) == len(sampler)
            assert list(clone) == list(pipe.set_seed(3))

    def test_bad_arguments(self):
        with pytest.raises(TypeError, match="GeoSampler"):
            GeoSamplerPipe([BoundingBox(0, 1, 0, 1)])
        pipe = self.make_samplers()["grid"].as_pipe()
        with pytest.raises(ValueError, match="state"):
            pipe.load_state_dict({"nope": 1})

    def test_sampler_iterator_state_roundtrip(self):
        ds = FakeGeoDataset([fp(0, 100, 0, 100)])

        def make(seed):
            return RandomGeoSampler(ds, size=10, length=3000, generator=torch.Generator().manual_seed(seed))

        sampler = make(0)
        it = iter(sampler)
        head = [next(it) for _ in range(1500)]
        state = pickle.loads(pickle.dumps(it.state_dict()))
        rest = list(it)
        next_epoch = list(sampler)
        assert len(head) + len(rest) == 3000

        other = make(99)  # a generator in another state: the checkpoint restores it
        resumed = iter(other)
        resumed.load_state_dict(state)
        assert list(resumed) == rest
        assert list(other) == next_epoch


class TestTorchGeoQueries:
    """TorchGeo 0.8: sampler items are (slice x, slice y, slice t), times as pandas Timestamps."""

    def test_items_are_three_slices_with_timestamps(self, two_tiles):
        import pandas as pd

        for sampler in (RandomGeoSampler(two_tiles, size=10, length=5, seed=0), GridGeoSampler(two_tiles, size=50),
                        PreChippedGeoSampler(two_tiles)):
            for item in sampler:
                x, y, t = item
                assert isinstance(item, tuple) and all(isinstance(s, slice) for s in item)
                assert x.step is None and y.step is None and t.step is None
                assert isinstance(t.start, pd.Timestamp) and isinstance(t.stop, pd.Timestamp)
                box = from_slices(item)
                assert (box.mint_s, box.maxt_s) in {(0, DAY), (DAY, 2 * DAY)}
        batch = next(iter(RandomBatchGeoSampler(two_tiles, size=10, batch_size=3, length=3, seed=0)))
        assert isinstance(batch, list) and len(batch) == 3 and all(len(item) == 3 for item in batch)
        open_ended = next(iter(GridGeoSampler(FakeGeoDataset([fp(0, 10, 0, 10)]), size=10)))
        assert open_ended[2] == slice(pd.Timestamp.min, pd.Timestamp.max)

    def test_shapely_roi_and_pandas_toi(self, two_tiles):
        import pandas as pd
        import shapely

        # a triangle over the small tile: footprints are clipped to it, then to whole pixels
        triangle = shapely.Polygon([(0, 0), (60, 0), (0, 60)])
        sampler = GridGeoSampler(two_tiles, size=10, roi=triangle)
        assert sampler.hits.tolist() == [0]
        assert sampler.footprints[0, :4].tolist() == [0, 60, 0, 60]
        rectangle = shapely.box(50, 0, 1100, 100)
        assert RandomGeoSampler(two_tiles, size=10, roi=rectangle).footprints[:, :4].tolist() == [
            [50, 100, 0, 100], [1000, 1100, 0, 100]]
        toi = pd.Interval(pd.Timestamp(1970, 1, 2, 12), pd.Timestamp(1970, 1, 5))
        sampler = RandomGeoSampler(two_tiles, size=10, length=10, toi=toi, seed=0)
        assert sampler.hits.tolist() == [1]
        assert {from_slices(q).mint_s for q in sampler} == {1.5 * DAY}
        with pytest.warns(UserWarning, match="does not intersect"):
            assert list(GridGeoSampler(two_tiles, size=10, roi=shapely.box(400, 0, 500, 100))) == []

    def test_torchgeo_units_and_tile_to_chips_tuple(self, two_tiles):
        import enum

        class TorchGeoUnits(enum.Enum):  # TorchGeo's Units: auto() values, same names
            PIXELS = enum.auto()
            CRS = enum.auto()

        assert RandomGeoSampler(two_tiles, size=10, units=TorchGeoUnits.CRS).units is Units.CRS
        # TorchGeo 0.8's bounds argument: (xmin, ymin, xmax, ymax)
        assert tile_to_chips((0, 0, 100, 50), (10, 10)) == (5, 10)
        assert tile_to_chips((slice(0, 100), slice(0, 50)), (10, 10), (8, 8)) == (6, 13)

    def test_get_random_bounding_box_draws_as_torchgeo(self):
        from pipekit.samplers import get_random_bounding_box

        generator = torch.Generator().manual_seed(3)
        x, y = get_random_bounding_box((100, 200, 400, 300), (20, 30), (2.0, 4.0), generator)
        # TorchGeo's arithmetic, with the same two draws
        replay = torch.Generator().manual_seed(3)
        ux, uy = torch.rand(1, generator=replay).item(), torch.rand(1, generator=replay).item()
        xmin = 100 + int(ux * (400 - 100 - 30) / 2.0) * 2.0
        ymin = 200 + int(uy * (300 - 200 - 20) / 4.0) * 4.0
        assert (x, y) == (slice(xmin, xmin + 30), slice(ymin, ymin + 20))
        assert get_random_bounding_box((0, 0, 10, 10), 10, 1)[0] == slice(0.0, 10.0)

    def test_a_geodataframe_index_is_read(self, two_tiles):
        """A TorchGeo-style dataset (its index a GeoDataFrame) can be sampled by pipekit's samplers."""
        from types import SimpleNamespace

        from pipekit.geo._frame import frame_from_index

        frame = frame_from_index(two_tiles.index, "EPSG:32631", {"filepath": ["a.tif", "b.tif"]})
        sampler = GridGeoSampler(SimpleNamespace(index=frame, res=(1.0, 1.0)), size=50)
        assert boxes_of(sampler) == boxes_of(GridGeoSampler(two_tiles, size=50))

    def test_checkpoint_of_a_shuffled_sampler_pipe_loads_weights_only(self, two_tiles, tmp_path):
        """A shuffle buffer after the sampler holds queries: torch.load(weights_only=True) must accept them."""
        def make():
            pipe = RandomGeoSampler(two_tiles, size=10, length=60).as_pipe().shuffle(buffer_size=8)
            return pipekit.DataLoader(pipe.batch(3), num_workers=0)

        torch.manual_seed(0)
        loader = make()
        it = iter(loader)
        head = [next(it) for _ in range(4)]
        torch.save(loader.state_dict(), tmp_path / "ckpt.pt")
        rest = list(it)
        state = torch.load(tmp_path / "ckpt.pt", weights_only=True)
        resumed = make()
        resumed.load_state_dict(state)
        assert boxes_of(q for batch in resumed for q in batch) == boxes_of(q for batch in rest for q in batch)
        assert len(head) * 3 + sum(map(len, rest)) == 60
        # BoundingBox queries (pipekit's own) load too
        torch.save({"buffer": [BoundingBox(0, 1, 0, 1, 0, DAY)]}, tmp_path / "boxes.pt")
        assert torch.load(tmp_path / "boxes.pt", weights_only=True)["buffer"][0] == BoundingBox(0, 1, 0, 1, 0, DAY)


class TestTorchGeoAttributes:
    """What TorchGeo 0.8 code reads from a sampler: ``roi`` a shapely Polygon, ``index`` a GeoDataFrame."""

    def test_roi_is_a_polygon_and_the_box_stays_reachable(self, two_tiles):
        import shapely

        sampler = GridGeoSampler(two_tiles, size=10)
        assert sampler.roi.equals(shapely.box(0, 0, 1300, 100))
        assert isinstance(sampler.roi_box, BoundingBox)
        triangle = shapely.Polygon([(0, 0), (60, 0), (0, 60)])
        assert RandomGeoSampler(two_tiles, size=10, roi=triangle).roi is triangle
        clipped = RandomGeoSampler(two_tiles, size=10, roi=BoundingBox(50, 1100, 0, 100))
        assert clipped.roi.bounds == (50, 0, 1100, 100)

    def test_index_is_a_frame_of_the_clipped_footprints(self, two_tiles):
        sampler = RandomBatchGeoSampler(two_tiles, size=10, batch_size=2, roi=BoundingBox(50, 1100, 0, 100))
        frame = sampler.index
        assert frame.crs.to_epsg() == 32631
        assert frame.index.name == "datetime"
        assert [g.bounds for g in frame.geometry] == [(50, 0, 100, 100), (1000, 0, 1100, 100)]
        assert len(pickle.dumps(sampler)) < 20_000  # the frame is not pickled

    def test_fractional_pixel_sizes_are_crs_units(self):
        ds = FakeGeoDataset([fp(0, 100, 0, 100)], res=(10.0, 10.0))
        sampler = RandomGeoSampler(ds, size=(4.5, 3), length=5, seed=0)
        assert sampler.size == (45.0, 30.0)
        assert {(b.height, b.width) for b in boxes_of(sampler)} == {(45.0, 30.0)}

    def test_size_zero_yields_the_points_of_point_footprints(self):
        ds = FakeGeoDataset([fp(3, 3, 4, 4), fp(7, 7, 8, 8)])
        boxes = boxes_of(RandomGeoSampler(ds, size=0, length=20, seed=0))
        assert {(b.minx, b.maxx, b.miny, b.maxy) for b in boxes} == {(3, 3, 4, 4), (7, 7, 8, 8)}
        assert len(RandomGeoSampler(ds, size=0)) == 2

    def test_base_classes_are_abstract_and_subclasses_with_iter_work(self, two_tiles):
        from pipekit.geo.samplers import BatchGeoSampler, GeoSampler

        for cls in (GeoSampler, BatchGeoSampler):
            with pytest.raises(TypeError, match="Can't instantiate abstract class"):
                cls(two_tiles)

        class Corners(GeoSampler):
            def __iter__(self):
                for row in self.footprints:
                    yield slice(row[0], row[0]), slice(row[2], row[2]), slice(None, None)

            def __len__(self):
                return len(self.footprints)

        assert [(x.start, y.start) for x, y, _ in Corners(two_tiles)] == [(0, 0), (1000, 0)]
