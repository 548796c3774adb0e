"""``datasets.LandCoverAI``: TorchGeo 0.8's LandCover.ai v1 (aerial RGB of Poland, 5 classes) as 512 px chips.

The chips come ready-cut from TorchGeo's mirror (``output.zip``, 512x512 JPEG
chips and PNG masks, with the split lists beside it).  An archive of the
original tiles (``landcover.ai.v1.zip``: ``images/*.tif``, ``masks/*.tif`` and
the split lists) is cut into the same chips by pipekit itself, as the
dataset's own ``split.py`` does with OpenCV, without running that script.
"""

from __future__ import annotations

import glob
import hashlib
import os
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import torch

from pipekit._validate import check_callable, check_choice
from pipekit.datasets._download import download_url, extract_archive
from pipekit.datasets._nongeo import NonGeoDataset, read_chip
from pipekit.decoders import decode_image_bytes
from pipekit.errors import DatasetNotFoundError, DecodeError, HashError, ReadError

__all__ = ["LandCoverAI", "LandCoverAI100", "cut_tiles"]

#: the side of LandCover.ai's chips, in pixels
CHIP_SIZE = 512


def _read_tile(path: str, stage: str) -> np.ndarray:
    """A GeoTIFF tile's bands in their own dtype (uint8 for LandCover.ai): a tile is 9000x9500 pixels."""
    import rasterio

    try:
        with rasterio.open(path) as src:
            return src.read()
    except rasterio.errors.RasterioError as exc:
        raise DecodeError("read tile", path, stage, str(exc)) from exc


def cut_tiles(root: str, size: int = CHIP_SIZE, stage: str = "LandCoverAI") -> int:
    """Cut ``root/images/*.tif`` and ``root/masks/*.tif`` into ``root/output/<tile>_<k>.jpg`` / ``_<k>_m.png``.

    The chips of LandCover.ai's ``split.py``: ``size`` x ``size`` windows
    row by row, ``k`` counting every window of the tile (those cut off at the
    right or bottom edge too, which are not written), JPEG quality 95 (OpenCV's
    default) for the images and PNG for the masks.  The chips are written to a
    temporary folder moved into place at the end, so an interrupted cut
    leaves no partial ``output/``.  Returns the number of chips.

    Raises:
        DatasetNotFoundError: no tile, or a tile without its mask.
        DecodeError: a tile and its mask differ in size.
    """
    from PIL import Image

    images = sorted(glob.glob(os.path.join(root, "images", "*.tif")))
    if not images:
        raise DatasetNotFoundError(f"{stage}: no tile in {os.path.join(root, 'images')!r} to cut into chips")
    tmp = os.path.join(root, ".output.partial")
    os.makedirs(tmp, exist_ok=True)
    count = 0
    for image_path in images:
        name = os.path.splitext(os.path.basename(image_path))[0]
        mask_path = os.path.join(root, "masks", os.path.basename(image_path))
        if not os.path.isfile(mask_path):
            raise DatasetNotFoundError(f"{stage}: the tile {image_path!r} has no mask {mask_path!r}")
        image = _read_tile(image_path, stage).transpose(1, 2, 0)
        mask = _read_tile(mask_path, stage)[0]
        if image.shape[:2] != mask.shape:
            raise DecodeError("cut", image_path, stage, f"the tile is {image.shape[:2]} pixels, its mask {mask.shape}")
        k = 0
        for y in range(0, image.shape[0], size):
            for x in range(0, image.shape[1], size):
                chip = image[y:y + size, x:x + size]
                if chip.shape[:2] == (size, size):
                    Image.fromarray(np.ascontiguousarray(chip)).save(os.path.join(tmp, f"{name}_{k}.jpg"),
                                                                     quality=95)
                    Image.fromarray(np.ascontiguousarray(mask[y:y + size, x:x + size])).save(
                        os.path.join(tmp, f"{name}_{k}_m.png"))
                    count += 1
                k += 1
    os.replace(tmp, os.path.join(root, "output"))
    return count


