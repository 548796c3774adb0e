"""``datasets.UCMerced``: TorchGeo 0.8's UC Merced Land Use (21 classes of 256x256 RGB chips), with ``download=True``.

Also the helpers the split-list classification benchmarks share (:class:`~pipekit.datasets.RESISC45` too):
reading a split's list of file names, and drawing a chip with its label.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import torch

from pipekit._validate import check_callable, check_choice
from pipekit.datasets._download import check_integrity, dataset_not_found, extract_archive, fetch_for_dataset
from pipekit.datasets._eurosat import _InSplit
from pipekit.datasets._nongeo import NonGeoClassificationDataset
from pipekit.errors import ParseError

__all__ = ["UCMerced"]


def read_split_list(path: str, stage: str) -> _InSplit:
    """The chips a split list names (one file name a line), as an ``is_valid_file`` (picklable)."""
    try:
        with open(path, encoding="utf-8") as f:
            names = {line.strip() for line in f if line.strip()}
    except UnicodeDecodeError as exc:
        raise ParseError("read split list", path, stage, f"not a text file: {exc}") from exc
    if not names:
        raise ParseError("read split list", path, stage, "the split list is empty")
    return _InSplit(names)


def plot_chip(
    dataset: NonGeoClassificationDataset, sample: dict[str, Any], show_titles: bool, suptitle: str | None
) -> Any:
    """A classification sample's RGB chip (0-255 scaled to [0, 1]) titled with its label and any ``prediction``."""
    from pipekit.geo._plot import require_matplotlib

    plt = require_matplotlib()
    image = np.asarray(sample["image"], dtype=np.float32).transpose(1, 2, 0)
    if image.max() > 1:
        image = image / 255.0
    fig, ax = plt.subplots(figsize=(4, 4))
    ax.imshow(np.clip(image, 0, 1))
    ax.axis("off")
    if show_titles:
        title = f"Label: {dataset.classes[int(sample['label'])]}"
        if "prediction" in sample:
            title += f"\nPrediction: {dataset.classes[int(sample['prediction'])]}"
        ax.set_title(title)
    if suptitle is not None:
        fig.suptitle(suptitle)
    return fig


class SplitListed(NonGeoClassificationDataset):
    """A classification benchmark whose split is a list of file names in ``root`` (UCMerced, RESISC45).

    A subclass names the list (:meth:`_split_list_name`) and the class folders' parent (:meth:`_images_folder`),
    and its ``_verify`` fetches what is missing.
    """

    splits: tuple[str, ...] = ("train", "val", "test")

    def __init__(
        self,
        root: str | os.PathLike[str] = "data",
        split: str = "train",
        transforms: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        download: bool = False,
        checksum: bool = False,
    ) -> None:
        where = type(self).__name__
        check_choice(split, "split", where, self.splits)
        check_callable(transforms, "transforms", where)
        self.root = os.fspath(root)
        self.split = split
        self.download = bool(download)
        self.checksum = bool(checksum)
        self._verify()
        split_file = os.path.join(self.root, self._split_list_name(split))
        super().__init__(os.path.join(self.root, self._images_folder()), transforms=transforms,
                         is_valid_file=read_split_list(split_file, where))
        # ``root`` is now the class folders' parent, as TorchGeo's; the archive and the lists stay in the root given

    def _split_list_name(self, split: str) -> str:
        raise NotImplementedError

    def _images_folder(self) -> str:
        raise NotImplementedError

    def _verify(self) -> None:
        raise NotImplementedError


