"""ImageFolder on folders users make: symbolic links (issue 35: paths)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipekit import datasets


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    for c in ("a", "b"):
        (tmp_path / "root" / c).mkdir(parents=True)
        (tmp_path / "root" / c / f"{c}.jpg").write_bytes(b"x")
    return tmp_path / "root"


def test_symlink_loop_lists_each_file_once(folder: Path) -> None:
    # a link back to its own folder: os.walk(followlinks=True) went round it until ELOOP, ~40 copies of each file
    os.symlink(folder / "a", folder / "a" / "again")
    with pytest.warns(UserWarning, match=r"again.*already listed"):
        pipe = datasets.ImageFolder(folder, train=False, size=8, batch_size=None)
    assert [os.path.basename(u) for u, _ in pipe.samples] == ["a.jpg", "b.jpg"]


def test_linked_class_folder_is_followed(folder: Path, tmp_path: Path) -> None:
    # a class folder that is a link elsewhere (torchvision follows links): its files are listed
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "c.jpg").write_bytes(b"x")
    os.symlink(tmp_path / "elsewhere", folder / "c")
    pipe = datasets.ImageFolder(folder, train=False, size=8, batch_size=None)
    assert pipe.classes == ["a", "b", "c"] and len(pipe.samples) == 3


def test_root_that_is_a_file_says_so(folder: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"ImageFolder: .*a\.jpg' is a file, not a folder of class folders"):
        datasets.ImageFolder(folder / "a" / "a.jpg", train=False, size=8)
