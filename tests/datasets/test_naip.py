"""NAIP: 4-band (R, G, B, NIR) quarter quads in UTM (NAD83), sub-metre pixels."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest
import rasterio
from affine import Affine

from pipekit.datasets import NAIP
from pipekit.geo import BoundingBox

X0, Y0 = 450_000.0, 4_680_000.0
RES = 0.6


def write_quad(path: Path, seed: int, x0: float = X0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    xx = np.mgrid[0:300, 0:300][1]
    array = np.stack([(xx + 10 * b + seed) % 200 + 20 for b in range(4)]).astype(np.uint8)
    array[3] = rng.integers(100, 250, (300, 300), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    with rasterio.open(path, "w", driver="GTiff", width=300, height=300, count=4, dtype="uint8",
                       crs="EPSG:26915", transform=Affine(RES, 0, x0, 0, -RES, Y0), tiled=True,
                       blockxsize=128, blockysize=128, compress="deflate", photometric="RGB") as f:
        f.write(array)
    return array


@pytest.fixture(scope="module")
def naip(tmp_path_factory):
    root = tmp_path_factory.mktemp("naip")
    a = write_quad(root / "42093" / "m_4209355_ne_15_060_20210715.tif", 1)
    b = write_quad(root / "42093" / "m_4209355_nw_15_060_20210716_20211020.tif", 2, x0=X0 + 300 * RES)
    (root / "42093" / "m_4209355_ne_15_060_20210715.tif.aux.xml").write_text("<PAMDataset/>")
    return {"root": root, "a": a, "b": b}


def box(col: int, row: int, size: int) -> BoundingBox:
    return BoundingBox(X0 + col * RES, X0 + (col + size) * RES, Y0 - (row + size) * RES, Y0 - row * RES)


class TestNAIP:
    def test_quads_dates_and_bands(self, naip):
        ds = NAIP(naip["root"])
        assert len(ds) == 2 and ds.res == pytest.approx((RES, RES)) and ds.crs.to_epsg() == 26915
        starts = sorted(ds.geo_index.bounds[:, 4].tolist())
        assert starts == [datetime(2021, 7, 15, tzinfo=timezone.utc).timestamp(),
                          datetime(2021, 7, 16, tzinfo=timezone.utc).timestamp()]
        image = ds[box(280, 10, 40)]["image"].numpy()
        assert image.shape == (4, 40, 40)
        np.testing.assert_array_equal(image[:, :, :20], naip["a"][:, 10:50, 280:300])
        np.testing.assert_array_equal(image[:, :, 20:], naip["b"][:, 10:50, 0:20])

    def test_rgb_subset_and_plot(self, naip, tmp_path):
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        nir = NAIP(naip["root"], bands=["NIR"])
        np.testing.assert_array_equal(nir[box(0, 0, 8)]["image"][0].numpy(), naip["a"][3, :8, :8])
        ds = NAIP(naip["root"])
        fig = ds.plot(ds[box(0, 0, 64)])
        fig.savefig(tmp_path / "naip.png")
        plt.close(fig)
        shown = fig.get_axes()[0].get_images()[0].get_array()
        assert shown.shape == (64, 64, 3) and float(shown.min()) == 0.0 and float(shown.max()) == 1.0
