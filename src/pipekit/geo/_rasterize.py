"""Kernels that turn vector features into the targets of one query grid (pure functions, no I/O).

* :func:`burn_mask`: a semantic mask, each feature burned with its label
  (``rasterio.features.rasterize``; later features win where they overlap);
* :func:`pixel_boxes`: each feature's ``(xmin, ymin, xmax, ymax)`` box in
  pixel coordinates of the grid, clipped to it (TorchGeo 0.8's ``bbox_xyxy``);
* :func:`instance_masks`: one binary mask per feature.

Geometries are shapely 2 geometries already in the grid's CRS.  Each kernel refuses a geometry with NaN or
infinite coordinates (``ValueError`` naming the feature), and clips one reaching further than 2**30 pixels from
the grid to the grid's neighbourhood first (:func:`near_grid`): GDAL's rasterizer silently burns nothing for a
polygon reaching past 2**31 pixels.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import shapely
from affine import Affine
from rasterio.features import rasterize

__all__ = ["bad_coordinates", "burn_mask", "pixel_boxes", "instance_masks", "near_grid"]

#: A geometry reaching further than this many pixels from the grid is clipped before it is rasterized.
FAR_PIXELS = float(2**30)


#: The largest coordinate (absolute, in CRS units) a feature may have: far beyond any place on Earth in metres,
#: feet or degrees.  A feature past it (1e300) would stretch the dataset's index past what samplers can count.
MAX_COORDINATE = 1e10


def bad_coordinates(geometries: np.ndarray) -> dict[int, str]:
    """``{index: why}`` of the geometries with NaN, infinite or larger than :data:`MAX_COORDINATE` coordinates.

    Example:
        >>> import shapely
        >>> bad_coordinates(np.array([shapely.box(0, 0, 1, 1), shapely.box(0, 0, 1e300, 1)]))
        {1: 'coordinates beyond +-1e+10 (up to 1e+300)'}
    """
    coords, owner = shapely.get_coordinates(geometries, return_index=True)
    if len(coords) == 0:
        return {}
    flags = {}
    for name, test in (("NaN", np.isnan(coords)), ("infinite", np.isinf(coords)),
                       ("huge", np.isfinite(coords) & (np.abs(coords) > MAX_COORDINATE))):
        hit = np.zeros(len(geometries), dtype=bool)
        np.logical_or.at(hit, owner, test.any(axis=1))
        flags[name] = hit
    out: dict[int, str] = {}
    for i in np.flatnonzero(flags["NaN"] | flags["infinite"] | flags["huge"]).tolist():
        if flags["NaN"][i] or flags["infinite"][i]:
            out[i] = "NaN" if flags["NaN"][i] else "infinite"
            out[i] += " coordinates" + (" (and infinite ones)" if flags["NaN"][i] and flags["infinite"][i] else "")
        else:
            own = coords[owner == i]
            out[i] = f"coordinates beyond +-{MAX_COORDINATE:g} (up to {float(np.abs(own).max()):g})"
    return out


def near_grid(geometries: Sequence[Any] | np.ndarray, transform: Affine, shape: tuple[int, int],
              where: str = "rasterize") -> np.ndarray:
    """``geometries`` as an object array, each shapely geometry reaching further than :data:`FAR_PIXELS`
    pixels from the grid clipped to the grid and a pixel around it (what it covers in the grid is unchanged).

    GeoJSON-like mappings are passed through unchecked.

    Raises:
        ValueError: a shapely geometry has NaN or infinite coordinates (names its position in ``geometries``).

    Example:
        >>> import shapely
        >>> from affine import Affine
        >>> near_grid([shapely.box(0, 0, 1e300, 2)], Affine(1, 0, 0, 0, -1, 4), (4, 4))[0].bounds
        (0.0, 0.0, 5.0, 2.0)
    """
    geoms = np.empty(len(geometries), dtype=object)
    geoms[:] = list(geometries)
    shapes = np.flatnonzero([isinstance(g, shapely.Geometry) for g in geoms])
    if len(shapes) == 0:
        return geoms
    coords, owner = shapely.get_coordinates(geoms[shapes], return_index=True)
    finite = np.isfinite(coords).all(axis=1)
    if not finite.all():
        bad = int(shapes[owner[np.argmin(finite)]])
        raise ValueError(f"{where}: feature {bad} has NaN or infinite coordinates")
    if len(coords) == 0:
        return geoms
    inv = ~transform
    px = inv.a * coords[:, 0] + inv.b * coords[:, 1] + inv.c
    py = inv.d * coords[:, 0] + inv.e * coords[:, 1] + inv.f
    reach = np.zeros(len(shapes))
    np.maximum.at(reach, owner, np.maximum(np.abs(px), np.abs(py)))
    far = shapes[reach > FAR_PIXELS]
    if len(far):
        height, width = shape
        corners = [transform * (x, y) for x in (-1, width + 1) for y in (-1, height + 1)]
        xs, ys = [c[0] for c in corners], [c[1] for c in corners]
        geoms[far] = shapely.clip_by_rect(geoms[far], min(xs), min(ys), max(xs), max(ys))
    return geoms


def burn_mask(
    geometries: Sequence[shapely.Geometry] | np.ndarray,
    labels: Sequence[int] | np.ndarray,
    transform: Affine,
    shape: tuple[int, int],
    all_touched: bool = False,
) -> np.ndarray:
    """An int64 ``[H, W]`` mask: 0 (background) where no feature lies, else the label of the last feature there.

    Args:
        geometries: the features, in the grid's CRS (shapely geometries or
            GeoJSON-like mappings, which rasterio reads faster).
        labels: one integer per feature (0 burns background, TorchGeo's
            "not rendered").
        transform: the grid's affine transform.
        shape: ``(height, width)``.
        all_touched: burn every pixel a feature touches, not only those whose
            centre it covers (``rasterio.features.rasterize``'s option).

    Example:
        >>> import shapely
        >>> from affine import Affine
        >>> mask = burn_mask([shapely.box(0, 0, 2, 2)], [3], Affine(1, 0, 0, 0, -1, 4), (4, 4))
        >>> mask.tolist()
        [[0, 0, 0, 0], [0, 0, 0, 0], [3, 3, 0, 0], [3, 3, 0, 0]]
    """
    if len(geometries) != len(labels):
        raise ValueError(f"burn_mask: {len(geometries)} geometries but {len(labels)} labels")
    if len(geometries) == 0:
        return np.zeros(shape, dtype=np.int64)
    geometries = near_grid(geometries, transform, shape, "burn_mask")
    values = np.asarray(labels, dtype=np.int64)
    lo, hi = int(values.min()), int(values.max())
    dtype = np.int32 if lo >= -(2**31) and hi < 2**31 else np.float64
    out = rasterize(
        zip(list(geometries), values.astype(dtype).tolist()),
        out_shape=shape,
        transform=transform,
        fill=0,
        all_touched=all_touched,
        dtype=dtype,
    )
    return out.astype(np.int64)


def pixel_boxes(geometries: Sequence[shapely.Geometry] | np.ndarray, transform: Affine,
                shape: tuple[int, int]) -> np.ndarray:
    """A float32 ``[N, 4]`` array of ``(xmin, ymin, xmax, ymax)`` pixel boxes, clipped to the grid.

    Pixel coordinates run from ``(0, 0)`` at the grid's top-left corner to
    ``(width, height)``; a feature outside the grid gets a box of NaNs.

    Example:
        >>> import shapely
        >>> from affine import Affine
        >>> pixel_boxes([shapely.box(1, 1, 3, 9)], Affine(1, 0, 0, 0, -1, 4), (4, 4)).tolist()
        [[1.0, 0.0, 3.0, 3.0]]
    """
    if len(geometries) == 0:
        return np.empty((0, 4), dtype=np.float32)
    geoms = near_grid(geometries, transform, shape, "pixel_boxes")
    inv = ~transform
    coeffs = [inv.a, inv.b, inv.d, inv.e, inv.c, inv.f]
    in_pixels = np.array([shapely.affinity.affine_transform(g, coeffs) for g in geoms], dtype=object)
    height, width = shape
    clipped = shapely.clip_by_rect(in_pixels, 0.0, 0.0, float(width), float(height))
    return shapely.bounds(clipped).astype(np.float32)


def instance_masks(
    geometries: Sequence[shapely.Geometry] | np.ndarray,
    transform: Affine,
    shape: tuple[int, int],
    all_touched: bool = False,
) -> np.ndarray:
    """A uint8 ``[N, H, W]`` stack of binary masks, one per feature (overlaps stay in both).

    Example:
        >>> import shapely
        >>> from affine import Affine
        >>> masks = instance_masks([shapely.box(0, 0, 2, 2), shapely.box(1, 1, 4, 4)],
        ...                        Affine(1, 0, 0, 0, -1, 4), (4, 4))
        >>> masks.shape, masks.sum(axis=(1, 2)).tolist()
        ((2, 4, 4), [4, 9])
    """
    height, width = shape
    out = np.zeros((len(geometries), height, width), dtype=np.uint8)
    for k, geom in enumerate(near_grid(geometries, transform, shape, "instance_masks")):
        rasterize([(geom, 1)], out_shape=shape, transform=transform, fill=0, all_touched=all_touched,
                  dtype=np.uint8, out=out[k])
    return out
