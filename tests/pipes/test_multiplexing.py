"""Tests of mux_longest and SampleMultiplexer (pipekit.pipes._multiplexing)."""

from __future__ import annotations

import pickle
import random
from collections import Counter

import pytest
import torch
from torch.utils.data.graph_settings import apply_random_seed

from pipekit.pipes import (
    IterableWrapper,
    MultiplexerLongest,
    SampleMultiplexer,
)
from pipekit.pipes.base import owner_of
from pipekit.testing import assert_resumes

# list() asks for len(); a header over an unsized source warns (once) that its length is a guess.
pytestmark = pytest.mark.filterwarnings("ignore:Header. the source has no length")


def three_ranges():
    return IterableWrapper(range(3)), IterableWrapper(range(10, 15)), IterableWrapper(range(20, 25))


@pytest.mark.parametrize(
    ("name", "kind", "cls"),
    [
        ("mux_longest", "iter", "multiplexing.MultiplexerLongest"),
    ],
)
def test_functional_names_are_pipekits(name, kind, cls):
    assert owner_of(name, kind) == f"pipekit.pipes._{cls}"


# ----------------------------------------------------------------- mux_longest


class TestMultiplexerLongest:
    def test_torchdata_example(self):
        dp1, dp2, dp3 = IterableWrapper(range(5)), IterableWrapper(range(10, 15)), IterableWrapper(range(20, 25))
        assert list(dp1.mux_longest(dp2, dp3)) == [0, 10, 20, 1, 11, 21, 2, 12, 22, 3, 13, 23, 4, 14, 24]

    def test_uneven(self):
        assert list(MultiplexerLongest(*three_ranges())) == [0, 10, 20, 1, 11, 21, 2, 12, 22, 13, 23, 14, 24]
        assert list(IterableWrapper([]).mux_longest(IterableWrapper("ab"))) == ["a", "b"]

    def test_invalid_inputs(self):
        with pytest.raises(TypeError, match="IterDataPipe"):
            MultiplexerLongest(IterableWrapper([1]), "ab")

    def test_length_and_pickle(self):
        pipe = MultiplexerLongest(*three_ranges())
        assert len(pipe) == 13
        assert list(pickle.loads(pickle.dumps(pipe))) == list(pipe)

    @pytest.mark.parametrize("n", [0, 1, 2, 3, 7, 10, 12, 13])
    def test_resumes(self, n):
        assert_resumes(lambda: MultiplexerLongest(*three_ranges()), n)


# ----------------------------------------------------------------- SampleMultiplexer


def sample_reference(weights, seed):
    """torchdata 0.9's SampleMultiplexer draws, written from its documented algorithm."""
    total = sum(w for _, w in weights)
    live = [(iter(items), w / total) for items, w in weights]
    rng, out = random.Random(seed), []
    while len(live) > 1:
        r, s = rng.random(), 0.0
        for it, w in live:
            s += w
            if r < s:
                try:
                    out.append(next(it))
                except StopIteration:
                    live = [(k, v / (1 - w)) for k, v in live if k is not it]
                break
    out.extend(live[0][0])
    return out


class TestSampleMultiplexer:
    def test_torchdata_example(self):
        d = {IterableWrapper([0] * 10): 99999999, IterableWrapper([1] * 10): 0.0000001}
        # (torchdata's docstring printed only 10 items; its code, like this one, yields all 20)
        assert list(SampleMultiplexer(pipes_to_weights_dict=d, seed=0)) == [0] * 10 + [1] * 10

    @pytest.mark.parametrize("seed", [0, 1, 42])
    def test_same_draws_as_torchdata(self, seed):
        sources = [(list(range(5)), 1), (list("abcdefgh"), 2.5), ([None] * 3, 0.5)]
        d = {IterableWrapper(items): w for items, w in sources}
        assert list(SampleMultiplexer(d, seed=seed)) == sample_reference(sources, seed)

    def test_weights_set_the_ratio(self):
        d = {IterableWrapper([0]).cycle(): 3, IterableWrapper([1]).cycle(): 1}
        out = list(SampleMultiplexer(d, seed=5).header(4000))
        assert abs(Counter(out)[0] / 4000 - 0.75) < 0.03

    def test_all_items_once(self):
        d = {IterableWrapper(range(10)): 1, IterableWrapper(range(10, 13)): 5}
        assert sorted(SampleMultiplexer(d, seed=3)) == list(range(13))

    def test_explicit_seed_continues_across_epochs_and_ignores_set_seed(self):
        d = {IterableWrapper(range(10)): 1, IterableWrapper(range(10, 20)): 1}
        a, b = SampleMultiplexer(d, seed=7), SampleMultiplexer(d, seed=7)
        b.set_seed(123)
        assert list(a) == list(b)
        assert list(a) == list(b)  # second epoch continues the same stream in both

    def test_set_seed_and_torch_seed_without_explicit_seed(self):
        d = {IterableWrapper(range(10)): 1, IterableWrapper(range(10, 20)): 1}
        pipe = SampleMultiplexer(d)
        assert list(pipe.set_seed(4)) == list(pipe.set_seed(4))
        outs = {tuple(pipe.set_seed(s)) for s in range(6)}
        assert len(outs) > 1
        torch.manual_seed(2)
        first_run = list(pipe)
        torch.manual_seed(2)
        assert list(pipe) == first_run
        apply_random_seed(pipe, torch.Generator().manual_seed(9))
        seeded = list(pipe)
        apply_random_seed(pipe, torch.Generator().manual_seed(9))
        assert list(pipe) == seeded

    @pytest.mark.parametrize(
        ("arg", "error"),
        [({}, ValueError), ([], ValueError), ({"x": 1}, TypeError)],
    )
    def test_invalid_dict(self, arg, error):
        with pytest.raises(error):
            SampleMultiplexer(arg)

    @pytest.mark.parametrize("weight", [0, -1, "1", float("nan")])
    def test_invalid_weight(self, weight):
        with pytest.raises(ValueError, match="positive"):
            SampleMultiplexer({IterableWrapper([1]): weight})

    def test_single_source_length_pickle(self):
        assert list(SampleMultiplexer({IterableWrapper("abc"): 2})) == ["a", "b", "c"]
        d = {IterableWrapper(range(3)): 1, IterableWrapper(range(4)): 1}
        pipe = SampleMultiplexer(d, seed=1)
        assert len(pipe) == 7
        clone = pickle.loads(pickle.dumps(pipe))
        assert list(clone) == list(pipe)

    @pytest.mark.parametrize("n", [0, 1, 4, 9, 10, 11])
    def test_resumes(self, n):
        def make():
            d = {IterableWrapper(range(3)): 1, IterableWrapper(range(10, 16)): 2, IterableWrapper("ab"): 1}
            return SampleMultiplexer(d, seed=11)

        assert_resumes(make, n)

    @pytest.mark.parametrize("n", [0, 6])
    def test_resumes_with_loader_seed(self, n):
        def make():
            d = {IterableWrapper(range(5)): 1, IterableWrapper(range(10, 15)): 1}
            return SampleMultiplexer(d).set_seed(3)

        assert_resumes(make, n)
