"""Synthetic image corpora: class-per-folder JPEG folders and WebDataset tar shards, made locally.

Nothing here downloads anything.  Each writer is deterministic for a seed and
skips work when the corpus already exists (a ``.complete`` marker is written
last, so an interrupted run is redone rather than half-used).
"""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw
from tqdm import tqdm

__all__ = ["default_cache_dir", "make_image", "write_image_folder", "write_image_shards"]

CLASSES = ("circle", "square", "triangle", "stripes")


def default_cache_dir() -> Path:
    """``$PIPEKIT_CACHE`` or ``~/.cache/pipekit``."""
    return Path(os.environ.get("PIPEKIT_CACHE", Path.home() / ".cache" / "pipekit"))


def make_image(label: int, rng: np.random.Generator, size: tuple[int, int] = (256, 256)) -> Image.Image:
    """A textured RGB image whose class (``CLASSES[label]``) is visible: a shape or stripes."""
    w, h = size
    base = rng.integers(0, 256, size=3)
    noise = rng.normal(0, 18, size=(h, w, 3))
    xx = np.mgrid[0:h, 0:w][1]
    gradient = (xx / w * 60 - 30)[..., None]
    pixels = np.clip(base + noise + gradient, 0, 255).astype(np.uint8)
    img = Image.fromarray(pixels, "RGB")
    draw = ImageDraw.Draw(img)
    color = tuple(int(c) for c in rng.integers(0, 256, size=3))
    cx, cy = rng.integers(w // 4, 3 * w // 4), rng.integers(h // 4, 3 * h // 4)
    r = int(rng.integers(min(w, h) // 8, min(w, h) // 4))
    name = CLASSES[label % len(CLASSES)]
    if name == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=color)
    elif name == "square":
        draw.rectangle([cx - r, cy - r, cx + r, cy + r], fill=color)
    elif name == "triangle":
        draw.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=color)
    else:
        step = max(4, r // 3)
        for x0 in range(0, w, 2 * step):
            draw.rectangle([x0, 0, x0 + step - 1, h], fill=color)
    return img


def _sizes(rng: np.random.Generator, vary: bool, size: int) -> tuple[int, int]:
    if not vary:
        return (size, size)
    return (int(rng.integers(size * 3 // 4, size * 5 // 4)), int(rng.integers(size * 3 // 4, size * 5 // 4)))


def write_image_folder(
    root: str | Path,
    per_class: int = 100,
    size: int = 256,
    vary_size: bool = True,
    seed: int = 0,
    progress: bool = True,
) -> Path:
    """Write ``root/<class>/<class>_<i>.jpg`` JPEGs (an ImageFolder layout) and return ``root``."""
    root = Path(root)
    marker = root / ".complete"
    if marker.exists():
        return root
    rng = np.random.default_rng(seed)
    total = per_class * len(CLASSES)
    with tqdm(total=total, desc=f"writing {total} JPEGs to {root}", disable=not progress, unit="img") as bar:
        for label, name in enumerate(CLASSES):
            (root / name).mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                img = make_image(label, rng, _sizes(rng, vary_size, size))
                img.save(root / name / f"{name}_{i:05d}.jpg", quality=90)
                bar.update()
    marker.touch()
    return root


def write_image_shards(
    root: str | Path,
    shards: int = 4,
    per_shard: int = 100,
    size: int = 224,
    seed: int = 0,
    progress: bool = True,
) -> list[Path]:
    """Write WebDataset tar shards ``root/shard-000000.tar`` ... of ``.jpg`` + ``.cls`` pairs."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    paths = [root / f"shard-{i:06d}.tar" for i in range(shards)]
    if (root / ".complete").exists():
        return paths
    rng = np.random.default_rng(seed)
    with tqdm(total=shards * per_shard, desc=f"writing shards to {root}", disable=not progress) as bar:
        for s, path in enumerate(paths):
            with tarfile.open(path, "w") as tar:
                for i in range(per_shard):
                    label = int(rng.integers(0, len(CLASSES)))
                    buf = io.BytesIO()
                    make_image(label, rng, (size, size)).save(buf, format="JPEG", quality=90)
                    key = f"sample{s:03d}{i:05d}"
                    for ext, data in ((".jpg", buf.getvalue()), (".cls", str(label).encode())):
                        info = tarfile.TarInfo(key + ext)
                        info.size = len(data)
                        tar.addfile(info, io.BytesIO(data))
                    bar.update()
    (root / ".complete").touch()
    return paths
