"""Reading one query's pixels: native windows, warping of just the window, first-valid mosaics.

The output of a query is a grid (:class:`Grid`): origin at the query's
``(minx, maxy)``, pixel size the dataset's ``res``, shape computed by
:func:`patch_shape` so that a box of 256 pixels is read as 256 pixels, never
255 or 257 from floating-point noise.

:func:`read_into` fills a preallocated output array from one file:

* **native** (the fast path): the file has the target CRS and pixel size and
  is north-up.  The query window is snapped to the file's pixel grid, clipped
  to the file, and every requested band is read in one ``src.read(indexes,
  window=...)`` call; the parts of the query outside the file keep the fill
  value (a boundless read, without GDAL's slower VRT-based boundless mode).
  Snapping is exact for nearest-neighbour resampling (it picks the pixel
  under each target pixel centre, as GDAL does) and, for other resamplings,
  used only when the offset is below :data:`SNAP_TOLERANCE` pixels;
* **warped**: otherwise the part of the file that covers the query (its
  bounds transformed to the file's CRS, plus a margin for the resampling
  kernel) is read natively and reprojected onto the query grid with
  ``rasterio.warp.reproject`` -- never the whole file, never a merged mosaic.

Nodata pixels are left out of the resampling (GDAL's masked kernels, as
``rasterio.warp.reproject`` of the whole file does), so warped samples agree
with GDAL's own reprojection of the file onto the query grid.
:func:`read_stack_into` reads the band files of one scene, warping them in
a single call when they share a grid.

With several files under one query, each pixel (and band) takes the first
file that has a valid value there ("first" in index order; nodata and
pixels outside a file are not valid).
"""

from __future__ import annotations

import math
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np
import rasterio
from affine import Affine
from rasterio.crs import CRS
from rasterio.enums import Resampling
from rasterio.warp import reproject, transform_bounds
from rasterio.warp import transform as warp_transform
from rasterio.windows import Window

from pipekit import _fast
from pipekit.errors import (
    SkippedReadError,  # re-exported: its former home
    SourceReadError,
)
from pipekit.geo import _warp as warp
from pipekit.geo import warpcache
from pipekit.geo._bbox import BoundingBox
from pipekit.geo.io import RasterHandle, error_reason

__all__ = [
    "Grid",
    "SourceReadError",
    "SkippedReadError",
    "read_stack_into",
    "same_grid",
    "transform_bounds_fast",
    "patch_shape",
    "read_into",
    "native_offsets",
    "SNAP_TOLERANCE",
    "valid_mask",
    "resampling_from",
]

#: Largest sub-pixel offset (in pixels) between a query and a file's grid that
#: is snapped instead of resampled, for resamplings other than nearest.
SNAP_TOLERANCE = 0.01

# Relative tolerance when turning a length in CRS units into a pixel count.
_SHAPE_RTOL = 1e-6

_KERNEL_RADIUS = {
    Resampling.nearest: 1.0,
    Resampling.bilinear: 1.0,
    Resampling.cubic: 2.0,
    Resampling.cubic_spline: 2.0,
    Resampling.lanczos: 3.0,
}


def apply_affine(t: Affine, x: float, y: float) -> tuple[float, float]:
    """``t`` applied to the point ``(x, y)`` (without affine's deprecated ``*`` operator)."""
    return t.a * x + t.b * y + t.c, t.d * x + t.e * y + t.f


def window_transform(t: Affine, col: float, row: float) -> Affine:
    """The transform of the window of ``t``'s raster that starts at pixel ``(col, row)``."""
    x, y = apply_affine(t, col, row)
    return Affine(t.a, t.b, x, t.d, t.e, y)


