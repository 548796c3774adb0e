"""EuroSAT's datamodules: the train/val/test lists of :class:`~pipekit.datasets.EuroSAT` and its variants.

``EuroSATDataModule``, ``EuroSATSpatialDataModule`` (the split by longitude)
and ``EuroSAT100DataModule`` (100 chips, for tutorials), each normalised with
the per-band statistics TorchGeo 0.8 uses for it.
"""

from __future__ import annotations

from typing import Any

import torch

from pipekit.datamodules._base import NonGeoDataModule
from pipekit.transforms.batch_augment import BatchCompose, BatchRandomHorizontalFlip, BatchRandomVerticalFlip

__all__ = ["EuroSAT100DataModule", "EuroSATDataModule", "EuroSATSpatialDataModule"]

# Per-band mean and standard deviation of the EuroSAT chips (digital numbers), the statistics
# TorchGeo 0.8's EuroSATDataModule normalises with, so models trained with either see the same inputs.
MEAN = {
    "B01": 1354.40546513, "B02": 1118.24399958, "B03": 1042.92983953, "B04": 947.62620298,
    "B05": 1199.47283961, "B06": 1999.79090914, "B07": 2369.22292565, "B08": 2296.82608323,
    "B09": 732.08340178, "B10": 12.11327804, "B11": 1819.01027855, "B12": 1118.92391149,
    "B8A": 2594.14080798,
}
STD = {
    "B01": 245.71762908, "B02": 333.00778264, "B03": 395.09249139, "B04": 593.75055589,
    "B05": 566.4170017, "B06": 861.18399006, "B07": 1086.63139075, "B08": 1117.98170791,
    "B09": 404.91978886, "B10": 4.77584468, "B11": 1002.58768311, "B12": 761.30323499,
    "B8A": 1231.58581042,
}

# The same statistics over the chips of EuroSATSpatial's training split (TorchGeo 0.8's SPATIAL_MEAN/SPATIAL_STD).
SPATIAL_MEAN = {
    "B01": 1375.9932, "B02": 1142.6339, "B03": 1077.5502, "B04": 1003.8445, "B05": 1280.7300,
    "B06": 2130.3491, "B07": 2524.0549, "B08": 2454.1938, "B09": 785.4963, "B10": 12.4639,
    "B11": 1969.9224, "B12": 1206.2421, "B8A": 2779.4104,
}
SPATIAL_STD = {
    "B01": 249.8516, "B02": 337.9465, "B03": 392.5661, "B04": 612.4237, "B05": 562.2878,
    "B06": 806.8271, "B07": 1022.6378, "B08": 1065.4312, "B09": 410.5831, "B10": 4.8878,
    "B11": 958.4751, "B12": 740.6196, "B8A": 1157.2896,
}


def _band_stats(where: str, kwargs: dict[str, Any], mean: dict[str, float], std: dict[str, float]
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The statistics of the ``bands`` in ``kwargs`` (default: all of EuroSAT's), in their order."""
    from pipekit.datasets import EuroSAT

    bands = kwargs.get("bands", EuroSAT.all_band_names)
    unknown = [b for b in bands if b not in mean]
    if unknown:
        raise ValueError(f"{where}: unknown band(s) {unknown}; EuroSAT's: {list(mean)}")
    return torch.tensor([mean[b] for b in bands]), torch.tensor([std[b] for b in bands])


class EuroSATDataModule(NonGeoDataModule):
    """EuroSAT land-cover classification: the dataset's own train/val/test lists (TorchGeo 0.8's datamodule).

    The splits are the fixed lists EuroSAT ships (``eurosat-train.txt``...),
    so every run sees the same chips; the training order is shuffled with
    ``seed``.  Images are normalised on the device with the per-band
    statistics of the dataset (:data:`MEAN`, :data:`STD`, for the ``bands``
    chosen); training batches are flipped at random on the device.

    Args:
        batch_size: chips per batch.
        num_workers: DataLoader worker processes.
        seed: seed of the training shuffle and of the flips.
        **kwargs: passed to :class:`~pipekit.datasets.EuroSAT` (``root``,
            ``bands``, ``download``, ``checksum``).
    """

    def __init__(self, batch_size: int = 64, num_workers: int = 0, *, seed: int = 0, **kwargs: Any) -> None:
        from pipekit.datasets import EuroSAT

        self.mean, self.std = _band_stats("EuroSATDataModule", kwargs, MEAN, STD)
        super().__init__(EuroSAT, batch_size, num_workers, seed=seed, **kwargs)
        self.train_aug = BatchCompose([BatchRandomHorizontalFlip(), BatchRandomVerticalFlip()], seed=seed)


class EuroSATSpatialDataModule(NonGeoDataModule):
    """EuroSAT split by longitude: :class:`~pipekit.datasets.EuroSATSpatial`'s train/val/test lists (TorchGeo 0.8's).

    The splits are the fixed lists ``eurosat-spatial-<split>.txt`` (60/20/20 %
    of the chips, west to east), so validation and test are regions the model
    never saw.  Images are normalised on the device with the per-band
    statistics of that training split (:data:`SPATIAL_MEAN`,
    :data:`SPATIAL_STD`, TorchGeo 0.8's, in digital numbers); training
    batches are flipped at random on the device (TorchGeo 0.8 does not
    augment: set ``train_aug = None`` for its behaviour).

    Args:
        batch_size: chips per batch.
        num_workers: DataLoader worker processes.
        seed: seed of the training shuffle and of the flips.
        **kwargs: passed to :class:`~pipekit.datasets.EuroSATSpatial` (``root``,
            ``bands``, ``download``, ``checksum``).
    """

    def __init__(self, batch_size: int = 64, num_workers: int = 0, *, seed: int = 0, **kwargs: Any) -> None:
        from pipekit.datasets import EuroSATSpatial

        self.mean, self.std = _band_stats("EuroSATSpatialDataModule", kwargs, SPATIAL_MEAN, SPATIAL_STD)
        super().__init__(EuroSATSpatial, batch_size, num_workers, seed=seed, **kwargs)
        self.train_aug = BatchCompose([BatchRandomHorizontalFlip(), BatchRandomVerticalFlip()], seed=seed)


class EuroSAT100DataModule(NonGeoDataModule):
    """EuroSAT's 100-chip subset, for tutorials and demonstrations, not benchmarks (TorchGeo 0.8's datamodule).

    :class:`~pipekit.datasets.EuroSAT100`'s own train/val/test lists
    (``eurosat-100-<split>.txt``); normalised with the full EuroSAT's
    statistics (:data:`MEAN`, :data:`STD`), as TorchGeo 0.8 does; training
    batches flipped at random on the device.

    Args:
        batch_size: chips per batch.
        num_workers: DataLoader worker processes.
        seed: seed of the training shuffle and of the flips.
        **kwargs: passed to :class:`~pipekit.datasets.EuroSAT100` (``root``,
            ``bands``, ``download``, ``checksum``).
    """

    def __init__(self, batch_size: int = 64, num_workers: int = 0, *, seed: int = 0, **kwargs: Any) -> None:
        from pipekit.datasets import EuroSAT100

        self.mean, self.std = _band_stats("EuroSAT100DataModule", kwargs, MEAN, STD)
        super().__init__(EuroSAT100, batch_size, num_workers, seed=seed, **kwargs)
        self.train_aug = BatchCompose([BatchRandomHorizontalFlip(), BatchRandomVerticalFlip()], seed=seed)
