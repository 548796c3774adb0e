"""JPEGs decoded where the model runs: encoded batches from the workers, decode + crop + flip on the device.

The CPU image path decodes and crops each JPEG in the workers; at 0 workers that is ~70% of the loader's time
(issue 34).  This module splits it in two, so the decode can run on the GPU (torchvision's batched
``decode_jpeg(device="cuda")``, nvJPEG):

* **CPU side** (:class:`JpegCropParams`, in the workers): each sample's JPEG stays encoded (a 1-D ``uint8``
  tensor); its header gives the size (and its EXIF orientation), which is checked against the pixel limit
  (:mod:`pipekit._decode_checks`) and from which the ``RandomResizedCrop`` box and the flip are drawn, from the
  pipe's seeded stream, with exactly the draws the CPU path makes (:mod:`pipekit.transforms._direct`).  So the
  parameters are reproducible, saved in checkpoints (the stream's position), and travel with the batch.
  :class:`EncodedCollate` concatenates a batch's JPEGs into one flat tensor (one buffer to pass between
  processes and to pin) beside a ``[B, 7]`` int64 table, :data:`PARAMS_KEY`, of
  ``top, left, height, width, flip, orientation, nbytes``.
* **Device side** (:func:`decode_jpeg_crops`, a kernel): batched decode on ``device``, then per image the EXIF
  orientation, the crop resized to ``size`` (bilinear, antialiased: the kernel the CPU path calls) and the flip;
  the stacked ``uint8 [B, 3, S, S]`` batch then goes through :func:`pipekit.device.to_device`'s fused
  conversion and normalisation.  :class:`JpegDecodeStep` is what ``DeviceLoader(..., decode="jpeg")`` runs.

On the CPU the device side decodes with the same libjpeg call and resizes with the same kernel as the CPU path,
so given the same parameters the images are equal; on CUDA, nvJPEG's IDCT and upsampling and the GPU resize
differ by a few levels (see the tests' tolerance).

A top-level module (not in ``pipes/`` or ``transforms/``): it joins a pipe (the CPU side, an
:class:`~pipekit.pipes.Augmenter`) to the device kernels of :mod:`pipekit.device`, as :mod:`pipekit.decoders`
joins decoding to the pipes, and neither package may import the other's side.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from pipekit._decode_checks import jpeg_size, over_limit
from pipekit.errors import DecodeError, SkipLog, check_on_error
from pipekit.pipes._sample_transforms import Augmenter
from pipekit.pipes.base import IterDataPipe

__all__ = ["PARAMS_KEY", "JpegCropParams", "EncodedCollate", "decode_jpeg_crops", "JpegDecodeStep", "jpeg_crop_stage"]

#: The batch entry holding each sample's ``top, left, height, width, flip, orientation, nbytes`` (int64 ``[B, 7]``).
PARAMS_KEY = "__jpeg_crop__"
_CPU_STAGE = "jpeg_crop_params"
_DEVICE_STAGE = "decode_jpeg_crops"
_EXIF_SWAPS = frozenset({5, 6, 7, 8})  # orientations that transpose the image


def _limit(max_pixels: int | None, where: str) -> int:
    from pipekit.decoders import _pixel_limit

    return _pixel_limit(max_pixels, where)


def _header(data: Any, key: str, stage: str, limit: int) -> tuple[int, int]:
    """``(height, width)`` a JPEG declares, checked against ``limit``; a :class:`DecodeError` naming ``key``."""
    if bytes(data[:3]) != b"\xff\xd8\xff":
        raise DecodeError("decode image", key, stage, f"not a JPEG (first bytes {bytes(data[:8])!r})")
    size = jpeg_size(data)
    if size is None:
        raise DecodeError("decode image", key, stage, "corrupt JPEG: no readable start-of-frame header")
    reason = over_limit(size, limit)
    if reason is not None:
        raise DecodeError("decode image", key, stage, reason)
    return size[1], size[0]


def _orientation(data: bytes) -> int:
    """The EXIF orientation (1-8) of a JPEG; 1 without an ``Exif`` block (Pillow is asked only when there is one)."""
    if data.find(b"Exif\x00\x00", 0, 4096) < 0:
        return 1
    from pipekit._image_backends import _exif_orientation

    return _exif_orientation(data)


class JpegCropParams(Augmenter):
    """Keep each sample's JPEG encoded and draw its ``RandomResizedCrop`` box and flip (the CPU side).

    For each sample dict the JPEG at ``image_key`` (bytes) becomes a 1-D ``uint8`` tensor, and
    :data:`PARAMS_KEY` holds ``[top, left, height, width, flip, orientation, nbytes]``: the box and flip
    ``v2.RandomResizedCrop(size, scale, ratio)`` and ``v2.RandomHorizontalFlip(flip_p)`` would draw for the
    decoded (EXIF-oriented) image, drawn from this pipe's stream with the same numbers the CPU path
    (``TarShards(size=...)``) draws.  The size comes from the header, checked against ``max_pixels``
    (a :class:`~pipekit.errors.DecodeError` naming the sample's ``__key__``; with ``on_error="skip"`` the
    sample is dropped and counted in ``skip_log``).  Seeded and checkpointed as ``augment``.

    Example:
        >>> import io, torch
        >>> from PIL import Image
        >>> from pipekit.pipes import IterableWrapper
        >>> buf = io.BytesIO(); Image.new("RGB", (40, 30)).save(buf, "JPEG")
        >>> samples = [{"__key__": f"s{i}", ".jpg": buf.getvalue()} for i in range(2)]
        >>> pipe = JpegCropParams(IterableWrapper(samples), 16).set_seed(0)
        >>> [s["__jpeg_crop__"].tolist()[2:4] for s in pipe]  # the crops' height and width, within 30 x 40
        [[25, 28], [11, 12]]
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe,
        size: int | Sequence[int],
        *,
        image_key: str = ".jpg",
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        flip_p: float = 0.5,
        max_pixels: int | None = None,
        on_error: str = "raise",
    ) -> None:
        from torchvision.transforms import v2

        from pipekit.transforms._direct import direct_image_ops

        ops = [v2.RandomResizedCrop(size, scale=scale, ratio=ratio, antialias=True), v2.RandomHorizontalFlip(flip_p)]
        super().__init__(source_datapipe, ops, image_key=image_key, mask_keys=())
        self.image_key = image_key
        self.flip_p = float(flip_p)
        self.max_pixels = max_pixels
        self._limit = _limit(max_pixels, _CPU_STAGE)
        self._crop = direct_image_ops(ops)[0]  # type: ignore[index]
        self.on_error = check_on_error(on_error)
        self.skip_log = SkipLog(_CPU_STAGE)

    def __len__(self) -> int:
        if self.on_error == "skip":
            raise TypeError(f"{_CPU_STAGE} with on_error='skip' has no valid length (samples may be skipped)")
        return super().__len__()

    def __iter__(self) -> Iterator[Any]:
        key, stream, crop, flip_p, limit = self.image_key, self._stream, self._crop, self.flip_p, self._limit
        skip = self.on_error == "skip"
        for item in self.source_datapipe:
            if not isinstance(item, Mapping) or key not in item:
                raise KeyError(f"{_CPU_STAGE}: sample {_name(item)!r} has no {key!r} entry; pass image_key=")
            data = item[key]
            raw = bytes(data) if not isinstance(data, bytes) else data
            try:
                height, width = _header(raw, _name(item), _CPU_STAGE, limit)
            except DecodeError as exc:
                if not skip:
                    raise
                self.skip_log.record(exc)
                continue
            orientation = _orientation(raw)
            if orientation in _EXIF_SWAPS:
                height, width = width, height
            g = stream.generator()
            top, left, h, w = crop.params(height, width, g)  # type: ignore[attr-defined]
            flip = int(bool(torch.rand(1, generator=g) < flip_p))  # RandomHorizontalFlip's test
            params = torch.tensor([top, left, h, w, flip, orientation, len(raw)], dtype=torch.int64)
            yield {**item, key: torch.frombuffer(bytearray(raw), dtype=torch.uint8), PARAMS_KEY: params}


