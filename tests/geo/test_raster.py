"""RasterDataset: bands, reads, mosaics, CRSs, errors, pickling, composition, plots, slices, index frames, dtypes."""

from __future__ import annotations

import logging
import os
import pickle
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import rasterio
import torch
from affine import Affine
from rasterio.crs import CRS
from rasterio.enums import Resampling
from rasterio.warp import reproject
from torch.utils.data import DataLoader

from pipekit.datasets import RasterDataset
from pipekit.errors import DatasetNotFoundError, GeoReferenceError, ReadError
from pipekit.geo import BoundingBox
from pipekit.geo import io as geo_io
from pipekit.geo._bbox import from_slices
from pipekit.geo._composition import IntersectionDataset, UnionDataset
from pipekit.geo._read import SkippedReadError

UTM15 = "EPSG:32615"
ALBERS = "EPSG:5070"
X0, Y0 = 399_990.0, 4_650_030.0  # the grid of the conftest fixtures


def box(col: float, row: float, width: float, height: float, res: float = 30.0,
        x0: float = X0, y0: float = Y0) -> BoundingBox:
    """The box of ``width`` x ``height`` pixels whose top-left pixel is (col, row) of a grid at (x0, y0)."""
    return BoundingBox(x0 + col * res, x0 + (col + width) * res, y0 - (row + height) * res, y0 - row * res)


def reference(path: Path, grid, bands: list[int], resampling: Resampling, nodata: float | None = None) -> np.ndarray:
    """GDAL's own answer: the whole file reprojected onto the query grid."""
    with rasterio.open(path) as src:
        out = np.zeros((len(bands), grid.height, grid.width), dtype=src.dtypes[0])
        reproject(
            rasterio.band(src, bands),
            out,
            dst_transform=grid.transform,
            dst_crs=grid.crs,
            resampling=resampling,
            dst_nodata=0 if nodata is None else nodata,
        )
    return out


class Dated(RasterDataset):
    filename_glob = "scene_*.tif"
    filename_regex = r"""
        ^scene
        _(?P<date>\d{8})
        \.tif$
    """
    date_format = "%Y%m%d"


class Named(RasterDataset):
    filename_glob = "*.tif"
    all_bands = ("red", "green", "blue")
    rgb_bands = ("red", "green", "blue")


class Mask(RasterDataset):
    filename_glob = "*.tif"
    is_image = False


class TestBands:
    def test_named_bands_select_and_reorder(self, utm_scene):
        ds = Named(utm_scene["root"], bands=["blue", "red"])
        got = ds[box(0, 0, 16, 16)]["image"].numpy()
        np.testing.assert_array_equal(got, utm_scene["array"][[2, 0], :16, :16])
        with pytest.raises(ValueError, match="Dataset does not contain some of the RGB bands"):
            ds._plot_spec()  # not the first two bands drawn as if they were red and green
        assert Named(utm_scene["root"])._plot_spec() == {"rgb": [0, 1, 2]}

    def test_unknown_band_is_refused(self, utm_scene):
        with pytest.raises(ValueError, match="no band"):
            Named(utm_scene["root"], bands=["nir"])
        with pytest.raises(ValueError, match="must not repeat"):
            Named(utm_scene["root"], bands=["red", "red"])

    def test_unnamed_bands_by_index(self, utm_scene):
        ds = RasterDataset(utm_scene["root"], bands=[3])
        np.testing.assert_array_equal(ds[box(0, 0, 8, 8)]["image"].numpy(), utm_scene["array"][2:3, :8, :8])
        with pytest.raises(ReadError, match="band 4"):
            RasterDataset(utm_scene["root"], bands=[4])


