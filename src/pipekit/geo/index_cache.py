"""A raster dataset's index saved to GeoParquet and reloaded (a compatibility module).

The code lives in :mod:`pipekit.geo.catalog`: the file format in
``_saved_index``, the files' fingerprints in ``_fingerprints``, and the
headers read or reused from a saved index (what ``RasterDataset(index_cache=)``
does) in ``_cached_headers``.  This module re-exports what was importable
from it before.
"""

from __future__ import annotations

# aliased, so re-exported: the names code imported from here
from pipekit.geo.catalog._cached_headers import _merge as _merge
from pipekit.geo.catalog._fingerprints import MtimeStamps as MtimeStamps
from pipekit.geo.catalog._fingerprints import _fingerprint_columns as _fingerprint_columns
from pipekit.geo.catalog._fingerprints import fingerprint_columns as fingerprint_columns
from pipekit.geo.catalog._fingerprints import fingerprints as fingerprints
from pipekit.geo.catalog._saved_index import DEFAULT_NAME as DEFAULT_NAME
from pipekit.geo.catalog._saved_index import FORMAT as FORMAT
from pipekit.geo.catalog._saved_index import VERSION as VERSION
from pipekit.geo.catalog._saved_index import IndexCacheError as IndexCacheError
from pipekit.geo.catalog._saved_index import SavedIndex as SavedIndex
from pipekit.geo.catalog._saved_index import read_index as read_index
from pipekit.geo.catalog._saved_index import write_index as write_index

__all__ = [
    "DEFAULT_NAME",
    "IndexCacheError",
    "MtimeStamps",
    "SavedIndex",
    "fingerprint_columns",
    "fingerprints",
    "read_index",
    "write_index",
]
