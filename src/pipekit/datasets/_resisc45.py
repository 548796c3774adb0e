"""``datasets.RESISC45``: TorchGeo 0.8's NWPU-RESISC45 (45 scene classes of 256x256 RGB chips), downloadable."""

from __future__ import annotations

import os
from typing import Any, ClassVar

from pipekit.datasets._download import check_integrity, dataset_not_found, extract_archive, fetch_for_dataset
from pipekit.datasets._ucmerced import SplitListed, plot_chip

__all__ = ["RESISC45"]

_HF = "https://hf.co/datasets/isaaccorley/resisc45/resolve/883edc0eee77b2c84225472f10f126e3ed83fa6e/"


class RESISC45(SplitListed):
    """NWPU-RESISC45: 31,500 RGB chips of 256x256 pixels, 45 scene classes (TorchGeo 0.8's).

    The same files, layout and splits as ``torchgeo.datasets.RESISC45``:
    ``root/NWPU-RESISC45.zip`` extracts to ``root/NWPU-RESISC45/<class>/<class>_NNN.jpg``
    and ``root/resisc45-<split>.txt`` lists the split's chips (the train/val/test
    splits of "In-domain representation learning for remote sensing").  Samples are
    ``{"image": float32 [3, 256, 256] (0-255), "label": int64 []}``.

    With ``download=True`` missing files are fetched from :attr:`url` and
    :attr:`split_urls` with a resumable download (with ``checksum=True``
    verified against :attr:`md5` / :attr:`split_md5s` before being kept) and
    extracted safely; a failed or refused download says which file to fetch by
    hand and where to put it.  :meth:`pipe` makes it a pipe for
    :class:`pipekit.DataLoader` with exact mid-epoch resume.

    Args:
        root: the folder holding (or receiving) the files.
        split: ``"train"``, ``"val"`` or ``"test"``.
        transforms: a callable ``sample dict -> sample dict``.
        download: download what is missing.
        checksum: verify the MD5 of what is downloaded (and of an archive found in ``root``).

    Raises:
        DatasetNotFoundError: the data is not in ``root`` and ``download=False``
            (the message says what to fetch by hand).
        ValueError: an unknown ``split`` (TorchGeo: ``AssertionError``).
        TypeError: ``transforms`` that is neither callable nor ``None``.

    Example:
        >>> import tempfile
        >>> from pipekit.datasets import DatasetNotFoundError, RESISC45
        >>> RESISC45.directory, RESISC45.split_filename("test")
        ('NWPU-RESISC45', 'resisc45-test.txt')
        >>> try:
        ...     RESISC45(tempfile.mkdtemp())
        ... except DatasetNotFoundError as exc:
        ...     print("Dataset not found" in str(exc), "NWPU-RESISC45.zip" in str(exc))
        True True
    """

    url = _HF + "NWPU-RESISC45.zip"
    md5 = "75206b2e16446591afa88e2628744886"
    filename = "NWPU-RESISC45.zip"
    #: the class folders' parent inside the archive
    directory = "NWPU-RESISC45"
    splits = ("train", "val", "test")
    split_urls: ClassVar[dict[str, str]] = {
        "train": _HF + "resisc45-train.txt",
        "val": _HF + "resisc45-val.txt",
        "test": _HF + "resisc45-test.txt",
    }
    split_md5s: ClassVar[dict[str, str]] = {
        "train": "b5a4c05a37de15e4ca886696a85c403e",
        "val": "a0770cee4c5ca20b8c32bbd61e114805",
        "test": "3dda9e4988b47eb1de9f07993653eb08",
    }

    def _split_list_name(self, split: str) -> str:
        return self.split_filename(split)

    def _images_folder(self) -> str:
        return self.directory

    @staticmethod
    def split_filename(split: str) -> str:
        """The name of ``split``'s list in ``root``: ``resisc45-<split>.txt``."""
        return f"resisc45-{split}.txt"

    def _needed(self) -> list[tuple[str, str, str | None]]:
        return [(self.url, os.path.join(self.root, self.filename), self.md5),
                (self.split_urls[self.split], os.path.join(self.root, self.split_filename(self.split)),
                 self.split_md5s[self.split])]

    def _verify(self) -> None:
        """Find the chips and the split list in ``root``, extracting or downloading what is missing."""
        where = type(self).__name__
        archive = os.path.join(self.root, self.filename)
        if not os.path.isdir(os.path.join(self.root, self.directory)):
            if check_integrity(archive, self.md5 if self.checksum else None):
                extract_archive(archive, self.root)
            elif self.download:
                fetch_for_dataset(where, self.url, self.root, self.filename, self.md5, verify=self.checksum,
                                  extract=True)
            else:
                raise dataset_not_found(where, self.root, self._needed(), False)
        for split in self.splits if self.download else (self.split,):
            name = self.split_filename(split)
            if os.path.isfile(os.path.join(self.root, name)):
                continue
            if not self.download:
                raise dataset_not_found(where, self.root, self._needed()[1:], False)
            fetch_for_dataset(where, self.split_urls[split], self.root, name, self.split_md5s[split],
                              verify=self.checksum)

    def plot(self, sample: dict[str, Any], show_titles: bool = True, suptitle: str | None = None) -> Any:
        """Draw a sample's chip titled with its label (and its ``"prediction"``, if any); returns the Figure."""
        return plot_chip(self, sample, show_titles, suptitle)
