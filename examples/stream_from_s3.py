"""Stream WebDataset tar shards and Cloud-Optimized GeoTIFFs straight from S3 (or any S3-compatible store).

What it shows:

* ``datasets.TarShards("s3://bucket/shards/shard-{000000..000003}.tar", storage_options=...)``:
  shards listed from a brace pattern (no bucket listing), shuffled, split
  between DataLoader workers, streamed member by member (nothing is
  downloaded to disk), decoded and batched;
* ``datasets.RasterDataset("s3://bucket/cogs/", storage_options=...)`` with a
  ``GridGeoSampler``: each patch is a windowed read of a COG, a few HTTP
  range requests through GDAL's ``/vsis3/``, in DataLoader workers;
* credentials: ``--key``/``--secret`` or the usual ``AWS_ACCESS_KEY_ID`` /
  ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN`` environment variables,
  ``--anon`` for public buckets, ``--endpoint-url`` (or ``AWS_ENDPOINT_URL``)
  for MinIO, SeaweedFS, Ceph, R2...  Checkpoints of these pipelines never
  contain the credentials.

``--upload-demo-data`` first writes four small synthetic shards and one small
COG under ``--shards`` and ``--cogs`` in the bucket, so the script can be
tried against an empty bucket::

    python examples/stream_from_s3.py --endpoint-url http://localhost:9000 --bucket demo --upload-demo-data
    python examples/stream_from_s3.py --bucket my-bucket --shards 'train/shard-{000000..000127}.tar' --cogs scenes/
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rasterio.transform import from_origin

import pipekit
from pipekit import datasets
from pipekit.geo import GridGeoSampler, stack_samples, write_geotiff
from pipekit.synthetic import write_image_shards


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bucket", required=True, help="the bucket to read from")
    parser.add_argument("--shards", default="shards/shard-{000000..000003}.tar",
                        help="shard key pattern (brace ranges), or a prefix ending with / to list")
    parser.add_argument("--cogs", default="cogs/", help="key prefix (or key) of the GeoTIFFs/COGs")
    parser.add_argument("--endpoint-url", default=os.environ.get("AWS_ENDPOINT_URL"),
                        help="S3 endpoint (default $AWS_ENDPOINT_URL, else AWS)")
    parser.add_argument("--region", default=os.environ.get("AWS_REGION", os.environ.get("AWS_DEFAULT_REGION")),
                        help="region (default $AWS_REGION / $AWS_DEFAULT_REGION)")
    parser.add_argument("--key", default=os.environ.get("AWS_ACCESS_KEY_ID"), help="default $AWS_ACCESS_KEY_ID")
    parser.add_argument("--secret", default=os.environ.get("AWS_SECRET_ACCESS_KEY"),
                        help="default $AWS_SECRET_ACCESS_KEY")
    parser.add_argument("--anon", action="store_true", help="unsigned requests (public buckets)")
    parser.add_argument("--upload-demo-data", action="store_true",
                        help="first write synthetic shards and a COG to --shards and --cogs")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=64, help="images are cropped to this size to batch them")
    parser.add_argument("--patch", type=int, default=128, help="COG patch side in pixels")
    parser.add_argument("--max-batches", type=int, default=None, help="stop each stream after this many batches")
    parser.add_argument("--workers", type=int, default=2)
    return parser


def storage_options(args: argparse.Namespace) -> dict[str, Any]:
    """s3fs options; GDAL's /vsis3/ reads the same ones (pipekit translates them)."""
    options: dict[str, Any] = {}
    if args.anon:
        options["anon"] = True
    elif args.key and args.secret:
        options["key"], options["secret"] = args.key, args.secret
        token = os.environ.get("AWS_SESSION_TOKEN")
        if token:
            options["token"] = token
    client: dict[str, Any] = {}
    if args.endpoint_url:
        client["endpoint_url"] = args.endpoint_url
    if args.region:
        client["region_name"] = args.region
    if client:
        options["client_kwargs"] = client
    return options


