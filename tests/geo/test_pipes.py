"""read_geo, and the pipe-native chain sampler -> sharding_filter -> read_geo through pipekit.DataLoader."""

from __future__ import annotations

import math
import os
import pickle
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

import pipekit
from pipekit.errors import ReadError
from pipekit.geo._bbox import BoundingBox, from_slices
from pipekit.geo._collate import stack_samples
from pipekit.geo._index import GeoIndex
from pipekit.geo._pipes import GeoReader
from pipekit.geo.samplers import GridGeoSampler, RandomBatchGeoSampler, RandomGeoSampler
from pipekit.pipes import IterableWrapper
from pipekit.pipes._resume import not_snapshot_capable, prepare_for_resume
from pipekit.testing import assert_resumes, resume_after

DAY = 86400.0


class FakeGeoDataset(torch.utils.data.Dataset):
    """A stand-in geo dataset whose sample is computed from the query box.

    The image holds the x and y coordinate of each pixel centre.  With
    ``log``, every query is appended to a file (to count reads across worker
    processes).
    """

    def __init__(self, footprints, res=(1.0, 1.0), log: Path | None = None) -> None:
        self.index = GeoIndex(np.asarray(footprints, dtype=float))
        self.res = res
        self.crs = "EPSG:32631"
        self.log = str(log) if log is not None else None

    @property
    def bounds(self) -> BoundingBox:
        return self.index.total_bounds

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, query) -> dict:
        bbox = from_slices(query)
        if not len(self.index.query(bbox)):
            raise IndexError(f"query {bbox} is outside the dataset")
        if self.log is not None:
            with open(self.log, "a") as f:
                f.write(f"{bbox.minx!r} {bbox.maxy!r} {os.getpid()}\n")
        xres, yres = self.res
        h, w = round(bbox.height / yres), round(bbox.width / xres)
        xs = bbox.minx + (torch.arange(w, dtype=torch.float64) + 0.5) * xres
        ys = bbox.maxy - (torch.arange(h, dtype=torch.float64) + 0.5) * yres
        image = torch.stack([xs.expand(h, w), ys[:, None].expand(h, w)])
        return {"image": image, "bounds": bbox, "crs": self.crs}

    def reads(self) -> list[tuple[float, float, int]]:
        if self.log is None or not os.path.exists(self.log):
            return []
        rows = [line.split() for line in Path(self.log).read_text().splitlines()]
        return [(float(x), float(y), int(pid)) for x, y, pid in rows]


def fp(minx, maxx, miny, maxy, mint=-math.inf, maxt=math.inf):
    return [minx, maxx, miny, maxy, mint, maxt]


@pytest.fixture
def dataset(tmp_path):
    return FakeGeoDataset(
        [fp(0, 64, 0, 48, 0, DAY), fp(100, 180, 0, 40, DAY, 2 * DAY)], log=tmp_path / "reads.txt"
    )


def bounds_of(items) -> list[BoundingBox]:
    """The bounds of samples (or batches, or lists of them) as BoundingBoxes."""
    out = []
    for item in items:
        if isinstance(item, dict):
            b = item["bounds"]
            out.extend(from_slices(x) for x in (b if isinstance(b, list) else [b]))
        else:
            out.extend(bounds_of(item))
    return out


def boxes_of(queries) -> list[BoundingBox]:
    """Sampler items (TorchGeo 0.8's slices) as BoundingBoxes."""
    return [from_slices(q) for q in queries]


