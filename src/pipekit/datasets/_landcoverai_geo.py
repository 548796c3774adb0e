"""``datasets.LandCoverAIGeo``: TorchGeo 0.8's LandCover.ai v1 tiles as a geo dataset (image and mask per query)."""

from __future__ import annotations

import glob
import os
from collections.abc import Callable
from typing import Any

from pipekit.datasets._download import download_url, extract_archive
from pipekit.datasets._landcoverai import LandCoverAI
from pipekit.errors import DatasetNotFoundError
from pipekit.geo._raster import RasterDataset

__all__ = ["LandCoverAIGeo"]


class _Masks(RasterDataset):
    """The tiles' masks (``masks/*.tif``), read onto the images' grid."""

    filename_glob = os.path.join("masks", "*.tif")
    filename_regex = ".*tif"
    is_image = False


class LandCoverAIGeo(RasterDataset):
    """LandCover.ai v1's 41 orthophoto tiles (EPSG:2180) with their masks, queried by area (TorchGeo 0.8's).

    ``root/images/*.tif`` (RGB, 25 or 50 cm) and ``root/masks/*.tif`` (the
    classes of :class:`LandCoverAI`: 0 background, 1 building, 2 woodland,
    3 water, 4 road).  ``dataset[query]`` gives ``{"image": float32 [3, H, W],
    "mask": int64 [1, H, W], "crs", "bounds", "transform"}`` (the mask keeps its
    band axis, as TorchGeo's does for this dataset), the mask read onto the
    image's grid with nearest resampling.

    With ``download=True`` the tile archive (:attr:`url`, ~1.5 GB; checked
    against :attr:`md5` with ``checksum=True``) is downloaded, resumably,
    and extracted safely; an archive already in ``root`` is extracted.

    Args:
        root: the folder holding (or receiving) the files.
        crs: the CRS to warp to (default: the first file's).
        res: the resolution (default: the first file's).
        transforms: a callable ``sample dict -> sample dict``.
        cache: keep file handles open (TorchGeo's argument).
        download: download what is missing.
        checksum: verify the MD5 of what is downloaded.

    Raises:
        DatasetNotFoundError: no tiles in ``root`` and ``download=False``.
        HashError: ``checksum=True`` and the download's MD5 differs.

    Example:
        >>> import tempfile
        >>> from pipekit.datasets import DatasetNotFoundError, LandCoverAIGeo
        >>> try:
        ...     LandCoverAIGeo(tempfile.mkdtemp())
        ... except DatasetNotFoundError as exc:
        ...     print("use `download=True`" in str(exc))
        True
    """

    url = "https://landcover.ai.linuxpolska.com/download/landcover.ai.v1.zip"
    filename = "landcover.ai.v1.zip"
    md5 = "3268c89070e8734b4e91d531c0617e03"
    filename_glob = os.path.join("images", "*.tif")
    filename_regex = ".*tif"
    classes = LandCoverAI.classes
    cmap = LandCoverAI.cmap
    plot = LandCoverAI.plot

    def __init__(
        self,
        root: Any = "data",
        crs: Any = None,
        res: Any = None,
        transforms: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        cache: bool = True,
        download: bool = False,
        checksum: bool = False,
    ) -> None:
        self.root = os.fspath(root)
        self.download = bool(download)
        self.checksum = bool(checksum)
        self._verify()
        super().__init__(self.root, crs, res, transforms=transforms, cache=cache)
        self._masks = _Masks(self.root, crs=self.crs, res=self.res, cache=cache)

    def _tiles_present(self) -> bool:
        images = glob.glob(os.path.join(self.root, "images", "*.tif"))
        masks = glob.glob(os.path.join(self.root, "masks", "*.tif"))
        return len(images) > 0 and len(images) == len(masks)

    def _verify(self) -> None:
        """Find the tiles in ``root``; extract or download the archive when they are missing."""
        if self._tiles_present():
            return
        archive = os.path.join(self.root, self.filename)
        if not os.path.isfile(archive):
            if not self.download:
                raise DatasetNotFoundError(
                    f"Dataset not found in `root={self.root!r}` and `download=False`, either specify a different "
                    "`root` or use `download=True` to automatically download the dataset.")
            download_url(self.url, self.root, self.filename, md5=self.md5 if self.checksum else None)
        extract_archive(archive)
        if not self._tiles_present():
            raise DatasetNotFoundError(f"{type(self).__name__}: {archive!r} holds no images/*.tif with their "
                                       "masks/*.tif")

    def _getitem(self, bbox: Any, grid: Any, bounds: Any) -> dict[str, Any]:
        sample = super()._getitem(bbox, grid, bounds)
        mask = self._masks._getitem(bbox, grid, bounds)["mask"]
        sample["mask"] = mask if mask.ndim == 3 else mask.unsqueeze(0)
        return sample
