"""Paths users write: ``~`` and relative paths open as they list (issue 35: paths)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipekit.pipes import FSSpecFileLister, IterableWrapper


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.txt").write_bytes(b"hello")
    return tmp_path


def _read(pipe) -> list[tuple[str, bytes]]:
    return [(url, stream.read()) for url, stream in pipe]


def test_tilde_path_opens_like_fsspec_lists_it(home: Path) -> None:
    # the lister (through fsspec) expands ~; the opener's plain-file path opened '~/...' literally
    assert list(FSSpecFileLister("~/data")) == [str(home / "data" / "a.txt")]
    assert _read(IterableWrapper(["~/data/a.txt"]).open_files_by_fsspec(mode="rb")) == [("~/data/a.txt", b"hello")]


def test_reopen_expands_tilde_too(home: Path) -> None:
    opener = IterableWrapper([]).open_files_by_fsspec(mode="rb")
    assert opener.reopen("~/data/a.txt").read() == b"hello"


def test_relative_path(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(home)
    assert _read(IterableWrapper(["data/a.txt"]).open_files_by_fsspec(mode="rb")) == [("data/a.txt", b"hello")]
    assert [os.path.basename(u) for u in FSSpecFileLister("data")] == ["a.txt"]
