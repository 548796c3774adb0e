"""pipekit.geo.warpcache: reprojected blocks warped once, assembled into patches."""

from __future__ import annotations

import numpy as np
import pytest
from affine import Affine
from pyproj import Transformer

from pipekit import _fast
from pipekit.geo import BoundingBox, RasterDataset, warpcache
from pipekit.geo.io import close_cached_handles

from .conftest import ALBERS, UTM15, X0, Y0, write_tif

B = warpcache.BLOCK


@pytest.fixture(autouse=True)
def fresh_cache():
    budget = warpcache.warp_cache_budget()
    warpcache.clear_warp_cache()
    yield
    warpcache.set_warp_cache_budget(budget)
    warpcache.clear_warp_cache()


def index_warp(calls):
    """A fake warp: each pixel holds its global lattice column and row (from the grid's transform)."""

    def warp(transform, shape):
        calls.append((transform, shape))
        h, w = shape
        col0 = round(transform.c / transform.a)
        row0 = round(-transform.f / -transform.e)
        rows, cols = np.mgrid[row0:row0 + h, col0:col0 + w]
        return np.stack([cols, rows]).astype(np.int64), None

    return warp


def _assemble_block_by_block(found, col0, row0, h, w):
    """The patch assembly of ``read_blocks`` before its slices were computed per block row and column."""
    first = next(iter(found.values()))[0]
    out = np.empty((first.shape[0], h, w), dtype=first.dtype)
    covered = None
    for (bx, by), (data, inside) in found.items():
        c_lo, c_hi = max(col0, bx * B), min(col0 + w, (bx + 1) * B)
        r_lo, r_hi = max(row0, by * B), min(row0 + h, (by + 1) * B)
        src = (slice(None), slice(r_lo - by * B, r_hi - by * B), slice(c_lo - bx * B, c_hi - bx * B))
        dst = (slice(None), slice(r_lo - row0, r_hi - row0), slice(c_lo - col0, c_hi - col0))
        out[dst] = data[src]
        if inside is not None:
            if covered is None:
                covered = np.ones((h, w), dtype=bool)
            covered[dst[1:]] = inside[src[1:]]
    return out, covered


def test_patch_assembly_matches_block_by_block():
    rng = np.random.default_rng(0)
    for _ in range(40):
        col0, row0 = (int(v) for v in rng.integers(-300, 300, 2))
        h, w = (int(v) for v in rng.integers(1, 3 * B, 2))
        bx0, bx1, by0, by1 = col0 // B, (col0 + w - 1) // B, row0 // B, (row0 + h - 1) // B
        found = {}
        for by in range(by0, by1 + 1):
            for bx in range(bx0, bx1 + 1):
                inside = rng.random((B, B)) > 0.3 if rng.random() < 0.3 else None
                found[(bx, by)] = (rng.integers(0, 255, (2, B, B)).astype(np.uint8), inside)
        got = warpcache._assemble(found, col0, row0, (h, w), (bx0, bx1, by0, by1))
        want = _assemble_block_by_block(found, col0, row0, h, w)
        assert np.array_equal(got[0], want[0])
        assert (got[1] is None) == (want[1] is None) and (got[1] is None or np.array_equal(got[1], want[1]))


