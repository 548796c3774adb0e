"""Raster datasets: :class:`RasterDataset`, a geo dataset of raster files (GeoTIFF, COG, JPEG 2000...).

A dataset is its arguments, a *catalog* and a *reader*.  The catalog
(:class:`~pipekit.geo.catalog.FileCatalog`, or a STAC item catalog) says what
the entries are: the files are listed and their metadata read once, when the
dataset is built, their footprints (in the dataset CRS) and time intervals
(from their names) going into a :class:`~pipekit.geo._index.GeoIndex`
(``dataset.geo_index``), which ``dataset.index``, TorchGeo 0.8's
``GeoDataFrame``, shows.  The reader (:class:`~pipekit.geo._reader.RasterReader`)
reads an entry's files onto a query's grid; the dataset mosaics the entries
and assembles the sample.  The dataset holds no open file: it pickles to
DataLoader workers as a few arrays and strings, and each worker opens files
lazily through :mod:`pipekit.geo.io`'s per-process cache.

``RasterDataset`` holds the arguments and the policies (dtype, resampling, CRS
and resolution); building the index is :class:`~pipekit.geo._raster_index.RasterIndexing`'s
and assembling a sample :class:`~pipekit.geo._raster_sample.RasterSampling`'s, its bases.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from rasterio.crs import CRS
from rasterio.enums import Resampling

from pipekit.errors import RGBBandsMissingError, SkipLog, check_on_error
from pipekit.geo import io as geo_io
from pipekit.geo._antimeridian import one_side
from pipekit.geo._base import (
    GeoDataset,
    Sample,
    _default_res,
    _reproject_index,
    _to_crs,
    _to_res,
)
from pipekit.geo._bbox import BoundingBox
from pipekit.geo._crs import user_crs
from pipekit.geo._raster_index import RasterIndexing
from pipekit.geo._raster_sample import RasterSampling
from pipekit.geo._read import resampling_from
from pipekit.geo._reader import RasterReader
from pipekit.geo.catalog import CachedHeaders, check_bands

__all__ = ["RasterDataset"]


class RasterDataset(RasterSampling, RasterIndexing, GeoDataset):
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
            :class:`~pipekit.geo._read.SkippedReadError` (a ``ReadError``) and
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
            path or fsspec URL, or ``None`` (see :mod:`pipekit.geo.catalog`
            and :meth:`save_index`).
        index_workers: threads that read the files' headers (``None``: see
            :func:`pipekit.geo.catalog._headers.default_workers`); the index is the
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
        self._reader = RasterReader(geo_io.RasterOpener(storage_options, vsi, gdal_options, cache_dir), self.name,
                                    self.skip_log)
        self._cached_headers = CachedHeaders(self.root, self._opener, self.name, index_cache, index_workers, progress)
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

        self._catalog = self._make_catalog()
        self._reader.concurrent = self._catalog.concurrent
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
                left, bottom, right, top = one_side(self._files.crs(first), target_crs,
                                                    *self._files.native_bounds(first))  # not across 180 degrees
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
        """``bands=`` checked against the product's band names (default ``default_bands``, else all)."""
        return check_bands(bands, self.default_bands, self.all_bands, self.separate_files, self.name)

    @property
    def _opener(self) -> geo_io.RasterOpener:
        """How files are opened (the reader's; replacing it makes this dataset's reads use another)."""
        return self._reader.opener

    @_opener.setter
    def _opener(self, value: geo_io.RasterOpener) -> None:
        self._reader = copy.copy(self._reader)  # a copy (to_crs) that shares the reader keeps its opener
        self._reader.opener = value

    @property
    def files(self) -> list[str]:
        """The indexed files (for ``separate_files``, one per scene: its first band's)."""
        return [self._files.path(int(i)) for i in self._entry_rows()]

    def _entry_rows(self) -> np.ndarray:
        """The file-table row of each index entry."""
        return np.arange(len(self._files)) if self._rows is None else self._rows

    @property
    def crs(self) -> Any:
        """The dataset's CRS: pyproj's ``CRS``, as TorchGeo 0.8 gives (kept inside as rasterio's, ``_crs``)."""
        return user_crs(self._crs)

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

    # -- the saved index ----------------------------------------------------------------------
    @property
    def index_cache(self) -> Any:
        """``index_cache=``: ``True``, a path or URL of the saved index, or ``None``."""
        return self._cached_headers.index_cache

    @index_cache.setter
    def index_cache(self, value: Any) -> None:
        self._cached_headers.index_cache = value

    @property
    def index_workers(self) -> int | None:
        """Threads that read the files' headers (``index_workers=``)."""
        return self._cached_headers.index_workers

    @property
    def progress(self) -> bool | None:
        """Whether a progress bar shows while headers are read (``progress=``)."""
        return self._cached_headers.progress

    def index_cache_url(self) -> str | None:
        """Where the saved index is read and written (``None`` without ``index_cache``)."""
        return self._cached_headers.url()

    def save_index(self, path: Any = None) -> str:
        """Save the headers of the indexed files to a GeoParquet file and return where.

        Args:
            path: a local path or fsspec URL (default: ``index_cache``'s
                location, ``<root>/.pipekit-index.parquet`` for ``index_cache=True``
                or when none was given and the root is one folder).

        Reload it with ``RasterDataset(root, index_cache=path)``: files whose
        size or modification time changed since are read again.

        Raises:
            RuntimeError: the dataset was unpickled (a DataLoader worker's copy
                holds no fingerprints): save from the dataset that was built.

        Example:
            >>> import os, tempfile, numpy as np, rasterio
            >>> from affine import Affine
            >>> from pipekit.datasets import RasterDataset
            >>> root = tempfile.mkdtemp()
            >>> with rasterio.open(f"{root}/a.tif", "w", driver="GTiff", width=8, height=8, count=1, dtype="uint8",
            ...                    crs="EPSG:32615", transform=Affine(10, 0, 500000, 0, -10, 4000080)) as f:
            ...     f.write(np.zeros((1, 8, 8), dtype="uint8"))
            >>> where = RasterDataset(root).save_index()
            >>> os.path.basename(where)
            '.pipekit-index.parquet'
            >>> RasterDataset(root, index_cache=True).files == [f"{root}/a.tif"]
            True
        """
        return self._cached_headers.save(path, self._files, self._crs)

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
        if self.is_image and self.rgb_bands:
            bands = list(self.bands or ())
            missing = [b for b in self.rgb_bands if b not in bands]
            if missing:  # other bands drawn as red, green and blue would mislead (TorchGeo raises too)
                raise RGBBandsMissingError(f"{self.name}: Dataset does not contain some of the RGB bands "
                                 f"(missing {', '.join(map(str, missing))}; bands={bands})")
            spec["rgb"] = [bands.index(b) for b in self.rgb_bands]
        elif not self.is_image:
            if self.cmap is not None:
                spec["cmap"] = self.cmap
            if self.class_names is not None:
                spec["class_names"] = self.class_names
        return spec


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    """The torch dtype of numpy data (``torch.from_numpy``'s)."""
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype
