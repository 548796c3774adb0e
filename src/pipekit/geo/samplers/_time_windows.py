"""Time windows of time series samplers: footprints grouped into places, and windows of their scenes.

``time_window=`` of :class:`~pipekit.geo.samplers.RandomGeoSampler` and
:class:`~pipekit.geo.samplers.GridGeoSampler` (no TorchGeo 0.8 sampler has
it): :func:`_time_window` checks the argument, :func:`_places` groups
footprints that overlap by half or more, :func:`time_windows` cuts each
place's scenes into windows.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from pipekit.geo._index import GeoIndex

__all__ = ["time_windows"]


def _time_window(window: Any) -> int | float | None:
    """A sampler's ``time_window``: a number of scenes (int) or a duration (seconds, from a timedelta)."""
    if window is None:
        return None
    if isinstance(window, bool):
        raise TypeError(f"time_window must be an int (scenes) or a timedelta (duration), got {window!r}")
    if isinstance(window, numbers.Integral):
        if window < 1:
            raise ValueError(f"time_window must be at least 1 scene, got {window!r}")
        return int(window)
    seconds = getattr(window, "total_seconds", None)
    if seconds is None and isinstance(window, np.timedelta64):
        seconds = lambda: window / np.timedelta64(1, "us") / 1e6  # noqa: E731
    if seconds is None:
        raise TypeError(
            f"time_window must be an int (scenes) or a timedelta / pandas.Timedelta (duration), got {window!r}"
        )
    value = float(seconds())
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"time_window must be a positive duration, got {window!r}")
    return value


def _places(footprints: np.ndarray, overlap: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """Group footprints into places: those overlapping by at least ``overlap`` of the smaller one, transitively.

    Returns ``(label, boxes)``: each footprint's place, and each place's box,
    the intersection of its footprints (where every scene of it has data).
    """
    n = len(footprints)
    parent = np.arange(n)

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return int(i)

    spatial = footprints.copy()
    spatial[:, 4], spatial[:, 5] = 0.0, 0.0
    index = GeoIndex(spatial)
    ia, ib = index.intersect_pairs(index, spatial_only=True)
    keep = ia < ib
    ia, ib = ia[keep], ib[keep]
    a, b = footprints[ia], footprints[ib]
    w = np.minimum(a[:, 1], b[:, 1]) - np.maximum(a[:, 0], b[:, 0])
    h = np.minimum(a[:, 3], b[:, 3]) - np.maximum(a[:, 2], b[:, 2])
    area = (footprints[:, 1] - footprints[:, 0]) * (footprints[:, 3] - footprints[:, 2])
    close = w.clip(0) * h.clip(0) >= overlap * np.minimum(area[ia], area[ib])
    for i, j in zip(ia[close].tolist(), ib[close].tolist()):
        ri, rj = find(i), find(j)
        if ri != rj:
            parent[max(ri, rj)] = min(ri, rj)
    roots = np.array([find(i) for i in range(n)], dtype=np.int64)
    _, label = np.unique(roots, return_inverse=True)
    label = label.reshape(-1)
    boxes = np.empty((int(label.max()) + 1 if n else 0, 4))
    for p in range(len(boxes)):
        m = footprints[label == p]
        boxes[p] = (m[:, 0].max(), m[:, 1].min(), m[:, 2].max(), m[:, 3].min())
    return label, boxes


def time_windows(footprints: np.ndarray, window: int | float, cover: bool) -> tuple[np.ndarray, np.ndarray]:
    """The footprints of a time series sampler: one row per place and time window.

    Footprints that overlap by at least half of the smaller one (scenes of
    one path/row or tile, shifted a little or reprojected from another CRS)
    form a place, whose box is where they all have data; the distinct time
    intervals of its footprints, oldest first, are its scenes.  ``window``
    an int ``N``: a window spans ``N`` consecutive scenes (from the first
    one's start to the last one's end); places with fewer scenes are
    dropped.  ``window`` a float: a duration in seconds from a scene's start
    (ending a microsecond before start + duration).  ``cover=False`` gives
    every window (one per starting scene: what random samplers draw from);
    ``cover=True`` only enough windows, without overlap, to cover every scene
    once (the last ``N``-scene window is moved back to end at the last
    scene, as grid rows are).

    Returns ``(rows, source)``: the ``[n, 6]`` windows and, for each, the
    index (into ``footprints``) of the place's first footprint.

    Example:
        >>> day = 86400.0
        >>> fp = np.array([[k, 10 + k, 0, 10, k * day, k * day + 1] for k in range(5)], dtype=float)
        >>> rows, _ = time_windows(fp, 2, cover=True)  # five scenes, each shifted by 1: one place
        >>> (rows[:, 4] / day).tolist(), ((rows[:, 5] - 1) / day).tolist(), rows[0, :4].tolist()
        ([0.0, 2.0, 3.0], [1.0, 3.0, 4.0], [4.0, 10.0, 0.0, 10.0])
        >>> len(time_windows(fp, 2, cover=False)[0]), len(time_windows(fp, 6, cover=False)[0])
        (4, 0)
        >>> rows, _ = time_windows(fp, 2.5 * day, cover=True)
        >>> (rows[:, 4] / day).tolist()
        [0.0, 3.0]
    """
    out: list[np.ndarray] = []
    source: list[int] = []
    label, places = _places(footprints)
    for p in range(len(places)):
        members = np.flatnonzero(label == p)
        box = places[p]
        if box[0] >= box[1] or box[2] >= box[3]:
            continue
        times = np.unique(footprints[members, 4:6], axis=0)  # sorted by start, then end
        m = len(times)
        if isinstance(window, int):
            if m < window:
                continue
            starts = list(range(0, m - window + 1, window if cover else 1))
            if cover and starts[-1] != m - window:
                starts.append(m - window)
            spans = [(times[k, 0], times[k : k + window, 1].max()) for k in starts]
        else:
            spans = []
            end = -math.inf
            for k in range(m):
                if cover and times[k, 0] <= end:
                    continue
                end = times[k, 0] + window - 1e-6
                spans.append((times[k, 0], end))
        for lo, hi in spans:
            out.append(np.array([*box, lo, hi]))
            source.append(int(members[0]))
    rows = np.array(out, dtype=np.float64).reshape(-1, 6)
    return rows, np.array(source, dtype=np.int64)
