"""The same TorchGeo 0.8 data-loading code on TorchGeo and on pipekit: same shapes, dtypes, bounds types, labels.

Skipped unless ``torchgeo`` imports (the ``bench`` extra).  Each function
below is written once against a ``datasets`` and a ``samplers`` module, as
user code is, and run with ``torchgeo.datasets``/``torchgeo.samplers`` and
with ``pipekit.datasets``/``pipekit.samplers`` on the tutorials' synthetic
data (``conftest.py``).  Pixel values may differ where the libraries resample
differently (pipekit reprojects labels in one nearest-neighbour step; see the
docs/migration/torchgeo.md's differences), so the checks are the ones a port relies on: sample
keys, shapes and dtypes, the types of bounds, sampler items and indexes, and
the set of labels.
"""

from __future__ import annotations

import pandas as pd
import pytest
import torch

pytest.importorskip("torchgeo", reason="the bench extra (TorchGeo) is not installed")

import torchgeo.datasets
import torchgeo.samplers

import pipekit.datasets
import pipekit.samplers

LIBRARIES = {
    "torchgeo": (torchgeo.datasets, torchgeo.samplers),
    "pipekit": (pipekit.datasets, pipekit.samplers),
}
CLASSES = [0, 1, 5, 24, 111, 122, 141, 176]


def introduction(datasets, samplers, landsat_root, cdl_root):
    """The "Introduction to TorchGeo" tutorial's datasets, queries and samplers."""
    landsat7 = datasets.Landsat7(paths=landsat_root, bands=["SR_B1", "SR_B2", "SR_B3", "SR_B4", "SR_B5", "SR_B7"])
    landsat8 = datasets.Landsat8(paths=landsat_root, bands=["SR_B2", "SR_B3", "SR_B4", "SR_B5", "SR_B6", "SR_B7"])
    cdl = datasets.CDL(paths=cdl_root, classes=CLASSES)
    # as built (TorchGeo's `|` and `&` then move the right operands to the left one's CRS in place)
    singles = [(d.index.copy(), d.bounds, d.res, d.crs) for d in (landsat7, landsat8, cdl)]
    dataset = (landsat7 | landsat8) & cdl
    size = 256
    xmin, ymin = 925000, 4470000
    tmin, tmax = pd.Timestamp(2023, 1, 1), pd.Timestamp(2023, 12, 31)
    samples = [
        dataset[xmin:xmin + size * 30:30, ymin:ymin + size * 30:30],
        dataset[xmin:xmin + size * 30, ymin:ymin + size * 30, tmin:tmax],
    ]
    torch.manual_seed(0)
    random = list(samplers.RandomGeoSampler(dataset, size=64, length=6))
    grid = samplers.GridGeoSampler(dataset, size=size, stride=size)
    samples += [dataset[q] for q in random[:3]]
    return {"singles": singles, "dataset": dataset, "samples": samples, "random": random, "grid": next(iter(grid))}


def custom_raster(datasets, samplers, root):
    """The custom raster dataset tutorial's class (the band written in filename_glob)."""

    class Sentinel2(datasets.RasterDataset):
        filename_glob = "T*_B02_10m.tif"
        filename_regex = r"^.{6}_(?P<date>\d{8}T\d{6})_(?P<band>B0[\d])"
        date_format = "%Y%m%dT%H%M%S"
        is_image = True
        separate_files = True
        all_bands = ("B02", "B03", "B04", "B08")
        rgb_bands = ("B04", "B03", "B02")

    dataset = Sentinel2(root)
    torch.manual_seed(1)
    queries = list(samplers.RandomGeoSampler(dataset, size=128, length=3))
    return {"dataset": dataset, "samples": [dataset[q] for q in queries], "queries": queries}


def surface_water(datasets, samplers, root):
    """The Earth Surface Water tutorial's datasets and sampler (is_image set after construction)."""
    images = datasets.RasterDataset(paths=(root / "tra_scene").as_posix(), crs="epsg:3395", res=10)
    masks = datasets.RasterDataset(paths=(root / "tra_truth").as_posix(), crs="epsg:3395", res=10)
    masks.is_image = False
    dset = images & masks
    torch.manual_seed(0)
    queries = list(samplers.RandomGeoSampler(images, size=128, length=4, units=samplers.Units.PIXELS))
    return {"images": images, "dset": dset, "samples": [dset[q] for q in queries]}


def run(name, function, *args):
    datasets, samplers = LIBRARIES[name]
    return function(datasets, samplers, *args)


def check_sample(ours, theirs):
    assert set(theirs) <= set(ours)  # pipekit adds "transform"
    for key in ("image", "mask"):
        if key in theirs:
            assert ours[key].shape == theirs[key].shape, key
            assert ours[key].dtype == theirs[key].dtype, key
    assert isinstance(ours["bounds"], tuple) and isinstance(theirs["bounds"], tuple)
    # TorchGeo reports the query as given; pipekit fills the parts a partial query left open (x, y and t, always)
    assert [type(s) for s in ours["bounds"]] == [slice] * 3
    assert [type(s) for s in theirs["bounds"]] == [slice] * len(theirs["bounds"])
    assert ours["crs"] == theirs["crs"]


def check_query(ours, theirs):
    assert isinstance(ours, tuple) and isinstance(theirs, tuple) and len(ours) == len(theirs) == 3
    assert all(isinstance(s, slice) for s in ours + theirs)
    assert type(ours[2].start) is type(theirs[2].start) is pd.Timestamp
    assert (ours[0].stop - ours[0].start, ours[1].stop - ours[1].start) == (
        theirs[0].stop - theirs[0].start, theirs[1].stop - theirs[1].start)


def check_index(ours, theirs):
    assert type(ours).__name__ == type(theirs).__name__ == "GeoDataFrame"
    assert list(ours.columns) == list(theirs.columns)
    assert len(ours) == len(theirs)
    assert isinstance(ours.index, pd.IntervalIndex) and isinstance(theirs.index, pd.IntervalIndex)
    assert ours.index.name == theirs.index.name == "datetime" and ours.index.closed == theirs.index.closed
    assert ours.crs == theirs.crs


def test_introduction(tutorial_data):
    args = (tutorial_data["landsat"].as_posix(), tutorial_data["cdl"].as_posix())
    tg, pk = run("torchgeo", introduction, *args), run("pipekit", introduction, *args)
    for (index, bounds, res, crs), (t_index, t_bounds, t_res, t_crs) in zip(pk["singles"], tg["singles"]):
        check_index(index, t_index)
        assert list(index.filepath) == list(t_index.filepath)
        assert list(index.index) == list(t_index.index)  # the same dates, to the microsecond
        assert [type(s) for s in bounds] == [type(s) for s in t_bounds] == [slice] * 3
        assert [s.step for s in bounds] == [s.step for s in t_bounds]
        assert (bounds[2].start, bounds[2].stop) == (t_bounds[2].start, t_bounds[2].stop)
        assert res == t_res and crs == t_crs
    check_index(pk["dataset"].index, tg["dataset"].index)
    for ours, theirs in zip(pk["samples"][:2], tg["samples"][:2]):  # the tutorial's queries: the same window
        check_sample(ours, theirs)
        assert tuple(ours["bounds"][: len(theirs["bounds"])]) == tuple(theirs["bounds"])
        assert set(ours["mask"].unique().tolist()) == set(theirs["mask"].unique().tolist())
    for ours, theirs in zip(pk["samples"][2:], tg["samples"][2:]):
        check_sample(ours, theirs)
    labels = [set().union(*(set(s["mask"].unique().tolist()) for s in r["samples"])) for r in (pk, tg)]
    assert labels[0] == labels[1] and labels[0] <= set(range(len(CLASSES)))
    assert len(pk["random"]) == len(tg["random"]) == 6
    for ours, theirs in zip(pk["random"], tg["random"]):
        check_query(ours, theirs)
    check_query(pk["grid"], tg["grid"])


def test_custom_raster_dataset(tutorial_data):
    tg, pk = (run(name, custom_raster, tutorial_data["sentinel"].as_posix()) for name in ("torchgeo", "pipekit"))
    assert len(pk["dataset"]) == len(tg["dataset"]) == 2
    check_index(pk["dataset"].index, tg["dataset"].index)
    assert list(pk["dataset"].index.filepath) == list(tg["dataset"].index.filepath)
    for ours, theirs in zip(pk["samples"], tg["samples"]):
        check_sample(ours, theirs)
    # the same query reads the same pixels (native windows: no resampling on either side)
    query = tg["queries"][0]
    assert torch.equal(pk["dataset"][query]["image"], tg["dataset"][query]["image"])


def test_surface_water(tutorial_data):
    root = tutorial_data["surface_water"] / "dset-s2"
    tg, pk = run("torchgeo", surface_water, root), run("pipekit", surface_water, root)
    check_index(pk["images"].index, tg["images"].index)
    check_index(pk["dset"].index, tg["dset"].index)
    for ours, theirs in zip(pk["samples"], tg["samples"]):
        check_sample(ours, theirs)
        assert ours["mask"].dtype == torch.int64 and ours["mask"].ndim == 2
        assert set(ours["mask"].unique().tolist()) <= {0, 1} and set(theirs["mask"].unique().tolist()) <= {0, 1}
