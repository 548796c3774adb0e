"""Sentinel-2 MSI Level-1C and Level-2A band files.

Inside a SAFE product each band is a JPEG 2000 file named after the tile and
the sensing time (GeoTIFF copies keep the name)::

    T15TVG_20210701T170859_B04.jp2          (Level-1C)
    T15TVG_20210701T170859_B04_10m.jp2      (Level-2A, with the pixel size)
    |      |               |   resolution of this copy (10m, 20m, 60m)
    |      |               band (B01..B12, B8A)
    |      sensing time (the sample's time, to the second)
    MGRS tile (UTM zone 15, latitude band T, square VG)

Tiles are in their UTM zone (EPSG:326xx/327xx).  Bands come at 10 m (B02,
B03, B04, B08), 20 m (B05, B06, B07, B8A, B11, B12) and 60 m (B01, B09,
B10); the dataset reads every band onto one grid, 10 m by default, resampling
the coarser ones.  Where Level-2A has a band at several resolutions, the
finest copy is read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pipekit.geo._base import Sample
from pipekit.geo._raster import RasterDataset

__all__ = ["Sentinel2"]


class Sentinel2(RasterDataset):
    """Sentinel-2 band files (``T{tile}_{YYYYMMDDTHHMMSS}_B{xx}[_{10m|20m|60m}].jp2|tif``), one file per band.

    ``all_bands`` lists the 13 MSI bands (B01..B12 and B8A, in wavelength
    order); ``default_bands`` leaves out B10 (cirrus), which Level-2A does
    not ship.  Level-2A's other single-band files can be chosen too:
    ``SCL`` (scene classification), ``AOT`` and ``WVP``.  ``res`` defaults to 10 m.

    Example:
        >>> from pipekit.datasets import Sentinel2
        >>> len(Sentinel2.all_bands), Sentinel2.rgb_bands
        (13, ('B04', 'B03', 'B02'))
    """

    filename_glob = "T*_*_{}*.*"
    filename_regex = r"""
        ^T(?P<tile>\d{2}[A-Z]{3})
        _(?P<date>\d{8}T\d{6})
        _(?P<band>B[0-9][0-9A]|SCL|AOT|WVP)
        (?:_(?P<resolution>\d{2}m))?
        \.(?:jp2|JP2|tif|TIF|tiff|TIFF)$
    """
    date_format = "%Y%m%dT%H%M%S"
    separate_files = True
    is_image = True
    nodata = 0
    all_bands = ("B01", "B02", "B03", "B04", "B05", "B06", "B07", "B08", "B8A", "B09", "B10", "B11", "B12")
    default_bands = ("B01", "B02", "B03", "B04", "B05", "B06", "B07", "B08", "B8A", "B09", "B11", "B12")
    rgb_bands = ("B04", "B03", "B02")

    def __init__(
        self,
        root: Any = None,
        crs: Any = None,
        res: Any = 10,
        bands: Sequence[str] | None = None,
        transforms: Callable[[Sample], Sample] | None = None,
        cache: bool = True,
        storage_options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(root, crs, res, bands, transforms, cache, storage_options, **kwargs)