class TestRead:
    def test_native_window_is_exact(self, utm_scene):
        ds = RasterDataset(utm_scene["root"])
        sample = ds[box(10, 20, 128, 64)]
        assert sample["image"].dtype == torch.float32
        assert sample["image"].shape == (3, 64, 128)
        np.testing.assert_array_equal(sample["image"].numpy(), utm_scene["array"][:, 20:84, 10:138])
        assert sample["crs"] == utm_scene["crs"]
        # TorchGeo 0.8: the query as (slice x, slice y, slice t), times as pandas Timestamps
        x, y, t = sample["bounds"]
        assert from_slices(sample["bounds"]) == box(10, 20, 128, 64)
        assert (x.start, y.stop, t.start) == (X0 + 300, Y0 - 600, pd.Timestamp.min)
        assert sample["transform"] == Affine(30.0, 0.0, X0 + 300, 0.0, -30.0, Y0 - 600)

    def test_slices_query(self, utm_scene):
        ds = RasterDataset(utm_scene["root"])
        b = box(5, 5, 32, 32)
        by_slice = ds[b.minx:b.maxx, b.miny:b.maxy]
        np.testing.assert_array_equal(by_slice["image"].numpy(), ds[b]["image"].numpy())
        with pytest.raises(TypeError, match="BoundingBox or by slices"):
            ds[3]

    @pytest.mark.parametrize("res", [30.0, 0.1, 0.3, 10.0 / 3.0])
    def test_exact_patch_sizes_at_awkward_bounds(self, tmp_path, res, rasters):
        x0, y0 = 500000.123, 4000000.789
        rasters.write_tif(tmp_path / "r.tif", rasters.pattern(400, 400), UTM15, Affine(res, 0.0, x0, 0.0, -res, y0))
        ds = RasterDataset(tmp_path)
        for col, row, size in [(0, 0, 256), (7, 3, 256), (101, 77, 255), (13, 200, 64), (1, 1, 257)]:
            minx = x0 + col * res
            maxy = y0 - row * res
            b = BoundingBox(minx, minx + size * res, maxy - size * res, maxy)
            assert ds[b]["image"].shape[-2:] == (size, size), (res, col, row, size)

    def test_nodata_fills_partial_coverage(self, utm_scene):
        ds = RasterDataset(utm_scene["root"])
        got = ds[box(-20, -10, 60, 40)]["image"].numpy()
        assert got.shape == (3, 40, 60)
        assert (got[:, :10, :] == 0).all() and (got[:, :, :20] == 0).all()
        np.testing.assert_array_equal(got[:, 10:, 20:], utm_scene["array"][:, :30, :40])
        # the far corner too
        got = ds[box(280, 290, 40, 40)]["image"].numpy()
        np.testing.assert_array_equal(got[:, :10, :20], utm_scene["array"][:, 290:, 280:])
        assert (got[:, 10:, :] == 0).all() and (got[:, :, 20:] == 0).all()

    def test_nodata_override_is_the_fill_value(self, utm_scene):
        ds = RasterDataset(utm_scene["root"], nodata=7)
        got = ds[box(-5, 0, 10, 10)]["image"].numpy()
        assert (got[:, :, :5] == 7).all()
        np.testing.assert_array_equal(got[:, :, 5:], utm_scene["array"][:, :10, :5])

    def test_query_outside_raises_index_error(self, utm_scene):
        ds = RasterDataset(utm_scene["root"])
        with pytest.raises(IndexError, match="not within the index of RasterDataset"):
            ds[box(1000, 1000, 10, 10)]

    def test_mask_is_int64_hw(self, utm_scene):
        ds = Mask(utm_scene["root"], bands=[1])
        mask = ds[box(0, 0, 16, 8)]["mask"]
        assert mask.dtype == torch.int64 and mask.shape == (8, 16)
        assert ds.resampling == Resampling.nearest
        assert RasterDataset(utm_scene["root"]).resampling == Resampling.bilinear
        assert Mask(utm_scene["root"], resampling="cubic").resampling == Resampling.cubic

    def test_transforms_and_dtype(self, utm_scene):
        def add_flag(sample):
            sample["flag"] = True
            return sample

        ds = RasterDataset(utm_scene["root"], transforms=add_flag, dtype=torch.int32)
        sample = ds[box(0, 0, 4, 4)]
        assert sample["flag"] is True and sample["image"].dtype == torch.int32

    def test_uncached_reads_leave_no_handle(self, utm_scene):
        geo_io.close_cached_handles()
        ds = RasterDataset(utm_scene["root"], cache=False)
        np.testing.assert_array_equal(ds[box(0, 0, 8, 8)]["image"].numpy(), utm_scene["array"][:, :8, :8])
        assert geo_io.cached_handle_count() == 0
        RasterDataset(utm_scene["root"])[box(0, 0, 8, 8)]
        assert geo_io.cached_handle_count() == 1

    def test_subpixel_offsets(self, utm_scene):
        near = Mask(utm_scene["root"], bands=[1])
        q = BoundingBox(X0 + 10 * 30 + 12.0, X0 + 42 * 30 + 12.0, Y0 - 40 * 30 - 9.0, Y0 - 8 * 30 - 9.0)
        grid = near.grid(q)
        ref = reference(utm_scene["path"], grid, [1], Resampling.nearest)
        np.testing.assert_array_equal(near[q]["mask"].numpy(), ref[0])
        bil = RasterDataset(utm_scene["root"])
        ref = reference(utm_scene["path"], grid, [1, 2, 3], Resampling.bilinear)
        got = bil[q]["image"].numpy()
        assert (np.abs(got - ref) <= 1).mean() >= 0.99


class TestMosaic:
    def test_first_valid_with_nodata_holes(self, mosaic_pair):
        ds = RasterDataset(mosaic_pair["root"])
        got = ds[box(90, 30, 120, 40)]["image"].numpy()[0]
        # columns 90..100: only a; 100..200: a first (b fills a's hole); 200..210: only b
        assert (got[:, :110] == 100).sum() == 40 * 110 - 20 * 20
        assert (got[10:30, 50:70] == 200).all()  # a's hole (rows 40..60, cols 140..160) is b's
        assert (got[:, 110:] == 200).all()

    def test_hits_in_other_crs_mosaic_too(self, mosaic_pair, tmp_path, rasters):
        # the same two files, one of them reprojected to Albers: the mosaic still fills a's hole
        b_src = mosaic_pair["root"] / "b.tif"
        with rasterio.open(b_src) as src:
            from rasterio.warp import calculate_default_transform

            transform, width, height = calculate_default_transform(src.crs, ALBERS, src.width, src.height,
                                                                   *src.bounds)
            out = np.zeros((1, height, width), np.uint16)
            reproject(rasterio.band(src, 1), out, dst_transform=transform, dst_crs=ALBERS,
                      resampling=Resampling.nearest, dst_nodata=0)
        rasters.write_tif(tmp_path / "b_albers.tif", out, ALBERS, transform, nodata=0)
        import shutil

        shutil.copy(mosaic_pair["root"] / "a.tif", tmp_path / "a.tif")
        ds = RasterDataset(tmp_path, crs=UTM15, res=30)
        got = ds[box(130, 35, 40, 30)]["image"].numpy()[0]
        hole = got[5:25, 10:30]
        assert (hole == 200).mean() > 0.95
        assert (got[:5] == 100).all()


