"""Spectral indices as pure tensor kernels (what the ``Append*`` transforms compute).

The kernels are also importable from :mod:`pipekit.transforms.indices`, which
holds TorchGeo's ``Append*`` classes beside them (``from
pipekit.transforms.indices import ndvi`` keeps working).

Every kernel takes an image with its band axis at ``-3`` (a ``[C, H, W]``
sample, a ``[B, C, H, W]`` batch, or any ``[..., C, H, W]``), the positions of
the bands it needs, and returns the index as a ``[..., 1, H, W]`` tensor, ready
to be appended with ``torch.cat((image, index), dim=-3)``.  They run on any
device, the same way on a sample in a DataLoader worker and on a batch on the
GPU.

Numerics, the same for every kernel:

* **dtype**: float16 and bfloat16 inputs are computed in float32 and the
  result is returned in the input's dtype (float32 and float64 stay as they
  are); integer inputs (uint8, uint16, int16...) give float32.
* **zero denominators** give ``fill`` (default 0), never NaN or Inf.  Any other
  non-finite result of a valid pixel (float overflow, ``sqrt`` of a negative
  number in :func:`band_math`) also becomes ``fill``, and results too large for
  a half-precision output are clamped to its largest finite value.
* **nodata**: a pixel is nodata when any band the index reads equals
  ``nodata`` or is NaN or infinite.  Nodata pixels get ``nodata_out`` in the
  output, NaN by default, so they stay missing (pass ``nodata_out=0`` or
  another value to mark them differently).  Nodata is decided on the raw band
  values, before ``scale`` and ``offset``.
* **scale, offset**: the bands are read as ``value * scale + offset`` (e.g.
  ``scale=0.0000275, offset=-0.2`` for Landsat Collection 2 surface
  reflectance, ``scale=1e-4`` for Sentinel-2 L2A).  Ratios of differences do
  not depend on ``scale`` but do on ``offset``; :func:`evi` and :func:`savi`
  add constants that assume reflectance in 0..1, so they need both right.

The formulas (bands by their role; ``ND(a, b) = (a - b) / (a + b)``):

=============  ==========================================  =========================
``ndvi``       ND(nir, red)                                 vegetation
``ndwi``       ND(green, nir)                               water (McFeeters 1996)
``mndwi``      ND(green, swir)                              water (Xu 2006), SWIR1
``ndbi``       ND(swir, nir)                                built-up
``ndsi``       ND(green, swir)                              snow
``nbr``        ND(nir, swir)                                burn ratio, SWIR2
``ndre``       ND(nir, vre1)                                red edge
``gndvi``      ND(nir, green)                               green NDVI
``bndvi``      ND(nir, blue)                                blue NDVI
``swi``        ND(vre1, swir2)                              standardized water-level
``grndvi``     (nir - (green + red)) / (nir + green + red)  tri-band
``gbndvi``     (nir - (green + blue)) / (nir + green + blue)
``rbndvi``     (nir - (red + blue)) / (nir + red + blue)
``evi``        G (nir - red) / (nir + C1 red - C2 blue + L)  G=2.5, C1=6, C2=7.5, L=1
``savi``       (1 + L) (nir - red) / (nir + red + L)        L=0.5
=============  ==========================================  =========================

:func:`band_math` evaluates a user formula over named bands, parsed with
:mod:`ast` (only numbers, band names, ``+ - * / **``, unary minus and the
functions ``abs sqrt exp log min max``; nothing is ``eval``-ed).

The numerics every kernel shares are in :mod:`pipekit.transforms._index_common`,
:func:`band_math` in :mod:`pipekit.transforms._band_math`; this module re-exports it.

Example:
    >>> import torch
    >>> from pipekit.transforms.index_kernels import ndvi
    >>> image = torch.tensor([[[0.1, 0.0]], [[0.5, 0.0]]])  # bands: red, nir; 1x2 pixels
    >>> ndvi(image, nir=1, red=0)
    tensor([[[0.6667, 0.0000]]])
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from pipekit.errors import BandMathError
from pipekit.transforms._band_math import band_math, parse_band_math
from pipekit.transforms._index_common import (
    _NAN,
    _check_number,
    _finish,
    _nd,
    _read_bands,
    _tri,
)

__all__ = [
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


# --------------------------------------------------------------------------- normalized differences


def normalized_difference(
    image: Tensor,
    a: int,
    b: int,
    *,
    fill: float = 0.0,
    nodata: float | None = None,
    nodata_out: float = _NAN,
    scale: float = 1.0,
    offset: float = 0.0,
) -> Tensor:
    """``(A - B) / (A + B)`` of bands ``a`` and ``b`` of ``image`` (band axis -3).

    Args:
        image: ``[..., C, H, W]`` tensor.
        a, b: band positions (negative positions count from the end).
        fill: value where ``A + B == 0``.
        nodata: raw band value that marks missing pixels (NaN and infinite
            values always do).
        nodata_out: the output value of nodata pixels (default NaN).
        scale, offset: read bands as ``value * scale + offset``.

    Returns:
        ``[..., 1, H, W]``: float32 for integer input, the input dtype otherwise.

    Example:
        >>> import torch
        >>> from pipekit.transforms.index_kernels import normalized_difference
        >>> image = torch.tensor([[[3, 0, 0]], [[1, 0, 5]]], dtype=torch.uint16)
        >>> normalized_difference(image, 0, 1, nodata=5)
        tensor([[[0.5000, 0.0000,    nan]]])
    """
    return _nd(image, a, b, "normalized_difference", ("a", "b"), fill, nodata, nodata_out, scale, offset)


def tri_band_normalized_difference(
    image: Tensor,
    a: int,
    b: int,
    c: int,
    *,
    fill: float = 0.0,
    nodata: float | None = None,
    nodata_out: float = _NAN,
    scale: float = 1.0,
    offset: float = 0.0,
) -> Tensor:
    """``(A - (B + C)) / (A + B + C)`` of bands ``a``, ``b``, ``c`` (TorchGeo's tri-band index).

    Arguments and numerics as :func:`normalized_difference`.

    Example:
        >>> import torch
        >>> from pipekit.transforms.index_kernels import tri_band_normalized_difference
        >>> tri_band_normalized_difference(torch.tensor([[[4.0]], [[1.0]], [[1.0]]]), 0, 1, 2)
        tensor([[[0.3333]]])
    """
    return _tri(
        image, a, b, c, "tri_band_normalized_difference", ("a", "b", "c"), fill, nodata, nodata_out, scale, offset
    )


def _make_nd(name: str, role_a: str, role_b: str, title: str) -> Callable[..., Tensor]:
    def kernel(
        image: Tensor,
        *args: int,
        fill: float = 0.0,
        nodata: float | None = None,
        nodata_out: float = _NAN,
        scale: float = 1.0,
        offset: float = 0.0,
        **bands: int,
    ) -> Tensor:
        positions = _bind(name, (role_a, role_b), args, bands)
        return _nd(image, *positions, name, (role_a, role_b), fill, nodata, nodata_out, scale, offset)

    kernel.__name__ = kernel.__qualname__ = name
    kernel.__doc__ = (
        f"{title}: ``({role_a} - {role_b}) / ({role_a} + {role_b})``.\n\n"
        f"Call as ``{name}(image, {role_a}=i, {role_b}=j)`` (or positionally, in that order) with the band\n"
        f"positions in ``image`` (band axis -3).  Keyword options ``fill``, ``nodata``, ``nodata_out``,\n"
        f"``scale`` and ``offset`` as :func:`normalized_difference`.  Returns ``[..., 1, H, W]``.\n"
    )
    return kernel


def _make_tri(name: str, roles: tuple[str, str, str], title: str) -> Callable[..., Tensor]:
    def kernel(
        image: Tensor,
        *args: int,
        fill: float = 0.0,
        nodata: float | None = None,
        nodata_out: float = _NAN,
        scale: float = 1.0,
        offset: float = 0.0,
        **bands: int,
    ) -> Tensor:
        positions = _bind(name, roles, args, bands)
        return _tri(image, *positions, name, roles, fill, nodata, nodata_out, scale, offset)

    a, b, c = roles
    kernel.__name__ = kernel.__qualname__ = name
    kernel.__doc__ = (
        f"{title}: ``({a} - ({b} + {c})) / ({a} + {b} + {c})``.\n\n"
        f"Call as ``{name}(image, {a}=i, {b}=j, {c}=k)`` (or positionally, in that order).  Options as\n"
        f":func:`normalized_difference`.  Returns ``[..., 1, H, W]``.\n"
    )
    return kernel


def _bind(name: str, roles: tuple[str, ...], args: tuple[Any, ...], bands: dict[str, Any]) -> list[Any]:
    if len(args) > len(roles):
        raise TypeError(f"{name}() takes {len(roles)} band positions ({', '.join(roles)}), got {len(args)}")
    values = dict(zip(roles, args))
    for role, band in bands.items():
        if role not in roles:
            raise TypeError(f"{name}() got an unexpected keyword argument {role!r} (bands: {', '.join(roles)})")
        if role in values:
            raise TypeError(f"{name}() got multiple values for band {role!r}")
        values[role] = band
    missing = [r for r in roles if r not in values]
    if missing:
        raise TypeError(f"{name}() missing band position(s): {', '.join(missing)}")
    return [values[r] for r in roles]


ndvi = _make_nd("ndvi", "nir", "red", "Normalized Difference Vegetation Index")
ndwi = _make_nd("ndwi", "green", "nir", "Normalized Difference Water Index (McFeeters)")
mndwi = _make_nd("mndwi", "green", "swir", "Modified Normalized Difference Water Index (Xu; SWIR1)")
ndbi = _make_nd("ndbi", "swir", "nir", "Normalized Difference Built-up Index")
ndsi = _make_nd("ndsi", "green", "swir", "Normalized Difference Snow Index")
nbr = _make_nd("nbr", "nir", "swir", "Normalized Burn Ratio (SWIR2)")
ndre = _make_nd("ndre", "nir", "vre1", "Normalized Difference Red Edge index")
gndvi = _make_nd("gndvi", "nir", "green", "Green Normalized Difference Vegetation Index")
bndvi = _make_nd("bndvi", "nir", "blue", "Blue Normalized Difference Vegetation Index")
swi = _make_nd("swi", "vre1", "swir2", "Standardized Water-Level Index")
grndvi = _make_tri("grndvi", ("nir", "green", "red"), "Green-Red Normalized Difference Vegetation Index")
gbndvi = _make_tri("gbndvi", ("nir", "green", "blue"), "Green-Blue Normalized Difference Vegetation Index")
rbndvi = _make_tri("rbndvi", ("nir", "red", "blue"), "Red-Blue Normalized Difference Vegetation Index")


# --------------------------------------------------------------------------- EVI, SAVI


def evi(
    image: Tensor,
    nir: int,
    red: int,
    blue: int,
    *,
    G: float = 2.5,  # noqa: N803 - the formula's names
    C1: float = 6.0,  # noqa: N803
    C2: float = 7.5,  # noqa: N803
    L: float = 1.0,  # noqa: N803
    fill: float = 0.0,
    nodata: float | None = None,
    nodata_out: float = _NAN,
    scale: float = 1.0,
    offset: float = 0.0,
) -> Tensor:
    """Enhanced Vegetation Index: ``G (nir - red) / (nir + C1 red - C2 blue + L)``.

    The standard coefficients (MODIS) assume surface reflectance in 0..1:
    pass ``scale``/``offset`` for integer products.  Other options as
    :func:`normalized_difference`.

    Example:
        >>> import torch
        >>> from pipekit.transforms.index_kernels import evi
        >>> image = torch.tensor([[[0.5]], [[0.1]], [[0.05]]])  # nir, red, blue
        >>> round(float(evi(image, nir=0, red=1, blue=2)), 4)  # 2.5 * 0.4 / (0.5 + 0.6 - 0.375 + 1)
        0.5797
    """
    fn = "evi"
    consts = [_check_number(v, k, fn) for k, v in (("G", G), ("C1", C1), ("C2", C2), ("L", L))]
    g, c1, c2, soil = consts
    bands, invalid = _read_bands(image, {"nir": nir, "red": red, "blue": blue}, fn, nodata, scale, offset)
    n, r, b = bands["nir"], bands["red"], bands["blue"]
    out = g * (n - r) / (n + c1 * r - c2 * b + soil)
    return _finish(out, None, invalid, fill, nodata_out, image.dtype, fn)


def savi(
    image: Tensor,
    nir: int,
    red: int,
    *,
    L: float = 0.5,  # noqa: N803 - the formula's name
    fill: float = 0.0,
    nodata: float | None = None,
    nodata_out: float = _NAN,
    scale: float = 1.0,
    offset: float = 0.0,
) -> Tensor:
    """Soil-Adjusted Vegetation Index: ``(1 + L) (nir - red) / (nir + red + L)``.

    ``L`` (soil brightness correction, default 0.5) assumes reflectance in
    0..1: pass ``scale``/``offset`` for integer products.  Other options as
    :func:`normalized_difference`.

    Example:
        >>> import torch
        >>> from pipekit.transforms.index_kernels import savi
        >>> float(savi(torch.tensor([[[0.3]], [[0.2]]]), nir=0, red=1))  # 1.5 * 0.1 / 1.0
        0.15000000596046448
    """
    fn = "savi"
    soil = _check_number(L, "L", fn)
    bands, invalid = _read_bands(image, {"nir": nir, "red": red}, fn, nodata, scale, offset)
    n, r = bands["nir"], bands["red"]
    out = (1.0 + soil) * (n - r) / (n + r + soil)
    return _finish(out, None, invalid, fill, nodata_out, image.dtype, fn)


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class IndexSpec:
    """A named index: its kernel, the band roles it reads (in order) and its numeric parameters."""

    kernel: Callable[..., Tensor]
    roles: tuple[str, ...]
    params: tuple[str, ...] = ()


INDICES: dict[str, IndexSpec] = {
    "normalized_difference": IndexSpec(normalized_difference, ("a", "b")),
    "tri_band_normalized_difference": IndexSpec(tri_band_normalized_difference, ("a", "b", "c")),
    "ndvi": IndexSpec(ndvi, ("nir", "red")),
    "ndwi": IndexSpec(ndwi, ("green", "nir")),
    "mndwi": IndexSpec(mndwi, ("green", "swir")),
    "ndbi": IndexSpec(ndbi, ("swir", "nir")),
    "ndsi": IndexSpec(ndsi, ("green", "swir")),
    "nbr": IndexSpec(nbr, ("nir", "swir")),
    "ndre": IndexSpec(ndre, ("nir", "vre1")),
    "gndvi": IndexSpec(gndvi, ("nir", "green")),
    "bndvi": IndexSpec(bndvi, ("nir", "blue")),
    "swi": IndexSpec(swi, ("vre1", "swir2")),
    "grndvi": IndexSpec(grndvi, ("nir", "green", "red")),
    "gbndvi": IndexSpec(gbndvi, ("nir", "green", "blue")),
    "rbndvi": IndexSpec(rbndvi, ("nir", "red", "blue")),
    "evi": IndexSpec(evi, ("nir", "red", "blue"), ("G", "C1", "C2", "L")),
    "savi": IndexSpec(savi, ("nir", "red"), ("L",)),
}
"""Named indices by lower-case name (what :class:`~pipekit.transforms.AppendIndex` accepts)."""