_uniform_dtype: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _direct_read_ok(handle: RasterHandle, indexes: list[int], window: Window, out: np.ndarray) -> bool:
    """Whether ``handle.ds._read`` may serve this read (what ``DatasetReader.read`` checks, known to hold).

    ``read()`` spends 40-80 µs of Python a call validating and cropping
    before it calls ``_read``, as much as copying a 256 px window out of
    GDAL's block cache; the native and warped paths call it 6-7 times a
    sample.  The checks it makes are cheap to make here for the reads those
    paths do: every band of the file has the output's dtype (``read()``
    refuses mixed dtypes), the bands exist, the window lies inside the
    file, ``out`` is C-contiguous and of the window's shape.
    """
    uniform = _uniform_dtype.get(handle)
    if uniform is None:
        ds = handle.ds
        uniform = _uniform_dtype[handle] = bool(
            _RAW_READ and hasattr(ds, "_read") and all(d == handle.dtype for d in ds.dtypes)
        )
    if not uniform or out.dtype != handle.np_dtype or not out.flags.c_contiguous:
        return False
    c0, r0, w, h = window.col_off, window.row_off, window.width, window.height
    return (
        type(c0) is int and type(r0) is int and type(w) is int and type(h) is int
        and c0 >= 0 and r0 >= 0 and w > 0 and h > 0 and c0 + w <= handle.width and r0 + h <= handle.height
        and out.shape == (len(indexes), h, w)
        and bool(indexes) and min(indexes) >= 1 and max(indexes) <= handle.count
    )


def _raw_read_supported(version: str) -> bool:
    """Whether ``DatasetReader._read(indexes, out, window, dtype)`` has the signature pipekit calls.

    It is private to rasterio: the same in 1.3 and 1.4 (pipekit's range); any other
    release goes through ``read()``.

    Example:
        >>> _raw_read_supported("1.4.4"), _raw_read_supported("1.3.9"), _raw_read_supported("2.0.0")
        (True, True, False)
    """
    parts = version.split(".")
    try:
        major, minor = int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return False
    return (major, minor) in ((1, 3), (1, 4))


#: Read windows through rasterio's ``DatasetReader._read`` where :func:`_direct_read_ok` allows it (tests
#: switch it off to compare with ``read()``); only on the rasterio releases whose ``_read`` is known.
_RAW_READ = _raw_read_supported(rasterio.__version__)


def _read_window(handle: RasterHandle, indexes: list[int], window: Window, out: np.ndarray | None = None) -> np.ndarray:
    try:
        target = out
        direct = _RAW_READ and isinstance(window, Window)  # else a ((row0, row1), (col0, col1)) pair: read()'s
        if direct and out is None:
            target = np.empty((len(indexes), int(window.height), int(window.width)), dtype=handle.np_dtype)
        direct = direct and _direct_read_ok(handle, indexes, window, target)
        if handle.remote:
            with handle.env():
                if handle.prefetch is not None and isinstance(window, Window):
                    handle.prefetch(indexes, window)
                if direct:
                    return handle.ds._read(indexes, target, window, target.dtype)
                return handle.ds.read(indexes, window=window, out=out)
        if direct:
            return handle.ds._read(indexes, target, window, target.dtype)
        return handle.ds.read(indexes, window=window, out=out)
    except Exception as exc:
        raise SourceReadError(handle.url, exc, error_reason(exc)) from exc


#: Runs ``fn(0), ..., fn(count - 1)`` (the parts of one read, possibly at once) and returns their results in order.
PartRunner = Callable[[Callable[[int], Any], int], list[Any]]


def _run_serially(fn: Callable[[int], Any], count: int) -> list[Any]:
    return [fn(k) for k in range(count)]


def _read_windows(parts: list[tuple[RasterHandle, list[int]]], window: Window, run: PartRunner | None) -> np.ndarray:
    """The window of each part, bands stacked in part order (read through ``run``: at once, where it can)."""
    if len(parts) == 1:
        return _read_window(parts[0][0], parts[0][1], window)
    # each part straight into its bands of one array (no concatenation afterwards)
    offsets = np.cumsum([0] + [len(indexes) for _, indexes in parts]).tolist()
    data = np.empty((offsets[-1], int(window.height), int(window.width)), dtype=parts[0][0].np_dtype)
    if any(h.np_dtype != data.dtype for h, _ in parts[1:]):  # mixed dtypes: numpy's promotion, as before
        return np.concatenate((run or _run_serially)(lambda k: _read_window(parts[k][0], parts[k][1], window),
                                                     len(parts)))
    (run or _run_serially)(lambda k: _read_window(parts[k][0], parts[k][1], window,
                                                  data[offsets[k]:offsets[k + 1]]), len(parts))
    return data


def resampling_from(value: Resampling | str | int) -> Resampling:
    """A :class:`rasterio.enums.Resampling` from itself, its name (``"bilinear"``) or its value."""
    if isinstance(value, Resampling):
        return value
    if isinstance(value, str):
        try:
            return Resampling[value.lower()]
        except KeyError:
            names = ", ".join(r.name for r in Resampling)
            raise ValueError(f"unknown resampling {value!r}; choose one of {names}") from None
    if isinstance(value, int) and not isinstance(value, bool):
        return Resampling(value)
    raise TypeError(f"resampling must be a rasterio Resampling or its name, got {value!r}")


