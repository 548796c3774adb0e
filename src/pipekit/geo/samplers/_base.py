"""What every geo sampler shares: units, argument checks, the :class:`GeoSampler` base class, epochs.

:class:`GeoSampler` selects the footprints of a dataset's index within an
roi/toi (snapped inwards to whole pixels), draws one seed per epoch and
hands out boxes chunk by chunk through :class:`_SamplerIterator`, a
resumable iterator (its state is the epoch seed and the count yielded).
The helpers here (:func:`tile_to_chips`, ``_pair``, ``_rows_cols``...) are
the argument checks and grid arithmetic of the concrete samplers.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Iterator
from enum import Enum
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import Sampler

from pipekit.geo._bbox import BoundingBox, parse_query, slices_from_rows, to_timestamp
from pipekit.geo._index import GeoIndex
from pipekit.geo.samplers._time_windows import _time_window, time_windows
from pipekit.pipes.state import draw_seed

if TYPE_CHECKING:
    from pipekit.geo.samplers._pipe import GeoSamplerPipe

__all__ = ["Units", "GeoSampler", "BatchGeoSampler", "tile_to_chips", "get_random_bounding_box"]

# Tolerance, in pixels (or strides), for float noise in sizes and positions.
_TOL = 1e-6

# Boxes are generated in chunks of this many (vectorised), from one seed per chunk.
_CHUNK = 1024

_SEED_MASK = (1 << 64) - 1


class Units(str, Enum):
    """Units of a sampler's ``size`` and ``stride``: ``"pixels"`` (default) or ``"crs"``."""

    PIXELS = "pixels"
    CRS = "crs"


def _units(units: Any) -> Units:
    if isinstance(units, Units):
        return units
    if isinstance(units, Enum) and units.name in ("PIXELS", "CRS"):  # TorchGeo's own Units
        return Units[units.name]
    if isinstance(units, str):
        try:
            return Units(units.lower())
        except ValueError:
            pass
    raise ValueError(f'units must be "pixels" or "crs" (or a Units member), got {units!r}')


def _pair(value: Any, name: str, zero: bool = False) -> tuple[float, float]:
    """``value`` as ``(height, width)``, validated positive (or zero where ``zero``).

    Sizes in pixels need not be whole numbers (as in TorchGeo: ``4.5`` pixels
    is ``4.5 * res`` CRS units); a size of 0 is TorchGeo's patch of point data.
    """
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"{name} must be a number or a (height, width) pair, got {value!r}")
        items = list(value)
    else:
        items = [value, value]
    out = []
    for v in items:
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise TypeError(f"{name} must be a number or a (height, width) pair of numbers, got {value!r}")
        f = float(v)
        if not math.isfinite(f) or f < 0 or (f == 0 and not zero):
            raise ValueError(f"{name} must be {'zero or ' if zero else ''}positive and finite, got {value!r}")
        out.append(f)
    return out[0], out[1]


def _to_tuple(value: Any) -> tuple[Any, Any]:
    """TorchGeo's helper: ``value`` as ``(value, value)`` unless it already is a pair.

    Example:
        >>> _to_tuple(3), _to_tuple((2, 4.5))
        ((3, 3), (2, 4.5))
    """
    if isinstance(value, numbers.Real):
        return (value, value)
    return value


def _resolution(dataset: Any) -> tuple[float, float]:
    res = getattr(dataset, "res", None)
    if res is None:
        raise TypeError(f"a geo sampler needs a dataset with a .res attribute, got {type(dataset).__name__}")
    if isinstance(res, numbers.Real):
        res = (res, res)
    try:
        xres, yres = (float(r) for r in res)
    except (TypeError, ValueError):
        raise ValueError(f"dataset.res must be (xres, yres) or a number, got {res!r}") from None
    if not (math.isfinite(xres) and math.isfinite(yres) and xres > 0 and yres > 0):
        raise ValueError(f"dataset.res must be positive, got {res!r}")
    return xres, yres


