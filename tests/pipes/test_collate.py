"""Tests of pipekit.pipes._collate."""

from __future__ import annotations

import pickle

import pytest
import torch

from pipekit.pipes import IterableWrapper, PadCollator
from pipekit.pipes._resume import not_snapshot_capable


@pytest.fixture
def samples() -> list[dict]:
    g = torch.Generator().manual_seed(0)
    lengths = [5, 2, 7, 1, 3]
    return [{"tokens": torch.randint(1, 100, (n,), generator=g), "id": i} for i, n in enumerate(lengths)]


class TestPadCollator:
    def test_pads_each_batch(self, samples):
        out = list(IterableWrapper(samples).batch(2).pad_collate(pad_value=0, keys=["tokens"]))
        assert [b["tokens"].shape for b in out] == [(2, 5), (2, 7), (1, 3)]
        assert [b["tokens_sizes"].flatten().tolist() for b in out] == [[5, 2], [7, 1], [3]]
        assert [b["id"].tolist() for b in out] == [[0, 1], [2, 3], [4]]
        assert torch.equal(out[0]["tokens"][1, :2], samples[1]["tokens"])
        assert (out[0]["tokens"][1, 2:] == 0).all()

    def test_tensor_samples(self):
        pipe = PadCollator(IterableWrapper([[torch.ones(2), torch.ones(3)]]), pad_value=-1)
        ((batch, sizes),) = list(pipe)
        assert batch.tolist() == [[1, 1, -1], [1, 1, 1]]
        assert sizes.tolist() == [[2], [3]]

    def test_unbatched_input_is_a_clear_error(self, samples):
        with pytest.raises(TypeError, match=r"expected batches.*\.batch\(n\)"):
            list(IterableWrapper(samples).pad_collate())

    def test_argument_validation(self, samples):
        with pytest.raises(TypeError, match="pad_value"):
            IterableWrapper(samples).pad_collate(pad_value="x")
        with pytest.raises(TypeError, match="keys"):
            IterableWrapper(samples).pad_collate(keys="tokens")

    def test_kernel_errors_propagate(self):
        pipe = IterableWrapper([[torch.ones(2), torch.ones(2, 2)]]).pad_collate()
        with pytest.raises(ValueError, match="different numbers of dimensions"):
            list(pipe)

    def test_len_pickle_and_stateless(self, samples):
        pipe = IterableWrapper(samples).batch(2).pad_collate(keys=["tokens"], pad_value={"tokens": -1})
        assert len(pipe) == 3
        copy = pickle.loads(pickle.dumps(pipe))
        a, b = list(pipe), list(copy)
        assert all(torch.equal(x["tokens"], y["tokens"]) for x, y in zip(a, b))
        assert not_snapshot_capable(pipe) == []
