"""Pure encoding kernels: tensors and Python objects in, bytes out (the reverse of :mod:`pipekit.decoders`).

:class:`pipekit.pipes.ShardWriter` and :class:`pipekit.pipes.TarWriter` use
them to turn a sample dict into the members of a WebDataset tar shard; they are
also usable on their own.  The encoder of a field is chosen by its extension,
as the ``webdataset`` library's writer does, and pipekit's decoder
(:class:`pipekit.pipes.Decoder`, functional ``decode``) reads back what they
write:

=======================================  ==========================================================
extension                                encoding (value -> bytes)
=======================================  ==========================================================
``.cls .cls2 .class .count .index``      ``str(value)`` in ASCII (``3`` -> ``b"3"``); a 0-d tensor or
``.inx .id``                             numpy scalar is written as its number
``.txt .text .transcript .html .htm``    UTF-8 (a ``str``)
``.json .jsn``                           ``json.dumps``; numpy scalars and arrays and tensors become
                                         numbers and lists
``.npy``                                 ``numpy.save`` format (arrays, numpy scalars, tensors); no
                                         object arrays (the decoder never unpickles)
``.npz``                                 ``numpy.savez_compressed`` of a dict of arrays
``.pth .pt``                             ``torch.save``
``.pyd .pickle``                         ``pickle.dumps`` (the default decoder does not unpickle:
                                         add a handler for trusted data)
``.jpg .jpeg .img .image``               JPEG, quality 100
``.png``                                 PNG (8-bit, or 16-bit grayscale from ``uint16``)
``.webp``                                WebP, lossless (8-bit: 16-bit images are refused)
``.bmp``                                 BMP (no alpha: RGBA images are refused)
``.ppm .pgm .pbm``                       Netpbm (the variant follows the image: P6 RGB, P5 gray,
                                         P4 bilevel; no alpha: RGBA images are refused)
``.tif .tiff``                           tensors: GeoTIFF with rasterio, every band and dtype kept
                                         (what :func:`pipekit.decoders.decode_tiff` reads back);
                                         numpy arrays and PIL images: TIFF with Pillow
=======================================  ==========================================================

Whatever the extension, ``bytes`` (and ``bytearray``, ``memoryview``) are
written as they are, a ``str`` as UTF-8, and a binary stream (anything with
``read()``, such as the members :class:`pipekit.pipes.WebDataset` yields) is
read to the end and closed; a ``.gz`` suffix (``"npy.gz"``) gzips the encoded
bytes.  The encoder is looked up by the longest extension the field name ends
with (``"seg.png"`` uses a ``"seg.png"`` encoder when there is one, else
``"png"``'s).

Images (the image extensions, and ``.tif`` for arrays and PIL images) may be

* a PIL image, saved as it is;
* a numpy array, ``HW`` or ``HWC`` (1 to 4 channels), as ``webdataset`` and
  Pillow take them;
* a tensor, ``HW`` or ``CHW`` (1 to 4 channels), as torchvision and pipekit's
  decoders give them;

of ``uint8`` (or ``uint16`` for one-channel PNGs), or floating point in
``[0, 1]``, which is scaled by 255 and truncated to ``uint8`` (values outside
``[-0.001, 1.001]``, and NaN, are refused), as ``webdataset`` does.

Where pipekit differs from ``webdataset`` 1.0 on purpose: a 0-d tensor in a
``.cls`` field gives ``b"3"`` (``webdataset`` writes ``b"tensor(3)"``); ``.pgm``
and ``.pbm`` work (``webdataset`` asks Pillow for formats it does not have);
JSON takes numpy values and tensors; ``.npy`` takes tensors and refuses object
arrays; ``.pt``, ``.webp``, ``.bmp`` and four-channel images are added; gzip
headers carry no time stamp, so the same sample gives the same bytes.
``webdataset``'s ``.ten``, ``.mp``/``.msgpack`` and ``.cbor`` have no encoder
here (pipekit reads none of them back); give one in ``encoders`` if you need it.
"""

from __future__ import annotations

import functools
import gzip
import io
import json
import pickle
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from pipekit.errors import EncodeError