def _name(item: Any) -> str:
    return str(item.get("__key__", "<sample>")) if isinstance(item, Mapping) else "<sample>"


class EncodedCollate:
    """Collate :class:`JpegCropParams` samples: the JPEGs concatenated into one flat ``uint8`` tensor.

    Every other entry is collated by :func:`pipekit.collate.collate` (``PARAMS_KEY`` becomes ``[B, 7]``).
    """

    def __init__(self, image_key: str = ".jpg") -> None:
        self.image_key = image_key

    def __call__(self, samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        from pipekit.collate import collate

        key = self.image_key
        flat = torch.cat([s[key] for s in samples])
        batch = collate([{k: v for k, v in s.items() if k != key} for s in samples])
        batch[key] = flat
        return batch


def jpeg_crop_stage(
    pipe: IterDataPipe,
    size: int | Sequence[int],
    *,
    image_key: str = ".jpg",
    batch_size: int | None = None,
    drop_last: bool = False,
    max_pixels: int | None = None,
    on_error: str = "raise",
) -> IterDataPipe:
    """What ``TarShards(..., decode_device=...)`` puts after its shuffle in place of decode + augment + collate.

    ``pipe`` yields undecoded samples (``{"__key__", ".jpg": bytes, ".cls": b"3"}``); the result yields
    :class:`JpegCropParams` samples (every entry but the image decoded as ``decode`` decodes it), or with
    ``batch_size`` encoded batches for ``DeviceLoader(loader, device, decode="jpeg", size=size, keys=image_key)``.

    Example:
        >>> import io, torch
        >>> from PIL import Image
        >>> from pipekit.device import DeviceLoader, jpeg_crop_stage
        >>> from pipekit.pipes import IterableWrapper
        >>> buf = io.BytesIO(); Image.new("RGB", (40, 30)).save(buf, "JPEG")
        >>> samples = [{"__key__": f"s{i}", ".jpg": buf.getvalue(), ".cls": b"1"} for i in range(4)]
        >>> pipe = jpeg_crop_stage(IterableWrapper(samples), 16, batch_size=2)  # in the workers
        >>> _ = torch.manual_seed(0)
        >>> batches = list(DeviceLoader(pipe, "cpu", decode="jpeg", size=16, keys=".jpg", scale=255))
        >>> [tuple(b[".jpg"].shape) for b in batches], batches[0][".cls"].tolist()
        ([(2, 3, 16, 16), (2, 3, 16, 16)], [1, 1])
    """
    out: IterDataPipe = pipe.decode(handlers={image_key: None}, on_error=on_error)  # the JPEG stays bytes
    out = JpegCropParams(out, size, image_key=image_key, max_pixels=max_pixels, on_error=on_error)
    if batch_size is not None:
        out = out.batch(batch_size, drop_last=drop_last).collate(collate_fn=EncodedCollate(image_key))
    return out


def _split(encoded: torch.Tensor | Sequence[torch.Tensor], params: torch.Tensor) -> list[torch.Tensor]:
    if isinstance(encoded, torch.Tensor):
        sizes = params[:, 6].tolist()
        if encoded.dim() != 1 or sum(sizes) != encoded.numel():
            raise ValueError(
                f"{_DEVICE_STAGE}: the encoded batch holds {encoded.numel()} bytes but {PARAMS_KEY} declares "
                f"{sum(sizes)}: not a batch of {EncodedCollate.__name__}"
            )
        return list(torch.split(encoded, sizes))
    return [t.cpu() for t in encoded]


def _decode_all(
    datas: list[torch.Tensor], device: torch.device, keys: Sequence[str], indices: list[int], skip_log: SkipLog | None
) -> tuple[list[torch.Tensor], list[int]]:
    """Decode ``datas[i]`` for ``i`` in ``indices`` on ``device``: the images and the indices decoded.

    When the batched call fails (torchvision raises for the whole batch), decode one by one to find the bad
    files: each raises a :class:`DecodeError` naming its key, or with a ``skip_log`` is recorded there and left out.
    """
    from torchvision.io import ImageReadMode, decode_jpeg

    from pipekit._image_backends import _clean_reason

    if not indices:
        return [], []
    try:
        return list(decode_jpeg([datas[i] for i in indices], mode=ImageReadMode.RGB, device=device)), indices
    except Exception as batch_exc:
        images, decoded = [], []
        for i in indices:
            try:
                images.append(decode_jpeg(datas[i], mode=ImageReadMode.RGB, device=device))
                decoded.append(i)
            except Exception as exc:
                error = DecodeError("decode image", keys[i], _DEVICE_STAGE, _clean_reason(exc))
                if skip_log is None:
                    raise error from exc
                skip_log.record(error)
        if skip_log is None:  # every file decodes alone: report the batch's failure
            raise DecodeError("decode image", f"a batch of {len(indices)}", _DEVICE_STAGE,
                              _clean_reason(batch_exc)) from batch_exc
        return images, decoded


def decode_jpeg_crops(
    encoded: torch.Tensor | Sequence[torch.Tensor],
    params: torch.Tensor,
    size: int | Sequence[int],
    device: torch.device | str = "cpu",
    *,
    keys: Sequence[str] | None = None,
    max_pixels: int | None = None,
) -> torch.Tensor:
    """Decode a batch of JPEGs on ``device`` and crop, resize and flip each: a ``uint8 [B, 3, S, S]`` batch.

    Args:
        encoded: the flat tensor of :class:`EncodedCollate`, or a list of 1-D ``uint8`` tensors (on the CPU).
        params: ``[B, 7]``: ``top, left, height, width, flip, orientation, nbytes`` (:data:`PARAMS_KEY`).
        size: the output size (``int`` or ``(h, w)``).
        device: where to decode (``"cuda"``: nvJPEG; ``"cpu"``: libjpeg, as the CPU path).
        keys: the samples' names for errors (the batch's ``__key__``).
        max_pixels: the pixel limit checked on each header before decoding (default
            :data:`pipekit.decoders.MAX_IMAGE_PIXELS`).

    Raises:
        DecodeError: a file is not a JPEG, is corrupt, or declares more than ``max_pixels`` pixels;
            it names the sample's key.  (``DeviceLoader(..., on_error="skip")`` drops such samples instead.)

    Example:
        >>> import io, torch
        >>> from PIL import Image
        >>> buf = io.BytesIO(); Image.new("RGB", (40, 30), (200, 10, 10)).save(buf, "JPEG")
        >>> data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
        >>> params = torch.tensor([[0, 0, 30, 40, 1, 1, data.numel()]])
        >>> out = decode_jpeg_crops(data, params, 8)
        >>> out.shape, out.dtype
        (torch.Size([1, 3, 8, 8]), torch.uint8)
        >>> bool((out[0, :, 4, 4].int() - torch.tensor([200, 10, 10])).abs().max() <= 3)  # JPEG's rounding
        True
    """
    return _decode_crops(encoded, params, size, device, keys, max_pixels, None)[0]


def _decode_crops(
    encoded: torch.Tensor | Sequence[torch.Tensor],
    params: torch.Tensor,
    size: int | Sequence[int],
    device: torch.device | str,
    keys: Sequence[str] | None,
    max_pixels: int | None,
    skip_log: SkipLog | None,
) -> tuple[torch.Tensor, list[int]]:
    """:func:`decode_jpeg_crops`, and the indices of the images kept (all of them unless ``skip_log`` is given)."""
    from torchvision.transforms.v2 import InterpolationMode
    from torchvision.transforms.v2 import functional as F

    from pipekit._image_backends import _apply_orientation

    device = torch.device(device)
    if params.dim() != 2 or params.shape[1] != 7:
        raise ValueError(f"{_DEVICE_STAGE}: params must be [B, 7], got {tuple(params.shape)}")
    datas = _split(encoded, params)
    if len(datas) != params.shape[0]:
        raise ValueError(f"{_DEVICE_STAGE}: {len(datas)} images but {params.shape[0]} rows of params")
    if not datas:
        raise ValueError(f"{_DEVICE_STAGE}: an empty batch")
    names = [str(k) for k in keys] if keys is not None else [f"<image {i} of the batch>" for i in range(len(datas))]
    limit = _limit(max_pixels, _DEVICE_STAGE)
    checked = []
    for i, (data, name) in enumerate(zip(datas, names)):
        try:
            _header(memoryview(data.numpy()), name, _DEVICE_STAGE, limit)  # before nvJPEG allocates anything
            checked.append(i)
        except DecodeError as exc:
            if skip_log is None:
                raise
            skip_log.record(exc)
    images, kept = _decode_all(datas, device, names, checked, skip_log)
    out_size = [size, size] if isinstance(size, int) else list(size)
    rows = params.tolist()
    out = torch.empty((len(images), 3, *out_size), dtype=torch.uint8, device=device)
    for i, (image, j) in enumerate(zip(images, kept)):
        top, left, h, w, flip, orientation, _ = rows[j]
        image = _apply_orientation(image, orientation)
        crop = F.resized_crop_image(
            image, top, left, h, w, size=out_size, interpolation=InterpolationMode.BILINEAR, antialias=True
        )
        out[i] = F.horizontal_flip_image(crop) if flip else crop
    return out, kept


class JpegDecodeStep:
    """``DeviceLoader(..., decode="jpeg")``'s step: take a batch's JPEGs and params out, decode them on the device.

    :meth:`split` takes the encoded entry and :data:`PARAMS_KEY` out of a host batch (they stay on the
    CPU: nvJPEG reads host memory); :meth:`apply` puts the decoded ``uint8`` images back at the entry.
    """

    def __init__(
        self, size: int | Sequence[int], key: str | None = None, max_pixels: int | None = None, on_error: str = "raise"
    ) -> None:
        if size is None:
            raise TypeError("DeviceLoader: decode='jpeg' needs size= (the crops' output size)")
        self.size = size
        self.key = key
        self.max_pixels = max_pixels
        _limit(max_pixels, "DeviceLoader")
        self.on_error = check_on_error(on_error)
        self.skip_log = SkipLog(_DEVICE_STAGE)

    def image_key(self, batch: Mapping[str, Any]) -> str:
        if self.key is not None:
            return self.key
        return "image" if "image" in batch else ".jpg"

    def split(self, batch: Any) -> tuple[dict[str, Any], tuple[str, Any, torch.Tensor]]:
        if not isinstance(batch, Mapping) or PARAMS_KEY not in batch:
            raise TypeError(
                f"DeviceLoader: decode='jpeg' takes batches of JpegCropParams samples (dicts with {PARAMS_KEY!r}, "
                f"e.g. from TarShards(..., decode_device=...)), got {type(batch).__name__}"
            )
        key = self.image_key(batch)
        if key not in batch:
            raise KeyError(f"DeviceLoader: the batch has no {key!r} entry (it has {sorted(batch)}); pass keys=")
        rest = {k: v for k, v in batch.items() if k not in (key, PARAMS_KEY)}
        return rest, (key, batch[key], batch[PARAMS_KEY])

    def apply(self, rest: dict[str, Any], held: tuple[str, Any, torch.Tensor], device: torch.device) -> dict[str, Any]:
        key, encoded, params = held
        names = rest.get("__key__")
        log = self.skip_log if self.on_error == "skip" else None
        images, kept = _decode_crops(encoded, params.cpu(), self.size, device, names, self.max_pixels, log)
        n = params.shape[0]
        if len(kept) < n:  # skipped: the batch's other entries keep the same samples
            if not kept:
                raise DecodeError("decode image", f"a batch of {n}", _DEVICE_STAGE,
                                  f"every JPEG of the batch was skipped ({self.skip_log.count} skipped so far)")
            rest = {k: _take(v, kept, n) for k, v in rest.items()}
            params = params[kept]
        return {**rest, key: images, PARAMS_KEY: params}


def _take(value: Any, kept: list[int], n: int) -> Any:
    """The ``kept`` rows of a batch entry of ``n`` samples (a tensor or a list); anything else as it is."""
    if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == n:
        return value[torch.tensor(kept, device=value.device)]
    if isinstance(value, (list, tuple)) and len(value) == n:
        return type(value)(value[i] for i in kept)
    return value
