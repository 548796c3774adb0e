"""Landsat 7/8/9 Collection 2 Level-2: real product names, one GeoTIFF per band, scenes in UTM zones."""

from __future__ import annotations

import pickle
from datetime import date, datetime, timezone
from pathlib import Path

import numpy as np
import pytest
import rasterio
import torch
from affine import Affine
from rasterio.warp import transform_bounds
from torch.utils.data import DataLoader

from pipekit import datasets
from pipekit.datasets import CDL, Landsat7, Landsat8, Landsat9
from pipekit.errors import ReadError
from pipekit.geo import BoundingBox, RandomGeoSampler, stack_samples
from pipekit.geo._composition import IntersectionDataset, UnionDataset

X0, Y0 = 399_990.0, 4_650_030.0  # UTM 15N, Iowa
SIZE = 240


def write(path: Path, array: np.ndarray, crs: str, transform: Affine, nodata: float | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with rasterio.open(path, "w", driver="GTiff", width=array.shape[-1], height=array.shape[-2], count=1,
                       dtype=array.dtype.name, crs=crs, transform=transform, nodata=nodata, tiled=True,
                       blockxsize=128, blockysize=128, compress="deflate") as f:
        f.write(array, 1)
    return path


def band_values(band: str, size: int = SIZE, seed: int = 0) -> np.ndarray:
    """A band's pixels: 1000 x its position in the name list + a gradient, so bands are told apart."""
    code = {"SR_B1": 1, "SR_B2": 2, "SR_B3": 3, "SR_B4": 4, "SR_B5": 5, "SR_B6": 6, "SR_B7": 7,
            "ST_B10": 10, "ST_B6": 11, "QA_PIXEL": 12}[band]
    yy, xx = np.mgrid[0:size, 0:size]
    return (code * 1000 + (xx + 2 * yy + seed) % 500 + 1).astype(np.uint16)


def write_scene(root: Path, product: str, bands: list[str], crs: str, transform: Affine, seed: int = 0) -> None:
    for band in bands:
        write(root / product / f"{product}_{band}.TIF", band_values(band, seed=seed), crs, transform, nodata=0)
    (root / product / f"{product}_MTL.txt").write_text("GROUP = LANDSAT_METADATA_FILE\n")


L8_BANDS = list(Landsat8.all_bands)
L7_BANDS = list(Landsat7.all_bands)


@pytest.fixture(scope="module")
def landsat(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("landsat")
    t = Affine(30.0, 0.0, X0, 0.0, -30.0, Y0)
    write_scene(root / "l8", "LC08_L2SP_026031_20210701_20210708_02_T1", L8_BANDS, "EPSG:32615", t)
    shifted = Affine(30.0, 0.0, X0 + 120 * 30, 0.0, -30.0, Y0 - 40 * 30)
    write_scene(root / "l8", "LC08_L2SP_025031_20210717_20210729_02_T1", L8_BANDS, "EPSG:32615", shifted, seed=7)
    write_scene(root / "l9", "LC09_L2SP_026031_20220610_20220612_02_T1", L8_BANDS, "EPSG:32615", t)
    # Landsat 7 in the neighbouring UTM zone (14N) over the same place
    left, bottom, right, top = transform_bounds("EPSG:32615", "EPSG:32614", X0, Y0 - SIZE * 30, X0 + SIZE * 30, Y0)
    t7 = Affine(30.0, 0.0, round(left / 30) * 30 - 600, 0.0, -30.0, round(top / 30) * 30)
    write_scene(root / "l7", "LE07_L2SP_027031_20210709_20210804_02_T1", L7_BANDS, "EPSG:32614", t7)
    # CDL in CONUS Albers covering the Landsat 8 scenes, two years
    left, bottom, right, top = transform_bounds("EPSG:32615", "EPSG:5070", X0 - 3000, Y0 - 330 * 30,
                                                X0 + 400 * 30, Y0 + 3000)
    width, height = int((right - left) // 30) + 1, int((top - bottom) // 30) + 1
    tc = Affine(30.0, 0.0, left, 0.0, -30.0, top)
    classes = np.array([1, 5, 24, 36, 111, 121, 176], dtype=np.uint8)
    yy, xx = np.mgrid[0:height, 0:width]
    cdl = classes[((xx // 37) + (yy // 29)) % len(classes)]
    write(root / "cdl" / "2021_30m_cdls.tif", cdl, "EPSG:5070", tc, nodata=0)
    write(root / "cdl" / "2022_30m_cdls.tif", np.roll(cdl, 5, axis=1), "EPSG:5070", tc, nodata=0)
    return {"root": root, "l8": root / "l8", "l9": root / "l9", "l7": root / "l7", "cdl": root / "cdl"}


def utm_box(col: int, row: int, size: int) -> BoundingBox:
    return BoundingBox(X0 + col * 30, X0 + (col + size) * 30, Y0 - (row + size) * 30, Y0 - row * 30)


class TestLandsat8:
    def test_band_lists(self):
        assert Landsat8.all_bands[0] == "SR_B1"
        assert Landsat8.all_bands[1:-2] == ("SR_B2", "SR_B3", "SR_B4", "SR_B5", "SR_B6", "SR_B7")
        assert Landsat8.all_bands[-2:] == ("ST_B10", "QA_PIXEL")
        assert Landsat8.rgb_bands == ("SR_B4", "SR_B3", "SR_B2")
        assert Landsat9.all_bands == Landsat8.all_bands
        assert Landsat7.default_bands == ("SR_B1", "SR_B2", "SR_B3", "SR_B4", "SR_B5", "SR_B7")

    def test_scenes_dates_and_separate_band_files(self, landsat):
        ds = Landsat8(landsat["l8"])
        assert len(ds) == 2
        assert [Path(f).name for f in ds.files] == [
            "LC08_L2SP_025031_20210717_20210729_02_T1_SR_B1.TIF",
            "LC08_L2SP_026031_20210701_20210708_02_T1_SR_B1.TIF",
        ]
        times = sorted(ds.geo_index.bounds[:, 4].tolist())
        assert times[0] == datetime(2021, 7, 1, tzinfo=timezone.utc).timestamp()  # acquisition, not processing
        sample = ds[utm_box(10, 10, 64)]
        image = sample["image"]
        assert image.shape == (7, 64, 64) and image.dtype == torch.float32
        for k, band in enumerate(Landsat8.default_bands):
            np.testing.assert_array_equal(image[k].numpy(), band_values(band)[10:74, 10:74])

    def test_band_subset(self, landsat):
        ds = Landsat8(landsat["l8"], bands=Landsat8.all_bands[1:-2])
        image = ds[utm_box(0, 0, 32)]["image"]
        assert image.shape == (6, 32, 32)
        np.testing.assert_array_equal(image[0].numpy(), band_values("SR_B2")[:32, :32])
        qa = Landsat8(landsat["l8"], bands=["QA_PIXEL", "ST_B10"])[utm_box(0, 0, 8)]["image"]
        np.testing.assert_array_equal(qa[0].numpy(), band_values("QA_PIXEL")[:8, :8])
        with pytest.raises(ValueError, match="has no band"):
            Landsat8(landsat["l8"], bands=["SR_B8"])

    def test_overlapping_scenes_mosaic(self, landsat):
        ds = Landsat8(landsat["l8"], bands=["SR_B4"])
        # columns 110..130 cross the left edge of the shifted scene (its col 0 = 120)
        image = ds[utm_box(110, 50, 20)]["image"][0].numpy()
        first = band_values("SR_B4", seed=7)  # the 2021-07-17 scene sorts first: it wins where both are valid
        np.testing.assert_array_equal(image[:, 10:], first[10:30, 0:10])
        np.testing.assert_array_equal(image[:, :10], band_values("SR_B4")[50:70, 110:120])

    def test_missing_band_file_is_reported(self, landsat, tmp_path):
        import shutil

        shutil.copytree(landsat["l8"], tmp_path / "l8")
        missing = next((tmp_path / "l8").rglob("LC08_L2SP_026031_*_SR_B5.TIF"))
        missing.unlink()
        with pytest.raises(ReadError, match=r"cannot find band file '.*_SR_B5\.TIF' in Landsat8: band 'SR_B5'"):
            Landsat8(tmp_path / "l8")
        ds = Landsat8(tmp_path / "l8", on_error="skip")
        assert len(ds) == 1 and ds.skip_log.count == 1
        assert len(Landsat8(tmp_path / "l8", bands=["SR_B4"])) == 2

    def test_bands_of_a_scene_are_warped_together(self, landsat, monkeypatch):
        from rasterio.enums import Resampling
        from rasterio.warp import reproject

        from pipekit.geo import _read as geo_read

        ds = Landsat8(landsat["l8"], crs="EPSG:32614", res=30, bands=["SR_B2", "SR_B3", "SR_B4"])
        calls = []
        original = geo_read.reproject
        monkeypatch.setattr(geo_read, "reproject", lambda *a, **k: calls.append(1) or original(*a, **k))
        scene = sorted(landsat["l8"].rglob("LC08_L2SP_026031_*_SR_B1.TIF"))[0]
        with rasterio.open(scene) as src:
            left, _, _, top = transform_bounds(src.crs, ds.crs, *src.bounds)
        q = BoundingBox(left + 600, left + 600 + 48 * 30, top - 600 - 48 * 30, top - 600)
        image = ds[q]["image"].numpy()
        assert len(calls) == 1  # one warp for the three band files
        grid = ds.grid(q)
        for k, band in enumerate(["SR_B2", "SR_B3", "SR_B4"]):
            expected = np.zeros((48, 48), np.uint16)
            with rasterio.open(str(scene).replace("SR_B1", band)) as src:
                reproject(rasterio.band(src, 1), expected, dst_transform=grid.transform, dst_crs=grid.crs,
                          resampling=Resampling.bilinear, dst_nodata=0)
            assert (image[k] == expected).mean() >= 0.99, band

    def test_unreadable_band_file_is_named(self, landsat, tmp_path):
        import shutil

        shutil.copytree(landsat["l8"], tmp_path / "l8")
        bad = next((tmp_path / "l8").rglob("LC08_L2SP_026031_*_SR_B3.TIF"))
        data = bad.read_bytes()
        bad.write_bytes(data[: len(data) - 4000])  # the last tiles are cut off
        ds = Landsat8(bad.parent, bands=["SR_B2", "SR_B3"])  # that scene alone
        assert ds[utm_box(0, 0, 32)]["image"].shape == (2, 32, 32)  # the first tiles are intact
        with pytest.raises(ReadError, match=r"cannot read raster '.*026031_.*_SR_B3\.TIF' in Landsat8"):
            ds[utm_box(200, 200, 32)]
        warped = Landsat8(bad.parent, bands=["SR_B2", "SR_B3"], crs="EPSG:5070", res=30)
        b = warped.bounds
        with pytest.raises(ReadError, match=r"_SR_B3\.TIF' in Landsat8"):
            warped[BoundingBox(b.minx, b.maxx, b.miny, b.maxy)]

    def test_landsat9_naming(self, landsat):
        ds = Landsat9(landsat["l9"])
        assert len(ds) == 1 and ds.bounds.mint == datetime(2022, 6, 10, tzinfo=timezone.utc).timestamp()
        assert len(Landsat9(landsat["root"])) == 1  # recursive search finds only LC09 files
        assert len(Landsat8(landsat["root"])) == 2

    def test_pickles_small(self, landsat):
        ds = Landsat8(landsat["l8"])
        ds[utm_box(0, 0, 8)]
        data = pickle.dumps(ds)
        assert len(data) < 20_000
        np.testing.assert_array_equal(pickle.loads(data)[utm_box(0, 0, 8)]["image"].numpy(),
                                      ds[utm_box(0, 0, 8)]["image"].numpy())


@pytest.fixture(scope="module")
def full(tmp_path_factory) -> Path:
    """A Landsat 8 and a Landsat 7 scene with every band file of the real products."""
    from pipekit.synthetic.geo import landsat_scene_id, write_landsat_scene

    root = tmp_path_factory.mktemp("c2l2")
    write_landsat_scene(root, landsat_scene_id("LC08", "026031", date(2023, 7, 15)), (X0, Y0), 96)
    write_landsat_scene(root, landsat_scene_id("LE07", "026031", date(2023, 7, 23)), (X0, Y0), 96)
    return root


class TestEveryBandFile:
    """Real Collection 2 scenes carry more band files than all_bands lists: each one can be chosen, as in TorchGeo."""

    def read(self, root: Path, pattern: str) -> np.ndarray:
        with rasterio.open(next(root.rglob(pattern))) as src:
            return src.read(1)

    def test_bands_outside_all_bands(self, full):
        bands = ["SR_B4", "SR_QA_AEROSOL", "QA_RADSAT", "ST_TRAD"]
        image = Landsat8(full, bands=bands)[utm_box(0, 0, 32)]["image"]
        assert image.shape == (4, 32, 32) and image.dtype == torch.float32
        for k, band in enumerate(bands):
            np.testing.assert_array_equal(image[k].numpy(), self.read(full, f"LC08*_{band}.TIF")[:32, :32])
        l7 = Landsat7(full, bands=["SR_B3", "SR_CLOUD_QA", "SR_ATMOS_OPACITY"])[utm_box(0, 0, 16)]["image"]
        np.testing.assert_array_equal(l7[2].numpy(), self.read(full, "LE07*_SR_ATMOS_OPACITY.TIF")[:16, :16])

    def test_bands_of_other_data_types_are_read_whole(self, full):
        # the first band is int16 (ST_QA), the next uint16 reflectance above 32767 where it is bright
        image = Landsat8(full, bands=["ST_QA", "SR_B4", "SR_QA_AEROSOL"], dtype="native")[utm_box(0, 0, 32)]["image"]
        assert image.dtype == torch.int32
        np.testing.assert_array_equal(image[1].numpy(), self.read(full, "LC08*_SR_B4.TIF")[:32, :32])

    def test_a_band_no_file_holds_is_refused(self, full):
        with pytest.raises(ValueError, match=r"has no band\(s\) \['SR_B99'\].*'SR_QA_AEROSOL'"):
            Landsat8(full, bands=["SR_B4", "SR_B99"])
        with pytest.raises(ValueError, match="has no band"):
            Landsat8(full, bands=["SR_B8"])  # in neither all_bands nor the files


class TestLandsat7:
    def test_reflective_default_bands_in_its_own_zone(self, landsat):
        ds = Landsat7(landsat["l7"])
        assert ds.crs.to_epsg() == 32614
        b = ds.bounds
        image = ds[BoundingBox(b.minx, b.minx + 16 * 30, b.maxy - 16 * 30, b.maxy)]["image"]
        assert image.shape == (6, 16, 16)
        np.testing.assert_array_equal(image[5].numpy(), band_values("SR_B7")[:16, :16])

    def test_union_with_landsat8_six_bands_each(self, landsat):
        l7 = Landsat7(landsat["l7"])
        l8 = Landsat8(landsat["l8"], bands=Landsat8.all_bands[1:-2])
        union = l7 | l8
        assert isinstance(union, UnionDataset)
        assert union.crs.to_epsg() == 32614 and len(union) == 3
        in_utm15 = Landsat8(landsat["l8"], bands=Landsat8.all_bands[1:-2]) | l7
        assert in_utm15.crs.to_epsg() == 32615
        sample = in_utm15[utm_box(200, 100, 64)]  # only the shifted Landsat 8 scene has data here... and L7
        assert sample["image"].shape == (6, 64, 64)
        assert (sample["image"] > 0).all()
        with pytest.raises(ValueError, match="different layouts"):
            l7 | Landsat8(landsat["l8"])


class TestWithCDL:
    def test_intersection_in_the_users_example(self, landsat):
        """The issue's example: (Landsat 7 | Landsat 8) & CDL, RandomGeoSampler, stack_samples."""
        landsat7 = datasets.Landsat7(root=str(landsat["l7"]))
        landsat8 = datasets.Landsat8(root=str(landsat["l8"]), bands=datasets.Landsat8.all_bands[1:-2])
        union = landsat7 | landsat8
        cdl = datasets.CDL(root=str(landsat["cdl"]))
        dataset = union & cdl
        assert isinstance(dataset, IntersectionDataset)
        assert dataset.crs == union.crs
        torch.manual_seed(0)  # the sampler draws from torch's global RNG
        sampler = RandomGeoSampler(dataset, size=64, length=8)
        loader = DataLoader(dataset, batch_size=4, sampler=sampler, collate_fn=stack_samples)
        batches = list(loader)
        assert len(batches) == 2
        for batch in batches:
            assert batch["image"].shape == (4, 6, 64, 64) and batch["image"].dtype == torch.float32
            assert batch["mask"].shape == (4, 64, 64) and batch["mask"].dtype == torch.int64
            # TorchGeo's ordinal labels of the codes 1, 5, 24, 36, 111, 121, 176
            assert set(torch.unique(batch["mask"]).tolist()) <= {0, 1, 5, 15, 27, 72, 74, 83}
            assert (batch["mask"] > 0).float().mean() > 0.5

    def test_time_intersection_picks_the_year(self, landsat):
        both = Landsat8(landsat["l8"], bands=["SR_B4"]) & CDL(landsat["cdl"])
        assert len(both) == 2  # each 2021 scene with the 2021 CDL only
        year = datetime(2021, 1, 1, tzinfo=timezone.utc).timestamp()
        assert (both.geo_index.bounds[:, 4] >= year).all()
        spatial = IntersectionDataset(Landsat8(landsat["l8"], bands=["SR_B4"]), CDL(landsat["cdl"]),
                                      spatial_only=True)
        assert len(spatial) == 4

    def test_plot_landsat_and_cdl(self, landsat, tmp_path):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        both = Landsat8(landsat["l8"]) & CDL(landsat["cdl"])
        fig = both.plot(both[utm_box(20, 20, 64)])
        fig.savefig(tmp_path / "landsat.png")
        plt.close(fig)
        assert (tmp_path / "landsat.png").stat().st_size > 1000
        labels = [t.get_text() for t in fig.get_axes()[1].get_legend().get_texts()]
        assert "1: Corn" in labels

    def test_plot_without_the_rgb_bands_raises_naming_them(self, landsat):
        pytest.importorskip("matplotlib")
        # drawing other bands as if they were red, green and blue would mislead: refused, as TorchGeo
        ds = Landsat8(landsat["l8"], bands=["SR_B4", "SR_B5"])
        sample = ds[utm_box(0, 0, 8)]
        with pytest.raises(ValueError, match=r"Landsat8: Dataset does not contain some of the RGB bands "
                                             r"\(missing SR_B3, SR_B2; bands=\['SR_B4', 'SR_B5'\]\)"):
            ds.plot(sample)
        with pytest.raises(ValueError, match="RGB bands"):
            (ds & CDL(landsat["cdl"])).plot(sample)

