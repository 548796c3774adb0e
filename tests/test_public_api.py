"""The public API is locked: a change to it must be deliberate and show up in this file's diff."""

from __future__ import annotations

import pipekit
import pipekit.geo
import pipekit.pipes
from pipekit.pipes.base import registered_names

PIPES_ALL = [
    "Augmenter",
    "BatchAsyncMapper",
    "BatchAugmenter",
    "BatchMapper",
    "Batcher",
    "BucketBatcher",
    "Bz2FileLoader",
    "CSVDictParser",
    "CSVParser",
    "CacheError",
    "Collator",
    "CompressionType",
    "Concater",
    "Cycler",
    "Decoder",
    "Decompressor",
    "Demultiplexer",
    "Dropper",
    "EndOnDiskCacheHolder",
    "Enumerator",
    "Extractor",
    "FSSpecFileLister",
    "FSSpecFileOpener",
    "FSSpecSaver",
    "FileLister",
    "FileOpener",
    "Filter",
    "FlatMapper",
    "Flattener",
    "Forker",
    "FullSync",
    "Grouper",
    "HTTPReader",
    "HashChecker",
    "HashError",
    "Header",
    "HttpReader",
    "ImageDecoder",
    "InBatchShuffler",
    "InMemoryCacheHolder",
    "IndexAdder",
    "IndexAppender",
    "IterDataPipe",
    "IterKeyZipper",
    "IterToMapConverter",
    "IterableWrapper",
    "JsonParser",
    "LengthSetter",
    "LineReader",
    "MapBatcher",
    "MapConcater",
    "MapDataPipe",
    "MapInMemoryCacheHolder",
    "MapKeyZipper",
    "MapMapper",
    "MapShuffler",
    "MapToIterConverter",
    "MapUnZipper",
    "MapZipper",
    "Mapper",
    "MaxTokenBucketizer",
    "Multiplexer",
    "MultiplexerLongest",
    "Normalizer",
    "OnDiskCacheHolder",
    "PadCollator",
    "ParagraphAggregator",
    "PinMemory",
    "Prefetcher",
    "RandomSplitter",
    "Repeater",
    "Resumable",
    "RoundRobinDemultiplexer",
    "RoutedDecoder",
    "Rows2Columnar",
    "SampleMultiplexer",
    "Sampler",
    "Saver",
    "SequenceWrapper",
    "ShardExpander",
    "ShardSaver",
    "ShardWriter",
    "ShardingFilter",
    "ShuffledFlatMapper",
    "Shuffler",
    "Slicer",
    "StreamReader",
    "StreamWrapper",
    "TarArchiveLoader",
    "TarSampleLoader",
    "TarWriter",
    "ThreadPoolMapper",
    "UnBatcher",
    "UnZipper",
    "WebDataset",
    "XzFileLoader",
    "ZipArchiveLoader",
    "Zipper",
    "ZipperLongest",
    "functional_datapipe",
]

ITER_NAMES = [
    "add_index",
    "append_index",
    "async_map_batches",
    "augment",
    "augment_batch",
    "batch",
    "bucketbatch",
    "check_hash",
    "collate",
    "concat",
    "cycle",
    "decode",
    "decode_image",
    "decompress",
    "demux",
    "drop",
    "end_caching",
    "enumerate",
    "extract",
    "filter",
    "flatmap",
    "flatten",
    "fork",
    "fullsync",
    "groupby",
    "header",
    "in_batch_shuffle",
    "in_memory_cache",
    "lines_to_paragraphs",
    "list_files",
    "list_files_by_fsspec",
    "load_from_bz2",
    "load_from_tar",
    "load_from_xz",
    "load_from_zip",
    "load_tar_samples",
    "map",
    "map_batches",
    "max_token_bucketize",
    "mux",
    "mux_longest",
    "normalize",
    "on_disk_cache",
    "open_files",
    "open_files_by_fsspec",
    "pad_collate",
    "parse_csv",
    "parse_csv_as_dict",
    "parse_json_files",
    "pin_memory",
    "prefetch",
    "random_split",
    "read_from_http",
    "read_from_stream",
    "read_geo",
    "readlines",
    "repeat",
    "round_robin_demux",
    "routed_decode",
    "rows2columnar",
    "save_by_fsspec",
    "save_to_disk",
    "set_length",
    "shard_expand",
    "sharding_filter",
    "shuffle",
    "shuffled_flatmap",
    "slice",
    "threadpool_map",
    "to_map_datapipe",
    "unbatch",
    "unzip",
    "webdataset",
    "write_shards",
    "zip",
    "zip_longest",
    "zip_with_iter",
    "zip_with_map",
]