def _pixels(length: float, res: float) -> int:
    """``round(length / res)``, robust to floating-point noise (and never banker's rounding)."""
    value = length / res
    # values within the tolerance of a half round up, whichever side of it float noise put them
    return math.floor(value + 0.5 + _SHAPE_RTOL * max(1.0, abs(value)))


def patch_shape(bbox: BoundingBox, res: tuple[float, float]) -> tuple[int, int]:
    """``(height, width)`` in pixels of ``bbox`` at ``res = (xres, yres)``; at least 1x1.

    Example:
        >>> from pipekit.geo import BoundingBox
        >>> patch_shape(BoundingBox(0.1, 0.1 + 256 * 0.3, 0, 25.6), (0.3, 0.1))
        (256, 256)
    """
    xres, yres = res
    return max(1, _pixels(bbox.maxy - bbox.miny, yres)), max(1, _pixels(bbox.maxx - bbox.minx, xres))


class Grid:
    """The pixel grid a query is read onto: CRS, affine transform, shape.

    ``crs_key`` identifies the CRS cheaply (its WKT) for per-handle caches.
    """

    __slots__ = ("crs", "crs_key", "height", "transform", "width")

    def __init__(self, crs: CRS, transform: Affine, height: int, width: int, crs_key: str) -> None:
        self.crs = crs
        self.transform = transform
        self.height = height
        self.width = width
        self.crs_key = crs_key

    def __repr__(self) -> str:
        return f"Grid(crs={self.crs}, transform={tuple(self.transform)[:6]}, height={self.height}, width={self.width})"

    @classmethod
    def from_bbox(cls, bbox: BoundingBox, res: tuple[float, float], crs: CRS, crs_key: str | None = None) -> Grid:
        height, width = patch_shape(bbox, res)
        xres, yres = res
        transform = Affine(xres, 0.0, bbox.minx, 0.0, -yres, bbox.maxy)
        return cls(crs, transform, height, width, crs_key if crs_key is not None else crs.to_wkt())

    @property
    def shape(self) -> tuple[int, int]:
        return self.height, self.width

    @property
    def bounds(self) -> tuple[float, float, float, float]:
        """``(left, bottom, right, top)`` of the grid."""
        t = self.transform
        return t.c, t.f + t.e * self.height, t.c + t.a * self.width, t.f


def transform_bounds_fast(
    src_crs: CRS, dst_crs: CRS, left: float, bottom: float, right: float, top: float, densify_pts: int = 21
) -> tuple[float, float, float, float]:
    """Bounds of a box after reprojection: its edges densified with ``densify_pts`` points each.

    Gives the same result as ``rasterio.warp.transform_bounds`` (which
    costs milliseconds per call with GDAL 3.10) in tens of microseconds, by
    transforming the edge points in one ``rasterio.warp.transform`` call.
    Falls back to ``transform_bounds`` where the result could wrap the
    antimeridian (geographic targets) or some points do not transform.
    """
    n = densify_pts + 2
    xs = np.linspace(left, right, n)
    ys = np.linspace(bottom, top, n)
    ex = np.concatenate([xs, xs, np.full(n, left), np.full(n, right)])
    ey = np.concatenate([np.full(n, bottom), np.full(n, top), ys, ys])
    try:
        tx, ty = warp_transform(src_crs, dst_crs, ex, ey)
    except Exception:
        tx = ty = None
    if tx is not None:
        tx = np.asarray(tx)
        ty = np.asarray(ty)
        if np.isfinite(tx).all() and np.isfinite(ty).all():
            result = (float(tx.min()), float(ty.min()), float(tx.max()), float(ty.max()))
            if not (dst_crs.is_geographic and result[2] - result[0] > 180.0):
                return result
    return tuple(transform_bounds(src_crs, dst_crs, left, bottom, right, top, densify_pts=densify_pts))


