"""Tests of the collate kernels in pipekit.collate."""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import pytest
import torch

from pipekit.collate import pad_collate, pad_stack


@pytest.fixture
def seqs() -> list[torch.Tensor]:
    return [torch.tensor([1, 2, 3]), torch.tensor([4]), torch.tensor([5, 6])]


@pytest.fixture
def images() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.rand(3, 4, 5, generator=g), torch.rand(3, 2, 7, generator=g), torch.rand(3, 6, 1, generator=g)]


class TestPadStack:
    def test_pads_every_dimension(self, images):
        batch, sizes = pad_stack(images, pad_value=-1.0)
        assert batch.shape == (3, 3, 6, 7)
        assert sizes.dtype == torch.long
        assert sizes.tolist() == [[3, 4, 5], [3, 2, 7], [3, 6, 1]]
        for i, img in enumerate(images):
            c, h, w = img.shape
            assert torch.equal(batch[i, :c, :h, :w], img)
            mask = torch.ones(batch.shape[1:], dtype=torch.bool)
            mask[:c, :h, :w] = False
            assert (batch[i][mask] == -1.0).all()

    def test_equal_shapes_is_stack(self):
        ts = [torch.ones(2, 2), torch.zeros(2, 2)]
        batch, sizes = pad_stack(ts, pad_value=9)
        assert torch.equal(batch, torch.stack(ts))
        assert sizes.tolist() == [[2, 2], [2, 2]]

    def test_scalars(self):
        batch, sizes = pad_stack([torch.tensor(1), torch.tensor(2)])
        assert batch.tolist() == [1, 2]
        assert sizes.shape == (2, 0)

    def test_dtype_promotion_and_numpy(self):
        batch, _ = pad_stack([np.array([1, 2], dtype=np.int32), torch.tensor([0.5])])
        assert batch.dtype == torch.float32
        assert batch.tolist() == [[1.0, 2.0], [0.5, 0.0]]

    def test_empty_dimension(self):
        batch, sizes = pad_stack([torch.ones(0, 2), torch.ones(1, 2)])
        assert batch.shape == (2, 1, 2)
        assert batch[0].tolist() == [[0.0, 0.0]]
        assert sizes.tolist() == [[0, 2], [1, 2]]

    def test_different_ndim_is_a_clear_error(self):
        with pytest.raises(ValueError, match=r"different numbers of dimensions.*sample 1 has shape \(2, 2\)"):
            pad_stack([torch.ones(3), torch.ones(2, 2)])

    def test_pad_value_must_fit_dtype(self):
        with pytest.raises(ValueError, match="not an integer"):
            pad_stack([torch.ones(1, dtype=torch.long), torch.ones(2, dtype=torch.long)], pad_value=0.5)
        with pytest.raises(ValueError, match="out of range"):
            pad_stack([torch.ones(1, dtype=torch.uint8), torch.ones(2, dtype=torch.uint8)], pad_value=-1)

    def test_empty(self):
        with pytest.raises(ValueError, match="empty"):
            pad_stack([])


class TestPadCollateTensors:
    def test_values_and_sizes(self, seqs):
        batch, sizes = pad_collate(seqs, pad_value=-7)
        assert batch.tolist() == [[1, 2, 3], [4, -7, -7], [5, 6, -7]]
        assert sizes.tolist() == [[3], [1], [2]]

    def test_keys_not_allowed(self, seqs):
        with pytest.raises(ValueError, match="keys must be None"):
            pad_collate(seqs, keys=[0])

    def test_mixed_sample_types(self, seqs):
        with pytest.raises(TypeError, match="sample 1 is a str"):
            pad_collate([seqs[0], "x"])

    def test_not_a_list(self, seqs):
        with pytest.raises(TypeError, match="expected a list of samples"):
            pad_collate(seqs[0])

    def test_empty_batch(self):
        with pytest.raises(ValueError, match="empty batch"):
            pad_collate([])


