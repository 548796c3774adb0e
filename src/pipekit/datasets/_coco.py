"""``datasets.COCODetection``: object detection chips described by a COCO-style JSON file.

The JSON holds ``images`` (``id``, ``file_name`` relative to the images'
folder, ``width``, ``height``), ``annotations`` (``image_id``,
``bbox = [x, y, width, height]`` in pixels, ``category_id``, optional
``segmentation`` polygons ``[[x1, y1, x2, y2, ...], ...]`` and ``iscrowd``)
and ``categories`` (``id``, ``name``).  Samples use TorchGeo 0.8's
object-detection keys (as its ``VHR10``, ``DIOR``, ``VectorDataset`` with
``task="object_detection"`` / ``"instance_segmentation"``):

* ``image``: float32 ``[C, H, W]``;
* ``bbox_xyxy``: float32 ``[N, 4]``, ``(xmin, ymin, xmax, ymax)`` in pixels,
  clipped to the image;
* ``label``: int64 ``[N]``, the annotations' ``category_id``;
* ``mask``: uint8 ``[N, H, W]`` instance masks, 1 inside the annotation's
  polygons (rasterized with Pillow), when the dataset has masks.
"""

from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from pipekit._fs import is_local, local_path
from pipekit._validate import check_callable, check_choice
from pipekit.datasets._nongeo import NonGeoDataset, _read_bytes, read_chip, resolve_bands, select_bands
from pipekit.errors import ParseError

__all__ = ["COCODetection", "collate_detection", "polygons_to_mask", "coco_polygons_to_mask"]


