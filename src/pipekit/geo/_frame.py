"""``dataset.index`` as TorchGeo 0.8 has it: a geopandas ``GeoDataFrame`` view of pipekit's :class:`GeoIndex`.

TorchGeo 0.8 keeps one row per file (or scene) in a ``GeoDataFrame``: a
``geometry`` column of footprint boxes in the dataset CRS (``.crs``), a
``pandas.IntervalIndex`` of datetimes named ``"datetime"`` (closed on both
sides; ``Timestamp.min``/``Timestamp.max`` where a file has no date) and a
``"filepath"`` column (``"filepath_1"``/``"filepath_2"`` in an intersection).
Users filter, inspect and plot it.

pipekit answers queries with its own :class:`~pipekit.geo._index.GeoIndex`
(``dataset.geo_index``, numpy arrays and a packed R-tree, microseconds per
query at 100,000 files).  This module converts between the two:

* :func:`frame_from_index`: the ``GeoDataFrame`` of a ``GeoIndex`` plus columns
  (built lazily the first time ``dataset.index`` is read, cached until the
  ``GeoIndex`` changes);
* :func:`index_from_frame`: the boxes of a ``GeoDataFrame`` (a filtered
  ``dataset.index`` assigned back, or a TorchGeo dataset's index handed to a
  pipekit sampler) as a ``GeoIndex``.

geopandas is imported on first use, so ``import pipekit`` does not pay for it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from pipekit.geo._index import GeoIndex

if TYPE_CHECKING:
    from geopandas import GeoDataFrame

__all__ = ["frame_from_index", "index_from_frame", "interval_index", "is_frame"]

_MIN_NS = pd.Timestamp.min.value
_MAX_NS = pd.Timestamp.max.value


def interval_index(times: np.ndarray) -> pd.IntervalIndex:
    """TorchGeo's ``IntervalIndex`` (closed both sides, named ``"datetime"``) of ``[N, 2]`` POSIX seconds.

    ``-inf``/``inf`` become ``Timestamp.min``/``Timestamp.max`` (times beyond
    them are clipped to them); times are kept to the microsecond.

    Example:
        >>> index = interval_index(np.array([[0.0, 86399.999999], [-np.inf, np.inf]]))
        >>> index[0], index.closed, index.name
        (Interval(1970-01-01 00:00:00, 1970-01-01 23:59:59.999999, closed='both'), 'both', 'datetime')
        >>> index[1].left == pd.Timestamp.min and index[1].right == pd.Timestamp.max
        True
    """
    times = np.asarray(times, dtype=np.float64).reshape(-1, 2)
    ns = np.empty(times.shape, dtype=np.int64)
    finite = np.isfinite(times)
    with np.errstate(invalid="ignore", over="ignore"):
        micro = np.clip(np.rint(times * 1e6), _MIN_NS // 1000 + 1, _MAX_NS // 1000)
    ns[finite] = micro[finite].astype(np.int64) * 1000
    ns[~finite & (times < 0)] = _MIN_NS
    ns[~finite & (times > 0)] = _MAX_NS
    left = pd.DatetimeIndex(ns[:, 0].astype("datetime64[ns]"))
    right = pd.DatetimeIndex(ns[:, 1].astype("datetime64[ns]"))
    return pd.IntervalIndex.from_arrays(left, right, closed="both", name="datetime")


def _seconds(values: Any) -> np.ndarray:
    """POSIX seconds of datetimes (naive: UTC); ``Timestamp.min``/``max`` are -inf/inf."""
    index = pd.DatetimeIndex(values)
    if index.tz is not None:
        index = index.tz_convert("UTC").tz_localize(None)
    out = index.to_numpy().astype("datetime64[us]").astype(np.int64).astype(np.float64) / 1e6
    out[np.asarray(index <= pd.Timestamp.min)] = -math.inf
    out[np.asarray(index >= pd.Timestamp.max)] = math.inf
    return out


def frame_from_index(index: GeoIndex, crs: Any, columns: Mapping[str, Sequence[Any]] | None = None) -> GeoDataFrame:
    """A ``GeoDataFrame`` with TorchGeo 0.8's layout: ``columns``, then ``geometry`` (boxes), indexed by time.

    Example:
        >>> frame = frame_from_index(GeoIndex([[0, 10, 0, 5, 0, 86399.999999]]), "EPSG:32615", {"filepath": ["a.tif"]})
        >>> list(frame.columns), frame.crs.to_epsg(), frame.index.name, frame.geometry.iloc[0].bounds
        (['filepath', 'geometry'], 32615, 'datetime', (0.0, 0.0, 10.0, 5.0))
    """
    import geopandas
    import shapely

    b = index.bounds
    geometry = shapely.box(b[:, 0], b[:, 2], b[:, 1], b[:, 3])
    data = {name: list(values) for name, values in (columns or {}).items()}
    for name, values in data.items():
        if len(values) != len(index):
            raise ValueError(f"column {name!r} has {len(values)} values for {len(index)} index entries")
    crs = crs.to_wkt() if hasattr(crs, "to_wkt") else crs
    return geopandas.GeoDataFrame(data, index=interval_index(b[:, 4:]), geometry=geometry, crs=crs)


def is_frame(value: Any) -> bool:
    """Whether ``value`` looks like a TorchGeo index: a ``GeoDataFrame`` with a geometry and an ``IntervalIndex``."""
    return hasattr(value, "geometry") and isinstance(getattr(value, "index", None), pd.IntervalIndex)


def index_from_frame(frame: GeoDataFrame, crs: Any = None) -> GeoIndex:
    """The boxes of a TorchGeo-style ``GeoDataFrame`` (bounds of each geometry, its time interval) as a ``GeoIndex``.

    With ``crs``, a frame in another CRS is transformed to it first.

    Raises:
        TypeError: ``frame`` has no geometry or no ``IntervalIndex`` of times.
        ValueError: a geometry is empty.
    """
    if not is_frame(frame):
        raise TypeError(
            "expected a GeoDataFrame indexed by a pandas.IntervalIndex of datetimes (TorchGeo's dataset.index), "
            f"got {type(frame).__name__}"
        )
    if crs is not None and frame.crs is not None:
        target = crs.to_wkt() if hasattr(crs, "to_wkt") else crs
        import pyproj

        if not pyproj.CRS.from_user_input(target).equals(frame.crs):
            frame = frame.to_crs(target)
    bounds = np.asarray(frame.geometry.bounds, dtype=np.float64).reshape(-1, 4)
    if len(bounds) and np.isnan(bounds).any():
        row = int(np.flatnonzero(np.isnan(bounds).any(axis=1))[0])
        raise ValueError(f"dataset.index row {row} has an empty geometry")
    boxes = np.empty((len(bounds), 6), dtype=np.float64)
    boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3] = bounds[:, 0], bounds[:, 2], bounds[:, 1], bounds[:, 3]
    boxes[:, 4] = _seconds(frame.index.left)
    boxes[:, 5] = _seconds(frame.index.right)
    return GeoIndex(boxes)