class LandCoverAI(NonGeoDataset):
    """LandCover.ai v1: 512x512 RGB chips of aerial orthophotos of Poland with 5-class masks (TorchGeo 0.8's).

    41 orthophotos (33 at 25 cm, 8 at 50 cm) cut into 10,674 chips, with the
    dataset's train/val/test lists (``root/<split>.txt``, one chip id a line)
    and chips ``root/output/<id>.jpg`` / ``<id>_m.png``.  Classes (mask
    values): 0 background, 1 building, 2 woodland, 3 water, 4 road.  Samples
    are ``{"image": float32 [3, 512, 512] (0-255), "mask": int64 [512, 512]}``.

    With ``download=True`` what is missing is fetched from :attr:`url`
    (TorchGeo's mirror of the chips; the split lists from the same folder,
    :attr:`metadata`), resumable, verified with ``checksum=True`` against
    :attr:`md5`, and extracted safely.  An archive already in ``root`` is
    extracted without downloading; one of the original tiles
    (``landcover.ai.v1.zip``, https://landcover.ai.linuxpolska.com/download/landcover.ai.v1.zip)
    is cut into the chips by :func:`cut_tiles`.

    Args:
        root: the folder holding (or receiving) the files.
        split: ``"train"``, ``"val"`` or ``"test"``.
        transforms: a callable ``sample dict -> sample dict``.
        download: download what is missing.
        checksum: verify the MD5 of what is downloaded.

    Raises:
        DatasetNotFoundError: the data is not in ``root`` and ``download=False``
            (or a split list names a chip that is not there).
        HashError: ``checksum=True`` and a download's MD5 differs.
        ValueError: an unknown ``split``.

    Example:
        >>> import tempfile
        >>> from pipekit.datasets import DatasetNotFoundError, LandCoverAI
        >>> LandCoverAI.classes
        ('Background', 'Building', 'Woodland', 'Water', 'Road')
        >>> try:
        ...     LandCoverAI(tempfile.mkdtemp())
        ... except DatasetNotFoundError as exc:
        ...     print("use `download=True`" in str(exc))
        True
    """

    url = ("https://hf.co/datasets/dragon7/LandCover.ai/resolve/262c75fbbf77d107f0a8335e9eef1f6234481d08/"
           "output.zip")
    filename = "output.zip"
    md5 = "e0cf2403116dc08c97a69604bd0cdb74"
    #: optional SHA-256 of the tile archive's ``split.py`` (TorchGeo before 0.8.1 checked it before running the
    #: script); with ``checksum=True`` and a ``split.py`` extracted, it is checked before the tiles are cut
    sha256: str | None = None
    metadata: ClassVar[dict[str, dict[str, str]]] = {
        "train": {"filename": "train.txt", "md5": "059d87b49390d557d15090167493f758"},
        "val": {"filename": "val.txt", "md5": "3f3ff579b050d1fcd12e66ce48f73d67"},
        "test": {"filename": "test.txt", "md5": "b019a7607a10166a81f4e243c456c212"},
    }
    #: whether the split lists come from the archive (True) or are downloaded beside it
    split_files_in_archive = False
    splits = ("train", "val", "test")
    classes = ("Background", "Building", "Woodland", "Water", "Road")
    cmap: ClassVar[dict[int, tuple[int, int, int, int]]] = {
        0: (0, 0, 0, 0),
        1: (97, 74, 74, 255),
        2: (38, 115, 0, 255),
        3: (0, 197, 255, 255),
        4: (207, 207, 207, 255),
    }

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
        self.transforms = transforms
        self.download = bool(download)
        self.checksum = bool(checksum)
        self._verify()
        with open(os.path.join(self.root, self.metadata[split]["filename"])) as f:
            self.ids = [line.strip() for line in f if line.strip()]
        missing = [i for i in self.ids if not os.path.isfile(os.path.join(self.root, "output", i + ".jpg"))]
        if missing:
            raise DatasetNotFoundError(f"{where}: {len(missing)} chip(s) of the {split!r} list are not in "
                                       f"{os.path.join(self.root, 'output')!r}, e.g. {missing[0]}.jpg")

    # -- files --------------------------------------------------------------------------------------------------

    def _split_files_present(self) -> bool:
        return all(os.path.isfile(os.path.join(self.root, m["filename"])) for m in self.metadata.values())

    def _chips_present(self) -> bool:
        images = glob.glob(os.path.join(self.root, "output", "*_*.jpg"))
        masks = glob.glob(os.path.join(self.root, "output", "*_*_m.png"))
        return len(images) > 0 and len(images) == len(masks)

    def _not_found(self) -> DatasetNotFoundError:
        return DatasetNotFoundError(
            f"Dataset not found in `root={self.root!r}` and `download=False`, either specify a different "
            "`root` or use `download=True` to automatically download the dataset.")

    def _verify(self) -> None:
        """Find the chips and split lists in ``root``; extract, cut or download what is missing."""
        lists_missing = not self._split_files_present()
        if not self._chips_present() or (lists_missing and self.split_files_in_archive):
            archive = os.path.join(self.root, self.filename)
            if not os.path.isfile(archive):
                if not self.download:
                    raise self._not_found()
                # saved as ``filename`` whatever the URL's last part (a mirror may name it otherwise)
                download_url(self.url, self.root, self.filename, md5=self.md5 if self.checksum else None)
            extract_archive(archive)
            if not self._chips_present():
                self._cut_tiles()
            lists_missing = not self._split_files_present()
        if lists_missing:
            if not self.download or self.split_files_in_archive:
                missing = [m["filename"] for m in self.metadata.values()
                           if not os.path.isfile(os.path.join(self.root, m["filename"]))]
                raise DatasetNotFoundError(f"{self._not_found()} (missing: {', '.join(missing)})")
            for meta in self.metadata.values():
                download_url(self.url.replace(self.filename, meta["filename"]), self.root,
                             md5=meta["md5"] if self.checksum else None)

    def _cut_tiles(self) -> None:
        """The archive held the original tiles: cut them into the chips (checking ``split.py`` first, see sha256)."""
        script = os.path.join(self.root, "split.py")
        if self.checksum and self.sha256 is not None and os.path.isfile(script):
            with open(script, "rb") as f:
                actual = hashlib.sha256(f.read()).hexdigest()
            if actual != self.sha256.lower():
                raise HashError("verify", script, type(self).__name__,
                                f"Dataset corrupted: sha256 mismatch: expected {self.sha256}, got {actual}",
                                expected=self.sha256, actual=actual)
        cut_tiles(self.root, stage=type(self).__name__)

    # -- samples ------------------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, Any]:
        id_ = self.ids[index]
        stage = type(self).__name__
        image = read_chip(os.path.join(self.root, "output", id_ + ".jpg"), stage=stage)
        mask_path = os.path.join(self.root, "output", id_ + "_m.png")
        try:
            with open(mask_path, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise ReadError("read", mask_path, stage, f"{type(exc).__name__}: {exc}") from exc
        mask = decode_image_bytes(data, mode="L", url=mask_path, stage=stage)[0].to(torch.int64)
        sample: dict[str, Any] = {"image": image, "mask": mask}
        if self.transforms is not None:
            sample = self.transforms(sample)
        return sample

    def plot(self, sample: dict[str, Any], show_titles: bool = True, suptitle: str | None = None) -> Any:
        """Draw the image, its mask in the classes' colours and a ``"prediction"`` when present; the Figure."""
        from matplotlib.colors import ListedColormap

        from pipekit.geo._plot import require_matplotlib

        plt = require_matplotlib()
        colors = np.zeros((max(self.cmap) + 1, 4))
        colors[list(self.cmap)] = list(self.cmap.values())
        cmap = ListedColormap(colors[:, :3] / 255)
        image = np.asarray(sample["image"]).astype("uint8").squeeze()
        panels = [("Image", np.rollaxis(image, 0, 3), {})]
        for key, title in (("mask", "Mask"), ("prediction", "Predictions")):
            if key in sample:
                array = np.asarray(sample[key]).astype("uint8")
                panels.append((title, array.squeeze() if key == "mask" else array,
                               {"vmin": 0, "vmax": 4, "cmap": cmap, "interpolation": "none"}))
        fig, axs = plt.subplots(1, len(panels), figsize=(len(panels) * 4, 5), squeeze=False)
        for ax, (title, array, kwargs) in zip(axs[0], panels):
            ax.imshow(array, **kwargs)
            ax.axis("off")
            if show_titles:
                ax.set_title(title)
        if suptitle is not None:
            fig.suptitle(suptitle)
        return fig


class LandCoverAI100(LandCoverAI):
    """LandCover.ai's 100-chip subset (TorchGeo 0.8's), for tutorials and tests: the same layout, classes and splits.

    One archive (``landcoverai100.zip``, :attr:`md5`) holds the chips and the split lists.

    Example:
        >>> from pipekit.datasets import LandCoverAI100
        >>> LandCoverAI100.filename
        'landcoverai100.zip'
    """

    url = ("https://hf.co/datasets/isaaccorley/landcoverai/resolve/5cdf9299bd6c1232506cf79373df01f6e6596b50/"
           "landcoverai100.zip")
    filename = "landcoverai100.zip"
    md5 = "66eb33b5a0cabb631836ce0a4eafb7cd"
    split_files_in_archive = True
