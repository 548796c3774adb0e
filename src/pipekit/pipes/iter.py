"""torchdata's ``torchdata.datapipes.iter`` namespace: every iterable pipe of :mod:`pipekit.pipes`.

torchdata code is often written against the namespaces rather than the classes; only the import
line changes::

    import pipekit.pipes as dp                 # was: import torchdata.datapipes as dp
    files = dp.iter.FileLister("data/", masks="*.csv")
    rows = dp.iter.FileOpener(files, mode="rt").parse_csv()
    table = dp.map.SequenceWrapper(["a", "b"])

    from pipekit.pipes.iter import Mapper      # was: from torchdata.datapipes.iter import Mapper

The namespaces are built from ``pipekit.pipes.__all__`` when pipekit is imported, so a pipe added
to :mod:`pipekit.pipes` appears here without a list to keep up to date:

* :mod:`pipekit.pipes.map` holds the map-style pipes (subclasses of ``MapDataPipe``) and torch's
  pipes that :mod:`pipekit.pipes` exports with a ``Map`` prefix because an iterable pipe has the
  same name (``MapBatcher``, ``MapShuffler``...); there they have torchdata's names
  (``dp.map.Batcher``, ``dp.map.Shuffler``);
* this module holds every other pipe class, under the same name as in :mod:`pipekit.pipes`
  (``IterDataPipe`` included, as in torchdata).

Names :mod:`pipekit.pipes` exports that are not pipes (``StreamWrapper``, ``functional_datapipe``,
the error classes) are in neither namespace.

Example:
    >>> import pipekit.pipes as dp
    >>> list(dp.iter.IterableWrapper(range(4)).map(str))
    ['0', '1', '2', '3']
    >>> dp.iter.Mapper is dp.Mapper, dp.map.Mapper is dp.MapMapper
    (True, True)
    >>> dp.map.SequenceWrapper([10, 20, 30])[1]
    20
"""

from __future__ import annotations

from typing import Any

import pipekit.pipes as _pipes
from pipekit.pipes.base import IterDataPipe, MapDataPipe

__all__: list[str] = []


def torchdata_namespaces() -> dict[str, dict[str, type]]:
    """``{"iter": {name: class}, "map": {name: class}}``: :mod:`pipekit.pipes`' pipe classes split as torchdata's."""
    exported: dict[str, Any] = {name: getattr(_pipes, name) for name in _pipes.__all__}
    namespaces: dict[str, dict[str, type]] = {"iter": {}, "map": {}}
    for name, obj in exported.items():
        if not (isinstance(obj, type) and issubclass(obj, IterDataPipe | MapDataPipe)):
            continue
        # pipekit.pipes prefixes torch's map-style pipes with "Map" where an iterable pipe has the name.
        map_twin = name.startswith("Map") and name[3:] in exported
        if map_twin:
            namespaces["map"][name[3:]] = obj
        elif issubclass(obj, MapDataPipe):
            namespaces["map"][name] = obj
        else:
            namespaces["iter"][name] = obj
    return namespaces


def _fill() -> None:
    classes = torchdata_namespaces()["iter"]
    globals().update(classes)
    __all__.extend(sorted(classes))


_fill()


def __getattr__(name: str) -> object:
    """A torchdata name pipekit deliberately lacks raises ``AttributeError`` naming what to use instead."""
    import sys

    from pipekit.pipes._missing import missing_name

    # the caller: ``from pipekit.pipes.iter import X`` gets an ImportError naming the replacement (see missing_name)
    raise missing_name("torchdata", __name__, name, sys._getframe(1))