class TestPadCollateDicts:
    def test_pads_tensor_keys_and_collates_others(self, seqs, images):
        samples = [
            {"tokens": s, "image": im, "label": i, "name": f"s{i}"} for i, (s, im) in enumerate(zip(seqs, images))
        ]
        out = pad_collate(samples, pad_value={"tokens": -1})
        assert list(out) == ["tokens", "tokens_sizes", "image", "image_sizes", "label", "name"]
        assert out["tokens"].tolist() == [[1, 2, 3], [4, -1, -1], [5, 6, -1]]
        assert out["tokens_sizes"].tolist() == [[3], [1], [2]]
        assert out["image"].shape == (3, 3, 6, 7)
        assert out["image"][1, :, 2:, :].abs().sum() == 0  # padded with the default 0
        assert out["image_sizes"].tolist() == [[3, 4, 5], [3, 2, 7], [3, 6, 1]]
        assert torch.equal(out["label"], torch.tensor([0, 1, 2]))
        assert out["name"] == ["s0", "s1", "s2"]

    def test_keys_selects_what_is_padded(self, seqs):
        samples = [{"a": s, "b": torch.tensor([1.0, 2.0])} for s in seqs]
        out = pad_collate(samples, keys=["a"])
        assert "b_sizes" not in out
        assert out["b"].shape == (3, 2)
        assert out["a_sizes"].flatten().tolist() == [3, 1, 2]

    def test_unpadded_variable_tensors_are_a_clear_error(self, seqs):
        samples = [{"a": s, "b": s} for s in seqs]
        with pytest.raises(ValueError, match=r"cannot stack key 'b'.*list it in keys"):
            pad_collate(samples, keys=["a"])

    def test_non_tensor_objects_kept_as_lists(self, seqs):
        samples = [{"a": s, "meta": {"i": i}} for i, s in enumerate(seqs)]
        assert pad_collate(samples)["meta"] == [{"i": 0}, {"i": 1}, {"i": 2}]

    def test_missing_key(self, seqs):
        with pytest.raises(ValueError, match=r"key 'zz' is not in the samples"):
            pad_collate([{"a": s} for s in seqs], keys=["zz"])

    def test_different_keys(self, seqs):
        with pytest.raises(ValueError, match=r"sample 1 has different keys.*missing \['b'\]"):
            pad_collate([{"a": seqs[0], "b": 1}, {"a": seqs[1]}])

    def test_padding_a_non_tensor(self):
        with pytest.raises(TypeError, match="key 'a' of sample 0 is a str"):
            pad_collate([{"a": "x"}, {"a": "y"}], keys=["a"])

    def test_sizes_key_collision(self, seqs):
        with pytest.raises(ValueError, match="already have that key"):
            pad_collate([{"a": s, "a_sizes": 1} for s in seqs], keys=["a"])

    def test_pad_value_for_unpadded_key(self, seqs):
        with pytest.raises(ValueError, match=r"pad_value has entries for \['b'\]"):
            pad_collate([{"a": s, "b": "x"} for s in seqs], pad_value={"b": 1})

    def test_ndim_mismatch_names_key(self):
        with pytest.raises(ValueError, match="key 'a' has tensors with different numbers of dimensions"):
            pad_collate([{"a": torch.ones(2)}, {"a": torch.ones(2, 2)}])


