"""CDL: the USDA NASS Cropland Data Layer, a yearly 30 m crop-type map of the contiguous US.

One file per year, in CONUS Albers Equal Area (EPSG:5070), one ``uint8``
band of class codes (0 is background / no data)::

    2023_30m_cdls.tif       (also .tiff, .img)
    |    the sample's time: the whole year

The class codes, names and colours are USDA's: the 134 codes of the colour
table of the released GeoTIFFs, with the colours TorchGeo 0.8's ``CDL.cmap``
holds.  As in TorchGeo, samples carry *ordinal* labels: the codes listed in
``classes=`` (default: all 134) become ``0..n-1`` in that order, every
other code becomes 0 (background); ``ordinal=False`` (pipekit only) keeps
the raw codes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from pipekit.errors import ArchiveError, DatasetNotFoundError, HashError, ReadError
from pipekit.geo._base import Sample
from pipekit.geo._raster import RasterDataset
from pipekit.geo.catalog._listing import find_files

__all__ = ["CDL", "CDL_CLASSES"]

#: ``{value: (name, (r, g, b))}`` for the named CDL classes.
CDL_CLASSES: dict[int, tuple[str, tuple[int, int, int]]] = {
    0: ("Background", (0, 0, 0)),
    1: ("Corn", (255, 211, 0)),
    2: ("Cotton", (255, 37, 37)),
    3: ("Rice", (0, 168, 226)),
    4: ("Sorghum", (255, 158, 9)),
    5: ("Soybeans", (37, 111, 0)),
    6: ("Sunflower", (255, 255, 0)),
    10: ("Peanuts", (111, 166, 0)),
    11: ("Tobacco", (0, 175, 73)),
    12: ("Sweet Corn", (222, 166, 9)),
    13: ("Pop or Orn Corn", (222, 166, 9)),
    14: ("Mint", (124, 211, 255)),
    21: ("Barley", (226, 0, 124)),
    22: ("Durum Wheat", (137, 96, 83)),
    23: ("Spring Wheat", (217, 181, 107)),
    24: ("Winter Wheat", (166, 111, 0)),
    25: ("Other Small Grains", (213, 158, 188)),
    26: ("Dbl Crop WinWht/Soybeans", (111, 111, 0)),
    27: ("Rye", (171, 0, 124)),
    28: ("Oats", (160, 88, 137)),
    29: ("Millet", (111, 0, 73)),
    30: ("Speltz", (213, 158, 188)),
    31: ("Canola", (209, 255, 0)),
    32: ("Flaxseed", (124, 153, 255)),
    33: ("Safflower", (213, 213, 0)),
    34: ("Rape Seed", (209, 255, 0)),
    35: ("Mustard", (0, 175, 73)),
    36: ("Alfalfa", (255, 166, 226)),
    37: ("Other Hay/Non Alfalfa", (166, 241, 139)),
    38: ("Camelina", (0, 175, 73)),
    39: ("Buckwheat", (213, 158, 188)),
    41: ("Sugarbeets", (168, 0, 226)),
    42: ("Dry Beans", (166, 0, 0)),
    43: ("Potatoes", (111, 37, 0)),
    44: ("Other Crops", (0, 175, 73)),
    45: ("Sugarcane", (175, 124, 255)),
    46: ("Sweet Potatoes", (111, 37, 0)),
    47: ("Misc Vegs & Fruits", (255, 102, 102)),
    48: ("Watermelons", (255, 102, 102)),
    49: ("Onions", (255, 204, 102)),
    50: ("Cucumbers", (255, 102, 102)),
    51: ("Chick Peas", (0, 175, 73)),
    52: ("Lentils", (0, 222, 175)),
    53: ("Peas", (83, 255, 0)),
    54: ("Tomatoes", (241, 162, 120)),
    55: ("Caneberries", (255, 102, 102)),
    56: ("Hops", (0, 175, 73)),
    57: ("Herbs", (124, 211, 255)),
    58: ("Clover/Wildflowers", (232, 190, 255)),
    59: ("Sod/Grass Seed", (175, 255, 222)),
    60: ("Switchgrass", (0, 175, 73)),
    61: ("Fallow/Idle Cropland", (190, 190, 120)),
    63: ("Forest", (147, 204, 147)),
    64: ("Shrubland", (198, 213, 158)),
    65: ("Barren", (204, 190, 162)),
    66: ("Cherries", (255, 0, 255)),
    67: ("Peaches", (255, 143, 171)),
    68: ("Apples", (185, 0, 79)),
    69: ("Grapes", (111, 69, 137)),
    70: ("Christmas Trees", (0, 120, 120)),
    71: ("Other Tree Crops", (175, 153, 111)),
    72: ("Citrus", (255, 255, 124)),
    74: ("Pecans", (181, 111, 92)),
    75: ("Almonds", (0, 166, 130)),
    76: ("Walnuts", (232, 213, 175)),
    77: ("Pears", (175, 153, 111)),
    81: ("Clouds/No Data", (241, 241, 241)),
    82: ("Developed", (153, 153, 153)),
    83: ("Water", (73, 111, 162)),
    87: ("Wetlands", (124, 175, 175)),
    88: ("Nonag/Undefined", (232, 255, 190)),
    92: ("Aquaculture", (0, 255, 255)),
    111: ("Open Water", (73, 111, 162)),
    112: ("Perennial Ice/Snow", (211, 226, 249)),
    121: ("Developed/Open Space", (153, 153, 153)),
    122: ("Developed/Low Intensity", (153, 153, 153)),
    123: ("Developed/Med Intensity", (153, 153, 153)),
    124: ("Developed/High Intensity", (153, 153, 153)),
    131: ("Barren", (204, 190, 162)),
    141: ("Deciduous Forest", (147, 204, 147)),
    142: ("Evergreen Forest", (147, 204, 147)),
    143: ("Mixed Forest", (147, 204, 147)),
    152: ("Shrubland", (198, 213, 158)),
    176: ("Grass/Pasture", (232, 255, 190)),
    190: ("Woody Wetlands", (124, 175, 175)),
    195: ("Herbaceous Wetlands", (124, 175, 175)),
    204: ("Pistachios", (0, 255, 139)),
    205: ("Triticale", (213, 158, 188)),
    206: ("Carrots", (255, 102, 102)),
    207: ("Asparagus", (255, 102, 102)),
    208: ("Garlic", (255, 102, 102)),
    209: ("Cantaloupes", (255, 102, 102)),
    210: ("Prunes", (255, 143, 171)),
    211: ("Olives", (51, 73, 51)),
    212: ("Oranges", (226, 111, 37)),
    213: ("Honeydew Melons", (255, 102, 102)),
    214: ("Broccoli", (255, 102, 102)),
    215: ("Avocados", (102, 153, 77)),
    216: ("Peppers", (255, 102, 102)),
    217: ("Pomegranates", (175, 153, 111)),
    218: ("Nectarines", (255, 143, 171)),
    219: ("Greens", (255, 102, 102)),
    220: ("Plums", (255, 143, 171)),
    221: ("Strawberries", (255, 102, 102)),
    222: ("Squash", (255, 102, 102)),
    223: ("Apricots", (255, 143, 171)),
    224: ("Vetch", (0, 175, 73)),
    225: ("Dbl Crop WinWht/Corn", (255, 211, 0)),
    226: ("Dbl Crop Oats/Corn", (255, 211, 0)),
    227: ("Lettuce", (255, 102, 102)),
    228: ("Dbl Crop Triticale/Corn", (255, 211, 0)),
    229: ("Pumpkins", (255, 102, 102)),
    230: ("Dbl Crop Lettuce/Durum Wht", (137, 96, 83)),
    231: ("Dbl Crop Lettuce/Cantaloupe", (255, 102, 102)),
    232: ("Dbl Crop Lettuce/Cotton", (255, 37, 37)),
    233: ("Dbl Crop Lettuce/Barley", (226, 0, 124)),
    234: ("Dbl Crop Durum Wht/Sorghum", (255, 158, 9)),
    235: ("Dbl Crop Barley/Sorghum", (255, 158, 9)),
    236: ("Dbl Crop WinWht/Sorghum", (166, 111, 0)),
    237: ("Dbl Crop Barley/Corn", (255, 211, 0)),
    238: ("Dbl Crop WinWht/Cotton", (166, 111, 0)),
    239: ("Dbl Crop Soybeans/Cotton", (37, 111, 0)),
    240: ("Dbl Crop Soybeans/Oats", (37, 111, 0)),
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
    254: ("Dbl Crop Barley/Soybeans", (37, 111, 0)),
}


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _int_list(values: Any, what: str, example: str) -> list[int]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"{what} must be a list of {example}, got {values!r}")
    values = list(values)
    bad = [v for v in values if not _is_int(v)]
    if bad:
        raise TypeError(f"{what} must be a list of {example} (ints), got {bad}")
    return [int(v) for v in values]


class CDL(RasterDataset):
    """The Cropland Data Layer (``YYYY_30m_cdls.tif``), a mask layer in CONUS Albers (EPSG:5070).

    TorchGeo 0.8's ``CDL``: samples hold ``"mask"`` (int64 ``[H, W]``) of
    ordinal labels, read with nearest-neighbour resampling when reprojected.
    The raw codes are read (and cached) as they are; each sample's codes are
    then mapped through :attr:`ordinal_map`: ``classes[i] -> i``, every other
    code -> 0 (background).

    Args:
        paths: a directory (searched recursively), a file, a glob, an fsspec
            URL or a list of them (default ``"data"``); ``root=`` is accepted too.
        crs, res, transforms, cache: as :class:`RasterDataset`.
        years: the years to use, from the year in the file names (default:
            ``[2023]`` to extract or download, and every year found is used).
            Each must be a year USDA released (2008-2024, the keys of
            :attr:`md5s`), and a file of each year listed must be found (or
            extracted / downloaded).
        classes: CDL codes to keep, ``0`` (background) first; they become the
            labels ``0..n-1`` in that order, and every other code becomes 0.
            Default (or ``None``): all 134 codes of :attr:`cmap`.
        download: when no file is found in ``paths`` (a local directory),
            download each year's ``YYYY_30m_cdls.zip`` from USDA into it
            (:attr:`url`) and extract it; zips already there are extracted
            without it.
        checksum: check the MD5 of downloaded zips (:attr:`md5s`).
        ordinal: pipekit only: ``False`` keeps the raw CDL codes in masks
            (then ``classes`` cannot be given).
        storage_options, **kwargs: other :class:`RasterDataset` options.

    Attributes:
        cmap: ``{code: (r, g, b, a)}`` for the 134 CDL codes (TorchGeo's).
        classes: the codes kept, in label order.
        ordinal_map: int64 tensor indexed by code (length 255): its label.
        ordinal_cmap: uint8 tensor ``[len(classes), 4]``: the RGBA of each label.
        class_names: ``{mask value: name}`` (``CDL.class_names``, on the
            class: ``{code: name}``).
        years: the years asked for (``[2023]`` when not given).

    Differences from TorchGeo 0.8, on purpose:

    * TorchGeo only uses ``years`` to extract or download files; files of
      other years found in ``paths`` are used all the same.  pipekit uses
      only the files of the years given (without ``years=``, all of them, as
      TorchGeo), and raises ``DatasetNotFoundError`` (a ``FileNotFoundError``) naming a year without a file.
    * TorchGeo accepts ``classes`` with 0 anywhere (then the unlisted codes
      share the label of ``classes[0]``) and repeated codes; pipekit refuses
      both.  Invalid ``years``/``classes`` raise ``ValueError`` (TorchGeo:
      ``AssertionError``) with TorchGeo's message.
    * TorchGeo maps the codes after ``transforms`` ran (they see raw codes);
      pipekit maps them first, so ``transforms`` see the labels the sample
      ends with.  A code outside the colour table (e.g. 255) becomes 0 where
      TorchGeo raises ``IndexError``.
    * Names also ending in ``.tiff`` or ``.img`` (older releases) are indexed.

    Example:
        >>> import tempfile, numpy as np, rasterio
        >>> from affine import Affine
        >>> from pipekit.datasets import CDL
        >>> root = tempfile.mkdtemp()
        >>> codes = np.array([[1, 24], [176, 62]], dtype="uint8")  # corn, winter wheat, grass, (no class)
        >>> with rasterio.open(f"{root}/2023_30m_cdls.tif", "w", driver="GTiff", width=2, height=2, count=1,
        ...                    dtype="uint8", crs="EPSG:5070", transform=Affine(30, 0, 0, 0, -30, 60)) as f:
        ...     f.write(codes, 1)
        >>> ds = CDL(root)
        >>> sample = ds[ds.bounds]
        >>> sample["mask"].tolist(), sample["mask"].dtype, len(ds.classes)
        ([[1, 15], [83, 0]], torch.int64, 134)
        >>> CDL(root, classes=[0, 24, 176])[ds.bounds]["mask"].tolist()
        [[0, 1], [2, 0]]
        >>> CDL(root, ordinal=False)[ds.bounds]["mask"].tolist()
        [[1, 24], [176, 62]]
        >>> ds.ordinal_map[24].item(), ds.class_names[15], ds.ordinal_cmap[15].tolist() == list(CDL.cmap[24])
        (15, 'Winter Wheat', True)
        >>> ds.labels_of([24, 176])
        [15, 83]
    """

    filename_glob = "*_30m_cdls.*"
    filename_regex = r"""
        ^(?P<date>\d{4})
        _30m_cdls
        \.(?:tif|tiff|TIF|TIFF|img)$
    """
    zipfile_glob = "*_30m_cdls.zip"
    date_format = "%Y"
    is_image = False
    nodata = 0
    url = "https://www.nass.usda.gov/Research_and_Science/Cropland/Release/datasets/{}_30m_cdls.zip"
    #: ``{year: MD5 of YYYY_30m_cdls.zip}``: the years released (TorchGeo 0.8's list).
    md5s: ClassVar[dict[int, str]] = {
        2024: "841cd0cb8d4a9129cb1e4cfa0e40c286",
        2023: "8c7685d6278d50c554f934b16a6076b7",
        2022: "754cf50670cdfee511937554785de3e6",
        2021: "27606eab08fe975aa138baad3e5dfcd8",
        2020: "483ee48c503aa81b684225179b402d42",
        2019: "a5168a2fc93acbeaa93e24eee3d8c696",
        2018: "4ad0d7802a9bb751685eb239b0fa8609",
        2017: "d173f942a70f94622f9b8290e7548684",
        2016: "fddc5dff0bccc617d70a12864c993e51",
        2015: "2e92038ab62ba75e1687f60eecbdd055",
        2014: "50bdf9da84ebd0457ddd9e0bf9bbcc1f",
        2013: "7be66c650416dc7c4a945dd7fd93c5b7",
        2012: "286504ff0512e9fe1a1975c635a1bec2",
        2011: "517bad1a99beec45d90abb651fb1f0e3",
        2010: "98d354c5a62c9e3e40ccadce265c721c",
        2009: "663c8a5fdd92ebfc0d6bee008586d19a",
        2008: "0610f2f17ab60a9fbb3baeb7543993a4",
    }
    cmap: ClassVar[dict[int, tuple[int, int, int, int]]] = {
        value: (*rgb, 255) for value, (_, rgb) in CDL_CLASSES.items()
    }
    class_names: Mapping[int, str] = {value: name for value, (name, _) in CDL_CLASSES.items()}

    def __init__(
        self,
        paths: Any = None,
        crs: Any = None,
        res: Any = None,
        years: Iterable[int] | None = None,
        classes: Sequence[int] | None = None,
        transforms: Callable[[Sample], Sample] | None = None,
        cache: bool = True,
        download: bool = False,
        checksum: bool = False,
        *,
        root: Any = None,
        ordinal: bool = True,
        storage_options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if paths is not None and root is not None:
            raise TypeError("pass paths= or root= (pipekit's name), not both")
        if not isinstance(ordinal, bool):
            raise TypeError(f"ordinal must be a bool, got {ordinal!r}")
        for name, flag in (("download", download), ("checksum", checksum)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {flag!r}")
        wanted = self._check_years(years)
        if not ordinal and classes is not None:
            raise ValueError("classes= maps CDL codes to ordinal labels, and ordinal=False keeps the raw codes: "
                             "pass one or the other")
        self.ordinal = ordinal
        self.years = [2023] if wanted is None else wanted
        self.classes = self._check_classes(classes)
        self.download = download
        self.checksum = checksum
        if wanted is not None:
            # only the files whose name holds one of these years (four digits standing alone)
            years_re = "|".join(str(y) for y in sorted(set(wanted)))
            self.filename_regex = rf"(?=.*?(?<!\d)(?:{years_re})(?!\d))" + type(self).filename_regex

        location = paths if paths is not None else root
        args = (location, crs, res, None, transforms, cache, storage_options)
        try:
            super().__init__(*args, **kwargs)
        except FileNotFoundError as exc:
            if self._listed(location, storage_options) or not self._fetch(location, self.years):
                raise self._not_found(location, self.years) from exc
            super().__init__(*args, **kwargs)
        if wanted is not None:
            missing = self._missing_years(wanted)
            if missing and self._fetch(location, missing):
                super().__init__(*args, **kwargs)
                missing = self._missing_years(wanted)
            if missing:
                raise self._not_found(location, missing)

        self.ordinal_map = torch.zeros(max(self.cmap) + 1, dtype=self.dtype)
        self.ordinal_cmap = torch.zeros((len(self.classes), 4), dtype=torch.uint8)
        self._lookup = np.zeros(256, dtype=np.uint8)
        for label, code in enumerate(self.classes):
            self.ordinal_map[code] = label
            self.ordinal_cmap[label] = torch.tensor(self.cmap[code], dtype=torch.uint8)
            self._lookup[code] = label
        self._pair_lookup = _pair_table(self._lookup)
        if ordinal:
            self.class_names = {label: CDL_CLASSES[code][0] for label, code in enumerate(self.classes)}

    # -- arguments ----------------------------------------------------------------------------
    def _check_years(self, years: Iterable[int] | None) -> list[int] | None:
        if years is None:
            return None
        values = _int_list(years, "years", "years such as [2022, 2023]")
        if not values:
            raise ValueError("years must not be empty (leave it out to use every year found)")
        unknown = [y for y in values if y not in self.md5s]
        if unknown:
            raise ValueError(f"CDL has no year(s) {unknown}: "
                             f"CDL data product only exists for the following years: {list(self.md5s)}.")
        return values

    def _check_classes(self, classes: Sequence[int] | None) -> list[int]:
        if classes is None:
            return list(self.cmap)
        values = _int_list(classes, "classes", "CDL class codes such as [0, 1, 5]")
        unknown = [v for v in values if v not in self.cmap]
        if unknown:
            raise ValueError(f"{unknown} are not CDL class codes. Only the following classes are valid: "
                             f"{list(self.cmap)}.")
        if 0 not in values:
            raise ValueError(f"Classes must include the background class: 0 (got {values})")
        if values[0] != 0:
            raise ValueError(f"classes must start with 0, the background, which becomes label 0 and takes every "
                             f"code not listed (got {values}; TorchGeo would give classes[0] and the unlisted "
                             "codes the same label)")
        if len(set(values)) != len(values):
            raise ValueError(f"classes must not repeat, got {values}")
        return values

    def labels_of(self, codes: Iterable[int]) -> list[int]:
        """The mask values of CDL ``codes``: their labels (the codes themselves with ``ordinal=False``).

        Raises:
            ValueError: a code is not among :attr:`classes` (its pixels are label 0, the background).
        """
        values = _int_list(codes, "codes", "CDL class codes")
        if not self.ordinal:
            return values
        label_of = {code: label for label, code in enumerate(self.classes)}
        missing = [v for v in values if v not in label_of]
        if missing:
            raise ValueError(f"CDL code(s) {missing} are not among the dataset's classes (their pixels are label 0, "
                             f"the background): pass them in CDL(classes=...); classes: {self.classes}")
        return [label_of[v] for v in values]

    # -- files: TorchGeo's _verify (extract YYYY_30m_cdls.zip, or download it) -----------------------
    def _year_of(self, path: str) -> int | None:
        match = self._regex.match(path.replace("\\", "/").rsplit("/", 1)[-1])
        date = match.groupdict().get("date") if match is not None else None
        return int(date[:4]) if date else None

    def _missing_years(self, wanted: list[int]) -> list[int]:
        found = {self._year_of(path) for path in self.files}
        return sorted(set(wanted) - found)

    def _listed(self, location: Any, storage_options: Mapping[str, Any] | None) -> bool:
        """Whether files named like CDL files are there (then an error indexing them is not a missing dataset)."""
        try:
            return bool(find_files("data" if location is None else location, self._glob(), self._regex,
                                   storage_options, name=self.name))
        except FileNotFoundError:
            return False

    @staticmethod
    def _local_dir(location: Any) -> Path | None:
        location = "data" if location is None else location
        if isinstance(location, (str, os.PathLike)) and "://" not in os.fspath(location):
            return Path(location)
        return None

    def _fetch(self, location: Any, years: list[int]) -> bool:
        """Extract ``YYYY_30m_cdls.zip`` of each year in the local directory ``location``, downloading
        the missing zips first with ``download=True``; ``False`` when that cannot be done."""
        folder = self._local_dir(location)
        if folder is None:
            return False
        zips = {year: folder / self.zipfile_glob.replace("*", str(year)) for year in sorted(set(years))}
        absent = [year for year, path in zips.items() if not path.is_file()]
        if absent and not self.download:
            return False
        folder.mkdir(parents=True, exist_ok=True)
        for year in absent:
            self._download_zip(year, folder)
        for path in zips.values():
            self._extract_zip(path, folder)
        return True

    def _download_zip(self, year: int, folder: Path) -> None:
        # pipekit's download_url: an interrupted transfer resumes from its ``.part`` file next time, and
        # the zip is moved into place only once its MD5 matches (with checksum=True).
        from pipekit.datasets._download import download_url

        url = self.url.format(year)
        path = folder / self.zipfile_glob.replace("*", str(year))
        try:
            download_url(url, str(folder), path.name, md5=self.md5s[year] if self.checksum else None)
        except HashError as exc:
            raise HashError("check the MD5 of", url, self.name, f"expected MD5 {exc.expected}, got {exc.actual}",
                            exc.expected, exc.actual) from exc
        except Exception as exc:
            raise ReadError("download", url, self.name, f"{type(exc).__name__}: {exc}") from exc

    def _extract_zip(self, path: Path, folder: Path) -> None:
        # pipekit's extract_archive refuses members escaping ``folder`` (``..``, absolute names, links).
        from pipekit.datasets._download import extract_archive

        try:
            extract_archive(str(path), str(folder))
        except ArchiveError as exc:  # named by extract_archive's stage: name CDL's
            raise ArchiveError("extract", str(path), self.name, exc.reason) from exc
        except Exception as exc:
            raise ArchiveError("extract", str(path), self.name, f"{type(exc).__name__}: {exc}") from exc

    def _not_found(self, location: Any, years: list[int]) -> DatasetNotFoundError:
        where = "data" if location is None else location
        where = os.fspath(where) if isinstance(where, os.PathLike) else where
        years = sorted(set(years))
        zips = ", ".join(self.zipfile_glob.replace("*", str(y)) for y in years)
        how = ("pass download=True to download them from USDA" if self._local_dir(location) is not None
               else "download=True only fills a local directory")
        return DatasetNotFoundError(
            f"Dataset not found: {self.name}: no file for year(s) {years} (named like '{{year}}_30m_cdls.tif') "
            f"in {where!r}, nor {zips} to extract; {how}"
        )

    # -- reading ------------------------------------------------------------------------------
    def _postprocess(self, array: np.ndarray) -> np.ndarray:
        """Codes -> ordinal labels (after the read: the warp cache keeps raw codes)."""
        if not self.ordinal:
            return array
        if array.dtype != np.uint8:
            array = np.clip(array, 0, 255).astype(np.uint8)
        return _relabel(array, self._lookup, self._pair_lookup)

    def _plot_spec(self) -> dict[str, Any]:
        if not self.ordinal:
            return {"cmap": self.cmap, "class_names": self.class_names}
        colours = {label: tuple(int(c) for c in rgba) for label, rgba in enumerate(self.ordinal_cmap.tolist())}
        return {"cmap": colours, "class_names": self.class_names}


def _pair_table(lookup: np.ndarray) -> np.ndarray:
    """``uint16 [65536]``: for two consecutive ``uint8`` codes read as one ``uint16``, their two labels.

    Built from the bytes of each index in memory order, so it holds on any byte order.
    """
    pairs = np.arange(1 << 16, dtype=np.uint16).view(np.uint8).reshape(-1, 2)
    return np.ascontiguousarray(lookup[pairs]).reshape(-1).view(np.uint16)


def _relabel(codes: np.ndarray, lookup: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """``lookup[codes]`` for ``uint8`` codes, two codes per gather where the array allows it.

    A 256 px mask is 65,536 gathers with ``lookup[codes]`` (~0.4 ms); as
    32,768 ``uint16`` pairs through :func:`_pair_table`'s 128 KiB table it
    takes a third of that.  Same values, same ``uint8`` dtype.
    """
    if codes.flags.c_contiguous and codes.size % 2 == 0 and codes.size:
        return np.take(pairs, codes.reshape(-1).view(np.uint16), mode="clip").view(np.uint8).reshape(codes.shape)
    return np.take(lookup, codes)
