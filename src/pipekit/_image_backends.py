"""The image decoders' backend pieces, behind :mod:`pipekit.decoders` (which says which backend reads which format).

Pillow (open, EXIF orientation, PIL modes to ``CHW`` tensors), torchvision's PNG decoder for 16-bit colour and
WebP, ``simplejpeg`` for the JPEGs it decodes to the same pixels as torchvision (when it is installed), and the
pixel conversions every backend's output goes through (channel counts, EXIF orientation of a
tensor); the checks that an image's declared size is within the pixel limit, and the error reasons they give.
"""

from __future__ import annotations

import functools
import io
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from pipekit import _fast
from pipekit._decode_checks import check_png_structure, over_limit
from pipekit.errors import DecodeError

#: No pixel limit (what ``max_pixels`` resolves to when :data:`pipekit.decoders.MAX_IMAGE_PIXELS` is ``None``).
_UNLIMITED = 1 << 62

_EXIF_ORIENTATION = 0x0112


def _to_bytes(data: Any) -> bytes:
    """Accept bytes-like objects and 1-D uint8 numpy arrays / CPU tensors."""
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    if isinstance(data, np.ndarray):
        if data.dtype != np.uint8:
            raise TypeError(f"expected a uint8 buffer, got a numpy array of {data.dtype}")
        return data.tobytes()
    if isinstance(data, torch.Tensor):
        if data.dtype != torch.uint8:
            raise TypeError(f"expected a uint8 buffer, got a tensor of {data.dtype}")
        return data.detach().cpu().contiguous().numpy().tobytes()
    raise TypeError(
        "expected encoded image bytes (bytes, bytearray, memoryview, or a uint8 numpy array or tensor), "
        f"got {type(data).__name__}"
    )


def _check_size(size: tuple[int, int] | None, limit: int, url: str, stage: str) -> None:
    reason = over_limit(size, limit)
    if reason is not None:
        raise DecodeError("decode image", url, stage, reason)


def _byte_tensor(data: bytes) -> torch.Tensor:
    # A private writable copy: torch.frombuffer on read-only bytes warns, and the
    # decoders must never see a buffer someone else may change.
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


_TV_PREFIX = re.compile(r"^\w+, [^,\s]+:\d+, ")


def _clean_reason(exc: BaseException) -> str:
    """A short reason for an exception (drops torchvision's C++ source location)."""
    text = str(exc).strip() or type(exc).__name__
    first = text.splitlines()[0]
    return _TV_PREFIX.sub("", first)


def _gray(rgb: torch.Tensor) -> torch.Tensor:
    # ITU-R 601-2 luma with Pillow's fixed-point weights, so that mode="GRAY"
    # agrees with PIL's convert("L") for 8-bit images.
    wide = rgb.to(torch.int64)
    y = (wide[0] * 19595 + wide[1] * 38470 + wide[2] * 7471 + 32768) >> 16
    return y.unsqueeze(0).to(rgb.dtype)


def _convert_channels(img: torch.Tensor, channels: int | None) -> torch.Tensor:
    """Convert a CHW image with 1 (L), 2 (LA), 3 (RGB) or 4 (RGBA) channels."""
    have = img.shape[0]
    if channels is None or have == channels:
        return img
    if have not in (1, 2, 3, 4):
        raise ValueError(f"cannot convert an image with {have} channels")
    opaque = torch.full_like(img[:1], torch.iinfo(img.dtype).max)
    color = img[:3] if have >= 3 else img[:1].expand(3, -1, -1)
    alpha = img[have - 1 :] if have in (2, 4) else opaque
    if channels == 1:
        return img[:1] if have == 2 else _gray(color)
    if channels == 2:
        return torch.cat([img[:1] if have <= 2 else _gray(color), alpha])
    if channels == 3:
        return color
    return torch.cat([color, alpha])


def _apply_orientation(img: torch.Tensor, orientation: int) -> torch.Tensor:
    """Rotate/flip a CHW tensor as EXIF orientation ``orientation`` (1-8) asks."""
    if orientation == 2:
        return img.flip(-1)
    if orientation == 3:
        return img.flip(-2, -1)
    if orientation == 4:
        return img.flip(-2)
    if orientation == 5:
        return img.transpose(-2, -1)
    if orientation == 6:
        return img.transpose(-2, -1).flip(-1)
    if orientation == 7:
        return img.transpose(-2, -1).flip(-2, -1)
    if orientation == 8:
        return img.transpose(-2, -1).flip(-2)
    return img


def _pil_open(data: bytes) -> Any:
    from PIL import Image

    return Image.open(io.BytesIO(data))


def _exif_orientation(data: bytes) -> int:
    """The EXIF orientation tag of an image Pillow can open (1 when absent)."""
    try:
        with _pil_open(data) as im:
            value = im.getexif().get(_EXIF_ORIENTATION, 1)
    except Exception:  # a broken EXIF block never makes a readable image fail
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


_PIL_TO_RGB = {"CMYK", "YCbCr", "LAB", "HSV", "RGBX"}


