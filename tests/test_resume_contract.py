"""The loader and resume contract, tested generatively (issue 35: "test the contract, not the paths").

Hypothesis composes small pipelines from the registered pipes (ints, real files listed or opened,
WebDataset tar shards of real JPEGs through ``load_from_tar`` + ``webdataset`` + ``decode``, the
``TarShards`` and ``ImageFolder`` recipes; shuffles, maps, filters, batching, bucketing, zips, forks,
demux + mux, cycle, header, caches and ``sharding_filter``), runs them in ``pipekit.DataLoader`` with 0, 1
or 2 workers (persistent or not, drawn prefetch factors and batch sizes), checkpoints them at a drawn
point (before ``iter()``, right after it, mid-epoch, after the last batch, after the epoch ended), injects
a fault (a file deleted or replaced between checkpoint and resume, an unpicklable item, a read error under
``on_error="raise"`` and ``"skip"``) and checks the invariant of :mod:`contract.harness`: the resumed run
yields exactly what the uninterrupted run yields after the checkpoint, or a typed ``PipekitError`` naming
the cause is raised within a bounded time.  The writing side (:mod:`contract.writing`): ``write_shards``
in a DataLoader, resumed or not, leaves shards holding every sample exactly once, or raises.

Profiles (root ``conftest.py``): ``ci`` (derandomized, about 2 minutes for this file on two cores; the
default under ``--all`` and in CI) and ``deep`` (``./run test --hypothesis-profile=deep
tests/test_resume_contract.py``).  Cases of a defect already known (and being fixed) are listed in
:data:`KNOWN_DEFECTS`: they are left out of the generated examples (counted as hypothesis events) and
each has a pinned minimal example that must still break the contract.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from contract import harness
from contract.harness import ContractBrokenError, run_case
from contract.pipelines import FILE_SOURCES, POINTS, RECIPES, SOURCES, Case, Corpus, write_corpus
from contract.writing import WriteCase, run_write_case

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

LEVEL0 = [("shuffle", 3), ("shuffle", 8), ("map",), ("filter",), ("batch", 2), ("batch", 4), ("bucketbatch", 3),
          ("max_token", 4), ("zip",), ("fork_zip",), ("demux_mux",), ("cycle", 2), ("header", 7), ("cache",)]
LEVEL1 = [("in_batch_shuffle",), ("unbatch",), ("map",), ("filter",), ("shuffle", 3), ("header", 3), ("cache",)]
OPAQUE = [("map",), ("filter",), ("shuffle", 3), ("header", 3), ("cache",), ("cycle", 2)]  # recipe's batches
BATCHING = {"batch", "bucketbatch", "max_token"}


@st.composite
def cases(draw: Callable[..., Any], faults: tuple[str | None, ...] = (None,), workers: tuple[int, ...] = (0,)) -> Case:
    fault = draw(st.sampled_from(faults))
    sources = SOURCES
    if fault in ("delete", "replace"):
        sources = FILE_SOURCES
    elif fault == "read_error":
        sources = tuple(s for s in FILE_SOURCES if s != "listed_files")
    source = draw(st.sampled_from(sources))
    recipe = source in RECIPES
    recipe_batch = draw(st.sampled_from([None, 3])) if recipe else None
    level = 2 if recipe_batch else 0
    ops: list[tuple[Any, ...]] = []
    for _ in range(draw(st.integers(0, 4))):
        op = draw(st.sampled_from({0: LEVEL0, 1: LEVEL1, 2: OPAQUE}[level]))
        ops.append(op)
        if op[0] in BATCHING:
            level = 1
        elif op[0] == "unbatch":
            level = 0
    if fault in ("lock", "generator"):
        ops.insert(draw(st.integers(0, len(ops))), (fault,))
    shard_at = None if recipe else draw(st.integers(0 if source == "ints" else -1, len(ops)))
    num_workers = draw(st.sampled_from(workers))
    point = draw(st.sampled_from(("after_iter", "mid", "last") if fault in ("delete", "replace") else POINTS))
    return Case(
        source=source,
        ops=tuple(ops),
        shard_at=shard_at,
        num_workers=num_workers,
        persistent=draw(st.booleans()) if num_workers else True,
        prefetch_factor=draw(st.sampled_from([None, 1, 3])) if num_workers else None,
        batch_size=draw(st.sampled_from([None, 2])) if level == 0 and fault not in ("lock", "generator") else None,
        recipe_batch=recipe_batch,
        point=point,
        fraction=draw(st.integers(0, 10)) / 10,
        via=draw(st.sampled_from(["pickle", "torch_save"])),
        fault=fault,
        victim=draw(st.integers(0, 15)) if fault in ("delete", "replace", "read_error") else 0,
        on_error=draw(st.sampled_from(["raise", "skip"])) if fault == "read_error" else "raise",
        seed=draw(st.integers(0, 3)),
        reseed=draw(st.booleans()),
    )


# --- defects known and being fixed elsewhere ----------------------------------------------------------------
# Each entry: a predicate over the drawn case (as narrow as the defect) and a pinned minimal example that
# still breaks the contract.  Generated cases matching a predicate are not run (hypothesis counts them as
# events); the pinned examples must still break the contract.  THE LEAD REMOVES AN ENTRY WHEN ITS FIX LANDS (the
# pinned example then passes and its strict xfail fails, which is the reminder).


def _has(case: Case, *names: str) -> bool:
    return any(op[0] in names for op in case.ops)


BUFFERING = ("shuffle", "bucketbatch", "max_token", "cache", "demux_mux", "fork_zip")


def _buffered_after_fault(case: Case) -> bool:
    """An op that holds items across a yield comes after the unpicklable item is made."""
    at = next((i for i, op in enumerate(case.ops) if op[0] in ("lock", "generator")), len(case.ops))
    return any(op[0] in BUFFERING for op in case.ops[at + 1:])


KNOWN_DEFECTS: dict[str, tuple[Callable[[Case], bool], Case]] = {
}


# write_shards in a DataLoader (the pinned examples run in test_known_defect_still_breaks_the_contract too)
KNOWN_WRITING_DEFECTS: dict[str, tuple[Callable[[WriteCase], bool], WriteCase]] = {
}


# intermittent: seen failing in some runs only, with no deterministic minimal example (none is pinned)
INTERMITTENT_DEFECTS: dict[str, Callable[[Case], bool]] = {
}


def known_defect(case: Case | WriteCase) -> str | None:
    table: dict[str, Any] = KNOWN_WRITING_DEFECTS if isinstance(case, WriteCase) else KNOWN_DEFECTS
    found = next((name for name, (matches, _) in table.items() if matches(case)), None)
    if found is None and isinstance(case, Case):
        found = next((name for name, matches in INTERMITTENT_DEFECTS.items() if matches(case)), None)
    return found


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    return write_corpus(tmp_path_factory.mktemp("contract"))


class _Scratch:
    """A fresh folder per example (hypothesis runs many examples in one test call)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.n = 0

    def next(self) -> Path:
        self.n += 1
        return self.base / f"example{self.n}"


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> _Scratch:
    return _Scratch(tmp_path_factory.mktemp("scratch"))


