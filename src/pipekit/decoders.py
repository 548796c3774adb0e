"""Pure decoding kernels: bytes in, tensors and Python objects out.

The pipes in :mod:`pipekit.pipes._decode` wrap these functions; they are also
usable on their own (in a ``map``, a ``Dataset.__getitem__``...).

Images
------
:func:`decode_image_bytes` turns an encoded image into a ``CHW``
``uint8`` tensor (``uint16`` for 16-bit PNG and TIFF), whatever the format:

========  =====================================================================
format    backend and notes
========  =====================================================================
JPEG      ``torchvision.io.decode_jpeg`` (libjpeg-turbo); EXIF orientation applied.  Where the
          optional ``simplejpeg`` package is installed (``pip install simplejpeg``), JPEGs
          without an EXIF segment are decoded by it: the same libjpeg-turbo decode, the
          same pixels, ~10% less CPU than torchvision's build; CMYK files, files with
          EXIF and files it finds fault with go to torchvision as before.
PNG       Pillow.  ``torchvision.io.decode_png`` (0.29) is not used for 8-bit files:
          it kills the process (SIGSEGV) on many corrupt PNGs -- 4 in 10 in a
          fuzz test with flipped, cut or deleted bytes -- and returns palette
          *indices* instead of colours for palette PNGs.  16-bit grayscale PNGs
          come back as ``uint16``.  16-bit gray+alpha and RGB(A) PNGs, which
          Pillow only reads as 8 bits, are decoded by torchvision to keep all
          16 bits, after
          pipekit has checked the file's structure (chunk CRCs, zlib stream and
          checksum, image data size, row filters) so that libpng meets no error
          while writing rows.  EXIF orientation applied.
WebP      ``torchvision.io.decode_webp``; animated WebP through Pillow (first
          frame).  EXIF orientation applied (torchvision ignores it for WebP, so
          pipekit reads the tag with Pillow and rotates the tensor).
GIF       Pillow, which decodes the first frame only (torchvision's ``decode_gif``
          decodes every frame of an animation) and keeps a transparent colour as
          an alpha channel: ``RGBA`` when the GIF has one, else ``RGB``.
BMP, TIFF Pillow (first page of a multi-page TIFF); 16-bit grayscale TIFF gives
          ``uint16``.  TIFFs with 32-bit or float samples are refused: decode them
          with :func:`decode_tiff` (rasterio), which keeps any dtype.
AVIF      Pillow, when it was built with libavif (``PIL.features.check("avif")``).
          torchvision 0.29 needs the separate ``torchvision-extra-decoders``
          package for AVIF/HEIC, so it is not used.
others    Whatever else Pillow recognises (PPM, ICO, TGA, JPEG 2000...).  HEIC is
          not supported (neither Pillow nor torchvision 0.29 decode it without
          plug-ins).
========  =====================================================================

The format is recognised from the bytes' signature, never from a file name.

Decompression bombs
-------------------
A few hundred bytes can declare an image of billions of pixels (a JPEG whose header says 60000x60000
decodes to 10.8 GB).  Every image decoder here reads the size the header declares, without decoding,
and refuses an image over the pixel limit with a :class:`~pipekit.errors.DecodeError` naming the
file, the size and the limit, before any pixel buffer is allocated.  The limit is ``max_pixels=``
of each decoder and pipe, else the module setting :data:`MAX_IMAGE_PIXELS`: by default 178,956,970
pixels (about 13,400 x 13,400; 512 MiB as 8-bit RGB), the threshold above which Pillow itself refuses
an image (twice ``PIL.Image.MAX_IMAGE_PIXELS``), so that every format, whichever backend decodes it,
has the same ceiling.  Formats Pillow decodes stay bound by Pillow's own setting too: to go past it,
raise ``PIL.Image.MAX_IMAGE_PIXELS`` as well.
torchvision 0.29 marks its image decoders deprecated (in favour of TorchCodec);
everything backend-specific lives in this module and in :mod:`pipekit._image_backends`
(Pillow, torchvision's PNG and WebP decoders, the pixel conversions).

Other files
-----------
:func:`default_handlers` maps file extensions to decoders for
:class:`pipekit.pipes.Decoder` (functional ``decode``):

* ``.json .jsn`` -> :func:`decode_json`; ``.txt .text .transcript`` -> :func:`decode_text`;
* ``.cls .cls2 .class .count .index .inx .id`` -> :func:`decode_cls` (an ``int`` when the
  text is an integer, like webdataset's and torch's ``basichandlers``);
* ``.npy`` -> :func:`decode_npy`, ``.npz`` -> :func:`decode_npz` (never unpickle);
* ``.pt .pth`` -> :func:`decode_torch` (``torch.load(..., weights_only=True)``);
* ``.tif .tiff`` -> :func:`decode_tiff` (rasterio: any band count and dtype, ``CHW`` tensor);
* ``.jpg .jpeg .png .webp .gif .bmp .avif`` -> :func:`decode_image_bytes`.

Pickle files (``.pyd``, ``.pickle``) have no default handler: unpickling runs
arbitrary code.  Add one explicitly if the data is trusted.
"""