class TestPadCollateTuples:
    def test_tuple(self, seqs):
        samples = [(s, i, f"n{i}") for i, s in enumerate(seqs)]
        (tokens, labels, names), sizes = pad_collate(samples)
        assert tokens.tolist() == [[1, 2, 3], [4, 0, 0], [5, 6, 0]]
        assert labels.tolist() == [0, 1, 2]
        assert names == ["n0", "n1", "n2"]
        assert sizes[0].tolist() == [[3], [1], [2]]
        assert sizes[1] is None
        assert sizes[2] is None

    def test_namedtuple_and_per_field_pad_value(self, seqs):
        Sample = namedtuple("Sample", ["x", "y"])
        samples = [Sample(s, s * 10) for s in seqs]
        batch, sizes = pad_collate(samples, pad_value={0: -1, -1: -2})
        assert isinstance(batch, Sample)
        assert batch.x[1].tolist() == [4, -1, -1]
        assert batch.y[1].tolist() == [40, -2, -2]
        assert len(sizes) == 2

    def test_list_sample_and_keys(self, seqs):
        samples = [[s, torch.ones(2)] for s in seqs]
        batch, sizes = pad_collate(samples, keys=[0])
        assert isinstance(batch, list)
        assert batch[1].shape == (3, 2)
        assert sizes[1] is None

    def test_bad_keys(self, seqs):
        with pytest.raises(TypeError, match="field indices"):
            pad_collate([(s,) for s in seqs], keys=["a"])
        with pytest.raises(ValueError, match="out of range"):
            pad_collate([(s,) for s in seqs], keys=[3])
        with pytest.raises(TypeError, match="keys must be a list"):
            pad_collate([(s,) for s in seqs], keys="a")

    def test_different_lengths(self, seqs):
        with pytest.raises(ValueError, match="sample 1 has 1"):
            pad_collate([(seqs[0], 1), (seqs[1],)])

    def test_unsupported_sample(self):
        with pytest.raises(TypeError, match="must be tensors, tuples/lists or dicts"):
            pad_collate([1, 2])


class TestCollate:
    def test_geo_sample_dicts(self):
        from pipekit.collate import collate
        from pipekit.geo import BoundingBox

        samples = [
            {
                "image": torch.full((3, 4, 4), i, dtype=torch.uint8),
                "mask": torch.zeros(4, 4, dtype=torch.long),
                "crs": "EPSG:32615",
                "bounds": BoundingBox(0, 1, 0, 1),
                "label": i,
            }
            for i in range(3)
        ]
        batch = collate(samples)
        assert batch["image"].shape == (3, 3, 4, 4)
        assert batch["image"].dtype == torch.uint8
        assert batch["mask"].shape == (3, 4, 4)
        assert batch["crs"] == ["EPSG:32615"] * 3
        assert batch["bounds"] == [BoundingBox(0, 1, 0, 1)] * 3
        assert batch["label"].tolist() == [0, 1, 2]

    def test_tensors_tuples_and_arrays(self):
        from pipekit.collate import collate

        assert collate([torch.ones(2), torch.zeros(2)]).tolist() == [[1, 1], [0, 0]]
        images, labels = collate([(np.ones((2, 2), dtype=np.uint8), 1), (np.zeros((2, 2), dtype=np.uint8), 0)])
        assert images.shape == (2, 2, 2)
        assert images.dtype == torch.uint8
        assert labels.tolist() == [1, 0]

    @pytest.mark.parametrize("pin", [False, True])
    def test_pin_memory_flag_gives_same_values(self, pin):
        from pipekit.collate import collate, pad_collate

        samples = [{"image": torch.randint(0, 255, (3, 5, 5), dtype=torch.uint8), "id": i} for i in range(4)]
        batch = collate(samples, pin_memory=pin)
        assert torch.equal(batch["image"], torch.stack([s["image"] for s in samples]))
        assert batch["image"].is_pinned() == (pin and torch.cuda.is_available())
        ragged = [torch.ones(2, 3), torch.ones(3, 1)]
        padded, sizes = pad_collate(ragged, pad_value=-1, pin_memory=pin)
        assert padded.shape == (2, 3, 3)
        assert padded[1, :, 1:].eq(-1).all()
        assert sizes.tolist() == [[2, 3], [3, 1]]
        assert padded.is_pinned() == (pin and torch.cuda.is_available())

    def test_worker_batches_are_built_in_shared_memory(self):
        # padded and stacked batches are written straight into shared memory inside a worker
        from pipekit.collate import collate, pad_collate

        def check(samples):
            padded, _ = pad_collate([s["image"] for s in samples], pad_value=0)
            stacked = collate([s["mask"] for s in samples])
            return padded.is_shared(), stacked.is_shared(), padded

        data = [{"image": torch.ones(1, 2 + i, 2), "mask": torch.full((2, 2), i)} for i in range(2)]
        [(padded_shared, stacked_shared, padded)] = list(
            torch.utils.data.DataLoader(data, batch_size=2, num_workers=1, collate_fn=check)
        )
        assert padded_shared and stacked_shared
        assert padded.shape == (2, 1, 3, 2) and padded[0, 0, 2].eq(0).all()

    def test_errors_name_the_key(self):
        from pipekit.collate import collate

        with pytest.raises(ValueError, match=r"collate: cannot stack key 'image'.*pad_collate"):
            collate([{"image": torch.zeros(3, 2, 2)}, {"image": torch.zeros(3, 4, 4)}])
        with pytest.raises(ValueError, match="different keys"):
            collate([{"a": 1}, {"b": 2}])
        with pytest.raises(ValueError, match="empty batch"):
            collate([])
        with pytest.raises(TypeError, match="list of samples"):
            collate(torch.zeros(2))


