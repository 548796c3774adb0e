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


CHIP_DATASET_NAMES = ["NonGeoDataset", "NonGeoClassificationDataset", "ChipRecipe", "EuroSAT", "COCODetection",
                      "VHR10", "UCMerced", "RESISC45"]
# benchmark datasets (issue 32)
CHIP_DATASET_NAMES += ["EuroSAT100", "EuroSATSpatial", "InriaAerialImageLabeling", "So2Sat",
                       "LandCoverAI", "LandCoverAI100"]
DOWNLOAD_NAMES = ["calculate_md5", "check_integrity", "download_url", "extract_archive", "download_and_extract_archive"]


def test_chip_datasets_and_download_names():
    import pipekit.datasets
    import pipekit.datasets._download
    import pipekit.datasets.utils

    assert [n for n in CHIP_DATASET_NAMES if n not in pipekit.datasets.__all__] == []
    assert pipekit.datasets._download.__all__ == DOWNLOAD_NAMES
    for name in ("check_integrity", "download_and_extract_archive", "download_url", "extract_archive"):
        assert name in pipekit.datasets.utils.__all__  # TorchGeo 0.8's torchgeo.datasets.utils.__all__
        assert getattr(pipekit.datasets.utils, name) is getattr(pipekit.datasets._download, name)


# The public modules (names without a leading underscore) and what the user-facing packages export.
PUBLIC_MODULES = [
    "pipekit",
    "pipekit.adapters",
    "pipekit.cli",
    "pipekit.collate",
    "pipekit.dataloader2",
    "pipekit.datamodules",
    "pipekit.datasets",
    "pipekit.datasets.splits",
    "pipekit.datasets.utils",
    "pipekit.decoders",
    "pipekit.device",
    "pipekit.encoders",
    "pipekit.errors",
    "pipekit.geo",
    "pipekit.geo.catalog",
    "pipekit.geo.io",
    "pipekit.geo.io.handles",
    "pipekit.geo.io.lanes",
    "pipekit.geo.io.opener",
    "pipekit.geo.rangecache",
    "pipekit.geo.rangefetch",
    "pipekit.geo.samplers",
    "pipekit.geo.warpcache",
    "pipekit.malloc",
    "pipekit.pipes",
    "pipekit.pipes.base",
    "pipekit.pipes.iter",
    "pipekit.pipes.map",
    "pipekit.pipes.state",
    "pipekit.profiling",
    "pipekit.retry",
    "pipekit.samplers",
    "pipekit.synthetic",
    "pipekit.synthetic.geo",
    "pipekit.synthetic.images",
    "pipekit.synthetic.stac",
    "pipekit.testing",
    "pipekit.transforms",
    "pipekit.transforms.batch_augment",
    "pipekit.transforms.functional",
    "pipekit.transforms.index_kernels",
    "pipekit.transforms.indices",
    "pipekit.transforms.seeding",
    "pipekit.webdataset",
]

GEO_ALL = [
    "BatchGeoSampler",
    "BoundingBox",
    "DistributedGeoSampler",
    "GeoDataset",
    "GeoIndex",
    "GeoReader",
    "GeoReferenceError",
    "GeoSampler",
    "GeoSamplerPipe",
    "Grid",
    "GridGeoSampler",
    "IntersectionDataset",
    "PreChippedGeoSampler",
    "RandomBatchGeoSampler",
    "RandomGeoSampler",
    "RasterDataset",
    "RasterOpener",
    "UnionDataset",
    "Units",
    "VectorDataset",
    "close_cached_handles",
    "concat_samples",
    "merge_samples",
    "patch_shape",
    "plot_sample",
    "set_handle_budget",
    "stack_samples",
    "tile_to_chips",
    "unbind_samples",
    "write_geotiff",
]

DATASETS_ALL = [
    "BoundingBox",
    "CDL",
    "CDL_CLASSES",
    "COCODetection",
    "ChipRecipe",
    "DatasetNotFoundError",
    "DependencyNotFoundError",
    "EuroSAT",
    "GeoDataset",
    "GeoSegmentation",
    "GeoSlice",
    "ImageFolder",
    "IndexedShards",
    "IntersectionDataset",
    "Landsat",
    "Landsat7",
    "Landsat8",
    "Landsat9",
    "NAIP",
    "NonGeoClassificationDataset",
    "NonGeoDataset",
    "RESISC45",
    "RGBBandsMissingError",
    "RasterDataset",
    "STACDataset",
    "Sentinel2",
    "TarShards",
    "UCMerced",
    "UnionDataset",
    "VHR10",
    "VectorDataset",
    "WebDataset",
    "concat_samples",
    "index_shards",
    "merge_samples",
    "random_bbox_assignment",
    "random_bbox_splitting",
    "random_grid_cell_assignment",
    "roi_split",
    "stack_samples",
    "time_series_split",
    "unbind_samples",
    "utils",
]
# benchmark datasets (issue 32): EuroSAT's variants, Inria, LandCover.ai, So2Sat
DATASETS_ALL = sorted([*DATASETS_ALL, "EuroSAT100", "EuroSATSpatial", "InriaAerialImageLabeling", "So2Sat",
                       "LandCoverAI", "LandCoverAI100", "LandCoverAIGeo"])

