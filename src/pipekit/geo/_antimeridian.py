"""Footprints that cross the antimeridian: a raster's bounds in another CRS as one box, or two split at 180 degrees.

A grid in UTM zone 60 (or 1) often runs past 180 degrees of longitude.  In a
CRS cut at the antimeridian (``EPSG:4326``, ``EPSG:3857`` and other world
CRSs centred on Greenwich) its reprojected edges jump from one side of the
world to the other: a bounding box of them is either inverted (``min > max``)
or the whole world's width.  As the STAC specification advises for such
geometries, :func:`footprint_parts` splits the footprint at the antimeridian
into two boxes, one on each side, each as tight as the data it covers; in a
CRS without the cut (the item's own UTM zone, the neighbouring zone) the
footprint stays one box.

The cut is found without an extra transform: the box's edges, densified, are
transformed once into the target CRS (as
:func:`~pipekit.geo._read.transform_bounds_fast` does), and a step between
neighbouring edge points longer than half of the points' whole span is the
jump of a wrap.  Only then are the edges transformed to longitude/latitude,
unwrapped, clipped at 180 degrees with shapely and each part transformed into
the target CRS.  A box holding a pole (a polar stereographic tile) wraps too
but spans every longitude: it stays one box, GDAL's bounds (down to the pole).
"""

from __future__ import annotations

import math

import numpy as np
from rasterio.crs import CRS
from rasterio.warp import transform as warp_transform
from rasterio.warp import transform_bounds

__all__ = ["footprint_parts", "one_side", "wraps"]

Box = tuple[float, float, float, float]

_LONLAT = CRS.from_epsg(4326)