class TestCrossCRS:
    @pytest.mark.parametrize("resampling", [Resampling.bilinear, Resampling.nearest])
    def test_synthetic_agrees_with_gdal_reproject(self, utm_scene, resampling):
        ds = RasterDataset(utm_scene["root"], crs=ALBERS, res=25.0, resampling=resampling)
        b = ds.bounds
        q = BoundingBox(b.minx + 1003.0, b.minx + 1003.0 + 128 * 25, b.miny + 2011.0, b.miny + 2011.0 + 96 * 25)
        got = ds[q]["image"].numpy()
        ref = reference(utm_scene["path"], ds.grid(q), [1, 2, 3], resampling)
        assert got.shape == ref.shape == (3, 96, 128)
        assert (got == ref).mean() >= 0.99

    def test_synthetic_partial_cover_agrees(self, utm_scene):
        ds = RasterDataset(utm_scene["root"], crs=ALBERS, res=30.0)
        b = ds.bounds
        q = BoundingBox(b.maxx - 2000.0, b.maxx + 1000.0, b.maxy - 1500.0, b.maxy + 1500.0)
        got = ds[q]["image"].numpy()
        ref = reference(utm_scene["path"], ds.grid(q), [1, 2, 3], Resampling.bilinear)
        assert (got == ref).mean() >= 0.99
        assert (got == 0).any() and (got > 0).any()

    def test_cc0_pair_agrees_in_both_crss(self, cc0):
        root = cc0("RGB.byte.tif", "rgb1_fake_nir_epsg3857.tif")
        rgb = RasterDataset(root / "RGB.byte.tif")
        nir = RasterDataset(root / "rgb1_fake_nir_epsg3857.tif")
        assert rgb.crs.to_epsg() == 32618 and nir.crs.to_epsg() == 3857
        both = rgb & nir
        assert both.crs == rgb.crs and both.res == rgb.res
        b = both.bounds
        size = 96 * rgb.res[0]
        cx, cy = (b.minx + b.maxx) / 2, (b.miny + b.maxy) / 2
        q = BoundingBox(cx - size / 2, cx + size / 2, cy - size / 2, cy + size / 2)
        sample = both[q]
        assert sample["image"].shape == (4, 96, 96)
        grid = both.grid(q)
        ref_rgb = reference(root / "RGB.byte.tif", grid, [1, 2, 3], Resampling.bilinear)
        ref_nir = reference(root / "rgb1_fake_nir_epsg3857.tif", grid, [1], Resampling.bilinear)
        got = sample["image"].numpy()
        assert (got[:3] == ref_rgb).mean() >= 0.99
        assert (got[3:] == ref_nir).mean() >= 0.99
        assert (got[3] > 0).mean() > 0.5
        # and the other way round: the RGB warped into Web Mercator
        other = nir & rgb
        b = other.bounds
        size = 64 * nir.res[0]
        cx, cy = (b.minx + b.maxx) / 2, (b.miny + b.maxy) / 2
        q = BoundingBox(cx - size / 2, cx + size / 2, cy - size / 2, cy + size / 2)
        got = other[q]["image"].numpy()
        ref_rgb = reference(root / "RGB.byte.tif", other.grid(q), [1, 2, 3], Resampling.bilinear)
        assert (got[1:] == ref_rgb).mean() >= 0.99

    def test_crs_setter_reindexes(self, utm_scene):
        ds = RasterDataset(utm_scene["root"])
        utm_bounds = ds.bounds
        ds.crs = ALBERS
        assert ds.crs == CRS.from_string(ALBERS)
        assert ds.bounds.minx != utm_bounds.minx
        ds.res = 60
        assert ds.res == (60.0, 60.0)
        q = BoundingBox(ds.bounds.minx + 600, ds.bounds.minx + 600 + 32 * 60,
                        ds.bounds.miny + 600, ds.bounds.miny + 600 + 16 * 60)
        assert ds[q]["image"].shape == (3, 16, 32)


