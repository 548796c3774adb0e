"""GDAL's network I/O on pipekit's own threads ("lanes"), and the GDAL environment each keeps entered.

GDAL keeps its HTTP connections (for /vsis3/, /vsicurl/) in thread-local storage.  A forked
DataLoader worker inherits a copy of the forking thread's storage, and so would send its
requests down the very sockets its parent (and its sibling workers) use, mixing up the
replies.  All of pipekit's GDAL network I/O therefore runs on threads of its own: threads do
not survive a fork, so every process starts with fresh connections.

- :func:`run_remote` runs a call on the idlest lane; :func:`run_parts` runs the parts of one
  read (the band files of a scene) at once, part ``k`` on lane ``k``; :func:`uses_gdal_network`
  says which files need them.
- Each lane keeps the GDAL environment of the last remote file it read entered
  (the fast path ``lane_env``, :mod:`pipekit._fast`): it sets itself as the environment policy of
  :meth:`~pipekit.geo.io.opener.RasterOpener.env` (:func:`~pipekit.geo.io.opener.set_env_policy`).
- :func:`current_lane`, :func:`lane_alive` and :func:`run_on_lane` let the handle cache
  (:mod:`pipekit.geo.io.handles`) close a lane's handles on that lane.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import rasterio
import rasterio.env

from pipekit import _fast
from pipekit._fs import is_local
from pipekit.geo.io.opener import set_env_policy

if TYPE_CHECKING:
    from pipekit.geo.io.opener import RasterOpener, _Resolved

__all__ = [
    "REMOTE_IO_THREADS",
    "current_lane",
    "lane_alive",
    "leave_lane_env",
    "on_io_thread",
    "run_on_lane",
    "run_parts",
    "run_remote",
    "uses_gdal_network",
]

T = TypeVar("T")

#: How many lanes (I/O threads) each process has.
REMOTE_IO_THREADS = 4

# -- the GDAL environment a lane keeps entered -------------------------------------------------

_lane_envs = threading.local()


def _enter_lane_env(resolved: _Resolved, make: Callable[[_Resolved], rasterio.Env]) -> None:
    """Make ``resolved``'s GDAL environment the one entered on this I/O thread (leaving another first)."""
    if getattr(_lane_envs, "key", None) == resolved.env_key and rasterio.env.hasenv():
        return
    leave_lane_env()
    env = make(resolved)
    env.__enter__()
    _lane_envs.env, _lane_envs.key = env, resolved.env_key


def leave_lane_env() -> None:
    """Leave the GDAL environment this thread keeps entered, if any (see :meth:`RasterOpener.env`)."""
    env = getattr(_lane_envs, "env", None)
    _lane_envs.env = _lane_envs.key = None
    if env is not None and rasterio.env.hasenv():  # (an outer environment that ended took it along)
        env.__exit__(None, None, None)


def _lane_env_policy(
    resolved: _Resolved, make: Callable[[_Resolved], rasterio.Env]
) -> contextlib.AbstractContextManager[Any]:
    """A lane's environment policy (:func:`~pipekit.geo.io.opener.set_env_policy`): keep it entered."""
    if _fast.enabled("lane_env"):  # keep it entered (pipekit._fast); off: entered and left around each use
        _enter_lane_env(resolved, make)
        return contextlib.nullcontext()
    return make(resolved)


# -- the lanes ---------------------------------------------------------------------------------

_lane_local = threading.local()


class _Batch:
    """The parts of one :func:`run_parts` call: their results and errors, and a latch the last lane opens.

    Each lane runs its share of the parts one after another
    (:meth:`run`); the lane that finishes last releases :attr:`done`, which
    the caller waits on.  Cheaper than a future per part: no condition
    variables, no waiter objects, one queue entry per lane.
    """

    __slots__ = ("cancelled", "done", "errors", "fn", "results", "tokens")

    def __init__(self, fn: Callable[[int], Any], count: int, groups: int) -> None:
        self.fn = fn
        self.results: list[Any] = [None] * count
        self.errors: list[BaseException | None] = [None] * count
        self.tokens = list(range(groups))  # list.pop is atomic: the lane that pops 0 is the last one
        self.done = threading.Lock()
        self.done.acquire()
        self.cancelled = False  # the caller was interrupted: parts not started yet are dropped

    def run(self, parts: list[int]) -> None:
        try:
            for k in parts:
                if self.cancelled:
                    break
                try:
                    self.results[k] = self.fn(k)
                except BaseException as exc:  # handed to the caller, which raises it in part order
                    self.errors[k] = exc
        finally:
            if self.tokens.pop() == 0:
                self.done.release()

    def wait(self) -> None:
        """Block until every lane has run its parts (parts not started are dropped if interrupted)."""
        try:
            self.done.acquire()
        except BaseException:
            self.cancelled = True
            self.done.acquire()  # parts already running write into the caller's arrays: let them finish
            raise


class _Lane(threading.Thread):
    """One GDAL network I/O thread: runs ``(batch, parts)`` jobs from its queue, in order."""

    def __init__(self, k: int) -> None:
        # daemon: an idle lane waiting on its queue must not keep the interpreter from exiting
        super().__init__(name=f"pipekit-geo-io-{k}", daemon=True)
        self.index = k
        self.jobs: queue.SimpleQueue[tuple[_Batch, list[int]] | None] = queue.SimpleQueue()
        self.running = False

    def run(self) -> None:
        _lane_local.io_lane = True
        _lane_local.io_lane_index = self.index
        set_env_policy(_lane_env_policy)
        jobs = self.jobs
        while True:
            job = jobs.get()
            if job is None:
                return
            self.running = True
            try:
                job[0].run(job[1])
            finally:
                self.running = False

    def load(self) -> int:
        """Jobs queued or running on this lane."""
        return self.jobs.qsize() + self.running


