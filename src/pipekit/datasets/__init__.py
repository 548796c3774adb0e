"""Datasets: TorchGeo 0.8's ``torchgeo.datasets`` names for geospatial rasters, and pipekit's recipes.

Code written for TorchGeo ports by changing its imports
(``from torchgeo.datasets import ...`` -> ``from pipekit.datasets import ...``):

* the geo dataset classes: :class:`GeoDataset`, :class:`RasterDataset`
  (any collection of georeferenced rasters), :class:`IntersectionDataset`
  (``a & b``) and :class:`UnionDataset` (``a | b``), composed across CRSs;
* the products: :class:`Landsat` (7, 8, 9: Collection 2 Level-2 band
  files), :class:`CDL`, :class:`Sentinel2`, :class:`NAIP`, which describe
  their file naming, bands and colours;
* :class:`BoundingBox`, :data:`GeoSlice`, the collate functions
  (:func:`stack_samples`, :func:`concat_samples`, :func:`merge_samples`,
  :func:`unbind_samples`), TorchGeo's errors (:class:`DatasetNotFoundError`,
  :class:`DependencyNotFoundError`, :class:`RGBBandsMissingError`) and :mod:`~pipekit.datasets.utils`;
* the splits of :mod:`~pipekit.datasets.splits` (:func:`random_bbox_assignment`,
  :func:`random_bbox_splitting`, :func:`random_grid_cell_assignment`,
  :func:`roi_split`, :func:`time_series_split`).

pipekit's own geo dataset: :class:`STACDataset`, the assets of STAC items
(a static catalog, a STAC API search, stac-geoparquet or ``pystac.Item``
objects), needing the ``stac`` extra.

The geo names (and the chip datasets, which share its errors) need the
``geo`` extra (``pip install "pipekit[geo]"``): they are imported on first
use, so ``import pipekit.datasets`` for :class:`ImageFolder` or
:class:`TarShards` imports no geo package.

Samples, ``dataset.bounds``, ``dataset.index`` and sampler items are
TorchGeo 0.8's (see the migration guide, ``docs/migration/torchgeo.md``,
for the import map and the differences).

Recipes, ready pipelines for the common cases (each a pipe for
:class:`pipekit.DataLoader`, ``train=True/False`` choosing shuffling and
augmentation, every stage replaceable by keyword):

* :class:`ImageFolder`: class-per-folder classification, local or any fsspec URL;
* :class:`TarShards` (also ``WebDataset``): WebDataset tar shards (brace patterns, local or S3);
* :class:`IndexedShards`: the same shards as a map-style dataset, ``dataset[i]`` read with one
  ranged read (``RandomSampler``, ``DistributedSampler``), from the indexes :func:`index_shards` writes;
* :class:`GeoSegmentation`: ``images & labels`` -> sampler -> spectral
  indices -> augmentation -> batches, for semantic segmentation of rasters.

Chip datasets (map-style, TorchGeo 0.8's, and pipes through ``.pipe()``):
:class:`NonGeoDataset`, :class:`NonGeoClassificationDataset` (class folders of
GeoTIFF/PNG/JPEG chips, local or fsspec), :class:`EuroSAT`
(``download=True``), :class:`COCODetection` (COCO JSON boxes and masks),
:class:`ChipRecipe`; downloads in :mod:`pipekit.datasets._download`.

TorchGeo 0.8's benchmark datasets (map-style, ``download=True`` where the host allows it, and pipes through
``.pipe()``; ``LandCoverAIGeo`` is a geo dataset): :class:`VHR10` (NWPU VHR-10 object detection: boxes, labels,
instance masks), :class:`UCMerced` and :class:`RESISC45` (scene classification), :class:`EuroSAT100` and
:class:`EuroSATSpatial` (EuroSAT's 100-chip subset and longitude split),
:class:`InriaAerialImageLabeling` (building masks; a manual download),
:class:`LandCoverAI`, :class:`LandCoverAI100` and :class:`LandCoverAIGeo`
(land cover of Poland, ``download=True``), :class:`So2Sat` (HDF5, the ``hdf5``
extra; a manual download).
"""

from typing import TYPE_CHECKING, Any

from pipekit._optional import lazy_attributes
from pipekit.datasets._imagefolder import ImageFolder
from pipekit.datasets._indexed_shards import IndexedShards, index_shards
from pipekit.datasets._tar_shards import TarShards, WebDataset

if TYPE_CHECKING:  # loaded on first use, see _LAZY below; named here for type checkers and the API reference
    from pipekit.datasets import utils
    from pipekit.datasets._cdl import CDL, CDL_CLASSES
    from pipekit.datasets._coco import COCODetection
    from pipekit.datasets._eurosat import EuroSAT, EuroSAT100, EuroSATSpatial
    from pipekit.datasets._geosegmentation import GeoSegmentation
    from pipekit.datasets._inria import InriaAerialImageLabeling
    from pipekit.datasets._landcoverai import LandCoverAI, LandCoverAI100
    from pipekit.datasets._landcoverai_geo import LandCoverAIGeo
    from pipekit.datasets._landsat import Landsat, Landsat7, Landsat8, Landsat9
    from pipekit.datasets._naip import NAIP
    from pipekit.datasets._nongeo import ChipRecipe, NonGeoClassificationDataset, NonGeoDataset
    from pipekit.datasets._resisc45 import RESISC45  # benchmark datasets: VHR10, UCMerced, RESISC45
    from pipekit.datasets._sentinel2 import Sentinel2
    from pipekit.datasets._so2sat import So2Sat
    from pipekit.datasets._ucmerced import UCMerced
    from pipekit.datasets._vhr10 import VHR10
    from pipekit.datasets.splits import (
        random_bbox_assignment,
        random_bbox_splitting,
        random_grid_cell_assignment,
        roi_split,
        time_series_split,
    )
    from pipekit.errors import DatasetNotFoundError, DependencyNotFoundError, RGBBandsMissingError
    from pipekit.geo._base import GeoDataset
    from pipekit.geo._bbox import BoundingBox, GeoSlice
    from pipekit.geo._collate import concat_samples, merge_samples, stack_samples, unbind_samples
    from pipekit.geo._composition import IntersectionDataset, UnionDataset
    from pipekit.geo._raster import RasterDataset
    from pipekit.geo._stac import STACDataset
    from pipekit.geo._vector import VectorDataset

