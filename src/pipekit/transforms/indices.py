"""TorchGeo's ``torchgeo.transforms.indices``: the ``Append*`` index transforms, and pipekit's index kernels.

Every class of TorchGeo 0.8's module is here under its name, with its
constructor arguments (``index_a``, ``index_nir``, ``index_red``...,
positional in TorchGeo's order) and its call semantics, so code written for
TorchGeo runs after changing ``from torchgeo.transforms import indices`` to
``from pipekit.transforms import indices``:

* a bare ``[C, H, W]`` tensor gives ``[1, C + 1, H, W]`` (TorchGeo's classes are
  kornia augmentations, which return a batch of one; pass ``keepdim=True`` for
  ``[C + 1, H, W]``), a ``[B, C, H, W]`` batch gives ``[B, C + 1, H, W]``;
* they chain in ``nn.Sequential`` and inside kornia's ``AugmentationSequential``
  (where one with ``keepdim=True`` is applied to single ``[C, H, W]`` images,
  give pipekit's classes ``keepdim=True`` too: kornia sets it on its own
  augmentations only);
* a sample dict ``{"image": ...}`` gets the index appended to its image, which
  keeps its number of dimensions (what TorchGeo's samples get through
  ``AugmentationSequential(..., data_keys=None, keepdim=True)``; TorchGeo's
  classes cannot take a dict themselves).

pipekit adds bands given by name (``AppendNDVI(nir="SR_B5", red="SR_B4")`` on
samples that carry ``"bands"``, or with ``bands=dataset.bands``), the options
``fill``, ``nodata``, ``nodata_out``, ``scale``, ``offset``, and more indices
(:class:`AppendMNDWI`, :class:`AppendEVI`, :class:`AppendSAVI`,
:class:`AppendBandMath`, and :class:`AppendIndex` for any of them by name).  The
classes are defined in :mod:`pipekit.transforms._spectral`, which lists where
pipekit deliberately differs from TorchGeo (zero denominators give 0, never
NaN or Inf; no ``1e-10`` bias; integer images accepted).

The pure kernels (:func:`ndvi`, :func:`normalized_difference`, :func:`band_math`,
:data:`INDICES`...) live in :mod:`pipekit.transforms.index_kernels` and are
importable from here too.

Example:
    >>> import torch
    >>> from pipekit.transforms import indices
    >>> transform = indices.AppendNDVI(index_nir=1, index_red=0)
    >>> image = torch.tensor([[[0.1]], [[0.5]]])            # red, nir; [C, H, W]
    >>> out = transform(image)
    >>> out.shape, round(float(out[0, -1]), 4)              # TorchGeo's shape: a batch of one
    (torch.Size([1, 3, 1, 1]), 0.6667)
    >>> transform(image.unsqueeze(0).expand(4, 2, 1, 1)).shape
    torch.Size([4, 3, 1, 1])
    >>> transform({"image": image, "label": 3})["image"].shape
    torch.Size([3, 1, 1])
"""

from __future__ import annotations

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
from pipekit.transforms.index_kernels import (
    INDICES,
    BandMathError,
    IndexSpec,
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
    parse_band_math,
    rbndvi,
    savi,
    swi,
    tri_band_normalized_difference,
)

__all__ = [
    # TorchGeo 0.8's torchgeo.transforms.indices
    "AppendBNDVI",
    "AppendGBNDVI",
    "AppendGNDVI",
    "AppendGRNDVI",
    "AppendNBR",
    "AppendNDBI",
    "AppendNDRE",
    "AppendNDSI",
    "AppendNDVI",
    "AppendNDWI",
    "AppendNormalizedDifferenceIndex",
    "AppendRBNDVI",
    "AppendSWI",
    "AppendTriBandNormalizedDifferenceIndex",
    # pipekit's additions
    "AppendBandMath",
    "AppendEVI",
    "AppendIndex",
    "AppendMNDWI",
    "AppendSAVI",
    # kernels (pipekit.transforms.index_kernels)
    "INDICES",
    "BandMathError",
    "IndexSpec",
    "band_math",
    "bndvi",
    "evi",
    "gbndvi",
    "gndvi",
    "grndvi",
    "mndwi",
    "nbr",
    "ndbi",
    "ndre",
    "ndsi",
    "ndvi",
    "ndwi",
    "normalized_difference",
    "parse_band_math",
    "rbndvi",
    "savi",
    "swi",
    "tri_band_normalized_difference",
]
