"""CDL: the USDA NASS Cropland Data Layer, a yearly 30 m crop-type map of the contiguous US.

One file per year, in CONUS Albers Equal Area (EPSG:5070), one ``uint8``
band of class values (0 is background / no data)::

    2023_30m_cdls.tif       (also .tiff, .img)
    |    the sample's time: the whole year

The class values, names and colours are USDA's (the colour table of the
released GeoTIFFs, as documented by TorchGeo's ``CDL.cmap``).  ``classes=``
picks a subset and maps it to ordinal labels ``0..n-1`` for training.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from pipekit.geo.base import Sample
from pipekit.geo.raster import RasterDataset

__all__ = ["CDL", "CDL_CLASSES"]

#: ``{value: (name, (r, g, b))}`` for the named CDL classes.
CDL_CLASSES: dict[int, tuple[str, tuple[int, int, int]]] = {
    0: ("Background", (0, 0, 0)),
    1: ("Corn", (255, 211, 0)),
    2: ("Cotton", (255, 38, 38)),
    3: ("Rice", (0, 168, 228)),
    4: ("Sorghum", (255, 158, 11)),
    5: ("Soybeans", (38, 112, 0)),
    6: ("Sunflower", (255, 255, 0)),
    10: ("Peanuts", (112, 165, 0)),
    11: ("Tobacco", (0, 175, 75)),
    12: ("Sweet Corn", (221, 165, 11)),
    13: ("Pop or Orn Corn", (221, 165, 11)),
    14: ("Mint", (126, 211, 255)),
    21: ("Barley", (226, 0, 124)),
    22: ("Durum Wheat", (137, 98, 84)),
    23: ("Spring Wheat", (216, 181, 107)),
    24: ("Winter Wheat", (165, 112, 0)),
    25: ("Other Small Grains", (214, 158, 188)),
    26: ("Dbl Crop WinWht/Soybeans", (112, 112, 0)),
    27: ("Rye", (172, 0, 124)),
    28: ("Oats", (160, 89, 137)),
    29: ("Millet", (112, 0, 73)),
    30: ("Speltz", (214, 158, 188)),
    31: ("Canola", (209, 255, 0)),
    32: ("Flaxseed", (126, 153, 255)),
    33: ("Safflower", (214, 214, 0)),
    34: ("Rape Seed", (209, 255, 0)),
    35: ("Mustard", (0, 175, 75)),
    36: ("Alfalfa", (255, 165, 226)),
    37: ("Other Hay/Non Alfalfa", (165, 242, 140)),
    38: ("Camelina", (0, 175, 75)),
    39: ("Buckwheat", (214, 158, 188)),
    41: ("Sugarbeets", (168, 0, 228)),
    42: ("Dry Beans", (165, 0, 0)),
    43: ("Potatoes", (112, 38, 0)),
    44: ("Other Crops", (0, 175, 75)),
    45: ("Sugarcane", (177, 126, 255)),
    46: ("Sweet Potatoes", (112, 38, 0)),
    47: ("Misc Vegs & Fruits", (255, 102, 102)),
    48: ("Watermelons", (255, 102, 102)),
    49: ("Onions", (255, 204, 102)),
    50: ("Cucumbers", (255, 102, 102)),
    51: ("Chick Peas", (0, 175, 75)),
    52: ("Lentils", (0, 221, 175)),
    53: ("Peas", (84, 255, 0)),
    54: ("Tomatoes", (242, 163, 119)),
    55: ("Caneberries", (255, 102, 102)),
    56: ("Hops", (0, 175, 75)),
    57: ("Herbs", (126, 211, 255)),
    58: ("Clover/Wildflowers", (232, 191, 255)),
    59: ("Sod/Grass Seed", (175, 255, 221)),
    60: ("Switchgrass", (0, 175, 75)),
    61: ("Fallow/Idle Cropland", (191, 191, 119)),
    62: ("Pasture/Grass", (0, 0, 0)),
    63: ("Forest", (147, 204, 147)),
    64: ("Shrubland", (198, 214, 158)),
    65: ("Barren", (204, 191, 163)),
    66: ("Cherries", (255, 0, 255)),
    67: ("Peaches", (255, 142, 170)),
    68: ("Apples", (186, 0, 79)),
    69: ("Grapes", (112, 68, 137)),
    70: ("Christmas Trees", (0, 119, 119)),
    71: ("Other Tree Crops", (177, 154, 112)),
    72: ("Citrus", (255, 255, 126)),
    74: ("Pecans", (181, 112, 91)),
    75: ("Almonds", (0, 165, 130)),
    76: ("Walnuts", (233, 214, 175)),
    77: ("Pears", (177, 154, 112)),
    81: ("Clouds/No Data", (242, 242, 242)),
    82: ("Developed", (154, 154, 154)),
    83: ("Water", (75, 112, 163)),
    87: ("Wetlands", (126, 177, 177)),
    88: ("Nonag/Undefined", (232, 255, 191)),
    92: ("Aquaculture", (0, 255, 255)),
    111: ("Open Water", (75, 112, 163)),
    112: ("Perennial Ice/Snow", (211, 226, 249)),
    121: ("Developed/Open Space", (154, 154, 154)),
    122: ("Developed/Low Intensity", (154, 154, 154)),
    123: ("Developed/Med Intensity", (154, 154, 154)),
    124: ("Developed/High Intensity", (154, 154, 154)),
    131: ("Barren", (204, 191, 163)),
    141: ("Deciduous Forest", (147, 204, 147)),
    142: ("Evergreen Forest", (147, 204, 147)),
    143: ("Mixed Forest", (147, 204, 147)),
    152: ("Shrubland", (198, 214, 158)),
    176: ("Grass/Pasture", (232, 255, 191)),
    190: ("Woody Wetlands", (126, 177, 177)),
    195: ("Herbaceous Wetlands", (126, 177, 177)),
    204: ("Pistachios", (0, 255, 140)),
    205: ("Triticale", (214, 158, 188)),
    206: ("Carrots", (255, 102, 102)),
    207: ("Asparagus", (255, 102, 102)),
    208: ("Garlic", (255, 102, 102)),
    209: ("Cantaloupes", (255, 102, 102)),
    210: ("Prunes", (255, 142, 170)),
    211: ("Olives", (51, 73, 51)),
    212: ("Oranges", (228, 112, 38)),
    213: ("Honeydew Melons", (255, 102, 102)),
    214: ("Broccoli", (255, 102, 102)),
    215: ("Avocados", (102, 153, 76)),
    216: ("Peppers", (255, 102, 102)),
    217: ("Pomegranates", (177, 154, 112)),
    218: ("Nectarines", (255, 142, 170)),
    219: ("Greens", (255, 102, 102)),
    220: ("Plums", (255, 142, 170)),
    221: ("Strawberries", (255, 102, 102)),
    222: ("Squash", (255, 102, 102)),
    223: ("Apricots", (255, 142, 170)),
    224: ("Vetch", (0, 175, 75)),
    225: ("Dbl Crop WinWht/Corn", (255, 211, 0)),
    226: ("Dbl Crop Oats/Corn", (255, 211, 0)),
    227: ("Lettuce", (255, 102, 102)),
    228: ("Dbl Crop Triticale/Corn", (255, 210, 0)),
    229: ("Pumpkins", (255, 102, 102)),
    230: ("Dbl Crop Lettuce/Durum Wht", (137, 98, 84)),
    231: ("Dbl Crop Lettuce/Cantaloupe", (255, 102, 102)),
    232: ("Dbl Crop Lettuce/Cotton", (255, 38, 38)),
    233: ("Dbl Crop Lettuce/Barley", (226, 0, 124)),
    234: ("Dbl Crop Durum Wht/Sorghum", (255, 158, 11)),
    235: ("Dbl Crop Barley/Sorghum", (255, 158, 11)),
    236: ("Dbl Crop WinWht/Sorghum", (165, 112, 0)),
    237: ("Dbl Crop Barley/Corn", (255, 211, 0)),
    238: ("Dbl Crop WinWht/Cotton", (165, 112, 0)),
    239: ("Dbl Crop Soybeans/Cotton", (38, 112, 0)),
    240: ("Dbl Crop Soybeans/Oats", (38, 112, 0)),
    241: ("Dbl Crop Corn/Soybeans", (255, 211, 0)),
    242: ("Blueberries", (0, 0, 153)),
    243: ("Cabbage", (255, 102, 102)),
    244: ("Cauliflower", (255, 102, 102)),
    245: ("Celery", (255, 102, 102)),
    246: ("Radishes", (255, 102, 102)),
    247: ("Turnips", (255, 102, 102)),
    248: ("Eggplants", (255, 102, 102)),
    249: ("Gourds", (255, 102, 102)),
    250: ("Cranberries", (255, 102, 102)),
    254: ("Dbl Crop Barley/Soybeans", (38, 112, 0)),
}


def _full_cmap() -> dict[int, tuple[int, int, int, int]]:
    """All 256 values: named classes in their colour, background transparent, unused values black."""
    cmap = {v: (0, 0, 0, 255) for v in range(256)}
    for value, (_, rgb) in CDL_CLASSES.items():
        cmap[value] = (*rgb, 255)
    cmap[0] = (0, 0, 0, 0)
    return cmap


class CDL(RasterDataset):
    """The Cropland Data Layer (``YYYY_30m_cdls.tif``), a mask layer in CONUS Albers (EPSG:5070).

    Samples hold ``"mask"`` (int64 ``[H, W]``), read with nearest-neighbour
    resampling when reprojected.  ``cmap`` holds USDA's colours for all 256
    values and ``class_names`` the names of the classes in use.

    Args:
        root, crs, res, transforms, cache, storage_options: as :class:`RasterDataset`.
        classes: CDL class values to keep, starting with 0 (background);
            they become the ordinal labels ``0..n-1`` in that order, and every
            value not listed becomes 0.  Default: the raw CDL values.
        **kwargs: other :class:`RasterDataset` options.

    Example:
        >>> from pipekit.datasets import CDL
        >>> CDL.cmap[1], CDL.class_names[1], CDL.cmap[0][3]
        ((255, 211, 0, 255), 'Corn', 0)
    """

    filename_glob = "*_30m_cdls.*"
    filename_regex = r"""
        ^(?P<date>\d{4})
        _30m_cdls
        \.(?:tif|tiff|TIF|TIFF|img)$
    """
    date_format = "%Y"
    is_image = False
    nodata = 0
    cmap: Mapping[int, tuple[int, int, int, int]] = _full_cmap()
    class_names: Mapping[int, str] = {value: name for value, (name, _) in CDL_CLASSES.items()}

    def __init__(
        self,
        root: Any = None,
        crs: Any = None,
        res: Any = None,
        classes: Sequence[int] | None = None,
        transforms: Callable[[Sample], Sample] | None = None,
        cache: bool = True,
        storage_options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.classes = self._check_classes(classes)
        if self.classes is not None:
            lookup = np.zeros(256, dtype=np.uint8)
            for label, value in enumerate(self.classes):
                lookup[value] = label
            self._ordinal_map: np.ndarray | None = lookup
            self.cmap = {label: CDL.cmap[value] for label, value in enumerate(self.classes)}
            self.class_names = {
                label: CDL_CLASSES.get(value, (f"class {value}", None))[0]
                for label, value in enumerate(self.classes)
            }
        else:
            self._ordinal_map = None
        super().__init__(root, crs, res, None, transforms, cache, storage_options, **kwargs)

    @staticmethod
    def _check_classes(classes: Sequence[int] | None) -> list[int] | None:
        if classes is None:
            return None
        if isinstance(classes, (str, bytes)) or not isinstance(classes, Sequence):
            raise TypeError(f"classes must be a list of CDL class values, got {classes!r}")
        values = list(classes)
        bad = [v for v in values if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v <= 255]
        if bad:
            raise ValueError(f"CDL class values are integers in 0..255, got {bad}")
        if not values or values[0] != 0:
            raise ValueError(f"classes must start with 0 (the background, label 0), got {values}")
        if len(set(values)) != len(values):
            raise ValueError(f"classes must not repeat, got {values}")
        return [int(v) for v in values]

    def _postprocess(self, array: np.ndarray) -> np.ndarray:
        if self._ordinal_map is None:
            return array
        if array.dtype != np.uint8:
            array = np.clip(array, 0, 255).astype(np.uint8)
        return self._ordinal_map[array]
