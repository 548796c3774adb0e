"""GeoIndex: packed R-tree queries and joins checked against brute-force numpy references."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from pipekit.geo._bbox import BoundingBox
from pipekit.geo._index import FANOUT, GeoIndex


def brute_query(bounds: np.ndarray, q, spatial_only: bool = False) -> np.ndarray:
    q = q.seconds() if isinstance(q, BoundingBox) else tuple(q)  # times in seconds
    if len(q) == 4:
        q = (*q, -np.inf, np.inf)
    b = bounds
    mask = (b[:, 0] <= q[1]) & (b[:, 1] >= q[0]) & (b[:, 2] <= q[3]) & (b[:, 3] >= q[2])
    if not spatial_only:
        mask &= (b[:, 4] <= q[5]) & (b[:, 5] >= q[4])
    return np.flatnonzero(mask)


def brute_pairs(a: np.ndarray, b: np.ndarray, spatial_only: bool = False):
    m = (a[:, None, 0] <= b[None, :, 1]) & (a[:, None, 1] >= b[None, :, 0])
    m &= (a[:, None, 2] <= b[None, :, 3]) & (a[:, None, 3] >= b[None, :, 2])
    if not spatial_only:
        m &= (a[:, None, 4] <= b[None, :, 5]) & (a[:, None, 5] >= b[None, :, 4])
    i, j = np.nonzero(m)  # row-major: sorted by i then j
    return i, j


def random_boxes(rng: np.random.Generator, n: int, extent: float = 1000.0, grid: bool = False) -> np.ndarray:
    """Random boxes; with ``grid`` the coordinates are integers so edges often touch exactly."""
    if grid:
        x = rng.integers(0, int(extent), n).astype(float)
        y = rng.integers(0, int(extent), n).astype(float)
        w = rng.integers(0, 30, n).astype(float)  # zero-width boxes included
        h = rng.integers(0, 30, n).astype(float)
        t = rng.integers(0, 20, n).astype(float)
        d = rng.integers(0, 5, n).astype(float)
    else:
        x, y = rng.uniform(0, extent, n), rng.uniform(0, extent, n)
        w, h = rng.exponential(extent / 50, n), rng.exponential(extent / 50, n)
        t, d = rng.uniform(0, 100, n), rng.uniform(0, 10, n)
    b = np.stack([x, x + w, y, y + h, t, t + d], axis=1)
    # a few very large boxes and boxes with open time intervals
    k = max(1, n // 200)
    b[:k, 1] += extent / 2
    b[:k, 3] += extent / 3
    b[k : 2 * k, 4] = -np.inf
    b[2 * k : 3 * k, 5] = np.inf
    return b


def random_query(rng: np.random.Generator, extent: float = 1000.0, grid: bool = False) -> BoundingBox:
    if grid:
        x, y = rng.integers(0, int(extent), 2)
        w, h = rng.integers(0, 60, 2)
        t = rng.integers(0, 20)
        return BoundingBox(x, x + w, y, y + h, t, t + rng.integers(0, 5))
    x, y = rng.uniform(-50, extent, 2)
    w, h = rng.exponential(extent / 20, 2)
    kind = rng.integers(0, 3)
    if kind == 0:
        return BoundingBox(x, x + w, y, y + h)
    t = rng.uniform(0, 100)
    return BoundingBox(x, x + w, y, y + h, t, t + rng.uniform(0, 20))


class TestQuery:
    @pytest.mark.parametrize("n", [1, 7, FANOUT, 300, 5000])
    @pytest.mark.parametrize("grid", [False, True])
    def test_matches_brute_force(self, n, grid):
        rng = np.random.default_rng(n + 1000 * grid)
        bounds = random_boxes(rng, n, grid=grid)
        index = GeoIndex(bounds)
        nonempty = 0
        for _ in range(300):
            q = random_query(rng, grid=grid)
            for spatial_only in (False, True):
                got = index.query(q, spatial_only=spatial_only)
                want = brute_query(bounds, q, spatial_only)
                assert got.dtype == np.int64
                np.testing.assert_array_equal(got, want)
                nonempty += len(want) > 0
        if n >= 300:
            assert nonempty > 50  # the queries do hit things

    def test_touching_edges_and_corners_count(self):
        bounds = np.array([[0, 10, 0, 10, 0, 1]] * 400, dtype=float)
        bounds[:, 0] += np.arange(400) * 20
        bounds[:, 1] += np.arange(400) * 20
        index = GeoIndex(bounds)
        assert index.query(BoundingBox(10, 20, 10, 20)).tolist() == [0, 1]  # corner of 0, edge of 1
        assert index.query(BoundingBox(10.000001, 19.999999, 0, 10)).tolist() == []
        # time intervals touching at a single instant
        assert index.query(BoundingBox(0, 5, 0, 5, 1, 2)).tolist() == [0]
        assert index.query(BoundingBox(0, 5, 0, 5, 1.5, 2)).tolist() == []
        assert index.query(BoundingBox(0, 5, 0, 5, 1.5, 2), spatial_only=True).tolist() == [0]

    def test_zero_area_boxes_and_point_query(self):
        rng = np.random.default_rng(5)
        pts = rng.integers(0, 50, (2000, 2)).astype(float)
        bounds = np.stack([pts[:, 0], pts[:, 0], pts[:, 1], pts[:, 1], np.zeros(2000), np.zeros(2000)], axis=1)
        index = GeoIndex(bounds)
        for x, y in rng.integers(0, 50, (100, 2)):
            q = BoundingBox(x, x, y, y, 0, 0)
            np.testing.assert_array_equal(index.query(q), brute_query(bounds, q))
            assert len(index.query(q)) == np.sum((pts[:, 0] == x) & (pts[:, 1] == y))

    def test_tuple_queries(self):
        index = GeoIndex([[0, 1, 0, 1, 5, 6]])
        assert index.query((0.5, 2, 0.5, 2)).tolist() == [0]
        assert index.query((0.5, 2, 0.5, 2, 7, 8)).tolist() == []
        with pytest.raises(ValueError, match="4 or 6"):
            index.query((0, 1, 2))
        with pytest.raises(ValueError, match="NaN"):
            index.query((0, np.nan, 0, 1))
        with pytest.raises(ValueError, match="greater"):
            index.query((1, 0, 0, 1))
        with pytest.raises(TypeError, match="BoundingBox"):
            index.query(3)

    def test_duplicates_all_reported(self):
        bounds = np.tile([[0, 1, 0, 1, 0, 1]], (1000, 1))
        assert GeoIndex(bounds).query((0, 1, 0, 1)).tolist() == list(range(1000))

    def test_large_index_query_is_fast(self):
        import time

        rng = np.random.default_rng(0)
        bounds = random_boxes(rng, 100_000, extent=1e6)
        index = GeoIndex(bounds)
        queries = [random_query(rng, extent=1e6) for _ in range(200)]
        index.query(queries[0])  # builds the tree
        start = time.perf_counter()
        for q in queries:
            index.query(q)
        per_query = (time.perf_counter() - start) / len(queries)
        assert per_query < 2e-3, f"query on 100k entries took {per_query * 1e6:.0f} us"
        for q in queries[:20]:
            np.testing.assert_array_equal(index.query(q), brute_query(bounds, q))


class TestIntersectPairs:
    @pytest.mark.parametrize(("na", "nb"), [(1, 1), (5, 400), (700, 3), (1500, 2500)])
    @pytest.mark.parametrize("grid", [False, True])
    def test_matches_brute_force(self, na, nb, grid):
        rng = np.random.default_rng(na * 7 + nb + grid)
        a, b = random_boxes(rng, na, grid=grid), random_boxes(rng, nb, grid=grid)
        for spatial_only in (False, True):
            i, j = GeoIndex(a).intersect_pairs(GeoIndex(b), spatial_only=spatial_only)
            wi, wj = brute_pairs(a, b, spatial_only)
            assert i.dtype == j.dtype == np.int64
            np.testing.assert_array_equal(i, wi)
            np.testing.assert_array_equal(j, wj)

    def test_self_join_includes_diagonal(self):
        rng = np.random.default_rng(3)
        a = random_boxes(rng, 600)
        i, j = GeoIndex(a).intersect_pairs(GeoIndex(a))
        pairs = set(zip(i.tolist(), j.tolist(), strict=True))
        assert all((k, k) in pairs for k in range(600))
        assert all((m, k) in pairs for k, m in pairs)  # symmetric

    def test_disjoint_and_empty(self):
        a = GeoIndex([[0, 1, 0, 1]])
        b = GeoIndex([[2, 3, 2, 3]])
        for x, y in [(a, b), (a, GeoIndex.empty()), (GeoIndex.empty(), a)]:
            i, j = x.intersect_pairs(y)
            assert i.tolist() == j.tolist() == []
        with pytest.raises(TypeError, match="GeoIndex"):
            a.intersect_pairs([[0, 1, 0, 1]])

    def test_large_join_is_fast(self):
        """Two tilings of 50,000 overlapping scenes with dates, like two products' footprints."""
        import time

        rng = np.random.default_rng(1)

        def scenes(step, size, shift, n_dates):
            xs, ys = np.meshgrid(np.arange(250) * step + shift, np.arange(200) * step + shift)
            x, y = xs.ravel(), ys.ravel()
            t = rng.integers(0, n_dates, len(x)) * 86400.0
            return np.stack([x, x + size, y, y + size, t, t + 86399], axis=1)

        a = scenes(100.0, 110.0, 0.0, 3)
        b = scenes(100.0, 100.0, 37.0, 3)
        ia, ib = GeoIndex(a), GeoIndex(b)
        start = time.perf_counter()
        i, j = ia.intersect_pairs(ib)
        elapsed = time.perf_counter() - start
        assert elapsed < 3.0, f"join of 50k x 50k scenes took {elapsed:.2f}s"
        assert len(i) > 50_000
        for k in rng.integers(0, len(a), 50):
            np.testing.assert_array_equal(j[i == k], brute_query(b, a[k]))
        si, _ = ia.intersect_pairs(ib, spatial_only=True)
        assert len(si) > len(i)


