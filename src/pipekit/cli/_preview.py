"""``pipekit preview``: render one raster sample (RGB, mask, spectral index) to a PNG.

The mask may come from vector files (GeoPackage, GeoJSON, Shapefile...):
their polygons are rasterized onto the image's grid (``--mask fields.gpkg``),
or drawn alone when PATH holds only vector files.
"""

from __future__ import annotations

import argparse
import math
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from pipekit.cli._common import (
    CliError,
    add_storage_option_argument,
    file_kind,
    list_files,
    non_negative_int,
    parse_storage_options,
    positive_int,
)
from pipekit.cli._products import GENERIC, PRODUCTS, Product, detect_product, product_names
from pipekit.geo._bbox import from_slices

__all__ = ["add_parser", "run", "render_preview"]

_ATTEMPTS = 6  # random patches tried to find one without (much) nodata


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "preview",
        help="render a random raster sample (RGB, mask, spectral index) to a PNG",
        description=(
            "Reads one random patch of a raster product and draws it: the product's RGB bands with a 2-98 "
            "percentile stretch, a mask product (e.g. CDL) with its colour map and legend, and a spectral index "
            "(NDVI by default where the product has NIR and red bands).  A folder holding an image product and "
            "a mask product (like the demo corpus) shows both."
        ),
    )
    p.add_argument("path", metavar="PATH_OR_URL", help="a folder, file or URL of rasters")
    p.add_argument("--out", required=True, type=Path, help="the PNG to write")
    p.add_argument("--product", choices=product_names(), default=None,
                   help="the image product (default: detected from the file names)")
    p.add_argument("--mask", metavar="PATH_OR_URL", default=None,
                   help="rasters of a mask product, or vector files (.gpkg, .geojson, .shp...) whose polygons "
                        "are rasterized, to draw beside the image (default: a mask product found in PATH, e.g. CDL)")
    p.add_argument("--mask-product", choices=product_names(), default=None,
                   help="the mask product (default: detected; 'raster' for any single-band class raster)")
    p.add_argument("--index", default=None,
                   help="the spectral index panel: an index name (ndvi, ndwi, nbr, evi...) or 'none' "
                        "(default: ndvi where the product has NIR and red bands)")
    p.add_argument("--label-name", default=None,
                   help="vector masks: the attribute whose integer values are drawn (default: every polygon is 1)")
    p.add_argument("--size", type=positive_int, default=256, help="patch side in pixels (default 256)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="which random patch (default 0)")
    add_storage_option_argument(p)
    p.set_defaults(func=run)


@dataclass
class _Layer:
    product: Product | None  # None: a generic raster
    root: str
    vector: bool = False  # vector files, rasterized (VectorDataset)
    label_name: str | None = None

    @property
    def name(self) -> str:
        if self.vector:
            return "vector"
        return self.product.name if self.product is not None else GENERIC


def _vector_files(path: str, storage_options: dict[str, Any]) -> list[str]:
    """The vector files under ``path`` when it holds vector files and no raster (else ``[]``)."""
    from pipekit.cli._inspection_vectors import is_vector

    listing = list_files(path, storage_options)
    if any(file_kind(name) == "raster" for _, name, _ in listing.files):
        return []
    return [url for url, name, _ in listing.files if is_vector(name)]


def _products_in(path: str, storage_options: dict[str, Any]) -> Counter:
    listing = list_files(path, storage_options)
    found: Counter = Counter()
    for _, name, _ in listing.files:
        base = name.rsplit("/", 1)[-1]
        if file_kind(base) != "raster":
            continue
        product, _ = detect_product(base)
        found[product.name if product is not None else GENERIC] += 1
    if not found:
        kinds = Counter(file_kind(n) for _, n, _ in listing.files)
        hint = ""
        if kinds["image"] or kinds["shard"]:
            hint = " (it holds images or tar shards: 'pipekit inspect' lists them; preview draws rasters)"
        raise CliError(f"no raster files (.tif, .jp2...) in {path!r}{hint}")
    return found


def _pick(found: Counter, wanted: str | None, mask: bool, path: str) -> tuple[bool, Product | None]:
    """``(present, product)``: the product of ``found`` to draw as an image (or a mask); ``None`` is generic."""
    if wanted is not None:
        if wanted == GENERIC:
            return True, None
        if found[wanted] == 0:
            glob = PRODUCTS[wanted].cls.filename_glob.replace("{}", "*")
            raise CliError(f"no {wanted} files (named like {glob!r}) in {path!r}")
        return True, PRODUCTS[wanted]
    fitting = [(n, name) for name, n in found.items() if name != GENERIC and PRODUCTS[name].is_mask == mask]
    if fitting:
        return True, PRODUCTS[max(fitting)[1]]
    if not mask and found[GENERIC]:
        return True, None
    return False, None


def _dataset(layer: _Layer, storage_options: dict[str, Any], mask: bool,
             index: tuple[str, dict[str, str]] | None = None, shared: bool = False) -> Any:
    from pipekit.geo._raster import RasterDataset

    kwargs: dict[str, Any] = {"storage_options": storage_options} if storage_options else {}
    if layer.vector:
        from pipekit.errors import StageError
        from pipekit.geo._vector import VectorDataset

        try:
            return VectorDataset(_vector_files(layer.root, storage_options), label_name=layer.label_name, **kwargs)
        except (StageError, ValueError) as exc:
            raise CliError(str(exc)) from exc
    if layer.product is not None:
        cls = layer.product.cls
        if not mask and cls.all_bands:
            # only the bands drawn: RGB and the index's (fewer files to read, remote ones especially)
            wanted = set(cls.rgb_bands) | (set(index[1].values()) if index is not None else set())
            kwargs["bands"] = [b for b in cls.all_bands if b in wanted]
        return cls(layer.root, **kwargs)
    cls = type("Mask" if mask else "Raster", (RasterDataset,), {"is_image": not mask, "filename_glob": "*"})
    listing = list_files(layer.root, storage_options)
    files = [url for url, name, _ in listing.files if file_kind(name) == "raster"]
    if shared:  # beside a product in the same folder: only the files no product claims
        files = [url for url in files if detect_product(url.rsplit("/", 1)[-1])[0] is None]
    if not files:
        raise CliError(f"no {'mask ' if mask else ''}rasters other than the product's in {layer.root!r}")
    return cls(files, **kwargs)


def _index_spec(index: str | None, layer: _Layer | None) -> tuple[str, dict[str, str]] | None:
    from pipekit.transforms.indices import INDICES

    if index is not None and index.lower() == "none":
        return None
    roles = layer.product.roles if layer is not None and layer.product is not None else {}
    if index is None:
        return ("ndvi", {"nir": roles["nir"], "red": roles["red"]}) if "nir" in roles and "red" in roles else None
    spec = INDICES.get(index.lower())
    if spec is None:
        raise CliError(f"unknown index {index!r}; known indices: {', '.join(sorted(INDICES))}, or 'none'")
    if layer is None:
        raise CliError(f"--index {index}: there is no image product to compute it on")
    missing = [r for r in spec.roles if r not in roles]
    if missing:
        what = layer.name if layer.product is not None else "a generic raster (pass --product)"
        raise CliError(f"--index {index} needs the {', '.join(spec.roles)} bands; {what} has no "
                       f"{', '.join(missing)} band known to pipekit")
    return index.lower(), {r: roles[r] for r in spec.roles}


def _patch_size(ds: Any, size: int) -> int:
    """``size``, or the side of the largest square patch the largest footprint holds."""
    b = ds.geo_index.bounds
    xres, yres = ds.res
    fits = np.minimum(np.floor((b[:, 1] - b[:, 0]) / xres + 1e-6), np.floor((b[:, 3] - b[:, 2]) / yres + 1e-6))
    largest = int(fits.max()) if len(fits) else 0
    if largest < 1:
        raise CliError(f"{ds.name}: every footprint is smaller than one pixel at res {ds.res}")
    return min(size, largest)


def _valid_fraction(sample: dict[str, Any]) -> float:
    import torch

    if "image" in sample:
        image = sample["image"].float()
        invalid = (~torch.isfinite(image) | (image == 0)).all(dim=0)
        return 1.0 - float(invalid.float().mean())
    mask = sample["mask"]
    return float((mask != 0).float().mean())


def _date(seconds: float) -> str:
    if not math.isfinite(seconds):
        return ""
    try:
        return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%d")
    except (OverflowError, OSError, ValueError):
        return ""


def run(args: argparse.Namespace) -> int:
    storage_options = parse_storage_options(args.storage_option)
    out = Path(args.out)
    if out.suffix.lower() != ".png":
        raise CliError(f"--out must name a .png file, got {str(out)!r}")
    if not out.parent.exists():
        raise CliError(f"the folder of --out does not exist: {str(out.parent)!r}")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise CliError("preview needs matplotlib: pip install 'pipekit[plot]'") from None

    image_layer: _Layer | None = None
    mask_layer: _Layer | None = None
    if _vector_files(args.path, storage_options):  # vector files alone: their polygons as a mask
        if args.mask is not None:
            raise CliError(f"{args.path!r} holds vector files only; pass the image rasters as PATH and the "
                           "vector files as --mask")
        mask_layer = _Layer(None, args.path, vector=True, label_name=args.label_name)
        path = render_preview(None, mask_layer, None, out, size=args.size, seed=args.seed,
                              storage_options=storage_options)
        print(path)
        return 0
    found = _products_in(args.path, storage_options)
    present, product = _pick(found, args.product, False, args.path)
    if present and product is not None and product.is_mask:  # --product cdl: the mask alone
        mask_layer = _Layer(product, args.path)
    elif present:
        image_layer = _Layer(product, args.path)
    if mask_layer is None and args.mask is not None and _vector_files(args.mask, storage_options):
        mask_layer = _Layer(None, args.mask, vector=True, label_name=args.label_name)
    elif mask_layer is None and args.mask is not None:
        present, product = _pick(_products_in(args.mask, storage_options), args.mask_product, True, args.mask)
        if not present:
            raise CliError(f"no mask product (e.g. CDL) detected in {args.mask!r}; pass --mask-product raster "
                           "to read its rasters as class masks")
        mask_layer = _Layer(product, args.mask)
    elif mask_layer is None:
        present, product = _pick(found, args.mask_product, True, args.path)
        if present and (args.mask_product is not None or product is not None):
            mask_layer = _Layer(product, args.path)
    if image_layer is None and mask_layer is None:
        raise CliError(f"nothing to draw in {args.path!r}: found {', '.join(sorted(found))} rasters but no image "
                       "product; pass --product")
    index = _index_spec(args.index, image_layer)
    path = render_preview(image_layer, mask_layer, index, out, size=args.size, seed=args.seed,
                          storage_options=storage_options)
    print(path)
    return 0


def render_preview(
    image_layer: _Layer | None,
    mask_layer: _Layer | None,
    index: tuple[str, dict[str, str]] | None,
    out: Path,
    *,
    size: int,
    seed: int,
    storage_options: dict[str, Any],
) -> str:
    """Read a random patch and draw it; returns the line to print."""
    import torch

    from pipekit.geo import RandomGeoSampler

    shared = image_layer is not None and mask_layer is not None and image_layer.root == mask_layer.root
    image_ds = _dataset(image_layer, storage_options, False, index, shared) if image_layer is not None else None
    mask_ds = _dataset(mask_layer, storage_options, True, None, shared) if mask_layer is not None else None
    if image_ds is not None and mask_ds is not None:
        try:
            ds = image_ds & mask_ds
        except ValueError as exc:
            raise CliError(str(exc)) from exc
    else:
        ds = image_ds if image_ds is not None else mask_ds
        if image_ds is None and mask_layer is not None and mask_layer.vector:
            # polygons alone: a resolution that fits their whole extent into the patch
            extent = ds._extent()
            ds.res = max(extent.maxx - extent.minx, extent.maxy - extent.miny) / size
    side = _patch_size(ds, size)
    sampler = RandomGeoSampler(ds, size=side, length=_ATTEMPTS, generator=torch.Generator().manual_seed(seed))
    best: tuple[float, Any] | None = None
    for box in sampler:
        sample = ds[box]
        valid = _valid_fraction(sample)
        if best is None or valid > best[0]:
            best = (valid, sample)
        if valid >= 0.95:
            break
    if best is None:  # the sampler had nothing to draw (it says why)
        reason = getattr(sampler, "empty_reason", None) or "no patch of this size fits the data"
        raise CliError(f"nothing to preview: {reason}; try a smaller --size")
    valid, sample = best

    panels: list[tuple[str, Any]] = []
    notes = []
    if image_ds is not None:
        image = sample["image"].float()
        blank = (~torch.isfinite(image) | (image == 0)).all(dim=0)
        product = image_layer.product
        rgb_names = [b for b in (product.cls.rgb_bands if product is not None else ()) if b in image_ds.bands]
        if len(rgb_names) == 3:
            rgb = [image_ds.bands.index(b) for b in rgb_names]
            label = f"RGB ({', '.join(rgb_names)})"
        elif image.shape[0] >= 3:
            rgb, label = [0, 1, 2], "bands 1, 2, 3"
        else:
            rgb, label = [0], "band 1"
        panels.append(("rgb", (image[rgb], blank, label)))
        if index is not None:
            from pipekit.transforms import AppendIndex

            name, roles = index
            scale = product.scale if product is not None else 1.0
            offset = product.offset if product is not None else 0.0
            nodata = image_ds.nodata
            values = AppendIndex(name, bands=list(image_ds.bands), scale=scale, offset=offset,
                                 nodata=nodata, **roles).compute(image)[0]
            panels.append(("index", (values, name, roles)))
    if mask_ds is not None:
        mask = sample["mask"]
        panels.append(("mask", (mask, mask_ds)))

    title_bits = [ds.name.strip("()"), f"{side}x{side} px at {ds.res[0]:g} {_units(ds.crs)}",
                  f"{ds.crs.to_string() if ds.crs.to_epsg() is None else f'EPSG:{ds.crs.to_epsg()}'}"]
    bounds = from_slices(sample["bounds"])  # TorchGeo 0.8's (slice x, slice y, slice t)
    when = _date(bounds.mint_s)
    if when:
        title_bits.append(when)
    _draw(panels, out, " | ".join(title_bits))
    if side < size:
        notes.append(f"patch shrunk to {side} px, the largest that fits a footprint")
    if valid < 0.95:
        notes.append(f"{100 * (1 - valid):.0f}% of the patch is nodata (best of {_ATTEMPTS} random patches)")
    drawn = " + ".join(
        {"rgb": lambda p: p[2], "index": lambda p: p[1], "mask": lambda p: f"{mask_layer.name} mask"}[kind](payload)
        for kind, payload in panels
    )
    b = bounds
    digits = 6 if ds.crs.is_geographic else 0
    corners = ", ".join(f"{v:.{digits}f}" for v in (b.minx, b.miny, b.maxx, b.maxy))
    line = f"wrote {out}: {drawn}; {side}x{side} px of {ds.name} at ({corners}) in {title_bits[2]}" + (
        f", {when}" if when else "")
    return line + "".join(f"\nnote: {n}" for n in notes)


def _units(crs: Any) -> str:
    return "deg" if crs.is_geographic else "m"


def _draw(panels: list[tuple[str, Any]], out: Path, title: str) -> None:
    import matplotlib.patches as mpatches
    from matplotlib.figure import Figure

    from pipekit.geo._plot import stretch

    fig = Figure(figsize=(4.6 * len(panels) + (1.8 if any(k == "mask" for k, _ in panels) else 0.4), 5.0), dpi=100)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (kind, payload) in zip(axes, panels):
        ax.set_xticks([])
        ax.set_yticks([])
        if kind == "rgb":
            image, blank, label = payload
            array = image.numpy().astype(np.float64)
            array[:, blank.numpy()] = np.nan
            picture = stretch(np.moveaxis(array, 0, -1))
            ax.imshow(picture[..., 0] if picture.shape[-1] == 1 else picture,
                      cmap="gray" if picture.shape[-1] == 1 else None, interpolation="nearest")
            ax.set_title(label)
        elif kind == "index":
            values, name, roles = payload
            im = ax.imshow(values.numpy(), cmap="RdYlGn", vmin=-1.0, vmax=1.0, interpolation="nearest")
            fig.colorbar(im, ax=ax, fraction=0.046, pad=0.03)
            ax.set_title(f"{name.upper()} ({', '.join(f'{r}={b}' for r, b in roles.items())})")
        else:
            mask, mask_ds = payload
            mask = mask.numpy().astype(np.int64)
            if mask.ndim == 3:
                mask = mask[0]
            spec = mask_ds._plot_spec()  # the colours of the mask's values: CDL's ordinal labels, not its codes
            cmap = spec.get("cmap") or {}
            names = spec.get("class_names") or {}
            values, counts = np.unique(mask, return_counts=True)
            rgba = np.zeros((*mask.shape, 4))
            handles = []
            fallback = _tab20()
            for k, (v, n) in enumerate(zip(values.tolist(), counts.tolist())):
                colour = cmap.get(v)
                if colour is None:
                    colour = fallback[k % len(fallback)]
                colour = tuple(colour) if len(colour) == 4 else (*colour, 255)
                rgba[mask == v] = [c / 255.0 for c in colour]
                label = f"{v}: {names[v]}" if v in names else str(v)
                handles.append(mpatches.Patch(facecolor=[c / 255.0 for c in colour[:3]], edgecolor="black",
                                              label=f"{label} ({100 * n / mask.size:.0f}%)"))
            ax.imshow(rgba, interpolation="nearest")
            ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)
            ax.set_title(f"{mask_ds.name} mask")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, format="png")


def _tab20() -> list[tuple[int, int, int, int]]:
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    return [tuple(int(255 * c) for c in cmap(i)) for i in range(20)]
