"""Tests for datasets.IndexedShards and datasets.index_shards: random access into real tar shards."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import torch
from torch.utils.data import DistributedSampler, RandomSampler

import pipekit
from pipekit import datasets
from pipekit.errors import IndexCacheError, ReadError
from pipekit.pipes import IterableWrapper, ShardWriter
from pipekit.synthetic import write_image_shards

SHARDS, PER_SHARD = 3, 5
PATTERN = "shard-{000000..000002}.tar"


@pytest.fixture(scope="module")
def jpeg_shards(tmp_path_factory) -> Path:
    """Real JPEG shards written without an index (as users have them), then indexed."""
    root = tmp_path_factory.mktemp("indexed")
    write_image_shards(root, shards=SHARDS, per_shard=PER_SHARD, size=16, progress=False)
    datasets.index_shards(str(root / PATTERN))
    return root


def _streamed(urls: list[str], storage_options=None) -> list[dict]:
    pipe = IterableWrapper(urls).open_files_by_fsspec(mode="rb", **(storage_options or {})).load_tar_samples()
    return list(pipe)


def _write(root: Path, n: int = 7, **kw) -> list[str]:
    """PNG + cls + json samples of varied sizes in shards of 3, with their indexes."""
    with ShardWriter(str(root / "w-%03d.tar"), maxcount=3, verbose=0, index=True, mtime=0, **kw) as sink:
        for i in range(n):
            sink.write({"__key__": f"k{i:03d}", "png": torch.full((3, 2 + i, 3), i, dtype=torch.uint8),
                        "cls": i, "json": {"i": "x" * (i * 97)}})
    return sink.shards


def test_samples_equal_the_streaming_readers_one_read_each(jpeg_shards, monkeypatch):
    ds = datasets.IndexedShards(str(jpeg_shards / PATTERN))
    assert len(ds) == SHARDS * PER_SHARD
    reads, real = [], os.pread

    def pread(fd, n, offset):
        reads.append(offset)
        return real(fd, n, offset)

    monkeypatch.setattr("pipekit.datasets._indexed_shards.os.pread", pread)
    assert [ds[i] for i in range(len(ds))] == _streamed(ds.shards)
    assert len(reads) == len(ds)
    monkeypatch.undo()
    assert ds[-1] == ds[len(ds) - 1]
    with pytest.raises(IndexError, match="out of range"):
        ds[len(ds)]


def test_writer_index_equals_a_scan_of_the_written_shards(tmp_path):
    shards = _write(tmp_path)
    written = [json.loads(Path(s + ".idx.json").read_text()) for s in shards]
    datasets.index_shards(shards, overwrite=True)
    scanned = [json.loads(Path(s + ".idx.json").read_text()) for s in shards]
    assert [d["samples"] for d in written] == [d["samples"] for d in scanned]
    assert written[0]["format"] == "pipekit.shard-index" and written[0]["version"] == 1
    assert written[0]["size"] == os.path.getsize(shards[0])
    ds = datasets.IndexedShards(shards)
    assert [ds[i] for i in range(len(ds))] == _streamed(shards)


def test_random_order_and_distributed_sampler(jpeg_shards):
    ds = datasets.IndexedShards(str(jpeg_shards))
    everything = _streamed(ds.shards)
    order = list(RandomSampler(ds, generator=torch.Generator().manual_seed(1)))
    assert order != sorted(order)
    assert [ds[i] for i in order] == [everything[i] for i in order]
    ranks = [list(DistributedSampler(ds, num_replicas=2, rank=r, shuffle=True, seed=3)) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1]) == 8  # 15 samples padded to equal epochs
    assert set(ranks[0]) | set(ranks[1]) == set(range(len(ds)))


@pytest.mark.timeout(60)
def test_two_workers_read_each_sample_once_and_handles_are_not_pickled(jpeg_shards):
    ds = datasets.IndexedShards(str(jpeg_shards / PATTERN))
    ds[0]  # opens a file in this process
    assert ds._files and not pickle.loads(pickle.dumps(ds))._files
    sampler = RandomSampler(ds, generator=torch.Generator().manual_seed(0))
    loader = pipekit.DataLoader(ds, sampler=sampler, batch_size=None, num_workers=2)
    keys = [s["__key__"] for s in loader]
    assert sorted(keys) == sorted(s["__key__"] for s in _streamed(ds.shards))
    assert keys == [ds[i]["__key__"] for i in list(RandomSampler(ds, generator=torch.Generator().manual_seed(0)))]


def test_missing_index_says_how_to_make_one(tmp_path):
    write_image_shards(tmp_path, shards=1, per_shard=2, size=8, progress=False)
    shard = str(tmp_path / "shard-000000.tar")
    with pytest.raises(ReadError, match=r"has no index.*index_shards\(urls\).*pipekit shard --index") as info:
        datasets.IndexedShards(shard)
    assert info.value.url == shard + ".idx.json" and shard in str(info.value)


def test_stale_index_is_refused_naming_both_files(tmp_path):
    shards = _write(tmp_path, n=3)
    keep = Path(shards[0] + ".idx.json").read_bytes()
    _write(tmp_path, n=2)  # the shard is rewritten (fewer samples)...
    Path(shards[0] + ".idx.json").write_bytes(keep)  # ...and an old index put back beside it
    with pytest.raises(IndexCacheError, match="stale") as info:
        datasets.IndexedShards(shards[0])
    assert info.value.url == shards[0] + ".idx.json" and repr(shards[0]) in str(info.value)
    os.utime(shards[0], (0, 0))  # same size, other mtime: the index no longer describes the file
    datasets.index_shards(shards[0], overwrite=True)
    os.utime(shards[0], (1, 1))
    with pytest.raises(IndexCacheError, match="modified at"):
        datasets.IndexedShards(shards[0])
    Path(shards[0] + ".idx.json").write_text('{"format": "other"}')
    with pytest.raises(IndexCacheError, match="not a pipekit shard index"):
        datasets.IndexedShards(shards[0])
    Path(shards[0] + ".idx.json").write_text('{"format": "pipekit.shard-index", "version": 1, "size": 1, '
                                             '"samples": [["k000", []]]}')
    with pytest.raises(IndexCacheError, match="corrupt: ValueError: sample 'k000' has no members"):
        datasets.IndexedShards(shards[0], check=False)


def test_truncated_shard(tmp_path):
    shards = _write(tmp_path, n=3)
    ds = datasets.IndexedShards(shards[0])
    size = os.path.getsize(shards[0])
    with open(shards[0], "r+b") as f:
        f.truncate(size // 2)
    assert ds[0][".cls"] == b"0"  # before the cut: still read
    with pytest.raises(ReadError, match=r"truncated: sample 'k002'") as info:
        ds[2]
    assert info.value.url == shards[0] and info.value.stage == "IndexedShards"
    with pytest.raises(IndexCacheError, match=f"the shard has {size // 2}"):
        datasets.IndexedShards(shards[0])


def test_compressed_shards_are_not_indexed(tmp_path):
    with pytest.raises(ValueError, match="uncompressed"):
        ShardWriter(str(tmp_path / "s-%02d.tar.gz"), index=True)
    with ShardWriter(str(tmp_path / "s-%02d.tar.gz"), verbose=0) as sink:
        sink.write({"__key__": "a", "cls": 1})
    with pytest.raises(ReadError, match="compressed shards cannot be read at an offset"):
        datasets.index_shards(sink.shards)


@pytest.mark.s3
def test_s3_one_ranged_read_per_sample(s3_server, tmp_path, monkeypatch):
    bucket = s3_server.create_bucket()
    opts = s3_server.storage_options
    shards = _write(tmp_path, n=5)  # written locally, indexed on S3 by a scan
    fs = s3_server.fs()
    for s in shards:
        fs.put(s, f"{bucket}/d/{Path(s).name}")
    urls = [f"s3://{bucket}/d/{Path(s).name}" for s in shards]
    with pytest.raises(ReadError, match="has no index"):
        datasets.IndexedShards(urls, storage_options=opts)
    assert datasets.index_shards(f"s3://{bucket}/d/", storage_options=opts) == [u + ".idx.json" for u in urls]
    with monkeypatch.context() as m:  # sizes and ETags come from one listing of the prefix, not a request per shard
        m.setattr("pipekit.datasets._indexed_shards.fingerprint", None)
        ds = datasets.IndexedShards(f"s3://{bucket}/d/", storage_options=opts)
    everything = _streamed(urls, opts)
    assert [ds[i] for i in range(len(ds))] == everything
    assert ds.__getitems__([4, 0, 3]) == [everything[i] for i in (4, 0, 3)]  # ranges requested together
    fs.put(shards[0], f"{bucket}/d/{Path(shards[1]).name}")  # a shard replaced after it was indexed
    with pytest.raises(IndexCacheError, match=r"stale.*w-001\.tar"):
        datasets.IndexedShards(urls, storage_options=opts)
    written = ShardWriter(f"s3://{bucket}/w/w-%03d.tar", maxcount=2, verbose=0, index=True, storage_options=opts)
    with written as sink:
        for i in range(3):
            sink.write({"__key__": f"k{i}", "txt": f"sample {i}"})
    direct = datasets.IndexedShards(written.shards, storage_options=opts)
    assert [direct[i] for i in (2, 0, 1)] == [_streamed(written.shards, opts)[i] for i in (2, 0, 1)]


def test_a_batch_of_indices_is_read_at_once_with_the_same_samples(tmp_path):
    shards = _write(tmp_path, n=7)
    ds = datasets.IndexedShards(shards)
    order = [6, 0, 3, 3, -1]
    assert ds.__getitems__(order) == [ds[i] for i in order]
    loader = pipekit.DataLoader(ds, batch_size=3, collate_fn=list, num_workers=0)
    assert [s for batch in loader for s in batch] == [ds[i] for i in range(len(ds))]
    with open(shards[2], "r+b") as f:
        f.truncate(600)
    with pytest.raises(ReadError, match="truncated: sample 'k006'"):
        ds.__getitems__([0, 6])


def test_resumes_mid_epoch_with_a_global_shuffle(jpeg_shards):
    ds = datasets.IndexedShards(str(jpeg_shards / PATTERN))

    def loader():
        sampler = RandomSampler(ds, generator=torch.Generator().manual_seed(5))
        return pipekit.DataLoader(ds, sampler=sampler, batch_size=2, collate_fn=list)

    first = loader()
    it = iter(first)
    seen = [s["__key__"] for _ in range(3) for s in next(it)]
    state = first.state_dict()
    rest = [s["__key__"] for batch in it for s in batch]
    resumed = loader()
    resumed.load_state_dict(state)
    assert [s["__key__"] for batch in resumed for s in batch] == rest
    assert sorted(seen + rest) == sorted(s["__key__"] for s in _streamed(ds.shards))
