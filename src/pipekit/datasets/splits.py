"""Train/val/test splits of geo datasets: TorchGeo 0.8's ``torchgeo.datasets.splits``.

Each function returns a list of copies of the dataset, each restricted to
part of ``dataset.index`` (the ``GeoDataFrame`` of footprints and times):
samplers then draw queries only inside that part, and a split's raster reads
only its own files.  They work on any pipekit geo dataset: a
:class:`~pipekit.geo._raster.RasterDataset`, a product (``Landsat8``,
``CDL``...), ``a & b`` and ``a | b``.

* :func:`random_bbox_assignment`: whole index entries (files, scenes)
  assigned at random; entries may overlap, so splits may share pixels;
* :func:`random_bbox_splitting`: each entry cut into parts of the given
  fractions of its area, one part per split;
* :func:`random_grid_cell_assignment`: each entry cut into a grid of
  cells, cells assigned at random;
* :func:`roi_split`: the index clipped to one region of interest per split;
* :func:`time_series_split`: the index cut along time.

The last four never let two splits share a pixel (for the last, a pixel at
one time) as long as the index entries themselves do not overlap: the parts
of each entry are disjoint, and samplers keep patches inside them.  (Entries
that overlap, e.g. ``a | a``, are cut independently, as in TorchGeo.)

A split's index rows keep their ``filepath``: a raster split reads only
those files.  A split moved to another CRS (``split.to_crs(...)``, or as
an operand of ``&``/``|``) keeps its parts, their bounds reprojected.
"""

from __future__ import annotations

import copy
import math
import numbers
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, TypeVar

import numpy as np
import pandas as pd
import torch

from pipekit.geo._base import GeoDataset

__all__ = [
    "random_bbox_assignment",
    "random_bbox_splitting",
    "random_grid_cell_assignment",
    "roi_split",
    "time_series_split",
]

D = TypeVar("D", bound=GeoDataset)


def _check_dataset(dataset: Any, fn: str) -> None:
    if not isinstance(dataset, GeoDataset):
        raise TypeError(f"{fn} splits a GeoDataset, got {type(dataset).__name__}")
    if len(dataset) == 0:
        raise ValueError(f"{fn}: {dataset.name} has an empty index, nothing to split")