class TestGeoReader:
    def test_reads_each_box(self, dataset):
        boxes = [BoundingBox(0, 8, 40, 48, 0, DAY), BoundingBox(100, 108, 0, 8, DAY, 2 * DAY)]
        samples = list(IterableWrapper(boxes).read_geo(dataset))
        assert [s["bounds"] for s in samples] == boxes
        assert samples[0]["image"].shape == (2, 8, 8)
        assert samples[1]["image"][0, 0, 0].item() == 100.5  # x of the first pixel centre
        assert samples[1]["image"][1, 0, 0].item() == 7.5  # y of the first pixel centre
        assert GeoReader(IterableWrapper(boxes), dataset).functional_name == "read_geo"

    def test_lists_of_boxes_from_a_batch_sampler(self, dataset):
        sampler = RandomBatchGeoSampler(dataset, size=8, batch_size=4, length=12, seed=0)
        out = list(sampler.as_pipe().read_geo(dataset))
        assert len(out) == 3 and all(len(batch) == 4 for batch in out)
        again = RandomBatchGeoSampler(dataset, size=8, batch_size=4, length=12, seed=0)
        assert bounds_of(out) == boxes_of(box for batch in again.as_pipe() for box in batch)
        stacked = stack_samples(out[0])
        assert stacked["image"].shape == (4, 2, 8, 8)

    def test_error_names_the_box_and_chains(self, dataset):
        bad = BoundingBox(500.25, 508, 0, 8)
        pipe = IterableWrapper([BoundingBox(0, 8, 0, 8), bad]).read_geo(dataset)
        it = iter(pipe)
        next(it)
        with pytest.raises(ReadError) as info:
            next(it)
        message = str(info.value)
        assert "read_geo" in message and "FakeGeoDataset" in message
        assert "minx=500.25" in message and "IndexError" in message
        assert isinstance(info.value.__cause__, IndexError)

    def test_skip_records_the_failure(self, dataset):
        boxes = [BoundingBox(0, 8, 0, 8), BoundingBox(500, 508, 0, 8), BoundingBox(8, 16, 0, 8)]
        pipe = IterableWrapper(boxes).read_geo(dataset, on_error="skip")
        assert [s["bounds"] for s in pipe] == [boxes[0], boxes[2]]
        assert pipe.skip_log.count == 1
        assert "minx=500.0" in pipe.skip_log.skipped[0].url
        assert pipe.skip_log.skipped[0].stage == "read_geo"

    def test_arguments_len_and_pickle(self, dataset):
        with pytest.raises(ValueError, match="on_error"):
            IterableWrapper([]).read_geo(dataset, on_error="ignore")
        with pytest.raises(TypeError, match="indexable"):
            IterableWrapper([]).read_geo(42)
        pipe = GridGeoSampler(dataset, size=16).as_pipe().read_geo(dataset)
        assert len(pipe) == len(GridGeoSampler(dataset, size=16))
        clone = pickle.loads(pickle.dumps(pipe))
        assert bounds_of(clone) == bounds_of(pipe)
        with pytest.raises(TypeError, match="skip"):
            len(IterableWrapper([]).read_geo(dataset, on_error="skip"))

    def test_stateless_in_a_resumable_chain(self, dataset):
        def make():
            return RandomGeoSampler(dataset, size=8, length=40).as_pipe().set_seed(4).read_geo(dataset)

        assert not_snapshot_capable(prepare_for_resume(make())) == []
        expected = bounds_of(make())
        for cut in (0, 1, 17, 39):
            head, rest = resume_after(make, cut)
            assert bounds_of(head + rest) == expected
        assert_resumes(lambda: RandomGeoSampler(dataset, size=8, length=40).as_pipe().set_seed(4), 20)


class TagEpochSeed:
    """Map a sample to (epoch seed of the sampler pipe, bounds), in whichever process runs it."""

    def __init__(self, source) -> None:
        self.source = source

    def __call__(self, sample):
        return self.source.epoch_seed, sample["bounds"]


def grid_chain(dataset, batch=None):
    pipe = GridGeoSampler(dataset, size=16, stride=12).as_pipe().sharding_filter().read_geo(dataset)
    return pipe.batch(batch).collate(stack_samples) if batch else pipe


def random_chain(dataset, length=60, batch=None):
    pipe = RandomGeoSampler(dataset, size=8, length=length).as_pipe().sharding_filter().read_geo(dataset)
    return pipe.batch(batch).collate(stack_samples) if batch else pipe


