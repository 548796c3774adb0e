"""Query boxes: TorchGeo 0.8's slices ``(slice x, slice y, slice t)`` and pipekit's :class:`BoundingBox`.

TorchGeo 0.8 indexes geo datasets with slices, ``dataset[x0:x1, y0:y1, t0:t1]``
(a :data:`GeoSlice`), and reports ``dataset.bounds``, sampler items and
``sample["bounds"]`` as ``(slice(minx, maxx), slice(miny, maxy), slice(mint,
maxt))`` tuples, times as :class:`pandas.Timestamp`.  pipekit does the same;
inside, a query is a :class:`BoundingBox` (floats, times in POSIX seconds),
which is also accepted as a query.  This module converts between the two:

* :func:`to_slices`: a box as a 3-slice tuple (times as ``pandas.Timestamp``,
  open ends as ``Timestamp.min``/``Timestamp.max``, as TorchGeo);
* :func:`parse_query`: any query (box, slices, partial slices, steps) as a box,
  the resolution its steps ask for and the resolved slices;
* :class:`Bounds`: the type of ``dataset.bounds``, a 3-slice tuple that also
  answers BoundingBox's attribute names (``.minx`` ...) for older pipekit code.

Importing this module allows these types in ``torch.load(..., weights_only=True)``
(:func:`torch.serialization.add_safe_globals`), so checkpoints of pipelines whose
buffers hold queries (a shuffle after a sampler pipe) load safely.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from typing import Any, NamedTuple, TypeAlias

import numpy as np
import pandas as pd
import torch

__all__ = [
    "BoundingBox",
    "Bounds",
    "GeoSlice",
    "GeoSlices",
    "to_timestamp",
    "to_time",
    "to_slices",
    "from_slices",
    "parse_query",
    "MIN_TIME",
    "MAX_TIME",
]

MIN_TIME = -math.inf
MAX_TIME = math.inf

#: TorchGeo 0.8's query type: ``x0:x1:xres``, optionally ``, y0:y1:yres`` and ``, t0:t1:tres``.
GeoSlice: TypeAlias = slice | tuple[slice] | tuple[slice, slice] | tuple[slice, slice, slice]


class GeoSlices(NamedTuple):
    """``(slice x, slice y, slice t)``: a sampler item or ``sample["bounds"]``, TorchGeo 0.8's 3-slice tuple.

    A tuple (``x, y, t = query``, ``query[0].start``, equal to the plain tuple
    of the same slices, printed like one) whose parts are also named.  Being
    a named tuple, it stays a tuple through ``torch.utils.data``'s
    ``default_convert`` (a DataLoader with ``batch_size=None``), which turns
    plain tuples into lists.

    Example:
        >>> q = GeoSlices(slice(0.0, 10.0), slice(5.0, 15.0), slice(None, None))
        >>> q == (slice(0.0, 10.0), slice(5.0, 15.0), slice(None, None)), q.x.stop
        (True, 10.0)
        >>> q
        (slice(0.0, 10.0, None), slice(5.0, 15.0, None), slice(None, None, None))
    """

    x: slice
    y: slice
    t: slice

    def __repr__(self) -> str:
        return tuple.__repr__(self)


def to_timestamp(t: Any) -> float:
    """Seconds since the POSIX epoch (UTC) for a number, ``datetime``, ``date``, numpy or pandas time.

    Naive datetimes are taken as UTC.  ``None`` is not accepted: pass
    ``MIN_TIME``/``MAX_TIME`` for open intervals.
    """
    if isinstance(t, bool):
        raise TypeError(f"not a time: {t!r}")
    if isinstance(t, (int, float)):
        return float(t)
    if isinstance(t, pd.Timestamp):
        return _timestamp_seconds(t)
    if isinstance(t, datetime):
        if t.tzinfo is None:
            t = t.replace(tzinfo=timezone.utc)
        return t.timestamp()
    if isinstance(t, date):
        return datetime(t.year, t.month, t.day, tzinfo=timezone.utc).timestamp()
    if hasattr(t, "timestamp") and callable(t.timestamp):  # pandas.Timestamp
        return to_timestamp(t.to_pydatetime()) if hasattr(t, "to_pydatetime") else float(t.timestamp())
    try:
        import numpy as np

        if isinstance(t, np.datetime64):
            return float(t.astype("datetime64[us]").astype("int64")) / 1e6
        if isinstance(t, np.generic):
            return float(t)
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    raise TypeError(f"not a time (number of seconds, datetime, date or datetime64): {t!r}")


def _num(v: float) -> str:
    """A coordinate as TorchGeo's messages print it (``1``, not ``1.0``)."""
    return str(int(v)) if v.is_integer() and abs(v) < 1e15 else str(v)


