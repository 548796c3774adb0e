"""VectorDataset: real vector files (written by pyogrio/geopandas) rasterized onto query grids."""

from __future__ import annotations

import importlib.util
import logging
import pickle
from pathlib import Path

import geopandas
import numpy as np
import pytest
import shapely
import torch
from affine import Affine
from rasterio.features import rasterize

import pipekit
from pipekit.datasets import RasterDataset, VectorDataset
from pipekit.errors import DatasetNotFoundError, ParseError, ReadError
from pipekit.geo import (
    BoundingBox,
    GridGeoSampler,
    IntersectionDataset,
    PreChippedGeoSampler,
    RandomBatchGeoSampler,
    RandomGeoSampler,
    UnionDataset,
)
from pipekit.geo import _vector as vector_module

from .conftest import UTM15, pattern, write_tif

X0, Y0 = 500_000.0, 4_000_000.0  # lower-left corner of the fields, UTM 15N
RES = 10.0


def fields() -> geopandas.GeoDataFrame:
    """A square with a hole (class 1), a two-part multipolygon (class 2), a long strip (class 3)."""
    outer = shapely.box(X0, Y0, X0 + 400, Y0 + 400)
    hole = shapely.box(X0 + 100, Y0 + 100, X0 + 300, Y0 + 300)
    holed = shapely.Polygon(outer.exterior.coords, [hole.exterior.coords])
    multi = shapely.MultiPolygon([shapely.box(X0 + 500, Y0, X0 + 600, Y0 + 100),
                                  shapely.box(X0 + 700, Y0 + 200, X0 + 800, Y0 + 300)])
    strip = shapely.box(X0 + 450, Y0 + 350, X0 + 1000, Y0 + 400)
    return geopandas.GeoDataFrame({"crop": [1, 2, 3], "name": ["a", "b", "c"]}, geometry=[holed, multi, strip],
                                  crs=UTM15)


def shifted(dx: float, crop: int | None = None) -> geopandas.GeoDataFrame:
    """:func:`fields` moved ``dx`` metres east (every crop set to ``crop`` if given)."""
    gdf = fields()
    gdf = gdf.set_geometry(gdf.geometry.translate(xoff=dx))
    return gdf if crop is None else gdf.assign(crop=crop)


def reference(gdf: geopandas.GeoDataFrame, bbox: BoundingBox, label: str | None = "crop") -> np.ndarray:
    """rasterio's own rasterization of ``gdf`` onto the query grid (what the dataset must return)."""
    h, w = round((bbox.maxy - bbox.miny) / RES), round((bbox.maxx - bbox.minx) / RES)
    values = gdf[label].tolist() if label else [1] * len(gdf)
    return rasterize(zip(gdf.geometry, values), out_shape=(h, w),
                     transform=Affine(RES, 0, bbox.minx, 0, -RES, bbox.maxy), fill=0).astype(np.int64)


@pytest.fixture
def gpkg(tmp_path: Path) -> Path:
    path = tmp_path / "fields.gpkg"
    fields().to_file(path, driver="GPKG", engine="pyogrio")
    return path


FORMATS = {"gpkg": "GPKG", "geojson": "GeoJSON", "shp": "ESRI Shapefile", "fgb": "FlatGeobuf", "parquet": None}


