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