__all__ = [
    "EncodeError",
    "IMAGE_ENCODER_EXTENSIONS",
    "default_encoders",
    "encode_cls",
    "encode_image",
    "encode_json",
    "encode_npy",
    "encode_npz",
    "encode_pickle",
    "encode_sample",
    "encode_text",
    "encode_tiff",
    "encode_torch",
    "encode_value",
    "encoder_table",
    "field_name",
    "find_encoder",
]

Encoder = Callable[[Any], bytes]

_BYTES = (bytes, bytearray, memoryview)


# ---------------------------------------------------------------------------
# simple values
# ---------------------------------------------------------------------------


def _item(value: Any) -> Any:
    """A 0-d tensor or numpy scalar as the Python number it holds; anything else unchanged."""
    if isinstance(value, torch.Tensor) and value.ndim == 0:
        return value.item()
    if isinstance(value, np.generic) or (isinstance(value, np.ndarray) and value.ndim == 0):
        return value.item()
    return value


def encode_cls(value: Any) -> bytes:
    """A class label (or any short value) as ASCII text: ``str(value)``.

    Example:
        >>> import torch
        >>> encode_cls(3), encode_cls(torch.tensor(7)), encode_cls("cat")
        (b'3', b'7', b'cat')
    """
    value = _item(value)
    if isinstance(value, torch.Tensor | np.ndarray):
        raise TypeError(f"a class label must be a number or a str, got an array of shape {tuple(value.shape)}")
    text = str(value)
    try:
        return text.encode("ascii")
    except UnicodeEncodeError:
        raise ValueError(f"a class label is written as ASCII text, got {text!r}") from None


def encode_text(value: Any) -> bytes:
    """A ``str`` as UTF-8.

    Example:
        >>> encode_text("naïve")
        b'na\\xc3\\xafve'
    """
    if not isinstance(value, str):
        raise TypeError(f"text must be a str, got {type(value).__name__}")
    return value.encode("utf-8")


def _json_default(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().tolist()
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def encode_json(value: Any) -> bytes:
    """``json.dumps(value)`` in UTF-8; numpy values and tensors become numbers and lists.

    Example:
        >>> import numpy as np
        >>> encode_json({"box": np.array([1, 2]), "score": np.float32(0.5)})
        b'{"box": [1, 2], "score": 0.5}'
    """
    return json.dumps(value, default=_json_default).encode("utf-8")


def _as_numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, np.generic):
        return np.asarray(value)
    raise TypeError(f"expected a numpy array or a tensor, got {type(value).__name__}")


def encode_npy(value: Any) -> bytes:
    """An array (numpy array or scalar, or tensor) in ``.npy`` format, as ``numpy.save`` writes it.

    Object arrays are refused: reading them back would need unpickling, which
    :func:`pipekit.decoders.decode_npy` never does.

    Example:
        >>> import torch
        >>> from pipekit.decoders import decode_npy
        >>> decode_npy(encode_npy(torch.arange(3, dtype=torch.int16)))
        array([0, 1, 2], dtype=int16)
    """
    array = _as_numpy(value)
    if array.dtype.hasobject:
        raise TypeError("object arrays cannot be written as .npy (they would need pickling); use .pyd or .pth")
    stream = io.BytesIO()
    np.lib.format.write_array(stream, array, allow_pickle=False)
    return stream.getvalue()


def encode_npz(value: Any) -> bytes:
    """A dict of arrays (or tensors) as a compressed ``.npz`` archive (``numpy.savez_compressed``).

    Example:
        >>> import numpy as np
        >>> from pipekit.decoders import decode_npz
        >>> decode_npz(encode_npz({"x": np.zeros(2)}))
        {'x': array([0., 0.])}
    """
    if not isinstance(value, Mapping):
        raise TypeError(f".npz holds a dict of arrays, got {type(value).__name__}")
    arrays = {}
    for name, array in value.items():
        if not isinstance(name, str):
            raise TypeError(f"the names of the arrays of an .npz must be str, got {name!r}")
        arrays[name] = _as_numpy(array)
        if arrays[name].dtype.hasobject:
            raise TypeError(f"array {name!r} is an object array, which .npz cannot hold without pickling")
    stream = io.BytesIO()
    np.savez_compressed(stream, **arrays)
    return stream.getvalue()


