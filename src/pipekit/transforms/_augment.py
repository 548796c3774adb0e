"""Sample-dict augmentation on torchvision.transforms.v2, for any number of bands.

:class:`Augment` runs torchvision v2 transforms (and the ones below) on a sample
dict: ``sample["image"]`` becomes a ``tv_tensors.Image``, ``sample["mask"]`` a
``tv_tensors.Mask`` and box entries ``tv_tensors.BoundingBoxes``, so geometric
ops move them together (masks are resampled with nearest neighbour, boxes
follow the corners).  Other entries pass through untouched: plain tensors
(``labels``...) are handed to torchvision as plain tensors, which it leaves as
they are (``SanitizeBoundingBoxes`` can still filter ``labels``), and
non-tensor values (``crs``, ``bounds``, ``transform``) never reach it.
Geometric ops do **not** update georeferencing entries such as ``bounds`` or
``transform``.

Multispectral images (7, 11, 13... bands):

* torchvision's geometric ops (``RandomHorizontalFlip``, ``RandomVerticalFlip``,
  ``RandomAffine``, ``RandomRotation``, ``RandomResizedCrop``, ``RandomCrop``,
  ``ElasticTransform``...) work for any number of bands, as do
  ``GaussianBlur`` and :class:`RandomRot90` here;
* per-band photometric ops here accept any number of bands:
  :class:`RandomBrightness`, :class:`RandomContrast`, :class:`RandomGamma`,
  :class:`RandomGaussianNoise`, :class:`RandomChannelDropout` (and
  ``torchvision``'s ``GaussianBlur``);
* ops that only make sense on RGB (hue, saturation, TrivialAugment's colour
  ops): :class:`RandomHue`, :class:`RandomSaturation`, :class:`ColorJitter`,
  :class:`TrivialAugment` and :class:`RGBOnly` refuse an image that does not
  have exactly 3 bands with an error naming the op and the band count, unless
  told which bands are red, green and blue (``rgb_bands=(r, g, b)``, by
  position, or by name with ``bands=dataset.bands``): then they change those
  three bands only.  torchvision's own RGB-only ops in an :class:`Augment`
  are refused the same way before anything runs.

Value conventions: per-band ops compute in float32 (float64 stays float64).
Integer images are rounded and clamped to their dtype's range (or
``value_range``); float images are clamped only when ``value_range`` is given,
so reflectances above 1 or normalised (negative) values survive.  The RGB ops
call torchvision's kernels on the three bands and follow torchvision's
conventions (floats in 0..1, clamped).

Where things live: this module holds :class:`Augment` (the sample-dict
wrapper) and re-exports the ops, which live in modules of one concern each:
:mod:`~pipekit.transforms._radiometric` (per-band ops),
:mod:`~pipekit.transforms._color` (RGB-band ops), :mod:`~pipekit.transforms._geometric`
(:class:`RandomRot90`) and :mod:`~pipekit.transforms._autoaugment`
(:class:`TrivialAugment`).  Their arithmetic is done by the kernels of
:mod:`pipekit.transforms.functional`, shared with the batch ops of
:mod:`pipekit.transforms.batch_augment`.

Randomness: an :class:`Augment` draws every random parameter from its own
:class:`~pipekit.transforms.seeding.RandomStream` (torch's global RNG is swapped
for the stream during the call and restored after), so each DataLoader worker
and rank has its own reproducible stream; see :mod:`pipekit.transforms.seeding`.
The ops used on their own draw from torch's global RNG, like torchvision's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch import Tensor, nn
from torchvision import tv_tensors

from pipekit.transforms._autoaugment import TrivialAugment
from pipekit.transforms._color import ColorJitter, RandomHue, RandomSaturation, RGBOnly
from pipekit.transforms._common import DEFAULT_BOX_KEYS
from pipekit.transforms._geometric import RandomRot90
from pipekit.transforms._radiometric import (
    RandomBrightness,
    RandomChannelDropout,
    RandomContrast,
    RandomGamma,
    RandomGaussianNoise,
)
from pipekit.transforms._tv import _plain
from pipekit.transforms.seeding import RandomStream

__all__ = [
    "Augment",
    "ColorJitter",
    "RGBOnly",
    "RandomBrightness",
    "RandomChannelDropout",
    "RandomContrast",
    "RandomGamma",
    "RandomGaussianNoise",
    "RandomHue",
    "RandomRot90",
    "RandomSaturation",
    "TrivialAugment",
    "DEFAULT_BOX_KEYS",
]


_TV_RGB_ONLY: dict[str, str] = {
    "ColorJitter": "pipekit.transforms.ColorJitter (brightness/contrast per band, saturation/hue on rgb_bands)",
    "RandomPhotometricDistort": "pipekit.transforms.ColorJitter, or RGBOnly(...)",
    "TrivialAugmentWide": "pipekit.transforms.TrivialAugment(rgb_bands=...)",
    "RandAugment": "pipekit.transforms.TrivialAugment(rgb_bands=...)",
    "AutoAugment": "pipekit.transforms.TrivialAugment(rgb_bands=...)",
    "AugMix": "pipekit.transforms.TrivialAugment(rgb_bands=...)",
    "RandomGrayscale": "pipekit.transforms.RGBOnly(RandomGrayscale(...), rgb_bands=...)",
    "Grayscale": "pipekit.transforms.RGBOnly(Grayscale(3), rgb_bands=...)",
    "RandomAutocontrast": "pipekit.transforms.RGBOnly(RandomAutocontrast(...), rgb_bands=...)",
    "RandomAdjustSharpness": "pipekit.transforms.RGBOnly(RandomAdjustSharpness(...), rgb_bands=...)",
    "RGB": "nothing: the image is already multi-band",
}


def _rgb_only_ops(transform: Any) -> list[str]:
    """Names of torchvision ops inside ``transform`` that accept only 1- or 3-band images."""
    if isinstance(transform, RGBOnly):
        return []
    found: list[str] = []
    cls = type(transform)
    if cls.__module__.startswith("torchvision.") and cls.__name__ in _TV_RGB_ONLY:
        found.append(cls.__name__)
    inner = getattr(transform, "transforms", None)
    if isinstance(inner, (list, tuple, nn.ModuleList)):
        for t in inner:
            found.extend(_rgb_only_ops(t))
    return found


def _op_name(op: Any) -> str:
    return type(op).__name__ if not isinstance(op, type) else op.__name__


class Augment(nn.Module):
    """Apply transforms to a sample dict with its image, masks and boxes moving together.

    Args:
        transforms: a transform or a list of them, applied in order:
            torchvision v2 transforms, the ops of this module, or any callable
            taking and returning the dict of ``tv_tensors``.
        image_key: the entry holding the image ``[C, H, W]`` (or a batch
            ``[B, C, H, W]``: then every image of it gets the same parameters;
            use :mod:`pipekit.transforms.batch_augment` for per-sample ones).
        mask_keys: entries holding masks (``[H, W]`` or ``[K, H, W]``).
        box_keys: entries holding boxes ``[N, 4]``, with their format
            (``"XYXY"``, ``"XYWH"``, ``"CXCYWH"``); default
            :data:`DEFAULT_BOX_KEYS`.
        seed: the stream's seed (see :mod:`pipekit.transforms.seeding`);
            ``None`` derives one from the DataLoader worker's seed, or from
            torch's global RNG in the main process.

    Called with a dict, returns a new dict with the image, masks and boxes
    transformed (as plain tensors) and every other entry as it was.  Called
    with a tensor, treats it as the image and returns a tensor.

    Example:
        >>> import torch
        >>> from torchvision.transforms import v2
        >>> from pipekit.transforms import Augment, RandomBrightness, RandomRot90
        >>> aug = Augment([v2.RandomHorizontalFlip(p=1.0), RandomRot90(k=(2,)), RandomBrightness(0.1)], seed=0)
        >>> image = torch.arange(4.0).reshape(1, 2, 2).expand(7, 2, 2) / 10  # 7 bands
        >>> mask = (image[0] > 0.15).long()
        >>> mask.tolist()
        [[0, 0], [1, 1]]
        >>> out = aug({"image": image, "mask": mask, "crs": "EPSG:32632"})
        >>> out["mask"].tolist(), out["image"].shape, out["crs"]
        ([[1, 1], [0, 0]], torch.Size([7, 2, 2]), 'EPSG:32632')
    """

    def __init__(
        self,
        transforms: Callable[[Any], Any] | Sequence[Callable[[Any], Any]],
        *,
        image_key: str = "image",
        mask_keys: Sequence[str] = ("mask",),
        box_keys: Mapping[str, str] | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        ops = list(transforms) if isinstance(transforms, (list, tuple, nn.ModuleList)) else [transforms]
        for i, op in enumerate(ops):
            if not callable(op):
                raise TypeError(f"Augment: transform {i} is not callable ({type(op).__name__})")
        if not isinstance(image_key, str):
            raise TypeError(f"Augment: image_key must be a str, got {image_key!r}")
        if isinstance(mask_keys, str):
            mask_keys = (mask_keys,)
        box_keys = dict(DEFAULT_BOX_KEYS if box_keys is None else box_keys)
        for k, fmt in box_keys.items():
            if str(fmt).upper() not in ("XYXY", "XYWH", "CXCYWH"):
                raise ValueError(f"Augment: box format of {k!r} must be XYXY, XYWH or CXCYWH, got {fmt!r}")
        self.ops = ops
        self.image_key = image_key
        self.mask_keys = tuple(mask_keys)
        self.box_keys = {k: str(v).upper() for k, v in box_keys.items()}
        self.stream = RandomStream(seed)
        self._rgb_only = [name for op in ops for name in _rgb_only_ops(op)]

    def extra_repr(self) -> str:
        return "\n".join(repr(op) for op in self.ops)

    def forward(self, sample: Any) -> Any:
        return self.apply(sample, self.stream)

    def apply(self, sample: Any, stream: RandomStream) -> Any:
        """Transform ``sample`` drawing random parameters from ``stream`` (used by the ``augment`` pipe)."""
        if isinstance(sample, Tensor):
            return self.apply({self.image_key: sample}, stream)[self.image_key]
        if not isinstance(sample, Mapping):
            raise TypeError(f"Augment: expects a sample dict or an image tensor, got {type(sample).__name__}")
        if self.image_key not in sample:
            raise KeyError(f"Augment: the sample has no {self.image_key!r} entry (keys: {sorted(map(str, sample))})")
        image = sample[self.image_key]
        if not isinstance(image, Tensor) or image.dim() < 3:
            shape = tuple(image.shape) if isinstance(image, Tensor) else type(image).__name__
            raise ValueError(f"Augment: sample[{self.image_key!r}] must be a [C, H, W] tensor, got {shape}")
        channels = int(image.shape[-3])
        if self._rgb_only and channels not in (1, 3):
            names = sorted(set(self._rgb_only))
            hints = "; ".join(f"for {n} use {_TV_RGB_ONLY[n]}" for n in names)
            raise ValueError(
                f"Augment: torchvision's {', '.join(names)} only accept(s) 1- or 3-band images, but "
                f"sample[{self.image_key!r}] has {channels} bands; {hints}"
            )
        height, width = int(image.shape[-2]), int(image.shape[-1])
        data: dict[str, Any] = {self.image_key: tv_tensors.Image(image)}
        for key, value in sample.items():
            if key == self.image_key or not isinstance(value, Tensor):
                continue
            if key in self.mask_keys:
                data[key] = tv_tensors.Mask(value)
            elif key in self.box_keys:
                if value.dim() != 2 or value.shape[-1] != 4:
                    raise ValueError(f"Augment: sample[{key!r}] must hold boxes as [N, 4], got {tuple(value.shape)}")
                data[key] = tv_tensors.BoundingBoxes(value, format=self.box_keys[key], canvas_size=(height, width))
            else:
                data[key] = value  # plain tensors pass through torchvision untouched
        with stream.torch_global():
            for i, op in enumerate(self.ops):
                try:
                    data = op(data)
                except (TypeError, ValueError) as exc:
                    text = str(exc)
                    if "channel" in text and ("1 or 3" in text or "must be 1 or 3" in text):
                        raise ValueError(
                            f"Augment: step {i} ({_op_name(op)}) accepts only 1- or 3-band images, but the image "
                            f"has {channels} bands: {text}"
                        ) from exc
                    _note(exc, f"in Augment step {i} ({_op_name(op)})")
                    raise
                except Exception as exc:
                    _note(exc, f"in Augment step {i} ({_op_name(op)})")
                    raise
                if not isinstance(data, Mapping) or self.image_key not in data:
                    raise TypeError(f"Augment: step {i} ({_op_name(op)}) did not return the sample dict")
        out = dict(sample)
        for key, value in data.items():
            out[key] = _plain(value) if isinstance(value, Tensor) else value
        return out


def _note(exc: BaseException, message: str) -> None:
    if hasattr(exc, "add_note"):
        exc.add_note(message)
