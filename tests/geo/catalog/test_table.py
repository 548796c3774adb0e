"""pipekit.geo.catalog._table: the file table's helpers equal the per-file code they replaced."""

from __future__ import annotations

import numpy as np
import pytest
from rasterio.crs import CRS

UTM15 = "EPSG:32615"


@pytest.mark.parametrize(
    "paths",
    [
        [],
        ["/d/a.tif"],
        ["/d/t_01.tif", "/d/t_02.tif", "/d/t_10.tif"],
        ["/d/t_10.tif", "/d/t_02.tif", "/d/x.tif"],
        ["/d/a.tif", "/e/b.tif"],
        ["a.tif", "b.tif"],
        ["/d/a\0.tif", "/d/a\0/d/a.tif"],
        ["/d/a", "/d/a", "/d/ab"],
        ["s3://b/p/x_1.tif", "s3://b/p/x_2.tif"],
        ["/d/a.tif", "/d/a.tif\0/d/b", "/d/a.tif"],
    ],
)
def test_strip_prefix_equals_commonprefix(paths):
    import os

    from pipekit.geo.catalog._table import _strip_prefix

    prefix, names = _strip_prefix(list(paths))
    expected = os.path.commonprefix(paths) if len(paths) > 1 else ""  # noqa: RUF071
    assert prefix == expected
    assert names == [p[len(expected) :] for p in paths]


def test_footprints_equal_the_corner_reduction():
    from pipekit.geo.catalog._table import HeaderColumns, _FileTable

    rng = np.random.default_rng(0)
    n = 500
    transforms = np.column_stack(
        [
            rng.uniform(-30, 30, n),
            rng.uniform(-5, 5, n),
            rng.uniform(-1e6, 1e6, n),
            rng.uniform(-5, 5, n),
            rng.uniform(-30, 30, n),
            rng.uniform(-1e6, 1e6, n),
        ]
    )
    transforms[::3, 1] = transforms[::3, 3] = 0.0  # north-up ones too
    shapes = rng.integers(1, 5000, (n, 2))
    columns = HeaderColumns(
        [CRS.from_string(UTM15)],
        np.zeros(n),
        ["uint8"],
        np.zeros(n),
        transforms,
        shapes,
        np.ones(n),
        np.full(n, np.nan),
        np.zeros(n, dtype=bool),
    )
    table = _FileTable.from_columns([f"/d/{i}.tif" for i in range(n)], columns, np.zeros((n, 2)), None, {})
    out = table.footprints(CRS.from_string(UTM15))
    # the computation before: corners stacked into [N, 4] and reduced along that axis
    t = transforms
    h, w = shapes[:, 0].astype(np.float64), shapes[:, 1].astype(np.float64)
    cols = np.stack([np.zeros_like(w), w, np.zeros_like(w), w], axis=1)
    rows = np.stack([np.zeros_like(h), np.zeros_like(h), h, h], axis=1)
    xs = t[:, 0:1] * cols + t[:, 1:2] * rows + t[:, 2:3]
    ys = t[:, 3:4] * cols + t[:, 4:5] * rows + t[:, 5:6]
    expected = np.column_stack([xs.min(axis=1), xs.max(axis=1), ys.min(axis=1), ys.max(axis=1)])
    np.testing.assert_array_equal(out, expected)
    for i in range(0, n, 50):
        left, bottom, right, top = table.native_bounds(i)
        np.testing.assert_allclose(out[i], [left, right, bottom, top], rtol=1e-12)