MAP_NAMES = ["batch", "concat", "in_memory_cache", "map", "shuffle", "to_iter_datapipe", "unzip", "zip"]

TORCHDATA_CLASS_NAMES = [
    "IterableWrapper",
    "BucketBatcher",
    "MaxTokenBucketizer",
    "FSSpecFileLister",
    "FSSpecFileOpener",
    "FSSpecSaver",
    "TarArchiveLoader",
    "ZipArchiveLoader",
    "Decompressor",
    "WebDataset",
    "ShardExpander",
    "Header",
    "Cycler",
    "Repeater",
    "Enumerator",
    "IndexAdder",
    "LengthSetter",
    "InMemoryCacheHolder",
    "OnDiskCacheHolder",
    "EndOnDiskCacheHolder",
    "IterKeyZipper",
    "MapKeyZipper",
    "SampleMultiplexer",
    "ZipperLongest",
    "MultiplexerLongest",
    "RoundRobinDemultiplexer",
    "RandomSplitter",
    "UnZipper",
    "InBatchShuffler",
    "FlatMapper",
    "ShuffledFlatMapper",
    "BatchMapper",
    "ThreadPoolMapper",
    "Prefetcher",
    "PinMemory",
    "LineReader",
    "CSVParser",
    "CSVDictParser",
    "JsonParser",
    "HttpReader",
    "Saver",
    "HashChecker",
    "Dropper",
    "Slicer",
    "Flattener",
    "Rows2Columnar",
    "ParagraphAggregator",
    "FullSync",
    "IterToMapConverter",
    "MapToIterConverter",
    "Mapper",
    "Filter",
    "Shuffler",
    "Batcher",
    "UnBatcher",
    "Collator",
    "Zipper",
    "Concater",
    "Multiplexer",
    "Forker",
    "Demultiplexer",
    "Grouper",
    "ShardingFilter",
    "FileLister",
    "FileOpener",
    "StreamReader",
    "RoutedDecoder",
    "SequenceWrapper",
    "BatchAsyncMapper",
    "Bz2FileLoader",
    "XzFileLoader",
    "Extractor",
]


def test_pipes_all_is_locked():
    assert sorted(pipekit.pipes.__all__) == PIPES_ALL


def test_every_exported_name_exists():
    for name in pipekit.pipes.__all__:
        assert hasattr(pipekit.pipes, name), name
    for name in pipekit.geo.__all__:
        assert hasattr(pipekit.geo, name), name


def test_torchdata_class_names_are_exported():
    missing = [n for n in TORCHDATA_CLASS_NAMES if n not in pipekit.pipes.__all__]
    assert missing == []


def test_functional_names_are_locked():
    names = [n for n in registered_names("iter") if not n.startswith("_") and n != "trace_as_dataframe"]
    assert names == ITER_NAMES
    assert registered_names("map") == MAP_NAMES


def test_top_level():
    assert set(pipekit.__all__) >= {"DataLoader", "pipes", "geo", "errors", "__version__"}


# torchdata 0.9's ``torchdata.datapipes.map`` names that pipekit has (not the map-style InMemoryCacheHolder, UnZipper).
TORCHDATA_MAP_NAMES = [
    "Batcher",
    "Concater",
    "InMemoryCacheHolder",
    "IterToMapConverter",
    "MapDataPipe",
    "Mapper",
    "SequenceWrapper",
    "Shuffler",
    "UnZipper",
    "Zipper",
]

