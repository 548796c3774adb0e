"""TorchGeo 0.8's ``torchgeo.samplers``, by the same names: replace ``torchgeo`` by ``pipekit`` in the import.

>>> from pipekit.samplers import GridGeoSampler, RandomGeoSampler, RandomBatchGeoSampler, Units

The samplers are :mod:`pipekit.geo.samplers`' (also importable from
:mod:`pipekit.geo`): each yields TorchGeo 0.8's queries, ``(slice(xmin,
xmax), slice(ymin, ymax), slice(tmin, tmax))`` with ``pandas.Timestamp``
times (batch samplers: lists of them), takes TorchGeo's arguments (``roi`` a
shapely ``Polygon``, ``toi`` a ``pandas.Interval``, ``units=Units.PIXELS``,
``generator``) and adds pipekit's own: ``seed=``, resumable iterators and
:meth:`~pipekit.geo.samplers.GeoSampler.as_pipe` for pipe-native pipelines
with exact mid-epoch resume.  Where pipekit differs on purpose (every
in-footprint position can be drawn; the grid's last row and column end at
the footprint's edge) the migration guide (``docs/migration/torchgeo.md``) says so.

The samplers need the ``geo`` extra (``pip install "pipekit[geo]"``); they
are imported on first use.

Example:
    >>> from types import SimpleNamespace
    >>> from pipekit.geo._index import GeoIndex
    >>> ds = SimpleNamespace(index=GeoIndex([[0, 40, 0, 20]]), res=(1.0, 1.0))
    >>> x, y, t = next(iter(GridGeoSampler(ds, size=10)))
    >>> x, y
    (slice(0.0, 10.0, None), slice(10.0, 20.0, None))
"""

from typing import TYPE_CHECKING, Any

from pipekit._optional import lazy_attributes

if TYPE_CHECKING:
    from pipekit.geo.samplers import (
        BatchGeoSampler,
        GeoSampler,
        GeoSamplerPipe,
        GridGeoSampler,
        PreChippedGeoSampler,
        RandomBatchGeoSampler,
        RandomGeoSampler,
        Units,
        get_random_bounding_box,
        tile_to_chips,
    )

__all__ = [
    "BatchGeoSampler",
    "GeoSampler",
    "GridGeoSampler",
    "PreChippedGeoSampler",
    "RandomBatchGeoSampler",
    "RandomGeoSampler",
    "Units",
    "get_random_bounding_box",
    "tile_to_chips",
    "GeoSamplerPipe",
]

# and TorchGeo's private ``_to_tuple`` (``torchgeo.samplers.utils``), which TorchGeo code imports
_getattr, _dir = lazy_attributes(
    __name__, dict.fromkeys([*__all__, "_to_tuple"], "pipekit.geo.samplers"), globals()
)


def __getattr__(name: str) -> Any:
    """Import :mod:`pipekit.geo.samplers` (the geo extra's packages) on first use."""
    return _getattr(name)


def __dir__() -> list[str]:
    return _dir()
