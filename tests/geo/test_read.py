"""Window reading: grids and exact sizes, native vs warped paths, fill and first-valid mosaics."""

from __future__ import annotations

import numpy as np
import pytest
import rasterio
from affine import Affine
from rasterio.crs import CRS
from rasterio.enums import Resampling
from rasterio.warp import reproject, transform_bounds

from pipekit.geo import BoundingBox
from pipekit.geo import _read as geo_read
from pipekit.geo import io as geo_io
from pipekit.geo._read import Grid, patch_shape, read_into, resampling_from, transform_bounds_fast, valid_mask

UTM = CRS.from_epsg(32615)
ALBERS = CRS.from_epsg(5070)


@pytest.fixture
def scene(utm_scene):
    handle = geo_io.open_handle(geo_io.RasterOpener(), str(utm_scene["path"]))
    yield handle, utm_scene
    handle.close()


def grid_at(col: float, row: float, width: int, height: int, res: float = 30.0, crs: CRS = UTM,
            origin: tuple[float, float] = (399_990.0, 4_650_030.0)) -> Grid:
    x0, y0 = origin
    bbox = BoundingBox(x0 + col * res, x0 + (col + width) * res, y0 - (row + height) * res, y0 - row * res)
    return Grid.from_bbox(bbox, (res, res), crs)


class TestPatchShape:
    @pytest.mark.parametrize("res", [0.1, 0.3, 0.6, 1 / 3, 10.0, 30.0, 0.000269494585236])
    @pytest.mark.parametrize("size", [1, 64, 255, 256, 257, 1000])
    def test_box_of_n_pixels_is_n_pixels(self, res, size):
        for origin in (0.0, 0.1, 500_000.123, 4_650_030.7, -8_789_636.7079):
            bbox = BoundingBox(origin, origin + size * res, origin - size * res * 0.5, origin + size * res * 0.5)
            assert patch_shape(bbox, (res, res)) == (size, size)

    def test_rectangular_pixels_and_rounding(self):
        assert patch_shape(BoundingBox(0, 100, 0, 50), (10, 5)) == (10, 10)
        assert patch_shape(BoundingBox(0, 104, 0, 10), (10, 10)) == (1, 10)
        assert patch_shape(BoundingBox(0, 105, 0, 10), (10, 10)) == (1, 11)  # halves round up
        assert patch_shape(BoundingBox(0, 1, 0, 1), (10, 10)) == (1, 1)  # never empty

    def test_grid_transform_and_bounds(self):
        grid = Grid.from_bbox(BoundingBox(100, 400, 200, 500), (30.0, 30.0), UTM)
        assert grid.transform == Affine(30.0, 0.0, 100.0, 0.0, -30.0, 500.0)
        assert grid.shape == (10, 10)
        assert grid.bounds == (100.0, 200.0, 400.0, 500.0)
        assert "height=10" in repr(grid)


class TestHelpers:
    def test_valid_mask(self):
        ints = np.array([0, 1, 2], dtype=np.uint8)
        assert valid_mask(ints, None) is None
        assert valid_mask(ints, 0).tolist() == [False, True, True]
        assert valid_mask(ints, 300) is None  # not representable: everything valid
        floats = np.array([np.nan, 1.0, -9999.0])
        assert valid_mask(floats, None).tolist() == [False, True, True]
        assert valid_mask(floats, -9999.0).tolist() == [False, True, False]
        assert valid_mask(floats, float("nan")).tolist() == [False, True, True]

    def test_resampling_from(self):
        assert resampling_from("Bilinear") == Resampling.bilinear
        assert resampling_from(Resampling.cubic) == Resampling.cubic
        assert resampling_from(0) == Resampling.nearest
        with pytest.raises(ValueError, match="unknown resampling"):
            resampling_from("smooth")
        with pytest.raises(TypeError):
            resampling_from(1.5)

    @pytest.mark.parametrize(("src", "dst"), [(UTM, ALBERS), (ALBERS, UTM), (UTM, CRS.from_epsg(4326)),
                                              (CRS.from_epsg(3857), CRS.from_epsg(32618))])
    def test_fast_transform_bounds_matches_rasterio(self, src, dst):
        left, bottom, right, top = transform_bounds(UTM, src, 400_000, 4_600_000, 420_000, 4_650_000)
        fast = transform_bounds_fast(src, dst, left, bottom, right, top)
        slow = transform_bounds(src, dst, left, bottom, right, top, densify_pts=21)
        assert fast == pytest.approx(slow, rel=1e-9, abs=1e-6)


class TestNative:
    def test_direct_read_into_output(self, scene):
        handle, data = scene
        grid = grid_at(10, 20, 64, 32)
        out = np.empty((3, 32, 64), dtype=np.uint16)
        assert read_into(handle, [1, 2, 3], grid, out, None, Resampling.bilinear, 0, 0, prefilled=False)
        np.testing.assert_array_equal(out, data["array"][:, 20:52, 10:74])

    def test_band_order_and_conversion(self, scene):
        handle, data = scene
        out = np.zeros((2, 8, 8), dtype=np.float32)
        read_into(handle, [3, 1], grid_at(0, 0, 8, 8), out, None, Resampling.nearest, 0, 0)
        np.testing.assert_array_equal(out, data["array"][[2, 0], :8, :8].astype(np.float32))

    def test_outside_pixels_get_the_fill_even_when_unfilled(self, scene):
        handle, data = scene
        out = np.full((3, 20, 20), 12345, dtype=np.uint16)  # garbage, as from np.empty
        assert read_into(handle, [1, 2, 3], grid_at(-5, -5, 20, 20), out, None, Resampling.nearest, 0, 9,
                         prefilled=False)
        assert (out[:, :5, :] == 9).all() and (out[:, :, :5] == 9).all()
        np.testing.assert_array_equal(out[:, 5:, 5:], data["array"][:, :15, :15])
        out[:] = 12345
        assert not read_into(handle, [1], grid_at(1000, 0, 4, 4), out[:1, :4, :4], None, Resampling.nearest, 0, 9,
                             prefilled=False)
        assert (out[0, :4, :4] == 9).all()

    def test_file_nodata_other_than_fill_is_not_copied(self, tmp_path, rasters):
        array = np.full((1, 10, 10), 5, dtype=np.uint16)
        array[0, 2:4, 2:4] = 65535
        path = rasters.write_tif(tmp_path / "n.tif", array, UTM, Affine(30.0, 0, 0, 0, -30.0, 300.0), nodata=65535)
        handle = geo_io.open_handle(geo_io.RasterOpener(), str(path))
        try:
            out = np.zeros((1, 10, 10), dtype=np.uint16)
            grid = Grid.from_bbox(BoundingBox(0, 300, 0, 300), (30.0, 30.0), UTM)
            read_into(handle, [1], grid, out, None, Resampling.nearest, 65535, 0)
            assert (out[0, 2:4, 2:4] == 0).all() and out.sum() == 5 * 96
        finally:
            handle.close()

    def test_snapping_only_within_tolerance_for_bilinear(self, scene, monkeypatch):
        handle, _ = scene
        calls = []
        original = geo_read._read_warped
        monkeypatch.setattr(geo_read, "_read_warped", lambda *a: calls.append(1) or original(*a))
        out = np.zeros((1, 8, 8), dtype=np.uint16)
        read_into(handle, [1], grid_at(3.004, 2.0, 8, 8), out, None, Resampling.bilinear, 0, 0)
        assert calls == []  # 0.004 px: snapped
        read_into(handle, [1], grid_at(3.3, 2.0, 8, 8), out, None, Resampling.bilinear, 0, 0)
        assert calls == [1]  # 0.3 px: resampled
        read_into(handle, [1], grid_at(3.3, 2.4, 8, 8), out, None, Resampling.nearest, 0, 0)
        assert calls == [1]  # nearest: always snapped (it is what GDAL picks)


