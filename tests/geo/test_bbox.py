"""BoundingBox: validation, set operations, splitting, TorchGeo slice queries."""

from __future__ import annotations

import math
import pickle
import re
from datetime import date, datetime, timedelta, timezone

import numpy as np
import pandas as pd
import pytest

from pipekit.geo._bbox import BoundingBox, from_slices, to_timestamp


class TestBoundingBox:
    def test_fields_and_tuple_behaviour(self):
        # TorchGeo's: times read back as datetimes (pandas Timestamps), in the tuple too; seconds in mint_s/maxt_s
        day, next_day = datetime(2025, 4, 24), datetime(2025, 4, 25)
        b = BoundingBox(0, 10, -5, 5, day, next_day)
        assert tuple(b) == (0.0, 10.0, -5.0, 5.0, day, next_day)
        minx, maxx, miny, maxy, mint, maxt = b
        assert (minx, maxx, miny, maxy, mint, maxt) == (0.0, 10.0, -5.0, 5.0, day, next_day)
        assert isinstance(b.mint, pd.Timestamp) and b.mint == day and b.maxt == next_day
        assert b[1] == 10.0 and b[-1] == next_day and b[1:3] == [10.0, -5.0]
        assert len(b) == 6
        assert (b.mint_s, b.maxt_s) == (day.replace(tzinfo=timezone.utc).timestamp(), next_day.replace(
            tzinfo=timezone.utc).timestamp())
        assert b.seconds() == (0.0, 10.0, -5.0, 5.0, b.mint_s, b.maxt_s)
        assert b.width == 10 and b.height == 10 and b.area == 100 and b.volume == 100 * timedelta(days=1)
        assert BoundingBox(0, 10, -5, 5, 100, 200) == BoundingBox(0, 10, -5, 5, 100.0, 200.0)

    def test_default_time_is_open(self):
        b = BoundingBox(0, 1, 0, 1)
        assert b.mint_s == -math.inf and b.maxt_s == math.inf
        assert b.mint == pd.Timestamp.min and b.maxt == pd.Timestamp.max  # TorchGeo's open ends
        assert BoundingBox(0, 1, 0, 1, pd.Timestamp.min, pd.Timestamp.max) == b
        assert b.volume == math.inf

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            ((1, 0, 0, 1), "Bounding box is invalid: 'minx=1' > 'maxx=0'"),
            ((0, 1, 2.5, 1), "Bounding box is invalid: 'miny=2.5' > 'maxy=1'"),
            ((0, 1, 0, 1, 5, 4), "Bounding box is invalid: 'mint=1970-01-01 00:00:05' > 'maxt=1970-01-01 00:00:04'"),
            ((0, math.inf, 0, 1), "maxx must be finite"),
            ((0, 1, math.nan, 1), "miny must be finite"),
        ],
    )
    def test_validation(self, args, message):
        with pytest.raises(ValueError, match=message):
            BoundingBox(*args)

    def test_type_errors(self):
        with pytest.raises(TypeError, match="minx must be a number"):
            BoundingBox("a", 1, 0, 1)
        with pytest.raises(TypeError, match="not a time"):
            BoundingBox(0, 1, 0, 1, "yesterday", 2)

    def test_times_from_dates(self):
        b = BoundingBox(0, 1, 0, 1, date(2020, 1, 1), datetime(2020, 1, 2, tzinfo=timezone.utc))
        assert b.maxt_s - b.mint_s == 86400 and b.maxt - b.mint == timedelta(days=1)
        assert to_timestamp(np.datetime64("2020-01-01T00:00:00")) == b.mint_s

    def test_intersects_touching_and_time(self):
        a = BoundingBox(0, 10, 0, 10, 0, 10)
        assert a.intersects(BoundingBox(10, 20, 10, 20, 0, 10))  # a shared corner counts
        assert not a.intersects(BoundingBox(10.001, 20, 0, 10, 0, 10))
        later = BoundingBox(0, 10, 0, 10, 11, 12)
        assert not a.intersects(later)
        assert a.intersects(later, spatial_only=True)

    def test_and_or(self):
        a, b = BoundingBox(0, 10, 0, 10), BoundingBox(5, 15, -5, 5)
        assert a & b == BoundingBox(5, 10, 0, 5)
        assert a | b == BoundingBox(0, 15, -5, 10)
        far = BoundingBox(20, 30, 20, 30)
        with pytest.raises(ValueError, match=re.escape(f"Bounding boxes {a} and {far} do not overlap")):
            a & far

    def test_contains(self):
        a = BoundingBox(0, 10, 0, 10)
        assert BoundingBox(1, 2, 1, 2) in a
        assert BoundingBox(1, 20, 1, 2) not in a
        assert "x" not in a

    @pytest.mark.parametrize("horizontal", [True, False])
    def test_split(self, horizontal):
        a = BoundingBox(0, 10, 0, 20, 1, 2)
        left, right = a.split(0.25, horizontal=horizontal)
        assert left | right == a
        assert left.area == pytest.approx(a.area / 4)
        with pytest.raises(ValueError, match="Input proportion must be between 0 and 1"):
            a.split(1.0)

    def test_with_time_and_pickle(self):
        a = BoundingBox(0, 1, 0, 1).with_time(5, 6)
        assert (a.mint_s, a.maxt_s) == (5.0, 6.0)
        assert pickle.loads(pickle.dumps(a)) == a
        assert "mint=1970-01-01T00:00:05Z" in repr(a)

    def test_frozen(self):
        with pytest.raises(AttributeError):
            BoundingBox(0, 1, 0, 1).minx = 3


