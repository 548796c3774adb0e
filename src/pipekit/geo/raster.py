"""Raster datasets: :class:`RasterDataset`, a geo dataset of raster files (GeoTIFF, COG, JPEG 2000...).

Files are listed and their metadata read once, when the dataset is built
(see :mod:`pipekit.geo.discovery`); their footprints (in the dataset CRS)
and time intervals (from their names) go into a
:class:`~pipekit.geo.index.GeoIndex` (``dataset.geo_index``), which
``dataset.index``, TorchGeo 0.8's ``GeoDataFrame``, shows.  The dataset holds
no open file: it pickles to DataLoader workers as a few arrays and strings,
and each worker opens files lazily through :mod:`pipekit.geo.io`'s
per-process cache.
"""

from __future__ import annotations

import copy
import logging
import math
import operator
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from rasterio.crs import CRS
from rasterio.enums import Resampling

from pipekit.errors import ParseError, ReadError, SkipLog, StageError, check_on_error
from pipekit.geo import io as geo_io
from pipekit.geo.base import (
    Arrays,
    GeoDataset,
    Sample,
    _crs_name,
    _default_res,
    _fill_dtype,
    _reproject_index,
    _to_crs,
    _to_res,
    _to_tensor,
)
from pipekit.geo.bbox import MAX_TIME, MIN_TIME, BoundingBox
from pipekit.geo.discovery import (
    DatasetNotFoundError,
    RasterHeader,
    _FileTable,
    _split_name,
    any_band_glob,
    date_interval,
    date_intervals,
    find_paths,
    gc_paused,
    group_scenes,
    read_header,
)
from pipekit.geo.index import GeoIndex
from pipekit.geo.index_cache import IndexCacheMixin
from pipekit.geo.read import Grid, resampling_from
from pipekit.geo.reader import RasterReader, ReadSettings

__all__ = ["RasterDataset"]

logger = logging.getLogger("pipekit.geo")


