"""GeoDataset and subclasses written the TorchGeo 0.8 way: ``index`` and ``res`` assigned, their own ``__getitem__``.

Such a subclass never calls the base constructor's file discovery: its index is
a ``GeoDataFrame`` of footprints with an ``IntervalIndex`` named ``datetime``.
"""

from __future__ import annotations

import pickle
import warnings

import geopandas as gpd
import pandas as pd
import pytest
import shapely

from pipekit.errors import EmptyIntersectionError, NotGeoDatasetError, PipekitError
from pipekit.geo import GeoDataset, IntersectionDataset, UnionDataset

DAY1 = pd.Timestamp(2024, 6, 1)
DAY2 = pd.Timestamp(2024, 6, 2)
DAY5 = pd.Timestamp(2024, 6, 5)


class Footprints(GeoDataset):
    """A dataset written as TorchGeo 0.8's docs show: ``index`` and ``res`` assigned, its own ``__getitem__``."""

    def __init__(self, boxes=((0, 0, 10, 10, DAY1, DAY2),), crs="EPSG:32615", res=1.0, paths=None):
        geometry = [shapely.box(*b[:4]) for b in boxes]
        times = pd.IntervalIndex.from_tuples([(b[4], b[5]) for b in boxes], closed="both", name="datetime")
        self.index = gpd.GeoDataFrame(index=times, geometry=geometry, crs=crs)
        self.res = res
        if paths is not None:
            self.paths = paths

    def __getitem__(self, query):
        x, y, t = self._disambiguate_slice(query)
        hits = self.index.cx[x.start : x.stop, y.start : y.stop]
        if hits.empty:
            raise IndexError(f"nothing at {query}")
        return {"query": (x, y, t), "rows": len(hits)}


class TestTorchGeoStyleSubclass:
    def test_builds_with_crs_from_its_frame(self):
        ds = Footprints()
        assert ds.crs.to_epsg() == 32615
        assert ds.res == (1.0, 1.0)
        assert len(ds) == 1
        x, y, t = ds.bounds
        assert (x.start, x.stop, y.start, y.stop) == (0, 10, 0, 10)
        assert (t.start, t.stop) == (DAY1, DAY2)

    def test_index_is_the_frame_assigned(self):
        ds = Footprints()
        assert isinstance(ds.index, gpd.GeoDataFrame)
        assert ds.index.index.name == "datetime"

    def test_frame_without_crs_is_refused_naming_the_dataset(self):
        class NoCrs(GeoDataset):
            def __init__(self):
                self.index = gpd.GeoDataFrame(
                    index=pd.IntervalIndex.from_tuples([(DAY1, DAY2)], closed="both", name="datetime"),
                    geometry=[shapely.box(0, 0, 1, 1)],
                )

        with pytest.raises(ValueError, match=r"NoCrs\.index: the GeoDataFrame assigned has no crs"):
            NoCrs()

    def test_getitem_and_disambiguate_slice(self):
        ds = Footprints()
        assert ds[2:4, 2:4]["query"][2] == slice(DAY1, DAY2, 1)
        full = (slice(5, 10.0, 1.0), slice(0, 10.0, 1.0), slice(DAY1, DAY2, 1))
        assert ds._disambiguate_slice(slice(5, None)) == full
        assert ds._disambiguate_slice((slice(None), slice(None, None, 2))) == (
            slice(0, 10.0, 1.0), slice(0, 10.0, 2), slice(DAY1, DAY2, 1))

    def test_crs_and_res_assigned_later_move_the_index(self):
        ds = Footprints(boxes=((500000, 0, 500010, 10, DAY1, DAY2),))
        ds.crs = "EPSG:4326"
        assert ds.crs.to_epsg() == 4326
        x, _, _ = ds.bounds
        assert -93.1 < x.start < x.stop < -92.9  # UTM 15N's central meridian is -93
        ds.res = 0.5
        assert ds.res == (0.5, 0.5)

    def test_pickles(self):
        ds = Footprints()
        copy = pickle.loads(pickle.dumps(ds))
        assert (copy.crs, copy.res, len(copy), copy.bounds) == (ds.crs, ds.res, 1, ds.bounds)

    def test_str(self):
        assert str(Footprints()).splitlines()[1:] == [
            "    type: GeoDataset",
            f"    bbox: {Footprints().bounds!r}",
            "    size: 1",
        ]


class TestFiles:
    def test_no_paths_no_files(self):
        assert Footprints().files == []

    def test_directories_globbed_files_and_urls_kept_sorted(self, tmp_path):
        (tmp_path / "sub").mkdir()
        (tmp_path / "sub" / "b.tif").touch()
        (tmp_path / "a.tif").touch()
        paths = [tmp_path, "s3://bucket/z.tif", "/vsizip/x.zip/y.tif", str(tmp_path / "a.tif")]
        assert Footprints(paths=paths).files == sorted(
            [str(tmp_path / "a.tif"), str(tmp_path / "sub" / "b.tif"), "s3://bucket/z.tif", "/vsizip/x.zip/y.tif"]
        )

    def test_missing_path_is_left_out_with_a_warning_naming_it(self, tmp_path):
        missing = tmp_path / "nowhere.tif"
        with pytest.warns(UserWarning, match="nowhere.tif'. Path was ignored"):
            assert Footprints(paths=[missing]).files == []


