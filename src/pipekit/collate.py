"""Collate kernels: turn a list of samples into one batch.

These are plain functions (no DataPipe machinery); :mod:`pipekit.pipes._collate`
wraps them as pipes.

:func:`pad_stack` pads a list of tensors of the same number of dimensions to
the largest size along *every* dimension and stacks them.  :func:`pad_collate`
applies it to whole samples -- tensors, tuples (or lists) of fields, or dicts --
and reports the original size of every padded tensor:

===================  ===========================================================
sample               ``pad_collate(samples)`` returns
===================  ===========================================================
tensor / ndarray     ``(batch, sizes)``: ``batch`` is ``[B, *max_shape]``,
                     ``sizes`` a ``LongTensor [B, ndim]``
tuple / list         ``(batch, sizes)``: ``batch`` has the sample's container type
                     (namedtuples included), one collated entry per field;
                     ``sizes`` is a tuple aligned with the fields, holding a
                     ``LongTensor [B, ndim]`` for each padded field and ``None``
                     for the others
dict                 one ``dict``: the collated fields, plus ``"<key>_sizes"``
                     (``LongTensor [B, ndim]``) right after each padded ``key``
===================  ===========================================================

:func:`collate` stacks samples of equal shapes (sample dicts from geo datasets
included: ``crs``, ``bounds`` and other non-tensors become lists).

One rule collates a field (a key of sample dicts, a field of tuples) in
:func:`collate`, in :func:`collate_dicts` -- the sample-dict collation behind
:func:`collate` and :func:`pipekit.geo.stack_samples` -- and for the fields
:func:`pad_collate` does not pad, looking at all the values of the field:

=====================================  ==============================================
the values of a field                  become
=====================================  ==============================================
tensors, numeric NumPy arrays          one stacked tensor ``[B, ...]`` (dtypes promoted
                                       to a common one; different shapes are an error
                                       naming the field)
numbers: Python ``int``/``float``/     a tensor, as :func:`torch.utils.data.default_collate`
``bool``, NumPy scalars                makes it (``int`` -> int64, ``float`` -> float64)
anything else, or a mix of kinds:      a list, as they are
``None``, strings, CRS, bounds,
dicts, lists, complex numbers...
=====================================  ==============================================

Nested dicts and lists are kept as they are (a list of them), not collated
recursively.

Both :func:`collate` and :func:`pad_collate` take ``pin_memory=True`` to write
the batch straight into page-locked host memory, ready for an asynchronous
copy to the GPU.  The memory comes from torch's caching host allocator, so the
buffers of earlier batches are reused once freed, instead of pinning a fresh
copy of every batch (``batch.pin_memory()`` allocates *and* copies).  Without
CUDA there is nothing to pin and the batch is ordinary memory.  Pinned memory
does not survive the trip from a DataLoader worker to the main process, so pin
where the batch is consumed (the main process), or let
:class:`pipekit.device.DeviceLoader` stage batches into reused pinned buffers.

:func:`empty_host` and :func:`use_shared_buffers_in_default_collate` (where a
batch's memory comes from) are in :mod:`pipekit._batch_memory`; this module re-exports them.
"""

from __future__ import annotations

import numbers
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate

from pipekit._batch_memory import empty_host, use_shared_buffers_in_default_collate

__all__ = [
    "collate",
    "collate_dicts",
    "pad_collate",
    "pad_stack",
    "empty_host",
    "use_shared_buffers_in_default_collate",
]

PadValue = int | float | bool

_STAGE = "pad_collate"
_COLLATE = "collate"


def _is_array(value: Any) -> bool:
    return isinstance(value, (torch.Tensor, np.ndarray))


def _is_stackable(value: Any) -> bool:
    """A tensor, or a NumPy array torch can hold (not strings or objects)."""
    return isinstance(value, torch.Tensor) or (isinstance(value, np.ndarray) and value.dtype.kind in "biufc")


#: Exact types :func:`_is_number` accepts, checked first without ``numbers.Number``'s ABC machinery.
_PLAIN_NUMBERS = (int, float, bool)


def _is_number(value: Any) -> bool:
    """A real number (Python or NumPy scalar, bools included), as :func:`default_collate` turns into a tensor."""
    return isinstance(value, numbers.Number) and not isinstance(value, complex)


