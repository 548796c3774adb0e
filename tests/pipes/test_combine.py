"""Combining and splitting pipes together."""

from __future__ import annotations

import logging

import pytest

import pipekit
from pipekit.pipes import (
    IterableWrapper,
    SampleMultiplexer,
)

# list() asks for len(); a header over an unsized source warns (once) that its length is a guess.
pytestmark = pytest.mark.filterwarnings("ignore:Header. the source has no length")


class TestWithDataLoader:
    def test_split_and_recombined_pipeline_resumes_by_snapshot(self, caplog):
        caplog.set_level(logging.INFO, logger="pipekit")

        def make():
            a, b = IterableWrapper(range(40)).round_robin_demux(2)
            weights = {a: 1, b.batch(2): 1}
            return SampleMultiplexer(weights, seed=4).zip_longest(IterableWrapper("xyz").cycle(3))

        loader = pipekit.DataLoader(make())
        it = iter(loader)
        head = [next(it) for _ in range(12)]
        state = loader.state_dict()
        rest = list(it)
        resumed = pipekit.DataLoader(make())
        resumed.load_state_dict(state)
        assert list(resumed) == rest
        assert head + rest == [list(t) for t in make()]  # the loader hands tuples over as lists
        assert "replay" not in caplog.text
