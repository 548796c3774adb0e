"""Argument checks shared by pipes, recipes and datasets, with one message format.

Every check raises ``TypeError`` for a value of the wrong type and ``ValueError`` for one out of range, and
formats its message as ``"<where>: <name> must be <what>, got <value>"`` (``where``: the pipe's functional name
or the class a user called), so a user sees the same sentence whichever pipe refused the argument.

Example:
    >>> check_int(3, "batch_size", "batch", minimum=1)
    3
    >>> check_int(0, "batch_size", "batch", minimum=1)
    Traceback (most recent call last):
    ...
    ValueError: batch: batch_size must be a positive int, got 0
    >>> check_int("3", "limit", "header", minimum=0)
    Traceback (most recent call last):
    ...
    TypeError: header: limit must be an int >= 0, got str '3'
    >>> check_choice("val", "split", "UCMerced", ("train", "val", "test"))
    'val'
    >>> check_choice("validation", "split", "UCMerced", ("train", "val", "test"))
    Traceback (most recent call last):
    ...
    ValueError: UCMerced: split must be one of train, val, test, got 'validation'
    >>> check_callable(5, "transforms", "VHR10")
    Traceback (most recent call last):
    ...
    TypeError: VHR10: transforms must be callable or None, got 5
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any, Literal, overload

__all__ = ["check_callable", "check_choice", "check_int"]


def _what(minimum: int | None, allow_none: bool) -> str:
    if minimum is None:
        what = "an int"
    elif minimum == 1:
        what = "a positive int"
    else:
        what = f"an int >= {minimum}"
    return f"{what} or None" if allow_none else what


@overload
def check_int(
    value: Any, name: str, where: str, *, minimum: int | None = ..., allow_none: Literal[False] = ...
) -> int: ...


@overload
def check_int(value: Any, name: str, where: str, *, minimum: int | None = ..., allow_none: bool) -> int | None: ...


def check_int(value: Any, name: str, where: str, *, minimum: int | None = None, allow_none: bool = False) -> int | None:
    """``value`` as an ``int`` (``bool`` refused) of at least ``minimum``, or ``None`` where ``allow_none``.

    Args:
        value: what the user passed.
        name: the argument's name.
        where: the pipe's functional name or the class called, which starts the message.
        minimum: the smallest value accepted (``None``: any).
        allow_none: accept ``None`` (and return it).
    """
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        what = _what(minimum, allow_none)
        raise TypeError(f"{where}: {name} must be {what}, got {type(value).__name__} {value!r:.50}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{where}: {name} must be {_what(minimum, allow_none)}, got {value}")
    return int(value)


def check_choice(value: Any, name: str, where: str, choices: Sequence[Any], *, context: str = "") -> Any:
    """``value`` if it is one of ``choices``; else ``ValueError`` naming them (a dataset's ``split``).

    Args:
        value: what the user passed.
        name: the argument's name.
        where: the pipe's functional name or the class called, which starts the message.
        choices: the values accepted, in the order the message lists them.
        context: what the choices depend on, said after them (``"for version '3_block'"``); ``""``: nothing.

    Example:
        >>> check_choice("validation", "split", "So2Sat", ("train", "test"), context="for version '3_block'")
        Traceback (most recent call last):
        ...
        ValueError: So2Sat: split must be one of train, test for version '3_block', got 'validation'
    """
    if value not in choices:
        said = f" {context}" if context else ""
        raise ValueError(f"{where}: {name} must be one of {', '.join(map(str, choices))}{said}, got {value!r}")
    return value


def check_callable(value: Any, name: str, where: str) -> Any:
    """``value`` if it is callable or ``None``; else ``TypeError`` (a dataset's ``transforms``).

    Args:
        value: what the user passed.
        name: the argument's name.
        where: the pipe's functional name or the class called, which starts the message.
    """
    if value is not None and not callable(value):
        raise TypeError(f"{where}: {name} must be callable or None, got {value!r}")
    return value
