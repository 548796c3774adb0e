"""A STAC item's assets as the bands of a scene: which assets are read, and their grid from the projection extension.

:func:`select_assets` picks the asset (and band) of each wanted asset key or
band name (``eo:bands``/``bands`` ``name`` or ``common_name``);
:func:`header_from_proj` gives an asset's raster header from its ``proj:*``
fields, without opening it.  Used by :class:`~pipekit.geo.catalog.STACCatalog`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from affine import Affine
from rasterio.crs import CRS

from pipekit.errors import ReadError
from pipekit.geo._stac_items import ItemRecord
from pipekit.geo.catalog._headers import RasterHeader

__all__ = ["RASTER_FIELD_PLACES", "header_from_proj", "media_type_note", "not_raster", "raster_field", "select_assets"]


def _bands_of(asset: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """An asset's band list: STAC 1.1 ``bands``, else ``eo:bands``, else ``raster:bands``."""
    for key in ("bands", "eo:bands", "raster:bands"):
        value = asset.get(key)
        if value:
            return list(value)
    return []


def _band_names(band: Mapping[str, Any]) -> set[str]:
    return {str(v) for v in (band.get("name"), band.get("common_name"), band.get("eo:common_name")) if v}


def _still_selects(record: ItemRecord, wanted: Sequence[str], parts: Sequence[tuple[str, tuple[int, ...]]]) -> bool:
    """Whether ``parts`` (another item's selection) selects ``wanted`` in ``record`` too (as in one collection)."""
    for name, (key, indexes) in zip(wanted, parts):
        asset = record.assets.get(key)
        if asset is None:
            return False
        if key == name:
            if len(indexes) != max(1, len(_bands_of(asset))):
                return False
            continue
        bands = _bands_of(asset)
        if len(bands) > 1:  # a band of a multi-band asset: this item may hold it alone too (preferred)
            return False
        if len(indexes) != 1 or len(bands) < indexes[0] or name not in _band_names(bands[indexes[0] - 1]):
            return False
    return True


def select_assets(record: ItemRecord, wanted: Sequence[str]) -> list[tuple[str, tuple[int, ...]]]:
    """``(asset key, 1-based band indexes)`` of each wanted asset key or band name of an item.

    A name is an asset key (all its bands), else a band ``name`` or
    ``common_name`` (``"red"``, ``"nir"``) in an asset's ``eo:bands``/``bands``
    (single-band assets preferred over multi-band ones such as ``visual``).

    Raises:
        ReadError: the item has no such asset or band (names the item and its asset keys).

    Example:
        >>> from pipekit.geo._stac_items import ItemRecord
        >>> rec = ItemRecord("S2B_T31UFU", None, 0, 0, {}, {
        ...     "B04": {"href": "b04.tif", "eo:bands": [{"name": "B04", "common_name": "red"}]},
        ...     "visual": {"href": "tci.tif", "eo:bands": [{"name": "B04", "common_name": "red"},
        ...                                                {"name": "B03", "common_name": "green"}]}})
        >>> select_assets(rec, ["red", "visual"])
        [('B04', (1,)), ('visual', (1, 2))]
    """
    out = []
    for name in wanted:
        asset = record.assets.get(name)
        if asset is not None:
            out.append((name, tuple(range(1, max(1, len(_bands_of(asset))) + 1))))
            continue
        matches = []
        for key, fields in record.assets.items():
            bands = _bands_of(fields)
            for j, band in enumerate(bands):
                if name in _band_names(band):
                    matches.append((len(bands) > 1, key, j + 1))
        if not matches:
            where = f" (read from {record.href})" if record.href else ""
            raise ReadError(
                "select STAC asset",
                record.href or record.id,
                "STACDataset",
                f"item {record.id!r} has no asset or band {name!r}{where}; its assets are {sorted(record.assets)}",
            )
        _, key, index = min(matches)
        out.append((key, (index,)))
    return out


#: media types of assets that are surely not rasters GDAL opens (point clouds, tables, vectors, documents)
NOT_RASTER_TYPES = (
    "application/vnd.laszip",  # LAS/LAZ and COPC ("application/vnd.laszip+copc")
    "application/vnd.apache.parquet",
    "application/x-parquet",
    "application/geo+json",
    "application/json",
    "application/vnd.flatgeobuf",
    "application/x-shapefile",
    "text/",
    "application/pdf",
    "application/xml",
)


def media_type_note(asset: Mapping[str, Any]) -> str:
    """``" (media type '...')"`` for an asset that declares one, else ``""`` (what error messages add)."""
    media_type = asset.get("type")
    return f" (media type {media_type!r})" if media_type else ""


