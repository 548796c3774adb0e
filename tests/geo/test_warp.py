"""The numpy window warp (pipekit.geo._warp) against GDAL's own reprojection."""

from __future__ import annotations

import numpy as np
import pytest
import rasterio
from affine import Affine
from pyproj import Transformer
from rasterio.crs import CRS
from rasterio.enums import Resampling
from rasterio.warp import reproject

from pipekit import _fast
from pipekit.geo import BoundingBox, RasterDataset
from pipekit.geo import _warp as warp

from .conftest import ALBERS, UTM15, X0, Y0, write_tif

UTM = CRS.from_string(UTM15)
ALB = CRS.from_string(ALBERS)


@pytest.fixture(scope="module")
def classes_albers(tmp_path_factory):
    """A categorical raster (fields of classes 1..9, nodata 0 holes) in CONUS Albers."""
    rng = np.random.default_rng(3)
    fields = rng.integers(1, 10, size=(40, 40)).astype(np.uint8)
    data = np.kron(fields, np.ones((15, 15), dtype=np.uint8))  # 600 x 600, fields 15 px wide
    data[100:130, 200:260] = 0
    left, top = Transformer.from_crs(UTM15, ALBERS, always_xy=True).transform(X0 - 3000, Y0 + 3000)
    transform = Affine(30.0, 0, round(left / 30) * 30, 0, -30.0, round(top / 30) * 30)
    path = write_tif(tmp_path_factory.mktemp("warp") / "classes.tif", data, ALBERS, transform, nodata=0)
    return path


def gdal_reference(path, grid, resampling, band=1):
    with rasterio.open(path) as src:
        ref = np.zeros((grid.height, grid.width), dtype=src.dtypes[0])
        reproject(
            src.read(band), ref, src_transform=src.transform, src_crs=src.crs, src_nodata=src.nodata,
            dst_transform=grid.transform, dst_crs=grid.crs, dst_nodata=src.nodata or 0, resampling=resampling,
        )
    return ref


class TestSourceCoordinates:
    def test_matches_exact_transform(self):
        dst = Affine(30.0, 0, X0, 0, -30.0, Y0)
        src = Affine(30.0, 0, 100_000.0, 0, -30.0, 2_200_000.0)
        cols, rows = warp.source_coordinates(dst, UTM, (200, 300), src, ALB)
        assert cols.shape == rows.shape == (200, 300)
        to_src = Transformer.from_crs(UTM15, ALBERS, always_xy=True)
        r, c = np.meshgrid(np.arange(200) + 0.5, np.arange(300) + 0.5, indexing="ij")
        x, y = to_src.transform(X0 + 30.0 * c, Y0 - 30.0 * r)
        exact_c, exact_r = (np.asarray(x) - 100_000.0) / 30.0, (2_200_000.0 - np.asarray(y)) / 30.0
        assert np.abs(cols - exact_c).max() < warp.MAX_ERROR
        assert np.abs(rows - exact_r).max() < warp.MAX_ERROR

    def test_outside_the_crs_domain(self):
        # latitudes beyond the pole do not transform
        dst = Affine(1.0, 0, 0.0, 0, -1.0, 120.0)
        src = Affine(30.0, 0, 0.0, 0, -30.0, 0.0)
        assert warp.source_coordinates(dst, CRS.from_epsg(4326), (8, 8), src, UTM) is None


