"""Draw the documentation's pictures into ``docs/assets/figures/`` from pipekit itself.

``./run docs`` runs this before mkdocs builds, so every picture shows what the code does now: each is drawn
from the synthetic corpus (:mod:`pipekit.synthetic`), the CC0 rasters in ``tests/data/`` (see its README) or
``benchmarks/README.md``, read with pipekit's own datasets and transforms.  The PNGs are committed too, so the
site builds from a clone without drawing them; drawing is deterministic (fixed seeds, no timestamps in the
files), so a picture the code changed shows up in ``git diff`` after ``./run docs``.

Usage::

    python scripts/docs_figures.py                 # every figure
    python scripts/docs_figures.py --only ratios   # one (tests/test_docs.py draws this one)
    python scripts/docs_figures.py --out /tmp/figs # elsewhere

Needs the ``docs`` extra (matplotlib, and the ``geo`` and ``stac`` extras for the rasters and the STAC item).
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
OUT = ROOT / "docs" / "assets" / "figures"
DPI = 80


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 9, "axes.titlesize": 9, "figure.dpi": DPI})
    return plt


def _save(fig, path: Path) -> None:
    # no "Software"/date metadata: the same drawing gives the same bytes
    fig.savefig(path, dpi=DPI, bbox_inches="tight", metadata={"Software": None})
    _plt().close(fig)


def _stretch(image):
    """``[C, H, W]`` -> ``[H, W, C]`` in 0..1, each band stretched between its 2nd and 98th percentiles."""
    import numpy as np

    array = np.asarray(image, dtype="float64")
    out = np.zeros_like(array)
    for i, band in enumerate(array):
        valid = band[band > 0] if (band > 0).any() else band
        lo, hi = np.percentile(valid, [2, 98])
        out[i] = np.clip((band - lo) / max(hi - lo, 1e-9), 0, 1)
    return out.transpose(1, 2, 0) if out.shape[0] > 1 else out[0]


def landsat_cdl(out: Path) -> None:
    """geospatial guide: a ``Landsat8 & CDL`` sample, the image and its mask side by side."""
    from pandas import Timestamp

    from pipekit.datasets import CDL, Landsat8
    from pipekit.geo import plot_sample
    from pipekit.synthetic.geo import write_landsat_cdl_corpus

    root = write_landsat_cdl_corpus(tempfile.mkdtemp(), size=256, scenes=1, progress=False)
    landsat8 = Landsat8(paths=f"{root}/landsat8", bands=["SR_B4", "SR_B3", "SR_B2"])
    cdl = CDL(paths=f"{root}/cdl")
    dataset = landsat8 & cdl
    x, y, _ = dataset.bounds
    size = 160 * 30
    sample = dataset[x.start:x.start + size, y.stop - size:y.stop, Timestamp(2023, 1, 1):Timestamp(2023, 12, 31)]
    title = "(landsat8 & cdl)[query]: image and mask"
    fig = plot_sample(sample, rgb=[0, 1, 2], cmap=cdl.cmap, class_names=cdl.class_names, suptitle=title)
    fig.set_size_inches(7, 3.4)
    _save(fig, out / "landsat-cdl-sample.png")


def reprojection(out: Path) -> None:
    """geospatial guide: one real raster read in its own CRS (UTM 18N) and reprojected to EPSG:4326."""
    from pipekit.geo import RasterDataset

    plt = _plt()
    path = str(DATA / "RGB.byte.tif")
    native = RasterDataset(paths=path, res=1200)
    geographic = RasterDataset(paths=path, crs="EPSG:4326", res=0.011)
    fig, axes = plt.subplots(1, 2, figsize=(7.5, 3.6), layout="constrained")
    for ax, ds, title, unit in (
        (axes[0], native, "RasterDataset(paths=...): EPSG:32618 (UTM 18N)", "m"),
        (axes[1], geographic, 'RasterDataset(paths=..., crs="EPSG:4326")', "degrees"),
    ):
        x, y, t = ds.bounds
        sample = ds[x, y, t]
        ax.imshow(_stretch(sample["image"]), extent=(x.start, x.stop, y.start, y.stop), aspect="equal")
        ax.set_title(title)
        ax.set_xlabel(f"x ({unit})")
    axes[0].ticklabel_format(style="sci", scilimits=(0, 0))
    axes[1].ticklabel_format(useOffset=False, style="plain")
    fig.suptitle("Landsat 7 RGB.byte.tif (CC0): before and after reprojection, read window by window")
    _save(fig, out / "reprojection.png")


def _real_patch():
    """A 128 px patch of RGB.byte.tif over the Bahamas' shallows, as uint8 ``[3, H, W]``."""
    from pipekit.geo import RasterDataset

    ds = RasterDataset(paths=str(DATA / "RGB.byte.tif"), dtype="native")
    x, y, t = ds.bounds
    x0, y0 = x.start + 330 * 300, y.stop - 420 * 300
    return ds[x0:x0 + 128 * 300, y0 - 128 * 300:y0, t]["image"]


