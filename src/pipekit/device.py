"""Feeding the device: compact host batches, async copies, conversion on the device.

The usual last step of a pipeline (collate to float32 on the CPU, copy from
pageable memory, synchronously, in NCHW, convert again in the model) is the one
that most often starves a GPU.  pipekit keeps batches compact on the host
(uint8/uint16/int16, pinned) and does the expensive work on the device:

* :func:`to_device` copies integer images as they are, then converts (and,
  when asked, scales) and normalises them in **one** fused kernel straight into
  a ``channels_last`` tensor; masks stay integer; everything else passes
  through.  Values stay in the data's own units unless ``scale=`` says
  otherwise, the units :func:`pipekit.transforms.compute_stats` reports
  statistics in (and TorchGeo's recipes normalise with), so
  ``normalize=(stats.mean, stats.std)`` gives mean 0, std 1.
* :class:`DeviceLoader` wraps any loader and overlaps the copy of batch n+1
  with the compute on batch n on side CUDA streams, with the stream
  synchronisation that keeps that safe; its ``state_dict()`` accounts for the
  batch in flight.
* JPEGs decoded on the device: :func:`jpeg_crop_stage` (:class:`JpegCropParams`)
  keeps the workers' JPEGs encoded and draws their crop and flip there;
  ``DeviceLoader(..., decode="jpeg", size=)`` decodes them on the device
  (nvJPEG on CUDA) and crops, resizes and flips there (:func:`decode_jpeg_crops`).

On the CPU both give the same values and layouts, so CPU-only code and tests
behave the same.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch

from pipekit._jpeg_device import JpegCropParams, decode_jpeg_crops, jpeg_crop_stage

__all__ = [
    "to_device",
    "DeviceLoader",
    "prefetch_to_device",
    "default_scale",
    "JpegCropParams",
    "jpeg_crop_stage",
    "decode_jpeg_crops",
]

_INT_SCALES = {
    torch.uint8: 255.0,
    torch.int8: 127.0,
    torch.uint16: 65535.0,
    torch.int16: 32767.0,
    torch.int32: 2147483647.0,
}
_FUSED = True  # tests switch this off to check the unfused fallback
_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def default_scale(dtype: torch.dtype) -> float:
    """The integer type's maximum (255 for uint8, 65535 for uint16...), or 1 for floats.

    What to pass as ``to_device(..., scale=default_scale(x.dtype))`` to map an
    integer image to 0..1 (for statistics in those units, such as ImageNet's).
    :func:`to_device` itself does not scale by it unless asked (earlier
    versions did by default).
    """
    if dtype.is_floating_point:
        return 1.0
    if dtype not in _INT_SCALES:
        raise TypeError(f"to_device: unsupported image dtype {dtype}")
    return _INT_SCALES[dtype]


def _per_channel(values: Any, channels: int, name: str) -> torch.Tensor:
    t = torch.as_tensor(values, dtype=torch.float64).flatten()
    if t.numel() == 1:
        t = t.expand(channels)
    if t.numel() != channels:
        raise ValueError(f"to_device: {name} has {t.numel()} values but the image has {channels} channels")
    return t


def _convert_image(
    x: torch.Tensor,
    device: torch.device,
    non_blocking: bool,
    dtype: torch.dtype,
    scale: float | None,
    normalize: tuple[Any, Any] | None,
    channels_last: bool,
) -> torch.Tensor:
    if x.dim() < 3:
        raise ValueError(
            f"to_device: an image must have a channel axis ([C,H,W], [B,C,H,W] or [B,T,C,H,W]), got {tuple(x.shape)}"
        )
    # Integer data crosses the bus as is (2-4x fewer bytes than float32).
    moved = x.to(device, non_blocking=non_blocking)
    if x.dtype not in _FLOATS and x.dtype not in _INT_SCALES:
        raise TypeError(f"to_device: unsupported image dtype {x.dtype}")
    s = 1.0 if scale is None else float(scale)
    if s <= 0 or not math.isfinite(s):
        raise ValueError(f"to_device: scale must be a positive finite number, got {scale!r}")
    # 4-D batches [B,C,H,W] and single images [C,H,W] have channels at -3; 5-D [B,T,C,H,W] too.
    channels = x.shape[-3]
    if normalize is not None:
        mean, std = normalize
        mean_t = _per_channel(mean, channels, "mean")
        std_t = _per_channel(std, channels, "std")
        if bool((std_t <= 0).any()):
            raise ValueError(f"to_device: std must be positive, got {std_t.tolist()}")
        if scale is None and not x.dtype.is_floating_point:
            _warn_if_unit_scale_stats(x.dtype, mean_t, std_t)
        a = 1.0 / (s * std_t)
        b = -mean_t / std_t
    else:
        a = torch.full((channels,), 1.0 / s, dtype=torch.float64)
        b = torch.zeros(channels, dtype=torch.float64)
    view = (channels, 1, 1)
    ab = torch.stack([a, b]).to(dtype)
    if device.type == "cuda":
        # From pinned memory, asynchronously: a copy from pageable memory would block this thread until the
        # stream had finished everything queued before it (the batch's own copy, in DeviceLoader).
        ab = ab.pin_memory()
    ab = ab.to(device, non_blocking=True)
    a, b = ab[0].view(view), ab[1].view(view)
    if channels_last and x.dim() == 4:
        fmt = torch.channels_last
    elif channels_last and x.dim() == 5:
        fmt = torch.channels_last_3d
    else:
        fmt = torch.contiguous_format
    out = torch.empty(moved.shape, dtype=dtype, device=device, memory_format=fmt)
    if _FUSED:
        try:
            # One kernel: cast from the integer input, multiply-add per channel, write in the target layout.
            torch.addcmul(b, moved, a, out=out)
            return out
        except (RuntimeError, NotImplementedError):
            pass  # some integer dtypes (e.g. uint16 on some devices) lack the mixed-dtype kernel
    out.copy_(moved)
    out.mul_(a).add_(b)
    return out


def _warn_if_unit_scale_stats(dtype: torch.dtype, mean: torch.Tensor, std: torch.Tensor) -> None:
    """Warn when statistics look like those of 0..1 images (ImageNet's) but raw integers are normalised with them."""
    top = _INT_SCALES[dtype]
    if top >= 255 and float(mean.abs().max()) <= 1.0 and float(std.max()) <= 1.0:
        warnings.warn(
            f"to_device: normalize's mean {[round(v, 4) for v in mean.tolist()]} and std look like statistics of "
            f"images in 0..1, but the {dtype} images are not rescaled (to_device keeps raw values, the units of "
            f"compute_stats); pass scale={top:g} to map them to 0..1 first, or scale=1 to keep raw values and "
            "silence this warning",
            UserWarning,
            stacklevel=5,  # the caller of to_device
        )


def _as_key_set(keys: Any, default: Sequence[Any]) -> tuple[Any, ...]:
    if keys is None:
        return ()
    if keys is ...:
        return tuple(default)
    if isinstance(keys, (str, int)):
        return (keys,)
    return tuple(keys)


def to_device(
    batch: Any,
    device: torch.device | str | int,
    *,
    non_blocking: bool = True,
    channels_last: bool = True,
    dtype: torch.dtype = torch.float32,
    normalize: tuple[Any, Any] | None = None,
    scale: float | None = None,
    keys: Any = ...,
    mask_keys: Any = ...,
    mask_dtype: torch.dtype | None = None,
) -> Any:
    """Move a batch to ``device`` and turn its images into normalised floating point there.

    **Units.**  Integer images are *not* rescaled unless ``scale=`` asks for
    it: a uint16 image of reflectance DN stays in DN, so statistics computed
    on the raw values, as :func:`pipekit.transforms.compute_stats` computes
    them (and TorchGeo's recipes normalise with), normalise it to mean 0 and
    std 1: ``to_device(batch, "cuda", normalize=(stats.mean, stats.std))``.
    For statistics of images in 0..1 (ImageNet's ``mean=[0.485, ...]``), pass
    ``scale=255`` for uint8 (``scale=default_scale(x.dtype)`` in general); a
    ``UserWarning`` says so when such statistics meet unscaled integers.
    (Earlier versions divided integer images by their dtype's maximum by
    default, so raw statistics gave a constant batch.)

    Args:
        batch: a tensor, a dict (sample or batch dict), or a tuple/list of entries.
        device: the target device (``"cuda"``, ``"cuda:1"``, ``"cpu"``...).
        non_blocking: asynchronous copies (effective from pinned memory).
        channels_last: return 4-D images in ``torch.channels_last`` and 5-D ones
            (``[B,T,C,H,W]`` time series) in ``torch.channels_last_3d``.
        dtype: ``torch.float32``, ``torch.float16`` or ``torch.bfloat16``.
        normalize: ``(mean, std)`` per channel, in the units of the image
            after ``scale`` (the raw values by default), or ``None`` to only
            convert (and scale).
        scale: the value mapped to 1.0 before normalising.  Default ``None``:
            no rescaling, images keep their values (the units of
            :func:`~pipekit.transforms.compute_stats`).  ``scale=255`` maps
            uint8 images to 0..1, ``scale=10000`` reads Sentinel-2-style
            ``uint16 * 10000`` reflectance as 0..1.
        keys: which entries are images: dict keys, or tuple/list positions.
            Default ``"image"`` for dicts, position 0 for tuples/lists, and the
            tensor itself for a bare tensor.  ``None`` converts nothing.
        mask_keys: entries that are masks: moved as they are (contiguous,
            integer), default ``"mask"`` for dicts.
        mask_dtype: convert masks to this dtype on the device (e.g. ``torch.long``).

    Returns the batch with the same structure; non-tensor entries pass
    through.  The result equals ``((x.float() / scale - mean) / std)`` up to
    the rounding of ``dtype``.

    Example:
        >>> import torch
        >>> from pipekit.device import to_device
        >>> batch = {"image": torch.full((2, 3, 4, 4), 200, dtype=torch.uint8),
        ...          "mask": torch.zeros(2, 4, 4, dtype=torch.uint8), "id": ["a", "b"]}
        >>> out = to_device(batch, "cpu", normalize=([100.0] * 3, [50.0] * 3))  # raw units, as compute_stats
        >>> out["image"].dtype, out["image"].is_contiguous(memory_format=torch.channels_last)
        (torch.float32, True)
        >>> round(float(out["image"].max()), 4), out["mask"].dtype, out["id"]
        (2.0, torch.uint8, ['a', 'b'])
        >>> out = to_device(batch, "cpu", scale=255, normalize=([0.5] * 3, [0.5] * 3))  # statistics in 0..1
        >>> round(float(out["image"].max()), 4)
        0.5686
    """
    if dtype not in _FLOATS:
        raise TypeError(f"to_device: dtype must be a floating point type, got {dtype}")
    device = torch.device(device)

    def image(x: torch.Tensor) -> torch.Tensor:
        return _convert_image(x, device, non_blocking, dtype, scale, normalize, channels_last)

    def mask(x: torch.Tensor) -> torch.Tensor:
        moved = x.to(device, non_blocking=non_blocking)
        if mask_dtype is not None:
            moved = moved.to(mask_dtype)
        return moved.contiguous()

    def plain(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return x.to(device, non_blocking=non_blocking)
        return x

    if isinstance(batch, torch.Tensor):
        return image(batch) if keys is not None else plain(batch)
    if isinstance(batch, Mapping):
        image_keys = _as_key_set(keys, ("image",))
        masks = _as_key_set(mask_keys, ("mask",))
        out = {}
        for k, v in batch.items():
            if k in image_keys and isinstance(v, torch.Tensor):
                out[k] = image(v)
            elif k in masks and isinstance(v, torch.Tensor):
                out[k] = mask(v)
            else:
                out[k] = plain(v)
        return type(batch)(out) if not isinstance(batch, dict) else out
    if isinstance(batch, (tuple, list)):
        image_keys = _as_key_set(keys, (0,))
        masks = _as_key_set(mask_keys, ())
        items = []
        for i, v in enumerate(batch):
            if i in image_keys and isinstance(v, torch.Tensor):
                items.append(image(v))
            elif i in masks and isinstance(v, torch.Tensor):
                items.append(mask(v))
            else:
                items.append(plain(v))
        if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
            return type(batch)(*items)
        return type(batch)(items)
    return batch


_TO_DEVICE_KWARGS = {
    "non_blocking",
    "channels_last",
    "dtype",
    "normalize",
    "scale",
    "keys",
    "mask_keys",
    "mask_dtype",
}


def _map_tensors(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``obj`` with ``fn`` applied to each of its tensors, through dicts, tuples, lists and namedtuples."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, Mapping):
        mapped = {k: _map_tensors(v, fn) for k, v in obj.items()}
        return mapped if isinstance(obj, dict) else type(obj)(mapped)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(_map_tensors(v, fn) for v in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(_map_tensors(v, fn) for v in obj)
    return obj


def _move(obj: Any, device: torch.device, non_blocking: bool) -> Any:
    """Every tensor of a batch copied to ``device`` as it is, the structure kept (what :func:`to_device` moves)."""
    return _map_tensors(obj, lambda t: t.to(device, non_blocking=non_blocking))


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, Mapping):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


class DeviceLoader:
    """Wrap a loader so its batches arrive on ``device``, converted, one batch ahead.

    On CUDA, batch n+1 is copied on one side stream and converted on
    another while the caller computes on batch n: the copy of batch n+1
    runs on the copy engine while batch n is still being converted, so the
    copies follow each other back to back.  The conversion waits for its
    batch's copies, the current stream waits for the conversion before the
    batch is handed out (``wait_stream``), and every tensor is marked as used
    by each stream that reads it (``record_stream``), so no tensor is read
    before its copy lands or reused by the allocator while still in use.  On
    the CPU it is a plain loop applying :func:`to_device`.

    ``state_dict()`` returns the wrapped loader's state as of the last batch
    *handed out*, not the one prefetched, so a resumed run does not lose the
    batch that was in flight.  ``load_state_dict`` and ``len`` delegate to the
    wrapped loader.

    Args:
        loader: any iterable of batches (``pipekit.DataLoader``, a torch
            ``DataLoader``, a pipe...).
        device: target device.
        stage_pinned: on CUDA, copy CPU tensors that are not pinned into a
            small ring of page-locked buffers that are reused from batch to
            batch (each reused only after its previous copy to the device has
            finished), so the copy to the device is asynchronous without
            pinning a fresh buffer per batch.  Use it with
            ``pipekit.DataLoader(..., pin_memory=False)``.
        decode: ``"jpeg"``: batches hold encoded JPEGs and their crop parameters
            (:func:`jpeg_crop_stage`, :class:`JpegCropParams`); they are
            decoded on ``device`` (nvJPEG on CUDA), cropped, resized to ``size`` and flipped there, then
            converted as ``to_device`` converts images.  The image entry is ``keys`` (default ``"image"``,
            else ``".jpg"``).  ``None`` (default): batches are moved as they are.
        size: the output size of the crops (with ``decode="jpeg"``).
        max_pixels: the pixel limit each JPEG's header is checked against before decoding (default
            ``pipekit.decoders.MAX_IMAGE_PIXELS``).
        on_error: with ``decode="jpeg"``: ``"raise"`` a ``DecodeError`` naming a corrupt JPEG's key, or
            ``"skip"`` it (the batch keeps its other samples; counted in ``skip_log``).
        **to_device_kwargs: passed to :func:`to_device` (``normalize``,
            ``dtype``, ``channels_last``, ``keys``...).

    Example:
        >>> import torch
        >>> from pipekit.device import DeviceLoader
        >>> batches = [torch.full((2, 3, 2, 2), 255, dtype=torch.uint8) for _ in range(3)]
        >>> [float(b.mean()) for b in DeviceLoader(batches, "cpu", scale=255)]
        [1.0, 1.0, 1.0]
    """

    def __init__(
        self,
        loader: Iterable[Any],
        device: torch.device | str | int,
        *,
        stage_pinned: bool = True,
        decode: str | None = None,
        size: int | Sequence[int] | None = None,
        max_pixels: int | None = None,
        on_error: str = "raise",
        **to_device_kwargs: Any,
    ) -> None:
        self.loader = loader
        self._decode: Any = None
        if decode is not None:
            if decode != "jpeg":
                raise ValueError(f"DeviceLoader: decode must be None or 'jpeg', got {decode!r}")
            from pipekit._jpeg_device import JpegDecodeStep

            keys = to_device_kwargs.get("keys", ...)
            self._decode = JpegDecodeStep(size, None if keys is ... else keys, max_pixels, on_error)  # type: ignore
            self.skip_log = self._decode.skip_log
        self.device = torch.device(device)
        self.stage_pinned = stage_pinned
        self.to_device_kwargs = to_device_kwargs
        self._state: Any = None
        self._have_state = False
        # Validate the arguments now rather than at the first batch.
        unknown = set(to_device_kwargs) - _TO_DEVICE_KWARGS
        if unknown:
            raise TypeError(
                f"DeviceLoader: unexpected arguments {sorted(unknown)} (to_device takes {sorted(_TO_DEVICE_KWARGS)})"
            )
        dtype = to_device_kwargs.get("dtype", torch.float32)
        if dtype not in _FLOATS:
            raise TypeError(f"DeviceLoader: dtype must be a floating point type, got {dtype}")

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def _loader_state(self) -> Any:
        sd = getattr(self.loader, "state_dict", None)
        return sd() if callable(sd) else None

    def state_dict(self) -> Any:
        """The wrapped loader's state after the last batch this loader yielded."""
        if self._have_state:
            return self._state
        return self._loader_state()

    def load_state_dict(self, state: Any) -> None:
        load = getattr(self.loader, "load_state_dict", None)
        if not callable(load):
            raise TypeError(f"{type(self.loader).__name__} has no load_state_dict")
        load(state)
        self._have_state = False

    def _convert(self, batch: Any, held: Any = None) -> Any:
        if self._decode is not None:
            if held is None:
                batch, held = self._decode.split(batch)
            batch = self._decode.apply(batch, held, self.device)
            return to_device(batch, self.device, **{**self.to_device_kwargs, "keys": held[0]})
        return to_device(batch, self.device, **self.to_device_kwargs)

    def __iter__(self) -> Iterator[Any]:
        if self.device.type != "cuda":
            yield from self._iter_plain()
        else:
            yield from self._iter_cuda()

    def _iter_plain(self) -> Iterator[Any]:
        it = iter(self.loader)
        while True:
            try:
                batch = next(it)
            except StopIteration:
                break
            self._state, self._have_state = self._loader_state(), True
            yield self._convert(batch)
        self._have_state = False

    def _iter_cuda(self) -> Iterator[Any]:
        # Two side streams: the copies of batch n+1 run on ``copying`` while the conversion of batch n runs on
        # ``converting`` (the copy engine and the SMs work at once), so copies follow each other back to back.
        copying = torch.cuda.Stream(device=self.device)
        converting = torch.cuda.Stream(device=self.device)
        staging = _PinnedRing() if self.stage_pinned else None
        non_blocking = self.to_device_kwargs.get("non_blocking", True)
        it = iter(self.loader)

        def fetch() -> tuple[bool, Any, Any]:
            try:
                host = next(it)
            except StopIteration:
                return False, None, None
            state = self._loader_state()
            held = None
            if self._decode is not None:  # the JPEGs stay on the host, where nvJPEG reads them
                host, held = self._decode.split(host)
            if staging is not None:
                host = staging.stage(host)
            with torch.cuda.stream(copying):
                moved = _move(host, self.device, non_blocking)
            if staging is not None:
                staging.record(copying)  # the staged buffers are free again once these copies finish
            converting.wait_stream(copying)
            if any(t.device.type == "cuda" for t in _tensors(host)):  # made on the GPU by the loader: wait for it
                converting.wait_stream(torch.cuda.current_stream(self.device))
            for t in _tensors(moved):
                if t.device.type == "cuda":
                    t.record_stream(converting)  # made on ``copying``, read on ``converting``
            with torch.cuda.stream(converting):
                ready = self._convert(moved, held)
            return True, ready, state

        ok, current, state = fetch()
        while ok:
            current_stream = torch.cuda.current_stream(self.device)
            current_stream.wait_stream(converting)
            for t in _tensors(current):
                if t.device.type == "cuda":
                    t.record_stream(current_stream)
            self._state, self._have_state = state, True
            ok, nxt, nxt_state = fetch()  # starts copying n+1 before the caller works on n
            yield current
            current, state = nxt, nxt_state
        self._have_state = False


class _PinnedRing:
    """Reusable page-locked staging buffers, ``depth`` per (shape, dtype).

    A buffer is handed out again only after the event recorded after its last
    host-to-device copy has completed, so a copy in flight is never
    overwritten.
    """

    def __init__(self, depth: int = 2, max_shapes: int = 16) -> None:
        self.depth = depth
        self.max_shapes = max_shapes
        self.slots: dict[tuple[Any, ...], list[list[Any]]] = {}
        self.turn: dict[tuple[Any, ...], int] = {}
        self.pending: list[list[Any]] = []

    def _buffer_for(self, t: torch.Tensor) -> torch.Tensor:
        key = (tuple(t.shape), t.dtype)
        ring = self.slots.get(key)
        if ring is None:
            if len(self.slots) >= self.max_shapes:  # variable shapes: drop the oldest
                oldest = next(iter(self.slots))
                for _, event in self.slots.pop(oldest):
                    if event is not None:
                        event.synchronize()
                self.turn.pop(oldest, None)
            ring = self.slots[key] = []
        i = self.turn.get(key, 0)
        if len(ring) < self.depth:
            ring.append([torch.empty(t.shape, dtype=t.dtype, pin_memory=True), None])
            i = len(ring) - 1
        slot = ring[i]
        if slot[1] is not None:
            slot[1].synchronize()
            slot[1] = None
        self.turn[key] = (i + 1) % self.depth
        self.pending.append(slot)
        return slot[0]

    def stage(self, batch: Any) -> Any:
        """``batch`` with each CPU tensor that is not pinned copied into a pinned buffer of the ring."""
        return _map_tensors(batch, self._stage_tensor)

    def _stage_tensor(self, t: torch.Tensor) -> torch.Tensor:
        if t.device.type != "cpu" or t.is_pinned():
            return t
        buf = self._buffer_for(t)
        buf.copy_(t)
        return buf

    def record(self, stream: Any) -> None:
        if not self.pending:
            return
        event = torch.cuda.Event()
        event.record(stream)
        for slot in self.pending:
            slot[1] = event
        self.pending = []


def prefetch_to_device(
    loader: Iterable[Any], device: torch.device | str | int, **to_device_kwargs: Any
) -> DeviceLoader:
    """Functional spelling of :class:`DeviceLoader`."""
    return DeviceLoader(loader, device, **to_device_kwargs)
