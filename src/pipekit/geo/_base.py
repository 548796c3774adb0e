"""The base class of geo datasets, :class:`GeoDataset`, and the helpers every geo dataset shares.

A geo dataset is a map-style torch ``Dataset`` indexed, as in TorchGeo 0.8,
by slices ``dataset[x0:x1, y0:y1, t0:t1]`` in its CRS (or by a
:class:`~pipekit.geo.BoundingBox`).  ``dataset[query]`` returns a sample dict::

    {"image": float32 [C, H, W]  (or "mask": int64 [H, W] for a one-band mask),
     "crs": CRS, "bounds": (slice x, slice y, slice t) of the query, "transform": Affine of the patch}

read onto the grid with origin ``(minx, maxy)`` and pixel size ``dataset.res``
(or the query's x and y steps; see :mod:`pipekit.geo._read`).
``dataset.bounds`` is TorchGeo 0.8's ``(slice x, slice y, slice t)`` too, and
``dataset.index`` TorchGeo 0.8's ``GeoDataFrame`` (:mod:`pipekit.geo._frame`), a
view of ``dataset.geo_index``, the :class:`~pipekit.geo._index.GeoIndex` that
answers the queries.  Besides :class:`GeoDataset`
this module holds the CRS and resolution arguments' checks (``_to_crs``,
``_to_res``, ``_default_res``) and the dtype helpers that turn the arrays
read into sample tensors.
"""

from __future__ import annotations

import copy
import fnmatch
import glob
import math
import os
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from rasterio.crs import CRS
from rasterio.warp import calculate_default_transform, transform_bounds
from torch.utils.data import Dataset

from pipekit._fs import split_protocol
from pipekit.geo._bbox import BoundingBox, Bounds, is_complete, parse_query
from pipekit.geo._index import GeoIndex
from pipekit.geo._read import Grid

if TYPE_CHECKING:
    from geopandas import GeoDataFrame

    from pipekit.geo._composition import IntersectionDataset, UnionDataset

__all__ = ["GeoDataset", "Sample", "Arrays"]

Sample = dict[str, Any]
Arrays = dict[str, tuple[np.ndarray, "np.ndarray | None"]]


# ---------------------------------------------------------------------------------------------
# helpers


def _to_crs(value: Any) -> CRS:
    if isinstance(value, CRS):
        return value
    try:
        return CRS.from_user_input(value)
    except Exception as exc:
        raise ValueError(f"not a CRS: {value!r} ({exc})") from None


def _to_res(value: Any) -> tuple[float, float]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        pair = (float(value), float(value))
    elif isinstance(value, Sequence) and len(value) == 2:
        pair = (float(value[0]), float(value[1]))
    else:
        raise ValueError(f"res must be a number or an (xres, yres) pair, got {value!r}")
    if not all(math.isfinite(v) and v > 0 for v in pair):
        raise ValueError(f"res must be positive, got {value!r}")
    return pair


def _crs_name(crs: CRS) -> str:
    epsg = crs.to_epsg()
    return f"EPSG:{epsg}" if epsg else crs.to_string()


_NUMPY_DTYPES: dict[torch.dtype, np.dtype | None] = {}


def _numpy_dtype(dtype: torch.dtype) -> np.dtype | None:
    """The numpy dtype of a torch dtype (``None`` for torch-only types such as bfloat16)."""
    try:
        return _NUMPY_DTYPES[dtype]
    except KeyError:
        pass
    try:
        result: np.dtype | None = torch.empty(0, dtype=dtype).numpy().dtype
    except (TypeError, RuntimeError):
        result = None
    _NUMPY_DTYPES[dtype] = result
    return result


def _to_tensor(array: np.ndarray, dtype: torch.dtype | None) -> torch.Tensor:
    """``array`` as a tensor of ``dtype`` (``None``: its own dtype, for ``dtype="native"``)."""
    if dtype is None:
        return torch.from_numpy(np.ascontiguousarray(array))
    target = _numpy_dtype(dtype)
    if target is not None:
        if array.dtype != target:
            array = array.astype(target)
        return torch.from_numpy(np.ascontiguousarray(array))
    return torch.from_numpy(np.ascontiguousarray(array.astype(np.float32))).to(dtype)


def _fill_dtype(native: np.dtype, fill: float) -> np.dtype:
    """``native``, or a dtype that can also hold the fill value."""
    if np.issubdtype(native, np.floating):
        return native
    if isinstance(fill, float) and (math.isnan(fill) or fill != int(fill)):
        return np.dtype(np.float64) if native.itemsize >= 4 else np.dtype(np.float32)
    info = np.iinfo(native)
    if info.min <= fill <= info.max:
        return native
    return np.result_type(native, np.min_scalar_type(int(fill)))


