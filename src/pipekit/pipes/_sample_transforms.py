"""Pipes that apply :mod:`pipekit.transforms` to samples: indices, augmentation, normalisation.

* ``append_index`` (:class:`IndexAppender`): append a spectral index channel;
* ``normalize`` (:class:`Normalizer`): per-band ``(x - mean) / std``;
* ``augment`` (:class:`Augmenter`): sample-dict augmentation (:class:`~pipekit.transforms.Augment`);
* ``augment_batch`` (:class:`BatchAugmenter`): per-sample augmentation of collated batches.

The transforms themselves also work with ``pipe.map(transform)``.  The
difference is randomness: the ``augment`` and ``augment_batch`` pipes are
random pipes in pipekit's sense (``set_seed``, seeded from the DataLoader's
shared seed, each worker and rank on its own stream derived from it) and save
their random stream in checkpoints, so a resumed run draws exactly the
augmentations an uninterrupted one would.  ``pipe.map(Augment(...))`` draws
from the transform's own per-worker stream (see
:mod:`pipekit.transforms.seeding`), which is reproducible for a seeded
DataLoader but not part of checkpoints.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from pipekit.pipes.base import IterDataPipe, functional_datapipe
from pipekit.pipes.state import SeededPipe
from pipekit.transforms._normalize import Normalize
from pipekit.transforms._spectral import AppendIndex
from pipekit.transforms.batch_augment import BatchTransform
from pipekit.transforms.seeding import RandomStream, pipe_stream_seed

if TYPE_CHECKING:
    from pipekit.transforms._augment import Augment

__all__ = ["Augmenter", "BatchAugmenter", "IndexAppender", "Normalizer"]


def _note(exc: BaseException, message: str) -> None:
    if hasattr(exc, "add_note"):  # Python >= 3.11
        exc.add_note(message)


def _len(source: IterDataPipe, name: str) -> int:
    try:
        return len(source)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{name}: the source pipe has no len()") from None


@functional_datapipe("append_index")
class IndexAppender(IterDataPipe):
    """Append a spectral index as a channel of each sample's image (functional name ``append_index``).

    Args:
        source_datapipe: samples ``{"image": [C, H, W], ...}`` (or batches, or tensors).
        index: an index name (``"ndvi"``...), a band_math formula, or a ready
            :class:`~pipekit.transforms.AppendIndex` (such as ``AppendNDVI(...)``).
        **kwargs: the bands and options of :class:`~pipekit.transforms.AppendIndex`
            (``nir=..., red=..., bands=dataset.bands, nodata=...``) when
            ``index`` is a name or formula.

    Example:
        >>> import torch
        >>> from pipekit.pipes import IterableWrapper
        >>> samples = [{"image": torch.tensor([[[0.1]], [[0.5]]]), "id": i} for i in range(2)]
        >>> out = list(IterableWrapper(samples).append_index("ndvi", nir=1, red=0))
        >>> [(round(float(s["image"][2]), 4), s["id"]) for s in out]
        [(0.6667, 0), (0.6667, 1)]
    """

    stateless = True

    def __init__(self, source_datapipe: IterDataPipe, index: str | AppendIndex, **kwargs: Any) -> None:
        super().__init__()
        if isinstance(index, AppendIndex):
            if kwargs:
                raise TypeError(f"append_index: got an AppendIndex and extra arguments {sorted(kwargs)}")
            self.transform = index
        else:
            self.transform = AppendIndex(index, **kwargs)
        self.source_datapipe = source_datapipe

    def __iter__(self) -> Iterator[Any]:
        for item in self.source_datapipe:
            try:
                yield self.transform(item)
            except Exception as exc:
                _note(exc, f"in append_index ({self.transform!r})")
                raise

    def __len__(self) -> int:
        return _len(self.source_datapipe, "append_index")


@functional_datapipe("normalize")
class Normalizer(IterDataPipe):
    """Normalise each sample's image per band (functional name ``normalize``).

    Args:
        source_datapipe: samples (or batches, or tensors).
        mean: one value per band, or a ready :class:`~pipekit.transforms.Normalize`
            (e.g. ``compute_stats(...).normalize()``).
        std: one value per band (not with a ``Normalize``).
        dtype, key: as :class:`~pipekit.transforms.Normalize`.

    Example:
        >>> import torch
        >>> from pipekit.pipes import IterableWrapper
        >>> samples = [{"image": torch.full((2, 1, 1), 12, dtype=torch.uint8)}]
        >>> [s["image"].flatten().tolist() for s in IterableWrapper(samples).normalize([10, 8], [2, 4])]
        [[1.0, 1.0]]
    """

    stateless = True

    def __init__(
        self,
        source_datapipe: IterDataPipe,
        mean: Sequence[float] | float | Normalize,
        std: Sequence[float] | float | None = None,
        *,
        dtype: torch.dtype | None = None,
        key: str = "image",
    ) -> None:
        super().__init__()
        if isinstance(mean, Normalize):
            if std is not None or dtype is not None or key != "image":
                raise TypeError("normalize: pass either a Normalize or mean/std/dtype/key, not both")
            self.transform = mean
        else:
            if std is None:
                raise TypeError("normalize: std is required with mean")
            self.transform = Normalize(mean, std, dtype=dtype, key=key)
        self.source_datapipe = source_datapipe

    def __iter__(self) -> Iterator[Any]:
        for item in self.source_datapipe:
            try:
                yield self.transform(item)
            except Exception as exc:
                _note(exc, "in normalize")
                raise

    def __len__(self) -> int:
        return _len(self.source_datapipe, "normalize")


class _StreamPipe(SeededPipe):
    """What ``augment`` and ``augment_batch`` share: a :class:`RandomStream` seeded per epoch, worker and rank.

    The transforms draw from a :class:`~pipekit.transforms.seeding.RandomStream`
    (torch's and numpy's generators: torchvision's random transforms draw from
    torch's global generator), not from ``self.rng``.  The epoch seed mixes
    the pending seed (or a draw from torch) with the worker id and rank
    (:func:`~pipekit.transforms.seeding.pipe_stream_seed`), so workers and
    ranks differ; the stream restarts from it at each epoch and its position
    is the checkpoint's ``"rng"`` (``None`` before the first epoch started).
    """

    state_keys = ("rng",)
    _runtime = ("_started",)

    def _init_stream(self) -> None:
        self._stream = RandomStream()
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._started = False  # a pickled copy (in a DataLoader worker) has not started its stream

    def derive_epoch_seed(self, seed: int | None) -> int:
        return pipe_stream_seed(seed)

    def _restore_base(self, state: dict[str, Any] | None) -> None:
        # "rng" is the stream's position, not the state of self.rng; a state taken before the first
        # epoch started (rng None) is the start of an epoch, seeded from the pending seed.
        if state is None or state["rng"] is None:
            super()._restore_base(None)
        else:
            super()._restore_base({key: value for key, value in state.items() if key != "rng"})

    def state_dict(self) -> dict[str, Any]:
        """The random stream's position (``None`` before the first epoch started)."""
        return {"rng": self._stream.state_dict() if self._started else None}

    def restore(self, state: dict[str, Any] | None) -> None:
        if state is None or state["rng"] is None:
            self._stream.reseed(self.epoch_seed)
        else:
            self._stream.load_state_dict(state["rng"])
        self._started = True

    def __len__(self) -> int:
        return _len(self.source_datapipe, self.functional_name)  # type: ignore[attr-defined]


@functional_datapipe("augment")
class Augmenter(_StreamPipe):
    """Augment each sample dict with torchvision v2 transforms (functional name ``augment``).

    Image, masks and boxes move together and other entries pass through (see
    :class:`~pipekit.transforms.Augment`).  Random parameters come from the
    pipe's stream: seeded by ``set_seed`` (the DataLoader's shared seed, per
    epoch) or else from torch's global RNG, mixed with the worker id and rank,
    so workers and ranks differ and a seeded run is reproducible.  The
    stream's position is saved in checkpoints.

    Args:
        source_datapipe: sample dicts (or image tensors).
        transforms: an :class:`~pipekit.transforms.Augment`, or a transform or
            list of transforms to build one from.
        image_key, mask_keys, box_keys: as :class:`~pipekit.transforms.Augment`
            (only with a list of transforms).

    Example:
        >>> import torch
        >>> from torchvision.transforms import v2
        >>> from pipekit.pipes import IterableWrapper
        >>> from pipekit.transforms import RandomRot90
        >>> samples = [{"image": torch.rand(7, 4, 4), "mask": torch.eye(4, dtype=torch.long)} for _ in range(3)]
        >>> pipe = IterableWrapper(samples).augment([v2.RandomVerticalFlip(), RandomRot90()]).set_seed(0)
        >>> [tuple(s["image"].shape) for s in pipe]
        [(7, 4, 4), (7, 4, 4), (7, 4, 4)]
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe,
        transforms: Augment | Callable[[Any], Any] | Sequence[Callable[[Any], Any]],
        *,
        image_key: str = "image",
        mask_keys: Sequence[str] = ("mask",),
        box_keys: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__()
        from pipekit.transforms._augment import Augment  # imports torchvision: only when an augment pipe is built

        if isinstance(transforms, Augment):
            if image_key != "image" or tuple(mask_keys) != ("mask",) or box_keys is not None:
                raise TypeError("augment: pass the keys to the Augment, not to the pipe")
            self.transform = transforms
        else:
            self.transform = Augment(transforms, image_key=image_key, mask_keys=mask_keys, box_keys=box_keys)
        self.source_datapipe = source_datapipe
        self._init_stream()

    def __iter__(self) -> Iterator[Any]:
        for item in self.source_datapipe:
            try:
                out = self.transform.apply(item, self._stream)
            except Exception as exc:
                _note(exc, "in augment")
                raise
            yield out


@functional_datapipe("augment_batch")
class BatchAugmenter(_StreamPipe):
    """Augment collated batches per sample (functional name ``augment_batch``).

    Runs a :mod:`~pipekit.transforms.batch_augment` transform (flips, 90-degree
    rotations, crops, MixUp, CutMix, or a ``BatchCompose`` of them) on each
    batch, drawing its random parameters from the pipe's stream (seeded like
    ``augment``, saved in checkpoints).  Put it after ``collate``; on a GPU,
    running the transform on the batch after ``to_device`` is usually faster.

    Args:
        source_datapipe: batch dicts ``{"image": [B, C, H, W], ...}`` or tensors.
        transform: a :class:`~pipekit.transforms.BatchTransform`.

    Example:
        >>> import torch
        >>> from pipekit.pipes import IterableWrapper
        >>> from pipekit.transforms import BatchRandomCrop
        >>> batches = [{"image": torch.rand(4, 13, 8, 8)} for _ in range(2)]
        >>> [tuple(b["image"].shape) for b in IterableWrapper(batches).augment_batch(BatchRandomCrop(4)).set_seed(0)]
        [(4, 13, 4, 4), (4, 13, 4, 4)]
    """

    def __init__(self, source_datapipe: IterDataPipe, transform: BatchTransform) -> None:
        super().__init__()
        if not isinstance(transform, BatchTransform):
            raise TypeError(
                f"augment_batch: transform must be a pipekit.transforms.BatchTransform (BatchCompose, MixUp...), "
                f"got {type(transform).__name__}"
            )
        self.transform: nn.Module = transform
        self.source_datapipe = source_datapipe
        self._init_stream()

    def __iter__(self) -> Iterator[Any]:
        for batch in self.source_datapipe:
            try:
                out = self.transform(batch, self._stream.numpy())
            except Exception as exc:
                _note(exc, "in augment_batch")
                raise
            yield out
