"""What the files of a raster dataset are: :class:`FileCatalog`, from a root, a glob, a regex and a date format.

The catalog lists the files (:func:`~pipekit.geo.catalog._listing.find_paths`),
groups the band files of ``separate_files`` products into scenes
(:mod:`pipekit.geo.catalog._band_files`), reads their headers or reuses a
saved index (:class:`~pipekit.geo.catalog._cached_headers.CachedHeaders`),
dates them from their names and builds the file table
(:class:`~pipekit.geo.catalog._table._FileTable`) a
:class:`~pipekit.geo._raster.RasterDataset` indexes.  Then it says what an
index entry's parts are (the files and band indexes read) and how many
channels a sample has.
"""

from __future__ import annotations

import operator
import re
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from rasterio.crs import CRS

from pipekit._fs import is_local
from pipekit.errors import DatasetNotFoundError, ParseError, ReadError, SkipLog, StageError
from pipekit.geo._bbox import MAX_TIME, MIN_TIME
from pipekit.geo.catalog._band_files import SceneRules, band_columns
from pipekit.geo.catalog._cached_headers import CachedHeaders
from pipekit.geo.catalog._dates import date_interval, date_intervals
from pipekit.geo.catalog._headers import RasterHeader, read_header
from pipekit.geo.catalog._listing import any_band_glob, find_paths, gc_paused
from pipekit.geo.catalog._table import _FileTable

__all__ = ["FileCatalog", "check_bands", "file_time_interval"]

#: ``(path, regex match) -> (start, stop)`` POSIX seconds: a dataset's own dating of a file
TimeInterval = Callable[[str, "re.Match[str]"], tuple[float, float]]


_NOT_A_RASTER = ("not recognized as being in a supported file format", "TIFFReadDirectory", "TIFFFetchDirectory")


def _not_a_raster(error: StageError) -> bool:
    """Whether ``error`` says a local file's content is not a raster GDAL reads (what TorchGeo leaves out)."""
    if not isinstance(error, ReadError) or not is_local(error.url):
        return False
    return any(text in error.reason for text in _NOT_A_RASTER)


def file_time_interval(path: str, match: re.Match[str], date_format: str, stage: str) -> tuple[float, float]:
    """The time interval of one file from its name's ``date`` (or ``start``/``stop``) groups.

    Raises:
        ParseError: a date does not follow ``date_format`` (names the file).

    Example:
        >>> import re
        >>> match = re.match(r"(?P<date>\\d{8})", "20210701")
        >>> start, stop = file_time_interval("20210701.tif", match, "%Y%m%d", "demo")
        >>> round(stop - start)
        86400
    """
    groups = match.groupdict()
    try:
        if groups.get("date"):
            return date_interval(groups["date"], date_format)
        mint, maxt = MIN_TIME, MAX_TIME
        if groups.get("start"):
            mint = date_interval(groups["start"], date_format)[0]
        if groups.get("stop"):
            maxt = date_interval(groups["stop"], date_format)[1]
        return mint, maxt
    except ValueError as exc:
        raise ParseError("parse the date of", path, stage, f"{exc} (date_format {date_format!r})") from exc


def check_bands(
    bands: Sequence[Any] | None,
    default_bands: Sequence[Any] | None,
    all_bands: Sequence[str],
    separate_files: bool,
    name: str,
) -> list[Any]:
    """The bands a file dataset reads: ``bands`` (else ``default_bands``, else ``all_bands``), checked.

    Names of ``all_bands`` where the product names its bands (for
    ``separate_files`` products any band name, looked for in the files),
    else 1-based band indexes.

    Raises:
        TypeError: ``bands`` is not a sequence.
        ValueError: ``bands`` is empty, repeats a band, or names one the product does not have.

    Example:
        >>> check_bands(None, None, ("red", "green"), False, "Demo")
        ['red', 'green']
        >>> check_bands([3, 1], None, (), False, "Demo")
        [3, 1]
    """
    if bands is not None and (isinstance(bands, str) or not isinstance(bands, Sequence)):
        raise TypeError(f"bands must be a sequence of band names, got {bands!r}")
    if bands is not None and len(bands) == 0:
        raise ValueError("bands must not be empty")
    if bands is None:
        chosen = list(default_bands) if default_bands is not None else list(all_bands)
    else:
        chosen = list(bands)
    if all_bands and separate_files:
        bad = [b for b in chosen if not isinstance(b, str) or not b]
        if bad:
            raise ValueError(f"{name} bands are band names (strings), got {bad}")
    elif all_bands:
        unknown = [b for b in chosen if b not in all_bands]
        if unknown:
            raise ValueError(
                f"{name} has no band(s) {unknown}; its bands are {list(all_bands)}"
            )
    elif chosen:
        bad = [b for b in chosen if isinstance(b, bool) or not isinstance(b, int) or b < 1]
        if bad:
            raise ValueError(
                f"{name} names no bands (all_bands is empty): select bands by 1-based index, got {bad}"
            )
    if separate_files and not chosen:
        raise ValueError(f"{name} has separate_files=True but no bands (set all_bands or pass bands=)")
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"bands must not repeat, got {chosen}")
    return chosen


