"""``datasets.EuroSAT``: TorchGeo 0.8's EuroSAT (13-band Sentinel-2 chips, 10 classes), with ``download=True``."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np

from pipekit._validate import check_callable, check_choice
from pipekit.datasets._download import download_and_extract_archive, download_url, extract_archive
from pipekit.datasets._nongeo import NonGeoClassificationDataset
from pipekit.errors import DatasetNotFoundError, RGBBandsMissingError

__all__ = ["EuroSAT", "EuroSAT100", "EuroSATSpatial"]


class _InSplit:
    """``is_valid_file`` of a split: the file's name is in the split's list (picklable, unlike a closure)."""

    def __init__(self, names: set[str]) -> None:
        self.names = frozenset(names)

    def __call__(self, path: str) -> bool:
        return path.replace("\\", "/").rsplit("/", 1)[-1] in self.names


class EuroSAT(NonGeoClassificationDataset):
    """EuroSAT: 27,000 Sentinel-2 chips of 64x64 pixels, 13 bands, 10 land-cover classes (TorchGeo 0.8's).

    The same files, layout and splits as ``torchgeo.datasets.EuroSAT``:
    ``root/EuroSATallBands.zip`` extracts to ``root/<base_dir>/<Class>/<Class>_<n>.tif``
    and ``root/eurosat-<split>.txt`` lists the split's chips (the train/val/test
    splits of "In-domain representation learning for remote sensing").  Samples
    are ``{"image": float32 [len(bands), 64, 64], "label": int64 []}``.

    With ``download=True`` missing files are fetched from :attr:`url` (the
    split list from ``url + split_filenames[split]``, the archive from
    ``url + filename``) by :func:`pipekit.datasets._download.download_url`
    (resumable; with ``checksum=True`` verified against :attr:`md5` /
    :attr:`split_md5s` before being kept) and extracted safely.  Point
    :attr:`url` at a mirror by subclassing or setting the class attribute.

    Args:
        root: the folder holding (or receiving) the files.
        split: ``"train"``, ``"val"`` or ``"test"``.
        bands: band names to load, in order (default all 13; :attr:`BAND_SETS`).
        transforms: a callable ``sample dict -> sample dict``.
        download: download what is missing.
        checksum: verify the MD5 of what is downloaded.

    Raises:
        DatasetNotFoundError: the data is not in ``root`` and ``download=False``.
        ValueError: an unknown ``split`` or band name.
        TypeError: ``transforms`` that is neither callable nor ``None``.

    Example:
        >>> import tempfile
        >>> from pipekit.datasets import DatasetNotFoundError, EuroSAT
        >>> EuroSAT.all_band_names[:4], EuroSAT.rgb_bands
        (('B01', 'B02', 'B03', 'B04'), ('B04', 'B03', 'B02'))
        >>> try:
        ...     EuroSAT(tempfile.mkdtemp())
        ... except DatasetNotFoundError as exc:
        ...     print("use `download=True`" in str(exc))
        True
    """

    url = "https://hf.co/datasets/torchgeo/eurosat/resolve/1ce6f1bfb56db63fd91b6ecc466ea67f2509774c/"
    filename = "EuroSATallBands.zip"
    md5 = "5ac12b3b2557aa56e1826e981e8e200e"

    #: the class folders' parent inside the archive
    base_dir = os.path.join("ds", "images", "remote_sensing", "otherDatasets", "sentinel_2", "tif")

    splits = ("train", "val", "test")
    split_filenames: ClassVar[dict[str, str]] = {
        "train": "eurosat-train.txt",
        "val": "eurosat-val.txt",
        "test": "eurosat-test.txt",
    }
    split_md5s: ClassVar[dict[str, str]] = {
        "train": "908f142e73d6acdf3f482c5e80d851b1",
        "val": "95de90f2aa998f70a3b2416bfe0687b4",
        "test": "7ae5ab94471417b6e315763121e67c5f",
    }

    #: TorchGeo 0.8's band order of the chips
    all_band_names = ("B01", "B02", "B03", "B04", "B05", "B06", "B07", "B08", "B09", "B10", "B11", "B12", "B8A")
    rgb_bands = ("B04", "B03", "B02")
    BAND_SETS: ClassVar[dict[str, tuple[str, ...]]] = {"all": all_band_names, "rgb": rgb_bands}

    def __init__(
        self,
        root: str | os.PathLike[str] = "data",
        split: str = "train",
        bands: Sequence[str] = BAND_SETS["all"],
        transforms: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        download: bool = False,
        checksum: bool = False,
    ) -> None:
        where = type(self).__name__
        check_choice(split, "split", where, self.splits)
        check_callable(transforms, "transforms", where)  # before any download, as the split and the bands
        self.root = os.fspath(root)
        self.split = split
        self.download = bool(download)
        self.checksum = bool(checksum)
        self._resolve_bands(bands, where)  # validate before any download
        self._verify()
        names = set()
        with open(os.path.join(self.root, self.split_filenames[split])) as f:
            for line in f:
                if line.strip():
                    names.add(line.strip().replace(".jpg", ".tif"))
        super().__init__(os.path.join(self.root, self.base_dir), transforms=transforms,
                         is_valid_file=_InSplit(names), bands=bands)
        # ``root`` is now the class folders' parent, as TorchGeo's (ImageFolder sets it); the files and
        # the archive stay in the root given

    def _not_found(self) -> DatasetNotFoundError:
        if self.download:
            return DatasetNotFoundError(f"Dataset not found in `root={self.root!r}` and cannot be downloaded")
        return DatasetNotFoundError(
            f"Dataset not found in `root={self.root!r}` and `download=False`, either specify a different "
            "`root` or use `download=True` to automatically download the dataset."
        )

    def _verify(self) -> None:
        """Find the split list and the chips in ``root``, extracting or downloading what is missing."""
        split_file = os.path.join(self.root, self.split_filenames[self.split])
        if not os.path.isfile(split_file):
            if not self.download:
                raise self._not_found()
            download_url(self.url + self.split_filenames[self.split], self.root,
                         md5=self.split_md5s[self.split] if self.checksum else None)
        if os.path.isdir(os.path.join(self.root, self.base_dir)):
            return
        archive = os.path.join(self.root, self.filename)
        if os.path.isfile(archive):
            extract_archive(archive)
        elif self.download:
            download_and_extract_archive(self.url + self.filename, self.root,
                                         md5=self.md5 if self.checksum else None)
        else:
            raise self._not_found()

    def plot(self, sample: dict[str, Any], show_titles: bool = True, suptitle: str | None = None) -> Any:
        """Draw a sample's RGB bands (reflectance / 3000, clipped, as TorchGeo) titled with its label.

        A ``"prediction"`` in the sample is added to the title.  Returns the
        matplotlib Figure.

        Raises:
            ValueError: the dataset's ``bands`` lack one of :attr:`rgb_bands`
                (:class:`~pipekit.errors.RGBBandsMissingError`, a ``ValueError``).
        """
        from pipekit.geo._plot import require_matplotlib

        missing = [b for b in self.rgb_bands if b not in (self.bands or ())]
        if missing:
            raise RGBBandsMissingError(f"{type(self).__name__}: Dataset does not contain some of the RGB bands "
                             f"(missing {', '.join(missing)}; bands={list(self.bands or ())})")
        plt = require_matplotlib()
        indices = [list(self.bands).index(b) for b in self.rgb_bands]
        image = np.asarray(sample["image"])[indices].transpose(1, 2, 0)
        image = np.clip(image / 3000, 0, 1)
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


class EuroSATSpatial(EuroSAT):
    """EuroSAT with TorchGeo 0.8's spatial split: train/val/test by longitude (60/20/20 %), not at random.

    The same chips and archive as :class:`EuroSAT`; only the split lists
    differ (``eurosat-spatial-<split>.txt``, downloaded from :attr:`url` and
    verified against :attr:`split_md5s` with ``checksum=True``).  Arguments,
    samples and errors are :class:`EuroSAT`'s.

    Example:
        >>> from pipekit.datasets import EuroSATSpatial
        >>> EuroSATSpatial.split_filenames["val"], EuroSATSpatial.filename
        ('eurosat-spatial-val.txt', 'EuroSATallBands.zip')
    """

    split_filenames: ClassVar[dict[str, str]] = {
        "train": "eurosat-spatial-train.txt",
        "val": "eurosat-spatial-val.txt",
        "test": "eurosat-spatial-test.txt",
    }
    split_md5s: ClassVar[dict[str, str]] = {
        "train": "7be3254be39f23ce4d4d144290c93292",
        "val": "acf392290050bb3df790dc8fc0ebf193",
        "test": "5ec1733f9c16116bf0aa2d921fc613ef",
    }


class EuroSAT100(EuroSAT):
    """EuroSAT's 100-chip subset (TorchGeo 0.8's): 10 per class, 6 train, 2 val, 2 test; for tutorials and tests.

    The layout, classes and bands of :class:`EuroSAT`, from a smaller archive
    (``EuroSAT100.zip``, :attr:`md5`) and its own split lists
    (``eurosat-100-<split>.txt``).  Not a benchmark.

    Example:
        >>> from pipekit.datasets import EuroSAT100
        >>> EuroSAT100.filename, EuroSAT100.split_filenames["train"]
        ('EuroSAT100.zip', 'eurosat-100-train.txt')
    """

    filename = "EuroSAT100.zip"
    md5 = "c21c649ba747e86eda813407ef17d596"
    split_filenames: ClassVar[dict[str, str]] = {
        "train": "eurosat-100-train.txt",
        "val": "eurosat-100-val.txt",
        "test": "eurosat-100-test.txt",
    }
    split_md5s: ClassVar[dict[str, str]] = {
        "train": "033d0c23e3a75e3fa79618b0e35fe1c7",
        "val": "3e3f8b3c344182b8d126c4cc88f3f215",
        "test": "f908f151b950f270ad18e61153579794",
    }
