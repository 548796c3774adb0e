"""A vector file's features for :class:`~pipekit.geo._vector.VectorDataset`: reading the file, and one per process.

:func:`read_vector` reads a file (pyogrio/GDAL; GeoParquet with geopandas; a remote file through a local copy,
with a Shapefile's parts).  A file's features in one CRS are a :class:`_Layer` (geometries, their ``STRtree``,
attributes, times), kept in the per-process cache :data:`_LAYERS`, never in the dataset object.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import shapely

from pipekit._fs import is_local, url_to_fs
from pipekit.errors import ParseError, ReadError, StageError
from pipekit.geo import io as geo_io
from pipekit.geo._bbox import MAX_TIME, MIN_TIME
from pipekit.geo.catalog._dates import date_interval

if TYPE_CHECKING:
    import pandas as pd

#: files of a Shapefile besides the ``.shp`` (and other side files found next to vector files)
_SIDECARS = (".shx", ".dbf", ".prj", ".cpg", ".qix", ".sbn", ".sbx", ".qmd", ".xml", ".gpkg-wal", ".gpkg-shm")
_SHAPEFILE_PARTS = (".shx", ".dbf", ".prj", ".cpg")


@contextmanager
def _local_file(url: str, storage_options: Mapping[str, Any]) -> Iterator[str]:
    """A local path for ``url``: itself, or a temporary copy of a remote file (with a Shapefile's parts)."""
    if geo_io.is_local(url):
        yield geo_io.local_path(url)
        return

    fs, path = url_to_fs(url, storage_options)
    tmp = tempfile.mkdtemp(prefix="pipekit-vector-")
    try:
        name = path.rsplit("/", 1)[-1]
        fs.get_file(path, os.path.join(tmp, name))
        stem, ext = os.path.splitext(path)
        if ext.lower() == ".shp":
            for part in _SHAPEFILE_PARTS:
                for candidate in (stem + part, stem + part.upper()):
                    if fs.exists(candidate):
                        fs.get_file(candidate, os.path.join(tmp, candidate.rsplit("/", 1)[-1]))
        yield os.path.join(tmp, name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _is_parquet(url: str) -> bool:
    return url.lower().endswith((".parquet", ".geoparquet"))


def read_vector(url: str, layer: str | int | None, storage_options: Mapping[str, Any], stage: str) -> Any:
    """The features of a vector file as a ``GeoDataFrame`` indexed by feature id.

    Raises:
        ReadError: the file cannot be read (names it and ``stage``).
    """
    try:
        with _local_file(url, storage_options) as path:
            if _is_parquet(path):
                import geopandas

                return geopandas.read_parquet(path)
            import pyogrio

            return pyogrio.read_dataframe(path, layer=layer, fid_as_index=True)
    except Exception as exc:
        raise ReadError("read vector file", url, stage, f"{type(exc).__name__}: {exc}") from exc


#: the errors of a file whose content is not vectors GDAL (or pyarrow) reads: what TorchGeo leaves out
_NOT_VECTORS = ("DataSourceError", "ArrowInvalid")


_NOT_CONTENT = ("No such file", "Permission denied")


def _not_vectors(exc: StageError, path: str) -> bool:
    """Whether ``exc`` says the local file ``path`` is not a vector file (not that it is gone or locked)."""
    cause = exc.__cause__
    return (is_local(path) and cause is not None and type(cause).__name__ in _NOT_VECTORS
            and not any(text in exc.reason for text in _NOT_CONTENT))


@dataclass
class _Layer:
    """A file's features in one CRS: geometries, their STRtree, attributes, times and feature ids."""

    geometries: np.ndarray
    tree: shapely.STRtree
    attributes: pd.DataFrame
    times: np.ndarray | None
    fids: np.ndarray
    positions: np.ndarray | None = None  # each feature's position in its file (default: its own index)

    def __post_init__(self) -> None:
        self._shapes: list[Any] = [None] * len(self.geometries)
        if self.positions is None:
            self.positions = np.arange(len(self.geometries))
        # each feature's largest distance from the origin in x or y, to find those reaching far from a query
        reach = np.zeros(len(self.geometries))
        coords, owner = shapely.get_coordinates(self.geometries, return_index=True)
        np.maximum.at(reach, owner, np.abs(coords).max(axis=1) if len(coords) else np.zeros(0))
        self.reach = reach

    def subset(self, keep: np.ndarray) -> _Layer:
        """The features where ``keep`` is true, with a new STRtree."""
        geoms = self.geometries[keep]
        times = None if self.times is None else self.times[keep]
        attributes = self.attributes[keep].reset_index(drop=True)
        return _Layer(geoms, shapely.STRtree(geoms), attributes, times, self.fids[keep], self.positions[keep])

    @property
    def bounds(self) -> np.ndarray:
        """``(minx, miny, maxx, maxy)`` of all features."""
        return shapely.total_bounds(self.geometries)

    def shapes(self, idx: np.ndarray) -> list[Any]:
        """The GeoJSON-like mappings of features ``idx`` (built once each: rasterio reads them ~5x faster
        than shapely geometries, whose ``__geo_interface__`` walks every coordinate in Python)."""
        out = []
        cache = self._shapes
        for i in idx.tolist():
            shape = cache[i]
            if shape is None:
                shape = cache[i] = shapely.geometry.mapping(self.geometries[i])
            out.append(shape)
        return out


#: the per-process cache of loaded files: key -> _Layer
_LAYERS: dict[tuple[Any, ...], _Layer] = {}


_LAYERS_LOCK = threading.Lock()


def clear_cache() -> None:
    """Forget every vector file loaded in this process (they are read again when next queried)."""
    with _LAYERS_LOCK:
        _LAYERS.clear()


def _feature_times(values: Any, date_format: str, url: str, stage: str) -> np.ndarray:
    """``[N, 2]`` POSIX-second intervals of a date attribute (datetimes, or strings in ``date_format``)."""
    import pandas as pd

    series = pd.Series(values)
    out = np.empty((len(series), 2), dtype=np.float64)
    out[:, 0], out[:, 1] = MIN_TIME, MAX_TIME
    if pd.api.types.is_datetime64_any_dtype(series):
        stamps = pd.to_datetime(series, utc=True)
        ok = stamps.notna().to_numpy()
        seconds = stamps[ok].astype("int64").to_numpy() / 1e9
        out[ok, 0] = seconds
        out[ok, 1] = seconds
        return out
    for k, value in enumerate(series.tolist()):
        if value is None or (isinstance(value, float) and np.isnan(value)):
            continue
        try:
            out[k] = date_interval(str(value), date_format)
        except ValueError as exc:
            raise ParseError("parse the date attribute of", url, stage,
                             f"feature {k}: {exc} (date_format {date_format!r})") from exc
    return out
