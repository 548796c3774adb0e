"""Import pipekit before pytest collects any module, so doctest collection of src/ files
(which use --import-mode=importlib) and the tests share one copy of each pipekit module.

It also splits the suite in two tiers.  By default the tests marked ``slow``, ``s3`` or
``distributed`` are left out (``./run test``: a few minutes); ``--all`` runs them too
(``./run test --all``, what CI runs).  A file or test named on the command line
(``pytest tests/test_x.py``, ``tests/test_x.py::test_y``) runs in full, and a ``-m``
expression chooses by marker on its own.

Hypothesis profiles (the generative tests, e.g. ``tests/test_resume_contract.py``): ``ci`` is the default,
derandomized (the same examples on every run) and sized for CI (``.ci/run``: ``--all``); ``deep`` draws many
more random examples (about 10 minutes for the resume contract), run by hand: ``./run test
--hypothesis-profile=deep tests/test_resume_contract.py``.  Tests size themselves as a share of the
profile's ``max_examples``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase

import pipekit  # noqa: F401

_SLOW_IS_FINE = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large]
settings.register_profile(
    "ci", derandomize=True, database=None, max_examples=20, deadline=None, print_blob=True,
    suppress_health_check=_SLOW_IS_FINE,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # a failure is reported as found, not shrunk for minutes
)
# deep: random examples, and the failures it finds are replayed first next time from a database outside the clone
settings.register_profile(
    "deep", max_examples=200, deadline=None, print_blob=True, suppress_health_check=_SLOW_IS_FINE,
    database=DirectoryBasedExampleDatabase(Path.home() / ".cache" / "pipekit" / "hypothesis"),
)
settings.load_profile("ci")  # unless --hypothesis-profile names another (hypothesis' plugin loads it later)

FULL_TIER_MARKERS = ("slow", "s3", "distributed")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--all",
        action="store_true",
        dest="run_all_tiers",
        help=f"also run the tests marked {', '.join(FULL_TIER_MARKERS)} (left out by default)",
    )


def _named_files(config: pytest.Config) -> set[Path]:
    """The files named on the command line (``path`` or ``path::test``), resolved."""
    named = set()
    for arg in config.args:
        path = Path(config.invocation_params.dir, arg.split("::", 1)[0])
        if path.is_file():
            named.add(path.resolve())
    return named


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("run_all_tiers") or config.getoption("markexpr"):
        return
    named = _named_files(config)
    keep, left_out = [], []
    for item in items:
        full_tier = any(item.get_closest_marker(m) is not None for m in FULL_TIER_MARKERS)
        if full_tier and Path(item.path).resolve() not in named:
            left_out.append(item)
        else:
            keep.append(item)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = keep
        config.stash[_LEFT_OUT] = len(left_out)


_LEFT_OUT = pytest.StashKey[int]()


def pytest_report_header(config: pytest.Config) -> str | None:
    if config.getoption("run_all_tiers"):
        return "tiers: all (slow, s3 and distributed tests included)"
    return None


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    count = config.stash.get(_LEFT_OUT, 0)
    if count:
        terminalreporter.write_line(
            f"{count} tests marked {', '.join(FULL_TIER_MARKERS[:-1])} or {FULL_TIER_MARKERS[-1]} were left out: "
            "`./run test --all` (pytest --all) runs them, naming a file runs all of its tests"
        )