def encode_torch(value: Any) -> bytes:
    """``torch.save(value)``: tensors, containers of tensors, plain Python values.

    Example:
        >>> import torch
        >>> from pipekit.decoders import decode_torch
        >>> decode_torch(encode_torch({"w": torch.ones(2)}))
        {'w': tensor([1., 1.])}
    """
    stream = io.BytesIO()
    torch.save(value, stream)
    return stream.getvalue()


def encode_pickle(value: Any) -> bytes:
    """``pickle.dumps(value)`` (read it back only from trusted sources: unpickling runs code).

    Example:
        >>> import pickle
        >>> pickle.loads(encode_pickle({"a": (1, 2)}))
        {'a': (1, 2)}
    """
    return pickle.dumps(value)


# ---------------------------------------------------------------------------
# images
# ---------------------------------------------------------------------------

_PIL_FORMATS = {
    "jpg": "JPEG", "jpeg": "JPEG", "png": "PNG", "webp": "WEBP", "bmp": "BMP",
    "ppm": "PPM", "pgm": "PPM", "pbm": "PPM", "tif": "TIFF", "tiff": "TIFF",
}
_SAVE_OPTIONS: dict[str, dict[str, Any]] = {
    "JPEG": {"quality": 100}, "TIFF": {"quality": 100}, "WEBP": {"lossless": True},
}


def _image_array(image: Any) -> np.ndarray:
    """A numpy ``HW``/``HWC`` ``uint8``/``uint16``/bool array Pillow can take, from an array or a tensor."""
    if isinstance(image, torch.Tensor):
        tensor = image.detach().cpu()
        if tensor.ndim == 3:
            if not 1 <= tensor.shape[0] <= 4:
                raise ValueError(f"an image tensor must be HW or CHW with 1 to 4 channels, got shape "
                                 f"{tuple(tensor.shape)}")
            tensor = tensor.permute(1, 2, 0)
        array = tensor.numpy()
    elif isinstance(image, np.ndarray):
        array = image
        if array.ndim == 3 and not 1 <= array.shape[2] <= 4:
            raise ValueError(f"an image array must be HW or HWC with 1 to 4 channels (numpy arrays are "
                             f"channels-last, tensors channels-first), got shape {array.shape}")
    else:
        raise TypeError(f"expected a PIL image, a numpy array or a tensor, got {type(image).__name__}")
    if array.ndim not in (2, 3):
        raise ValueError(f"an image must have 2 or 3 dimensions, got shape {tuple(array.shape)}")
    if np.issubdtype(array.dtype, np.floating):
        if np.isnan(array).any():  # NaN passes every range check and casts to 0: refuse it
            raise ValueError(f"floating-point image values must lie in [0, 1], got {int(np.isnan(array).sum())} "
                             "NaN pixel(s)")
        low, high = float(np.amin(array)), float(np.amax(array))
        if low <= -0.001 or high >= 1.001:
            raise ValueError(f"floating-point image values must lie in [0, 1], got [{low:g}, {high:g}]")
        array = np.array(np.clip(array, 0.0, 1.0) * 255.0, dtype=np.uint8)  # truncates, as webdataset
    elif array.dtype not in (np.uint8, np.uint16, np.bool_):
        raise TypeError(f"image pixels must be uint8, uint16 or floating point in [0, 1], got {array.dtype}")
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    if array.dtype == np.uint16 and array.ndim == 3:
        raise ValueError("uint16 images must have one channel (Pillow writes 16-bit grayscale only)")
    return np.ascontiguousarray(array)


# Pillow modes a format cannot store: Pillow writes them anyway, losing part of the image
_LOSSY_MODES = {
    "WEBP": {"I;16": "16-bit values (saturated to 255)", "I": "32-bit values", "F": "floating-point values"},
    "BMP": {"RGBA": "the alpha channel", "LA": "the alpha channel"},
    "PPM": {"RGBA": "the alpha channel", "LA": "the alpha channel"},
}


