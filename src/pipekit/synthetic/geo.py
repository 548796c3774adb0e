"""Synthetic geospatial corpora in the real products' file layouts, written locally (no download).

:func:`write_landsat_cdl_corpus` writes the corpus of the demo and the
benchmarks (described below).  The product writers lay files out as the
products ship them, for code written against TorchGeo's datasets:

* :func:`write_landsat_scene`: a Landsat 7/8/9 Collection 2 Level-2 scene
  folder with every band file of the real product (``SR_B1`` ..
  ``SR_QA_AEROSOL``, ``ST_*``, ``QA_PIXEL``, ``QA_RADSAT``) and its ``MTL.txt``;
* :func:`write_cdl`: a Cropland Data Layer year (``YYYY_30m_cdls.tif``);
* :func:`write_sentinel2_tile`: Sentinel-2 L2A band files as the Planetary
  Computer serves them (``T40XDH_20220902T090559_B02_10m.tif``);
* :func:`write_surface_water`: the Earth Surface Water dataset's folders
  (``dset-s2/tra_scene``, ``tra_truth``, ``val_scene``, ``val_truth``) of
  6-band Sentinel-2 patches in several UTM zones and their water masks.

All are drawn from one :class:`LandCover` (a deterministic function of UTM
15N position; other CRSs are mapped onto it), so labels agree with images.

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

__all__ = [
    "LandCover",
    "write_landsat_cdl_corpus",
    "write_landsat_scene",
    "write_cdl",
    "write_sentinel2_tile",
    "write_surface_water",
    "landsat_scene_id",
    "LANDSAT8_BANDS",
    "LANDSAT_C2L2_FILES",
    "CDL_CLASSES",
]

LANDSAT8_BANDS = ("SR_B1", "SR_B2", "SR_B3", "SR_B4", "SR_B5", "SR_B6", "SR_B7", "ST_B10", "QA_PIXEL")

#: Every band file of a Collection 2 Level-2 (L2SP) scene, per sensor: ``{band: (data type, nodata)}``.
LANDSAT_C2L2_FILES: dict[str, dict[str, tuple[str, int | None]]] = {
    "LC08": {
        **{f"SR_B{i}": ("uint16", 0) for i in range(1, 8)},
        "SR_QA_AEROSOL": ("uint8", 1),
        "ST_B10": ("uint16", 0),
        **{f"ST_{q}": ("int16", -9999) for q in ("ATRAN", "CDIST", "DRAD", "EMIS", "EMSD", "QA", "TRAD", "URAD")},
        "QA_PIXEL": ("uint16", 1),
        "QA_RADSAT": ("uint16", None),
    },
    "LE07": {
        **{f"SR_B{i}": ("uint16", 0) for i in (1, 2, 3, 4, 5, 7)},
        "SR_ATMOS_OPACITY": ("int16", -9999),
        "SR_CLOUD_QA": ("uint8", None),
        "ST_B6": ("uint16", 0),
        **{f"ST_{q}": ("int16", -9999) for q in ("ATRAN", "CDIST", "DRAD", "EMIS", "EMSD", "QA", "TRAD", "URAD")},
        "QA_PIXEL": ("uint16", 1),
        "QA_RADSAT": ("uint16", None),
    },
}
LANDSAT_C2L2_FILES["LC09"] = LANDSAT_C2L2_FILES["LC08"]

# Which of the surface-reflectance signatures (coastal, blue, green, red, NIR, SWIR1, SWIR2) each SR band holds.
_SR_SIGNATURE = {
    "LC08": {f"SR_B{i}": i - 1 for i in range(1, 8)},
    "LE07": {"SR_B1": 1, "SR_B2": 2, "SR_B3": 3, "SR_B4": 4, "SR_B5": 5, "SR_B7": 6},
}
_SR_SIGNATURE["LC09"] = _SR_SIGNATURE["LC08"]

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
    from pipekit.datasets._cdl import CDL

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


# ---------------------------------------------------------------------------------------------
# product writers


def _utm_classes(cover: LandCover, crs: str, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Land cover at the pixel centres ``xs`` x ``ys`` of a grid in ``crs`` (mapped onto UTM 15N)."""
    gx, gy = np.meshgrid(xs, ys)
    if crs != _UTM:
        gx, gy = Transformer.from_crs(crs, _UTM, always_xy=True).transform(gx, gy)
    return cover.classes(np.asarray(gx), np.asarray(gy))


