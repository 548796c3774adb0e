"""The fast GeoTIFF header path gives exactly rasterio's answer, or leaves the file to rasterio."""

from __future__ import annotations

import math
import shutil
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rasterio
from affine import Affine
from rasterio.control import GroundControlPoint
from rasterio.crs import CRS

from pipekit.errors import ReadError
from pipekit.geo import _tiff_header as tiff_header
from pipekit.geo._tiff_header import FastHeaderReader, parse_tiff_tags
from pipekit.geo.catalog._headers import RasterHeader, read_header
from pipekit.geo.io import RasterOpener

OPENER = RasterOpener()

# a user CRS with no EPSG code (GDAL writes it as user-defined GeoKeys)
USER_CRS = "+proj=aea +lat_0=23 +lon_0=-96 +lat_1=29.5 +lat_2=45.5 +x_0=1000 +y_0=0 +ellps=GRS80 +units=m +no_defs"


def truth(path: str | Path) -> RasterHeader:
    return read_header(OPENER, str(path))


def assert_same(fast: RasterHeader, expected: RasterHeader) -> None:
    """Every field an index uses, bit for bit (NaN nodata equal to NaN)."""
    assert fast.crs == expected.crs
    assert fast.crs.to_wkt() == expected.crs.to_wkt()
    assert tuple(fast.transform) == tuple(expected.transform)
    assert tuple(fast.bounds) == tuple(expected.bounds)
    assert fast.res == expected.res
    assert (fast.width, fast.height, fast.count, fast.dtype) == (
        expected.width,
        expected.height,
        expected.count,
        expected.dtype,
    )
    if expected.nodata is None or fast.nodata is None:
        assert fast.nodata is expected.nodata
    else:
        assert fast.nodata == expected.nodata or (math.isnan(fast.nodata) and math.isnan(expected.nodata))
    assert fast.index_error("t") is None and expected.index_error("t") is None


def read_twice(path: str | Path) -> tuple[FastHeaderReader, RasterHeader]:
    """A fresh reader reads ``path`` twice: the first is checked against rasterio, the second is fast."""
    reader = FastHeaderReader(truth)
    reader(str(path))
    header = reader(str(path))
    return reader, header


def write(
    path: Path,
    *,
    crs: Any = "EPSG:32615",
    transform: Affine | None = None,
    dtype: str = "uint16",
    count: int = 1,
    height: int = 37,
    width: int = 53,
    nodata: float | None = None,
    point: bool = False,
    **profile: Any,
) -> Path:
    transform = transform or Affine(30.0, 0.0, 399_990.0, 0.0, -30.0, 4_650_030.0)
    path.parent.mkdir(parents=True, exist_ok=True)
    with rasterio.open(
        path,
        "w",
        driver="GTiff",
        width=width,
        height=height,
        count=count,
        dtype=dtype,
        crs=CRS.from_user_input(crs) if crs is not None else None,
        transform=transform,
        nodata=nodata,
        **profile,
    ) as dst:
        if point:  # GDAL writes GTRasterTypeGeoKey = PixelIsPoint
            dst.update_tags(AREA_OR_POINT="Point")
        dst.write(np.ones((count, height, width), dtype=dtype))
    return path


CASES: dict[str, dict[str, Any]] = {
    "utm striped uint16": {},
    "utm tiled deflate nodata 0": {
        "tiled": True,
        "blockxsize": 16,
        "blockysize": 16,
        "compress": "deflate",
        "nodata": 0,
    },
    "epsg4326 float32 nan": {
        "crs": "EPSG:4326",
        "dtype": "float32",
        "nodata": float("nan"),
        "transform": Affine(0.001, 0, -93.5, 0, -0.001, 42.1),
    },
    "epsg4326 float32 -max": {
        "crs": "EPSG:4326",
        "dtype": "float32",
        "nodata": -3.4028234663852886e38,
        "transform": Affine(0.25, 0, -180, 0, -0.25, 90),
    },
    "web mercator 3 bands lzw": {
        "crs": "EPSG:3857",
        "count": 3,
        "dtype": "uint8",
        "compress": "lzw",
        "transform": Affine(152.87, 0, -10_400_000.5, 0, -152.87, 5_200_000.25),
    },
    "albers conus (CDL) uint8 nodata 255": {
        "crs": "EPSG:5070",
        "dtype": "uint8",
        "nodata": 255,
        "transform": Affine(30, 0, -12_345.0, 0, -30, 2_012_345.0),
    },
    "band interleaved int16 -9999": {"count": 4, "dtype": "int16", "interleave": "band", "nodata": -9999},
    "bigtiff float64": {"BIGTIFF": "YES", "dtype": "float64", "nodata": 1e20},
    "bigtiff tiled zstd": {
        "BIGTIFF": "YES",
        "tiled": True,
        "blockxsize": 16,
        "blockysize": 16,
        "compress": "zstd",
        "count": 2,
    },
    "big endian int32": {"ENDIANNESS": "BIG", "dtype": "int32", "nodata": -1},
    "uint32": {"dtype": "uint32"},
    "int64 nodata": {"dtype": "int64", "nodata": -5},
    "uint64": {"dtype": "uint64"},
    "jpeg ycbcr": {
        "dtype": "uint8",
        "count": 3,
        "compress": "jpeg",
        "photometric": "ycbcr",
        "tiled": True,
        "blockxsize": 16,
        "blockysize": 16,
        "height": 64,
        "width": 64,
    },
    "pixel is point": {"point": True},
    "pixel is point, geographic": {"point": True, "crs": "EPSG:4326", "transform": Affine(0.1, 0, -93, 0, -0.1, 42)},
    "user crs (no EPSG code)": {"crs": USER_CRS},
    "fractional pixel": {"transform": Affine(0.3, 0, 123.456789, 0, -0.7, 987.654321), "crs": "EPSG:32633"},
    "big raster header": {
        "height": 5000,
        "width": 3000,
        "tiled": True,
        "blockxsize": 256,
        "blockysize": 256,
        "sparse_ok": True,
    },
}