def _roi(roi: Any) -> tuple[BoundingBox | None, Any]:
    """``(the roi's box, the roi's shapely geometry where it is not that box)``."""
    if roi is None or isinstance(roi, BoundingBox):
        return roi, None
    if isinstance(roi, tuple) and roi and all(isinstance(s, slice) for s in roi):
        return parse_query(roi, None)[0] if len(roi) == 3 else _slices_roi(roi), None
    if isinstance(roi, (tuple, list)) and len(roi) in (4, 6):
        return BoundingBox(*roi), None
    if hasattr(roi, "geom_type") and hasattr(roi, "bounds"):  # a shapely geometry (TorchGeo 0.8's roi)
        import shapely

        if roi.is_empty:
            raise ValueError("roi is an empty geometry")
        minx, miny, maxx, maxy = roi.bounds
        box = BoundingBox(minx, maxx, miny, maxy)
        exact = shapely.box(minx, miny, maxx, maxy).equals(roi)
        return box, None if exact else roi
    raise TypeError(
        "roi must be a shapely Polygon (TorchGeo 0.8), slices (x, y[, t]), a BoundingBox or "
        f"(minx, maxx, miny, maxy[, mint, maxt]), got {roi!r}"
    )


def _slices_roi(roi: tuple[slice, ...]) -> BoundingBox:
    x, y = roi
    return BoundingBox(x.start, x.stop, y.start, y.stop)


def _toi(toi: Any) -> tuple[float, float] | None:
    """A time of interest as ``(mint, maxt)`` POSIX seconds."""
    if toi is None:
        return None
    if isinstance(toi, BoundingBox):
        start, stop = toi.mint_s, toi.maxt_s
    elif isinstance(toi, slice):
        if toi.step is not None:
            raise ValueError(f"toi slice must not have a step, got {toi!r}")
        start, stop = toi.start, toi.stop
    elif hasattr(toi, "left") and hasattr(toi, "right"):  # pandas.Interval
        start, stop = toi.left, toi.right
    elif isinstance(toi, (tuple, list)) and len(toi) == 2:
        start, stop = toi
    else:
        raise TypeError(f"toi must be a (start, stop) pair, a slice or a pandas.Interval, got {toi!r}")
    mint = -math.inf if start is None else to_timestamp(start)
    maxt = math.inf if stop is None else to_timestamp(stop)
    if mint > maxt:
        raise ValueError(f"toi starts after it ends: {toi!r}")
    return mint, maxt


def _generator(generator: Any, seed: Any) -> torch.Generator | None:
    if seed is not None:
        if generator is not None:
            raise ValueError("pass either generator= or seed=, not both")
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise TypeError(f"seed must be an int, got {seed!r}")
        return torch.Generator().manual_seed(int(seed) & ((1 << 63) - 1))
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    return generator


def _rows_cols(extent: np.ndarray, size: float, stride: float) -> np.ndarray:
    """TorchGeo's ``ceil((extent - size) / stride) + 1``, robust to float noise, at least 1."""
    n = np.ceil((extent - size) / stride - _TOL) + 1
    return np.maximum(n, 1).astype(np.int64)


def _extent_of(bounds: Any) -> tuple[float, float, float, float]:
    """``(xmin, ymin, xmax, ymax)`` of TorchGeo 0.8's tuple, slices or a :class:`BoundingBox`."""
    if isinstance(bounds, BoundingBox):
        return bounds.minx, bounds.miny, bounds.maxx, bounds.maxy
    if isinstance(bounds, tuple) and len(bounds) >= 2 and all(isinstance(s, slice) for s in bounds):
        return float(bounds[0].start), float(bounds[1].start), float(bounds[0].stop), float(bounds[1].stop)
    try:
        xmin, ymin, xmax, ymax = (float(v) for v in bounds)
    except (TypeError, ValueError):
        raise TypeError(f"bounds must be (xmin, ymin, xmax, ymax), slices or a BoundingBox, got {bounds!r}") from None
    return xmin, ymin, xmax, ymax