class TestConstruction:
    def test_empty(self):
        index = GeoIndex.empty()
        assert len(index) == 0
        assert index.bounds.shape == (0, 6)
        assert index.query(BoundingBox(0, 1, 0, 1)).tolist() == []
        assert index.areas.shape == (0,)
        with pytest.raises(ValueError, match="empty"):
            index.total_bounds
        assert len(GeoIndex([])) == 0
        assert repr(index) == "GeoIndex(0 entries)"

    def test_four_columns_get_open_times(self):
        index = GeoIndex([[0, 1, 2, 3]])
        assert index.bounds.tolist() == [[0, 1, 2, 3, -np.inf, np.inf]]
        assert index[0] == BoundingBox(0, 1, 2, 3)

    def test_bounds_read_only_and_copied(self):
        src = np.array([[0.0, 1, 0, 1, 0, 1]])
        index = GeoIndex(src)
        src[0, 0] = -5
        assert index.bounds[0, 0] == 0
        with pytest.raises(ValueError, match="read-only"):
            index.bounds[0, 0] = 3

    @pytest.mark.parametrize(
        ("row", "match"),
        [
            ([1, 0, 0, 1, 0, 1], "min greater"),
            ([0, 1, 1, 0, 0, 1], "min greater"),
            ([0, 1, 0, 1, 2, 1], "min greater"),
            ([0, np.nan, 0, 1, 0, 1], "NaN"),
            ([0, np.inf, 0, 1, 0, 1], "infinite"),
            ([0, 1, 0, 1, np.nan, 1], "NaN"),
        ],
    )
    def test_invalid_entries_named(self, row, match):
        with pytest.raises(ValueError, match=match) as info:
            GeoIndex([[0, 1, 0, 1, 0, 1], row])
        assert "entry 1" in str(info.value)

    def test_bad_shape(self):
        with pytest.raises(ValueError, match=r"\[N, 6\]"):
            GeoIndex(np.zeros((3, 5)))
        with pytest.raises(ValueError, match=r"\[N, 6\]"):
            GeoIndex(np.zeros(6))

    def test_total_bounds_and_areas(self):
        index = GeoIndex([[0, 2, 0, 3, 5, 6], [-1, 1, 10, 11, 1, 2], [4, 4, 4, 4, -np.inf, 3]])
        assert index.total_bounds == BoundingBox(-1, 4, 0, 11, -np.inf, 6)
        assert index.areas.tolist() == [6.0, 2.0, 0.0]

    def test_concat_and_subset(self):
        a = GeoIndex([[0, 1, 0, 1], [5, 6, 5, 6]])
        b = GeoIndex([[0.5, 2, 0.5, 2]])
        c = a.concat(b)
        assert len(c) == 3
        assert c.query((0.9, 1, 0.9, 1)).tolist() == [0, 2]
        assert c.subset([2, 0]).bounds[:, 0].tolist() == [0.5, 0.0]
        assert a.concat(GeoIndex.empty()) == a
        with pytest.raises(TypeError, match="GeoIndex"):
            a.concat(np.zeros((1, 6)))

    def test_from_boxes_and_iteration(self):
        boxes = [BoundingBox(0, 1, 0, 1, 3, 4), BoundingBox(2, 3, 2, 3)]
        index = GeoIndex.from_boxes(boxes)
        assert list(index) == boxes
        assert index[1] == boxes[1]
        assert len(GeoIndex.from_boxes([])) == 0