TRANSFORMS_ALL = [
    "AppendBNDVI",
    "AppendBandMath",
    "AppendEVI",
    "AppendGBNDVI",
    "AppendGNDVI",
    "AppendGRNDVI",
    "AppendIndex",
    "AppendMNDWI",
    "AppendNBR",
    "AppendNDBI",
    "AppendNDRE",
    "AppendNDSI",
    "AppendNDVI",
    "AppendNDWI",
    "AppendNormalizedDifferenceIndex",
    "AppendRBNDVI",
    "AppendSAVI",
    "AppendSWI",
    "AppendTriBandNormalizedDifferenceIndex",
    "Augment",
    "BandStats",
    "BatchCompose",
    "BatchRandomBrightness",
    "BatchRandomChoice",
    "BatchRandomContrast",
    "BatchRandomCrop",
    "BatchRandomGaussianNoise",
    "BatchRandomHorizontalFlip",
    "BatchRandomResizedCrop",
    "BatchRandomRot90",
    "BatchRandomVerticalFlip",
    "BatchTransform",
    "ColorJitter",
    "CutMix",
    "DEFAULT_BOX_KEYS",
    "MixUp",
    "Normalize",
    "RGBOnly",
    "RandomBrightness",
    "RandomChannelDropout",
    "RandomContrast",
    "RandomGamma",
    "RandomGaussianNoise",
    "RandomHue",
    "RandomRot90",
    "RandomSaturation",
    "RandomStream",
    "TrivialAugment",
    "augment",
    "band_math",
    "batch_augment",
    "bndvi",
    "compute_stats",
    "evi",
    "functional",
    "gbndvi",
    "gndvi",
    "grndvi",
    "index_kernels",
    "indices",
    "mndwi",
    "nbr",
    "ndbi",
    "ndre",
    "ndsi",
    "ndvi",
    "ndwi",
    "normalize",
    "normalized_difference",
    "rbndvi",
    "savi",
    "seeding",
    "spectral",
    "stats",
    "swi",
    "tri_band_normalized_difference",
]


DATAMODULES_ALL = [
    "BaseDataModule",
    "EuroSAT100DataModule",
    "EuroSATDataModule",
    "EuroSATSpatialDataModule",
    "GeoDataModule",
    "InriaAerialImageLabelingDataModule",
    "LIGHTNING_EXTRA",
    "LandCoverAI100DataModule",
    "LandCoverAIDataModule",
    "LandsatCDLDataModule",
    "LightningDataLoader",
    "NonGeoDataModule",
    "RESISC45DataModule",
    "So2SatDataModule",
    "UCMercedDataModule",
    "VHR10DataModule",
    "compute_stats",
]


def test_the_datamodules_names_are_locked():
    import pipekit.datamodules

    assert sorted(pipekit.datamodules.__all__) == DATAMODULES_ALL


def _public_modules() -> list[str]:
    import pathlib

    src = pathlib.Path(pipekit.__file__).parent
    found = []
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src.parent).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        if not any(part.startswith("_") for part in parts):
            found.append(".".join(parts))
    return sorted(found)


def test_the_public_modules_are_locked():
    """A new module is internal (``_name``) unless it is meant to be public: then it is added here and documented."""
    assert _public_modules() == PUBLIC_MODULES


def test_every_public_module_has_a_reference_page():
    import pathlib
    import re

    docs = pathlib.Path(__file__).parents[1] / "docs" / "reference"
    documented = {m for page in docs.glob("*.md") for m in re.findall(r"^::: (pipekit[\w.]*)", page.read_text(), re.M)}
    # the command line is documented as a command (docs/guides/cli.md), not as an API; pipekit.pipes.iter and .map
    # are torchdata's namespaces over the same pipes as pipekit.pipes, documented on its page
    exempt = {"pipekit.cli", "pipekit.pipes.iter", "pipekit.pipes.map"}
    assert [m for m in PUBLIC_MODULES if m not in documented and m not in exempt] == []


def test_the_geo_datasets_and_transforms_names_are_locked():
    import pipekit.datasets
    import pipekit.transforms

    assert sorted(pipekit.geo.__all__) == GEO_ALL
    assert sorted(pipekit.datasets.__all__) == DATASETS_ALL
    assert sorted(pipekit.transforms.__all__) == TRANSFORMS_ALL


def test_every_exported_name_of_the_packages_resolves():
    """Each name in a package's __all__ (lazy ones included, submodules exported by name too) can be got."""
    import pipekit.datasets
    import pipekit.samplers
    import pipekit.transforms

    for package in (pipekit, pipekit.pipes, pipekit.geo, pipekit.datasets, pipekit.samplers, pipekit.transforms):
        missing = [n for n in package.__all__ if not hasattr(package, n)]
        assert missing == [], f"{package.__name__}: {missing}"


def test_device_names():
    import pipekit.device

    assert pipekit.device.__all__ == [
        "to_device",
        "DeviceLoader",
        "prefetch_to_device",
        "default_scale",
        "JpegCropParams",
        "jpeg_crop_stage",
        "decode_jpeg_crops",
    ]