@dataclass(frozen=True, slots=True, init=False, repr=False)
class BoundingBox:
    """An axis-aligned box in space and time: ``(minx, maxx, miny, maxy, mint, maxt)``, TorchGeo's type.

    Coordinates are in the units of the dataset's CRS.  Times are given as
    anything :func:`to_timestamp` accepts (``datetime``, ``pandas.Timestamp``,
    POSIX seconds) and read back as TorchGeo 0.8 gives them: :attr:`mint` and
    :attr:`maxt` are :class:`pandas.Timestamp` (a ``datetime``; open ends
    ``Timestamp.min``/``Timestamp.max``), and the box iterates and indexes
    like TorchGeo's.  :attr:`mint_s` and :attr:`maxt_s` are the same times in
    POSIX seconds (UTC; ``-inf``/``inf`` when open, the defaults), what
    pipekit computes with.  Boxes are validated on creation (finite
    coordinates, ``min <= max``).

    Example:
        >>> from datetime import datetime
        >>> from pipekit.geo import BoundingBox
        >>> a = BoundingBox(0, 10, 0, 10)
        >>> b = BoundingBox(5, 15, 5, 15)
        >>> a.intersects(b), (a & b).area, (a | b).area
        (True, 25.0, 225.0)
        >>> left, right = a.split(0.3)
        >>> left.maxx, right.minx
        (3.0, 3.0)
        >>> day = BoundingBox(0, 1, 0, 1, datetime(2025, 4, 24), datetime(2025, 4, 25))
        >>> day.mint, day.maxt_s - day.mint_s, day.volume
        (Timestamp('2025-04-24 00:00:00'), 86400.0, datetime.timedelta(days=1))
    """

    minx: float
    maxx: float
    miny: float
    maxy: float
    #: the start in POSIX seconds (UTC; ``-inf``: open)
    mint_s: float
    #: the end in POSIX seconds (UTC; ``inf``: open)
    maxt_s: float

    def __init__(self, minx: float, maxx: float, miny: float, maxy: float,
                 mint: Any = MIN_TIME, maxt: Any = MAX_TIME) -> None:
        setattr_ = object.__setattr__
        for name, value in (("minx", minx), ("maxx", maxx), ("miny", miny), ("maxy", maxy)):
            try:
                value = float(value)
            except (TypeError, ValueError):
                raise TypeError(f"BoundingBox.{name} must be a number, got {value!r}") from None
            if not math.isfinite(value):
                raise ValueError(f"BoundingBox.{name} must be finite, got {value}")
            setattr_(self, name, value)
        for name, value in (("mint_s", mint), ("maxt_s", maxt)):
            value = to_timestamp(value)
            if math.isnan(value):
                raise ValueError(f"BoundingBox.{name[:4]} must not be NaN")
            setattr_(self, name, value)
        # TorchGeo's messages
        if self.minx > self.maxx:
            raise ValueError(f"Bounding box is invalid: 'minx={_num(self.minx)}' > 'maxx={_num(self.maxx)}'")
        if self.miny > self.maxy:
            raise ValueError(f"Bounding box is invalid: 'miny={_num(self.miny)}' > 'maxy={_num(self.maxy)}'")
        if self.mint_s > self.maxt_s:
            raise ValueError(f"Bounding box is invalid: 'mint={self.mint}' > 'maxt={self.maxt}'")

    # times as TorchGeo gives them ---------------------------------------------------
    @property
    def mint(self) -> pd.Timestamp:
        """The start, a :class:`pandas.Timestamp` (``Timestamp.min`` when open); :attr:`mint_s` in seconds."""
        return to_time(self.mint_s)

    @property
    def maxt(self) -> pd.Timestamp:
        """The end, a :class:`pandas.Timestamp` (``Timestamp.max`` when open); :attr:`maxt_s` in seconds."""
        return to_time(self.maxt_s)

    # tuple-like behaviour (TorchGeo's: times as Timestamps) ---------------------------
    def __iter__(self):
        return iter((self.minx, self.maxx, self.miny, self.maxy, self.mint, self.maxt))

    def __getitem__(self, index: int | slice) -> Any:
        """TorchGeo's: an item of ``(minx, maxx, miny, maxy, mint, maxt)``, or a list for a slice."""
        return list(self)[index]

    def __len__(self) -> int:
        return 6

    def seconds(self) -> tuple[float, float, float, float, float, float]:
        """``(minx, maxx, miny, maxy, mint_s, maxt_s)``: the box as numbers (times in POSIX seconds)."""
        return (self.minx, self.maxx, self.miny, self.maxy, self.mint_s, self.maxt_s)

    # geometry ---------------------------------------------------------------
    @property
    def width(self) -> float:
        return self.maxx - self.minx

    @property
    def height(self) -> float:
        return self.maxy - self.miny

    @property
    def area(self) -> float:
        """Spatial area (CRS units squared)."""
        return self.width * self.height

    @property
    def volume(self) -> Any:
        """Area times duration, a :class:`~datetime.timedelta` as TorchGeo's (``inf`` for an open time interval)."""
        duration = self.maxt_s - self.mint_s
        if not math.isfinite(duration):
            return math.inf if self.area else 0.0
        return self.area * timedelta(microseconds=round(duration * 1e6))

    def intersects(self, other: BoundingBox, spatial_only: bool = False) -> bool:
        """Whether the boxes share at least a point (touching edges count)."""
        spatial = (
            self.minx <= other.maxx
            and self.maxx >= other.minx
            and self.miny <= other.maxy
            and self.maxy >= other.miny
        )
        if spatial_only or not spatial:
            return spatial
        return self.mint_s <= other.maxt_s and self.maxt_s >= other.mint_s

    def contains(self, other: BoundingBox) -> bool:
        """Whether ``other`` lies entirely inside this box."""
        return (
            self.minx <= other.minx
            and self.maxx >= other.maxx
            and self.miny <= other.miny
            and self.maxy >= other.maxy
            and self.mint_s <= other.mint_s
            and self.maxt_s >= other.maxt_s
        )

    def __contains__(self, other: object) -> bool:
        return isinstance(other, BoundingBox) and self.contains(other)

    def __and__(self, other: BoundingBox) -> BoundingBox:
        """The intersection; ``ValueError`` when the boxes do not intersect."""
        if not isinstance(other, BoundingBox):
            return NotImplemented
        if not self.intersects(other):
            raise ValueError(f"Bounding boxes {self} and {other} do not overlap")
        return BoundingBox(
            max(self.minx, other.minx),
            min(self.maxx, other.maxx),
            max(self.miny, other.miny),
            min(self.maxy, other.maxy),
            max(self.mint_s, other.mint_s),
            min(self.maxt_s, other.maxt_s),
        )

    def __or__(self, other: BoundingBox) -> BoundingBox:
        """The smallest box containing both."""
        if not isinstance(other, BoundingBox):
            return NotImplemented
        return BoundingBox(
            min(self.minx, other.minx),
            max(self.maxx, other.maxx),
            min(self.miny, other.miny),
            max(self.maxy, other.maxy),
            min(self.mint_s, other.mint_s),
            max(self.maxt_s, other.maxt_s),
        )

    def split(self, proportion: float, horizontal: bool = True) -> tuple[BoundingBox, BoundingBox]:
        """Cut into two boxes at ``proportion`` of the width (or of the height if not ``horizontal``)."""
        if not 0.0 < proportion < 1.0:
            raise ValueError(f"Input proportion must be between 0 and 1 (exclusive), got {proportion}")
        t0, t1 = self.mint_s, self.maxt_s
        if horizontal:
            cut = self.minx + self.width * proportion
            return (
                BoundingBox(self.minx, cut, self.miny, self.maxy, t0, t1),
                BoundingBox(cut, self.maxx, self.miny, self.maxy, t0, t1),
            )
        cut = self.miny + self.height * proportion
        return (
            BoundingBox(self.minx, self.maxx, self.miny, cut, t0, t1),
            BoundingBox(self.minx, self.maxx, cut, self.maxy, t0, t1),
        )

    def with_time(self, mint: Any = MIN_TIME, maxt: Any = MAX_TIME) -> BoundingBox:
        """The same spatial box with another time interval."""
        return BoundingBox(self.minx, self.maxx, self.miny, self.maxy, mint, maxt)

    def __repr__(self) -> str:
        def t(v: float) -> str:
            if math.isinf(v):
                return "-inf" if v < 0 else "inf"
            try:
                return datetime.fromtimestamp(v, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            except (ValueError, OverflowError, OSError):  # before year 1 or after 9999: seconds, as stored
                return f"{v:.6g}s"

        return (
            f"BoundingBox(minx={self.minx:.6g}, maxx={self.maxx:.6g}, miny={self.miny:.6g}, "
            f"maxy={self.maxy:.6g}, mint={t(self.mint_s)}, maxt={t(self.maxt_s)})"
        )


#: Seconds of recently converted Timestamps: a sampler's boxes share a few times (each sample converts two, ~7 µs
#: each, against a dict lookup's 0.2 µs).  Equal Timestamps are the same instant, so they have the same seconds.
_SECONDS: dict[pd.Timestamp, float] = {}
_SECONDS_MAX = 256


def _timestamp_seconds(t: pd.Timestamp) -> float:
    """POSIX seconds of a Timestamp (naive: UTC); ``Timestamp.min``/``max`` (TorchGeo's open ends) are -inf/inf."""
    seconds = _SECONDS.get(t)
    if seconds is None:
        seconds = _convert_timestamp(t)
        if len(_SECONDS) >= _SECONDS_MAX:
            _SECONDS.clear()
        _SECONDS[t] = seconds
    return seconds


def _convert_timestamp(t: pd.Timestamp) -> float:
    if t.tzinfo is not None:
        t = t.tz_convert("UTC").tz_localize(None)
    if t <= pd.Timestamp.min:
        return -math.inf
    if t >= pd.Timestamp.max:
        return math.inf
    return float(t.to_datetime64().astype("datetime64[us]").astype(np.int64)) / 1e6


def to_time(seconds: float) -> pd.Timestamp:
    """A POSIX time (seconds, UTC) as a naive :class:`pandas.Timestamp` to the microsecond, TorchGeo's time type.

    ``-inf`` and ``inf`` (open intervals) become ``Timestamp.min`` and
    ``Timestamp.max``, as TorchGeo marks files without a date.

    Example:
        >>> to_time(1690243200.0), to_time(-math.inf) == pd.Timestamp.min
        (Timestamp('2023-07-25 00:00:00'), True)
    """
    if seconds == -math.inf:
        return pd.Timestamp.min
    if seconds == math.inf:
        return pd.Timestamp.max
    return pd.Timestamp(round(seconds * 1e6), unit="us")


class _TimeCache(dict):
    """``to_time`` memoised over one batch of conversions (a sampler's boxes share few distinct times)."""

    def __missing__(self, seconds: float) -> pd.Timestamp:
        value = self[seconds] = to_time(seconds)
        return value


def to_slices(bbox: BoundingBox, res: tuple[float, float] | None = None, *,
              _times: dict[float, pd.Timestamp] | None = None) -> GeoSlices:
    """``bbox`` as TorchGeo 0.8's ``(slice(minx, maxx), slice(miny, maxy), slice(mint, maxt))``.

    Times become :class:`pandas.Timestamp` (:func:`to_time`).  With ``res``,
    the x and y slices carry it as their step (``dataset.bounds`` does, with a
    time step of 1, as TorchGeo); otherwise no step (sampler items).

    Example:
        >>> to_slices(BoundingBox(0, 10, 20, 30, 1690243200, 1690329599.999999))
        (slice(0.0, 10.0, None), slice(20.0, 30.0, None), slice(Timestamp('2023-07-25 00:00:00'), \
Timestamp('2023-07-25 23:59:59.999999'), None))
    """
    times = _times if _times is not None else _TimeCache()
    mint, maxt = times[bbox.mint_s], times[bbox.maxt_s]
    if res is None:
        return GeoSlices(slice(bbox.minx, bbox.maxx), slice(bbox.miny, bbox.maxy), slice(mint, maxt))
    return GeoSlices(slice(bbox.minx, bbox.maxx, res[0]), slice(bbox.miny, bbox.maxy, res[1]), slice(mint, maxt, 1))


def slices_from_rows(rows: np.ndarray) -> list[GeoSlices]:
    """:func:`to_slices` of each row ``(minx, maxx, miny, maxy, mint, maxt)`` of an ``[n, 6]`` array."""
    times = _TimeCache()
    out = []
    for minx, maxx, miny, maxy, mint, maxt in rows.tolist():
        out.append(GeoSlices(slice(minx, maxx), slice(miny, maxy), slice(times[mint], times[maxt])))
    return out


class Bounds(GeoSlices):
    """``dataset.bounds``: TorchGeo 0.8's ``(slice(minx, maxx, xres), slice(miny, maxy, yres), slice(mint, maxt, 1))``.

    A tuple of three slices (``x, y, t = dataset.bounds``,
    ``dataset.bounds[0].start``, ``dataset[dataset.bounds]``), times as
    :class:`pandas.Timestamp`.  It also answers :class:`BoundingBox`'s
    attribute names (``minx``, ``maxx``, ``miny``, ``maxy``, ``width``,
    ``height``, ``area``; ``mint``/``maxt`` in POSIX seconds) for code written
    for pipekit's earlier ``BoundingBox`` bounds, and :attr:`bbox` is the box.

    Example:
        >>> b = Bounds.from_bbox(BoundingBox(0, 100, 0, 50), (10.0, 10.0))
        >>> x, y, t = b
        >>> x, b.maxy, t.start == pd.Timestamp.min
        (slice(0.0, 100.0, 10.0), 50.0, True)
    """

    __slots__ = ()

    @classmethod
    def from_bbox(cls, bbox: BoundingBox, res: tuple[float, float]) -> Bounds:
        return cls(*to_slices(bbox, res))

    @property
    def bbox(self) -> BoundingBox:
        """The same extent as a :class:`BoundingBox`."""
        return parse_query(tuple(self), None)[0]

    minx = property(lambda self: self.bbox.minx)
    maxx = property(lambda self: self.bbox.maxx)
    miny = property(lambda self: self.bbox.miny)
    maxy = property(lambda self: self.bbox.maxy)
    mint = property(lambda self: self.bbox.mint_s)  # seconds, as pipekit's earlier bounds
    maxt = property(lambda self: self.bbox.maxt_s)
    width = property(lambda self: self.bbox.width)
    height = property(lambda self: self.bbox.height)
    area = property(lambda self: self.bbox.area)


def _is_slices(key: Any) -> bool:
    # a list too: torch's DataLoader (batch_size=None) turns tuples in samples into lists
    return isinstance(key, slice) or (
        isinstance(key, (tuple, list)) and 1 <= len(key) <= 3 and all(isinstance(k, slice) for k in key)
    )


def _query_error(key: Any) -> TypeError:
    return TypeError(
        "a geo dataset is indexed by a BoundingBox or by slices dataset[x0:x1, y0:y1, t0:t1] (TorchGeo 0.8), "
        f"got {key!r}"
    )


def parse_query(
    key: Any, default: BoundingBox | None
) -> tuple[BoundingBox, tuple[float | None, float | None], GeoSlices]:
    """A query as ``(box, (x step, y step), resolved slices)``, with TorchGeo 0.8's ``__getitem__`` semantics.

    ``key`` is a :data:`GeoSlice` (``x0:x1:xres, y0:y1:yres, t0:t1:tres``,
    any trailing part and any slice end may be left out) or a
    :class:`BoundingBox`.  Missing parts take ``default``'s extent (the
    dataset's bounds).  The x and y steps, when given, are the pixel size to
    read at (TorchGeo reads at ``x.step, y.step``; a dataset fills a missing
    one from its ``res``); a time step other than 1 (TorchGeo: every n-th
    file) is refused.  The resolved slices keep the query's own values and
    steps, with the missing ends filled in (they are what ``sample["bounds"]``
    holds).

    Raises:
        TypeError: ``key`` is neither.
        ValueError: an empty or inverted extent, a non-positive step, a time
            step, or an open end without ``default``.

    Example:
        >>> default = BoundingBox(0, 100, 0, 50, 0, 10)
        >>> box, steps, _ = parse_query((slice(10, 20, 2.0), slice(5, 25)), default)
        >>> box.minx, box.maxx, box.miny, box.maxy, box.mint_s, steps
        (10.0, 20.0, 5.0, 25.0, 0.0, (2.0, None))
    """
    if isinstance(key, BoundingBox):
        return key, (None, None), to_slices(key)
    if isinstance(key, GeoSlices) and is_complete(key) and key.t.step is None and key.x.step is None \
            and key.y.step is None:
        return _box_of(key), (None, None), key
    if isinstance(key, slice):
        key = (key,)
    if not _is_slices(key):
        raise _query_error(key)
    key = tuple(key)
    given = list(key) + [slice(None)] * (3 - len(key))
    lows = (None, None, None) if default is None else (default.minx, default.miny, default.mint_s)
    highs = (None, None, None) if default is None else (default.maxx, default.maxy, default.maxt_s)
    values: list[float] = []
    resolved: list[slice] = []
    for axis, s in enumerate(given):
        convert = float if axis < 2 else to_timestamp
        ends = []
        for end, fallback in ((s.start, lows[axis]), (s.stop, highs[axis])):
            if end is None:
                if fallback is None:
                    raise ValueError(f"query {key!r} leaves an end open and there are no bounds to default to")
                ends.append((fallback, fallback if axis < 2 else to_time(fallback)))
            else:
                try:
                    ends.append((convert(end), end))
                except (TypeError, ValueError) as exc:
                    what = "coordinate" if axis < 2 else "time"
                    raise TypeError(f"query {key!r}: {end!r} is not a {what}") from exc
        values += [ends[0][0], ends[1][0]]
        resolved.append(slice(ends[0][1], ends[1][1], s.step))
    steps: list[float | None] = []
    for s in given[:2]:
        if s.step is None:
            steps.append(None)
            continue
        try:
            step = float(s.step)
        except (TypeError, ValueError):
            raise TypeError(f"query {key!r}: the x and y steps are pixel sizes, got {s.step!r}") from None
        if not (math.isfinite(step) and step > 0):
            raise ValueError(f"query {key!r}: the x and y steps are pixel sizes and must be positive")
        steps.append(step)
    if given[2].step is not None and given[2].step != 1:
        raise ValueError(
            f"query {key!r}: a time step other than 1 (TorchGeo: every n-th file) is not supported; "
            "filter dataset.index instead"
        )
    minx, maxx, miny, maxy, mint, maxt = values
    try:
        box = BoundingBox(minx, maxx, miny, maxy, mint, maxt)
    except ValueError as exc:
        raise ValueError(f"invalid query {key!r}: {exc}") from None
    return box, (steps[0], steps[1]), GeoSlices(resolved[0], resolved[1], resolved[2])


def _box_of(q: GeoSlices) -> BoundingBox:
    """The box of a complete query without steps (a sampler item): the fast path of :func:`parse_query`."""
    try:
        return BoundingBox(q.x.start, q.x.stop, q.y.start, q.y.stop, to_timestamp(q.t.start), to_timestamp(q.t.stop))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"invalid query {q!r}: {exc}") from None


