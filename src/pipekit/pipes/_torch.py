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

import functools
import random
import threading
from collections.abc import Callable, Collection, Iterator
from typing import Any

import torch
from torch.utils.data import IterDataPipe, MapDataPipe
from torch.utils.data.datapipes._decorator import functional_datapipe as torch_functional_datapipe
from torch.utils.data.datapipes._hook_iterator import (
    _generate_input_args_string,
    _set_datapipe_valid_iterator_id,
    _SnapshotState,
)
from torch.utils.data.datapipes.datapipe import DataChunk, _IterDataPipeSerializationWrapper
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
    "explain_missing_attributes",
    # torch's own pipes (re-exported by pipekit.pipes._builtin)
    "Batcher",
    "Collator",
    "Concater",
    "DataChunk",
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
    "loader_iteration",
    "pipe_graph",
    "pickle_state",
    "iterator_id",
    "hooked_iterator_target",
    "shuffler_position",
    "shuffler_snapshot",
    "shuffle_buffered",
    "restore_shuffler",
    "stop_journal",
    "ShufflerSnapshot",
    "is_child_pipe",
    "shuffle_replaying",
]

# torch's iterator hook asks every pipe, at every ``next()``, whether it is a
# child of a ``fork``/``demux`` with ``hasattr(pipe, "_is_child_datapipe")``.
# Only torch's ``_ChildDataPipe`` defines it, so for every other pipe the lookup
# misses and falls through ``IterDataPipe.__getattr__`` (the functional-name
# table) to an ``AttributeError``: about half of a short chain's per-item cost.
# A class default of ``False`` answers the same thing at once; ``_ChildDataPipe``
# keeps its own ``True``.
IterDataPipe._is_child_datapipe = False


def is_child_pipe(pipe: Any) -> bool:
    """Whether ``pipe`` is a child of a ``fork``/``demux`` (torch's ``_ChildDataPipe``): it shares its source."""
    return getattr(type(pipe), "_is_child_datapipe", False) is True


# Items pulled through pipekit.DataLoader skip torch's per-item iterator hook.
#
# torch wraps every pipe's ``__iter__`` (at class creation) in a generator that,
# for every item, resumes itself, counts the item and calls a function checking
# that no second iterator was started on the pipe since (the "single iterator
# per IterDataPipe" rule), then resumes the pipe's own generator.  That costs
# 10-20 times what the pipe's own generator does per item (0.4 µs a pipe in a
# tight loop, several times that between decodes that flush the CPU caches),
# and a pipeline pays it once per pipe for every sample.
#
# While pipekit.DataLoader pulls an item (:meth:`LoaderPipeWrapper.next_item`,
# :meth:`LoaderPipeWrapper.restart`), iterators started on the pipes of its
# pipeline are delegated to with ``yield from`` instead: numbered and reset
# when they start, as torch does, errors annotated with the pipe that raised
# them, as torch does, but not checked at every item.  Iterators started
# anywhere else (a pipe iterated directly, a thread of ``prefetch``, or
# anything while torch's profiler is on, which records each pipe's items)
# keep torch's hook unchanged.


def _torch_hook_code() -> Any:
    """The code object of torch's per-item hook (``wrap_generator``), taken from a pipe torch defines."""
    hooked = Mapper.__dict__["__iter__"]
    if getattr(hooked, "__wrapped__", None) is None or hooked.__code__.co_name != "wrap_generator":
        return None  # torch changed its hook: keep it everywhere
    return hooked.__code__


_HOOK_CODE = _torch_hook_code()


class _Scope(threading.local):
    active = False

    def __reduce__(self) -> tuple[Callable[[], _Scope], tuple[()]]:
        # dill pickles a class it cannot import (one defined in __main__) by value, with the module globals its
        # methods use: a loader's __iter__ refers to this object; each process has its own
        return _this_scope, ()


def _this_scope() -> _Scope:
    return _scope


_scope = _Scope()