def _check_pad_scalar(value: Any, where: str) -> None:
    if isinstance(value, (torch.Tensor, np.ndarray)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{_STAGE}: pad_value{where} must be a real number, got {type(value).__name__}")


def _check_pad_fits(pad_value: PadValue, dtype: torch.dtype, name: str) -> None:
    if dtype == torch.bool:
        if pad_value not in (0, 1):
            raise ValueError(f"{_STAGE}: pad_value {pad_value!r} for {name} does not fit its dtype torch.bool")
    elif not (dtype.is_floating_point or dtype.is_complex):
        if isinstance(pad_value, float) and not float(pad_value).is_integer():
            raise ValueError(f"{_STAGE}: pad_value {pad_value!r} for {name} is not an integer but its dtype is {dtype}")
        info = torch.iinfo(dtype)
        if not info.min <= int(pad_value) <= info.max:
            raise ValueError(f"{_STAGE}: pad_value {pad_value!r} for {name} is out of range for {dtype}")


def _common_dtype(ts: Sequence[torch.Tensor]) -> torch.dtype:
    dtype = ts[0].dtype
    for t in ts[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def pad_stack(
    tensors: Sequence[torch.Tensor | np.ndarray],
    pad_value: PadValue = 0,
    *,
    name: str = "the samples",
    pin_memory: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad tensors to the largest size along every dimension and stack them.

    Args:
        tensors: a non-empty sequence of tensors (or NumPy arrays) with the same
            number of dimensions and on the same device.  Their dtypes are
            promoted to a common one, as :func:`torch.stack` does.
        pad_value: the value written in the padding.
        name: how error messages refer to the tensors (``"key 'image'"``).
        pin_memory: write ``batch`` into pinned host memory (CPU tensors only;
            see :func:`empty_host`).

    Returns:
        ``(batch, sizes)``: ``batch`` has shape ``[B, *max_shape]`` and ``sizes``
        is a ``LongTensor [B, ndim]`` with each tensor's original shape.

    Raises:
        ValueError: empty input, different numbers of dimensions or devices, or a
            ``pad_value`` that the dtype cannot hold (``0.5`` for integers).

    Example:
        >>> import torch
        >>> from pipekit.collate import pad_stack
        >>> batch, sizes = pad_stack([torch.ones(2, 3), torch.ones(1, 4)], pad_value=-1)
        >>> batch.shape, sizes.tolist()
        (torch.Size([2, 2, 4]), [[2, 3], [1, 4]])
        >>> batch[1]
        tensor([[ 1.,  1.,  1.,  1.],
                [-1., -1., -1., -1.]])
    """
    if len(tensors) == 0:
        raise ValueError(f"{_STAGE}: cannot pad an empty list of tensors ({name})")
    _check_pad_scalar(pad_value, "")
    ts = [torch.as_tensor(t) if isinstance(t, np.ndarray) else t for t in tensors]
    for i, t in enumerate(ts):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{_STAGE}: {name}: sample {i} is a {type(t).__name__}, not a tensor")
    first = ts[0]
    for i, t in enumerate(ts):
        if t.dim() != first.dim():
            raise ValueError(
                f"{_STAGE}: {name} has tensors with different numbers of dimensions: sample 0 has "
                f"shape {tuple(first.shape)} ({first.dim()}-d), sample {i} has shape {tuple(t.shape)} "
                f"({t.dim()}-d)"
            )
        if t.device != first.device:
            raise ValueError(
                f"{_STAGE}: {name} has tensors on different devices: sample 0 on {first.device}, "
                f"sample {i} on {t.device}"
            )
    dtype = _common_dtype(ts)
    shapes = [tuple(t.shape) for t in ts]
    sizes = torch.tensor(shapes, dtype=torch.long).reshape(len(ts), first.dim())
    pin = pin_memory and first.device.type == "cpu"
    if all(s == shapes[0] for s in shapes):
        if first.device.type == "cpu":
            out = empty_host((len(ts), *shapes[0]), dtype, pin_memory=pin)
            return torch.stack([t.to(dtype) for t in ts], out=out), sizes
        return torch.stack([t.to(dtype) for t in ts]), sizes
    _check_pad_fits(pad_value, dtype, name)
    max_shape = [max(dim) for dim in zip(*shapes)]
    if first.device.type == "cpu":
        out = empty_host((len(ts), *max_shape), dtype, pin_memory=pin)
        out.fill_(pad_value)
    else:
        out = torch.full((len(ts), *max_shape), pad_value, dtype=dtype, device=first.device)
    for i, t in enumerate(ts):
        out[(i, *(slice(0, n) for n in t.shape))] = t
    return out, sizes


def _stack(tensors: list[torch.Tensor], name: str, stage: str, pin_memory: bool = False) -> torch.Tensor:
    """``torch.stack`` of same-shape tensors into a fresh batch: pinned, or in shared memory inside a worker."""
    shapes = {t.shape for t in tensors}
    if len(shapes) > 1:
        hint = "list it in keys to pad it" if stage == _STAGE else "use pad_collate to pad them"
        listed = sorted(tuple(shape) for shape in shapes)
        if stage != _STAGE and _images_of_sizes(listed):
            hint = (
                "images of different sizes: resize them to one size, with the recipe's size= "
                "(datasets.WebDataset(urls, size=224)) or a Resize transform, or use pad_collate to pad them"
            )
        raise ValueError(f"{stage}: cannot stack {name}: its tensors have different shapes {listed[:4]}; {hint}")
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) == 1:  # the usual case: no conversion (``t.to`` of its own dtype is ``t`` anyway)
        (dtype,) = dtypes
        ts = tensors
    else:
        dtype = _common_dtype(tensors)
        ts = [t.to(dtype) for t in tensors]
    try:
        if _special_memory(pin_memory) and all(t.device.type == "cpu" and not t.requires_grad for t in ts):
            return torch.stack(ts, out=empty_host((len(ts), *tensors[0].shape), dtype, pin_memory=pin_memory))
        return torch.stack(ts)  # ordinary memory: torch allocates it (faster than stacking into ``out=``)
    except RuntimeError as exc:  # tensors on different devices...
        raise ValueError(f"{stage}: cannot stack {name}: {exc}") from exc


def _images_of_sizes(shapes: list[tuple[int, ...]]) -> bool:
    """Whether ``shapes`` are those of ``[C, H, W]`` images with the same channels and different sizes."""
    return all(len(s) == 3 and s[0] in (1, 3, 4) for s in shapes) and len({s[0] for s in shapes}) == 1


def _special_memory(pin_memory: bool) -> bool:
    """Whether :func:`empty_host` gives other than ordinary memory: pinned (with CUDA), or shared in a worker."""
    return (pin_memory and torch.cuda.is_available()) or torch.utils.data.get_worker_info() is not None


def _collate_column(
    values: list[Any], name: str, pin_memory: bool = False, stage: str = _COLLATE, tensors_only: bool = False
) -> Any:
    """Collate the values one field takes in the samples of a batch (the rule in the module docstring).

    With ``tensors_only`` (TorchGeo's ``stack_samples``), only tensors are
    stacked; numbers and arrays stay lists.
    """
    if tensors_only:
        if all(isinstance(v, torch.Tensor) for v in values):
            return _stack(values, name, stage, pin_memory)
        return list(values)
    if all(isinstance(v, torch.Tensor) for v in values):  # the usual case, checked first
        return _stack(values, name, stage, pin_memory)
    if all(_is_stackable(v) for v in values):
        return _stack([torch.as_tensor(v) for v in values], name, stage, pin_memory)
    if all(type(v) in _PLAIN_NUMBERS for v in values) or all(_is_number(v) for v in values):
        return default_collate(values)
    return list(values)


def _check_dicts(samples: list[Any], stage: str, same_keys: bool = True) -> None:
    """Refuse an empty batch, samples that are not dicts and (with ``same_keys``) samples whose keys differ."""
    if not samples:
        raise ValueError(f"{stage}: cannot collate an empty batch (it needs at least one sample)")
    first = samples[0]
    for i, s in enumerate(samples):
        if not isinstance(s, Mapping):
            raise TypeError(f"{stage}: samples must be dicts, but sample {i} is a {type(s).__name__}")
        if same_keys and s.keys() != first.keys():
            missing = [k for k in first if k not in s]
            extra = [k for k in s if k not in first]
            raise ValueError(
                f"{stage}: sample {i} has different keys from sample 0 (missing {missing!r}, extra {extra!r})"
            )


def _columns(samples: list[Mapping[Any, Any]]) -> dict[Any, list[Any]]:
    """``{key: [the values of the samples that have it]}``, keys in order of appearance."""
    columns: dict[Any, list[Any]] = {}
    for sample in samples:
        for key, value in sample.items():
            columns.setdefault(key, []).append(value)
    return columns


def collate_dicts(
    samples: Iterable[Mapping[Any, Any]],
    *,
    pin_memory: bool = False,
    name: str = _COLLATE,
    tensors_only: bool = False,
    same_keys: bool = True,
) -> dict:
    """Collate sample dicts with the same keys into one batch dict, key by key.

    The sample-dict collation shared by :func:`collate` and
    :func:`pipekit.geo.stack_samples`: each key is collated by the rule in the
    module docstring (tensors and arrays stacked, numbers to a tensor, the rest
    kept as a list).  Inside a DataLoader worker the stacked tensors are built
    in shared memory, with ``pin_memory`` in pinned memory (see :func:`empty_host`).

    Args:
        samples: a non-empty iterable of dicts with the same keys.
        pin_memory: write the stacked tensors into pinned host memory.
        name: how error messages name the caller.
        tensors_only: stack tensors only and keep every other value (numbers,
            arrays) as a list: TorchGeo's ``stack_samples`` rule.
        same_keys: refuse samples whose keys differ; with ``False`` a key
            collates the values of the samples that have it (TorchGeo's rule).

    Example:
        >>> import torch
        >>> from pipekit.collate import collate_dicts
        >>> batch = collate_dicts([{"image": torch.zeros(2, 2), "id": 7, "crs": "EPSG:4326", "x": 0.5}] * 3)
        >>> batch["image"].shape, batch["id"], batch["crs"], batch["x"].dtype
        (torch.Size([3, 2, 2]), tensor([7, 7, 7]), ['EPSG:4326', 'EPSG:4326', 'EPSG:4326'], torch.float64)
    """
    samples = list(samples)
    _check_dicts(samples, name, same_keys=same_keys)
    return {
        key: _collate_column(values, f"key {key!r}", pin_memory, name, tensors_only)
        for key, values in _columns(samples).items()
    }


def _pad_value_for(pad_value: PadValue | Mapping[Hashable, PadValue], key: Hashable) -> PadValue:
    if isinstance(pad_value, Mapping):
        return pad_value.get(key, 0)
    return pad_value


def _check_pad_mapping(pad_value: Any, padded: list[Hashable]) -> None:
    if isinstance(pad_value, Mapping):
        extra = [k for k in pad_value if k not in padded]
        if extra:
            raise ValueError(
                f"{_STAGE}: pad_value has entries for {extra!r}, which are not padded (padded: {padded!r})"
            )
        for k, v in pad_value.items():
            _check_pad_scalar(v, f"[{k!r}]")
    else:
        _check_pad_scalar(pad_value, "")


def _collate_dict(
    samples: list[Mapping[Any, Any]],
    pad_value: PadValue | Mapping[Hashable, PadValue],
    keys: Sequence[Hashable] | None,
    pin_memory: bool = False,
) -> dict[Any, Any]:
    _check_dicts(samples, _STAGE)
    first = samples[0]
    names = list(first.keys())
    if keys is None:
        padded = [k for k in names if _is_array(first[k])]
    else:
        padded = list(keys)
        for k in padded:
            if k not in first:
                raise ValueError(f"{_STAGE}: key {k!r} is not in the samples (keys: {names!r})")
    for k in padded:
        for i, s in enumerate(samples):
            if not _is_array(s[k]):
                raise TypeError(
                    f"{_STAGE}: key {k!r} of sample {i} is a {type(s[k]).__name__}, not a tensor; "
                    "only tensors can be padded"
                )
        sizes_key = f"{k}_sizes"
        if sizes_key in first:
            raise ValueError(
                f"{_STAGE}: cannot add {sizes_key!r} for padded key {k!r}: the samples already have that key"
            )
    _check_pad_mapping(pad_value, padded)
    out: dict[Any, Any] = {}
    for k in names:
        values = [s[k] for s in samples]
        if k in padded:
            out[k], out[f"{k}_sizes"] = pad_stack(
                values, _pad_value_for(pad_value, k), name=f"key {k!r}", pin_memory=pin_memory
            )
        else:
            out[k] = _collate_column(values, f"key {k!r}", pin_memory, _STAGE)
    return out


def _collate_fields(
    samples: list[Sequence[Any]],
    pad_value: PadValue | Mapping[Hashable, PadValue],
    keys: Sequence[Hashable] | None,
    pin_memory: bool = False,
) -> tuple[Any, tuple[torch.Tensor | None, ...]]:
    first = samples[0]
    n = len(first)
    for i, s in enumerate(samples):
        if not isinstance(s, (tuple, list)):
            raise TypeError(f"{_STAGE}: sample 0 is a {type(first).__name__} but sample {i} is a {type(s).__name__}")
        if len(s) != n:
            raise ValueError(f"{_STAGE}: sample 0 has {n} fields but sample {i} has {len(s)}")
    if keys is None:
        padded = [j for j in range(n) if _is_array(first[j])]
    else:
        padded = []
        for k in keys:
            if isinstance(k, bool) or not isinstance(k, int):
                raise TypeError(f"{_STAGE}: keys for tuple samples must be field indices (ints), got {k!r}")
            if not -n <= k < n:
                raise ValueError(f"{_STAGE}: field index {k} is out of range for samples with {n} fields")
            padded.append(k % n)
    if isinstance(pad_value, Mapping):
        pad_value = {(k % n if isinstance(k, int) and not isinstance(k, bool) else k): v for k, v in pad_value.items()}
    _check_pad_mapping(pad_value, padded)
    fields: list[Any] = []
    sizes: list[torch.Tensor | None] = []
    for j in range(n):
        values = [s[j] for s in samples]
        if j in padded:
            for i, v in enumerate(values):
                if not _is_array(v):
                    raise TypeError(
                        f"{_STAGE}: field {j} of sample {i} is a {type(v).__name__}, not a tensor; "
                        "only tensors can be padded"
                    )
            batch, size = pad_stack(values, _pad_value_for(pad_value, j), name=f"field {j}", pin_memory=pin_memory)
            fields.append(batch)
            sizes.append(size)
        else:
            fields.append(_collate_column(values, f"field {j}", pin_memory, _STAGE))
            sizes.append(None)
    if isinstance(first, tuple) and hasattr(first, "_fields"):  # namedtuple
        return type(first)(*fields), tuple(sizes)
    return type(first)(fields), tuple(sizes)


def pad_collate(
    samples: Sequence[Any],
    pad_value: PadValue | Mapping[Hashable, PadValue] = 0,
    keys: Sequence[Hashable] | None = None,
    *,
    pin_memory: bool = False,
) -> Any:
    """Collate samples into a batch, padding variable-size tensors.

    Each padded tensor is padded with ``pad_value`` up to the largest size of
    the batch along every dimension, then stacked, and its original size is
    returned next to it (see the table in :mod:`pipekit.collate`).

    Args:
        samples: a non-empty sequence of samples of the same structure: tensors
            (or NumPy arrays), tuples/lists of fields, or dicts.
        pad_value: the padding value, or a dict giving it per key (dict samples)
            or per field index (tuple samples); keys it does not name are padded
            with ``0``.
        keys: which dict keys (or tuple field indices) to pad.  ``None`` pads every
            field whose value is a tensor or array in the first sample.  Must be
            ``None`` for tensor samples.
        pin_memory: write the batch's tensors into pinned host memory
            (see the module docstring).

    Returns:
        ``(batch, sizes)`` for tensor and tuple samples, a dict for dict samples.

    Raises:
        ValueError: empty batch, samples of different structure, tensors with
            different numbers of dimensions, a ``"<key>_sizes"`` key that already
            exists, or a non-padded field whose tensors differ in shape.
        TypeError: a padded field that is not a tensor, or an unsupported sample type.

    Example:
        >>> import torch
        >>> from pipekit.collate import pad_collate
        >>> samples = [{"x": torch.tensor([1, 2, 3]), "id": "a"}, {"x": torch.tensor([4]), "id": "b"}]
        >>> batch = pad_collate(samples, pad_value=-1)
        >>> batch["x"], batch["x_sizes"], batch["id"]
        (tensor([[ 1,  2,  3],
                [ 4, -1, -1]]), tensor([[3],
                [1]]), ['a', 'b'])
        >>> batch, sizes = pad_collate([torch.zeros(2, 1), torch.zeros(1, 2)])
        >>> batch.shape, sizes.tolist()
        (torch.Size([2, 2, 2]), [[2, 1], [1, 2]])
    """
    if isinstance(samples, (str, bytes, torch.Tensor, np.ndarray, Mapping)) or not isinstance(samples, Sequence):
        raise TypeError(f"{_STAGE}: expected a list of samples, got {type(samples).__name__}")
    samples = list(samples)
    if not samples:
        raise ValueError(f"{_STAGE}: cannot collate an empty batch")
    if keys is not None and (isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence)):
        raise TypeError(f"{_STAGE}: keys must be a list of keys or None, got {keys!r}")
    first = samples[0]
    if _is_array(first):
        if keys is not None:
            raise ValueError(f"{_STAGE}: keys must be None when the samples are tensors")
        if isinstance(pad_value, Mapping):
            raise TypeError(f"{_STAGE}: pad_value must be a number when the samples are tensors")
        for i, s in enumerate(samples):
            if not _is_array(s):
                raise TypeError(f"{_STAGE}: sample 0 is a tensor but sample {i} is a {type(s).__name__}")
        return pad_stack(samples, pad_value, pin_memory=pin_memory)
    if isinstance(first, Mapping):
        return _collate_dict(samples, pad_value, keys, pin_memory)
    if isinstance(first, (tuple, list)):
        return _collate_fields(samples, pad_value, keys, pin_memory)
    raise TypeError(f"{_STAGE}: samples must be tensors, tuples/lists or dicts, got {type(first).__name__}")


def collate(samples: Sequence[Any], *, pin_memory: bool = False) -> Any:
    """Stack samples of equal shapes into a batch.

    * tensors and NumPy arrays are stacked along a new first axis (when shapes
      differ, the error names the key and points to :func:`pad_collate`);
    * numbers become a tensor (``int`` -> int64, ``float`` -> float64, as
      :func:`torch.utils.data.default_collate`);
    * everything else (``crs``, ``bounds``, strings, ``None``...) becomes a list;
    * dicts are collated key by key (:func:`collate_dicts`), tuples and lists
      field by field.

    A field is stacked or made a tensor only when all its values are of that
    kind; a mix (a tensor in one sample, ``None`` in another) is kept as a list.

    Args:
        samples: a non-empty sequence of samples of the same structure.
        pin_memory: write the stacked tensors into pinned host memory
            (see the module docstring).

    Example:
        >>> import torch
        >>> from pipekit.collate import collate
        >>> samples = [{"image": torch.zeros(3, 4, 4, dtype=torch.uint8), "crs": "EPSG:32615", "label": i}
        ...            for i in range(2)]
        >>> batch = collate(samples)
        >>> batch["image"].shape, batch["crs"], batch["label"]
        (torch.Size([2, 3, 4, 4]), ['EPSG:32615', 'EPSG:32615'], tensor([0, 1]))
    """
    if isinstance(samples, (str, bytes, torch.Tensor, np.ndarray, Mapping)) or not isinstance(samples, Sequence):
        raise TypeError(f"{_COLLATE}: expected a list of samples, got {type(samples).__name__}")
    samples = list(samples)
    if not samples:
        raise ValueError(f"{_COLLATE}: cannot collate an empty batch")
    first = samples[0]
    if _is_array(first):
        for i, s in enumerate(samples):
            if not _is_array(s):
                raise TypeError(f"{_COLLATE}: sample 0 is a tensor but sample {i} is a {type(s).__name__}")
        return _collate_column(samples, "the samples", pin_memory, _COLLATE)
    if isinstance(first, Mapping):
        return collate_dicts(samples, pin_memory=pin_memory)
    if isinstance(first, (tuple, list)):
        n = len(first)
        for i, s in enumerate(samples):
            if not isinstance(s, (tuple, list)) or len(s) != n:
                raise ValueError(f"{_COLLATE}: sample 0 has {n} fields but sample {i} does not: {s!r:.80}")
        fields = [_collate_column([s[j] for s in samples], f"field {j}", pin_memory, _COLLATE) for j in range(n)]
        if isinstance(first, tuple) and hasattr(first, "_fields"):  # namedtuple
            return type(first)(*fields)
        return type(first)(fields)
    return list(samples)
