"""Transforms for (multispectral) samples and batches: spectral indices, augmentation, normalisation.

Everything here works on a sample dict ``{"image": [C, H, W], "mask": [H, W], ...}``
in a DataLoader worker (``pipe.map(t)``, or the ``append_index``/``augment``/
``normalize``/``augment_batch`` pipes) and, where it makes sense, on a collated
batch ``{"image": [B, C, H, W], ...}`` on the GPU, with the same numbers.

* :mod:`~pipekit.transforms.indices`: TorchGeo's module of the same name:
  every ``Append*`` class of TorchGeo 0.8 (:class:`AppendNDVI`...) with its
  arguments and call semantics, and the kernels below;
* :mod:`~pipekit.transforms.index_kernels`: pure index kernels (NDVI, NDWI,
  EVI, ``band_math``...), band axis -3, any device and float dtype;
* :mod:`~pipekit.transforms._spectral`: where :class:`AppendIndex` and the
  ``Append*`` classes are defined, bands by position or by name;
* :mod:`~pipekit.transforms.functional`: pure augmentation kernels
  (brightness, contrast, gamma, noise, flips, 90-degree rotations, crops...)
  on ``[C, H, W]`` images and ``[B, C, H, W]`` batches, shared by the two
  augmentation paths below;
* :mod:`~pipekit.transforms._augment`: :class:`Augment` on torchvision v2 with
  multispectral-aware ops (from :mod:`~pipekit.transforms._radiometric`,
  :mod:`~pipekit.transforms._color`, :mod:`~pipekit.transforms._geometric` and
  :mod:`~pipekit.transforms._autoaugment`);
* :mod:`~pipekit.transforms.batch_augment`: per-sample random ops on batches,
  MixUp, CutMix;
* :mod:`~pipekit.transforms._normalize`: :class:`Normalize`;
* :mod:`~pipekit.transforms._stats`: :func:`compute_stats`;
* :mod:`~pipekit.transforms.seeding`: per-worker, per-rank random streams.

>>> from pipekit.transforms import AppendNDVI, Augment, Normalize, compute_stats
>>> from pipekit.transforms import indices   # as ``from torchgeo.transforms import indices``

torchvision (slow to import) is imported only when a name from
:mod:`~pipekit.transforms._augment` (or one of the sample-op modules it
re-exports) is first used, so importing this package (and ``import pipekit``)
stays fast.
"""

import importlib
from typing import Any

from pipekit.transforms import (
    _normalize as normalize,
)
from pipekit.transforms import (
    _spectral as spectral,
)
from pipekit.transforms import (
    _stats as stats,
)
from pipekit.transforms import (
    batch_augment,
    functional,
    index_kernels,
    indices,
    seeding,
)
from pipekit.transforms._normalize import (
    Normalize,
)
from pipekit.transforms._spectral import (
    AppendBandMath,
    AppendBNDVI,
    AppendEVI,
    AppendGBNDVI,
    AppendGNDVI,
    AppendGRNDVI,
    AppendIndex,
    AppendMNDWI,
    AppendNBR,
    AppendNDBI,
    AppendNDRE,
    AppendNDSI,
    AppendNDVI,
    AppendNDWI,
    AppendNormalizedDifferenceIndex,
    AppendRBNDVI,
    AppendSAVI,
    AppendSWI,
    AppendTriBandNormalizedDifferenceIndex,
)
from pipekit.transforms._stats import (
    BandStats,
    compute_stats,
)
from pipekit.transforms.batch_augment import (
    BatchCompose,
    BatchRandomBrightness,
    BatchRandomChoice,
    BatchRandomContrast,
    BatchRandomCrop,
    BatchRandomGaussianNoise,
    BatchRandomHorizontalFlip,
    BatchRandomResizedCrop,
    BatchRandomRot90,
    BatchRandomVerticalFlip,
    BatchTransform,
    CutMix,
    MixUp,
)
from pipekit.transforms.index_kernels import (
    band_math,
    bndvi,
    evi,
    gbndvi,
    gndvi,
    grndvi,
    mndwi,
    nbr,
    ndbi,
    ndre,
    ndsi,
    ndvi,
    ndwi,
    normalized_difference,
    rbndvi,
    savi,
    swi,
    tri_band_normalized_difference,
)
from pipekit.transforms.seeding import RandomStream