class FileCatalog:
    """The files of a :class:`~pipekit.geo._raster.RasterDataset`: listed, grouped, dated and their headers read.

    Args:
        root: a directory, a file, a glob, an fsspec URL or a list of them.
        filename_glob: files to consider (``"{}"`` for the band of ``separate_files`` products).
        regex: the compiled ``filename_regex``.
        date_format: how the regex's ``date``/``start``/``stop`` texts are parsed.
        separate_files: one file per band, grouped into scenes.
        bands: the bands read.
        all_bands: the product's band names.
        band_variant_groups: regex groups that may differ between the files of one scene besides ``band``.
        headers: reads the headers, reusing a saved index.
        name: the dataset's name (errors, logs).
        on_error: ``"raise"`` or ``"skip"`` for files that cannot be indexed.
        skip_log: where skipped files are counted.

    :meth:`build` lists the files; ``table`` is then the file table.
    """

    #: the band files of a remote entry may be read each on its own I/O lane at once
    concurrent = True

    def __init__(
        self,
        root: Any,
        *,
        filename_glob: str,
        regex: re.Pattern[str],
        date_format: str,
        separate_files: bool,
        bands: Sequence[Any],
        all_bands: Sequence[str],
        band_variant_groups: Sequence[str],
        headers: CachedHeaders,
        name: str,
        on_error: str,
        skip_log: SkipLog,
    ) -> None:
        self.root = root
        self.filename_glob = filename_glob
        self.regex = regex
        self.date_format = date_format
        self.separate_files = separate_files
        self.bands = list(bands)
        self.all_bands = all_bands
        self.band_variant_groups = band_variant_groups
        self.headers = headers
        self.name = name
        self.on_error = on_error
        self.skip_log = skip_log
        self.band_dtypes: list[str] = []  # the data types of the first scene's other band files
        self.table: _FileTable
        self.left_out: list[StageError] = []  # files that are not rasters, left out under on_error="raise"

    def skip_or_raise(self, error: StageError) -> None:
        """Raise ``error`` (``on_error="raise"``) or count it in the skip log.

        A local file that is not a raster GDAL can read (its content: not a
        recognised format, a broken TIFF directory) is left out under
        ``on_error="raise"`` too, as TorchGeo does, but not silently: counted
        in the skip log, and :meth:`build` warns naming them.  Anything else
        (a file gone, an I/O error, a remote read, no georeference) is raised.
        """
        if self.on_error == "raise":
            if not _not_a_raster(error):
                raise error
            self.left_out.append(error)
        self.skip_log.record(error)

    def _warn_left_out(self, found_count: int) -> None:
        if not self.left_out:
            return
        shown = "; ".join(f"{e.url!r} ({e.reason})" for e in self.left_out[:5])
        more = f"; and {len(self.left_out) - 5} more" if len(self.left_out) > 5 else ""
        warnings.warn(
            f"{self.name}: left out {len(self.left_out)} file(s) of {found_count} that are not rasters GDAL can "
            f"read: {shown}{more} (counted in skip_log; on_error='skip' leaves them out without this warning)",
            UserWarning,
            stacklevel=6,
        )

    # -- listing ------------------------------------------------------------------------------
    def glob(self) -> str:
        """``filename_glob`` with its band placeholder ``{}`` matching any band (scenes are grouped later)."""
        return any_band_glob(self.filename_glob)

    def band_in_glob(self) -> bool:
        """Whether ``filename_glob`` names one band, TorchGeo's way (``"T*_B02_10m.tif"``), not with ``{}``."""
        return self.separate_files and "{}" not in self.filename_glob

    def build(self, time_interval: TimeInterval | None = None) -> _FileTable:
        """List the files, read (or reload) their headers and build the file table (also kept as ``table``).

        ``time_interval``: a dataset's own dating of one file, asked file by
        file (``None``: the names' dates, parsed once per distinct text).

        Raises:
            DatasetNotFoundError: no file found, or none could be indexed.
        """
        # the collector paused until the per-file objects of indexing (a Match per file name...) are gone: paused
        # only around the listing, it traversed the 100,000 matches still alive when it was enabled again (~40 ms)
        self.left_out = []
        with gc_paused():
            self.table = self._index_files(time_interval)
        return self.table

    def _index_files(self, time_interval: TimeInterval | None) -> _FileTable:
        in_glob = self.band_in_glob()
        origins: dict[str, str] | None = {} if in_glob else None  # only TorchGeo's band-in-glob scenes need them
        paths, matches = find_paths(self.root, self.glob(), self.regex, self.headers.opener.storage_options,
                                    with_siblings=self.separate_files, name=self.name,
                                    all_siblings=in_glob, origins=origins)
        found_count = len(paths)
        bands_of: list[dict[str, str]] = []
        if self.separate_files:
            matched = list(zip(paths, matches))
            rules = SceneRules(self.bands, self.all_bands, self.band_variant_groups, self.name, self.skip_or_raise)
            rules.check_bands_found(matched, self.root)
            scenes = rules.of_glob_matches(matched, origins or {}) if in_glob else rules.group(matched)
            paths = [path for path, _, _ in scenes]
            matches = [match for _, match, _ in scenes]
            bands_of = [bands for _, _, bands in scenes]

        columns, rows = self.headers.read(paths, self.skip_or_raise)
        self._warn_left_out(found_count)
        if not rows:
            first = self.skip_log.skipped[0] if self.skip_log.skipped else None
            raise DatasetNotFoundError(
                f"{self.name}: none of the {found_count} file(s) found in {self.root!r} could be indexed "
                f"({self.skip_log.count} skipped, see skip_log"
                + (f"; the first: {first.url!r}: {first.reason})" if first is not None else ")")
            )
        if len(rows) < len(paths):  # files that could not be indexed were skipped
            paths = [paths[i] for i in rows]
            matches = [matches[i] for i in rows]
            bands_of = [bands_of[i] for i in rows] if bands_of else bands_of
        times = self.file_times(paths, matches, time_interval)
        band_spans, band_overrides = band_columns(paths, matches, bands_of) if self.separate_files else (None, {})
        table = _FileTable.from_columns(paths, columns, times, band_spans, band_overrides)
        self.band_dtypes = self._band_dtypes(bands_of[0], paths[0]) if self.separate_files else []
        return table

    # -- dates --------------------------------------------------------------------------------
    def file_times(
        self, paths: list[str], matches: list[re.Match[str]], time_interval: TimeInterval | None = None
    ) -> np.ndarray:
        """``[n, 2]`` time intervals of the files from their names, vectorised.

        Without ``date``/``start``/``stop`` groups every file spans all time
        (no per-file step).  With them, each distinct date text is parsed once
        and the files take their interval by code; the first file (in order)
        whose date cannot be parsed is reported, with the error the per-file
        :func:`file_time_interval` raises.  A ``time_interval`` given (a
        dataset's own) is asked file by file.
        """
        n = len(paths)
        times = np.empty((n, 2), dtype=np.float64)
        groups = self.regex.groupindex
        if not any(g in groups for g in ("date", "start", "stop")):
            times[:, 0], times[:, 1] = MIN_TIME, MAX_TIME
            return times
        if time_interval is not None:
            for k, (path, match) in enumerate(zip(paths, matches)):
                times[k] = time_interval(path, match)
            return times
        fields = {g: date_intervals(list(map(operator.methodcaller("group", g), matches)), self.date_format)
                  for g in ("date", "start", "stop") if g in groups}
        dated = fields["date"].given if "date" in fields else np.zeros(n, dtype=bool)
        times[:, 0], times[:, 1] = MIN_TIME, MAX_TIME
        failed = np.zeros(n, dtype=bool)
        if "date" in fields:  # a file with a date takes its interval; start and stop are not looked at
            times[dated] = fields["date"].intervals[dated]
            failed |= fields["date"].failed
        for g, side in (("start", 0), ("stop", 1)):
            if g in fields:
                use = fields[g].given & ~dated
                times[use, side] = fields[g].intervals[use, side]
                failed |= fields[g].failed & ~dated
        if failed.any():
            k = int(np.argmax(failed))
            for g in ("date", "start", "stop"):  # the first of the file's texts that fails, as parsed in turn
                field = fields.get(g)
                if field is not None and field.failed[k] and (g == "date" or not dated[k]):
                    error = field.error(k)
                    if isinstance(error, ValueError):
                        raise ParseError("parse the date of", paths[k], self.name,
                                         f"{error} (date_format {self.date_format!r})") from error
                    raise error
        return times

    # -- band files -----------------------------------------------------------------------------
    def _inspect(self, path: str) -> RasterHeader | None:
        try:
            header = read_header(self.headers.opener, path, self.name)
        except ReadError as exc:
            self.skip_or_raise(exc)
            return None
        error = header.index_error(self.name)
        if error is not None:
            self.skip_or_raise(error)
            return None
        return header

    def _band_dtypes(self, bands: dict[str, str], index_path: str) -> list[str]:
        """The data types of a scene's other band files (a product's bands differ: uint8 QA, int16 ST, uint16 SR)."""
        out = []
        for path in bands.values():
            if path == index_path:
                continue
            header = self._inspect(path)
            if header is not None:
                out.append(header.dtype)
        return out

    # -- what the dataset reads ---------------------------------------------------------------------
    def native_dtypes(self) -> list[str]:
        """The data types of the files read (the table's, and the first scene's other band files')."""
        return [*self.table.dtypes, *self.band_dtypes]

    def layout(self, bands: Sequence[Any]) -> tuple[list[int], int]:
        """``(band indexes read from each file, channels of a sample)`` for ``bands``.

        Raises:
            ReadError: a file has fewer bands than read (names it).
        """
        table = self.table
        if not self.separate_files:
            if self.all_bands:
                needed = max(list(self.all_bands).index(b) + 1 for b in bands)
                what = f"band {list(self.all_bands)[needed - 1]!r} (band {needed})"
            elif bands:
                needed = max(bands)
                what = f"band {needed}"
            else:
                needed = int(table.counts.max())
                what = f"{needed} bands (like {table.path(int(np.argmax(table.counts)))!r})"
            short = np.flatnonzero(table.counts < needed)
            if len(short):
                i = int(short[0])
                raise ReadError("index raster", table.path(i), self.name,
                                f"it has {int(table.counts[i])} band(s), the dataset reads {what}")
        if self.separate_files:
            indexes = [1]
        elif self.all_bands:
            indexes = [list(self.all_bands).index(b) + 1 for b in bands]
        elif bands:
            indexes = list(bands)
        else:
            indexes = list(range(1, int(table.counts.max()) + 1))
        return indexes, (len(bands) if self.separate_files else len(indexes))

    def parts(self, row: int, bands: Sequence[Any], indexes: list[int]) -> tuple[list[tuple[str, list[int]]], None]:
        """The files of file-table row ``row`` and the band indexes read from each (no label: errors name the file)."""
        if self.separate_files:
            return [(self.table.band_path(row, band), [1]) for band in bands], None
        return [(self.table.path(row), indexes)], None

    def footprints(self, crs: CRS) -> np.ndarray:
        """``[n, 4]`` ``(minx, maxx, miny, maxy)`` of the files in ``crs``."""
        return self.table.footprints(crs)

    def footprint_entries(self, crs: CRS) -> tuple[np.ndarray, np.ndarray | None]:
        """The files' footprints in ``crs``, two for a file split at the antimeridian, and each one's row."""
        return self.table.footprint_entries(crs)

    def frame_columns(self, rows: np.ndarray) -> dict[str, list[str]]:
        """``dataset.index``'s columns for file-table ``rows``: ``filepath`` (a scene's first band file)."""
        return {"filepath": [self.table.path(int(i)) for i in rows]}