class TestWarped:
    @pytest.mark.parametrize("resampling", [Resampling.nearest, Resampling.bilinear, Resampling.cubic])
    def test_matches_whole_file_reprojection(self, scene, resampling):
        handle, data = scene
        with rasterio.open(data["path"]) as src:
            left, bottom, _, _ = transform_bounds(src.crs, ALBERS, *src.bounds)
        res = 40.0
        bbox = BoundingBox(left + 500, left + 500 + 100 * res, bottom + 700, bottom + 700 + 80 * res)
        grid = Grid.from_bbox(bbox, (res, res), ALBERS)
        out = np.zeros((3, 80, 100), dtype=np.uint16)
        assert read_into(handle, [1, 2, 3], grid, out, None, resampling, 0, 0)
        expected = np.zeros_like(out)
        with rasterio.open(data["path"]) as src:
            reproject(rasterio.band(src, [1, 2, 3]), expected, dst_transform=grid.transform, dst_crs=ALBERS,
                      resampling=resampling, dst_nodata=0)
        assert (out == expected).mean() >= 0.99

    def test_downsampling_reads_enough_margin(self, scene):
        handle, data = scene
        res = 97.0  # about 3 source pixels per target pixel
        with rasterio.open(data["path"]) as src:
            left, bottom, _, _ = transform_bounds(src.crs, ALBERS, *src.bounds)
        bbox = BoundingBox(left + 1000, left + 1000 + 40 * res, bottom + 1000, bottom + 1000 + 40 * res)
        grid = Grid.from_bbox(bbox, (res, res), ALBERS)
        out = np.zeros((1, 40, 40), dtype=np.uint16)
        read_into(handle, [2], grid, out, None, Resampling.bilinear, 0, 0)
        expected = np.zeros_like(out)
        with rasterio.open(data["path"]) as src:
            reproject(rasterio.band(src, 2), expected[0], dst_transform=grid.transform, dst_crs=ALBERS,
                      resampling=Resampling.bilinear, dst_nodata=0)
        assert (out == expected).mean() >= 0.99

    def test_no_overlap_returns_false(self, scene):
        handle, _ = scene
        grid = Grid.from_bbox(BoundingBox(-2_000_000, -1_990_000, 100_000, 110_000), (100.0, 100.0), ALBERS)
        out = np.full((1, 100, 100), 3, dtype=np.uint16)
        assert not read_into(handle, [1], grid, out, None, Resampling.bilinear, 0, 3, prefilled=False)
        assert (out == 3).all()


class TestMosaicValidity:
    def test_first_valid_per_band_element(self, scene):
        handle, data = scene
        grid = grid_at(0, 0, 4, 4)
        out = np.zeros((3, 4, 4), dtype=np.uint16)
        valid = np.zeros(out.shape, dtype=bool)
        out[0] = 77
        valid[0] = True  # band 1 already filled by an earlier file
        read_into(handle, [1, 2, 3], grid, out, valid, Resampling.nearest, 0, 0)
        assert (out[0] == 77).all()
        np.testing.assert_array_equal(out[1:], data["array"][1:, :4, :4])
        assert valid.all()

    def test_unfilled_output_is_only_for_single_files(self, scene):
        handle, _ = scene
        out = np.zeros((1, 2, 2), dtype=np.uint16)
        with pytest.raises(ValueError, match="prefilled=False"):
            read_into(handle, [1], grid_at(0, 0, 2, 2), out, np.zeros(out.shape, bool), Resampling.nearest, 0, 0,
                      prefilled=False)