class TestErrors:
    def test_corrupt_file_fails_at_read_naming_it(self, cc0):
        root = cc0("corrupt.tif")
        ds = RasterDataset(root)  # opens fine: metadata is readable
        b = ds.bounds
        half = (b.maxx - b.minx) / 2
        ok = BoundingBox(b.minx, b.minx + half - 10, b.maxy - half + 10, b.maxy)
        assert ds[ok]["image"].shape[0] == 3
        bad = BoundingBox(b.maxx - 100, b.maxx, b.miny, b.miny + 100)
        with pytest.raises(ReadError, match=r"cannot read raster '.*corrupt\.tif' in RasterDataset"):
            ds[bad]

    def test_corrupt_file_skipped_and_logged_with_on_error_skip(self, cc0):
        # issue 13: a skipped read is counted and has no sample (it used to return a zero-filled patch)
        ds = RasterDataset(cc0("corrupt.tif"), on_error="skip")
        b = ds.bounds
        with pytest.raises(SkippedReadError, match=r"cannot read raster '.*corrupt\.tif' in RasterDataset: .*skipped"):
            ds[BoundingBox(b.maxx - 100, b.maxx, b.miny, b.miny + 100)]
        assert ds.skip_log.count == 1
        assert ds.skip_log.skipped[0].url.endswith("corrupt.tif")

    def test_raster_without_crs_is_refused_at_index_time(self, cc0):
        root = cc0("float_nan.tif")
        with pytest.raises(GeoReferenceError, match=r"cannot index raster '.*float_nan\.tif'.*no CRS"):
            RasterDataset(root)
        with pytest.raises(FileNotFoundError, match="none of the 1 file"):
            RasterDataset(root, on_error="skip")

    def test_unreadable_file_fails_at_index_time_naming_it(self, utm_scene, tmp_path):
        (tmp_path / "broken.tif").write_bytes(b"II*\x00 this is not a tiff")
        # left out as TorchGeo does (with a warning naming it); with nothing else, no dataset
        with pytest.warns(UserWarning, match=r"left out 1 file.*broken\.tif"), \
                pytest.raises(DatasetNotFoundError, match=r"none of the 1 file.*the first: '.*broken\.tif'"):
            RasterDataset(tmp_path)
        ds = RasterDataset([tmp_path, utm_scene["path"]], on_error="skip")
        assert len(ds) == 1 and ds.skip_log.count == 1

    def test_argument_validation(self, utm_scene):
        with pytest.raises(ValueError, match="on_error"):
            RasterDataset(utm_scene["root"], on_error="ignore")
        with pytest.raises(ValueError, match="res must be positive"):
            RasterDataset(utm_scene["root"], res=-1)
        with pytest.raises(TypeError, match="transforms must be callable"):
            RasterDataset(utm_scene["root"], transforms=3)
        with pytest.raises(ValueError, match="not a CRS"):
            RasterDataset(utm_scene["root"], crs="EPSG:notacode")


class TestPickle:
    def test_pickle_is_small_and_holds_no_handle(self, utm_scene, mosaic_pair):
        ds = RasterDataset([utm_scene["root"], mosaic_pair["root"]], bands=[1])
        ds[box(0, 0, 8, 8)]  # opens handles in this process
        assert geo_io.cached_handle_count() >= 1
        data = pickle.dumps(ds)
        assert len(data) < 20_000
        assert b"DatasetReader" not in data and b"RasterHandle" not in data
        clone = pickle.loads(data)
        np.testing.assert_array_equal(clone[box(0, 0, 8, 8)]["image"].numpy(), ds[box(0, 0, 8, 8)]["image"].numpy())
        assert "_crs_key" not in clone.__dict__ or isinstance(clone.__dict__["_crs_key"], str)

    def test_compositions_pickle(self, utm_scene, mosaic_pair):
        a = RasterDataset(utm_scene["root"], bands=[1])
        b = RasterDataset(mosaic_pair["root"])
        for ds in (a | b, a & b):
            clone = pickle.loads(pickle.dumps(ds))
            q = box(10, 10, 16, 16)
            np.testing.assert_array_equal(clone[q]["image"].numpy(), ds[q]["image"].numpy())


class TestWorkers:
    def test_two_workers_with_a_bounding_box_sampler(self, utm_scene):
        ds = RasterDataset(utm_scene["root"])
        boxes = [box(c, r, 32, 32) for c in range(0, 200, 40) for r in range(0, 120, 60)]
        expected = torch.stack([ds[b]["image"] for b in boxes])  # parent opens handles before forking

        def collate(samples):
            return {"image": torch.stack([s["image"] for s in samples]), "pid": [s["pid"] for s in samples],
                    "handles": [s["handles"] for s in samples]}

        ds.transforms = _tag_worker
        loader = DataLoader(ds, batch_size=4, sampler=boxes, num_workers=2, collate_fn=collate)
        images, pids = [], set()
        for batch in loader:
            images.append(batch["image"])
            pids.update(batch["pid"])
            assert all(count >= 1 for count in batch["handles"])
        assert torch.equal(torch.cat(images), expected)
        assert len(pids) == 2 and os.getpid() not in pids


def _tag_worker(sample):
    sample["pid"] = os.getpid()
    sample["handles"] = geo_io.cached_handle_count()
    return sample


