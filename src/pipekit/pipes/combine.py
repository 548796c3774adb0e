"""Pipes that combine several sources into one, or split one source into several (a re-export module).

The pipes that lived here are now in one module per family; this module
keeps every name importable from its old path:

* :mod:`pipekit.pipes.zipping`: ``zip_longest`` (:class:`ZipperLongest`),
  ``zip_with_iter`` (:class:`IterKeyZipper`), ``zip_with_map`` (:class:`MapKeyZipper`);
* :mod:`pipekit.pipes.multiplexing`: ``mux_longest`` (:class:`MultiplexerLongest`),
  :class:`SampleMultiplexer`;
* :mod:`pipekit.pipes.splitting`: ``round_robin_demux`` (:class:`RoundRobinDemultiplexer`),
  ``unzip`` (:class:`UnZipper`), ``random_split`` (:class:`RandomSplitter`) and
  their shared containers and children;
* :mod:`pipekit.pipes.conversion`: ``to_map_datapipe`` (:class:`IterToMapConverter`),
  ``to_iter_datapipe`` (:class:`MapToIterConverter`).
"""

from __future__ import annotations

from pipekit.pipes.conversion import IterToMapConverter, MapToIterConverter
from pipekit.pipes.multiplexing import MultiplexerLongest, SampleMultiplexer
from pipekit.pipes.splitting import (
    RandomSplitter,
    RoundRobinDemultiplexer,
    SplitterIterator,
    UnZipper,
    _check_buffer_size,
    _RandomSplitContainer,
    _RoundRobinContainer,
    _SplitChild,
    _SplitContainer,
    _UnZipContainer,
)
from pipekit.pipes.zipping import IterKeyZipper, MapKeyZipper, ZipperLongest, _check_pipes

__all__ = [
    "IterKeyZipper",
    "IterToMapConverter",
    "MapKeyZipper",
    "MapToIterConverter",
    "MultiplexerLongest",
    "RandomSplitter",
    "RoundRobinDemultiplexer",
    "SampleMultiplexer",
    "UnZipper",
    "ZipperLongest",
]

# Private names that lived here, importable from the old path too.
_MOVED = (
    SplitterIterator,
    _RandomSplitContainer,
    _RoundRobinContainer,
    _SplitChild,
    _SplitContainer,
    _UnZipContainer,
    _check_buffer_size,
    _check_pipes,
)
