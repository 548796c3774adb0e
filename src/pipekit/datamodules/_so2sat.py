"""``So2SatDataModule``: So2Sat LCZ42's splits (version 2's own, version 3's seeded 80/20), per-version statistics."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor
from torch.utils.data import random_split

from pipekit.datamodules._base import NonGeoDataModule

__all__ = ["So2SatDataModule"]

# Per-band mean and standard deviation of each version's training data (TorchGeo 0.8's values), in the order of
# So2Sat.all_band_names (8 Sentinel-1 bands, then 10 Sentinel-2 bands), in the units of the samples (float32 as stored).
_MEANS: dict[str, list[float]] = {
    "2": [-0.00003591224260, -0.00000765856128, 0.00005937385750, 0.00002516623150, 0.04420110660000,
          0.25761027100000, 0.00075567433700, 0.00135034668000, 0.12375696117681, 0.10927746363683,
          0.10108552032678, 0.11423986161140, 0.15926566920230, 0.18147236008771, 0.17457403122913,
          0.19501607349635, 0.15428468872076, 0.10905050699570],
    "3_random": [-0.00005541164581, -0.00001363245448, 0.00004558943283, 0.00002990907940, 0.04451951629749,
                 0.25862310103671, 0.00032720731137, 0.00123416595462, 0.12428656593186, 0.11001677362564,
                 0.10230652367417, 0.11532195526186, 0.15989486018315, 0.18204406482475, 0.17513562590622,
                 0.19565546643221, 0.15648722649020, 0.11122536338577],
    "3_block": [-0.00004632368791, 0.00001260869365, 0.00005305557337, 0.00003471369557, 0.04449937686171,
                0.26046026815721, 0.00087815394475, 0.00086889627435, 0.12381869777901, 0.10944155483024,
                0.10176911573221, 0.11465267892206, 0.15870528223797, 0.18053964470203, 0.17366821871719,
                0.19390983961551, 0.15536490486611, 0.11057334452833],
}
_STDS: dict[str, list[float]] = {
    "2": [0.17555201, 0.17556463, 0.45998793, 0.45598876, 2.85599092, 8.32480061, 2.44987574, 1.46473530,
          0.03958795, 0.04777826, 0.06636616, 0.06358874, 0.07744387, 0.09101635, 0.09218466, 0.10164581,
          0.09991773, 0.08780632],
    "3_random": [0.1756914, 0.1761190, 0.4600589, 0.4563601, 2.2492179, 7.9056503, 2.1917633, 1.3148480,
                 0.0392269, 0.0470917, 0.0653264, 0.0624057, 0.0758367, 0.0891717, 0.0905092, 0.0996856,
                 0.0990188, 0.0873386],
    "3_block": [0.1751797, 0.1754073, 0.4610124, 0.4572122, 0.8294254, 7.1771026, 0.9642598, 0.8770835,
                0.0388311, 0.0464986, 0.0643833, 0.0616141, 0.0753004, 0.0886178, 0.0899500, 0.0991759,
                0.0983276, 0.0865943],
}
_MEANS["3_culture_10"] = _MEANS["2"]  # the same training data as version 2
_STDS["3_culture_10"] = _STDS["2"]


class So2SatDataModule(NonGeoDataModule):
    """So2Sat LCZ42 local-climate-zone classification (TorchGeo 0.8's datamodule).

    **Splits**: version ``"2"`` uses the dataset's own ``train``,
    ``validation`` (as ``val``) and ``test`` files.  The version 3 datasets
    (``"3_random"``, ``"3_block"``, ``"3_culture_10"``) have only ``train`` and
    ``test``: ``val`` is a random ``val_split_pct`` of ``train``
    (``torch.utils.data.random_split`` with a generator seeded by ``seed``; the
    default ``seed=0`` gives TorchGeo 0.8's split), fixed for a given seed.

    **Statistics**: TorchGeo 0.8's per-band mean and standard deviation of
    each version's training data (:attr:`means_per_version`,
    :attr:`stds_per_version`), for the bands of ``band_set``, in the units of
    the samples.  One difference: with ``band_set="all"`` TorchGeo 0.8 leaves
    its base's ``mean=0``, ``std=255`` (its statistics are only applied to
    ``"s1"``, ``"s2"`` and ``"rgb"``), which shrinks So2Sat's values (about
    0..1 for Sentinel-2) towards 0; this datamodule normalises all 18 bands
    with their statistics.  No augmentation, as TorchGeo 0.8.

    Args:
        batch_size: patches per batch.
        num_workers: DataLoader worker processes.
        band_set: ``"all"``, ``"s1"``, ``"s2"`` or ``"rgb"``
            (:attr:`pipekit.datasets.So2Sat.BAND_SETS`; sets ``bands``).
        val_split_pct: the fraction of ``train`` that is ``val`` in the version 3 datasets.
        seed: seed of the version 3 validation split and of the training shuffle.
        **kwargs: passed to :class:`~pipekit.datasets.So2Sat` (``root``,
            ``version``, ``checksum``).
    """

    means_per_version: ClassVar[dict[str, Tensor]] = {k: torch.tensor(v) for k, v in _MEANS.items()}
    stds_per_version: ClassVar[dict[str, Tensor]] = {k: torch.tensor(v) for k, v in _STDS.items()}

    def __init__(self, batch_size: int = 64, num_workers: int = 0, band_set: str = "all",
                 val_split_pct: float = 0.2, *, seed: int = 0, **kwargs: Any) -> None:
        from pipekit.datasets import So2Sat

        where = type(self).__name__
        version = kwargs["version"] = str(kwargs.get("version", "2"))
        if version not in self.means_per_version:
            raise ValueError(f"{where}: version must be one of {', '.join(self.means_per_version)}, got {version!r}")
        if band_set not in So2Sat.BAND_SETS:
            raise ValueError(f"{where}: band_set must be one of {', '.join(So2Sat.BAND_SETS)}, got {band_set!r}")
        if not 0 < val_split_pct < 1:
            raise ValueError(f"{where}: val_split_pct must be between 0 and 1, got {val_split_pct!r}")
        bands = kwargs["bands"] = So2Sat.BAND_SETS[band_set]
        # the samples' band order: the Sentinel-1 bands chosen, then the Sentinel-2 ones (So2Sat's)
        order = [b for b in bands if b in So2Sat.all_s1_band_names] + [
            b for b in bands if b in So2Sat.all_s2_band_names]
        index = [So2Sat.all_band_names.index(b) for b in order]
        self.mean = self.means_per_version[version][index]
        self.std = self.stds_per_version[version][index]
        self.band_set = band_set
        self.val_split_pct = float(val_split_pct)
        super().__init__(So2Sat, batch_size, num_workers, split_names={"val": "validation"}, seed=seed, **kwargs)

    def setup(self, stage: str) -> None:
        """Build the splits of ``stage``: version 2's files, or version 3's ``train`` split into train and val."""
        if self.kwargs["version"] == "2":
            super().setup(stage)
            return
        if stage in ("fit", "validate"):
            dataset = self._make("train")
            val_length = round(len(dataset) * self.val_split_pct)
            self.train_dataset, self.val_dataset = random_split(
                dataset, [len(dataset) - val_length, val_length], generator=torch.Generator().manual_seed(self.seed))
        if stage == "test":
            self.test_dataset = self._make("test")