from __future__ import annotations

import functools
import io
import json
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from pipekit._decode_checks import (
    check_npy_header,
    check_npz,
    declared_size,
    jpeg_frame,
    jpeg_size,
    over_limit,
)
from pipekit._image_backends import (
    _UNLIMITED,
    _check_size,
    _clean_reason,
    _convert_channels,
    _decode_jpeg_simplejpeg,
    _decode_png16_color,
    _decode_webp,
    _decode_with_pil,
    _pillow_refused,
    _png_is_16bit_color,
    _simplejpeg_decoder,
    _to_bytes,
)
from pipekit._validate import check_int
from pipekit.errors import DecodeError

__all__ = [
    "IMAGE_EXTENSIONS",
    "MAX_IMAGE_PIXELS",
    "decode_cls",
    "decode_image_bytes",
    "decode_json",
    "decode_npy",
    "decode_npz",
    "decode_text",
    "decode_tiff",
    "decode_torch",
    "default_handlers",
    "image_format",
    "normalize_image_mode",
]

#: Extensions decoded as images by :func:`default_handlers`.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".avif")

#: The most pixels (width x height) an image may declare, for every decoder called without ``max_pixels=``
#: (``None``: no limit).  The default, 178,956,970, is the threshold above which Pillow refuses an image
#: (twice its ``PIL.Image.MAX_IMAGE_PIXELS``): one ceiling for every format.  Read when a decoder is called
#: and when a pipe is built (a pipe keeps the limit it was built with, also in DataLoader workers).
MAX_IMAGE_PIXELS: int | None = 2 * 89_478_485

_BytesLike = bytes | bytearray | memoryview

# Requested channel counts for ``mode``.
_MODES: dict[str, int | None] = {
    "UNCHANGED": None,
    "GRAY": 1,
    "L": 1,
    "GRAY_ALPHA": 2,
    "LA": 2,
    "RGB": 3,
    "RGBA": 4,
    "RGB_ALPHA": 4,
}


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def normalize_image_mode(mode: Any) -> int | None:
    """The channel count that ``mode`` asks for, or ``None`` to keep the image's own.

    Accepts ``None``, the strings ``"RGB"``, ``"RGBA"``, ``"GRAY"``/``"L"``,
    ``"GRAY_ALPHA"``/``"LA"``, ``"UNCHANGED"`` (any case), and members of
    ``torchvision.io.ImageReadMode``.

    Example:
        >>> normalize_image_mode("rgb"), normalize_image_mode("L"), normalize_image_mode(None)
        (3, 1, None)
    """
    if mode is None:
        return None
    if not isinstance(mode, str):
        # torchvision.io.ImageReadMode (an Enum) without importing torchvision here.
        name = getattr(mode, "name", None)
        if type(mode).__name__ != "ImageReadMode" or not isinstance(name, str):
            raise TypeError(f"image mode must be None, a string or a torchvision ImageReadMode, got {mode!r}")
        mode = name
    key = mode.upper()
    if key not in _MODES:
        raise ValueError(
            f"unknown image mode {mode!r}; expected None, 'RGB', 'RGBA', 'GRAY' (or 'L'), "
            "'GRAY_ALPHA' (or 'LA') or 'UNCHANGED'"
        )
    return _MODES[key]


