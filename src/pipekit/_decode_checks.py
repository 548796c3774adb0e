"""Checks made on an encoded file before it is decoded: the size it declares, its structure.

:func:`declared_size`: the pixel size an encoded image declares in its header, read without decoding it.
:mod:`pipekit.decoders` checks this size against its pixel limit before a decoder allocates the
pixels: a 632-byte JPEG may declare 60000x60000 pixels (10.8 GB once decoded).  Each reader looks at
the first bytes only (a JPEG's segments up to its start-of-frame, a TIFF's first directory) and
returns ``None`` when the header cannot be read; the decoder then reports the broken file itself.
:func:`jpeg_frame` adds what a JPEG decoder other than torchvision's must know before it may decode it.
:func:`check_png_structure` checks a PNG before torchvision's decoder sees it, :func:`check_npy_header` a
``.npy`` header before numpy allocates what it declares.
"""

from __future__ import annotations

import io
import struct
import zipfile
import zlib
from typing import Any

import numpy as np

from pipekit.errors import DecodeError

__all__ = [
    "check_npy_header", "check_npz", "check_png_structure", "declared_size", "jpeg_frame", "jpeg_size", "over_limit",
]

# JPEG start-of-frame markers: C0-CF except DHT (C4), JPG (C8) and DAC (CC)
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# markers without a length: TEM, RST0-7, SOI
_STANDALONE = frozenset({0x01, *range(0xD0, 0xD9)})


def jpeg_size(data: bytes) -> tuple[int, int] | None:
    """``(width, height)`` from a JPEG's start-of-frame segment (the EXIF thumbnail's is skipped with APP1)."""
    pos, end = 2, len(data) - 9
    while pos <= end:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
        elif marker in _SOF:
            height, width = struct.unpack_from(">HH", data, pos + 5)
            return (width, height) if height else None  # 0: the height comes later (DNL): unknown
        elif marker in _STANDALONE:
            pos += 2
        else:
            pos += 2 + ((data[pos + 2] << 8) | data[pos + 3])
    return None


_SOS, _APP1 = 0xDA, 0xE1


def jpeg_frame(data: bytes) -> tuple[int, int, int, bool] | None:
    """``(width, height, components, exif)`` of a JPEG, from its segments up to the start of scan.

    ``components`` is the frame's component count (1 gray, 3 YCbCr or RGB, 4 CMYK or YCCK), ``exif`` whether an
    APP1 segment holds EXIF data (which may rotate the image).  ``None`` when the segments cannot be walked to a
    frame header and the start of scan, or the height is 0 (given later, in a DNL segment).

    Example:
        >>> import io
        >>> from PIL import Image
        >>> buf = io.BytesIO()
        >>> Image.new("RGB", (5, 3)).save(buf, "JPEG")
        >>> jpeg_frame(buf.getvalue())
        (5, 3, 3, False)
    """
    pos, end, frame, exif = 2, len(data) - 9, None, False
    while pos <= end:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in _STANDALONE:
            pos += 2
            continue
        if marker == _SOS:
            return frame if frame is not None and frame[1] else None
        if marker in _SOF:
            height, width = struct.unpack_from(">HH", data, pos + 5)
            frame = (width, height, data[pos + 9], exif)
        elif marker == _APP1 and data[pos + 4 : pos + 10] == b"Exif\x00\x00":
            exif = True
            if frame is not None:
                frame = (*frame[:3], True)
        pos += 2 + ((data[pos + 2] << 8) | data[pos + 3])
    return None


def _webp(data: bytes) -> tuple[int, int] | None:
    kind = data[12:16]
    if kind == b"VP8X" and len(data) >= 30:
        width = int.from_bytes(data[24:27], "little") + 1
        height = int.from_bytes(data[27:30], "little") + 1
        return width, height
    if kind == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if kind == b"VP8 " and len(data) >= 30 and data[23:26] == b"\x9d\x01\x2a":
        width, height = struct.unpack_from("<HH", data, 26)
        return width & 0x3FFF, height & 0x3FFF
    return None


_TIFF_TYPES = {3: ("H", 2), 4: ("I", 4), 16: ("Q", 8)}  # SHORT, LONG, LONG8


