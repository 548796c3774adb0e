"""Reading a local GeoTIFF's header without GDAL, for indexing many small files quickly.

Indexing opens every file once for its CRS, geotransform, size, bands, data
type and nodata value.  ``rasterio.open`` costs ~0.5 ms of CPU per small
local file, most of it Python-level code that holds the GIL (so threads do
not help); this module reads the first few KB of the file and parses the
TIFF (or BigTIFF) first image file directory and its GeoTIFF tags with
:mod:`struct` in ~30 µs.  (``tifffile`` was measured first: ~0.5 ms a file,
no faster than rasterio on these tiny files, since it parses every tag of
every page.)

Exactness is the rule, speed the bonus: :class:`FastHeaderReader` returns
exactly what :func:`pipekit.geo.catalog._headers.read_header` (rasterio) would, or
``None`` and the caller asks rasterio.  How:

* what a file's header says that is the same across a dataset's files --
  the GeoKey directory and its double and ASCII parameters (the CRS), the
  georeferencing form, the data type tags, the band count, the
  photometric and compression tags, the nodata text -- forms its
  *signature*.  The first file of each signature is opened with rasterio
  too: its CRS is kept for the signature (so the CRS object is GDAL's own,
  user-defined CRSs included), and the fast answer is compared field by
  field with rasterio's.  A signature whose fast answer differs is never
  read fast again (rasterio answers for all its files);
* what varies from file to file -- width, height, the tiepoint and pixel
  scale or the transformation matrix -- is turned into the geotransform
  and bounds with GDAL's and rasterio's own arithmetic;
* anything the parser does not fully understand goes to rasterio: not a
  TIFF, a first image that is a mask or a reduced-resolution image, GCPs
  (several tiepoints, or a tiepoint without a pixel scale), rotated or
  south-up transforms, no georeferencing tags (GDAL would look for a world
  file), sub-byte or complex or half-float data, old-style JPEG, a
  ``PIXELTYPE`` in GDAL's metadata tag, a GDAL side file (``.aux.xml``,
  ``.aux``) that could override the header, GDAL configuration that
  changes how headers are read (:data:`GDAL_OPTIONS_THAT_MATTER` in the
  environment or the active ``rasterio.Env``), and any read or parse error.

``PIPEKIT_FAST_HEADERS=0`` in the environment turns the fast path off
(every header read by rasterio, as before).

Only local files are read this way (remote ones would cost a request each
either way, and GDAL's are what pipekit reads them with).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import struct
import threading
from collections.abc import Callable
from typing import Any

from affine import Affine

from pipekit.errors import UnsupportedTiffError

__all__ = ["GDAL_OPTIONS_THAT_MATTER", "FastHeaderReader", "TiffTags", "UnsupportedTiffError", "parse_tiff_tags"]

logger = logging.getLogger("pipekit.geo")

#: bytes read from the start of a file (small files at once; tag values further on are read with a seek)
HEAD_BYTES = 16384

#: GDAL configuration options that change what a GeoTIFF header reads as: set, the fast path is off
GDAL_OPTIONS_THAT_MATTER = (
    "GTIFF_POINT_GEO_IGNORE",
    "GTIFF_GEOREF_SOURCES",
    "GDAL_PAM_ENABLED",
    "GDAL_PAM_PROXY_DIR",
    "GTIFF_REPORT_COMPD_CS",
    "GTIFF_SRS_SOURCE",
    "GTIFF_IGNORE_READ_ERRORS",
    "GDAL_GEOREF_SOURCES",
)

# TIFF tags read
_SUBFILE_TYPE, _WIDTH, _HEIGHT, _BITS, _COMPRESSION, _PHOTOMETRIC = 254, 256, 257, 258, 259, 262
_SAMPLES, _SAMPLE_FORMAT = 277, 339
_STRIP_OFFSETS, _STRIP_COUNTS, _TILE_OFFSETS, _TILE_COUNTS = 273, 279, 324, 325
_PIXEL_SCALE, _TIEPOINT, _TRANSFORMATION = 33550, 33922, 34264
_GEOKEYS, _GEO_DOUBLES, _GEO_ASCII = 34735, 34736, 34737
_GDAL_METADATA, _GDAL_NODATA = 42112, 42113
_WANTED = frozenset(
    (
        _SUBFILE_TYPE,
        _WIDTH,
        _HEIGHT,
        _BITS,
        _COMPRESSION,
        _PHOTOMETRIC,
        _SAMPLES,
        _SAMPLE_FORMAT,
        _PIXEL_SCALE,
        _TIEPOINT,
        _TRANSFORMATION,
        _GEOKEYS,
        _GEO_DOUBLES,
        _GEO_ASCII,
        _GDAL_METADATA,
        _GDAL_NODATA,
    )
)

# tags whose presence is checked (GDAL cannot open an image without them), not read
_LOCATIONS = frozenset((_STRIP_OFFSETS, _STRIP_COUNTS, _TILE_OFFSETS, _TILE_COUNTS))


@functools.lru_cache(maxsize=64)
def _struct(fmt: str) -> struct.Struct:
    return struct.Struct(fmt)


# TIFF field types: struct code and size (RATIONAL and SRATIONAL are not needed by any tag read here)
_FIELD_TYPES = {
    1: ("B", 1),
    2: ("s", 1),
    3: ("H", 2),
    4: ("I", 4),
    6: ("b", 1),
    7: ("B", 1),
    8: ("h", 2),
    9: ("i", 4),
    11: ("f", 4),
    12: ("d", 8),
    13: ("I", 4),
    16: ("Q", 8),
    17: ("q", 8),
    18: ("Q", 8),
}

# (SampleFormat, BitsPerSample) -> the numpy dtype name rasterio reports (others go to rasterio)
_DTYPES = {
    (1, 8): "uint8",
    (1, 16): "uint16",
    (2, 16): "int16",
    (1, 32): "uint32",
    (2, 32): "int32",
    (3, 32): "float32",
    (3, 64): "float64",
    (1, 64): "uint64",
    (2, 64): "int64",
}

# GeoKey: GTRasterTypeGeoKey (1 area, 2 point)
_RASTER_TYPE_KEY = 1025

_FLOAT32_MAX = 3.4028234663852886e38


class TiffTags(dict):
    """The tags of a TIFF file's first image that an index needs: ``{tag: values}`` (see :func:`parse_tiff_tags`).

    ``present`` holds the strip and tile location tags found (checked, not read).
    """

    __slots__ = ("present",)


def parse_tiff_tags(read: Callable[[int, int], bytes], head: bytes) -> TiffTags:
    """The tags of the first image file directory: ``{tag: tuple of values, or bytes for ASCII/UNDEFINED}``.

    ``head`` is the start of the file; ``read(offset, size)`` reads further on.

    Raises:
        UnsupportedTiffError: not a TIFF or BigTIFF file, or a directory that cannot be parsed.

    Example:
        >>> import struct
        >>> entries = [(256, 3, 1, 7), (257, 3, 1, 5)]
        >>> data = b"II*\\x00" + struct.pack("<I", 8) + struct.pack("<H", 2)
        >>> data += b"".join(struct.pack("<HHIHH", t, k, n, v, 0) for t, k, n, v in entries) + b"\\0" * 4
        >>> tags = parse_tiff_tags(lambda offset, size: data[offset:offset + size], data)
        >>> tags.get(256), tags.get(257)
        ((7,), (5,))
    """
    if len(head) < 16:
        raise UnsupportedTiffError("too short for a TIFF header")
    order = head[:2]
    if order == b"II":
        bo = "<"
    elif order == b"MM":
        bo = ">"
    else:
        raise UnsupportedTiffError("not a TIFF file")
    (magic,) = struct.unpack_from(bo + "H", head, 2)
    if magic == 42:
        (ifd,) = struct.unpack_from(bo + "I", head, 4)
        count_fmt, entry_fmt, entry_size, inline = "H", "HHI4s", 12, 4
    elif magic == 43:
        offset_size, zero, ifd = struct.unpack_from(bo + "HHQ", head, 4)
        if offset_size != 8 or zero != 0:
            raise UnsupportedTiffError("unusual BigTIFF header")
        count_fmt, entry_fmt, entry_size, inline = "Q", "HHQ8s", 20, 8
    else:
        raise UnsupportedTiffError("not a TIFF file")

    def chunk(offset: int, size: int) -> bytes:
        if offset + size <= len(head):
            return head[offset : offset + size]
        data = read(offset, size)
        if len(data) != size:
            raise UnsupportedTiffError(f"truncated at byte {offset}")
        return data

    count_size = struct.calcsize(count_fmt)
    (n,) = struct.unpack(bo + count_fmt, chunk(ifd, count_size))
    if not 0 < n < 4096:
        raise UnsupportedTiffError(f"{n} entries in the first directory")
    table = chunk(ifd + count_size, n * entry_size)
    values = TiffTags()
    present = set()
    offset_fmt = bo + ("I" if inline == 4 else "Q")
    for tag, kind, count, raw in _struct(bo + entry_fmt).iter_unpack(table):
        if tag not in _WANTED:
            if tag in _LOCATIONS:
                present.add(tag)
            continue
        field = _FIELD_TYPES.get(kind)
        if field is None:
            raise UnsupportedTiffError(f"tag {tag} has field type {kind}")
        code, size = field
        total = count * size
        if total > (1 << 24):
            raise UnsupportedTiffError(f"tag {tag} holds {total} bytes")
        data = raw[:total] if total <= inline else chunk(struct.unpack(offset_fmt, raw)[0], total)
        if code == "s" or kind == 7:
            values[tag] = bytes(data)
        else:
            values[tag] = _struct(f"{bo}{count}{code}").unpack(data)
    values.present = present
    return values


def _signature(tags: TiffTags) -> tuple[Any, ...]:
    """What a file shares with the other files of its kind (see the module docstring)."""
    get = tags.get
    return (
        get(_GEOKEYS),
        get(_GEO_DOUBLES),
        get(_GEO_ASCII),
        _TRANSFORMATION in tags,
        _TIEPOINT in tags,
        _PIXEL_SCALE in tags,
        get(_BITS),
        get(_SAMPLE_FORMAT),
        get(_SAMPLES),
        get(_PHOTOMETRIC),
        get(_COMPRESSION),
        get(_SUBFILE_TYPE),
        get(_GDAL_NODATA),
    )


def _geokey(tags: TiffTags, key: int) -> int | None:
    """A SHORT GeoKey's value stored in the directory itself, or ``None``."""
    directory = tags.get(_GEOKEYS)
    if not directory or len(directory) < 4:
        return None
    for k in range(4, min(len(directory), 4 + 4 * directory[3]), 4):
        if directory[k] == key and directory[k + 1] == 0:
            return directory[k + 3]
    return None


