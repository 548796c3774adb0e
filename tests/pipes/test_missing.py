"""Names torchdata and the ``webdataset`` library had and pipekit deliberately lacks: each error names the pipekit way.

Every form a user types: a functional name on a pipe (``.list_files_by_s3()``), a ``webdataset`` method on a
pipekit pipe (``.with_epoch(10)``), ``from pipekit.pipes import S3FileLister`` and a ``webdataset`` keyword
argument pipekit refuses.  ``hasattr``/``getattr`` keep their meaning: the names stay missing.
"""

from __future__ import annotations

import pytest

import pipekit.pipes as dp
import pipekit.webdataset as wds
from pipekit.pipes._missing import FUNCTIONAL_NAMES, KEYWORDS, METHODS, REPLACEMENTS, explain_unexpected_keywords

# torchdata 0.9's functional names of the classes in the table (from each class's @functional_datapipe)
TORCHDATA_09 = {
    "list_files_by_s3": "S3FileLister",
    "load_files_by_s3": "S3FileLoader",
    "list_files_by_ais": "AISFileLister",
    "load_files_by_ais": "AISFileLoader",
    "list_files_by_iopath": "IoPathFileLister",
    "open_files_by_iopath": "IoPathFileOpener",
    "save_by_iopath": "IoPathSaver",
    "read_from_gdrive": "GDriveReader",
    "read_from_remote": "OnlineReader",
    "dataframe": "DataFrameMaker",
    "load_parquet_as_df": "ParquetDataFrameLoader",
    "load_from_rar": "RarArchiveLoader",
    "load_from_tfrecord": "TFRecordLoader",
    "sharding_round_robin_dispatch": "ShardingRoundRobinDispatcher",
}


def test_the_table_holds_torchdata_09s_functional_names():
    assert FUNCTIONAL_NAMES == TORCHDATA_09
    assert all(("torchdata", cls) in REPLACEMENTS for cls in FUNCTIONAL_NAMES.values())


def test_no_name_in_the_tables_is_a_functional_name_pipekit_has():
    # an explanation only runs where torch's lookup failed: one for a registered name would be dead text
    assert not (set(FUNCTIONAL_NAMES) | set(METHODS)) & set(dp.IterDataPipe.functions)


class TestFunctionalNames:
    @pytest.mark.parametrize("name", sorted(TORCHDATA_09))
    def test_calling_one_names_the_replacement(self, name):
        pipe = dp.IterableWrapper(["s3://bucket/prefix/"])
        with pytest.raises(AttributeError) as info:
            getattr(pipe, name)()
        message = str(info.value)
        cls = TORCHDATA_09[name]
        assert f"'{name}'" in message and f"torchdata's {cls}" in message, message
        assert REPLACEMENTS["torchdata", cls] in message and "docs/migration/torchdata.md" in message

    @pytest.mark.parametrize("name", ["list_files_by_s3", "load_from_rar"])
    def test_the_name_stays_missing(self, name):
        pipe = dp.IterableWrapper([1])
        assert not hasattr(pipe, name) and getattr(pipe, name, None) is None
        assert name not in dp.IterDataPipe.functions

    def test_registered_names_and_other_misses_are_unchanged(self):
        pipe = dp.IterableWrapper([1, 2, 3])
        assert list(pipe.map(str).header(2)) == ["1", "2"]
        with pytest.raises(AttributeError, match="no attribute 'no_such_pipe") as info:
            pipe.no_such_pipe
        assert "pipekit" not in str(info.value)

    def test_map_style_pipes_are_unchanged(self):
        # torchdata 0.9's map-style pipes had none of these names
        table = dp.SequenceWrapper([1, 2])
        with pytest.raises(AttributeError) as info:
            table.list_files_by_s3
        assert "pipekit" not in str(info.value)
        assert list(table.map(str).to_iter_datapipe()) == ["1", "2"]


