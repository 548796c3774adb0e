"""Landsat 7, 8 and 9 Collection 2 Level-2 scenes (one GeoTIFF per band).

USGS names every band file of a Collection 2 product after the product::

    LC08_L2SP_023032_20210701_20210708_02_T1_SR_B4.TIF
    |  | |    |     |        |        |  |  band (SR_B1..SR_B7 reflectance, ST_B10 or ST_B6 temperature, QA_PIXEL...)
    |  | |    |     |        |        |  collection category (T1, T2, RT)
    |  | |    |     |        |        collection number (02)
    |  | |    |     |        processing date
    |  | |    |     acquisition date (the sample's time)
    |  | |    WRS-2 path and row
    |  | processing level (L2SP: surface reflectance and temperature, L2SR: reflectance only)
    |  satellite (07, 08, 09)
    sensor (C: OLI/TIRS, E: ETM+)

Files are in the UTM zone of the scene (e.g. EPSG:32615), 30 m pixels,
``uint16`` digital numbers with 0 as fill (apply USGS's scale factors,
0.0000275 and -0.2 for reflectance, in a transform if you need physical
units).  Scenes from several zones are reprojected to the dataset CRS (the
first file's unless given).
"""

from __future__ import annotations

from pipekit.geo._raster import RasterDataset

__all__ = ["Landsat", "Landsat7", "Landsat8", "Landsat9"]


class Landsat(RasterDataset):
    """Base class of the Landsat Collection 2 Level-2 products (one file per band).

    Subclasses set ``filename_glob`` (``"LC08_*_{}.*"``, ``{}`` standing for
    the band), ``all_bands``, ``default_bands`` and ``rgb_bands``.  Each scene
    is indexed once, through the file of its first requested band; the other
    bands are read from the files whose names differ only in the band.
    """

    filename_regex = r"""
        ^L(?P<sensor>[COTEM])(?P<satellite>\d{2})
        _(?P<processing_level>[A-Z0-9]{4})
        _(?P<wrs_path>\d{3})(?P<wrs_row>\d{3})
        _(?P<date>\d{8})
        _(?P<processing_date>\d{8})
        _(?P<collection_number>\d{2})
        _(?P<collection_category>[A-Z0-9]{2})
        _(?P<band>[A-Z][A-Z0-9_]*)
        \.(?:TIF|tif|TIFF|tiff)$
    """
    date_format = "%Y%m%d"
    separate_files = True
    is_image = True
    nodata = 0


class Landsat7(Landsat):
    """Landsat 7 ETM+ Collection 2 Level-2 (``LE07_L2SP_...``).

    ``all_bands`` are the six reflective bands, the thermal band and the QA
    band; ``default_bands`` the six reflective bands (SR_B1, SR_B2, SR_B3,
    SR_B4, SR_B5, SR_B7), so ``Landsat7() | Landsat8(bands=Landsat8.all_bands[1:-2])``
    mosaics six bands with six.

    Example:
        >>> from pipekit.datasets import Landsat7
        >>> Landsat7.default_bands
        ('SR_B1', 'SR_B2', 'SR_B3', 'SR_B4', 'SR_B5', 'SR_B7')
        >>> Landsat7.rgb_bands
        ('SR_B3', 'SR_B2', 'SR_B1')
    """

    filename_glob = "LE07_*_{}.*"
    all_bands = ("SR_B1", "SR_B2", "SR_B3", "SR_B4", "SR_B5", "SR_B7", "ST_B6", "QA_PIXEL")
    default_bands = ("SR_B1", "SR_B2", "SR_B3", "SR_B4", "SR_B5", "SR_B7")
    rgb_bands = ("SR_B3", "SR_B2", "SR_B1")


class Landsat8(Landsat):
    """Landsat 8 OLI/TIRS Collection 2 Level-2 (``LC08_L2SP_...``).

    ``all_bands``: SR_B1 (coastal aerosol), SR_B2..SR_B7 (blue, green, red,
    NIR, SWIR 1, SWIR 2), then the two non-reflective bands ST_B10 (surface
    temperature) and QA_PIXEL, so ``all_bands[1:-2]`` is SR_B2..SR_B7.
    ``default_bands`` are the seven reflective bands.

    Example:
        >>> from pipekit.datasets import Landsat8
        >>> Landsat8.all_bands[1:-2]
        ('SR_B2', 'SR_B3', 'SR_B4', 'SR_B5', 'SR_B6', 'SR_B7')
    """

    filename_glob = "LC08_*_{}.*"
    all_bands = ("SR_B1", "SR_B2", "SR_B3", "SR_B4", "SR_B5", "SR_B6", "SR_B7", "ST_B10", "QA_PIXEL")
    default_bands = ("SR_B1", "SR_B2", "SR_B3", "SR_B4", "SR_B5", "SR_B6", "SR_B7")
    rgb_bands = ("SR_B4", "SR_B3", "SR_B2")


class Landsat9(Landsat8):
    """Landsat 9 OLI-2/TIRS-2 Collection 2 Level-2 (``LC09_L2SP_...``); bands as :class:`Landsat8`."""

    filename_glob = "LC09_*_{}.*"
