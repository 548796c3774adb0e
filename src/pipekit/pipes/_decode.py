"""Decode files into tensors and Python objects: ``decode_image`` and ``decode``.

Both pipes take the ``(url, stream_or_bytes)`` tuples that
``open_files_by_fsspec`` and ``load_from_tar`` yield; ``decode`` also takes
webdataset sample dicts.  Streams are read to the end and closed.  The kernels
live in :mod:`pipekit.decoders`.

Both are 1-to-1 maps (or filters, with ``on_error="skip"``) that hold nothing
between items, so they need no checkpoint state (``stateless = True``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from pipekit.decoders import _decode_image, _pixel_limit, decode_image_bytes, default_handlers, normalize_image_mode
from pipekit.errors import DecodeError, ReadError, SkipLog, StageError, check_on_error
from pipekit.pipes.base import IterDataPipe, StreamWrapper, functional_datapipe

__all__ = ["Decoder", "ImageDecoder"]

_BYTES = (bytes, bytearray, memoryview)


def _split_item(item: Any, stage: str) -> tuple[str, Any]:
    if type(item) is tuple and len(item) == 2:  # the usual (url, stream) pair: no further checks
        url, data = item
        return url if type(url) is str else str(url), data
    if not (isinstance(item, (tuple, list)) and len(item) == 2):
        raise TypeError(f"{stage}: expected (url, stream_or_bytes) tuples, got {type(item).__name__}: {item!r:.80}")
    url, data = item
    return str(url), data


def _read_all(data: Any, url: str, stage: str) -> Any:
    """Read a stream fully and close it; bytes-likes become ``bytes``; anything else is returned."""
    kind = type(data)
    if kind is bytes:
        return data
    if kind is StreamWrapper and data.parent_stream is None:
        # What open_files_by_fsspec yields: read the wrapped file itself (the wrapper's
        # __getattr__ costs a lookup per call), then close through the wrapper, which marks it closed.
        file = data.file_obj
        try:
            out = file.read()
        except Exception as exc:
            raise ReadError("read", url, stage, f"{type(exc).__name__}: {exc}") from exc
        finally:
            data.close()
        if type(out) is bytes:
            return out
        if isinstance(out, str):
            raise TypeError(f"{stage}: the stream of {url!r} is in text mode; open files in binary mode ('rb')")
        return bytes(out)
    if isinstance(data, _BYTES):
        return bytes(data)
    read = getattr(data, "read", None)
    if not callable(read):
        return data
    try:
        out = read()
    except Exception as exc:
        raise ReadError("read", url, stage, f"{type(exc).__name__}: {exc}") from exc
    finally:
        close = getattr(data, "close", None)
        if callable(close):
            close()
    if isinstance(out, str):
        raise TypeError(f"{stage}: the stream of {url!r} is in text mode; open files in binary mode ('rb')")
    return bytes(out)


def _close_streams(values: Any) -> None:
    for value in values:
        close = getattr(value, "close", None)
        if callable(close) and callable(getattr(value, "read", None)):
            close()


@functional_datapipe("decode_image")
class ImageDecoder(IterDataPipe[tuple[str, torch.Tensor]]):
    """Decode ``(url, stream_or_bytes)`` items into ``(url, image)`` with ``image`` a ``CHW`` tensor.

    JPEG, PNG (8 and 16 bit), WebP, GIF (first frame), BMP, TIFF, AVIF and the other
    formats Pillow reads, recognised from the bytes; the EXIF orientation is applied.
    Images come back as contiguous ``uint8`` tensors (``uint16`` for 16-bit PNG and
    TIFF).  See :func:`pipekit.decoders.decode_image_bytes` for the backends.

    Args:
        source_datapipe: yields ``(url, data)`` with ``data`` a binary stream (read to
            the end, then closed), ``bytes``/``bytearray``/``memoryview``, or a 1-D
            ``uint8`` numpy array or tensor.
        mode: ``None`` keeps each file's channels; ``"RGB"``, ``"RGBA"``, ``"GRAY"``
            (``"L"``) or ``"GRAY_ALPHA"`` (``"LA"``), any case, or a
            ``torchvision.io.ImageReadMode``, force them.
        on_error: ``"raise"`` raises :class:`~pipekit.errors.DecodeError` (or
            :class:`~pipekit.errors.ReadError` when a stream fails) naming the url;
            ``"skip"`` logs the item, records it in ``self.skip_log`` and goes on.
        max_pixels: the most pixels (width x height) an image may declare, checked on its header
            before decoding (a decompression bomb raises :class:`~pipekit.errors.DecodeError`, or is
            skipped).  Default: :data:`pipekit.decoders.MAX_IMAGE_PIXELS` (178,956,970) as it is when
            the pipe is built; the pipe keeps it, in DataLoader workers too.

    Example:
        >>> import io
        >>> from PIL import Image
        >>> from pipekit.pipes import IterableWrapper
        >>> buf = io.BytesIO()
        >>> Image.new("RGB", (3, 2), (0, 128, 255)).save(buf, "PNG")
        >>> items = [("a.png", buf.getvalue()), ("broken.jpg", b"\\xff\\xd8\\xff not a jpeg")]
        >>> pipe = IterableWrapper(items).decode_image(mode="RGB", on_error="skip")
        >>> [(url, tuple(img.shape), img[:, 0, 0].tolist()) for url, img in pipe]
        [('a.png', (3, 2, 3), [0, 128, 255])]
        >>> pipe.skip_log.count, pipe.skip_log.skipped[0].url
        (1, 'broken.jpg')
    """

    stateless = True

    def __init__(
        self,
        source_datapipe: IterDataPipe[tuple[str, Any]],
        mode: Any = None,
        on_error: str = "raise",
        max_pixels: int | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(source_datapipe, IterDataPipe):
            raise TypeError(f"decode_image: source_datapipe must be an IterDataPipe, got {type(source_datapipe)}")
        normalize_image_mode(mode)
        self.source_datapipe = source_datapipe
        self.mode = mode
        self.max_pixels = _pixel_limit(max_pixels, "decode_image")
        self.on_error = check_on_error(on_error)
        self.skip_log = SkipLog("decode_image")

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        mode, skip, limit = self.mode, self.on_error != "raise", self.max_pixels
        channels = normalize_image_mode(mode)
        for item in self.source_datapipe:
            if type(item) is tuple and len(item) == 2 and type(item[0]) is str:  # the usual (url, stream)
                url, data = item
            else:
                url, data = _split_item(item, "decode_image")
            try:
                raw = _read_all(data, url, "decode_image")
                if type(raw) is bytes:
                    image = _decode_image(raw, channels, url, "decode_image", limit)
                elif isinstance(raw, str):
                    raise TypeError(f"decode_image: got a str for {url!r}, expected bytes or a binary stream")
                else:
                    image = decode_image_bytes(raw, mode=mode, url=url, stage="decode_image", max_pixels=limit)
            except StageError as exc:
                if not skip:
                    raise
                self.skip_log.record(exc)
                continue
            yield url, image

    def __len__(self) -> int:
        if self.on_error == "skip":
            raise TypeError("decode_image with on_error='skip' has no valid length (items may be skipped)")
        return len(self.source_datapipe)  # type: ignore[arg-type]


Handler = Callable[[bytes], Any]


def _norm_ext(ext: Any) -> str:
    if not isinstance(ext, str) or not ext.strip(".") or ext != ext.strip():
        raise ValueError(f"decode: handler keys must be file extensions like '.png' or 'seg.png', got {ext!r}")
    ext = ext.lower()
    return ext if ext.startswith(".") else "." + ext


def _url_name(url: str) -> str:
    """The last path component of a URL or path, without a query string."""
    path = url
    if "://" in path:
        path = path.split("?", 1)[0].split("#", 1)[0]
    return path.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]


@functional_datapipe("decode")
class Decoder(IterDataPipe[Any]):
    """Decode files by their extension: ``(url, data)`` tuples or webdataset sample dicts.

    The handler is chosen by the longest extension the name ends with, ignoring
    case, so ``x.seg.png`` uses a ``.seg.png`` handler when there is one and the
    ``.png`` handler otherwise.  The defaults (:func:`pipekit.decoders.default_handlers`):
    JSON (``.json``), text (``.txt``), class labels (``.cls``: ``int`` when the text is
    an integer, else the text), numpy (``.npy``, ``.npz``; never unpickled), torch
    (``.pt``, ``.pth`` with ``weights_only=True``), TIFF/GeoTIFF via rasterio
    (``.tif``, ``.tiff``: a ``(bands, H, W)`` tensor, dtype kept) and images
    (``.jpg .jpeg .png .webp .gif .bmp .avif``: ``CHW`` ``uint8``/``uint16`` tensors).
    Pickles have no default handler, as unpickling can run code.

    * ``(url, data)`` tuples give ``(url, decoded)``; the extension comes from the
      url's last path component.
    * Sample dicts like ``{"__key__": "s/0001", ".jpg": stream, ".cls": stream}``
      give a new dict with every value decoded by its key's extension (``".jpg"``
      and ``"jpg"`` both work).  Keys starting with ``__`` (``__key__``,
      ``__url__``) and values that are not bytes or binary streams pass through
      unchanged.

    Streams are read to the end and closed.  Data without a handler comes out as
    raw ``bytes``.

    Args:
        source_datapipe: yields ``(url, stream_or_bytes)`` tuples or sample dicts.
        handlers: ``{extension: fn}`` added to (and overriding) the defaults; ``fn``
            takes the file's ``bytes`` and returns the decoded value.  An extension
            mapped to ``None`` is left as raw bytes.  Keys may omit the leading dot.
            Use module-level functions (not lambdas) so the pipe can be pickled for
            DataLoader workers.
        on_error: ``"raise"`` raises :class:`~pipekit.errors.DecodeError` naming the
            url (for dicts ``<__key__><extension>``) and stage ``decode``; ``"skip"``
            logs it, records it in ``self.skip_log`` and drops the item (the whole
            sample for dicts).
        image_mode: the ``mode`` used for images (``None``, ``"RGB"``, ``"GRAY"``...,
            see :func:`pipekit.decoders.decode_image_bytes`).
        max_pixels: the most pixels an image or TIFF may declare, checked on its header before
            decoding (a decompression bomb raises :class:`~pipekit.errors.DecodeError`, or is skipped).
            Default: :data:`pipekit.decoders.MAX_IMAGE_PIXELS` (178,956,970) as it is when the pipe is
            built; the pipe keeps it, in DataLoader workers too.

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> items = [("d/1.json", b'{"x": [1, 2]}'), ("d/1.CLS", b"3\\n"), ("d/1.bin", b"raw")]
        >>> list(IterableWrapper(items).decode())
        [('d/1.json', {'x': [1, 2]}), ('d/1.CLS', 3), ('d/1.bin', b'raw')]
        >>> samples = [{"__key__": "s/0", ".txt": b"hello", ".seg.txt": b"a b"}]
        >>> list(IterableWrapper(samples).decode(handlers={"seg.txt": bytes.split}))
        [{'__key__': 's/0', '.txt': 'hello', '.seg.txt': [b'a', b'b']}]
    """

    stateless = True

    def __init__(
        self,
        source_datapipe: IterDataPipe[Any],
        handlers: Mapping[str, Handler | None] | None = None,
        on_error: str = "raise",
        image_mode: Any = None,
        max_pixels: int | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(source_datapipe, IterDataPipe):
            raise TypeError(f"decode: source_datapipe must be an IterDataPipe, got {type(source_datapipe)}")
        if handlers is not None and not isinstance(handlers, Mapping):
            raise TypeError(f"decode: handlers must be a dict {{extension: function}}, got {type(handlers)}")
        self.max_pixels = _pixel_limit(max_pixels, "decode")
        table: dict[str, Handler | None] = dict(default_handlers(image_mode, self.max_pixels))
        for ext, fn in (handlers or {}).items():
            if fn is not None and not callable(fn):
                raise TypeError(f"decode: the handler for {ext!r} must be callable or None, got {fn!r}")
            table[_norm_ext(ext)] = fn
        self.source_datapipe = source_datapipe
        self.handlers = table
        self.image_mode = image_mode
        self.on_error = check_on_error(on_error)
        self.skip_log = SkipLog("decode")
        # Longest extension first, so the first match is the longest one.
        self._by_length = sorted(table, key=len, reverse=True)
        # Handlers of sample-dict keys (".jpg", ".cls"...): a few per dataset, looked up once each.
        self._key_handlers: dict[str, Handler | None] = {}

    def find_handler(self, name: str) -> tuple[str | None, Handler | None]:
        """The extension and handler for a file or dict-key ``name`` (``(None, None)`` if none)."""
        lowered = name.lower()
        if not lowered.startswith("."):
            lowered = "." + lowered
        for ext in self._by_length:
            if lowered.endswith(ext):
                return ext, self.handlers[ext]
        return None, None

    def _key_handler(self, key: str) -> Handler | None:
        """``find_handler(key)``'s handler for a sample-dict key, remembered (up to 256 keys)."""
        try:
            return self._key_handlers[key]
        except KeyError:
            fn = self.find_handler(key)[1]
            if len(self._key_handlers) < 256:
                self._key_handlers[key] = fn
            return fn

    def _decode_one(self, name: str, data: Any, where: str, key: str | None = None) -> Any:
        raw = _read_all(data, where, "decode")
        if not isinstance(raw, bytes):
            return raw  # already decoded (or not file data): pass through
        fn = self.find_handler(name)[1] if key is None else self._key_handler(key)
        if fn is None:
            return raw
        try:
            return fn(raw)
        except Exception as exc:
            reason = exc.reason if isinstance(exc, StageError) else f"{type(exc).__name__}: {exc}"
            raise DecodeError("decode", where, "decode", reason) from exc

    def _decode_sample(self, sample: Mapping[str, Any]) -> dict[str, Any]:
        base = str(sample.get("__key__", "<sample without __key__>"))
        out: dict[str, Any] = {}
        items = list(sample.items())
        for i, (key, value) in enumerate(items):
            if not isinstance(key, str) or key.startswith("__"):
                out[key] = value
                continue
            suffix = key if key.startswith(".") else "." + key
            try:
                out[key] = self._decode_one(key, value, base + suffix, key)
            except BaseException:
                _close_streams(v for _, v in items[i + 1 :])
                raise
        return out

    def __iter__(self) -> Iterator[Any]:
        for item in self.source_datapipe:
            try:
                if isinstance(item, Mapping):
                    yield_item: Any = self._decode_sample(item)
                else:
                    url, data = _split_item(item, "decode")
                    yield_item = (url, self._decode_one(_url_name(url), data, url))
            except StageError as exc:
                if self.on_error == "raise":
                    raise
                self.skip_log.record(exc)
                continue
            yield yield_item

    def __len__(self) -> int:
        if self.on_error == "skip":
            raise TypeError("decode with on_error='skip' has no valid length (items may be skipped)")
        return len(self.source_datapipe)  # type: ignore[arg-type]