def image_format(data: _BytesLike) -> str | None:
    """Recognise an encoded image from its first bytes.

    Returns ``"jpeg"``, ``"png"``, ``"gif"``, ``"webp"``, ``"bmp"``, ``"tiff"``,
    ``"avif"``, ``"heic"`` or ``None`` when the signature is none of these.

    Example:
        >>> image_format(b"\\x89PNG\\r\\n\\x1a\\n...."), image_format(b"hello")
        ('png', None)
    """
    head = bytes(data[:32])
    if head.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if head[:2] == b"BM":
        return "bmp"
    if head[:4] in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"):
        return "tiff"
    if head[4:8] == b"ftyp":
        brand = head[8:12]
        if brand in (b"avif", b"avis"):
            return "avif"
        if brand in (b"heic", b"heix", b"hevc", b"hevx", b"heim", b"heis", b"mif1", b"msf1"):
            return "heic"
    return None


def _pixel_limit(max_pixels: Any, where: str) -> int:
    """The pixel limit for a ``max_pixels`` argument: itself, or :data:`MAX_IMAGE_PIXELS` when it is ``None``."""
    if max_pixels is None:
        return _UNLIMITED if MAX_IMAGE_PIXELS is None else MAX_IMAGE_PIXELS
    return check_int(max_pixels, "max_pixels", where, minimum=1)


def _jpeg_operator() -> Callable[..., torch.Tensor] | None:
    """torchvision's registered CPU JPEG operator, or ``None`` where its image extension did not load."""
    try:
        return torch.ops.image.decode_jpeg
    except (AttributeError, RuntimeError):
        return None


@functools.cache
def _tv_jpeg() -> tuple[Callable[[torch.Tensor, int, bool], torch.Tensor], dict[int | None, int], int]:
    """A JPEG decoder ``(bytes tensor, mode, apply_exif_orientation) -> CHW tensor``, and its ``mode``
    argument per channel count and by default (looked up once).

    The decoder is torchvision's CPU operator ``torch.ops.image.decode_jpeg``, the call
    ``torchvision.io.decode_jpeg`` ends in for one CPU tensor: its per-call API-usage
    logging, deprecation check, device and mode parsing cost ~20 µs an image, as much
    as the rest of the per-image plumbing (issue 12).  Where that operator is not
    registered, ``torchvision.io.decode_jpeg`` itself (which then explains why).
    """
    from torchvision.io import ImageReadMode, decode_jpeg

    # GRAY: libjpeg's own luma, no chroma upsampling; RGB also converts CMYK and grayscale JPEGs
    modes = {1: ImageReadMode.GRAY.value, 3: ImageReadMode.RGB.value, 4: ImageReadMode.RGB.value}
    def public_call(data: torch.Tensor, mode: int, apply_exif_orientation: bool) -> torch.Tensor:
        return decode_jpeg(data, mode=ImageReadMode(mode), apply_exif_orientation=apply_exif_orientation)

    return _jpeg_operator() or public_call, modes, ImageReadMode.UNCHANGED.value