def _tiff(data: bytes) -> tuple[int, int] | None:
    """``(width, height)`` of a TIFF's (or BigTIFF's) first image: tags 256 and 257 of its first directory."""
    order = "<" if data[:2] == b"II" else ">"
    big = data[2:4] in (b"+\x00", b"\x00+")
    try:
        if big:
            (offset,) = struct.unpack_from(order + "Q", data, 8)
            (count,) = struct.unpack_from(order + "Q", data, offset)
            entry, first, size = "HHQ", offset + 8, 20
        else:
            (offset,) = struct.unpack_from(order + "I", data, 4)
            (count,) = struct.unpack_from(order + "H", data, offset)
            entry, first, size = "HHI", offset + 2, 12
        found: dict[int, int] = {}
        for i in range(min(count, 4096)):
            at = first + i * size
            tag, kind, n = struct.unpack_from(order + entry, data, at)
            if tag in (256, 257) and kind in _TIFF_TYPES and n == 1:
                code, _ = _TIFF_TYPES[kind]
                (found[tag],) = struct.unpack_from(order + code, data, at + size - (8 if big else 4))
                if len(found) == 2:
                    return found[256], found[257]
    except struct.error:
        return None
    return None


def declared_size(data: bytes, fmt: str | None) -> tuple[int, int] | None:
    """``(width, height)`` that the header of an encoded image of format ``fmt`` declares, or ``None``.

    ``fmt`` is :func:`pipekit.decoders.image_format`'s answer.

    Example:
        >>> import io
        >>> from PIL import Image
        >>> buf = io.BytesIO(); Image.new("RGB", (7, 3)).save(buf, "JPEG")
        >>> declared_size(buf.getvalue(), "jpeg")
        (7, 3)
    """
    if fmt == "jpeg":
        return jpeg_size(data)
    if fmt == "png" and len(data) >= 24 and data[12:16] == b"IHDR":
        width, height = struct.unpack_from(">II", data, 16)
        return width, height
    if fmt == "gif" and len(data) >= 10:
        width, height = struct.unpack_from("<HH", data, 6)
        return width, height
    if fmt == "bmp" and len(data) >= 26:
        if int.from_bytes(data[14:18], "little") == 12:  # OS/2 BITMAPCOREHEADER
            width, height = struct.unpack_from("<Hh", data, 18)
        else:
            width, height = struct.unpack_from("<ii", data, 18)
        return abs(width), abs(height)
    if fmt == "webp":
        return _webp(data)
    if fmt == "tiff":
        return _tiff(data)
    return None


def over_limit(size: tuple[int, int] | None, limit: int, what: str = "image") -> str | None:
    """Why an image of ``size`` pixels is refused under ``limit``, or ``None`` when it is not."""
    if size is None or size[0] * size[1] <= limit:
        return None
    width, height = size
    return (f"the {what} declares {width}x{height} pixels ({width * height:,}), over the pixel limit of {limit:,} "
            "(a decompression bomb?); if the file is trusted, pass a larger max_pixels= to the decoder or pipe, "
            "or set pipekit.decoders.MAX_IMAGE_PIXELS")


_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))
_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}


def check_png_structure(data: bytes, limit: int) -> None:
    """Raise ``ValueError`` unless the PNG's chunks and image data are intact.

    Checks what libpng would otherwise only find while writing rows (where an
    error crashes torchvision 0.29's ``decode_png``): every chunk's CRC, an
    ``IHDR``, a complete zlib stream with a correct checksum and nothing after
    it, exactly the amount of image data the header announces, valid row
    filter types, and an ``IEND``.
    """
    pos, ihdr, idat, ended = 8, b"", [], False
    while pos + 12 <= len(data):
        length = int.from_bytes(data[pos : pos + 4], "big")
        kind = data[pos + 4 : pos + 8]
        end = pos + 12 + length
        if end > len(data):
            raise ValueError(f"truncated {kind!r} chunk")
        body = data[pos + 8 : pos + 8 + length]
        if zlib.crc32(kind + body) != int.from_bytes(data[end - 4 : end], "big"):
            raise ValueError(f"CRC error in the {kind.decode('latin-1')} chunk")
        if kind == b"IHDR":
            ihdr = body
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            ended = True
            break
        pos = end
    if len(ihdr) != 13:
        raise ValueError("missing or malformed IHDR chunk")
    width, height, depth, color, compression, filtering, interlace = struct.unpack(">IIBBBBB", ihdr)
    if color not in _PNG_CHANNELS or depth not in (1, 2, 4, 8, 16) or interlace > 1 or compression or filtering:
        raise ValueError("invalid IHDR chunk")
    if not width or not height or width >= 2**31 or height >= 2**31:
        raise ValueError("invalid IHDR chunk")
    if width * height > limit:
        raise ValueError(over_limit((width, height), limit))
    if not idat:
        raise ValueError("no image data (IDAT)")
    if not ended:
        raise ValueError("missing IEND chunk (truncated file)")
    inflater = zlib.decompressobj()
    raw = inflater.decompress(b"".join(idat))
    if not inflater.eof:
        raise ValueError("truncated image data (incomplete zlib stream)")
    if inflater.unused_data:
        raise ValueError("extra data after the compressed image data")
    bits = _PNG_CHANNELS[color] * depth
    passes = ((0, 0, 1, 1),) if interlace == 0 else _ADAM7
    view = np.frombuffer(raw, np.uint8)
    offset = 0
    for x0, y0, dx, dy in passes:
        pw, ph = (width - x0 + dx - 1) // dx, (height - y0 + dy - 1) // dy
        if pw <= 0 or ph <= 0:
            continue
        stride = 1 + (pw * bits + 7) // 8
        if offset + stride * ph > len(raw):
            raise ValueError("not enough image data")
        if np.any(view[offset : offset + stride * ph : stride] > 4):
            raise ValueError("invalid row filter type")
        offset += stride * ph
    if offset != len(raw):
        raise ValueError("too much image data")