class TestPickle:
    def test_roundtrip_queries_the_same(self):
        rng = np.random.default_rng(2)
        bounds = random_boxes(rng, 3000)
        index = GeoIndex(bounds)
        index.query((0, 1, 0, 1))  # tree built; must not be pickled
        clone = pickle.loads(pickle.dumps(index))
        assert clone == index
        assert not clone.bounds.flags.writeable
        for _ in range(50):
            q = random_query(rng)
            np.testing.assert_array_equal(clone.query(q), index.query(q))

    def test_pickle_is_just_the_arrays(self):
        rng = np.random.default_rng(4)
        index = GeoIndex(random_boxes(rng, 100_000, extent=1e6))
        index.query((0, 1, 0, 1))
        size = len(pickle.dumps(index, protocol=pickle.HIGHEST_PROTOCOL))
        assert index.bounds.nbytes <= size < index.bounds.nbytes * 1.01 + 1000


class TestFromArray:
    """``GeoIndex._from_array``: a dataset's new boxes taken without a copy, checked as the constructor checks."""

    def test_takes_the_array_and_equals_the_copying_constructor(self):
        boxes = np.array([[0, 10, 0, 10, 0, 5], [10, 20, 0, 10, -np.inf, np.inf]], dtype=np.float64)
        index = GeoIndex._from_array(boxes)
        assert np.shares_memory(index.bounds, boxes) and not index.bounds.flags.writeable
        assert index == GeoIndex(boxes.copy()) and index.query((5, 12, 5, 6)).tolist() == [0, 1]

    @pytest.mark.parametrize(
        ("row", "message"),
        [
            ([0, np.nan, 0, 1, 0, 1], "NaN or infinite"),
            ([0, 1, 0, np.inf, 0, 1], "NaN or infinite"),
            ([0, 1, 0, 1, np.nan, 1], "NaN or infinite"),
            ([2, 1, 0, 1, 0, 1], "min greater"),
            ([0, 1, 0, 1, 5, 1], "min greater"),
        ],
    )
    def test_refuses_what_the_constructor_refuses(self, row, message):
        boxes = np.array([[0, 1, 0, 1, 0, 1], [0, 1, 0, 1, 0, 1], row], dtype=np.float64)
        for build in (GeoIndex, GeoIndex._from_array):
            with pytest.raises(ValueError, match=f"entry 2 .*{message}|entry 2 has a {message}"):
                build(boxes.copy())

    def test_refuses_another_layout(self):
        with pytest.raises(ValueError, match="takes an"):
            GeoIndex._from_array(np.zeros((3, 4)))


