"""Pipes that convert between iterable and map-style pipes: ``to_map_datapipe`` and ``to_iter_datapipe``.

torchdata 0.9's ``to_map_datapipe`` (:class:`IterToMapConverter`, called on
iterable pipes) and ``to_iter_datapipe`` (:class:`MapToIterConverter`,
called on map-style pipes) under the same class names, arguments and outputs.

Resume: ``to_iter_datapipe`` records how many indices it has looked up;
``to_map_datapipe`` whether its table was loaded.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from pipekit.pipes._callables import _check_callable
from pipekit.pipes.base import IterDataPipe, MapDataPipe, functional_datapipe
from pipekit.pipes.state import ResumableMapPipe, ResumablePipe

__all__ = ["IterToMapConverter", "MapToIterConverter"]


@functional_datapipe("to_map_datapipe", on="iter")
class IterToMapConverter(ResumableMapPipe):
    """Turn an IterDataPipe of key-value pairs into a MapDataPipe (functional name: ``to_map_datapipe``).

    The source is read on the first lookup (or ``len()`` when the source has
    none) and kept in a dict.  Items must be ``(key, value)`` pairs, or
    ``key_value_fn`` must turn them into pairs; a later duplicate key replaces
    the earlier value, with a warning.  A missing key raises ``IndexError``
    (so ``list(map_dp)`` works on integer keys ``0..n-1``).

    Resume: the snapshot only says whether the table was loaded.  Its source
    is restored to where it was (its end, once the table is loaded), so a
    restored converter first drains the source's restored remainder, then reads
    the source again from its start to rebuild the table.

    Args:
        datapipe: the source IterDataPipe.
        key_value_fn: maps an item to a ``(key, value)`` pair.

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> list(IterableWrapper([(i, i) for i in range(10)]).to_map_datapipe())
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
        >>> map_dp2 = IterableWrapper([("a", 1), ("b", 2), ("c", 1)]).to_map_datapipe()
        >>> map_dp2["a"]
        1
        >>> def row_to_tuple(row):
        ...     return row[0], row[1:]
        >>> dp3 = IterableWrapper([("a", 1, 1, 1), ("b", 2, 2, 2)]).to_map_datapipe(key_value_fn=row_to_tuple)
        >>> dp3["a"]
        (1, 1, 1)
    """

    state_keys = ("loaded",)

    def __init__(self, datapipe: IterDataPipe, key_value_fn: Callable[[Any], tuple[Any, Any]] | None = None) -> None:
        super().__init__()
        if not isinstance(datapipe, IterDataPipe):
            raise TypeError(f"to_map_datapipe: datapipe must be an IterDataPipe, got {type(datapipe).__name__}")
        if key_value_fn is not None:
            _check_callable(key_value_fn, "to_map_datapipe", "key_value_fn")
        self.source_datapipe = datapipe
        self.key_value_fn = key_value_fn
        self._map: dict[Any, Any] | None = None
        self._drain = False

    @property
    def datapipe(self) -> IterDataPipe:
        """The source pipe (torchdata's attribute name for ``source_datapipe``)."""
        return self.source_datapipe

    def state_dict(self) -> dict[str, Any]:
        return {"loaded": self._map is not None}

    def restore(self, state: dict[str, Any] | None) -> None:
        # A table loaded before the checkpoint left the source at its end: its restored iterator
        # continues there, and must be drained before the source is read again.
        self._drain = state is not None and bool(state.get("loaded"))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._map = None

    def _load_map(self) -> dict[Any, Any]:
        self._start_pass()
        if self._drain:
            for _ in self.source_datapipe:  # the restored source continues from the snapshot: skip to its end
                pass
        table: dict[Any, Any] = {}
        for i, item in enumerate(self.source_datapipe):
            pair = item if self.key_value_fn is None else self.key_value_fn(item)
            try:
                length = len(pair)
            except TypeError:
                raise TypeError(
                    f"to_map_datapipe: item {i} is not a (key, value) pair: {type(pair).__name__} {pair!r:.200}"
                ) from None
            if length != 2:
                raise ValueError(f"to_map_datapipe: item {i} has {length} elements, 2 are required: {pair!r:.200}")
            key, value = pair
            if key in table:
                warnings.warn(f"to_map_datapipe: duplicate key {key!r}; the later value wins", stacklevel=2)
            table[key] = value
        self._map = table
        return table

    def __getitem__(self, index: Any) -> Any:
        table = self._map if self._map is not None else self._load_map()
        try:
            return table[index]
        except KeyError:
            raise IndexError(f"to_map_datapipe: no key {index!r}") from None

    def __len__(self) -> int:
        if self._map is not None:
            return len(self._map)
        try:
            return len(self.source_datapipe)
        except (TypeError, NotImplementedError):  # no length (NotImplementedError: torchdata's pipes' way)
            pass
        return len(self._load_map())



@functional_datapipe("to_iter_datapipe", on="map")
class MapToIterConverter(ResumablePipe):
    """Turn a MapDataPipe into an IterDataPipe (functional name: ``to_iter_datapipe``).

    Yields ``datapipe[i]`` for each ``i`` of ``indices`` (default:
    ``range(len(datapipe))``).

    Resumable: the snapshot is the number of indices done.

    Args:
        datapipe: the source MapDataPipe.
        indices: the keys to look up, in order.

    Example:
        >>> from pipekit.pipes import SequenceWrapper
        >>> list(SequenceWrapper(range(10)).to_iter_datapipe())
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
        >>> list(SequenceWrapper({"a": 1, "b": 2, "c": 3}).to_iter_datapipe(indices=["a", "b", "c"]))
        [1, 2, 3]
    """

    state_keys = ("pos",)
    _runtime = ("_pos",)

    def __init__(self, datapipe: MapDataPipe, indices: Sequence[Any] | None = None) -> None:
        super().__init__()
        if not isinstance(datapipe, MapDataPipe):
            raise TypeError(f"to_iter_datapipe: datapipe must be a MapDataPipe, got {type(datapipe).__name__}")
        self.source_datapipe = datapipe
        self.indices = list(indices) if indices is not None else range(len(datapipe))
        self._init_runtime()

    @property
    def datapipe(self) -> MapDataPipe:
        """The source pipe (torchdata's attribute name for ``source_datapipe``)."""
        return self.source_datapipe

    def _init_runtime(self) -> None:
        self._pos = 0

    def state_dict(self) -> dict[str, Any]:
        return {"pos": self._pos}

    def restore(self, state: dict[str, Any] | None) -> None:
        self._pos = int(state["pos"]) if state is not None else 0

    def __iter__(self) -> Iterator[Any]:
        while self._pos < len(self.indices):
            index = self.indices[self._pos]
            self._pos += 1
            yield self.source_datapipe[index]

    def __len__(self) -> int:
        return len(self.indices)
