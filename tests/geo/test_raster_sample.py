"""How a raster dataset assembles a sample: an entry's files, remembered per dataset."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from affine import Affine

from pipekit.geo import BoundingBox, RasterDataset

X0, Y0 = 399_990.0, 4_650_030.0


class Scene(RasterDataset):
    """One file per band: ``scene_20230715_B1.tif``, ``..._B2.tif``, ``..._B3.tif``."""

    filename_glob = "scene_*_{}.tif"
    filename_regex = r"^scene_(?P<date>\d{8})_(?P<band>B\d)"
    date_format = "%Y%m%d"
    separate_files = True
    all_bands = ("B1", "B2", "B3")


@pytest.fixture(scope="module")
def scene(tmp_path_factory, rasters) -> Path:
    root = tmp_path_factory.mktemp("scene")
    for k, band in enumerate(Scene.all_bands):
        array = np.full((1, 40, 40), 100 * (k + 1), dtype=np.uint16)
        rasters.write_tif(root / f"scene_20230715_{band}.tif", array, rasters.UTM15,
                          Affine(30.0, 0, X0, 0, -30.0, Y0))
    return root


def test_band_files_are_those_of_the_bands_as_they_are_now(scene: Path) -> None:
    ds = Scene(scene, bands=["B1", "B3"])
    box = BoundingBox(X0, X0 + 300, Y0 - 300, Y0, 0, 2e9)
    assert ds[box]["image"][:, 0, 0].tolist() == [100.0, 300.0]
    assert ds[box]["image"][:, 0, 0].tolist() == [100.0, 300.0]  # the entry's files remembered: the same
    ds.bands[1] = "B2"  # changed in place: the files read follow
    assert ds[box]["image"][:, 0, 0].tolist() == [100.0, 200.0]
    ds.bands = ["B3", "B1"]
    assert torch.equal(ds[box]["image"][:, 0, 0], torch.tensor([300.0, 100.0]))