class TestDataLoaderChain:
    @pytest.mark.parametrize("num_workers", [0, 2])
    def test_grid_every_box_exactly_once(self, dataset, num_workers):
        expected = boxes_of(GridGeoSampler(dataset, size=16, stride=12))
        loader = pipekit.DataLoader(grid_chain(dataset), num_workers=num_workers)
        got = bounds_of(loader)
        assert Counter(got) == Counter(expected)
        assert len(got) == len(expected) == len(set(expected))
        reads = dataset.reads()
        assert len(reads) == len(expected)  # each box read once, in one worker
        if num_workers:
            assert len({pid for *_, pid in reads}) == 2

    def test_batched_and_collated(self, dataset):
        loader = pipekit.DataLoader(grid_chain(dataset, batch=4), num_workers=2)
        batches = list(loader)
        assert all(b["image"].shape[1:] == (2, 16, 16) for b in batches)
        assert sum(b["image"].shape[0] for b in batches) == len(GridGeoSampler(dataset, size=16, stride=12))

    @pytest.mark.parametrize("num_workers", [0, 2])
    def test_random_exactly_once_and_seeded(self, dataset, num_workers):
        torch.manual_seed(0)
        first = bounds_of(pipekit.DataLoader(random_chain(dataset), num_workers=num_workers))
        torch.manual_seed(0)
        again = bounds_of(pipekit.DataLoader(random_chain(dataset), num_workers=num_workers))
        assert first == again
        assert len(first) == 60
        # the workers agreed on one sequence and split it: it is the pipe's sequence for some seed
        # (so no box is repeated more than the sampler itself repeats it)
        assert len(set(first)) >= 55
        torch.manual_seed(1)
        other = bounds_of(pipekit.DataLoader(random_chain(dataset), num_workers=num_workers))
        assert other != first

    def test_workers_split_one_shared_sequence(self, dataset):
        """Both workers draw the same epoch seed; sharding_filter splits that one sequence."""
        torch.manual_seed(3)
        source = RandomGeoSampler(dataset, size=8, length=50).as_pipe()
        chain = source.sharding_filter().read_geo(dataset).map(TagEpochSeed(source))
        got = list(pipekit.DataLoader(chain, num_workers=2))
        seeds = {seed for seed, _ in got}
        assert len(seeds) == 1
        # the loader takes items from the workers in turn: the output is the sequence itself
        expected = boxes_of(RandomGeoSampler(dataset, size=8, length=50).as_pipe().set_seed(seeds.pop()))
        assert [box for _, box in got] == expected
        per_worker = Counter(pid for *_, pid in dataset.reads())
        assert sorted(per_worker.values()) == [25, 25]

    @pytest.mark.parametrize("num_workers", [0, 2])
    @pytest.mark.parametrize("stop_after", [1, 7, 13])
    def test_random_resume_mid_epoch_exact(self, dataset, num_workers, stop_after):
        def make():
            return random_chain(dataset, length=60, batch=3)

        torch.manual_seed(0)
        loader = pipekit.DataLoader(make(), num_workers=num_workers)
        it = iter(loader)
        head = [next(it) for _ in range(stop_after)]
        state = loader.state_dict()
        rest = list(it)
        del it, loader
        reads_before = len(dataset.reads())
        resumed = pipekit.DataLoader(make(), num_workers=num_workers)
        resumed.load_state_dict(state)
        resumed_items = list(resumed)
        assert bounds_of(resumed_items) == bounds_of(rest)
        assert len(bounds_of(head)) + len(bounds_of(rest)) == 60
        # resumed by position, not by replaying: only the remaining boxes are read again
        assert len(dataset.reads()) - reads_before == len(bounds_of(rest))

    @pytest.mark.parametrize("num_workers", [0, 2])
    def test_grid_resume_mid_epoch_exact(self, dataset, num_workers):
        loader = pipekit.DataLoader(grid_chain(dataset), num_workers=num_workers)
        it = iter(loader)
        head = [next(it) for _ in range(9)]
        state = loader.state_dict()
        rest = list(it)
        resumed = pipekit.DataLoader(grid_chain(dataset), num_workers=num_workers)
        resumed.load_state_dict(state)
        assert bounds_of(resumed) == bounds_of(rest)
        expected = boxes_of(GridGeoSampler(dataset, size=16, stride=12))
        assert Counter(bounds_of(head) + bounds_of(rest)) == Counter(expected)


