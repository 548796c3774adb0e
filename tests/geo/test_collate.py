"""Collate functions for geo samples (TorchGeo semantics)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipekit.geo._bbox import BoundingBox
from pipekit.geo._collate import concat_samples, merge_samples, stack_samples, unbind_samples


def sample(i: int, channels: int = 3) -> dict:
    return {
        "image": torch.full((channels, 4, 5), float(i)),
        "mask": torch.full((4, 5), i, dtype=torch.int64),
        "crs": "EPSG:32631",
        "bounds": BoundingBox(i, i + 5, 0, 4),
    }


class TestStackSamples:
    def test_stacks_tensors_and_lists_the_rest(self):
        batch = stack_samples([sample(0), sample(1), sample(2)])
        assert batch["image"].shape == (3, 3, 4, 5)
        assert batch["mask"].shape == (3, 4, 5)
        assert batch["mask"].dtype == torch.int64
        assert batch["image"][:, 0, 0, 0].tolist() == [0.0, 1.0, 2.0]
        assert batch["crs"] == ["EPSG:32631"] * 3
        assert batch["bounds"] == [BoundingBox(i, i + 5, 0, 4) for i in range(3)]
        assert list(batch) == ["image", "mask", "crs", "bounds"]

    def test_batches_are_built_in_shared_memory_inside_workers(self):
        # stacked straight into shared memory in the worker, as default_collate does: the batch
        # then reaches the main process without another copy of its pixels
        def collate(samples):
            batch = stack_samples(samples)
            batch["shared_in_worker"] = [batch["image"].is_shared(), batch["mask"].is_shared()]
            return batch

        loader = torch.utils.data.DataLoader([sample(i) for i in range(4)], batch_size=2, num_workers=1,
                                             collate_fn=collate)
        batches = list(loader)
        assert [b["shared_in_worker"] for b in batches] == [[True, True], [True, True]]
        assert torch.equal(batches[1]["image"][:, 0, 0, 0], torch.tensor([2.0, 3.0]))
        # in the main process, ordinary memory
        assert not stack_samples([sample(0), sample(1)])["image"].is_shared()

    def test_only_tensors_are_stacked_as_in_torchgeo(self):
        # TorchGeo 0.8's stack_samples stacks tensors and keeps every other value as a list;
        # pipekit.collate.collate is the one that turns numbers into tensors (default_collate's rule).
        samples = [{**sample(i), "label": i, "cloud": i / 4, "path": f"s{i}.tif", "nodata": None} for i in range(3)]
        batch = stack_samples(samples)
        assert batch["label"] == [0, 1, 2]
        assert batch["cloud"] == [0.0, 0.25, 0.5]
        assert batch["path"] == ["s0.tif", "s1.tif", "s2.tif"] and batch["nodata"] == [None] * 3
        assert batch["crs"] == ["EPSG:32631"] * 3
        arrays = stack_samples([{"a": np.ones(2)}, {"a": np.zeros(2)}])["a"]
        assert isinstance(arrays, list) and len(arrays) == 2
        # a key holding a tensor in some samples and None in others stays a list
        assert stack_samples([{"m": torch.ones(2)}, {"m": None}])["m"][1] is None

    def test_accepts_any_iterable(self):
        batch = stack_samples(sample(i) for i in range(2))
        assert batch["image"].shape == (2, 3, 4, 5)

    def test_shape_mismatch_names_the_key(self):
        with pytest.raises(ValueError, match="'image'") as info:
            stack_samples([sample(0, channels=3), sample(1, channels=2)])
        assert "(3, 4, 5)" in str(info.value) and "(2, 4, 5)" in str(info.value)

    def test_different_keys_refused(self):
        other = sample(1)
        del other["mask"]
        with pytest.raises(ValueError, match=r"sample 1 .*missing \['mask'\]"):
            stack_samples([sample(0), other])

    def test_empty_and_non_dict(self):
        with pytest.raises(ValueError, match="at least one"):
            stack_samples([])
        with pytest.raises(TypeError, match="sample 0 is a list"):
            stack_samples([[1, 2]])


class TestConcatSamples:
    def test_concatenates_along_first_axis(self):
        joined = concat_samples([sample(0, channels=3), sample(1, channels=2)])
        assert joined["image"].shape == (5, 4, 5)
        assert joined["image"][:, 0, 0].tolist() == [0, 0, 0, 1, 1]
        assert joined["mask"].shape == (8, 5)  # dim 0 of [H, W]
        assert joined["crs"] == "EPSG:32631"
        assert joined["bounds"] == BoundingBox(0, 5, 0, 4)  # the first sample's

    def test_image_and_mask_from_different_datasets(self):
        # what an intersection dataset joins: an image from one, a mask from the other
        image = {"image": torch.ones(3, 4, 4), "crs": "a", "bounds": BoundingBox(0, 4, 0, 4)}
        mask = {"mask": torch.zeros(4, 4, dtype=torch.long), "crs": "a", "bounds": BoundingBox(0, 4, 0, 4)}
        joined = concat_samples([image, mask])
        assert joined["image"].shape == (3, 4, 4)
        assert joined["mask"].shape == (4, 4)
        assert joined["crs"] == "a"

    def test_mismatch_and_empty(self):
        with pytest.raises(ValueError, match="'image'"):
            concat_samples([{"image": torch.ones(1, 4, 4)}, {"image": torch.ones(1, 3, 3)}])
        with pytest.raises(ValueError, match="at least one"):
            concat_samples([])


class TestMergeSamples:
    def test_elementwise_maximum_fills_nodata(self):
        a = {"image": torch.tensor([[0.0, 5.0], [0.0, 0.0]]), "crs": "a"}
        b = {"image": torch.tensor([[3.0, 1.0], [0.0, 2.0]]), "crs": "b"}
        merged = merge_samples([a, b])
        assert merged["image"].tolist() == [[3.0, 5.0], [0.0, 2.0]]
        assert merged["crs"] == "b"  # later non-tensor values win
        assert a["image"].tolist() == [[0.0, 5.0], [0.0, 0.0]]  # inputs untouched

    def test_keys_may_differ(self):
        merged = merge_samples([{"image": torch.ones(1)}, {"mask": torch.zeros(1)}, {"image": torch.full((1,), 2.0)}])
        assert merged["image"].tolist() == [2.0]
        assert merged["mask"].tolist() == [0.0]

    def test_errors(self):
        with pytest.raises(ValueError, match="'image'"):
            merge_samples([{"image": torch.ones(2)}, {"image": torch.ones(3)}])
        with pytest.raises(ValueError, match="at least one"):
            merge_samples([])
        with pytest.raises(TypeError, match="dicts"):
            merge_samples(["x"])


class TestUnbindSamples:
    def test_inverse_of_stack(self):
        samples = [sample(i) for i in range(3)]
        batch = stack_samples(samples)
        out = unbind_samples(batch)
        assert len(out) == 3
        for got, want in zip(out, samples, strict=True):
            assert set(got) == set(want)
            assert torch.equal(got["image"], want["image"])
            assert torch.equal(got["mask"], want["mask"])
            assert got["bounds"] == want["bounds"] and got["crs"] == want["crs"]
        assert batch["image"].shape == (3, 3, 4, 5)  # the batch is not modified

    def test_numbers_round_trip(self):
        out = unbind_samples(stack_samples([{"label": 3, "crs": "a"}, {"label": 4, "crs": "b"}]))
        assert [(s["label"], s["crs"]) for s in out] == [(3, "a"), (4, "b")]

    def test_errors(self):
        with pytest.raises(ValueError, match="'crs' has 1 items, expected 2"):
            unbind_samples({"image": torch.zeros(2, 1), "crs": ["a"]})
        with pytest.raises(TypeError, match="'crs'"):
            unbind_samples({"image": torch.zeros(2, 1), "crs": "a"})
        with pytest.raises(ValueError, match="0-d"):
            unbind_samples({"x": torch.tensor(1.0)})
        assert unbind_samples({}) == []
