"""torchdata's ``torchdata.datapipes.map`` namespace: the map-style pipes of :mod:`pipekit.pipes`.

``dp.map.SequenceWrapper``, ``dp.map.Mapper``, ``dp.map.Batcher``, ``dp.map.Shuffler``,
``dp.map.Zipper``, ``dp.map.Concater``, ``dp.map.IterToMapConverter`` and ``dp.map.MapDataPipe``
under torchdata's names, with ``import pipekit.pipes as dp``; see :mod:`pipekit.pipes.iter` for
how both namespaces are derived from ``pipekit.pipes.__all__``.

Example:
    >>> import pipekit.pipes as dp
    >>> squares = dp.map.SequenceWrapper(range(4)).map(lambda x: x * x)
    >>> squares[3], isinstance(squares, dp.map.Mapper)
    (9, True)
    >>> from pipekit.pipes.map import Batcher
    >>> Batcher(dp.map.SequenceWrapper(range(5)), 2)[2]
    [4]
"""

from __future__ import annotations

from pipekit.pipes.iter import torchdata_namespaces

__all__: list[str] = []


def _fill() -> None:
    classes = torchdata_namespaces()["map"]
    globals().update(classes)
    __all__.extend(sorted(classes))


_fill()


def __getattr__(name: str) -> object:
    """A torchdata name pipekit deliberately lacks raises ``AttributeError`` naming what to use instead."""
    import sys

    from pipekit.pipes._missing import missing_name

    # the caller: ``from pipekit.pipes.map import X`` gets an ImportError naming the replacement (see missing_name)
    raise missing_name("torchdata", __name__, name, sys._getframe(1))
