"""A DataLoader batch read straight into batch tensors (``__getitems__``), and stacked without a copy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from affine import Affine

from pipekit import DataLoader
from pipekit.geo import RandomGeoSampler, RasterDataset, stack_samples
from pipekit.geo._batch import stacked
from pipekit.geo._bbox import BoundingBox

X0, Y0 = 399_990.0, 4_650_030.0


class Image(RasterDataset):
    filename_glob = "image*.tif"


class Labels(RasterDataset):
    filename_glob = "labels*.tif"
    is_image = False


@pytest.fixture(scope="module")
def files(tmp_path_factory, rasters) -> Path:
    """A 3-band uint16 image (UTM 15N, nodata 0 in a corner) and uint8 labels in CONUS Albers (warped on read)."""
    root = tmp_path_factory.mktemp("batch")
    image = rasters.pattern(96, 96, 3, seed=3)
    image[:, :10, :10] = 0
    rasters.write_tif(root / "image.tif", image, rasters.UTM15, Affine(30.0, 0, X0, 0, -30.0, Y0), nodata=0)
    labels = (rasters.pattern(110, 110, 1, seed=4, dtype="uint16") % 7).astype(np.uint8)
    # the labels' grid in Albers, over the image's area (CDL's case)
    rasters.write_tif(root / "labels.tif", labels, rasters.ALBERS, Affine(30.0, 0, 147_000.0, 0, -30.0, 2_112_300.0))
    return root


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert list(a) == list(b)
    for key, value in a.items():
        if isinstance(value, torch.Tensor):
            other = b[key]
            assert value.dtype == other.dtype and value.shape == other.shape, key
            assert torch.equal(value, other), key
        else:
            assert value == b[key], key


def _keys(dataset: Any, n: int = 6, size: int = 16) -> list[Any]:
    return list(RandomGeoSampler(dataset, size=size, length=n, seed=1))


def _datasets(root: Path) -> dict[str, Any]:
    image, labels = Image(root), Labels(root)
    return {
        "image": image,
        "image & labels": image & labels,
        "labels & image": labels & image,
        "image | image": image | Image(root),
        "native (sample by sample)": Image(root, dtype="native") & labels,
        "transforms (sample by sample)": Image(root, transforms=lambda s: {**s, "flag": 1}) & labels,
    }


@pytest.mark.parametrize("name", ["image", "image & labels", "labels & image", "image | image",
                                  "native (sample by sample)", "transforms (sample by sample)"])
def test_batch_is_the_samples_one_by_one(files: Path, name: str) -> None:
    dataset = _datasets(files)[name]
    keys = _keys(dataset)
    batch = dataset.__getitems__(keys)
    assert len(batch) == len(keys)
    for got, key in zip(batch, keys):
        _same(got, dataset[key])
    views = stacked([s["image"] for s in batch])  # the samples are the slots of one batch tensor, or their own
    assert (views is None) == name.endswith("(sample by sample)")


def test_samples_are_slots_of_one_tensor_stacked_without_a_copy(files: Path) -> None:
    dataset = Image(files) & Labels(files)
    keys = _keys(dataset)
    samples = dataset.__getitems__(keys)
    batch = stack_samples(samples)
    expected = stack_samples([dataset[key] for key in keys])
    _same(batch, expected)
    assert batch["image"].shape == (len(keys), 3, 16, 16) and batch["mask"].shape == (len(keys), 16, 16)
    assert batch["image"].data_ptr() == samples[0]["image"].data_ptr()  # the samples' own memory: no copy
    assert batch["mask"].data_ptr() == samples[0]["mask"].data_ptr()


def test_other_samples_are_still_copied(files: Path) -> None:
    dataset = Image(files) & Labels(files)
    keys = _keys(dataset)
    samples = dataset.__getitems__(keys)
    for subset in (samples[::-1], samples[:3], samples[:1]):  # reordered or part of a batch: stacked as before
        batch = stack_samples(subset)
        _same(batch, stack_samples([dict(s, image=s["image"].clone(), mask=s["mask"].clone()) for s in subset]))
        assert batch["image"].data_ptr() != subset[0]["image"].data_ptr()
    one = dataset[keys[0]]  # a sample of its own, alone in a batch: a copy too
    assert stack_samples([one])["image"].data_ptr() != one["image"].data_ptr()


def test_queries_of_different_sizes_and_a_missing_one(files: Path) -> None:
    dataset = Image(files) & Labels(files)
    left, top = X0 + 300, Y0 - 300
    keys = [BoundingBox(left, left + 480, top - 480, top, 0, 2e9),
            BoundingBox(left, left + 300, top - 300, top, 0, 2e9)]
    for got, key in zip(dataset.__getitems__(keys), keys):
        _same(got, dataset[key])
    outside = BoundingBox(0, 300, 0, 300, 0, 2e9)
    with pytest.raises(IndexError) as one:
        dataset[outside]
    with pytest.raises(IndexError) as batch:
        dataset.__getitems__([keys[0], outside])
    assert str(batch.value) == str(one.value)


@pytest.mark.timeout(60)
def test_dataloader_batches_equal_stacked_samples(files: Path) -> None:
    dataset = Image(files) & Labels(files)
    sampler = RandomGeoSampler(dataset, size=16, length=8, seed=2)
    batches = list(DataLoader(dataset, batch_size=4, sampler=sampler, collate_fn=stack_samples))
    assert [len(b["bounds"]) for b in batches] == [4, 4]
    for batch in batches:
        _same(batch, stack_samples([dataset[bounds] for bounds in batch["bounds"]]))
