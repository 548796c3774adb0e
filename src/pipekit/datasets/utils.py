"""TorchGeo 0.8's ``torchgeo.datasets.utils``, the names of it that geo data loading code uses.

>>> from pipekit.datasets.utils import BoundingBox, GeoSlice, stack_samples, unbind_samples

* :data:`GeoSlice` (the query type), :class:`~pipekit.geo.BoundingBox`
  (pipekit's, still accepted as a query: TorchGeo 0.8 deprecates its own);
* the collate functions :func:`stack_samples`, :func:`concat_samples`,
  :func:`merge_samples`, :func:`unbind_samples` (:mod:`pipekit.geo._collate`);
* :func:`disambiguate_timestamp` (the time interval a date in a file name
  stands for) and :func:`array_to_tensor`;
* the download helpers TorchGeo re-exports from here (torchvision's there):
  ``download_url``, ``download_and_extract_archive``, ``extract_archive``,
  ``check_integrity``; pipekit's own (:mod:`pipekit.datasets._download`:
  resumable, ``sha256=``, fsspec URLs; :mod:`pipekit.datasets._extract`: safe
  extraction, all or nothing, within limits on bytes, members and expansion
  ratio), same signatures plus keyword arguments.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from pipekit.datasets._download import (
    check_integrity,
    download_and_extract_archive,
    download_url,
    extract_archive,
)
from pipekit.errors import DatasetNotFoundError
from pipekit.geo._bbox import BoundingBox, GeoSlice, to_time
from pipekit.geo._collate import concat_samples, merge_samples, stack_samples, unbind_samples
from pipekit.geo.catalog._dates import date_interval

__all__ = [
    "BoundingBox",
    "DatasetNotFoundError",
    "GeoSlice",
    "array_to_tensor",
    "concat_samples",
    "disambiguate_timestamp",
    "merge_samples",
    "stack_samples",
    "unbind_samples",
    "check_integrity",
    "download_and_extract_archive",
    "download_url",
    "extract_archive",
]


def disambiguate_timestamp(date_str: str, format: str) -> tuple[pd.Timestamp, pd.Timestamp]:
    """The ``(start, end)`` Timestamps a partial date stands for: ``"2023"`` with ``"%Y"`` is the whole year.

    As TorchGeo's: the end is one microsecond before the next period.

    Example:
        >>> disambiguate_timestamp("2023", "%Y")
        (Timestamp('2023-01-01 00:00:00'), Timestamp('2023-12-31 23:59:59.999999'))
    """
    start, end = date_interval(date_str, format)
    return to_time(start), to_time(end)


def array_to_tensor(array: np.ndarray) -> torch.Tensor:
    """A copy of ``array`` as a tensor, ``uint16`` as int32 and ``uint32`` as int64 (TorchGeo's helper).

    Example:
        >>> array_to_tensor(np.array([65535], dtype=np.uint16))
        tensor([65535], dtype=torch.int32)
    """
    if array.dtype == np.uint16:
        array = array.astype(np.int32)
    elif array.dtype == np.uint32:
        array = array.astype(np.int64)
    return torch.tensor(array)
