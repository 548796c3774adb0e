"""TarShards' local copies of remote shards (datasets._shard_cache) and resume: a copy is stamped as its object.

The shards are served over HTTP on loopback by Python's file server (sizes and ``Last-Modified``, as a plain web
server or a mirror sends them), copied into ``cache_dir`` by ``TarShards(cache_dir=...)``.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterator
from pathlib import Path

import pytest

import pipekit
from mirror_server import serve_folder
from pipekit import datasets
from pipekit.datasets._shard_cache import CachedShardOpener
from pipekit.errors import CheckpointError
from pipekit.pipes import IterableWrapper
from pipekit.synthetic import write_image_shards


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """Two shards of four samples in a folder, and the URL of that folder on a loopback HTTP server."""
    root = tmp_path / "served"
    write_image_shards(root, shards=2, per_shard=4, size=8, progress=False)
    with serve_folder(root) as url:
        yield root, url


def _replace_on_the_server(path: Path) -> None:
    """Other bytes of the same size, and a later modification time (Last-Modified counts whole seconds)."""
    data = path.read_bytes()
    path.write_bytes(data[:-1024] + bytes(255 - b for b in data[-1024:]))
    st = path.stat()
    os.utime(path, (st.st_atime, st.st_mtime + 10))


def _keys(batches: list[dict]) -> list[str]:
    return [key for batch in batches for key in batch["__key__"]]


def _shards(base: str, cache: Path) -> datasets.TarShards:
    return datasets.TarShards(f"{base}/shard-{{000000..000001}}.tar", train=False, batch_size=2, cache_dir=cache)


@pytest.mark.timeout(60)
def test_a_mid_shard_resume_on_a_fresh_cache_is_exact(served, tmp_path):
    """Resumed on another machine (an empty cache_dir), the shard is copied again, byte for byte the same: the
    archive's position used to hold the stamp of the first copy (its mtime) and refused the new one as changed."""
    _, base = served
    full = _keys(list(pipekit.DataLoader(_shards(base, tmp_path / "c0"))))
    loader = pipekit.DataLoader(_shards(base, tmp_path / "c1"))
    it = iter(loader)
    head = _keys([next(it)])  # in shard 0
    state = pickle.loads(pickle.dumps(loader.state_dict()))
    resumed = pipekit.DataLoader(_shards(base, tmp_path / "c2"))
    resumed.load_state_dict(state)
    assert head + _keys(list(resumed)) == full


def _cycled(base: str, cache: Path):
    """Two passes over the shards (the second reads the copies the first made), each member's name and bytes."""
    urls = [f"{base}/shard-{s:06d}.tar" for s in range(2)]
    members = CachedShardOpener(IterableWrapper(urls), cache, {}).load_from_tar()
    return members.map(lambda item: (item[0].rsplit("/", 1)[-1], item[1].read())).cycle(2)


def _checkpoint_in_the_first_pass(base: str, cache: Path) -> tuple[list, dict]:
    loader = pipekit.DataLoader(_cycled(base, cache))
    it = iter(loader)
    head = [next(it) for _ in range(10)]  # shard 0 read (8 members), in shard 1
    return head, pickle.loads(pickle.dumps(loader.state_dict()))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cache", ["same", "fresh"])
def test_a_cycled_resume_refuses_a_shard_changed_on_the_server(served, tmp_path, cache):
    """The second pass reads shard 0 again: changed on the server since the checkpoint, the cache copies it again
    and the resumed run refuses it, naming it, whether the cache is the checkpoint's or an empty one."""
    root, base = served
    _, state = _checkpoint_in_the_first_pass(base, tmp_path / "c1")
    _replace_on_the_server(root / "shard-000000.tar")
    loader = pipekit.DataLoader(_cycled(base, tmp_path / ("c1" if cache == "same" else "c2")))
    loader.load_state_dict(state)
    with pytest.raises(CheckpointError, match=r"shard-000000\.tar' changed since the checkpoint"):
        list(loader)


@pytest.mark.timeout(60)
def test_a_cycled_resume_on_a_fresh_cache_of_unchanged_shards_is_exact(served, tmp_path):
    _, base = served
    full = list(pipekit.DataLoader(_cycled(base, tmp_path / "c0")))
    head, state = _checkpoint_in_the_first_pass(base, tmp_path / "c1")
    resumed = pipekit.DataLoader(_cycled(base, tmp_path / "c2"))
    resumed.load_state_dict(state)
    assert head + list(resumed) == full


def test_a_shard_replaced_on_a_web_server_is_copied_again(served, tmp_path):
    """A web server tells a version by Last-Modified only (no ETag): the copy of a shard replaced by one of the same
    size used to be read stale, its record holding the size alone."""
    root, base = served
    url = f"{base}/shard-000000.tar"
    opener = CachedShardOpener(IterableWrapper([url]), tmp_path / "c", {})
    first = opener.local_copy(url)
    _replace_on_the_server(root / "shard-000000.tar")
    assert Path(opener.local_copy(url)).read_bytes() == (root / "shard-000000.tar").read_bytes() != b""
    assert first == opener.local_copy(url)
