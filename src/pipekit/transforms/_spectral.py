"""Append spectral indices to samples and batches: :class:`AppendIndex` and TorchGeo-style shortcuts.

An :class:`AppendIndex` computes an index with the kernels of
:mod:`pipekit.transforms.index_kernels` and appends it as a channel.  The same
object works

* on one sample ``{"image": [C, H, W], ...}`` (``pipe.map(AppendNDVI(...))``
  or ``pipe.append_index(...)`` in DataLoader workers): it returns the sample
  with ``sample["image"]`` of shape ``[C + 1, H, W]``, every other key kept;
* on a collated batch ``{"image": [B, C, H, W], ...}``, on any device: it is a
  ``torch.nn.Module``, so ``AppendNDVI(...).to("cuda")`` or a call on a GPU batch
  just works (it has no parameters); the image becomes ``[B, C + 1, H, W]``;
* on a bare image tensor, with TorchGeo's (kornia's) semantics: ``[C, H, W]``
  gives ``[1, C + 1, H, W]`` (a batch of one, as TorchGeo's ``Append*``
  classes, kornia augmentations, return it; ``keepdim=True`` gives
  ``[C + 1, H, W]``), ``[B, C, H, W]`` gives ``[B, C + 1, H, W]``.  So
  TorchGeo's tutorials (``image = AppendNDVI(index_nir=7, index_red=3)(image)[0]``),
  ``nn.Sequential`` chains and kornia's ``AugmentationSequential`` behave the
  same with pipekit's classes.  One exception: kornia's
  ``AugmentationSequential(..., keepdim=True)`` passes its ``keepdim`` on to
  kornia augmentations only (TorchGeo's classes are some), so where such a
  sequence is applied to single ``[C, H, W]`` images, build pipekit's
  transforms in it with ``keepdim=True`` (on ``[B, C, H, W]`` batches nothing
  changes).

A sample dict keeps its image's shape: TorchGeo's classes cannot be called on a
dict at all (kornia's ``AugmentationSequential(..., data_keys=None,
keepdim=True)`` unpacks it and gives the same shapes as pipekit here).

Bands are given by position or by name.  Names (``AppendNDVI(nir="SR_B5",
red="SR_B4")``) are looked up in the sample's ``"bands"`` entry when it has one,
else in ``bands=`` given to the transform (e.g. ``bands=dataset.bands``); see
:mod:`pipekit.transforms._bands`.  When a sample carries ``"bands"``, the index
name is appended to it, so a later transform can use the index by name.

Integer images (uint8, uint16...) become float32 to hold the index; float
images keep their dtype.  Zero denominators give ``fill`` (0) and nodata
pixels ``nodata_out`` (NaN), see :mod:`pipekit.transforms.index_kernels`.

Deliberate differences from TorchGeo 0.8 (whose classes compute
``(A - B) / (A + B + 1e-10)``):

* a zero denominator gives ``fill`` (0), never NaN or Inf.  TorchGeo gives 0
  where both bands are 0 in float32, but NaN in float16 (``1e-10`` rounds to
  0), and ``(A - B) * 1e10`` (``+-inf`` in float16) where ``A + B == 0`` with ``A != 0``
  (normalised, signed data);
* no ``1e-10`` is added, so tiny denominators are not biased (TorchGeo gives
  0.0099 instead of 1 for ``A = 1e-12, B = 0``);
* integer images are accepted (and give float32); kornia refuses them.

Everywhere else (finite bands, non-zero denominators) the values agree to
float rounding.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from pipekit.transforms._bands import band_names_for, check_band_spec, check_names, resolve_band
from pipekit.transforms.index_kernels import INDICES, band_math, parse_band_math

__all__ = [
    "AppendIndex",
    "AppendNormalizedDifferenceIndex",
    "AppendTriBandNormalizedDifferenceIndex",
    "AppendNDVI",
    "AppendNDWI",
    "AppendMNDWI",
    "AppendNDBI",
    "AppendNDSI",
    "AppendNBR",
    "AppendNDRE",
    "AppendGNDVI",
    "AppendBNDVI",
    "AppendSWI",
    "AppendGRNDVI",
    "AppendGBNDVI",
    "AppendRBNDVI",
    "AppendEVI",
    "AppendSAVI",
    "AppendBandMath",
]

_NAN = float("nan")
Band = int | str


class AppendIndex(nn.Module):
    """Append a spectral index as a new channel of ``sample["image"]``.

    Args:
        index: a named index (``"ndvi"``, ``"ndwi"``, ``"mndwi"``, ``"ndbi"``,
            ``"ndsi"``, ``"nbr"``, ``"ndre"``, ``"gndvi"``, ``"bndvi"``,
            ``"swi"``, ``"grndvi"``, ``"gbndvi"``, ``"rbndvi"``, ``"evi"``,
            ``"savi"``, ``"normalized_difference"``,
            ``"tri_band_normalized_difference"``; case-insensitive) or a
            :func:`~pipekit.transforms.index_kernels.band_math` formula such as
            ``"(nir - red) / (nir + red)"``.
        **bands_and_params: the band of each role of the index, by position or
            name, as ``nir=4`` or with TorchGeo's spelling ``index_nir=4``
            (roles: see :data:`~pipekit.transforms.index_kernels.INDICES`; for a
            formula, the names it uses); and the index's own parameters
            (``L`` for SAVI; ``G``, ``C1``, ``C2``, ``L`` for EVI).
        bands: the names of the image's bands, in order (e.g.
            ``dataset.bands``), to resolve bands given by name when the
            sample has no ``"bands"`` entry.
        key: the sample entry holding the image.
        bands_key: the sample entry that may hold band names (``None``: never
            read it).  If present, the new channel's name is appended to it.
        name: the new channel's name (default: the index name, or
            ``"band_math"`` for a formula).
        fill, nodata, nodata_out, scale, offset: numerics, as
            :func:`~pipekit.transforms.index_kernels.normalized_difference`.
        keepdim: for a bare ``[C, H, W]`` tensor, return ``[C + 1, H, W]``
            instead of TorchGeo's (kornia's) ``[1, C + 1, H, W]``.  Sample
            dicts and batches always keep their number of dimensions.

    Example:
        >>> import torch
        >>> from pipekit.transforms import AppendIndex
        >>> sample = {"image": torch.tensor([[[0.1]], [[0.5]]]), "bands": ["red", "nir"], "id": 7}
        >>> out = AppendIndex("ndvi", nir="nir", red="red")(sample)
        >>> out["image"].shape, round(float(out["image"][2]), 4), out["bands"], out["id"]
        (torch.Size([3, 1, 1]), 0.6667, ['red', 'nir', 'ndvi'], 7)
        >>> AppendIndex("ndvi", nir=1, red=0)(sample["image"]).shape  # a bare tensor: TorchGeo's shape
        torch.Size([1, 3, 1, 1])
    """

    def __init__(
        self,
        index: str,
        *,
        bands: Sequence[str] | None = None,
        key: str = "image",
        bands_key: str | None = "bands",
        name: str | None = None,
        fill: float = 0.0,
        nodata: float | None = None,
        nodata_out: float = _NAN,
        scale: float = 1.0,
        offset: float = 0.0,
        keepdim: bool = False,
        **bands_and_params: Any,
    ) -> None:
        super().__init__()
        where = type(self).__name__
        if not isinstance(index, str) or not index.strip():
            raise TypeError(f"{where}: index must be an index name or a formula (str), got {index!r}")
        spec = INDICES.get(index.strip().lower())
        if spec is not None:
            self.index = index.strip().lower()
            self.expression: str | None = None
            roles, param_names = spec.roles, spec.params
        elif index.strip().isidentifier():
            raise ValueError(
                f"{where}: unknown index {index!r}; known indices: {', '.join(sorted(INDICES))} "
                "(or pass a band_math formula such as '(nir - red) / (nir + red)')"
            )
        else:
            parse_band_math(index)
            self.index = "band_math"
            self.expression = index
            roles, param_names = parse_band_math(index)[1], ()
        kwargs = dict(bands_and_params)
        band_spec: dict[str, Band] = {}
        for role in roles:
            plain, torchgeo = kwargs.pop(role, None), kwargs.pop(f"index_{role}", None)
            if plain is not None and torchgeo is not None:
                raise TypeError(f"{where}: band {role!r} given twice ({role}={plain!r}, index_{role}={torchgeo!r})")
            value = plain if plain is not None else torchgeo
            if value is None:
                raise TypeError(f"{where}: missing band {role!r} (pass {role}=<position or name>)")
            band_spec[role] = check_band_spec(value, role, where)
        params: dict[str, float] = {}
        for p in param_names:
            if p in kwargs:
                value = kwargs.pop(p)
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise TypeError(f"{where}: {p} must be a number, got {value!r}")
                params[p] = float(value)
        for k in [k for k, v in kwargs.items() if v is None]:
            del kwargs[k]  # unused role keywords of the named shortcuts
        if kwargs:
            expected = [*roles, *param_names]
            raise TypeError(f"{where}: unexpected argument(s) {sorted(kwargs)} (this index takes {expected})")
        for label, value in (("fill", fill), ("scale", scale), ("offset", offset), ("nodata_out", nodata_out)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{where}: {label} must be a number, got {value!r}")
        if not math.isfinite(fill):
            raise ValueError(f"{where}: fill must be finite, got {fill}")
        if nodata is not None and (isinstance(nodata, bool) or not isinstance(nodata, (int, float))):
            raise TypeError(f"{where}: nodata must be a number or None, got {nodata!r}")
        if not isinstance(key, str):
            raise TypeError(f"{where}: key must be a str, got {key!r}")
        if name is not None and not isinstance(name, str):
            raise TypeError(f"{where}: name must be a str, got {name!r}")
        if not isinstance(keepdim, bool):
            raise TypeError(f"{where}: keepdim must be a bool, got {keepdim!r}")
        self.bands = check_names(bands, where)
        self.band_spec = band_spec
        self.params = params
        self.key = key
        self.bands_key = bands_key
        self.name = name if name is not None else self.index
        self.fill = float(fill)
        self.nodata = None if nodata is None else float(nodata)
        self.nodata_out = float(nodata_out)
        self.scale = float(scale)
        self.offset = float(offset)
        self.keepdim = keepdim

    def extra_repr(self) -> str:
        what = repr(self.expression) if self.expression is not None else self.index
        bands = ", ".join(f"{k}={v!r}" for k, v in self.band_spec.items())
        return f"{what}, {bands}"

    def compute(self, image: Tensor, names: Sequence[str] | None = None) -> Tensor:
        """The index of ``image`` (``[..., C, H, W]``) as ``[..., 1, H, W]``, not appended."""
        where = type(self).__name__
        known = tuple(names) if names is not None else self.bands
        positions = {role: resolve_band(b, known, role, where) for role, b in self.band_spec.items()}
        options = {
            "fill": self.fill,
            "nodata": self.nodata,
            "nodata_out": self.nodata_out,
            "scale": self.scale,
            "offset": self.offset,
        }
        try:
            if self.expression is not None:
                return band_math(image, self.expression, **options, **positions)
            return INDICES[self.index].kernel(image, **positions, **self.params, **options)
        except (IndexError, ValueError, TypeError) as exc:
            raise type(exc)(f"{where}: {exc}") from exc

    def forward(self, sample: Any) -> Any:
        where = type(self).__name__
        if isinstance(sample, Tensor):
            index = self.compute(sample, self.bands)
            out = torch.cat((sample.to(index.dtype), index), dim=-3)
            # TorchGeo's classes are kornia augmentations: a single [C, H, W] image comes back as a batch of one.
            return out.unsqueeze(0) if out.dim() == 3 and not self.keepdim else out
        if not isinstance(sample, Mapping):
            raise TypeError(f"{where}: expects a sample dict or an image tensor, got {type(sample).__name__}")
        if self.key not in sample:
            raise KeyError(f"{where}: the sample has no {self.key!r} entry (keys: {sorted(map(str, sample))})")
        image = sample[self.key]
        if not isinstance(image, Tensor):
            raise TypeError(f"{where}: sample[{self.key!r}] must be a tensor, got {type(image).__name__}")
        names = band_names_for(sample, self.bands, self.bands_key, where)
        index = self.compute(image, names)
        out = dict(sample)
        out[self.key] = torch.cat((image.to(index.dtype), index), dim=-3)
        if self.bands_key is not None and sample.get(self.bands_key) is not None:
            carried = sample[self.bands_key]
            if len(carried) and all(isinstance(v, str) for v in carried):
                out[self.bands_key] = [*carried, self.name]
            else:
                out[self.bands_key] = [[*per_sample, self.name] for per_sample in carried]
        return out


class AppendBandMath(AppendIndex):
    """Append a user formula over named bands (see :func:`~pipekit.transforms.index_kernels.band_math`).

    Example:
        >>> import torch
        >>> from pipekit.transforms import AppendBandMath
        >>> t = AppendBandMath("nir / red", nir=1, red=0, name="ratio")
        >>> t({"image": torch.tensor([[[2.0]], [[3.0]]])})["image"].flatten().tolist()
        [2.0, 3.0, 1.5]
    """

    def __init__(self, expression: str, **kwargs: Any) -> None:
        if isinstance(expression, str) and expression.strip().lower() in INDICES:
            raise ValueError(f"AppendBandMath: {expression!r} is a named index; use AppendIndex({expression!r}, ...)")
        if isinstance(expression, str) and expression.strip().isidentifier():
            expression = f"({expression.strip()})"  # a single band: still a formula
        super().__init__(expression, **kwargs)


def _shortcut_doc(cls_name: str, index: str, args: str, torchgeo: bool = True) -> str:
    kernel = INDICES[index].kernel
    title = (kernel.__doc__ or "").split(":")[0].strip() or index.upper()
    tg = " TorchGeo's argument names (``index_...``) and plain role names both work." if torchgeo else ""
    return (
        f"Append {title} ({index.upper()}) to ``sample['image']``: :class:`AppendIndex` ``({index!r})``.\n\n"
        f"Bands ({args}) by position or by name (with ``bands=`` or a sample ``'bands'`` entry).{tg}\n"
        f"Keyword options as :class:`AppendIndex`.  Formula: :mod:`pipekit.transforms.index_kernels`.\n"
    )


class AppendNormalizedDifferenceIndex(AppendIndex):
    """Append ``(A - B) / (A + B)`` of bands ``index_a`` and ``index_b`` (TorchGeo's class).

    Example:
        >>> import torch
        >>> from pipekit.transforms import AppendNormalizedDifferenceIndex
        >>> out = AppendNormalizedDifferenceIndex(index_a=0, index_b=1)(torch.tensor([[[3.0]], [[1.0]]]))
        >>> out.flatten().tolist()
        [3.0, 1.0, 0.5]
    """

    def __init__(
        self, index_a: Band | None = None, index_b: Band | None = None, *, a: Band | None = None,
        b: Band | None = None, **options: Any,
    ) -> None:  # fmt: skip
        super().__init__("normalized_difference", index_a=index_a, index_b=index_b, a=a, b=b, **options)


class AppendTriBandNormalizedDifferenceIndex(AppendIndex):
    """Append ``(A - (B + C)) / (A + B + C)`` of bands ``index_a``, ``index_b``, ``index_c`` (TorchGeo's class).

    Example:
        >>> import torch
        >>> from pipekit.transforms import AppendTriBandNormalizedDifferenceIndex
        >>> t = AppendTriBandNormalizedDifferenceIndex(index_a=0, index_b=1, index_c=2)
        >>> out = t(torch.tensor([[[4.0]], [[1.0]], [[1.0]]]))
        >>> out.shape, round(float(out[0, 3]), 4)
        (torch.Size([1, 4, 1, 1]), 0.3333)
    """

    def __init__(
        self, index_a: Band | None = None, index_b: Band | None = None, index_c: Band | None = None, *,
        a: Band | None = None, b: Band | None = None, c: Band | None = None, **options: Any,
    ) -> None:  # fmt: skip
        super().__init__(
            "tri_band_normalized_difference",
            index_a=index_a,
            index_b=index_b,
            index_c=index_c,
            a=a,
            b=b,
            c=c,
            **options,
        )


class AppendNDVI(AppendIndex):
    __doc__ = _shortcut_doc("AppendNDVI", "ndvi", "nir, red")

    def __init__(
        self, index_nir: Band | None = None, index_red: Band | None = None, *, nir: Band | None = None,
        red: Band | None = None, **options: Any,
    ) -> None:  # fmt: skip
        super().__init__("ndvi", index_nir=index_nir, index_red=index_red, nir=nir, red=red, **options)


class AppendNDWI(AppendIndex):
    __doc__ = _shortcut_doc("AppendNDWI", "ndwi", "green, nir")

    def __init__(
        self, index_green: Band | None = None, index_nir: Band | None = None, *, green: Band | None = None,
        nir: Band | None = None, **options: Any,
    ) -> None:  # fmt: skip
        super().__init__("ndwi", index_green=index_green, index_nir=index_nir, green=green, nir=nir, **options)


class AppendMNDWI(AppendIndex):
    __doc__ = _shortcut_doc("AppendMNDWI", "mndwi", "green, swir")

    def __init__(
        self, index_green: Band | None = None, index_swir: Band | None = None, *, green: Band | None = None,
        swir: Band | None = None, **options: Any,
    ) -> None:  # fmt: skip
        super().__init__("mndwi", index_green=index_green, index_swir=index_swir, green=green, swir=swir, **options)


class AppendNDBI(AppendIndex):
    __doc__ = _shortcut_doc("AppendNDBI", "ndbi", "swir, nir")

    def __init__(
        self, index_swir: Band | None = None, index_nir: Band | None = None, *, swir: Band | None = None,
        nir: Band | None = None, **options: Any,
    ) -> None:  # fmt: skip
        super().__init__("ndbi", index_swir=index_swir, index_nir=index_nir, swir=swir, nir=nir, **options)


class AppendNDSI(AppendIndex):
    __doc__ = _shortcut_doc("AppendNDSI", "ndsi", "green, swir")

    def __init__(
        self, index_green: Band | None = None, index_swir: Band | None = None, *, green: Band | None = None,
        swir: Band | None = None, **options: Any,
    ) -> None:  # fmt: skip
        super().__init__("ndsi", index_green=index_green, index_swir=index_swir, green=green, swir=swir, **options)


class AppendNBR(AppendIndex):
    __doc__ = _shortcut_doc("AppendNBR", "nbr", "nir, swir")

    def __init__(
        self, index_nir: Band | None = None, index_swir: Band | None = None, *, nir: Band | None = None,
        swir: Band | None = None, **options: Any,
    ) -> None:  # fmt: skip
        super().__init__("nbr", index_nir=index_nir, index_swir=index_swir, nir=nir, swir=swir, **options)


class AppendNDRE(AppendIndex):
    __doc__ = _shortcut_doc("AppendNDRE", "ndre", "nir, vre1")

    def __init__(
        self, index_nir: Band | None = None, index_vre1: Band | None = None, *, nir: Band | None = None,
        vre1: Band | None = None, **options: Any,
    ) -> None:  # fmt: skip
        super().__init__("ndre", index_nir=index_nir, index_vre1=index_vre1, nir=nir, vre1=vre1, **options)


class AppendGNDVI(AppendIndex):
    __doc__ = _shortcut_doc("AppendGNDVI", "gndvi", "nir, green")

    def __init__(
        self, index_nir: Band | None = None, index_green: Band | None = None, *, nir: Band | None = None,
        green: Band | None = None, **options: Any,
    ) -> None:  # fmt: skip
        super().__init__("gndvi", index_nir=index_nir, index_green=index_green, nir=nir, green=green, **options)


class AppendBNDVI(AppendIndex):
    __doc__ = _shortcut_doc("AppendBNDVI", "bndvi", "nir, blue")

    def __init__(
        self, index_nir: Band | None = None, index_blue: Band | None = None, *, nir: Band | None = None,
        blue: Band | None = None, **options: Any,
    ) -> None:  # fmt: skip
        super().__init__("bndvi", index_nir=index_nir, index_blue=index_blue, nir=nir, blue=blue, **options)


class AppendSWI(AppendIndex):
    __doc__ = _shortcut_doc("AppendSWI", "swi", "vre1, swir2")

    def __init__(
        self, index_vre1: Band | None = None, index_swir2: Band | None = None, *, vre1: Band | None = None,
        swir2: Band | None = None, **options: Any,
    ) -> None:  # fmt: skip
        super().__init__("swi", index_vre1=index_vre1, index_swir2=index_swir2, vre1=vre1, swir2=swir2, **options)


class AppendGRNDVI(AppendIndex):
    __doc__ = _shortcut_doc("AppendGRNDVI", "grndvi", "nir, green, red")

    def __init__(
        self, index_nir: Band | None = None, index_green: Band | None = None, index_red: Band | None = None, *,
        nir: Band | None = None, green: Band | None = None, red: Band | None = None, **options: Any,
    ) -> None:  # fmt: skip
        super().__init__(
            "grndvi",
            index_nir=index_nir,
            index_green=index_green,
            index_red=index_red,
            nir=nir,
            green=green,
            red=red,
            **options,
        )


class AppendGBNDVI(AppendIndex):
    __doc__ = _shortcut_doc("AppendGBNDVI", "gbndvi", "nir, green, blue")

    def __init__(
        self, index_nir: Band | None = None, index_green: Band | None = None, index_blue: Band | None = None, *,
        nir: Band | None = None, green: Band | None = None, blue: Band | None = None, **options: Any,
    ) -> None:  # fmt: skip
        super().__init__(
            "gbndvi",
            index_nir=index_nir,
            index_green=index_green,
            index_blue=index_blue,
            nir=nir,
            green=green,
            blue=blue,
            **options,
        )


class AppendRBNDVI(AppendIndex):
    __doc__ = _shortcut_doc("AppendRBNDVI", "rbndvi", "nir, red, blue")

    def __init__(
        self, index_nir: Band | None = None, index_red: Band | None = None, index_blue: Band | None = None, *,
        nir: Band | None = None, red: Band | None = None, blue: Band | None = None, **options: Any,
    ) -> None:  # fmt: skip
        super().__init__(
            "rbndvi",
            index_nir=index_nir,
            index_red=index_red,
            index_blue=index_blue,
            nir=nir,
            red=red,
            blue=blue,
            **options,
        )


class AppendEVI(AppendIndex):
    __doc__ = _shortcut_doc("AppendEVI", "evi", "nir, red, blue", torchgeo=False) + (
        "\nCoefficients ``G=2.5, C1=6, C2=7.5, L=1`` by default; pass ``scale``/``offset`` so bands\n"
        "read as reflectance in 0..1.\n"
    )

    def __init__(
        self, nir: Band | None = None, red: Band | None = None, blue: Band | None = None, **options: Any,
    ) -> None:  # fmt: skip
        super().__init__("evi", nir=nir, red=red, blue=blue, **options)


class AppendSAVI(AppendIndex):
    __doc__ = _shortcut_doc("AppendSAVI", "savi", "nir, red", torchgeo=False) + (
        "\n``L=0.5`` by default; pass ``scale``/``offset`` so bands read as reflectance in 0..1.\n"
    )

    def __init__(self, nir: Band | None = None, red: Band | None = None, **options: Any) -> None:
        super().__init__("savi", nir=nir, red=red, **options)