_RINGS: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def _edges(left: float, bottom: float, right: float, top: float, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The box's boundary as a ring of ``4 * n`` points: bottom, right edge up, top right to left, left down."""
    ring = _RINGS.get(n)
    if ring is None:  # the unit square's ring, made once per density
        t = np.linspace(0.0, 1.0, n)
        u = np.concatenate([t, np.ones(n), t[::-1], np.zeros(n)])
        v = np.concatenate([np.zeros(n), t, np.ones(n), t[::-1]])
        ring = _RINGS[n] = (u, v)
    u, v = ring
    return left + u * (right - left), bottom + v * (top - bottom)


def wraps(xs: np.ndarray, span: float | None = None) -> bool:
    """Whether x coordinates of a ring's points (in order) jump across the world: one step over half their span.

    Example:
        >>> wraps(np.array([178.0, 179.0, 179.9, -179.8, -179.0, 179.0]))
        True
        >>> wraps(np.array([10.0, 10.5, 11.0, 11.5, 11.0, 10.5]))
        False
    """
    if span is None:
        span = float(xs.max() - xs.min())
    if not span > 0:
        return False
    steps = np.abs(np.diff(xs))
    return bool(steps.max() > 0.5 * span or abs(float(xs[-1] - xs[0])) > 0.5 * span)


def _lonlat_parts(src_crs: CRS, ex: np.ndarray, ey: np.ndarray) -> list[Box]:
    """The ring's lon/lat boxes on each side of the antimeridian (``[]`` if it does not cross it)."""
    import shapely

    lon, lat = (np.asarray(v, dtype=np.float64) for v in warp_transform(src_crs, _LONLAT, ex, ey))
    if not (np.isfinite(lon).all() and np.isfinite(lat).all()) or not wraps(lon):
        return []
    lon = np.where(lon < 0, lon + 360.0, lon)  # the ring is near 180 degrees: east of it becomes 180..360
    ring = shapely.Polygon(np.column_stack([lon, lat]))
    if not ring.is_valid:
        ring = shapely.make_valid(ring)
    parts = []
    for lo, hi, shift in ((float(lon.min()) - 1.0, 180.0, 0.0), (180.0, float(lon.max()) + 1.0, -360.0)):
        piece = shapely.clip_by_rect(ring, lo, -90.0, hi, 90.0)
        if piece.is_empty or piece.area == 0:
            continue
        minx, miny, maxx, maxy = piece.bounds
        parts.append((minx + shift, miny, maxx + shift, maxy))
    return parts


def _holds_a_pole(src_crs: CRS, left: float, bottom: float, right: float, top: float) -> bool:
    """Whether the North or South Pole lies inside the box (a polar stereographic tile): its edges wrap, not split."""
    try:
        xs, ys = warp_transform(_LONLAT, src_crs, [0.0, 0.0], [90.0, -90.0])
    except Exception:
        return False
    return any(
        math.isfinite(x) and math.isfinite(y) and left <= x <= right and bottom <= y <= top for x, y in zip(xs, ys)
    )


def _bounds_of(tx: np.ndarray, ty: np.ndarray) -> Box:
    return float(tx.min()), float(ty.min()), float(tx.max()), float(ty.max())


def footprint_parts(
    src_crs: CRS, dst_crs: CRS, left: float, bottom: float, right: float, top: float, densify_pts: int = 21
) -> list[Box]:
    """The ``(left, bottom, right, top)`` boxes in ``dst_crs`` of a box in ``src_crs``: one, or two split at 180°.

    Two boxes only where the box crosses the antimeridian *and* ``dst_crs``
    is cut there (its transformed edges wrap); each covers the part of the
    footprint on its side, up to the antimeridian's own x in ``dst_crs``.

    Example:
        >>> utm60 = CRS.from_epsg(32760)  # Fiji: UTM zone 60 south, 180 degrees at x ~ 819,000
        >>> [tuple(round(v, 2) for v in b) for b in footprint_parts(utm60, _LONLAT, 780000, 8020000, 876000, 8116000)]
        [(179.63, -17.89, 180.0, -17.02), (-180.0, -17.88, -179.45, -17.01)]
        >>> len(footprint_parts(utm60, CRS.from_epsg(32701), 780000, 8020000, 876000, 8116000))  # zone 1: no cut
        1
    """
    n = densify_pts + 2
    ex, ey = _edges(left, bottom, right, top, n)
    try:
        tx, ty = warp_transform(src_crs, dst_crs, ex, ey)
        tx, ty = np.asarray(tx, dtype=np.float64), np.asarray(ty, dtype=np.float64)
        xmin, xmax, ymin, ymax = tx.min(), tx.max(), ty.min(), ty.max()
        finite = bool(np.isfinite(xmin + xmax + ymin + ymax))  # a NaN or inf anywhere shows in the extremes
    except Exception:
        finite = False
    if not finite:
        # some edge points do not transform: GDAL's own bounds (which report a wrap as left > right)
        west, south, east, north = transform_bounds(src_crs, dst_crs, left, bottom, right, top, densify_pts=densify_pts)
        if dst_crs.is_geographic and west > east:
            return [(west, south, 180.0, north), (-180.0, south, east, north)]
        return [(west, south, east, north)]
    if not wraps(tx, float(xmax - xmin)):
        return [(float(xmin), float(ymin), float(xmax), float(ymax))]
    if _holds_a_pole(src_crs, left, bottom, right, top):  # every longitude: one box, GDAL's (to the pole)
        return [tuple(transform_bounds(src_crs, dst_crs, left, bottom, right, top, densify_pts=densify_pts))]
    lonlat = _lonlat_parts(src_crs, ex, ey)
    if len(lonlat) < 2:
        return [(float(xmin), float(ymin), float(xmax), float(ymax))]
    if dst_crs == _LONLAT:
        return lonlat
    out = []
    for west, south, east, north in lonlat:
        px, py = _edges(west, south, east, north, n)
        qx, qy = (np.asarray(v, dtype=np.float64) for v in warp_transform(_LONLAT, dst_crs, px, py))
        if west <= -180.0:  # the antimeridian's own points may land on the far side: take them on this side
            qx = np.where(px <= -180.0, -np.abs(qx), qx)
        if east >= 180.0:
            qx = np.where(px >= 180.0, np.abs(qx), qx)
        out.append(_bounds_of(qx, qy))
    return out


def one_side(src_crs: CRS, dst_crs: CRS, left: float, bottom: float, right: float, top: float) -> Box:
    """The box itself, or where it is split in ``dst_crs`` a strip of it (a quarter) that lies on one side of 180°.

    What a default resolution is computed over: GDAL's suggestion over a box
    across the antimeridian spans the world (5 degrees for a 2 km grid).

    Example:
        >>> utm60 = CRS.from_epsg(32760)
        >>> one_side(utm60, _LONLAT, 780000, 8020000, 876000, 8116000)
        (780000, 8020000, 804000.0, 8116000)
        >>> one_side(utm60, utm60, 780000, 8020000, 876000, 8116000)
        (780000, 8020000, 876000, 8116000)
    """
    try:
        if src_crs == dst_crs or len(footprint_parts(src_crs, dst_crs, left, bottom, right, top)) < 2:
            return left, bottom, right, top
    except Exception:  # bounds that do not transform: the caller's own reprojection says why
        return left, bottom, right, top
    quarter = (right - left) / 4.0
    for strip in ((left, bottom, left + quarter, top), (right - quarter, bottom, right, top)):
        if len(footprint_parts(src_crs, dst_crs, *strip)) == 1:
            return strip
    return left, bottom, right, top
