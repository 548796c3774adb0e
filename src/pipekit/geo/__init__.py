"""Geospatial datasets: bounding-box queries, composition across CRSs, samplers.

The datasets live in :mod:`pipekit.geo._base` (:class:`GeoDataset`),
:mod:`pipekit.geo._raster` (:class:`RasterDataset`) and
:mod:`pipekit.geo._composition` (``a & b``, ``a | b``); what their files are (listing, dates, scenes,
headers, the saved index) in :mod:`pipekit.geo.catalog`; how their pixels are read in
:mod:`pipekit.geo._reader` and :mod:`pipekit.geo.io`; the samplers in :mod:`pipekit.geo.samplers`.

>>> from pipekit.geo import BoundingBox, RandomGeoSampler, GridGeoSampler, stack_samples
"""

# first: without the geo extra, say how to install it (not a bare "No module named 'rasterio'")
from pipekit.geo import _requirements  # noqa: F401  isort: skip
from pipekit.errors import GeoReferenceError
from pipekit.geo._base import GeoDataset
from pipekit.geo._bbox import BoundingBox
from pipekit.geo._collate import concat_samples, merge_samples, stack_samples, unbind_samples
from pipekit.geo._composition import IntersectionDataset, UnionDataset
from pipekit.geo._index import GeoIndex
from pipekit.geo._pipes import GeoReader
from pipekit.geo._plot import plot_sample
from pipekit.geo._raster import RasterDataset
from pipekit.geo._read import Grid, patch_shape
from pipekit.geo._vector import VectorDataset
from pipekit.geo._write import write_geotiff
from pipekit.geo.io import RasterOpener, close_cached_handles, set_handle_budget
from pipekit.geo.samplers import (
    BatchGeoSampler,
    DistributedGeoSampler,
    GeoSampler,
    GeoSamplerPipe,
    GridGeoSampler,
    PreChippedGeoSampler,
    RandomBatchGeoSampler,
    RandomGeoSampler,
    Units,
    tile_to_chips,
)

__all__ = [
    "BatchGeoSampler",
    "BoundingBox",
    "GeoDataset",
    "GeoIndex",
    "GeoReferenceError",
    "Grid",
    "IntersectionDataset",
    "RasterDataset",
    "RasterOpener",
    "UnionDataset",
    "close_cached_handles",
    "patch_shape",
    "plot_sample",
    "set_handle_budget",
    "write_geotiff",
    "GeoReader",
    "DistributedGeoSampler",
    "GeoSampler",
    "GeoSamplerPipe",
    "GridGeoSampler",
    "PreChippedGeoSampler",
    "RandomBatchGeoSampler",
    "RandomGeoSampler",
    "Units",
    "concat_samples",
    "merge_samples",
    "stack_samples",
    "tile_to_chips",
    "unbind_samples",
    "VectorDataset",
]
