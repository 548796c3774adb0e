"""torchdata 0.9's map-style pipes that torch does not ship: ``in_memory_cache`` and ``unzip`` on MapDataPipes.

``torchdata.datapipes.map`` had, besides torch's own map-style pipes
(``SequenceWrapper``, ``map``, ``batch``, ``shuffle``, ``zip``, ``concat``,
re-exported by :mod:`pipekit.pipes._builtin` with a ``Map`` prefix where the
name is also an iterable pipe's) and ``IterToMapConverter``
(:mod:`pipekit.pipes._conversion`), two pipes of its own:

* ``in_memory_cache`` (:class:`MapInMemoryCacheHolder`, torchdata's
  ``map.InMemoryCacheHolder``) keeps each item once it has been looked up;
* ``unzip`` (:class:`MapUnZipper`, torchdata's ``map.UnZipper``) splits a
  pipe of sequences into one map-style pipe per position.

Both have the functional names of their iterable namesakes
(:mod:`pipekit.pipes._memory_cache`, :mod:`pipekit.pipes._splitting`),
registered on map-style pipes.  Map-style pipes are looked up, not iterated:
they hold no position, so they are stateless for resume.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipekit.pipes._splitting import _check_sequence, _unzip_columns
from pipekit.pipes._torch import pickle_state
from pipekit.pipes.base import MapDataPipe, functional_datapipe

__all__ = ["MapInMemoryCacheHolder", "MapUnZipper"]


# --------------------------------------------------------------------------- in_memory_cache


@functional_datapipe("in_memory_cache")
class MapInMemoryCacheHolder(MapDataPipe):
    """Keep each item of a map-style pipe once it has been looked up (functional name: ``in_memory_cache``).

    torchdata's ``torchdata.datapipes.map.InMemoryCacheHolder``: the first
    ``dp[index]`` reads ``source_dp[index]`` and keeps it in a dict; later
    lookups of the same index return the kept object (no copy), so expensive
    upstream work (decoding, downloads) runs once per index.  There is no size
    limit.  The cache lives in this process: a pickled copy (a DataLoader
    worker) starts empty (torchdata pickled the cache along with the pipe).
    The pipe holds no position, so it is stateless for resume.

    Args:
        source_dp: the MapDataPipe whose items are kept.

    Example:
        >>> from pipekit.pipes import SequenceWrapper
        >>> calls = []
        >>> def load(i):
        ...     calls.append(i)
        ...     return i * 10
        >>> dp = SequenceWrapper(range(5)).map(load).in_memory_cache()
        >>> list(dp), dp[2], len(dp), calls
        ([0, 10, 20, 30, 40], 20, 5, [0, 1, 2, 3, 4])
    """

    stateless = True

    def __init__(self, source_dp: MapDataPipe) -> None:
        super().__init__()
        if not isinstance(source_dp, MapDataPipe):
            raise TypeError(f"in_memory_cache: source_dp must be a MapDataPipe, got {type(source_dp).__name__}")
        self.source_datapipe = source_dp
        self.cache: dict[Any, Any] = {}

    @property
    def source_dp(self) -> MapDataPipe:
        """The source pipe (torchdata's attribute name for ``source_datapipe``)."""
        return self.source_datapipe

    def __getitem__(self, index: Any) -> Any:
        try:
            return self.cache[index]
        except KeyError:
            pass
        except TypeError:  # an unhashable index (a slice, a list): ask the source, keep nothing
            return self.source_datapipe[index]
        item = self.source_datapipe[index]
        self.cache[index] = item
        return item

    def __len__(self) -> int:
        return len(self.source_datapipe)

    def __getstate__(self) -> Any:
        state = dict(self.__dict__)
        state["cache"] = {}
        return pickle_state(state)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


# --------------------------------------------------------------------------- unzip


class _MapUnZipChild(MapDataPipe):
    """One output of the map-style ``unzip``: ``source[index][column]``."""

    stateless = True  # lookups hold no position

    def __init__(self, source_datapipe: MapDataPipe, column: int, sequence_length: int) -> None:
        super().__init__()
        self.source_datapipe = source_datapipe
        self.column = column
        self.sequence_length = sequence_length

    @property
    def main_datapipe(self) -> MapDataPipe:
        """The source pipe (torchdata's attribute name for ``source_datapipe``)."""
        return self.source_datapipe

    @property
    def instance_id(self) -> int:
        """The column this child returns (torchdata's attribute name)."""
        return self.column

    def __getitem__(self, index: Any) -> Any:
        item = self.source_datapipe[index]
        _check_sequence(item, self.sequence_length, f"item {index!r}")
        return item[self.column]

    def __len__(self) -> int:
        return len(self.source_datapipe)


@functional_datapipe("unzip")
class MapUnZipper(MapDataPipe):
    """Split a map-style pipe of sequences into one map-style pipe per position (functional name: ``unzip``).

    torchdata's ``torchdata.datapipes.map.UnZipper``: returns a list of
    MapDataPipes, one per column not in ``columns_to_skip``; child ``j``'s
    ``[index]`` is ``source[index][column j]`` and its length the source's.
    Nothing is buffered: each lookup reads the source item again (put
    ``in_memory_cache`` before it for expensive items).  An item whose length
    is not ``sequence_length`` raises ``ValueError`` when it is looked up
    (torchdata did not check).  Arguments that leave no child raise
    :class:`~pipekit.errors.ConfigurationError`, a ``ValueError`` (as
    torchdata's for ``sequence_length < 1``) that is also a ``RuntimeError``
    (as torchdata's when every column is skipped).

    Args:
        source_datapipe: a MapDataPipe of sequences (tuples, lists).
        sequence_length: the length of every sequence (> 0).
        columns_to_skip: positions that get no child.

    Example:
        >>> from pipekit.pipes import SequenceWrapper
        >>> source_dp = SequenceWrapper([(i, i + 10, i + 20) for i in range(3)])
        >>> dp1, dp2, dp3 = source_dp.unzip(sequence_length=3)
        >>> list(dp1), list(dp2), list(dp3)
        ([0, 1, 2], [10, 11, 12], [20, 21, 22])
        >>> dp1, dp3 = source_dp.unzip(sequence_length=3, columns_to_skip=[1])
        >>> dp3[2], len(dp3)
        (22, 3)
    """

    def __new__(  # type: ignore[misc]
        cls,
        source_datapipe: MapDataPipe,
        sequence_length: int,
        columns_to_skip: Sequence[int] | None = None,
    ) -> Any:
        if not isinstance(source_datapipe, MapDataPipe):
            raise TypeError(f"unzip: source_datapipe must be a MapDataPipe, got {type(source_datapipe).__name__}")
        columns = _unzip_columns(sequence_length, columns_to_skip)
        return [_MapUnZipChild(source_datapipe, col, sequence_length) for col in columns]