__all__ = [
    "GeoDataset",
    "RasterDataset",
    "IntersectionDataset",
    "UnionDataset",
    "Landsat",
    "Landsat7",
    "Landsat8",
    "Landsat9",
    "CDL",
    "CDL_CLASSES",
    "Sentinel2",
    "NAIP",
    "BoundingBox",
    "GeoSlice",
    "DatasetNotFoundError",
    "DependencyNotFoundError",
    "RGBBandsMissingError",
    "stack_samples",
    "concat_samples",
    "merge_samples",
    "unbind_samples",
    "utils",
    "ImageFolder",
    "TarShards",
    "WebDataset",
    "IndexedShards",
    "index_shards",
    "GeoSegmentation",
    "VectorDataset",
    "random_bbox_assignment",
    "random_bbox_splitting",
    "random_grid_cell_assignment",
    "roi_split",
    "time_series_split",
    "NonGeoDataset",
    "NonGeoClassificationDataset",
    "ChipRecipe",
    "EuroSAT",
    "COCODetection",
    "STACDataset",
    # benchmark datasets (TorchGeo 0.8's): VHR10, UCMerced, RESISC45
    "VHR10",
    "UCMerced",
    "RESISC45",
    # benchmark datasets (issue 32): EuroSAT's variants, Inria, LandCover.ai, So2Sat
    "EuroSAT100",
    "EuroSATSpatial",
    "InriaAerialImageLabeling",
    "So2Sat",
    "LandCoverAI",
    "LandCoverAI100",
    "LandCoverAIGeo",
]

# Everything but the image recipes, imported on first use (the geo extra's packages stay unimported until then).
_LAZY = {
    "utils": "pipekit.datasets.utils",
    "CDL": "pipekit.datasets._cdl",
    "CDL_CLASSES": "pipekit.datasets._cdl",
    "COCODetection": "pipekit.datasets._coco",
    "EuroSAT": "pipekit.datasets._eurosat",
    "GeoSegmentation": "pipekit.datasets._geosegmentation",
    "Landsat": "pipekit.datasets._landsat",
    "Landsat7": "pipekit.datasets._landsat",
    "Landsat8": "pipekit.datasets._landsat",
    "Landsat9": "pipekit.datasets._landsat",
    "NAIP": "pipekit.datasets._naip",
    "ChipRecipe": "pipekit.datasets._nongeo",
    "NonGeoClassificationDataset": "pipekit.datasets._nongeo",
    "NonGeoDataset": "pipekit.datasets._nongeo",
    "Sentinel2": "pipekit.datasets._sentinel2",
    "random_bbox_assignment": "pipekit.datasets.splits",
    "random_bbox_splitting": "pipekit.datasets.splits",
    "random_grid_cell_assignment": "pipekit.datasets.splits",
    "roi_split": "pipekit.datasets.splits",
    "time_series_split": "pipekit.datasets.splits",
    "BoundingBox": "pipekit.geo._bbox",
    "GeoSlice": "pipekit.geo._bbox",
    "concat_samples": "pipekit.geo._collate",
    "merge_samples": "pipekit.geo._collate",
    "stack_samples": "pipekit.geo._collate",
    "unbind_samples": "pipekit.geo._collate",
    "GeoDataset": "pipekit.geo._base",
    "IntersectionDataset": "pipekit.geo._composition",
    "RasterDataset": "pipekit.geo._raster",
    "UnionDataset": "pipekit.geo._composition",
    "DatasetNotFoundError": "pipekit.errors",
    "DependencyNotFoundError": "pipekit.errors",
    "RGBBandsMissingError": "pipekit.errors",
    "STACDataset": "pipekit.geo._stac",
    "VectorDataset": "pipekit.geo._vector",
    # benchmark datasets: VHR10, UCMerced, RESISC45
    "VHR10": "pipekit.datasets._vhr10",
    "UCMerced": "pipekit.datasets._ucmerced",
    "RESISC45": "pipekit.datasets._resisc45",
    # benchmark datasets (issue 32): EuroSAT's variants, Inria, LandCover.ai, So2Sat
    "EuroSAT100": "pipekit.datasets._eurosat",
    "EuroSATSpatial": "pipekit.datasets._eurosat",
    "InriaAerialImageLabeling": "pipekit.datasets._inria",
    "So2Sat": "pipekit.datasets._so2sat",
    "LandCoverAI": "pipekit.datasets._landcoverai",
    "LandCoverAI100": "pipekit.datasets._landcoverai",
    "LandCoverAIGeo": "pipekit.datasets._landcoverai_geo",
}

_getattr, _dir = lazy_attributes(__name__, _LAZY, globals())


def __getattr__(name: str) -> Any:
    """Import the geo datasets (the geo extra's packages) and the chip datasets on first use."""
    return _getattr(name)


def __dir__() -> list[str]:
    return _dir()