def valid_mask(data: np.ndarray, nodata: float | None) -> np.ndarray | None:
    """Where ``data`` holds a value (not ``nodata``, not NaN); ``None`` means everywhere."""
    floating = np.issubdtype(data.dtype, np.floating)
    if nodata is None:
        return ~np.isnan(data) if floating else None
    if isinstance(nodata, float) and math.isnan(nodata):
        return ~np.isnan(data) if floating else None
    if floating:
        return (data != nodata) & ~np.isnan(data)
    lo, hi = warp.int_range(data.dtype)
    if not lo <= nodata <= hi or nodata != int(nodata):
        return None
    return data != data.dtype.type(int(nodata))


def _same_crs(handle: RasterHandle, grid: Grid) -> bool:
    cached = handle.same_crs.get(grid.crs_key)
    if cached is None:
        cached = handle.same_crs[grid.crs_key] = bool(handle.crs == grid.crs)
    return cached


def native_offsets(handle: RasterHandle, grid: Grid, resampling: Resampling) -> tuple[int, int] | None:
    """The (column, row) of the grid's origin in the file's pixels when a native read is exact, else None.

    A file read natively is never warped together with others by :func:`read_stack_into`.
    """
    t = handle.transform
    g = grid.transform
    if t.b != 0.0 or t.d != 0.0 or t.a <= 0.0 or t.e >= 0.0:
        return None
    # pixel sizes must agree to within a small fraction of a pixel across the whole window
    span = max(grid.width, grid.height, 1)
    if abs(t.a - g.a) * span > SNAP_TOLERANCE * g.a or abs(t.e - g.e) * span > SNAP_TOLERANCE * abs(g.e):
        return None
    if not _same_crs(handle, grid):
        return None
    col = (g.c - t.c) / t.a
    row = (g.f - t.f) / t.e
    col_i = math.floor(col + 0.5)
    row_i = math.floor(row + 0.5)
    if resampling != Resampling.nearest and (
        abs(col - col_i) > SNAP_TOLERANCE or abs(row - row_i) > SNAP_TOLERANCE
    ):
        return None
    return col_i, row_i


def read_into(
    handle: RasterHandle,
    indexes: list[int],
    grid: Grid,
    out: np.ndarray,
    valid: np.ndarray | None,
    resampling: Resampling,
    nodata: float | None,
    fill: float = 0,
    prefilled: bool = True,
) -> bool:
    """Read bands ``indexes`` (1-based) of ``handle`` onto ``grid`` into ``out`` (``[len(indexes), H, W]``).

    Args:
        handle: the open file.
        indexes: band numbers to read, in output order.
        grid: the output grid.
        out: the output array, prefilled with the fill value.
        valid: ``None`` when this file is the only one of the query (every
            pixel it covers is written); otherwise a boolean array shaped like
            ``out`` of the elements already holding a value: only the others
            are written (first-valid mosaic), and it is updated.
        resampling: for the warped path.
        nodata: the file's nodata value (the dataset's override, or the file's).
        fill: the value ``out`` was prefilled with.
        prefilled: ``False`` when ``out`` is uninitialised (single file only):
            the elements the file does not cover are then set to ``fill`` here,
            which saves filling the whole array when the file covers it all.

    Returns:
        whether the file covered any part of the grid.
    """
    if not prefilled and valid is not None:
        raise ValueError("prefilled=False is only for a single file (valid=None)")
    offsets = native_offsets(handle, grid, resampling)
    if offsets is not None:
        return _read_native(handle, indexes, grid, out, valid, nodata, fill, prefilled, *offsets)
    if not prefilled:
        out[...] = fill
    return _read_warped([(handle, indexes)], grid, out, valid, resampling, nodata, fill)


def same_grid(a: RasterHandle, b: RasterHandle) -> bool:
    """Whether two files share CRS, transform and size (e.g. the band files of one Landsat scene)."""
    if a.width != b.width or a.height != b.height or a.transform != b.transform:
        return False
    key = b.crs.to_wkt() if b.crs is not None else ""
    cached = a.same_crs.get(key)
    if cached is None:
        cached = a.same_crs[key] = bool(a.crs == b.crs)
    return cached


