"""The resume and seeding protocol of pipekit's pipes, and the bases that implement it.

:class:`pipekit.DataLoader` checkpoints a pipeline by asking each of its pipes
for its *own* position right after the pipeline's last pipe yielded an item
(at that moment every pipe is paused at a ``yield``), and restores a copy of
the pipeline by giving each pipe its position back.  Nothing is replayed, and
nothing already consumed is read or decoded again.

The contract
------------
Every pipe in a checkpointed pipeline is one of:

**Stateless**: holds nothing between two yields (one-to-one maps, filters,
decoders, ``batch``).  Declare it with the class attribute ``stateless = True``
(or :func:`pipekit.pipes._resume.register_stateless` for a class you do not own).

**Resumable**: has ``state_dict()`` and ``load_state_dict(state)``:

* ``state_dict()`` returns a small dict of plain picklable values (ints,
  strings, tuples, lists, dicts, tensors): the pipe's own position (counters,
  the input it is expanding, buffered items, random generator state), never
  its upstream's (every pipe reports its own), never open handles, never
  secrets (credentials stay in the pipe's arguments, which the user rebuilds).
  A DataLoader worker takes its pipeline's position once per batch and keeps
  the last few itself (it sends them to the main process only when
  ``state_dict()`` makes a checkpoint, see :mod:`pipekit._worker_states`), so
  return *new* containers (``list(self._buffer)``, not ``self._buffer``): a
  position must not change when the pipe moves on.  Buffered items are kept
  by reference; still prefer positions to data where the data can be found
  again, since a checkpoint carries it.
* The position must be up to date *at each* ``yield``: a checkpoint is taken
  while every pipe is paused at its ``yield``, so count an item before
  yielding it, not after.
* ``load_state_dict(state)`` is called on a freshly built copy of the same
  pipeline before it is iterated.  The *next* iterator on the pipe resumes
  from that position; the one after it starts a new epoch as usual.  Until
  that iterator starts, ``state_dict()`` returns the pending state.  A state
  belongs to the epoch it resumes: :class:`pipekit.DataLoader` drops one a
  pipe still holds when the next epoch starts (a pipe the resumed epoch never
  pulled from, upstream of a ``header`` at its limit, say).
* A pipe that keeps something from an epoch that ran to its end for the next
  one (``in_memory_cache``: its frozen cache) sets ``keeps_across_epochs =
  True`` and writes ``carry_over(state)``: given its position at the end of
  an epoch (a state dropped as above, or the one an end-of-epoch checkpoint
  carries), it keeps what the next epoch starts from.  Its ``state_dict()``
  must hold that much at the end of an epoch: an end-of-epoch checkpoint of
  :class:`pipekit.DataLoader` holds no positions, only these pipes' states
  (per worker, with persistent workers).

:class:`ResumablePipe` implements all of that: a subclass writes
``state_dict()`` (its own fields) and ``restore(state)`` (set its fields from
a state, or to the start of an epoch when ``state`` is ``None``).  The base
keeps a loaded state pending and hands it to ``restore`` when the next
iterator starts (torch calls ``reset()`` lazily, at an iterator's first
``next()``).  Fields named in ``_runtime`` are left out of pickles (a pipe is
pickled into each DataLoader worker) and rebuilt by ``_init_runtime()``.

**Expanders** (one input, many outputs: archives, ``flatmap``, ``readlines``)
record the input they are in and how many of its outputs they yielded, and
after a restore *continue that input* before pulling the next one from
upstream: :class:`ExpandingPipe` does it by calling its function on the
stored input again and skipping what was yielded; archive and line readers
store the input's URL and re-open it.

**Re-opening by URL**: a pipe yielding ``(url, stream)`` pairs may offer
``reopen(url) -> stream``, which opens ``url`` again with the same arguments
(credentials, storage options) it used the first time.  Expanders resuming in
the middle of a file find it with :func:`find_reopen` and fall back to
``fsspec.open(url)``, so a checkpoint holds a URL, never credentials.

**Files read again**: a resume reads files again where the pipeline is
resumed by replaying its items (a pipe neither stateless nor resumable) or
holds a pipe that reads its source again within an epoch (``cycle``, ``ResampledShardList``: their
class sets ``rereads = True``).  There :class:`pipekit.DataLoader` gives the
pipes that open files (their class sets ``stamps_files = True``:
``open_files_by_fsspec``, ``read_from_http``, the archive loaders) a log in ``_stamp_log``, to
which they hand each file they open (``_stamp_log.opened(url, stream,
stage)``, when it is not ``None``); a checkpoint holds the files' stamps and
the resumed run refuses one read again that changed since, naming it
(:mod:`pipekit.pipes._stamps`).

**Threads**: pipes that run background threads (``prefetch``,
``threadpool_map``) also provide ``pause()``, a context manager that parks
their threads at a safe point while the whole pipeline's positions are read;
their ``state_dict()`` includes the items in flight.

**Seeds**: random pipes follow torch's ``Shuffler``.  ``set_seed(seed)`` (torch's
DataLoader calls it on every pipe that has it, with a seed shared by all
workers and ranks) keeps the seed pending in ``self._seed`` until the pipe's
next iterator starts; that epoch's generator is seeded from it, or, when no
seed is pending, from a seed drawn from torch's global generator
(:func:`draw_seed`), so ``torch.manual_seed`` makes runs reproducible and
every epoch differs.  Checkpoints read ``_seed`` to seed pipes that had not
started yet.  :class:`SeededPipe` implements it with one kind of generator, a
:class:`random.Random` (``self.rng``) seeded from the epoch seed, whose state
is saved in the pipe's checkpoint; :class:`PermutationSource` is a source whose
whole epoch follows from the epoch seed, so its checkpoint is two numbers.

A worked example
----------------
``header`` (:class:`pipekit.pipes._flow.Header`) needs a counter; its whole
resume support is ``state_dict`` and ``restore``::

    class Header(ResumablePipe):
        state_keys = ("count",)  # load_state_dict refuses a state without them

        def __init__(self, source_datapipe, limit=10):
            self.source_datapipe, self.limit, self._count = source_datapipe, limit, 0

        def state_dict(self):
            return {"count": self._count}

        def restore(self, state):  # state is None at the start of an epoch
            self._count = 0 if state is None else state["count"]

        def __iter__(self):
            for item in self.source_datapipe:
                if self._count >= self.limit:
                    return
                self._count += 1
                yield item

:func:`pipekit.testing.assert_resumes` checks that a checkpoint taken after
any number of items, restored into a fresh copy, gives exactly the rest
(define pipes at module level: checkpoints walk the pipeline by pickling it):

>>> from pipekit.pipes import IterableWrapper
>>> from pipekit.testing import assert_resumes
>>> for n in range(5):
...     assert_resumes(lambda: IterableWrapper(range(10)).header(4), n)
"""

