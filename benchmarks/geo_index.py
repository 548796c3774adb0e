"""GeoIndex: build, query and join times at 1k / 10k / 100k footprints.

Footprints are scene-like boxes (UTM-sized, 3-30 km, with acquisition days)
scattered over a 2,000 km square; queries are 256-pixel patches at 30 m with a
one-month time window.  Each query's result is checked against a brute-force
numpy scan before timing.  Prints one table row per size:

* build: constructing the index and its packed R-tree (first query);
* query: mean time of one ``query`` (spatiotemporal) and ``spatial_only``;
* brute: the same query as a vectorised scan of all entries, for scale;
* join: ``intersect_pairs`` of the index with a second one of the same size;
* pickle: size of the pickled index relative to its bounds array.

Run: ``./run exec python benchmarks/geo_index.py`` (``--sizes 1000 50000``...).
"""

from __future__ import annotations

import argparse
import pickle
import time

import numpy as np

from pipekit.geo._bbox import BoundingBox
from pipekit.geo._index import GeoIndex

DAY = 86400.0
EXTENT = 2_000_000.0


def footprints(rng: np.random.Generator, n: int) -> np.ndarray:
    x, y = rng.uniform(0, EXTENT, n), rng.uniform(0, EXTENT, n)
    w, h = rng.uniform(3_000, 30_000, n), rng.uniform(3_000, 30_000, n)
    t = rng.integers(0, 3650, n) * DAY
    return np.stack([x, x + w, y, y + h, t, t + DAY - 1], axis=1)


def queries(rng: np.random.Generator, n: int) -> list[BoundingBox]:
    size = 256 * 30.0
    out = []
    for _ in range(n):
        x, y = rng.uniform(0, EXTENT - size, 2)
        t = rng.integers(0, 3650) * DAY
        out.append(BoundingBox(x, x + size, y, y + size, t, t + 30 * DAY))
    return out


def brute(b: np.ndarray, q: BoundingBox, spatial_only: bool) -> np.ndarray:
    m = (b[:, 0] <= q.maxx) & (b[:, 1] >= q.minx) & (b[:, 2] <= q.maxy) & (b[:, 3] >= q.miny)
    if not spatial_only:
        m &= (b[:, 4] <= q.maxt_s) & (b[:, 5] >= q.mint_s)
    return np.flatnonzero(m)


def per_call(fn, items) -> float:
    start = time.perf_counter()
    for item in items:
        fn(item)
    return (time.perf_counter() - start) / len(items)


def bench(n: int, n_queries: int, seed: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    bounds = footprints(rng, n)
    qs = queries(rng, n_queries)

    start = time.perf_counter()
    index = GeoIndex(bounds)
    index.query(qs[0])
    build = time.perf_counter() - start

    for q in qs[:50]:
        for spatial_only in (False, True):
            if not np.array_equal(index.query(q, spatial_only), brute(bounds, q, spatial_only)):
                raise AssertionError(f"GeoIndex.query disagrees with the brute-force scan for {q}")

    query = per_call(index.query, qs)
    query_spatial = per_call(lambda q: index.query(q, spatial_only=True), qs)
    scan = per_call(lambda q: brute(bounds, q, False), qs[: max(10, n_queries // 10)])

    other = GeoIndex(footprints(rng, n))
    start = time.perf_counter()
    i, _ = index.intersect_pairs(other)
    join = time.perf_counter() - start

    size = len(pickle.dumps(index, protocol=pickle.HIGHEST_PROTOCOL))
    return {
        "n": n,
        "build_ms": build * 1e3,
        "query_us": query * 1e6,
        "spatial_us": query_spatial * 1e6,
        "brute_us": scan * 1e6,
        "join_ms": join * 1e3,
        "pairs": len(i),
        "pickle_ratio": size / bounds.nbytes,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--queries", type=int, default=2_000, help="queries timed per size")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    header = (
        f"{'entries':>9} {'build ms':>9} {'query us':>9} {'spatial us':>11} {'brute us':>9} "
        f"{'join ms':>9} {'pairs':>8} {'pickle/bounds':>14}"
    )
    print(header)
    print("-" * len(header))
    for n in args.sizes:
        r = bench(n, args.queries, args.seed)
        print(
            f"{r['n']:>9,} {r['build_ms']:>9.1f} {r['query_us']:>9.1f} {r['spatial_us']:>11.1f} "
            f"{r['brute_us']:>9.1f} {r['join_ms']:>9.1f} {r['pairs']:>8,} {r['pickle_ratio']:>14.3f}"
        )


if __name__ == "__main__":
    main()