def encode_image(image: Any, format: str = "png") -> bytes:
    """An image encoded as ``format`` (``"jpg"``, ``"png"``, ``"webp"``, ``"bmp"``, ``"ppm"``, ``"tiff"``...).

    Args:
        image: a PIL image, a numpy ``HW``/``HWC`` array or a ``HW``/``CHW``
            tensor of ``uint8`` (``uint16`` for one channel) or floats in ``[0, 1]``.
        format: the file format, by extension or Pillow name (any case).  JPEG
            is written at quality 100 and WebP losslessly.

    Example:
        >>> import torch
        >>> from pipekit.decoders import decode_image_bytes
        >>> img = torch.arange(24, dtype=torch.uint8).reshape(3, 2, 4)
        >>> torch.equal(decode_image_bytes(encode_image(img, "png")), img)
        True
    """
    from PIL import Image

    name = _PIL_FORMATS.get(format.lower(), format.upper())
    if not isinstance(image, Image.Image):
        image = Image.fromarray(_image_array(image))
    lost = _LOSSY_MODES.get(name, {}).get(image.mode)
    if lost is not None:
        raise ValueError(f"{name} would lose {lost} of this {image.mode} image (Pillow writes it anyway); use png, "
                         "which keeps them")
    with io.BytesIO() as out:
        image.save(out, format=name, **_SAVE_OPTIONS.get(name, {}))
        return out.getvalue()


def encode_tiff(image: Any) -> bytes:
    """A TIFF: tensors through rasterio (any band count and dtype), arrays and PIL images through Pillow.

    A ``HW`` or ``CHW`` tensor becomes a GeoTIFF without georeferencing, one band
    per channel, its dtype kept, which :func:`pipekit.decoders.decode_tiff`
    reads back unchanged.  Numpy arrays and PIL images are written as
    :func:`encode_image` does (``HWC``, as ``webdataset`` writes them).

    Example:
        >>> import torch
        >>> from pipekit.decoders import decode_tiff
        >>> bands = torch.rand(5, 4, 3)
        >>> torch.equal(decode_tiff(encode_tiff(bands)), bands)
        True
    """
    if not isinstance(image, torch.Tensor):
        return encode_image(image, "tiff")
    array = image.detach().cpu().numpy()
    if array.ndim == 2:
        array = array[None]
    if array.ndim != 3:
        raise ValueError(f"a TIFF tensor must be HW or CHW, got shape {tuple(image.shape)}")
    from rasterio.io import MemoryFile

    count, height, width = array.shape
    profile = {"driver": "GTiff", "width": width, "height": height, "count": count, "dtype": array.dtype.name}
    # rasterio warns (NotGeoreferencedWarning) that the file has no georeferencing; as in
    # pipekit.decoders.decode_tiff the warning is left alone (catch_warnings is not thread-safe).
    with MemoryFile() as memory:
        with memory.open(**profile) as dataset:
            dataset.write(array)
        return bytes(memory.read())


#: Extensions :func:`default_encoders` encodes as images.
IMAGE_ENCODER_EXTENSIONS = (".jpg", ".jpeg", ".img", ".image", ".png", ".webp", ".bmp", ".ppm", ".pgm", ".pbm")

_CLS_EXTENSIONS = (".cls", ".cls2", ".class", ".count", ".index", ".inx", ".id")
_TEXT_EXTENSIONS = (".txt", ".text", ".transcript", ".html", ".htm")