__all__ = [
    "AppendBNDVI",
    "AppendBandMath",
    "AppendEVI",
    "AppendGBNDVI",
    "AppendGNDVI",
    "AppendGRNDVI",
    "AppendIndex",
    "AppendMNDWI",
    "AppendNBR",
    "AppendNDBI",
    "AppendNDRE",
    "AppendNDSI",
    "AppendNDVI",
    "AppendNDWI",
    "AppendNormalizedDifferenceIndex",
    "AppendRBNDVI",
    "AppendSAVI",
    "AppendSWI",
    "AppendTriBandNormalizedDifferenceIndex",
    "Augment",
    "BandStats",
    "BatchCompose",
    "BatchRandomBrightness",
    "BatchRandomChoice",
    "BatchRandomContrast",
    "BatchRandomCrop",
    "BatchRandomGaussianNoise",
    "BatchRandomHorizontalFlip",
    "BatchRandomResizedCrop",
    "BatchRandomRot90",
    "BatchRandomVerticalFlip",
    "BatchTransform",
    "ColorJitter",
    "CutMix",
    "DEFAULT_BOX_KEYS",
    "MixUp",
    "Normalize",
    "RGBOnly",
    "RandomBrightness",
    "RandomChannelDropout",
    "RandomContrast",
    "RandomGamma",
    "RandomGaussianNoise",
    "RandomHue",
    "RandomRot90",
    "RandomSaturation",
    "RandomStream",
    "TrivialAugment",
    "augment",
    "band_math",
    "batch_augment",
    "bndvi",
    "compute_stats",
    "evi",
    "functional",
    "gbndvi",
    "gndvi",
    "grndvi",
    "index_kernels",
    "indices",
    "mndwi",
    "nbr",
    "ndbi",
    "ndre",
    "ndsi",
    "ndvi",
    "ndwi",
    "normalize",
    "normalized_difference",
    "rbndvi",
    "savi",
    "seeding",
    "spectral",
    "stats",
    "swi",
    "tri_band_normalized_difference",
]

_AUGMENT = "pipekit.transforms._augment"

_LAZY = {
    "DEFAULT_BOX_KEYS": _AUGMENT,
    "Augment": _AUGMENT,
    "ColorJitter": _AUGMENT,
    "RandomBrightness": _AUGMENT,
    "RandomChannelDropout": _AUGMENT,
    "RandomContrast": _AUGMENT,
    "RandomGamma": _AUGMENT,
    "RandomGaussianNoise": _AUGMENT,
    "RandomHue": _AUGMENT,
    "RandomRot90": _AUGMENT,
    "RandomSaturation": _AUGMENT,
    "RGBOnly": _AUGMENT,
    "TrivialAugment": _AUGMENT,
    # submodules that import torchvision
    "augment": _AUGMENT,
    "autoaugment": "pipekit.transforms._autoaugment",
    "color": "pipekit.transforms._color",
    "geometric": "pipekit.transforms._geometric",
    "radiometric": "pipekit.transforms._radiometric",
}


def __getattr__(name: str) -> Any:
    """Import :mod:`pipekit.transforms._augment` (and torchvision) on first use of one of its names."""
    if name not in _LAZY:
        raise AttributeError(f"module 'pipekit.transforms' has no attribute {name!r}")
    module = importlib.import_module(_LAZY[name])
    # a submodule exported by name (``augment`` is the module ``_augment``), or a name defined in one
    value = module if module.__name__.rpartition(".")[2].lstrip("_") == name else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
