"""Tests of webdataset grouping and shard_expand, on real tar shards (local and S3)."""

from __future__ import annotations

import gc
import io
import itertools
import pickle
import tarfile
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data.datapipes.utils.common import StreamWrapper

from pipekit.errors import ParseError
from pipekit.pipes import IterableWrapper, ShardExpander, WebDataset
from pipekit.pipes._resume import prepare_for_resume, restore_pipeline, snapshot_pipeline
from pipekit.testing import assert_resumes


def write_shard(path: Path, members: list[tuple[str, bytes]]) -> str:
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return str(path)


def sample_members(shard: int, n: int) -> list[tuple[str, bytes]]:
    out = []
    for k in range(n):
        out.append((f"{k:04d}.jpg", f"img-{shard}-{k}".encode()))
        out.append((f"{k:04d}.cls", str(k).encode()))
    return out


@pytest.fixture
def shards(tmp_path: Path) -> list[str]:
    """Two shards whose member names are the same (``0000.jpg``...), 3 samples each."""
    return [write_shard(tmp_path / f"shard-{i:02d}.tar", sample_members(i, 3)) for i in range(2)]


def read_item(item):
    url, stream = item
    return url, stream.read()


def materialize(sample: dict[str, Any]) -> dict[str, Any]:
    return {k: (v if k == "__key__" else v.read()) for k, v in sample.items()}


def wds(paths, **kwargs):
    return IterableWrapper(paths).open_files_by_fsspec(mode="rb", **kwargs).load_from_tar().webdataset()