class TestComposition:
    def test_intersection_reads_each_operand_with_its_getitem(self):
        a = Footprints()
        b = Footprints(boxes=((5, 5, 20, 20, DAY1, DAY5),))
        both = a & b
        assert isinstance(both, IntersectionDataset)
        assert len(both) == 1
        x, y, t = both.bounds
        assert (x.start, x.stop, y.start, y.stop) == (5, 10, 5, 10)
        assert (t.start, t.stop) == (DAY1, DAY2)
        sample = both[6:8, 6:8]
        assert sample["rows"] == 1

    def test_union_merges_operand_samples(self):
        a = Footprints()
        b = Footprints(boxes=((20, 20, 30, 30, DAY1, DAY2),))
        either = a | b
        assert isinstance(either, UnionDataset)
        assert len(either) == 2
        assert either[21:22, 21:22]["rows"] == 1
        with pytest.raises(IndexError, match="not found in index"):
            either[12:13, 12:13]

    def test_operand_in_another_crs_is_moved_not_changed(self):
        a = Footprints(boxes=((500000, 0, 500010, 10, DAY1, DAY2),))
        b = Footprints(boxes=((500000, 0, 500010, 10, DAY1, DAY2),))
        b.crs = "EPSG:4326"
        both = a & b
        assert both.crs.to_epsg() == 32615
        assert b.crs.to_epsg() == 4326
        assert len(both) == 1

    def test_no_shared_area_is_pipekits_error_and_a_runtime_error(self):
        a = Footprints()
        b = Footprints(boxes=((10, 10, 20, 20, DAY1, DAY2),))  # touches a corner only
        with pytest.raises(EmptyIntersectionError, match=r"Footprints & Footprints: .*no spatial intersection") as info:
            a & b
        assert isinstance(info.value, RuntimeError) and isinstance(info.value, ValueError)
        assert isinstance(info.value, PipekitError)

    def test_no_shared_time_says_so(self):
        a = Footprints()
        b = Footprints(boxes=((0, 0, 10, 10, DAY5, DAY5 + pd.Timedelta(days=1)),))
        with pytest.raises(RuntimeError, match="no temporal intersection; pass spatial_only=True"):
            a & b
        assert len(IntersectionDataset(a, b, spatial_only=True)) == 1

    def test_operand_that_is_not_a_geo_dataset(self):
        with pytest.raises(NotGeoDatasetError, match=r"IntersectionDataset only supports GeoDatasets.*got list"):
            Footprints() & []
        with pytest.raises(ValueError, match="UnionDataset only supports GeoDatasets"):
            UnionDataset(Footprints(), [])
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(TypeError):
                Footprints() | 3

    def test_unions_and_intersections_of_compositions(self):
        boxes = [((k * 20, 0, k * 20 + 10, 10, DAY1, DAY2),) for k in range(4)]
        a, b, c, d = (Footprints(boxes=bx) for bx in boxes)
        everything = (a | b) | (c | d)
        assert len(everything) == 4
        assert everything[61:62, 1:2]["rows"] == 1
        same = Footprints()
        assert len((a & same) & (same & a)) == 1


def test_geo_dataset_itself_is_abstract():
    with pytest.raises(TypeError, match="Can't instantiate abstract class GeoDataset"):
        GeoDataset()


class TestSampledAndLoaded:
    """The subclass with every sampler, and read by a DataLoader with worker processes."""

    def test_every_sampler_draws_from_it(self):
        from pipekit.geo.samplers import GridGeoSampler, PreChippedGeoSampler, RandomBatchGeoSampler, RandomGeoSampler

        ds = Footprints(boxes=((0, 0, 10, 10, DAY1, DAY2), (20, 0, 30, 10, DAY2, DAY5)))
        samplers = [
            RandomGeoSampler(ds, size=4, length=6, seed=0),
            GridGeoSampler(ds, size=5),
            PreChippedGeoSampler(ds, shuffle=True, seed=0),
        ]
        for sampler in samplers:
            queries = list(sampler)
            assert queries and all(ds[q]["rows"] == 1 for q in queries), type(sampler).__name__
        assert len(list(GridGeoSampler(ds, size=5))) == 8
        batches = list(RandomBatchGeoSampler(ds, size=4, batch_size=3, length=6, seed=0))
        assert [len(b) for b in batches] == [3, 3]
        assert all(len({q[0].start >= 20 for q in batch}) == 1 for batch in batches)  # a batch from one footprint

    @pytest.mark.timeout(60)
    def test_dataloader_with_two_workers(self):
        from torch.utils.data import DataLoader

        from pipekit.geo.samplers import GridGeoSampler

        ds = Footprints(boxes=((0, 0, 10, 10, DAY1, DAY2),)) | Footprints(boxes=((20, 0, 30, 10, DAY1, DAY2),))
        sampler = GridGeoSampler(ds, size=5)
        loader = DataLoader(ds, sampler=sampler, num_workers=2, collate_fn=list)
        seen = [sample["query"] for batch in loader for sample in batch]
        assert sorted((x.start, y.start) for x, y, _ in seen) == sorted((x.start, y.start) for x, y, _ in sampler)
