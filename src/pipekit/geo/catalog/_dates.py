"""Dates in file names: the time interval a date string stands for, at its format's precision.

:func:`date_interval` parses one date (``"2021"`` with ``"%Y"`` is the whole
year); :func:`date_intervals` parses the dates of many file names, each
distinct text once, into a :class:`DateColumn` that keeps the errors for the
caller to raise.  Used when a raster or vector dataset indexes its files.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import numpy as np

__all__ = ["DateColumn", "date_interval", "date_intervals"]


_PRECISION_STEPS = (
    ("%f", "microsecond"),
    ("%S", "second"),
    ("%s", "second"),
    ("%T", "second"),
    ("%M", "minute"),
    ("%H", "hour"),
    ("%I", "hour"),
    ("%d", "day"),
    ("%j", "day"),
    ("%m", "month"),
    ("%b", "month"),
    ("%B", "month"),
)
# what carries a year: without one, strptime fills in 1900; the text then dates nothing (all of time)
_YEAR_DIRECTIVES = frozenset("yYcxG")
_EXTRA_STEPS = {"c": "second", "X": "second", "x": "day"}


def _directives(date_format: str) -> list[str]:
    """The directive letters of a strptime format, in order; ``%%`` is a literal ``%``, not a directive."""
    out = []
    i = 0
    while i < len(date_format) - 1:
        if date_format[i] == "%":
            if date_format[i + 1] != "%":
                out.append(date_format[i + 1])
            i += 2
        else:
            i += 1
    return out


def date_interval(text: str, date_format: str) -> tuple[float, float]:
    """The time interval (POSIX seconds) a date string stands for at its format's precision.

    ``"2021"`` with ``"%Y"`` is the whole year 2021; ``"20210701"`` with
    ``"%Y%m%d"`` that day.  The end is one microsecond before the next period.
    A format without a year (``""``, ``"%m-%d"``) dates nothing: ``(-inf, inf)``,
    all of time, as TorchGeo (not the year 1900 ``strptime`` fills in); ``%%``
    is a literal ``%``.

    Example:
        >>> from datetime import datetime, timezone
        >>> start, end = date_interval("20210701", "%Y%m%d")
        >>> datetime.fromtimestamp(start, timezone.utc).isoformat()
        '2021-07-01T00:00:00+00:00'
        >>> round(end - start, 6)
        86399.999999
    """
    return _date_interval(text, date_format)


@functools.lru_cache(maxsize=1 << 16)  # many files share a date; strptime costs ~10 us
def _date_interval(text: str, date_format: str) -> tuple[float, float]:
    start = datetime.strptime(text, date_format)
    if start.tzinfo is None:
        start = start.replace(tzinfo=timezone.utc)
    directives = set(_directives(date_format))
    if not directives & _YEAR_DIRECTIVES:
        return -math.inf, math.inf
    unit = "year"
    for directive, name in _PRECISION_STEPS:
        if directive[1] in directives:
            unit = name
            break
    else:
        for letter, name in _EXTRA_STEPS.items():
            if letter in directives:
                unit = name
                break
    if unit == "year":
        end = start.replace(year=start.year + 1, month=1, day=1, hour=0, minute=0, second=0, microsecond=0)
    elif unit == "month":
        year, month = (start.year + 1, 1) if start.month == 12 else (start.year, start.month + 1)
        end = start.replace(year=year, month=month, day=1, hour=0, minute=0, second=0, microsecond=0)
    else:
        step = {
            "day": timedelta(days=1),
            "hour": timedelta(hours=1),
            "minute": timedelta(minutes=1),
            "second": timedelta(seconds=1),
            "microsecond": timedelta(microseconds=1),
        }[unit]
        end = start + step
    return start.timestamp(), end.timestamp() - 1e-6


@dataclass
class DateColumn:
    """The time intervals of many date texts (:func:`date_intervals`), one row per text.

    Attributes:
        intervals: ``[n, 2]`` POSIX seconds (NaN where no date is given or it failed).
        given: the text is a date to parse (not ``None`` or empty).
        failed: it is given and could not be parsed (:meth:`error` says why).
    """

    intervals: np.ndarray
    given: np.ndarray
    failed: np.ndarray
    codes: np.ndarray
    errors: list[BaseException | None]

    def error(self, i: int) -> BaseException | None:
        """The exception :func:`date_interval` raised for text ``i`` (``None`` if it did not fail)."""
        return self.errors[int(self.codes[i])]


def date_intervals(texts: Sequence[str | None], date_format: str) -> DateColumn:
    """:func:`date_interval` of many texts, each distinct text parsed once (``None``/``""``: no date).

    Files of a dataset share few dates: 100,000 file names are not 100,000
    calls; the rows take their interval from their text's code.  Errors are
    kept, not raised: the caller reports the first row that needs a failed one.

    Example:
        >>> column = date_intervals(["2021", None, "2021", "20x1"], "%Y")
        >>> column.given.tolist(), column.failed.tolist(), column.intervals[0].tolist() == column.intervals[2].tolist()
        ([True, False, True, True], [False, False, False, True], True)
        >>> type(column.error(3)).__name__
        'ValueError'
    """
    code_of = {text: j for j, text in enumerate(dict.fromkeys(texts))}
    codes = np.fromiter(map(code_of.__getitem__, texts), dtype=np.int64, count=len(texts))
    m = len(code_of)
    intervals = np.full((m, 2), np.nan)
    given = np.zeros(m, dtype=bool)
    failed = np.zeros(m, dtype=bool)
    errors: list[BaseException | None] = [None] * m
    for j, text in enumerate(code_of):
        if not text:
            continue
        given[j] = True
        try:
            intervals[j] = _date_interval(text, date_format)
        except Exception as exc:  # kept for the caller, which raises it for the first file that needs it
            failed[j] = True
            errors[j] = exc
    return DateColumn(intervals[codes], given[codes], failed[codes], codes, errors)
