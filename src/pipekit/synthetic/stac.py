"""A synthetic Sentinel-2-like STAC corpus: COGs in two UTM zones, their items, catalogs and stac-geoparquet.

:func:`write_sentinel2_cogs` writes Cloud-Optimized GeoTIFFs (tiled,
overviews) of a few tiles on both sides of the UTM zone 31/32 boundary
(EPSG:32631 and EPSG:32632); :func:`sentinel2_items` makes STAC item dicts
with Sentinel-2 style ids, ``eo:bands`` common names, the projection
extension, ``raster:bands`` and ``eo:cloud_cover`` -- as many as asked, one
per tile and date (items of one tile share its COGs, so 10,000 items need
no 10,000 rasters); :func:`write_static_catalog` saves them as a pystac
collection (local or any fsspec URL) and :func:`write_geoparquet` as
stac-geoparquet (with rustac).
"""

from __future__ import annotations

import datetime as _dt
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipekit._fs import url_to_fs

__all__ = [
    "S2_BANDS",
    "S2_TILES",
    "write_sentinel2_cogs",
    "sentinel2_items",
    "write_static_catalog",
    "write_geoparquet",
    "write_label_raster",
    "write_collection_files",
]

#: asset key -> (common name, centre wavelength in micrometres)
S2_BANDS = {"B02": ("blue", 0.49), "B03": ("green", 0.56), "B04": ("red", 0.665), "B08": ("nir", 0.842)}

#: MGRS tile -> (EPSG, top-left corner): two tiles west and two east of 6 degrees E (the zone 31/32 boundary),
#: near 47.5 N; the zone-32 tiles overlap the zone-31 ones once reprojected.
S2_TILES = {
    "T31TGN": (32631, (722_000.0, 5_271_000.0)),
    "T31TGM": (32631, (722_000.0, 5_265_880.0)),
    "T32TKT": (32632, (273_500.0, 5_271_000.0)),
    "T32TKS": (32632, (273_500.0, 5_265_880.0)),
}


def _pattern(size: int, band: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size].astype(np.float32)
    fields = (np.sin(x / 23.0 + band) + np.cos(y / 31.0 - band)) * 1500 + 3000
    return np.clip(fields + rng.normal(0, 80, (size, size)), 1, 10000).astype(np.uint16)


