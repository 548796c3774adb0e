"""Fixtures for the ``pipekit`` command's tests: small real corpora of rasters, images and shards."""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rasterio
import rasterio.errors
from rasterio.transform import from_origin

from pipekit.cli import main
from pipekit.synthetic import write_image_folder, write_image_shards
from pipekit.synthetic.geo import write_landsat_cdl_corpus


@pytest.fixture
def cli(capsys) -> Callable[..., tuple[int, str, str]]:
    """Run ``pipekit ARGS`` in this process: ``(exit status, stdout, stderr)``."""

    def run(*argv: Any) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory) -> Path:
    """A one-scene, 256 x 256 Landsat 8 + CDL corpus (the demo's layout), written once."""
    return write_landsat_cdl_corpus(tmp_path_factory.mktemp("corpus") / "landsat-cdl-v1", size=256, scenes=1,
                                    progress=False)


@pytest.fixture
def demo_cache(small_corpus: Path, tmp_path: Path) -> Path:
    """A cache folder already holding the (small) demo corpus."""
    cache = tmp_path / "cache"
    shutil.copytree(small_corpus, cache / small_corpus.name)
    return cache


def _write(path: Path, data: np.ndarray, crs: str | None, transform: Any, nodata: float | None = None,
           **extra: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    count = data.shape[0]
    profile = {"driver": "GTiff", "width": data.shape[2], "height": data.shape[1], "count": count,
               "dtype": str(data.dtype), **extra}
    if crs is not None:
        profile.update(crs=crs, transform=transform)
    if nodata is not None:
        profile["nodata"] = nodata
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", rasterio.errors.NotGeoreferencedWarning)
        with rasterio.open(path, "w", **profile) as dst:
            dst.write(data)


@pytest.fixture(scope="session")
def rasters(tmp_path_factory, small_corpus: Path) -> Path:
    """A folder of rasters of every kind ``inspect`` tells apart, with real product file names."""
    root = tmp_path_factory.mktemp("rasters")
    shutil.copytree(small_corpus / "landsat8", root / "landsat8")
    shutil.copytree(small_corpus / "cdl", root / "cdl")
    rng = np.random.default_rng(0)
    # Sentinel-2 L2A band at 10 m (UTM 15N)
    _write(root / "s2" / "T15TVG_20210701T170859_B04_10m.tif",
           rng.integers(1, 4000, (1, 64, 64), dtype=np.uint16), "EPSG:32615",
           from_origin(500000, 4650000, 10, 10), 0)
    # NAIP: 4 bands, uint8, NAD83 / UTM 15N, 1 m
    _write(root / "naip" / "m_4209055_ne_15_060_20190715.tif",
           rng.integers(0, 255, (4, 80, 60), dtype=np.uint8), "EPSG:26915", from_origin(440000, 4650000, 1, 1),
           tiled=True, blockxsize=16, blockysize=16, compress="deflate")
    # a generic raster in lon/lat
    _write(root / "dem" / "elevation.tif", rng.normal(300, 20, (1, 20, 30)).astype(np.float32), "EPSG:4326",
           from_origin(-94.0, 42.1, 0.01, 0.01))
    # a raster without a CRS
    _write(root / "scan.tif", np.zeros((1, 8, 8), dtype=np.uint8), None, None)
    (root / "notes.txt").write_text("not a raster")
    return root


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory) -> Path:
    """``root/<class>/<image>``: 4 classes of 3 JPEGs (varied sizes), plus a PNG."""
    root = write_image_folder(tmp_path_factory.mktemp("images") / "imgs", per_class=3, size=40, progress=False)
    from PIL import Image

    Image.new("L", (17, 23), 128).save(root / "circle" / "extra.png")
    return root


@pytest.fixture(scope="session")
def shards(tmp_path_factory) -> Path:
    """Two WebDataset shards of 4 ``.jpg`` + ``.cls`` samples each (32 x 32)."""
    root = tmp_path_factory.mktemp("shards")
    write_image_shards(root, shards=2, per_shard=4, size=32, progress=False)
    return root


def s3_options(s3_server: Any) -> list[str]:
    """``-o KEY=VALUE`` arguments for the test S3 server."""
    so = s3_server.storage_options
    return ["-o", f"key={so['key']}", "-o", f"secret={so['secret']}",
            "-o", f"client_kwargs.endpoint_url={so['client_kwargs']['endpoint_url']}",
            "-o", f"client_kwargs.region_name={so['client_kwargs']['region_name']}"]


@pytest.fixture
def s3_args(s3_server: Any) -> list[str]:
    return s3_options(s3_server)
