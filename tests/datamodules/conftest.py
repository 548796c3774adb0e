"""Tiny extracted layouts of the benchmark datasets, for their datamodules' tests (built once per session).

Each builder writes the files a dataset reads (real GeoTIFF, JPEG, PNG and HDF5 files) with the helpers of the
dataset's own tests in ``tests/datasets/``, already extracted, so no archive or server is needed.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

# train/val/test chips per class in the classification layouts: two training batches of 2 chips
_COUNTS = {"train": 2, "val": 1, "test": 1}
_CLASSES = ("airplane", "beach")


def _ucmerced(root: Path) -> None:
    from ..datasets.test_ucmerced import _tif

    folder = root / "UCMerced_LandUse" / "Images"
    for split, count in _COUNTS.items():
        names = []
        for c, cls in enumerate(_CLASSES):
            for n in range(count):
                name = f"{cls}{split}{n:02d}.tif"
                (folder / cls).mkdir(parents=True, exist_ok=True)
                (folder / cls / name).write_bytes(_tif(10 * c + n + 1, 8, 8))
                names.append(name)
        (root / f"uc_merced-{split}.txt").write_text("\n".join(names) + "\n")


def _resisc45(root: Path) -> None:
    from ..datasets.test_resisc45 import _jpeg

    folder = root / "NWPU-RESISC45"
    for split, count in _COUNTS.items():
        names = []
        for c, cls in enumerate(_CLASSES):
            for n in range(count):
                name = f"{cls}_{split}{n:03d}.jpg"
                (folder / cls).mkdir(parents=True, exist_ok=True)
                (folder / cls / name).write_bytes(_jpeg(60 * c + 20 * n + 40))
                names.append(name)
        (root / f"resisc45-{split}.txt").write_text("\n".join(names) + "\n")


def _eurosat(variant: str) -> Callable[[Path], None]:
    def build(root: Path) -> None:
        from pipekit import datasets

        from .test_datamodules import write_eurosat

        write_eurosat(root)  # the chips and EuroSAT's lists; the variant's lists are copies of them
        for split, name in getattr(datasets, variant).split_filenames.items():
            if not (root / name).exists():
                shutil.copy(root / f"eurosat-{split}.txt", root / name)

    return build


def _inria(root: Path) -> None:
    from ..datasets.test_inria import TEST, TRAIN, _tif

    top = root / "AerialImageDataset"
    mask = np.zeros((1, 6, 8), np.uint8)
    mask[:, :, :4] = 255
    for name, value in TRAIN.items():  # city index 1-5: val (2 tiles), 6 on: train (3 tiles)
        _tif(top / "train" / "images" / name, np.full((3, 6, 8), value, np.uint8))
        _tif(top / "train" / "gt" / name, mask)
    for name, value in TEST.items():
        _tif(top / "test" / "images" / name, np.full((3, 6, 8), value, np.uint8))


def _png(array: np.ndarray, fmt: str) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(array).save(buf, fmt)
    return buf.getvalue()


def _landcoverai(root: Path) -> None:
    chips = {"M-33-20-D-c-4-2_0": "train", "M-33-20-D-c-4-2_1": "train", "M-33-20-D-c-4-2_2": "val",
             "N-34-97-D-c-2-4_7": "test"}
    (root / "output").mkdir(parents=True)
    for i, (chip, _split) in enumerate(chips.items()):
        (root / "output" / f"{chip}.jpg").write_bytes(_png(np.full((8, 8, 3), 40 * i + 20, np.uint8), "JPEG"))
        mask = np.zeros((8, 8), np.uint8)
        mask[:4] = i + 1
        (root / "output" / f"{chip}_m.png").write_bytes(_png(mask, "PNG"))
    for split in _COUNTS:
        (root / f"{split}.txt").write_text("".join(f"{c}\n" for c, s in chips.items() if s == split))


def _so2sat(root: Path) -> None:
    from pipekit.datasets import So2Sat

    from ..datasets.test_so2sat import _write

    for version in ("2", "3_block"):
        for offset, name in enumerate(So2Sat.filenames_by_version[version].values()):
            _write(root / name, 3 * offset)


def _vhr10(root: Path) -> None:
    from ..datasets.test_vhr10 import DIR, FILL, H, W, _annotations, _jpeg

    ann = _annotations()  # 3 images with objects; 2 more, one with 2 objects and one without
    ann["images"] += [{"id": i, "file_name": f"{i + 1:03d}.jpg", "width": W, "height": H} for i in (3, 4)]
    ann["annotations"] += [{"id": 10 + k, "image_id": 3, "category_id": 2, "bbox": [4 * k, 2, 4, 4], "iscrowd": 0,
                            "segmentation": [[4 * k, 2, 4 * k + 4, 2, 4 * k + 4, 6, 4 * k, 6]]} for k in (0, 1)]
    folder = root / DIR / "positive image set"
    folder.mkdir(parents=True)
    for i in range(5):
        (folder / f"{i + 1:03d}.jpg").write_bytes(_jpeg(FILL[i % len(FILL)]))
    (root / DIR / "annotations.json").write_text(json.dumps(ann))


BUILDERS: dict[str, Callable[[Path], None]] = {
    "ucmerced": _ucmerced,
    "resisc45": _resisc45,
    "eurosat100": _eurosat("EuroSAT100"),
    "eurosatspatial": _eurosat("EuroSATSpatial"),
    "inria": _inria,
    "landcoverai": _landcoverai,
    "so2sat": _so2sat,
    "vhr10": _vhr10,
}


@pytest.fixture(scope="session")
def benchmark_root(tmp_path_factory) -> Callable[[str], Path]:
    """``benchmark_root(name)``: the root of dataset ``name``'s tiny layout (written on first use)."""
    built: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in built:
            root = tmp_path_factory.mktemp(name)
            BUILDERS[name](root)
            built[name] = root
        return built[name]

    return get


def train_batch(dm) -> tuple[dict, dict, dict]:
    """A datamodule's first training batch: as loaded, normalised on the CPU "device", and then augmented."""
    import torch

    from .test_datamodules import fake_trainer

    raw = next(iter(dm.train_dataloader()))
    moved = dm.transfer_batch_to_device(dict(raw), torch.device("cpu"), 0)
    dm.trainer = fake_trainer(training=True)
    try:
        augmented = dm.on_after_batch_transfer(dict(moved), 0)
    finally:
        dm.trainer = None
    return raw, moved, augmented
