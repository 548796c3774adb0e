"""The torchdata and ``webdataset`` names pipekit deliberately lacks, and what to use instead: one table.

``pipekit.pipes``, its ``iter``/``map`` namespaces and ``pipekit.webdataset`` look a missing name up here
(their module ``__getattr__``), so ``dp.iter.S3FileLister`` raises an ``AttributeError`` that names the
pipekit way instead of a bare "no attribute".  The migration guides list the same names, with reasons.
"""

from __future__ import annotations

__all__ = ["REPLACEMENTS", "missing_name"]

_FSSPEC_LIST = 'list_files_by_fsspec("s3://bucket/prefix/")'
_FSSPEC_OPEN = 'open_files_by_fsspec(mode="rb") on "s3://..." URLs (the s3 extra)'
_TO_SHARDS = "WebDataset shards (convert the records; pipekit.pipes.ShardWriter writes them)"

# (library, name) -> the pipekit way
REPLACEMENTS: dict[tuple[str, str], str] = {
    # torchdata 0.9's datapipes.iter / .map
    ("torchdata", "S3FileLister"): f"{_FSSPEC_LIST} (IterableWrapper([url]).list_files_by_fsspec())",
    ("torchdata", "S3FileLoader"): _FSSPEC_OPEN,
    ("torchdata", "AISFileLister"): f"{_FSSPEC_LIST} on the AIStore bucket's S3 API",
    ("torchdata", "AISFileLoader"): f"{_FSSPEC_OPEN} on the AIStore bucket's S3 API",
    ("torchdata", "IoPathFileLister"): "list_files_by_fsspec (fsspec reaches the same local and remote paths)",
    ("torchdata", "IoPathFileOpener"): "open_files_by_fsspec",
    ("torchdata", "IoPathSaver"): "save_by_fsspec",
    ("torchdata", "HuggingFaceHubReader"): "IterableWrapper(datasets.load_dataset(...)) (Hugging Face datasets)",
    ("torchdata", "GDriveReader"): "read_from_http on a direct download URL",
    ("torchdata", "OnlineReader"): "read_from_http (HttpReader)",
    ("torchdata", "DataFrameMaker"): "IterableWrapper over rows read with pyarrow or pandas",
    ("torchdata", "ParquetDataFrameLoader"): "IterableWrapper(pyarrow.parquet.read_table(path).to_pylist())",
    ("torchdata", "RarArchiveLoader"): "load_from_tar / load_from_zip (convert the .rar archives)",
    ("torchdata", "TFRecordLoader"): _TO_SHARDS,
    ("torchdata", "TFRecordExample"): _TO_SHARDS,
    ("torchdata", "TFRecordExampleSpec"): _TO_SHARDS,
    ("torchdata", "ShardingRoundRobinDispatcher"): "sharding_filter()",
    # the webdataset library
    ("webdataset", "MultiShardSample"): "several WebDatasets mixed with pipekit.pipes.SampleMultiplexer",
    ("webdataset", "RandomMix"): "pipekit.pipes.SampleMultiplexer({ds_a: 0.7, ds_b: 0.3})",
    ("webdataset", "RoundRobin"): "pipekit.pipes.Multiplexer (mux) or MultiplexerLongest (mux_longest)",
    ("webdataset", "ChoppedDataset"): "WebDataset(...).with_epoch(n)",
    ("webdataset", "DBCache"): "pipekit.pipes.InMemoryCacheHolder (in_memory_cache) or WebDataset(cache_dir=...)",
    ("webdataset", "LMDBCached"): "WebDataset(cache_dir=...) (local copies of the shards)",
    ("webdataset", "Cached"): "pipekit.pipes.InMemoryCacheHolder (in_memory_cache)",
    ("webdataset", "detshuffle"): "shuffle(n): pipekit's shuffles are seeded from the DataLoader, deterministic",
    ("webdataset", "xdecode"): 'decode(...) with functions (key, data) -> value, or map_dict(jpg=fn)',
    ("webdataset", "rsample"): "select(predicate) with a seeded random.Random, or pipekit.pipes.RandomSplitter",
    ("webdataset", "wids"): "datasets.WebDataset / WebDataset: random access into shards is not in this version",
    ("webdataset", "ShardList"): "SimpleShardList",
    ("webdataset", "gopen"): "fsspec.open(url) (pipe: URLs: WebDataset(['pipe:cmd args']))",
    ("webdataset", "torch_video"): "decode(fn) with a function (key, data) -> video of your own (torchvision.io)",
    ("webdataset", "torch_audio"): "decode(fn) with a function (key, data) -> audio of your own (torchaudio)",
    ("webdataset", "Continue"): "a handler returning True (ignore_and_continue)",
}


def missing_name(library: str, module: str, name: str) -> AttributeError:
    """The ``AttributeError`` for ``module.name``: naming the replacement when ``name`` is in the table.

    Example:
        >>> str(missing_name("torchdata", "pipekit.pipes.iter", "S3FileLister"))[:88]
        "module 'pipekit.pipes.iter' has no attribute 'S3FileLister' (torchdata's S3FileLister): "
    """
    what = REPLACEMENTS.get((library, name))
    message = f"module {module!r} has no attribute {name!r}"
    if what is None:
        return AttributeError(message)
    return AttributeError(
        f"{message} ({library}'s {name}): pipekit deliberately has no {name}; use {what} "
        f"(see docs/migration/{library}.md)"
    )