# ---------------------------------------------------------------------------------------------
# the base class


class GeoDataset(Dataset):
    """Base class of geo datasets: a map-style torch ``Dataset`` indexed by slices (or bounding boxes).

    Subclasses set ``_crs``, ``_res``, ``geo_index`` and implement ``_read``.

    Attributes:
        crs: the dataset's CRS (queries and samples are in it).
        res: ``(xres, yres)`` pixel size of samples, in CRS units.
        index: TorchGeo 0.8's ``GeoDataFrame`` of footprints (``geometry``,
            ``filepath``, an ``IntervalIndex`` of times named ``"datetime"``,
            ``.crs``), built on first use from :attr:`geo_index`; assign a
            filtered copy to restrict the dataset (and its samplers) to its rows.
        geo_index: the :class:`~pipekit.geo._index.GeoIndex` of footprints and
            times that answers queries (what samplers read).
        bounds: TorchGeo 0.8's ``(slice(minx, maxx, xres), slice(miny, maxy,
            yres), slice(mint, maxt, 1))`` of everything (a :class:`~pipekit.geo._bbox.Bounds`).
        transforms: a callable applied to each sample dict.
    """

    _crs: CRS
    _res: tuple[float, float]
    geo_index: GeoIndex
    transforms: Callable[[Sample], Sample] | None = None
    #: samples stack the scenes of a query's time along a first axis (see ``RasterDataset(time_series=)``)
    time_series: bool = False

    def __new__(cls, *args: Any, **kwargs: Any) -> GeoDataset:
        if cls is GeoDataset:
            raise TypeError(
                "Can't instantiate abstract class GeoDataset: subclass it (assign index and res, implement "
                "__getitem__) or use RasterDataset/VectorDataset"
            )
        return super().__new__(cls)

    # -- attributes -------------------------------------------------------------------------
    @property
    def crs(self) -> Any:
        """The dataset's CRS: pyproj's ``CRS``, as TorchGeo 0.8 gives (assign any CRS rasterio accepts).

        Kept inside as rasterio's ``CRS`` (``_crs``, what GDAL calls take); converted once per CRS.
        """
        from pipekit.geo._crs import user_crs

        return user_crs(self._crs)

    @crs.setter
    def crs(self, value: Any) -> None:
        self._retarget_in_place(_to_crs(value), None)

    @property
    def res(self) -> tuple[float, float]:
        return self._res

    @res.setter
    def res(self, value: Any) -> None:
        res = _to_res(value)
        if not hasattr(self, "_res") or not hasattr(self, "_crs"):
            # a subclass written the TorchGeo way assigns ``index`` and ``res`` in its constructor: nothing to move yet
            self._res = res
            return
        self._retarget_in_place(None, res)

    def _retarget_in_place(self, crs: CRS | None, res: tuple[float, float] | None) -> None:
        """TorchGeo's ``crs``/``res`` setters: this dataset (and its operands) in another CRS or resolution."""
        crs = self._crs if crs is None else crs
        res = self._res if res is None else res
        if crs == self._crs and res == self._res:
            return
        clone = self._retargeted(crs, res)
        self.__dict__.update(clone.__dict__)

    def _extent(self) -> BoundingBox:
        """The :class:`BoundingBox` of everything (cached for the current ``geo_index``)."""
        cached = self.__dict__.get("_extent_cache")
        if cached is None or cached[0] is not self.geo_index:
            cached = self.__dict__["_extent_cache"] = (self.geo_index, self.geo_index.total_bounds)
        return cached[1]

    @property
    def bounds(self) -> Bounds:
        return Bounds.from_bbox(self._extent(), self._res)

    @property
    def index(self) -> GeoDataFrame:
        cached = self.__dict__.get("_frame_cache")
        if cached is None or cached[0] is not self.geo_index:
            cached = self.__dict__["_frame_cache"] = (self.geo_index, self._frame())
        return cached[1]

    @index.setter
    def index(self, value: Any) -> None:
        if isinstance(value, GeoIndex):
            self.geo_index = value
            return
        frame = value
        if not hasattr(self, "_crs"):
            # TorchGeo 0.8's contract: a subclass assigns a GeoDataFrame without the base constructor; its CRS
            # is the dataset's
            from pipekit.geo._frame import is_frame

            if not is_frame(frame):
                raise TypeError(
                    f"{self.name}.index takes a GeoDataFrame indexed by a pandas.IntervalIndex named 'datetime' "
                    f"(TorchGeo 0.8's dataset.index) or a GeoIndex, got {type(frame).__name__}"
                )
            if frame.crs is None:
                raise ValueError(f"{self.name}.index: the GeoDataFrame assigned has no crs (set crs= when building it)")
            self._crs = _to_crs(frame.crs)
        self._set_frame(frame)
        self.__dict__["_frame_cache"] = (self.geo_index, frame)

    def _frame(self) -> GeoDataFrame:
        """This dataset's ``GeoDataFrame`` (subclasses add their columns)."""
        from pipekit.geo._frame import frame_from_index

        return frame_from_index(self.geo_index, self._crs)

    def _set_frame(self, frame: Any) -> None:
        """Restrict this dataset to the rows of ``frame`` (a filtered ``dataset.index``)."""
        from pipekit.geo._frame import index_from_frame

        self.geo_index = index_from_frame(frame, self._crs)
        self._cut = True

    @property
    def name(self) -> str:
        return type(self).__name__

    def __len__(self) -> int:
        return len(self.geo_index)

    #: TorchGeo's glob of the files :attr:`files` lists under a directory of ``paths``
    filename_glob: str = "*"

    @property
    def files(self) -> list[str]:
        """The files of ``paths`` (TorchGeo 0.8's ``GeoDataset.files``), sorted, without duplicates.

        A directory is searched recursively for ``filename_glob``; a file (or a
        remote URL, a ``/vsi...`` path) that matches it is kept as given.  A path
        that is neither is left out with a ``UserWarning`` naming it (unless the
        dataset can ``download``).  Without ``paths``, the ``filepath`` column
        of :attr:`index` where it has one, else nothing.
        """
        paths = getattr(self, "paths", None)
        if paths is None:
            cached = self.__dict__.get("_frame_cache")
            frame = cached[1] if cached is not None else None
            if frame is not None and "filepath" in getattr(frame, "columns", ()):
                return sorted({str(f) for f in frame["filepath"]})
            return []
        return _list_files(paths, self.filename_glob, warn=not hasattr(self, "download"))

    def _disambiguate_slice(self, query: Any) -> tuple[slice, slice, slice]:
        """TorchGeo 0.8's helper: ``query`` (a slice or up to three) with what it leaves open taken from :attr:`bounds`.

        Each of ``start``, ``stop`` and ``step`` the query gives replaces the
        bounds' own, axis by axis (``x``, ``y``, ``t``); nothing is clipped or
        reordered.
        """
        out = list(self.bounds)
        if isinstance(query, slice):
            query = (query,)
        for i, part in enumerate(query):
            if not isinstance(part, slice):
                raise TypeError(f"{self.name}: a query is up to three slices (x, y, t), got {query!r}")
            start = out[i].start if part.start is None else part.start
            stop = out[i].stop if part.stop is None else part.stop
            step = out[i].step if part.step is None else part.step
            out[i] = slice(start, stop, step)
        return out[0], out[1], out[2]

    # -- queries ----------------------------------------------------------------------------
    def grid(self, bbox: BoundingBox, res: tuple[float, float] | None = None) -> Grid:
        """The pixel grid ``bbox`` is read onto (at ``res``, default the dataset's)."""
        key = self.__dict__.get("_crs_key")
        if key is None:
            key = self.__dict__["_crs_key"] = self._crs.to_wkt()
        return Grid.from_bbox(bbox, self._res if res is None else res, self._crs, key)

    def _query(self, key: Any) -> tuple[BoundingBox, tuple[float, float] | None, tuple[slice, slice, slice]]:
        """``(box, resolution or None, the slices samples report)`` of a query."""
        try:
            bbox, (xstep, ystep), bounds = parse_query(key, None if is_complete(key) else self._extent())
        except TypeError as exc:
            raise TypeError(f"{self.name}: {exc}") from None
        res = None
        if xstep is not None or ystep is not None:
            res = (xstep if xstep is not None else self._res[0], ystep if ystep is not None else self._res[1])
            if res == self._res:
                res = None
        return bbox, res, bounds

    def _missing(self, bbox: BoundingBox) -> IndexError:
        try:
            extent = repr(self._extent())
        except ValueError:
            extent = "(empty)"
        return IndexError(
            f"query: {bbox} not found in index with bounds: {extent} (it is not within the index of {self.name})"
        )

    def __getitem__(self, key: Any) -> Sample:
        """The sample of a query (TorchGeo 0.8's slices, or a BoundingBox); ``IndexError`` when nothing covers it.

        ``sample["bounds"]`` is the query as ``(slice x, slice y, slice t)``,
        with the ends it left open filled in from :attr:`bounds`.
        """
        bbox, res, bounds = self._query(key)
        grid = self.grid(bbox, res)
        sample = self._getitem(bbox, grid, bounds)
        if self.transforms is not None:
            sample = self.transforms(sample)
        return sample

    def _getitem(self, bbox: BoundingBox, grid: Grid, bounds: Any) -> Sample:
        arrays = self._read(bbox, grid, track_valid=False)
        if arrays is None:
            raise self._missing(bbox)
        return self._finish(bbox, grid, arrays, bounds)

    def _finish(self, bbox: BoundingBox, grid: Grid, arrays: Arrays, bounds: Any) -> Sample:
        sample: Sample = {}
        dtypes = self._dtypes()
        for key, (array, _) in arrays.items():
            if key == "mask" and array.shape[0] == 1:
                array = array[0]  # in numpy: a tensor's ``[0]`` costs ~10x more
            sample[key] = _to_tensor(array, dtypes[key])
        sample["crs"] = self.crs  # pyproj's CRS, as TorchGeo's samples
        sample["bounds"] = bounds
        sample["transform"] = grid.transform
        return sample

    # -- what subclasses provide ------------------------------------------------------------
    def _read(self, bbox: BoundingBox, grid: Grid, track_valid: bool) -> Arrays | None:
        """Pixels of ``bbox`` on ``grid`` per sample key, with validity masks when ``track_valid``.

        ``None`` when no index entry intersects ``bbox``.
        """
        raise NotImplementedError

    def _layers(self) -> dict[str, int]:
        """Sample keys and their channel counts, e.g. ``{"image": 3}``."""
        raise NotImplementedError

    def _dtypes(self) -> dict[str, torch.dtype | None]:
        """The torch dtype of each sample key (``None``: the dtype read, see ``dtype="native"``)."""
        raise NotImplementedError

    def _retargeted(self, crs: CRS, res: tuple[float, float]) -> GeoDataset:
        """A copy of this dataset in another CRS and/or resolution (reprojected on read).

        This default serves subclasses written the TorchGeo way (they assign
        ``index`` and read in their own ``__getitem__``): the copy's index is
        the footprints moved to ``crs`` (``GeoDataFrame.to_crs``), the dataset
        itself is left as it is.
        """
        clone = copy.copy(self)
        for key in ("_crs_key", "_frame_cache", "_extent_cache"):
            clone.__dict__.pop(key, None)
        if crs != self._crs:
            from pipekit.geo._frame import index_from_frame

            frame = self.index.to_crs(crs.to_wkt())
            clone.geo_index = index_from_frame(frame)
            clone.__dict__["_frame_cache"] = (clone.geo_index, frame)
        clone._crs, clone._res = crs, res
        return clone

    def _has_transforms(self) -> bool:
        return self.transforms is not None

    def _reads_itself(self) -> bool:
        """See :func:`_reads_itself` (compositions: whether an operand does)."""
        cls = type(self)
        return cls._read is GeoDataset._read and cls.__getitem__ is not GeoDataset.__getitem__

    def _plot_spec(self) -> dict[str, Any]:
        return {}

    # -- composition --------------------------------------------------------------------------
    def __and__(self, other: GeoDataset) -> IntersectionDataset:
        """``a & b``: samples where both datasets have data, holding both products' keys.

        ``NotGeoDatasetError`` (a ``TypeError`` and a ``ValueError``) when ``other`` is not a geo dataset.
        """
        from pipekit.geo._composition import IntersectionDataset

        return IntersectionDataset(self, other)

    def __or__(self, other: GeoDataset) -> UnionDataset:
        """``a | b``: samples where either dataset has data, mosaicked first-valid.

        ``NotGeoDatasetError`` (a ``TypeError`` and a ``ValueError``) when ``other`` is not a geo dataset.
        """
        from pipekit.geo._composition import UnionDataset

        return UnionDataset(self, other)

    def to_crs(self, crs: Any = None, res: Any = None) -> GeoDataset:
        """A copy of this dataset in ``crs`` and/or at ``res`` (files are reprojected on read)."""
        target_crs = self._crs if crs is None else _to_crs(crs)
        target_res = self._res if res is None else _to_res(res)
        if crs is not None and res is None and target_crs != self._crs:
            target_res = _default_res(self._crs, target_crs, self._res, self._extent())
        return self._retargeted(target_crs, target_res)

    # -- display --------------------------------------------------------------------------------
    def plot(self, sample: Sample, show_titles: bool = True, suptitle: str | None = None) -> Any:
        """Render a sample with matplotlib (the ``plot`` extra) and return the Figure.

        The image is shown as RGB from the product's ``rgb_bands`` (2-98
        percentile stretch), the mask with the product's colour map and a
        legend; a ``"prediction"`` key is shown beside the mask.
        """
        from pipekit.geo._plot import plot_sample

        return plot_sample(sample, show_titles=show_titles, suptitle=suptitle, **self._plot_spec())

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for key in ("_crs_key", "_frame_cache", "_extent_cache"):
            state.pop(key, None)  # rebuilt on demand (the GeoDataFrame is not sent to workers)
        return state

    def __str__(self) -> str:
        """TorchGeo 0.8's summary: the class, its kind, :attr:`bounds` and the number of index entries."""
        try:
            bounds = repr(self.bounds)
        except ValueError:
            bounds = "(empty)"
        kind = type(self).__name__ if type(self).__name__ in ("IntersectionDataset", "UnionDataset") else "GeoDataset"
        return f"{type(self).__name__} Dataset\n    type: {kind}\n    bbox: {bounds}\n    size: {len(self)}"

    def __repr__(self) -> str:
        try:
            bounds = repr(self._extent())
        except ValueError:
            bounds = "(empty)"
        return (
            f"{self.name}(crs={_crs_name(self._crs)}, res={self._res}, entries={len(self)}, bounds={bounds})"
        )


