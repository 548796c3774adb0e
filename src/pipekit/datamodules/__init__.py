"""Lightning datamodules: TorchGeo 0.8's ``torchgeo.datamodules`` names, whose runs resume mid-epoch.

``Trainer.fit(model, datamodule=EuroSATDataModule(root=..., batch_size=64))``
as with TorchGeo; the differences (see :mod:`pipekit.datamodules._base`):

* the loaders are :class:`pipekit.DataLoader` s: Lightning saves their
  position in every checkpoint, and ``fit(..., ckpt_path=...)`` after a run
  stopped mid-epoch goes on with the next batch, no sample repeated or
  skipped (the augmentations' random streams are saved too);
* normalisation with the datamodule's stored ``mean``/``std`` happens on the
  device (:func:`pipekit.device.to_device`), augmentation too, on the batch
  (:mod:`pipekit.transforms.batch_augment`);
* splits and shuffles are seeded (``seed=0``).

The names:

* :class:`BaseDataModule`, :class:`GeoDataModule`, :class:`NonGeoDataModule`:
  the bases, with TorchGeo's constructor arguments and hooks (``setup``,
  ``*_dataloader``, ``on_after_batch_transfer``, ``plot``);
* :class:`EuroSATDataModule`: :class:`~pipekit.datasets.EuroSAT`'s
  train/val/test lists;
* one per benchmark dataset of :mod:`pipekit.datasets`, under TorchGeo 0.8's
  names and arguments: :class:`VHR10DataModule`, :class:`UCMercedDataModule`,
  :class:`RESISC45DataModule`, :class:`EuroSAT100DataModule`,
  :class:`EuroSATSpatialDataModule`, :class:`InriaAerialImageLabelingDataModule`,
  :class:`LandCoverAIDataModule`, :class:`LandCoverAI100DataModule`,
  :class:`So2SatDataModule` (the guide's table lists their splits and statistics);
* :class:`LandsatCDLDataModule`: ``Landsat8 & CDL`` crop-type segmentation,
  split by region (seeded blocks, :func:`~pipekit.datasets.roi_split`);
* :func:`compute_stats`: the per-band statistics a datamodule stores,
  computed from its training split;
* :class:`LightningDataLoader`: the datamodules' loader, for your own
  datamodule's hooks (a :class:`pipekit.DataLoader` that resumes exactly
  with Lightning's checkpoints, also over a pipeline without a length).

Lightning is an optional dependency (``pip install 'pipekit[lightning]'``):
``import pipekit`` never imports it, and importing this package without it
raises :class:`~pipekit.errors.DependencyNotFoundError` saying so.  pipekit
ships no models or training loops: use TorchGeo's trainers
(``torchgeo.trainers``) or segmentation-models-pytorch with these datamodules.
"""

from __future__ import annotations

from pipekit.errors import DependencyNotFoundError

LIGHTNING_EXTRA = "pip install 'pipekit[lightning]'"
"""How to install what this package needs (the ``lightning`` extra)."""


def _require_lightning() -> None:
    try:
        import lightning.pytorch  # noqa: F401
    except ImportError as exc:
        if (exc.name or "").partition(".")[0] != "lightning":
            raise
        raise DependencyNotFoundError(
            f"pipekit.datamodules needs the 'lightning' package, which is not installed: {LIGHTNING_EXTRA}",
            name="lightning",
        ) from exc


_require_lightning()

from pipekit.datamodules._base import BaseDataModule, GeoDataModule, NonGeoDataModule  # noqa: E402
from pipekit.datamodules._eurosat import (  # noqa: E402
    EuroSAT100DataModule,
    EuroSATDataModule,
    EuroSATSpatialDataModule,
)
from pipekit.datamodules._inria import InriaAerialImageLabelingDataModule  # noqa: E402
from pipekit.datamodules._landcoverai import LandCoverAI100DataModule, LandCoverAIDataModule  # noqa: E402
from pipekit.datamodules._landsat_cdl import LandsatCDLDataModule  # noqa: E402
from pipekit.datamodules._loaders import LightningDataLoader  # noqa: E402
from pipekit.datamodules._resisc45 import RESISC45DataModule  # noqa: E402
from pipekit.datamodules._so2sat import So2SatDataModule  # noqa: E402
from pipekit.datamodules._stats import compute_stats  # noqa: E402
from pipekit.datamodules._ucmerced import UCMercedDataModule  # noqa: E402
from pipekit.datamodules._vhr10 import VHR10DataModule  # noqa: E402

__all__ = [
    "BaseDataModule",
    "EuroSAT100DataModule",
    "EuroSATDataModule",
    "EuroSATSpatialDataModule",
    "GeoDataModule",
    "InriaAerialImageLabelingDataModule",
    "LIGHTNING_EXTRA",
    "LandCoverAI100DataModule",
    "LandCoverAIDataModule",
    "LandsatCDLDataModule",
    "LightningDataLoader",
    "NonGeoDataModule",
    "RESISC45DataModule",
    "So2SatDataModule",
    "UCMercedDataModule",
    "VHR10DataModule",
    "compute_stats",
]
