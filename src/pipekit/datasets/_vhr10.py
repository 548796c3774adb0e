"""``datasets.VHR10``: TorchGeo 0.8's NWPU VHR-10 object detection dataset, without pycocotools."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from pipekit._validate import check_callable, check_choice
from pipekit.datasets._coco import COCODetection, collate_detection
from pipekit.datasets._download import check_integrity, dataset_not_found, extract_archive, fetch_for_dataset
from pipekit.datasets._nongeo import NonGeoDataset, read_chip
from pipekit.errors import ReadError

__all__ = ["VHR10"]


class VHR10(NonGeoDataset):
    """NWPU VHR-10: 800 very-high-resolution images, 10 object classes, boxes and instance masks (TorchGeo 0.8's).

    The same files, layout, splits and sample keys as ``torchgeo.datasets.VHR10``:
    ``root/NWPU VHR-10 dataset.zip`` extracts to ``root/NWPU VHR-10 dataset/`` with
    ``positive image set/001.jpg ... 650.jpg`` (each with at least one object) and
    ``negative image set/001.jpg ... 150.jpg`` (none); the COCO annotations of the
    positive set are ``root/NWPU VHR-10 dataset/annotations.json``.  A sample is

    * ``image``: float32 ``[3, H, W]`` (0-255);
    * ``label``: int64 ``[N]``, the category of each object (1-10, :attr:`categories`);
    * ``bbox_xyxy``: float32 ``[N, 4]``, ``(xmin, ymin, xmax, ymax)`` in pixels;
    * ``mask``: bool ``[N, H, W]``, the instance masks: the COCO polygons rasterized
      with pycocotools' pixels (TorchGeo's) by pipekit, without pycocotools.

    Differences from TorchGeo 0.8, on purpose: a sample of the negative set, or
    a positive image without objects, has the same keys with ``N = 0`` (TorchGeo
    puts a dict of COCO fields in its ``label``), so both sets batch alike; an
    index past the end raises ``IndexError`` (TorchGeo wraps around); an invalid
    ``split`` raises ``ValueError`` (TorchGeo: ``AssertionError``).  As TorchGeo,
    the negative set has :attr:`negative_size` (150) samples, read as
    ``negative image set/<index + 1:03d>.jpg``; a missing image raises
    :class:`~pipekit.errors.ReadError` naming it.

    With ``download=True`` missing files are fetched from :attr:`image_meta` and
    :attr:`target_meta` (``url``, ``filename``, ``md5``) with a resumable
    download (with ``checksum=True`` verified against the MD5 before being kept)
    and extracted safely; a failed or refused download says which file to fetch
    by hand and where to put it.  :meth:`pipe` makes it a pipe for
    :class:`pipekit.DataLoader` with exact mid-epoch resume (batches from
    :func:`~pipekit.datasets._coco.collate_detection`: images stacked, the rest lists).

    Args:
        root: the folder holding (or receiving) the files.
        split: ``"positive"`` or ``"negative"``.
        transforms: a callable ``sample dict -> sample dict``.
        download: download what is missing.
        checksum: verify the MD5 of the files.

    Raises:
        DatasetNotFoundError: the data is not in ``root`` and ``download=False``
            (the message says what to fetch by hand).
        ValueError: an unknown ``split``.

    Example:
        >>> import tempfile
        >>> from pipekit.datasets import DatasetNotFoundError, VHR10
        >>> VHR10.categories[1], len(VHR10.categories)
        ('airplane', 11)
        >>> try:
        ...     VHR10(tempfile.mkdtemp())
        ... except DatasetNotFoundError as exc:
        ...     print("Dataset not found" in str(exc), "NWPU%20VHR-10%20dataset.zip" in str(exc))
        True True
    """

    image_meta: ClassVar[dict[str, str]] = {
        "url": "https://hf.co/datasets/isaaccorley/vhr10/resolve/60ecc4be33609184e2224606858cd00b7daba8df/"
               "NWPU%20VHR-10%20dataset.zip",
        "filename": "NWPU VHR-10 dataset.zip",
        "md5": "6add6751469c12dd8c8d6223064c6c4d",
    }
    target_meta: ClassVar[dict[str, str]] = {
        "url": "https://hf.co/datasets/isaaccorley/vhr10/resolve/7e7968ad265dadc4494e0ca4a079e0b63dc6f3f8/"
               "annotations.json",
        "filename": "annotations.json",
        "md5": "7c76ec50c17a61bb0514050d20f22c08",
    }
    #: the class names by label (0 is the background)
    categories = ("background", "airplane", "ships", "storage tank", "baseball diamond", "tennis court",
                  "basketball court", "ground track field", "harbor", "bridge", "vehicle")
    splits = ("positive", "negative")
    #: the folder the archive extracts to
    directory = "NWPU VHR-10 dataset"
    #: the number of images in the negative set
    negative_size = 150

    def __init__(
        self,
        root: str | os.PathLike[str] = "data",
        split: str = "positive",
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
        self._coco: COCODetection | None = None
        if split == "positive":
            self._coco = COCODetection(self._image_dir, self._annotations, masks=True, mask_rule="pycocotools")
            self._coco.ids = sorted(self._coco.ids)

    @property
    def _image_dir(self) -> str:
        return os.path.join(self.root, self.directory, f"{self.split} image set")

    @property
    def _annotations(self) -> str:
        return os.path.join(self.root, self.directory, self.target_meta["filename"])

    def _md5(self, meta: Mapping[str, str]) -> str | None:
        return meta["md5"] if self.checksum else None

    def _verify(self) -> None:
        """Find the images (and the annotations of the positive set), extracting or downloading what is missing."""
        where = type(self).__name__
        archive = os.path.join(self.root, self.image_meta["filename"])
        needed = [(self.image_meta["url"], archive, self.image_meta["md5"])]
        if self.split == "positive":
            needed.append((self.target_meta["url"], self._annotations, self.target_meta["md5"]))
        if not os.path.isdir(self._image_dir):
            if check_integrity(archive, self._md5(self.image_meta)):
                extract_archive(archive, self.root)
            elif self.download:
                fetch_for_dataset(where, self.image_meta["url"], self.root, self.image_meta["filename"],
                                  self.image_meta["md5"], verify=self.checksum, extract=True)
            else:
                raise dataset_not_found(where, self.root, needed, False)
        if self.split == "positive" and not check_integrity(self._annotations, self._md5(self.target_meta)):
            if not self.download:
                raise dataset_not_found(where, self.root, needed, False)
            fetch_for_dataset(where, self.target_meta["url"], os.path.dirname(self._annotations),
                              self.target_meta["filename"], self.target_meta["md5"], verify=self.checksum)

    def __len__(self) -> int:
        return len(self._coco) if self._coco is not None else self.negative_size

    @staticmethod
    def collate_fn(samples: Sequence[Mapping[str, Any]]) -> Any:
        """Batches for :meth:`pipe`: images stacked, boxes, labels and masks as lists (``collate_detection``)."""
        return collate_detection(samples)

    def __getitem__(self, index: int) -> dict[str, Any]:
        size = len(self)
        if not -size <= index < size:
            raise IndexError(f"{type(self).__name__}: index {index} is out of range for {size} samples")
        index %= size
        if self._coco is not None:
            sample = self._coco[index]
            sample["mask"] = sample["mask"].bool()
        else:
            path = os.path.join(self._image_dir, f"{index + 1:03d}.jpg")
            if not os.path.isfile(path):
                raise ReadError("read", path, type(self).__name__,
                                f"the negative image set should hold 001.jpg to {self.negative_size:03d}.jpg")
            image = read_chip(path, stage=type(self).__name__)
            height, width = int(image.shape[-2]), int(image.shape[-1])
            sample = {"image": image, "label": torch.zeros(0, dtype=torch.int64),
                      "bbox_xyxy": torch.zeros(0, 4, dtype=torch.float32),
                      "mask": torch.zeros(0, height, width, dtype=torch.bool)}
        if self.transforms is not None:
            sample = self.transforms(sample)
        return sample

    def plot(
        self,
        sample: dict[str, Any],
        show_titles: bool = True,
        suptitle: str | None = None,
        show_feats: str | None = "both",
        box_alpha: float = 0.7,
        mask_alpha: float = 0.7,
    ) -> Any:
        """Draw a sample: the image with its boxes, class names and masks, and the predictions beside it.

        ``show_feats`` chooses ``"boxes"``, ``"masks"`` or ``"both"``.  A sample
        with ``prediction_label`` and ``prediction_score`` (and
        ``prediction_bbox_xyxy`` / ``prediction_mask``) gets a second panel with
        the predictions scored 0.5 or more, as TorchGeo's.  Masks are drawn as
        coloured overlays (scikit-image is not needed).  Returns the matplotlib Figure.

        Raises:
            ValueError: an unknown ``show_feats``.
        """
        from matplotlib import patches

        from pipekit.geo._plot import require_matplotlib

        if show_feats not in ("boxes", "masks", "both"):
            raise ValueError(f"{type(self).__name__}.plot: show_feats must be 'boxes', 'masks' or 'both', "
                             f"got {show_feats!r}")
        plt = require_matplotlib()
        image = _stretch(np.asarray(sample["image"], dtype=np.float64).transpose(1, 2, 0))
        predictions = "prediction_label" in sample and self.split == "positive"
        ncols = 2 if predictions else 1
        fig, axs = plt.subplots(ncols=ncols, squeeze=False, figsize=(ncols * 5, 5))
        cmap = plt.get_cmap("gist_rainbow")
        panels = [(axs[0, 0], "", "Ground Truth", None)]
        if predictions:
            panels.append((axs[0, 1], "prediction_", "Prediction", np.asarray(sample["prediction_score"])))
        for ax, prefix, title, scores in panels:
            ax.imshow(image)
            ax.axis("off")
            if self.split == "negative":
                continue
            labels = np.asarray(sample[prefix + "label"]).reshape(-1)
            boxes = np.asarray(sample[prefix + "bbox_xyxy"]).reshape(-1, 4) if prefix + "bbox_xyxy" in sample else None
            masks = np.asarray(sample[prefix + "mask"]) if prefix + "mask" in sample else None
            for i, label in enumerate(labels):
                if scores is not None and float(scores.reshape(-1)[i]) < 0.5:
                    continue
                color = cmap(int(label) / len(self.categories))
                caption = self.categories[int(label)] if 0 <= int(label) < len(self.categories) else str(label)
                if scores is not None:
                    caption += f" {float(scores.reshape(-1)[i]):.3f}"
                if boxes is not None and i < len(boxes):
                    x1, y1, x2, y2 = boxes[i]
                    if show_feats in ("boxes", "both"):
                        ax.add_patch(patches.Rectangle((x1, y1), x2 - x1, y2 - y1, linewidth=2, alpha=box_alpha,
                                                       linestyle="dashed", edgecolor=color, facecolor="none"))
                    ax.text(x1, y1 - 2, caption, color="white", size=9)
                if masks is not None and i < len(masks) and show_feats in ("masks", "both"):
                    overlay = np.zeros((*masks[i].shape[-2:], 4))
                    overlay[np.asarray(masks[i], dtype=bool).reshape(overlay.shape[:2])] = (*color[:3], mask_alpha)
                    ax.imshow(overlay)
            if show_titles:
                ax.set_title(title)
        if suptitle is not None:
            fig.suptitle(suptitle)
        fig.tight_layout()
        return fig


def _stretch(image: np.ndarray, lower: float = 2, upper: float = 98) -> np.ndarray:
    """``image`` scaled to [0, 1] between its ``lower`` and ``upper`` percentiles (over all channels, as TorchGeo)."""
    lo, hi = np.percentile(image, [lower, upper])
    return np.clip((image - lo) / (hi - lo if hi > lo else 1.0), 0.0, 1.0)