def augmentations(out: Path) -> None:
    """transforms guide: the same real patch through ``Augment`` with six seeds."""
    import torch
    from torchvision.transforms import v2

    from pipekit.transforms import Augment, RandomBrightness, RandomRot90

    plt = _plt()
    patch = _real_patch()
    ops = [v2.RandomResizedCrop(128, scale=(0.3, 1.0), antialias=True), v2.RandomHorizontalFlip(), RandomRot90(),
           RandomBrightness(0.25)]
    fig, axes = plt.subplots(1, 6, figsize=(9, 1.9))
    axes[0].imshow(_stretch(patch))
    axes[0].set_title("the patch")
    mask = torch.zeros(128, 128, dtype=torch.int64)
    mask[:64, :64] = 1
    for seed, ax in enumerate(axes[1:], start=1):
        image = Augment(ops, seed=seed)({"image": patch.float() / 255, "mask": mask})["image"]
        ax.imshow(_stretch(image * 255))
        ax.set_title(f"seed={seed}")
    for ax in axes:
        ax.set_axis_off()
    fig.suptitle("Augment([RandomResizedCrop, RandomHorizontalFlip, RandomRot90, RandomBrightness], seed=...)")
    _save(fig, out / "augmentations.png")


def spectral_indices(out: Path) -> None:
    """transforms guide: normalized differences of the real patch's bands (red, green, blue)."""
    from pipekit.transforms.indices import AppendNormalizedDifferenceIndex

    plt = _plt()
    patch = _real_patch().float()
    green_red = AppendNormalizedDifferenceIndex(index_a=1, index_b=0)(patch)[0][-1]
    blue_red = AppendNormalizedDifferenceIndex(index_a=2, index_b=0)(patch)[0][-1]
    fig, axes = plt.subplots(1, 3, figsize=(7.5, 2.6))
    axes[0].imshow(_stretch(patch))
    axes[0].set_title("RGB.byte.tif patch (Landsat 7)")
    for ax, index, title in (
        (axes[1], green_red, "(green - red) / (green + red)"),
        (axes[2], blue_red, "(blue - red) / (blue + red)"),
    ):
        shown = ax.imshow(index.numpy(), cmap="RdYlBu", vmin=-0.6, vmax=0.6)
        ax.set_title(title)
        fig.colorbar(shown, ax=ax, fraction=0.046, pad=0.04)
    for ax in axes:
        ax.set_axis_off()
    fig.suptitle("AppendNormalizedDifferenceIndex(index_a=..., index_b=0): shallow water stands out")
    _save(fig, out / "spectral-indices.png")