class TestWebDataset:
    def test_grouping_and_key_format(self, shards: list[str]) -> None:
        got = [materialize(s) for s in wds(shards)]
        assert got[0] == {"__key__": f"{shards[0]}/0000", ".jpg": b"img-0-0", ".cls": b"0"}
        assert got[2] == {"__key__": f"{shards[0]}/0002", ".jpg": b"img-0-2", ".cls": b"2"}
        assert len(got) == 6

    def test_key_changes_at_archive_boundary(self, shards: list[str]) -> None:
        keys = [s["__key__"] for s in wds(shards)]
        # both shards hold 0000..0002: the archive URL in the key keeps their samples apart
        assert keys == [f"{shards[i]}/{k:04d}" for i in range(2) for k in range(3)]

    def test_values_are_member_streams(self, shards: list[str]) -> None:
        sample = next(iter(wds(shards[:1])))
        assert isinstance(sample[".jpg"], StreamWrapper)
        assert sample[".jpg"].read() == b"img-0-0"

    def test_early_stop_closes_only_the_buffered_sample(self, shards: list[str]) -> None:
        pipe = wds(shards[:1])
        it = iter(pipe)
        first = next(it)
        buffered = pipe._sample[".jpg"]  # the look-ahead member of the next sample
        del it
        gc.collect()
        assert buffered.closed
        assert first[".jpg"].read() == b"img-0-0"  # what was handed out stays usable
        assert first[".cls"].read() == b"0"

    def test_new_epoch_closes_the_abandoned_look_ahead(self, shards: list[str]) -> None:
        pipe = wds(shards[:1])
        it = iter(pipe)
        next(it)
        buffered = pipe._sample[".jpg"]
        assert [s["__key__"] for s in pipe] == [f"{shards[0]}/{k:04d}" for k in range(3)]
        assert buffered.closed
        del it  # the old iterator going away must not touch the new epoch's state
        gc.collect()

    def test_multi_dot_extensions_and_directories(self) -> None:
        items = [
            ("s.tar/dir.v2/a.seg.png", b"seg"),
            ("s.tar/dir.v2/a.png", b"png"),
            ("s.tar/dir.v2/b.png", b"png2"),
        ]
        got = list(IterableWrapper(items).webdataset())
        assert got == [
            {"__key__": "s.tar/dir.v2/a", ".seg.png": b"seg", ".png": b"png"},
            {"__key__": "s.tar/dir.v2/b", ".png": b"png2"},
        ]

    def test_backslashes_become_slashes(self) -> None:
        got = list(IterableWrapper([("C:\\data\\s.tar\\x.jpg", b"1")]).webdataset())
        assert got == [{"__key__": "C:/data/s.tar/x", ".jpg": b"1"}]

    def test_names_without_extension_recorded(self) -> None:
        items = [("s.tar/README", b"meta"), ("s.tar/a.jpg", b"1"), ("s.tar/a.cls", b"2")]
        pipe = IterableWrapper(items).webdataset()
        assert list(pipe) == [{"__key__": "s.tar/a", ".jpg": b"1", ".cls": b"2"}]
        assert pipe.skip_log.count == 1
        assert pipe.skip_log.skipped[0].url == "s.tar/README"

    def test_duplicate_extension_is_an_error(self) -> None:
        items = [("s.tar/a.jpg", b"1"), ("s.tar/a.jpg", b"again")]
        with pytest.raises(ParseError, match=r"s\.tar/a\.jpg.*webdataset.*already has a '\.jpg' field"):
            list(IterableWrapper(items).webdataset())

    def test_bad_items(self) -> None:
        with pytest.raises(TypeError, match=r"webdataset: expected \(path, data\) pairs"):
            list(IterableWrapper(["just-a-path.jpg"]).webdataset())
        with pytest.raises(TypeError, match="webdataset"):
            list(IterableWrapper([(3, b"x")]).webdataset())

    def test_empty(self) -> None:
        assert list(IterableWrapper([]).webdataset()) == []

    def test_resume(self, shards: list[str]) -> None:
        def make():
            return IterableWrapper(shards).open_files_by_fsspec(mode="rb").load_from_tar().map(read_item).webdataset()

        for n in (0, 1, 2, 3, 4, 5, 6):  # 3: first sample of shard 2 (the look-ahead crossed the boundary)
            assert_resumes(make, n)

    def test_state_holds_the_look_ahead(self, shards: list[str]) -> None:
        pipe = IterableWrapper(shards[:1]).open_files_by_fsspec(mode="rb").load_from_tar().map(read_item).webdataset()
        it = iter(pipe)
        next(it)
        assert pipe.state_dict() == {"key": f"{shards[0]}/0001", "fields": [(".jpg", False, b"img-0-1")]}
        list(it)
        assert pipe.state_dict() == {"key": None, "fields": []}

    def test_resume_with_streams(self, shards: list[str]) -> None:
        def make():
            return prepare_for_resume(wds(shards))

        expected = [materialize(s) for s in make()]
        for n in (1, 3, 5):
            pipe = make()
            it = iter(pipe)
            head = [materialize(next(it)) for _ in range(n)]
            state = pickle.loads(pickle.dumps(snapshot_pipeline(pipe)))
            rest = [materialize(s) for s in it]  # the live run is unaffected by the snapshot
            assert head + rest == expected
            fresh = make()
            restore_pipeline(fresh, state)
            assert head + [materialize(s) for s in fresh] == expected

    def test_loaded_state_is_reported_until_it_starts(self) -> None:
        items = [("s.tar/0001.cls", b"3"), ("s.tar/0002.jpg", b"img2")]
        pipe = IterableWrapper(items).webdataset()
        state = {"key": "s.tar/0001", "fields": [(".jpg", True, b"img1")]}
        pipe.load_state_dict(state)
        assert pipe.state_dict() == state
        first, second = list(pipe)
        assert first[".jpg"].read() == b"img1"  # the restored stream field
        assert (first["__key__"], first[".cls"]) == ("s.tar/0001", b"3")
        assert second == {"__key__": "s.tar/0002", ".jpg": b"img2"}
        assert pipe.state_dict() == {"key": None, "fields": []}

    def test_pickle(self, shards: list[str]) -> None:
        pipe = wds(shards)
        clone = pickle.loads(pickle.dumps(pipe))
        assert [materialize(s) for s in clone] == [materialize(s) for s in pipe]
        it = iter(pipe)
        next(it)  # a stream is buffered now; it must not be pickled
        again = pickle.loads(pickle.dumps(pipe))
        assert again._sample is None
        assert isinstance(WebDataset(IterableWrapper([])), WebDataset)

    @pytest.mark.s3
    def test_s3(self, s3_server, s3_bucket: str, shards: list[str]) -> None:
        fs = s3_server.fs()
        urls = []
        for p in shards:
            fs.put_file(p, f"{s3_bucket}/wds/{Path(p).name}")
            urls.append(f"s3://{s3_bucket}/wds/{Path(p).name}")
        got = [materialize(s) for s in wds(urls, **s3_server.storage_options)]
        assert [s["__key__"] for s in got] == [f"{urls[i]}/{k:04d}" for i in range(2) for k in range(3)]
        assert got[4] == {"__key__": f"{urls[1]}/0001", ".jpg": b"img-1-1", ".cls": b"1"}

        def make():
            opened = IterableWrapper(urls).open_files_by_fsspec(mode="rb", **s3_server.storage_options)
            return opened.load_from_tar().map(read_item).webdataset()

        assert_resumes(make, 3)


