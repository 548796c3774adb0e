"""What the recipes (:class:`~pipekit.datasets.ImageFolder`, :class:`~pipekit.datasets.TarShards`,
:class:`~pipekit.datasets.GeoSegmentation`) share.

* :class:`Recipe`: the base class.  A recipe *is* a pipe (an ``IterDataPipe``
  that yields what the chain it built yields), so it goes straight into
  :class:`pipekit.DataLoader` and chains further (``recipe.header(10)``); the
  chain itself is :attr:`Recipe.pipe`.  It holds no position of its own: the
  pipes of the chain are checkpointed by the loader.
* :class:`ListSource`: a source pipe over a list known in advance (files,
  shards) that shuffles with a random *permutation* per epoch.  Its checkpoint
  is two numbers (the epoch's seed and the position), however long the list,
  where a shuffle buffer over the whole list would checkpoint the list.
* the standard image transforms of classification (``RandomResizedCrop`` and a
  horizontal flip, optionally ``TrivialAugmentWide``, for training;
  ``Resize`` and ``CenterCrop`` for evaluation), applied to uint8 images so
  that :func:`pipekit.device.to_device` converts and normalises them on the
  device.

torchvision is imported when a transform is first built, not with this module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from pipekit._fs import listing_change, listing_record, redact_url
from pipekit._validate import check_int
from pipekit.errors import ReadError
from pipekit.pipes.base import IterDataPipe
from pipekit.pipes.state import PermutationSource

__all__ = ["Recipe", "ListSource", "ApplyToKey", "standard_image_transforms", "check_positive_int", "check_stage"]

def check_positive_int(value: Any, name: str, where: str, *, allow_none: bool = False) -> int | None:
    """``value`` as a positive ``int`` (or ``None`` when allowed): :func:`pipekit._validate.check_int`."""
    return check_int(value, name, where, minimum=1, allow_none=allow_none)


def check_stage(value: Any, name: str, where: str) -> Any:
    """A stage override: ``None`` (the default stage), ``False`` (no stage) or a callable."""
    if value is None or value is False or callable(value):
        return value
    raise TypeError(f"{where}: {name} must be a callable, None (the default) or False (none), got {value!r}")


class Recipe(IterDataPipe):
    """Base class of the recipes: a pipe that yields what the chain it built yields.

    Subclasses build their chain in ``__init__`` and store it in
    ``self.source_datapipe`` (the upstream attribute every pipekit pipe has;
    ``datapipe`` is an alias).  ``len()`` is the chain's, when it has one.
    """

    stateless = True  # the chain's pipes hold the position; this wrapper holds nothing
    source_datapipe: IterDataPipe

    @property
    def pipe(self) -> IterDataPipe:
        """The chain this recipe built (its last pipe)."""
        return self.source_datapipe

    @property
    def datapipe(self) -> IterDataPipe:
        """The chain this recipe built (an alias of :attr:`pipe`; recipes may set it)."""
        return self.source_datapipe

    @datapipe.setter
    def datapipe(self, pipe: IterDataPipe) -> None:
        self.source_datapipe = pipe

    def __iter__(self) -> Iterator[Any]:
        yield from self.source_datapipe

    def __len__(self) -> int:
        try:
            return len(self.source_datapipe)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(f"{type(self).__name__}: this pipeline has no len()") from None


class ListSource(PermutationSource):
    """Yield the items of a list, in a new random order each epoch when shuffling.

    A :class:`~pipekit.pipes.state.PermutationSource`: the order is a
    permutation drawn from the epoch's seed, so the whole list is shuffled
    (not a window of it) and a checkpoint is ``{"seed", "yielded"}``
    only.  Seeding follows torch's ``Shuffler``: :meth:`set_seed` (called by
    the DataLoader with the seed it shares with every worker and rank, so
    that all draw the *same* permutation and a ``sharding_filter`` after this
    pipe splits it) applies to the next epoch; without it the seed is drawn
    from torch's global RNG.  ``set_shuffle(False)`` (the DataLoader's
    ``shuffle=False``) keeps the list's order.

    A list of files (URLs) listed when the recipe is built is passed with
    ``listing=(where, root, what)``: a resumed run works on a new listing,
    where a file added or deleted since the checkpoint would shift every
    position after it (files repeated, others never read).  The checkpoint
    then also keeps :func:`pipekit._fs.listing_record` of the list (of the
    URLs without their secrets: a digest, the count and the names,
    compressed), and restoring it on another listing raises
    :class:`~pipekit.errors.ReadError` naming ``root``, the recipe
    (``where``) and the files (``what``) added and gone.  A file whose
    contents changed under the same name is read afresh.

    Args:
        items: the items, in their unshuffled order.
        shuffle: shuffle each epoch.
        listing: ``(where, root, what)`` to record the listing of ``items`` (URLs) in checkpoints.

    Example:
        >>> from pipekit.datasets._recipe import ListSource
        >>> list(ListSource(["a", "b", "c", "d"], shuffle=False))
        ['a', 'b', 'c', 'd']
        >>> pipe = ListSource(list(range(6)))
        >>> first = list(pipe.set_seed(0))
        >>> sorted(first), first == list(pipe.set_seed(0))
        ([0, 1, 2, 3, 4, 5], True)
    """

    def __init__(self, items: Sequence[Any] = (), shuffle: bool = True, *,
                 listing: tuple[str, str, str] | None = None) -> None:
        super().__init__(items, shuffle=shuffle)
        self.listing = listing
        self._record: dict[str, Any] | None = None

    def _names(self) -> list[str]:
        return [redact_url(str(item)) for item in self.items]

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.listing is None:
            return state
        if getattr(self, "_record", None) is None:  # once: the list does not change after the recipe is built
            self._record = listing_record(self._names())
        return {**state, "listing": self._record}

    def restore(self, state: dict[str, Any] | None) -> None:
        listing = None if state is None else state.get("listing")
        if self.listing is not None and isinstance(listing, dict):
            where, root, what = self.listing
            change = listing_change(listing, self._names())
            if change is not None:
                raise ReadError(
                    "resume listing", root, where,
                    f"the {what} under it changed since the checkpoint ({change}): the checkpoint's positions "
                    f"count {what} of the old listing and would repeat some and skip others; resume from a "
                    "checkpoint taken on these files, or start the epoch over",
                )
            self._record = dict(listing)
        super().restore(state)


def _pair(value: Any, name: str, where: str) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        raise TypeError(f"{where}: {name} must be a (min, max) pair of numbers, got {value!r}") from None
    if not 0 < lo <= hi:
        raise ValueError(f"{where}: {name} must satisfy 0 < min <= max, got {value!r}")
    return lo, hi


def standard_image_transforms(
    size: int | tuple[int, int],
    train: bool,
    *,
    trivial_augment: bool = False,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    resize: int | None = None,
    where: str = "standard_image_transforms",
) -> list[Callable[[Any], Any]]:
    """The usual classification transforms, as a list of torchvision v2 ops on uint8 images.

    Training: ``RandomResizedCrop(size, scale, ratio)``, ``RandomHorizontalFlip()``
    and, with ``trivial_augment``, ``TrivialAugmentWide()``.  Evaluation:
    ``Resize(resize)`` (the shorter side; default ``size / 0.875``, 256 for
    224) then ``CenterCrop(size)``.  Images stay ``uint8``.

    Example:
        >>> import torch
        >>> from pipekit.datasets._recipe import standard_image_transforms
        >>> ops = standard_image_transforms(32, train=False)
        >>> [type(op).__name__ for op in ops]
        ['Resize', 'CenterCrop']
        >>> image = torch.zeros(3, 48, 64, dtype=torch.uint8)
        >>> for op in ops:
        ...     image = op(image)
        >>> image.shape, image.dtype
        (torch.Size([3, 32, 32]), torch.uint8)
    """
    from torchvision.transforms import v2

    if isinstance(size, (tuple, list)):
        if len(size) != 2:
            raise ValueError(f"{where}: size must be an int or a (height, width) pair, got {size!r}")
        hw = (check_positive_int(size[0], "size", where), check_positive_int(size[1], "size", where))
    else:
        side = check_positive_int(size, "size", where)
        hw = (side, side)
    if train:
        ops: list[Any] = [
            v2.RandomResizedCrop(hw, scale=_pair(scale, "scale", where), ratio=_pair(ratio, "ratio", where),
                                 antialias=True),
            v2.RandomHorizontalFlip(),
        ]
        if trivial_augment:
            ops.append(v2.TrivialAugmentWide())
        return ops
    if resize is None:
        resize = round(min(hw) / 0.875)
    resize = check_positive_int(resize, "resize", where)
    return [v2.Resize(resize, antialias=True), v2.CenterCrop(hw)]


class ApplyToKey:
    """Apply ``fn`` to ``sample[key]`` and return the sample with the result (picklable, for ``map``).

    ``fn`` may be a list of ops, applied in order.
    """

    def __init__(self, fn: Callable[[Any], Any] | Sequence[Callable[[Any], Any]], key: str = "image") -> None:
        self.ops = list(fn) if isinstance(fn, (list, tuple)) else [fn]
        self.key = key

    def __call__(self, sample: Mapping[str, Any]) -> dict[str, Any]:
        if self.key not in sample:
            raise KeyError(f"the sample has no {self.key!r} entry (keys: {sorted(map(str, sample))})")
        value = sample[self.key]
        for op in self.ops:
            value = op(value)
        out = dict(sample)
        out[self.key] = value
        return out

    def __repr__(self) -> str:
        return f"ApplyToKey({self.ops!r}, key={self.key!r})"
