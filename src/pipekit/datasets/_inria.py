"""``datasets.InriaAerialImageLabeling``: TorchGeo 0.8's Inria building segmentation tiles (a manual download)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from pipekit._validate import check_callable, check_choice
from pipekit.datasets._download import calculate_md5, extract_archive
from pipekit.datasets._nongeo import NonGeoDataset, read_chip
from pipekit.errors import DatasetNotFoundError, HashError

__all__ = ["InriaAerialImageLabeling"]

_CITY_INDEX = re.compile(r"([A-Za-z]+)(\d+)")


class InriaAerialImageLabeling(NonGeoDataset):
    """Inria Aerial Image Labeling: 0.3 m RGB aerial tiles and building masks (TorchGeo 0.8's).

    360 GeoTIFF tiles of 5000x5000 pixels over ten cities: 180 training
    tiles with masks (Austin, Chicago, Kitsap, West Tyrol, Vienna) and 180
    test tiles without (Bellingham, Bloomington, Innsbruck, San Francisco,
    East Tyrol).  As TorchGeo does, the training tiles whose city index is
    1-5 (``austin1.tif`` ... ``austin5.tif``, every city) are the ``"val"``
    split and those from 6 on the ``"train"`` split; ``"test"`` is the test
    tiles.  Tiles are in sorted file-name order.

    Samples are ``{"image": float32 [3, H, W], "mask": int64 [H, W]}`` (the
    mask 1 on buildings, 0 elsewhere; ``"test"`` samples have no mask).

    The host needs a registration, so there is no ``download=``: fetch the
    archive by hand from https://project.inria.fr/aerialimagelabeling/download/
    (the 7-Zip parts ``aerialimagelabeling.7z.001`` ... ``.005``;
    ``7z x aerialimagelabeling.7z.001`` gives ``NEW2-AerialImageDataset.zip``)
    and put ``NEW2-AerialImageDataset.zip`` in ``root``: it is checked
    against :attr:`md5` with ``checksum=True`` and extracted safely to
    ``root/AerialImageDataset/{train,test}/...``.  A ``root`` that already holds
    ``AerialImageDataset/`` is used as it is.

    Args:
        root: the folder holding the archive or ``AerialImageDataset/``.
        split: ``"train"``, ``"val"`` or ``"test"``.
        transforms: a callable ``sample dict -> sample dict``.
        checksum: verify the archive's MD5 before extracting it.

    Raises:
        DatasetNotFoundError: neither ``AerialImageDataset/`` nor the archive
            is in ``root`` (the message says what to download), or the split
            has no tile, or a training tile has no mask.
        HashError: ``checksum=True`` and the archive's MD5 is not :attr:`md5`
            (a ``RuntimeError``; "Dataset corrupted", naming the archive).
        ValueError: an unknown ``split``.
        TypeError: ``transforms`` that is neither callable nor ``None``.

    Example:
        >>> import tempfile
        >>> from pipekit.datasets import DatasetNotFoundError, InriaAerialImageLabeling
        >>> try:
        ...     InriaAerialImageLabeling(tempfile.mkdtemp())
        ... except DatasetNotFoundError as exc:
        ...     print("NEW2-AerialImageDataset.zip" in str(exc))
        True
    """

    directory = "AerialImageDataset"
    filename = "NEW2-AerialImageDataset.zip"
    md5 = "4b1acfe84ae9961edc1a6049f940380f"
    #: where the archive is downloaded by hand (after registering)
    url = "https://project.inria.fr/aerialimagelabeling/download/"
    splits = ("train", "val", "test")

    def __init__(
        self,
        root: str | os.PathLike[str] = "data",
        split: str = "train",
        transforms: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        checksum: bool = False,
    ) -> None:
        where = type(self).__name__
        check_choice(split, "split", where, self.splits)
        check_callable(transforms, "transforms", where)
        self.root = os.fspath(root)
        self.split = split
        self.transforms = transforms
        self.checksum = bool(checksum)
        self._verify()
        self.files = self._load_files()

    def _load_files(self) -> list[dict[str, str]]:
        """``[{"image": path(, "label": path)}]`` of the split, in sorted file-name order."""
        folder = os.path.join(self.root, self.directory, "test" if self.split == "test" else "train")
        images_dir = os.path.join(folder, "images")
        names = sorted(n for n in os.listdir(images_dir) if n.endswith(".tif")) if os.path.isdir(images_dir) else []
        files = []
        for name in names:
            image = os.path.join(images_dir, name)
            if self.split == "test":
                files.append({"image": image})
                continue
            match = _CITY_INDEX.search(name)  # the file name's, not the path's (a folder "test0" is no city)
            if match is None:
                continue
            if (int(match.group(2)) <= 5) != (self.split == "val"):
                continue
            label = os.path.join(folder, "gt", name)
            if not os.path.isfile(label):
                raise DatasetNotFoundError(f"{type(self).__name__}: the tile {image!r} has no mask {label!r}")
            files.append({"image": image, "label": label})
        if not files:
            raise DatasetNotFoundError(f"{type(self).__name__}: no {self.split!r} tile (<city><n>.tif) in "
                                       f"{images_dir!r}")
        return files

    def _verify(self) -> None:
        """Find ``AerialImageDataset/`` in ``root``, or extract it from the archive (checking its MD5)."""
        if os.path.isdir(os.path.join(self.root, self.directory)):
            return
        archive = os.path.join(self.root, self.filename)
        if not os.path.isfile(archive):
            raise DatasetNotFoundError(
                f"Dataset not found in `root={self.root!r}`: {type(self).__name__} cannot be downloaded "
                f"automatically (the host needs a registration). Download it from {self.url} (the parts "
                f"aerialimagelabeling.7z.001 to .005; `7z x aerialimagelabeling.7z.001` gives {self.filename}) "
                f"and put {self.filename} in {self.root!r}, or extract it there ({self.directory}/train, "
                f"{self.directory}/test).")
        if self.checksum:
            actual = calculate_md5(archive)
            if actual != self.md5.lower():
                raise HashError("verify", archive, type(self).__name__,
                                f"Dataset corrupted: md5 mismatch: expected {self.md5}, got {actual}",
                                expected=self.md5, actual=actual)
        extract_archive(archive)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> dict[str, Any]:
        files = self.files[index]
        stage = type(self).__name__
        sample: dict[str, Any] = {"image": read_chip(files["image"], stage=stage)}
        if "label" in files:
            mask = read_chip(files["label"], stage=stage)[0]
            sample["mask"] = mask.clamp(0, 1).to(torch.int64)
        if self.transforms is not None:
            sample = self.transforms(sample)
        return sample

    def plot(self, sample: dict[str, Any], show_titles: bool = True, suptitle: str | None = None) -> Any:
        """Draw the image (percentile-stretched), its mask and a ``"prediction"`` when present; the Figure."""
        from pipekit.datasets.utils import percentile_normalization
        from pipekit.geo._plot import require_matplotlib

        plt = require_matplotlib()
        image = np.asarray(sample["image"][:3]).transpose(1, 2, 0)
        panels = [("Image", percentile_normalization(image, axis=(0, 1)))]
        panels += [(title, np.asarray(sample[key])) for key, title in (("mask", "Label"), ("prediction", "Prediction"))
                   if key in sample]
        fig, axs = plt.subplots(ncols=len(panels), figsize=(len(panels) * 4, 4), squeeze=False)
        for ax, (title, array) in zip(axs[0], panels):
            ax.imshow(array, interpolation="none")
            ax.axis("off")
            if show_titles:
                ax.set_title(title)
        if suptitle is not None:
            fig.suptitle(suptitle)
        return fig