@pytest.mark.parametrize("case", list(CASES))
def test_fast_path_equals_rasterio(tmp_path: Path, case: str) -> None:
    options = dict(CASES[case])
    path = write(tmp_path / "a.tif", **options)
    reader, header = read_twice(path)
    assert (reader.fast, reader.slow) == (1, 1), f"{case}: the second read should be parsed directly"
    assert_same(header, truth(path))


def test_many_files_of_one_kind_are_checked_once(tmp_path: Path) -> None:
    paths = [
        write(
            tmp_path / f"t{i}.tif",
            transform=Affine(10, 0, 500_000 + 70.5 * i, 0, -10, 4e6 - 3.25 * i),
            width=7 + i,
            height=5 + 2 * i,
            nodata=1 if i % 2 else None,
        )
        for i in range(12)
    ]
    reader = FastHeaderReader(truth)
    headers = [reader(str(p)) for p in paths]
    assert (reader.fast, reader.slow) == (10, 2)  # rasterio reads the first file of each kind (nodata or not)
    for path, header in zip(paths, headers):
        assert_same(header, truth(path))


def test_real_files(data_dir: Path, tmp_path: Path) -> None:
    """The CC0 rasters in tests/data (Landsat 7 derived RGB, Web Mercator, a COG with overviews)."""
    for name in ("RGB.byte.tif", "rgb1_fake_nir_epsg3857.tif", "cogeo.tif", "corrupt.tif"):
        path = shutil.copy(data_dir / name, tmp_path / name)
        reader, header = read_twice(path)
        assert reader.fast == 1, name
        assert_same(header, truth(path))


def test_raster_without_crs_goes_to_rasterio(data_dir: Path, tmp_path: Path) -> None:
    path = shutil.copy(data_dir / "float_nan.tif", tmp_path / "float_nan.tif")
    reader, header = read_twice(path)
    assert reader.fast == 0
    assert header.crs is None and header.index_error("t") is not None


@pytest.mark.parametrize("case", ["rotated", "gcps", "aux.xml nodata", "png", "not a raster", "south up"])
def test_what_the_fast_path_declines(tmp_path: Path, case: str) -> None:
    path = tmp_path / "a.tif"
    if case == "rotated":
        write(path, transform=Affine.rotation(20) @ Affine(10, 0, 500_000, 0, -10, 4e6))
    elif case == "gcps":
        gcps = [
            GroundControlPoint(0, 0, 500_000, 4e6),
            GroundControlPoint(0, 50, 500_500, 4e6),
            GroundControlPoint(30, 0, 500_000, 4e6 - 300),
        ]
        write(path, crs=None, transform=Affine.identity())
        with rasterio.open(path, "r+") as dst:
            dst.gcps = (gcps, CRS.from_epsg(32615))
    elif case == "aux.xml nodata":
        write(path, nodata=7)
        (tmp_path / "a.tif.aux.xml").write_text(
            '<PAMDataset><PAMRasterBand band="1"><NoDataValue>42</NoDataValue></PAMRasterBand></PAMDataset>'
        )
    elif case == "png":
        path = tmp_path / "a.png"
        with rasterio.open(
            path,
            "w",
            driver="PNG",
            width=4,
            height=4,
            count=1,
            dtype="uint8",
            crs="EPSG:32615",
            transform=Affine(10, 0, 500_000, 0, -10, 4e6),
        ) as dst:
            dst.write(np.ones((1, 4, 4), dtype="uint8"))
    elif case == "not a raster":
        path.write_bytes(b"II*\x00" + b"\xff" * 12)
    elif case == "south up":
        write(path, transform=Affine(10, 0, 500_000, 0, 10, 4e6))
    reader = FastHeaderReader(truth)
    if case == "not a raster":
        with pytest.raises(ReadError, match=r"a\.tif"):
            reader(str(path))
        assert reader.fast == 0
        return
    reader(str(path))
    header = reader(str(path))
    assert reader.fast == 0, case
    expected = truth(path)
    assert tuple(header.transform) == tuple(expected.transform) and header.crs == expected.crs
    assert header.nodata == expected.nodata
    if case == "aux.xml nodata":
        assert header.nodata == 42


