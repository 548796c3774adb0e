"""write_geotiff: predicted patches written as tiled, compressed, georeferenced GeoTIFFs."""

from __future__ import annotations

import fsspec
import numpy as np
import pytest
import rasterio
import torch
from affine import Affine

from pipekit.datasets import RasterDataset
from pipekit.geo import BoundingBox
from pipekit.geo._write import write_geotiff

X0, Y0 = 399_990.0, 4_650_030.0


class TestWriteGeoTIFF:
    def test_sample_roundtrip_keeps_the_georeference(self, utm_scene, tmp_path):
        ds = RasterDataset(utm_scene["root"])
        q = BoundingBox(X0 + 300, X0 + 300 + 96 * 30, Y0 - 600 - 64 * 30, Y0 - 600)
        sample = ds[q]
        prediction = sample["image"].mean(dim=0, keepdim=True)
        path = write_geotiff(tmp_path / "out" / "pred.tif", prediction, sample["crs"], sample["transform"])
        with rasterio.open(path) as f:
            assert f.crs == sample["crs"]
            assert f.transform == sample["transform"]
            assert (f.height, f.width, f.count) == (64, 96, 1)
            assert f.profile["tiled"] and f.profile["compress"] == "deflate"
            assert f.bounds == (q.minx, q.miny, q.maxx, q.maxy)
            np.testing.assert_allclose(f.read(1), prediction[0].numpy())
        # read back through a dataset at the same place
        back = RasterDataset(path)
        np.testing.assert_allclose(back[q]["image"][0].numpy(), prediction[0].numpy())

    def test_labels_nodata_colormap_band_names(self, tmp_path):
        labels = torch.randint(0, 5, (40, 50), dtype=torch.int64)
        path = write_geotiff(
            tmp_path / "labels.tif", labels, "EPSG:5070", Affine(30, 0, 100_000, 0, -30, 2_000_000),
            nodata=0, colormap={1: (255, 0, 0), 2: (0, 255, 0, 255)}, band_names=["class"], blocksize=16,
        )
        with rasterio.open(path) as f:
            assert f.dtypes[0] == "uint8" and f.nodata == 0
            assert f.block_shapes[0] == (16, 16)
            assert f.colormap(1)[1] == (255, 0, 0, 255)
            assert f.descriptions == ("class",)
            np.testing.assert_array_equal(f.read(1), labels.numpy())

    def test_booleans_halves_and_transform_tuples(self, tmp_path):
        path = write_geotiff(tmp_path / "b.tif", np.eye(20, dtype=bool), 32615, (10, 0, 0, 0, -10, 200))
        with rasterio.open(path) as f:
            assert f.dtypes[0] == "uint8" and f.transform == Affine(10, 0, 0, 0, -10, 200)
        path = write_geotiff(tmp_path / "h.tif", torch.ones(2, 8, 8, dtype=torch.float16), "EPSG:4326",
                             Affine(0.1, 0, 0, 0, -0.1, 1), compress="lzw")
        with rasterio.open(path) as f:
            assert f.dtypes[0] == "float32" and f.profile["compress"] == "lzw" and f.count == 2

    def test_remote_url_is_uploaded(self, tmp_path):
        url = "memory://geo-write-test/pred.tif"
        try:
            write_geotiff(url, np.arange(64, dtype=np.uint16).reshape(8, 8), "EPSG:32615",
                          Affine(30, 0, X0, 0, -30, Y0))
            data = fsspec.filesystem("memory").cat_file("/geo-write-test/pred.tif")
            local = tmp_path / "copy.tif"
            local.write_bytes(data)
            with rasterio.open(local) as f:
                np.testing.assert_array_equal(f.read(1), np.arange(64).reshape(8, 8))
            with pytest.raises(FileExistsError, match="overwrite=False"):
                write_geotiff(url, np.zeros((8, 8), np.uint8), "EPSG:32615", Affine(30, 0, X0, 0, -30, Y0),
                              overwrite=False)
        finally:
            fsspec.filesystem("memory").rm("/geo-write-test", recursive=True)

    def test_invalid_arguments(self, tmp_path):
        t = Affine(1, 0, 10, 0, -1, 10)
        with pytest.raises(ValueError, match=r"\[H, W\] or \[C, H, W\]"):
            write_geotiff(tmp_path / "x.tif", np.zeros((1, 1, 2, 2)), "EPSG:4326", t)
        with pytest.raises(ValueError, match="not a CRS"):
            write_geotiff(tmp_path / "x.tif", np.zeros((2, 2)), "EPSG:nope", t)
        with pytest.raises(ValueError, match="multiple of 16"):
            write_geotiff(tmp_path / "x.tif", np.zeros((2, 2)), "EPSG:4326", t, blocksize=100)
        with pytest.raises(ValueError, match="unknown compression"):
            write_geotiff(tmp_path / "x.tif", np.zeros((2, 2)), "EPSG:4326", t, compress="zip")
        with pytest.raises(ValueError, match="band names"):
            write_geotiff(tmp_path / "x.tif", np.zeros((2, 2)), "EPSG:4326", t, band_names=["a", "b"])
        with pytest.raises(ValueError, match="colormap"):
            write_geotiff(tmp_path / "x.tif", np.zeros((2, 2), np.float32), "EPSG:4326", t, colormap={1: (1, 2, 3)})
        write_geotiff(tmp_path / "x.tif", np.zeros((2, 2)), "EPSG:4326", t)
        with pytest.raises(FileExistsError):
            write_geotiff(tmp_path / "x.tif", np.zeros((2, 2)), "EPSG:4326", t, overwrite=False)
