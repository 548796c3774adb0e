"""``GeoIndex``: a compact spatiotemporal index over many boxes, held in numpy arrays.

A geo dataset indexes the footprints of its files (often tens of thousands of
scenes).  :class:`GeoIndex` keeps them as one ``float64`` array of shape
``[N, 6]`` (``minx, maxx, miny, maxy, mint, maxt``, the order of
:class:`~pipekit.geo.BoundingBox`) plus a packed R-tree built from it:

* the entries are ordered with *Sort-Tile-Recursive* packing (sort by x
  centre, cut into vertical slices, sort each slice by y centre) and grouped
  ``FANOUT`` at a time into leaf nodes;
* each upper level packs the nodes below it the same way, and stores every
  node's bounds and the contiguous range of its children;
* a query walks the levels top-down with a handful of vectorised numpy
  operations per level, so it costs microseconds at 100,000 entries.

The tree is built lazily (at the first query) and is not pickled: a pickled
index is just its bounds array, so DataLoader workers receive it cheaply and
rebuild the tree on first use.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from pipekit.geo._bbox import BoundingBox

__all__ = ["GeoIndex", "FANOUT"]

#: Children per node of the packed R-tree.
FANOUT = 16

# Below this many entries a query scans all of them (faster than the tree).
_BRUTE_FORCE = 256
#: Up to this many entries (an index per scene layer holds a few) a query compares Python floats: numpy's twelve
#: gathers and comparisons of :func:`_select` cost ~10 µs, several times the loop.
_PYTHON_LOOP = 8

# A query starts at the lowest tree level with at most this many nodes (scanning a few
# hundred nodes at once is cheaper than descending through the levels above them).
_START_NODES = 512

_LANES = np.arange(FANOUT, dtype=np.int64)

# intersect_pairs expands and filters candidate pairs in blocks of about this many.
_PAIR_BLOCK = 1 << 18

_EMPTY = np.empty(0, dtype=np.int64)


def _query_tuple(bbox: Any) -> tuple[float, float, float, float, float, float]:
    """A query box as six floats (a BoundingBox, or a sequence of 4 or 6 numbers)."""
    if isinstance(bbox, BoundingBox):
        return (bbox.minx, bbox.maxx, bbox.miny, bbox.maxy, bbox.mint_s, bbox.maxt_s)
    try:
        values = [float(v) for v in bbox]
    except TypeError:
        raise TypeError(
            f"a GeoIndex query takes a BoundingBox or (minx, maxx, miny, maxy[, mint, maxt]), got {bbox!r}"
        ) from None
    if len(values) == 4:
        values += [-math.inf, math.inf]
    if len(values) != 6:
        raise ValueError(f"a query box has 4 or 6 coordinates, got {len(values)}: {bbox!r}")
    if any(math.isnan(v) for v in values):
        raise ValueError(f"a query box must not contain NaN: {bbox!r}")
    minx, maxx, miny, maxy, mint, maxt = values
    if minx > maxx or miny > maxy or mint > maxt:
        raise ValueError(f"invalid query box (a min is greater than its max): {bbox!r}")
    return minx, maxx, miny, maxy, mint, maxt


def _select(b: np.ndarray, idx: np.ndarray, q: Sequence[float], spatial_only: bool) -> np.ndarray:
    """The elements of ``idx`` whose boxes (columns of the ``[6, m]`` array ``b``) intersect ``q``.

    Touching edges count.  Gathers row by row (much faster than ``b[:, idx]``).
    """
    mask = b[0].take(idx) <= q[1]
    mask &= b[1].take(idx) >= q[0]
    mask &= b[2].take(idx) <= q[3]
    mask &= b[3].take(idx) >= q[2]
    if not spatial_only:
        mask &= b[4].take(idx) <= q[5]
        mask &= b[5].take(idx) >= q[4]
    return idx[mask]


def _select_pairs(
    ba: np.ndarray, bb: np.ndarray, ia: np.ndarray, ib: np.ndarray, spatial_only: bool
) -> tuple[np.ndarray, np.ndarray]:
    """The pairs ``(ia[k], ib[k])`` whose boxes intersect, filtering one axis at a time."""
    axes = (0, 2) if spatial_only else (0, 2, 4)
    for lo in axes:
        hi = lo + 1
        mask = ba[lo].take(ia) <= bb[hi].take(ib)
        mask &= ba[hi].take(ia) >= bb[lo].take(ib)
        ia, ib = ia[mask], ib[mask]
    return ia, ib


def _descend_pairs(
    stage: tuple[np.ndarray, Any, Any],
    children_boxes: np.ndarray,
    partner_boxes: np.ndarray,
    nodes: np.ndarray,
    partners: np.ndarray,
    spatial_only: bool,
    swapped: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Replace the node of each pair by those of its children that intersect the partner.

    Works in blocks of about ``_PAIR_BLOCK`` candidate pairs to bound memory.
    ``swapped`` says the nodes belong to the second index of the join (the
    intersection test is symmetric, so only the argument order changes).
    """
    _, starts, ends = stage
    s, e = starts[nodes], ends[nodes]
    counts = e - s
    cum = np.cumsum(counts)
    total = int(cum[-1]) if len(cum) else 0
    bounds = np.searchsorted(cum, np.arange(_PAIR_BLOCK, total, _PAIR_BLOCK), side="left") + 1
    cuts = [0, *bounds.tolist(), len(nodes)]
    keep_n, keep_p = [], []
    for lo, hi in itertools.pairwise(cuts):
        if hi <= lo:
            continue
        kids = _expand(s[lo:hi], e[lo:hi])
        mates = np.repeat(partners[lo:hi], counts[lo:hi])
        if swapped:
            mates, kids = _select_pairs(partner_boxes, children_boxes, mates, kids, spatial_only)
        else:
            kids, mates = _select_pairs(children_boxes, partner_boxes, kids, mates, spatial_only)
        keep_n.append(kids)
        keep_p.append(mates)
    if not keep_n:
        return _EMPTY, _EMPTY
    if len(keep_n) == 1:
        return keep_n[0], keep_p[0]
    return np.concatenate(keep_n), np.concatenate(keep_p)