def _numbers(values: Any, name: str, fn: str) -> list[float]:
    """``values`` as a non-empty list of positive finite numbers (``TypeError``/``ValueError`` otherwise)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) == 0:
        raise TypeError(f"{fn}: {name} must be a non-empty sequence of numbers, got {values!r}")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError(f"{fn}: {name} must be numbers, got {v!r} in {list(values)!r}")
        f = float(v)
        if not math.isfinite(f) or f <= 0:
            raise ValueError(f"{fn}: All items in input {name} must be greater than 0, got {list(values)!r}")
        out.append(f)
    return out


def _fractions(values: Any, fn: str, name: str = "fractions", must: str = "1") -> list[float]:
    fractions = _numbers(values, name, fn)
    if not math.isclose(sum(fractions), 1.0):
        raise ValueError(
            f"{fn}: Sum of input {name} must equal {must}, got {list(values)!r} (sum {sum(fractions):g})"
        )
    return fractions


def _fractions_to_lengths(fractions: Sequence[float], total: int) -> list[int]:
    """``total`` divided by ``fractions`` (floors, the remainder handed out one each from the first).

    Example:
        >>> _fractions_to_lengths([0.5, 0.3, 0.2], 7)
        [4, 2, 1]
    """
    lengths = [math.floor(f * total) for f in fractions]
    for k in range(total - sum(lengths)):
        lengths[k % len(lengths)] += 1
    return lengths


def _with_index(dataset: D, frame: Any) -> D:
    """A copy of ``dataset`` whose ``index`` is ``frame``."""
    ds = copy.deepcopy(dataset)
    ds.index = frame
    return ds


def _assign(dataset: D, frame: Any, lengths: Sequence[int], generator: torch.Generator | None) -> list[D]:
    """Rows of ``frame`` in a random order, cut into consecutive runs of ``lengths``."""
    order = torch.randperm(len(frame), generator=generator).tolist()
    out = []
    start = 0
    for n in lengths:
        out.append(_with_index(dataset, frame.iloc[order[start : start + n]]))
        start += n
    return out


def random_bbox_assignment(
    dataset: D,
    lengths: Sequence[float],
    generator: torch.Generator | None = torch.default_generator,
) -> list[D]:
    """Split a geo dataset by assigning its index entries (files, scenes) to splits at random.

    Entries that overlap may land in different splits, which then share
    those pixels; use :func:`random_grid_cell_assignment` or
    :func:`random_bbox_splitting` where that matters.

    Args:
        dataset: the dataset to split (any pipekit ``GeoDataset``).
        lengths: entries per split, as counts summing to ``len(dataset)``
            or fractions summing to 1.
        generator: the ``torch.Generator`` of the random permutation (seed
            it for a reproducible split).

    Returns:
        One dataset per item of ``lengths``.

    Raises:
        TypeError: ``dataset`` is not a GeoDataset, or ``lengths`` not numbers.
        ValueError: ``lengths`` has an item <= 0 or sums to neither 1 nor ``len(dataset)``.

    Example:
        >>> import tempfile, torch
        >>> from pipekit.datasets import RasterDataset, random_bbox_assignment
        >>> from pipekit.synthetic.geo import write_cdl
        >>> root = tempfile.mkdtemp()
        >>> for year in (2021, 2022, 2023):
        ...     _ = write_cdl(root, year, (399_990, 4_642_290, 402_390, 4_645_530))
        >>> ds = RasterDataset(root)
        >>> train, val = random_bbox_assignment(ds, [2, 1], generator=torch.Generator().manual_seed(0))
        >>> len(train), len(val)
        (2, 1)
    """
    fn = "random_bbox_assignment"
    _check_dataset(dataset, fn)
    values = _numbers(lengths, "lengths", fn)
    total = len(dataset)
    if math.isclose(sum(values), 1.0):
        counts = _fractions_to_lengths(values, total)
    elif math.isclose(sum(values), total) and all(v == round(v) for v in values):
        counts = [round(v) for v in values]
    else:
        raise ValueError(
            f"{fn}: Sum of input lengths must equal 1 or the length of dataset's index: fractions summing to 1 "
            f"or counts summing to the {total} entries of {dataset.name}'s index, got {list(lengths)!r}"
        )
    return _assign(dataset, dataset.index, counts, generator)


def random_bbox_splitting(
    dataset: D,
    fractions: Sequence[float],
    generator: torch.Generator | None = torch.default_generator,
) -> list[D]:
    """Split a geo dataset by cutting each index entry into parts, one part per split.

    Each entry's footprint is cut across by straight lines, the direction
    (horizontal or vertical) and the side the first part is taken from chosen
    at random per entry, alternating direction part after part; part ``k``
    holds ``fractions[k]`` of the footprint's area.  Parts are disjoint.

    Args:
        dataset: the dataset to split.
        fractions: fractions of each footprint per split, summing to 1.
        generator: the ``torch.Generator`` of the random choices.

    Returns:
        One dataset per fraction.

    Raises:
        TypeError, ValueError: as for :func:`random_bbox_assignment`.

    Example:
        >>> import tempfile, torch
        >>> from pipekit.datasets import RasterDataset, random_bbox_splitting
        >>> from pipekit.synthetic.geo import write_cdl
        >>> path = write_cdl(tempfile.mkdtemp(), 2023, (399_990, 4_642_290, 402_390, 4_645_530))
        >>> ds = RasterDataset(path)
        >>> parts = random_bbox_splitting(ds, [0.75, 0.25], generator=torch.Generator().manual_seed(0))
        >>> [round(float(p.index.geometry.area.sum() / ds.index.geometry.area.sum()), 2) for p in parts]
        [0.75, 0.25]
    """
    import shapely

    fn = "random_bbox_splitting"
    _check_dataset(dataset, fn)
    fracs = _fractions(fractions, fn)
    frame = dataset.index
    parts: list[list[Any]] = [[] for _ in fracs]
    for geometry in frame.geometry:
        horizontal, flip = (bool(v) for v in torch.randint(0, 2, (2,), generator=generator).tolist())
        minx, miny, maxx, maxy = geometry.bounds
        remaining = 1.0
        for k, fraction in enumerate(fracs):
            if k == len(fracs) - 1:
                part = shapely.clip_by_rect(geometry, minx, miny, maxx, maxy)
            else:
                share = fraction / remaining
                if horizontal:
                    cut = maxy - (maxy - miny) * share if flip else miny + (maxy - miny) * share
                    box = (minx, cut, maxx, maxy) if flip else (minx, miny, maxx, cut)
                    miny, maxy = (miny, cut) if flip else (cut, maxy)
                else:
                    cut = maxx - (maxx - minx) * share if flip else minx + (maxx - minx) * share
                    box = (cut, miny, maxx, maxy) if flip else (minx, miny, cut, maxy)
                    minx, maxx = (minx, cut) if flip else (cut, maxx)
                part = shapely.clip_by_rect(geometry, *box)
            parts[k].append(part)
            remaining -= fraction
            horizontal = not horizontal
    out = []
    for geoms in parts:
        piece = frame.copy()
        piece = piece.set_geometry(list(geoms), crs=frame.crs)
        out.append(_with_index(dataset, piece[~piece.geometry.is_empty]))
    return out


def random_grid_cell_assignment(
    dataset: D,
    fractions: Sequence[float],
    grid_size: int = 6,
    generator: torch.Generator | None = torch.default_generator,
) -> list[D]:
    """Split a geo dataset by cutting each index entry into a grid of cells and assigning cells at random.

    Each footprint is cut into ``grid_size`` x ``grid_size`` equal cells;
    all cells of all entries are shuffled and cut into runs of the given
    fractions of their number.  Cells are disjoint.

    Args:
        dataset: the dataset to split.
        fractions: fractions of the cells per split, summing to 1.
        grid_size: rows and columns of the grid (at least 2).
        generator: the ``torch.Generator`` of the random permutation.

    Returns:
        One dataset per fraction.

    Raises:
        TypeError, ValueError: as for :func:`random_bbox_assignment`, or
            ``grid_size`` below 2.

    Example:
        >>> import tempfile, torch
        >>> from pipekit.datasets import RasterDataset, random_grid_cell_assignment
        >>> from pipekit.synthetic.geo import write_cdl
        >>> path = write_cdl(tempfile.mkdtemp(), 2023, (399_990, 4_642_290, 402_390, 4_645_530))
        >>> train, val = random_grid_cell_assignment(RasterDataset(path), [0.75, 0.25], grid_size=4,
        ...                                          generator=torch.Generator().manual_seed(0))
        >>> len(train), len(val)
        (12, 4)
    """
    import shapely

    fn = "random_grid_cell_assignment"
    _check_dataset(dataset, fn)
    fracs = _fractions(fractions, fn)
    if isinstance(grid_size, bool) or not isinstance(grid_size, numbers.Integral) or grid_size < 2:
        raise ValueError(f"{fn}: Input grid_size must be greater than 1 (an int), got {grid_size!r}")
    frame = dataset.index
    rows: list[int] = []
    cells: list[Any] = []
    for r, geometry in enumerate(frame.geometry):
        minx, miny, maxx, maxy = geometry.bounds
        xs = np.linspace(minx, maxx, grid_size + 1)
        ys = np.linspace(miny, maxy, grid_size + 1)
        for i in range(grid_size):
            for j in range(grid_size):
                cell = shapely.clip_by_rect(geometry, xs[i], ys[j], xs[i + 1], ys[j + 1])
                if not cell.is_empty and cell.area > 0:
                    rows.append(r)
                    cells.append(cell)
    grid = frame.iloc[rows].copy()
    grid = grid.set_geometry(cells, crs=frame.crs)
    return _assign(dataset, grid, _fractions_to_lengths(fracs, len(grid)), generator)


def roi_split(dataset: D, rois: Sequence[Any]) -> list[D]:
    """Split a geo dataset by regions of interest: each split is the index clipped to one roi.

    Args:
        dataset: the dataset to split.
        rois: shapely polygons in the dataset's CRS (or anything with a
            ``__geo_interface__``), one per split; they may touch but not overlap.

    Returns:
        One dataset per roi (its index may be empty where the roi misses the data).

    Raises:
        ValueError: two rois overlap.

    Example:
        >>> import tempfile, shapely
        >>> from pipekit.datasets import RasterDataset, roi_split
        >>> from pipekit.synthetic.geo import write_cdl
        >>> ds = RasterDataset(write_cdl(tempfile.mkdtemp(), 2023, (399_990, 4_642_290, 402_390, 4_645_530)))
        >>> x, y, _ = ds.bounds
        >>> mid = (x.start + x.stop) / 2
        >>> west, east = roi_split(ds, [shapely.box(x.start, y.start, mid, y.stop),
        ...                             shapely.box(mid, y.start, x.stop, y.stop)])
        >>> west.bounds[0].stop == east.bounds[0].start == mid
        True
    """
    import shapely
    from shapely.geometry import shape

    fn = "roi_split"
    _check_dataset(dataset, fn)
    if isinstance(rois, (str, bytes)) or not isinstance(rois, Sequence) or len(rois) == 0:
        raise TypeError(f"{fn}: rois must be a non-empty sequence of polygons, got {rois!r}")
    geoms = []
    for roi in rois:
        if not isinstance(roi, shapely.Geometry):
            if not hasattr(roi, "__geo_interface__"):
                raise TypeError(f"{fn}: rois must be shapely polygons, got {type(roi).__name__}")
            roi = shape(roi)
        geoms.append(roi)
    for i, a in enumerate(geoms):
        for j in range(i + 1, len(geoms)):
            b = geoms[j]
            if shapely.intersects(a, b) and not shapely.touches(a, b):
                raise ValueError(f"{fn}: ROIs in input rois can't overlap: rois {i} and {j} do (they may touch)")
    frame = dataset.index
    footprints = np.asarray(frame.geometry.values)
    had_area = shapely.area(footprints) > 0
    out = []
    for roi in geoms:
        parts = shapely.intersection(footprints, roi)
        # an entry with an area keeps a part with one (not the line where it touches the roi); a point stays a point
        keep = ~shapely.is_empty(parts) & ~(had_area & (shapely.area(parts) <= 0))
        rows = np.flatnonzero(keep)
        clipped = frame.iloc[rows].copy().set_geometry(list(parts[rows]), crs=frame.crs)
        out.append(_with_index(dataset, clipped))
    return out


def _timedelta(value: Any) -> pd.Timedelta | None:
    if isinstance(value, (pd.Timedelta, timedelta, np.timedelta64)):
        return pd.Timedelta(value)
    return None


def time_series_split(dataset: D, lengths: Sequence[Any]) -> list[D]:
    """Split a geo dataset along time into splits that share no instant.

    Each split keeps the index entries whose time interval overlaps its own,
    with their intervals clipped to it (each split but the last ends one
    microsecond before the next begins).  Entries keep pipekit's intervals
    closed on both sides; TorchGeo 0.8 makes them open and also ends every
    entry of a split but the last a microsecond early, even those inside it.

    Args:
        dataset: the dataset to split (its index must have dates).
        lengths: the splits' time spans, one of: fractions of the dataset's
            time extent summing to 1; ``pandas.Timedelta`` durations summing
            to it; ``pandas.Interval`` ``(start, end)`` pairs that cover it
            without overlapping.

    Returns:
        One dataset per item of ``lengths``.

    Raises:
        TypeError: ``lengths`` mixes kinds or holds something else.
        ValueError: the fractions/durations do not add up to the extent, the
            intervals overlap, leave its bounds or do not cover it, or the
            dataset has no dates.

    Example:
        >>> import tempfile
        >>> import pandas as pd
        >>> from pipekit.datasets import RasterDataset, time_series_split
        >>> from pipekit.synthetic.geo import write_cdl
        >>> root = tempfile.mkdtemp()
        >>> for year in (2021, 2022, 2023):
        ...     _ = write_cdl(root, year, (399_990, 4_642_290, 402_390, 4_645_530))
        >>> class YearlyCDL(RasterDataset):
        ...     filename_regex = r"(?P<date>\\d{4})_30m_cdls"
        ...     date_format = "%Y"
        >>> ds = YearlyCDL(root)
        >>> _, _, t = ds.bounds
        >>> cut = pd.Timestamp("2023-01-01")
        >>> early, late = time_series_split(ds, [pd.Interval(t.start, cut), pd.Interval(cut, t.stop)])
        >>> len(early), len(late), early.bounds[2].stop < late.bounds[2].start
        (2, 1, True)
        >>> len(time_series_split(ds, [0.5, 0.5])[0])  # 2022 is cut in two: both splits hold part of it
        2
    """
    fn = "time_series_split"
    _check_dataset(dataset, fn)
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Sequence) or len(lengths) == 0:
        raise TypeError(f"{fn}: lengths must be a non-empty sequence, got {lengths!r}")
    _, _, t = dataset.bounds
    start, stop = pd.Timestamp(t.start), pd.Timestamp(t.stop)
    if start <= pd.Timestamp.min or stop >= pd.Timestamp.max:
        raise ValueError(
            f"{fn}: {dataset.name} has index entries without dates (time bounds {start} .. {stop}); "
            "a time split needs dated entries (filename_regex with a date group)"
        )
    total = stop - start
    items = list(lengths)
    if all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in items):
        durations = [total * f for f in _fractions(items, fn, "lengths", "1 or the dataset's time length")]
        durations[-1] = total - sum(durations[:-1], pd.Timedelta(0))  # no float residue at the end
        items = durations
    pairs = all(isinstance(v, pd.Interval) for v in items)
    if all(_timedelta(v) is not None for v in items):
        durations = [_timedelta(v) for v in items]
        if any(d <= pd.Timedelta(0) for d in durations):
            raise ValueError(f"{fn}: All items in input lengths must be greater than 0, got {list(lengths)!r}")
        intervals = []
        left = start
        for d in durations:
            intervals.append(pd.Interval(left, left + d, closed="neither"))
            left = left + d
    elif all(isinstance(v, pd.Interval) for v in items):
        intervals = [pd.Interval(pd.Timestamp(v.left), pd.Timestamp(v.right), closed="neither") for v in items]
    else:
        raise TypeError(
            f"{fn}: lengths must be all fractions, all pandas.Timedelta or all pandas.Interval, got {list(lengths)!r}"
        )
    for k, iv in enumerate(intervals):
        if iv.left < start or iv.right > stop:
            raise ValueError(f"{fn}: Pairs of timestamps in lengths can't be out of dataset's time bounds: "
                             f"interval {k} ({iv.left} .. {iv.right}) leaves them ({start} .. {stop})")
        for m, other in enumerate(intervals):
            if m != k and iv.left < other.right and other.left < iv.right:
                raise ValueError(f"{fn}: Pairs of timestamps in lengths can't overlap: intervals {k} and {m} do")
    covered = sum((iv.right - iv.left for iv in intervals), pd.Timedelta(0))
    if abs(covered - total) > pd.Timedelta(1, unit="us"):
        what = "Pairs of timestamps in lengths must cover dataset's time bounds" if pairs else (
            "Sum of input lengths must equal 1 or the dataset's time length")
        raise ValueError(f"{fn}: {what}: lengths cover {covered} of the dataset's {total} time extent")
    frame = dataset.index
    # which entries a split holds: an open end (TorchGeo's intervals may be closed="neither") excludes its own
    # instant, so an entry ending where a split starts is not in it; the times kept are the entries' ends
    tick = pd.Timedelta(1, unit="us")
    lefts = pd.DatetimeIndex(frame.index.left)
    rights = pd.DatetimeIndex(frame.index.right)
    closed = frame.index.closed
    first = lefts + tick if closed in ("right", "neither") else lefts
    last = rights - tick if closed in ("left", "neither") else rights
    last_end = max(iv.right for iv in intervals)
    out = []
    for iv in intervals:
        end = iv.right if iv.right == last_end else iv.right - pd.Timedelta(1, unit="us")
        keep = np.asarray((first <= end) & (last >= iv.left))
        piece = frame.iloc[np.flatnonzero(keep)].copy()
        new_left = np.maximum(lefts[keep].to_numpy(), np.datetime64(iv.left.to_datetime64()))
        new_right = np.minimum(rights[keep].to_numpy(), np.datetime64(end.to_datetime64()))
        ok = new_left <= new_right
        piece = piece.iloc[np.flatnonzero(ok)]
        piece.index = pd.IntervalIndex.from_arrays(new_left[ok], new_right[ok], closed="both", name="datetime")
        out.append(_with_index(dataset, piece))
    return out