class TestReadErrors:
    """A failed read says why: GDAL's own messages, not only rasterio's "See previous exception"."""

    def test_gdal_reason_is_in_the_read_error(self, cc0):
        from pipekit.datasets import RasterDataset
        from pipekit.errors import ReadError

        ds = RasterDataset(cc0("corrupt.tif"))
        b = ds.bounds
        with pytest.raises(ReadError) as info:
            ds[BoundingBox(b.maxx - 100, b.maxx, b.miny, b.miny + 100)]
        text = str(info.value)
        assert "corrupt.tif" in text and "Read failed" in text
        # GDAL's chain behind rasterio's RasterioIOError: the block that failed and libtiff's reason
        assert "(GDAL: " in text and "IReadBlock failed" in text and "TIFFFillTile" in text

    def test_source_read_error_carries_the_chain(self, cc0):
        path = cc0("corrupt.tif") / "corrupt.tif"
        handle = geo_io.open_handle(geo_io.RasterOpener(), str(path))
        try:
            with pytest.raises(geo_read.SourceReadError, match=r"RasterioIOError: .*\(GDAL: .*TIFFFillTile"):
                geo_read._read_window(handle, [1], rasterio.windows.Window(0, 0, handle.width, handle.height))
        finally:
            handle.close()


class TestRawWindowReads:
    """Window reads through rasterio's ``DatasetReader._read`` give exactly what ``read()`` gives."""

    @staticmethod
    def _samples(ds, boxes) -> list[dict]:
        return [ds[box] for box in boxes]

    @pytest.mark.parametrize(
        ("dtype", "nodata"),
        [("uint8", 0), ("uint16", 0), ("int16", -9999), ("float32", None), ("float32", -1.0), ("uint16", None)],
    )
    @pytest.mark.parametrize("choice", [None, "native"])
    def test_samples_are_bit_identical_to_read(self, tmp_path, rasters, monkeypatch, dtype, nodata, choice):
        from pipekit.datasets import RasterDataset

        array = rasters.pattern(90, 110, 3, seed=4, dtype=dtype)
        if nodata is not None:
            array[:, 10:20, 30:45] = nodata  # a nodata hole
        transform = Affine(30.0, 0.0, rasters.X0, 0.0, -30.0, rasters.Y0)
        rasters.write_tif(tmp_path / "a.tif", array, rasters.UTM15, transform, nodata=nodata, blocksize=32)
        ds = RasterDataset(str(tmp_path), dtype=choice)
        b = ds.bounds
        x0, y1 = b[0].start, b[1].stop
        boxes = [
            BoundingBox(x0, x0 + 64 * 30, y1 - 64 * 30, y1),  # inside, over the hole
            BoundingBox(x0 + 80 * 30, x0 + 144 * 30, y1 - 40 * 30, y1 + 24 * 30),  # past two edges: fill
            BoundingBox(x0 + 7 * 30, x0 + 17 * 30, y1 - 90 * 30, y1 - 80 * 30),  # the last rows
        ]
        fast = self._samples(ds, boxes)
        monkeypatch.setattr(geo_read, "_RAW_READ", False)
        slow = self._samples(ds, boxes)
        for a, b_ in zip(fast, slow):
            assert a["image"].dtype == b_["image"].dtype
            assert torch_equal(a["image"], b_["image"])

    def test_mixed_band_dtypes_go_through_read(self, tmp_path, rasters):
        """A file whose bands differ in dtype is left to ``read()`` (which refuses it, as before)."""
        path = tmp_path / "mixed.tif"
        with rasterio.open(path, "w", driver="GTiff", width=8, height=8, count=2, dtype="uint8", crs=rasters.UTM15,
                           transform=Affine(30.0, 0.0, 0.0, 0.0, -30.0, 240.0)) as dst:
            dst.write(np.ones((2, 8, 8), np.uint8))
        handle = geo_io.open_handle(geo_io.RasterOpener(), str(path))
        try:
            out = np.empty((1, 4, 4), np.uint8)
            assert geo_read._direct_read_ok(handle, [1], rasterio.windows.Window(0, 0, 4, 4), out)
            # a window outside the file, a band it lacks, a float window, another dtype: read() decides
            assert not geo_read._direct_read_ok(handle, [1], rasterio.windows.Window(6, 0, 4, 4), out)
            assert not geo_read._direct_read_ok(handle, [3], rasterio.windows.Window(0, 0, 4, 4), out)
            assert not geo_read._direct_read_ok(handle, [1], rasterio.windows.Window(0.5, 0, 4, 4), out)
            assert not geo_read._direct_read_ok(handle, [1], rasterio.windows.Window(0, 0, 4, 4),
                                                out.astype(np.uint16))
            assert not geo_read._direct_read_ok(handle, [1, 2], rasterio.windows.Window(0, 0, 4, 4), out)
        finally:
            handle.close()

    def test_multi_part_windows_match_concatenation(self, tmp_path, rasters, monkeypatch):
        """Band files warped together are read into one array: the same as reading and concatenating them."""
        handles = []
        for k in range(3):
            array = rasters.pattern(40, 50, 1, seed=k, dtype="uint16")
            path = rasters.write_tif(tmp_path / f"b{k}.tif", array, rasters.UTM15,
                                     Affine(30.0, 0.0, 0.0, 0.0, -30.0, 1200.0))
            handles.append(geo_io.open_handle(geo_io.RasterOpener(), str(path)))
        try:
            parts = [(h, [1]) for h in handles]
            window = rasterio.windows.Window(3, 5, 20, 30)
            got = geo_read._read_windows(parts, window, None)
            monkeypatch.setattr(geo_read, "_RAW_READ", False)
            want = np.concatenate([h.ds.read([1], window=window) for h in handles])
            assert got.dtype == want.dtype and np.array_equal(got, want)
        finally:
            for h in handles:
                h.close()

    @pytest.mark.parametrize("nodata", [None, 0, 7])
    def test_band_files_read_at_once_match_part_by_part(self, tmp_path, rasters, monkeypatch, nodata):
        """A scene's band files read each straight into the output: what reading them part by part gives."""
        handles = []
        for k in range(3):
            array = rasters.pattern(40, 50, 1, seed=k, dtype="uint16")
            array[0, :4, :4] = 7
            path = rasters.write_tif(tmp_path / f"b{k}.tif", array, rasters.UTM15,
                                     Affine(30.0, 0.0, 0.0, 0.0, -30.0, 1200.0), nodata=nodata)
            handles.append(geo_io.open_handle(geo_io.RasterOpener(), str(path)))
        try:
            parts = [(h, [1]) for h in handles]
            origin = (0.0, 1200.0)
            grids = [grid_at(0, 0, 20, 16, origin=origin), grid_at(30, 24, 20, 16, origin=origin),  # inside
                     grid_at(40, 30, 20, 16, origin=origin), grid_at(-5, 2, 8, 8, origin=origin)]  # past edges
            nodatas = [h.nodata for h in handles]
            for dtype in (np.uint16, np.float32):
                for grid in grids:
                    got = np.full((3, grid.height, grid.width), 1, dtype)
                    geo_read.read_stack_into(parts, nodatas, grid, got, None, Resampling.nearest, 0, False)
                    with monkeypatch.context() as m:
                        m.setattr(geo_read, "_read_native_stack", lambda *args: False)
                        want = np.full((3, grid.height, grid.width), 1, dtype)
                        geo_read.read_stack_into(parts, nodatas, grid, want, None, Resampling.nearest, 0, False)
                    assert np.array_equal(got, want)
        finally:
            for h in handles:
                h.close()


def torch_equal(a, b) -> bool:
    import torch

    return a.shape == b.shape and bool(torch.equal(a.isnan(), b.isnan())) and bool(
        torch.equal(torch.nan_to_num(a), torch.nan_to_num(b)))
