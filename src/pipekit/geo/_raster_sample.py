"""How a :class:`~pipekit.geo._raster.RasterDataset` assembles a sample: index hits, mosaics, time series.

:class:`RasterSampling` is a base of ``RasterDataset``: it finds the index entries under a query, reads each
through the dataset's reader onto the query grid (first-valid mosaic, or one file straight into its buffer), stacks
the time steps of a ``time_series`` dataset, and says which sample keys and dtypes the reads give.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from pipekit.geo._base import Arrays, Sample, _to_tensor
from pipekit.geo._batch import read_batch
from pipekit.geo._bbox import BoundingBox
from pipekit.geo._read import Grid, resampling_from
from pipekit.geo._reader import ReadSettings
from pipekit.geo.catalog import FileCatalog

#: Most entries whose parts a dataset remembers (:meth:`RasterSampling._entry_parts`).
_PARTS_CACHE_MAX = 4096


class RasterSampling:
    """The sample-assembly half of :class:`~pipekit.geo._raster.RasterDataset` (see the module docstring)."""

    # -- reading ----------------------------------------------------------------------------
    def __getitems__(self, keys: Sequence[Any]) -> list[Sample]:
        """``[self[key] for key in keys]`` (a DataLoader's batch), read into one tensor per key (``_batch``)."""
        return read_batch(self, keys)

    def _layers(self) -> dict[str, int]:
        return {"image" if self.is_image else "mask": self._channels}

    def _dtypes(self) -> dict[str, torch.dtype | None]:
        dtype = None if self.native_dtype else self.dtype
        if dtype is None and not self.native_dtype:  # a subclass's ``dtype = None``: TorchGeo's default
            dtype = torch.float32 if self.is_image else torch.long
        return {"image" if self.is_image else "mask": dtype}

    def _read(self, bbox: BoundingBox, grid: Grid, track_valid: bool) -> Arrays | None:
        if self.time_series:
            raise ValueError(
                f"{self.name} has time_series=True: its samples are stacks in time, which cannot be mosaicked "
                "into a union (a | b); build the union of datasets without time_series"
            )
        hits = self.geo_index.query(bbox)
        if len(hits) == 0:
            return None
        if self._rows is not None:
            hits = self._rows[hits]
            if len(hits) > 1:  # both parts of a file split at the antimeridian: read it once
                hits = hits[np.sort(np.unique(hits, return_index=True)[1])]
        return self._mosaic(hits, grid, track_valid)

    def _getitem(self, bbox: BoundingBox, grid: Grid, bounds: Any) -> Sample:
        if not self.time_series:
            return super()._getitem(bbox, grid, bounds)
        hits = self.geo_index.query(bbox)
        if len(hits) == 0:
            raise self._missing(bbox)
        starts, groups = time_steps(self.geo_index.bounds[hits, 4:], hits)
        key = "image" if self.is_image else "mask"
        arrays = []
        for group in groups:
            rows = self._rows[group] if self._rows is not None else group
            if self._rows is not None and len(rows) > 1:  # both parts of a file split at the antimeridian: once
                rows = rows[np.sort(np.unique(rows, return_index=True)[1])]
            arrays.append(self._mosaic(rows, grid, False)[key][0])
        stack = np.stack(arrays)
        tensor = _to_tensor(stack, self._dtypes()[key])
        if key == "mask" and tensor.shape[1] == 1:
            tensor = tensor[:, 0]
        return {key: tensor, "dates": torch.from_numpy(starts), "crs": self.crs, "bounds": bounds,
                "transform": grid.transform}

    def _mosaic(self, hits: np.ndarray, grid: Grid, track_valid: bool) -> Arrays:
        """The files (file-table rows) ``hits`` mosaicked first-valid onto ``grid``."""
        key = "image" if self.is_image else "mask"
        shape = (self._channels, grid.height, grid.width)
        if track_valid or len(hits) > 1:
            out = np.full(shape, self._fill_value, dtype=self._np_dtype)
            valid = np.zeros(shape, dtype=bool)
            settings = self._read_settings()
            for n, i in enumerate(hits.tolist()):
                self._read_entry(i, grid, out, valid, True, settings)
                if n + 1 < len(hits) and valid.all():
                    break
            return {key: (self._postprocess(out), valid)}
        # one file: read straight into an uninitialised buffer (filled only where the file is absent)
        out = np.empty(shape, dtype=self._np_dtype)
        self._read_entry(int(hits[0]), grid, out, None, False)
        return {key: (self._postprocess(out), None)}

    def _read_settings(self) -> ReadSettings:
        """What the reader takes from this dataset's settings as they are now."""
        return ReadSettings(resampling_from(self.resampling), self.nodata, self._fill_value, self.cache, self.on_error)

    def _read_entry(self, i: int, grid: Grid, out: np.ndarray, valid: np.ndarray | None, prefilled: bool,
                    settings: ReadSettings | None = None) -> None:
        """Read file-table row ``i`` (a file, a scene of band files, an item's assets) into ``out``."""
        parts, label = self._entry_parts(i)
        self._reader.read(parts, grid, out, valid, prefilled, settings or self._read_settings(), label)

    def _entry_parts(self, i: int) -> tuple[list[tuple[str, list[int]]], Any]:
        """``catalog.parts`` of row ``i`` for the bands as they are now, remembered for a catalog of files.

        A scene's band paths are built once instead of at every read (~8 us
        for six bands).  A STAC catalog is asked every time: its hrefs may be
        signed for a while only.
        """
        catalog = self._catalog
        if type(catalog) is not FileCatalog:
            return catalog.parts(i, self.bands, self._indexes)
        key = (catalog, i, tuple(self.bands), tuple(self._indexes))
        cache = self.__dict__.get("_parts_cache")
        if cache is None or len(cache) >= _PARTS_CACHE_MAX:
            cache = self.__dict__["_parts_cache"] = {}
        found = cache.get(key)
        if found is None:
            found = cache[key] = catalog.parts(i, self.bands, self._indexes)
        return found

    def _postprocess(self, array: np.ndarray) -> np.ndarray:
        """Hook for products (e.g. CDL's ordinal class mapping); identity by default."""
        return array


def time_steps(times: np.ndarray, hits: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """The time steps of index entries ``hits`` with ``[n, 2]`` intervals ``times``: oldest first.

    Entries with the same interval form one step (in index order within it).
    Returns ``(starts, groups)``: each step's start (POSIX seconds) and its entries.

    Example:
        >>> starts, groups = time_steps(np.array([[20.0, 29.0], [0.0, 9.0], [20.0, 29.0]]), np.array([4, 7, 9]))
        >>> starts.tolist(), [g.tolist() for g in groups]
        ([0.0, 20.0], [[7], [4, 9]])
    """
    order = np.lexsort((np.arange(len(hits)), times[:, 1], times[:, 0]))
    t = times[order]
    new = np.ones(len(order), dtype=bool)
    new[1:] = (t[1:, 0] != t[:-1, 0]) | (t[1:, 1] != t[:-1, 1])
    firsts = np.flatnonzero(new)
    groups = np.split(hits[order], firsts[1:])
    return t[firsts, 0].astype(np.float64), groups
