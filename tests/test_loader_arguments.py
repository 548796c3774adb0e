"""pipekit.DataLoader's arguments are checked when the loader is made (pipekit._loader._arguments), naming them."""

from __future__ import annotations

import pytest
import torch

import pipekit
from pipekit.pipes import IterableWrapper


def _pipe():
    return IterableWrapper(range(4))


@pytest.mark.parametrize("generator", ["0", 0, torch.zeros(1)])
def test_a_generator_that_is_not_one_is_refused_when_the_loader_is_made(generator):
    """torch raised ``random_() received an invalid combination of arguments`` at the first ``iter()``."""
    with pytest.raises(TypeError, match=r"pipekit\.DataLoader: generator must be a torch\.Generator or None"):
        pipekit.DataLoader(_pipe(), generator=generator)


@pytest.mark.parametrize("dataset", [None, 5, 2.5])
def test_a_dataset_that_is_neither_iterable_nor_indexable_is_refused_naming_it(dataset):
    """torch accepted ``None`` until the first ``iter()`` and said ``object of type 'int' has no len()``."""
    with pytest.raises(TypeError, match=r"pipekit\.DataLoader: dataset must be"):
        pipekit.DataLoader(dataset)


def test_what_torch_accepts_still_loads():
    generator = torch.Generator().manual_seed(0)
    assert list(pipekit.DataLoader(_pipe(), generator=generator)) == [0, 1, 2, 3]
    assert [b.tolist() for b in pipekit.DataLoader([1, 2], generator=None)] == [[1], [2]]
    assert [b.tolist() for b in pipekit.DataLoader(range(2))] == [[0], [1]]
