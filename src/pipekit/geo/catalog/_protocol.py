"""What a :class:`~pipekit.geo._raster.RasterDataset` asks of its catalog: the :class:`Catalog` protocol.

:class:`~pipekit.geo.catalog.FileCatalog` and
:class:`~pipekit.geo.catalog.STACCatalog` implement it.  The dataset builds
its catalog once (:meth:`Catalog.build`), indexes ``table``'s footprints and
times, and asks, for each index entry it reads, which parts to read; the
catalog never calls back into the dataset.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
from rasterio.crs import CRS

from pipekit.geo._reader import EntryLabel
from pipekit.geo.catalog._table import _FileTable

__all__ = ["Catalog"]


class Catalog(Protocol):
    """The entries of a raster dataset: what they are and which files (and bands) are read for each."""

    #: the file table, once built: one row per entry (paths or ids, headers, time intervals)
    table: _FileTable
    #: the parts of a remote entry may be read each on its own I/O lane at once
    concurrent: bool

    def build(self, time_interval: Callable[[str, Any], tuple[float, float]] | None = None) -> _FileTable:
        """Find the entries and build ``table`` (``time_interval``: a dataset's own dating of a file, if any)."""
        ...

    def layout(self, bands: Sequence[Any]) -> tuple[list[int], int]:
        """``(band indexes read from each file, channels of a sample)`` for ``bands``."""
        ...

    def native_dtypes(self) -> list[str]:
        """The data types of the files read (what ``dtype="native"`` samples hold)."""
        ...

    def parts(
        self, row: int, bands: Sequence[Any], indexes: list[int]
    ) -> tuple[list[tuple[str, list[int]]], EntryLabel | None]:
        """The ``(url, band indexes)`` read for table row ``row``, and what the errors of its reads name."""
        ...

    def footprints(self, crs: CRS) -> np.ndarray:
        """``[n, 4]`` ``(minx, maxx, miny, maxy)`` of the rows in ``crs``."""
        ...

    def frame_columns(self, rows: np.ndarray) -> dict[str, list[str]]:
        """The columns ``dataset.index`` shows for table ``rows`` (``filepath``...)."""
        ...
