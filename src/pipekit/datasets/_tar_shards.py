"""``datasets.TarShards`` (alias ``datasets.WebDataset``): WebDataset tar shards, local or on S3, as a ready pipeline.

Shards are tar files whose members are grouped into samples by name
(``0001.jpg`` + ``0001.cls`` -> ``{"__key__": ".../0001", ".jpg": ..., ".cls": ...}``).
The recipe::

    ListSource(shards)        shard list shuffled per epoch (train), before sharding_filter
    -> sharding_filter        each shard to one DataLoader worker / distributed rank
    -> open_files_by_fsspec   (url, stream), with storage_options for S3 (with cache_dir: from a
                              local copy of each remote shard, made on first use)
    -> load_tar_samples       sample dicts of the members' bytes (load_from_tar + webdataset + reading
                              the members, in one pipe), so the shuffle buffer (and a checkpoint
                              of it) holds no open streams; never extracted to disk
    -> shuffle                sample-level buffer (train)
    [-> threadpool_map        with decode_threads=: the images decoded on a thread pool, in order]
    -> decode                 by extension: .jpg/.png -> uint8 [C, H, W], .cls -> int, .json -> dict, ...
    [-> resize/crop images    with size=: RandomResizedCrop + flip (train) | Resize + CenterCrop]
    [-> transform]
    [-> batch + collate]

Not to be confused with the ``webdataset`` *pipe*
(:class:`pipekit.pipes.WebDataset`, torchdata's ``WebDataset``), whose grouping
``load_tar_samples`` (:class:`pipekit.pipes.TarSampleLoader`) does here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

import pipekit.pipes  # noqa: F401  (registers the functional names used below)
from pipekit import _fast
from pipekit._fs import redact_url, url_to_fs
from pipekit._validate import check_callable, check_int
from pipekit.collate import collate
from pipekit.datasets._recipe import (
    ListSource,
    Recipe,
    check_positive_int,
    check_stage,
    standard_image_transforms,
)
from pipekit.datasets._shard_cache import CachedShardOpener
from pipekit.pipes._decode import Decoder
from pipekit.pipes._missing import explain_unexpected_keywords
from pipekit.pipes._sample_transforms import Augmenter
from pipekit.pipes._shard_sources import PipeOpener, ResampledShardList, check_pipe_url, is_pipe_url
from pipekit.pipes._webdataset import shard_expand
from pipekit.pipes.base import IterDataPipe

__all__ = ["TarShards", "WebDataset", "expand_shard_urls"]

_TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")


def _has_magic(text: str) -> bool:
    return any(c in text for c in "*?[")


def expand_shard_urls(
    urls: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], storage_options: Mapping[str, Any] | None = None
) -> list[str]:
    """The shard URLs that ``urls`` stand for, in order.

    Each entry is

    * a brace pattern (``"s3://b/train-{000000..000099}.tar"``), expanded
      without asking the storage (:func:`~pipekit.pipes._webdataset.shard_expand`);
    * a tar file's path or URL, kept as is;
    * a glob (``"data/*.tar"``) or a folder / prefix (``"s3://b/train/"``),
      listed with fsspec: its tar files (``.tar``, ``.tar.gz``, ``.tgz``...), sorted
      (a glob matching nothing that is the name of a tar file, ``shard[1].tar``, is that file);
    * a ``pipe:CMD ARGS`` URL (the ``webdataset`` library's), brace-expanded only;
      shell syntax in it raises ``ValueError`` naming the URL.

    Raises ``FileNotFoundError`` when a glob or folder holds no tar file.

    Example:
        >>> from pipekit.datasets._tar_shards import expand_shard_urls
        >>> expand_shard_urls(["s3://bucket/a-{0..2}.tar", "s3://bucket/b.tar"])
        ['s3://bucket/a-0.tar', 's3://bucket/a-1.tar', 's3://bucket/a-2.tar', 's3://bucket/b.tar']
    """
    if isinstance(urls, (str, os.PathLike)):
        urls = [urls]
    if not isinstance(urls, Sequence) or not urls:
        raise TypeError(f"TarShards: urls must be a shard URL/pattern or a non-empty list of them, got {urls!r}")
    out: list[str] = []
    for entry in urls:
        if not isinstance(entry, (str, os.PathLike)):
            raise TypeError(f"TarShards: a shard URL must be a str, got {type(entry).__name__}: {entry!r}")
        for url in shard_expand(os.fspath(entry)):
            if is_pipe_url(url):
                check_pipe_url(url, "TarShards")  # refused now, naming the URL, not when a worker runs it
                out.append(url)
            elif url.lower().endswith(_TAR_SUFFIXES) and not _has_magic(url):
                out.append(url)
            else:
                out.extend(_list_tars(url, dict(storage_options or {})))
    return out


def _list_tars(url: str, storage_options: dict[str, Any]) -> list[str]:

    local = "://" not in url
    fs, path = url_to_fs(url, storage_options)
    if _has_magic(path):
        found = [p for p in fs.glob(path) if p.lower().endswith(_TAR_SUFFIXES)]
        if not found and path.lower().endswith(_TAR_SUFFIXES) and fs.isfile(path):
            found = [path]  # a shard whose name holds glob characters (shard[1].tar) that match nothing else
    elif fs.isdir(path):
        found = [p for p in fs.find(path.rstrip("/")) if p.lower().endswith(_TAR_SUFFIXES)]
    elif fs.exists(path):
        raise ValueError(f"TarShards: {url!r} is not a tar file (expected {', '.join(_TAR_SUFFIXES)})")
    else:
        raise FileNotFoundError(f"TarShards: no such shard, folder or prefix: {url!r}")
    if not found:
        raise FileNotFoundError(f"TarShards: no tar shards in {url!r}")
    return sorted(p if local else fs.unstrip_protocol(p) for p in found)


class _ImageOps:
    """Apply image ops to ``sample[key]`` (evaluation's resize/crop), naming the sample when it lacks the key."""

    def __init__(self, ops: list[Any], key: str) -> None:
        self.ops = ops
        self.key = key

    def __call__(self, sample: Mapping[str, Any]) -> dict[str, Any]:
        if self.key not in sample:
            raise KeyError(
                f"TarShards: sample {sample.get('__key__')!r} has no {self.key!r} entry "
                f"(it has {sorted(k for k in sample if not k.startswith('__'))}); pass image_key="
            )
        value = sample[self.key]
        for op in self.ops:
            value = op(value)
        return {**sample, self.key: value}


class _ThreadDecode:
    """``threadpool_map``'s function for ``decode_threads``: a sample with its image entry decoded.

    The handler is the one the decode stage after the pool would use for that
    key (the same ``image_mode``), so the image is the same tensor.  A sample
    whose image fails to decode comes back with its bytes untouched: the
    decode stage then decodes them again in the loop and raises (the same
    :class:`~pipekit.errors.DecodeError`, naming the member and the stage) or
    skips and counts it, exactly as without threads.
    """

    def __init__(self, handler: Callable[[bytes], Any], key: str) -> None:
        self.handler, self.key = handler, key

    def __call__(self, sample: Any) -> Any:
        if type(sample) is not dict:
            return sample
        raw = sample.get(self.key)
        if type(raw) is not bytes:
            return sample
        try:
            image = self.handler(raw)
        except Exception:  # decoded again by the decode stage, which reports or skips it
            return sample
        return {**sample, self.key: image}


def _note(exc: BaseException, message: str) -> None:
    if hasattr(exc, "add_note"):  # Python >= 3.11
        exc.add_note(message)


class _ImageAugmenter(Augmenter):
    """``augment`` for TarShards' training ops: the same pipe, run on the plain image tensor.

    The recipe's ops (``RandomResizedCrop``, flip, ``TrivialAugmentWide``) are
    torchvision v2 transforms that touch only the image.  For a sample whose
    image is a ``[1 or 3, H, W]`` tensor and which holds no other tensor (the
    usual ``{"__key__", ".jpg", ".cls"}``), they run on the tensor itself
    inside the pipe's random stream, skipping :class:`~pipekit.transforms.Augment`'s
    ``tv_tensors`` dict (wrapping, flattening and unwrapping the sample costs
    ~80 µs a sample, 3% of a JPEG's decode + crop).  torchvision draws the
    same parameters and runs the same kernels for a plain tensor as for a
    lone ``tv_tensors.Image``, so the images are the same, and the stream,
    seeding and checkpoint are ``augment``'s.  Any other sample (other
    tensors, other shapes, a missing key) goes through ``Augment`` as before,
    with its checks and messages.

    When the ops are exactly ``RandomResizedCrop`` and flips (the recipe
    without ``trivial_augment``), they run as :func:`~pipekit.transforms._direct.direct_image_ops`
    steps: the same draws, taken from the stream's own ``torch.Generator``
    instead of swapping torch's global RNG for each sample, and the same
    kernels, so the same images and stream positions (checkpoints).
    """

    def __init__(self, source_datapipe: IterDataPipe, ops: list[Any], image_key: str) -> None:
        from pipekit.transforms._direct import direct_image_ops

        super().__init__(source_datapipe, ops, image_key=image_key, mask_keys=())
        self.image_ops = list(ops)
        self.image_key = image_key
        # the crop and flips straight from the stream's generator, without swapping torch's global RNG
        # (fast path "direct_image_ops", pipekit._fast; off: torchvision's transforms under the stream's RNG)
        self._direct = direct_image_ops(self.image_ops) if _fast.enabled("direct_image_ops") else None

    def _plain_image(self, item: Any) -> Any:
        """The image of ``item`` when the plain-tensor path applies to it, else ``None``."""
        if type(item) is not dict:
            return None
        image = item.get(self.image_key)
        if type(image) is not torch.Tensor or image.dim() != 3 or image.shape[0] not in (1, 3):
            return None
        for key, value in item.items():
            if key != self.image_key and isinstance(value, torch.Tensor):
                return None
        return image

    def _run_ops(self, image: torch.Tensor) -> torch.Tensor:
        ops, stream, i = self.image_ops, self._stream, 0
        try:
            if self._direct is not None:
                g = stream.generator()
                for i, step in enumerate(self._direct):  # noqa: B007  (i names the step in errors)
                    image = step(image, g)
            else:
                with stream.torch_global():
                    for i, op in enumerate(ops):  # noqa: B007
                        image = op(image)
        except Exception as exc:
            _note(exc, f"in Augment step {i} ({type(ops[i]).__name__}), in augment")
            raise
        return image

    def __iter__(self) -> Iterator[Any]:
        key, stream = self.image_key, self._stream
        for item in self.source_datapipe:
            image = self._plain_image(item)
            if image is None:
                try:
                    out = self.transform.apply(item, stream)
                except Exception as exc:
                    _note(exc, "in augment")
                    raise
                yield out
                continue
            yield {**item, key: self._run_ops(image)}


class TarShards(Recipe):
    """Samples from WebDataset tar shards (local, S3 or any fsspec URL), shuffled, decoded, batched.

    Also available as ``datasets.WebDataset``, after the ``webdataset``
    library's class it replaces (not the pipe :class:`pipekit.pipes.WebDataset`,
    torchdata's ``webdataset``).  Archive members are grouped into samples and
    read as bytes in one step, :class:`pipekit.pipes.TarSampleLoader`
    (``load_tar_samples``): the samples of ``load_from_tar().webdataset()``.

    In training the shard list is shuffled each epoch before
    ``sharding_filter`` hands each shard to one DataLoader worker / rank (so
    use at least as many shards as workers times ranks), and samples are
    shuffled again in a buffer of ``shuffle_buffer`` samples.  Members are
    read into ``bytes`` before that buffer and decoded after it, so the
    buffer (and a checkpoint of it) holds compact encoded samples.  In
    evaluation shards and samples keep their order.

    The ``webdataset`` library's habits work too: ``shardshuffle=`` is
    ``shuffle_shards=`` (any true value shuffles the whole list; no buffer
    size is needed), ``resampled=True`` draws shards with replacement,
    endlessly, each DataLoader worker and rank its own (cut epochs with
    ``.header(n)``, ``n`` samples or batches per worker: equal-length epochs
    on every rank), and ``pipe:CMD ARGS`` URLs read each shard from a
    command's standard output (run without a shell; see
    :mod:`pipekit.webdataset` for the library's whole interface).

    Samples are dicts keyed by extension (torchdata's format):
    ``{"__key__": "shards/shard-000000.tar/sample0001", ".jpg": uint8 [3, H, W], ".cls": 3}``.
    Batches collate them key by key (tensors stacked, numbers to a tensor,
    strings to lists): ``{".jpg": [B, 3, H, W], ".cls": int64 [B], "__key__": [...]}``.

    Args:
        urls: shard URLs, brace patterns (``"s3://b/train-{000000..000099}.tar"``),
            globs or folders, or a list of them (see :func:`expand_shard_urls`).
        train: shuffle (shards and samples) and augment images (with ``size``).
        batch_size: samples per batch; ``None`` yields samples.
        shuffle_shards: shuffle the shard list each epoch (training only).
        shardshuffle: the ``webdataset`` library's name for ``shuffle_shards``
            (``None``: use ``shuffle_shards``; any other value: its truth).
        resampled: draw shards at random with replacement, endlessly, in
            each worker and rank, instead of reading the list once per epoch
            (the pipeline has no end: take ``.header(n)`` of it).
        shuffle_buffer: samples in the sample-level shuffle buffer (training
            only); ``0`` or ``None`` turns it off.
        decode: ``True`` (the default handlers of :class:`pipekit.pipes.Decoder`),
            ``False`` (raw ``bytes``), a dict ``{extension: fn(bytes)}`` added
            to the defaults, or a function ``decode(pipe) -> pipe`` replacing
            the stage (called while the recipe is built).
        storage_options: fsspec options (s3fs spelling for S3: ``key``,
            ``secret``, ``client_kwargs={"endpoint_url": ...}``).
        size: resize images so they stack: ``RandomResizedCrop(size)`` and a
            horizontal flip for training, ``Resize`` and ``CenterCrop`` for
            evaluation, on ``image_key``.  ``None`` (default) keeps them as decoded.
        image_key: the entry ``size`` applies to.
        trivial_augment: add ``TrivialAugmentWide`` to training (with ``size``).
        image_mode: channels images are decoded to (``None`` keeps each file's).
        transform: a picklable callable ``sample -> sample`` run after
            decoding (and resizing); ``None`` for none.
        collate_fn: replaces the collate function (a list of samples -> a batch).
        drop_last: drop each worker's last, shorter batch.
        on_error: ``"raise"`` or ``"skip"`` corrupt archive members and
            undecodable files (recorded in those pipes' ``skip_log``).
        cache_dir: a local folder where remote shards are copied whole the
            first time they are read and read from afterwards (later epochs
            read local disk; the ``webdataset`` library's and LitData's
            cache).  Each open checks the copy against the remote object's
            size and ETag / modification time (one metadata request per shard
            and epoch) and copies it again when it changed.  Local shards are
            read in place.  ``None`` (default): remote shards are streamed
            every epoch.  Not with ``pipe:`` URLs.
        decode_threads: decode ``image_key``'s images on a pool of this many
            threads, ahead of the loop and in order (``0``, the default: in the
            loop).  For a loader with ``num_workers=0``, whose process otherwise
            uses one core: JPEG decoding releases the GIL, so the decode of the
            next samples runs beside the crop, collate and training step of
            this one.  The images, their order, the augmentations and a
            checkpoint are the same as without threads (the samples in flight
            are in the checkpoint and decoded again on resume); a corrupt image
            is named or skipped by the decode stage as without threads.  It
            uses more cores than the process's one, so say so when comparing.
        decode_device: decode the JPEGs on this device instead of in the
            workers (``"cuda"``: nvJPEG); training with ``size`` only.  Batches
            then hold the encoded JPEGs and their crop and flip, drawn in the
            workers from the pipe's seeded stream, and
            ``pipekit.device.DeviceLoader(loader, decode_device, decode="jpeg",
            size=size, keys=image_key)`` decodes, crops, flips and normalises
            them there.

    Attributes:
        shards: the shard URLs, in their unshuffled order.

    Example:
        >>> import tempfile
        >>> import torch
        >>> from pipekit import datasets
        >>> from pipekit.synthetic import write_image_shards
        >>> root = tempfile.mkdtemp()
        >>> _ = write_image_shards(root, shards=2, per_shard=4, size=32, progress=False)
        >>> train = datasets.TarShards(root + "/shard-{000000..000001}.tar", batch_size=4, shuffle_buffer=8)
        >>> _ = torch.manual_seed(0)
        >>> batches = list(train)
        >>> len(batches), batches[0][".jpg"].shape, batches[0][".cls"].dtype
        (2, torch.Size([4, 3, 32, 32]), torch.int64)
        >>> val = datasets.TarShards(root, train=False, batch_size=None)
        >>> [s["__key__"].rsplit("/", 1)[1] for s in val][:3]
        ['sample00000000', 'sample00000001', 'sample00000002']
    """

    @explain_unexpected_keywords("webdataset")
    def __init__(
        self,
        urls: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        train: bool = True,
        batch_size: int | None = 32,
        shuffle_shards: bool = True,
        shardshuffle: bool | int | None = None,
        resampled: bool = False,
        shuffle_buffer: int | None = 1000,
        decode: bool | Mapping[str, Any] | Callable[[IterDataPipe], IterDataPipe] = True,
        storage_options: Mapping[str, Any] | None = None,
        size: int | tuple[int, int] | None = None,
        image_key: str = ".jpg",
        trivial_augment: bool = False,
        image_mode: Any = None,
        transform: Callable[[Any], Any] | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        drop_last: bool = False,
        on_error: str = "raise",
        cache_dir: str | os.PathLike[str] | None = None,
        decode_threads: int = 0,
        decode_device: str | torch.device | None = None,
    ) -> None:
        super().__init__()
        where = "TarShards"
        if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
            raise TypeError(f"{where}: cache_dir must be a folder path or None, got {cache_dir!r}")
        if storage_options is not None and not isinstance(storage_options, Mapping):
            raise TypeError(f"{where}: storage_options must be a dict, got {type(storage_options).__name__}")
        batch_size = check_positive_int(batch_size, "batch_size", where, allow_none=True)
        if shuffle_buffer is not None and not (isinstance(shuffle_buffer, int) and shuffle_buffer == 0):
            shuffle_buffer = check_positive_int(shuffle_buffer, "shuffle_buffer", where)
        if not (isinstance(decode, (bool, Mapping)) or callable(decode)):
            raise TypeError(
                f"{where}: decode must be True, False, a dict of handlers or a function pipe -> pipe, got {decode!r}"
            )
        check_stage(transform, "transform", where)
        if transform is False:
            transform = None
        check_callable(collate_fn, "collate_fn", where)
        if size is not None and decode is False:
            raise ValueError(f"{where}: size= resizes decoded images, but decode=False leaves them as bytes")
        if not isinstance(image_key, str):
            raise TypeError(f"{where}: image_key must be a str such as '.jpg', got {image_key!r}")
        decode_threads = check_int(decode_threads, "decode_threads", where, minimum=0)
        if decode_threads and not (decode is True or isinstance(decode, Mapping)):
            raise ValueError(f"{where}: decode_threads decodes with the recipe's decode stage, got decode={decode!r}")

        if decode_device is not None and not (
            train and size is not None and decode is True and not trivial_augment and transform is None
            and collate_fn is None and not decode_threads and image_mode in (None, "RGB", "rgb")
        ):
            raise ValueError(
                f"{where}: decode_device= decodes and crops training JPEGs on the device: it needs train=True and "
                "size=, and takes no decode=, trivial_augment=, transform=, collate_fn=, decode_threads= or "
                "image_mode= other than RGB"
            )
        self.decode_device = None if decode_device is None else torch.device(decode_device)
        self.train = bool(train)
        self.batch_size = batch_size
        self.resampled = bool(resampled)
        self.storage_options = dict(storage_options or {})
        self.shards: list[str] = expand_shard_urls(urls, self.storage_options)
        options = self.storage_options or None
        piped = [is_pipe_url(u) for u in self.shards]
        if any(piped) and not all(piped):
            raise ValueError(
                f"{where}: the shard list mixes pipe: and other URLs ({self.shards[piped.index(True)]!r} and "
                f"{self.shards[piped.index(False)]!r}); use one kind per dataset"
            )
        if piped[0] and cache_dir is not None:
            raise ValueError(f"{where}: cache_dir= copies remote objects, but {self.shards[0]!r} is a pipe: URL")
        if shardshuffle is not None:
            shuffle_shards = bool(shardshuffle)

        pipe: IterDataPipe
        if resampled:  # each worker and rank draws its own shards: no sharding_filter
            pipe = ResampledShardList(self.shards, where=where)
        else:
            given = urls if isinstance(urls, (str, os.PathLike)) else (urls[0] if len(urls) == 1 else None)
            root = redact_url(os.fspath(given)) if given is not None else f"{len(urls)} shard URLs and patterns"
            pipe = ListSource(self.shards, shuffle=self.train and bool(shuffle_shards),
                              listing=(where, root, "shards")).sharding_filter()
        if piped[0]:
            pipe = PipeOpener(pipe, where=where)
        elif cache_dir is not None:
            pipe = CachedShardOpener(pipe, cache_dir, self.storage_options)
        else:
            pipe = pipe.open_files_by_fsspec(mode="rb", storage_options=options)
        pipe = pipe.load_tar_samples(on_error=on_error)
        if self.train and shuffle_buffer:
            pipe = pipe.shuffle(buffer_size=shuffle_buffer)
        if decode_device is not None:
            from pipekit.device import jpeg_crop_stage

            self.source_datapipe = jpeg_crop_stage(
                pipe, size, image_key=image_key, batch_size=batch_size, drop_last=drop_last, on_error=on_error
            )
            return
        if decode is True or isinstance(decode, Mapping):
            handlers = None if decode is True else dict(decode)
            if decode_threads:
                handler = Decoder(pipe, handlers=handlers, image_mode=image_mode).find_handler(image_key)[1]
                if handler is not None:
                    pipe = pipe.threadpool_map(
                        _ThreadDecode(handler, image_key), scheduled_tasks=4 * decode_threads,
                        max_workers=decode_threads, thread_name_prefix="pipekit-decode",
                    )
            pipe = pipe.decode(handlers=handlers, on_error=on_error, image_mode=image_mode)
        elif decode is not False:
            pipe = decode(pipe)  # type: ignore[operator]
            if not isinstance(pipe, IterDataPipe):
                raise TypeError(f"{where}: decode must return a pipe, got {type(pipe).__name__}")
        if size is not None:
            ops = standard_image_transforms(size, self.train, trivial_augment=trivial_augment, where=where)
            if self.train:
                pipe = _ImageAugmenter(pipe, ops, image_key)
            else:
                pipe = pipe.map(_ImageOps(ops, image_key))
        if transform is not None:
            pipe = pipe.map(transform)
        if batch_size is not None:
            pipe = pipe.batch(batch_size, drop_last=drop_last).collate(collate_fn=collate_fn or collate)
        self.source_datapipe = pipe

    def __repr__(self) -> str:
        mode = "train" if self.train else "eval"
        resampled = ", resampled" if self.resampled else ""
        return f"TarShards({len(self.shards)} shards{resampled}, {mode}, batch_size={self.batch_size})"

    __str__ = __repr__


WebDataset = TarShards
"""``datasets.WebDataset``: the name of the ``webdataset`` library's class this recipe replaces.

The same class as :class:`TarShards`.  Not to be confused with the pipe
:class:`pipekit.pipes.WebDataset` (torchdata's ``webdataset``), which groups
``(path, stream)`` archive members into samples (this recipe groups them with
:class:`pipekit.pipes.TarSampleLoader`, which reads them as bytes in the same step).
"""