def _transform(tags: TiffTags) -> tuple[float, float, float, float]:
    """``(a, c, e, f)`` of the north-up geotransform GDAL derives from the tags (GDAL's arithmetic, in its order)."""
    matrix = tags.get(_TRANSFORMATION)
    point = _geokey(tags, _RASTER_TYPE_KEY) == 2
    if matrix is not None:
        if len(matrix) < 16 or tags.get(_TIEPOINT) is not None or point:
            raise UnsupportedTiffError("transformation matrix with tiepoints, or pixel-is-point")
        a, b, c, d, e, f = matrix[0], matrix[1], matrix[3], matrix[4], matrix[5], matrix[7]
        if b != 0.0 or d != 0.0:
            raise UnsupportedTiffError("rotated transform")
    else:
        tie = tags.get(_TIEPOINT)
        scale = tags.get(_PIXEL_SCALE)
        if tie is None or scale is None or len(tie) != 6 or len(scale) < 2:
            raise UnsupportedTiffError("no single tiepoint with a pixel scale (GCPs or no georeferencing)")
        a, e = scale[0], -scale[1]
        b = d = 0.0
        c = tie[3] - tie[0] * a
        f = tie[4] - tie[1] * e
        if point:  # GDAL moves pixel-is-point references to the pixel's corner
            c -= a * 0.5 + b * 0.5
            f -= d * 0.5 + e * 0.5
    if not (a > 0.0 and e < 0.0) or not all(math.isfinite(v) for v in (a, c, e, f)):
        raise UnsupportedTiffError("not a north-up transform")
    return a, c, e, f