class TestComposition:
    def test_union_covers_either_and_mosaics_first_valid(self, utm_scene, mosaic_pair):
        a = RasterDataset(mosaic_pair["root"] / "a.tif")
        b = RasterDataset(mosaic_pair["root"] / "b.tif")
        union = a | b
        assert isinstance(union, UnionDataset)
        assert len(union) == 2
        got = union[box(90, 30, 120, 40)]["image"].numpy()[0]
        assert (got[10:30, 50:70] == 200).all()
        assert (got[:10, :110] == 100).all() and (got[:, 110:] == 200).all()
        reversed_union = b | a
        got = reversed_union[box(90, 30, 120, 40)]["image"].numpy()[0]
        assert (got[:, 10:] == 200).all() and (got[:, :10] == 100).all()

    def test_union_refuses_different_layouts(self, utm_scene, mosaic_pair):
        three = RasterDataset(utm_scene["root"])
        one = RasterDataset(mosaic_pair["root"])
        with pytest.raises(ValueError, match=r"cannot mosaic samples of different layouts"):
            three | one

    def test_union_of_operands_with_transforms_runs_them_and_merges_as_torchgeo(self, mosaic_pair):
        def plus_one(sample):
            return {**sample, "image": sample["image"] + 1, "seen": sample.get("seen", 0) + 1}

        a = RasterDataset(mosaic_pair["root"] / "a.tif", transforms=plus_one)
        b = RasterDataset(mosaic_pair["root"] / "b.tif")
        union = a | a  # TorchGeo's `ds | ds`
        assert isinstance(union, UnionDataset) and len(union) == 2
        # each operand's sample goes through its own transforms, then the samples merge by maximum
        # (TorchGeo's merge_samples): a's data 100 -> 101, its nodata hole (0) -> 1
        got = (a | b)[box(90, 30, 120, 40)]
        image = got["image"].numpy()[0]
        assert (image[:, :10] == 101).all() and (image[:, 10:] == 200).all() and got["seen"] == 1
        hole = (a | a)[box(140, 40, 20, 20)]["image"].numpy()
        assert (hole == 1).all()

    def test_intersection_holds_both_keys(self, utm_scene, mosaic_pair):
        image = RasterDataset(utm_scene["root"])
        mask = Mask(mosaic_pair["root"])
        both = image & mask
        assert isinstance(both, IntersectionDataset)
        sample = both[box(10, 10, 32, 16)]
        assert sample["image"].shape == (3, 16, 32) and sample["mask"].shape == (16, 32)
        assert sample["mask"].dtype == torch.int64
        assert (sample["mask"] == 100).all()
        assert both.bounds.maxx <= image.bounds.maxx
        images = image & RasterDataset(mosaic_pair["root"])
        assert images[box(10, 10, 8, 8)]["image"].shape == (4, 8, 8)

    def test_empty_intersection_names_both(self, utm_scene, tmp_path, rasters):
        t = Affine(30.0, 0.0, X0 + 1e6, 0.0, -30.0, Y0)
        far = rasters.write_tif(tmp_path / "far.tif", rasters.pattern(20, 20), UTM15, t)
        with pytest.raises(ValueError, match=r"Dated & RasterDataset: the datasets do not intersect"):
            Dated(_dated_copy(utm_scene, tmp_path)) & RasterDataset(far)

    def test_time_matters_unless_spatial_only(self, utm_scene, tmp_path, rasters):
        dated = Dated(_dated_copy(utm_scene, tmp_path))
        later = tmp_path / "later"
        t = Affine(30.0, 0.0, X0, 0.0, -30.0, Y0)
        rasters.write_tif(later / "scene_20230101.tif", rasters.pattern(50, 50), UTM15, t)
        other = Dated(later)
        with pytest.raises(ValueError, match="in space and time"):
            dated & other
        both = IntersectionDataset(dated, other, spatial_only=True)
        assert both[box(0, 0, 8, 8)]["image"].shape == (4, 8, 8)

    def test_right_operand_is_reprojected_and_crs_res_override(self, utm_scene, cc0, caplog):
        utm = RasterDataset(utm_scene["root"])
        albers = RasterDataset(utm_scene["root"], crs=ALBERS, res=30)
        with caplog.at_level(logging.INFO, logger="pipekit.geo"):
            both = utm & albers
        assert both.crs == utm.crs and both.res == utm.res
        assert any("reprojected on read" in r.getMessage() for r in caplog.records)
        q = box(20, 20, 64, 64)
        got = both[q]["image"].numpy()
        np.testing.assert_array_equal(got[:3], utm_scene["array"][:, 20:84, 20:84])
        # the "Albers" dataset's file is in UTM: back in UTM it is read natively again
        np.testing.assert_array_equal(got[3:], got[:3])
        forced = IntersectionDataset(utm, albers, crs=ALBERS, res=60)
        assert forced.crs == CRS.from_string(ALBERS) and forced.res == (60.0, 60.0)
        b = forced.bounds
        sample = forced[BoundingBox(b.minx + 600, b.minx + 600 + 60 * 20, b.miny + 600, b.miny + 600 + 60 * 10)]
        assert sample["image"].shape == (6, 10, 20)

    def test_nested_compositions(self, utm_scene, mosaic_pair):
        a = RasterDataset(mosaic_pair["root"] / "a.tif")
        b = RasterDataset(mosaic_pair["root"] / "b.tif")
        image = RasterDataset(utm_scene["root"], bands=[1])
        nested = (a | b) & image
        sample = nested[box(90, 30, 120, 40)]
        assert sample["image"].shape == (2, 40, 120)
        assert (sample["image"][0, 10:30, 50:70] == 200).all()
        assert len(pickle.dumps(nested)) < 30_000


def _dated_copy(utm_scene, tmp_path: Path) -> Path:
    root = tmp_path / "dated"
    root.mkdir(exist_ok=True)
    target = root / "scene_20210701.tif"
    if not target.exists():
        target.write_bytes(utm_scene["path"].read_bytes())
    return root


class TestPlot:
    def test_plot_renders_image_and_mask_to_png(self, utm_scene, mosaic_pair, tmp_path):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        class ClassMask(Mask):
            cmap = {100: (255, 0, 0), 200: (0, 0, 255)}
            class_names = {100: "field", 200: "water"}

        image = Named(utm_scene["root"])
        mask = ClassMask(mosaic_pair["root"])
        both = image & mask
        sample = both[box(90, 30, 120, 40)]
        sample["prediction"] = sample["mask"].clone()
        fig = both.plot(sample, suptitle="test")
        out = tmp_path / "plot.png"
        fig.savefig(out)
        plt.close(fig)
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        axes = fig.get_axes()
        assert len(axes) == 3
        legend = axes[1].get_legend()
        assert [t.get_text() for t in legend.get_texts()] == ["100: field", "200: water"]
        fig = image.plot(image[box(0, 0, 16, 16)], show_titles=False)
        plt.close(fig)

    def test_plot_without_matplotlib_names_the_extra(self, utm_scene, monkeypatch):
        import sys

        monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
        ds = RasterDataset(utm_scene["root"])
        with pytest.raises(ImportError, match=r"pipekit\[plot\]"):
            ds.plot(ds[box(0, 0, 8, 8)])


