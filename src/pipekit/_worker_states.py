"""Worker checkpoints on request: how ``pipekit.DataLoader`` keeps exact resume cheap with workers.

torchdata's ``StatefulDataLoader`` has each worker send its dataset's state
with every batch (``snapshot_every_n_steps=1``), pickled, through the result
queue.  A pipeline's position includes its buffered items (a 1,000-sample
shuffle buffer holds 1,000 samples' bytes), so sending it with each batch of
64 pickles and copies ~15 batches' worth of data per batch: with 2 workers on
JPEG shards that halved the throughput.

Instead each worker keeps its last few positions *locally*, as taken (a
pipeline position is made of fresh containers, so a shuffle buffer's copy is a
list of references: microseconds), and sends with each batch only a small
token naming that position (:data:`DEFERRED` mode, plus the skip report).  When
the main process is asked for ``state_dict()``, it looks for tokens in the
states torchdata holds, asks the worker that sent each one for the full
position over a side channel (one request queue per worker, one reply queue),
and puts the answers in their place: the checkpoint is the same as before,
and the cost is paid per checkpoint instead of per batch.

A worker is never more than ``prefetch_factor`` batches ahead of the last
batch the main process took from it, so it keeps the positions of its last
``prefetch_factor + 2`` checkpointed batches.  A small thread in each worker
answers the requests, so a worker blocked waiting for work (its prefetch is
full while the main process checkpoints) still answers.

The positions a worker keeps hold references to items, not copies: a pipeline
that changes items *in place* after a buffering pipe (``x.mul_(2)`` on a
tensor that was in the shuffle buffer) changes what a checkpoint taken a batch
earlier holds, as it did before for ``num_workers=0``.  Map to new objects
after a buffer.
"""

from __future__ import annotations

import contextlib
import multiprocessing.context
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from pipekit.errors import WorkerStateError

__all__ = ["DEFERRED", "StateChannel", "WorkerStates", "resolve_deferred"]

DEFERRED = "deferred"  # the mode of a token standing for a position kept in a worker

_STOP = None  # sent on a request queue to stop a worker's answering thread


class StateChannel:
    """The queues between the main process and the workers of one multi-process iterator.

    Created by the main process before the workers start, and handed to them
    with the dataset (inherited on fork, pickled while spawning).

    Args:
        context: a ``multiprocessing`` context (the loader's).
        num_workers: how many workers the iterator starts.
        depth: how many checkpointed positions each worker keeps.
    """

    def __init__(self, context: Any, num_workers: int, depth: int) -> None:
        self.requests = [context.Queue() for _ in range(num_workers)]
        self.replies = context.Queue()
        self.depth = depth

    def __reduce__(self) -> Any:
        # Queues cross to a process only while it is being started; any other pickling of the
        # pipe (torch walks a pipeline's graph by pickling it) leaves the channel behind.
        try:
            multiprocessing.context.assert_spawning(self)
        except RuntimeError:
            return (_no_channel, ())
        return (_rebuild, (self.requests, self.replies, self.depth))

    def close(self) -> None:
        """Stop the workers' answering threads and let the queues go without waiting for their feeders."""
        for q in self.requests:
            with contextlib.suppress(ValueError, OSError):  # already closed
                q.put(_STOP)
            q.cancel_join_thread()
            q.close()
        self.replies.cancel_join_thread()
        self.replies.close()

    def fetch(
        self, wanted: dict[tuple[int, int, int], Any], alive: Callable[[int], bool], timeout: float = 60.0
    ) -> dict[tuple[int, int, int], dict[str, Any]]:
        """Ask each worker for the positions ``wanted`` names ``(worker, run, seq)``, and wait for them.

        ``alive(worker)`` tells whether a worker still runs.  Raises
        :class:`~pipekit.errors.WorkerStateError` naming the worker(s) when one
        dies before it answers, when one no longer holds the position, and
        when the answers are not all in after ``timeout`` seconds (a worker
        stopped, or frozen in code that holds the GIL: a worker busy in its
        pipe still answers, from its answering thread).
        """
        for worker, run, seq in wanted:
            self.requests[worker].put((run, seq))
        found: dict[tuple[int, int, int], dict[str, Any]] = {}
        deadline = time.monotonic() + timeout
        while len(found) < len(wanted):
            try:
                worker, run, seq, state, error = self.replies.get(timeout=min(0.5, max(timeout, 0.01)))
            except queue.Empty:
                missing = sorted(set(wanted) - set(found))
                dead = sorted({w for w, _, _ in missing if not alive(w)})
                if dead:
                    raise WorkerStateError(
                        f"pipekit.DataLoader.state_dict: {_names(dead)} exited before sending its position "
                        f"for the checkpoint (positions still missing: {missing}); a worker keeps its position "
                        f"until asked, so resume from the last checkpoint taken before it died",
                        dead,
                    ) from None
                if time.monotonic() > deadline:
                    silent = sorted({w for w, _, _ in missing})
                    raise WorkerStateError(
                        f"pipekit.DataLoader.state_dict: {_names(silent)} did not answer within "
                        f"{timeout:g} s (state_timeout) with its position for the checkpoint (positions still "
                        f"missing: {missing}, as (worker, iterator, batch)); a worker answers from a thread of "
                        f"its own, so it is stopped or frozen in code that holds the GIL; no checkpoint was "
                        f"made: resume from the last one, or raise state_timeout",
                        silent,
                    ) from None
                continue
            key = (worker, run, seq)
            if key not in wanted:  # the answer to an earlier request that gave up waiting
                continue
            if error is not None:
                raise WorkerStateError(f"pipekit.DataLoader.state_dict: worker {worker}: {error}", [worker])
            found[key] = state
        return found