def test_a_kind_whose_fast_answer_differs_is_read_by_rasterio(tmp_path: Path, monkeypatch) -> None:
    """The safety net: a parser bug shows up on the first file of a kind, and rasterio answers for all of them."""
    paths = [write(tmp_path / f"t{i}.tif", transform=Affine(10, 0, 500_000 + 100 * i, 0, -10, 4e6)) for i in range(4)]
    real = tiff_header._transform
    monkeypatch.setattr(tiff_header, "_transform", lambda tags: (lambda a, c, e, f: (a, c + 1.0, e, f))(*real(tags)))
    reader = FastHeaderReader(truth)
    headers = [reader(str(p)) for p in paths]
    assert (reader.fast, reader.slow) == (0, 4)
    for path, header in zip(paths, headers):
        assert_same(header, truth(path))


def test_gdal_options_that_change_headers_turn_it_off(tmp_path: Path) -> None:
    path = write(tmp_path / "a.tif", point=True)
    with rasterio.Env(GTIFF_POINT_GEO_IGNORE="YES"):
        reader = FastHeaderReader(truth)
        reader(str(path))
        header = reader(str(path))
        assert not reader.enabled and reader.fast == 0
        assert tuple(header.transform) == tuple(truth(path).transform)


def test_missing_file_is_rasterios_error(tmp_path: Path) -> None:
    reader = FastHeaderReader(lambda p: read_header(OPENER, p, "ds"))
    with pytest.raises(ReadError, match="no such file"):
        reader(str(tmp_path / "missing.tif"))


def test_parse_tiff_tags_big_endian_and_out_of_line_values() -> None:
    # a classic big-endian TIFF: width 5 (SHORT, inline), pixel scale (3 DOUBLEs, out of line)
    scale = struct.pack(">3d", 2.0, 3.0, 0.0)
    entries = struct.pack(">HHIHH", 256, 3, 1, 5, 0) + struct.pack(">HHII", 33550, 12, 3, 8 + 2 + 24 + 4)
    data = b"MM\x00*" + struct.pack(">I", 8) + struct.pack(">H", 2) + entries + b"\x00" * 4 + scale
    tags = parse_tiff_tags(lambda offset, size: data[offset : offset + size], data[:20])
    assert tags[256] == (5,)
    assert tags[33550] == (2.0, 3.0, 0.0)


def test_index_build_equals_rasterio_only(tmp_path: Path, monkeypatch) -> None:
    """A RasterDataset over mixed files indexes the same files and boxes with the fast path and without it."""
    from pipekit.datasets import RasterDataset

    for i in range(6):
        write(tmp_path / f"u{i}.tif", transform=Affine(30, 0, 399_990 + 900 * i, 0, -30, 4_650_030), nodata=0)
    write(tmp_path / "r.tif", transform=Affine.rotation(10) @ Affine(30, 0, 399_990, 0, -30, 4_650_030), nodata=0)
    write(tmp_path / "w.tif", crs="EPSG:4326", transform=Affine(0.0003, 0, -93.5, 0, -0.0003, 42.0), nodata=0)
    fast = RasterDataset(tmp_path)
    monkeypatch.setattr(tiff_header, "_gdal_options_set", lambda: True)
    slow = RasterDataset(tmp_path)
    assert fast.files == slow.files
    assert fast.crs == slow.crs and fast.res == slow.res
    assert np.array_equal(fast.geo_index.bounds, slow.geo_index.bounds)


def test_environment_switch_turns_it_off(tmp_path: Path, monkeypatch) -> None:
    path = write(tmp_path / "a.tif")
    monkeypatch.setenv("PIPEKIT_FAST_HEADERS", "0")
    reader, header = read_twice(path)
    assert not reader.enabled and (reader.fast, reader.slow) == (0, 2)
    assert_same(header, truth(path))


@pytest.mark.parametrize("point", [False, True])
def test_tiepoint_away_from_the_corner(tmp_path: Path, point: bool) -> None:
    """A tiepoint at raster (I, J) != (0, 0) (GDAL writes (0, 0); other writers do not): GDAL's arithmetic."""
    path = write(tmp_path / "a.tif", transform=Affine(30, 0, 500_000, 0, -30, 4e6), point=point)
    data = path.read_bytes()
    tie = parse_tiff_tags(lambda offset, size: data[offset : offset + size], data)[33922]
    assert len(tie) == 6
    old = struct.pack("<6d", *tie)
    assert data.count(old) == 1
    path.write_bytes(data.replace(old, struct.pack("<6d", 2.5, 7.0, 0.0, 600_123.25, 3_999_000.5, 0.0)))
    reader, header = read_twice(path)
    assert reader.fast == 1
    assert_same(header, truth(path))
    assert header.transform.c == 600_123.25 - 2.5 * 30 - (15 if point else 0)