class RasterDataset(IndexCacheMixin, GeoDataset):
    """A geo dataset of raster files (GeoTIFF, COG, JPEG 2000...), local or remote.

    Subclasses describe a product with class attributes, as in TorchGeo 0.8:

    * ``filename_glob``: files to consider in directories.  For
      ``separate_files`` products, either TorchGeo's form, which names one
      band (``"T*_B02_10m.tif"``: one file per scene; each other band is
      the file whose name has that band instead, in the same folder), or
      pipekit's ``"{}"`` placeholder for the band (``"LC08_*_{}.*"``: every
      band file is found and grouped into scenes, across sibling folders);
    * ``filename_regex``: a verbose (``re.VERBOSE``) regex matched against
      file names, with optional named groups ``date`` (or ``start`` and
      ``stop``), parsed with ``date_format``, and ``band``;
    * ``is_image``: samples hold ``"image"`` if true, else ``"mask"`` (read
      when the sample is, so setting it after construction works, as in
      TorchGeo);
    * ``all_bands``, ``default_bands``, ``rgb_bands``: band names (for
      ``separate_files`` products, any band whose files the scenes hold can
      be chosen, listed in ``all_bands`` or not, e.g. Landsat's
      ``SR_QA_AEROSOL``);
    * ``separate_files``: one file per band: the files whose names differ
      only in the ``band`` group (and a ``resolution`` group, which may
      differ between bands) form a scene, indexed once through the file of
      its first band; the other bands are read from the files with their
      band name substituted;
    * ``nodata``, ``dtype``, ``resampling``, ``cmap`` and ``class_names`` for plots.

    Samples hold float32 images and int64 masks, as TorchGeo returns them
    (``dtype`` follows ``is_image``, and the resampling follows the dtype:
    bilinear for floats, nearest for integers).  ``dtype="native"`` keeps the
    files' own data type instead (e.g. ``uint16`` Landsat, ``uint8`` CDL):
    4x (images) to 8x (masks) fewer bytes through workers, shared memory and
    host-to-device copies, for pipelines that convert on the GPU
    (:func:`pipekit.device.to_device`).

    Args:
        root: a directory (searched recursively for ``filename_glob``), a
            file, a glob, an fsspec URL (``s3://bucket/prefix``,
            ``memory://...``) or a list of them.  ``paths=`` is accepted as
            TorchGeo's name for it.
        crs: the dataset CRS (default: the first file's); other files are
            reprojected on read.
        res: pixel size, a number or ``(xres, yres)`` (default: the first
            file's, converted to ``crs`` if needed).
        bands: band names to read (default ``default_bands``, else all).
        transforms: a callable applied to every sample dict.
        cache: keep file handles open between reads (per worker process).
        storage_options: fsspec options for remote roots (s3fs spelling for S3).
        nodata: override the files' nodata value (also the fill value).
        dtype: torch dtype of samples (default float32 for images, int64 for
            masks), or ``"native"``: the files' own data type (widened only
            where the fill value needs it).
        resampling: override ``resampling`` (name or rasterio ``Resampling``;
            default bilinear for float samples and native images, nearest otherwise).
        time_series: stack, rather than mosaic, the scenes a query's time
            overlaps (TorchGeo's ``time_series``, added after 0.8):
            ``sample["image"]`` is ``[T, C, H, W]`` (a mask ``[T, H, W]``),
            one time step per distinct scene time interval, oldest first
            (entries with the same interval, e.g. adjacent tiles of one
            date, are mosaicked into one step; TorchGeo stacks every file),
            and ``sample["dates"]`` the ``[T]`` float64 POSIX seconds of
            each step's start.  Default ``False``: one ``[C, H, W]`` mosaic.
        on_error: ``"raise"`` (default) or ``"skip"``: files that cannot be
            indexed are then logged, counted in ``self.skip_log`` and left
            out; a read that fails is counted there too, and the query has
            no sample: ``dataset[query]`` raises
            :class:`~pipekit.geo.read.SkippedReadError` (a ``ReadError``) and
            ``read_geo`` drops the query -- never a zero-filled patch.
        vsi: how remote files are opened (see :class:`pipekit.geo.io.RasterOpener`).
        gdal_options: extra GDAL configuration for remote files.
        cache_dir: a local folder that keeps the byte ranges read from
            remote files (S3, HTTP, any fsspec URL), shared by DataLoader
            workers (a tile one worker fetched is not fetched again by
            another) and by later runs, which read it from local disk.
            Nothing is evicted: it grows to the bytes read, at most the
            remote files' size.  Remote files are then read through fsspec
            (``vsi=True`` is refused).  See
            :class:`pipekit.geo.rangecache.RangeCache`.  Default ``None``.
        index_cache: keep the files' headers in a GeoParquet file and reuse
            them next time (only files whose size or modification time changed
            are opened again): ``True`` (``<root>/.pipekit-index.parquet``), a
            path or fsspec URL, or ``None`` (see :mod:`pipekit.geo.index_cache`
            and :meth:`save_index`).
        index_workers: threads that read the files' headers (``None``: see
            :func:`pipekit.geo.discovery.default_workers`); the index is the
            same whatever their number.
        progress: a tqdm progress bar while headers are read (``None``: only
            for 5,000 files or more).

    Raises:
        DatasetNotFoundError: no file found (names the root and glob; TorchGeo's
            exception, a ``FileNotFoundError``).
        ReadError: a file cannot be opened (names it).
        GeoReferenceError: a file has no CRS or geotransform (names it).

    Example:
        >>> import tempfile, numpy as np, rasterio
        >>> from affine import Affine
        >>> from pipekit.geo import BoundingBox
        >>> from pipekit.datasets import RasterDataset
        >>> root = tempfile.mkdtemp()
        >>> with rasterio.open(f"{root}/a.tif", "w", driver="GTiff", width=64, height=64, count=1, dtype="uint8",
        ...                    crs="EPSG:32615", transform=Affine(10, 0, 500000, 0, -10, 4000640)) as f:
        ...     f.write(np.arange(64 * 64, dtype="uint8").reshape(1, 64, 64))
        >>> ds = RasterDataset(root)
        >>> sample = ds[BoundingBox(500000, 500320, 4000320, 4000640)]
        >>> sample["image"].shape, sample["image"].dtype, sample["crs"].to_epsg()
        (torch.Size([1, 32, 32]), torch.float32, 32615)
    """

    filename_glob: str = "*"
    filename_regex: str = ".*"
    date_format: str = "%Y%m%d"
    is_image: bool = True
    separate_files: bool = False
    all_bands: Sequence[str] = ()
    default_bands: Sequence[str] | None = None
    rgb_bands: Sequence[str] = ()
    nodata: float | None = None
    cmap: Mapping[int, Sequence[int]] | None = None
    class_names: Mapping[int, str] | None = None
    #: regex groups that may differ between the files of one scene besides ``band``
    band_variant_groups: Sequence[str] = ("resolution",)
    #: the band files of a remote entry may be read each on its own I/O lane at once (see RasterReader)
    _concurrent_parts: bool = True

    def __init__(
        self,
        root: Any = None,
        crs: Any = None,
        res: Any = None,
        bands: Sequence[str] | None = None,
        transforms: Callable[[Sample], Sample] | None = None,
        cache: bool = True,
        storage_options: Mapping[str, Any] | None = None,
        *,
        paths: Any = None,
        nodata: float | None = None,
        dtype: torch.dtype | str | None = None,
        resampling: Resampling | str | None = None,
        on_error: str = "raise",
        vsi: bool | None = None,
        gdal_options: Mapping[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        time_series: bool = False,
        index_cache: Any = None,
        index_workers: int | None = None,
        progress: bool | None = None,
    ) -> None:
        if not isinstance(time_series, bool):
            raise TypeError(f"time_series must be a bool, got {time_series!r}")
        self.time_series = time_series
        if root is not None and paths is not None:
            raise TypeError("pass root= or paths= (TorchGeo's name), not both")
        root = paths if root is None else root
        self.root = "data" if root is None else root
        self.paths = self.root
        if transforms is not None and not callable(transforms):
            raise TypeError(f"transforms must be callable, got {type(transforms).__name__}")
        if not isinstance(cache, bool):
            raise TypeError(f"cache must be a bool, got {cache!r}")
        self.transforms = transforms
        self.cache = cache
        self.on_error = check_on_error(on_error)
        self.skip_log = SkipLog(self.name)
        self._opener = geo_io.RasterOpener(storage_options, vsi, gdal_options, cache_dir)
        self._reader = RasterReader(self._opener, self.name, self.skip_log, concurrent=self._concurrent_parts)
        self._init_index_options(index_cache, index_workers, progress)
        self.storage_options = self._opener.storage_options
        if nodata is not None:
            self.nodata = float(nodata)
        if dtype is not None:
            self.dtype = dtype
        if resampling is not None:
            self.resampling = resampling
        self.bands = self._check_bands(bands)
        try:
            self._regex = re.compile(self.filename_regex, re.VERBOSE)
        except re.error as exc:
            raise ValueError(f"{self.name}.filename_regex is not a valid regex: {exc}") from None
        if self.separate_files and "band" not in self._regex.groupindex:
            raise ValueError(f"{self.name} has separate_files=True, so its filename_regex needs a 'band' group")

        given_crs = None if crs is None else _to_crs(crs)
        given_res = None if res is None else _to_res(res)

        self._files = self._build_file_table()
        first = 0
        target_crs = self._files.crs(first) if given_crs is None else given_crs
        if given_res is not None:
            target_res = given_res
        else:
            file_res = self._files.res(first)
            if target_crs == self._files.crs(first):
                target_res = file_res
            else:
                left, bottom, right, top = self._files.native_bounds(first)
                target_res = _default_res(
                    self._files.crs(first), target_crs, file_res, BoundingBox(left, right, bottom, top)
                )
        self._crs = target_crs
        self._res = target_res
        self._rows: np.ndarray | None = None  # file-table row of each index entry (None: entry i is row i)
        self.geo_index = self._build_index(target_crs)
        self._log_choice(crs, res)
        self._save_pending()

    # -- sample types ----------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        """The samples' torch dtype: float32 for images, int64 for masks (following ``is_image``) unless set.

        Set it (or pass ``dtype=``) to a torch dtype, or to ``"native"`` for
        the files' own data type (this property then reports its torch dtype).
        """
        choice = self.__dict__.get("_dtype_choice")
        if choice is None:
            return torch.float32 if self.is_image else torch.long
        if choice == "native":
            return _torch_dtype(self.__dict__.get("_np_dtype", np.dtype(np.float32)))
        return choice

    @dtype.setter
    def dtype(self, value: torch.dtype | str | None) -> None:
        if value is not None and value != "native" and not isinstance(value, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype or 'native' (the files' own type), got {value!r}")
        self.__dict__["_dtype_choice"] = value

    @property
    def native_dtype(self) -> bool:
        """Whether samples keep the files' own data type (``dtype="native"``)."""
        return self.__dict__.get("_dtype_choice") == "native"

    @property
    def resampling(self) -> Resampling:
        """Resampling when files are reprojected or resized: as set, else bilinear for float dtypes, nearest for others.

        As TorchGeo 0.8 decides it from ``dtype`` (so from ``is_image``);
        with ``dtype="native"``, bilinear for images and nearest for masks.
        """
        choice = self.__dict__.get("_resampling_choice")
        if choice is not None:
            return choice
        if self.native_dtype:
            return Resampling.bilinear if self.is_image else Resampling.nearest
        dtype = self.dtype
        floating = dtype.is_floating_point if isinstance(dtype, torch.dtype) else self.is_image
        return Resampling.bilinear if floating else Resampling.nearest

    @resampling.setter
    def resampling(self, value: Resampling | str | int | None) -> None:
        self.__dict__["_resampling_choice"] = None if value is None else resampling_from(value)
    # -- configuration --------------------------------------------------------------------
    def _check_bands(self, bands: Sequence[str] | None) -> list[Any]:
        if bands is not None and (isinstance(bands, str) or not isinstance(bands, Sequence)):
            raise TypeError(f"bands must be a sequence of band names, got {bands!r}")
        if bands is not None and len(bands) == 0:
            raise ValueError("bands must not be empty")
        if bands is None:
            chosen = list(self.default_bands) if self.default_bands is not None else list(self.all_bands)
        else:
            chosen = list(bands)
        if self.all_bands and self.separate_files:
            bad = [b for b in chosen if not isinstance(b, str) or not b]
            if bad:
                raise ValueError(f"{self.name} bands are band names (strings), got {bad}")
        elif self.all_bands:
            unknown = [b for b in chosen if b not in self.all_bands]
            if unknown:
                raise ValueError(
                    f"{self.name} has no band(s) {unknown}; its bands are {list(self.all_bands)}"
                )
        elif chosen:
            bad = [b for b in chosen if isinstance(b, bool) or not isinstance(b, int) or b < 1]
            if bad:
                raise ValueError(
                    f"{self.name} names no bands (all_bands is empty): select bands by 1-based index, got {bad}"
                )
        if self.separate_files and not chosen:
            raise ValueError(f"{self.name} has separate_files=True but no bands (set all_bands or pass bands=)")
        if len(set(chosen)) != len(chosen):
            raise ValueError(f"bands must not repeat, got {chosen}")
        return chosen

    @property
    def files(self) -> list[str]:
        """The indexed files (for ``separate_files``, one per scene: its first band's)."""
        return [self._files.path(int(i)) for i in self._entry_rows()]

    def _entry_rows(self) -> np.ndarray:
        """The file-table row of each index entry."""
        return np.arange(len(self._files)) if self._rows is None else self._rows

    @property
    def crs(self) -> CRS:
        return self._crs

    @crs.setter
    def crs(self, value: Any) -> None:
        new = _to_crs(value)
        if new == self._crs:
            return
        self._crs = new
        self.__dict__.pop("_crs_key", None)
        self.geo_index = self._build_index(new)

    @property
    def res(self) -> tuple[float, float]:
        return self._res

    @res.setter
    def res(self, value: Any) -> None:
        self._res = _to_res(value)

    # -- indexing -------------------------------------------------------------------------
    def _glob(self) -> str:
        """``filename_glob`` with its band placeholder ``{}`` matching any band (scenes are grouped later)."""
        return any_band_glob(self.filename_glob)

    def _band_in_glob(self) -> bool:
        """Whether ``filename_glob`` names one band, TorchGeo's way (``"T*_B02_10m.tif"``), not with ``{}``."""
        return self.separate_files and "{}" not in self.filename_glob

    def _skip_or_raise(self, error: StageError) -> None:
        if self.on_error == "raise":
            raise error
        self.skip_log.record(error)

    def _build_file_table(self) -> _FileTable:
        # the collector paused until the per-file objects of indexing (a Match per file name...) are gone: paused
        # only around the listing, it traversed the 100,000 matches still alive when it was enabled again (~40 ms)
        with gc_paused():
            return self._index_files()

    def _index_files(self) -> _FileTable:
        """List the files, read (or reload) their headers and build the file table (:meth:`_build_file_table`)."""
        in_glob = self._band_in_glob()
        origins: dict[str, str] | None = {} if in_glob else None  # only TorchGeo's band-in-glob scenes need them
        paths, matches = find_paths(self.root, self._glob(), self._regex, self.storage_options,
                                    with_siblings=self.separate_files, name=self.name,
                                    all_siblings=in_glob, origins=origins)
        found_count = len(paths)
        bands_of: list[dict[str, str]] = []
        if self.separate_files:
            matched = list(zip(paths, matches))
            self._check_bands_found(matched)
            if in_glob:
                scenes = self._scenes_of_glob_matches(matched, origins or {})
            else:
                scenes = self._group_scenes(matched)
            paths = [path for path, _, _ in scenes]
            matches = [match for _, match, _ in scenes]
            bands_of = [bands for _, _, bands in scenes]

        columns, rows = self._read_metadata(paths)
        if not rows:
            raise DatasetNotFoundError(
                f"{self.name}: none of the {found_count} file(s) found in {self.root!r} could be indexed "
                f"({self.skip_log.count} skipped, see skip_log)"
            )
        if len(rows) < len(paths):  # files that could not be indexed were skipped
            paths = [paths[i] for i in rows]
            matches = [matches[i] for i in rows]
            bands_of = [bands_of[i] for i in rows] if bands_of else bands_of
        times = self._file_times(paths, matches)
        band_spans, band_overrides = self._band_columns(paths, matches, bands_of) if self.separate_files else (None, {})
        table = _FileTable.from_columns(paths, columns, times, band_spans, band_overrides)
        band_dtypes = self._band_dtypes(bands_of[0], paths[0]) if self.separate_files else []
        self._check_table(table, band_dtypes)
        return table

    def _file_times(self, paths: list[str], matches: list[re.Match[str]]) -> np.ndarray:
        """``[n, 2]`` time intervals of the files from their names (:meth:`_time_interval`), vectorised.

        Without ``date``/``start``/``stop`` groups every file spans all time
        (no per-file step).  With them, each distinct date text is parsed once
        and the files take their interval by code; the first file (in order)
        whose date cannot be parsed is reported, with the error the per-file
        :meth:`_time_interval` raises.  A subclass that overrides
        :meth:`_time_interval` is asked file by file.
        """
        n = len(paths)
        times = np.empty((n, 2), dtype=np.float64)
        groups = self._regex.groupindex
        if not any(g in groups for g in ("date", "start", "stop")):
            times[:, 0], times[:, 1] = MIN_TIME, MAX_TIME
            return times
        if type(self)._time_interval is not RasterDataset._time_interval:
            for k, (path, match) in enumerate(zip(paths, matches)):
                times[k] = self._time_interval(path, match)
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

    def _band_columns(self, paths: list[str], matches: list[re.Match[str]],
                      bands_of: list[dict[str, str]]) -> tuple[np.ndarray, dict[tuple[int, str], str]]:
        """Where each file's band name lies in its path, and the band files not found by substituting it."""
        offsets = np.fromiter((len(_split_name(path)[0]) for path in paths), dtype=np.int64, count=len(paths))
        spans = np.array(list(map(operator.methodcaller("span", "band"), matches)), dtype=np.int64).reshape(-1, 2)
        band_spans = spans + offsets[:, None]
        band_overrides: dict[tuple[int, str], str] = {}
        for k, (path, (start, stop), bands) in enumerate(zip(paths, band_spans.tolist(), bands_of)):
            head, tail = path[:start], path[stop:]
            for band, other in bands.items():
                if other != head + band + tail:
                    band_overrides[(k, band)] = other
        return band_spans, band_overrides

    def _group_scenes(
        self, matched: list[tuple[str, re.Match[str]]]
    ) -> list[tuple[str, re.Match[str], dict[str, str]]]:
        """Band files grouped into scenes: ``(index file, its match, {band: file})`` for complete scenes.

        The scenes are :func:`~pipekit.geo.discovery.group_scenes`': the files
        whose names agree in every regex group except ``band`` and the
        ``band_variant_groups`` (e.g. Sentinel-2's ``resolution``), wherever
        they lie (Sentinel-2 Level-2A keeps its 10, 20 and 60 m bands in
        sibling folders) -- unless two of them would hold the same band and
        variant, in which case each folder is a scene of its own.  The index
        file is the finest copy of the first requested band; each band is read
        from its finest copy.  A scene missing a requested band is reported
        (``ReadError``, or recorded with ``on_error="skip"``).
        """
        scenes = []
        for files in group_scenes(matched, self.band_variant_groups):
            scene = self._complete_scene(files)
            if scene is not None:
                scenes.append(scene)
        scenes.sort(key=lambda scene: scene[0])
        return scenes

    def _check_bands_found(self, matched: list[tuple[str, re.Match[str]]]) -> None:
        """Refuse bands outside ``all_bands`` that no file found holds (a typo, or a band the scenes do not carry).

        (A band of ``all_bands`` missing from a scene is reported per scene, see ``_complete_scene``.)
        """
        found = {match.group("band") for _, match in matched}
        missing = [b for b in self.bands if b not in found and b not in self.all_bands]
        if missing:
            raise ValueError(
                f"{self.name} has no band(s) {missing} in the files found in {self.root!r}: they hold bands "
                f"{sorted(found)} (its all_bands are {list(self.all_bands)})"
            )

    def _scenes_of_glob_matches(
        self, matched: list[tuple[str, re.Match[str]]], origins: dict[str, str]
    ) -> list[tuple[str, re.Match[str], dict[str, str]]]:
        """TorchGeo's rule for a ``filename_glob`` that names a band: one scene per file the glob finds.

        Each band is read from the file whose name is the scene file's with
        the band substituted (in the same folder), as TorchGeo reads it; where
        no such file exists, from the finest copy of the band among the files
        of the same scene (the names agree in every other group), if any.
        """
        known = {path for path, _ in matched}
        by_scene: dict[tuple[Any, ...], list[tuple[str, re.Match[str]]]] = {}
        for path, match in matched:
            by_scene.setdefault(self._scene_key(match), []).append((path, match))
        scenes = []
        for path, match in matched:
            if origins.get(path) == "sibling":
                continue  # found beside a scene file: a band file, not a scene of its own
            directory, name = _split_name(path)
            start, stop = match.span("band")
            chosen: dict[str, str] = {}
            for band in self.bands:
                candidate = directory + name[:start] + band + name[stop:]
                if candidate in known:
                    chosen[band] = candidate
                    continue
                options = sorted(
                    (self._variant_rank(m), _split_name(p)[0] != directory, p)
                    for p, m in by_scene[self._scene_key(match)] if m.group("band") == band
                )
                if not options:
                    self._skip_or_raise(ReadError(
                        "find band file", candidate, self.name,
                        f"band {band!r} of the scene of {name!r} is missing (separate_files: one file per band)",
                    ))
                    break
                chosen[band] = options[0][2]
            else:
                scenes.append((path, match, chosen))
        return scenes

    def _scene_key(self, match: re.Match[str]) -> tuple[Any, ...]:
        """What the files of one scene share: every regex group but ``band`` and the variant groups."""
        skip = {"band", *self.band_variant_groups}
        return tuple(sorted((k, v) for k, v in match.groupdict().items() if k not in skip))

    def _complete_scene(
        self, files: dict[tuple[Any, ...], tuple[str, re.Match[str]]]
    ) -> tuple[str, re.Match[str], dict[str, str]] | None:
        by_band: dict[str, list[tuple[tuple[float, str], str, re.Match[str]]]] = {}
        for (band, *_), (path, match) in files.items():
            by_band.setdefault(band, []).append((self._variant_rank(match), path, match))
        for options in by_band.values():
            options.sort(key=lambda option: (option[0], option[1]))
        first = self.bands[0]
        if first in by_band:
            _, index_path, index_match = by_band[first][0]
        else:
            _, index_path, index_match = min(option for options in by_band.values() for option in options)
        directory, name = _split_name(index_path)
        start, stop = index_match.span("band")
        chosen: dict[str, str] = {}
        for band in self.bands:
            options = by_band.get(band)
            if not options:
                self._skip_or_raise(ReadError(
                    "find band file", directory + name[:start] + band + name[stop:], self.name,
                    f"band {band!r} of the scene of {name!r} is missing (separate_files: one file per band)",
                ))
                return None
            best = options[0][0]
            same_folder = [o for o in options if o[0] == best and _split_name(o[1])[0] == directory]
            chosen[band] = (same_folder or options)[0][1]
        return index_path, index_match, chosen

    def _variant_rank(self, match: re.Match[str]) -> tuple[float, str]:
        """Sort key among the files of one band: the finest resolution (digits of the variant group) first."""
        for group in self.band_variant_groups:
            value = match.groupdict().get(group)
            if value:
                digits = re.sub(r"\D", "", value)
                return (float(digits) if digits else math.inf, value)
        return (-math.inf, "")

    def _time_interval(self, path: str, match: re.Match[str]) -> tuple[float, float]:
        groups = match.groupdict()
        try:
            if groups.get("date"):
                return date_interval(groups["date"], self.date_format)
            mint, maxt = MIN_TIME, MAX_TIME
            if groups.get("start"):
                mint = date_interval(groups["start"], self.date_format)[0]
            if groups.get("stop"):
                maxt = date_interval(groups["stop"], self.date_format)[1]
            return mint, maxt
        except ValueError as exc:
            raise ParseError("parse the date of", path, self.name,
                             f"{exc} (date_format {self.date_format!r})") from exc

    def _inspect(self, path: str) -> RasterHeader | None:
        try:
            header = read_header(self._opener, path, self.name)
        except ReadError as exc:
            self._skip_or_raise(exc)
            return None
        error = header.index_error(self.name)
        if error is not None:
            self._skip_or_raise(error)
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

    def _check_table(self, table: _FileTable, band_dtypes: Sequence[str] = ()) -> None:
        if not self.separate_files:
            if self.all_bands:
                needed = max(list(self.all_bands).index(b) + 1 for b in self.bands)
                what = f"band {list(self.all_bands)[needed - 1]!r} (band {needed})"
            elif self.bands:
                needed = max(self.bands)
                what = f"band {needed}"
            else:
                needed = int(table.counts.max())
                what = f"{needed} bands (like {table.path(int(np.argmax(table.counts)))!r})"
            short = np.flatnonzero(table.counts < needed)
            if len(short):
                i = int(short[0])
                raise ReadError("index raster", table.path(i), self.name,
                                f"it has {int(table.counts[i])} band(s), the dataset reads {what}")
        natives = [np.dtype(d) for d in (*table.dtypes, *band_dtypes)]
        native = np.result_type(*natives) if natives else np.dtype(np.float32)
        if self.nodata is not None:
            fill = float(self.nodata)
        else:
            first = table.file_nodata(0)
            fill = first if first is not None else 0.0
        self._fill_value = fill
        self._np_dtype = _fill_dtype(native, fill)
        if self.separate_files:
            self._indexes = [1]
        elif self.all_bands:
            self._indexes = [list(self.all_bands).index(b) + 1 for b in self.bands]
        elif self.bands:
            self._indexes = list(self.bands)
        else:
            self._indexes = list(range(1, int(table.counts.max()) + 1))
        self._channels = len(self.bands) if self.separate_files else len(self._indexes)

    def _build_index(self, crs: CRS) -> GeoIndex:
        boxes = np.empty((len(self._files), 6), dtype=np.float64)
        boxes[:, :4] = self._files.footprints(crs)
        boxes[:, 4:] = self._files.times
        if self._rows is not None:
            boxes = boxes[self._rows]
        return GeoIndex._from_array(boxes)  # a new array: not copied again

    def _frame(self) -> Any:
        """TorchGeo 0.8's index: a ``filepath`` column (a scene's first band file), geometry, time intervals."""
        from pipekit.geo.frame import frame_from_index

        return frame_from_index(self.geo_index, self._crs, {"filepath": self.files})

    def _set_frame(self, frame: Any) -> None:
        """Keep the rows of ``frame`` (a filtered ``dataset.index``), matched to files by their ``filepath``."""
        from pipekit.geo.frame import index_from_frame

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

    # -- reading ----------------------------------------------------------------------------
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
            arrays.append(self._mosaic(rows, grid, False)[key][0])
        stack = np.stack(arrays)
        tensor = _to_tensor(stack, self._dtypes()[key])
        if key == "mask" and tensor.shape[1] == 1:
            tensor = tensor[:, 0]
        return {key: tensor, "dates": torch.from_numpy(starts), "crs": self._crs, "bounds": bounds,
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
        """Read index entry ``i`` (a file, or a scene of band files) into ``out``."""
        if self.separate_files:
            parts = [(self._files.band_path(i, band), [1]) for band in self.bands]
        else:
            parts = [(self._files.path(i), self._indexes)]
        self._reader.read(parts, grid, out, valid, prefilled, settings or self._read_settings())

    def _postprocess(self, array: np.ndarray) -> np.ndarray:
        """Hook for products (e.g. CDL's ordinal class mapping); identity by default."""
        return array

    def _retargeted(self, crs: CRS, res: tuple[float, float]) -> RasterDataset:
        clone = copy.copy(self)
        clone.__dict__.pop("_crs_key", None)
        clone._res = res
        if crs != self._crs:
            clone._crs = crs
            if self.__dict__.get("_cut"):
                clone.geo_index = _reproject_index(self.geo_index, self._crs, crs)
            else:
                clone.geo_index = clone._build_index(crs)
        return clone

    def _plot_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {}
        if self.is_image:
            if self.rgb_bands and all(b in self.bands for b in self.rgb_bands):
                spec["rgb"] = [self.bands.index(b) for b in self.rgb_bands]
        else:
            if self.cmap is not None:
                spec["cmap"] = self.cmap
            if self.class_names is not None:
                spec["class_names"] = self.class_names
        return spec



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


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    """The torch dtype of numpy data (``torch.from_numpy``'s)."""
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype
