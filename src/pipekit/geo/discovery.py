"""Finding the files of a raster dataset and what their names and headers say (a re-export module).

What a :class:`~pipekit.geo.raster.RasterDataset` does when it is built
lived here; it is now in the modules of :mod:`pipekit.geo.catalog`, one
concern each, and this module keeps every name importable from its old path:

* ``pipekit.geo.catalog._dates``: :func:`date_interval`,
  :func:`date_intervals` and :class:`DateColumn` (dates in file names);
* ``pipekit.geo.catalog._listing``: :func:`find_files`, :func:`find_paths`,
  :func:`any_band_glob`, :func:`gc_paused`, the lister of local folders and
  fsspec URLs, the rules for hidden and GDAL side files, ``_split_name``;
* ``pipekit.geo.catalog._scenes``: :func:`group_scenes` (band files grouped
  into scenes);
* ``pipekit.geo.catalog._headers``: :class:`RasterHeader`, :func:`read_header`,
  :func:`read_headers`, :func:`default_workers`, ``check_workers``,
  ``PROGRESS_MIN_FILES`` and ``REMOTE_WORKERS``;
* ``pipekit.geo.catalog._table``: :class:`HeaderColumns` and ``_FileTable``
  (the per-file metadata of an index, in arrays);
* :mod:`pipekit.errors`: :class:`GeoReferenceError` and
  :class:`DatasetNotFoundError`.

Constants are read where they are defined: set them on their module
(``pipekit.geo.catalog._headers.PROGRESS_MIN_FILES``), not on this one.
"""

from __future__ import annotations

from pipekit.errors import DatasetNotFoundError, GeoReferenceError
from pipekit.geo.catalog._dates import _PRECISION_STEPS, DateColumn, _date_interval, date_interval, date_intervals
from pipekit.geo.catalog._headers import (
    _CHUNK,
    _WKT_CACHE,
    _WKT_CACHE_SIZE,
    PROGRESS_MIN_FILES,
    REMOTE_WORKERS,
    RasterHeader,
    _map_threads,
    _progress_bar,
    _read_chunk,
    _wkt,
    check_workers,
    default_workers,
    read_header,
    read_headers,
)
from pipekit.geo.catalog._listing import (
    _SIDECAR_SUFFIXES,
    _any_sidecar,
    _as_list,
    _find_files,
    _folder_entries,
    _glob_matcher,
    _has_magic,
    _is_dir,
    _is_local,
    _is_sidecar,
    _Lister,
    _match_scan,
    _scan_folder,
    _split_name,
    any_band_glob,
    find_files,
    find_paths,
    gc_paused,
    logger,
)
from pipekit.geo.catalog._scenes import Scene, group_scenes
from pipekit.geo.catalog._table import HeaderColumns, _FileTable, _strip_prefix

__all__ = [
    "DatasetNotFoundError",
    "GeoReferenceError",
    "HeaderColumns",
    "RasterHeader",
    "any_band_glob",
    "DateColumn",
    "date_interval",
    "date_intervals",
    "default_workers",
    "find_files",
    "find_paths",
    "gc_paused",
    "group_scenes",
    "read_header",
    "read_headers",
]

# Names that lived here and are not in __all__, importable from the old path too.
_MOVED = (
    _CHUNK,
    _PRECISION_STEPS,
    _SIDECAR_SUFFIXES,
    _WKT_CACHE,
    _WKT_CACHE_SIZE,
    PROGRESS_MIN_FILES,
    REMOTE_WORKERS,
    Scene,
    _FileTable,
    _Lister,
    _any_sidecar,
    _as_list,
    _date_interval,
    _find_files,
    _folder_entries,
    _glob_matcher,
    _has_magic,
    _is_dir,
    _is_local,
    _is_sidecar,
    _map_threads,
    _match_scan,
    _progress_bar,
    _read_chunk,
    _scan_folder,
    _split_name,
    _strip_prefix,
    _wkt,
    check_workers,
    logger,
)