def _reads_itself(dataset: GeoDataset) -> bool:
    """Whether ``dataset`` is written the TorchGeo way (or composes one): its own ``__getitem__``, no ``_read``.

    Compositions then query it with ``dataset[slices]`` (as TorchGeo does)
    instead of reading its pixels onto their grid.
    """
    return dataset._reads_itself()


def _is_file_or_url(path: str) -> bool:
    return os.path.isfile(path) or split_protocol(path)[0] is not None or path.startswith("/vsi")


def _list_files(paths: Any, pattern: str, warn: bool) -> list[str]:
    """TorchGeo's file discovery: directories globbed recursively for ``pattern``, matching files and URLs kept."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files: set[str] = set()
    for path in paths:
        text = os.fspath(path)
        if os.path.isdir(text):
            found = glob.iglob(os.path.join(text, "**", pattern), recursive=True)
            files.update(f for f in found if not os.path.isdir(f))  # TorchGeo lists matching folders too
        elif _is_file_or_url(text) and fnmatch.fnmatch(text, f"*{pattern}"):
            files.add(text)
        elif warn:
            warnings.warn(
                f"Could not find any relevant files for provided path {text!r}. Path was ignored.",
                UserWarning,
                stacklevel=3,
            )
    return sorted(files)


def _reproject_index(index: GeoIndex, src: CRS, dst: CRS) -> GeoIndex:
    """The boxes of ``index`` (in ``src``) as boxes in ``dst``: each box's reprojected bounds, times kept.

    What a dataset whose index was assigned (a split, a filtered copy) keeps
    when it moves to another CRS, instead of re-indexing whole files.
    """
    boxes = index.bounds.copy()
    for row in boxes:
        left, bottom, right, top = transform_bounds(src, dst, row[0], row[2], row[1], row[3], densify_pts=21)
        row[0], row[1], row[2], row[3] = left, right, bottom, top
    return GeoIndex(boxes)


def _default_res(src_crs: CRS, dst_crs: CRS, res: tuple[float, float], bounds: BoundingBox) -> tuple[float, float]:
    """The pixel size in ``dst_crs`` matching ``res`` in ``src_crs`` around ``bounds`` (GDAL's suggestion)."""
    width = max(1, round(bounds.width / res[0]))
    height = max(1, round(bounds.height / res[1]))
    with warnings.catch_warnings():
        # rasterio's own use of affine's deprecated ``*`` operator
        warnings.simplefilter("ignore", PendingDeprecationWarning)
        transform, _, _ = calculate_default_transform(
            src_crs, dst_crs, width, height, left=bounds.minx, bottom=bounds.miny, right=bounds.maxx, top=bounds.maxy
        )
    return abs(transform.a), abs(transform.e)
