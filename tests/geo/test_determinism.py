"""A geo read gives the same pixels whatever the process read before (issue 13, item 3).

The warp cache (:mod:`pipekit.geo.warpcache`) serves nearest-neighbour reads
in another CRS from blocks warped for earlier queries; the direct path warps
the query's own grid.  Both must compute every pixel by the same arithmetic,
so a read is the same with the cache on or off, first or repeated, and a
resumed run reads the masks of the uninterrupted one.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

import pipekit
from pipekit import datasets
from pipekit.geo import RandomGeoSampler, warpcache
from pipekit.synthetic.geo import CDL_CLASSES, write_landsat_cdl_corpus

CLASSES = [0, *CDL_CLASSES]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_landsat_cdl_corpus(tmp_path_factory.mktemp("corpus"), size=512, scenes=2, progress=False)


@pytest.fixture(autouse=True)
def fresh_cache():
    budget = warpcache.warp_cache_budget()
    warpcache.clear_warp_cache()
    yield
    warpcache.set_warp_cache_budget(budget)
    warpcache.clear_warp_cache()


def _boxes(dataset, size: int, n: int, seed: int) -> list:
    torch.manual_seed(seed)
    return list(RandomGeoSampler(dataset, size=size, length=n))


def _reads(dataset, boxes) -> list[np.ndarray]:
    return [np.asarray(dataset[box]["mask"]).copy() for box in boxes]


class TestCacheOnOff:
    @pytest.mark.parametrize("size", [16, 64, 200])
    def test_cached_reads_equal_uncached_reads_bit_for_bit(self, corpus, size):
        ds = datasets.Landsat8(corpus / "landsat8") & datasets.CDL(corpus / "cdl")
        boxes = _boxes(ds, size, 64, seed=size)
        warpcache.set_warp_cache_budget(0)
        uncached = _reads(ds, boxes)
        warpcache.set_warp_cache_budget(64 * 2**20)
        first = _reads(ds, boxes)  # fills the blocks (first query on each lattice is warped directly)
        second = _reads(ds, boxes)  # served from blocks
        assert warpcache.warp_cache_stats()["hits"] > 0  # the cached path was taken
        for i, (a, b, c) in enumerate(zip(uncached, first, second)):
            assert np.array_equal(a, b), f"box {i}: first cached read differs from the uncached read"
            assert np.array_equal(a, c), f"box {i}: repeated cached read differs from the uncached read"

    def test_a_read_does_not_depend_on_the_reads_before_it(self, corpus):
        ds = datasets.Landsat8(corpus / "landsat8") & datasets.CDL(corpus / "cdl")
        boxes = _boxes(ds, 48, 64, seed=7)
        forward = _reads(ds, boxes)
        warpcache.clear_warp_cache()
        backward = _reads(ds, boxes[::-1])[::-1]
        warpcache.clear_warp_cache()
        alone = []
        for box in boxes:  # each read from an empty cache
            warpcache.clear_warp_cache()
            alone.extend(_reads(ds, [box, box])[1:])  # the second read of a lattice comes from blocks
        for i, (a, b, c) in enumerate(zip(forward, backward, alone)):
            assert np.array_equal(a, b) and np.array_equal(a, c), f"box {i} depends on the reads before it"


class TestResume:
    def test_resumed_geosegmentation_reads_the_masks_of_the_uninterrupted_run(self, corpus):
        images, labels = datasets.Landsat8(corpus / "landsat8"), datasets.CDL(corpus / "cdl")

        def loader():
            recipe = datasets.GeoSegmentation(images, labels, size=32, length=64, batch_size=4, classes=CLASSES)
            return pipekit.DataLoader(recipe, num_workers=0)

        torch.manual_seed(3)
        full = list(loader())
        torch.manual_seed(3)
        first = loader()
        it = iter(first)
        head = [next(it) for _ in range(5)]
        state = pickle.loads(pickle.dumps(first.state_dict()))
        warpcache.clear_warp_cache()  # a resumed run starts in a fresh process, with an empty cache
        resumed = loader()
        resumed.load_state_dict(state)
        got = head + list(resumed)
        assert [b["bounds"] for b in got] == [b["bounds"] for b in full]
        for i, (a, b) in enumerate(zip(got, full)):
            assert torch.equal(a["mask"], b["mask"]), f"batch {i}: masks differ"
            assert torch.equal(a["image"], b["image"]), f"batch {i}: images differ"
