"""``datasets.ImageFolder``: class-per-folder image classification as a ready pipeline.

The layout is torchvision's ``ImageFolder``'s::

    root/circle/img_0001.jpg
    root/circle/more/img_0002.png      (sub-folders belong to their top folder's class)
    root/square/img_0003.jpg

on a local disk or anywhere fsspec reaches (``s3://bucket/train`` with
``storage_options``).  The recipe lists the files once, when it is built, and
streams them through::

    ListSource(files)          the whole list shuffled per epoch (train), before anything is read
    -> sharding_filter         each file to one DataLoader worker / distributed rank
    -> open_files_by_fsspec    (url, stream)
    -> decode_image            (url, uint8 [3, H, W])
    -> {"image", "label", "url"}
    -> transforms              RandomResizedCrop + flip [+ TrivialAugmentWide] | Resize + CenterCrop
    -> batch + collate         {"image": uint8 [B, 3, size, size], "label": int64 [B], "url": [B urls]}
       (or bucketbatch by aspect ratio)

Images stay ``uint8`` all the way: :class:`pipekit.device.DeviceLoader` (or
:func:`~pipekit.device.to_device`) copies the compact batch to the GPU and
converts and normalises it there.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

import pipekit.pipes  # noqa: F401  (registers the functional names used below)
from pipekit._fs import list_class_folders
from pipekit._validate import check_callable
from pipekit.collate import collate
from pipekit.datasets._recipe import (
    ApplyToKey,
    ListSource,
    Recipe,
    check_positive_int,
    check_stage,
    standard_image_transforms,
)
from pipekit.pipes.base import IterDataPipe

__all__ = ["ImageFolder", "IMG_EXTENSIONS", "collate_by_aspect"]

#: torchvision's ``IMG_EXTENSIONS`` (compared case-insensitively).
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")

_MAX_ASPECT = 2.0
_ASPECT_STEP = 16


def _list_classes(
    root: str, extensions: tuple[str, ...], storage_options: Mapping[str, Any], allow_empty: bool
) -> tuple[str, list[str], list[tuple[str, int]]]:
    """``(prefix, classes, [(url, label)])``: class folders of ``root`` (sorted) and their image files (sorted)."""
    listing = list_class_folders(root, storage_options, "ImageFolder", absolute=True)
    files: list[tuple[str, int]] = []
    for label, name in enumerate(listing.classes):
        found = [f for f in listing.files[name] if f.lower().endswith(extensions)]
        files.extend((f, label) for f in found)
        if not (found or allow_empty):
            _missing_images(root, name, extensions)
    return listing.prefix, listing.classes, files


def _missing_images(root: str, name: str, extensions: tuple[str, ...]) -> None:
    raise FileNotFoundError(
        f"ImageFolder: class folder {name!r} of {root!r} has no image files "
        f"(extensions {', '.join(extensions)}); remove it or pass allow_empty=True"
    )


class _ListedFiles(ListSource):
    """The recipe's files, shuffled per epoch; its checkpoint also records the listing its positions count.

    The files are listed when the recipe is built, so a resumed run works on a new listing: a file added or
    deleted since the checkpoint would shift every position after it (files repeated, others never read).
    The checkpoint keeps :func:`pipekit._fs.listing_record` of the list (a digest, the count and the names,
    compressed), and restoring it on another listing raises :class:`~pipekit.errors.ReadError` naming the
    files added and gone (:class:`~pipekit.datasets._recipe.ListSource`'s ``listing``).  A file whose
    contents changed under the same name is read afresh: each file is read whole, so no position points
    inside one.
    """

    def __init__(self, items: Sequence[str], shuffle: bool, root: str) -> None:
        super().__init__(items, shuffle=shuffle, listing=("ImageFolder", root, "image files"))
        self.root = root


class _ToSample:
    """``(url, image) -> {"image", "label", "url"}``, the label from the url's class folder."""

    def __init__(self, prefix: str, class_to_idx: Mapping[str, int]) -> None:
        self.prefix = prefix
        self.class_to_idx = dict(class_to_idx)

    def __call__(self, item: tuple[str, Any]) -> dict[str, Any]:
        url, image = item
        if not url.startswith(self.prefix):
            raise ValueError(f"ImageFolder: {url!r} is not under the root {self.prefix!r}")
        rest = url[len(self.prefix):].replace(os.sep, "/")
        name = rest.split("/", 1)[0]
        try:
            label = self.class_to_idx[name]
        except KeyError:
            raise ValueError(f"ImageFolder: {url!r} is not in a class folder of {self.prefix!r}") from None
        return {"image": image, "label": label, "url": url}


class _AspectResize:
    """Resize a ``[C, H, W]`` image to its aspect bucket: shorter side ``size``, longer side a multiple of 16.

    The aspect ratio is clamped to 1:2..2:1, so extreme panoramas are squeezed.
    """

    def __init__(self, size: int) -> None:
        self.size = size

    def shape(self, height: int, width: int) -> tuple[int, int]:
        ratio = min(max(width / max(height, 1), 1 / _MAX_ASPECT), _MAX_ASPECT)
        long_ratio = ratio if ratio >= 1 else 1 / ratio
        long_side = max(self.size, round(self.size * long_ratio / _ASPECT_STEP) * _ASPECT_STEP)
        return (self.size, long_side) if ratio >= 1 else (long_side, self.size)

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        from torchvision.transforms.v2 import functional as F

        h, w = int(image.shape[-2]), int(image.shape[-1])
        target = self.shape(h, w)
        if (h, w) == target:
            return image
        return F.resize(image, list(target), antialias=True)

    def __repr__(self) -> str:
        return f"AspectResize(size={self.size})"


def _sort_by_shape(bucket: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``bucketbatch``'s ``sort_key``: samples with the same image shape next to each other."""
    return sorted(bucket, key=lambda s: (int(s["image"].shape[-2]), int(s["image"].shape[-1])))


def collate_by_aspect(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Collate samples whose images may differ in shape: resize the odd ones to the batch's most common shape.

    After ``bucketbatch`` sorted a bucket by shape, almost every batch holds
    one shape; a batch that straddles two aspect buckets is resized to the
    shape most of its images have (ties: the first), then collated with
    :func:`pipekit.collate.collate`.

    Example:
        >>> import torch
        >>> from pipekit.datasets._imagefolder import collate_by_aspect
        >>> samples = [{"image": torch.zeros(3, 32, 48, dtype=torch.uint8), "label": 0},
        ...            {"image": torch.zeros(3, 32, 48, dtype=torch.uint8), "label": 1},
        ...            {"image": torch.zeros(3, 32, 32, dtype=torch.uint8), "label": 2}]
        >>> batch = collate_by_aspect(samples)
        >>> batch["image"].shape, batch["label"].tolist()
        (torch.Size([3, 3, 32, 48]), [0, 1, 2])
    """
    samples = list(samples)
    if not samples:
        raise ValueError("collate_by_aspect: cannot collate an empty batch")
    shapes = [tuple(s["image"].shape[-2:]) for s in samples]
    target = Counter(shapes).most_common(1)[0][0]
    if any(shape != target for shape in shapes):
        from torchvision.transforms.v2 import functional as F

        samples = [
            s if tuple(s["image"].shape[-2:]) == target else {**s, "image": F.resize(s["image"], list(target),
                                                                                   antialias=True)}
            for s in samples
        ]
    return collate(samples)


class ImageFolder(Recipe):
    """Class-per-folder image classification, from a local folder or any fsspec URL, ready for a DataLoader.

    Labels are the indices of the sorted class folder names (:attr:`classes`,
    :attr:`class_to_idx`, as torchvision's ``ImageFolder``).  Files are listed
    once, when the recipe is built; in training they are shuffled as a whole
    list each epoch *before* anything is read (a checkpoint stores the epoch's
    seed and position, and a record of the listing: resuming on a folder
    where files were added or deleted since raises
    :class:`~pipekit.errors.ReadError` naming them), then split between DataLoader workers and
    distributed ranks by ``sharding_filter``, so each file is read once per
    epoch.  Batches are dicts ``{"image": uint8 [B, 3, size, size],
    "label": int64 [B], "url": [B urls]}``; convert and normalise the images
    on the device with :class:`pipekit.device.DeviceLoader`.

    Training applies ``RandomResizedCrop(size)`` and a horizontal flip (and
    ``TrivialAugmentWide`` with ``trivial_augment=True``) through the
    ``augment`` pipe, whose random stream is seeded per worker and rank and
    saved in checkpoints; evaluation applies ``Resize(size / 0.875)`` and
    ``CenterCrop(size)``.

    Every stage can be replaced:

    Args:
        root: the folder of class folders: a local path or an fsspec URL.
        train: training (shuffling, random augmentation) or evaluation
            (file order, deterministic resize and crop).
        size: output side in pixels (or ``(height, width)``).
        batch_size: samples per batch; ``None`` yields samples, unbatched.
        trivial_augment: add ``TrivialAugmentWide`` to the training transforms.
        bucket_by_aspect: keep each image's aspect ratio instead of cropping
            it square: every image is resized to its aspect bucket (shorter
            side ``size``, longer side a multiple of 16, at most twice the
            shorter), buckets of ``batch_size * bucket_batches`` samples are
            sorted by shape with ``bucketbatch``, and :func:`collate_by_aspect`
            stacks each batch (needs ``batch_size``).  Buffered samples are
            decoded images, so checkpoints grow with ``bucket_batches``.
        bucket_batches: batches per sorting bucket with ``bucket_by_aspect``.
        shuffle: shuffle the files each epoch (default: ``train``).
        drop_last: drop each worker's last, shorter batch.
        scale, ratio: ``RandomResizedCrop``'s ranges (training).
        resize: evaluation's resize of the shorter side (default ``size / 0.875``).
        extensions: file extensions that are images (case-insensitive).
        allow_empty: accept class folders without images (else ``FileNotFoundError``).
        storage_options: fsspec options for remote roots (s3fs spelling for S3).
        image_mode: the channels images are decoded to (``"RGB"``; ``None`` keeps each file's).
        on_error: ``"raise"`` or ``"skip"`` undecodable images (recorded in the
            ``decode_image`` pipe's ``skip_log``).
        decode: replaces the decoding stage: a function ``decode(pipe) -> pipe``
            from ``(url, stream)`` items to ``(url, image)`` items, e.g.
            ``lambda p: p.decode_image(mode="RGB").map(my_fix)`` (it is called
            once, while the recipe is built; the pipes it returns must pickle).
        transform: replaces the image transforms: a picklable callable
            ``image -> image`` (e.g. a ``torchvision.transforms.v2.Compose``), or
            ``False`` for none (then images keep their decoded size).  Random
            ops in it draw from torch's global RNG in each worker, which
            checkpoints do not record (the default transforms' stream is).
        collate_fn: replaces the collate function (a list of sample dicts -> a batch).

    Attributes:
        classes: the class names, sorted.
        class_to_idx: ``{class name: label}``.
        samples: ``[(url, label)]`` of every file, in listing order (built on access).
        targets: the labels of :attr:`samples`.

    Raises:
        FileNotFoundError: ``root`` does not exist, has no class folders, or a
            class folder has no images (names them).

    Example:
        >>> import tempfile
        >>> import torch
        >>> import pipekit
        >>> from pipekit import datasets
        >>> from pipekit.synthetic import write_image_folder
        >>> root = write_image_folder(tempfile.mkdtemp(), per_class=3, size=40, progress=False)
        >>> train = datasets.ImageFolder(root, train=True, size=32, batch_size=4)
        >>> train.classes
        ['circle', 'square', 'stripes', 'triangle']
        >>> _ = torch.manual_seed(0)
        >>> batch = next(iter(pipekit.DataLoader(train, num_workers=0)))
        >>> batch["image"].shape, batch["image"].dtype, batch["label"].dtype
        (torch.Size([4, 3, 32, 32]), torch.uint8, torch.int64)
        >>> val = datasets.ImageFolder(root, train=False, size=32, batch_size=None)
        >>> [s["label"] for s in val][:4]
        [0, 0, 0, 1]
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        train: bool = True,
        size: int | tuple[int, int] = 224,
        batch_size: int | None = 32,
        trivial_augment: bool = False,
        bucket_by_aspect: bool = False,
        bucket_batches: int = 8,
        shuffle: bool | None = None,
        drop_last: bool = False,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        resize: int | None = None,
        extensions: Sequence[str] = IMG_EXTENSIONS,
        allow_empty: bool = False,
        storage_options: Mapping[str, Any] | None = None,
        image_mode: Any = "RGB",
        on_error: str = "raise",
        decode: Callable[[IterDataPipe], IterDataPipe] | None = None,
        transform: Callable[[Any], Any] | bool | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
    ) -> None:
        super().__init__()
        where = "ImageFolder"
        if not isinstance(root, (str, os.PathLike)):
            raise TypeError(f"{where}: root must be a path or URL, got {type(root).__name__}")
        root = os.fspath(root)
        if storage_options is not None and not isinstance(storage_options, Mapping):
            raise TypeError(f"{where}: storage_options must be a dict, got {type(storage_options).__name__}")
        if isinstance(extensions, str) or not all(isinstance(e, str) for e in extensions):
            raise TypeError(f"{where}: extensions must be a list of strings such as '.jpg', got {extensions!r}")
        exts = tuple(e.lower() if e.startswith(".") else "." + e.lower() for e in extensions)
        if not exts:
            raise ValueError(f"{where}: extensions must not be empty")
        batch_size = check_positive_int(batch_size, "batch_size", where, allow_none=True)
        bucket_batches = check_positive_int(bucket_batches, "bucket_batches", where)
        if decode is not None and not callable(decode):
            raise TypeError(f"{where}: decode must be a function pipe -> pipe, got {decode!r}")
        if transform is True:
            transform = None
        check_stage(transform, "transform", where)
        check_callable(collate_fn, "collate_fn", where)
        if bucket_by_aspect and batch_size is None:
            raise ValueError(f"{where}: bucket_by_aspect=True batches by aspect ratio, so it needs a batch_size")
        if bucket_by_aspect and isinstance(size, (tuple, list)):
            raise ValueError(f"{where}: bucket_by_aspect=True takes an int size (the shorter side), got {size!r}")

        self.root = root
        self.train = bool(train)
        self.size = size
        self.batch_size = batch_size
        self.storage_options = dict(storage_options or {})
        prefix, classes, files = _list_classes(root, exts, self.storage_options, bool(allow_empty))
        if not classes:
            raise FileNotFoundError(f"{where}: {root!r} has no class folders (expected root/<class>/<image>)")
        if not files:
            raise FileNotFoundError(f"{where}: no image files (extensions {', '.join(exts)}) under {root!r}")
        self.classes: list[str] = classes
        self.class_to_idx: dict[str, int] = {name: i for i, name in enumerate(classes)}
        self.targets: list[int] = [label for _, label in files]
        source = _ListedFiles([url for url, _ in files], self.train if shuffle is None else shuffle, root)
        self._urls: list[str] = source.items  # the source's own list: pickled to workers once

        pipe: IterDataPipe = source
        pipe = pipe.sharding_filter()
        pipe = pipe.open_files_by_fsspec(mode="rb", storage_options=self.storage_options or None)
        if decode is None:
            pipe = pipe.decode_image(mode=image_mode, on_error=on_error)
        else:
            pipe = decode(pipe)
            if not isinstance(pipe, IterDataPipe):
                raise TypeError(f"{where}: decode must return a pipe, got {type(pipe).__name__}")
        pipe = pipe.map(_ToSample(prefix, self.class_to_idx))

        if transform is None:
            if bucket_by_aspect:
                pipe = pipe.map(ApplyToKey(_AspectResize(int(size)), "image"))  # type: ignore[arg-type]
                ops: list[Any] = []
                if self.train:
                    from torchvision.transforms import v2

                    ops.append(v2.RandomHorizontalFlip())
                    if trivial_augment:
                        ops.append(v2.TrivialAugmentWide())
            else:
                ops = standard_image_transforms(size, self.train, trivial_augment=trivial_augment, scale=scale,
                                                ratio=ratio, resize=resize, where=where)
            if self.train:
                pipe = pipe.augment(ops, mask_keys=())
            elif ops:
                pipe = pipe.map(ApplyToKey(ops, "image"))
        elif transform is not False:
            pipe = pipe.map(ApplyToKey(transform, "image"))

        if batch_size is not None:
            if bucket_by_aspect:
                pipe = pipe.bucketbatch(batch_size, drop_last=drop_last, batch_num=bucket_batches,
                                        sort_key=_sort_by_shape, use_in_batch_shuffle=not self.train)
                pipe = pipe.collate(collate_fn=collate_fn or collate_by_aspect)
            else:
                pipe = pipe.batch(batch_size, drop_last=drop_last).collate(collate_fn=collate_fn or collate)
        self.source_datapipe = pipe

    @property
    def samples(self) -> list[tuple[str, int]]:
        """``[(url, label)]`` of every file, in listing order (a new list each time)."""
        return list(zip(self._urls, self.targets))

    def __repr__(self) -> str:
        mode = "train" if self.train else "eval"
        return (f"ImageFolder({self.root!r}, {mode}, {len(self.classes)} classes, {len(self._urls)} images, "
                f"size={self.size}, batch_size={self.batch_size})")

    __str__ = __repr__

