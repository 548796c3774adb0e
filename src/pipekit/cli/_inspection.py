"""``pipekit inspect``: what a folder or bucket of rasters, images, tar shards or vector files holds, or a STAC catalog.

This module holds the command (its arguments, and choosing what to inspect);
the findings and their tables live in :mod:`pipekit.cli._inspection_rasters`,
:mod:`pipekit.cli._inspection_images`, :mod:`pipekit.cli._inspection_shards` and
:mod:`pipekit.cli._inspection_vectors` and :mod:`pipekit.cli._inspection_stac` (catalogs, STAC APIs,
stac-geoparquet).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from typing import Any

from pipekit.cli._common import (
    CliError,
    add_storage_option_argument,
    credentials_hint,
    file_kind,
    list_files,
    parse_storage_options,
    positive_int,
)
from pipekit.cli._inspection_images import inspect_images
from pipekit.cli._inspection_rasters import inspect_rasters
from pipekit.cli._inspection_shards import inspect_shards
from pipekit.cli._inspection_stac import inspect_stac, looks_like_stac
from pipekit.cli._inspection_vectors import inspect_vectors, is_vector
from pipekit.cli._products import product_names

__all__ = ["add_parser", "run", "inspect_rasters", "inspect_images", "inspect_shards"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "inspect",
        help="list what a folder or bucket holds: rasters, an image folder, tar shards, vector files or a STAC catalog",
        description=(
            "Rasters (GeoTIFF, COG, JPEG 2000): a table of files (scenes of band files grouped) with product, "
            "CRS, resolution, size, bands, dates and footprint, and their union footprint.  Image folders "
            "(root/<class>/<image>) and tar shards (WebDataset): counts per class, sizes and formats.  Vector files "
            "(GeoPackage, GeoJSON, Shapefile, FlatGeobuf, GeoParquet): features, geometry types, CRS, bounds "
            "and attributes of each layer.  STAC (a catalog.json/collection.json, a STAC API URL or a "
            "stac-geoparquet file): items, collections, time span, assets and their bands, CRSs.  Works "
            "on local paths and fsspec URLs such as s3://bucket/prefix."
        ),
    )
    p.add_argument("path", metavar="PATH_OR_URL", help="a folder, a file, or a URL (s3://bucket/prefix)")
    p.add_argument("--product", choices=product_names(), default=None,
                   help="only the rasters of this product (default: every raster, products detected by file name)")
    p.add_argument("--kind", choices=["rasters", "images", "shards", "vectors", "stac"], default=None,
                   help="what to inspect when a folder holds several kinds of files (default: the most common)")
    p.add_argument("--sample", type=positive_int, default=100,
                   help="images whose headers are read for sizes and modes (default 100)")
    p.add_argument("--json", action="store_true", help="print the findings as JSON instead of tables")
    add_storage_option_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    storage_options = parse_storage_options(args.storage_option)
    guess_stac = args.kind is None and args.product is None and looks_like_stac(args.path, storage_options)
    if args.kind == "stac" or guess_stac:
        # a STAC catalog/collection, a STAC API's landing page or a stac-geoparquet file
        report = inspect_stac(args.path, storage_options)
        print(json.dumps(report.as_dict(), indent=2, default=str) if args.json else report.render())
        return 1 if report.errors else 0
    listing = list_files(args.path, storage_options)
    kinds = Counter(k for k in (file_kind(name) for _, name, _ in listing.files) if k is not None)
    kinds["vector"] = sum(1 for _, name, _ in listing.files if is_vector(name))
    kind = args.kind
    if args.product is not None:
        if kind not in (None, "rasters"):
            raise CliError(f"--product applies to rasters, not to --kind {kind}")
        kind = "rasters"
    if kind is None:
        if not +kinds:
            what = "the file" if listing.is_file else f"{len(listing.files)} file(s)"
            raise CliError(
                f"nothing to inspect in {args.path!r}: {what} with no raster (.tif, .jp2...), image (.jpg, .png...), "
                "tar shard (.tar) or vector (.gpkg, .geojson, .shp...) extension"
            )
        # shards first (they hold the images), then the most common kind (rasters on a tie)
        kind = "shards" if kinds["shard"] else max(("rasters", "images", "vectors"),
                                                    key=lambda k: (kinds[k[:-1]], k == "rasters"))
    try:
        if kind == "rasters":
            report = inspect_rasters(listing, args.product, storage_options)
        elif kind == "vectors":
            report = inspect_vectors(listing, storage_options)
        elif kind == "images":
            report = inspect_images(listing, args.sample)
        else:
            report = inspect_shards(listing, args.sample)
    except CliError:
        raise
    except Exception as exc:  # credentials that list but cannot read: say how to pass others
        hint = credentials_hint(exc, args.path)
        if hint is None:
            raise
        raise CliError(hint) from exc
    if args.json:
        print(json.dumps(report.as_dict(), indent=2, default=str))
    else:
        print(report.render())
    return 1 if report.errors else 0
