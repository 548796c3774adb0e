"""TorchGeo 0.8's split functions and pipekit's, on the same files and seeds: the same splits.

Skipped unless ``torchgeo`` imports (the ``bench`` extra).  Both libraries
draw the same ``torch.randperm``/``torch.randint`` from the generator, so the
same seed assigns the same files, cells and parts.
"""

from __future__ import annotations

import itertools
from datetime import date
from pathlib import Path

import pandas as pd
import pytest
import shapely
import torch

pytest.importorskip("torchgeo", reason="the bench extra (TorchGeo) is not installed")

import torchgeo.datasets

import pipekit.datasets
from pipekit.synthetic.geo import landsat_scene_id, write_landsat_scene

X0, Y0 = 420_000.0, 4_660_000.0
PX = 32
SIDE = 30.0 * PX
BANDS = ["SR_B2", "SR_B3", "SR_B4"]


@pytest.fixture(scope="module")
def scenes(tmp_path_factory) -> Path:
    """Six Landsat 8 scenes on a 3x2 grid of adjacent footprints, on six dates."""
    root = tmp_path_factory.mktemp("split-scenes")
    for k, (i, j) in enumerate(itertools.product(range(3), range(2))):
        scene = landsat_scene_id("LC08", f"0260{31 + k}", date(2023, 5, 1 + 5 * k))
        write_landsat_scene(root, scene, (X0 + i * SIDE, Y0 - j * SIDE), PX, bands=tuple(BANDS), seed=k, flat=True)
    return root


def rows(ds) -> list[tuple]:
    """A split's index as comparable rows: file name, rounded geometry bounds, time interval (to the millisecond).

    The file is the first column (TorchGeo 0.8.1's ``random_grid_cell_assignment``
    loses the column names); times to the millisecond, because TorchGeo's
    ``time_series_split`` also ends every entry of a split but the last one
    microsecond early, where pipekit ends only those that cross into the next split.
    """
    out = []
    paths = ds.index.iloc[:, 0]
    for interval, path, geometry in zip(ds.index.index, paths, ds.index.geometry):
        bounds = tuple(round(v, 3) for v in geometry.bounds)
        times = (pd.Timestamp(interval.left).floor("ms"), pd.Timestamp(interval.right).floor("ms"))
        out.append((Path(path).name, bounds, *times))
    return sorted(out)


def both(scenes):
    return {name: lib.Landsat8(paths=str(scenes), bands=BANDS) for name, lib in
            (("torchgeo", torchgeo.datasets), ("pipekit", pipekit.datasets))}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("fn", ["random_bbox_assignment", "random_bbox_splitting", "random_grid_cell_assignment"])
def test_same_seed_same_split(scenes, fn, seed):
    got = {}
    for name, ds in both(scenes).items():
        split = getattr(torchgeo.datasets if name == "torchgeo" else pipekit.datasets, fn)
        args = {"random_bbox_assignment": ([0.5, 0.3, 0.2],), "random_bbox_splitting": ([0.5, 0.3, 0.2],),
                "random_grid_cell_assignment": ([0.6, 0.4], 3)}[fn]
        got[name] = [rows(s) for s in split(ds, *args, generator=torch.Generator().manual_seed(seed))]
    assert got["pipekit"] == got["torchgeo"]


def test_same_roi_and_time_splits(scenes):
    got = {}
    for name, ds in both(scenes).items():
        lib = torchgeo.datasets if name == "torchgeo" else pipekit.datasets
        cut = X0 + 1.5 * SIDE
        rois = [shapely.box(X0, Y0 - 2 * SIDE, cut, Y0), shapely.box(cut, Y0 - 2 * SIDE, X0 + 3 * SIDE, Y0)]
        _, _, t = ds.bounds
        mid = pd.Timestamp("2023-05-13")
        got[name] = (
            [rows(s) for s in lib.roi_split(ds, rois)],
            [rows(s) for s in lib.time_series_split(ds, [pd.Interval(t.start, mid), pd.Interval(mid, t.stop)])],
        )
    assert got["pipekit"] == got["torchgeo"]
