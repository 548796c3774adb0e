"""The public toolkit for resumable and seeded pipes (pipekit.pipes.state)."""

from __future__ import annotations

import pickle
import random
from typing import Any

import pytest
import torch

import pipekit
from pipekit.pipes import IterableWrapper
from pipekit.pipes.base import IterDataPipe, functional_datapipe
from pipekit.pipes.state import (
    ExpandingPipe,
    PermutationSource,
    ResumablePipe,
    SeededPipe,
    check_seed,
    draw_seed,
    find_reopen,
)
from pipekit.testing import assert_resumes

# --------------------------------------------------------------------------- a newcomer's pipe
# Written from CONTRIBUTING.md alone: a resumable, seeded pipe that keeps each item with a
# probability and tags kept items with a running count.  Its resume support is state_dict()
# and restore(); its randomness is SeededPipe's self.rng.
# (Registered by the fixture below rather than with @functional_datapipe, so the name does not
# outlive this module's tests: tests/test_public_api.py locks the registered names.)


class KeepSomeNumbered(SeededPipe):
    """Keep each item with probability ``p`` and number the kept ones (functional name: ``keep_some_numbered``).

    Args:
        source_datapipe: the items.
        p: the probability of keeping an item, in [0, 1].
    """

    state_keys = ("kept",)

    def __init__(self, source_datapipe: Any, p: float = 0.5) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"keep_some_numbered: p must be in [0, 1], got {p!r}")
        self.source_datapipe = source_datapipe
        self.p = p
        self.kept = 0

    def state_dict(self) -> dict[str, Any]:
        return {"kept": self.kept}

    def restore(self, state: dict[str, Any] | None) -> None:
        self.kept = 0 if state is None else state["kept"]

    def __iter__(self):
        for item in self.source_datapipe:
            if self.rng.random() < self.p:
                self.kept += 1  # the position moves before the yield: checkpoints are taken there
                yield self.kept - 1, item


@pytest.fixture(autouse=True, scope="module")
def _registered():
    functional_datapipe("keep_some_numbered")(KeepSomeNumbered)
    yield
    del IterDataPipe.functions["keep_some_numbered"]


def make_newcomer(seed: int = 3):
    return IterableWrapper(range(40)).shuffle(buffer_size=8).set_seed(1).keep_some_numbered(p=0.6).set_seed(seed)


class TestNewcomerPipe:
    @pytest.mark.parametrize("n", [0, 1, 5, 11, 20])
    def test_resumes_exactly(self, n):
        assert_resumes(make_newcomer, n)

    def test_functional_name_and_output(self):
        assert list(IterableWrapper(range(4)).keep_some_numbered(p=1.0)) == [(0, 0), (1, 1), (2, 2), (3, 3)]
        with pytest.raises(ValueError, match="p must be in"):
            IterableWrapper([]).keep_some_numbered(p=2)

    def test_seeded_like_torch_shuffle(self):
        assert list(make_newcomer(3)) == list(make_newcomer(3))
        assert list(make_newcomer(3)) != list(make_newcomer(4))
        torch.manual_seed(0)
        unseeded = IterableWrapper(range(40)).keep_some_numbered()
        a = list(unseeded)
        b = list(unseeded)  # a new epoch draws a new seed from torch
        assert a != b
        torch.manual_seed(0)
        assert list(IterableWrapper(range(40)).keep_some_numbered()) == a

    def test_through_the_dataloader_with_workers_and_resume(self):
        def make():
            # it decides which items exist: before sharding_filter, with the seed all workers share
            return IterableWrapper(range(60)).keep_some_numbered(p=0.5).sharding_filter()

        torch.manual_seed(0)
        loader = pipekit.DataLoader(make(), num_workers=2)
        it = iter(loader)
        head = [next(it) for _ in range(7)]
        state = loader.state_dict()
        rest = list(it)
        resumed = pipekit.DataLoader(make(), num_workers=2)
        resumed.load_state_dict(state)
        assert list(resumed) == rest
        numbers = sorted(n for n, _ in head + rest)
        assert numbers == list(range(len(numbers)))  # every kept item exactly once across the two workers