def landsat_scene_id(sensor: str, path_row: str, acquired: date, processed: date | None = None,
                     level: str = "L2SP", category: str = "T1") -> str:
    """A Collection 2 product id, e.g. ``LC08_L2SP_026031_20230715_20230725_02_T1``."""
    processed = processed or acquired + timedelta(days=10)
    return f"{sensor}_{level}_{path_row}_{acquired:%Y%m%d}_{processed:%Y%m%d}_02_{category}"


def write_landsat_scene(
    root: str | Path,
    scene: str,
    origin: tuple[float, float],
    size: int = 256,
    crs: str = _UTM,
    bands: tuple[str, ...] | None = None,
    cover: LandCover | None = None,
    seed: int = 0,
    blocksize: int = 256,
    flat: bool = False,
) -> Path:
    """Write ``root/<scene>/<scene>_<band>.TIF`` for every band file of a Landsat C2L2 scene, and its ``MTL.txt``.

    With ``flat``, the files go straight into ``root``, as a USGS tarball
    extracts (several scenes then share the folder).

    ``scene`` is the product id (``LC08_...``, ``LC09_...``, ``LE07_...``,
    see :func:`landsat_scene_id`), which picks the sensor's band files
    (:data:`LANDSAT_C2L2_FILES`: data types and nodata as USGS ships them).
    Reflectance bands hold the land cover's signature in C2 digital numbers;
    the other bands plausible constants per class.  30 m pixels from
    ``origin`` (the top-left corner, in ``crs``).

    Returns the folder written to.
    """
    sensor = scene[:4]
    if sensor not in LANDSAT_C2L2_FILES:
        raise ValueError(f"unknown Landsat sensor {sensor!r} in {scene!r}; expected one of {list(LANDSAT_C2L2_FILES)}")
    files = LANDSAT_C2L2_FILES[sensor]
    chosen = tuple(files) if bands is None else tuple(bands)
    unknown = [b for b in chosen if b not in files]
    if unknown:
        raise ValueError(f"{sensor} scenes have no band file(s) {unknown}; they have {list(files)}")
    folder = Path(root) if flat else Path(root) / scene
    folder.mkdir(parents=True, exist_ok=True)
    x0, y0 = origin
    classes = _utm_classes(cover or LandCover(), crs,
                           x0 + 30.0 * (np.arange(size) + 0.5), y0 - 30.0 * (np.arange(size) + 0.5))
    transform = from_origin(x0, y0, 30.0, 30.0)
    rng = np.random.default_rng(seed)
    water = classes == 111
    for band in chosen:
        dtype, nodata = files[band]
        if band in _SR_SIGNATURE[sensor]:
            data = _reflectance_dn(classes, _SR_SIGNATURE[sensor][band], rng)
        elif band.startswith("ST_B"):
            data = (42700 + rng.normal(0, 150, size=classes.shape) - water * 900).astype(np.uint16)
        elif band == "QA_PIXEL":
            data = np.where(water, 21952, 21824).astype(np.uint16)
        elif band in ("SR_QA_AEROSOL", "SR_CLOUD_QA"):
            data = np.where(water, 4, 2).astype(np.uint8) + (rng.random(classes.shape) < 0.05).astype(np.uint8) * 64
        elif band == "QA_RADSAT":
            data = np.zeros(classes.shape, dtype=np.uint16)
        else:  # ST_ATRAN, ST_EMIS... and SR_ATMOS_OPACITY: scaled int16 quantities
            noise = rng.integers(0, 20, size=classes.shape)
            data = (8000 + 100 * (classes.astype(np.int16) % 7) + noise).astype(np.int16)
        profile = _profile(size, size, dtype, crs, transform, nodata)
        profile.update(blockxsize=blocksize, blockysize=blocksize)
        if nodata is None:
            del profile["nodata"]
        with rasterio.open(folder / f"{scene}_{band}.TIF", "w", **profile) as dst:
            dst.write(data.astype(dtype), 1)
    (folder / f"{scene}_MTL.txt").write_text(f"GROUP = LANDSAT_METADATA_FILE\n  LANDSAT_PRODUCT_ID = \"{scene}\"\n")
    (folder / f"{scene}_ANG.txt").write_text("GROUP = FILE_HEADER\n")
    return folder


