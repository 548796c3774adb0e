"""The ``webdataset`` library's decoding: ``.decode("pil" | "rgb8" | "torchrgb8" | ..., handler=)``.

Image specs follow the library's table: ``"pil"`` (a PIL image), ``"rgb8"``/``"l8"``/``"rgba8"`` (uint8 numpy
``HWC``/``HW``), ``"rgb"``/``"l"``/``"rgba"`` (float32 numpy in 0..1), ``"torchrgb8"``/``"torchl8"``/
``"torchrgba8"`` (uint8 tensors ``CHW``/``HW``), ``"torchrgb"``/``"torch"``/``"torchl"``/``"torchrgba"``
(float32 tensors in 0..1), ``"pilrgb"``/``"pill"``/``"pilrgba"`` (converted PIL images).  Tensor specs decode
with pipekit's decoder (:func:`pipekit.decoders.decode_image_bytes`: libjpeg-turbo through torchvision,
EXIF-oriented, pixel limit checked); the others through Pillow, as the library does.  Fields the image
handler does not take go to the library's basic handlers (``txt``, ``cls``, ``json``, ``npy``, ``pth``...);
``.gz`` fields are decompressed first.
"""

from __future__ import annotations

import gzip
import io
import json
import pickle
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pipekit.decoders import decode_image_bytes, decode_npy, decode_npz, decode_torch
from pipekit.errors import DecodeError
from pipekit.pipes.base import IterDataPipe
from pipekit.webdataset._stages import HandledPipe, Stage, reraise_exception

__all__ = ["Decoder", "ImageHandler", "basichandlers", "decode", "imagehandler"]

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "ppm", "pgm", "pbm", "pnm", "webp", "bmp", "tif", "tiff")

IMAGE_SPECS: dict[str, tuple[str, str | None, str | None]] = {
    "l8": ("numpy", "uint8", "l"),
    "rgb8": ("numpy", "uint8", "rgb"),
    "rgba8": ("numpy", "uint8", "rgba"),
    "l": ("numpy", "float", "l"),
    "rgb": ("numpy", "float", "rgb"),
    "rgba": ("numpy", "float", "rgba"),
    "torchl8": ("torch", "uint8", "l"),
    "torchrgb8": ("torch", "uint8", "rgb"),
    "torchrgba8": ("torch", "uint8", "rgba"),
    "torchl": ("torch", "float", "l"),
    "torchrgb": ("torch", "float", "rgb"),
    "torch": ("torch", "float", "rgb"),
    "torchrgba": ("torch", "float", "rgba"),
    "pill": ("pil", None, "l"),
    "pil": ("pil", None, None),
    "pilrgb": ("pil", None, "rgb"),
    "pilrgba": ("pil", None, "rgba"),
}

_PIL_MODES = {"l": "L", "rgb": "RGB", "rgba": "RGBA"}


class ImageHandler:
    """A handler ``(key, data) -> image or None`` for one of the library's image specs (see the module).

    Example:
        >>> ImageHandler("torchrgb8")("sample.cls", b"3") is None  # not an image extension: left to others
        True
    """

    def __init__(self, imagespec: str, extensions: Sequence[str] = IMAGE_EXTENSIONS) -> None:
        if not isinstance(imagespec, str) or imagespec.lower() not in IMAGE_SPECS:
            raise ValueError(
                f"pipekit.webdataset.decode: unknown image specification {imagespec!r}; expected one of "
                f"{', '.join(IMAGE_SPECS)} (or a function (key, data) -> value)"
            )
        self.imagespec = imagespec.lower()
        self.extensions = tuple(e.lower() for e in extensions)

    def __call__(self, key: str, data: bytes) -> Any:
        extension = re.sub(r".*[.]", "", key).lower()
        if extension not in self.extensions:
            return None
        atype, etype, mode = IMAGE_SPECS[self.imagespec]
        if atype == "torch":
            image = decode_image_bytes(data, mode=_PIL_MODES[mode or "rgb"], url=key, stage="decode", contiguous=True)
            if mode == "l":
                image = image[0]
            return image if etype == "uint8" else image.float().div_(255.0)
        import PIL.Image

        try:
            with PIL.Image.open(io.BytesIO(data)) as opened:
                opened.load()
                image = opened if mode is None else opened.convert(_PIL_MODES[mode])
                if atype == "pil":
                    return image.copy() if image is opened else image
                array = np.asarray(image)
        except (OSError, ValueError, PIL.Image.DecompressionBombError) as exc:
            raise DecodeError("decode image", key, "decode", f"{type(exc).__name__}: {exc}") from exc
        return array if etype == "uint8" else array.astype(np.float32) / 255.0