class TestSourceAffine:
    def test_matches_exact_transform_over_a_patch(self):
        dst = Affine(30.0, 0, X0, 0, -30.0, Y0)
        src = Affine(30.0, 0, 100_000.0, 0, -30.0, 2_200_000.0)
        coef = warp.source_affine(dst, UTM, (256, 256), src, ALB)
        assert coef is not None and coef.shape == (2, 3)
        to_src = Transformer.from_crs(UTM15, ALBERS, always_xy=True)
        r, c = np.meshgrid(np.arange(256) + 0.5, np.arange(256) + 0.5, indexing="ij")
        x, y = to_src.transform(X0 + 30.0 * c, Y0 - 30.0 * r)
        exact_c, exact_r = (np.asarray(x) - 100_000.0) / 30.0, (2_200_000.0 - np.asarray(y)) / 30.0
        assert np.abs(coef[0, 0] * c + coef[0, 1] * r + coef[0, 2] - exact_c).max() < warp.MAX_ERROR
        assert np.abs(coef[1, 0] * c + coef[1, 1] * r + coef[1, 2] - exact_r).max() < warp.MAX_ERROR

    def test_refuses_grids_where_the_projection_bends(self):
        # 2000 km of UTM mapped to geographic degrees: far from affine
        dst = Affine(8000.0, 0, X0 - 1e6, 0, -8000.0, Y0 + 1e6)
        src = Affine(0.01, 0, -130.0, 0, -0.01, 60.0)
        assert warp.source_affine(dst, UTM, (250, 250), src, CRS.from_epsg(4326)) is None
        # the general path still serves it (interpolated or exact per pixel)
        assert warp.source_coordinates(dst, UTM, (250, 250), src, CRS.from_epsg(4326)) is not None

    def test_outside_the_crs_domain(self):
        dst = Affine(1.0, 0, 0.0, 0, -1.0, 120.0)
        src = Affine(30.0, 0, 0.0, 0, -30.0, 0.0)
        assert warp.source_affine(dst, CRS.from_epsg(4326), (8, 8), src, UTM) is None


class TestNearestAffine:
    def read_from(self, data):
        calls = []

        def read(c0, r0, c1, r1):
            calls.append((c0, r0, c1, r1))
            return data[:, r0:r1, c0:c1]

        return read, calls

    def test_same_pixels_as_the_per_pixel_path(self):
        rng = np.random.default_rng(1)
        data = rng.integers(0, 250, size=(2, 400, 400)).astype(np.uint8)
        src = Affine(30.0, 0, 100_000.0, 0, -30.0, 2_200_000.0)
        to_dst = Transformer.from_crs(ALBERS, UTM15, always_xy=True)
        to_src = Transformer.from_crs(UTM15, ALBERS, always_xy=True)
        cx, cy = to_dst.transform(100_000.0 + 200 * 30, 2_200_000.0 - 200 * 30)
        for k in range(6):  # patches at sub-pixel offsets around the file's centre
            dst = Affine(30.0, 0, cx - 3000 + 7.3 * k, 0, -30.0, cy + 3000 - 11.1 * k)
            coef = warp.source_affine(dst, UTM, (64, 80), src, ALB)
            read, calls = self.read_from(data)
            got = warp.nearest_affine(read, (400, 400), coef, (64, 80))
            # exact source coordinates of every target centre
            r, c = np.meshgrid(np.arange(64) + 0.5, np.arange(80) + 0.5, indexing="ij")
            x, y = to_src.transform(dst.c + 30.0 * c, dst.f - 30.0 * r)
            cols, rows = (np.asarray(x) - 100_000.0) / 30.0, (2_200_000.0 - np.asarray(y)) / 30.0
            expected = data[:, np.floor(rows).astype(int), np.floor(cols).astype(int)]
            assert got.shape == (2, 64, 80) and got.dtype == np.uint8
            # identical wherever the exact centre is clear of a pixel edge by the fit's tolerance
            clear = (np.abs(cols - np.round(cols)) > warp.MAX_ERROR) & (np.abs(rows - np.round(rows)) > warp.MAX_ERROR)
            assert clear.mean() > 0.9
            assert (got[:, clear] == expected[:, clear]).all()
            (c0, r0, c1, r1), = calls  # one window read, just around the needed pixels
            assert c0 == int(np.floor(cols.min())) and r0 == int(np.floor(rows.min()))
            assert c1 - 1 <= int(np.floor(cols.max())) + 1 and r1 - 1 <= int(np.floor(rows.max())) + 1

    def test_grid_reaching_outside_the_file_is_declined(self):
        data = np.zeros((1, 100, 100), np.uint8)
        coef = np.array([[1.0, 0.0, -5.0], [0.0, 1.0, 10.0]])  # starts 5 columns left of the file
        read, calls = self.read_from(data)
        assert warp.nearest_affine(read, (100, 100), coef, (20, 20)) is None
        assert calls == []
        inside = np.array([[1.0, 0.0, 80.0], [0.0, 1.0, 80.0]])
        assert warp.nearest_affine(read, (100, 100), inside, (20, 20)).shape == (1, 20, 20)
        assert warp.nearest_affine(read, (100, 100), inside, (21, 21)) is None  # centre of pixel 20 is at 100.5