def polygons_to_mask(polygons: Sequence[Sequence[float]], height: int, width: int) -> np.ndarray:
    """A uint8 ``[height, width]`` mask, 1 inside any of the COCO polygons (``[x1, y1, x2, y2, ...]`` each).

    A polygon of an odd number of values is read without its last value (as
    pycocotools reads it); one of fewer than 3 points draws nothing.

    Example:
        >>> polygons_to_mask([[1, 1, 3, 1, 3, 3, 1, 3]], 5, 5)
        array([[0, 0, 0, 0, 0],
               [0, 1, 1, 1, 0],
               [0, 1, 1, 1, 0],
               [0, 1, 1, 1, 0],
               [0, 0, 0, 0, 0]], dtype=uint8)
    """
    from PIL import Image, ImageDraw

    canvas = Image.new("L", (int(width), int(height)), 0)
    draw = ImageDraw.Draw(canvas)
    for polygon in polygons:
        points = [float(v) for v in polygon]
        points = points[: len(points) // 2 * 2]  # an odd trailing value is ignored, as pycocotools does
        if len(points) >= 6:
            draw.polygon(points, fill=1, outline=1)
    return np.asarray(canvas, dtype=np.uint8)


def coco_polygons_to_mask(polygons: Sequence[Sequence[float]], height: int, width: int) -> np.ndarray:
    """A uint8 ``[height, width]`` mask of COCO polygons by the COCO rule: pixel ``(r, c)`` is the square ``[c, c+1) x
    [r, r+1)``, so a polygon's mask has about its area (the ``area`` COCO files record).

    The same pixels as pycocotools' ``frPyObjects`` then ``decode`` (which TorchGeo's ``VHR10``
    uses), computed the same way: the outline traced at 5x resolution, its crossings of the pixel
    columns' centres taken as run boundaries.  A polygon of an odd number of values is read without
    its last value; one of fewer than 3 points draws nothing.

    Example:
        >>> coco_polygons_to_mask([[1, 1, 3, 1, 3, 3, 1, 3]], 4, 4)
        array([[0, 0, 0, 0],
               [0, 1, 1, 0],
               [0, 1, 1, 0],
               [0, 0, 0, 0]], dtype=uint8)
    """
    mask = np.zeros((int(height), int(width)), dtype=np.uint8)
    for polygon in polygons:
        if len(polygon) >= 6 and height > 0 and width > 0:
            mask |= _coco_polygon(polygon, int(height), int(width))
    return mask


def _coco_polygon(polygon: Sequence[float], h: int, w: int) -> np.ndarray:
    scale = 5.0
    k = len(polygon) // 2
    xy = np.asarray([float(v) for v in polygon[: 2 * k]], dtype=np.float64).reshape(k, 2)
    # vertices on the 5x grid, rounded half up and truncated toward zero (C's (int)(v + .5))
    x = np.trunc(scale * xy[:, 0] + 0.5).astype(np.int64).tolist()
    y = np.trunc(scale * xy[:, 1] + 0.5).astype(np.int64).tolist()
    x.append(x[0])
    y.append(y[0])
    us, vs = [], []
    for j in range(k):  # every grid point along each edge, stepping along its longer axis
        xs, xe, ys, ye = x[j], x[j + 1], y[j], y[j + 1]
        dx, dy = abs(xe - xs), abs(ys - ye)
        flip = (dx >= dy and xs > xe) or (dx < dy and ys > ye)
        if flip:
            xs, xe, ys, ye = xe, xs, ye, ys
        n = max(dx, dy)
        t = np.arange(n + 1)
        if flip:
            t = n - t
        if dx >= dy:
            us.append(t + xs)
            vs.append(np.trunc(ys + ((ye - ys) / dx if dx else 0.0) * t + 0.5).astype(np.int64))
        else:
            vs.append(t + ys)
            us.append(np.trunc(xs + (xe - xs) / dy * t + 0.5).astype(np.int64))
    u, v = np.concatenate(us), np.concatenate(vs)
    moved = u[1:] != u[:-1]
    u0, u1, v0, v1 = u[:-1][moved], u[1:][moved], v[:-1][moved], v[1:][moved]
    # where the outline crosses a pixel column's centre: a run boundary (column-major order)
    col = (np.where(u1 < u0, u1, u1 - 1) + 0.5) / scale - 0.5
    row = (np.minimum(v0, v1) + 0.5) / scale - 0.5
    on = (np.floor(col) == col) & (col >= 0) & (col <= w - 1)
    row = np.ceil(np.clip(row[on], 0, h))
    bounds = col[on].astype(np.int64) * h + row.astype(np.int64)
    # runs between consecutive boundaries alternate outside / inside
    inside = (np.cumsum(np.bincount(bounds, minlength=h * w + 1))[: h * w] % 2).astype(np.uint8)
    return inside.reshape(w, h).T


def collate_detection(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Batch detection samples: ``image`` stacked, every other key (boxes, labels, masks) as a list.

    Each image has its own number of objects, so ``bbox_xyxy``, ``label`` and
    ``mask`` stay lists of per-image tensors (what torchvision's detection
    models take).

    Example:
        >>> import torch
        >>> s = {"image": torch.zeros(3, 4, 4), "bbox_xyxy": torch.zeros(2, 4), "label": torch.tensor([1, 2])}
        >>> batch = collate_detection([s, s])
        >>> batch["image"].shape, len(batch["bbox_xyxy"]), batch["label"][1].tolist()
        (torch.Size([2, 3, 4, 4]), 2, [1, 2])
    """
    samples = list(samples)
    if not samples:
        raise ValueError("collate_detection: cannot collate an empty batch")
    batch: dict[str, Any] = {}
    for key in samples[0]:
        values = [s[key] for s in samples]
        if key == "image":
            shapes = {tuple(v.shape) for v in values}
            if len(shapes) > 1:
                raise ValueError(f"collate_detection: images of different shapes {sorted(shapes)} in one batch; "
                                 "resize them in the dataset's transforms")
            batch[key] = torch.stack(values)
        else:
            batch[key] = values
    return batch


_MASK_RULES = {"pillow": polygons_to_mask, "pycocotools": coco_polygons_to_mask}


def _join(root: str, name: str) -> str:
    if "://" in name or os.path.isabs(name):
        return name
    if is_local(root):
        return os.path.join(root, name)
    return posixpath.join(root.rstrip("/"), name)


class COCODetection(NonGeoDataset):
    """Object detection (and instance segmentation) chips with a COCO-style JSON file, map-style.

    Each image of the JSON's ``images`` list is one sample (in file order; see
    the module docstring for the keys).  Annotations with ``iscrowd = 1`` are
    left out, and so are boxes without area after clipping to the image
    (as TorchGeo's and torchvision's COCO conversions do).  An annotation
    without polygons has an all-zero mask.

    Args:
        root: the folder of the images, a local path or an fsspec URL.
        ann_file: the JSON file, relative to ``root`` or a path / URL of its own.
        transforms: a callable ``sample dict -> sample dict``.
        bands: bands to load (names from ``band_names`` or 0-based indices; ``None``: all).
        band_names: the names of the images' bands.
        masks: return ``mask``; default: when any annotation has polygons.
        mask_rule: how polygons become pixels: ``"pillow"`` (:func:`polygons_to_mask`:
            vertices at pixel centres, the outline's pixels included) or
            ``"pycocotools"`` (:func:`coco_polygons_to_mask`: the COCO rule, pycocotools'
            pixels, a mask of about the polygon's area).
        storage_options: fsspec options for remote ``root`` / ``ann_file``.

    Attributes:
        ids: the image ids, in file order; ``images`` maps them to their entries.
        categories: ``{category_id: name}``.
        classes: the category names, in ``categories`` order.

    Raises:
        ParseError: the JSON cannot be parsed or misses a field (naming the file
            and the entry).
        DatasetNotFoundError: ``ann_file`` does not exist.
        ValueError: an unknown ``mask_rule``.
        TypeError: ``root`` or ``ann_file`` that is not a path or URL, or ``transforms`` that is neither
            callable nor ``None``.

    Example:
        >>> import json, os, tempfile
        >>> import numpy as np
        >>> from PIL import Image
        >>> from pipekit.datasets import COCODetection
        >>> root = tempfile.mkdtemp()
        >>> Image.fromarray(np.zeros((8, 10, 3), np.uint8)).save(os.path.join(root, "a.png"))
        >>> coco = {"images": [{"id": 1, "file_name": "a.png", "width": 10, "height": 8}],
        ...         "annotations": [{"id": 1, "image_id": 1, "category_id": 3, "bbox": [2, 1, 4, 5],
        ...                          "segmentation": [[2, 1, 6, 1, 6, 6, 2, 6]], "iscrowd": 0}],
        ...         "categories": [{"id": 3, "name": "tree"}]}
        >>> with open(os.path.join(root, "annotations.json"), "w") as f:
        ...     json.dump(coco, f)
        >>> ds = COCODetection(root)
        >>> sample = ds[0]
        >>> sample["bbox_xyxy"].tolist(), sample["label"].tolist(), sample["mask"].shape
        ([[2.0, 1.0, 6.0, 6.0]], [3], torch.Size([1, 8, 10]))
    """

    def __init__(
        self,
        root: str | os.PathLike[str] = "data",
        ann_file: str | os.PathLike[str] = "annotations.json",
        transforms: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        *,
        bands: Sequence[str | int] | None = None,
        band_names: Sequence[str] = (),
        masks: bool | None = None,
        mask_rule: str = "pillow",
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        where = type(self).__name__
        self.mask_rule = check_choice(mask_rule, "mask_rule", where, tuple(_MASK_RULES))
        if not isinstance(root, (str, os.PathLike)) or not isinstance(ann_file, (str, os.PathLike)):
            raise TypeError(f"{where}: root and ann_file must be paths or URLs")
        check_callable(transforms, "transforms", where)
        self.root = os.fspath(root)
        self.ann_file = _join(self.root, os.fspath(ann_file))
        self.transforms = transforms
        self.storage_options = dict(storage_options or {})
        self.band_names = tuple(band_names)
        self.bands, self.band_indices = resolve_bands(bands, self.band_names, where)
        self._parse(self._load_json(where), where)
        self.masks = self._has_polygons if masks is None else bool(masks)

    def _load_json(self, where: str) -> Any:
        from pipekit.errors import DatasetNotFoundError

        if is_local(self.ann_file) and not os.path.isfile(local_path(self.ann_file)):
            raise DatasetNotFoundError(f"{where}: no annotation file {self.ann_file!r}")
        data = _read_bytes(self.ann_file, self.storage_options, where)
        try:
            return json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ParseError("parse COCO JSON", self.ann_file, where, f"{type(exc).__name__}: {exc}") from exc

    def _parse(self, doc: Any, where: str) -> None:
        def bad(what: str) -> ParseError:
            return ParseError("parse COCO JSON", self.ann_file, where, what)

        if not isinstance(doc, dict) or not isinstance(doc.get("images"), list):
            raise bad("no 'images' list at the top level")
        self.images: dict[Any, dict[str, Any]] = {}
        self.ids: list[Any] = []
        for i, entry in enumerate(doc["images"]):
            if not isinstance(entry, dict) or "id" not in entry or not isinstance(entry.get("file_name"), str):
                raise bad(f"images[{i}] needs an 'id' and a 'file_name'")
            if entry["id"] in self.images:
                raise bad(f"images[{i}]: duplicate image id {entry['id']!r}")
            self.images[entry["id"]] = entry
            self.ids.append(entry["id"])
        self.annotations: dict[Any, list[dict[str, Any]]] = {i: [] for i in self.ids}
        self._has_polygons = False
        for i, ann in enumerate(doc.get("annotations", [])):
            if not isinstance(ann, dict) or "image_id" not in ann or "category_id" not in ann:
                raise bad(f"annotations[{i}] needs an 'image_id' and a 'category_id'")
            box = ann.get("bbox")
            if not (isinstance(box, list) and len(box) == 4 and all(isinstance(v, (int, float)) for v in box)):
                raise bad(f"annotations[{i}]: 'bbox' must be [x, y, width, height], got {box!r}")
            if ann["image_id"] not in self.annotations:
                raise bad(f"annotations[{i}]: image_id {ann['image_id']!r} is not in 'images'")
            if ann.get("iscrowd", 0):
                continue
            seg = ann.get("segmentation")
            if isinstance(seg, list) and seg:
                if not all(isinstance(p, list) for p in seg):
                    raise bad(f"annotations[{i}]: 'segmentation' must be a list of polygons")
                self._has_polygons = True
            self.annotations[ann["image_id"]].append(ann)
        self.categories: dict[Any, str] = {c["id"]: str(c.get("name", c["id"])) for c in doc.get("categories", [])
                                           if isinstance(c, dict) and "id" in c}
        self.classes: list[str] = list(self.categories.values())

    def __len__(self) -> int:
        return len(self.ids)

    @staticmethod
    def collate_fn(samples: Sequence[Mapping[str, Any]]) -> Any:
        """Batches for :meth:`pipe`: :func:`collate_detection` (images stacked, boxes/labels/masks as lists)."""
        return collate_detection(samples)

    def __getitem__(self, index: int) -> dict[str, Any]:
        image_id = self.ids[index]
        entry = self.images[image_id]
        url = _join(self.root, entry["file_name"])
        stage = type(self).__name__
        image = read_chip(url, self.storage_options, stage)
        image = select_bands(image, self.bands, self.band_indices, url, stage)
        height, width = int(image.shape[-2]), int(image.shape[-1])
        anns = self.annotations[image_id]
        boxes = torch.tensor([a["bbox"] for a in anns], dtype=torch.float32).reshape(-1, 4)
        boxes[:, 2:] += boxes[:, :2]
        boxes[:, 0::2].clamp_(min=0, max=width)
        boxes[:, 1::2].clamp_(min=0, max=height)
        keep = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
        labels = torch.tensor([int(a["category_id"]) for a in anns], dtype=torch.int64)
        sample: dict[str, Any] = {"image": image, "bbox_xyxy": boxes[keep], "label": labels[keep]}
        if self.masks:
            kept = [a for a, k in zip(anns, keep.tolist()) if k]
            if kept:
                rasterize = _MASK_RULES[self.mask_rule]
                masks = np.stack([rasterize(a.get("segmentation") or [], height, width) for a in kept])
            else:
                masks = np.zeros((0, height, width), dtype=np.uint8)
            sample["mask"] = torch.from_numpy(masks)
        if self.transforms is not None:
            sample = self.transforms(sample)
        return sample