class TestOneRuleForSampleDicts:
    """collate, collate_dicts and pipekit.geo.stack_samples share one implementation.

    They agree on tensors and on what stays a list; for numbers and numpy arrays collate follows
    torch's default_collate (tensors) and stack_samples follows TorchGeo (lists).
    """

    CASES = {
        # name: (values of one key across 2 samples, expected: a (dtype, shape) or "list")
        "int": ([1, 2], (torch.int64, (2,))),
        "float": ([0.5, 1.5], (torch.float64, (2,))),
        "bool": ([True, False], (torch.bool, (2,))),
        "numpy int32 scalar": ([np.int32(1), np.int32(2)], (torch.int32, (2,))),
        "numpy float32 scalar": ([np.float32(1), np.float32(2)], (torch.float32, (2,))),
        "numpy array": ([np.ones(3, np.uint8), np.zeros(3, np.uint8)], (torch.uint8, (2, 3))),
        "tensor": ([torch.ones(3), torch.zeros(3)], (torch.float32, (2, 3))),
        "0-d tensor": ([torch.tensor(1), torch.tensor(2)], (torch.int64, (2,))),
        "tensors of two dtypes": ([torch.ones(3, dtype=torch.uint8), torch.ones(3)], (torch.float32, (2, 3))),
        "None": ([None, None], "list"),
        "str": (["a", "b"], "list"),
        "crs": (["EPSG:32615", "EPSG:32616"], "list"),
        "nested dict": ([{"a": 1}, {"a": 2}], "list"),
        "nested list": ([[1, 2], [3, 4]], "list"),
        "complex": ([1j, 2j], "list"),
        "numpy strings": ([np.array(["a"]), np.array(["b"])], "list"),
        "tensor and None": ([torch.ones(3), None], "list"),
        "None and tensor": ([None, torch.ones(3)], "list"),
        "number and None": ([1, None], "list"),
        "tensor and number": ([torch.tensor(1), 2], "list"),
    }

    @pytest.mark.parametrize("case", list(CASES))
    def test_collate_and_stack_samples_agree(self, case):
        from pipekit.collate import collate, collate_dicts
        from pipekit.geo import stack_samples

        values, expected = self.CASES[case]
        samples = [{"k": v} for v in values]
        outs = [(collate(samples)["k"], expected), (collate_dicts(samples)["k"], expected)]
        torchgeo_expected = expected if all(isinstance(v, torch.Tensor) for v in values) else "list"
        outs.append((stack_samples(samples)["k"], torchgeo_expected))
        for out, expected in outs:
            if expected == "list":
                assert isinstance(out, list) and len(out) == 2
                assert all(a is b for a, b in zip(out, values))
            else:
                assert isinstance(out, torch.Tensor) and (out.dtype, tuple(out.shape)) == expected
                assert out.tolist() == [torch.as_tensor(v).tolist() for v in values]

    def test_bounds_are_kept_as_lists(self):
        from pipekit.collate import collate
        from pipekit.geo import BoundingBox, stack_samples

        samples = [{"bounds": BoundingBox(i, i + 1, 0, 1), "crs": "EPSG:32615"} for i in range(2)]
        assert collate(samples) == stack_samples(samples) == {
            "bounds": [BoundingBox(0, 1, 0, 1), BoundingBox(1, 2, 0, 1)],
            "crs": ["EPSG:32615", "EPSG:32615"],
        }

    def test_same_errors(self):
        from pipekit.collate import collate
        from pipekit.geo import stack_samples

        for fn, name in ((collate, "collate"), (stack_samples, "stack_samples")):
            with pytest.raises(ValueError, match=rf"{name}: cannot stack key 'image'.*shapes \[\(2, 2\), \(3, 3\)\]"):
                fn([{"image": torch.zeros(2, 2)}, {"image": torch.zeros(3, 3)}])
            with pytest.raises(ValueError, match=rf"{name}: sample 1 has different keys.*missing \['b'\]"):
                fn([{"a": 1, "b": 2}, {"a": 1}])
            with pytest.raises(TypeError, match=rf"{name}: samples must be dicts, but sample 1 is a list"):
                fn([{"a": 1}, [1]])

    def test_worker_batches_promote_dtypes_into_shared_memory(self):
        # default_collate used to fail in a worker on a uint8 and a float32 tensor of one key
        from pipekit.collate import collate
        from pipekit.geo import stack_samples

        def check(samples):
            return [
                (b["a"].dtype, b["a"].is_shared(), type(b["n"]).__name__)
                for b in (collate(samples), stack_samples(samples))
            ]

        data = [{"a": torch.ones(2, dtype=torch.uint8), "n": 1}, {"a": torch.ones(2), "n": 2}]
        [result] = list(torch.utils.data.DataLoader(data, batch_size=2, num_workers=1, collate_fn=check))
        assert result == [(torch.float32, True, "Tensor"), (torch.float32, True, "list")]


