"""STAC: building a STACDataset from 10,000 items three ways, and its patch rate against a plain RasterDataset.

What is measured (issue 11, "Measure"):

1. **Opening**: ``N`` synthetic Sentinel-2-like items (10,000; 1,000 with
   ``--quick``; :mod:`pipekit.synthetic.stac`: four 10 m tiles in UTM zones 31
   and 32, four band COGs each, one item per tile and date) as

   * a static pystac collection on the local S3 server (SeaweedFS,
     ``tests/s3server.py``): ``collection.json`` + one JSON per item, walked
     through fsspec (``storage_options``), items fetched 16 at a time;
   * a STAC API (``rustac serve``, in-memory backend, on loopback) searched with
     pystac-client, every page followed (``limit`` 100, pystac-client's
     default page size, and 1,000);
   * a stac-geoparquet file (written by rustac) on the same S3 server, read with pyarrow.

   With ``--filters``, the same opening with a search (``filter="eo:cloud_cover
   < 10"``, a ``datetime`` range and a ``bbox``): evaluated client-side on the
   stac-geoparquet file (and the static catalog), and server-side by a STAC API
   that evaluates CQL2 (``rustac serve`` over the same stac-geoparquet, its DuckDB
   backend); the three selections are checked equal.

   Seconds (wall, and the process's CPU time: steadier on a shared machine)
   to a ready ``STACDataset(source, assets=["red", "green", "blue",
   "nir"])`` and the requests made (documents read; API pages; the one file).
   Target: stac-geoparquet under 2 s for 10,000 items.

2. **Patches/s**: the 16 COGs (512 px, 256 px tiles, DEFLATE, overviews) on
   the S3 server, read through GDAL's ``/vsis3/`` as random 128 px patches of
   four bands, batch 8, through ``pipekit.DataLoader`` with 0 and 2 workers:
   ``STACDataset`` over the four items of one date against a plain
   ``RasterDataset`` subclass (``separate_files``, one scene per tile folder)
   over the same bucket, with the same boxes (identically seeded
   ``RandomGeoSampler``; both in EPSG:32631, the zone-32 tiles reprojected).
   Each (workers, round) reads the boxes with both, alternating which goes
   first; a warm-up pass first.  Ratio STAC / plain (target >= 0.9).

Run: ``PYTHONPATH=src python benchmarks/stac.py --quick`` (about a minute on 2
loaded cores); without ``--quick`` 10,000 items and more patches.  The machine
is shared: figures are indicative, the ratios steadier than the rates.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import pipekit  # noqa: E402
from pipekit.datasets import RasterDataset, STACDataset  # noqa: E402
from pipekit.geo import RandomGeoSampler, stack_samples  # noqa: E402
from pipekit.synthetic.stac import (  # noqa: E402
    sentinel2_items,
    write_collection_files,
    write_geoparquet,
    write_sentinel2_cogs,
    write_static_catalog,
)

ASSETS = ["red", "green", "blue", "nir"]


class TileBands(RasterDataset):
    """The same COGs as a plain RasterDataset: one scene per tile folder, one file per band."""

    filename_glob = "{}.tif"
    filename_regex = r"^(?P<band>B0[2348])\.tif$"
    separate_files = True
    all_bands = ("B02", "B03", "B04", "B08")


def build(label: str, make) -> dict:
    start, cpu = time.perf_counter(), time.process_time()
    ds = make()
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    print(
        f"  {label:<34} {len(ds):>6} items  {seconds:7.2f} s (CPU {cpu:5.2f} s)  {ds.requests:>6} requests", flush=True
    )
    return {
        "source": label,
        "items": len(ds),
        "seconds": round(seconds, 3),
        "cpu_seconds": round(cpu, 3),
        "requests": ds.requests,
    }


def patch_rate(ds, boxes_seed: int, n: int, size: int, workers: int) -> float:
    sampler = RandomGeoSampler(ds, size=size, length=n)
    import torch

    torch.manual_seed(boxes_seed)
    pipe = sampler.as_pipe().sharding_filter().read_geo(ds).batch(8).collate(stack_samples)
    loader = pipekit.DataLoader(pipe, num_workers=workers)
    start = time.perf_counter()
    count = sum(batch["image"].shape[0] for batch in loader)
    return count / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1,000 items and fewer patches")
    parser.add_argument("--items", type=int, default=None)
    parser.add_argument("--patches", type=int, default=None, help="patches per timed pass")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument(
        "--skip-catalog", action="store_true", help="no static catalog (writing 10,000 item files to S3 takes minutes)"
    )
    parser.add_argument("--skip-patches", action="store_true", help="only the opening figures")
    parser.add_argument(
        "--filters",
        action="store_true",
        help="also open with a search: client-side (stac-geoparquet, catalog) vs a CQL2 API",
    )
    args = parser.parse_args(argv)
    n_items = args.items or (1_000 if args.quick else 10_000)
    n_patches = args.patches or (96 if args.quick else 320)
    rounds = args.rounds or (2 if args.quick else 3)

    from s3server import start_s3_server
    from stacserver import start_stac_server

    print(f"machine: {os.cpu_count()} CPUs (shared with other jobs); {n_items} items, {n_patches} patches/pass")
    s3 = start_s3_server()
    so = s3.storage_options
    results: dict = {"items": n_items, "open": [], "patches": []}
    try:
        with tempfile.TemporaryDirectory(prefix="pipekit-bench-stac-") as tmp:
            work = Path(tmp)
            bucket = s3.create_bucket()
            fs = s3.fs()
            cogs = write_sentinel2_cogs(work / "cogs", size=512)
            fs.put(str(work / "cogs"), f"{bucket}/cogs", recursive=True)
            items = sentinel2_items(cogs, f"s3://{bucket}/cogs", n_items, size=512)
            t = time.perf_counter()
            if not args.skip_catalog:
                write_static_catalog(items, str(work / "catalog"))
                fs.put(str(work / "catalog"), f"{bucket}/catalog", recursive=True)
            write_geoparquet(items, f"s3://{bucket}/items.parquet", so)
            api = start_stac_server(write_collection_files(items, work / "api"), work)
            print(f"corpus written in {time.perf_counter() - t:.1f} s")
            try:
                print("opening:")
                if not args.skip_catalog:
                    results["open"].append(
                        build(
                            "static catalog (S3)",
                            lambda: STACDataset(
                                f"s3://{bucket}/catalog/collection.json", assets=ASSETS, storage_options=so
                            ),
                        )
                    )
                for limit in (100, 1000):
                    results["open"].append(
                        build(
                            f"STAC API search (limit {limit})",
                            lambda limit=limit: STACDataset(
                                api.url, assets=ASSETS, collections=["sentinel-2-l2a-synthetic"], limit=limit
                            ),
                        )
                    )
                results["open"].append(
                    build(
                        "stac-geoparquet (S3)",
                        lambda: STACDataset(f"s3://{bucket}/items.parquet", assets=ASSETS, storage_options=so),
                    )
                )
            finally:
                api.stop()
            if args.filters:
                results["filtered"] = open_filtered(items, work, bucket, so, args)

            if args.skip_patches:
                return _finish(results, args)
            first_date = [i for i in items if "20240501" in i["id"]]
            stac = STACDataset(first_date, assets=ASSETS, storage_options=so)
            plain = TileBands(
                f"s3://{bucket}/cogs/",
                crs=stac.crs,
                res=stac.res,
                bands=["B04", "B03", "B02", "B08"],
                storage_options=so,
            )
            assert len(stac) == len(plain) == 4, (len(stac), len(plain))
            box = stac.bounds
            same = bool((stac[box]["image"] == plain[box]["image"]).all())
            print(
                f"patches/s ({n_patches} random 128 px patches of 4 bands per pass, S3 /vsis3/); "
                f"identical mosaics: {same}"
            )
            for workers in (0, 2):
                patch_rate(stac, 99, min(32, n_patches), 128, workers)  # warm-up
                patch_rate(plain, 99, min(32, n_patches), 128, workers)
                rates = {"stac": [], "plain": []}
                for r in range(rounds):
                    order = [("stac", stac), ("plain", plain)] if r % 2 == 0 else [("plain", plain), ("stac", stac)]
                    for name, ds in order:
                        rates[name].append(patch_rate(ds, r, n_patches, 128, workers))
                s, p = statistics.median(rates["stac"]), statistics.median(rates["plain"])
                print(
                    f"  workers={workers}: STACDataset {s:7.1f}/s  RasterDataset {p:7.1f}/s  ratio {s / p:.2f} "
                    f"(rounds: stac {[round(x) for x in rates['stac']]}, plain {[round(x) for x in rates['plain']]})",
                    flush=True,
                )
                results["patches"].append(
                    {
                        "workers": workers,
                        "stac": round(s, 1),
                        "plain": round(p, 1),
                        "ratio": round(s / p, 3),
                        "identical": same,
                    }
                )
    finally:
        s3.stop(timeout=3.0)
    return _finish(results, args)


#: a search selecting about a tenth of the items: clear scenes of the summer over the zone boundary
SEARCH = {"filter": "eo:cloud_cover < 10", "datetime": "2024-05-01/2025-12-31", "bbox": [5.9, 47.4, 6.1, 47.6]}


def open_filtered(items: list, work: Path, bucket: str, so: dict, args: argparse.Namespace) -> list[dict]:
    """Open with :data:`SEARCH`: client-side on stac-geoparquet (and the catalog), server-side by a CQL2 API."""
    from stacserver import start_stac_server

    local = write_geoparquet(items, str(work / "filtered" / "items.parquet"))
    api = start_stac_server([local], work / "filtered")  # the DuckDB backend: evaluates the filter
    rows, selections = [], {}
    print(f"opening with {SEARCH}:")
    try:
        cases = [
            (
                "stac-geoparquet (S3), client-side",
                lambda: STACDataset(f"s3://{bucket}/items.parquet", assets=ASSETS, storage_options=so, **SEARCH),
            )
        ]
        if not args.skip_catalog:
            cases.append(
                (
                    "static catalog (S3), client-side",
                    lambda: STACDataset(
                        f"s3://{bucket}/catalog/collection.json", assets=ASSETS, storage_options=so, **SEARCH
                    ),
                )
            )
        cases.append(
            ("STAC API (rustac DuckDB), limit 1000", lambda: STACDataset(api.url, assets=ASSETS, limit=1000, **SEARCH))
        )
        for label, make in cases:
            holder = []
            rows.append(build(label, lambda make=make, holder=holder: holder.append(make()) or holder[0]))
            selections[label] = sorted(holder[0].item_ids)
    finally:
        api.stop()
    same = len({tuple(v) for v in selections.values()}) == 1
    print(f"  the same {len(next(iter(selections.values())))} items selected by every path: {same}")
    if not same:
        raise AssertionError(f"the selections differ: { {k: len(v) for k, v in selections.items()} }")
    return rows


def _finish(results: dict, args: argparse.Namespace) -> int:
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
