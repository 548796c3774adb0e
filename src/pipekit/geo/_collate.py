"""Collate functions for geo sample dicts (TorchGeo's ``stack_samples`` and friends).

A geo sample is a dict such as ``{"image": Tensor[C, H, W], "mask": Tensor[H, W],
"crs": CRS, "bounds": BoundingBox}``.  These functions combine samples:

* :func:`stack_samples`: a mini-batch (tensors stacked on a new first axis),
  the ``collate_fn`` for a DataLoader over a geo dataset;
* :func:`concat_samples`: join samples along the first axis (channels), as an
  intersection dataset does with the samples of its two datasets;
* :func:`merge_samples`: overlay samples of the same place, as a union
  dataset does;
* :func:`unbind_samples`: the inverse of :func:`stack_samples`.

:func:`stack_samples` is :func:`pipekit.collate.collate_dicts`, the sample-dict
collation :func:`pipekit.collate.collate` uses too: tensors (and NumPy arrays)
are stacked, numbers become a tensor as :func:`torch.utils.data.default_collate`
makes it (``int`` -> int64, ``float`` -> float64), and every other value
(``crs``, ``bounds``, strings, ``None``...) is kept as a list, as in TorchGeo.
:func:`concat_samples` keeps the first sample's value for anything that is not
a tensor, as in TorchGeo.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import Tensor

from pipekit.collate import _check_dicts, _columns, collate_dicts
from pipekit.geo._batch import stacked_samples

__all__ = ["stack_samples", "concat_samples", "merge_samples", "unbind_samples"]


def stack_samples(samples: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Stack samples into a mini-batch: tensors on a new first axis, every other value as a list.

    TorchGeo's ``stack_samples``: only tensors are stacked (numbers, arrays,
    CRSs and bounds stay lists).  :func:`pipekit.collate.collate` is the same
    collation with ``torch.utils.data.default_collate``'s rule for numbers and
    arrays.  Unlike TorchGeo, samples whose keys differ are refused with an
    error naming the keys (TorchGeo builds a batch whose lists have different
    lengths).

    Args:
        samples: sample dicts with the same keys; tensors of a key must have
            the same shape.

    Returns:
        one dict: ``{"image": Tensor[B, C, H, W], "crs": [crs, ...], ...}``;
        inside a DataLoader worker its tensors are in shared memory.  The
        samples of a batch a raster dataset read through ``__getitems__``
        (a DataLoader's batch) are views of such a batch already: it is
        returned as it is, not copied (:mod:`pipekit.geo._batch`).

    Example:
        >>> import torch
        >>> from pipekit.geo._collate import stack_samples
        >>> batch = stack_samples([{"image": torch.zeros(3, 4, 4), "id": 1}, {"image": torch.ones(3, 4, 4), "id": 2}])
        >>> batch["image"].shape, batch["id"]
        (torch.Size([2, 3, 4, 4]), [1, 2])
    """
    samples = list(samples)
    batch = stacked_samples(samples)  # the samples of one batch read by a dataset's __getitems__: no copy
    if batch is not None:
        return batch
    return collate_dicts(samples, name="stack_samples", tensors_only=True)


def concat_samples(samples: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Join samples along the first axis of their tensors (e.g. the channels of two images).

    Tensors of a key are concatenated with ``torch.cat`` (dim 0), over the
    samples that have the key (an image from one dataset and a mask from
    another both pass through); for any other value the first sample's is
    kept.

    Example:
        >>> import torch
        >>> from pipekit.geo._collate import concat_samples
        >>> a = {"image": torch.zeros(3, 4, 4), "crs": "a"}
        >>> b = {"image": torch.ones(1, 4, 4), "crs": "a"}
        >>> joined = concat_samples([a, b])
        >>> joined["image"].shape, joined["crs"]
        (torch.Size([4, 4, 4]), 'a')
    """
    samples = list(samples)
    _check_dicts(samples, "concat_samples", same_keys=False)
    collated: dict[str, Any] = _columns(samples)
    for key, values in collated.items():
        if isinstance(values[0], Tensor):
            try:
                collated[key] = torch.cat(values)
            except (RuntimeError, TypeError) as exc:
                shapes = [tuple(v.shape) if isinstance(v, Tensor) else type(v).__name__ for v in values]
                raise ValueError(f"concat_samples: cannot concatenate {key!r} (shapes {shapes}): {exc}") from exc
        else:
            collated[key] = values[0]
    return collated


def merge_samples(samples: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Overlay samples of the same place: the element-wise maximum of tensors of the same key.

    Taking the maximum lets data replace nodata (zeros) wherever any sample
    has data, as TorchGeo's union datasets do.  Keys may differ between
    samples; for values that are not tensors, the last sample's wins.

    Example:
        >>> import torch
        >>> from pipekit.geo._collate import merge_samples
        >>> merged = merge_samples([{"mask": torch.tensor([0, 2, 0])}, {"mask": torch.tensor([1, 0, 0]), "x": 5}])
        >>> merged["mask"].tolist(), merged["x"]
        ([1, 2, 0], 5)
    """
    samples = list(samples)
    _check_dicts(samples, "merge_samples", same_keys=False)
    merged: dict[str, Any] = {}
    for sample in samples:
        for key, value in sample.items():
            if key in merged and isinstance(value, Tensor) and isinstance(merged[key], Tensor):
                try:
                    merged[key] = torch.maximum(merged[key], value)
                except RuntimeError as exc:
                    raise ValueError(
                        f"merge_samples: cannot merge {key!r} of shapes {tuple(merged[key].shape)} "
                        f"and {tuple(value.shape)}: {exc}"
                    ) from exc
            else:
                merged[key] = value
    return merged


def unbind_samples(sample: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Split a mini-batch back into samples (the inverse of :func:`stack_samples`).

    Tensors are unbound along their first axis (numbers that
    :func:`stack_samples` made a tensor come back as 0-d tensors); other values
    must be sequences with one element per sample.  The batch is not modified.

    Example:
        >>> import torch
        >>> from pipekit.geo._collate import unbind_samples
        >>> samples = unbind_samples({"image": torch.zeros(2, 3, 4, 4), "id": [1, 2]})
        >>> len(samples), samples[1]["image"].shape, samples[1]["id"]
        (2, torch.Size([3, 4, 4]), 2)
    """
    if not isinstance(sample, Mapping):
        raise TypeError(f"unbind_samples takes a dict, got {type(sample).__name__}")
    columns: dict[str, Any] = {}
    size = None
    for key, values in sample.items():
        if isinstance(values, Tensor):
            if values.dim() == 0:
                raise ValueError(f"unbind_samples: {key!r} is a 0-d tensor, not a batch")
            column: Any = torch.unbind(values)
        elif isinstance(values, (list, tuple)):
            column = values
        else:
            raise TypeError(
                f"unbind_samples: {key!r} is a {type(values).__name__}; batch values must be tensors, lists or tuples"
            )
        if size is None:
            size = len(column)
        elif len(column) != size:
            raise ValueError(f"unbind_samples: {key!r} has {len(column)} items, expected {size}")
        columns[key] = column
    return [{key: column[i] for key, column in columns.items()} for i in range(size or 0)]