# --------------------------------------------------------------------------- ResumablePipe


class Counter(ResumablePipe):
    state_keys = ("n",)
    _runtime = ("scratch",)

    def __init__(self, source_datapipe: Any) -> None:
        self.source_datapipe = source_datapipe
        self.n = 0
        self.restores: list[Any] = []
        self._init_runtime()

    def _init_runtime(self) -> None:
        self.scratch = object()  # not picklable state would go here

    def state_dict(self) -> dict[str, Any]:
        return {"n": self.n}

    def restore(self, state: dict[str, Any] | None) -> None:
        self.restores.append(state)
        self.n = 0 if state is None else state["n"]

    def __iter__(self):
        for item in self.source_datapipe:
            self.n += 1
            yield item


class TestResumablePipe:
    def test_restore_applies_to_next_iterator_only(self):
        pipe = Counter(IterableWrapper(range(5)))
        pipe.load_state_dict({"n": 3})
        list(pipe)
        list(pipe)
        assert pipe.restores == [{"n": 3}, None]

    def test_state_dict_returns_pending_state(self):
        pipe = Counter(IterableWrapper(range(5)))
        pipe.load_state_dict({"n": 3})
        assert pipe.state_dict() == {"n": 3}
        it = iter(pipe)
        next(it)
        assert pipe.state_dict() == {"n": 4}

    def test_bad_states_are_refused(self):
        pipe = Counter(IterableWrapper(range(5)))
        with pytest.raises(TypeError, match="expects a dict"):
            pipe.load_state_dict([1, 2])
        with pytest.raises(ValueError, match=r"not a Counter state \(missing n"):
            pipe.load_state_dict({"m": 1})

    def test_runtime_fields_stay_out_of_pickles(self):
        pipe = Counter(IterableWrapper(range(5)))
        scratch = pipe.scratch
        copy = pickle.loads(pickle.dumps(pipe))
        assert "scratch" not in pipe.__getstate__()
        assert copy.scratch is not scratch and copy.n == 0

    def test_missing_methods_are_named(self):
        class Half(ResumablePipe):
            def __iter__(self):
                yield 1

        with pytest.raises(NotImplementedError, match="Half must implement restore"):
            list(Half())
        with pytest.raises(NotImplementedError, match="Half must implement state_dict"):
            Half().state_dict()


# --------------------------------------------------------------------------- SeededPipe


class Noise(SeededPipe):
    def __init__(self, source_datapipe: Any) -> None:
        self.source_datapipe = source_datapipe

    def __iter__(self):
        for item in self.source_datapipe:
            yield item, self.rng.random()


class TestSeededPipe:
    def test_seed_is_pending_until_the_iterator_starts(self):
        pipe = Noise(IterableWrapper(range(3))).set_seed(5)
        assert pipe._seed == 5
        it = iter(pipe)
        next(it)
        assert pipe._seed is None and pipe.epoch_seed == 5

    def test_same_generator_as_random_random(self):
        got = [x for _, x in Noise(IterableWrapper(range(4))).set_seed(9)]
        rng = random.Random(9)
        assert got == [rng.random() for _ in range(4)]

    def test_unseeded_epochs_draw_from_torch(self):
        torch.manual_seed(1)
        expected = draw_seed()
        torch.manual_seed(1)
        pipe = Noise(IterableWrapper(range(2)))
        list(pipe)
        assert pipe.epoch_seed == expected

    def test_rng_state_in_checkpoint_once_used(self):
        pipe = Noise(IterableWrapper(range(4))).set_seed(2)
        it = iter(pipe)
        next(it)
        state = pipe.state_dict()
        assert state["seed"] == 2 and "rng" in state

    @pytest.mark.parametrize("n", [0, 1, 3])
    def test_resumes(self, n):
        assert_resumes(lambda: Noise(IterableWrapper(range(6))).set_seed(4), n)

    def test_check_seed(self):
        assert check_seed(3, "x") == 3
        with pytest.raises(TypeError, match="x: seed must be an int"):
            check_seed(True, "x")
        with pytest.raises(TypeError, match="seed must be an int"):
            Noise(IterableWrapper([])).set_seed("1")