def default_encoders() -> dict[str, Encoder]:
    """The extension -> encoder table :class:`pipekit.pipes.ShardWriter` uses by default.

    Keys are lower-case extensions with their leading dot; every encoder takes
    a value and returns ``bytes``.  They are module-level functions (or
    ``functools.partial`` of them), so pipes holding them pickle.

    Example:
        >>> table = default_encoders()
        >>> table[".cls"](3), table[".json"]({"a": 1})
        (b'3', b'{"a": 1}')
    """
    table: dict[str, Encoder] = dict.fromkeys(_CLS_EXTENSIONS, encode_cls)
    table.update(dict.fromkeys(_TEXT_EXTENSIONS, encode_text))
    table.update({".json": encode_json, ".jsn": encode_json, ".npy": encode_npy, ".npz": encode_npz})
    table.update({".pth": encode_torch, ".pt": encode_torch, ".pyd": encode_pickle, ".pickle": encode_pickle})
    for ext in IMAGE_ENCODER_EXTENSIONS:
        fmt = "jpg" if ext in (".img", ".image") else ext[1:]
        table[ext] = functools.partial(encode_image, format=fmt)
    table.update({".tif": encode_tiff, ".tiff": encode_tiff})
    return table


# ---------------------------------------------------------------------------
# fields and samples
# ---------------------------------------------------------------------------


def _norm_ext(ext: Any) -> str:
    if not isinstance(ext, str) or not ext.strip(".") or ext != ext.strip():
        raise ValueError(f"encoder keys must be file extensions like '.png' or 'seg.png', got {ext!r}")
    ext = ext.lower()
    return ext if ext.startswith(".") else "." + ext


def encoder_table(extra: Mapping[str, Encoder | None] | None = None) -> dict[str, Encoder | None]:
    """:func:`default_encoders` with ``extra`` added (and overriding); keys may omit their leading dot.

    An extension mapped to ``None`` takes only bytes, str and streams.

    Example:
        >>> table = encoder_table({"PNG": None, "seg.png": bytes})
        >>> table[".png"] is None, table[".seg.png"] is bytes
        (True, True)
    """
    table: dict[str, Encoder | None] = dict(default_encoders())
    if extra is None:
        return table
    if not isinstance(extra, Mapping):
        raise TypeError(f"encoders must be a dict {{extension: function}}, got {type(extra).__name__}")
    for ext, fn in extra.items():
        if fn is not None and not callable(fn):
            raise TypeError(f"the encoder for {ext!r} must be callable or None, got {fn!r}")
        table[_norm_ext(ext)] = fn
    return table


def find_encoder(name: str, encoders: Mapping[str, Encoder | None]) -> Encoder | None:
    """The encoder of the longest extension ``name`` ends with (``None`` when none matches).

    ``encoders`` maps lower-case extensions with their leading dot (as
    :func:`default_encoders` does) to encoders.

    Example:
        >>> table = {".png": "png", ".seg.png": "seg"}
        >>> find_encoder("x.seg.png", table), find_encoder("PNG", table), find_encoder("dat", table)
        ('seg', 'png', None)
    """
    lowered = name.lower()
    if not lowered.startswith("."):
        lowered = "." + lowered
    best: str | None = None
    for ext in encoders:
        if lowered.endswith(ext) and (best is None or len(ext) > len(best)):
            best = ext
    return None if best is None else encoders[best]


def _read_stream(value: Any) -> Any:
    read = getattr(value, "read", None)
    if isinstance(value, (*_BYTES, str)) or not callable(read):
        return value
    try:
        data = read()
    finally:
        close = getattr(value, "close", None)
        if callable(close):
            close()
    if isinstance(data, str):
        raise TypeError("the stream is in text mode; open files in binary mode ('rb')")
    return data


