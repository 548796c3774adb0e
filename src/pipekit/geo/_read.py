"""Reading one query's pixels: native windows, warping of just the window, first-valid mosaics.

The output of a query is a grid (:class:`Grid`, in :mod:`pipekit.geo._grid`): origin at the query's
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
  ``rasterio.warp.reproject`` -- never the whole file, never a merged mosaic
  (or with numpy, where that gives GDAL's result: :mod:`pipekit.geo._fast_warp`).

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
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import rasterio
from rasterio.enums import Resampling
from rasterio.warp import reproject
from rasterio.windows import Window

from pipekit import _fast
from pipekit.errors import (
    SkippedReadError,  # re-exported: its former home
    SourceReadError,
)
from pipekit.geo import _warp as warp
from pipekit.geo._fast_warp import _USE_GDAL, _warp_fast
from pipekit.geo._grid import (  # re-exported: their former home
    Grid,
    apply_affine,
    patch_shape,
    resampling_from,
    transform_bounds_fast,
    window_transform,
)
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

_KERNEL_RADIUS = {
    Resampling.nearest: 1.0,
    Resampling.bilinear: 1.0,
    Resampling.cubic: 2.0,
    Resampling.cubic_spline: 2.0,
    Resampling.lanczos: 3.0,
}


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
    if valid is None and run is None and _read_native_stack(parts, nodatas, grid, out, resampling, fill):
        return True
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


def _read_native_stack(
    parts: list[tuple[RasterHandle, list[int]]],
    nodatas: list[float | None],
    grid: Grid,
    out: np.ndarray,
    resampling: Resampling,
    fill: float,
) -> bool:
    """The parts of one file-only query read each straight into its bands of ``out``, if all can be.

    What :func:`read_stack_into` does, part after part, when every part is read
    natively (:func:`native_offsets`), its window lies inside its file, has the
    output's dtype and a nodata that is the fill value (or none): the same
    window reads, without the per-part calls around them (a warm Landsat
    scene is six band files).  ``False`` (and nothing read) when one part
    cannot be read so: the general path then reads them all.
    """
    if not out.flags.c_contiguous:
        return False
    h, w = grid.height, grid.width
    plan = []
    k = 0
    for (handle, indexes), nodata in zip(parts, nodatas):
        offsets = native_offsets(handle, grid, resampling)
        if offsets is None or handle.np_dtype != out.dtype or not (nodata is None or _same_value(nodata, fill)):
            return False
        col, row = offsets
        if col < 0 or row < 0 or col + w > handle.width or row + h > handle.height:
            return False
        plan.append((handle, indexes, Window(col, row, w, h), k))
        k += len(indexes)
    for handle, indexes, window, k in plan:
        _read_window(handle, indexes, window, out[k:k + len(indexes)])
    return True


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
        fast = _warp_fast(parts, grid, resampling, lambda window: _read_windows(parts, window, run))
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
