"""Import pipekit before pytest collects any module, so doctest collection of src/ files
(which use --import-mode=importlib) and the tests share one copy of each pipekit module.

It also splits the suite in two tiers.  By default the tests marked ``slow``, ``s3`` or
``distributed`` are left out (``./run test``: a few minutes); ``--all`` runs them too
(``./run test --all``, what CI runs).  A file or test named on the command line
(``pytest tests/test_x.py``, ``tests/test_x.py::test_y``) runs in full, and a ``-m``
expression chooses by marker on its own.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import pipekit  # noqa: F401

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