def imagehandler(imagespec: str, extensions: Sequence[str] = IMAGE_EXTENSIONS) -> ImageHandler:
    """``wds.imagehandler("rgb8")``: an :class:`ImageHandler`."""
    return ImageHandler(imagespec, extensions)


def _text(data: bytes) -> str:
    return data.decode("utf-8")


_BASIC: dict[str, Callable[[bytes], Any]] = {
    **dict.fromkeys(("txt", "text", "transcript"), _text),
    **dict.fromkeys(("cls", "cls2", "class", "count", "index", "inx", "id"), lambda data: int(data)),
    **dict.fromkeys(("json", "jsn"), json.loads),
    **dict.fromkeys(("pyd", "pickle"), pickle.loads),
    "pth": decode_torch,
    "npy": decode_npy,
    "npz": decode_npz,
}


def basichandlers(key: str, data: bytes) -> Any:
    """The library's basic decoders by extension (``txt``, ``cls``, ``json``, ``pyd``, ``pth``, ``npy``...).

    ``pyd``/``pickle`` fields are unpickled, as the library does: read only shards you trust.

    Example:
        >>> basichandlers("x.cls", b"7"), basichandlers("x.json", b'{"a": 1}'), basichandlers("x.bin", b"")
        (7, {'a': 1}, None)
    """
    extension = re.sub(r".*[.]", "", key).lower()
    fn = _BASIC.get(extension)
    return None if fn is None else fn(data)


class Decoder:
    """Decode each field of a sample with the first handler that takes it (the library's ``Decoder``).

    Args:
        handlers: functions ``(key, data) -> value or None`` (``None``: not mine), tried in order, then the
            basic handlers.
        pre, post: handlers tried before / after them (default: none / :func:`basichandlers`).
        only: decode only these fields (a list or a space-separated string); the others are left as bytes.
        partial: leave a field no handler takes as bytes (the library's default too).
    """

    def __init__(self, handlers: Sequence[Callable[[str, bytes], Any]], pre: Sequence[Callable] | None = None,
                 post: Sequence[Callable] | None = None, only: Any = None, partial: bool = False) -> None:
        self.handlers = [*(pre or []), *handlers, *([basichandlers] if post is None else post)]
        self.only = set(only.split()) if isinstance(only, str) else None if only is None else set(only)
        self.partial = partial

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(sample, dict):
            raise TypeError(f"pipekit.webdataset.decode: expected a sample dict, got {type(sample).__name__}")
        out: dict[str, Any] = {}
        for key, value in sample.items():
            if key.startswith("__") or not isinstance(value, bytes | bytearray | memoryview):
                out[key] = value
                continue
            if self.only is not None and key.lstrip(".") not in self.only:
                out[key] = value
                continue
            name, data = key.lstrip("."), bytes(value)
            if name.endswith(".gz") or name == "gz":
                data, name = gzip.decompress(data), name[:-3]
            where = f"{sample.get('__url__', '')}/{sample.get('__key__', '?')}.{name}"
            decoded = None
            for handler in self.handlers:
                try:
                    decoded = handler("." + name, data)
                except DecodeError:
                    raise
                except Exception as exc:
                    raise DecodeError("decode", where, "decode", f"{type(exc).__name__}: {exc}") from exc
                if decoded is not None:
                    break
            out[key] = data if decoded is None else decoded
        return out


class DecodeStage(HandledPipe):
    """``.decode(...)``: a :class:`Decoder` on each sample, errors through ``handler``."""

    stage = "decode"

    def __init__(self, source_datapipe: IterDataPipe, decoder: Decoder, handler: Any = reraise_exception) -> None:
        super().__init__(source_datapipe, handler)
        self.decoder = decoder

    def apply(self, item: Any) -> Any:
        return self.decoder(item)


def decode(*specs: str | Callable, handler: Any = reraise_exception, pre: Any = None, post: Any = None,
           only: Any = None, partial: bool = False) -> Stage:
    """``wds.decode("torchrgb8")``: a stage decoding each sample (strings are image specs, functions handlers)."""
    handlers = [ImageHandler(s) if isinstance(s, str) else s for s in specs]
    for h in handlers:
        if not callable(h):
            raise TypeError(f"pipekit.webdataset.decode: expected image specs or functions (key, data), got {h!r:.80}")
    return Stage(DecodeStage, Decoder(handlers, pre=pre, post=post, only=only, partial=partial), handler=handler)