class _Lanes:
    """This process's GDAL network I/O threads: ``REMOTE_IO_THREADS`` lanes, each one thread with a job queue.

    Each lane is one thread, with its own handle cache (:func:`cached_handle`
    is per thread): part ``k`` of a read always goes to lane ``k %
    REMOTE_IO_THREADS``, so the file of a scene's ``k``-th band is opened on
    one lane only and its handle found there again on the next sample.
    """

    def __init__(self, count: int) -> None:
        self.pid = os.getpid()
        self.lanes = [_Lane(k) for k in range(count)]
        for lane in self.lanes:
            lane.start()

    def run(self, fn: Callable[[int], T], count: int, lane_of: Callable[[int], int]) -> _Batch:
        """Run ``fn(0), ..., fn(count - 1)``, ``fn(k)`` on lane ``lane_of(k)``; returns the finished batch."""
        groups: dict[int, list[int]] = {}
        for k in range(count):
            groups.setdefault(lane_of(k) % len(self.lanes), []).append(k)
        batch = _Batch(fn, count, len(groups))
        for lane, parts in groups.items():
            self.lanes[lane].jobs.put((batch, parts))
        batch.wait()
        return batch

    def idlest(self) -> int:
        """The lane with the fewest jobs queued or running (the first of them: one caller keeps to lane 0)."""
        loads = [lane.load() for lane in self.lanes]
        return loads.index(min(loads))


_remote_pool: _Lanes | None = None
_remote_lock = threading.Lock()


def _remote_lanes() -> _Lanes:
    global _remote_pool
    pid = os.getpid()
    lanes = _remote_pool
    if lanes is None or lanes.pid != pid:
        with _remote_lock:
            lanes = _remote_pool
            if lanes is None or lanes.pid != pid:
                # lanes inherited through fork have no threads: never touch them
                lanes = _remote_pool = _Lanes(REMOTE_IO_THREADS)
    return lanes


def on_io_thread() -> bool:
    """Whether the calling thread is one of pipekit's GDAL network I/O threads."""
    return getattr(_lane_local, "io_lane", False)


def current_lane() -> int | None:
    """The index of the lane the calling thread is, or ``None`` on any other thread."""
    return getattr(_lane_local, "io_lane_index", None)


def lane_alive(index: int) -> bool:
    """Whether this process has started its lanes and lane ``index`` still runs."""
    lanes = _remote_pool
    return lanes is not None and lanes.pid == os.getpid() and lanes.lanes[index].is_alive()


def run_on_lane(index: int, fn: Callable[[], Any], timeout: float) -> bool:
    """Queue ``fn()`` on this process's lane ``index`` (see :func:`lane_alive`); whether it ran within ``timeout`` s.

    Its error, if any, is dropped.
    """
    lanes = _remote_pool
    if lanes is None or lanes.pid != os.getpid():
        raise RuntimeError("this process has not started its I/O lanes")
    batch = _Batch(lambda _: fn(), 1, 1)
    lanes.lanes[index].jobs.put((batch, [0]))
    return batch.done.acquire(timeout=timeout)


def run_remote(fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(*args)`` on one of this process's GDAL network I/O threads (the idlest) and return its result."""
    if on_io_thread():
        return fn(*args)
    lanes = _remote_lanes()
    lane = lanes.idlest()
    batch = lanes.run(lambda _: fn(*args), 1, lambda _: lane)
    error = batch.errors[0]
    if error is not None:
        raise error
    return batch.results[0]


def run_parts(
    fn: Callable[[int], T], count: int, failed: Callable[[int], None] | None = None, lanes: Sequence[int] | None = None
) -> list[T]:
    """``[fn(0), ..., fn(count - 1)]``, each ``fn(k)`` on I/O thread ``k % REMOTE_IO_THREADS``, all at once.

    The parts of one read (the band files of a scene): GDAL releases the GIL
    while it waits on the network, so the requests of the parts overlap.
    Returns when every part has finished (none still writes into the
    caller's arrays).  If parts failed, ``failed(k)`` is called with the
    first of them in part order and its error raised, as a serial loop would.
    On an I/O thread already, the parts run here, one after another
    (``failed(k)`` for the one that raised).  ``lanes``: run
    ``fn(k)`` on thread ``lanes[k] % REMOTE_IO_THREADS`` instead (where
    part ``lanes[k]`` of an earlier call left its handle).  Parts that
    share a thread run on it one after another, in part order.
    """
    if on_io_thread():
        out = []
        for k in range(count):
            try:
                out.append(fn(k))
            except BaseException:
                if failed is not None:
                    failed(k)
                raise
        return out
    batch = _remote_lanes().run(fn, count, (lambda k: k) if lanes is None else lanes.__getitem__)
    for k, error in enumerate(batch.errors):
        if error is not None:
            if failed is not None:
                failed(k)
            raise error
    return batch.results


def uses_gdal_network(opener: RasterOpener, url: str) -> bool:
    """Whether ``url``'s reads wait on the network inside GDAL (so they run on the I/O threads).

    GDAL's ``/vsis3/`` and ``/vsicurl/``, and files read through the range
    cache (``cache_dir=``): its misses are fetched while GDAL waits, with
    the GIL released.
    """
    if is_local(url):
        return False
    kind = opener.resolve(url).kind
    return kind == "vsi" or (kind == "fsspec" and opener.cache is not None)
