"""The raster products the command knows: detection from file names, band roles for indices."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

__all__ = ["Product", "PRODUCTS", "product_names", "detect_product", "get_product", "format_date"]


@dataclass(frozen=True)
class Product:
    """A raster product: its dataset class and how its digital numbers become reflectance."""

    name: str
    class_name: str
    #: reflectance = DN * scale + offset (what spectral indices are computed on)
    scale: float = 1.0
    offset: float = 0.0

    @property
    def roles(self) -> dict[str, str]:
        """The band playing each spectral role (``{"nir": "SR_B5", "red": "SR_B4", ...}``)."""
        from pipekit.datasets._geosegmentation import BAND_ROLES

        own = getattr(self.cls, "band_roles", None)
        if isinstance(own, dict):
            return dict(own)
        for cls, roles in BAND_ROLES.items():
            if issubclass(self.cls, cls):
                return dict(roles)
        return {}

    @property
    def cls(self) -> Any:
        from pipekit import datasets

        return getattr(datasets, self.class_name)

    @property
    def is_mask(self) -> bool:
        return not self.cls.is_image

    def match(self, filename: str) -> re.Match[str] | None:
        """The product's ``filename_regex`` match of ``filename`` if it also fits ``filename_glob``."""
        cls = self.cls
        from pipekit.geo.catalog._listing import any_band_glob  # (geo only when a product is matched)

        if not fnmatch.fnmatchcase(filename, any_band_glob(cls.filename_glob)):
            return None
        return _regex(cls).match(filename)


_REGEXES: dict[type, re.Pattern[str]] = {}


def _regex(cls: type) -> re.Pattern[str]:
    pattern = _REGEXES.get(cls)
    if pattern is None:
        pattern = _REGEXES[cls] = re.compile(cls.filename_regex, re.VERBOSE)
    return pattern


# Collection 2 Level-2 surface reflectance: DN * 0.0000275 - 0.2
_LANDSAT_SCALE = (2.75e-5, -0.2)

#: Products by the name the command uses (``--product``), in detection order.
PRODUCTS: dict[str, Product] = {
    "landsat7": Product("landsat7", "Landsat7", *_LANDSAT_SCALE),
    "landsat8": Product("landsat8", "Landsat8", *_LANDSAT_SCALE),
    "landsat9": Product("landsat9", "Landsat9", *_LANDSAT_SCALE),
    "sentinel2": Product("sentinel2", "Sentinel2", 1e-4, 0.0),
    "naip": Product("naip", "NAIP"),
    "cdl": Product("cdl", "CDL"),
}

#: ``--product raster``: any georeferenced raster, bands by number.
GENERIC = "raster"


def product_names() -> list[str]:
    return [*PRODUCTS, GENERIC]


def get_product(name: str) -> Product | None:
    """The product called ``name`` (``None`` for ``"raster"``, a generic raster)."""
    return None if name == GENERIC else PRODUCTS[name]


def detect_product(filename: str) -> tuple[Product | None, re.Match[str] | None]:
    """The product a file name belongs to, and the name's match of its regex; ``(None, None)`` if none.

    Example:
        >>> product, match = detect_product("LC08_L2SP_026031_20230715_20230725_02_T1_SR_B4.TIF")
        >>> product.name, match.group("band"), match.group("date")
        ('landsat8', 'SR_B4', '20230715')
        >>> detect_product("2023_30m_cdls.tif")[0].name
        'cdl'
        >>> detect_product("elevation.tif")
        (None, None)
    """
    for product in PRODUCTS.values():
        match = product.match(filename)
        if match is not None:
            return product, match
    return None, None


_PRECISION = (("%f", "%Y-%m-%dT%H:%M:%S.%f"), ("%S", "%Y-%m-%dT%H:%M:%S"), ("%M", "%Y-%m-%dT%H:%M"),
              ("%H", "%Y-%m-%dT%H:00"), ("%d", "%Y-%m-%d"), ("%j", "%Y-%m-%d"), ("%m", "%Y-%m"), ("%b", "%Y-%m"))


def format_date(text: str, date_format: str) -> str:
    """A date from a file name in ISO form at its own precision (``"2023"``, ``"2023-07-15"``...).

    Example:
        >>> format_date("20230715", "%Y%m%d"), format_date("2023", "%Y")
        ('2023-07-15', '2023')
        >>> format_date("20210701T170859", "%Y%m%dT%H%M%S")
        '2021-07-01T17:08:59'
    """
    try:
        when = datetime.strptime(text, date_format).replace(tzinfo=timezone.utc)
    except ValueError:
        return text
    for directive, out in _PRECISION:
        if directive in date_format:
            return when.strftime(out)
    return when.strftime("%Y")