def _write_cog(
    path: Path, data: np.ndarray, epsg: int, origin: tuple[float, float], res: float, nodata: float | None
) -> None:
    import rasterio
    from rasterio.io import MemoryFile
    from rasterio.shutil import copy as rio_copy
    from rasterio.transform import from_origin

    profile = {
        "driver": "GTiff",
        "width": data.shape[-1],
        "height": data.shape[-2],
        "count": 1,
        "dtype": data.dtype.name,
        "crs": f"EPSG:{epsg}",
        "transform": from_origin(origin[0], origin[1], res, res),
        "nodata": nodata,
        "tiled": True,
        "blockxsize": 256,
        "blockysize": 256,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with MemoryFile() as memfile:
        with memfile.open(**profile) as dst:
            dst.write(data.reshape(1, *data.shape[-2:]))
            dst.build_overviews([2, 4], rasterio.enums.Resampling.average)
        with memfile.open() as src:
            rio_copy(src, str(path), driver="COG", blocksize=256, compress="DEFLATE", overviews="FORCE_USE_EXISTING")


def write_sentinel2_cogs(
    root: str | Path, size: int = 512, res: float = 10.0, tiles: Sequence[str] = tuple(S2_TILES), seed: int = 0
) -> dict[str, dict[str, str]]:
    """Write one COG per tile and band under ``root/{tile}/{band}.tif`` (uint16, nodata 0, 256 px tiles, overviews).

    Returns:
        ``{tile: {band: path relative to root}}``.

    Example:
        >>> import tempfile, rasterio
        >>> root = tempfile.mkdtemp()
        >>> cogs = write_sentinel2_cogs(root, size=256, tiles=["T31TGN"])
        >>> with rasterio.open(f"{root}/{cogs['T31TGN']['B04']}") as f:
        ...     facts = f.crs.to_epsg(), f.block_shapes[0], f.overviews(1)
        >>> facts
        (32631, (256, 256), [2, 4])
    """
    out: dict[str, dict[str, str]] = {}
    for t, tile in enumerate(tiles):
        epsg, origin = S2_TILES[tile]
        out[tile] = {}
        for b, band in enumerate(S2_BANDS):
            relative = f"{tile}/{band}.tif"
            _write_cog(Path(root) / relative, _pattern(size, b, seed * 100 + t * 10 + b), epsg, origin, res, 0)
            out[tile][band] = relative
    return out


def sentinel2_items(
    cogs: Mapping[str, Mapping[str, str]],
    href_root: str,
    n_items: int,
    size: int = 512,
    res: float = 10.0,
    start: _dt.date = _dt.date(2024, 5, 1),
    collection: str = "sentinel-2-l2a-synthetic",
    seed: int = 0,
) -> list[dict[str, Any]]:
    """``n_items`` STAC item dicts over the tiles of ``cogs``, one per tile and date (every 5 days, tile by tile).

    Asset hrefs are ``{href_root}/{tile}/{band}.tif``.  Items carry
    ``proj:code`` and ``proj:epsg``, ``proj:transform``, ``proj:shape``,
    ``eo:cloud_cover`` (seeded) and Sentinel-2 style ids
    (``S2B_MSIL2A_20240501T103629_R108_T31TGN_20240501T120000``).

    Example:
        >>> items = sentinel2_items({"T31TGN": {"B04": "T31TGN/B04.tif"}}, "s3://b/cogs", 2)
        >>> [i["id"] for i in items], items[0]["assets"]["B04"]["href"]
        (['S2B_MSIL2A_20240501T103629_R108_T31TGN_20240501T120000', \
'S2B_MSIL2A_20240506T103629_R108_T31TGN_20240506T120000'], 's3://b/cogs/T31TGN/B04.tif')
    """
    from pyproj import Transformer

    rng = np.random.default_rng(seed)
    tiles = list(cogs)
    footprints = {}
    for tile in tiles:
        epsg, (x0, y0) = S2_TILES[tile]
        to_lonlat = Transformer.from_crs(epsg, 4326, always_xy=True)
        extent = size * res
        ring = [
            to_lonlat.transform(x, y)
            for x, y in ((x0, y0), (x0 + extent, y0), (x0 + extent, y0 - extent), (x0, y0 - extent), (x0, y0))
        ]
        lons, lats = zip(*ring)
        footprints[tile] = (
            {"type": "Polygon", "coordinates": [[list(p) for p in ring]]},
            [min(lons), min(lats), max(lons), max(lats)],
        )
    items = []
    for n in range(n_items):
        tile = tiles[n % len(tiles)]
        day = start + _dt.timedelta(days=5 * (n // len(tiles)))
        epsg, (x0, y0) = S2_TILES[tile]
        stamp = day.strftime("%Y%m%d")
        geometry, bbox = footprints[tile]
        assets = {}
        for band, path in cogs[tile].items():
            common, centre = S2_BANDS[band]
            assets[band] = {
                "href": f"{href_root.rstrip('/')}/{path}",
                "type": "image/tiff; application=geotiff; profile=cloud-optimized",
                "roles": ["data"],
                "eo:bands": [{"name": band, "common_name": common, "center_wavelength": centre}],
                "raster:bands": [{"data_type": "uint16", "nodata": 0, "spatial_resolution": res}],
            }
        items.append(
            {
                "type": "Feature",
                "stac_version": "1.0.0",
                "stac_extensions": [
                    "https://stac-extensions.github.io/eo/v1.1.0/schema.json",
                    "https://stac-extensions.github.io/projection/v1.1.0/schema.json",
                    "https://stac-extensions.github.io/raster/v1.1.0/schema.json",
                ],
                "id": f"S2B_MSIL2A_{stamp}T103629_R108_{tile}_{stamp}T120000",
                "collection": collection,
                "geometry": geometry,
                "bbox": bbox,
                "properties": {
                    "datetime": f"{day.isoformat()}T10:36:29Z",
                    "platform": "sentinel-2b",
                    "eo:cloud_cover": round(float(rng.uniform(0, 100)), 2),
                    "proj:epsg": epsg,
                    "proj:code": f"EPSG:{epsg}",
                    "proj:transform": [res, 0.0, x0, 0.0, -res, y0],
                    "proj:shape": [size, size],
                    "s2:mgrs_tile": tile[1:],
                },
                "links": [],
                "assets": assets,
            }
        )
    return items


def _collection(items: Sequence[Mapping[str, Any]], collection_id: str) -> Any:
    import pystac

    lons = [v for i in items for v in (i["bbox"][0], i["bbox"][2])]
    lats = [v for i in items for v in (i["bbox"][1], i["bbox"][3])]
    times = sorted(i["properties"]["datetime"] for i in items)
    parse = _dt.datetime.fromisoformat
    extent = pystac.Extent(
        pystac.SpatialExtent([[min(lons), min(lats), max(lons), max(lats)]]),
        pystac.TemporalExtent([[parse(times[0].replace("Z", "+00:00")), parse(times[-1].replace("Z", "+00:00"))]]),
    )
    return pystac.Collection(collection_id, "Synthetic Sentinel-2 L2A-like COGs (pipekit)", extent, license="CC0-1.0")


def write_static_catalog(
    items: Sequence[Mapping[str, Any]],
    href: str,
    storage_options: Mapping[str, Any] | None = None,
    collection_id: str = "sentinel-2-l2a-synthetic",
) -> str:
    """Save ``items`` as a self-contained pystac collection at ``href`` (a folder: local or an fsspec URL).

    Returns the ``collection.json`` href.  Item JSON files go to
    ``{href}/{item id}/{item id}.json`` (pystac's layout); asset hrefs are kept as given.
    """
    import pystac

    from pipekit.geo._stac_items import FsspecStacIO

    collection = _collection(items, collection_id)
    for item in items:
        collection.add_item(pystac.Item.from_dict(dict(item), preserve_dict=False))
    root = href.rstrip("/")
    collection.normalize_hrefs(root)
    collection.save(pystac.CatalogType.SELF_CONTAINED, stac_io=FsspecStacIO(storage_options))
    return f"{root}/collection.json"


def write_collection_files(
    items: Sequence[Mapping[str, Any]], folder: str | Path, collection_id: str = "sentinel-2-l2a-synthetic"
) -> list[str]:
    """Write ``collection.json`` and ``items.json`` (a FeatureCollection) into ``folder`` (for ``rustac serve``)."""
    import json

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    collection = _collection(items, collection_id).to_dict(include_self_link=False)
    collection["links"] = []
    (folder / "collection.json").write_text(json.dumps(collection))
    (folder / "items.json").write_text(json.dumps({"type": "FeatureCollection", "features": list(items)}))
    return [str(folder / "collection.json"), str(folder / "items.json")]


def write_geoparquet(
    items: Sequence[Mapping[str, Any]], href: str, storage_options: Mapping[str, Any] | None = None
) -> str:
    """Write ``items`` as stac-geoparquet with rustac (to a local path, or uploaded to an fsspec URL)."""
    import rustac

    if "://" not in href:
        rustac.write_sync(str(href), [dict(i) for i in items])
        return str(href)

    with tempfile.TemporaryDirectory() as tmp:
        local = os.path.join(tmp, "items.parquet")
        rustac.write_sync(local, [dict(i) for i in items])
        fs, path = url_to_fs(href, storage_options)
        fs.put_file(local, path)
    return href


def write_label_raster(
    path: str | Path, tile: str = "T31TGN", size: int = 512, res: float = 10.0, classes: int = 4, seed: int = 0
) -> str:
    """A uint8 class raster (a GeoTIFF) over ``tile``'s footprint, e.g. the labels of a segmentation example."""
    import rasterio
    from rasterio.transform import from_origin

    epsg, origin = S2_TILES[tile]
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size]
    data = ((x // 64 + y // 64 + rng.integers(0, 2, (size, size))) % classes).astype(np.uint8)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with rasterio.open(
        path,
        "w",
        driver="GTiff",
        width=size,
        height=size,
        count=1,
        dtype="uint8",
        crs=f"EPSG:{epsg}",
        transform=from_origin(*origin, res, res),
        tiled=True,
        blockxsize=256,
        blockysize=256,
    ) as dst:
        dst.write(data, 1)
    return str(path)