def decode_image_bytes(
    data: Any,
    *,
    mode: Any = None,
    url: str = "<bytes>",
    stage: str = "decode_image",
    contiguous: bool = False,
    max_pixels: int | None = None,
) -> torch.Tensor:
    """Decode an encoded image into a ``CHW`` tensor.

    Args:
        data: the encoded file: ``bytes``, ``bytearray``, ``memoryview``, or a 1-D
            ``uint8`` numpy array or tensor.
        mode: ``None`` keeps the file's channels (1 gray, 2 gray+alpha, 3 RGB, 4 RGBA);
            ``"RGB"``, ``"RGBA"``, ``"GRAY"``/``"L"`` or ``"GRAY_ALPHA"``/``"LA"`` (any
            case, or a ``torchvision.io.ImageReadMode``) force the channels.  Gray is
            ITU-R 601 luma, alpha is dropped when not asked for and added opaque
            when asked for.
        url: names the image in error messages.
        stage: the pipeline stage named in error messages.
        contiguous: return a contiguous ``(C, H, W)`` tensor.  By default the
            tensor keeps the decoder's memory layout: JPEG and WebP decode to
            interleaved pixels, so the ``(C, H, W)`` tensor is a channels-last view
            of them.  Resizing and stacking take either layout (torchvision's
            resize is faster on the channels-last one), and skipping the copy
            saves ~15% of a JPEG decode.
        max_pixels: the most pixels (width x height) the image may declare; checked on the header,
            before decoding.  Default: :data:`MAX_IMAGE_PIXELS` (178,956,970, Pillow's own threshold).

    Returns:
        A ``uint8`` tensor of shape ``(C, H, W)`` (``uint16`` for 16-bit
        PNG/TIFF), with the EXIF orientation applied.  Animated GIF/WebP give their
        first frame.

    Raises:
        DecodeError: the bytes are empty, corrupt, not an image format that can be
            decoded, or declare more than ``max_pixels`` pixels (action ``"decode image"``,
            the ``url`` and ``stage``).
        TypeError: ``data`` is not a byte buffer.
        ValueError: ``mode`` is not a known mode, ``max_pixels`` not a positive int.

    Example:
        >>> import io
        >>> from PIL import Image
        >>> buf = io.BytesIO()
        >>> Image.new("RGB", (4, 2), (255, 0, 0)).save(buf, "PNG")
        >>> img = decode_image_bytes(buf.getvalue())
        >>> img.shape, img.dtype, img[:, 0, 0].tolist()
        (torch.Size([3, 2, 4]), torch.uint8, [255, 0, 0])
        >>> decode_image_bytes(buf.getvalue(), mode="GRAY").shape
        torch.Size([1, 2, 4])
    """
    limit = _pixel_limit(max_pixels, stage)
    img = _decode_image(_to_bytes(data), normalize_image_mode(mode), url, stage, limit)
    return img.contiguous() if contiguous else img


def _decode_image(raw: bytes, channels: int | None, url: str, stage: str, limit: int) -> torch.Tensor:
    """:func:`decode_image_bytes` once its arguments are checked (``channels`` from :func:`normalize_image_mode`,
    ``limit`` from :func:`_pixel_limit`).

    JPEGs go straight to torchvision's operator: the format, the bytes and the mode are
    known, and a pipeline decodes one per sample (each Python call on the way costs more
    between decodes than in a loop).
    """
    if raw[:3] == b"\xff\xd8\xff":  # JPEG: what image_format calls "jpeg"
        # the SOF header: a few segments read, nothing decoded (with simplejpeg: up to the scan, for its checks)
        frame = jpeg_frame(raw) if _simplejpeg_decoder() is not None else None
        size = frame[:2] if frame is not None else jpeg_size(raw)
        if size is not None and size[0] * size[1] > limit:
            _check_size(size, limit, url, stage)
        if frame is not None and not frame[3]:  # simplejpeg, where it gives torchvision's pixels (no EXIF)
            img = _decode_jpeg_simplejpeg(raw, channels, frame[2])
            if img is not None:
                return img if channels is None or img.shape[0] == channels else _convert_channels(img, channels)
        decode, modes, unchanged = _tv_jpeg()
        try:
            # a private writable copy, as _byte_tensor makes; torchvision reads the orientation from the
            # APP1 segment libjpeg keeps while parsing the header: no measurable cost for JPEGs without one
            # (issue 12), so it is always applied
            img = decode(torch.frombuffer(bytearray(raw), dtype=torch.uint8), modes.get(channels, unchanged), True)
        except Exception as exc:
            raise DecodeError("decode image", url, stage, _clean_reason(exc)) from exc
        return img if channels is None or img.shape[0] == channels else _convert_channels(img, channels)
    if not raw:
        raise DecodeError("decode image", url, stage, "empty file (0 bytes)")
    fmt = image_format(raw)
    if fmt == "heic":
        raise DecodeError(
            "decode image",
            url,
            stage,
            "HEIC images are not supported (install a Pillow HEIF plug-in and decode with a custom handler)",
        )
    size = declared_size(raw, fmt)
    _check_size(size, limit, url, stage)
    try:
        if fmt == "webp":
            img = _decode_webp(raw, limit, url, stage)
        elif fmt == "png" and _png_is_16bit_color(raw):
            img = _decode_png16_color(raw, limit)
        else:
            img = _decode_with_pil(raw, limit, url, stage)
    except DecodeError:
        raise
    except Exception as exc:
        reason = _clean_reason(exc)
        if type(exc).__name__ == "DecompressionBombError":  # Pillow's own limit, below ours
            reason = _pillow_refused(size, limit, reason)
        elif fmt is None and type(exc).__name__ == "UnidentifiedImageError":
            reason = "not a recognised image format (first bytes " + repr(raw[:8]) + ")"
        raise DecodeError("decode image", url, stage, reason) from exc
    if img.ndim == 4:  # defensive: a backend returned all frames
        img = img[0]
    return _convert_channels(img, channels)