def tile_to_chips(
    bounds: Any, size: tuple[float, float], stride: tuple[float, float] | None = None
) -> tuple[int, int]:
    """Rows and columns of ``size`` patches, ``stride`` apart, that cover ``bounds`` (TorchGeo's helper).

    ``ceil((extent - size) / stride) + 1`` along each axis (tolerant of float
    noise).  ``bounds`` is TorchGeo 0.8's ``(xmin, ymin, xmax, ymax)``, or
    slices ``(x, y[, t])``, or a :class:`~pipekit.geo.BoundingBox`.

    Example:
        >>> from pipekit.samplers import tile_to_chips
        >>> tile_to_chips((0, 0, 100, 50), (10, 10))
        (5, 10)
        >>> tile_to_chips((0, 0, 100, 50), (10, 10), (8, 8))
        (6, 13)
    """
    if stride is None:
        stride = size
    if stride[0] <= 0 or stride[1] <= 0:
        raise ValueError(f"stride must be positive, got {stride!r}")
    xmin, ymin, xmax, ymax = _extent_of(bounds)
    rows = _rows_cols(np.array([ymax - ymin]), size[0], stride[0])[0]
    cols = _rows_cols(np.array([xmax - xmin]), size[1], stride[1])[0]
    return int(rows), int(cols)


def get_random_bounding_box(
    bounds: Any,
    size: tuple[float, float] | float,
    res: tuple[float, float] | float,
    generator: torch.Generator | None = None,
) -> tuple[slice, slice]:
    """A random ``size`` box within ``bounds``, a whole number of pixels from its corner (TorchGeo 0.8's helper).

    The same draws as TorchGeo's: one ``torch.rand`` for x, then one for y,
    from ``generator``; the offset is ``int(u * (extent - size) / res)``
    pixels from ``(xmin, ymin)`` (so, as in TorchGeo, the last possible
    offset is never drawn; pipekit's samplers draw every one).  ``size`` and
    ``res`` are in CRS units, ``(height, width)`` and ``(xres, yres)``.

    Returns:
        ``(slice(xmin, xmax), slice(ymin, ymax))``.

    Example:
        >>> import torch
        >>> x, y = get_random_bounding_box((0, 0, 100, 100), 10, 1, torch.Generator().manual_seed(0))
        >>> x.stop - x.start, y.stop - y.start
        (10.0, 10.0)
    """
    xmin, ymin, xmax, ymax = _extent_of(bounds)
    height, width = (size, size) if isinstance(size, numbers.Real) else size
    xres, yres = (res, res) if isinstance(res, numbers.Real) else res
    span_x = (xmax - xmin - width) / xres
    span_y = (ymax - ymin - height) / yres
    xmin += int(torch.rand(1, generator=generator).item() * span_x) * xres
    ymin += int(torch.rand(1, generator=generator).item() * span_y) * yres
    return slice(float(xmin), float(xmin + width)), slice(float(ymin), float(ymin + height))


def _boxes(b: np.ndarray) -> list[tuple[slice, slice, slice]]:
    """TorchGeo 0.8's ``(slice x, slice y, slice t)`` queries from the rows of an ``[n, 6]`` array."""
    return slices_from_rows(b)


def dataset_index(dataset: Any) -> GeoIndex:
    """The :class:`GeoIndex` a sampler draws from: ``dataset.geo_index``, or ``dataset.index`` when it is one.

    A TorchGeo-style ``GeoDataFrame`` index (a TorchGeo dataset, or a
    stand-in) is converted.
    """
    index = getattr(dataset, "geo_index", None)
    if isinstance(index, GeoIndex):
        return index
    index = getattr(dataset, "index", None)
    if isinstance(index, GeoIndex):
        return index
    from pipekit.geo._frame import index_from_frame, is_frame

    if is_frame(index):
        return index_from_frame(index)
    raise TypeError(
        f"a geo sampler needs a geo dataset (with a GeoIndex .geo_index or a GeoDataFrame .index), "
        f"got {type(dataset).__name__}"
    )


