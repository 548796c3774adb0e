"""Kernels that turn vector features into the targets of one query grid (pure functions, no I/O).

* :func:`burn_mask`: a semantic mask, each feature burned with its label
  (``rasterio.features.rasterize``; later features win where they overlap);
* :func:`pixel_boxes`: each feature's ``(xmin, ymin, xmax, ymax)`` box in
  pixel coordinates of the grid, clipped to it (TorchGeo 0.8's ``bbox_xyxy``);
* :func:`instance_masks`: one binary mask per feature.

Geometries are shapely 2 geometries already in the grid's CRS.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import shapely
from affine import Affine
from rasterio.features import rasterize

__all__ = ["burn_mask", "pixel_boxes", "instance_masks"]


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
    geoms = np.asarray(geometries, dtype=object)
    if len(geoms) == 0:
        return np.empty((0, 4), dtype=np.float32)
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
    for k, geom in enumerate(geometries):
        rasterize([(geom, 1)], out_shape=shape, transform=transform, fill=0, all_touched=all_touched,
                  dtype=np.uint8, out=out[k])
    return out
