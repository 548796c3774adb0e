"""The synthetic Landsat 8 + CDL corpus: real product names, CRSs and consistent land cover."""

from __future__ import annotations

import numpy as np
import rasterio

from pipekit.synthetic.geo import CDL_CLASSES, LANDSAT8_BANDS, LandCover, write_landsat_cdl_corpus


def test_corpus_layout_and_georeference(tmp_path):
    root = write_landsat_cdl_corpus(tmp_path / "corpus", size=128, scenes=2, progress=False)
    scenes = sorted(p.name for p in (root / "landsat8").iterdir())
    assert len(scenes) == 2
    assert all(s.startswith("LC08_L2SP_026031_2023") and s.endswith("_02_T1") for s in scenes)
    bands = sorted(p.name.split("_T1_")[1].split(".")[0] for p in (root / "landsat8" / scenes[0]).glob("*.TIF"))
    assert sorted(bands) == sorted(LANDSAT8_BANDS)
    with rasterio.open(root / "landsat8" / scenes[0] / f"{scenes[0]}_SR_B4.TIF") as src:
        assert src.crs.to_epsg() == 32615
        assert src.res == (30.0, 30.0)
        assert src.dtypes[0] == "uint16"
        assert src.profile["tiled"] and src.compression.name.lower() == "deflate"
        red = src.read(1).astype(float) * 2.75e-5 - 0.2
    assert 0.0 < np.median(red) < 0.3  # plausible surface reflectance
    with rasterio.open(root / "cdl" / "2023_30m_cdls.tif") as src:
        assert src.crs.to_epsg() == 5070
        codes = set(np.unique(src.read(1)).tolist()) - {0}
    assert codes <= set(CDL_CLASSES)
    assert len(codes) >= 4


def test_land_cover_is_a_function_of_position():
    cover = LandCover(seed=0)
    y = np.array([4_650_000.0, 4_650_000.0, 4_650_000.0])
    river_x = 450_000.0 + 2500.0 * np.sin(y[2] / 7000.0)
    x = np.array([430_000.0, 430_010.0, river_x])
    a, b = cover.classes(x, y), cover.classes(x, y)
    assert np.array_equal(a, b)
    assert a[2] == 111  # the river runs through x = 450 km
