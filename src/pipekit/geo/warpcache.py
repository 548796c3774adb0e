"""A per-process cache of reprojected blocks, so that a layer in another CRS is warped once, not per patch.

Reading ``landsat & cdl`` on Landsat's grid reprojects the CDL for every
patch.  Random patches of a training run overlap, epoch after epoch, and the
same CDL pixels would be warped again each time.  Like GDAL's ``WarpedVRT``
(which keeps warped blocks in GDAL's block cache), this module keeps the
warped pixels in blocks of :data:`BLOCK` x :data:`BLOCK` target pixels on the
query grid's pixel lattice, and assembles a patch from them:

* a block is identified by the open file(s) and bands it comes from, the
  target CRS and resolution, the lattice's sub-pixel phase and the block's
  position, so it is only reused for exactly the same target pixels;
* missing blocks are warped together, in one call, then split;
* blocks are only used for lattices seen before (the second query on a
  lattice starts filling them): arbitrary, unaligned queries are warped
  directly instead of filling the cache with blocks that never come back;
* the cache holds at most :func:`warp_cache_budget` bytes per process
  (:data:`DEFAULT_BUDGET`, or ``PIPEKIT_GEO_WARP_CACHE_MB``), least recently
  used blocks first out; ``0`` turns it off.  Blocks belong to one opening of
  a file (a handle), so a file closed and opened again is warped afresh.

Only nearest-neighbour reads go through it: a nearest pixel depends on its
own centre only, so a patch assembled from blocks is the patch warped whole
-- provided every pixel is computed by the same arithmetic whichever grid it
is warped with.  :mod:`pipekit.geo._read` ensures that: the query's origin is
put on its lattice (:func:`lattice`, to a millionth of a pixel) and each
pixel's source pixel comes from the affine map fitted over its lattice block
(one map per block and source, never per patch), so a read gives the same
pixels with the cache on or off, whatever was read before.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable

import numpy as np
from affine import Affine

__all__ = [
    "BLOCK",
    "DEFAULT_BUDGET",
    "ENV_VAR",
    "read_blocks",
    "Lattice",
    "lattice",
    "lattice_transform",
    "set_warp_cache_budget",
    "warp_cache_budget",
    "clear_warp_cache",
    "warp_cache_stats",
]

#: Side of a cached block, in target pixels.
BLOCK = 128
#: Default byte budget of the cache in each process.
ENV_VAR = "PIPEKIT_GEO_WARP_CACHE_MB"


def _budget_from_env() -> int:
    text = os.environ.get(ENV_VAR, "64")
    try:
        mib = float(text)
    except ValueError:
        raise ValueError(f"{ENV_VAR} must be a number of MiB (0 turns the warp cache off), got {text!r}") from None
    if not mib >= 0:
        raise ValueError(f"{ENV_VAR} must be >= 0 MiB, got {text!r}")
    return int(mib * 2**20)


DEFAULT_BUDGET = _budget_from_env()

# Sub-pixel phase resolution (steps per pixel): queries whose origins differ by float noise are on one lattice.
_PHASE_STEPS = 1 << 20
_MAX_PHASES = 256

Block = tuple[np.ndarray, "np.ndarray | None"]
#: ``warp(transform, (height, width)) -> (data [bands, h, w], inside [h, w] or None) | None``
WarpFn = Callable[[Affine, tuple[int, int]], "Block | None"]


class _Cache:
    def __init__(self, budget: int) -> None:
        self.pid = os.getpid()
        self.budget = budget
        self.blocks: OrderedDict[Hashable, Block] = OrderedDict()
        self.nbytes = 0
        self.phases: dict[Hashable, int] = {}
        self.hits = 0
        self.misses = 0

    def put(self, key: Hashable, block: Block) -> None:
        size = _size(block)
        if size > self.budget:
            return
        old = self.blocks.pop(key, None)
        if old is not None:
            self.nbytes -= _size(old)
        self.blocks[key] = block
        self.nbytes += size
        self.shrink()

    def shrink(self) -> None:
        while self.nbytes > self.budget and self.blocks:
            self.nbytes -= _size(self.blocks.popitem(last=False)[1])


def _size(block: Block) -> int:
    data, inside = block
    return data.nbytes + (inside.nbytes if inside is not None else 0)


_local = threading.local()
_settings = {"budget": DEFAULT_BUDGET}


def _cache() -> _Cache:
    cache = getattr(_local, "cache", None)
    if cache is None or cache.pid != os.getpid():  # a forked worker starts empty
        cache = _local.cache = _Cache(_settings["budget"])
    return cache


def set_warp_cache_budget(nbytes: int) -> None:
    """Bound the cache of warped blocks of each process (and thread) to ``nbytes``; ``0`` turns it off.

    Set it before DataLoader workers start: each worker has its own cache.
    """
    if nbytes < 0:
        raise ValueError(f"the warp cache budget must be >= 0 bytes, got {nbytes}")
    _settings["budget"] = int(nbytes)
    cache = _cache()
    cache.budget = int(nbytes)
    if nbytes == 0:
        clear_warp_cache()
    else:
        cache.shrink()


def warp_cache_budget() -> int:
    """The byte budget of the warp cache (per process and thread)."""
    return _settings["budget"]


def clear_warp_cache() -> None:
    """Drop every cached block of this process and thread, and reset its counters."""
    cache = _cache()
    cache.blocks.clear()
    cache.nbytes = 0
    cache.phases.clear()
    cache.hits = cache.misses = 0


def warp_cache_stats() -> dict[str, int]:
    """``{"blocks", "bytes", "hits", "misses"}`` of this process's cache (hits and misses count blocks)."""
    cache = _cache()
    return {"blocks": len(cache.blocks), "bytes": cache.nbytes, "hits": cache.hits, "misses": cache.misses}


