"""Tests for datasets.COCODetection with real PNG / GeoTIFF chips and COCO JSON files written in fixtures."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import rasterio
import torch
from PIL import Image
from rasterio.transform import from_origin

import pipekit
from pipekit.datasets import COCODetection, DatasetNotFoundError
from pipekit.datasets._coco import collate_detection, polygons_to_mask
from pipekit.errors import DecodeError, ParseError

H, W = 20, 30


def _coco(n_images: int = 4) -> dict:
    images, annotations = [], []
    for i in range(n_images):
        images.append({"id": 10 + i, "file_name": f"img/{i}.png", "width": W, "height": H})
        if i == 0:
            continue  # an image without objects
        annotations.append({"id": 100 + i, "image_id": 10 + i, "category_id": 1, "iscrowd": 0, "area": 40,
                            "bbox": [2, 3, 8, 5], "segmentation": [[2, 3, 10, 3, 10, 8, 2, 8]]})
        annotations.append({"id": 200 + i, "image_id": 10 + i, "category_id": 2, "iscrowd": 0, "area": 1,
                            "bbox": [25, 15, 10, 10]})  # clipped at the image's edge; no polygon
        annotations.append({"id": 300 + i, "image_id": 10 + i, "category_id": 2, "iscrowd": 1,
                            "bbox": [0, 0, 5, 5], "segmentation": {"counts": [0, 25], "size": [H, W]}})
    return {"images": images, "annotations": annotations,
            "categories": [{"id": 1, "name": "building"}, {"id": 2, "name": "tree"}]}


@pytest.fixture
def coco_root(tmp_path) -> Path:
    (tmp_path / "img").mkdir()
    for i in range(4):
        Image.fromarray(np.full((H, W, 3), i * 10, np.uint8)).save(tmp_path / "img" / f"{i}.png")
    (tmp_path / "annotations.json").write_text(json.dumps(_coco()))
    return tmp_path


def test_samples_have_torchgeo_detection_keys(coco_root):
    ds = COCODetection(coco_root)
    assert len(ds) == 4 and ds.ids == [10, 11, 12, 13] and ds.categories == {1: "building", 2: "tree"}
    assert ds.classes == ["building", "tree"] and ds.masks
    empty = ds[0]
    assert set(empty) == {"image", "bbox_xyxy", "label", "mask"}
    assert empty["bbox_xyxy"].shape == (0, 4) and empty["label"].shape == (0,) and empty["mask"].shape == (0, H, W)
    s = ds[2]
    assert s["image"].shape == (3, H, W) and s["image"].dtype == torch.float32 and s["image"].max() == 20
    assert s["bbox_xyxy"].dtype == torch.float32 and s["label"].dtype == torch.int64 and s["mask"].dtype == torch.uint8
    assert s["bbox_xyxy"].tolist() == [[2, 3, 10, 8], [25, 15, 30, 20]]  # xywh -> xyxy, clipped; iscrowd left out
    assert s["label"].tolist() == [1, 2]
    assert s["mask"].shape == (2, H, W)
    assert s["mask"][0].sum() == (10 - 2 + 1) * (8 - 3 + 1) and s["mask"][0, 3:9, 2:11].all()
    assert s["mask"][1].sum() == 0  # no polygon


def test_masks_off_transforms_and_bands(coco_root):
    ds = COCODetection(coco_root, masks=False, bands=[0], transforms=lambda s: {**s, "seen": True})
    s = ds[1]
    assert "mask" not in s and s["seen"] and s["image"].shape == (1, H, W)
    named = COCODetection(coco_root, band_names=("R", "G", "B"), bands=("B",))
    assert named[3]["image"].shape == (1, H, W) and named[3]["image"].max() == 30


def test_geotiff_chips_and_separate_annotation_file(tmp_path):
    profile = dict(driver="GTiff", width=W, height=H, count=5, dtype="uint16", crs="EPSG:32631",
                   transform=from_origin(0, 100, 1, 1))
    with rasterio.open(tmp_path / "a.tif", "w", **profile) as f:
        f.write(np.arange(5, dtype=np.uint16)[:, None, None] * np.ones((5, H, W), np.uint16))
    doc = {"images": [{"id": 1, "file_name": "a.tif", "width": W, "height": H}],
           "annotations": [{"image_id": 1, "category_id": 7, "bbox": [1, 1, 2, 2]}]}
    (tmp_path / "labels").mkdir()
    (tmp_path / "labels" / "train.json").write_text(json.dumps(doc))
    ds = COCODetection(tmp_path, tmp_path / "labels" / "train.json")
    s = ds[0]
    assert s["image"].shape == (5, H, W) and s["image"][:, 0, 0].tolist() == [0, 1, 2, 3, 4]
    assert not ds.masks and "mask" not in s and s["label"].tolist() == [7]


def test_bad_files_raise_naming_them(coco_root, tmp_path):
    with pytest.raises(DatasetNotFoundError, match=r"nope.json"):
        COCODetection(coco_root, "nope.json")
    # bad arguments are refused as such before the JSON is looked for
    with pytest.raises(TypeError, match="COCODetection: transforms must be callable or None, got 5"):
        COCODetection(coco_root, "nope.json", transforms=5)
    with pytest.raises(ValueError, match="COCODetection: mask_rule must be one of pillow, pycocotools, got 'cv2'"):
        COCODetection(coco_root, "nope.json", mask_rule="cv2")
    (coco_root / "broken.json").write_text("{not json")
    with pytest.raises(ParseError, match=r"broken\.json"):
        COCODetection(coco_root, "broken.json")
    (coco_root / "nobox.json").write_text(json.dumps({"images": [{"id": 1, "file_name": "x.png"}],
                                                      "annotations": [{"image_id": 1, "category_id": 1}]}))
    with pytest.raises(ParseError, match=r"nobox\.json.*annotations\[0\].*bbox"):
        COCODetection(coco_root, "nobox.json")
    (coco_root / "orphan.json").write_text(json.dumps({"images": [], "annotations": [
        {"image_id": 5, "category_id": 1, "bbox": [0, 0, 1, 1]}]}))
    with pytest.raises(ParseError, match="image_id 5 is not in 'images'"):
        COCODetection(coco_root, "orphan.json")
    (coco_root / "img" / "2.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    ds = COCODetection(coco_root)
    with pytest.raises(DecodeError, match=r"2\.png.*COCODetection"):
        ds[2]
    pipe = ds.pipe(train=False, batch_size=None, on_error="skip")
    assert [int(s["image"].max()) for s in pipe] == [0, 10, 30]


def test_pipe_collates_lists_and_resumes(coco_root):
    ds = COCODetection(coco_root)
    batches = list(ds.pipe(train=False, batch_size=3))
    assert batches[0]["image"].shape == (3, 3, H, W)
    assert isinstance(batches[0]["bbox_xyxy"], list) and [len(b) for b in batches[0]["bbox_xyxy"]] == [0, 2, 2]

    def loader():
        return pipekit.DataLoader(COCODetection(coco_root).pipe(train=True, batch_size=1), num_workers=0)

    torch.manual_seed(0)
    full = [int(b["image"].max()) for b in loader()]
    torch.manual_seed(0)
    first = loader()
    it = iter(first)
    head = [int(next(it)["image"].max())]
    state = pickle.loads(pickle.dumps(first.state_dict()))
    resumed = loader()
    resumed.load_state_dict(state)
    assert head + [int(b["image"].max()) for b in resumed] == full and sorted(full) == [0, 10, 20, 30]


def test_collate_and_polygons():
    with pytest.raises(ValueError, match="different shapes"):
        collate_detection([{"image": torch.zeros(3, 2, 2)}, {"image": torch.zeros(3, 2, 3)}])
    mask = polygons_to_mask([[0, 0, 2, 0, 2, 2, 0, 2], [5, 5, 6, 5, 6, 6]], 8, 8)
    assert mask.dtype == np.uint8 and mask[:3, :3].all() and mask[5, 5] == 1 and mask.sum() == 9 + 3
