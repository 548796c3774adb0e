"""Pipes that interleave the items of several sources: ``mux_longest`` and ``SampleMultiplexer``.

torchdata 0.9's ``mux_longest`` (:class:`MultiplexerLongest`) and
:class:`SampleMultiplexer` under the same class names, arguments and outputs.

Resume: ``mux_longest`` records which sources are exhausted and whose turn is
next; ``SampleMultiplexer`` its random generator's state and the weights of
the sources not yet exhausted.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from pipekit.pipes._zipping import _check_pipes
from pipekit.pipes.base import IterDataPipe, functional_datapipe
from pipekit.pipes.state import ResumablePipe, SeededPipe

__all__ = ["MultiplexerLongest", "SampleMultiplexer"]


@functional_datapipe("mux_longest")
class MultiplexerLongest(ResumablePipe):
    """Take one item from each source in turn, skipping exhausted ones, until all are exhausted.

    (functional name: ``mux_longest``).  Unlike torch's ``mux``, which stops
    at the shortest source, every item of every source is yielded.

    Resumable: the snapshot is the set of exhausted sources and whose turn is next.

    Args:
        *datapipes: the sources.

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> dp1, dp2, dp3 = IterableWrapper(range(5)), IterableWrapper(range(10, 15)), IterableWrapper(range(20, 25))
        >>> list(dp1.mux_longest(dp2, dp3))
        [0, 10, 20, 1, 11, 21, 2, 12, 22, 3, 13, 23, 4, 14, 24]
        >>> list(IterableWrapper(range(3)).mux_longest(IterableWrapper("a")))
        [0, 'a', 1, 2]
    """

    state_keys = ("finished", "next")
    _runtime = ("_finished", "_next")

    def __init__(self, *datapipes: IterDataPipe) -> None:
        super().__init__()
        _check_pipes(datapipes, "mux_longest")
        self.datapipes = datapipes
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._finished: set[int] = set()
        self._next = 0

    def state_dict(self) -> dict[str, Any]:
        return {"finished": sorted(self._finished), "next": self._next}

    def restore(self, state: dict[str, Any] | None) -> None:
        self._finished = set(state["finished"]) if state is not None else set()
        self._next = int(state["next"]) if state is not None else 0

    def __iter__(self) -> Iterator[Any]:
        start = self._next
        n = len(self.datapipes)
        iterators = [None if i in self._finished else iter(dp) for i, dp in enumerate(self.datapipes)]
        while len(self._finished) < n:
            for i in range(start, n):
                if i in self._finished:
                    continue
                try:
                    value = next(iterators[i])  # type: ignore[arg-type]
                except StopIteration:
                    self._finished.add(i)
                    continue
                self._next = i + 1
                yield value
            start = 0

    def __len__(self) -> int:
        return sum(len(dp) for dp in self.datapipes)


class SampleMultiplexer(SeededPipe):
    """Draw items from several sources at random, in proportion to their weights, until all are exhausted.

    Each step picks a source with probability proportional to its weight
    among the sources not yet exhausted.  To keep the ratio forever, make the
    sources endless (``cycle()``).  The same draws as torchdata, so a seeded run
    gives torchdata's output.

    Seeding: with ``seed``, the sampling is fixed by it (later epochs continue
    the same random stream) and the DataLoader's ``set_seed`` does not change
    it.  Without ``seed``, ``set_seed(seed)`` (called by the DataLoader with its
    shared seed) fixes the next epoch, and otherwise a seed is drawn from
    ``torch`` at the start of each epoch.

    Resumable: the snapshot holds the RNG state (and the epoch seed) and the
    weights of the sources not yet exhausted.

    Args:
        pipes_to_weights_dict: ``{pipe: weight}`` with positive weights.
        seed: seed of the sampling (optional).

    Example:
        >>> from pipekit.pipes import IterableWrapper, SampleMultiplexer
        >>> source_dp1 = IterableWrapper([0] * 10)
        >>> source_dp2 = IterableWrapper([1] * 10)
        >>> d = {source_dp1: 99999999, source_dp2: 0.0000001}
        >>> list(SampleMultiplexer(pipes_to_weights_dict=d, seed=0))
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]
        >>> d = {IterableWrapper("ab"): 1, IterableWrapper(range(4)): 1}
        >>> list(SampleMultiplexer(d, seed=1))
        ['a', 0, 1, 'b', 2, 3]
    """

    state_keys = ("live",)
    _runtime = ("_live",)

    def __init__(self, pipes_to_weights_dict: dict[IterDataPipe, float], seed: int | None = None) -> None:
        super().__init__()
        if not isinstance(pipes_to_weights_dict, dict) or not pipes_to_weights_dict:
            raise ValueError("SampleMultiplexer: pipes_to_weights_dict must be a non-empty dict {pipe: weight}")
        total = 0.0
        for i, (dp, weight) in enumerate(pipes_to_weights_dict.items()):
            if not isinstance(dp, IterDataPipe):
                raise TypeError(f"SampleMultiplexer: key {i} must be an IterDataPipe, got {type(dp).__name__}")
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
                raise ValueError(f"SampleMultiplexer: weights must be positive numbers, got {weight!r}")
            total += weight
        self.pipes_and_weights = [(dp, w / total) for dp, w in pipes_to_weights_dict.items()]
        # An explicit seed fixes one generator for the pipe's life: each epoch continues its stream.
        self._stream: random.Random | None = random.Random(seed) if seed is not None else None
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._live: list[tuple[int, float]] = [(i, w) for i, (_, w) in enumerate(self.pipes_and_weights)]

    def set_seed(self, seed: int) -> SampleMultiplexer:
        """Seed the next epoch (ignored when the constructor was given a ``seed``)."""
        if self._stream is None:
            super().set_seed(seed)
        return self

    def derive_epoch_seed(self, seed: int | None) -> int | None:
        if self._stream is not None:
            return None  # the constructor's generator goes on: no seed is drawn from torch
        return super().derive_epoch_seed(seed)

    def _generator(self) -> random.Random:
        """The constructor-seeded generator, or else the epoch's (seeded by ``set_seed`` or torch)."""
        return self._stream if self._stream is not None else self.rng

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"live": list(self._live)}
        if self._stream is not None:
            state["rng"] = self._stream.getstate()
        return state

    def restore(self, state: dict[str, Any] | None) -> None:
        if state is None:
            self._init_runtime()
            return
        self._live = [(int(i), float(w)) for i, w in state["live"]]
        if self._stream is not None and state.get("rng") is not None:
            version, internal, gauss = state["rng"]
            self._stream.setstate((version, tuple(internal), gauss))

    def __iter__(self) -> Iterator[Any]:
        rng = self._generator()
        iterators = {i: iter(self.pipes_and_weights[i][0]) for i, _ in self._live}
        while len(self._live) > 1:
            r = rng.random()
            s = 0.0
            chosen: tuple[int, float] | None = None
            for live in self._live:
                s += live[1]
                if r < s:
                    chosen = live
                    break
            if chosen is None:
                continue  # rounding left r above the last cumulative weight: draw again
            i, weight = chosen
            try:
                item = next(iterators[i])
            except StopIteration:
                new_total = 1 - weight
                if new_total <= 0:
                    new_total = sum(w for j, w in self._live if j != i)
                self._live = [(j, w / new_total) for j, w in self._live if j != i]
                continue
            yield item
        if self._live:
            i = self._live[0][0]
            for item in iterators[i]:
                yield item
            self._live = []

    def __len__(self) -> int:
        return sum(len(dp) for dp, _ in self.pipes_and_weights)
