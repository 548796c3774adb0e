"""The CRS users see is pyproj's (TorchGeo 0.8's type); pipekit keeps rasterio's inside for GDAL calls."""

from __future__ import annotations

import pickle

import pyproj
from rasterio.crs import CRS
from rasterio.warp import transform_bounds

from pipekit.datasets import RasterDataset

UTM15 = "EPSG:32615"
ALBERS = "EPSG:5070"


def test_dataset_and_sample_crs_are_pyproj_and_compare_with_rasterio(mosaic_pair):
    ds = RasterDataset(mosaic_pair["root"])
    assert isinstance(ds.crs, pyproj.CRS) and ds.crs.to_epsg() == 32615
    assert ds.crs == CRS.from_string(UTM15) and CRS.from_string(UTM15) == ds.crs
    x, y, _ = ds.bounds
    sample = ds[x.start:x.start + 300, y.start:y.start + 300]
    assert isinstance(sample["crs"], pyproj.CRS) and sample["crs"] == ds.crs
    assert pickle.loads(pickle.dumps(sample["crs"])) == ds.crs
    # handed back to rasterio and to pipekit, it works as before
    assert transform_bounds(ds.crs, "EPSG:4326", x.start, y.start, x.stop, y.stop)[0] < -90
    again = RasterDataset(mosaic_pair["root"], crs=ds.crs, res=ds.res)
    assert again.crs == ds.crs and len(again) == len(ds)


def test_reprojected_composition_reads_with_pyproj_crs(mosaic_pair):
    utm = RasterDataset(mosaic_pair["root"])
    albers = RasterDataset(mosaic_pair["root"], crs=pyproj.CRS.from_user_input(ALBERS), res=30.0)
    assert isinstance(albers.crs, pyproj.CRS) and albers.crs.to_epsg() == 5070
    both = albers & utm  # the right operand is reprojected onto the left's CRS on read
    assert both.crs.to_epsg() == 5070
    x, y, _ = both.bounds
    cx, cy = (x.start + x.stop) / 2, (y.start + y.stop) / 2
    sample = both[cx - 300:cx + 300, cy - 300:cy + 300]
    assert isinstance(sample["crs"], pyproj.CRS) and sample["image"].shape == (2, 20, 20)
    utm.crs = albers.crs  # TorchGeo's setter takes pyproj's CRS too
    assert utm.crs == albers.crs
