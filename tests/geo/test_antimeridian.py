"""Footprints across the antimeridian (``pipekit.geo._antimeridian``): split where the target CRS is cut at 180
degrees, one box elsewhere, a polar tile one box down to its pole."""

from __future__ import annotations

import pytest
from rasterio.crs import CRS

from pipekit.geo._antimeridian import footprint_parts

LONLAT, MERCATOR = CRS.from_epsg(4326), CRS.from_epsg(3857)
FIJI = (CRS.from_epsg(32760), (780_000, 8_020_000, 876_000, 8_116_000))  # UTM 60 south, across 180 degrees


@pytest.mark.parametrize("dst", [LONLAT, MERCATOR])
def test_split_in_crs_cut_at_180(dst):
    src, box = FIJI
    east, west = footprint_parts(src, dst, *box)
    edge = 180.0 if dst == LONLAT else 20_037_508.342789244
    assert east[2] == pytest.approx(edge) and west[0] == pytest.approx(-edge)
    assert east[0] < east[2] and west[0] < west[2] and west[2] < 0 < east[0]


@pytest.mark.parametrize("epsg", [32760, 32701, 3832])  # its own zone, the next zone, a Pacific-centred Mercator
def test_one_box_where_the_crs_is_not_cut(epsg):
    src, box = FIJI
    (left, _, right, _), = footprint_parts(src, CRS.from_epsg(epsg), *box)
    assert right - left < 200_000


@pytest.mark.parametrize(("box", "expected"), [
    ((-1e6, -1e6, 1e6, 1e6), (-180.0, -90.0, 180.0, -77.04)),  # around the South Pole
    ((-3e6, -1e6, -1e6, 1e6), (-135.0, -80.82, -45.0, -61.48)),  # beside it: no wrap
])
def test_polar_tile_is_one_box_down_to_the_pole(box, expected):
    (found,) = footprint_parts(CRS.from_epsg(3031), LONLAT, *box)
    assert found == pytest.approx(expected, abs=0.01)