def write(gdf: geopandas.GeoDataFrame, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    driver = FORMATS[path.suffix[1:]]
    if driver is None:
        gdf.to_parquet(path)
    else:
        gdf.to_file(path, driver=driver, engine="pyogrio")
    return path


WHOLE = BoundingBox(X0 - 100, X0 + 1100, Y0 - 100, Y0 + 500)


def classes_in(ds: VectorDataset, mint: float, maxt: float) -> set[int]:
    """The values of the mask of :data:`WHOLE` between times ``mint`` and ``maxt``."""
    return set(ds[BoundingBox(WHOLE.minx, WHOLE.maxx, WHOLE.miny, WHOLE.maxy, mint, maxt)]["mask"].unique().tolist())


class TestSemantic:
    def test_mask_matches_rasterio_holes_and_multipolygons(self, gpkg):
        ds = VectorDataset(gpkg, res=RES, label_name="crop")
        sample = ds[WHOLE]
        mask = sample["mask"]
        assert mask.dtype == torch.int64 and mask.shape == (60, 120)
        np.testing.assert_array_equal(mask.numpy(), reference(fields(), WHOLE))
        row = lambda y: int((WHOLE.maxy - y) / RES)  # noqa: E731
        col = lambda x: int((x - WHOLE.minx) / RES)  # noqa: E731
        assert mask[row(Y0 + 50), col(X0 + 50)] == 1  # the square
        assert mask[row(Y0 + 200), col(X0 + 200)] == 0  # its hole
        assert mask[row(Y0 + 50), col(X0 + 550)] == 2  # first part of the multipolygon
        assert mask[row(Y0 + 250), col(X0 + 750)] == 2  # second part
        assert mask[row(Y0 + 50), col(X0 + 650)] == 0  # between the parts
        assert sample["crs"] == ds.crs and sample["transform"] == Affine(RES, 0, WHOLE.minx, 0, -RES, WHOLE.maxy)

    def test_default_label_is_one_and_all_touched(self, gpkg):
        ds = VectorDataset(gpkg, res=RES)
        assert set(ds[WHOLE]["mask"].unique().tolist()) == {0, 1}
        # a query grid offset by half a pixel: all_touched burns more pixels
        q = BoundingBox(X0 - 95, X0 + 1105, Y0 - 95, Y0 + 505)
        plain = ds[q]["mask"].sum()
        touched = VectorDataset(gpkg, res=RES, all_touched=True)[q]["mask"].sum()
        assert touched > plain

    def test_feature_crossing_the_query_edge(self, gpkg):
        ds = VectorDataset(gpkg, res=RES, label_name="crop")
        q = BoundingBox(X0 + 800, X0 + 900, Y0 + 300, Y0 + 420)  # cuts the strip
        mask = ds[q]["mask"]
        np.testing.assert_array_equal(mask.numpy(), reference(fields(), q))
        assert mask.shape == (12, 10)
        assert (mask[2:7] == 3).all() and (mask[7:] == 0).all() and (mask[:2] == 0).all()

    def test_empty_query_is_all_background(self, gpkg):
        ds = VectorDataset(gpkg, res=RES, label_name="crop")
        q = BoundingBox(X0 + 620, X0 + 680, Y0 + 120, Y0 + 180)  # inside the file's bounds, no feature
        mask = ds[q]["mask"]
        assert mask.shape == (6, 6) and mask.dtype == torch.int64 and int(mask.abs().sum()) == 0

    def test_query_outside_the_files_raises_index_error(self, gpkg):
        ds = VectorDataset(gpkg, res=RES)
        with pytest.raises(IndexError, match="not within the index"):
            ds[BoundingBox(0, 100, 0, 100)]

    def test_slices_with_a_step_choose_the_resolution(self, gpkg):
        ds = VectorDataset(gpkg, res=RES, label_name="crop")
        mask = ds[X0:X0 + 400:20.0, Y0:Y0 + 400:20.0]["mask"]
        assert mask.shape == (20, 20)

    def test_index_is_one_row_per_file_with_its_features_box(self, tmp_path):
        a = write(fields(), tmp_path / "a.gpkg")
        b = write(shifted(5000), tmp_path / "b.geojson")
        ds = VectorDataset(tmp_path, res=RES)
        assert len(ds) == 2 and ds.files == [str(a), str(b)]
        frame = ds.index
        assert list(frame["filepath"]) == [str(a), str(b)]
        assert frame.geometry.iloc[0].bounds == (X0, Y0, X0 + 1000, Y0 + 400)
        assert frame.crs.to_epsg() == 32615 and frame.index.name == "datetime"
        ds.index = frame.iloc[[1]]  # restrict to b
        assert ds.files == [str(b)]
        with pytest.raises(IndexError):
            ds[WHOLE]


class TestFormats:
    @pytest.mark.parametrize("ext", sorted(FORMATS))
    def test_every_format_gives_the_same_mask(self, tmp_path, ext):
        path = write(fields(), tmp_path / ext / f"fields.{ext}")
        ds = VectorDataset(tmp_path / ext, res=RES, label_name="crop")
        assert ds.files == [str(path)]  # the Shapefile's .shx/.dbf/.prj are not files of their own
        np.testing.assert_array_equal(ds[WHOLE]["mask"].numpy(), reference(fields(), WHOLE))

    def test_filename_glob_and_layer(self, tmp_path):
        path = tmp_path / "two_layers.gpkg"
        fields().to_file(path, layer="fields", engine="pyogrio")
        fields().iloc[[2]].to_file(path, layer="strip", engine="pyogrio")
        (tmp_path / "notes.txt").write_text("not a vector file")

        class Fields(VectorDataset):
            filename_glob = "*.gpkg"

        both = Fields(tmp_path, res=RES, label_name="crop")
        assert both.files == [str(path)]
        strip = Fields(tmp_path, res=RES, label_name="crop", layer="strip")
        assert set(strip[WHOLE]["mask"].unique().tolist()) == {0, 3}
        assert set(Fields(tmp_path, res=RES, layer=0)[WHOLE]["mask"].unique().tolist()) == {0, 1}


class TestCRS:
    def test_features_in_4326_rasterized_on_a_utm_grid(self, tmp_path):
        path = write(fields().to_crs("EPSG:4326"), tmp_path / "wgs84.gpkg")
        ds = VectorDataset(path, crs=UTM15, res=RES, label_name="crop")
        assert ds.crs.to_epsg() == 32615
        mask = ds[WHOLE]["mask"].numpy()
        ref = reference(fields(), WHOLE)
        assert (mask == ref).mean() > 0.995  # straight edges in degrees bend a little in UTM
        assert set(np.unique(mask).tolist()) == {0, 1, 2, 3}

    def test_default_crs_is_the_first_files(self, tmp_path):
        write(fields().to_crs("EPSG:4326"), tmp_path / "wgs84.gpkg")
        ds = VectorDataset(tmp_path)
        assert ds.crs.to_epsg() == 4326 and ds.res == (0.0001, 0.0001)  # TorchGeo's default res

    def test_to_crs_reprojects_features(self, gpkg):
        ds = VectorDataset(gpkg, crs="EPSG:4326", res=0.0001, label_name="crop")
        back = ds.to_crs(UTM15, res=RES)
        assert (back[WHOLE]["mask"].numpy() == reference(fields(), WHOLE)).mean() > 0.995


class TestInvalid:
    def bowtie(self, tmp_path: Path) -> Path:
        bow = shapely.Polygon([(X0, Y0), (X0 + 200, Y0 + 200), (X0 + 200, Y0), (X0, Y0 + 200), (X0, Y0)])
        assert not bow.is_valid
        gdf = geopandas.GeoDataFrame({"crop": [4, 1]}, geometry=[bow, shapely.box(X0 + 300, Y0, X0 + 400, Y0 + 100)],
                                     crs=UTM15)
        return write(gdf, tmp_path / "bowtie.gpkg")

    def test_bowtie_is_repaired_and_reported(self, tmp_path, caplog):
        path = self.bowtie(tmp_path)
        vector_module.clear_cache()
        with caplog.at_level(logging.WARNING, logger="pipekit.geo"):
            ds = VectorDataset(path, res=RES, label_name="crop")
        assert any("repaired 1 invalid" in r.getMessage() and str(path) in r.getMessage()
                   and "feature ids [1]" in r.getMessage() for r in caplog.records)
        mask = ds[BoundingBox(X0, X0 + 400, Y0, Y0 + 200)]["mask"]
        # both triangles of the bow-tie are burned (make_valid keeps them), none of the area outside them
        repaired = shapely.make_valid(shapely.Polygon([(0, 0), (20, 20), (20, 0), (0, 20), (0, 0)]))
        assert int((mask[:, :20] == 4).sum()) == pytest.approx(repaired.area, rel=0.15)
        assert int((mask == 1).sum()) == 100

    def test_bowtie_raises_when_asked(self, tmp_path):
        path = self.bowtie(tmp_path)
        with pytest.raises(ParseError, match=r"bowtie\.gpkg.*feature ids \[1\].*Self-intersection"):
            VectorDataset(path, res=RES, on_invalid="raise")
        with pytest.raises(ValueError, match="on_invalid"):
            VectorDataset(path, on_invalid="drop")

    def test_null_geometries_are_reported(self, tmp_path, caplog):
        gdf = geopandas.GeoDataFrame({"crop": [1, 2]}, geometry=[shapely.box(X0, Y0, X0 + 10, Y0 + 10), None],
                                     crs=UTM15)
        path = write(gdf, tmp_path / "null.gpkg")
        with caplog.at_level(logging.WARNING, logger="pipekit.geo"):
            ds = VectorDataset(path, res=RES)
        assert any("1 feature(s) without a geometry" in r.getMessage() for r in caplog.records)
        assert ds[BoundingBox(X0, X0 + 10, Y0, Y0 + 10)]["mask"].sum() == 1


class TestErrors:
    def test_corrupt_file_is_left_out_with_a_warning_naming_it(self, tmp_path, gpkg):
        # TorchGeo leaves a file it cannot read out silently; pipekit leaves it out too, naming it and counting
        bad = gpkg.parent / "broken.gpkg"
        bad.write_bytes(b"SQLite format 3\x00" + b"\x00garbage" * 100)
        (gpkg.parent / "broken.geojson").write_text('{"type": "FeatureCollection", "features": [')
        with pytest.warns(UserWarning, match=r"VectorDataset: left out 2 file\(s\) of 3 that are not vector files "
                                             r"GDAL can read: '.*broken\.geojson'.*'.*broken\.gpkg'"):
            ds = VectorDataset(gpkg.parent, res=RES)
        assert ds.files == [str(gpkg)] and ds.skip_log.count == 2
        with pytest.warns(UserWarning, match="left out 1 file"), \
                pytest.raises(DatasetNotFoundError, match=r"no readable vector file"):
            VectorDataset(bad)
        (gpkg.parent / "gone.gpkg").symlink_to(tmp_path / "nowhere.gpkg")  # listed, then not there: raised
        with pytest.raises(ReadError, match=r"read vector file.*gone\.gpkg.*VectorDataset"):
            VectorDataset(gpkg.parent, res=RES)

    def test_corrupt_file_skipped_and_counted(self, tmp_path, gpkg):
        (gpkg.parent / "broken.geojson").write_text('{"type": "FeatureCollection", "features": [')
        ds = VectorDataset(gpkg.parent, res=RES, on_error="skip")
        assert ds.files == [str(gpkg)] and ds.skip_log.count == 1
        assert "broken.geojson" in ds.skip_log.skipped[0].url

    def test_no_files(self, tmp_path):
        with pytest.raises(DatasetNotFoundError):
            VectorDataset(tmp_path)

    def test_bad_arguments(self, gpkg):
        with pytest.raises(ValueError, match="Invalid task"):
            VectorDataset(gpkg, task="classification")
        with pytest.raises(ParseError, match="no attribute 'missing'"):
            VectorDataset(gpkg, res=RES, label_name="missing")[WHOLE]


class TestTasks:
    def test_object_detection(self, gpkg):
        ds = VectorDataset(gpkg, res=RES, label_name="crop", task="object_detection")
        q = BoundingBox(X0 - 100, X0 + 900, Y0 - 100, Y0 + 500)  # cuts the strip at x = X0 + 900
        sample = ds[q]
        assert "mask" not in sample
        boxes, labels = sample["bbox_xyxy"], sample["label"]
        assert boxes.dtype == torch.float32 and labels.dtype == torch.int32
        assert labels.tolist() == [1, 2, 3]
        assert boxes[0].tolist() == [10.0, 10.0, 50.0, 50.0]  # pixel coordinates of the square
        assert boxes[2].tolist() == [55.0, 10.0, 100.0, 15.0]  # the strip clipped at the query's edge

    def test_instance_segmentation(self, gpkg):
        ds = VectorDataset(gpkg, res=RES, label_name="crop", task="instance_segmentation")
        sample = ds[WHOLE]
        masks, boxes, labels = sample["mask"], sample["bbox_xyxy"], sample["label"]
        assert masks.dtype == torch.uint8 and masks.shape == (3, 60, 120)
        assert labels.tolist() == [1, 2, 3] and boxes.shape == (3, 4)
        semantic = reference(fields(), WHOLE)
        for k, value in enumerate([1, 2, 3]):
            np.testing.assert_array_equal(masks[k].numpy().astype(bool), semantic == value)

    def test_instance_segmentation_drops_features_without_pixels(self, tmp_path):
        gdf = geopandas.GeoDataFrame({"crop": [1, 2]}, crs=UTM15, geometry=[
            shapely.box(X0, Y0, X0 + 100, Y0 + 100), shapely.box(X0 + 101, Y0 + 1, X0 + 103, Y0 + 3)])
        ds = VectorDataset(write(gdf, tmp_path / "tiny.gpkg"), res=RES, label_name="crop",
                           task="instance_segmentation")
        sample = ds[BoundingBox(X0, X0 + 200, Y0, Y0 + 100)]
        assert sample["label"].tolist() == [1] and len(sample["mask"]) == len(sample["bbox_xyxy"]) == 1

    @pytest.mark.parametrize("task", ["semantic_segmentation", "object_detection", "instance_segmentation"])
    def test_a_query_inside_the_hole_has_no_shapes_and_empty_targets(self, gpkg, task):
        ds = VectorDataset(gpkg, res=RES, label_name="crop", task=task)
        sample = ds[BoundingBox(X0 + 150, X0 + 250, Y0 + 150, Y0 + 250)]  # inside the square's hole
        if task == "semantic_segmentation":
            assert torch.equal(sample["mask"], torch.zeros(10, 10, dtype=sample["mask"].dtype))
            return
        assert sample["bbox_xyxy"].shape == (0, 4) and sample["bbox_xyxy"].dtype == torch.float32
        assert sample["label"].shape == (0,)
        if task == "instance_segmentation":  # no instance: [0, H, W], the [N, H, W] of N = 0 instances
            assert sample["mask"].shape == (0, 10, 10) and sample["mask"].dtype == torch.uint8

    def test_get_label_override(self, gpkg):
        class ByName(VectorDataset):
            def get_label(self, feature):
                return {"a": 7, "b": 0, "c": 9}[feature["name"]]

        mask = ByName(gpkg, res=RES)[WHOLE]["mask"]
        assert set(mask.unique().tolist()) == {0, 7, 9}


class TestTime:
    def test_date_from_filename(self, tmp_path):
        write(fields(), tmp_path / "fields_20210701.gpkg")
        write(fields().assign(crop=5), tmp_path / "fields_20220701.gpkg")

        class Dated(VectorDataset):
            filename_regex = r"fields_(?P<date>\d{8})\.gpkg"

        ds = Dated(tmp_path, res=RES, label_name="crop")
        from pipekit.geo.catalog._dates import date_interval

        t0, t1 = date_interval("20220701", "%Y%m%d")
        assert classes_in(ds, t0, t1) == {0, 5}
        t0, t1 = date_interval("20210701", "%Y%m%d")
        assert classes_in(ds, t0, t1) == {0, 1, 2, 3}
        assert set(ds[WHOLE]["mask"].unique().tolist()) == {0, 5}  # all times: the later file is burned last, on top

    def test_date_attribute_selects_features(self, tmp_path):
        gdf = fields().assign(seen=["2021-05-01", "2021-06-01", "2022-01-01"])
        path = write(gdf, tmp_path / "seen.gpkg")

        class Seen(VectorDataset):
            date_format = "%Y-%m-%d"

        ds = Seen(path, res=RES, label_name="crop", date_attribute="seen")
        from pipekit.geo.catalog._dates import date_interval

        start = date_interval("2021-05-01", "%Y-%m-%d")[0]
        end = date_interval("2021-05-31", "%Y-%m-%d")[1]
        assert classes_in(ds, start, end) == {0, 1}
        assert ds.geo_index.bounds[0, 4] == start
        with pytest.raises(IndexError):  # before every feature: outside the file's time interval
            ds[BoundingBox(WHOLE.minx, WHOLE.maxx, WHOLE.miny, WHOLE.maxy, 0, 1)]


class TestLoadingOnce:
    def test_queries_never_reread_and_pickle_is_small(self, gpkg, monkeypatch):
        calls = []
        real = vector_module.read_vector

        def counting(*args, **kwargs):
            calls.append(args[0])
            return real(*args, **kwargs)

        monkeypatch.setattr(vector_module, "read_vector", counting)
        vector_module.clear_cache()
        ds = VectorDataset(gpkg, res=RES, label_name="crop")
        assert len(calls) == 1
        for k in range(20):
            ds[BoundingBox(X0 + 10 * k, X0 + 10 * k + 200, Y0, Y0 + 200)]
        assert len(calls) == 1
        # in another CRS (as ``a & b`` makes it): reprojected from the features in memory, not read again
        wgs84 = ds.to_crs("EPSG:4326", res=0.0001)
        x, y, _ = wgs84.bounds
        assert int((wgs84[x.start:x.stop, y.start:y.stop]["mask"] > 0).sum()) > 0
        assert len(calls) == 1
        blob = pickle.dumps(ds)
        assert len(blob) < 8000 and b"POLYGON" not in blob
        vector_module.clear_cache()  # as in a fresh worker process
        clone = pickle.loads(blob)
        np.testing.assert_array_equal(clone[WHOLE]["mask"].numpy(), ds[WHOLE]["mask"].numpy())
        clone[WHOLE]
        assert len(calls) == 2  # loaded once in the "worker", on its first query


class TestRemote:
    def test_memory_filesystem(self, gpkg):
        import fsspec

        fs = fsspec.filesystem("memory")
        fs.pipe("/vector-test/fields.gpkg", gpkg.read_bytes())
        ds = VectorDataset("memory://vector-test/", res=RES, label_name="crop")
        assert ds.files == ["memory:///vector-test/fields.gpkg"]
        np.testing.assert_array_equal(ds[WHOLE]["mask"].numpy(), reference(fields(), WHOLE))

    @pytest.mark.s3
    def test_s3_shapefile_and_geojson(self, tmp_path, s3_server, s3_bucket):
        fs = s3_server.fs()
        shp = write(fields(), tmp_path / "shp" / "fields.shp")
        for part in shp.parent.iterdir():
            fs.put_file(str(part), f"{s3_bucket}/labels/{part.name}")
        gj = write(shifted(5000, 6), tmp_path / "f2.geojson")
        fs.put_file(str(gj), f"{s3_bucket}/labels/f2.geojson")
        ds = VectorDataset(f"s3://{s3_bucket}/labels/", res=RES, label_name="crop",
                           storage_options=s3_server.storage_options)
        assert [p.rsplit("/", 1)[-1] for p in ds.files] == ["f2.geojson", "fields.shp"]
        np.testing.assert_array_equal(ds[WHOLE]["mask"].numpy(), reference(fields(), WHOLE))
        assert set(ds[BoundingBox(X0 + 5000, X0 + 5400, Y0, Y0 + 400)]["mask"].unique().tolist()) == {0, 6}


def write_raster(root: Path) -> Path:
    """A 2-band uint16 raster over the fields (UTM 15N, 10 m)."""
    return write_tif(root / "image.tif", pattern(80, 140, bands=2), UTM15,
                     Affine(RES, 0, X0 - 200, 0, -RES, Y0 + 600))


class TestComposition:
    def test_intersection_with_a_raster(self, tmp_path, gpkg):
        images = RasterDataset(write_raster(tmp_path / "img"))
        labels = VectorDataset(gpkg, crs="EPSG:4326", res=0.0001, label_name="crop")  # another CRS, reprojected
        both = images & labels
        assert isinstance(both, IntersectionDataset) and both.crs == images.crs and both.res == (RES, RES)
        sample = both[WHOLE]
        assert sample["image"].shape == (2, 60, 120) and sample["image"].dtype == torch.float32
        assert sample["mask"].shape == (60, 120) and sample["mask"].dtype == torch.int64
        np.testing.assert_array_equal(sample["mask"].numpy(), reference(fields(), WHOLE))

    def test_intersection_with_the_cc0_raster(self, tmp_path):
        data = Path(__file__).resolve().parent.parent / "data" / "RGB.byte.tif"
        images = RasterDataset(data)
        box = images.bounds
        cx, cy = (box[0].start + box[0].stop) / 2, (box[1].start + box[1].stop) / 2
        gdf = geopandas.GeoDataFrame({"crop": [2]}, crs=images.crs.to_wkt(),
                                     geometry=[shapely.box(cx - 3000, cy - 3000, cx + 3000, cy + 3000)])
        labels = VectorDataset(write(gdf.to_crs("EPSG:4326"), tmp_path / "cc0.geojson"), label_name="crop")
        sample = (images & labels)[cx - 6000:cx + 6000, cy - 6000:cy + 6000]
        assert sample["image"].shape[0] == 3 and sample["mask"].shape == sample["image"].shape[1:]
        burned = int((sample["mask"] == 2).sum())
        pixels = (6000 / images.res[0]) * (6000 / images.res[1])
        assert burned == pytest.approx(pixels, rel=0.1)

    def test_union_of_two_vector_datasets(self, tmp_path):
        a = VectorDataset(write(fields(), tmp_path / "a.gpkg"), res=RES, label_name="crop")
        b = VectorDataset(write(shifted(200, 8), tmp_path / "b.gpkg"), res=RES,
                          label_name="crop")
        mask = (a | b)[WHOLE]["mask"]
        assert isinstance(a | b, UnionDataset)
        ra, rb = reference(fields(), WHOLE), reference(shifted(200, 8), WHOLE)
        np.testing.assert_array_equal(mask.numpy(), np.where(ra > 0, ra, rb))

    def test_samplers(self, gpkg):
        ds = VectorDataset(gpkg, res=RES, label_name="crop")
        grid = list(GridGeoSampler(ds, size=16, stride=16))
        assert len(grid) > 0 and all(ds[q]["mask"].shape == (16, 16) for q in grid)
        torch.manual_seed(0)
        randoms = list(RandomGeoSampler(ds, size=8, length=10))
        assert all(ds[q]["mask"].shape == (8, 8) for q in randoms)
        batches = list(RandomBatchGeoSampler(ds, size=8, batch_size=4, length=8, seed=0))
        assert len(batches) == 2 and all(ds[q]["mask"].shape == (8, 8) for b in batches for q in b)
        (chip,) = list(PreChippedGeoSampler(ds))  # one per file: the box of its features
        whole_file = BoundingBox(X0, X0 + 1000, Y0, Y0 + 400)
        np.testing.assert_array_equal(ds[chip]["mask"].numpy(), reference(fields(), whole_file))

    @pytest.mark.slow
    def test_dataloader_two_workers(self, tmp_path, gpkg):
        images = RasterDataset(write_raster(tmp_path / "img"))
        labels = VectorDataset(gpkg, res=RES, label_name="crop")
        both = images & labels
        pipe = GridGeoSampler(both, size=16, stride=16).as_pipe().sharding_filter().read_geo(both)
        loader = pipekit.DataLoader(pipe, num_workers=2)
        got = {tuple((s.start, s.stop) for s in b["bounds"][:2]): b["mask"] for b in loader}
        expected = list(GridGeoSampler(both, size=16, stride=16))
        assert len(got) == len(expected)
        for q in expected:
            key = ((q[0].start, q[0].stop), (q[1].start, q[1].stop))
            torch.testing.assert_close(got[key], both[q]["mask"])

    def test_geosegmentation_recipe_takes_vector_labels(self, tmp_path, gpkg):
        from pipekit.datasets import GeoSegmentation

        images = RasterDataset(write_raster(tmp_path / "img"))
        labels = VectorDataset(gpkg, res=RES, label_name="crop")
        recipe = GeoSegmentation(images, labels, size=16, length=4, batch_size=2, indices=())
        torch.manual_seed(0)
        batch = next(iter(recipe))
        assert batch["image"].shape == (2, 2, 16, 16) and batch["mask"].shape == (2, 16, 16)
        assert batch["mask"].dtype == torch.int64


@pytest.mark.skipif(importlib.util.find_spec("torchgeo") is None, reason="TorchGeo is not installed in this env")
class TestTorchGeoParity:
    @pytest.mark.parametrize("task", ["semantic_segmentation", "object_detection", "instance_segmentation"])
    def test_same_samples_as_torchgeo(self, gpkg, task):
        from torchgeo.datasets import VectorDataset as TGVectorDataset

        ours = VectorDataset(gpkg, res=RES, label_name="crop", task=task)
        theirs = TGVectorDataset(paths=[str(gpkg)], res=RES, label_name="crop", task=task)
        q = (slice(X0 - 100, X0 + 900, RES), slice(Y0 - 100, Y0 + 500, RES), slice(None))
        a, b = ours[q], theirs[q]
        for key in ("mask", "bbox_xyxy", "label"):
            assert (key in a) == (key in b)
            if key in a:
                torch.testing.assert_close(a[key], b[key], check_dtype=True)

    def test_same_mask_as_torchgeo_across_crs(self, tmp_path):
        from torchgeo.datasets import VectorDataset as TGVectorDataset

        path = write(fields().to_crs("EPSG:4326"), tmp_path / "wgs84.gpkg")
        ours = VectorDataset(path, crs=UTM15, res=RES, label_name="crop")
        theirs = TGVectorDataset(paths=[str(path)], crs=ours.crs, res=RES, label_name="crop")
        q = (slice(X0 + 300, X0 + 900, RES), slice(Y0 - 100, Y0 + 380, RES), slice(None))
        torch.testing.assert_close(ours[q]["mask"], theirs[q]["mask"])