class TestTorchGeoSlices:
    """TorchGeo 0.8: bounds, queries and sample bounds are (slice x, slice y, slice t)."""

    def test_bounds_are_slices_with_the_resolution_as_step(self, utm_scene, tmp_path):
        ds = Dated(_dated_copy(utm_scene, tmp_path))
        x, y, t = ds.bounds
        assert isinstance(ds.bounds, tuple) and len(ds.bounds) == 3
        assert (x.start, x.stop, x.step) == (X0, X0 + 300 * 30, 30.0)
        assert (y.start, y.stop, y.step) == (Y0 - 300 * 30, Y0, 30.0)
        assert t == slice(pd.Timestamp(2021, 7, 1), pd.Timestamp(2021, 7, 1, 23, 59, 59, 999999), 1)
        assert ds.bounds[0].start == X0  # the failing line, once a BoundingBox
        # the attribute names of the BoundingBox bounds pipekit had, for older code
        assert (ds.bounds.minx, ds.bounds.maxy) == (X0, Y0) and ds.bounds.bbox == ds._extent()
        # an undated raster spans all time, as TorchGeo marks it
        undated = RasterDataset(utm_scene["root"])
        assert undated.bounds[2] == slice(pd.Timestamp.min, pd.Timestamp.max, 1)

    def test_tutorial_queries(self, utm_scene, tmp_path):
        ds = Dated(_dated_copy(utm_scene, tmp_path))
        size, xres, yres = 16, 30, 30
        xmin, ymin = X0 + 10 * 30, Y0 - 200 * 30
        xmax, ymax = xmin + size * 30, ymin + size * 30
        tmin, tmax = pd.Timestamp(2021, 1, 1), pd.Timestamp(2021, 12, 31)
        expected = ds[BoundingBox(xmin, xmax, ymin, ymax)]["image"]
        for query in [(slice(xmin, xmax, xres), slice(ymin, ymax, yres)),
                      (slice(xmin, xmax), slice(ymin, ymax), slice(tmin, tmax))]:
            sample = ds[query]
            assert torch.equal(sample["image"], expected)
        whole = ds[:, :, tmin:tmax:1]
        assert whole["image"].shape == (3, 300, 300)
        # sample["bounds"]: the query, its open ends filled in from dataset.bounds
        x, y, t = ds[xmin:xmax, ymin:ymax]["bounds"]
        assert (x, y) == (slice(xmin, xmax), slice(ymin, ymax))
        assert (t.start, t.stop) == (ds.bounds[2].start, ds.bounds[2].stop)
        with pytest.raises(IndexError):
            ds[xmin:xmax, ymin:ymax, pd.Timestamp(2022, 1, 1):pd.Timestamp(2022, 2, 1)]

    def test_steps_are_the_resolution(self, utm_scene):
        ds = RasterDataset(utm_scene["root"])
        b = box(10, 20, 64, 32)
        coarse = ds[b.minx:b.maxx:60.0, b.miny:b.maxy:60.0]
        assert coarse["image"].shape == (3, 16, 32)
        assert coarse["transform"] == Affine(60.0, 0.0, b.minx, 0.0, -60.0, b.maxy)
        reference_ds = RasterDataset(utm_scene["root"], res=60)
        assert torch.equal(coarse["image"], reference_ds[b]["image"])
        assert ds[b.minx:b.maxx:60.0, b.miny:b.maxy]["image"].shape == (3, 32, 32)  # y keeps the dataset's 30 m
        assert ds.res == (30.0, 30.0)
        with pytest.raises(ValueError, match="time step"):
            ds[b.minx:b.maxx, b.miny:b.maxy, ::2]
        with pytest.raises(ValueError, match="positive"):
            ds[b.minx:b.maxx:-30.0, b.miny:b.maxy]

    def test_bounding_box_still_accepted_and_reported_as_slices(self, utm_scene):
        ds = RasterDataset(utm_scene["root"])
        b = box(5, 5, 32, 32)
        sample = ds[b]
        assert torch.equal(sample["image"], ds[b.minx:b.maxx, b.miny:b.maxy]["image"])
        x, y, t = sample["bounds"]
        assert (x, y) == (slice(b.minx, b.maxx), slice(b.miny, b.maxy))
        assert (t.start, t.stop) == (pd.Timestamp.min, pd.Timestamp.max)
        assert ds[sample["bounds"]]["bounds"] == sample["bounds"]  # a sample's bounds query it again
        assert ds[list(sample["bounds"])]["image"].shape == (3, 32, 32)  # as torch's default_convert leaves them

    def test_compositions_report_slices(self, utm_scene, mosaic_pair):
        image = RasterDataset(utm_scene["root"])
        mask = Mask(mosaic_pair["root"])
        both = image & mask
        x = both.bounds[0]
        assert x.step == 30.0 and x.stop <= image.bounds[0].stop
        q = box(10, 10, 16, 8)
        sample = both[q.minx:q.maxx, q.miny:q.maxy]
        assert sample["bounds"][0] == slice(q.minx, q.maxx)
        union = RasterDataset(mosaic_pair["root"] / "a.tif") | RasterDataset(mosaic_pair["root"] / "b.tif")
        assert union.bounds[0].stop == X0 + 300 * 30

    def test_collate_fn_and_crs_res_setters(self, utm_scene, mosaic_pair):
        from pipekit.geo import merge_samples

        a = RasterDataset(mosaic_pair["root"] / "a.tif")
        b = RasterDataset(mosaic_pair["root"] / "b.tif")
        q = box(90, 30, 120, 40)
        # TorchGeo's default for a union: the pixelwise maximum of the operands' samples (b's 200 wins)
        maximum = UnionDataset(a, b, collate_fn=merge_samples)[q]["image"][0]
        assert (maximum[:, 10:] == 200).all() and (maximum[:, :10] == 100).all()
        first_valid = (a | b)[q]["image"][0]
        assert (first_valid[:10, :110] == 100).all()
        pairs = IntersectionDataset(RasterDataset(utm_scene["root"]), Mask(mosaic_pair["root"]),
                                    collate_fn=lambda samples: {"parts": [sorted(s) for s in samples]})
        assert pairs[box(10, 10, 8, 8)]["parts"] == [["bounds", "crs", "image", "transform"],
                                                     ["bounds", "crs", "mask", "transform"]]
        union = a | b
        union.res = 60
        assert union.res == (60.0, 60.0) and union.datasets[0].res == (60.0, 60.0)
        assert union[q]["image"].shape == (1, 20, 60)
        union.crs = ALBERS
        assert union.crs == CRS.from_string(ALBERS) and union.datasets[1].crs == CRS.from_string(ALBERS)
        assert a.crs == CRS.from_string(UTM15)  # the operands themselves are left as they are


