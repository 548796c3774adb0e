"""The one seam between pipekit and torch's DataPipe machinery.

Everything pipekit takes from ``torch.utils.data.datapipes`` (the base
classes, the functional-name registry, torch's own pipes, ``StreamWrapper``),
from ``torch.utils.data.graph`` (walking a pipeline) and every private
attribute of torch's DataPipes it relies on (the pickling hook, iterator ids,
the shuffle buffer, the loader's serialization wrapper) is imported or touched
here and nowhere else; ``tests/pipes/test_seam.py`` enforces it by reading the
package's imports.  Should torch change or drop its DataPipe core, this is the
module to rewrite.

The rest of pipekit imports the public names through
:mod:`pipekit.pipes.base`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.utils.data import IterDataPipe, MapDataPipe
from torch.utils.data.datapipes._decorator import functional_datapipe as torch_functional_datapipe
from torch.utils.data.datapipes.datapipe import _IterDataPipeSerializationWrapper
from torch.utils.data.datapipes.iter import (
    Batcher,
    Collator,
    Concater,
    Demultiplexer,
    FileLister,
    FileOpener,
    Filter,
    Forker,
    Grouper,
    Mapper,
    Multiplexer,
    RoutedDecoder,
    Sampler,
    ShardingFilter,
    Shuffler,
    StreamReader,
    UnBatcher,
    Zipper,
)
from torch.utils.data.datapipes.iter import IterableWrapper as TorchIterableWrapper
from torch.utils.data.datapipes.map import Batcher as MapBatcher
from torch.utils.data.datapipes.map import Concater as MapConcater
from torch.utils.data.datapipes.map import Mapper as MapMapper
from torch.utils.data.datapipes.map import SequenceWrapper
from torch.utils.data.datapipes.map import Shuffler as MapShuffler
from torch.utils.data.datapipes.map import Zipper as MapZipper
from torch.utils.data.datapipes.utils.common import StreamWrapper
from torch.utils.data.graph import traverse_dps

__all__ = [
    # bases and registration
    "IterDataPipe",
    "MapDataPipe",
    "torch_functional_datapipe",
    "registry",
    "register_as_function",
    # torch's own pipes (re-exported by pipekit.pipes.builtin)
    "Batcher",
    "Collator",
    "Concater",
    "Demultiplexer",
    "FileLister",
    "FileOpener",
    "Filter",
    "Forker",
    "Grouper",
    "MapBatcher",
    "MapConcater",
    "MapMapper",
    "MapShuffler",
    "MapZipper",
    "Mapper",
    "Multiplexer",
    "RoutedDecoder",
    "Sampler",
    "SequenceWrapper",
    "ShardingFilter",
    "Shuffler",
    "StreamReader",
    "TorchIterableWrapper",
    "UnBatcher",
    "Zipper",
    # utilities
    "StreamWrapper",
    "LoaderPipeWrapper",
    "pipe_graph",
    "pickle_state",
    "iterator_id",
    "shuffler_position",
    "restore_shuffler",
]

# torch's iterator hook asks every pipe, at every ``next()``, whether it is a
# child of a ``fork``/``demux`` with ``hasattr(pipe, "_is_child_datapipe")``.
# Only torch's ``_ChildDataPipe`` defines it, so for every other pipe the lookup
# misses and falls through ``IterDataPipe.__getattr__`` (the functional-name
# table) to an ``AttributeError``: about half of a short chain's per-item cost.
# A class default of ``False`` answers the same thing at once; ``_ChildDataPipe``
# keeps its own ``True``.
IterDataPipe._is_child_datapipe = False


class LoaderPipeWrapper(_IterDataPipeSerializationWrapper):
    """The wrapper torch's DataLoader puts around a DataPipe, with its private fields named.

    torch pickles the pipe through it for the workers (with ``dill`` when the
    pipe holds lambdas), and the fetcher pulls items from it.  Subclasses use
    :attr:`pipe`, :meth:`restart` and :meth:`next_item` instead of torch's
    private attributes.
    """

    @property
    def pipe(self) -> Any:
        """The wrapped pipeline."""
        return self._datapipe

    def restart(self) -> None:
        """Start a new iterator on the wrapped pipeline."""
        self._datapipe_iter = iter(self._datapipe)

    def next_item(self) -> Any:
        """The next item of the current iterator (``StopIteration`` at the end)."""
        return next(self._datapipe_iter)  # type: ignore[arg-type]


def registry(kind: str) -> dict[str, Any]:
    """torch's table of functional names for ``"iter"`` or ``"map"`` pipes (name -> factory)."""
    return IterDataPipe.functions if kind == "iter" else MapDataPipe.functions


def register_as_function(kind: str, name: str, cls: type) -> None:
    """Register ``cls`` under functional ``name`` on ``"iter"`` or ``"map"`` pipes."""
    base = IterDataPipe if kind == "iter" else MapDataPipe
    base.register_datapipe_as_function(name, cls)


def pipe_graph(pipe: Any) -> dict[int, Any]:
    """torch's graph of the pipes ``pipe`` references: ``{id: (pipe, subgraph)}``."""
    return traverse_dps(pipe)


def pickle_state(state: dict[str, Any]) -> Any:
    """What a pipe's ``__getstate__`` returns for ``state``, after torch's pickling hook.

    torch's DataLoader installs a hook (``IterDataPipe.getstate_hook``) while it
    pickles a pipeline for its workers; a pipe that writes its own
    ``__getstate__`` must pass its state through it, as torch's base class does.
    """
    hook: Callable[[dict[str, Any]], Any] | None = IterDataPipe.getstate_hook
    return hook(state) if hook is not None else state


def iterator_id(pipe: Any) -> int | None:
    """How many iterators torch has started on ``pipe`` minus one (``None``: none yet).

    torch numbers a pipe's iterators when they start (at their first item);
    comparing the number before and after an epoch's first item tells which
    pipes have not started in this epoch.
    """
    return getattr(pipe, "_valid_iterator_id", None)


def shuffler_position(pipe: Shuffler) -> dict[str, Any]:
    """The shuffle buffer and random generator state of torch's ``Shuffler``."""
    return {"buffer": list(pipe._buffer), "rng": pipe._rng.getstate()}


def restore_shuffler(pipe: Shuffler, position: dict[str, Any]) -> None:
    """Put back a :func:`shuffler_position` into torch's ``Shuffler`` (its seed is spent)."""
    pipe._buffer = list(position["buffer"])
    pipe._rng.setstate(position["rng"])
    pipe._seed = None
