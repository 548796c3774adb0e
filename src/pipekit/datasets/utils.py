"""TorchGeo 0.8's ``torchgeo.datasets.utils``, the names of it that geo data loading code uses.

>>> from pipekit.datasets.utils import BoundingBox, GeoSlice, stack_samples, unbind_samples

* :data:`GeoSlice` (the query type), :class:`~pipekit.geo.BoundingBox`
  (pipekit's, still accepted as a query: TorchGeo 0.8 deprecates its own);
* the collate functions :func:`stack_samples`, :func:`concat_samples`,
  :func:`merge_samples`, :func:`unbind_samples` (:mod:`pipekit.geo._collate`);
* :func:`disambiguate_timestamp` (the time interval a date in a file name
  stands for) and :func:`array_to_tensor`;
* TorchGeo's small helpers: :data:`Path` (the path type), :func:`working_dir`,
  :func:`percentile_normalization`, :func:`lazy_import`, :func:`which` and
  :class:`Executable` (:class:`~pipekit.errors.DependencyNotFoundError` when
  a package or command is missing);
* the download helpers TorchGeo re-exports from here (torchvision's there):
  ``download_url``, ``download_and_extract_archive``, ``extract_archive``,
  ``check_integrity``; pipekit's own (:mod:`pipekit.datasets._download`:
  resumable, ``sha256=``, fsspec URLs; :mod:`pipekit.datasets._extract`: safe
  extraction, all or nothing, within limits on bytes, members and expansion
  ratio), same signatures plus keyword arguments.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any, TypeAlias

import numpy as np
import pandas as pd
import torch

from pipekit.datasets._download import (
    check_integrity,
    download_and_extract_archive,
    download_url,
    extract_archive,
)
from pipekit.errors import DatasetNotFoundError, DependencyNotFoundError
from pipekit.geo._bbox import BoundingBox, GeoSlice, to_time
from pipekit.geo._collate import concat_samples, merge_samples, stack_samples, unbind_samples
from pipekit.geo.catalog._dates import date_interval

__all__ = [
    "BoundingBox",
    "DatasetNotFoundError",
    "DependencyNotFoundError",
    "Executable",
    "Path",
    "lazy_import",
    "percentile_normalization",
    "which",
    "working_dir",
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


#: A local path or URL, as TorchGeo's ``torchgeo.datasets.utils.Path``.
Path: TypeAlias = str | os.PathLike[str]


@contextlib.contextmanager
def working_dir(dirname: Path, create: bool = False) -> Iterator[None]:
    """Run the ``with`` block in ``dirname`` (created first when ``create``), then go back.

    Example:
        >>> import tempfile
        >>> top = tempfile.mkdtemp()
        >>> with working_dir(os.path.join(top, "a", "b"), create=True):
        ...     os.getcwd() == os.path.realpath(os.path.join(top, "a", "b"))
        True
    """
    if create:
        os.makedirs(dirname, exist_ok=True)
    previous = os.getcwd()
    os.chdir(dirname)
    try:
        yield
    finally:
        os.chdir(previous)


def percentile_normalization(
    img: np.ndarray, lower: float = 2, upper: float = 98, axis: int | tuple[int, ...] | None = None
) -> np.ndarray:
    """``img`` stretched between its ``lower`` and ``upper`` percentiles and clipped to ``[0, 1]`` (TorchGeo's).

    Example:
        >>> percentile_normalization(np.array([[1, 2], [98, 100]]), 2, 98).round(2).tolist()
        [[0.0, 0.01], [0.98, 1.0]]
    """
    if not lower < upper:
        raise ValueError(f"percentile_normalization: lower must be less than upper, got {lower} and {upper}")
    low = np.percentile(img, lower, axis=axis)
    high = np.percentile(img, upper, axis=axis)
    return np.clip((img - low) / (high - low + 1e-5), 0, 1)


def lazy_import(name: str) -> Any:
    """The module ``name``, imported; :class:`~pipekit.errors.DependencyNotFoundError` naming what to install.

    Example:
        >>> lazy_import("collections.abc").__name__
        'collections.abc'
    """
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError:
        package = name.split(".")[0].replace("_", "-")
        package = {"skimage": "scikit-image"}.get(package, package)
        raise DependencyNotFoundError(
            f"{package} is not installed and is required to use this feature. Either run:\n"
            f"$ pip install {package}\nto install just this dependency, or:\n"
            '$ pip install "pipekit[geo]"\nfor the geospatial extra.'
        ) from None


class Executable:
    """A command-line program, called with its arguments (``subprocess.run(..., check=True)``; TorchGeo's)."""

    def __init__(self, name: Path) -> None:
        self.name = name

    def __call__(self, *args: Any, **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        kwargs["check"] = True
        return subprocess.run((self.name, *args), **kwargs)

    def __repr__(self) -> str:
        return f"Executable({self.name!r})"


def which(name: Path) -> Executable:
    """The program ``name`` found on ``PATH``; :class:`~pipekit.errors.DependencyNotFoundError` when it is not.

    Example:
        >>> which("sh").name.endswith("sh")
        True
    """
    found = shutil.which(name)
    if found is None:
        raise DependencyNotFoundError(f"{name} is not installed and is required to use this dataset (not on PATH).")
    return Executable(found)