class TestNearest:
    def test_agrees_with_gdal(self, classes_albers):
        ds = RasterDataset(classes_albers, crs=UTM15, res=30.0, resampling="nearest")
        b = ds.bounds
        rng = np.random.default_rng(0)
        agree = total = 0
        for _ in range(12):
            x = rng.uniform(b.minx, b.maxx - 96 * 30)
            y = rng.uniform(b.miny + 96 * 30, b.maxy)
            q = BoundingBox(x, x + 96 * 30, y - 96 * 30, y)
            got = ds[q]["image"].numpy()[0]
            ref = gdal_reference(classes_albers, ds.grid(q), Resampling.nearest)
            agree += int((got == ref).sum())
            total += ref.size
        assert agree / total >= 0.999

    def test_same_result_as_the_gdal_path(self, classes_albers, monkeypatch):
        ds = RasterDataset(classes_albers, crs=UTM15, res=30.0, resampling="nearest")
        b = ds.bounds
        q = BoundingBox(b.minx - 500, b.minx + 64 * 30 - 500, b.maxy - 64 * 30 + 500, b.maxy + 500)  # a corner
        fast = ds[q]["image"].numpy()[0]
        monkeypatch.setitem(_fast.state, "warp", False)
        slow = ds[q]["image"].numpy()[0]
        assert fast.shape == slow.shape == (64, 64)
        assert (fast == slow).mean() >= 0.999
        assert (fast == 0).any()  # the corner outside the raster is nodata

    def test_nodata_and_outside_are_not_valid(self):
        data = np.array([[[1, 2], [0, 4]]], dtype=np.uint8)

        def read(c0, r0, c1, r1):
            return data[:, r0:r1, c0:c1]

        cols = np.array([[0.5, 1.5, 2.5]])
        rows = np.array([[1.5, 1.5, 1.5]])
        out, valid = warp.warp_window(read, (2, 2), cols, rows, Resampling.nearest, 0, np.dtype(np.int64))
        assert out.shape == valid.shape == (1, 1, 3)
        assert valid.tolist() == [[[False, True, False]]]
        assert out[0, 0, 1] == 4


class TestBilinear:
    def test_close_to_gdal(self, tmp_path):
        rng = np.random.default_rng(1)
        yy, xx = np.mgrid[0:300, 0:300]
        data = (100 + 60 * np.sin(xx / 13) * np.cos(yy / 17) + rng.normal(0, 1, (300, 300))).astype(np.uint8)
        path = write_tif(tmp_path / "img.tif", data, ALBERS, Affine(60.0, 0, 100_000, 0, -60.0, 2_150_000))

        with rasterio.open(path) as src:
            grid_t = Affine(30.0, 0, 0, 0, -30.0, 0)
            left, top = Transformer.from_crs(ALBERS, UTM15, always_xy=True).transform(104_000, 2_146_000)
            grid_t = Affine(30.0, 0, left, 0, -30.0, top)
            cols, rows = warp.source_coordinates(grid_t, UTM, (128, 128), src.transform, src.crs)
            arr = src.read()

        def read(c0, r0, c1, r1):
            return arr[:, r0:r1, c0:c1]

        out, valid = warp.warp_window(read, arr.shape[1:], cols, rows, Resampling.bilinear, None, np.dtype(np.uint8))
        ref = np.zeros((128, 128), np.uint8)
        reproject(arr[0], ref, src_transform=Affine(60.0, 0, 100_000, 0, -60.0, 2_150_000), src_crs=ALB,
                  dst_transform=grid_t, dst_crs=UTM, resampling=Resampling.bilinear)
        assert valid.all()
        diff = np.abs(out[0].astype(int) - ref.astype(int))
        assert (diff <= 1).mean() >= 0.995

    def test_downsampling_is_left_to_gdal(self):
        cols, rows = np.meshgrid(np.arange(8) * 3.0 + 0.5, np.arange(8) * 3.0 + 0.5)
        data = np.ones((1, 30, 30), np.uint8)
        result = warp.warp_window(lambda *w: data, (30, 30), cols, rows, Resampling.bilinear, None, np.dtype("u1"))
        assert result is None
        assert not warp.supports(Resampling.bilinear)
        assert warp.supports(Resampling.nearest)