class TestShardExpander:
    def test_torchdata_examples(self) -> None:
        assert list(IterableWrapper(["ds-{00..05}.tar"]).shard_expand()) == [f"ds-0{i}.tar" for i in range(6)]
        got = list(IterableWrapper(["imgs_{00..02}.tar", "labels_{00..02}.tar"]).shard_expand())
        assert got == [f"imgs_0{i}.tar" for i in range(3)] + [f"labels_0{i}.tar" for i in range(3)]

    def test_padding_rules(self) -> None:
        assert list(ShardExpander(IterableWrapper(["s{8..11}"]))) == ["s8", "s9", "s10", "s11"]
        assert list(ShardExpander(IterableWrapper(["s{0..10}"])))[-2:] == ["s9", "s10"]
        assert list(ShardExpander(IterableWrapper(["s{098..101}"]))) == ["s098", "s099", "s100", "s101"]
        assert list(ShardExpander(IterableWrapper(["s{3..3}"]))) == ["s3"]

    def test_several_ranges(self) -> None:
        got = list(IterableWrapper(["gs://b/{0..1}/train-{000..002}-of-{3..3}.tar"]).shard_expand())
        assert got == [f"gs://b/{d}/train-{k:03d}-of-3.tar" for d in range(2) for k in range(3)]

    def test_no_range_passes_through(self) -> None:
        names = ["plain.tar", "weird{abc}.tar", "{}.tar"]
        assert list(IterableWrapper(names).shard_expand()) == names

    @pytest.mark.parametrize(
        ("pattern", "why"),
        [
            ("s-{1..}.tar", "malformed range"),
            ("s-{a..z}.tar", "malformed range"),
            ("s-{1...3}.tar", "malformed range"),
            ("s-{05..100}.tar", "starts with 0"),
            ("s-{100..99}.tar", "longer than the high bound"),
            ("s-{9..1}.tar", "empty"),
        ],
    )
    def test_bad_patterns(self, pattern: str, why: str) -> None:
        with pytest.raises(ValueError, match=why) as info:
            list(IterableWrapper([pattern]).shard_expand())
        assert pattern in str(info.value)
        assert "shard_expand" in str(info.value)

    def test_non_str(self) -> None:
        with pytest.raises(TypeError, match="shard_expand"):
            list(IterableWrapper([3]).shard_expand())

    def test_lazy(self) -> None:
        names = itertools.islice(IterableWrapper(["s-{000000000..999999999}.tar"]).shard_expand(), 2)
        assert list(names) == ["s-000000000.tar", "s-000000001.tar"]

    def test_resume(self) -> None:
        def make():
            return IterableWrapper(["a-{0..2}", "plain", "b-{00..01}-{0..1}"]).shard_expand()

        total = len(list(make()))
        assert total == 3 + 1 + 4
        for n in (0, 1, 3, 4, 6, total):
            assert_resumes(make, n)

    def test_loaded_state_is_reported_until_it_starts(self) -> None:
        pipe = IterableWrapper(["x-{0..3}"]).shard_expand()
        pipe.load_state_dict({"pattern": "x-{0..3}", "yielded": 3})
        assert pipe.state_dict() == {"pattern": "x-{0..3}", "yielded": 3}
        # the rest of the pattern, then the (not restored) upstream from the start
        assert list(pipe) == ["x-3", "x-0", "x-1", "x-2", "x-3"]
        assert pipe.state_dict() == {"pattern": None, "yielded": 0}
        with pytest.raises(ValueError, match="not a ShardExpander state"):
            pipe.load_state_dict({"pattern": "x-{0..3}"})
        with pytest.raises(ValueError, match="not a ShardExpander state"):
            pipe.load_state_dict({"pattern": "x-{0..3}", "yielded": "three"})

    def test_pickle(self) -> None:
        pipe = IterableWrapper(["x-{0..3}"]).shard_expand()
        assert list(pickle.loads(pickle.dumps(pipe))) == ["x-0", "x-1", "x-2", "x-3"]