DATALOADER2_NAMES = [
    "DataLoader2",
    "DistributedReadingService",
    "InProcessReadingService",
    "MultiProcessingReadingService",
    "SequentialReadingService",
]


def test_every_exported_pipe_is_in_exactly_one_torchdata_namespace():
    import pipekit.pipes as dp

    pipes = {
        name: obj
        for name in dp.__all__
        if isinstance(obj := getattr(dp, name), type) and issubclass(obj, dp.IterDataPipe | dp.MapDataPipe)
    }
    members = {kind: [getattr(ns, n) for n in ns.__all__] for kind, ns in (("iter", dp.iter), ("map", dp.map))}
    for name, cls in pipes.items():
        homes = [kind for kind, classes in members.items() if any(c is cls for c in classes)]
        assert len(homes) == 1, f"{name} is in {homes or 'no namespace'}"
    assert len(members["iter"]) + len(members["map"]) == len(pipes)  # nothing else, nothing twice


def test_torchdata_namespace_names():
    import pipekit.pipes as dp

    assert dp.map.__all__ == TORCHDATA_MAP_NAMES
    assert dp.map.Mapper is dp.MapMapper and dp.map.Shuffler is dp.MapShuffler and dp.map.Batcher is dp.MapBatcher
    assert dp.iter.Mapper is dp.Mapper and dp.iter.IterDataPipe is dp.IterDataPipe
    missing = [n for n in TORCHDATA_CLASS_NAMES if n not in {"SequenceWrapper", "IterToMapConverter"}]
    assert [n for n in missing if n not in dp.iter.__all__] == []
    from pipekit.pipes.iter import FileLister, Mapper  # noqa: F401
    from pipekit.pipes.map import SequenceWrapper  # noqa: F401


def test_dataloader2_names():
    import pipekit.dataloader2

    assert set(pipekit.__all__) >= {*DATALOADER2_NAMES, "adapters"}
    for name in DATALOADER2_NAMES:
        assert getattr(pipekit, name) is getattr(pipekit.dataloader2, name)
    assert pipekit.adapters.__all__ == ["Adapter", "Shuffle"]


def test_vector_dataset_is_exported():
    import pipekit.datasets

    assert pipekit.datasets.VectorDataset is pipekit.geo.VectorDataset
    assert "VectorDataset" in pipekit.datasets.__all__ and "VectorDataset" in pipekit.geo.__all__


# TorchGeo 0.8's ``torchgeo.datasets.splits`` names, exported from ``pipekit.datasets`` as TorchGeo does.
DATASET_SPLIT_NAMES = [
    "random_bbox_assignment",
    "random_bbox_splitting",
    "random_grid_cell_assignment",
    "roi_split",
    "time_series_split",
]


def test_dataset_split_names():
    import pipekit.datasets
    import pipekit.datasets.splits

    assert pipekit.datasets.splits.__all__ == DATASET_SPLIT_NAMES
    for name in DATASET_SPLIT_NAMES:
        assert name in pipekit.datasets.__all__
        assert getattr(pipekit.datasets, name) is getattr(pipekit.datasets.splits, name)


CHIP_DATASET_NAMES = ["NonGeoDataset", "NonGeoClassificationDataset", "ChipRecipe", "EuroSAT", "COCODetection"]
DOWNLOAD_NAMES = ["calculate_md5", "check_integrity", "download_url", "extract_archive", "download_and_extract_archive"]


def test_chip_datasets_and_download_names():
    import pipekit.datasets
    import pipekit.datasets.download
    import pipekit.datasets.utils

    assert [n for n in CHIP_DATASET_NAMES if n not in pipekit.datasets.__all__] == []
    assert pipekit.datasets.download.__all__ == DOWNLOAD_NAMES
    for name in ("check_integrity", "download_and_extract_archive", "download_url", "extract_archive"):
        assert name in pipekit.datasets.utils.__all__  # TorchGeo 0.8's torchgeo.datasets.utils.__all__
        assert getattr(pipekit.datasets.utils, name) is getattr(pipekit.datasets.download, name)