def write_cdl(
    root: str | Path,
    year: int,
    bounds: tuple[float, float, float, float],
    bounds_crs: str = _UTM,
    cover: LandCover | None = None,
    margin: float = 300.0,
) -> Path:
    """Write ``root/<year>_30m_cdls.tif``: CDL class codes on the CONUS Albers 30 m grid covering ``bounds``.

    ``bounds`` is ``(left, bottom, right, top)`` in ``bounds_crs``; the raster
    covers it with ``margin`` metres to spare, ``uint8`` with nodata 0 and
    USDA's colour map.  Returns the file.
    """
    cover = cover or LandCover()
    left, bottom, right, top = transform_bounds(bounds_crs, _ALBERS, *bounds, densify_pts=21)
    left, bottom = np.floor(left / 30.0) * 30.0 - margin, np.floor(bottom / 30.0) * 30.0 - margin
    right, top = np.ceil(right / 30.0) * 30.0 + margin, np.ceil(top / 30.0) * 30.0 + margin
    width, height = round(float(right - left) / 30.0), round(float(top - bottom) / 30.0)
    out = _utm_classes(cover, _ALBERS, left + 30.0 * (np.arange(width) + 0.5), top - 30.0 * (np.arange(height) + 0.5))
    path = Path(root) / f"{year}_30m_cdls.tif"
    path.parent.mkdir(parents=True, exist_ok=True)
    from pipekit.datasets._cdl import CDL

    cmap = getattr(CDL, "cmap", None)
    profile = _profile(width, height, "uint8", _ALBERS, from_origin(left, top, 30, 30), 0)
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(out.astype(np.uint8), 1)
        if cmap:
            dst.write_colormap(1, {int(k): tuple(int(c) for c in v[:4]) for k, v in dict(cmap).items()})
    return path


#: Sentinel-2 bands: (pixel size in metres, the signature index of :data:`_SIGNATURES`).
_S2_BANDS = {
    "B01": (60, 0), "B02": (10, 1), "B03": (10, 2), "B04": (10, 3), "B05": (20, 3), "B06": (20, 4),
    "B07": (20, 4), "B08": (10, 4), "B8A": (20, 4), "B09": (60, 4), "B11": (20, 5), "B12": (20, 6),
}


def _s2_dn(classes: np.ndarray, signature: int, rng: np.random.Generator) -> np.ndarray:
    """Sentinel-2 L2A digital numbers (reflectance x 10000) of the land cover."""
    table = np.zeros(256, dtype=np.float32)
    for code, sig in _SIGNATURES.items():
        table[code] = sig[signature]
    refl = table[classes] * (1.0 + rng.normal(0.0, 0.05, size=classes.shape).astype(np.float32))
    return np.clip(refl * 10000.0, 1, 65535).astype(np.uint16)


