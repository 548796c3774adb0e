"""Geospatial raster products built on :class:`RasterDataset`.

``datasets.RasterDataset`` reads any collection of georeferenced rasters;
the products (Landsat 7/8/9, CDL, Sentinel-2, NAIP) describe their file
naming, bands and colours.  Compose them with ``&`` (intersection) and ``|``
(union) across CRSs.

Recipes, ready pipelines for the common cases (each a pipe for
:class:`pipekit.DataLoader`, ``train=True/False`` choosing shuffling and
augmentation, every stage replaceable by keyword):

* :class:`ImageFolder`: class-per-folder classification, local or any fsspec URL;
* :class:`TarShards` (also ``WebDataset``): WebDataset tar shards (brace patterns, local or S3);
* :class:`GeoSegmentation`: ``images & labels`` -> sampler -> spectral
  indices -> augmentation -> batches, for semantic segmentation of rasters.
"""

from pipekit.datasets.cdl import CDL, CDL_CLASSES
from pipekit.datasets.geosegmentation import GeoSegmentation
from pipekit.datasets.imagefolder import ImageFolder
from pipekit.datasets.landsat import Landsat, Landsat7, Landsat8, Landsat9
from pipekit.datasets.naip import NAIP
from pipekit.datasets.sentinel2 import Sentinel2
from pipekit.datasets.tar_shards import TarShards, WebDataset
from pipekit.geo.dataset import GeoDataset, IntersectionDataset, RasterDataset, UnionDataset

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
    "ImageFolder",
    "TarShards",
    "WebDataset",
    "GeoSegmentation",
]
