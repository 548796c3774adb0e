"""Sentinel-2: one file per band at 10/20/60 m, Level-1C and Level-2A names, read onto one 10 m grid."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest
import rasterio
from affine import Affine
from rasterio.enums import Resampling
from rasterio.warp import reproject

from pipekit.datasets import Sentinel2
from pipekit.errors import ReadError
from pipekit.geo import BoundingBox

X0, Y0 = 399_960.0, 4_700_040.0  # tile 15TVG starts at a multiple of 60 m
SCENE = "T15TVG_20210701T170859"
SIZE_M = 2400.0  # the fixture tiles are 2.4 km square


def write(path: Path, array: np.ndarray, res: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with rasterio.open(path, "w", driver="GTiff", width=array.shape[1], height=array.shape[0], count=1,
                       dtype="uint16", crs="EPSG:32615", transform=Affine(res, 0, X0, 0, -res, Y0), nodata=0,
                       tiled=True, blockxsize=64, blockysize=64, compress="deflate") as f:
        f.write(array, 1)
    return path


def values(code: int, res: float) -> np.ndarray:
    n = int(SIZE_M / res)
    yy, xx = np.mgrid[0:n, 0:n]
    return (code * 1000 + (3 * xx + 5 * yy) % 700 + 1).astype(np.uint16)


L2A = {"B02": 10, "B03": 10, "B04": 10, "B08": 10, "B05": 20, "B06": 20, "B07": 20, "B8A": 20, "B11": 20,
       "B12": 20, "B01": 60, "B09": 60}


@pytest.fixture(scope="module")
def l2a(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("s2_l2a")
    granule = root / "S2B_MSIL2A_20210701T170859.SAFE" / "GRANULE" / "IMG_DATA"
    for k, (band, res) in enumerate(L2A.items()):
        write(granule / f"R{res}m" / f"{SCENE}_{band}_{res}m.tif", values(k + 1, res), res)
        if res == 10:  # Level-2A also ships the 10 m bands resampled to 20 m and 60 m
            write(granule / f"R{res}m" / f"{SCENE}_{band}_20m.tif", values(90, 20), 20)
    return root


@pytest.fixture(scope="module")
def l1c(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("s2_l1c")
    for k, (band, res) in enumerate({**L2A, "B10": 60}.items()):
        write(root / f"{SCENE}_{band}.tif", values(k + 1, res), res)
    return root


def box(col: int, row: int, size: int, res: float = 10.0) -> BoundingBox:
    return BoundingBox(X0 + col * res, X0 + (col + size) * res, Y0 - (row + size) * res, Y0 - row * res)


class TestSentinel2:
    def test_bands_and_names(self):
        assert Sentinel2.all_bands[8] == "B8A" and len(Sentinel2.all_bands) == 13
        assert "B10" not in Sentinel2.default_bands

    def test_level2a_one_scene_finest_copy_of_each_band(self, l2a):
        ds = Sentinel2(l2a, bands=["B04", "B05", "B01"])
        assert len(ds) == 1 and ds.res == (10.0, 10.0)
        assert ds.files[0].endswith(f"{SCENE}_B04_10m.tif")
        assert ds.bounds.mint == datetime(2021, 7, 1, 17, 8, 59, tzinfo=timezone.utc).timestamp()
        q = box(30, 40, 64)
        image = ds[q]["image"].numpy()
        assert image.shape == (3, 64, 64)
        np.testing.assert_array_equal(image[0], values(3, 10)[40:104, 30:94])  # B04 is the 3rd band written
        grid = ds.grid(q)
        for channel, band, path in ((1, "B05", f"R20m/{SCENE}_B05_20m.tif"), (2, "B01", f"R60m/{SCENE}_B01_60m.tif")):
            expected = np.zeros((64, 64), np.uint16)
            with rasterio.open(next(l2a.rglob(Path(path).name))) as src:
                reproject(rasterio.band(src, 1), expected, dst_transform=grid.transform, dst_crs=grid.crs,
                          resampling=Resampling.bilinear, dst_nodata=0)
            assert (image[channel] == expected).mean() >= 0.99, band

    def test_default_bands_of_level2a(self, l2a):
        ds = Sentinel2(l2a)
        image = ds[box(0, 0, 32)]["image"]
        assert image.shape == (12, 32, 32)
        assert (image > 0).all()

    def test_level1c_names_and_b10(self, l1c):
        ds = Sentinel2(l1c, bands=["B02", "B10"])
        image = ds[box(0, 0, 12)]["image"].numpy()
        np.testing.assert_array_equal(image[0], values(1, 10)[:12, :12])
        assert (image[1] > 12000).all()  # B10 is the 13th band written

    def test_level2a_scene_classification_is_selectable(self, l2a, tmp_path):
        root = tmp_path / "with_scl"
        for path in l2a.rglob("*.tif"):
            target = root / path.relative_to(l2a)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
        scl = np.full((120, 120), 4, dtype=np.uint16)  # 4: vegetation
        write(root / "S2B_MSIL2A_20210701T170859.SAFE" / "GRANULE" / "IMG_DATA" / "R20m" / f"{SCENE}_SCL_20m.tif",
              scl, 20)
        ds = Sentinel2(root, bands=["B04", "SCL"], resampling="nearest")
        image = ds[box(0, 0, 16)]["image"]
        assert image.shape == (2, 16, 16) and (image[1] == 4).all()

    def test_missing_band_is_reported(self, l2a):
        with pytest.raises(ReadError, match=r"cannot find band file '.*B10.*' in Sentinel2: band 'B10'"):
            Sentinel2(l2a, bands=["B02", "B10"])

    def test_res_and_crs_override(self, l2a):
        ds = Sentinel2(l2a, bands=["B02", "B11"], res=20)
        image = ds[box(0, 0, 16, res=20)]["image"].numpy()
        np.testing.assert_array_equal(image[1], values(9, 20)[:16, :16])  # B11 native at 20 m