class TestReadBlocks:
    def test_assembles_patches_from_blocks_and_warps_each_block_once(self):
        calls = []
        warp = index_warp(calls)
        rng = np.random.default_rng(0)
        seen_first = False
        touched = set()
        for _ in range(40):
            col, row = (int(v) for v in rng.integers(-300, 300, size=2))  # negative lattice indices too
            h, w = (int(v) for v in rng.integers(1, 300, size=2))
            t = Affine(30.0, 0, col * 30.0, 0, -30.0, -row * 30.0)
            got = warpcache.read_blocks("src", t, (h, w), warp)
            if not seen_first:  # the first query on a lattice is left to the caller
                assert got is None
                seen_first = True
                got = warpcache.read_blocks("src", t, (h, w), warp)
            data, inside = got
            touched.update((bx, by) for bx in range(col // B, (col + w - 1) // B + 1)
                           for by in range(row // B, (row + h - 1) // B + 1))
            rows, cols = np.mgrid[row:row + h, col:col + w]
            assert inside is None
            assert np.array_equal(data[0], cols) and np.array_equal(data[1], rows)
        # every block touched was missed (warped and stored) exactly once
        stats = warpcache.warp_cache_stats()
        assert stats["hits"] > 0 and stats["misses"] == len(touched) == stats["blocks"]

    def test_each_lattice_phase_and_source_is_separate(self):
        calls = []
        warp = index_warp(calls)
        t = Affine(30.0, 0, 0.0, 0, -30.0, 0.0)
        shifted = Affine(30.0, 0, 10.0, 0, -30.0, 0.0)  # a third of a pixel off the first lattice
        for transform in (t, t, shifted):
            warpcache.read_blocks("a", transform, (10, 10), warp)
        assert len(calls) == 1  # the shifted lattice was seen once only: not served from blocks
        assert warpcache.read_blocks("a", shifted, (10, 10), warp) is not None
        assert warpcache.read_blocks("b", t, (10, 10), warp) is None  # another source: a new lattice
        assert len(calls) == 2

    def test_budget_bounds_the_cache(self):
        warp = index_warp([])
        block_bytes = 2 * B * B * 8
        warpcache.set_warp_cache_budget(3 * block_bytes)
        for k in range(6):
            t = Affine(30.0, 0, k * B * 30.0, 0, -30.0, 0.0)
            for _ in range(2):
                warpcache.read_blocks("src", t, (B, B), warp)
        stats = warpcache.warp_cache_stats()
        assert stats["blocks"] == 3 and stats["bytes"] == 3 * block_bytes
        warpcache.set_warp_cache_budget(block_bytes)
        assert warpcache.warp_cache_stats()["blocks"] == 1
        warpcache.set_warp_cache_budget(0)
        assert warpcache.warp_cache_stats()["blocks"] == 0
        t = Affine(30.0, 0, 0.0, 0, -30.0, 0.0)
        assert warpcache.read_blocks("src", t, (B, B), warp) is None
        assert warpcache.read_blocks("src", t, (B, B), warp) is None
        with pytest.raises(ValueError, match=">= 0"):
            warpcache.set_warp_cache_budget(-1)

    def test_partial_coverage_is_kept_per_block(self):
        def warp(transform, shape):
            h, w = shape
            inside = np.zeros(shape, dtype=bool)
            inside[:, : w // 2] = True
            return np.ones((1, h, w), np.uint8), inside

        t = Affine(30.0, 0, 0.0, 0, -30.0, 0.0)
        warpcache.read_blocks("src", t, (2 * B, 2 * B), warp)
        _, inside = warpcache.read_blocks("src", t, (2 * B, 2 * B), warp)
        assert inside[:, :B].all() and not inside[:, B:].any()


@pytest.fixture(scope="module")
def albers_classes(tmp_path_factory):
    rng = np.random.default_rng(5)
    fields = rng.integers(1, 10, size=(30, 30)).astype(np.uint8)
    data = np.kron(fields, np.ones((20, 20), dtype=np.uint8))  # 600 x 600
    data[300:340, 100:180] = 0  # nodata holes
    left, top = Transformer.from_crs(UTM15, ALBERS, always_xy=True).transform(X0 - 3000, Y0 + 3000)
    transform = Affine(30.0, 0, round(left / 30) * 30, 0, -30.0, round(top / 30) * 30)
    return write_tif(tmp_path_factory.mktemp("warpcache") / "classes.tif", data, ALBERS, transform, nodata=0)


def snapped_boxes(ds, n, size, seed, margin=0):
    b = ds.bounds
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = b.minx + 30.0 * int(rng.integers(-margin, (b.maxx - b.minx) / 30 - size + margin))
        y = b.maxy - 30.0 * int(rng.integers(-margin, (b.maxy - b.miny) / 30 - size + margin))
        out.append(BoundingBox(x, x + size * 30.0, y - size * 30.0, y))
    return out


class TestDatasetReads:
    def test_cached_patches_equal_direct_warps(self, albers_classes):
        ds = RasterDataset(albers_classes, crs=UTM15, res=30.0, resampling="nearest")
        # inside the file, across its edges (fill outside), over nodata holes
        boxes = snapped_boxes(ds, 30, 96, seed=1, margin=40)
        cached = [ds[q]["image"] for q in boxes + boxes]
        assert warpcache.warp_cache_stats()["hits"] > 0
        warpcache.set_warp_cache_budget(0)
        direct = [ds[q]["image"] for q in boxes + boxes]
        for a, b in zip(cached, direct):
            assert a.shape == b.shape == (1, 96, 96)
            # a block's pixels are its lattice's: identical up to the affine fit's 0.01 px
            assert (a == b).float().mean() >= 0.999

    def test_agrees_with_gdal(self, albers_classes):
        ds = RasterDataset(albers_classes, crs=UTM15, res=30.0, resampling="nearest")
        boxes = snapped_boxes(ds, 12, 64, seed=2)
        cached = [ds[q]["image"] for q in boxes + boxes][len(boxes):]
        with _fast.disabled("warp"):
            gdal = [ds[q]["image"] for q in boxes]
        agree = sum(int((a == b).sum()) for a, b in zip(cached, gdal))
        assert agree / sum(a.numel() for a in gdal) >= 0.999

    def test_unaligned_queries_do_not_fill_the_cache(self, albers_classes):
        ds = RasterDataset(albers_classes, crs=UTM15, res=30.0, resampling="nearest")
        b = ds.bounds
        rng = np.random.default_rng(3)
        for _ in range(20):
            x = rng.uniform(b.minx + 3000, b.maxx - 6000)
            y = rng.uniform(b.miny + 6000, b.maxy - 3000)
            ds[BoundingBox(x, x + 64 * 30.0, y - 64 * 30.0, y)]
        assert warpcache.warp_cache_stats()["blocks"] == 0

    def test_a_reopened_file_is_warped_afresh(self, tmp_path):
        path = tmp_path / "c.tif"
        left, top = Transformer.from_crs(UTM15, ALBERS, always_xy=True).transform(X0 - 3000, Y0 + 3000)
        transform = Affine(30.0, 0, round(left / 30) * 30, 0, -30.0, round(top / 30) * 30)
        write_tif(path, np.full((400, 400), 7, np.uint8), ALBERS, transform)
        ds = RasterDataset(path, crs=UTM15, res=30.0, resampling="nearest")
        q = snapped_boxes(ds, 1, 64, seed=4)[0]
        assert ds[q]["image"].eq(7).all() and ds[q]["image"].eq(7).all()
        write_tif(path, np.full((400, 400), 9, np.uint8), ALBERS, transform)
        close_cached_handles()
        assert ds[q]["image"].eq(9).all() and ds[q]["image"].eq(9).all()


@pytest.mark.parametrize(("value", "message"), [("lots", "must be a number of MiB"), ("-5", "must be >= 0 MiB")])
def test_bad_budget_in_the_environment_is_named(monkeypatch, value, message):
    monkeypatch.setenv(warpcache.ENV_VAR, value)
    with pytest.raises(ValueError, match=f"PIPEKIT_GEO_WARP_CACHE_MB {message}"):
        warpcache._budget_from_env()
    monkeypatch.setenv(warpcache.ENV_VAR, "0.5")
    assert warpcache._budget_from_env() == 2**19