class TestStackFastPaths:
    """The main-process fast paths of the shared collation give what the general path gave."""

    def test_main_process_batch_is_a_fresh_ordinary_tensor(self):
        from pipekit.collate import collate
        from pipekit.geo import stack_samples

        images = [torch.arange(12, dtype=torch.float32).reshape(3, 2, 2) + i for i in range(3)]
        for batch in (collate(images), collate([{"image": t} for t in images])["image"],
                      stack_samples([{"image": t} for t in images])["image"]):
            assert torch.equal(batch, torch.stack(images))
            assert batch.is_contiguous() and not batch.is_shared() and batch.dtype == torch.float32
            batch.zero_()  # a copy: the samples are untouched
            assert images[1][0, 0, 0].item() == 1.0

    def test_mixed_dtypes_and_arrays_are_promoted_in_the_main_process(self):
        from pipekit.collate import collate

        batch = collate([torch.ones(2, dtype=torch.uint8), np.full(2, 0.5, dtype=np.float64), torch.zeros(2)])
        assert batch.dtype == torch.float64 and batch.tolist() == [[1, 1], [0.5, 0.5], [0, 0]]

    def test_tensors_requiring_grad_keep_it(self):
        from pipekit.collate import collate

        leaves = [torch.ones(2, requires_grad=True), torch.zeros(2, requires_grad=True)]
        batch = collate(leaves)
        assert batch.requires_grad
        batch.sum().backward()
        assert leaves[0].grad.tolist() == [1.0, 1.0]

    @pytest.mark.parametrize(
        ("values", "dtype"),
        [([1, 2], torch.int64), ([1.0, 2.5], torch.float64), ([True, False], torch.bool), ([1, 2.5], None),
         ([np.int16(1), np.int16(2)], torch.int16), ([1, np.float32(2.0)], None)],
    )
    def test_numbers_collate_as_default_collate(self, values, dtype):
        from torch.utils.data import default_collate

        from pipekit.collate import collate

        out = collate([{"n": v} for v in values])["n"]
        expected = default_collate(values)
        assert out.dtype == expected.dtype and out.tolist() == expected.tolist()
        assert dtype is None or out.dtype == dtype


