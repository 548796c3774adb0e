"""Shard indexes written by ShardWriter / write_shards: each member's offset and size, published after the shard."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from pipekit.errors import ReadError
from pipekit.pipes import IterableWrapper, ShardWriter
from pipekit.pipes._shard_index import scan_tar


def _index(shard: str) -> dict:
    return json.loads(Path(shard + ".idx.json").read_text())


def test_offsets_point_at_each_members_data_with_long_pax_names(tmp_path):
    key = "d/" + "k" * 150  # longer than ustar's 100 bytes: a PAX header precedes the member
    with ShardWriter(str(tmp_path / "s-%02d.tar"), verbose=0, index=True, format="PAX_FORMAT") as sink:
        sink.write({"__key__": key, "txt": "x" * 700, "cls": 1, "seg.json": {"a": 1}})
        sink.write({"__key__": "short", "txt": ""})
    data = Path(sink.shards[0]).read_bytes()
    with tarfile.open(sink.shards[0]) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar}
    samples = _index(sink.shards[0])["samples"]
    assert [k for k, _ in samples] == [key, "short"]
    for k, fields in samples:
        for ext, offset, size in fields:
            assert data[offset:offset + size] == members[f"{k}.{ext}"]
    assert [[k, [list(m) for m in f]] for k, f in scan_tar(io.BytesIO(data), "s", "t")] == samples


def test_write_shards_publishes_an_index_per_shard(tmp_path):
    samples = IterableWrapper([{"__key__": f"{i:03d}", "cls": i} for i in range(5)])
    urls = list(samples.write_shards(str(tmp_path / "p-%02d.tar"), maxcount=2, index=True))
    assert [len(_index(u)["samples"]) for u in urls] == [2, 2, 1]
    assert list(samples.write_shards(str(tmp_path / "q-%02d.tar"), maxcount=5))  # default: no index
    assert not any(p.name.startswith("q-") and p.name.endswith(".idx.json") for p in tmp_path.iterdir())


def test_index_is_refused_where_it_cannot_be_written(tmp_path):
    with pytest.raises(ValueError, match="not through opener"):
        ShardWriter(str(tmp_path / "s-%02d.tar"), index=True, opener=lambda name: io.BytesIO())
    with pytest.raises(ValueError, match="uncompressed"):
        ShardWriter(str(tmp_path / "s-%02d.tar"), index=True, compress=True)


def test_an_index_that_cannot_be_written_fails_the_write(tmp_path, monkeypatch):
    import pipekit.pipes._shard_writer as writer

    def fail(*args, **kwargs):
        raise ReadError("index", args[0], "ShardWriter", "disk full")

    monkeypatch.setattr(writer, "write_index", fail)
    with pytest.raises(ReadError, match="disk full"), ShardWriter(str(tmp_path / "s-%02d.tar"), verbose=0,
                                                                  index=True) as sink:
        sink.write({"__key__": "a", "cls": 1})
