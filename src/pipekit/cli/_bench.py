"""``pipekit bench``: throughput of a recipe and the time spent in each pipe of its chain."""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from pipekit.cli._common import (
    CliError,
    add_storage_option_argument,
    default_cache,
    file_kind,
    list_files,
    non_negative_int,
    one_line,
    parse_storage_options,
    positive_int,
)

__all__ = ["add_parser", "run", "build_recipe", "loader_rate"]

RECIPES = ("imagefolder", "webdataset", "geo")


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "bench",
        help="run a recipe for N batches: throughput and the time spent in each pipe",
        description=(
            "Runs a recipe (imagefolder, webdataset or geo) on a given folder, file or URL, or on the built-in "
            "synthetic data when RECIPE_OR_PATH is a recipe name.  First it pulls the batches in this process, "
            "timing every pipe of the chain (its own time, without the pipes it pulls from), so the slow stage "
            "shows in one table; then it measures the end-to-end rate of pipekit.DataLoader with --workers "
            "worker processes."
        ),
    )
    p.add_argument("target", metavar="RECIPE_OR_PATH",
                   help=f"a recipe name ({', '.join(RECIPES)}: on built-in synthetic data) or a path or URL "
                        "(image folder -> imagefolder, tar shards -> webdataset, rasters -> geo)")
    p.add_argument("--recipe", choices=RECIPES, default=None, help="the recipe for a path (default: detected)")
    p.add_argument("--batches", type=positive_int, default=20, help="batches to time (default 20)")
    p.add_argument("--warmup", type=non_negative_int, default=1,
                   help="batches taken before timing, to leave out start-up (default 1)")
    p.add_argument("--workers", type=non_negative_int, default=2,
                   help="DataLoader workers for the end-to-end rate (default 2; 0: in this process only)")
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help="samples per batch (default 32; geo 16)")
    p.add_argument("--size", type=positive_int, default=None,
                   help="image side (imagefolder/webdataset: resized crops, default 224) or patch side in pixels "
                        "(geo, default 256)")
    p.add_argument("--threads", type=positive_int, default=1,
                   help="torch threads while timing in this process (default 1, as in each pipekit.DataLoader "
                        "worker)")
    p.add_argument("--eval", action="store_true", help="the recipe's evaluation mode (no shuffling or augmentation)")
    p.add_argument("--cache", type=Path, default=None,
                   help="where the built-in synthetic data is written (default: $PIPEKIT_CACHE or ~/.cache/pipekit)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    add_storage_option_argument(p)
    p.set_defaults(func=run)


def _detect(target: str, storage_options: dict[str, Any]) -> str:
    listing = list_files(target, storage_options)
    kinds = Counter(k for k in (file_kind(n) for _, n, _ in listing.files) if k is not None)
    if kinds["shard"]:
        return "webdataset"
    if kinds["raster"] or kinds["image"]:
        return "geo" if kinds["raster"] >= kinds["image"] else "imagefolder"
    raise CliError(f"cannot tell which recipe fits {target!r}: no image files, tar shards or rasters in it; "
                   "pass --recipe")


def _geo_products(root: str, storage_options: dict[str, Any]) -> tuple[Any, Any]:
    """The most common image product under ``root`` and the most common mask product (or ``None``)."""
    from pipekit.cli._products import PRODUCTS, detect_product

    listing = list_files(root, storage_options)
    found: Counter = Counter()
    for _, name, _ in listing.files:
        base = name.rsplit("/", 1)[-1]
        if file_kind(base) == "raster":
            product, _ = detect_product(base)
            if product is not None:
                found[product.name] += 1
    images = [(n, k) for k, n in found.items() if not PRODUCTS[k].is_mask]
    masks = [(n, k) for k, n in found.items() if PRODUCTS[k].is_mask]
    if not images:
        raise CliError(f"the geo recipe needs an image product (Landsat, Sentinel-2, NAIP) in {root!r}; "
                       f"found {', '.join(sorted(found)) or 'no product files'}")
    return PRODUCTS[max(images)[1]], (PRODUCTS[max(masks)[1]] if masks else None)


def build_recipe(name: str, root: str | None, *, batch_size: int | None, size: int | None, train: bool,
                 cache: Path | None, storage_options: dict[str, Any]) -> tuple[Any, str]:
    """The recipe ``name`` on ``root`` (``None``: the built-in synthetic data), and a line describing it."""
    from pipekit import datasets

    options = {"storage_options": storage_options} if storage_options else {}
    if name in ("imagefolder", "webdataset"):
        side = size or 224
        batch = batch_size or 32
        if root is None:
            from pipekit.synthetic import write_image_folder, write_image_shards

            if name == "imagefolder":
                root = str(write_image_folder(default_cache(cache) / "bench-images-v1", per_class=64))
            else:
                folder = default_cache(cache) / "bench-shards-v1"
                write_image_shards(folder, shards=4, per_shard=64)
                root = str(folder)
        if name == "imagefolder":
            recipe = datasets.ImageFolder(root, train=train, size=side, batch_size=batch, **options)
            what = f"{len(recipe.samples)} images in {len(recipe.classes)} classes"
        else:
            recipe = datasets.TarShards(root, train=train, size=side, batch_size=batch, **options)
            what = f"{len(recipe.shards)} shards"
        return recipe, f"{name} on {root} ({what}), batches of {batch}, {side}x{side} px"
    side = size or 256
    batch = batch_size or 16
    if root is None:
        from pipekit.synthetic.geo import write_landsat_cdl_corpus

        root = str(write_landsat_cdl_corpus(default_cache(cache) / "landsat-cdl-v1"))
    image_product, mask_product = _geo_products(root, storage_options)
    images = image_product.cls(root, **options)
    if mask_product is None:
        recipe = _images_only(images, side, batch, train)
        return recipe, (f"geo on {root} ({image_product.name} only: no label product found), "
                        f"batches of {batch}, {side}x{side} px patches")
    labels = mask_product.cls(root, **options)
    recipe = datasets.GeoSegmentation(images, labels, size=side, batch_size=batch, train=train)
    return recipe, (f"geo on {root} ({image_product.name} & {mask_product.name}, {len(recipe.sampler)} patches "
                    f"an epoch), batches of {batch}, {side}x{side} px patches, channels {', '.join(recipe.bands)}")


def _images_only(images: Any, size: int, batch: int, train: bool) -> Any:
    """Sampler -> read_geo -> batch of an image product alone (GeoSegmentation needs labels)."""
    from pipekit.geo import GridGeoSampler, RandomGeoSampler, stack_samples

    sampler = RandomGeoSampler(images, size) if train else GridGeoSampler(images, size)
    return sampler.as_pipe().sharding_filter().read_geo(images).batch(batch).collate(collate_fn=stack_samples)


def loader_rate(pipe: Any, workers: int, batches: int) -> dict[str, float]:
    """Time ``batches`` batches of ``pipekit.DataLoader(pipe, num_workers=workers)`` after its first batch."""
    import pipekit
    from pipekit.profiling import batch_length

    loader = pipekit.DataLoader(pipe, num_workers=workers, persistent_workers=False)
    start = time.perf_counter()
    first = None
    count = samples = 0
    while count < batches:
        progressed = False
        for batch in loader:
            progressed = True
            if first is None:
                first = time.perf_counter()
                continue
            count += 1
            samples += batch_length(batch)
            if count >= batches:
                break
        if not progressed:
            raise CliError("the recipe yielded no batches")
    end = time.perf_counter()
    seconds = end - first
    return {"workers": workers, "batches": count, "samples": samples, "seconds": seconds,
            "startup_seconds": first - start, "batches_per_second": count / seconds if seconds > 0 else float("nan"),
            "samples_per_second": samples / seconds if seconds > 0 else float("nan")}


def run(args: argparse.Namespace) -> int:
    from pipekit.profiling import profile_pipeline

    storage_options = parse_storage_options(args.storage_option)
    if args.target in RECIPES:
        if args.recipe is not None and args.recipe != args.target:
            raise CliError(f"--recipe {args.recipe} contradicts the recipe name {args.target!r}")
        name, root = args.target, None
    else:
        root = args.target
        name = args.recipe or _detect(root, storage_options)
    start = time.perf_counter()
    try:
        recipe, description = build_recipe(name, root, batch_size=args.batch_size, size=args.size,
                                           train=not args.eval, cache=args.cache, storage_options=storage_options)
    except (FileNotFoundError, ValueError) as exc:
        raise CliError(f"cannot build the {name} recipe on {root or 'the built-in data'!r}: {one_line(exc)}") from exc
    built = time.perf_counter() - start
    pipe = getattr(recipe, "pipe", recipe)
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)  # a worker's view of the work: several threads per process distort it
    try:
        report = profile_pipeline(pipe, batches=args.batches, warmup=args.warmup)
    finally:
        torch.set_num_threads(threads)
    end_to_end = loader_rate(recipe, args.workers, args.batches) if args.workers > 0 else None
    slowest = report.slowest
    total_own = sum(s.self_seconds for s in report.stages)
    if args.json:
        out = {"recipe": name, "root": root, "description": description, "build_seconds": built,
               "in_process": report.as_dict(), "workers": end_to_end}
        print(json.dumps(out, indent=2))
        return 0
    print(f"pipekit bench: {description} (built in {built:.2f} s)")
    print(f"\nper-stage time in this process ({report.batches} batches after {args.warmup} warm-up, "
          f"{args.threads} torch thread(s); own time of each pipe, without the pipes it pulls from):")
    print(report.table())
    print()
    print(f"in this process: {report.summary()}")
    if end_to_end is not None:
        print(f"with {args.workers} DataLoader worker(s): {end_to_end['batches']} batches ({end_to_end['samples']} "
              f"samples) in {end_to_end['seconds']:.3f} s: {end_to_end['batches_per_second']:.2f} batches/s, "
              f"{end_to_end['samples_per_second']:.1f} samples/s (start-up and first batch "
              f"{end_to_end['startup_seconds']:.2f} s)")
    if slowest is not None and total_own > 0:
        print(f"slowest stage: {slowest.name} ({100 * slowest.self_seconds / total_own:.0f}% of the pipeline's own "
              f"time, {slowest.ms_per_item:.2f} ms per item)")
    return 0