def _pil_to_tensor(im: Any) -> torch.Tensor:
    """A loaded PIL image as a CHW uint8/uint16 tensor (L, LA, RGB or RGBA)."""
    mode = im.mode
    if mode.startswith("I;16"):
        arr = np.asarray(im).astype(np.uint16)  # native byte order, writable copy
    else:
        if mode == "1":
            im = im.convert("L")
        elif mode in ("P", "PA"):
            im = im.convert("RGBA" if mode == "PA" or "transparency" in im.info else "RGB")
        elif mode in _PIL_TO_RGB:
            im = im.convert("RGB")
        elif mode == "RGBa":
            im = im.convert("RGBA")
        elif mode == "La":
            im = im.convert("LA")
        elif mode not in ("L", "LA", "RGB", "RGBA"):
            raise ValueError(
                f"pixels of PIL mode {mode!r} (32-bit integer or floating point) cannot be returned as "
                "uint8/uint16; decode such TIFFs with pipekit.decoders.decode_tiff, which keeps the dtype"
            )
        arr = np.array(im)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    return torch.from_numpy(arr).permute(2, 0, 1)


def _decode_with_pil(data: bytes, limit: int = _UNLIMITED, url: str = "<bytes>", stage: str = "") -> torch.Tensor:
    from PIL import ImageOps

    with _pil_open(data) as im:
        _check_size(im.size, limit, url, stage)  # the header only: nothing decoded yet
        im.seek(0)
        im.load()
        oriented = ImageOps.exif_transpose(im)
        return _pil_to_tensor(oriented)


def _png_is_16bit_color(data: bytes) -> bool:
    # IHDR is the first chunk: bit depth at byte 24, colour type at byte 25.
    return len(data) > 25 and data[12:16] == b"IHDR" and data[24] == 16 and data[25] in (2, 4, 6)


def _decode_png16_color(data: bytes, limit: int = _UNLIMITED) -> torch.Tensor:
    from torchvision.io import decode_png

    check_png_structure(data, limit)
    return decode_png(_byte_tensor(data), apply_exif_orientation=True)


def _decode_webp(data: bytes, limit: int = _UNLIMITED, url: str = "<bytes>", stage: str = "") -> torch.Tensor:
    from torchvision.io import decode_webp

    try:
        img = decode_webp(_byte_tensor(data))
    except RuntimeError as exc:
        if "nimated" in str(exc):  # animated WebP: torchvision refuses, Pillow reads frame 0
            return _decode_with_pil(data, limit, url, stage)
        raise
    return _apply_orientation(img, _exif_orientation(data))


def _pillow_refused(size: tuple[int, int] | None, limit: int, reason: str) -> str:
    """The reason for Pillow's ``DecompressionBombError``: pipekit's limit's message, or Pillow's own setting."""
    from PIL import Image

    pillow = Image.MAX_IMAGE_PIXELS
    if pillow is not None and limit > 2 * pillow:
        shown = f"{size[0]}x{size[1]} pixels" if size is not None else "its size"
        return (f"Pillow refuses {shown} (over twice PIL.Image.MAX_IMAGE_PIXELS, {pillow:,}), although it is within "
                f"max_pixels={limit:,}; raise PIL.Image.MAX_IMAGE_PIXELS as well to decode it ({reason})")
    return over_limit(size, limit) or reason


def _simplejpeg_decoder() -> Callable[..., np.ndarray] | None:
    """``simplejpeg.decode_jpeg`` where the optional ``simplejpeg`` package is installed, else ``None``.

    Also ``None`` while the fast path ``"simplejpeg"`` is off (``pipekit._fast``: torchvision's decoder is its
    reference; ``benchmarks/shards.py --decode-ab`` switches it between epochs).
    """
    if not _fast.state.get("simplejpeg", True):
        return None
    return _simplejpeg_module()


@functools.cache
def _simplejpeg_module() -> Callable[..., np.ndarray] | None:
    try:
        from simplejpeg import decode_jpeg
    except ImportError:  # not installed (it is optional): torchvision's decoder
        return None
    return decode_jpeg


def _decode_jpeg_simplejpeg(data: bytes, channels: int | None, components: int) -> torch.Tensor | None:
    """A JPEG decoded by ``simplejpeg`` as torchvision's ``decode_jpeg`` would, or ``None`` to leave it to torchvision.

    Both are libjpeg-turbo with its default (accurate) DCT and fancy upsampling, so a file both decode gives the
    same pixels; ``simplejpeg``'s build is ~10% faster on a 320x256 photo (issue 34).  The caller has checked the
    pixel limit and that the file holds no EXIF segment (torchvision applies its orientation; this does not).
    Taken for gray or YCbCr/RGB files (``components`` 1 or 3), decoded to gray or RGB as torchvision's mode for
    ``channels`` would (the caller converts to 2 or 4 channels as after torchvision); CMYK files, and any file
    ``simplejpeg`` reports a problem with (its strict mode refuses even what libjpeg only warns about), go to
    torchvision, which decodes or names the error as before.
    The tensor is a ``CHW`` view of interleaved pixels, as torchvision's.
    """
    decode = _simplejpeg_decoder()
    if decode is None or components not in (1, 3):
        return None
    # torchvision's modes: GRAY for 1 channel, RGB for 3 and 4, the file's own (UNCHANGED) for 2 and None
    if channels == 1 or (channels not in (3, 4) and components == 1):
        space = "GRAY"
    else:
        space = "RGB"
    try:
        pixels = decode(data, space, strict=True)
    except Exception:  # torchvision decodes it again, and reports the file if it is broken
        return None
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    return torch.from_numpy(pixels).permute(2, 0, 1)
