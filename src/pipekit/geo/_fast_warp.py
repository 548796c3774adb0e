"""The fast path ``"warp"`` of a warped read (:mod:`pipekit._fast`): numpy warps of the source windows.

:func:`_warp_fast` warps the parts of one read with :mod:`pipekit.geo._warp`, where that gives GDAL's result,
and says ``_USE_GDAL`` where it does not (then :func:`pipekit.geo._read._read_warped` calls GDAL's warper).
Nearest-neighbour reads of north-up grids are computed on the query's pixel lattice
(:func:`pipekit.geo.warpcache.lattice`), one fitted map per lattice block, so a pixel is the same whichever
read it is part of.  It reads no file itself: the caller passes ``read_window``, which reads a window of the
parts.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable

import numpy as np
from affine import Affine
from rasterio.enums import Resampling
from rasterio.windows import Window

from pipekit.geo import _warp as warp
from pipekit.geo import warpcache
from pipekit.geo._grid import Grid
from pipekit.geo.io import RasterHandle

#: Reads one window of a read's parts, their bands stacked (``pipekit.geo._read._read_windows`` of the parts).
WindowReader = Callable[[Window], np.ndarray]


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
    handle: RasterHandle, read: WindowReader, cols: np.ndarray, rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray | None] | None:
    """The source pixels at integer ``(cols, rows)``: ``(data [bands, H, W], inside [H, W] or None)``.

    ``handle`` is the first part's (the parts share its grid); ``read`` reads their window.
    ``None`` when no pixel is inside the file(s).
    """
    height, width = handle.height, handle.width
    c0, c1 = max(int(cols.min()), 0), min(int(cols.max()) + 1, width)
    r0, r1 = max(int(rows.min()), 0), min(int(rows.max()) + 1, height)
    if c0 >= c1 or r0 >= r1:
        return None
    data = read(Window(c0, r0, c1 - c0, r1 - r0))
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
    read_window: WindowReader,
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
    target pixel; or ``_USE_GDAL``.  ``read_window`` reads a window of the parts (their bands stacked).
    """
    handle = parts[0][0]
    t = handle.transform
    if t.b != 0.0 or t.d != 0.0:
        return _USE_GDAL

    def read(c0: int, r0: int, c1: int, r1: int) -> np.ndarray:
        return read_window(Window(c0, r0, c1 - c0, r1 - r0))

    def warp_grid(transform: Affine, shape: tuple[int, int]) -> object:
        if resampling == Resampling.nearest:
            found = warpcache.lattice(transform)
            if found is not None:
                indices = _lattice_indices(handle, grid, *found, shape)
                if indices is None:
                    return _USE_GDAL
                return _take_nearest(handle, read_window, *indices)
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