def upload_demo_data(args: argparse.Namespace, options: dict[str, Any]) -> None:
    import fsspec

    fs = fsspec.filesystem("s3", **options)
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_image_shards(Path(tmp) / "shards", shards=4, per_shard=32, size=80, progress=False)
        prefix = args.shards.rsplit("/", 1)[0] if "/" in args.shards else ""
        for path in paths:
            key = f"{args.bucket}/{prefix}/{path.name}" if prefix else f"{args.bucket}/{path.name}"
            fs.put(str(path), key)
        rng = np.random.default_rng(0)
        yy, xx = np.mgrid[0:512, 0:512]
        bands = np.stack([(xx + yy + rng.normal(0, 8, xx.shape)) * (b + 1) for b in range(3)]).clip(1, 65535)
        cog = write_geotiff(Path(tmp) / "scene.tif", bands.astype(np.uint16), "EPSG:32615",
                            from_origin(500_000.0, 4_100_000.0, 10.0, 10.0), nodata=0)
        fs.put(cog, f"{args.bucket}/{args.cogs.rstrip('/')}/scene.tif" if args.cogs.endswith("/")
               else f"{args.bucket}/{args.cogs}")
    fs.invalidate_cache()
    print(f"uploaded {len(paths)} shards and 1 COG to s3://{args.bucket}")


def stream_shards(args: argparse.Namespace, options: dict[str, Any]) -> int:
    url = f"s3://{args.bucket}/{args.shards}"
    shards = datasets.TarShards(url, batch_size=args.batch_size, size=args.image_size, shuffle_buffer=64,
                                 storage_options=options)
    print(f"{shards}: {shards.shards[0]} ...")
    loader = pipekit.DataLoader(shards, num_workers=args.workers)
    start, samples, batches, keys = time.perf_counter(), 0, 0, set()
    for batch in loader:
        samples += len(batch["__key__"])
        keys.update(batch["__key__"])
        batches += 1
        if batches == 1:
            print(f"  first batch: .jpg {tuple(batch['.jpg'].shape)} {batch['.jpg'].dtype}, "
                  f".cls {batch['.cls'].tolist()[:8]}")
        if args.max_batches is not None and batches >= args.max_batches:
            break
    elapsed = time.perf_counter() - start
    print(f"  {samples} samples ({len(keys)} distinct) in {batches} batches, {samples / elapsed:.0f} samples/s")
    return samples


def stream_cogs(args: argparse.Namespace, options: dict[str, Any]) -> int:
    url = f"s3://{args.bucket}/{args.cogs}"
    rasters = datasets.RasterDataset(url, storage_options=options)
    print(f"{rasters}: {len(rasters.files)} file(s)")
    sampler = GridGeoSampler(rasters, size=args.patch)
    pipe = sampler.as_pipe().sharding_filter().read_geo(rasters).batch(args.batch_size).collate(
        collate_fn=stack_samples)
    start, patches, batches = time.perf_counter(), 0, 0
    for batch in pipekit.DataLoader(pipe, num_workers=args.workers):
        patches += batch["image"].shape[0]
        batches += 1
        if batches == 1:
            image = batch["image"]
            print(f"  first batch: image {tuple(image.shape)} {image.dtype}, mean {float(image.mean()):.1f}")
        if args.max_batches is not None and batches >= args.max_batches:
            break
    elapsed = time.perf_counter() - start
    print(f"  {patches} of {len(sampler)} patches in {batches} batches, {patches / elapsed:.0f} patches/s")
    return patches


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.manual_seed(0)
    options = storage_options(args)
    if args.upload_demo_data:
        upload_demo_data(args, options)
    samples = stream_shards(args, options)
    patches = stream_cogs(args, options)
    print(f"done: {samples} samples from tar shards and {patches} patches from COGs on s3://{args.bucket}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
