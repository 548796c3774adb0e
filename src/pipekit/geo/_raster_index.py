"""How a :class:`~pipekit.geo._raster.RasterDataset` builds its index: the catalog, the file table, the footprints.

:class:`RasterIndexing` is a base of ``RasterDataset``: it makes the catalog the class attributes describe, builds
the file table (files listed, headers read) and checks the sample layout it gives, turns the files' footprints and
times into the :class:`~pipekit.geo._index.GeoIndex` in the dataset CRS, converts to and from TorchGeo's
``GeoDataFrame`` index, and writes a saved index the catalog found out of date.  The arguments, the policies
(dtype, resampling) and the public index settings (``index_cache``, ``save_index``) stay on ``RasterDataset``.
"""

from __future__ import annotations

import logging
import re
import warnings
from typing import Any

import numpy as np
from rasterio.crs import CRS

from pipekit.geo._base import _crs_name, _fill_dtype
from pipekit.geo._index import GeoIndex
from pipekit.geo.catalog import Catalog, FileCatalog, file_time_interval
from pipekit.geo.catalog._listing import any_band_glob
from pipekit.geo.catalog._table import _FileTable

logger = logging.getLogger("pipekit.geo")


class RasterIndexing:
    """The index-building half of :class:`~pipekit.geo._raster.RasterDataset` (see the module docstring)."""

    # -- the catalog ------------------------------------------------------------------------
    def _make_catalog(self) -> Catalog:
        """What the entries are: the files under ``root`` that the class attributes describe."""
        return FileCatalog(
            self.root,
            filename_glob=self.filename_glob,
            regex=self._regex,
            date_format=self.date_format,
            separate_files=self.separate_files,
            bands=self.bands,
            all_bands=self.all_bands,
            band_variant_groups=self.band_variant_groups,
            headers=self._cached_headers,
            name=self.name,
            on_error=self.on_error,
            skip_log=self.skip_log,
        )

    def _glob(self) -> str:
        """``filename_glob`` with its band placeholder ``{}`` matching any band (scenes are grouped later)."""
        return any_band_glob(self.filename_glob)

    def _time_interval(self, path: str, match: re.Match[str]) -> tuple[float, float]:
        """A file's time interval from its name (a subclass that overrides it is asked file by file)."""
        return file_time_interval(path, match, self.date_format, self.name)

    def _build_file_table(self) -> _FileTable:
        """The catalog built (files listed, headers read) and the sample layout it gives checked."""
        overridden = type(self)._time_interval is not RasterIndexing._time_interval
        table = self._catalog.build(self._time_interval if overridden else None)
        self._check_table(table)
        return table

    def _check_table(self, table: _FileTable) -> None:
        """Band indexes, channels, fill value and numpy dtype of samples (``dtype="native"``'s type)."""
        self._indexes, self._channels = self._catalog.layout(self.bands)
        natives = [np.dtype(d) for d in self._catalog.native_dtypes()]
        native = np.result_type(*natives) if natives else np.dtype(np.float32)
        if self.nodata is not None:
            fill = float(self.nodata)
        else:
            first = table.file_nodata(0)
            fill = first if first is not None else 0.0
        self._fill_value = fill
        self._np_dtype = _fill_dtype(native, fill)

    def _build_index(self, crs: CRS) -> GeoIndex:
        """The index in ``crs``: a footprint per file, two for a file split at the antimeridian (``_rows`` maps)."""
        entries = getattr(self._catalog, "footprint_entries", None)
        footprints, rows = entries(crs) if entries is not None else (self._catalog.footprints(crs), None)
        if self.__dict__.get("_cut") and self._rows is not None:  # the rows of a filtered index: one footprint each
            footprints, rows = footprints[: len(self._files)][self._rows], self._rows
        else:
            self._rows = rows
        boxes = np.empty((len(footprints), 6), dtype=np.float64)
        boxes[:, :4] = footprints
        boxes[:, 4:] = self._files.times if rows is None else self._files.times[rows]
        return GeoIndex._from_array(boxes)  # a new array: not copied again

    def _frame(self) -> Any:
        """TorchGeo 0.8's index: geometry, time intervals and the catalog's columns (``filepath``...)."""
        from pipekit.geo._frame import frame_from_index

        return frame_from_index(self.geo_index, self._crs, self._catalog.frame_columns(self._entry_rows()))

    def _set_frame(self, frame: Any) -> None:
        """Keep the rows of ``frame`` (a filtered ``dataset.index``), matched to files by their ``filepath``."""
        from pipekit.geo._frame import index_from_frame

        if "filepath" not in getattr(frame, "columns", ()):
            raise ValueError(f"{self.name}.index needs its 'filepath' column to know which files the rows are")
        rows_of = {self._files.path(i): i for i in range(len(self._files))}
        unknown = [p for p in frame["filepath"] if p not in rows_of]
        if unknown:
            raise ValueError(f"{self.name}.index: {len(unknown)} filepath(s) are not files of this dataset, "
                             f"e.g. {unknown[0]!r}")
        index = index_from_frame(frame, self._crs)
        self._rows = np.array([rows_of[p] for p in frame["filepath"]], dtype=np.int64)
        self.geo_index = index
        self._cut = True  # the footprints may be parts of the files' (splits): kept through a change of CRS

    def _log_choice(self, crs: Any, res: Any) -> None:
        other = [k for k, c in enumerate(self._files.crs_list) if c != self._crs]
        n_other = int(np.isin(self._files.crs_ids, other).sum()) if other else 0
        logger.info(
            "%s: indexed %d file(s); CRS %s (%s), res %s (%s)%s",
            self.name,
            len(self._files),
            _crs_name(self._crs),
            "given" if crs is not None else f"from the first file {self._files.path(0)!r}",
            self._res,
            "given" if res is not None else "from the first file",
            f"; {n_other} file(s) in other CRSs are reprojected on read" if n_other else "",
        )

    def _save_pending(self) -> None:
        """Write the index the catalog found out of date, once the dataset CRS is known."""
        url, self._cached_headers.pending_save = self._cached_headers.pending_save, None
        if url is None:
            return
        try:
            self.save_index(url)
        except Exception as exc:
            warnings.warn(f"{self.name}: cannot save the index to {url!r}: {type(exc).__name__}: {exc}",
                          UserWarning, stacklevel=3)