def stac_footprints(out: Path) -> None:
    """STAC guide: an item across the antimeridian, one footprint in its UTM zone and two in EPSG:4326."""
    import numpy as np
    import rasterio
    from affine import Affine
    from matplotlib.patches import Rectangle

    from pipekit.datasets import STACDataset
    from pipekit.geo import RasterDataset

    plt = _plt()
    root = tempfile.mkdtemp()
    grid = [2000, 0, 780000, 0, -2000, 8116000]  # as the guide's example: UTM 60S, across 180 degrees
    with rasterio.open(f"{root}/B04.tif", "w", driver="GTiff", width=48, height=48, count=1, dtype="uint16",
                       crs="EPSG:32760", transform=Affine(*grid)) as f:
        f.write(np.full((1, 48, 48), 7, dtype="uint16"))
    item = {"type": "Feature", "stac_version": "1.0.0", "id": "S2B_60KYF_20240105_0_L2A", "geometry": None,
            "properties": {"datetime": "2024-01-05T22:25:48Z", "proj:epsg": 32760}, "links": [],
            "assets": {"red": {"href": f"{root}/B04.tif", "proj:shape": [48, 48], "proj:transform": grid,
                               "eo:bands": [{"name": "B04", "common_name": "red"}]}}}
    geographic = STACDataset([item], assets=["red"], crs="EPSG:4326", res=0.01)
    own = STACDataset([item], assets=["red"])
    boxes = geographic.geo_index.bounds[:, :4]

    world = RasterDataset(paths=str(DATA / "world.rgb.tif"), dtype="native")
    x, y, t = world.bounds
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.6), gridspec_kw={"width_ratios": [2.2, 1, 1]}, layout="constrained")
    axes[0].imshow(_stretch(world[x, y, t]["image"]), extent=(x.start, x.stop, y.start, y.stop))
    for west, east, south, north in boxes:
        axes[0].add_patch(Rectangle((west - 6, south - 6), east - west + 12, north - south + 12, fill=False,
                                    edgecolor="yellow", linewidth=2.5))
    axes[0].set_title("EPSG:4326: the item's two index entries\n(yellow), at both edges of the map")
    axes[0].set_xlabel("longitude")
    axes[0].set_ylabel("latitude")
    for ax, (west, east, south, north), side in zip(axes[1:], boxes, ("west of 180°", "east of 180°")):
        ax.add_patch(Rectangle((west, south), east - west, north - south, color="tab:red", alpha=0.4))
        ax.axvline(180 if west > 0 else -180, color="k", linestyle="--", linewidth=1)
        ax.set_xlim((west - 0.3, 180.0) if west > 0 else (-180.0, east + 0.3))
        ax.set_ylim(south - 0.3, north + 0.3)
        ax.set_title(f"entry {side}\nlon {west:.2f}..{east:.2f}")
        ax.set_xlabel("longitude")
    fig.suptitle(
        f"STACDataset([item], crs='EPSG:4326'): {len(geographic)} entries; in its own UTM zone 60S: {len(own)}"
    )
    _save(fig, out / "stac-antimeridian.png")


_RATIO = re.compile(r"\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?x\b")


def benchmark_ratios(readme: Path | None = None) -> list[tuple[str, float, float]]:
    """``(label, low, high)`` for each ratio (``1.5x``, ``0.98-0.99x``) in the headline column of
    ``benchmarks/README.md``'s first table; the label is the script and the clause the ratio stands in."""
    text = (readme or ROOT / "benchmarks" / "README.md").read_text()
    found = []
    for line in text.split("\n\n| script |", 1)[1].split("\n\n", 1)[0].splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3:
            continue
        script = cells[0].strip("`").removesuffix(".py")
        for clause in re.split(r"[;,] ", cells[-1]):
            for ratio in _RATIO.findall(clause):
                low, _, high = ratio[:-1].partition("-")
                note = re.sub(r"\s+", " ", clause.replace(ratio, "").strip(" :"))
                note = note if len(note) <= 44 else note[:43] + "…"
                found.append((f"{script}: {ratio} {note}".strip(), float(low), float(high or low)))
    return found


def ratios(out: Path) -> None:
    """performance page: the benchmarks' headline ratios, parsed from ``benchmarks/README.md``."""
    plt = _plt()
    rows = benchmark_ratios()
    if not rows:
        raise SystemExit("docs_figures: no ratios in benchmarks/README.md's headline table")
    fig, ax = plt.subplots(figsize=(7.5, 0.32 * len(rows) + 0.9))
    for i, (_, low, high) in enumerate(rows):
        ax.plot([low, high], [i, i], color="tab:blue", linewidth=6, solid_capstyle="butt")
        ax.plot([low, high], [i, i], "|", color="tab:blue", markersize=10)
    ax.axvline(1.0, color="k", linewidth=1)
    ax.set_xscale("log")
    ax.set_yticks(range(len(rows)), [label for label, _, _ in rows])
    ax.invert_yaxis()
    ax.set_xlabel("ratio, as benchmarks/README.md states it (1 = on par; log scale)")
    ax.set_title("Headline ratios of benchmarks/README.md (each row: what its clause compares)")
    ax.grid(axis="x", which="both", alpha=0.3)
    _save(fig, out / "benchmark-ratios.png")


FIGURES: dict[str, Callable[[Path], None]] = {
    "landsat-cdl": landsat_cdl,
    "reprojection": reprojection,
    "augmentations": augmentations,
    "indices": spectral_indices,
    "stac": stac_footprints,
    "ratios": ratios,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=sorted(FIGURES), help="draw only these figures")
    parser.add_argument("--out", type=Path, default=OUT, help=f"folder to write into (default {OUT})")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.only or FIGURES:
        start = time.perf_counter()
        FIGURES[name](args.out)
        print(f"docs_figures: {name} in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