class TestWebDatasetMethods:
    """The library's fluid methods, on a pipekit pipe that lacks them (``datasets.WebDataset`` is such a pipe)."""

    @pytest.mark.parametrize("name", ["with_epoch", "to_tuple", "batched", "map_dict", "with_length", "select"])
    def test_on_a_pipekit_pipe(self, name):
        with pytest.raises(AttributeError) as info:
            getattr(dp.IterableWrapper([{".cls": 1}]), name)(1)
        message = str(info.value)
        assert f"webdataset's .{name}()" in message and METHODS[name] in message, message
        assert "docs/migration/webdataset.md" in message

    def test_the_pipe_that_does_the_job_is_named(self):
        with pytest.raises(AttributeError, match=r"header\(n\)") as info:
            dp.IterableWrapper([1]).with_epoch(10)
        assert "cycle()" in str(info.value)

    @pytest.mark.parametrize("name", ["rsample", "xdecode", "mcached", "lmdb_cached", "log_keys", "rename_keys"])
    def test_on_a_pipekit_webdataset_pipeline(self, name):
        with pytest.raises(AttributeError) as info:
            getattr(wds.FluidWrapper([{"cls": b"1"}]), name)
        assert f"webdataset's .{name}()" in str(info.value) and METHODS[name] in str(info.value)

    def test_methods_pipekit_webdataset_has_are_unchanged(self):
        assert callable(wds.FluidWrapper([(1, "a")]).to_tuple)
        assert list(wds.FluidWrapper([(1, "a"), (2, "b")]).with_epoch(3)) == [(1, "a"), (2, "b"), (1, "a")]


def _from_import(module: str, name: str) -> None:
    exec(f"from {module} import {name}", {})  # the statement users type, compiled as theirs


class TestFromImport:
    @pytest.mark.parametrize(
        ("module", "name", "library"),
        [
            ("pipekit.pipes", "S3FileLister", "torchdata"),
            ("pipekit.pipes.iter", "RarArchiveLoader", "torchdata"),
            ("pipekit.pipes.map", "TFRecordLoader", "torchdata"),
            ("pipekit.webdataset", "RandomMix", "webdataset"),
            ("pipekit.webdataset", "wids", "webdataset"),
        ],
    )
    def test_names_the_replacement(self, module, name, library):
        with pytest.raises(ImportError) as info:
            _from_import(module, name)
        message = str(info.value)
        assert type(info.value) is ImportError and info.value.name == module
        assert f"cannot import name {name!r} from {module!r}" in message, message
        assert REPLACEMENTS[library, name] in message and f"docs/migration/{library}.md" in message

    def test_inside_a_function_and_with_several_names(self):
        def load():
            from pipekit.pipes import Mapper, S3FileLoader  # noqa: F401

        with pytest.raises(ImportError, match="open_files_by_fsspec"):
            load()

    def test_a_name_in_no_table_keeps_pythons_error(self):
        with pytest.raises(ImportError, match=r"^cannot import name 'NoSuchPipe' from 'pipekit.pipes' \(/"):
            _from_import("pipekit.pipes", "NoSuchPipe")

    def test_getattr_and_hasattr_keep_their_meaning(self):
        with pytest.raises(AttributeError, match="list_files_by_fsspec"):
            getattr(dp, "S3FileLister")  # noqa: B009
        assert not hasattr(dp, "S3FileLister") and not hasattr(wds, "RandomMix")
        assert getattr(dp.iter, "S3FileLister", None) is None
        from pipekit.pipes import Mapper

        assert Mapper is dp.Mapper


class TestKeywords:
    """``webdataset.WebDataset``'s keyword arguments, refused by a pipekit class with a TypeError naming the way."""

    class Recipe:
        @explain_unexpected_keywords("webdataset")
        def __init__(self, urls: str, *, shuffle_shards: bool = True) -> None:
            self.urls, self.shuffle_shards = urls, shuffle_shards

    @pytest.mark.parametrize("keyword", ["handler", "nodesplitter", "detshuffle", "seed", "cache_size"])
    def test_a_webdataset_keyword_names_the_replacement(self, keyword):
        with pytest.raises(TypeError) as info:
            self.Recipe("a.tar", **{keyword: 1})
        message = str(info.value)
        assert f"__init__() got an unexpected keyword argument {keyword!r}" in message, message
        assert KEYWORDS[keyword] in message and "docs/migration/webdataset.md" in message

    def test_accepted_and_unknown_keywords_are_unchanged(self):
        assert self.Recipe("a.tar", shuffle_shards=False).shuffle_shards is False
        with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'") as info:
            self.Recipe("a.tar", bogus=1)
        assert "webdataset" not in str(info.value)
        import inspect

        assert list(inspect.signature(self.Recipe).parameters) == ["urls", "shuffle_shards"]
