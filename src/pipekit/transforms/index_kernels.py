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

Example:
    >>> import torch
    >>> from pipekit.transforms.index_kernels import ndvi
    >>> image = torch.tensor([[[0.1, 0.0]], [[0.5, 0.0]]])  # bands: red, nir; 1x2 pixels
    >>> ndvi(image, nir=1, red=0)
    tensor([[[0.6667, 0.0000]]])
"""

from __future__ import annotations

import ast
import functools
import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from pipekit.errors import BandMathError

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

_NAN = float("nan")
_HALF = (torch.float16, torch.bfloat16)


# --------------------------------------------------------------------------- shared machinery


def _check_image(image: Any, fn: str) -> None:
    if not isinstance(image, Tensor):
        raise TypeError(f"{fn}: image must be a torch.Tensor, got {type(image).__name__}")
    if image.dim() < 3:
        raise ValueError(
            f"{fn}: image must have its band axis at -3 ([C, H, W] or [B, C, H, W]), got shape {tuple(image.shape)}"
        )
    if image.dtype == torch.bool or image.is_complex():
        raise TypeError(f"{fn}: image must be a real number tensor, got dtype {image.dtype}")


def _band_position(image: Tensor, band: Any, role: str, fn: str) -> int:
    if isinstance(band, bool) or not hasattr(band, "__index__"):
        raise TypeError(f"{fn}: band {role} must be an integer position, got {band!r}")
    i = operator.index(band)
    channels = image.shape[-3]
    if not -channels <= i < channels:
        raise IndexError(f"{fn}: band {role}={i} is out of range for an image with {channels} bands")
    return i % channels


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _output_dtype(dtype: torch.dtype) -> torch.dtype:
    return dtype if dtype.is_floating_point else torch.float32


def _check_number(value: Any, name: str, fn: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            value = float(value)  # numpy scalars, 0-d tensors
        except (TypeError, ValueError):
            raise TypeError(f"{fn}: {name} must be a number, got {type(value).__name__}") from None
    return float(value)


def _read_bands(
    image: Tensor,
    bands: Mapping[str, Any],
    fn: str,
    nodata: float | None,
    scale: float,
    offset: float,
) -> tuple[dict[str, Tensor], Tensor | None]:
    """The bands as ``[..., 1, H, W]`` compute-dtype tensors, and the nodata mask (or None)."""
    _check_image(image, fn)
    scale = _check_number(scale, "scale", fn)
    offset = _check_number(offset, "offset", fn)
    if nodata is not None:
        nodata = _check_number(nodata, "nodata", fn)
    ct = _compute_dtype(image.dtype)
    out: dict[str, Tensor] = {}
    invalid: Tensor | None = None
    for role, band in bands.items():
        i = _band_position(image, band, role, fn)
        raw = image.narrow(-3, i, 1)
        bad: Tensor | None = None
        if raw.is_floating_point():
            bad = (raw - raw) != 0  # NaN and +-inf; several times faster than ~torch.isfinite on CPU
        if nodata is not None and not math.isnan(nodata):
            eq = raw == nodata
            bad = eq if bad is None else bad | eq
        if bad is not None:
            invalid = bad if invalid is None else invalid | bad
        x = raw.to(ct)
        if scale != 1.0:
            x = x * scale
        if offset != 0.0:
            x = x + offset
        out[role] = x
    return out, invalid


def _safe_div(num: Tensor, den: Tensor) -> tuple[Tensor, Tensor]:
    """``num / den`` with zero denominators replaced by 1, and the zero mask."""
    zero = den == 0
    return num / torch.where(zero, torch.ones_like(den), den), zero


def _finish(
    out: Tensor,
    zero: Tensor | None,
    invalid: Tensor | None,
    fill: float,
    nodata_out: float,
    dtype: torch.dtype,
    fn: str,
) -> Tensor:
    fill = _check_number(fill, "fill", fn)
    nodata_out = _check_number(nodata_out, "nodata_out", fn)
    if not math.isfinite(fill):
        raise ValueError(f"{fn}: fill must be finite (it replaces zero denominators), got {fill}")
    if zero is not None:
        out = out.masked_fill(zero, fill)
    # x / 0 is +-inf and 0 / 0 is NaN: one pass turns zero denominators (and any overflow) into fill.
    out = torch.nan_to_num(out, nan=fill, posinf=fill, neginf=fill)
    out_dtype = _output_dtype(dtype)
    if out_dtype in _HALF:
        info = torch.finfo(out_dtype)
        out = out.clamp_(info.min, info.max)
    if invalid is not None:
        out = out.masked_fill_(invalid, nodata_out)
    return out.to(out_dtype)


def _nd(
    image: Tensor,
    a: Any,
    b: Any,
    fn: str,
    roles: tuple[str, str],
    fill: float,
    nodata: float | None,
    nodata_out: float,
    scale: float,
    offset: float,
) -> Tensor:
    bands, invalid = _read_bands(image, {roles[0]: a, roles[1]: b}, fn, nodata, scale, offset)
    x, y = bands[roles[0]], bands[roles[1]]
    out = (x - y) / (x + y)
    return _finish(out, None, invalid, fill, nodata_out, image.dtype, fn)


def _tri(
    image: Tensor,
    a: Any,
    b: Any,
    c: Any,
    fn: str,
    roles: tuple[str, str, str],
    fill: float,
    nodata: float | None,
    nodata_out: float,
    scale: float,
    offset: float,
) -> Tensor:
    bands, invalid = _read_bands(image, {roles[0]: a, roles[1]: b, roles[2]: c}, fn, nodata, scale, offset)
    x, d = bands[roles[0]], bands[roles[1]] + bands[roles[2]]
    out = (x - d) / (x + d)
    return _finish(out, None, invalid, fill, nodata_out, image.dtype, fn)


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


# --------------------------------------------------------------------------- band math

_BINOPS: dict[type, str] = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Pow: "**"}
_UNARY: dict[type, str] = {ast.USub: "-", ast.UAdd: "+"}
_FUNCS: dict[str, int] = {"abs": 1, "sqrt": 1, "exp": 1, "log": 1, "min": 2, "max": 2}


@functools.lru_cache(maxsize=256)
def parse_band_math(expression: str) -> tuple[ast.Expression, tuple[str, ...]]:
    """Parse and check a band_math formula; returns its tree and the band names it uses.

    Raises ``ValueError`` naming the offending part for anything but numbers,
    names, ``+ - * / **``, unary ``-``/``+`` and calls of ``abs sqrt exp log
    min max``.

    Example:
        >>> from pipekit.transforms.index_kernels import parse_band_math
        >>> parse_band_math("(nir - red) / (nir + red)")[1]
        ('nir', 'red')
    """
    if not isinstance(expression, str):
        raise TypeError(f"band_math: expression must be a string, got {type(expression).__name__}")
    if len(expression) > 10_000:
        raise BandMathError("band_math: expression is longer than 10000 characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise BandMathError(f"band_math: cannot parse {expression!r}: {exc.msg}") from None
    names: list[str] = []

    def check(node: ast.AST) -> None:
        if isinstance(node, ast.Expression):
            check(node.body)
        elif isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            check(node.left)
            check(node.right)
        elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            check(node.operand)
        elif isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
                raise BandMathError(f"band_math: only numbers are allowed as constants, got {node.value!r}")
        elif isinstance(node, ast.Name):
            if node.id in _FUNCS:
                raise BandMathError(f"band_math: {node.id!r} is a function; call it as {node.id}(...)")
            if node.id not in names:
                names.append(node.id)
        elif isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCS:
                what = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
                raise BandMathError(
                    f"band_math: function {what!r} is not allowed (allowed: {', '.join(sorted(_FUNCS))})"
                )
            if node.keywords or len(node.args) != _FUNCS[node.func.id]:
                raise BandMathError(f"band_math: {node.func.id}() takes {_FUNCS[node.func.id]} positional argument(s)")
            for arg in node.args:
                check(arg)
        else:
            raise BandMathError(
                f"band_math: {ast.unparse(node)!r} is not allowed; use numbers, band names, + - * / **, "
                f"and {', '.join(sorted(_FUNCS))}"
            )

    check(tree)
    if not names:
        raise BandMathError(f"band_math: {expression!r} uses no band")
    return tree, tuple(names)


def _evaluate(node: ast.AST, bands: Mapping[str, Tensor], zero: list[Tensor]) -> Tensor | float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, bands, zero)
    if isinstance(node, ast.Constant):
        return float(node.value)
    if isinstance(node, ast.Name):
        return bands[node.id]
    if isinstance(node, ast.UnaryOp):
        v = _evaluate(node.operand, bands, zero)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp):
        left = _evaluate(node.left, bands, zero)
        right = _evaluate(node.right, bands, zero)
        op = type(node.op)
        if op is ast.Div:
            if isinstance(right, Tensor):
                quotient, z = _safe_div(torch.as_tensor(left, dtype=right.dtype, device=right.device), right)
                zero.append(z)
                return quotient
            if right == 0:
                ref = next(iter(bands.values()))
                zero.append(torch.ones_like(ref, dtype=torch.bool))
                return torch.zeros_like(ref) if not isinstance(left, Tensor) else torch.zeros_like(left)
            return left / right
        if op is ast.Add:
            return left + right
        if op is ast.Sub:
            return left - right
        if op is ast.Mult:
            return left * right
        if isinstance(left, Tensor) or isinstance(right, Tensor):
            return torch.pow(left, right)  # type: ignore[arg-type]
        try:
            return float(left) ** float(right)
        except (OverflowError, ZeroDivisionError):
            return _NAN
    if isinstance(node, ast.Call):
        name = node.func.id  # type: ignore[attr-defined]
        args = [_evaluate(a, bands, zero) for a in node.args]
        ref = next(iter(bands.values()))
        targs = [a if isinstance(a, Tensor) else torch.full_like(ref, a) for a in args]
        if name == "abs":
            return targs[0].abs()
        if name == "sqrt":
            return targs[0].sqrt()
        if name == "exp":
            return targs[0].exp()
        if name == "log":
            return targs[0].log()
        if name == "min":
            return torch.minimum(targs[0], targs[1])
        return torch.maximum(targs[0], targs[1])
    raise BandMathError(f"band_math: unexpected node {ast.dump(node)}")  # pragma: no cover - parse checks


def band_math(
    image: Tensor,
    expression: str,
    *,
    fill: float = 0.0,
    nodata: float | None = None,
    nodata_out: float = _NAN,
    scale: float = 1.0,
    offset: float = 0.0,
    **bands: int,
) -> Tensor:
    """Evaluate a formula over named bands of ``image``.

    Args:
        image: ``[..., C, H, W]`` tensor.
        expression: e.g. ``"(nir - red) / (nir + red)"``; numbers, the band
            names given as keyword arguments, ``+ - * / **``, unary minus and
            ``abs sqrt exp log min max``.  It is parsed, never ``eval``-ed.
        **bands: the position of each band name, e.g. ``nir=4, red=3``.
        fill, nodata, nodata_out, scale, offset: as :func:`normalized_difference`.
            A pixel where any division has a zero denominator, or whose result
            is not finite, gets ``fill``.

    Example:
        >>> import torch
        >>> from pipekit.transforms.index_kernels import band_math
        >>> image = torch.tensor([[[0.2, 0.0]], [[0.6, 0.0]]])
        >>> band_math(image, "(nir - red) / (nir + red)", nir=1, red=0)
        tensor([[[0.5000, 0.0000]]])
    """
    fn = "band_math"
    tree, names = parse_band_math(expression)
    missing = [n for n in names if n not in bands]
    if missing:
        raise ValueError(
            f"band_math: {expression!r} uses band(s) {missing} with no position; pass them as keyword "
            f"arguments, e.g. {missing[0]}=3"
        )
    used = {n: bands[n] for n in names}
    values, invalid = _read_bands(image, used, fn, nodata, scale, offset)
    zero: list[Tensor] = []
    out = _evaluate(tree, values, zero)
    ref = values[names[0]]
    if not isinstance(out, Tensor):
        out = torch.full_like(ref, out)
    out = out.expand_as(ref).to(ref.dtype)
    zmask: Tensor | None = None
    for z in zero:
        zmask = z if zmask is None else zmask | z
    if zmask is not None:
        zmask = zmask.expand_as(out)
    return _finish(out, zmask, invalid, fill, nodata_out, image.dtype, fn)


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