from __future__ import annotations

import functools
import itertools
import numbers
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

import numpy as np

from pipekit._seeds import draw_seed, pipe_stream_seed
from pipekit.pipes._torch import Filter, IterDataPipe, MapDataPipe, ShardingFilter, Shuffler, pickle_state

__all__ = [
    "ExpandingPipe",
    "PendingState",
    "PermutationSource",
    "ResumableMapPipe",
    "ResumablePipe",
    "RuntimeFields",
    "SeededPipe",
    "ShufflingPipe",
    "check_seed",
    "draw_seed",
    "find_reopen",
]

SEED_MASK = (1 << 64) - 1  # epoch seeds of permutations are non-negative 64-bit numbers

P = TypeVar("P")


def check_seed(seed: Any, owner: str) -> int:
    """``seed`` as an int, or a ``TypeError`` naming ``owner`` (bools are refused)."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"{owner}: seed must be an int, got {type(seed).__name__}: {seed!r:.50}")
    return int(seed)


# Pipes that pass (url, stream) items through unchanged: an expander looks past them for reopen().
_PASS_THROUGH: tuple[type, ...] = (Filter, Shuffler, ShardingFilter)


def find_reopen(pipe: Any) -> Callable[[str], Any] | None:
    """The ``reopen(url)`` method of the nearest pipe upstream of an expander, if any.

    Looks at ``pipe`` and, past pipes that pass items through unchanged
    (``filter``, ``shuffle``, ``sharding_filter``), at the pipes above it.
    """
    seen = 0
    while pipe is not None and seen < 32:
        reopen = getattr(pipe, "reopen", None)
        if callable(reopen):
            return reopen
        if not isinstance(pipe, _PASS_THROUGH):
            return None
        upstream = getattr(pipe, "source_datapipe", None)
        pipe = upstream if upstream is not None else getattr(pipe, "datapipe", None)
        seen += 1
    return None


class RuntimeFields(IterDataPipe):
    """An iterable pipe that leaves the fields named in ``_runtime`` out of pickles and rebuilds them after.

    A pipe is pickled into every DataLoader worker; buffers, open files,
    threads and generators made during iteration must not travel with it.
    Name them in the class attribute ``_runtime`` and (re)create them in
    ``_init_runtime()``, which runs after unpickling (call it from
    ``__init__`` too).  Pickled states go through torch's pickling hook, as
    torch's own pipes' do.
    """

    _runtime: ClassVar[tuple[str, ...]] = ()

    def _init_runtime(self) -> None:
        """Create the fields named in ``_runtime`` (called after unpickling)."""

    def __getstate__(self) -> Any:
        runtime = type(self)._runtime
        state = {k: v for k, v in self.__dict__.items() if k not in runtime}
        return pickle_state(state)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()


def _reporting_pending(fn: Callable[[Any], dict[str, Any]]) -> Callable[[Any], dict[str, Any]]:
    """Wrap a subclass's ``state_dict``: a pending restore wins, and the base's fields are added."""

    @functools.wraps(fn)
    def state_dict(self: Any) -> dict[str, Any]:
        if self._pending is not None:
            return dict(self._pending)
        state = self._base_state()
        state.update(fn(self))
        return state

    state_dict._pipekit_state = True  # type: ignore[attr-defined]
    return state_dict


class PendingState:
    """The handling of a loaded state that resumable pipes share (no DataPipe base of its own).

    Used through :class:`ResumablePipe` (iterable pipes) and
    :class:`ResumableMapPipe` (map-style pipes): ``load_state_dict`` checks a
    state and keeps it pending, ``state_dict()`` returns it while it is
    pending (and the pipe's own ``state_dict`` otherwise), and
    :meth:`_start_pass` hands it to ``restore`` when the next pass begins.
    """

    __slots__ = ()
    state_keys: ClassVar[tuple[str, ...]] = ()
    #: The pipe keeps something from an epoch that ran to its end for the next (see :meth:`carry_over`).
    keeps_across_epochs: ClassVar[bool] = False
    _pending: dict[str, Any] | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("state_dict")
        if own is not None and not getattr(own, "_pipekit_state", False):
            cls.state_dict = _reporting_pending(own)  # type: ignore[method-assign]

    # -- to implement ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """This pipe's own position (see the module docstring)."""
        raise NotImplementedError(f"{type(self).__name__} must implement state_dict()")

    def restore(self, state: dict[str, Any] | None) -> None:
        """Set this pipe's fields from ``state`` (``None``: the start of an epoch)."""
        raise NotImplementedError(f"{type(self).__name__} must implement restore(state)")

    def check_state(self, state: dict[str, Any]) -> None:
        """Raise ``ValueError`` if ``state`` is not a state of this pipe (keys are checked already)."""

    def carry_over(self, state: dict[str, Any]) -> None:
        """Keep what the next epoch starts from, from ``state`` (a position no iterator continued).

        Called, on a pipe with ``keeps_across_epochs``, with a loaded state that
        is dropped because its epoch ended without pulling from this pipe, and
        with the state an end-of-epoch checkpoint carries.  Keep nothing when
        ``state`` is not at (or past) the point where an epoch hands something
        on (``in_memory_cache``: its cache is frozen).
        """

    # -- provided ----------------------------------------------------------------------------------
    def _pipe_name(self) -> str:
        return getattr(self, "functional_name", None) or type(self).__name__

    def _base_state(self) -> dict[str, Any]:
        return {}

    def _restore_base(self, state: dict[str, Any] | None) -> None:
        pass

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state`` (from :meth:`state_dict`) when the next pass starts."""
        if not isinstance(state, Mapping):
            raise TypeError(
                f"{self._pipe_name()}.load_state_dict expects a dict from state_dict(), got {type(state).__name__}"
            )
        state = dict(state)
        missing = [key for key in self.state_keys if key not in state]
        if missing:
            raise ValueError(f"not a {type(self).__name__} state (missing {', '.join(missing)}): {state!r:.200}")
        self.check_state(state)
        self._pending = state

    def _start_pass(self) -> None:
        """A pass begins: hand the pending state (``None``: none, a new epoch) to ``restore``."""
        state, self._pending = self._pending, None
        self._restore_base(state)
        self.restore(state)


class ResumablePipe(RuntimeFields, PendingState):
    """Base of iterable pipes that checkpoint their own position (see the module docstring).

    A subclass implements:

    * ``state_dict() -> dict``: its own position (called between two items);
    * ``restore(state: dict | None)``: set its fields from ``state``, or to the
      start of an epoch when ``state`` is ``None``.  Called once at the start
      of each iterator (from ``reset()``); expanders remember there the input
      they must continue before pulling the next one.

    and optionally ``state_keys`` (keys ``load_state_dict`` requires) or
    ``check_state(state)`` (raise ``ValueError`` for a state of another pipe).
    The base handles the rest: a loaded state stays pending until the next
    iterator starts, ``state_dict()`` returns it while it is pending, and
    ``reset()`` is written once, here.  Do not override ``reset()``.
    """

    def reset(self) -> None:
        self._start_pass()


class ResumableMapPipe(PendingState, MapDataPipe):
    """Base of map-style pipes that checkpoint their own position.

    As :class:`ResumablePipe`, for a ``MapDataPipe``: torch starts no
    iterator on a map-style pipe (so never calls its ``reset()``); call
    ``self._start_pass()`` where the pipe begins a pass over its source (its
    first lookup, say).
    """


class SeededPipe(ResumablePipe):
    """Base of random pipes: torch-``Shuffler``-style seeding and one generator (see the module docstring).

    ``set_seed(seed)`` keeps ``seed`` pending in ``self._seed``; when the next
    iterator starts, the pipe's *epoch seed* (``self.epoch_seed``) becomes
    :meth:`derive_epoch_seed` of it (by default the seed itself, or a draw
    from torch's global generator when none is pending) and ``self.rng``, a
    :class:`random.Random`, restarts from it.  Checkpoints hold the epoch seed
    and, once the pipe has drawn from ``self.rng``, the generator's state:
    subclasses add only their own fields.

    Shared or per-worker seeds: by default every DataLoader worker and rank
    gets the same epoch seed (torch's DataLoader hands all of them the same
    seed), which is what a pipe that decides *which items exist or in what
    order* needs when it sits before ``sharding_filter`` (shuffles, random
    splits and filters): all workers make the same decisions and the sharding
    splits one sequence.  A pipe that makes random decisions per item *after*
    ``sharding_filter`` (augmentation, per-item sampling) sets the class
    attribute ``seed_per_worker = True``: the worker id and rank are mixed into
    its epoch seed, so workers do not repeat each other's draws on different
    items.  Never set it on a pipe whose number of outputs depends on its
    draws and that may sit before ``sharding_filter``.
    """

    seed_per_worker: ClassVar[bool] = False
    _seed: int | None = None
    epoch_seed: int | None = None
    _rng: random.Random | None = None

    def set_seed(self: P, seed: int) -> P:
        """Seed the next epoch (later epochs draw a seed from torch again unless seeded too)."""
        self._seed = check_seed(seed, type(self).__name__)  # type: ignore[attr-defined]
        return self

    def derive_epoch_seed(self, seed: int | None) -> int | None:
        """The epoch seed for a pending ``seed`` (``None``: none pending).  Override to change it.

        The pending seed, or a draw from torch's global generator; with
        ``seed_per_worker``, mixed with the DataLoader worker id and rank.
        """
        epoch_seed = seed if seed is not None else draw_seed()
        if self.seed_per_worker:
            epoch_seed = pipe_stream_seed(epoch_seed)
        return epoch_seed

    @property
    def rng(self) -> random.Random:
        """The epoch's generator, seeded from the epoch seed on first use."""
        if self._rng is None:
            self._rng = random.Random(self.epoch_seed)
        return self._rng

    def _base_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"seed": self.epoch_seed}
        if self._rng is not None:
            state["rng"] = self._rng.getstate()
        return state

    def _restore_base(self, state: dict[str, Any] | None) -> None:
        if state is None:
            self.epoch_seed = self.derive_epoch_seed(self._seed)
            self._rng = None
        else:
            self.epoch_seed = state.get("seed")
            self._rng = None
            if state.get("rng") is not None:
                self._rng = random.Random()
                self._rng.setstate(_rng_state(state["rng"]))
        self._seed = None

    def state_dict(self) -> dict[str, Any]:
        """Nothing beyond the epoch seed and generator (override to add fields)."""
        return {}

    def restore(self, state: dict[str, Any] | None) -> None:
        """Nothing to restore beyond the epoch seed and generator (override to add fields)."""


class ShufflingPipe(SeededPipe):
    """A :class:`SeededPipe` that shuffles, and that torch's DataLoader can switch off, as torch's ``Shuffler``.

    ``set_shuffle(False)`` (torch's DataLoader calls ``set_shuffle`` with its
    ``shuffle`` argument, when given) keeps the order from the next epoch on:
    no epoch seed is derived, nothing is drawn from torch's generator, and a
    pending ``set_seed`` waits for the next shuffled epoch.  Subclasses read
    :attr:`shuffled` to decide whether to shuffle.
    """

    _enabled: bool = True

    def set_shuffle(self: P, shuffle: bool = True) -> P:
        """Shuffle (``True``) or keep the order (``False``) from the next epoch."""
        self._enabled = bool(shuffle)  # type: ignore[attr-defined]
        return self

    @property
    def shuffled(self) -> bool:
        """Whether this epoch (or the next, before it starts) is shuffled."""
        return self._enabled

    def derive_epoch_seed(self, seed: int | None) -> int | None:
        return super().derive_epoch_seed(seed) if self.shuffled else None

    def _restore_base(self, state: dict[str, Any] | None) -> None:
        pending = self._seed
        super()._restore_base(state)
        if state is None and not self.shuffled:
            self._seed = pending  # as torch's Shuffler: the seed waits for the next shuffled epoch


def _rng_state(state: Any) -> tuple[Any, ...]:
    # random.Random.setstate needs tuples; a checkpoint written as JSON or by torch.save may hold lists.
    version, internal, gauss = state
    return (version, tuple(internal), gauss)


class PermutationSource(ShufflingPipe):
    """A source whose epoch follows from its epoch seed: a seeded order, checkpointed as two numbers.

    Yields the items of ``items`` (a sequence) in a permutation drawn from
    the epoch seed (numpy's generator, fast for millions of items), or in
    their order when shuffling is off.  Its checkpoint is
    ``{"seed": epoch seed, "yielded": count}``, however long the epoch, and a
    restored copy regenerates the order and skips what was yielded without
    touching the items.  Subclasses with another way of generating an epoch
    from a seed override :meth:`epoch_items`, and :meth:`draw_epoch_seed` for
    another source of seeds than torch's global generator.

    Args:
        items: the items, in their unshuffled order.
        shuffle: shuffle each epoch (``set_shuffle`` changes it; torch's
            DataLoader calls it with its ``shuffle`` argument).

    Example:
        >>> from pipekit.pipes.state import PermutationSource
        >>> list(PermutationSource(["a", "b", "c", "d"], shuffle=False))
        ['a', 'b', 'c', 'd']
        >>> pipe = PermutationSource(list(range(6)))
        >>> first = list(pipe.set_seed(0))
        >>> sorted(first), first == list(pipe.set_seed(0))
        ([0, 1, 2, 3, 4, 5], True)
    """

    state_keys = ("seed", "yielded")

    def __init__(self, items: Sequence[Any] = (), shuffle: bool = True) -> None:
        if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
            raise TypeError(f"{type(self).__name__}: items must be a list, got {type(items).__name__}")
        self.items = list(items)
        self._enabled = bool(shuffle)
        self._start = 0
        self._yielded = 0

    def draw_epoch_seed(self) -> int:
        """An epoch seed when no seed was set (default: :func:`draw_seed`)."""
        return draw_seed()

    def derive_epoch_seed(self, seed: int | None) -> int | None:
        if not self.shuffled:
            return None
        return (seed if seed is not None else self.draw_epoch_seed()) & SEED_MASK

    def epoch_items(self, epoch_seed: int | None, start: int) -> Iterator[Any]:
        """The epoch's items from position ``start`` on (``epoch_seed`` ``None``: unshuffled)."""
        if epoch_seed is None:
            return itertools.islice(self.items, start, None)
        order = np.random.default_rng([epoch_seed]).permutation(len(self.items))
        return (self.items[int(i)] for i in order[start:])

    def state_dict(self) -> dict[str, Any]:
        return {"yielded": self._yielded}

    def restore(self, state: dict[str, Any] | None) -> None:
        self._start = 0 if state is None else int(state["yielded"])
        self._yielded = self._start

    def __iter__(self) -> Iterator[Any]:
        for item in self.epoch_items(self.epoch_seed, self._start):
            self._yielded += 1
            yield item

    def __len__(self) -> int:
        return len(self.items)


class ExpandingPipe(ResumablePipe):
    """Base of pipes that expand each input into several outputs, resumable mid-input.

    A subclass implements ``_outputs(item) -> Iterable`` (deterministic: it is
    called again on the same input after a restore) and iterates with
    :meth:`_expand_all`.  The checkpoint holds the input being expanded (it
    must be picklable) and how many of its outputs were yielded; a restored
    copy calls ``_outputs`` on that input again, skips those outputs, then
    goes on with the next inputs.
    """

    _runtime = ("_item", "_done", "_active")

    def _init_runtime(self) -> None:
        self._item: Any = None
        self._done = 0
        self._active = False
        self._resume_item: tuple[Any, int] | None = None

    def _outputs(self, item: Any) -> Iterable[Any]:
        raise NotImplementedError(f"{type(self).__name__} must implement _outputs(item)")

    def _iter_outputs(self, item: Any) -> Iterator[Any]:
        outputs = self._outputs(item)
        try:
            return iter(outputs)
        except TypeError:
            raise TypeError(
                f"{self._pipe_name()}: fn must return an iterable, got {type(outputs).__name__} for item {item!r:.200}"
            ) from None

    def _expand(self, item: Any, skip: int = 0) -> Iterator[Any]:
        """Yield the outputs of ``item`` after the first ``skip``, keeping count for checkpoints."""
        outputs = self._iter_outputs(item)
        if skip:
            for _ in itertools.islice(outputs, skip):
                pass
        self._item, self._done, self._active = item, skip, True
        for out in outputs:
            self._done += 1
            yield out
        self._item, self._done, self._active = None, 0, False

    def _expand_all(self, inputs: Iterable[Any]) -> Iterator[Any]:
        """Continue the restored input (if any), then expand each of ``inputs``."""
        resume, self._resume_item = getattr(self, "_resume_item", None), None
        if resume is not None:
            yield from self._expand(resume[0], resume[1])
        for item in inputs:
            yield from self._expand(item)

    def state_dict(self) -> dict[str, Any]:
        if not self._active:
            return {"active": False}
        return {"active": True, "item": self._item, "done": self._done}

    def restore(self, state: dict[str, Any] | None) -> None:
        self._init_runtime()
        if state is not None and state.get("active"):
            self._resume_item = (state["item"], int(state["done"]))