# ---------------------------------------------------------------------------
# per-extension decoders
# ---------------------------------------------------------------------------


def decode_text(data: bytes) -> str:
    """UTF-8 text (a leading byte-order mark is dropped).

    Example:
        >>> decode_text("naïve\\n".encode())
        'naïve\\n'
    """
    return bytes(data).decode("utf-8-sig")


def decode_cls(data: bytes) -> int | str:
    """A class label: an ``int`` when the text is an integer, else the stripped text.

    webdataset's and torch's ``basichandlers`` return ``int(data)`` for ``.cls``
    and leave non-integer labels undecoded (raw bytes); pipekit returns them as
    text instead.

    Example:
        >>> decode_cls(b"7\\n"), decode_cls(b"cat")
        (7, 'cat')
    """
    text = decode_text(data).strip()
    try:
        return int(text)
    except ValueError:
        return text


def decode_json(data: bytes) -> Any:
    """A JSON document (UTF-8, optional byte-order mark).

    Example:
        >>> decode_json(b'{"a": [1, 2.5, null]}')
        {'a': [1, 2.5, None]}
    """
    return json.loads(decode_text(data))


def decode_npy(data: bytes) -> np.ndarray:
    """A ``.npy`` array.  Object arrays are refused (``allow_pickle=False``); a header declaring
    more data than the file holds raises :class:`~pipekit.errors.DecodeError` before anything is allocated.

    Example:
        >>> import io, numpy as np
        >>> buf = io.BytesIO(); np.save(buf, np.arange(3, dtype=np.int16))
        >>> decode_npy(buf.getvalue())
        array([0, 1, 2], dtype=int16)
    """
    data = bytes(data)
    check_npy_header(data)
    return np.load(io.BytesIO(data), allow_pickle=False)


def decode_npz(data: bytes, *, max_ratio: int = 250) -> dict[str, np.ndarray]:
    """A ``.npz`` archive as a ``dict`` of arrays (read eagerly, never unpickled).

    Args:
        data: the file's bytes.
        max_ratio: the most the arrays may weigh over the file's size, once they weigh more than
            100 MiB (a 130 KB ``.npz`` of zeros holds 128 MiB); as ``extract_archive``'s default, 250.

    Raises:
        DecodeError: the archive expands past ``max_ratio``, or a member's header declares more data
            than it holds (checked on the headers, before anything is decompressed or allocated).

    Example:
        >>> import io, numpy as np
        >>> buf = io.BytesIO(); np.savez(buf, x=np.zeros(2))
        >>> decode_npz(buf.getvalue())
        {'x': array([0., 0.])}
    """
    data = bytes(data)
    check_npz(data, check_int(max_ratio, "max_ratio", "decode_npz", minimum=1))
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


def decode_torch(data: bytes) -> Any:
    """A ``torch.save`` file, loaded with ``weights_only=True`` onto the CPU.

    ``weights_only`` refuses arbitrary pickled objects (they could run code);
    tensors, containers of tensors and plain Python values load.  Tensors saved
    from a GPU are mapped to the CPU, as data-loading workers should not touch
    the GPU.

    Example:
        >>> import io, torch
        >>> buf = io.BytesIO(); torch.save({"w": torch.ones(2)}, buf)
        >>> decode_torch(buf.getvalue())
        {'w': tensor([1., 1.])}
    """
    return torch.load(io.BytesIO(bytes(data)), weights_only=True, map_location="cpu")


