"""Catalogs: what the entries of a raster dataset are, and where their pixels are read from.

A :class:`~pipekit.geo._raster.RasterDataset` holds a catalog (the
:class:`Catalog` protocol), which it builds once: the file table it indexes
(footprints, times, headers), and for each entry the parts read (URLs and
band indexes) by its :class:`~pipekit.geo._reader.RasterReader`.

* :class:`FileCatalog`: files found under a root by ``filename_glob`` and
  ``filename_regex``, dated by ``date_format``, band files grouped into
  scenes; their headers read, or reused from a saved GeoParquet index
  (:class:`CachedHeaders`, :func:`read_index`, :func:`write_index`);
* :class:`STACCatalog`: the items of a STAC source, their chosen assets as
  the bands of a scene (:class:`~pipekit.geo._stac.STACDataset`).
"""

from __future__ import annotations

from pipekit.geo.catalog._cached_headers import CachedHeaders
from pipekit.geo.catalog._files import FileCatalog, check_bands, file_time_interval
from pipekit.geo.catalog._fingerprints import MtimeStamps, fingerprint_columns, fingerprints
from pipekit.geo.catalog._protocol import Catalog
from pipekit.geo.catalog._saved_index import DEFAULT_NAME, IndexCacheError, SavedIndex, read_index, write_index
from pipekit.geo.catalog._stac import STACCatalog
from pipekit.geo.catalog._stac_assets import header_from_proj, select_assets

__all__ = [
    "DEFAULT_NAME",
    "CachedHeaders",
    "Catalog",
    "FileCatalog",
    "IndexCacheError",
    "MtimeStamps",
    "STACCatalog",
    "check_bands",
    "SavedIndex",
    "file_time_interval",
    "header_from_proj",
    "fingerprint_columns",
    "fingerprints",
    "read_index",
    "select_assets",
    "write_index",
]