def test_small_index_query_matches_the_array_kernel():
    """Indexes of a few entries (one per scene or layer) answer in Python; the result is ``_select``'s, exactly."""
    from pipekit.geo._index import _select

    rng = np.random.default_rng(7)
    for n in (1, 2, 3, 8, 9):
        lo = rng.integers(0, 10, size=(n, 3)).astype(float)
        span = rng.integers(0, 4, size=(n, 3)).astype(float)
        bounds = np.stack([lo[:, 0], lo[:, 0] + span[:, 0], lo[:, 1], lo[:, 1] + span[:, 1],
                           lo[:, 2], lo[:, 2] + span[:, 2]], axis=1)
        index = GeoIndex(bounds)
        for _ in range(60):  # integer corners: many boxes touch an entry's edge exactly
            a, b, c = rng.integers(-1, 12, size=3).astype(float)
            w, h, t = rng.integers(0, 4, size=3).astype(float)
            q = (a, a + w, b, b + h, c, c + t)
            for spatial_only in (False, True):
                got = index.query(q, spatial_only=spatial_only)
                want = _select(bounds.T, np.arange(n, dtype=np.int64), q, spatial_only)
                assert got.dtype == np.int64 and got.tolist() == want.tolist()
        got = index.query((0, 1, 0, 1, 0, 1))
        got[:] = -1  # a fresh array each time: the caller may write to it
        assert -1 not in index.query((0, 1, 0, 1, 0, 1)).tolist()
        assert pickle.loads(pickle.dumps(index)).query((0, 20, 0, 20)).tolist() == list(range(n))
