"""Issue 13 end to end: a damaged shard is never lost silently, with or without DataLoader workers.

The unit tests live with their modules (``tests/pipes/test_archives.py::TestTruncation``,
``tests/test_loader.py::TestNothingLostAcrossWorkers``); these run the scenarios of the
issue through ``datasets.TarShards`` (``datasets.WebDataset``) and ``pipekit.DataLoader``.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

import pipekit
from pipekit import datasets
from pipekit.errors import ArchiveError
from pipekit.synthetic import write_image_shards

SHARDS, PER_SHARD = 4, 5


@pytest.fixture(scope="module")
def damaged(tmp_path_factory) -> tuple[Path, int]:
    """Four shards; shard 1 cut at a member boundary (where tarfile used to stop quietly).

    Returns the folder and how many complete samples shard 1 still holds.
    """
    root = tmp_path_factory.mktemp("shards")
    write_image_shards(root, shards=SHARDS, per_shard=PER_SHARD, size=16, progress=False)
    path = root / "shard-000001.tar"
    with tarfile.open(path) as tar:
        members = tar.getmembers()
    per_sample = len(members) // PER_SHARD
    cut = members[2 * per_sample].offset  # the header of sample 2's first member
    path.write_bytes(path.read_bytes()[:cut])
    return root, 2


def keys(loader) -> list[str]:
    return [sample["__key__"] for sample in loader]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_cut_shard_raises_naming_it(damaged, num_workers):
    root, _ = damaged
    ds = datasets.WebDataset(str(root), train=False, batch_size=None)
    with pytest.raises(ArchiveError, match=r"shard-000001\.tar.* in load_from_tar: truncated") as info:
        keys(pipekit.DataLoader(ds, num_workers=num_workers))
    assert info.value.url == str(root / "shard-000001.tar")
    assert "(4 members yielded before)" in info.value.reason


@pytest.mark.parametrize("num_workers", [0, 2])
def test_cut_shard_skipped_is_reported(damaged, num_workers):
    root, complete = damaged
    ds = datasets.TarShards(str(root), train=False, batch_size=None, on_error="skip")
    loader = pipekit.DataLoader(ds, num_workers=num_workers)
    got = keys(loader)
    assert len(got) == (SHARDS - 1) * PER_SHARD + complete
    report = loader.skip_report()
    assert report.counts == {"load_from_tar": 1}
    (skipped,) = report.skipped
    assert skipped.url == str(root / "shard-000001.tar") and skipped.stage == "load_from_tar"
    assert skipped.reason.startswith("truncated") and "(4 members yielded before)" in skipped.reason
