"""datasets.TarShards(resampled=True) resumed: shards drawn with replacement are read again after a checkpoint."""

from __future__ import annotations

import io
import os
import pickle
import tarfile
from pathlib import Path

import pytest
import torch

import pipekit
from pipekit import datasets
from pipekit.errors import CheckpointError

SHARDS, PER_SHARD = 3, 2

pytestmark = pytest.mark.filterwarnings("ignore:Header. the source has no length")


def _write_shard(path: Path, texts: list[str]) -> None:
    with tarfile.open(path, "w") as tar:
        for i, text in enumerate(texts):
            data = text.encode()
            info = tarfile.TarInfo(f"s{i:03d}.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


@pytest.fixture
def shards(tmp_path) -> Path:
    for s in range(SHARDS):
        _write_shard(tmp_path / f"shard-{s}.tar", [f"shard {s} sample {i}" for i in range(PER_SHARD)])
    return tmp_path


def _loader(root: Path, samples: int, num_workers: int = 0) -> pipekit.DataLoader:
    ds = datasets.TarShards(str(root / "shard-{0..2}.tar"), batch_size=None, resampled=True, shuffle_buffer=0,
                            decode=False)
    return pipekit.DataLoader(ds.header(samples), num_workers=num_workers, batch_size=None)


def _item(sample: dict) -> tuple[str, bytes]:
    return sample["__key__"], sample[".txt"]


def _shard_of(key: str) -> str:
    return key.rsplit("/", 1)[0]


def _replace(shard: str) -> None:
    """Other contents, another size and a later mtime: what a shard rewritten in place looks like."""
    _write_shard(Path(shard), [f"rewritten {i} " + "x" * 12_000 for i in range(PER_SHARD)])  # past tar's 10 kB
    st = os.stat(shard)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


def _read_again(items: list[tuple[str, bytes]], at: int) -> list[str]:
    """The shards read before position ``at`` and drawn again after it, but the last one read and the next one
    (the checkpoint's position is past the last sample of the one, at the start of the other): the archive
    loader's own check refuses those as changed."""
    before = {_shard_of(k) for k, _ in items[:at]} - {_shard_of(items[at - 1][0]), _shard_of(items[at][0])}
    return [_shard_of(k) for k, _ in items[at:] if _shard_of(k) in before]


def _split(items: list[tuple[str, bytes]]) -> tuple[int, str]:
    """A checkpoint position at a shard boundary, and a shard read before it that is drawn again after it."""
    for at in range(PER_SHARD, len(items), PER_SHARD):
        again = _read_again(items, at)
        if again:
            return at, again[0]
    raise AssertionError("no shard read both before and after a checkpoint: draw more samples")


def test_a_shard_replaced_after_the_checkpoint_is_refused_when_drawn_again(shards):
    """The resampled shard list draws with replacement but did not say its epoch reads files again: nothing was
    stamped, and a shard read before the checkpoint and rewritten since was read with its new contents."""
    torch.manual_seed(1)
    full = [_item(s) for s in _loader(shards, 12)]
    at, shard = _split(full)
    torch.manual_seed(1)
    first = _loader(shards, 12)
    it = iter(first)
    head = [_item(next(it)) for _ in range(at)]
    assert head == full[:at]
    state = pickle.loads(pickle.dumps(first.state_dict()))
    resumed = _loader(shards, 12)
    resumed.load_state_dict(state)
    assert head + [_item(s) for s in resumed] == full  # unchanged shards: exact
    _replace(shard)
    resumed = _loader(shards, 12)
    resumed.load_state_dict(state)
    with pytest.raises(CheckpointError, match=rf"'{shard}' changed since the checkpoint"):
        list(resumed)


@pytest.mark.timeout(60)
def test_two_workers_resume_exactly_and_refuse_a_replaced_shard(shards):
    torch.manual_seed(1)
    full = [_item(s) for s in _loader(shards, 8, num_workers=2)]
    assert len(full) == 16  # each worker draws its own 8
    torch.manual_seed(1)
    first = _loader(shards, 8, num_workers=2)
    it = iter(first)
    at = 4 * PER_SHARD  # each worker has read two shards
    head = [_item(next(it)) for _ in range(at)]
    state = pickle.loads(pickle.dumps(first.state_dict()))
    resumed = _loader(shards, 8, num_workers=2)
    resumed.load_state_dict(state)
    assert head + [_item(s) for s in resumed] == full
    again = [shard for w in range(2) for shard in _read_again(full[w::2], at // 2)]  # workers take turns
    assert again, "no worker draws a shard again after the checkpoint: pick another seed"
    _replace(again[0])
    resumed = _loader(shards, 8, num_workers=2)
    resumed.load_state_dict(state)
    with pytest.raises(CheckpointError, match=rf"'{again[0]}' changed since the checkpoint"):
        list(resumed)
