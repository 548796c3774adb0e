"""The old import path pipekit.geo.discovery, now a re-export of pipekit.geo.catalog's modules and pipekit.errors.

The behaviour is tested where it lives: tests/geo/catalog/test_dates.py, test_listing.py, test_scenes.py,
test_headers.py and test_table.py.
"""

from __future__ import annotations

import pickle

import pytest

from pipekit import errors
from pipekit.geo import discovery
from pipekit.geo.catalog import _dates, _headers, _listing, _scenes, _table


def test_old_import_path_keeps_every_name():
    assert sorted(discovery.__all__) == sorted(
        [
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
    )
    for module in (_dates, _headers, _listing, _scenes, _table):
        for name in module.__all__:
            assert getattr(discovery, name) is getattr(module, name), name
    moved_private = ["_PRECISION_STEPS", "_date_interval", "_as_list", "_has_magic", "_Lister", "_glob_matcher"]
    moved_private += ["_is_dir", "_folder_entries", "_scan_folder", "_is_local", "_split_name", "_SIDECAR_SUFFIXES"]
    moved_private += ["_any_sidecar", "_is_sidecar", "_find_files", "_match_scan", "Scene", "_WKT_CACHE", "_wkt"]
    moved_private += ["_WKT_CACHE_SIZE", "_CHUNK", "check_workers", "_progress_bar", "_read_chunk", "_map_threads"]
    moved_private += ["PROGRESS_MIN_FILES", "REMOTE_WORKERS", "_strip_prefix", "_FileTable", "logger"]
    for name in moved_private:
        assert hasattr(discovery, name), name
    assert discovery.GeoReferenceError is errors.GeoReferenceError
    assert discovery.DatasetNotFoundError is errors.DatasetNotFoundError


def test_the_moved_errors_keep_their_kinds_and_messages():
    assert issubclass(errors.DatasetNotFoundError, FileNotFoundError)
    assert issubclass(errors.DatasetNotFoundError, errors.PipekitError)
    assert issubclass(errors.GeoReferenceError, errors.StageError) and issubclass(errors.GeoReferenceError, ValueError)
    error = errors.DatasetNotFoundError("Dated: no files matching filename_glob '*.tif'")
    assert str(error) == "Dated: no files matching filename_glob '*.tif'" and error.errno is None
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is errors.DatasetNotFoundError and str(again) == str(error)
    geo = errors.GeoReferenceError("index raster", "a.tif", "X", "the raster has no geotransform")
    assert str(geo) == "cannot index raster 'a.tif' in X: the raster has no geotransform"
    with pytest.raises(FileNotFoundError):
        raise errors.DatasetNotFoundError("none")
