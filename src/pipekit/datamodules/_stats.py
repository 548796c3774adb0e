"""``compute_stats``: the per-band statistics a datamodule stores, computed from its training split."""

from __future__ import annotations

from typing import Any

import torch

from pipekit.transforms._stats import BandStats
from pipekit.transforms._stats import compute_stats as _compute_stats

__all__ = ["compute_stats"]


def compute_stats(datamodule: Any, num_samples: int | None = 1000, *, seed: int = 0, progress: bool = False,
                  **kwargs: Any) -> BandStats:
    """Per-band statistics of a datamodule's training split: what its ``mean`` and ``std`` hold.

    Sets up the datamodule for ``"fit"`` and reads its training dataset: for a
    geo datamodule, ``num_samples`` patches of ``patch_size`` drawn by a
    random sampler seeded with ``seed``; for a chip datamodule, ``num_samples``
    chips in a random order seeded with ``seed`` (``None``: all of them).
    Statistics are of the raw values (see
    :func:`pipekit.transforms.compute_stats`), the units the datamodule
    normalises in on the device.  A datamodule's stored statistics name the
    call that produced them, so they can be computed again.

    Args:
        datamodule: a :class:`~pipekit.datamodules.GeoDataModule` or
            :class:`~pipekit.datamodules.NonGeoDataModule`.
        num_samples: patches or chips to read.
        seed: seed of the patches or of the order.
        progress: show a progress bar.
        **kwargs: passed to :func:`pipekit.transforms.compute_stats`
            (``percentiles``, ``nodata``...).

    Example:
        >>> import torch
        >>> from pipekit.datamodules import NonGeoDataModule, compute_stats
        >>> class Ramp(torch.utils.data.Dataset):
        ...     def __init__(self, split):
        ...         pass
        ...     def __len__(self):
        ...         return 4
        ...     def __getitem__(self, i):
        ...         return {"image": torch.full((2, 3, 3), i, dtype=torch.uint8), "label": torch.tensor(0)}
        >>> stats = compute_stats(NonGeoDataModule(Ramp), num_samples=None)
        >>> stats.mean, [round(s, 4) for s in stats.std]
        ([1.5, 1.5], [1.118, 1.118])
    """
    datamodule.setup("fit")
    dataset = datamodule.train_dataset
    if dataset is None:
        raise ValueError(f"compute_stats: {type(datamodule).__name__}.setup('fit') set no train_dataset")
    from pipekit.datamodules._base import GeoDataModule

    # a geo datamodule: patches of its size, from a seeded sampler (a chip datamodule may have a patch_size too,
    # as Inria's and VHR10's, for its crops or resizing: its chips are read whole)
    if isinstance(datamodule, GeoDataModule):
        return _compute_stats(dataset, num_samples, size=datamodule.patch_size, seed=seed, progress=progress,
                              **kwargs)
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed)).tolist()
    if num_samples is not None:
        order = order[:num_samples]
    return _compute_stats((dataset[i] for i in order), len(order), progress=progress, **kwargs)
