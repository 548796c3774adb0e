"""A realistic synthetic Landsat 8 + CDL corpus, written locally (no download).

Land cover is a deterministic function of map position (fields about 600 m
across, a river, a town), evaluated on each product's own grid:

* Landsat 8 Collection 2 Level-2 scenes in UTM zone 15N (EPSG:32615): one
  GeoTIFF per band (``LC08_L2SP_026031_20230715_20230725_02_T1_SR_B4.TIF``),
  uint16 surface reflectance with the real C2 scaling (reflectance =
  DN * 2.75e-5 - 0.2) from per-class spectral signatures plus noise, tiled 256
  and DEFLATE-compressed, nodata 0;
* a Cropland Data Layer raster ``2023_30m_cdls.tif`` in CONUS Albers
  (EPSG:5070), uint8 CDL class codes with the CDL colour map, covering all
  scenes.

Because both are drawn from the same land cover, a model can learn the CDL
classes from the Landsat bands, and their different CRSs exercise
reprojection.  The corpus is cached: a ``.complete`` marker is written last.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

import numpy as np
import rasterio
from pyproj import Transformer
from rasterio.transform import from_origin
from rasterio.warp import transform_bounds
from tqdm import tqdm

__all__ = ["LandCover", "write_landsat_cdl_corpus", "LANDSAT8_BANDS", "CDL_CLASSES"]

LANDSAT8_BANDS = ("SR_B1", "SR_B2", "SR_B3", "SR_B4", "SR_B5", "SR_B6", "SR_B7", "ST_B10", "QA_PIXEL")

# CDL codes used by the synthetic land cover, with their USDA names.
CDL_CLASSES = {
    1: "Corn",
    5: "Soybeans",
    24: "Winter Wheat",
    111: "Open Water",
    122: "Developed/Low Intensity",
    141: "Deciduous Forest",
    176: "Grass/Pasture",
}

# Surface reflectance of each class in SR_B1..SR_B7 (coastal, blue, green, red, NIR, SWIR1, SWIR2).
_SIGNATURES = {
    1: (0.035, 0.04, 0.07, 0.05, 0.45, 0.25, 0.12),
    5: (0.035, 0.04, 0.08, 0.06, 0.40, 0.22, 0.11),
    24: (0.045, 0.05, 0.09, 0.10, 0.30, 0.30, 0.18),
    111: (0.07, 0.06, 0.05, 0.03, 0.02, 0.01, 0.01),
    122: (0.09, 0.10, 0.12, 0.14, 0.20, 0.25, 0.22),
    141: (0.02, 0.02, 0.05, 0.03, 0.35, 0.15, 0.07),
    176: (0.045, 0.05, 0.08, 0.08, 0.30, 0.28, 0.15),
}
_FIELD_CLASSES = np.array([1, 1, 1, 5, 5, 5, 24, 141, 176, 176], dtype=np.uint8)
_UTM = "EPSG:32615"
_ALBERS = "EPSG:5070"


@dataclass(frozen=True)
class LandCover:
    """Land cover as a function of UTM 15N coordinates (metres)."""

    seed: int = 0
    field: float = 600.0

    def classes(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """CDL class codes at points ``(x, y)`` (EPSG:32615)."""
        # Fields: a jittered grid of cells, each with a class drawn from a hash of its id.
        jx = x + 120.0 * np.sin(y / 900.0 + self.seed)
        jy = y + 120.0 * np.cos(x / 1100.0 + self.seed)
        cx = np.floor(jx / self.field).astype(np.int64)
        cy = np.floor(jy / self.field).astype(np.int64)
        h = (cx * 73856093) ^ (cy * 19349663) ^ (self.seed * 83492791)
        h = (h ^ (h >> 13)) * 0x5BD1E995
        out = _FIELD_CLASSES[(h >> 7) % len(_FIELD_CLASSES)]
        # A river meandering north-south, and a town.
        river = np.abs(x - (450_000.0 + 2500.0 * np.sin(y / 7000.0))) < 90.0
        town = (x - 470_000.0) ** 2 + (y - 4_640_000.0) ** 2 < 2500.0**2
        out = np.where(town, 122, out)
        return np.where(river, 111, out).astype(np.uint8)


def _reflectance_dn(classes: np.ndarray, band: int, rng: np.random.Generator) -> np.ndarray:
    table = np.zeros(256, dtype=np.float32)
    for code, sig in _SIGNATURES.items():
        table[code] = sig[band]
    refl = table[classes] * (1.0 + rng.normal(0.0, 0.06, size=classes.shape).astype(np.float32))
    refl += rng.normal(0.0, 0.004, size=classes.shape).astype(np.float32)
    dn = (np.clip(refl, -0.19, 1.3) + 0.2) / 2.75e-5
    return np.clip(dn, 1, 65535).astype(np.uint16)


def _profile(width: int, height: int, dtype: str, crs: str, transform, nodata: int) -> dict:
    return {
        "driver": "GTiff",
        "width": width,
        "height": height,
        "count": 1,
        "dtype": dtype,
        "crs": crs,
        "transform": transform,
        "nodata": nodata,
        "tiled": True,
        "blockxsize": 256,
        "blockysize": 256,
        "compress": "deflate",
        "predictor": 2,
        "zlevel": 1,
    }


def _write_scene(
    root: Path, scene: str, origin: tuple[float, float], size: int, cover: LandCover, seed: int, bar: tqdm
) -> None:
    scene_dir = root / "landsat8" / scene
    scene_dir.mkdir(parents=True, exist_ok=True)
    x0, y0 = origin
    xs = x0 + 30.0 * (np.arange(size) + 0.5)
    ys = y0 - 30.0 * (np.arange(size) + 0.5)
    classes = cover.classes(xs[None, :], ys[:, None])
    transform = from_origin(x0, y0, 30.0, 30.0)
    rng = np.random.default_rng(seed)
    for b, band in enumerate(LANDSAT8_BANDS):
        if band == "ST_B10":
            data = (42700 + rng.normal(0, 150, size=classes.shape) - (classes == 111) * 900).astype(np.uint16)
        elif band == "QA_PIXEL":
            data = np.where(classes == 111, 21952, 21824).astype(np.uint16)
        else:
            data = _reflectance_dn(classes, b, rng)
        path = scene_dir / f"{scene}_{band}.TIF"
        with rasterio.open(path, "w", **_profile(size, size, "uint16", _UTM, transform, 0)) as dst:
            dst.write(data, 1)
        bar.update()


def _write_cdl(root: Path, bounds_utm: tuple[float, float, float, float], cover: LandCover, bar: tqdm) -> None:
    from pipekit.datasets.cdl import CDL

    left, bottom, right, top = transform_bounds(_UTM, _ALBERS, *bounds_utm, densify_pts=21)
    left, bottom = np.floor(left / 30.0) * 30.0 - 300.0, np.floor(bottom / 30.0) * 30.0 - 300.0
    right, top = np.ceil(right / 30.0) * 30.0 + 300.0, np.ceil(top / 30.0) * 30.0 + 300.0
    width, height = round(float(right - left) / 30.0), round(float(top - bottom) / 30.0)
    to_utm = Transformer.from_crs(_ALBERS, _UTM, always_xy=True)
    out = np.zeros((height, width), dtype=np.uint8)
    xs = left + 30.0 * (np.arange(width) + 0.5)
    step = 256
    for r0 in range(0, height, step):
        ys = top - 30.0 * (np.arange(r0, min(r0 + step, height)) + 0.5)
        gx, gy = np.meshgrid(xs, ys)
        ux, uy = to_utm.transform(gx, gy)
        out[r0 : r0 + len(ys)] = cover.classes(ux, uy)
    path = root / "cdl" / "2023_30m_cdls.tif"
    path.parent.mkdir(parents=True, exist_ok=True)
    cmap = getattr(CDL, "cmap", None)
    profile = _profile(width, height, "uint8", _ALBERS, from_origin(left, top, 30, 30), 0)
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(out, 1)
        if cmap:
            dst.write_colormap(1, {int(k): tuple(int(c) for c in v[:4]) for k, v in dict(cmap).items()})
    bar.update()


def write_landsat_cdl_corpus(
    root: str | Path, size: int = 1024, scenes: int = 2, seed: int = 0, progress: bool = True
) -> Path:
    """Write ``root/landsat8/<scene>/<scene>_<band>.TIF`` and ``root/cdl/2023_30m_cdls.tif``.

    Args:
        root: the corpus directory (reused when complete).
        size: scene side in pixels (30 m); real scenes are ~7,600.
        scenes: number of Landsat 8 scenes, on successive dates, each shifted
            by a third of a scene so they overlap.
        seed: land cover and noise seed.
        progress: show a progress bar.

    Returns ``root``.
    """
    root = Path(root)
    marker = root / ".complete"
    if marker.exists():
        return root
    cover = LandCover(seed=seed)
    x0, y0 = 420_000.0, 4_660_000.0  # central Iowa, UTM 15N
    shift = 30.0 * (size // 3)
    origins = [(x0 + i * shift, y0 - i * shift) for i in range(scenes)]
    with tqdm(total=scenes * len(LANDSAT8_BANDS) + 1, desc=f"writing synthetic Landsat 8 + CDL to {root}",
              unit="file", disable=not progress) as bar:
        for i, origin in enumerate(origins):
            acquired = date(2023, 7, 15) + timedelta(days=16 * i)  # Landsat 8 revisits every 16 days
            processed = acquired + timedelta(days=10)
            scene = f"LC08_L2SP_026031_{acquired:%Y%m%d}_{processed:%Y%m%d}_02_T1"
            _write_scene(root, scene, origin, size, cover, seed + i, bar)
        extent = 30.0 * size
        bounds = (x0, y0 - extent - (scenes - 1) * shift, x0 + extent + (scenes - 1) * shift, y0)
        _write_cdl(root, bounds, cover, bar)
    marker.touch()
    return root