class TestIndexFrame:
    """TorchGeo 0.8: dataset.index is a GeoDataFrame (geometry, filepath, IntervalIndex 'datetime', .crs)."""

    @pytest.fixture
    def two_dates(self, utm_scene, tmp_path, rasters):
        root = tmp_path / "dates"
        t = Affine(30.0, 0.0, X0, 0.0, -30.0, Y0)
        rasters.write_tif(root / "scene_20210701.tif", rasters.pattern(100, 100, 3), UTM15, t)
        rasters.write_tif(root / "scene_20220701.tif", rasters.pattern(100, 100, 3, seed=2), UTM15,
                          Affine(30.0, 0.0, X0 + 3000, 0.0, -30.0, Y0))
        return Dated(root)

    def test_layout(self, two_dates):
        import geopandas

        frame = two_dates.index
        assert isinstance(frame, geopandas.GeoDataFrame)
        assert list(frame.columns) == ["filepath", "geometry"]
        assert [os.path.basename(p) for p in frame.filepath] == ["scene_20210701.tif", "scene_20220701.tif"]
        assert isinstance(frame.index, pd.IntervalIndex) and frame.index.name == "datetime"
        assert frame.index.closed == "both"
        assert frame.index[0].left == pd.Timestamp(2021, 7, 1)
        assert frame.index[1].right == pd.Timestamp(2022, 7, 1, 23, 59, 59, 999999)
        assert frame.crs.to_epsg() == 32615
        assert frame.geometry.iloc[0].bounds == (X0, Y0 - 3000, X0 + 3000, Y0)
        assert frame.total_bounds.tolist() == [X0, Y0 - 3000, X0 + 6000, Y0]
        assert two_dates.index is frame  # built once, kept while the GeoIndex is the same
        assert len(frame) == len(two_dates) == len(two_dates.geo_index)

    def test_filtered_index_assigned_back_restricts_reads_and_samplers(self, two_dates):
        from pipekit.geo import GridGeoSampler

        later = two_dates.index[two_dates.index.index.left >= pd.Timestamp(2022, 1, 1)]
        two_dates.index = later
        assert len(two_dates) == 1 and two_dates.files[0].endswith("scene_20220701.tif")
        assert two_dates.bounds[0].start == X0 + 3000
        with pytest.raises(IndexError):
            two_dates[box(0, 0, 8, 8)]  # the 2021 scene is no longer part of the dataset
        assert two_dates[box(100, 0, 8, 8)]["image"].shape == (3, 8, 8)
        assert len(GridGeoSampler(two_dates, size=50)) == 4
        two_dates.crs = ALBERS  # rebuilding the index keeps the filter
        assert len(two_dates) == 1 and two_dates.index.crs.to_epsg() == 5070
        with pytest.raises(ValueError, match="filepath"):
            two_dates.index = later.assign(filepath="elsewhere.tif")

    def test_compositions(self, two_dates, utm_scene, mosaic_pair):
        mask = Mask(mosaic_pair["root"])
        both = RasterDataset(utm_scene["root"]) & mask
        frame = both.index
        assert list(frame.columns) == ["filepath_1", "filepath_2", "geometry"]
        assert len(frame) == len(both) == 2  # the scene meets a.tif and b.tif
        assert {os.path.basename(p) for p in frame.filepath_2} == {"a.tif", "b.tif"}
        assert isinstance(frame.index, pd.IntervalIndex)
        union = RasterDataset(mosaic_pair["root"] / "a.tif") | RasterDataset(mosaic_pair["root"] / "b.tif")
        assert list(union.index.columns) == ["filepath", "geometry"] and len(union.index) == 2
        only_a = union.index.iloc[:1]
        union.index = only_a
        assert len(union) == 1 and union.bounds[0].stop == X0 + 200 * 30

    def test_not_pickled_to_workers(self, two_dates):
        assert len(two_dates.index) == 2  # builds the GeoDataFrame
        clone = pickle.loads(pickle.dumps(two_dates))
        assert "_frame_cache" not in clone.__dict__
        assert clone.index.equals(two_dates.index)


