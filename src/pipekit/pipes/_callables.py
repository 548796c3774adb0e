"""Checking and calling the user functions that pipes apply (``fn``, ``input_col``)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any

InputCol = Hashable | Sequence[Hashable] | None


def _fn_name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__


def _check_callable(fn: Any, stage: str, what: str = "fn") -> None:
    if not callable(fn):
        raise TypeError(f"{stage}: {what} must be callable, got {type(fn).__name__}")


def _validate_input_col(fn: Callable[..., Any], input_col: InputCol, stage: str, nargs: int | None = None) -> None:
    """Check that ``fn`` accepts as many positional arguments as ``input_col`` selects."""
    if nargs is None:
        nargs = len(input_col) if isinstance(input_col, (list, tuple)) else 1
    if isinstance(input_col, (list, tuple)) and len(input_col) == 0:
        raise ValueError(f"{stage}: input_col must not be an empty {type(input_col).__name__}")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins and C functions: cannot check
        return
    try:
        sig.bind(*range(nargs))
    except TypeError as exc:
        raise ValueError(
            f"{stage}: fn {_fn_name(fn)} cannot be called with {nargs} positional argument(s) "
            f"(input_col={input_col!r}): {exc}"
        ) from None


def _apply_input_col(fn: Callable[..., Any], data: Any, input_col: InputCol) -> Any:
    if input_col is None:
        return fn(data)
    if isinstance(input_col, (list, tuple)):
        return fn(*(data[col] for col in input_col))
    return fn(data[input_col])


def _unpack(*args: Any) -> Any:
    """The default ``fn`` of ``flatmap``: the item itself (a tuple of columns with several ``input_col``)."""
    return args[0] if len(args) == 1 else args


def _iter_outputs(outputs: Any, stage: str, item: Any) -> Iterator[Any]:
    try:
        return iter(outputs)
    except TypeError:
        raise TypeError(
            f"{stage}: fn must return an iterable, got {type(outputs).__name__} for item {item!r:.200}"
        ) from None