def write_tile(path: Path, west: float, north: float, rows: int, cols: int, res: float) -> None:
    """A 2-band GeoTIFF whose band 1 holds each pixel's row and band 2 its column."""
    import rasterio
    from rasterio.transform import from_origin

    data = np.stack(np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")).astype("uint16")
    profile = {
        "driver": "GTiff", "width": cols, "height": rows, "count": 2, "dtype": "uint16",
        "crs": "EPSG:32615", "transform": from_origin(west, north, res, res),
    }
    with rasterio.open(path, "w", **profile) as f:
        f.write(data)


class TestWithRasterDataset:
    """Samplers and read_geo on real GeoTIFFs read by pipekit's RasterDataset."""

    TILES = [(500000.0, 4_000_000.0, 300, 257), (600000.0, 4_100_000.0, 200, 330)]

    @pytest.fixture(params=[30.0, 0.1])
    def raster(self, request, tmp_path):
        from pipekit.geo._raster import RasterDataset

        res = request.param
        for k, (west, north, rows, cols) in enumerate(self.TILES):
            write_tile(tmp_path / f"tile{k}.tif", west, north, rows, cols, res)
        return RasterDataset(str(tmp_path))

    def expected(self, box: BoundingBox, res: float):
        """Tile number, first row and first column of a patch, from its box."""
        for k, (west, north, rows, cols) in enumerate(self.TILES):
            if west - res / 2 <= box.minx < west + cols * res and north - rows * res <= box.maxy <= north + res / 2:
                return k, round((north - box.maxy) / res), round((box.minx - west) / res)
        raise AssertionError(f"{box} is in no tile")

    def check(self, sample, res: float, size: int) -> tuple[int, int, int]:
        box = from_slices(sample["bounds"])
        k, r0, c0 = self.expected(box, res)
        image = sample["image"]
        assert image.shape == (2, size, size)
        assert torch.equal(image[0], torch.arange(r0, r0 + size, dtype=image.dtype)[:, None].expand(size, size))
        assert torch.equal(image[1], torch.arange(c0, c0 + size, dtype=image.dtype).expand(size, size))
        return k, r0, c0

    def test_random_patches_are_exact_reads(self, raster):
        res = raster.res[0]
        assert raster.res == (res, res)
        for box in RandomGeoSampler(raster, size=64, length=30, seed=0):
            self.check(raster[box], res, 64)

    def test_grid_covers_every_pixel_with_exact_reads(self, raster):
        res = raster.res[0]
        covers = [np.zeros((rows, cols), dtype=bool) for *_, rows, cols in self.TILES]
        sampler = GridGeoSampler(raster, size=64, stride=60)
        for sample in sampler.as_pipe().read_geo(raster):
            k, r0, c0 = self.check(sample, res, 64)
            covers[k][r0 : r0 + 64, c0 : c0 + 64] = True
        assert all(cover.all() for cover in covers)

    def test_chain_through_dataloader_workers(self, raster):
        res = raster.res[0]
        torch.manual_seed(0)
        pipe = RandomGeoSampler(raster, size=32, length=24).as_pipe().sharding_filter().read_geo(raster)
        batches = list(pipekit.DataLoader(pipe.batch(4).collate(stack_samples), num_workers=2))
        assert [b["image"].shape for b in batches] == [(4, 2, 32, 32)] * 6
        for batch in batches:
            for image, box in zip(batch["image"], batch["bounds"], strict=True):
                self.check({"image": image, "bounds": box}, res, 32)


class TestSkippedReads:
    """RasterDataset(on_error="skip") on the real corrupt GeoTIFF: a failed read never becomes a sample."""

    @pytest.fixture
    def corrupt(self, cc0):
        from pipekit.geo._raster import RasterDataset

        return RasterDataset(cc0("corrupt.tif"), on_error="skip")

    def bad(self, ds, box: BoundingBox) -> bool:
        """Whether the box reaches into the file's lower-right tile, the one that cannot be decoded."""
        b = ds.bounds
        box = box if isinstance(box, BoundingBox) else from_slices(box)
        midx, midy = (b.minx + b.maxx) / 2, (b.miny + b.maxy) / 2
        return box.maxx > midx and box.miny < midy

    @pytest.mark.parametrize("reader_on_error", ["raise", "skip"])
    def test_failed_reads_are_dropped_and_counted(self, corrupt, reader_on_error):
        boxes = list(GridGeoSampler(corrupt, size=256))
        assert len(boxes) == 16
        pipe = IterableWrapper(boxes).read_geo(corrupt, on_error=reader_on_error)
        samples = list(pipe)
        expected = [box for box in boxes if not self.bad(corrupt, box)]
        assert len(expected) == 12
        assert [s["bounds"] for s in samples] == expected  # the 4 boxes on the corrupt tile have no sample
        assert pipe.skip_log.count == 4 and corrupt.skip_log.count == 4
        assert all(("slice(" in s.url or s.url.startswith("BoundingBox(")) for s in pipe.skip_log.skipped)
        assert all(s.url.endswith("corrupt.tif") and "TIFFFillTile" in s.reason for s in corrupt.skip_log.skipped)
        assert all(bool(s["image"].any()) for s in samples)

    def test_len_over_a_skipping_dataset_raises(self, corrupt, rasters):
        """Issue 13, item 4: the dataset drops failed reads, so the sampler's length would over-count."""
        from pipekit.geo._composition import IntersectionDataset
        from pipekit.geo._raster import RasterDataset

        boxes = list(GridGeoSampler(corrupt, size=256))
        pipe = IterableWrapper(boxes).read_geo(corrupt)
        with pytest.raises(TypeError, match="skip"):
            len(pipe)
        assert len(list(pipe)) == 12 < len(boxes)  # what len() would have claimed: 16
        both = IntersectionDataset(corrupt, RasterDataset(corrupt.files[0]))  # a skipping member of a composition
        with pytest.raises(TypeError, match="skip"):
            len(IterableWrapper(boxes).read_geo(both))
        assert len(IterableWrapper(boxes).read_geo(RasterDataset(corrupt.files[0]))) == 16

    def test_skipped_read_error_lives_in_pipekit_errors(self):
        """Issue 13, item 5."""
        import pipekit.errors
        import pipekit.geo._read

        assert pipekit.errors.SkippedReadError is pipekit.geo._read.SkippedReadError
        assert issubclass(pipekit.errors.SkippedReadError, ReadError)
        assert pipekit.errors.SkippedReadError.__module__ == "pipekit.errors"

    def test_direct_indexing_raises_after_counting(self, corrupt):
        from pipekit.geo._read import SkippedReadError

        b = corrupt.bounds
        with pytest.raises(SkippedReadError) as info:
            corrupt[BoundingBox(b.maxx - 100, b.maxx, b.miny, b.miny + 100)]
        assert isinstance(info.value, ReadError) and "skipped" in str(info.value)
        assert corrupt.skip_log.count == 1
        good = corrupt[BoundingBox(b.minx, b.minx + 100, b.maxy - 100, b.maxy)]
        assert good["image"].shape[0] == 3 and corrupt.skip_log.count == 1