def write_sentinel2_tile(
    root: str | Path,
    tile: str = "T15TVG",
    sensing: str = "20220718T170859",
    origin: tuple[float, float] = (420_000.0, 4_660_000.0),
    extent: float = 5160.0,
    crs: str = _UTM,
    bands: tuple[str, ...] = ("B02", "B03", "B04", "B08"),
    resolutions: tuple[int, ...] | None = None,
    cover: LandCover | None = None,
    seed: int = 0,
) -> list[Path]:
    """Write Sentinel-2 L2A band files ``root/{tile}_{sensing}_{band}_{res}m.tif`` (the Planetary Computer's names).

    Each band is written at its native pixel size (10, 20 or 60 m), or at
    every size in ``resolutions`` (L2A ships 20 and 60 m copies of the 10 m
    bands too), covering ``extent`` metres (a multiple of 60) from
    ``origin`` (top-left, in ``crs``), ``uint16`` reflectance x 10000 with
    nodata 0.  The land cover is evaluated on the 60 m grid (fields are
    hundreds of metres across), so full-size tiles (10,980 px) are quick to write.

    Returns the files written.
    """
    if round(extent / 60.0) * 60.0 != extent:
        raise ValueError(f"extent must be a multiple of 60 m (the coarsest band's pixel), got {extent}")
    cover = cover or LandCover()
    rng = np.random.default_rng(seed)
    x0, y0 = origin
    coarse_n = round(extent / 60.0)
    centres = (np.arange(coarse_n) + 0.5) * 60.0
    coarse = _utm_classes(cover, crs, x0 + centres, y0 - centres)
    table = np.zeros((7, 256), dtype=np.uint16)
    for code, sig in _SIGNATURES.items():
        table[:, code] = np.round(np.asarray(sig) * 10000.0).astype(np.uint16)
    written = []
    for band in bands:
        native, signature = _S2_BANDS[band]
        for res in resolutions or (native,):
            factor = 60 // res
            classes = np.repeat(np.repeat(coarse, factor, axis=0), factor, axis=1)
            data = table[signature][classes] + rng.integers(1, 9, size=classes.shape, dtype=np.uint16)
            n = classes.shape[0]
            path = Path(root) / f"{tile}_{sensing}_{band}_{res}m.tif"
            path.parent.mkdir(parents=True, exist_ok=True)
            profile = _profile(n, n, "uint16", crs, from_origin(x0, y0, res, res), 0)
            profile.update(blockxsize=min(256, 16 * (n // 16) or 16), blockysize=min(256, 16 * (n // 16) or 16))
            with rasterio.open(path, "w", **profile) as dst:
                dst.write(data, 1)
            written.append(path)
    return written


#: Earth Surface Water's six bands, in file order (B2, B3, B4, B8, B11, B12) as signature indices.
_SURFACE_WATER_BANDS = (1, 2, 3, 4, 5, 6)


def write_surface_water(
    root: str | Path,
    scenes: tuple[tuple[str, str, tuple[float, float]], ...] = (
        ("tra", "EPSG:32615", (446_000.0, 4_660_000.0)),
        ("tra", "EPSG:32614", (447_500.0, 4_652_000.0)),
        ("val", "EPSG:32615", (446_500.0, 4_644_000.0)),
    ),
    size: int = 640,
    cover: LandCover | None = None,
    seed: int = 0,
) -> Path:
    """Write the Earth Surface Water dataset's layout: ``root/dset-s2/{tra,val}_{scene,truth}/``.

    Each scene is a 6-band ``uint16`` GeoTIFF (Sentinel-2 B2, B3, B4, B8,
    B11, B12 at 10 m; reflectance x 10000) named like the dataset's
    (``S2A_L2A_20190318_N0211_R061_6Bands_S1.tif``), with its water mask
    (``..._S1_Truth.tif``, ``uint8``, 1 = water) on the same grid.  ``scenes``
    gives each one's split, CRS (the real dataset mixes UTM zones) and
    top-left corner (in UTM 15N, where the land cover's river runs; moved
    to the scene's CRS on its 10 m grid).  Returns ``root/dset-s2``.
    """
    cover = cover or LandCover()
    rng = np.random.default_rng(seed)
    base = Path(root) / "dset-s2"
    counts: dict[str, int] = {}
    for split, crs, (ux, uy) in scenes:
        x0, y0 = Transformer.from_crs(_UTM, crs, always_xy=True).transform(ux, uy)
        x0, y0 = round(x0 / 10.0) * 10.0, round(y0 / 10.0) * 10.0
        counts[split] = counts.get(split, 0) + 1
        k = counts[split]
        centres = (np.arange(size) + 0.5) * 10.0
        classes = _utm_classes(cover, crs, x0 + centres, y0 - centres)
        stem = f"S2A_L2A_2019{3 + k:02d}18_N0211_R0{60 + k}"
        transform = from_origin(x0, y0, 10.0, 10.0)
        image = np.stack([_s2_dn(classes, b, rng) for b in _SURFACE_WATER_BANDS])
        for folder, name, data in (
            (f"{split}_scene", f"{stem}_6Bands_S{k}.tif", image),
            (f"{split}_truth", f"{stem}_S{k}_Truth.tif", (classes == 111).astype(np.uint8)[None]),
        ):
            path = base / folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            profile = _profile(size, size, data.dtype.name, crs, transform, None)
            del profile["nodata"]
            profile["count"] = data.shape[0]
            with rasterio.open(path, "w", **profile) as dst:
                dst.write(data)
    return base