def _note_pipe(exc: Exception, datapipe: Any) -> None:
    """Name the pipe that raised ``exc`` in its message, once, the way torch's hook does."""
    msg = "thrown by __iter__ of"
    if not hasattr(exc.args, "__len__"):
        return
    full = f"{msg} {type(datapipe).__name__}({_generate_input_args_string(datapipe)})"
    if len(exc.args) == 0 or not isinstance(exc.args[0], str):
        exc.args = (f"\nThis exception is {full}",)
    elif msg not in exc.args[0] and "single iterator per IterDataPipe constraint" not in exc.args[0]:
        exc.args = (exc.args[0] + f"\nThis exception is {full}", *exc.args[1:])


def _delegate(datapipe: Any, gen: Iterator[Any]) -> Iterator[Any]:
    """What torch's hook does when an iterator starts, then the pipe's own generator without a per-item hook."""
    forward = datapipe._fast_forward_iterator
    if forward:  # a restored snapshot of torch's: it hands over the restored iterator
        datapipe._fast_forward_iterator = None
        datapipe._snapshot_state = _SnapshotState.Iterating
        yield from forward
        return
    _set_datapipe_valid_iterator_id(datapipe)
    try:
        yield from gen
    except Exception as exc:
        _note_pipe(exc, datapipe)
        raise


