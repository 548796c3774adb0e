"""VectorDataset and the rasterizing kernels against features with NaN, infinite or huge coordinates.

The files are real GeoPackages written by pyogrio holding, beside ordinary fields, one feature whose
coordinates are NaN, 1e300, or (in EPSG:4326) a latitude of 95 degrees that no projection maps.  Such a
feature raises a :class:`~pipekit.errors.ParseError` naming the file, the feature and why, or, with
``on_error="skip"``, is left out and counted; a feature that is merely far (reaching a billion metres
east) is still burned where it meets a query.
"""

from __future__ import annotations

import math
from pathlib import Path

import geopandas
import numpy as np
import pytest
import shapely
from affine import Affine

from pipekit.datasets import VectorDataset
from pipekit.errors import ParseError
from pipekit.geo import BoundingBox, GridGeoSampler, RandomGeoSampler
from pipekit.geo._rasterize import burn_mask, instance_masks, pixel_boxes

from .conftest import UTM15
from .test_vector import RES, WHOLE, X0, Y0, fields, reference

BAD = {
    "nan": shapely.Polygon([(X0 + 50, Y0), (math.nan, Y0 + 50), (X0 + 100, Y0 + 100)]),
    "inf": shapely.Polygon([(X0 + 50, Y0), (math.inf, Y0 + 50), (X0 + 100, Y0 + 100)]),
    "huge": shapely.box(X0, Y0, 1e300, Y0 + 100),
}
WHY = {"nan": "NaN", "inf": "infinite", "huge": "1e+300"}


def with_feature(tmp_path: Path, geometry: shapely.Geometry, crs: str = UTM15) -> Path:
    good = fields().to_crs(crs)
    gdf = geopandas.GeoDataFrame({"crop": [*good["crop"], 9], "name": [*good["name"], "bad"]},
                                 geometry=[*good.geometry, geometry], crs=crs)
    path = tmp_path / "fields.gpkg"
    gdf.to_file(path, driver="GPKG", engine="pyogrio")
    return path


class TestBadCoordinates:
    @pytest.mark.parametrize("kind", sorted(BAD))
    def test_raise_names_the_file_the_feature_and_why(self, tmp_path: Path, kind: str) -> None:
        path = with_feature(tmp_path, BAD[kind])
        with pytest.raises(ParseError) as info:
            VectorDataset(path, res=RES, label_name="crop")
        err = info.value
        assert err.url == str(path) and err.stage == "VectorDataset"
        assert "feature 3" in err.reason and "fid 4" in err.reason and WHY[kind] in err.reason
        assert "on_error='skip'" in err.reason

    @pytest.mark.parametrize("kind", sorted(BAD))
    @pytest.mark.parametrize("task", ["semantic_segmentation", "object_detection", "instance_segmentation"])
    def test_skip_leaves_the_feature_out_and_counts_it(self, tmp_path: Path, kind: str, task: str) -> None:
        path = with_feature(tmp_path, BAD[kind])
        ds = VectorDataset(path, res=RES, label_name="crop", task=task, on_error="skip")
        assert ds.skip_log.count == 1
        skipped = ds.skip_log.skipped[0]
        assert str(path) in skipped.url and "feature 3" in skipped.reason and WHY[kind] in skipped.reason
        assert ds.bounds[0].stop < X0 + 2000  # the bad feature does not stretch the index
        sample = ds[WHOLE]
        if task == "semantic_segmentation":
            np.testing.assert_array_equal(sample["mask"].numpy(), reference(fields(), WHOLE))
        else:
            assert sample["label"].tolist() == [1, 2, 3]
        for query in RandomGeoSampler(ds, size=32, length=20):  # was an IndexError: the index reached 1e300
            ds[query]

    def test_a_feature_no_projection_maps_is_named_after_reprojecting(self, tmp_path: Path) -> None:
        # latitude 95 is a finite number, but has no place in UTM: it comes back infinite
        path = with_feature(tmp_path, shapely.box(-93.0, 36.0, -92.9, 95.0), crs="EPSG:4326")
        with pytest.raises(ParseError, match=r"feature 3 .*fid 4.*EPSG:32615|feature 3 .*fid 4.*reprojected"):
            VectorDataset(path, crs=UTM15, res=RES, label_name="crop")
        ds = VectorDataset(path, crs=UTM15, res=RES, label_name="crop", on_error="skip")
        assert ds.skip_log.count == 1 and "reprojected" in ds.skip_log.skipped[0].reason
        assert len(list(GridGeoSampler(ds, size=16))) > 0


class TestFarFeatures:
    @pytest.mark.parametrize("task", ["semantic_segmentation", "instance_segmentation"])
    def test_a_feature_reaching_a_billion_metres_away_is_still_burned(self, tmp_path: Path, task: str) -> None:
        # 1e9 m at 0.1 m pixels is 1e10 pixels: past what GDAL's rasterizer handles, which burned nothing
        far = shapely.box(X0 - 1000, Y0 + 450, X0 + 1e9, Y0 + 480)
        gdf = geopandas.GeoDataFrame({"crop": [7]}, geometry=[far], crs=UTM15)
        path = tmp_path / "far.gpkg"
        gdf.to_file(path, driver="GPKG", engine="pyogrio")
        ds = VectorDataset(path, res=0.1, label_name="crop", task=task)
        q = BoundingBox(X0, X0 + 20, Y0 + 460, Y0 + 470)
        mask = ds[q]["mask"].numpy()
        assert mask.shape[-2:] == (100, 200) and (mask > 0).all()


class TestKernels:
    T = Affine(1, 0, 0, 0, -1, 4)

    def test_nan_coordinates_are_refused_naming_the_feature(self) -> None:
        geoms = [shapely.box(0, 0, 1, 1), shapely.Polygon([(0, 0), (math.nan, 1), (1, 1)])]
        for call in (lambda: burn_mask(geoms, [1, 2], self.T, (4, 4)), lambda: pixel_boxes(geoms, self.T, (4, 4)),
                     lambda: instance_masks(geoms, self.T, (4, 4))):
            with pytest.raises(ValueError, match=r"feature 1 .*NaN or infinite"):
                call()

    @pytest.mark.parametrize("reach", [3e9, 1e12, 1e300])
    def test_far_features_are_burned_where_they_meet_the_grid(self, reach: float) -> None:
        # GDAL loses a polygon reaching past 2**31 pixels: it burned nothing here
        for geom in (shapely.box(0, 0, reach, 2), shapely.Polygon([(0, 0), (reach, 1), (0, 2)])):
            assert burn_mask([geom], [1], self.T, (4, 4)).sum() >= 6
            assert instance_masks([geom], self.T, (4, 4)).sum() >= 6
