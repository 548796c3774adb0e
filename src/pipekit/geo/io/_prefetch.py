"""Tile prefetch for files read through the range cache: a window's tiles fetched at once, before GDAL reads them.

A :class:`~pipekit.geo.io.handles.RasterHandle` of a GeoTIFF read through the range cache
(``cache_dir=``) holds a :class:`_TilePrefetcher` (switched by
the fast path ``prefetch_tiles``, :mod:`pipekit._fast`); a window read calls it first.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import rasterio

from pipekit.geo.io._fsspec import _FsspecOpener

if TYPE_CHECKING:
    from pipekit.geo.io.handles import RasterHandle

logger = logging.getLogger("pipekit.geo")


class _TilePrefetcher:
    """Fetch the tiles a window read will decode into the range cache first, all at once.

    GDAL reads a window's tiles one after another through a Python file
    object (one round trip each); their byte ranges are in the TIFF's tile
    index (GDAL's ``BLOCK_OFFSET_x_y`` / ``BLOCK_SIZE_x_y`` items), so the
    missing ones are fetched together before GDAL asks.  Only a speed-up: a
    read the prediction misses (an overview, a mask) is fetched on demand.
    """

    def __init__(self, handle: RasterHandle, opener: _FsspecOpener, path: str) -> None:
        self.ds = handle.ds
        self.url = handle.url
        self.opener, self.path = opener, path
        self.blocks = {i: shape for i, shape in zip(self.ds.indexes, self.ds.block_shapes, strict=True)}
        self.interleaved = self.ds.interleaving is not None and self.ds.interleaving.name == "PIXEL"
        self.tiles: dict[tuple[int, int, int], tuple[int, int] | None] = {}
        self.off = False
        self.mirror: Any = None

    def _tile(self, band: int, x: int, y: int) -> tuple[int, int] | None:
        key = (band, x, y)
        if key not in self.tiles:
            offset = self.ds.get_tag_item(f"BLOCK_OFFSET_{x}_{y}", "TIFF", bidx=band)
            size = self.ds.get_tag_item(f"BLOCK_SIZE_{x}_{y}", "TIFF", bidx=band)
            self.tiles[key] = (int(offset), int(offset) + int(size)) if offset and size and int(size) else None
        return self.tiles[key]

    def __call__(self, indexes: Sequence[int], window: Any) -> None:
        col0, row0 = max(int(window.col_off), 0), max(int(window.row_off), 0)
        col1 = min(math.ceil(window.col_off + window.width), self.ds.width)
        row1 = min(math.ceil(window.row_off + window.height), self.ds.height)
        if col1 <= col0 or row1 <= row0:
            return
        if self.off:
            return
        ranges = []
        try:
            for band in indexes[:1] if self.interleaved else indexes:
                bh, bw = self.blocks[band]
                for y in range(row0 // bh, (row1 - 1) // bh + 1):
                    for x in range(col0 // bw, (col1 - 1) // bw + 1):
                        tile = self._tile(band, x, y)
                        if tile is not None:
                            ranges.append(tile)
        except (rasterio.errors.RasterioError, ValueError, KeyError) as exc:
            # a TIFF whose tile index GDAL does not expose: its tiles are fetched as GDAL reads them (a
            # failed fetch is not lost here: it was recorded and is raised when the read's block ends)
            logger.debug("%s: no tile prefetch (%s)", self.url, exc)
            self.off = True
            return
        if ranges:
            if self.mirror is None:  # the file is open, so its mirror exists: found once, not per read
                cache = self.opener.cache
                assert cache is not None
                self.mirror = cache.mirror(
                    self.opener.fs, self.path, self.opener.fs.unstrip_protocol(self.path), self.opener.fetch
                )
            self.mirror.ensure(self.opener.fs, self.path, ranges, self.opener.fetch)
