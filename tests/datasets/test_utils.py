"""pipekit.datasets.utils and the TorchGeo 0.8 names of pipekit.datasets."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from pipekit import datasets
from pipekit.datasets.utils import array_to_tensor, disambiguate_timestamp

#: the names of ``torchgeo.datasets.__all__`` (0.8.1) for raster geo data that pipekit provides
TORCHGEO_DATASETS_IN_SCOPE = [
    "BoundingBox", "CDL", "DatasetNotFoundError", "GeoDataset", "IntersectionDataset", "Landsat", "Landsat7",
    "Landsat8", "Landsat9", "NAIP", "RasterDataset", "Sentinel2", "UnionDataset", "concat_samples",
    "merge_samples", "stack_samples", "unbind_samples",
]


def test_torchgeo_names_are_there():
    assert [n for n in TORCHGEO_DATASETS_IN_SCOPE if n not in datasets.__all__] == []
    for name in datasets.__all__:
        assert hasattr(datasets, name), name
    assert issubclass(datasets.Landsat8, datasets.Landsat) and issubclass(datasets.Landsat, datasets.RasterDataset)
    assert issubclass(datasets.DatasetNotFoundError, FileNotFoundError)
    from pipekit.datasets.utils import download_and_extract_archive, download_url  # TorchGeo re-exports them

    assert callable(download_url) and callable(download_and_extract_archive)
    with pytest.raises(AttributeError):
        datasets.utils.no_such_name


@pytest.mark.parametrize(
    ("text", "fmt", "start", "end"),
    [
        ("2023", "%Y", pd.Timestamp(2023, 1, 1), pd.Timestamp(2023, 12, 31, 23, 59, 59, 999999)),
        ("202312", "%Y%m", pd.Timestamp(2023, 12, 1), pd.Timestamp(2023, 12, 31, 23, 59, 59, 999999)),
        ("20230715", "%Y%m%d", pd.Timestamp(2023, 7, 15), pd.Timestamp(2023, 7, 15, 23, 59, 59, 999999)),
        ("20220902T090559", "%Y%m%dT%H%M%S", pd.Timestamp(2022, 9, 2, 9, 5, 59),
         pd.Timestamp(2022, 9, 2, 9, 5, 59, 999999)),
    ],
)
def test_disambiguate_timestamp_as_torchgeo(text, fmt, start, end):
    assert disambiguate_timestamp(text, fmt) == (start, end)


def test_array_to_tensor():
    assert array_to_tensor(np.array([1, 65535], dtype=np.uint16)).dtype == torch.int32
    assert array_to_tensor(np.array([2**32 - 1], dtype=np.uint32)).tolist() == [2**32 - 1]
    source = np.zeros(3, dtype=np.float32)
    copied = array_to_tensor(source)
    source[0] = 5
    assert copied[0] == 0  # a copy, as TorchGeo's


def test_no_files_raises_torchgeos_error(tmp_path):
    with pytest.raises(datasets.DatasetNotFoundError, match="no files"):
        datasets.RasterDataset(tmp_path)


def test_torchgeo_helpers(tmp_path, monkeypatch):
    import os

    from pipekit.datasets.utils import lazy_import, percentile_normalization, which, working_dir
    from pipekit.errors import DependencyNotFoundError

    monkeypatch.chdir(tmp_path)
    with working_dir(tmp_path / "a" / "b", create=True):
        assert os.getcwd() == str((tmp_path / "a" / "b").resolve())
    assert os.getcwd() == str(tmp_path.resolve())
    stretched = percentile_normalization(np.array([[1.0, 2.0], [98.0, 100.0]]), 2, 98)
    assert stretched.min() == 0 and stretched.max() == 1
    with pytest.raises(ValueError, match="lower must be less than upper"):
        percentile_normalization(np.zeros(3), 50, 50)
    assert lazy_import("collections.abc").__name__ == "collections.abc"
    with pytest.raises(DependencyNotFoundError, match="pip install no-such-pkg\n") as info:
        lazy_import("no_such_pkg.sub")
    assert isinstance(info.value, ModuleNotFoundError)
    assert which("sh")("-c", "exit 0", capture_output=True).returncode == 0
    with pytest.raises(DependencyNotFoundError, match="no-such-command is not installed"):
        which("no-such-command")