class PerWorkerNoise(Noise):
    seed_per_worker = True


class TestSharedOrPerWorkerSeeds:
    @staticmethod
    def draws(cls: type) -> list[float]:
        pipe = cls(IterableWrapper(range(8)).sharding_filter())
        torch.manual_seed(0)
        return [x for _, x in sorted(pipekit.DataLoader(pipe, num_workers=2))]

    def test_shared_by_default(self):
        draws = self.draws(Noise)  # worker 0 has items 0, 2, 4, 6 and worker 1 items 1, 3, 5, 7
        assert draws[0::2] == draws[1::2]

    def test_per_worker_when_asked(self):
        draws = self.draws(PerWorkerNoise)
        assert draws[0::2] != draws[1::2]
        assert draws == self.draws(PerWorkerNoise)  # still reproducible under torch.manual_seed


# --------------------------------------------------------------------------- PermutationSource


class TestPermutationSource:
    def test_whole_list_permuted_per_epoch(self):
        pipe = PermutationSource(list(range(100)))
        torch.manual_seed(0)
        a, b = list(pipe), list(pipe)
        assert sorted(a) == sorted(b) == list(range(100)) and a != b

    def test_checkpoint_is_two_numbers(self):
        pipe = PermutationSource(list(range(10_000))).set_seed(1)
        it = iter(pipe)
        for _ in range(10):
            next(it)
        assert pipe.state_dict() == {"seed": 1, "yielded": 10}

    @pytest.mark.parametrize("shuffle", [True, False])
    @pytest.mark.parametrize("n", [0, 4, 9])
    def test_resumes(self, n, shuffle):
        assert_resumes(lambda: PermutationSource(list("abcdefghi"), shuffle=shuffle).set_seed(7), n)

    def test_set_shuffle(self):
        pipe = PermutationSource(list(range(5))).set_shuffle(False)
        assert list(pipe) == [0, 1, 2, 3, 4]

    def test_refuses_non_lists(self):
        with pytest.raises(TypeError, match="items must be a list"):
            PermutationSource("abc")


# --------------------------------------------------------------------------- ExpandingPipe


class Repeat3(ExpandingPipe):
    def __init__(self, source_datapipe: Any) -> None:
        self.source_datapipe = source_datapipe
        self._init_runtime()

    def _outputs(self, item: Any):
        return [item] * 3

    def __iter__(self):
        yield from self._expand_all(self.source_datapipe)


class TestExpandingPipe:
    @pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 8])
    def test_resumes_mid_input(self, n):
        assert_resumes(lambda: Repeat3(IterableWrapper(["a", "b", "c"])), n)

    def test_state_names_the_input(self):
        pipe = Repeat3(IterableWrapper(["a", "b"]))
        it = iter(pipe)
        next(it)
        next(it)
        assert pipe.state_dict() == {"active": True, "item": "a", "done": 2}

    def test_non_iterable_output_is_named(self):
        class Bad(Repeat3):
            def _outputs(self, item: Any):
                return 5

        with pytest.raises(TypeError, match="fn must return an iterable, got int"):
            list(Bad(IterableWrapper([1])))


def test_find_reopen_looks_past_pass_through_pipes():
    class Opener(ResumablePipe):
        def reopen(self, url: str) -> str:
            return url

    opener = Opener()
    assert find_reopen(opener.filter(bool).shuffle().sharding_filter()) == opener.reopen
    assert find_reopen(opener.map(str)) is None