def read_stack_into(
    parts: list[tuple[RasterHandle, list[int]]],
    nodatas: list[float | None],
    grid: Grid,
    out: np.ndarray,
    valid: np.ndarray | None,
    resampling: Resampling,
    fill: float = 0,
    prefilled: bool = True,
    run: PartRunner | None = None,
) -> bool:
    """Like :func:`read_into` for bands spread over several files (one scene, one file per band).

    ``out`` holds the parts' bands one after the other.  When the files
    share a grid that has to be warped, their windows are stacked and
    warped in a single call (one GDAL warp setup instead of one per band).

    ``run`` runs the per-part work (``run(fn, count)``: ``fn(k)`` for each
    part ``k``, results in order), e.g. each part on its own I/O thread at
    once (:func:`pipekit.geo.io.run_parts`); parts write disjoint slices of
    ``out`` and ``valid``.  Default: one after another, on this thread.

    Returns:
        whether any file covered part of the grid.
    """
    first = parts[0][0]
    if (
        len(parts) > 1
        and native_offsets(first, grid, resampling) is None
        and all(n == nodatas[0] or (n is not None and nodatas[0] is not None and _same_value(n, nodatas[0]))
                for n in nodatas)
        and all(same_grid(first, h) and h.dtype == first.dtype for h, _ in parts[1:])
    ):
        if not prefilled:
            out[...] = fill
        return _read_warped(parts, grid, out, valid, resampling, nodatas[0], fill, run)
    offsets = np.cumsum([0] + [len(indexes) for _, indexes in parts]).tolist()

    def read_part(k: int) -> bool:
        handle, indexes = parts[k]
        part = slice(offsets[k], offsets[k + 1])
        return read_into(handle, indexes, grid, out[part], None if valid is None else valid[part], resampling,
                         nodatas[k], fill, prefilled)

    return any((run or _run_serially)(read_part, len(parts)))


def _read_native(
    handle: RasterHandle,
    indexes: list[int],
    grid: Grid,
    out: np.ndarray,
    valid: np.ndarray | None,
    nodata: float | None,
    fill: float,
    prefilled: bool,
    col: int,
    row: int,
) -> bool:
    h, w = grid.height, grid.width
    c0, r0 = max(col, 0), max(row, 0)
    c1, r1 = min(col + w, handle.width), min(row + h, handle.height)
    if c0 >= c1 or r0 >= r1:
        if not prefilled:
            out[...] = fill
        return False
    window = Window(c0, r0, c1 - c0, r1 - r0)
    ys, xs = slice(r0 - row, r1 - row), slice(c0 - col, c1 - col)
    direct = (
        valid is None
        and r1 - r0 == h
        and c1 - c0 == w
        and out.dtype == handle.np_dtype  # GDAL's own type conversion is slower than numpy's
        and out.flags.c_contiguous
        and (nodata is None or _same_value(nodata, fill))
    )
    if direct:
        _read_window(handle, indexes, window, out)
        return True
    data = _read_window(handle, indexes, window)
    if not prefilled:
        out[...] = fill
    _place(data, out, valid, (slice(None), ys, xs), nodata, fill)
    return True