def decode_tiff(data: bytes, *, max_pixels: int | None = None) -> torch.Tensor:
    """A TIFF/GeoTIFF read with rasterio: all bands, ``(bands, H, W)``, dtype kept.

    A tensor rather than a numpy array, like the image decoders.  Any band count
    and any sample type torch has (``uint8``, ``int16``, ``uint16``, ``int32``,
    ``float32``...) come back unchanged; georeferencing is not returned (open the
    file with rasterio for it).

    Args:
        data: the file's bytes.
        max_pixels: the most pixels (width x height) the file may declare, and a quarter of the
            samples (width x height x bands) it may hold, checked on its header before reading
            (a sparse 60000x60000 TIFF is a few hundred KB and 3.6 GB read).  Default:
            :data:`MAX_IMAGE_PIXELS`.

    Raises:
        DecodeError: the file declares more than the limit (stage ``decode_tiff``).

    Example:
        >>> import numpy as np
        >>> from rasterio.io import MemoryFile
        >>> from rasterio.transform import Affine
        >>> arr = np.arange(12, dtype=np.float32).reshape(2, 2, 3)
        >>> profile = dict(driver="GTiff", width=3, height=2, count=2, dtype="float32",
        ...                crs="EPSG:4326", transform=Affine(1, 0, 0, 0, -1, 2))
        >>> with MemoryFile() as mem:
        ...     with mem.open(**profile) as ds:
        ...         ds.write(arr)
        ...     blob = mem.read()
        >>> t = decode_tiff(blob)
        >>> t.shape, t.dtype
        (torch.Size([2, 2, 3]), torch.float32)
    """
    from rasterio.io import MemoryFile

    # rasterio warns (NotGeoreferencedWarning) about plain, non-geo TIFFs; the warning is
    # left alone: silencing it per call (warnings.catch_warnings) is not thread-safe.
    limit = _pixel_limit(max_pixels, "decode_tiff")
    with MemoryFile(bytes(data)) as mem, mem.open() as ds:
        reason = over_limit((ds.width, ds.height), limit, "TIFF")
        if reason is None and ds.width * ds.height * ds.count > 4 * limit:
            reason = (f"the TIFF declares {ds.count} bands of {ds.width}x{ds.height} pixels "
                      f"({ds.width * ds.height * ds.count:,} samples), over 4 x the pixel limit of {limit:,} "
                      "(a decompression bomb?); if the file is trusted, pass a larger max_pixels= to the decoder "
                      "or pipe, or set pipekit.decoders.MAX_IMAGE_PIXELS")
        if reason is not None:
            raise DecodeError("decode", "<bytes>", "decode_tiff", reason)
        arr = ds.read()
    return torch.from_numpy(np.ascontiguousarray(arr))


_TEXT_EXTENSIONS = (".txt", ".text", ".transcript")
_CLS_EXTENSIONS = (".cls", ".cls2", ".class", ".count", ".index", ".inx", ".id")


def default_handlers(image_mode: Any = None, max_pixels: int | None = None) -> dict[str, Callable[[bytes], Any]]:
    """The extension -> decoder table used by :class:`pipekit.pipes.Decoder`.

    Keys are lower-case extensions with their leading dot.  Every handler takes
    the file's bytes and returns the decoded value; they are module-level
    functions (or ``functools.partial`` of them), so pipes holding them pickle.

    Args:
        image_mode: the ``mode`` passed to :func:`decode_image_bytes` for images.
        max_pixels: the pixel limit of the image and TIFF decoders (default: :data:`MAX_IMAGE_PIXELS`
            when they are called).

    Example:
        >>> handlers = default_handlers()
        >>> handlers[".cls"](b"3"), sorted(handlers)[:4]
        (3, ['.avif', '.bmp', '.class', '.cls'])
    """
    normalize_image_mode(image_mode)  # validate early
    limits: dict[str, Any] = {}
    if max_pixels is not None:
        limits["max_pixels"] = _pixel_limit(max_pixels, "default_handlers")
    handlers: dict[str, Callable[[bytes], Any]] = {".json": decode_json, ".jsn": decode_json}
    handlers.update(dict.fromkeys(_TEXT_EXTENSIONS, decode_text))
    handlers.update(dict.fromkeys(_CLS_EXTENSIONS, decode_cls))
    handlers.update({".npy": decode_npy, ".npz": decode_npz, ".pt": decode_torch, ".pth": decode_torch})
    tiff = functools.partial(decode_tiff, **limits) if limits else decode_tiff
    handlers.update({".tif": tiff, ".tiff": tiff})
    if image_mode is not None:
        limits["mode"] = image_mode
    image = functools.partial(decode_image_bytes, **limits) if limits else decode_image_bytes
    handlers.update(dict.fromkeys(IMAGE_EXTENSIONS, image))
    return handlers