def _run(case: Case | WriteCase, corpus: Corpus, scratch: _Scratch) -> None:
    if isinstance(case, WriteCase):
        run_write_case(case, scratch.next())
    else:
        run_case(case, corpus, scratch.next())


def check(case: Case | WriteCase, corpus: Corpus, scratch: _Scratch) -> None:
    name = known_defect(case)
    if name is not None:
        event(f"known defect, not run: {name}")
        return
    try:
        _run(case, corpus, scratch)
    except ContractBrokenError as exc:
        raise ContractBrokenError(f"{exc}\n  case: {case.short() if isinstance(case, Case) else case}") from exc


def examples(share: int) -> settings:
    """``share`` percent of the profile's ``max_examples`` (worker examples cost 10x those without)."""
    return settings(max_examples=max(1, settings.default.max_examples * share // 100), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.filter_too_much, HealthCheck.data_too_large])


@examples(500)
@given(case=cases())
def test_resume_is_exact_without_workers(case: Case, corpus: Corpus, scratch: _Scratch) -> None:
    check(case, corpus, scratch)


@examples(150)
@given(case=cases(workers=(1, 2)))
def test_resume_is_exact_with_workers(case: Case, corpus: Corpus, scratch: _Scratch) -> None:
    check(case, corpus, scratch)


@examples(1000)
@given(case=cases(faults=("delete", "replace", "lock", "generator", "read_error")))
def test_faults_without_workers(case: Case, corpus: Corpus, scratch: _Scratch) -> None:
    check(case, corpus, scratch)


@examples(100)
@given(case=cases(faults=("delete", "replace", "lock", "generator", "read_error"), workers=(1, 2)))
def test_faults_with_workers(case: Case, corpus: Corpus, scratch: _Scratch) -> None:
    check(case, corpus, scratch)


write_cases = st.builds(
    WriteCase,
    samples=st.integers(0, 20),
    maxcount=st.integers(1, 6),
    shuffle=st.booleans(),
    num_workers=st.sampled_from([0, 0, 1, 2]),
    persistent=st.booleans(),
    stop_after=st.none() | st.integers(0, 4),
    seed=st.integers(0, 3),
)


@examples(100)
@given(case=write_cases)
def test_written_shards_hold_every_sample_once(case: WriteCase, corpus: Corpus, scratch: _Scratch) -> None:
    check(case, corpus, scratch)


@pytest.mark.parametrize("name", sorted(KNOWN_DEFECTS) + sorted(KNOWN_WRITING_DEFECTS))
def test_known_defect_still_breaks_the_contract(name: str, corpus: Corpus, scratch: _Scratch,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The pinned minimal example of each known defect; remove the entry when its fix lands."""
    monkeypatch.setattr(harness, "BOUND_S", 10.0)  # the hang's example waits this long
    matches, case = {**KNOWN_DEFECTS, **KNOWN_WRITING_DEFECTS}[name]
    assert matches(case), f"{name}: the pinned example does not match its own predicate"
    with pytest.raises(ContractBrokenError):
        _run(case, corpus, scratch)
