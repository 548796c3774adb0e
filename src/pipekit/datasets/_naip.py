"""NAIP: USDA National Agriculture Imagery Program aerial orthoimagery.

Each file is a digital ortho quarter quad, four bands (red, green, blue,
near-infrared), ``uint8``, 0.6 or 1 m pixels, in its UTM zone (NAD83,
e.g. EPSG:26915)::

    m_3807511_ne_18_060_20181104.tif
    | |       |  |  |   acquisition date (the sample's time)
    | |       |  |  ground sample distance (060: 0.6 m)
    | |       |  UTM zone
    | |       quarter quad (ne, nw, se, sw)
    | USGS quadrangle
    "m": DOQQ

(Some releases append a processing date: ``..._20181104_20190211.tif``.)
"""

from __future__ import annotations

from pipekit.geo._raster import RasterDataset

__all__ = ["NAIP"]


class NAIP(RasterDataset):
    """NAIP quarter quads (``m_*.tif``), one 4-band file (R, G, B, NIR) per scene.

    Example:
        >>> from pipekit.datasets import NAIP
        >>> NAIP.all_bands, NAIP.rgb_bands
        (('R', 'G', 'B', 'NIR'), ('R', 'G', 'B'))
    """

    filename_glob = "m_*.*"
    filename_regex = r"""
        ^m
        _(?P<quadrangle>\d+)
        _(?P<quarter_quad>[a-z]+)
        _(?P<utm_zone>\d+)
        _(?P<resolution>\d+)
        _(?P<date>\d{8})
        (?:_(?P<processing_date>\d+))?
        \.(?:tif|TIF|tiff|TIFF)$
    """
    date_format = "%Y%m%d"
    is_image = True
    all_bands = ("R", "G", "B", "NIR")
    rgb_bands = ("R", "G", "B")
