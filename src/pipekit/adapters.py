"""Adapters for :class:`pipekit.DataLoader2` (torchdata's ``torchdata.dataloader2.adapter``).

An adapter is a callable that takes a pipe and returns it changed (or a new
one); ``DataLoader2(pipe, datapipe_adapter_fn=[...])`` applies each to its copy
of the pipe, and again to a pipe restored by ``load_state_dict``.

Example:
    >>> from pipekit import DataLoader2
    >>> from pipekit.adapters import Shuffle
    >>> from pipekit.pipes import IterableWrapper
    >>> pipe = IterableWrapper(range(6)).shuffle()
    >>> list(DataLoader2(pipe, [Shuffle(False)]))
    [0, 1, 2, 3, 4, 5]
"""

from __future__ import annotations

import inspect
import warnings
from abc import abstractmethod
from typing import Any

from pipekit.pipes._resume import pipeline_pipes

__all__ = ["Adapter", "Shuffle"]


class Adapter:
    """The base of adapters: a callable ``adapter(datapipe) -> datapipe``."""

    @abstractmethod
    def __call__(self, datapipe: Any) -> Any:
        """Change ``datapipe`` in place and return it, or return a new pipe."""


def _is_shuffler(pipe: Any) -> bool:
    """A pipe whose shuffling can be switched (torch's criterion: ``set_shuffle`` and ``set_seed`` methods)."""
    return inspect.ismethod(getattr(pipe, "set_shuffle", None)) and inspect.ismethod(getattr(pipe, "set_seed", None))


class Shuffle(Adapter):
    """Switch every shuffling pipe of the graph on or off (torchdata's ``Shuffle`` adapter).

    Args:
        enable: ``True`` enables every ``shuffle`` (and every other pipe with
            ``set_shuffle``: ``bucketbatch``, ``in_batch_shuffle``...), and adds a
            ``shuffle()`` at the end of the pipe, with a warning, if there is
            none; ``False`` disables them all; ``None`` changes nothing.
    """

    def __init__(self, enable: bool | None = True) -> None:
        self.enable = enable

    def __call__(self, datapipe: Any) -> Any:
        if self.enable is None:
            return datapipe
        shufflers = [dp for dp in pipeline_pipes(datapipe) if _is_shuffler(dp)]
        if not shufflers and self.enable:
            warnings.warn(
                "`shuffle=True` was set, but the datapipe does not contain a `Shuffler`. Adding one at the end. "
                "Be aware that the default buffer size might not be sufficient for your task.",
                UserWarning,
                stacklevel=2,
            )
            datapipe = datapipe.shuffle()
            shufflers = [datapipe]
        for shuffler in shufflers:
            shuffler.set_shuffle(self.enable)
        return datapipe

    def __repr__(self) -> str:
        return f"Shuffle(enable={self.enable!r})"
