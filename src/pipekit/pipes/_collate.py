"""Collate batches with padding (``pad_collate``).

torch's own ``collate`` (:class:`~pipekit.pipes.Collator`) stacks samples of
equal size.  :class:`PadCollator` pads variable-size tensors first, using the
kernel :func:`pipekit.collate.pad_collate`.
"""

from __future__ import annotations

import numbers
from collections.abc import Hashable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from pipekit.collate import PadValue, pad_collate
from pipekit.pipes.base import IterDataPipe, functional_datapipe

__all__ = ["PadCollator"]


@functional_datapipe("pad_collate")
class PadCollator(IterDataPipe):
    """Collate each batch (a list of samples), padding variable-size tensors.

    Every batch from upstream goes through :func:`pipekit.collate.pad_collate`:
    tensors are padded with ``pad_value`` to the largest size of the batch along
    every dimension and stacked, and their original sizes are returned.  Tensor
    and tuple samples give ``(batch, sizes)``; dict samples give a dict with a
    ``"<key>_sizes"`` ``LongTensor [B, ndim]`` after each padded key.  Fields
    that are not padded are collated with torch's ``default_collate`` (tensors,
    arrays, numbers) or kept as lists (strings, other objects).

    Args:
        datapipe: a pipe yielding batches, e.g. from ``.batch(n)``,
            ``.bucketbatch(...)`` or ``.max_token_bucketize(...)``.
        pad_value: the padding value, or a dict of values per key (dict samples)
            or per field index (tuple samples); unnamed keys use ``0``.
        keys: the dict keys (or tuple field indices) to pad; ``None`` pads every
            field that holds a tensor.

    Example:
        >>> import torch
        >>> from pipekit.pipes import IterableWrapper
        >>> seqs = IterableWrapper([torch.tensor([1, 2, 3]), torch.tensor([4]), torch.tensor([5, 6])])
        >>> batch, sizes = next(iter(seqs.batch(3).pad_collate(pad_value=0)))
        >>> batch
        tensor([[1, 2, 3],
                [4, 0, 0],
                [5, 6, 0]])
        >>> sizes.flatten().tolist()
        [3, 1, 2]
    """

    stateless = True

    def __init__(
        self,
        datapipe: IterDataPipe,
        pad_value: PadValue | Mapping[Hashable, PadValue] = 0,
        keys: Sequence[Hashable] | None = None,
    ) -> None:
        values = pad_value.values() if isinstance(pad_value, Mapping) else [pad_value]
        for v in values:
            if isinstance(v, (torch.Tensor, np.ndarray)) or not isinstance(v, numbers.Real):
                raise TypeError(f"pad_collate: pad_value must be a number or a dict of numbers, got {pad_value!r}")
        if keys is not None and (isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence)):
            raise TypeError(f"pad_collate: keys must be a list of keys (or field indices) or None, got {keys!r}")
        self.source_datapipe = datapipe
        self.pad_value = dict(pad_value) if isinstance(pad_value, Mapping) else pad_value
        self.keys = list(keys) if keys is not None else None

    def __iter__(self) -> Iterator[Any]:
        for batch in self.source_datapipe:
            if isinstance(batch, (str, bytes, Mapping, torch.Tensor, np.ndarray)) or not isinstance(
                batch, Sequence
            ):
                raise TypeError(
                    f"pad_collate: expected batches (lists of samples), got a {type(batch).__name__}; "
                    "batch the samples first, e.g. with .batch(n)"
                )
            yield pad_collate(batch, self.pad_value, self.keys)

    def __len__(self) -> int:
        return len(self.source_datapipe)