def _expand(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Concatenate ``range(starts[k], ends[k])`` for every ``k``, vectorised."""
    counts = ends - starts
    total = int(counts.sum())
    if total == 0:
        return _EMPTY
    offsets = np.cumsum(counts) - counts
    return np.arange(total, dtype=np.int64) + np.repeat(starts - offsets, counts)


def _children(starts: np.ndarray, count: int) -> np.ndarray:
    """The children of nodes whose children start at ``starts`` (up to FANOUT each, below ``count``)."""
    children = (starts[:, None] + _LANES).ravel()
    if len(starts) and starts.max() + FANOUT > count:  # the last node may have fewer children
        children = children[children < count]
    return children


def _str_order(boxes: np.ndarray) -> np.ndarray:
    """Sort-Tile-Recursive order of ``[m, 6]`` boxes: x slices, each sorted by y."""
    m = len(boxes)
    cx = boxes[:, 0] + boxes[:, 1]
    cy = boxes[:, 2] + boxes[:, 3]
    pages = -(-m // FANOUT)
    slices = max(1, math.ceil(math.sqrt(pages)))
    per_slice = FANOUT * -(-pages // slices)
    by_x = np.argsort(cx, kind="stable")
    slice_of = np.arange(m) // per_slice
    within = np.lexsort((cy[by_x], slice_of))
    return by_x[within]


def _group_bounds(boxes: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Bounds ``[g, 6]`` of consecutive groups of ``[m, 6]`` boxes starting at ``starts``."""
    out = np.empty((len(starts), 6), dtype=np.float64)
    out[:, 0::2] = np.minimum.reduceat(boxes[:, 0::2], starts, axis=0)
    out[:, 1::2] = np.maximum.reduceat(boxes[:, 1::2], starts, axis=0)
    return out


class _Tree:
    """The packed R-tree of a GeoIndex (never pickled)."""

    __slots__ = ("counts", "leaf", "levels", "order", "start")

    def __init__(self, bounds: np.ndarray) -> None:
        n = len(bounds)
        self.order = _str_order(bounds).astype(np.int64)
        leaf = bounds[self.order]
        self.leaf = np.ascontiguousarray(leaf.T)  # [6, n], entries in tree order
        # levels[0] are the leaf nodes (children: entries), levels[-1] the top.
        self.levels: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        boxes = leaf
        count = n
        while True:
            starts = np.arange(0, count, FANOUT, dtype=np.int64)
            ends = np.minimum(starts + FANOUT, count)
            node_boxes = _group_bounds(boxes, starts)
            if len(node_boxes) > FANOUT:
                perm = _str_order(node_boxes)
                node_boxes, starts, ends = node_boxes[perm], starts[perm], ends[perm]
            self.levels.append((np.ascontiguousarray(node_boxes.T), starts, ends))
            if len(node_boxes) <= FANOUT:
                break
            boxes, count = node_boxes, len(node_boxes)
        # number of children below each level (entries below level 0)
        self.counts = [n] + [level[0].shape[1] for level in self.levels[:-1]]
        self.start = next(i for i, level in enumerate(self.levels) if level[0].shape[1] <= _START_NODES)

    def stages(self) -> list[tuple[np.ndarray, np.ndarray | None, np.ndarray | None]]:
        """Top level first, then each level down, then the entries (without children)."""
        return [*reversed(self.levels), (self.leaf, None, None)]

    def query(self, q: Sequence[float], spatial_only: bool) -> np.ndarray:
        first = self.levels[self.start][0]
        cand = _select(first, np.arange(first.shape[1]), q, spatial_only)
        for level in range(self.start, -1, -1):
            if len(cand) == 0:
                return _EMPTY.copy()
            children = _children(self.levels[level][1][cand], self.counts[level])
            below = self.levels[level - 1][0] if level > 0 else self.leaf
            cand = _select(below, children, q, spatial_only)
        return np.sort(self.order[cand])


class GeoIndex:
    """A spatiotemporal index over ``N`` boxes stored in a ``[N, 6]`` float64 array.

    Rows are ``(minx, maxx, miny, maxy, mint, maxt)``, times in POSIX
    seconds (``-inf``/``inf`` for open intervals).  An ``[N, 4]`` array is
    accepted too and gets open time intervals.  Queries report every entry
    that shares at least a point with the query box (touching edges count,
    as in :meth:`BoundingBox.intersects`).

    Args:
        bounds: the boxes, ``[N, 6]`` (or ``[N, 4]``); copied and made
            read-only.

    Example:
        >>> import numpy as np
        >>> from pipekit.geo import BoundingBox
        >>> from pipekit.geo._index import GeoIndex
        >>> index = GeoIndex(np.array([[0, 10, 0, 10, 0, 5], [10, 20, 0, 10, 6, 9], [50, 60, 50, 60, 0, 9]]))
        >>> index.query(BoundingBox(5, 12, 5, 6)).tolist()
        [0, 1]
        >>> index.query(BoundingBox(5, 12, 5, 6, 7, 8)).tolist()
        [1]
        >>> index.query(BoundingBox(5, 12, 5, 6, 7, 8), spatial_only=True).tolist()
        [0, 1]
        >>> index.total_bounds
        BoundingBox(minx=0, maxx=60, miny=0, maxy=60, mint=1970-01-01T00:00:00Z, maxt=1970-01-01T00:00:09Z)
        >>> index.areas.tolist()
        [100.0, 100.0, 100.0]
        >>> [pair.tolist() for pair in index.intersect_pairs(GeoIndex([[8, 12, 0, 1]]))]
        [[0, 1], [0, 0]]
    """

    __slots__ = ("_bounds", "_rows", "_tree")

    def __init__(self, bounds: Any) -> None:
        arr = np.array(bounds, dtype=np.float64, copy=True)
        if arr.size == 0:
            arr = arr.reshape(0, 6)
        if arr.ndim != 2 or arr.shape[1] not in (4, 6):
            raise ValueError(f"GeoIndex bounds must have shape [N, 6] (or [N, 4]), got {arr.shape}")
        if arr.shape[1] == 4:
            times = np.empty((len(arr), 2))
            times[:, 0], times[:, 1] = -np.inf, np.inf
            arr = np.concatenate([arr, times], axis=1)
        self._bounds = self._validated(arr)
        self._tree: _Tree | None = None
        self._rows: list[list[float]] | None = None

    @classmethod
    def _from_array(cls, arr: np.ndarray) -> GeoIndex:
        """An index that takes ``arr`` (a new ``[N, 6]`` float64 array nobody else holds) without copying it."""
        if arr.dtype != np.float64 or arr.ndim != 2 or arr.shape[1] != 6:
            raise ValueError(f"GeoIndex._from_array takes an [N, 6] float64 array, got {arr.dtype} {arr.shape}")
        index = cls.__new__(cls)
        index._bounds = cls._validated(arr)
        index._tree = None
        index._rows = None
        return index

    @staticmethod
    def _validated(arr: np.ndarray) -> np.ndarray:
        if len(arr):
            # whole-array checks first (reducing [N, 6] along its short axis costs several times more),
            # the offending row looked for only when one fails
            if np.isnan(arr[:, 4:]).any() or not np.isfinite(arr[:, :4]).all():
                bad = np.isnan(arr).any(axis=1) | ~np.isfinite(arr[:, :4]).all(axis=1)
                i = int(np.flatnonzero(bad)[0])
                raise ValueError(f"GeoIndex entry {i} has NaN or infinite spatial bounds: {arr[i].tolist()}")
            bad = arr[:, 0] > arr[:, 1]
            bad |= arr[:, 2] > arr[:, 3]
            bad |= arr[:, 4] > arr[:, 5]
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise ValueError(
                    f"GeoIndex entry {i} has a min greater than its max "
                    f"(minx, maxx, miny, maxy, mint, maxt): {arr[i].tolist()}"
                )
        arr = np.ascontiguousarray(arr)
        arr.flags.writeable = False
        return arr

    # construction ---------------------------------------------------------------
    @classmethod
    def empty(cls) -> GeoIndex:
        """An index with no entries."""
        return cls(np.empty((0, 6)))

    @classmethod
    def from_boxes(cls, boxes: Iterable[BoundingBox | Sequence[float]]) -> GeoIndex:
        """An index over :class:`BoundingBox` objects (or 6-tuples), in order."""
        rows = [b.seconds() if isinstance(b, BoundingBox) else tuple(b) for b in boxes]
        return cls(np.array(rows, dtype=np.float64).reshape(len(rows), -1) if rows else np.empty((0, 6)))

    def concat(self, other: GeoIndex) -> GeoIndex:
        """A new index with this index's entries followed by ``other``'s (shifted by ``len(self)``)."""
        if not isinstance(other, GeoIndex):
            raise TypeError(f"can only concatenate a GeoIndex, got {type(other).__name__}")
        return GeoIndex(np.concatenate([self._bounds, other._bounds]))

    def subset(self, indices: Any) -> GeoIndex:
        """A new index with the entries at ``indices`` (an int array or boolean mask), in that order."""
        return GeoIndex(self._bounds[np.asarray(indices)])

    # access ---------------------------------------------------------------------
    @property
    def bounds(self) -> np.ndarray:
        """The ``[N, 6]`` float64 array of entries (read-only)."""
        return self._bounds

    def __len__(self) -> int:
        return len(self._bounds)

    def __getitem__(self, i: int) -> BoundingBox:
        """Entry ``i`` as a :class:`BoundingBox`."""
        return BoundingBox(*self._bounds[i].tolist())

    def __iter__(self):
        for row in self._bounds.tolist():
            yield BoundingBox(*row)

    @property
    def total_bounds(self) -> BoundingBox:
        """The smallest box containing every entry (``ValueError`` for an empty index)."""
        if len(self._bounds) == 0:
            raise ValueError("an empty GeoIndex has no bounds")
        b = self._bounds
        return BoundingBox(
            float(b[:, 0].min()),
            float(b[:, 1].max()),
            float(b[:, 2].min()),
            float(b[:, 3].max()),
            float(b[:, 4].min()),
            float(b[:, 5].max()),
        )

    @property
    def areas(self) -> np.ndarray:
        """Spatial area of each entry, float64 ``[N]``."""
        b = self._bounds
        return (b[:, 1] - b[:, 0]) * (b[:, 3] - b[:, 2])

    def _ensure_tree(self) -> _Tree:
        tree = self._tree
        if tree is None:
            tree = self._tree = _Tree(self._bounds)
        return tree

    # queries --------------------------------------------------------------------
    def query(self, bbox: BoundingBox | Sequence[float], spatial_only: bool = False) -> np.ndarray:
        """Indices (int64, ascending) of the entries intersecting ``bbox``.

        Args:
            bbox: a :class:`BoundingBox`, or ``(minx, maxx, miny, maxy[, mint, maxt])``.
            spatial_only: ignore the time intervals.
        """
        q = _query_tuple(bbox)
        n = len(self._bounds)
        if n == 0:
            return _EMPTY.copy()
        if n <= _PYTHON_LOOP:
            rows = self._rows
            if rows is None:
                rows = self._rows = self._bounds.tolist()  # the bounds are read-only
            minx, maxx, miny, maxy, mint, maxt = q
            hits = [
                i for i, r in enumerate(rows)
                if r[0] <= maxx and r[1] >= minx and r[2] <= maxy and r[3] >= miny
                and (spatial_only or (r[4] <= maxt and r[5] >= mint))
            ]
            return np.array(hits, dtype=np.int64)
        if n <= _BRUTE_FORCE:
            return _select(self._bounds.T, np.arange(n, dtype=np.int64), q, spatial_only)
        return self._ensure_tree().query(q, spatial_only)

    def intersect_pairs(self, other: GeoIndex, spatial_only: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """All pairs ``(i, j)`` where entry ``i`` of this index intersects entry ``j`` of ``other``.

        Runs a synchronised descent of both trees (vectorised over all
        candidate node pairs of a level), so it scales with the number of
        intersecting pairs, not with ``len(self) * len(other)``.

        Returns:
            two int64 arrays ``i`` and ``j`` of equal length, sorted by ``i``
            then ``j``.
        """
        if not isinstance(other, GeoIndex):
            raise TypeError(f"intersect_pairs takes a GeoIndex, got {type(other).__name__}")
        if len(self) == 0 or len(other) == 0:
            return _EMPTY.copy(), _EMPTY.copy()
        ta, tb = self._ensure_tree(), other._ensure_tree()
        sa, sb = ta.stages(), tb.stages()
        la, lb = 0, 0
        top_a, top_b = sa[0][0].shape[1], sb[0][0].shape[1]
        ia = np.repeat(np.arange(top_a, dtype=np.int64), top_b)
        ib = np.tile(np.arange(top_b, dtype=np.int64), top_a)
        ia, ib = _select_pairs(sa[0][0], sb[0][0], ia, ib, spatial_only)
        while (la < len(sa) - 1 or lb < len(sb) - 1) and len(ia):
            # Descend the side with more levels left (one side at a time bounds the
            # candidate pairs to FANOUT times the surviving ones).
            if len(sa) - la >= len(sb) - lb:
                ia, ib = _descend_pairs(sa[la], sa[la + 1][0], sb[lb][0], ia, ib, spatial_only)
                la += 1
            else:
                ib, ia = _descend_pairs(sb[lb], sb[lb + 1][0], sa[la][0], ib, ia, spatial_only, swapped=True)
                lb += 1
        if len(ia) == 0:
            return _EMPTY.copy(), _EMPTY.copy()
        i, j = ta.order[ia], tb.order[ib]
        if len(self) * len(other) < 2**62:
            order = np.argsort(i * len(other) + j)
        else:  # pragma: no cover - needs more than 2**31 entries on each side
            order = np.lexsort((j, i))
        return i[order], j[order]

    # pickling and display -----------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        return {"bounds": self._bounds}

    def __setstate__(self, state: dict[str, Any]) -> None:
        arr = np.require(state["bounds"], dtype=np.float64, requirements=["C", "O"])
        arr.flags.writeable = False
        self._bounds = arr
        self._tree = None
        self._rows = None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GeoIndex):
            return NotImplemented
        return self._bounds.shape == other._bounds.shape and bool(np.array_equal(self._bounds, other._bounds))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        if len(self) == 0:
            return "GeoIndex(0 entries)"
        return f"GeoIndex({len(self)} entries, total_bounds={self.total_bounds!r})"
