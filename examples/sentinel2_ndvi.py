"""NDVI from Sentinel-2 Level-2A band files, per patch through a pipeline and for a whole tile, with a plot.

What it shows:

* ``datasets.Sentinel2``: one file per band, named as ESA names them
  (``T15TWG_20230715T165849_B04_10m.tif``), 10 m and 20 m bands in sibling
  ``R10m``/``R20m`` folders grouped into one scene and read onto one 10 m
  grid (B11 is resampled);
* a pipe-native pipeline: ``GridGeoSampler(...).as_pipe().read_geo(dataset)
  .append_index("ndvi", nir="B08", red="B04", ...)``, the bands given by name
  and the Level-2A digital numbers turned into reflectance on the way
  (``reflectance = (DN - 1000) / 10000`` since processing baseline 04.00);
* a whole-tile read (``dataset[dataset.bounds]``) and a matplotlib figure:
  true colour, NDVI (-1..1) and its histogram, saved as a PNG.

The band files are written by this script (synthetic land cover: fields,
forest, a river and a town), so it runs with no download; ``--data`` points it
at a folder of real Level-2A band files (``.jp2`` or GeoTIFF) instead.

    python examples/sentinel2_ndvi.py --out ndvi.png
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import rasterio
import torch
from rasterio.transform import from_origin

from pipekit import datasets
from pipekit.geo import GridGeoSampler
from pipekit.geo._plot import stretch
from pipekit.synthetic.geo import CDL_CLASSES, LandCover
from pipekit.transforms import ndvi

TILE = "T15TWG"
SENSING = "20230715T165849"
BANDS = ("B02", "B03", "B04", "B08", "B11")
RESOLUTION = {"B02": 10, "B03": 10, "B04": 10, "B08": 10, "B11": 20}
BOA_OFFSET, QUANTIFICATION = 1000, 10000.0  # Level-2A, processing baseline >= 04.00

# Surface reflectance per land-cover class (CDL codes) in B02, B03, B04, B08, B11.
SIGNATURES = {
    1: (0.04, 0.07, 0.05, 0.45, 0.25),  # corn
    5: (0.04, 0.08, 0.06, 0.40, 0.22),  # soybeans
    24: (0.05, 0.09, 0.10, 0.30, 0.30),  # winter wheat (harvested by July)
    111: (0.06, 0.05, 0.03, 0.02, 0.01),  # open water
    122: (0.10, 0.12, 0.14, 0.20, 0.25),  # developed
    141: (0.02, 0.05, 0.03, 0.35, 0.15),  # deciduous forest
    176: (0.05, 0.08, 0.08, 0.30, 0.28),  # grass/pasture
}
ORIGIN = (446_000.0, 4_648_000.0)  # UTM 15N, around the synthetic river


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="folder of Sentinel-2 L2A band files; default: write a synthetic tile")
    parser.add_argument("--size", type=int, default=1024, help="synthetic tile side in 10 m pixels")
    parser.add_argument("--patch", type=int, default=256, help="patch side of the per-patch pipeline, in pixels")
    parser.add_argument("--out", default="sentinel2_ndvi.png", help="where to save the figure")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def write_tile(root: Path, size: int, seed: int = 0) -> Path:
    """Write one synthetic Level-2A tile: ``<root>/.../IMG_DATA/R10m/T15TWG_..._B04_10m.tif`` etc."""
    cover = LandCover(seed=seed)
    rng = np.random.default_rng(seed)
    granule = root / f"S2A_MSIL2A_{SENSING}_N0509_R026_{TILE}_20230715T221226.SAFE" / "GRANULE" / \
        f"L2A_{TILE}_A042087_20230715T170434" / "IMG_DATA"
    for b, band in enumerate(BANDS):
        res = RESOLUTION[band]
        n = size * 10 // res
        xs = ORIGIN[0] + res * (np.arange(n) + 0.5)
        ys = ORIGIN[1] - res * (np.arange(n) + 0.5)
        classes = cover.classes(xs[None, :], ys[:, None])
        table = np.zeros(256, dtype=np.float32)
        for code, signature in SIGNATURES.items():
            table[code] = signature[b]
        reflectance = table[classes] * (1 + rng.normal(0, 0.05, classes.shape)) + rng.normal(0, 0.003, classes.shape)
        dn = np.clip(np.round(reflectance * QUANTIFICATION) + BOA_OFFSET, 1, 65535).astype(np.uint16)
        path = granule / f"R{res}m" / f"{TILE}_{SENSING}_{band}_{res}m.tif"
        path.parent.mkdir(parents=True, exist_ok=True)
        profile = {"driver": "GTiff", "width": n, "height": n, "count": 1, "dtype": "uint16", "crs": "EPSG:32615",
                   "transform": from_origin(*ORIGIN, res, res), "nodata": 0, "tiled": True, "blockxsize": 256,
                   "blockysize": 256, "compress": "deflate", "predictor": 2}
        with rasterio.open(path, "w", **profile) as dst:
            dst.write(dn, 1)
    return root


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with tempfile.TemporaryDirectory(prefix="sentinel2-") as tmp:
        root = Path(args.data) if args.data else write_tile(Path(tmp), args.size, args.seed)
        dataset = datasets.Sentinel2(root, bands=list(BANDS))
        print(dataset)
        names = sorted(p.relative_to(root).as_posix() for p in root.rglob("T*_B*") if p.is_file())
        print(f"{len(names)} band files, e.g. {names[0]}")
        # DN -> reflectance for the index: reflectance = DN * 1e-4 - 0.1
        to_reflectance = {"scale": 1 / QUANTIFICATION, "offset": -BOA_OFFSET / QUANTIFICATION}

        # 1. Per patch, through a pipeline: the grid of patches -> samples -> NDVI appended as a channel.
        sampler = GridGeoSampler(dataset, size=args.patch)
        pipe = sampler.as_pipe().read_geo(dataset).append_index(
            "ndvi", nir="B08", red="B04", bands=dataset.bands, nodata=0, **to_reflectance
        )
        print(f"{len(sampler)} patches of {args.patch} x {args.patch} px:")
        for i, sample in enumerate(pipe):
            index = sample["image"][-1]
            valid = index[~index.isnan()]
            vegetated = (valid > 0.5).float().mean()
            print(f"  patch {i:2d}  mean NDVI {valid.mean():+.3f}  vegetated (NDVI > 0.5) {vegetated:.0%}")

        # 2. The whole tile at once, for the figure.
        sample = dataset[dataset.bounds]
        image = sample["image"]
        index = ndvi(image, nir=BANDS.index("B08"), red=BANDS.index("B04"), nodata=0, **to_reflectance)[0]
        print(f"tile: {tuple(image.shape)} {image.dtype}, NDVI {np.nanmin(index):+.2f} .. {np.nanmax(index):+.2f}")

        if not args.data:
            # Check against the land cover the tile was drawn from: each class has its expected sign.
            res = dataset.res[0]
            xs = dataset.bounds.minx + res * (np.arange(image.shape[-1]) + 0.5)
            ys = dataset.bounds.maxy - res * (np.arange(image.shape[-2]) + 0.5)
            cover = LandCover(seed=args.seed).classes(xs[None, :], ys[:, None])
            for code in sorted(SIGNATURES):
                pixels = torch.from_numpy(cover == code)
                if pixels.any():
                    print(f"  {CDL_CLASSES[code]:<24s} mean NDVI {float(index[pixels].mean()):+.2f}")

        rgb = image[[BANDS.index("B04"), BANDS.index("B03"), BANDS.index("B02")]].permute(1, 2, 0).numpy()
        rgb = stretch(rgb.reshape(-1, 1, 1)).reshape(rgb.shape)  # one 2-98 % stretch for all three bands
        fig, axes = plt.subplots(1, 3, figsize=(15, 5), gridspec_kw={"width_ratios": [1, 1.2, 1]})
        axes[0].imshow(rgb)
        axes[0].set_title("true colour (B04, B03, B02)")
        shown = axes[1].imshow(index.numpy(), cmap="RdYlGn", vmin=-1, vmax=1)
        axes[1].set_title("NDVI = (B08 - B04) / (B08 + B04)")
        fig.colorbar(shown, ax=axes[1], fraction=0.046)
        axes[2].hist(index[~index.isnan()].numpy().ravel(), bins=100, range=(-1, 1), color="tab:green")
        axes[2].set_title("NDVI histogram")
        axes[2].set_xlabel("NDVI")
        for ax in axes[:2]:
            ax.set_axis_off()
        fig.suptitle(f"Sentinel-2 L2A {TILE}, {SENSING[:4]}-{SENSING[4:6]}-{SENSING[6:8]}")
        fig.tight_layout()
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=100)
        plt.close(fig)
    print(f"saved {out} ({out.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
