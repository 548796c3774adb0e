"""Train straight from a STAC catalog: search items, read their COG assets as patches, batch them for a model.

What it shows:

* a static STAC collection of synthetic Sentinel-2-like COGs (tiled, with
  overviews, Sentinel-2 style item ids, tiles in UTM zones 31 and 32, the
  projection and eo extensions) written with pystac to a temporary folder or
  to an S3 bucket (``--bucket`` with ``--endpoint-url``...), plus the same
  items as stac-geoparquet;
* the items found three ways (``--source``): walking the static catalog,
  a STAC API search (``--source api`` serves the items with ``rustac serve``
  on loopback, or give ``--api-url``; searched by collection, bbox and
  date, pages followed), or reading the stac-geoparquet file;
* ``STACDataset(..., assets=["red", "green", "blue", "nir"]) & labels``: the
  items of both zones mosaicked into the labels' CRS, a random sampler, and
  ``pipekit.DataLoader`` with workers, training a per-pixel classifier.

Run::

    python examples/stac_training.py --steps 20
    python examples/stac_training.py --source api --steps 20
    python examples/stac_training.py --bucket demo --endpoint-url http://127.0.0.1:8333 --key K --secret S
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import torch

import pipekit
from pipekit.datasets import RasterDataset, STACDataset
from pipekit.geo import RandomGeoSampler, stack_samples
from pipekit.synthetic.stac import (
    sentinel2_items,
    write_collection_files,
    write_geoparquet,
    write_label_raster,
    write_sentinel2_cogs,
    write_static_catalog,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--source",
        choices=["catalog", "api", "geoparquet"],
        default="catalog",
        help="how the items are found (default: walk the static catalog)",
    )
    parser.add_argument("--api-url", default=None, help="search this STAC API instead of serving the items")
    parser.add_argument("--items", type=int, default=8, help="synthetic items (4 tiles x dates)")
    parser.add_argument("--tile-size", type=int, default=512, help="pixels per side of each COG")
    parser.add_argument("--patch", type=int, default=64, help="patch size in pixels")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--bucket", default=None, help="write the catalog and COGs to this S3 bucket")
    parser.add_argument("--endpoint-url", default=os.environ.get("AWS_ENDPOINT_URL"))
    parser.add_argument("--region", default=os.environ.get("AWS_REGION", "us-east-1"))
    parser.add_argument("--key", default=os.environ.get("AWS_ACCESS_KEY_ID"))
    parser.add_argument("--secret", default=os.environ.get("AWS_SECRET_ACCESS_KEY"))
    return parser


def storage_options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {"client_kwargs": {"region_name": args.region}}
    if args.endpoint_url:
        options["client_kwargs"]["endpoint_url"] = args.endpoint_url
    if args.key:
        options["key"], options["secret"] = args.key, args.secret
    return options


def write_corpus(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The COGs, the static collection, stac-geoparquet and the item collection ``rustac serve`` loads."""
    cogs = write_sentinel2_cogs(work / "cogs", size=args.tile_size)
    so: dict[str, Any] | None = None
    if args.bucket:
        import s3fs

        so = storage_options(args)
        fs = s3fs.S3FileSystem(**so)
        fs.put(str(work / "cogs"), f"{args.bucket}/stac-demo/cogs", recursive=True)
        base = f"s3://{args.bucket}/stac-demo"
    else:
        base = str(work)
    items = sentinel2_items(cogs, f"{base}/cogs", args.items, size=args.tile_size)
    return {
        "items": items,
        "storage_options": so,
        "catalog": write_static_catalog(items, f"{base}/catalog", so),
        "parquet": write_geoparquet(items, f"{base}/items.parquet", so),
        "api_files": write_collection_files(items, work / "api"),
    }


def serve(files: list[str], log: Path) -> tuple[subprocess.Popen, str]:
    """``rustac serve`` the items on a free loopback port (the ``rustac`` package's binary)."""
    import socket

    binary = shutil.which("rustac") or str(Path(sys.executable).parent / "rustac")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [binary, "serve", "--addr", f"127.0.0.1:{port}", "--create-collections", *files],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(url + "search?limit=1", timeout=5):
                return process, url
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"rustac serve did not start: {log.read_text()}") from None
            time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pipekit-stac-") as tmp:
        work = Path(tmp)
        corpus = write_corpus(args, work)
        so = corpus["storage_options"]
        assets = ["red", "green", "blue", "nir"]
        server = None
        try:
            if args.source == "api":
                url = args.api_url
                if url is None:
                    server, url = serve(corpus["api_files"], work / "rustac.log")
                images = STACDataset(
                    url,
                    assets=assets,
                    collections=["sentinel-2-l2a-synthetic"],
                    bbox=[5.9, 47.4, 6.1, 47.6],
                    datetime="2024-05-01/2024-12-31",
                    limit=4,
                    storage_options=so,
                )
            elif args.source == "geoparquet":
                images = STACDataset(corpus["parquet"], assets=assets, storage_options=so)
            else:
                images = STACDataset(corpus["catalog"], assets=assets, storage_options=so)
        finally:
            if server is not None:
                server.terminate()
                server.wait(timeout=10)
        found = set(images.item_ids)
        zones = sorted({i["properties"]["proj:epsg"] for i in corpus["items"] if i["id"] in found})
        print(
            f"{args.source}: {len(images)} items in EPSG {zones} ({images.requests} requests), "
            f"read in EPSG:{images.crs.to_epsg()}"
        )
        labels = RasterDataset(write_label_raster(work / "labels" / "labels.tif", size=args.tile_size))
        labels.is_image = False
        data = images & labels
        sampler = RandomGeoSampler(data, size=args.patch, length=args.steps * args.batch_size)
        pipe = sampler.as_pipe().sharding_filter().read_geo(data).batch(args.batch_size).collate(stack_samples)
        loader = pipekit.DataLoader(pipe, num_workers=args.workers)
        torch.manual_seed(0)
        model = torch.nn.Conv2d(len(assets), 4, kernel_size=1)
        optimiser = torch.optim.Adam(model.parameters(), lr=0.05)
        start = time.perf_counter()
        seen = 0
        for step, batch in enumerate(loader, 1):
            x = batch["image"] / 10000.0
            loss = torch.nn.functional.cross_entropy(model(x), batch["mask"])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            seen += x.shape[0]
            if step == 1 or step % 10 == 0:
                print(f"step {step}: loss {loss.item():.3f}")
        rate = seen / (time.perf_counter() - start)
        print(
            f"trained on {seen} patches of {args.patch}x{args.patch} px ({rate:.0f} patches/s); "
            f"skipped reads: {loader.skip_report() or 'none'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