def not_raster(
    record: ItemRecord, parts: Sequence[tuple[str, tuple[int, ...]]], hrefs: Sequence[str]
) -> ReadError | None:
    """The error for the first chosen asset whose declared media type is not a raster (``None``: all may be).

    Example:
        >>> from pipekit.geo._stac_items import ItemRecord
        >>> rec = ItemRecord("USGS_LPC_HI", None, 0, 0, {}, {"data": {"href": "c.copc.laz",
        ...                  "type": "application/vnd.laszip+copc"}})
        >>> print(not_raster(rec, [("data", (1,))], ["c.copc.laz"]).reason)  # doctest: +ELLIPSIS
        item 'USGS_LPC_HI' asset 'data' (media type 'application/vnd.laszip+copc') is not a raster: ...
    """
    for (key, _), href in zip(parts, hrefs):
        media_type = str(record.assets[key].get("type") or "").lower()
        if media_type.startswith(NOT_RASTER_TYPES):
            where = f" (read from {record.href})" if record.href else ""
            return ReadError(
                "select STAC asset", href, "STACDataset",
                f"item {record.id!r} asset {key!r}{media_type_note(record.assets[key])} is not a raster: "
                f"choose raster assets (GeoTIFF/COG, JPEG 2000, NetCDF...) of the item{where}; "
                f"its assets are {sorted(record.assets)}",
            )
    return None


_CRS_CACHE: dict[Any, CRS] = {}


def _proj_crs(fields: Mapping[str, Any]) -> CRS | None:
    for key in ("proj:code", "proj:epsg", "proj:wkt2", "proj:projjson"):
        value = fields.get(key)
        if value is None:
            continue
        cache_key = value if isinstance(value, (str, int)) else repr(value)
        crs = _CRS_CACHE.get(cache_key)
        if crs is None:
            if key == "proj:epsg":
                crs = CRS.from_epsg(int(value))
            elif key == "proj:projjson":
                crs = CRS.from_dict(value)
            else:
                crs = CRS.from_user_input(value)
            _CRS_CACHE[cache_key] = crs
        return crs
    return None


#: where an asset's ``data_type`` and ``nodata`` are read, first declared wins (docs/guides/stac.md)
RASTER_FIELD_PLACES = (
    "raster:bands[0]",  # the raster extension 1.x's band object (STAC 1.0)
    "bands[0]",  # STAC 1.1's band object
    "asset",  # STAC 1.1 common metadata (and the raster extension 2.0) on the asset
    "item",  # common metadata in the item's properties
)


def raster_field(record: ItemRecord, asset: Mapping[str, Any], name: str) -> Any:
    """An asset's ``data_type`` or ``nodata``: its first band's, else the asset's, else the item's (``None``: none).

    A band's value is the most specific (STAC 1.1 lets a band override the
    asset), the item's the least; a ``raster:bands`` object (raster extension
    1.x) comes before a ``bands`` one, as an item migrated to 1.1 may keep both.

    Example:
        >>> from pipekit.geo._stac_items import ItemRecord
        >>> rec = ItemRecord("S1_mosaic", None, 0, 0, {"nodata": 0}, {})
        >>> raster_field(rec, {"data_type": "int16", "nodata": -32768}, "nodata")
        -32768
        >>> raster_field(rec, {"nodata": -32768, "bands": [{"name": "VV", "nodata": -9999}]}, "nodata")
        -9999
        >>> raster_field(rec, {"href": "vv.tif"}, "nodata")
        0
    """
    for key in ("raster:bands", "bands"):
        first = (asset.get(key) or [None])[0]
        if isinstance(first, Mapping) and first.get(name) is not None:
            return first[name]
    if asset.get(name) is not None:
        return asset[name]
    return record.proj.get(name)


def header_from_proj(record: ItemRecord, key: str, href: str) -> RasterHeader | None:
    """The raster header the projection extension gives an item's asset (``None`` if it lacks any part).

    Asset-level ``proj:*`` fields override the item's; the data type and
    nodata are the first band's, the asset's or the item's (:func:`raster_field`).
    """
    asset = record.assets[key]
    fields = {**record.proj, **{k: v for k, v in asset.items() if k.startswith("proj:")}}
    try:
        crs = _proj_crs(fields)
    except Exception:
        return None
    transform = fields.get("proj:transform")
    shape = fields.get("proj:shape")
    if crs is None or not transform or len(transform) < 6 or not shape or len(shape) != 2:
        return None
    affine = Affine(*[float(v) for v in list(transform)[:6]])
    height, width = int(shape[0]), int(shape[1])
    bands = _bands_of(asset)
    dtype = str(raster_field(record, asset, "data_type") or "")
    nodata = raster_field(record, asset, "nodata")
    if nodata is not None:
        try:
            nodata = float(nodata)
        except (TypeError, ValueError):  # "nan", "inf" strings
            nodata = float(str(nodata))
    left, top = affine.c, affine.f
    right, bottom = affine.c + affine.a * width + affine.b * height, affine.f + affine.d * width + affine.e * height
    bounds = (min(left, right), min(top, bottom), max(left, right), max(top, bottom))
    return RasterHeader(href, crs, affine, width, height, max(1, len(bands)), dtype or "float32", nodata, bounds)