class UCMerced(SplitListed):
    """UC Merced Land Use: 2,100 RGB chips of 256x256 pixels (1 ft), 21 land-use classes (TorchGeo 0.8's).

    The same files, layout and splits as ``torchgeo.datasets.UCMerced``:
    ``root/UCMerced_LandUse.zip`` extracts to ``root/UCMerced_LandUse/Images/<class>/<class>NN.tif``
    and ``root/uc_merced-<split>.txt`` lists the split's chips (the train/val/test
    splits of "In-domain representation learning for remote sensing").  Samples are
    ``{"image": float32 [3, 256, 256] (0-255), "label": int64 []}``; the few chips of
    another size are resized to 256x256 (bilinear, antialiased, as TorchGeo).

    With ``download=True`` missing files are fetched from :attr:`url` (``url + filename``,
    ``url + split_filenames[split]``) with a resumable download (with
    ``checksum=True`` verified against :attr:`md5` / :attr:`split_md5s` before
    being kept) and extracted safely; a failed or refused download says which
    file to fetch by hand and where to put it.  :meth:`pipe` makes it a pipe for
    :class:`pipekit.DataLoader` with exact mid-epoch resume.

    Args:
        root: the folder holding (or receiving) the files.
        split: ``"train"``, ``"val"`` or ``"test"``.
        transforms: a callable ``sample dict -> sample dict``.
        download: download what is missing.
        checksum: verify the MD5 of what is downloaded.

    Raises:
        DatasetNotFoundError: the data is not in ``root`` and ``download=False``
            (the message says what to fetch by hand).
        ValueError: an unknown ``split`` (TorchGeo: ``AssertionError``).
        TypeError: ``transforms`` that is neither callable nor ``None``.

    Example:
        >>> import tempfile
        >>> from pipekit.datasets import DatasetNotFoundError, UCMerced
        >>> UCMerced.splits, UCMerced.split_filenames["val"]
        (('train', 'val', 'test'), 'uc_merced-val.txt')
        >>> try:
        ...     UCMerced(tempfile.mkdtemp())
        ... except DatasetNotFoundError as exc:
        ...     print("Dataset not found" in str(exc), "UCMerced_LandUse.zip" in str(exc))
        True True
    """

    url = "https://hf.co/datasets/torchgeo/ucmerced/resolve/7c5ef3454d9b1cccfa7ccde0c01fc8f00a45909a/"
    filename = "UCMerced_LandUse.zip"
    md5 = "5b7ec56793786b6dc8a908e8854ac0e4"
    #: the class folders' parent inside the archive
    base_dir = os.path.join("UCMerced_LandUse", "Images")
    splits = ("train", "val", "test")
    split_filenames: ClassVar[dict[str, str]] = {
        "train": "uc_merced-train.txt",
        "val": "uc_merced-val.txt",
        "test": "uc_merced-test.txt",
    }
    split_md5s: ClassVar[dict[str, str]] = {
        "train": "f2fb12eb2210cfb53f93f063a35ff374",
        "val": "11ecabfc52782e5ea6a9c7c0d263aca0",
        "test": "046aff88472d8fc07c4678d03749e28d",
    }
    #: the chips' size (height, width) in samples
    size = (256, 256)

    def _split_list_name(self, split: str) -> str:
        return self.split_filenames[split]

    def _images_folder(self) -> str:
        return self.base_dir

    def _needed(self) -> list[tuple[str, str, str | None]]:
        return [(self.url + self.filename, os.path.join(self.root, self.filename), self.md5),
                (self.url + self.split_filenames[self.split],
                 os.path.join(self.root, self.split_filenames[self.split]), self.split_md5s[self.split])]

    def _verify(self) -> None:
        """Find the chips and the split list in ``root``, extracting or downloading what is missing."""
        where = type(self).__name__
        archive = os.path.join(self.root, self.filename)
        if not os.path.isdir(os.path.join(self.root, self.base_dir)):
            if check_integrity(archive, self.md5 if self.checksum else None):
                extract_archive(archive, self.root)
            elif self.download:
                fetch_for_dataset(where, self.url + self.filename, self.root, self.filename, self.md5,
                                  verify=self.checksum, extract=True)
            else:
                raise dataset_not_found(where, self.root, self._needed(), False)
        for split in self.splits if self.download else (self.split,):
            name = self.split_filenames[split]
            if os.path.isfile(os.path.join(self.root, name)):
                continue
            if not self.download:
                raise dataset_not_found(where, self.root, self._needed()[1:], False)
            fetch_for_dataset(where, self.url + name, self.root, name, self.split_md5s[split], verify=self.checksum)

    def _load_image(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image, label = super()._load_image(index)
        if tuple(image.shape[-2:]) != self.size:  # torchvision's resize of a float image, as TorchGeo's
            image = torch.nn.functional.interpolate(image[None], size=self.size, mode="bilinear",
                                                    align_corners=False, antialias=True)[0]
        return image, label

    def plot(self, sample: dict[str, Any], show_titles: bool = True, suptitle: str | None = None) -> Any:
        """Draw a sample's chip titled with its label (and its ``"prediction"``, if any); returns the Figure."""
        return plot_chip(self, sample, show_titles, suptitle)
