"""Optional dependencies: the ``geo`` extra's packages, loaded on first use with an error that names the extra.

pipekit's core (pipes, the loaders, image recipes, transforms) needs none of
rasterio, pyproj, pandas, shapely, geopandas and pyarrow; they come with
``pip install "pipekit[geo]"``.  The packages that expose geo names next to
core ones (:mod:`pipekit`, :mod:`pipekit.datasets`, :mod:`pipekit.samplers`)
load them lazily with :func:`lazy_attributes` (a module ``__getattr__``,
PEP 562), so ``import pipekit`` never imports them, ``dir()`` and ``__all__``
still list every name, and using a geo name without the extra raises
:class:`ModuleNotFoundError` naming the missing package and the extra.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping, MutableMapping
from types import ModuleType
from typing import Any

__all__ = [
    "GEO_EXTRA",
    "GEO_PACKAGES",
    "import_optional",
    "lazy_attributes",
    "missing_geo_package",
    "require_geo",
]

GEO_EXTRA = 'pip install "pipekit[geo]"'

# The geo extra's packages (pyproject.toml's ``geo``), by import name.
GEO_PACKAGES = ("rasterio", "pyproj", "pandas", "shapely", "geopandas", "pyarrow")

# Modules the geo packages bring with them: one missing means the extra is missing too.
_GEO_MODULES = frozenset({*GEO_PACKAGES, "affine"})


def missing_geo_package(exc: BaseException) -> str | None:
    """The geo extra's package whose absence raised ``exc`` (or an exception it was raised from), else ``None``.

    Example:
        >>> missing_geo_package(ModuleNotFoundError("No module named 'rasterio'", name="rasterio.crs"))
        'rasterio'
        >>> missing_geo_package(ModuleNotFoundError("No module named 'foo'", name="foo")) is None
        True
    """
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ImportError) and seen.name:
            top = seen.name.partition(".")[0]
            if top in _GEO_MODULES:
                return top
        seen = seen.__cause__
    return None


def _geo_extra_error(what: str, package: str) -> ModuleNotFoundError:
    return ModuleNotFoundError(
        f"{what} needs the {package!r} package, which is not installed; it comes with pipekit's geo extra: {GEO_EXTRA}",
        name=package,
    )


def import_optional(module: str, what: str | None = None) -> ModuleType:
    """Import ``module``; if a geo package it needs is missing, raise an error naming it and the extra.

    Args:
        module: the dotted module name.
        what: what the user asked for, for the message (default: ``module``).

    Other import errors propagate unchanged.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        package = missing_geo_package(exc)
        if package is None:
            raise
        raise _geo_extra_error(what or module, package) from exc


def require_geo(what: str) -> None:
    """Raise the geo extra's error (naming ``what``) unless every package of the extra can be imported.

    For the top of a module that is geo through and through, so that ``import pipekit.geo``
    without the extra says how to install it rather than ``No module named 'rasterio'``.
    """
    for package in GEO_PACKAGES:
        try:
            found = importlib.util.find_spec(package) is not None
        except ImportError:  # a finder that refuses the package, or a broken parent
            found = False
        if not found:
            raise _geo_extra_error(what, package)


def lazy_attributes(
    module_name: str, lazy: Mapping[str, str], namespace: MutableMapping[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The bodies of a module's ``__getattr__`` and ``__dir__`` (PEP 562) that load ``lazy`` names on first use.

    The module defines the two functions itself (so linters see that it has
    them) and calls these::

        _getattr, _dir = lazy_attributes(__name__, {"geo": "pipekit.geo"}, globals())

        def __getattr__(name: str) -> Any:
            return _getattr(name)

        def __dir__() -> list[str]:
            return _dir()

    Args:
        module_name: the module's ``__name__``.
        lazy: each lazily loaded name -> the module that defines it (the name
            itself, ``f"{module_name}.{name}"``, for a submodule).
        namespace: the module's ``globals()``; a loaded value is stored there,
            so ``__getattr__`` runs once per name.

    A name whose module needs a missing geo package raises
    :class:`ModuleNotFoundError` naming the package and ``pipekit[geo]``.
    """

    def getattr_(name: str) -> Any:
        target = lazy.get(name)
        if target is None:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        module = import_optional(target, f"{module_name}.{name}")
        value = module if target == f"{module_name}.{name}" else getattr(module, name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted(set(namespace) | set(lazy))

    return getattr_, dir_