def _names(workers: list[int]) -> str:
    """``worker 1`` or ``workers 0, 1``."""
    return ("worker " if len(workers) == 1 else "workers ") + ", ".join(str(w) for w in workers)


def _no_channel() -> None:
    return None


def _rebuild(requests: list[Any], replies: Any, depth: int) -> StateChannel:
    channel = StateChannel.__new__(StateChannel)
    channel.requests, channel.replies, channel.depth = requests, replies, depth
    return channel


class WorkerStates:
    """A worker's last checkpointed positions, and the thread that sends them on request.

    Args:
        channel: the :class:`StateChannel` of the iterator the worker belongs to.
        worker: this worker's id.
        materialize: turns a kept state into the plain data to send (kept states may be
            lazy: see :meth:`pipekit.pipes._resume.SnapshotPlan.snapshot`); called in the
            answering thread, so it must not read what the worker's main thread changes.
    """

    def __init__(
        self,
        channel: StateChannel,
        worker: int,
        materialize: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        self.channel = channel
        self.worker = worker
        self._materialize = materialize
        self._kept: OrderedDict[tuple[int, int], dict[str, Any]] = OrderedDict()
        self._lock = threading.Lock()
        # The reply queue's feeder must not hold the worker's exit: the main process reads every
        # answer before it lets the workers go.
        channel.replies.cancel_join_thread()
        self._thread = threading.Thread(target=self._answer, name=f"pipekit-states-{worker}", daemon=True)
        self._thread.start()

    def keep(self, run: int, seq: int, state: dict[str, Any]) -> dict[str, Any]:
        """Keep ``state`` as the position of batch ``seq`` of iterator ``run``; return its token."""
        with self._lock:
            self._kept[(run, seq)] = state
            while len(self._kept) > self.channel.depth:
                self._kept.popitem(last=False)
        return {"mode": DEFERRED, "worker": self.worker, "run": run, "seq": seq}

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the answering thread (the main process's :meth:`StateChannel.close` does it for workers)."""
        self.channel.requests[self.worker].put(_STOP)
        self._thread.join(timeout)

    def _answer(self) -> None:
        requests = self.channel.requests[self.worker]
        while True:
            try:
                request = requests.get()
            except (EOFError, OSError):  # the main process went away
                return
            if request is _STOP:
                return
            run, seq = request
            with self._lock:
                state = self._kept.get((run, seq))
                kept = list(self._kept)
            error = None
            if state is None:
                error = (
                    f"the position of batch {seq} of iterator {run} is no longer kept (kept: {kept}); "
                    f"a worker keeps its last {self.channel.depth} checkpointed positions"
                )
            elif self._materialize is not None:
                try:
                    state = self._materialize(state)
                except Exception as exc:  # an answer, not a hang of the main process
                    state, error = None, f"rebuilding the position of batch {seq} of iterator {run} failed: {exc!r}"
            self.channel.replies.put((self.worker, run, seq, state, error))


def _tokens(obj: Any, out: list[dict[str, Any]]) -> None:
    if isinstance(obj, dict):
        if obj.get("mode") == DEFERRED and "seq" in obj:
            out.append(obj)
            return
        for value in obj.values():
            _tokens(value, out)


def _replace(obj: Any, found: dict[tuple[int, int, int], dict[str, Any]]) -> Any:
    if not isinstance(obj, dict):
        return obj
    if obj.get("mode") == DEFERRED and "seq" in obj:
        state = dict(found[(obj["worker"], obj["run"], obj["seq"])])
        for key, value in obj.items():  # what travels with the token (the skip report)
            if key not in ("mode", "worker", "run", "seq"):
                state[key] = value
        return state
    return {key: _replace(value, found) for key, value in obj.items()}


def resolve_deferred(
    state: dict[str, Any], channel: StateChannel | None, alive: Callable[[int], bool], timeout: float = 60.0
) -> dict[str, Any]:
    """``state`` (a loader's ``state_dict()``) with every worker token replaced by the position it names.

    Waits at most ``timeout`` seconds for the workers' answers (see :meth:`StateChannel.fetch`).
    """
    tokens: list[dict[str, Any]] = []
    _tokens(state, tokens)
    if not tokens:
        return state
    if channel is None:
        raise RuntimeError("pipekit.DataLoader.state_dict: the workers' positions are deferred but no channel is open")
    found = channel.fetch({(t["worker"], t["run"], t["seq"]): t for t in tokens}, alive, timeout)
    return _replace(state, found)