def encode_value(value: Any, extension: str, encoders: Mapping[str, Encoder | None] | None = None) -> bytes:
    """Encode ``value`` as the content of a file with ``extension`` (``"jpg"``, ``".seg.png"``, ``"npy.gz"``).

    ``bytes`` pass unchanged, a ``str`` is UTF-8 encoded and a binary stream is
    read (and closed), whatever the extension; anything else goes to the
    encoder of the extension (see :func:`find_encoder`).  A trailing ``.gz``
    gzips the result.

    Args:
        value: what to encode.
        extension: the field name, with or without its leading dot.
        encoders: the extension -> encoder table (default :func:`default_encoders`);
            an extension mapped to ``None`` takes only bytes, str and streams.

    Raises:
        ValueError: no encoder for the extension, or one refused the value.
        TypeError: the value has the wrong type for its extension.

    Example:
        >>> encode_value(5, "cls"), encode_value("hi", ".jpg"), encode_value(b"raw", "bin")
        (b'5', b'hi', b'raw')
        >>> import gzip
        >>> gzip.decompress(encode_value({"a": 1}, "json.gz"))
        b'{"a": 1}'
    """
    ext = extension.lower()
    compress = ext.endswith(".gz")
    if compress:
        ext = ext[: -len(".gz")]
    value = _read_stream(value)
    if isinstance(value, bytes):
        data = value
    elif isinstance(value, _BYTES):
        data = bytes(value)
    elif isinstance(value, str):
        data = value.encode("utf-8")
    else:
        table = default_encoders() if encoders is None else encoders
        encoder = find_encoder(ext, table) if ext.strip(".") else None
        if encoder is None:
            raise ValueError(
                f"no encoder for the extension {extension!r} (a {type(value).__name__}); give the value as "
                "bytes or str, or pass an encoder for it"
            )
        data = encoder(value)
        if isinstance(data, bytearray | memoryview):
            data = bytes(data)
        if not isinstance(data, bytes):
            raise TypeError(f"the encoder of {extension!r} returned {type(data).__name__}, not bytes")
    return gzip.compress(data, mtime=0) if compress else data


def field_name(key: str) -> str:
    """A sample dict key as the extension of a tar member: without its leading dot (``".jpg"`` -> ``"jpg"``)."""
    return key[1:] if key.startswith(".") else key


def encode_sample(
    sample: Mapping[str, Any],
    encoders: Mapping[str, Encoder | None] | None = None,
    keep_meta: bool = False,
    *,
    stage: str = "encode_sample",
) -> dict[str, Any]:
    """Encode every field of a WebDataset sample dict: ``{"__key__": key, extension: bytes, ...}``.

    Field names lose their leading dot (``".jpg"`` and ``"jpg"`` both give the
    member ``<key>.jpg``), as :class:`pipekit.pipes.WebDataset` writes them
    with one and ``webdataset`` without.  Fields starting with ``_``
    (``__url__``, ``__local_path__``) are left out, or, with ``keep_meta``,
    kept as UTF-8 when they are ``str`` (``webdataset``'s rule).
    ``__key__`` is kept as it is.

    Raises:
        EncodeError: naming ``<key>.<extension>`` and ``stage``, when a field
            cannot be encoded (the error it came from is chained).

    Example:
        >>> encode_sample({"__key__": "s/0001", ".cls": 3, "json": {"a": 1}, "__url__": "x.tar"})
        {'__key__': 's/0001', 'cls': b'3', 'json': b'{"a": 1}'}
    """
    if not isinstance(sample, Mapping):
        raise TypeError(f"{stage}: a sample must be a dict, got {type(sample).__name__}: {sample!r:.200}")
    if "__key__" not in sample:
        raise ValueError(f"{stage}: a sample must have a '__key__' (it has {sorted(map(str, sample))})")
    key = sample["__key__"]
    table = default_encoders() if encoders is None else encoders
    out: dict[str, Any] = {"__key__": key}
    for name, value in sample.items():
        if not isinstance(name, str):
            raise TypeError(f"{stage}: field names must be str, got {name!r} in sample {key!r}")
        if name == "__key__":
            continue
        field = field_name(name)
        if not field:
            raise ValueError(f"{stage}: sample {key!r} has a field without a name ({name!r})")
        if field in out:
            raise ValueError(f"{stage}: sample {key!r} has the field {field!r} twice (with and without a dot)")
        if name.startswith("_"):
            if not keep_meta:
                continue
            if not isinstance(value, str):
                raise EncodeError("encode", f"{key}.{field}", stage,
                                  f"metadata fields (starting with '_') must be str, got {type(value).__name__}")
            out[field] = value.encode("utf-8")
            continue
        try:
            out[field] = encode_value(value, field, table)
        except EncodeError:
            raise
        except Exception as exc:  # an encoder's own error (Pillow's OSError, a pickling error...), chained
            raise EncodeError("encode", f"{key}.{field}", stage, f"{type(exc).__name__}: {exc}") from exc
    return out