def test_a_box_with_a_time_past_year_9999_prints_and_a_dataset_names_it_as_missing():
    """Printing such a box raised ValueError inside a dataset's "not found" error, hiding the IndexError."""
    from types import SimpleNamespace

    from pipekit.geo._base import GeoDataset

    box = BoundingBox(0, 1, 0, 1, 0, 1e12)
    assert "maxt=1e+12s" in repr(box) and "mint=1970-01-01T00:00:00Z" in repr(box)
    stub = SimpleNamespace(_extent=lambda: (0, 1), name="stub")
    assert "1e+12s" in str(GeoDataset._missing(stub, box))


class TestFromSlices:
    DEFAULT = BoundingBox(0, 100, 0, 50, 10, 20)

    def test_full_and_partial_slices(self):
        assert from_slices((slice(1, 2), slice(3, 4), slice(12, 13)), self.DEFAULT) == BoundingBox(1, 2, 3, 4, 12, 13)
        assert from_slices(slice(5, None), self.DEFAULT) == BoundingBox(5, 100, 0, 50, 10, 20)
        assert from_slices((slice(None), slice(None, 7)), self.DEFAULT) == BoundingBox(0, 100, 0, 7, 10, 20)

    def test_bbox_passes_through(self):
        assert from_slices(self.DEFAULT, BoundingBox(0, 1, 0, 1)) is self.DEFAULT

    def test_errors(self):
        # TorchGeo 0.8: x and y steps are the resolution to read at (see TestParseQuery); a time step
        # (every n-th file in TorchGeo) is refused
        with pytest.raises(ValueError, match="time step"):
            from_slices((slice(0, 10), slice(0, 10), slice(10, 20, 2)), self.DEFAULT)
        with pytest.raises(TypeError, match="BoundingBox or by slices"):
            from_slices((1, 2), self.DEFAULT)
        with pytest.raises(TypeError, match="BoundingBox or by slices"):
            from_slices((slice(1, 2),) * 4, self.DEFAULT)


def test_timestamp_seconds_repeated_and_varied_timestamps():
    """Sampler boxes repeat a few times (TorchGeo's slices): every call gives the exact seconds, first or repeated."""
    cases = [
        (pd.Timestamp("2023-07-25 10:11:12.123456"), 1690279872.123456),
        (pd.Timestamp("2023-07-25 10:11:12.123456789"), 1690279872.123456),  # to the microsecond
        (pd.Timestamp("2023-07-25 12:11:12.123456", tz="Europe/Paris"), 1690279872.123456),
        (pd.Timestamp("2023-07-25 10:11:12.123456", tz="UTC"), 1690279872.123456),
        (pd.Timestamp("1969-12-31 23:59:59"), -1.0),
        (pd.Timestamp.min, -math.inf),
        (pd.Timestamp.max, math.inf),
    ]
    for _ in range(3):
        for t, want in cases:
            assert to_timestamp(t) == want, t
    for k in range(3000):  # more distinct times than any memo holds
        assert to_timestamp(pd.Timestamp(k, unit="s")) == float(k)