def _nodata(text: bytes | None, dtype: str) -> float | None:
    if text is None:
        return None
    value = float(text.rstrip(b"\x00").strip().decode("ascii"))
    if dtype == "float32":  # GDALAdjustNoDataCloseToFloatMax
        if abs(value + _FLOAT32_MAX) < 1e-10 * _FLOAT32_MAX:
            return -_FLOAT32_MAX
        if abs(value - _FLOAT32_MAX) < 1e-10 * _FLOAT32_MAX:
            return _FLOAT32_MAX
    return value


def _gdal_options_set() -> bool:
    """Whether GDAL configuration that changes header reading is set (environment or ``rasterio.Env``)."""
    if any(name in os.environ for name in GDAL_OPTIONS_THAT_MATTER):
        return True
    import rasterio.env

    if rasterio.env.hasenv():
        options = rasterio.env.getenv()
        return any(name in options for name in GDAL_OPTIONS_THAT_MATTER)
    return False


class FastHeaderReader:
    """Reads local GeoTIFF headers with :func:`parse_tiff_tags`, checked against rasterio once per signature.

    Args:
        fallback: ``fallback(path)`` -> the :class:`~pipekit.geo.catalog._headers.RasterHeader`
            rasterio gives (its errors propagate).

    One reader is meant for one index build: it remembers each signature's
    CRS and whether its fast answer matched rasterio's, and each folder's
    GDAL side files.  Safe to call from several threads.  ``fast`` and
    ``slow`` count the files read each way.

    Example:
        >>> import tempfile, numpy as np, rasterio
        >>> from affine import Affine
        >>> from pipekit.geo.catalog._headers import read_header
        >>> from pipekit.geo.io import RasterOpener
        >>> root = tempfile.mkdtemp()
        >>> for i in range(3):
        ...     with rasterio.open(f"{root}/{i}.tif", "w", driver="GTiff", width=4, height=2, count=1,
        ...                        dtype="uint8", crs="EPSG:32615", nodata=0,
        ...                        transform=Affine(10, 0, 500000 + 40 * i, 0, -10, 4000000)) as f:
        ...         f.write(np.ones((1, 2, 4), dtype="uint8"))
        >>> reader = FastHeaderReader(lambda path: read_header(RasterOpener(), path))
        >>> headers = [reader(f"{root}/{i}.tif") for i in range(3)]
        >>> headers[2].bounds, headers[2].crs.to_epsg(), headers[2].nodata
        ((500080.0, 3999980.0, 500120.0, 4000000.0), 32615, 0.0)
        >>> reader.fast, reader.slow  # the first file of the kind was checked against rasterio
        (2, 1)
    """

    def __init__(self, fallback: Callable[[str], Any]) -> None:
        self.fallback = fallback
        self.enabled = os.environ.get("PIPEKIT_FAST_HEADERS", "1") != "0" and not _gdal_options_set()
        self.fast = 0
        self.slow = 0
        self._crs: dict[tuple[Any, ...], Any] = {}  # signature -> CRS, or None: read with rasterio
        self._folders: dict[str, frozenset[str]] = {}
        self._lock = threading.Lock()

    def __call__(self, path: str) -> Any:
        """The header of ``path`` (see :func:`pipekit.geo.catalog._headers.read_header`)."""
        local = self._local(path)
        if local is None:
            return self._slow(path)
        try:
            tags, header = self._parse(local, path)
        except (UnsupportedTiffError, OSError, ValueError, struct.error, UnicodeDecodeError, OverflowError) as exc:
            logger.debug("fast header read of %s declined: %s", path, exc)
            return self._slow(path)
        signature = _signature(tags)
        crs = self._crs.get(signature, False)
        if crs is None:
            return self._slow(path)
        if crs is False:
            truth = self._slow(path)
            header.crs = truth.crs
            same = truth.crs is not None and _same_header(header, truth)
            with self._lock:
                self._crs[signature] = truth.crs if same else None
            if not same:
                logger.debug("fast header read of %s differs from rasterio's: %s vs %s", path, header, truth)
            return truth
        header.crs = crs
        with self._lock:
            self.fast += 1
        return header

    def _slow(self, path: str) -> Any:
        header = self.fallback(path)
        with self._lock:
            self.slow += 1
        return header

    def _local(self, path: str) -> str | None:
        """The local file path to parse, or ``None`` where rasterio must read ``path``."""
        if not self.enabled:
            return None
        if "://" in path or "::" in path:
            if not path.startswith("file://"):
                return None
            path = path[len("file://") :]
        if path.startswith("/vsi"):
            return None
        head, _, name = path.rpartition(os.sep)
        folder = head or "."
        siblings = self._folders.get(folder)
        if siblings is None:
            try:
                siblings = frozenset(n.lower() for n in os.listdir(folder) if n.lower().endswith((".aux.xml", ".aux")))
            except OSError:
                return None
            self._folders[folder] = siblings
        if siblings:
            stem = name.rpartition(".")[0] or name
            name, stem = name.lower(), stem.lower()
            if name + ".aux.xml" in siblings or stem + ".aux" in siblings or name + ".aux" in siblings:
                return None  # GDAL's side file may override what the header says
        return path

    def _parse(self, local: str, url: str) -> tuple[TiffTags, Any]:
        from pipekit.geo.catalog._headers import RasterHeader

        with open(local, "rb") as f:
            head = f.read(HEAD_BYTES)

            def read(offset: int, size: int) -> bytes:
                f.seek(offset)
                return f.read(size)

            tags = parse_tiff_tags(read, head)
        if not ({_STRIP_OFFSETS, _STRIP_COUNTS} <= tags.present or {_TILE_OFFSETS, _TILE_COUNTS} <= tags.present):
            raise UnsupportedTiffError("no strip or tile offsets and byte counts")
        subfile = tags.get(_SUBFILE_TYPE, (0,))[0]
        if subfile & 0b101:  # a reduced-resolution image or a mask first
            raise UnsupportedTiffError(f"first image has NewSubfileType {subfile}")
        if tags.get(_COMPRESSION, (1,))[0] == 6:
            raise UnsupportedTiffError("old-style JPEG")
        metadata = tags.get(_GDAL_METADATA)
        if metadata is not None and b"PIXELTYPE" in metadata:
            raise UnsupportedTiffError("PIXELTYPE in GDAL's metadata")
        (width,), (height,) = tags.get(_WIDTH, (0,)), tags.get(_HEIGHT, (0,))
        count = tags.get(_SAMPLES, (1,))[0]
        bits = set(tags.get(_BITS, (1,)))
        formats = set(tags.get(_SAMPLE_FORMAT, (1,)))
        if width < 1 or height < 1 or count < 1 or len(bits) != 1 or len(formats) != 1:
            raise UnsupportedTiffError("no pixels, or bands of different types")
        dtype = _DTYPES.get((formats.pop(), bits.pop()))
        if dtype is None:
            raise UnsupportedTiffError("data type")
        if tags.get(_GEOKEYS) is None:
            raise UnsupportedTiffError("no GeoKey directory")
        a, c, e, f = _transform(tags)
        transform = Affine(a, 0.0, c, 0.0, e, f)
        bounds = (c, f + e * height, c + a * width, f)  # rasterio's DatasetBase.bounds (north-up)
        header = RasterHeader(
            url=url,
            crs=None,
            transform=transform,
            width=width,
            height=height,
            count=count,
            dtype=dtype,
            nodata=_nodata(tags.get(_GDAL_NODATA), dtype),
            bounds=bounds,
        )
        return tags, header


def _same_header(fast: Any, truth: Any) -> bool:
    """Whether two headers agree in every field an index uses (NaN nodata equal to NaN)."""

    def same_nodata(x: float | None, y: float | None) -> bool:
        if x is None or y is None:
            return x is y
        return x == y or (math.isnan(x) and math.isnan(y))

    return (
        tuple(fast.transform) == tuple(truth.transform)
        and (fast.width, fast.height, fast.count, fast.dtype) == (truth.width, truth.height, truth.count, truth.dtype)
        and tuple(fast.bounds) == tuple(truth.bounds)
        and same_nodata(fast.nodata, truth.nodata)
        and not truth.has_gcps
    )