def _npy_shortfall(stream: Any, size: int) -> str | None:
    """Why a ``.npy`` of ``size`` bytes read from ``stream`` (at its start) holds less than its header declares."""
    from numpy.lib import format as npy_format

    start = stream.tell()
    try:
        version = npy_format.read_magic(stream)
        read_header = npy_format.read_array_header_1_0 if version == (1, 0) else npy_format.read_array_header_2_0
        shape, _, dtype = read_header(stream)
    except ValueError:
        return None  # not a .npy numpy can read: np.load says why
    if dtype.hasobject:
        return None  # refused by allow_pickle=False
    needed = int(np.prod(shape, dtype=object)) * dtype.itemsize
    held = size - (stream.tell() - start)
    if needed <= held:
        return None
    return (f"the header declares an array of shape {tuple(shape)} and dtype {dtype} ({needed:,} bytes) "
            f"but the file holds {held:,} bytes of data (truncated, or a forged header)")


def check_npy_header(data: bytes) -> None:
    """Refuse a ``.npy`` whose header declares more data than the file holds, before numpy allocates it.

    numpy allocates the whole declared array before reading it: a 200-byte file declaring a
    100000x100000 array of float64 asks for 74.5 GiB (``MemoryError``), a smaller declaration
    allocates it and then finds the data missing.
    """
    reason = _npy_shortfall(io.BytesIO(data), len(data))
    if reason is not None:
        raise DecodeError("decode", "<bytes>", "decode_npy", reason)


#: ``decode_npz`` refuses an archive expanding past ``max_ratio`` times its size only past this many bytes.
NPZ_RATIO_FLOOR = 100 << 20


def check_npz(data: bytes, max_ratio: int) -> None:
    """Refuse an ``.npz`` whose members declare more than ``max_ratio`` times its size (past
    :data:`NPZ_RATIO_FLOOR`), or a member whose ``.npy`` header declares more than the member holds.

    The sizes come from the zip's directory (which bounds what zipfile decompresses) and each member's
    header: nothing is decompressed past the headers.
    """
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, ValueError):
        return  # np.load says why
    with zf:
        total = 0
        for info in zf.infolist():
            total += info.file_size
            if total > NPZ_RATIO_FLOOR and total > max_ratio * max(len(data), 1):
                raise DecodeError("decode", "<bytes>", "decode_npz",
                                  f"member {info.filename!r}: the archive ({len(data):,} bytes) expands to "
                                  f"{total:,} bytes so far, over max_ratio={max_ratio:,} times its size "
                                  "(a decompression bomb?); if the file is trusted, pass a larger max_ratio=")
            if info.filename.endswith(".npy"):
                try:
                    with zf.open(info) as member:
                        reason = _npy_shortfall(member, info.file_size)
                except (zipfile.BadZipFile, OSError, EOFError):
                    continue  # np.load says why
                if reason is not None:
                    raise DecodeError("decode", "<bytes>", "decode_npz", f"member {info.filename!r}: {reason}")
