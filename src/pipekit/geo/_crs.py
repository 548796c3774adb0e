"""The CRS type users see: pyproj's :class:`pyproj.CRS`, as TorchGeo 0.8 gives; rasterio's inside.

pipekit keeps a dataset's CRS as a rasterio :class:`rasterio.crs.CRS` (``_crs``), the type GDAL calls
take without a conversion.  Where a user sees a CRS (``dataset.crs``, ``sample["crs"]``), it is
pyproj's, as in TorchGeo 0.8: :func:`user_crs` converts at that edge, once per CRS object
(a conversion parses WKT, ~0.2 ms; a sample pays a dictionary look-up).  The two types compare equal
to each other, and rasterio (``CRS.from_user_input``), GeoPandas and pyproj accept either, so a
``dataset.crs`` passed back to pipekit, rasterio or ``to_crs`` works.
"""

from __future__ import annotations

from typing import Any

import pyproj
from rasterio.crs import CRS

__all__ = ["user_crs"]

# rasterio CRS object -> (that object, pyproj's CRS); the object is kept so its id is not reused
_CACHE: dict[int, tuple[CRS, pyproj.CRS]] = {}
_CACHE_MAX = 256


def user_crs(crs: Any) -> Any:
    """``crs`` as pyproj's :class:`pyproj.CRS` (``None`` stays ``None``), cached per object.

    Example:
        >>> from rasterio.crs import CRS
        >>> c = user_crs(CRS.from_epsg(32615))
        >>> type(c).__module__.split(".")[0], c.to_epsg(), c == CRS.from_epsg(32615), user_crs(c) is c
        ('pyproj', 32615, True, True)
    """
    if crs is None or isinstance(crs, pyproj.CRS):
        return crs
    hit = _CACHE.get(id(crs))
    if hit is not None and hit[0] is crs:
        return hit[1]
    converted = pyproj.CRS.from_user_input(crs)
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.clear()
    _CACHE[id(crs)] = (crs, converted)
    return converted