def _same_value(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b


def _place(
    data: np.ndarray,
    out: np.ndarray,
    valid: np.ndarray | None,
    where: tuple,
    nodata: float | None,
    fill: float,
    coverage: np.ndarray | None = None,
) -> None:
    """Write ``data`` into ``out[where]``.

    Single file (``valid is None``): every covered element, except nodata
    elements when the file's nodata differs from the output's fill value.
    Mosaic: only elements not yet valid, and ``valid`` is updated.
    """
    if valid is None:
        mask = coverage
        if nodata is not None and not _same_value(nodata, fill):
            data_valid = valid_mask(data, nodata)
            if data_valid is not None:
                mask = data_valid if mask is None else (mask & data_valid)
        if mask is None:
            out[where] = data
        else:
            np.copyto(out[where], data, where=mask, casting="unsafe")
        return
    data_valid = valid_mask(data, nodata)
    if coverage is not None:
        data_valid = coverage if data_valid is None else (data_valid & coverage)
    target = valid[where]
    write = ~target if data_valid is None else (data_valid & ~target)
    np.copyto(out[where], data, where=write, casting="unsafe")
    if data_valid is None:
        target[...] = True
    else:
        target |= data_valid


def _source_window(handle: RasterHandle, grid: Grid, resampling: Resampling) -> tuple[int, int, int, int] | None:
    """``(col0, row0, col1, row1)`` of the file's pixels that the grid needs, clipped to the file."""
    left, bottom, right, top = grid.bounds
    if _same_crs(handle, grid):
        sb = (left, bottom, right, top)
    else:
        try:
            sb = transform_bounds_fast(grid.crs, handle.crs, left, bottom, right, top)
        except Exception:  # the query lies outside the file CRS's domain
            return None
        if not all(math.isfinite(v) for v in sb):
            return None
    inv = ~handle.transform
    xs, ys = [], []
    for x, y in ((sb[0], sb[1]), (sb[0], sb[3]), (sb[2], sb[1]), (sb[2], sb[3])):
        c, r = apply_affine(inv, x, y)
        xs.append(c)
        ys.append(r)
    # target pixel size in source pixels: how far the resampling kernel reaches
    scale = max(1.0, (max(xs) - min(xs)) / max(grid.width, 1), (max(ys) - min(ys)) / max(grid.height, 1))
    margin = math.ceil(_KERNEL_RADIUS.get(resampling, 1.0) * scale) + 2
    c0 = max(0, math.floor(min(xs)) - margin)
    r0 = max(0, math.floor(min(ys)) - margin)
    c1 = min(handle.width, math.ceil(max(xs)) + margin)
    r1 = min(handle.height, math.ceil(max(ys)) + margin)
    if c0 >= c1 or r0 >= r1:
        return None
    return c0, r0, c1, r1


def _nodata_in(data: np.ndarray, nodata: float | None) -> float | None:
    """The nodata value to hand GDAL's warper for ``data`` (``None`` if ``data``'s type cannot hold it).

    It is passed even when no element of the window holds it: GDAL's
    unmasked kernels are faster but round differently from the masked ones
    that ``rasterio.warp.reproject`` of the whole file uses.
    """
    if nodata is None or np.issubdtype(data.dtype, np.floating):
        return nodata
    lo, hi = warp.int_range(data.dtype)
    if not lo <= nodata <= hi or nodata != int(nodata):
        return None
    return nodata


_USE_GDAL = object()
_crs_keys: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _crs_key(handle: RasterHandle) -> str:
    key = _crs_keys.get(handle)
    if key is None:
        key = _crs_keys[handle] = handle.crs.to_wkt()
    return key


#: Fitted maps of lattice blocks: ``key -> [2, 3] coefficients`` (or ``None``: not affine over the block).
_block_maps: OrderedDict[tuple, np.ndarray | None] = OrderedDict()
_BLOCK_MAPS_MAX = 1 << 16
_block_maps_lock = threading.Lock()


def _block_map(handle: RasterHandle, grid: Grid, lat: warpcache.Lattice, bx: int, by: int) -> np.ndarray | None:
    """The affine map (target to source pixels) fitted over lattice block ``(bx, by)``, or ``None``.

    One map per block of the query lattice and source grid, fitted on the
    block's own extent: every read of a pixel uses the same map, whatever
    the query, so cached and direct reads agree bit for bit.
    """
    key = (tuple(handle.transform)[:6], _crs_key(handle), grid.crs_key, lat, bx, by)
    with _block_maps_lock:
        if key in _block_maps:
            _block_maps.move_to_end(key)
            return _block_maps[key]
    size = warpcache.BLOCK
    transform = warpcache.lattice_transform(lat, bx * size, by * size)
    coef = warp.source_affine(transform, grid.crs, (size, size), handle.transform, handle.crs, grid.crs_key,
                              _crs_key(handle))
    with _block_maps_lock:
        _block_maps[key] = coef
        if len(_block_maps) > _BLOCK_MAPS_MAX:
            _block_maps.popitem(last=False)
    return coef


def _lattice_indices(
    handle: RasterHandle, grid: Grid, lat: warpcache.Lattice, col0: int, row0: int, shape: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray] | None:
    """Source pixel ``(cols, rows)`` (integers, ``[H, W]``) under the nearest rule of the lattice's pixels.

    The grid starts at lattice pixel ``(col0, row0)``.  Each pixel is
    computed from its block's map (:func:`_block_map`) and its position in
    the block by the same float operations every time, so the result for a
    pixel does not depend on the grid it is read with.  ``None`` when a
    centre does not transform (outside the source CRS's domain).
    """
    size = warpcache.BLOCK
    h, w = shape
    cols = np.empty((h, w), dtype=np.intp)
    rows = np.empty((h, w), dtype=np.intp)
    centres = warp.block_centres(size)
    for by in range(row0 // size, (row0 + h - 1) // size + 1):
        r_lo, r_hi = max(row0, by * size), min(row0 + h, (by + 1) * size)
        y = centres[r_lo - by * size:r_hi - by * size]
        for bx in range(col0 // size, (col0 + w - 1) // size + 1):
            c_lo, c_hi = max(col0, bx * size), min(col0 + w, (bx + 1) * size)
            x = centres[c_lo - bx * size:c_hi - bx * size]
            dst = (slice(r_lo - row0, r_hi - row0), slice(c_lo - col0, c_hi - col0))
            coef = _block_map(handle, grid, lat, bx, by)
            if coef is not None:
                (a, b, c), (d, e, f) = coef.tolist()
                sc = np.add.outer(b * y + c, a * x)
                sr = np.add.outer(e * y + f, d * x)
            else:  # not affine over the block: interpolated over the whole block, then the part needed
                transform = warpcache.lattice_transform(lat, bx * size, by * size)
                coords = warp.source_coordinates(transform, grid.crs, (size, size), handle.transform, handle.crs,
                                                 grid.crs_key, _crs_key(handle))
                if coords is None:
                    return None
                part = (slice(r_lo - by * size, r_hi - by * size), slice(c_lo - bx * size, c_hi - bx * size))
                sc, sr = coords[0][part], coords[1][part]
            np.floor(sc, out=sc)
            np.floor(sr, out=sr)
            cols[dst] = sc
            rows[dst] = sr
    return cols, rows


def _take_nearest(
    parts: list[tuple[RasterHandle, list[int]]], cols: np.ndarray, rows: np.ndarray, run: PartRunner | None = None
) -> tuple[np.ndarray, np.ndarray | None] | None:
    """The source pixels at integer ``(cols, rows)``: ``(data [bands, H, W], inside [H, W] or None)``.

    ``None`` when no pixel is inside the file(s).
    """
    handle = parts[0][0]
    height, width = handle.height, handle.width
    c0, c1 = max(int(cols.min()), 0), min(int(cols.max()) + 1, width)
    r0, r1 = max(int(rows.min()), 0), min(int(rows.max()) + 1, height)
    if c0 >= c1 or r0 >= r1:
        return None
    data = _read_windows(parts, Window(c0, r0, c1 - c0, r1 - r0), run)
    inside: np.ndarray | None = None
    lc, lr = cols - c0, rows - r0
    if c0 > cols.min() or c1 <= cols.max() or r0 > rows.min() or r1 <= rows.max():
        inside = (lc >= 0) & (lc < c1 - c0) & (lr >= 0) & (lr < r1 - r0)
        np.clip(lc, 0, c1 - c0 - 1, out=lc)
        np.clip(lr, 0, r1 - r0 - 1, out=lr)
    lr *= c1 - c0
    lr += lc
    src = data.reshape(data.shape[0], -1)
    if data.shape[0] == 1:
        out = np.take(src[0], lr)[None]
    else:
        out = np.take(src, lr, axis=1)
    return out, inside


def _warp_fast(
    parts: list[tuple[RasterHandle, list[int]]],
    grid: Grid,
    resampling: Resampling,
    run: PartRunner | None = None,
) -> object:
    """Warp the parts with :mod:`pipekit.geo._warp` (nearest neighbour: through :mod:`pipekit.geo.warpcache`).

    Nearest-neighbour reads of north-up grids are computed on the query's
    pixel lattice (:func:`pipekit.geo.warpcache.lattice`): each target pixel
    takes the source pixel given by its lattice block's fitted map
    (:func:`_lattice_indices`), so a pixel is the same whether it is read
    directly, as part of a cached block, or after any other read.

    Returns ``(data, coverage)``: ``data`` ``[bands, H, W]`` in the files'
    dtype, ``coverage`` a boolean ``[H, W]`` of the target pixels that have a
    source pixel (``None``: all of them); or ``None`` if the files cover no
    target pixel; or ``_USE_GDAL``.
    """
    handle = parts[0][0]
    t = handle.transform
    if t.b != 0.0 or t.d != 0.0:
        return _USE_GDAL

    def read(c0: int, r0: int, c1: int, r1: int) -> np.ndarray:
        return _read_windows(parts, Window(c0, r0, c1 - c0, r1 - r0), run)

    def warp_grid(transform: Affine, shape: tuple[int, int]) -> object:
        if resampling == Resampling.nearest:
            found = warpcache.lattice(transform)
            if found is not None:
                indices = _lattice_indices(handle, grid, *found, shape)
                if indices is None:
                    return _USE_GDAL
                return _take_nearest(parts, *indices, run)
        src_key = _crs_key(handle)
        coef = warp.source_affine(transform, grid.crs, shape, t, handle.crs, grid.crs_key, src_key)
        if coef is not None:
            coords = warp.affine_coordinates(coef, shape)
        else:
            coords = warp.source_coordinates(transform, grid.crs, shape, t, handle.crs, grid.crs_key, src_key)
        if coords is None:
            return _USE_GDAL
        result = warp.warp_window(read, (handle.height, handle.width), *coords, resampling, None, handle.np_dtype)
        if result is None:
            # bilinear down-sampling is GDAL's; "nothing covered" is final
            return _USE_GDAL if resampling == Resampling.bilinear else None
        data, ok = result
        return data, ok.all(axis=0) if ok.ndim == 3 else ok

    if resampling == Resampling.nearest and all(h.reusable for h, _ in parts):

        def warp_blocks(transform: Affine, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray | None] | None:
            got = warp_grid(transform, shape)
            if got is None:  # no pixel of these blocks is in the file: all outside
                return np.zeros((sum(len(i) for _, i in parts), *shape), handle.np_dtype), np.zeros(shape, bool)
            return got if isinstance(got, tuple) else None

        source = (tuple((h.token, tuple(indexes)) for h, indexes in parts), grid.crs_key)
        got = warpcache.read_blocks(source, grid.transform, grid.shape, warp_blocks)
        if got is not None:
            if got[1] is not None and not got[1].any():
                return None
            return got
    return warp_grid(grid.transform, grid.shape)


def _read_warped(
    parts: list[tuple[RasterHandle, list[int]]],
    grid: Grid,
    out: np.ndarray,
    valid: np.ndarray | None,
    resampling: Resampling,
    nodata: float | None,
    fill: float,
    run: PartRunner | None = None,
) -> bool:
    """Warp the part of the file(s) under the grid; ``parts`` share one grid (their bands are stacked).

    ``run``: how the parts' windows are read (see :func:`read_stack_into`).
    """
    handle = parts[0][0]
    # the numpy warp where it gives GDAL's result (fast path "warp", pipekit._fast)
    if _fast.enabled("warp") and warp.supports(resampling):
        fast = _warp_fast(parts, grid, resampling, run)
        if fast is not _USE_GDAL:
            if fast is None:
                return False
            data, coverage = fast
            # pixels without a source pixel (or holding nodata) keep the fill
            _place(data, out, valid, (slice(None), slice(None), slice(None)), nodata, fill,
                   coverage=None if coverage is None else np.broadcast_to(coverage, data.shape))
            return True
    box = _source_window(handle, grid, resampling)
    if box is None:
        return False
    c0, r0, c1, r1 = box
    data = _read_windows(parts, Window(c0, r0, c1 - c0, r1 - r0), run)
    src_transform = window_transform(handle.transform, c0, r0)
    count = data.shape[0]
    src_nodata = _nodata_in(data, nodata)
    if valid is None and out.dtype == data.dtype and out.flags.c_contiguous:
        # one file: warp straight into the output (filled beforehand); GDAL leaves the
        # pixels it has no valid source for untouched
        reproject(
            data,
            out,
            src_transform=src_transform,
            src_crs=handle.crs,
            src_nodata=src_nodata,
            dst_transform=grid.transform,
            dst_crs=grid.crs,
            dst_nodata=None,
            resampling=resampling,
            init_dest_nodata=False,
            num_threads=1,
        )
        return True
    # one extra alpha band records which target pixels the file covers
    dst = np.zeros((count + 1, grid.height, grid.width), dtype=data.dtype)
    reproject(
        data,
        dst,
        src_transform=src_transform,
        src_crs=handle.crs,
        src_nodata=src_nodata,
        dst_transform=grid.transform,
        dst_crs=grid.crs,
        dst_nodata=None,
        dst_alpha=count + 1,
        resampling=resampling,
        init_dest_nodata=False,
        num_threads=1,
    )
    coverage = dst[count] > 0
    if not coverage.any():
        return False
    _place(dst[:count], out, valid, (slice(None), slice(None), slice(None)), nodata, fill,
           coverage=np.broadcast_to(coverage, dst[:count].shape))
    return True