def is_complete(key: Any) -> bool:
    """Whether ``key`` is a box or three slices with every end given (it needs no bounds to default to)."""
    if isinstance(key, BoundingBox):
        return True
    return (
        isinstance(key, (tuple, list)) and len(key) == 3
        and all(isinstance(s, slice) and s.start is not None and s.stop is not None for s in key)
    )


def from_slices(key: Any, default: BoundingBox | None = None) -> BoundingBox:
    """A query (TorchGeo 0.8's slices ``(x, y, t)``, a sampler item, or a box) as a :class:`BoundingBox`.

    Missing slices or open slice ends take ``default``'s extent (the
    dataset's bounds; without it, every end must be given); the steps (the
    resolution to read at) are left out: :func:`parse_query` returns them.

    Example:
        >>> import pandas as pd
        >>> from_slices((slice(0, 10), slice(20, 30), slice(pd.Timestamp(2023, 1, 1), pd.Timestamp.max)))
        BoundingBox(minx=0, maxx=10, miny=20, maxy=30, mint=2023-01-01T00:00:00Z, maxt=inf)
    """
    if isinstance(key, BoundingBox):
        return key
    return parse_query(key, default)[0]


def _allow_in_weights_only_checkpoints() -> None:
    """Let ``torch.load(weights_only=True)`` rebuild queries found in checkpoints (shuffle buffers, batches)."""
    from pandas._libs.tslibs.timestamps import _unpickle_timestamp

    torch.serialization.add_safe_globals([slice, BoundingBox, GeoSlices, Bounds, _unpickle_timestamp])


_allow_in_weights_only_checkpoints()