class GeoSampler(Sampler[tuple[slice, slice, slice]]):
    """Base class of the samplers: footprints within the roi/toi, epochs, resumable iterators.

    Subclasses implement ``__len__`` and ``_chunk(seed, c)`` (the boxes at
    positions ``c * 1024 ...`` of an epoch drawn with ``seed``), and set
    ``random``; or, as TorchGeo's, ``__iter__`` (``GeoSampler`` itself is
    abstract).

    Where nothing can be sampled (the roi or toi meets no footprint, the roi
    covers no whole pixel of one, no footprint is large enough for a patch)
    the sampler yields nothing, as TorchGeo's, and warns saying why (also in
    ``empty_reason``).

    Attributes:
        res: ``(xres, yres)`` of the dataset.
        roi: the region of interest as TorchGeo 0.8 has it, a shapely
            ``Polygon`` (the dataset's total bounds by default).
        roi_box: the roi's bounding :class:`~pipekit.geo.BoundingBox` (with
            the time interval of a ``BoundingBox`` roi).
        index: TorchGeo 0.8's ``GeoDataFrame`` of the footprints sampled
            from (clipped to the roi/toi), built on first use.
        toi: the time of interest as ``(mint, maxt)`` seconds, or ``None``.
        hits: indices (into ``dataset.index``) of the footprints sampled from.
        footprints: ``[len(hits), 6]`` array of those footprints, clipped to
            the roi/toi.
        skipped: indices (into ``dataset.index``) of footprints within the
            roi that are too small for one patch.
        generator: the ``torch.Generator`` epochs draw their seed from
            (``None``: torch's global RNG).
    """

    random: bool = False
    #: why the sampler yields nothing (the roi meets no footprint...), ``None`` when it yields something
    empty_reason: str | None = None

    def __new__(cls, *args: Any, **kwargs: Any) -> GeoSampler:
        if cls in (GeoSampler, BatchGeoSampler):
            raise TypeError(
                f"Can't instantiate abstract class {cls.__name__}: subclass it (implement __iter__ and __len__) "
                "or use one of the samplers"
            )
        return super().__new__(cls)

    def __init__(self, dataset: Any, roi: Any = None, toi: Any = None) -> None:
        index = dataset_index(dataset)
        self.res = _resolution(dataset)
        roi_box, roi_shape = _roi(roi)
        self.toi = _toi(toi)
        if len(index) == 0:
            raise ValueError(f"cannot sample from an empty dataset ({type(dataset).__name__} has no footprints)")
        total = index.total_bounds
        self.roi_box = roi_box if roi_box is not None else total
        self._roi_shape = roi if roi_shape is not None else None
        self._crs = getattr(dataset, "crs", None)
        self.generator: torch.Generator | None = None
        self.skipped = np.empty(0, dtype=np.int64)
        self.hits = np.empty(0, dtype=np.int64)
        self.footprints = np.empty((0, 6))

        query = self.roi_box
        if self.toi is not None:
            mint, maxt = max(query.mint_s, self.toi[0]), min(query.maxt_s, self.toi[1])
            if mint > maxt:
                self._nothing(f"the roi's time interval and the toi do not overlap: {query!r}, toi {toi!r}")
                return
            query = query.with_time(mint, maxt)
        if roi_box is None and self.toi is None:
            hits = np.arange(len(index), dtype=np.int64)
        else:
            hits = index.query(query)
        if len(hits) == 0:
            what = "roi/toi" if roi_box is not None and self.toi is not None else ("roi" if roi_box else "toi")
            self._nothing(
                f"the {what} does not intersect any footprint of the dataset: {what} "
                f"{query if roi_box is not None else toi!r}, dataset bounds {total!r}"
            )
            return
        orig = index.bounds[hits]
        b = orig.copy()
        b[:, 0::2] = np.maximum(b[:, 0::2], [query.minx, query.miny, query.mint_s])
        b[:, 1::2] = np.minimum(b[:, 1::2], [query.maxx, query.maxy, query.maxt_s])
        # footprints whose time interval only touches the roi's/toi's (a single instant of a longer one)
        keep = ~((b[:, 4] == b[:, 5]) & (orig[:, 4] < orig[:, 5]))
        hits, orig, b = hits[keep], orig[keep], b[keep]
        if len(hits) == 0:
            self._nothing(
                f"the toi only touches the time intervals of the dataset's footprints at their ends: "
                f"toi {toi!r}, roi {roi_box!r}"
            )
            return
        if roi_shape is not None:
            b = self._clip_to_shape(orig, b, roi_shape)
            keep = ~np.isnan(b).any(axis=1)
            hits, orig, b = hits[keep], orig[keep], b[keep]
        if roi_box is not None:
            b = self._snap_inwards(orig, b)
            keep = (b[:, 0] <= b[:, 1]) & (b[:, 2] <= b[:, 3])
            # footprints that only touch the roi (a zero-width or zero-height sliver of a box with area)
            keep &= ~((b[:, 0] == b[:, 1]) & (orig[:, 0] < orig[:, 1]))
            keep &= ~((b[:, 2] == b[:, 3]) & (orig[:, 2] < orig[:, 3]))
            hits, b = hits[keep], b[keep]
            if len(hits) == 0:
                self._nothing(
                    f"the roi covers no whole pixel of any footprint of the dataset: roi {roi_box!r}, "
                    f"dataset bounds {total!r}, res {self.res}"
                )
                return
        self.hits = hits
        self.footprints = b

    def _nothing(self, reason: str) -> None:
        """No footprint to sample: this sampler yields nothing (as TorchGeo's), and says why (``empty_reason``)."""
        self.empty_reason = reason
        warnings.warn(f"{type(self).__name__} yields nothing: {reason}", UserWarning, stacklevel=4)

    @property
    def roi(self) -> Any:
        """The region of interest, a shapely ``Polygon`` (TorchGeo 0.8's ``sampler.roi``)."""
        if self._roi_shape is not None:
            return self._roi_shape
        import shapely

        b = self.roi_box
        return shapely.box(b.minx, b.miny, b.maxx, b.maxy)

    @property
    def index(self) -> Any:
        """TorchGeo 0.8's ``sampler.index``: a ``GeoDataFrame`` of the footprints sampled from, clipped."""
        cached = self.__dict__.get("_frame")
        if cached is None or cached[0] is not self.footprints:
            from pipekit.geo._frame import frame_from_index

            crs = self._crs.to_wkt() if hasattr(self._crs, "to_wkt") else self._crs
            frame = frame_from_index(GeoIndex(self.footprints), crs)
            cached = self.__dict__["_frame"] = (self.footprints, frame)
        return cached[1]

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_frame", None)  # rebuilt on demand
        return state

    @staticmethod
    def _clip_to_shape(orig: np.ndarray, b: np.ndarray, shape: Any) -> np.ndarray:
        """The bounds of each footprint's part inside a non-rectangular roi (NaN rows where there is none)."""
        import shapely

        parts = shapely.intersection(shapely.box(orig[:, 0], orig[:, 2], orig[:, 1], orig[:, 3]), shape)
        bounds = shapely.bounds(parts)  # xmin, ymin, xmax, ymax; NaN for empty parts
        out = b.copy()
        out[:, 0] = np.maximum(b[:, 0], bounds[:, 0])
        out[:, 1] = np.minimum(b[:, 1], bounds[:, 2])
        out[:, 2] = np.maximum(b[:, 2], bounds[:, 1])
        out[:, 3] = np.minimum(b[:, 3], bounds[:, 3])
        out[np.isnan(bounds).any(axis=1)] = np.nan
        return out

    def _snap_inwards(self, orig: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Move the clipped sides of footprints inwards onto their own pixel grid (origin minx, maxy)."""
        xres, yres = self.res
        b = b.copy()
        left = b[:, 0] > orig[:, 0]
        b[left, 0] = orig[left, 0] + np.ceil((b[left, 0] - orig[left, 0]) / xres - _TOL) * xres
        right = b[:, 1] < orig[:, 1]
        b[right, 1] = orig[right, 0] + np.floor((b[right, 1] - orig[right, 0]) / xres + _TOL) * xres
        top = b[:, 3] < orig[:, 3]
        b[top, 3] = orig[top, 3] - np.ceil((orig[top, 3] - b[top, 3]) / yres - _TOL) * yres
        bottom = b[:, 2] > orig[:, 2]
        b[bottom, 2] = orig[bottom, 3] - np.floor((orig[bottom, 3] - b[bottom, 2]) / yres + _TOL) * yres
        return b

    def _keep_fitting(self, size: tuple[float, float]) -> None:
        """Drop (and record in ``skipped``) the footprints smaller than a ``size`` patch."""
        h, w = size
        xres, yres = self.res
        b = self.footprints
        fits = (b[:, 1] - b[:, 0] >= w - _TOL * xres) & (b[:, 3] - b[:, 2] >= h - _TOL * yres)
        self.skipped = self.hits[~fits]
        self.hits, self.footprints = self.hits[fits], b[fits]
        if len(self.hits) == 0 and len(b):
            widths, heights = b[:, 1] - b[:, 0], b[:, 3] - b[:, 2]
            self._nothing(
                f"no footprint of the dataset (within the roi) is large enough for a patch of "
                f"{h:g} x {w:g} CRS units (height x width); the largest footprint is "
                f"{heights.max():g} x {widths.max():g}"
            )

    def _apply_time_window(self, window: Any) -> None:
        """Replace the footprints by one row per place and time window (see :func:`time_windows`)."""
        self.time_window = _time_window(window)
        if self.time_window is None or len(self.footprints) == 0:
            return
        rows, source = time_windows(self.footprints, self.time_window, cover=not self.random)
        size = getattr(self, "size", None)
        if size is not None:  # a place's box (where all its scenes are) may be smaller than its footprints
            fits = (rows[:, 1] - rows[:, 0] >= size[1] - _TOL * self.res[0]) & (
                rows[:, 3] - rows[:, 2] >= size[0] - _TOL * self.res[1])
            rows, source = rows[fits], source[fits]
        if len(rows) == 0:
            raise ValueError(
                f"no place in the dataset (within the roi/toi) has {self.time_window} scenes for time_window="
                f"{window!r}; a place is a group of footprints overlapping by half or more, its scenes their dates"
            )
        self.hits, self.footprints = self.hits[source], rows

    # epochs -----------------------------------------------------------------------
    def _epoch_seed(self) -> int:
        """A new epoch's seed, drawn from ``generator`` (or torch's global RNG)."""
        return draw_seed(self.generator) & _SEED_MASK

    def _chunk(self, seed: int | None, c: int) -> list[Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _chunk_rng(self, seed: int | None, c: int) -> np.random.Generator:
        if seed is None:
            raise RuntimeError(f"{type(self).__name__} needs an epoch seed")
        return np.random.default_rng([c, seed & _SEED_MASK])

    def __iter__(self) -> Iterator[Any]:
        """One epoch of boxes; the iterator has ``state_dict``/``load_state_dict``."""
        seed = self._epoch_seed() if self.random else None
        state = self.generator.get_state() if self.generator is not None and self.random else None
        return _SamplerIterator(self, seed, 0, state)

    def __len__(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def as_pipe(self) -> GeoSamplerPipe:
        """This sampler's boxes as a resumable pipe (see :class:`GeoSamplerPipe`)."""
        from pipekit.geo.samplers._pipe import GeoSamplerPipe

        return GeoSamplerPipe(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self.hits)} footprints, {len(self)} items per epoch)"


