"""The base class of geo datasets, :class:`GeoDataset`, and the helpers every geo dataset shares.

A geo dataset is a map-style torch ``Dataset`` indexed by a
:class:`~pipekit.geo.BoundingBox` (or TorchGeo 0.8's slices
``dataset[x0:x1, y0:y1, t0:t1]``) in its CRS.  ``dataset[bbox]`` returns a
sample dict::

    {"image": float32 [C, H, W]  (or "mask": int64 [H, W] for a one-band mask),
     "crs": CRS, "bounds": the query BoundingBox, "transform": Affine of the patch}

read onto the grid with origin ``(bbox.minx, bbox.maxy)`` and pixel size
``dataset.res`` (see :mod:`pipekit.geo.read`).  Besides :class:`GeoDataset`
this module holds the CRS and resolution arguments' checks (``_to_crs``,
``_to_res``, ``_default_res``) and the dtype helpers that turn the arrays
read into sample tensors.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from rasterio.crs import CRS
from rasterio.warp import calculate_default_transform
from torch.utils.data import Dataset

from pipekit.geo.bbox import BoundingBox, from_slices
from pipekit.geo.index import GeoIndex
from pipekit.geo.read import Grid

if TYPE_CHECKING:
    from pipekit.geo.composition import IntersectionDataset, UnionDataset

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


def _to_tensor(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
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
    """Base class of geo datasets: a map-style torch ``Dataset`` indexed by bounding boxes.

    Subclasses set ``_crs``, ``_res``, ``index`` and implement ``_read``.

    Attributes:
        crs: the dataset's CRS (queries and samples are in it).
        res: ``(xres, yres)`` pixel size of samples, in CRS units.
        index: a :class:`~pipekit.geo.index.GeoIndex` of footprints (and times).
        bounds: the :class:`BoundingBox` of everything.
        transforms: a callable applied to each sample dict.
    """

    _crs: CRS
    _res: tuple[float, float]
    index: GeoIndex
    transforms: Callable[[Sample], Sample] | None = None

    # -- attributes -------------------------------------------------------------------------
    @property
    def crs(self) -> CRS:
        return self._crs

    @property
    def res(self) -> tuple[float, float]:
        return self._res

    @property
    def bounds(self) -> BoundingBox:
        return self.index.total_bounds

    @property
    def name(self) -> str:
        return type(self).__name__

    def __len__(self) -> int:
        return len(self.index)

    # -- queries ----------------------------------------------------------------------------
    def grid(self, bbox: BoundingBox) -> Grid:
        """The pixel grid ``bbox`` is read onto."""
        key = self.__dict__.get("_crs_key")
        if key is None:
            key = self.__dict__["_crs_key"] = self._crs.to_wkt()
        return Grid.from_bbox(bbox, self._res, self._crs, key)

    def _query(self, key: Any) -> BoundingBox:
        if isinstance(key, BoundingBox):
            return key
        if isinstance(key, (slice, tuple)):
            return from_slices(key, self.bounds)
        raise TypeError(
            f"{self.name} is indexed by a BoundingBox or by slices dataset[x0:x1, y0:y1, t0:t1], "
            f"got {type(key).__name__}"
        )

    def _missing(self, bbox: BoundingBox) -> IndexError:
        return IndexError(f"query {bbox} is not within the index of {self.name} (bounds {self.bounds!r})")

    def __getitem__(self, key: Any) -> Sample:
        """The sample of a :class:`BoundingBox` (or slices); ``IndexError`` when nothing covers it."""
        bbox = self._query(key)
        grid = self.grid(bbox)
        sample = self._getitem(bbox, grid)
        if self.transforms is not None:
            sample = self.transforms(sample)
        return sample

    def _getitem(self, bbox: BoundingBox, grid: Grid) -> Sample:
        arrays = self._read(bbox, grid, track_valid=False)
        if arrays is None:
            raise self._missing(bbox)
        return self._finish(bbox, grid, arrays)

    def _finish(self, bbox: BoundingBox, grid: Grid, arrays: Arrays) -> Sample:
        sample: Sample = {}
        dtypes = self._dtypes()
        for key, (array, _) in arrays.items():
            tensor = _to_tensor(array, dtypes[key])
            if key == "mask" and tensor.shape[0] == 1:
                tensor = tensor[0]
            sample[key] = tensor
        sample["crs"] = self._crs
        sample["bounds"] = bbox
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

    def _dtypes(self) -> dict[str, torch.dtype]:
        raise NotImplementedError

    def _retargeted(self, crs: CRS, res: tuple[float, float]) -> GeoDataset:
        """A copy of this dataset in another CRS and/or resolution (reprojected on read)."""
        raise NotImplementedError

    def _has_transforms(self) -> bool:
        return self.transforms is not None

    def _plot_spec(self) -> dict[str, Any]:
        return {}

    # -- composition --------------------------------------------------------------------------
    def __and__(self, other: GeoDataset) -> IntersectionDataset:
        """``a & b``: samples where both datasets have data, holding both products' keys."""
        if not isinstance(other, GeoDataset):
            return NotImplemented
        from pipekit.geo.composition import IntersectionDataset

        return IntersectionDataset(self, other)

    def __or__(self, other: GeoDataset) -> UnionDataset:
        """``a | b``: samples where either dataset has data, mosaicked first-valid."""
        if not isinstance(other, GeoDataset):
            return NotImplemented
        from pipekit.geo.composition import UnionDataset

        return UnionDataset(self, other)

    def to_crs(self, crs: Any = None, res: Any = None) -> GeoDataset:
        """A copy of this dataset in ``crs`` and/or at ``res`` (files are reprojected on read)."""
        target_crs = self._crs if crs is None else _to_crs(crs)
        target_res = self._res if res is None else _to_res(res)
        if crs is not None and res is None and target_crs != self._crs:
            target_res = _default_res(self._crs, target_crs, self._res, self.bounds)
        return self._retargeted(target_crs, target_res)

    # -- display --------------------------------------------------------------------------------
    def plot(self, sample: Sample, show_titles: bool = True, suptitle: str | None = None) -> Any:
        """Render a sample with matplotlib (the ``plot`` extra) and return the Figure.

        The image is shown as RGB from the product's ``rgb_bands`` (2-98
        percentile stretch), the mask with the product's colour map and a
        legend; a ``"prediction"`` key is shown beside the mask.
        """
        from pipekit.geo.plot import plot_sample

        return plot_sample(sample, show_titles=show_titles, suptitle=suptitle, **self._plot_spec())

    def __repr__(self) -> str:
        try:
            bounds = repr(self.bounds)
        except ValueError:
            bounds = "(empty)"
        return (
            f"{self.name}(crs={_crs_name(self._crs)}, res={self._res}, entries={len(self)}, bounds={bounds})"
        )


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
