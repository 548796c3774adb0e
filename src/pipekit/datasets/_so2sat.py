"""``datasets.So2Sat``: TorchGeo 0.8's So2Sat LCZ42 (Sentinel-1 + Sentinel-2 patches in HDF5, 17 climate zones).

HDF5 is read with ``h5py``, an optional dependency (the ``hdf5`` extra): it is
imported when a dataset is built, and its absence raises
:class:`~pipekit.errors.DependencyNotFoundError` saying what to install.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from pipekit._validate import check_callable, check_choice
from pipekit.datasets._download import calculate_md5
from pipekit.datasets._nongeo import NonGeoDataset
from pipekit.errors import DatasetNotFoundError, DependencyNotFoundError, HashError, RGBBandsMissingError

__all__ = ["So2Sat"]


def _h5py() -> Any:
    try:
        import h5py
    except ImportError:
        raise DependencyNotFoundError(
            "So2Sat reads HDF5 files with h5py, which is not installed: pip install 'pipekit[hdf5]' "
            "(or pip install h5py)") from None
    return h5py


class So2Sat(NonGeoDataset):
    """So2Sat LCZ42: 32x32 patches of 8 Sentinel-1 and 10 Sentinel-2 bands, 17 local climate zones (TorchGeo 0.8's).

    The versions and splits are TorchGeo's (:attr:`filenames_by_version`):
    version ``"2"`` has ``"train"`` (42 cities), ``"validation"`` (the western
    half of 10 other cities) and ``"test"`` (their eastern half)
    (``training.h5``, ``validation.h5``, ``testing.h5`` in ``root``); the
    version 3 splits ``"3_random"``, ``"3_block"`` and ``"3_culture_10"`` have
    ``"train"`` and ``"test"`` (``root/<random|block|culture_10>/{training,testing}.h5``).

    Samples are ``{"image": float32 [len(bands), 32, 32], "label": int64 []}``:
    the chosen Sentinel-1 bands (in the order given), then the chosen
    Sentinel-2 bands, and the index of the one-hot label.

    The files are not downloaded (several hours from an FTP server): fetch
    version 2 from https://dataserv.ub.tum.de/index.php/s/m1483140, e.g.
    ``wget ftp://m1483140:m1483140@dataserv.ub.tum.de/training.h5`` (and
    ``validation.h5``, ``testing.h5``) into ``root``; version 3 from
    https://mediatum.ub.tum.de/1613658, e.g.
    ``wget -P root/random/ ftp://m1613658:m1613658@dataserv.ub.tum.de/random/training.h5``.
    With ``checksum=True`` the file is checked against :attr:`md5s_by_version`.

    Reading needs ``h5py`` (``pip install 'pipekit[hdf5]'``).  Each process
    keeps its own open file (reopened after a fork, never pickled), so the
    dataset works with DataLoader workers.

    Args:
        root: the folder holding the ``.h5`` files.
        version: ``"2"``, ``"3_random"``, ``"3_block"`` or ``"3_culture_10"``.
        split: ``"train"``, ``"validation"`` (version 2 only) or ``"test"``.
        bands: band names, in order (:attr:`BAND_SETS`: ``"all"``, ``"s1"``, ``"s2"``, ``"rgb"``).
        transforms: a callable ``sample dict -> sample dict``.
        checksum: verify the file's MD5 (slow on the real 50 GB file).

    Raises:
        DependencyNotFoundError: h5py is not installed (naming the ``hdf5`` extra).
        DatasetNotFoundError: the split's file is not in ``root`` (the message
            says where to download it).
        HashError: ``checksum=True`` and the file's MD5 differs ("Dataset corrupted").
        ValueError: an unknown version, split (for the version) or band name.
        TypeError: ``transforms`` that is neither callable nor ``None``.

    Example:
        >>> import tempfile
        >>> from pipekit.datasets import DatasetNotFoundError, So2Sat
        >>> So2Sat.BAND_SETS["rgb"], len(So2Sat.classes)
        (('S2_B04', 'S2_B03', 'S2_B02'), 17)
        >>> try:
        ...     So2Sat(tempfile.mkdtemp(), split="validation")
        ... except DatasetNotFoundError as exc:
        ...     print("validation.h5" in str(exc))
        True
    """

    versions = ("2", "3_random", "3_block", "3_culture_10")
    filenames_by_version: ClassVar[dict[str, dict[str, str]]] = {
        "2": {"train": "training.h5", "validation": "validation.h5", "test": "testing.h5"},
        "3_random": {"train": "random/training.h5", "test": "random/testing.h5"},
        "3_block": {"train": "block/training.h5", "test": "block/testing.h5"},
        "3_culture_10": {"train": "culture_10/training.h5", "test": "culture_10/testing.h5"},
    }
    md5s_by_version: ClassVar[dict[str, dict[str, str]]] = {
        "2": {
            "train": "702bc6a9368ebff4542d791e53469244",
            "validation": "71cfa6795de3e22207229d06d6f8775d",
            "test": "e81426102b488623a723beab52b31a8a",
        },
        "3_random": {"train": "94e2e2e667b406c2adf61e113b42204e", "test": "1e15c425585ce816342d1cd779d453d8"},
        "3_block": {"train": "a91d6150e8b059dac86105853f377a11", "test": "6414af1ec33ace417e879f9c88066d47"},
        "3_culture_10": {"train": "702bc6a9368ebff4542d791e53469244", "test": "58335ce34ca3a18424e19da84f2832fc"},
    }
    #: where each version is downloaded by hand
    download_pages: ClassVar[dict[str, str]] = {
        "2": "https://dataserv.ub.tum.de/index.php/s/m1483140 (ftp://m1483140:m1483140@dataserv.ub.tum.de/{name})",
        "3": "https://mediatum.ub.tum.de/1613658 (ftp://m1613658:m1613658@dataserv.ub.tum.de/{name})",
    }

    classes = (
        "Compact high rise", "Compact mid rise", "Compact low rise", "Open high rise", "Open mid rise",
        "Open low rise", "Lightweight low rise", "Large low rise", "Sparsely built", "Heavy industry",
        "Dense trees", "Scattered trees", "Bush, scrub", "Low plants", "Bare rock or paved",
        "Bare soil or sand", "Water",
    )
    all_s1_band_names = ("S1_B1", "S1_B2", "S1_B3", "S1_B4", "S1_B5", "S1_B6", "S1_B7", "S1_B8")
    all_s2_band_names = ("S2_B02", "S2_B03", "S2_B04", "S2_B05", "S2_B06", "S2_B07", "S2_B08", "S2_B8A",
                         "S2_B11", "S2_B12")
    all_band_names = all_s1_band_names + all_s2_band_names
    rgb_bands = ("S2_B04", "S2_B03", "S2_B02")
    BAND_SETS: ClassVar[dict[str, tuple[str, ...]]] = {
        "all": all_band_names, "s1": all_s1_band_names, "s2": all_s2_band_names, "rgb": rgb_bands,
    }

    def __init__(
        self,
        root: str | os.PathLike[str] = "data",
        version: str = "2",
        split: str = "train",
        bands: Sequence[str] = BAND_SETS["all"],
        transforms: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        checksum: bool = False,
    ) -> None:
        where = type(self).__name__
        check_choice(version, "version", where, self.versions)
        splits = self.filenames_by_version[version]
        check_choice(split, "split", where, tuple(splits), context=f"for version {version!r}")
        if isinstance(bands, str) or not isinstance(bands, Sequence) or not bands:
            raise ValueError(f"{where}: bands must be a non-empty sequence of band names, got {bands!r}")
        for band in bands:
            if band not in self.all_band_names:
                raise ValueError(f"{where}: {band!r} is an invalid band name; the bands are: "
                                 f"{', '.join(self.all_band_names)}")
        check_callable(transforms, "transforms", where)
        h5py = _h5py()  # after the arguments: a bad one is refused as such, h5py installed or not
        self.s1_band_indices = np.array([self.all_s1_band_names.index(b) for b in bands
                                         if b in self.all_s1_band_names], dtype=int)
        self.s1_band_names = [self.all_s1_band_names[i] for i in self.s1_band_indices]
        self.s2_band_indices = np.array([self.all_s2_band_names.index(b) for b in bands
                                         if b in self.all_s2_band_names], dtype=int)
        self.s2_band_names = [self.all_s2_band_names[i] for i in self.s2_band_indices]
        self.bands = tuple(bands)
        self.root = os.fspath(root)
        self.version = version
        self.split = split
        self.transforms = transforms
        self.checksum = bool(checksum)
        self.fn = os.path.join(self.root, splits[split])
        self._verify()
        try:
            with h5py.File(self.fn, "r") as f:
                self.size: int = int(f["label"].shape[0])
        except (OSError, KeyError) as exc:
            raise DatasetNotFoundError(f"{where}: {self.fn!r} is not a So2Sat HDF5 file "
                                       f"({type(exc).__name__}: {exc})") from exc
        self._file: Any = None
        self._pid = -1

    def _verify(self) -> None:
        name = self.filenames_by_version[self.version][self.split]
        if not os.path.isfile(self.fn):
            page = self.download_pages["2" if self.version == "2" else "3"].format(name=name)
            raise DatasetNotFoundError(
                f"Dataset not found in `root={self.root!r}`: {type(self).__name__} cannot be downloaded "
                f"automatically. Download {name} (version {self.version}, split {self.split}) from {page} "
                f"and put it at {self.fn!r}.")
        if self.checksum:
            expected = self.md5s_by_version[self.version][self.split]
            actual = calculate_md5(self.fn)
            if actual != expected.lower():
                raise HashError("verify", self.fn, type(self).__name__,
                                f"Dataset corrupted: md5 mismatch: expected {expected}, got {actual}",
                                expected=expected, actual=actual)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_file"], state["_pid"] = None, -1  # an open HDF5 file is never pickled
        return state

    def _h5(self) -> Any:
        """This process's open file (opened again in a forked worker)."""
        if self._file is None or self._pid != os.getpid():
            self._file = _h5py().File(self.fn, "r")
            self._pid = os.getpid()
        return self._file

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not -self.size <= index < self.size:
            raise IndexError(f"{type(self).__name__}: index {index} is out of range for {self.size} samples")
        index %= self.size
        f = self._h5()
        s1 = np.take(np.asarray(f["sen1"][index], dtype=np.float32), self.s1_band_indices, axis=2)
        s2 = np.take(np.asarray(f["sen2"][index], dtype=np.float32), self.s2_band_indices, axis=2)
        image = np.concatenate([s1, s2], axis=2).transpose(2, 0, 1)
        label = torch.tensor(int(np.argmax(f["label"][index])), dtype=torch.int64)
        sample: dict[str, Any] = {"image": torch.from_numpy(np.ascontiguousarray(image)), "label": label}
        if self.transforms is not None:
            sample = self.transforms(sample)
        return sample

    def plot(self, sample: dict[str, Any], show_titles: bool = True, suptitle: str | None = None) -> Any:
        """Draw the RGB bands (stretched to their min and max) titled with the class (and ``"prediction"``).

        Raises:
            RGBBandsMissingError: ``bands`` lacks one of :attr:`rgb_bands`.
        """
        missing = [b for b in self.rgb_bands if b not in self.s2_band_names]
        if missing:
            raise RGBBandsMissingError(f"{type(self).__name__}: Dataset does not contain some of the RGB bands "
                                       f"(missing {', '.join(missing)}; bands={list(self.bands)})")
        from pipekit.datasets.utils import percentile_normalization
        from pipekit.geo._plot import require_matplotlib

        plt = require_matplotlib()
        offset = len(self.s1_band_names)
        indices = [offset + self.s2_band_names.index(b) for b in self.rgb_bands]
        image = percentile_normalization(np.asarray(sample["image"])[indices].transpose(1, 2, 0), 0, 100)
        fig, ax = plt.subplots(figsize=(4, 4))
        ax.imshow(image)
        ax.axis("off")
        if show_titles:
            title = f"Label: {self.classes[int(sample['label'])]}"
            if "prediction" in sample:
                title += f"\nPrediction: {self.classes[int(sample['prediction'])]}"
            ax.set_title(title)
        if suptitle is not None:
            fig.suptitle(suptitle)
        return fig