class BatchGeoSampler(GeoSampler):
    """Base class of samplers that yield lists of boxes (use as ``batch_sampler=``)."""


class _SamplerIterator(Iterator[Any]):
    """One epoch of a sampler from a position; resumable (torchdata's ``Stateful`` protocol)."""

    def __init__(self, sampler: GeoSampler, seed: int | None, start: int, generator_state: Any) -> None:
        self.sampler = sampler
        self.seed = seed
        self.length = len(sampler)
        self.pos = start
        self.generator_state = generator_state
        self._chunk_id = -1
        self._items: list[Any] = []

    def __iter__(self) -> _SamplerIterator:
        return self

    def __next__(self) -> Any:
        if self.pos >= self.length:
            raise StopIteration
        c, offset = divmod(self.pos, _CHUNK)
        if c != self._chunk_id:
            self._items = self.sampler._chunk(self.seed, c)
            self._chunk_id = c
        self.pos += 1
        return self._items[offset]

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "yielded": self.pos, "generator": self.generator_state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seed = state["seed"]
        self.pos = int(state["yielded"])
        self._chunk_id = -1
        gen_state = state.get("generator")
        if gen_state is not None and self.sampler.generator is not None:
            self.sampler.generator.set_state(gen_state)
            self.generator_state = gen_state
