"""Synthetic data in the real file layouts of TorchGeo's tutorials, at the places the tutorials use.

* ``landsat``: one folder holding a Landsat 7 and a Landsat 8 Collection 2
  Level-2 scene as their USGS tarballs extract (every band file, flat), the
  tutorial's product ids, Landsat 7 in UTM 16N covering the tutorial's query
  (x 925,000..932,680, y 4,470,000..4,477,680), Landsat 8 in UTM 17N over the
  same place; ``cdl``: ``2023_30m_cdls.tif`` in CONUS Albers covering both;
* ``sentinel``: the custom raster dataset tutorial's two Sentinel-2 L2A items
  (tiles T40XDH and T40XEJ in UTM 40N), bands B02, B03, B04, B08 as the
  Planetary Computer names them, 4,200 px (the tutorial samples 4,096 px);
* ``surface_water``: the Earth Surface Water dataset's ``dset-s2`` folders.

Written once per session, in a temporary folder; nothing is downloaded.
"""

from __future__ import annotations

from datetime import date
from pathlib import Path

import matplotlib
import pytest
from pyproj import Transformer

from pipekit.synthetic.geo import (
    landsat_scene_id,
    write_cdl,
    write_landsat_scene,
    write_sentinel2_tile,
    write_surface_water,
)

matplotlib.use("Agg")  # the tutorials call plt.show()

L7_SCENE = "LE07_L2SP_022032_20230725_20230820_02_T1"
L8_SCENE = "LC08_L2SP_023032_20230831_20230911_02_T1"
L7_ORIGIN = (920_985.0, 4_485_015.0)  # UTM 16N; 512 px of 30 m hold the tutorial's 256 px query
SCENE_PX = 512


@pytest.fixture(scope="session")
def tutorial_data(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("torchgeo_tutorials")
    landsat = root / "landsat"
    assert landsat_scene_id("LE07", "022032", date(2023, 7, 25), date(2023, 8, 20)) == L7_SCENE
    write_landsat_scene(landsat, L7_SCENE, L7_ORIGIN, SCENE_PX, crs="EPSG:32616", flat=True)
    # Landsat 8 in the next UTM zone, shifted by a third of a scene
    x, y = Transformer.from_crs("EPSG:32616", "EPSG:32617", always_xy=True).transform(
        L7_ORIGIN[0] + 5000.0, L7_ORIGIN[1] - 5000.0)
    l8_origin = (round(x / 30.0) * 30.0 + 15.0, round(y / 30.0) * 30.0 + 15.0)
    write_landsat_scene(landsat, L8_SCENE, l8_origin, SCENE_PX, crs="EPSG:32617", flat=True, seed=1)
    extent = SCENE_PX * 30.0
    left, top = L7_ORIGIN
    write_cdl(root / "cdl", 2023, (left - 3000, top - extent - 12000, left + extent + 12000, top + 3000),
              bounds_crs="EPSG:32616")
    sentinel = root / "sentinel"
    write_sentinel2_tile(sentinel, "T40XDH", "20220902T090559", (400_020.0, 8_400_000.0), 42_000.0, "EPSG:32640",
                         seed=0)
    write_sentinel2_tile(sentinel, "T40XEJ", "20220718T084609", (500_040.0, 8_500_020.0), 42_000.0, "EPSG:32640",
                         seed=1)
    write_surface_water(root / "surface_water")
    return {"landsat": landsat, "cdl": root / "cdl", "sentinel": sentinel, "surface_water": root / "surface_water"}