def _lattice(offset: float) -> tuple[int, int]:
    """``(index, phase)``: a pixel coordinate split into its lattice index and sub-pixel phase step."""
    steps = round(offset * _PHASE_STEPS)
    return steps // _PHASE_STEPS, steps % _PHASE_STEPS


#: ``(xres, yres, phase_x, phase_y)``: a north-up pixel lattice of a CRS (phases in steps of a pixel).
Lattice = tuple[float, float, int, int]


def lattice(transform: Affine) -> tuple[Lattice, int, int] | None:
    """``(lattice, col0, row0)`` of a north-up grid's transform: its lattice and the lattice index of its origin.

    Queries whose origins differ by float noise (less than a millionth of a
    pixel) are on the same lattice; ``None`` for a rotated grid or one with
    a non-positive pixel size.  Every pixel read through the lattice is
    computed from its lattice indices (see :func:`lattice_transform`), so
    it does not depend on which query, block or rectangle it was read with.
    """
    if transform.b != 0.0 or transform.d != 0.0:
        return None
    xres, yres = transform.a, -transform.e
    if not (xres > 0 and yres > 0):
        return None
    col0, phase_x = _lattice(transform.c / xres)
    row0, phase_y = _lattice(-transform.f / yres)
    return (xres, yres, phase_x, phase_y), col0, row0


def lattice_transform(lat: Lattice, col: int, row: int) -> Affine:
    """The transform of the grid whose origin is the lattice's pixel ``(col, row)`` (exactly, every time)."""
    xres, yres, phase_x, phase_y = lat
    fx, fy = phase_x / _PHASE_STEPS, phase_y / _PHASE_STEPS
    return Affine(xres, 0.0, (col + fx) * xres, 0.0, -yres, -(row + fy) * yres)