def _loader_iter(hooked: Callable[..., Any]) -> Callable[..., Any]:
    """``__iter__`` for a class whose torch-hooked ``__iter__`` is ``hooked``: lean inside the loader."""
    own = hooked.__wrapped__  # type: ignore[attr-defined]

    @functools.wraps(own)
    def __iter__(self: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:  # noqa: N807 - a method
        if _scope.active and not torch.autograd._profiler_enabled():
            return _delegate(self, own(self, *args, **kwargs))
        return hooked(self, *args, **kwargs)

    __iter__.__pipekit_torch_hook__ = hooked  # type: ignore[attr-defined]
    return __iter__


def loader_iteration(pipes: list[Any]) -> None:
    """Let ``pipes`` skip torch's per-item hook while pipekit.DataLoader pulls items (see above).

    Changes the class that defines each pipe's ``__iter__`` (torch's own
    classes included) once; outside the loader those classes behave as before.
    """
    if _HOOK_CODE is None:
        return
    for pipe in pipes:
        for cls in type(pipe).__mro__:
            method = cls.__dict__.get("__iter__")
            if method is None:
                continue
            if getattr(method, "__code__", None) is _HOOK_CODE:
                cls.__iter__ = _loader_iter(method)
            break


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
        self._datapipe_iter = _in_loader(self._datapipe.__iter__)

    def next_item(self) -> Any:
        """The next item of the current iterator (``StopIteration`` at the end)."""
        return _in_loader(self._datapipe_iter.__next__)  # type: ignore[union-attr]


def _in_loader(call: Callable[[], Any]) -> Any:
    """``call()`` with iterators started meanwhile skipping torch's per-item hook (see :func:`loader_iteration`)."""
    if _scope.active:  # a pipeline inside a pipeline's item
        return call()
    _scope.active = True
    try:
        return call()
    finally:
        _scope.active = False


def registry(kind: str) -> dict[str, Any]:
    """torch's table of functional names for ``"iter"`` or ``"map"`` pipes (name -> factory)."""
    return IterDataPipe.functions if kind == "iter" else MapDataPipe.functions


def register_as_function(kind: str, name: str, cls: type) -> None:
    """Register ``cls`` under functional ``name`` on ``"iter"`` or ``"map"`` pipes."""
    base = IterDataPipe if kind == "iter" else MapDataPipe
    base.register_datapipe_as_function(name, cls)


# ``.list_files_by_s3()`` (torchdata's) or ``.with_epoch(10)`` (webdataset's) on a pipe: torch's
# ``IterDataPipe.__getattr__`` raises a bare "no attribute"; wrapped once (pipes/_missing.py installs it), only
# those names, where torch's lookup fails, get an error naming the pipekit way.  Nothing is registered:
# ``hasattr`` stays False; any other miss costs a set lookup and a call (~0.5 us; pipelines miss a few times).


def explain_missing_attributes(
    kind: str, names: Collection[str], explain: Callable[[Any, str], AttributeError | None]
) -> None:
    """Let ``explain(pipe, name)`` (an error, or ``None`` for torch's) replace torch's bare ``AttributeError``.

    For ``names`` on ``"iter"``/``"map"`` pipes; calling it again replaces both (torch's method is wrapped once).
    """
    base = IterDataPipe if kind == "iter" else MapDataPipe
    current = base.__dict__["__getattr__"]
    torch_getattr = getattr(current, "__pipekit_torch_getattr__", current)
    explained = frozenset(names)

    @functools.wraps(torch_getattr)
    def __getattr__(self: Any, name: str) -> Any:  # noqa: N807 - a method
        if name not in explained:
            return torch_getattr(self, name)
        try:
            return torch_getattr(self, name)
        except AttributeError:
            error = explain(self, name)
            if error is None:
                raise
        raise error  # outside the except clause: no "During handling..." chain

    __getattr__.__pipekit_torch_getattr__ = torch_getattr  # type: ignore[attr-defined]
    base.__getattr__ = __getattr__  # type: ignore[method-assign]


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


# The class torch's iterator hook wraps a non-generator ``__iter__``'s result in (one class per hooked
# ``__iter__``, all defined by this function of torch's).
_DECORATOR_QUALNAME = "hook_iterator.<locals>.IteratorDecorator"
_DECORATOR_MODULE = "torch.utils.data.datapipes._hook_iterator"


def hooked_iterator_target(obj: Any) -> Any | None:
    """The iterator that torch's hook wraps in ``obj``, when ``obj`` is that wrapper; else ``None``.

    ``iter(pipe)`` on a pipe whose ``__iter__`` returns an iterator (``self``,
    as the loader's wrapper does) gives torch's ``IteratorDecorator``, which
    forwards every other attribute (``state_dict`` included) to that iterator.
    """
    cls = type(obj)
    if cls.__qualname__ == _DECORATOR_QUALNAME and cls.__module__ == _DECORATOR_MODULE:
        return obj.__dict__.get("iterator")
    return None


def shuffler_position(pipe: Shuffler) -> dict[str, Any]:
    """The shuffle buffer and random generator state of torch's ``Shuffler``."""
    return {"buffer": list(pipe._buffer), "rng": pipe._rng.getstate()}


def restore_shuffler(pipe: Shuffler, position: dict[str, Any]) -> None:
    """Put back a :func:`shuffler_position` into torch's ``Shuffler`` (its seed is spent)."""
    pipe._buffer = list(position["buffer"])
    pipe._rng.setstate(position["rng"])
    pipe._seed = None


# Lazy positions of the shuffle buffer (:func:`shuffle_buffered`, :func:`shuffler_snapshot`).
#
# Copying a 10,000-item buffer and the 625-int state of its generator after every batch, in every
# DataLoader worker, to keep a position that is almost never sent, costs tens of microseconds a batch
# (every item's refcount is touched, with caches cold from decoding).  Instead the pipe keeps a *base*
# (a copy of its buffer and generator state taken at one snapshot) and a *journal*: the source items
# its loop consumed since.  A snapshot records the base, the journal and its length, and the buffer's
# length: O(1).  The position it stands for is rebuilt, only when a checkpoint needs it, by running
# the loop's own steps on a copy of the base (:meth:`ShufflerSnapshot.materialize`), which reads the
# base (never changed) and the journal's first items (only ever appended to), never the live buffer:
# a DataLoader worker's answering thread can do it while the pipe goes on.  The journal is bounded:
# past ``_journal_cap`` items the loop drops it, and the next snapshot takes a new base (the cost of
# the old per-batch copy, once per ``_journal_cap`` items); so is the replay of the drain phase.


def _journal_cap(buffer_size: int) -> int:
    return max(256, buffer_size // 8)


def _draw(getrandbits: Callable[[int], int], n: int) -> int:
    """``random.Random.randint(0, n - 1)``'s draw, as the shuffle loops make it."""
    k = n.bit_length()
    i = getrandbits(k)
    while i >= n:
        i = getrandbits(k)
    return i


class ShufflerSnapshot:
    """A shuffle buffer's position at one snapshot, rebuilt on demand as :func:`shuffler_position`'s dict.

    Pickles as that dict (so sending it rebuilds it); :meth:`materialize`
    returns it.  With the pull numbers of the base's items (``pulls``, and
    ``pulled`` items pulled when the base was taken), the loop's steps rebuild
    them too, and ``finish(buffer, pulls, rng_state, pulled)`` makes the state
    (the replay form of :mod:`pipekit.pipes._shuffle_replay`).
    """

    __slots__ = ("_base", "_count", "_finish", "_journal", "_live", "_pulled", "_pulls", "_rng", "_size")

    def __init__(
        self,
        base: list[Any],
        rng: tuple[Any, ...],
        journal: list[Any],
        count: int,
        live: int,
        size: int,
        pulls: list[int] | None = None,
        pulled: int = 0,
        finish: Callable[..., dict[str, Any]] | None = None,
    ) -> None:
        self._base, self._rng, self._journal = base, rng, journal
        self._count, self._live, self._size = count, live, size
        self._pulls, self._pulled, self._finish = pulls, pulled, finish

    def materialize(self) -> dict[str, Any]:
        """``{"buffer": [...], "rng": state}``: what ``shuffler_position`` returned when this was taken."""
        buffer = list(self._base)
        pulls = list(self._pulls) if self._pulls is not None else [0] * len(buffer)
        number = self._pulled
        rng = random.Random()
        rng.setstate(self._rng)
        getrandbits, size = rng.getrandbits, self._size
        for x in self._journal[: self._count]:  # the loop's steps, as shuffle_buffered takes them
            n = len(buffer)
            if n == size:
                i = _draw(getrandbits, n)
                buffer[i], pulls[i] = x, number
            else:
                buffer.append(x)
                pulls.append(number)
            number += 1
        while len(buffer) > self._live:  # the drain after the source ended
            i = _draw(getrandbits, len(buffer))
            buffer.pop(i)
            pulls.pop(i)
        if len(buffer) != self._live:
            raise RuntimeError(
                f"shuffle: rebuilding a position gave {len(buffer)} buffered items instead of {self._live}"
            )
        if self._finish is not None:
            return self._finish(buffer, pulls if self._pulls is not None else None, rng.getstate(), number)
        return {"buffer": buffer, "rng": rng.getstate()}

    def __reduce__(self) -> Any:
        return (dict, (self.materialize(),))


def shuffler_snapshot(
    pipe: Shuffler, finish: Callable[..., dict[str, Any]] | None = None
) -> ShufflerSnapshot | dict[str, Any]:
    """The shuffle buffer's position as a :class:`ShufflerSnapshot`, in O(1) while the pipe keeps a journal.

    For a pipe iterated by :func:`shuffle_buffered` or :func:`shuffle_replaying`
    (whose pull numbers, ``pipe._pulls``, the snapshot rebuilds too, for
    ``finish``); a generator that is not a ``random.Random`` gets
    :func:`shuffler_position`'s copy.
    """
    rng = pipe._rng
    if type(rng) is not random.Random:
        return shuffler_position(pipe)
    buffer, size = pipe._buffer, pipe.buffer_size
    live = len(buffer)
    journal, base = pipe._journal, pipe._journal_base
    if journal is not None and base is not None:
        count = len(journal)
        # Items the drain popped since the base: bounded as the journal is.
        if min(size, len(base[0]) + count) - live <= _journal_cap(size):
            return ShufflerSnapshot(base[0], base[1], journal, count, live, size, base[2], base[3], finish)
    pulls = getattr(pipe, "_pulls", None)
    base = (list(buffer), rng.getstate(), None if pulls is None else list(pulls), getattr(pipe, "_pulled", 0))
    pipe._journal_base = base
    pipe._journal = journal = []  # a new list: earlier snapshots keep theirs
    return ShufflerSnapshot(base[0], base[1], journal, 0, live, size, base[2], base[3], finish)


def stop_journal(pipe: Shuffler) -> None:
    """Forget the pipe's base and journal (its buffer was replaced: a new epoch or a restore)."""
    pipe._journal = None
    pipe._journal_base = None


def shuffle_buffered(self: Any) -> Iterator[Any]:
    """``__iter__`` of pipekit's ``shuffle``: torch's ``Shuffler`` loop, the same order for the same seed.

    While the pipe has a journal (``self._journal``: a lazy snapshot of a
    :class:`~pipekit.pipes._builtin.ResumableShuffler` starts one), each consumed
    item is appended to it, for :func:`shuffler_snapshot`; past the cap the
    journal is dropped, so nothing grows when nobody takes snapshots.
    """
    # torch's loop, drawing the same random positions as its ``self._rng.randint(0, n - 1)``
    # (``random.Random._randbelow``: rejection sampling on ``getrandbits(n.bit_length())``)
    # without the three Python calls randint makes per item (tests compare the orders).
    if not self._enabled:
        yield from self.datapipe
        return
    rng = self._rng
    if type(rng) is not random.Random:
        yield from _shuffle_with(self, rng.randint)
        return
    getrandbits, size = rng.getrandbits, self.buffer_size
    cap = _journal_cap(size)
    buffer = self._buffer
    for x in self.datapipe:
        journal = self._journal
        if journal is not None:
            journal.append(x)
            if len(journal) > cap:
                self._journal = None
        n = len(buffer)
        if n == size:
            k = n.bit_length()
            i = getrandbits(k)
            while i >= n:
                i = getrandbits(k)
            val, buffer[i] = buffer[i], x
            yield val
        else:
            buffer.append(x)
    while buffer:
        n = len(buffer)
        k = n.bit_length()
        i = getrandbits(k)
        while i >= n:
            i = getrandbits(k)
        yield buffer.pop(i)


def shuffle_replaying(self: Any) -> Iterator[Any]:
    """``__iter__`` of ``ResumableShuffler``: :func:`shuffle_buffered`'s loop, numbering the pulls.

    Each buffer slot's pull number is kept in ``self._pulls`` (and the count
    in ``self._pulled``) before the item is yielded; every ``log.every``
    pulls the pipe's ``_snapshot_upstream(pulled)`` snapshots the pipes above
    while they are paused at the item they just yielded
    (:mod:`pipekit.pipes._shuffle_replay`).  The same order as
    :func:`shuffle_buffered` for the same seed.
    """
    if not self._enabled:
        self._log = None
        yield from self.datapipe
        return
    rng = self._rng
    if type(rng) is not random.Random:
        self._log = None
        yield from _shuffle_with(self, rng.randint)
        return
    it = self._start_replay()  # the iterator on the pipes above; a restore refilled the buffer
    getrandbits, size = rng.getrandbits, self.buffer_size
    cap = _journal_cap(size)
    buffer, pulls, pulled = self._buffer, self._pulls, self._pulled
    log = self._log
    next_at = log.next_at if log is not None else 1 << 62
    for x in it:
        journal = self._journal
        if journal is not None:
            journal.append(x)
            if len(journal) > cap:
                self._journal = None
        n = len(buffer)
        if n == size:
            k = n.bit_length()
            i = getrandbits(k)
            while i >= n:
                i = getrandbits(k)
            val, buffer[i] = buffer[i], x
            pulls[i] = pulled
            pulled += 1
            self._pulled = pulled
            if pulled >= next_at:
                next_at = log.take(pulled)
            yield val
        else:
            buffer.append(x)
            pulls.append(pulled)
            pulled += 1
            self._pulled = pulled
            if pulled >= next_at:
                next_at = log.take(pulled)
    while buffer:
        n = len(buffer)
        k = n.bit_length()
        i = getrandbits(k)
        while i >= n:
            i = getrandbits(k)
        pulls.pop(i)
        yield buffer.pop(i)


def _shuffle_with(self: Any, randint: Any) -> Iterator[Any]:
    buffer = self._buffer
    for x in self.datapipe:
        if len(buffer) == self.buffer_size:
            i = randint(0, len(buffer) - 1)
            val, buffer[i] = buffer[i], x
            yield val
        else:
            buffer.append(x)
    while buffer:
        yield buffer.pop(randint(0, len(buffer) - 1))
