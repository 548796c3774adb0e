"""pipekit.geo.catalog._dates: the dates of many file names equal each one's date_interval."""

from __future__ import annotations

import re

import numpy as np
import pytest


def test_date_intervals_equal_date_interval():
    from pipekit.geo.catalog._dates import date_interval, date_intervals

    texts = ["20210701", None, "", "20210701", "20211301", "20200229", "20210229", "20200229"]
    column = date_intervals(texts, "%Y%m%d")
    for k, text in enumerate(texts):
        assert column.given[k] == bool(text)
        if text in ("20211301", "20210229"):  # no such month, no such day
            assert column.failed[k] and column.error(k) is not None
            with pytest.raises(ValueError, match=re.escape(str(column.error(k)))):
                date_interval(text, "%Y%m%d")
            continue
        assert not column.failed[k] and column.error(k) is None
        if not text:
            assert np.isnan(column.intervals[k]).all()
        else:
            assert tuple(column.intervals[k].tolist()) == date_interval(text, "%Y%m%d")


def _utc(*args: int) -> float:
    from datetime import datetime, timezone

    return datetime(*args, tzinfo=timezone.utc).timestamp()


@pytest.mark.parametrize(
    ("text", "fmt", "expected"),
    [
        # a literal "%" followed by "m" is text, not a month: the date is the year
        ("2021%m", "%Y%%m", (_utc(2021, 1, 1), _utc(2022, 1, 1) - 1e-6)),
        ("2021%05", "%Y%%%m", (_utc(2021, 5, 1), _utc(2021, 6, 1) - 1e-6)),
        # no year in the format: no date at all (not the year 1900 strptime fills in), so all of time
        ("", "", (-np.inf, np.inf)),
        ("07-01", "%m-%d", (-np.inf, np.inf)),
        ("2021-07-01 13", "%Y-%m-%d %H", (_utc(2021, 7, 1, 13), _utc(2021, 7, 1, 14) - 1e-6)),
    ],
)
def test_date_interval_reads_directives_not_substrings(text, fmt, expected):
    from pipekit.datasets.utils import disambiguate_timestamp
    from pipekit.geo._bbox import to_time
    from pipekit.geo.catalog._dates import date_interval

    assert date_interval(text, fmt) == pytest.approx(expected)
    assert disambiguate_timestamp(text, fmt) == (to_time(expected[0]), to_time(expected[1]))