def read_blocks(
    source: Hashable, transform: Affine, shape: tuple[int, int], warp: WarpFn
) -> Block | None:
    """A warped patch assembled from cached blocks, warping (with ``warp``) the blocks missing.

    Args:
        source: what the pixels are warped from and onto (files, bands,
            target CRS): part of every block's key.
        transform: the patch's affine transform (north-up).
        shape: ``(height, width)`` of the patch.
        warp: warps a north-up grid ``(transform, shape)`` of the same CRS
            and resolution; returns ``(data, inside)`` or ``None`` (then the
            patch is not served from blocks).

    Returns:
        ``(data [bands, H, W], inside [H, W] or None)``, or ``None`` when the
        cache is off, the lattice is new, or ``warp`` declined: warp the
        patch directly.
    """
    cache = _cache()
    if cache.budget == 0:
        return None
    found_lattice = lattice(transform)
    if found_lattice is None:
        return None
    lat, col0, row0 = found_lattice
    lattice_key = (source, *lat)
    seen = cache.phases.get(lattice_key, 0)
    if seen == 0:
        if len(cache.phases) >= _MAX_PHASES:
            cache.phases.clear()
        cache.phases[lattice_key] = 1
        return None
    h, w = shape
    bx0, bx1 = col0 // BLOCK, (col0 + w - 1) // BLOCK
    by0, by1 = row0 // BLOCK, (row0 + h - 1) // BLOCK
    blocks = cache.blocks
    found: dict[tuple[int, int], Block] = {}
    missing: list[tuple[int, int]] = []
    for by in range(by0, by1 + 1):
        for bx in range(bx0, bx1 + 1):
            key = (lattice_key, bx, by)
            block = blocks.get(key)
            if block is None:
                missing.append((bx, by))
            else:
                blocks.move_to_end(key)
                found[(bx, by)] = block
    cache.hits += len(found)
    cache.misses += len(missing)
    if missing:
        mx0 = min(b[0] for b in missing)
        mx1 = max(b[0] for b in missing)
        my0 = min(b[1] for b in missing)
        my1 = max(b[1] for b in missing)
        rect = lattice_transform(lat, mx0 * BLOCK, my0 * BLOCK)
        warped = warp(rect, ((my1 - my0 + 1) * BLOCK, (mx1 - mx0 + 1) * BLOCK))
        if warped is None:
            return None
        data, inside = warped
        for bx, by in missing:
            ys = slice((by - my0) * BLOCK, (by - my0 + 1) * BLOCK)
            xs = slice((bx - mx0) * BLOCK, (bx - mx0 + 1) * BLOCK)
            block_inside = None
            if inside is not None:
                part = inside[ys, xs]
                block_inside = None if part.all() else part.copy()
            block = (data[:, ys, xs].copy(), block_inside)
            found[(bx, by)] = block
            cache.put((lattice_key, bx, by), block)
    return _assemble(found, col0, row0, (h, w), (bx0, bx1, by0, by1))


def _spans(lo: int, size: int, b0: int, b1: int) -> list[tuple[int, slice, slice]]:
    """For blocks ``b0..b1`` along one axis: ``(block, its pixels in the patch, in the block)``."""
    spans = []
    for b in range(b0, b1 + 1):
        a, z = max(lo, b * BLOCK), min(lo + size, (b + 1) * BLOCK)
        spans.append((b, slice(a - lo, z - lo), slice(a - b * BLOCK, z - b * BLOCK)))
    return spans


def _assemble(
    found: dict[tuple[int, int], Block], col0: int, row0: int, shape: tuple[int, int], span: tuple[int, int, int, int]
) -> Block:
    """The patch at lattice pixel ``(col0, row0)`` of ``shape`` from its blocks ``found`` (every one of them).

    Each block's overlap with the patch, the slices computed once per block
    row and column (a 256 px patch spans 3 x 3 blocks of 128).
    """
    h, w = shape
    bx0, bx1, by0, by1 = span
    first = found[(bx0, by0)][0]
    out = np.empty((first.shape[0], h, w), dtype=first.dtype)
    covered: np.ndarray | None = None
    columns = _spans(col0, w, bx0, bx1)
    for by, rows, block_rows in _spans(row0, h, by0, by1):
        for bx, cols, block_cols in columns:
            data, inside = found[(bx, by)]
            out[:, rows, cols] = data[:, block_rows, block_cols]
            if inside is not None:
                if covered is None:
                    covered = np.ones((h, w), dtype=bool)
                covered[rows, cols] = inside[block_rows, block_cols]
    return out, covered
