"""``LandsatCDLDataModule``: crop types from Landsat 8 and the Cropland Data Layer, split by region."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from pipekit.datamodules._base import GeoDataModule
from pipekit.errors import ConfigurationError
from pipekit.transforms.batch_augment import BatchCompose, BatchRandomHorizontalFlip, BatchRandomRot90

__all__ = ["LandsatCDLDataModule", "geographic_split"]


def geographic_split(dataset: Any, fractions: Sequence[float], grid_size: int, seed: int) -> list[Any]:
    """``dataset`` cut into ``grid_size`` x ``grid_size`` blocks over its bounds, blocks dealt to splits at random.

    The blocks are shuffled with a generator seeded by ``seed`` and dealt in
    runs of the given fractions of their number; each split is
    :func:`~pipekit.datasets.roi_split`'s part of the dataset in its blocks,
    one index row per footprint and block, so samplers never draw a patch
    that crosses into another split's block (patches stay inside a row).
    """
    import pandas as pd
    import shapely

    from pipekit.datasets.splits import roi_split

    (x, y, _t) = dataset.bounds
    xs = torch.linspace(x.start, x.stop, grid_size + 1).tolist()
    ys = torch.linspace(y.start, y.stop, grid_size + 1).tolist()
    blocks = [shapely.box(xs[i], ys[j], xs[i + 1], ys[j + 1]) for i in range(grid_size) for j in range(grid_size)]
    parts = roi_split(dataset, blocks)
    order = torch.randperm(len(blocks), generator=torch.Generator().manual_seed(seed)).tolist()
    counts = [round(f * len(blocks)) for f in fractions]
    counts[0] = len(blocks) - sum(counts[1:])
    if min(counts) < 1:
        raise ConfigurationError(f"geographic_split: {grid_size}x{grid_size} blocks leave a split of {fractions} "
                                 "empty; raise grid_size")
    out, start = [], 0
    for n in counts:
        chosen = [parts[k] for k in order[start:start + n] if len(parts[k].index)]
        start += n
        split = copy.deepcopy(parts[order[0]])
        split.index = pd.concat([p.index for p in chosen]) if chosen else split.index.iloc[:0]
        out.append(split)
    return out


class LandsatCDLDataModule(GeoDataModule):
    """Crop-type segmentation: ``Landsat8 & CDL`` patches, split by region, normalised and augmented on the device.

    The data: :class:`~pipekit.datasets.Landsat8` scenes (the seven
    reflective bands, uint16 DN) intersected with the
    :class:`~pipekit.datasets.CDL` (reprojected on the fly onto the Landsat
    grid), its codes mapped to labels ``0..len(classes)-1``.  Without
    ``landsat``/``cdl`` it uses the synthetic corpus of
    :func:`pipekit.synthetic.geo.write_landsat_cdl_corpus` (written once to
    the cache folder, or under ``root``).

    **The split** is geographic, fixed and seeded: the data's bounds are cut
    into ``grid_size`` x ``grid_size`` blocks, dealt to train/val/test in the
    ``fractions`` given, in an order drawn with ``seed``
    (:func:`~pipekit.datasets.roi_split` per block): no pixel is in two
    splits, and the same arguments give the same split on every machine.
    Training draws ``length`` random patches per epoch (seeded), evaluation a
    grid.

    **Statistics**: :attr:`mean` and :attr:`std` are those of the default
    synthetic corpus's training split (DN), computed with
    ``pipekit.datamodules.compute_stats(LandsatCDLDataModule(), num_samples=200)``
    (patches of 64 pixels, seed 0); for other data compute yours the same
    way and set them on the instance.  They are applied on the device
    (:func:`pipekit.device.to_device`), masks become int64 there, and
    training batches are flipped and rotated by 90 degrees on the device.

    Args:
        landsat: Landsat 8 scenes (a folder, glob or URL); default: the synthetic corpus.
        cdl: the CDL raster(s); default: the synthetic corpus.
        batch_size: patches per batch.
        patch_size: patch side in pixels.
        length: training patches per epoch (default: as many as tile the training blocks).
        num_workers: DataLoader worker processes.
        classes: CDL codes kept, mapped to labels in order (``classes[0]``, the
            background, takes every other code).
        fractions: train/val/test fractions of the blocks.
        grid_size: blocks per side.
        seed: seed of the split, the training patches and the augmentation.
        root: where the synthetic corpus is written (default: pipekit's cache folder).
        corpus_size, corpus_scenes: the synthetic corpus's scene side (pixels) and scene count.
        **kwargs: passed to :class:`~pipekit.datasets.Landsat8` (``bands``...).
    """

    mean = torch.tensor([8590.824, 8754.893, 9983.2801, 9489.9625, 21177.0319, 16025.5982, 11731.5003])
    std = torch.tensor([279.5728, 321.3651, 394.3439, 663.8958, 2219.5135, 1482.6968, 1001.0395])
    mask_dtype = torch.long

    def __init__(
        self,
        landsat: Any = None,
        cdl: Any = None,
        batch_size: int = 8,
        patch_size: int = 64,
        length: int | None = None,
        num_workers: int = 0,
        *,
        classes: Sequence[int] | None = None,
        fractions: Sequence[float] = (0.8, 0.1, 0.1),
        grid_size: int = 4,
        seed: int = 0,
        root: str | Path | None = None,
        corpus_size: int = 512,
        corpus_scenes: int = 2,
        **kwargs: Any,
    ) -> None:
        from pipekit.datasets import Landsat8
        from pipekit.synthetic.geo import CDL_CLASSES

        super().__init__(Landsat8, batch_size, patch_size, length, num_workers, seed=seed, **kwargs)
        if len(fractions) != 3 or abs(sum(fractions) - 1) > 1e-6 or min(fractions) <= 0:
            raise ValueError(
                f"LandsatCDLDataModule: fractions must be 3 positive numbers summing to 1, got {fractions}")
        self.landsat, self.cdl = landsat, cdl
        self.classes = list(classes) if classes is not None else [0, *CDL_CLASSES]
        self.fractions = tuple(fractions)
        self.grid_size = grid_size
        self.root = root
        self.corpus_size, self.corpus_scenes = corpus_size, corpus_scenes
        self.train_aug = BatchCompose([BatchRandomHorizontalFlip(), BatchRandomRot90()], seed=seed)

    @property
    def num_classes(self) -> int:
        """Labels in the masks: ``len(classes)``."""
        return len(self.classes)

    def _corpus(self) -> Path:
        from pipekit.synthetic import default_cache_dir
        from pipekit.synthetic.geo import write_landsat_cdl_corpus

        root = Path(self.root) if self.root is not None else default_cache_dir() / "datamodules"
        return write_landsat_cdl_corpus(root / f"landsat-cdl-{self.corpus_size}-{self.corpus_scenes}",
                                        size=self.corpus_size, scenes=self.corpus_scenes, progress=False)

    def prepare_data(self) -> None:
        """Write the synthetic corpus (once, on one process) when no ``landsat``/``cdl`` was given."""
        if self.landsat is None or self.cdl is None:
            self._corpus()

    def setup(self, stage: str) -> None:
        """Build ``Landsat8 & CDL``, split it by region (once) and make the samplers of ``stage``."""
        from pipekit.datasets import CDL, Landsat8

        if self.dataset is None:
            corpus = self._corpus() if self.landsat is None or self.cdl is None else None
            landsat = Landsat8(self.landsat if self.landsat is not None else corpus / "landsat8", **self.kwargs)
            cdl = CDL(self.cdl if self.cdl is not None else corpus / "cdl", classes=self.classes)
            self.dataset = landsat & cdl
            self.train_dataset, self.val_dataset, self.test_dataset = geographic_split(
                self.dataset, self.fractions, self.grid_size, self.seed)
        self._samplers(stage)