class TestDtypes:
    """TorchGeo 0.8: float32 images, int64 masks, following is_image even when set after construction."""

    def test_defaults_follow_is_image(self, utm_scene):
        ds = RasterDataset(utm_scene["root"])
        assert ds.dtype == torch.float32 and ds.resampling == Resampling.bilinear
        ds.is_image = False  # the Earth Surface Water tutorial's "IMPORTANT" line
        assert ds.dtype == torch.int64 and ds.resampling == Resampling.nearest
        sample = ds[box(0, 0, 8, 8)]
        assert "image" not in sample and sample["mask"].dtype == torch.int64
        assert sample["mask"].shape == (3, 8, 8)  # three bands stay a [C, H, W] mask, as in TorchGeo

    def test_is_image_set_after_construction_inside_an_intersection(self, utm_scene, mosaic_pair):
        images = RasterDataset(utm_scene["root"])
        masks = RasterDataset(mosaic_pair["root"])
        masks.is_image = False
        sample = (images & masks)[box(10, 10, 16, 8)]
        assert sample["image"].dtype == torch.float32 and sample["image"].shape == (3, 8, 16)
        assert sample["mask"].dtype == torch.int64 and sample["mask"].shape == (8, 16)

    def test_mask_reprojected_with_nearest_when_is_image_is_set_later(self, tmp_path, rasters):
        yy, xx = np.mgrid[0:120, 0:120]
        checker = np.where((yy // 8 + xx // 8) % 2 == 0, 10, 50).astype(np.uint8)[None]
        rasters.write_tif(tmp_path / "labels.tif", checker, UTM15, Affine(30.0, 0.0, X0, 0.0, -30.0, Y0))
        masks = RasterDataset(tmp_path, crs=ALBERS)
        masks.is_image = False
        b = masks._extent()
        q = BoundingBox(b.minx + 900, b.minx + 900 + 64 * masks.res[0], b.maxy - 900 - 64 * masks.res[1], b.maxy - 900)
        values = set(np.unique(masks[q]["mask"].numpy()).tolist())
        assert values == {10, 50}  # nearest: no blend of 10 and 50 at the squares' edges

    def test_native_keeps_the_files_type(self, utm_scene, mosaic_pair):
        ds = RasterDataset(utm_scene["root"], dtype="native")
        image = ds[box(0, 0, 8, 8)]["image"]
        assert image.dtype == torch.uint16 and ds.dtype == torch.uint16 and ds.native_dtype
        np.testing.assert_array_equal(image.numpy(), utm_scene["array"][:, :8, :8])
        assert ds.resampling == Resampling.bilinear
        mask = Mask(mosaic_pair["root"], dtype="native")
        assert mask[box(0, 0, 8, 8)]["mask"].dtype == torch.uint16 and mask.resampling == Resampling.nearest
        with pytest.raises(TypeError, match="native"):
            RasterDataset(utm_scene["root"], dtype="uint16")

    def test_native_samples_feed_the_device_path_to_the_same_numbers(self, utm_scene, mosaic_pair):
        """dtype="native": uint16 through stack_samples and to_device (the GPU path) equals the float32 path."""
        from pipekit.device import to_device
        from pipekit.geo import stack_samples

        images = RasterDataset(utm_scene["root"], dtype="native")
        labels = Mask(mosaic_pair["root"], dtype="native")
        floats = RasterDataset(utm_scene["root"]) & Mask(mosaic_pair["root"])
        queries = [box(10, 10, 16, 16), box(40, 20, 16, 16)]
        native = stack_samples([(images & labels)[q] for q in queries])
        assert native["image"].dtype == torch.uint16 and native["mask"].dtype == torch.uint16
        assert native["image"].element_size() * 2 == stack_samples([floats[q] for q in queries])["image"].element_size()
        out = to_device(native, "cpu", scale=10000.0, mask_dtype=torch.long)
        reference = stack_samples([floats[q] for q in queries])
        torch.testing.assert_close(out["image"], reference["image"] / 10000.0)
        assert torch.equal(out["mask"], reference["mask"])

    def test_explicit_dtype_and_resampling(self, utm_scene):
        # TorchGeo picks the resampling from the dtype: a float mask (pixelwise regression) is read bilinear
        regression = Mask(utm_scene["root"], dtype=torch.float32)
        assert regression.resampling == Resampling.bilinear
        assert regression[box(0, 0, 8, 8)]["mask"].dtype == torch.float32
        forced = Mask(utm_scene["root"], dtype=torch.float32, resampling="nearest")
        assert forced.resampling == Resampling.nearest

        class Float64Product(RasterDataset):  # a TorchGeo-style override of the dtype property
            @property
            def dtype(self) -> torch.dtype:
                return torch.float64

        assert Float64Product(utm_scene["root"])[box(0, 0, 4, 4)]["image"].dtype == torch.float64