class _Mixed(torch.utils.data.Dataset):
    """Samples of every kind torch's default_collate turns into tensors, plus strings and a subclass."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int):
        from torchvision import tv_tensors

        return {
            "image": torch.full((3, 4, 5), i, dtype=torch.uint8),
            "array": np.full((2, 2), i / 2, dtype=np.float32),
            "label": i,
            "score": i / 3,
            "flag": i % 2 == 0,
            "np_scalar": np.int16(i),
            "name": f"s{i}",
            "pair": (torch.tensor([i, -i]), i * 2),
            "boxes": tv_tensors.BoundingBoxes(torch.tensor([[i, i, i + 1, i + 1]]), format="XYXY", canvas_size=(8, 8)),
        }


def _same(a, b) -> None:
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    else:
        assert a == b


def test_default_collate_in_pipekit_workers_gives_torch_batches_in_pooled_memory():
    import pipekit
    from pipekit import _shm as shm

    theirs = list(torch.utils.data.DataLoader(_Mixed(), batch_size=6, num_workers=2))
    # pin_memory off (its default with CUDA is on): a pinned batch is the pin thread's copy, not the worker's buffer
    ours = list(pipekit.DataLoader(_Mixed(), batch_size=6, num_workers=2, persistent_workers=True, pin_memory=False))
    assert len(ours) == len(theirs) == 4
    for a, b in zip(ours, theirs):
        _same(a, b)
    # the tensors came from the workers' pools (the main process had mapped them), torch's do not
    assert any(b["image"].untyped_storage().data_ptr() in shm._received for b in ours)
    assert not any(b["image"].untyped_storage().data_ptr() in shm._received for b in theirs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_default_collate_in_pipekit_workers_with_pin_memory_gives_torch_batches_pinned():
    import pipekit

    theirs = list(torch.utils.data.DataLoader(_Mixed(), batch_size=6, num_workers=2))
    ours = list(pipekit.DataLoader(_Mixed(), batch_size=6, num_workers=2, pin_memory=True))
    assert len(ours) == len(theirs) == 4
    for a, b in zip(ours, theirs):
        _same(a, b)
        assert a["image"].is_pinned()


def test_use_shared_buffers_in_default_collate_keeps_a_users_entry(monkeypatch):
    from torch.utils.data._utils import collate as torch_collate

    from pipekit.collate import use_shared_buffers_in_default_collate

    collate_map = dict(torch_collate.default_collate_fn_map)
    monkeypatch.setattr(torch_collate, "default_collate_fn_map", collate_map)

    def mine(batch, *, collate_fn_map=None):
        return "mine"

    collate_map[int] = mine
    use_shared_buffers_in_default_collate()
    assert collate_map[int] is mine
    assert collate_map[torch.Tensor] is not torch_collate.collate_tensor_fn
    assert collate_map[float] is not torch_collate.collate_float_fn
    # outside a worker the batch is torch's, in ordinary memory
    out = collate_map[torch.Tensor]([torch.ones(2), torch.zeros(2)], collate_fn_map=collate_map)
    assert torch.equal(out, torch.tensor([[1.0, 1.0], [0.0, 0.0]])) and not out.is_shared()
