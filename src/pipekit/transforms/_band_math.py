"""``band_math``: a user formula over named bands, parsed with :mod:`ast` (nothing is ``eval``-ed).

Public in :mod:`pipekit.transforms.index_kernels` (and :mod:`pipekit.transforms`), which says what the formulas
may hold and how the results are computed.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Mapping

import torch
from torch import Tensor

from pipekit.errors import BandMathError
from pipekit.transforms._index_common import (
    _NAN,
    _finish,
    _read_bands,
    _safe_div,
)

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
