"""Geo datasets: :class:`RasterDataset` and its compositions ``a & b`` and ``a | b`` (a compatibility module).

The code lives in modules by concern; this module re-exports what was
importable from it before the split:

* :mod:`pipekit.geo.base`: :class:`GeoDataset`, the sample types and the
  CRS, resolution and dtype helpers;
* :mod:`pipekit.geo.discovery`: finding files, dates from their names,
  their headers, scenes of band files, :class:`GeoReferenceError`;
* :mod:`pipekit.geo.raster`: :class:`RasterDataset`;
* :mod:`pipekit.geo.composition`: :class:`IntersectionDataset` and
  :class:`UnionDataset`.
"""

from __future__ import annotations

# aliased, so re-exported: the other names (helpers, types) code imported from here
from pipekit.geo.base import Arrays as Arrays
from pipekit.geo.base import GeoDataset
from pipekit.geo.base import Sample as Sample
from pipekit.geo.base import _crs_name as _crs_name
from pipekit.geo.base import _default_res as _default_res
from pipekit.geo.base import _fill_dtype as _fill_dtype
from pipekit.geo.base import _numpy_dtype as _numpy_dtype
from pipekit.geo.base import _to_crs as _to_crs
from pipekit.geo.base import _to_res as _to_res
from pipekit.geo.base import _to_tensor as _to_tensor
from pipekit.geo.composition import IntersectionDataset, UnionDataset
from pipekit.geo.composition import _align as _align
from pipekit.geo.composition import _concat as _concat
from pipekit.geo.discovery import GeoReferenceError
from pipekit.geo.discovery import _as_list as _as_list
from pipekit.geo.discovery import _FileTable as _FileTable
from pipekit.geo.discovery import _has_magic as _has_magic
from pipekit.geo.discovery import _is_sidecar as _is_sidecar
from pipekit.geo.discovery import _Lister as _Lister
from pipekit.geo.discovery import _split_name as _split_name
from pipekit.geo.discovery import date_interval as date_interval
from pipekit.geo.raster import RasterDataset
from pipekit.geo.raster import logger as logger

__all__ = [
    "GeoDataset",
    "RasterDataset",
    "IntersectionDataset",
    "UnionDataset",
    "GeoReferenceError",
]
