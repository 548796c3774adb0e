"""The main process's side of a ``pipekit.DataLoader``'s workers: their reports and their deaths.

:class:`_WorkersIter` is torchdata's multi-process iterator as a pipekit
loader runs it: a worker that dies raises
:class:`~pipekit.errors.WorkerDiedError` naming the worker and the last file
it reported opening; a worker whose data ended stays, paused, until the
workers are shut down (a checkpoint may still name a position only it keeps);
only the process that started the workers shuts them down.
:func:`worker_reports` and :func:`skip_summaries` read what each worker sent
with its last batch (see :mod:`pipekit._loader._pipe`).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import time
import weakref
from typing import Any

from pipekit import _shm as shm
from pipekit._loader._pipe import REFUSED, REPORT
from pipekit._loader_seam import WorkersIterBase, worker_dataset_states, wrap_sigchld_handler
from pipekit.errors import UnsupportedItemError, WorkerDiedError

__all__ = ["skip_summaries", "worker_reports"]


def worker_reports(iterator: Any) -> dict[int, dict[str, Any]]:
    """The report (skip counts, last file) each worker of ``iterator`` sent with its latest state, by worker id."""
    states = worker_dataset_states(iterator)
    return {wid: state[REPORT] for wid, state in states.items() if isinstance(state.get(REPORT), dict)}


def skip_summaries(iterator: Any) -> list[dict[str, Any]]:
    """The skip summaries of every pipe of every worker of ``iterator``, by worker then pipe."""
    out: list[dict[str, Any]] = []
    for _, report in sorted(worker_reports(iterator).items()):
        skips = report.get("skips") or {}
        out += [skips[i] for i in sorted(skips)]
    return out


class _WorkersIter(WorkersIterBase):
    """torchdata's multi-process iterator, naming the worker (and its last file) when one dies."""

    # Bound here: an iterator collected at interpreter exit may find the module's globals cleared.
    _getpid = staticmethod(os.getpid)
    _is_finalizing = staticmethod(sys.is_finalizing)
    _forget_workers = staticmethod(shm.forget_workers)

    def mark_worker_unavailable(self, worker_id: int, shutdown: bool = False) -> None:
        # torch tells a worker whose data ended to exit as soon as its StopIteration arrives, which
        # can be ahead of that worker's last batches (still held here, in order, behind another
        # worker's). A checkpoint after one of those names a position only that worker keeps
        # (pipekit._worker_states): so it stays, paused as persistent workers are, and is told to
        # exit when the workers are shut down.
        if shutdown or self.persistent():
            super().mark_worker_unavailable(worker_id, shutdown)
            return
        self.stop_sending_work(worker_id)
        self.__dict__.setdefault("_pipekit_paused", set()).add(worker_id)

    #: How long the workers of an abandoned iterator get, together, to exit before they are terminated.
    ABANDONED_GRACE = 1.0

    def __del__(self) -> None:
        # The last reference is gone mid-epoch (a garbage collection, wherever it runs): torch would join each
        # busy worker for 5 s inside that unrelated code. Nothing will read these workers' batches.
        self.__dict__["_pipekit_abandoned"] = True
        super().__del__()

    def _stop_abandoned_workers(self) -> None:
        if self._is_finalizing():  # interpreter exit: torch's shutdown does nothing then, nor do we
            return
        workers = [w for w in self.processes() if w.is_alive()]
        if not workers:  # none started, or shut down already
            return
        self.workers_done()
        for worker_id in range(len(self.processes())):
            with contextlib.suppress(Exception):  # a queue already closed: the worker is gone
                self.tell_worker_to_exit(worker_id)
        deadline = time.monotonic() + self.ABANDONED_GRACE
        for w in workers:
            w.join(timeout=max(0.0, deadline - time.monotonic()))
        for w in workers:
            if w.is_alive():
                w.terminate()

    def shutdown_workers(self) -> None:
        # An iterator left to the garbage collector (e.g. held by a caught WorkerDiedError's
        # traceback) can be collected inside the next loader's forked workers: there its
        # workers are not children, and torch's shutdown fails ("can only test a child process")
        # or signals the owner's queues. Only the process that started the workers shuts them down.
        if getattr(self, "_pipekit_owner_pid", self._getpid()) != self._getpid():
            return
        for worker_id in self.__dict__.pop("_pipekit_paused", ()):  # done: they exit with the rest
            with contextlib.suppress(Exception):  # a queue already closed: the worker is gone
                self.tell_worker_to_exit(worker_id)
        if self.__dict__.get("_pipekit_abandoned"):
            self._stop_abandoned_workers()
        workers = self.processes()
        super().shutdown_workers()
        # Their pool buffers stay mapped here until forgotten (batches still held keep theirs);
        # at interpreter exit there is nothing to forget.
        if workers and not self._is_finalizing():
            self._forget_workers(w.pid for w in workers if w.pid is not None and w.exitcode is not None)

    def state_dict(self) -> dict[str, Any]:
        # A worker whose pipeline holds what a checkpoint cannot (an open file in a shuffle buffer)
        # says so with each batch: refuse here, typed and at once, instead of asking it for a
        # position it cannot send.
        for wid, state in sorted(worker_dataset_states(self).items()):
            if isinstance(state.get(REFUSED), str):
                raise UnsupportedItemError(f"{state[REFUSED]} (DataLoader worker {wid})")
        return super().state_dict()

    def get_data(self) -> Any:
        if "_pipekit_watched" not in self.__dict__:  # once: a death while the main process is elsewhere is named too
            self._pipekit_watched = True
            _RUNNING.add(self)
            wrap_sigchld_handler(_typed_death)
        try:
            return super().get_data()
        except WorkerDiedError:  # named already (the SIGCHLD handler, see _typed_death)
            raise
        except RuntimeError as exc:
            died = self._describe_death(exc)
            if died is None:
                raise
            raise died from exc
        except (OSError, EOFError) as exc:
            # A worker killed while this process rebuilds a batch it sent (its tensors' file
            # descriptors come over the worker's socket) surfaces as a connection error before
            # torch has reaped the worker. Give the death a moment to show, then name it.
            try:
                dead = self._dead_workers(wait=_DEATH_GRACE_S)
            except WorkerDiedError as named:  # the SIGCHLD handler, wrapped (see _typed_death)
                died = named
            except RuntimeError as signalled:  # torch's SIGCHLD handler: "DataLoader worker (pid N) is killed by ..."
                died = self._describe_death(signalled)
            else:
                if not dead:
                    raise
                pids = ", ".join(str(w.pid) for w in dead)
                message = f"DataLoader worker (pid(s) {pids}) exited unexpectedly while sending a batch ({exc!r})"
                died = self._describe_death(RuntimeError(message))
            if died is None:
                raise
            raise died from exc

    def _dead_workers(self, wait: float) -> list[Any]:
        workers = self.processes()
        deadline = time.monotonic() + wait
        while True:
            dead = [w for w in workers if not w.is_alive()]
            if dead or time.monotonic() >= deadline:
                return dead
            time.sleep(0.05)

    def _describe_death(self, exc: RuntimeError) -> WorkerDiedError | None:
        message = str(exc)
        if isinstance(exc, WorkerDiedError) or not message.startswith("DataLoader worker (pid"):
            return None
        found = re.search(r"\(pid(?:\(s\))? ([\d, ]+)\)", message)  # "(pid(s) 12, 13)" or "(pid 12)"
        pids = {int(p) for p in re.findall(r"\d+", found.group(1))} if found else set()
        dead = [(wid, w) for wid, w in enumerate(self.processes()) if w.pid in pids]
        if not dead:
            return WorkerDiedError(f"{message} (pipekit cannot tell which worker)")
        reports = worker_reports(self)
        parts = []
        fields: dict[str, Any] = {}
        for wid, proc in dead:
            code = proc.exitcode
            sig = signal.Signals(-code).name if isinstance(code, int) and -code in _SIGNALS else None
            how = f"killed by {sig}" if sig else (f"exit code {code}" if code is not None else "still exiting")
            last = (reports.get(wid) or {}).get("last")
            text = f"worker {wid} (pid {proc.pid}) {how}"
            if last:
                text += f"; with its last batch received it reported reading {last[0]!r} in {last[1]}"
            else:
                text += "; it had reported no file opened yet"
            parts.append(text)
            if not fields:
                fields = {
                    "worker_id": wid,
                    "pid": proc.pid,
                    "signal": sig,
                    "url": last[0] if last else None,
                    "stage": last[1] if last else None,
                }
        return WorkerDiedError(f"{message}: {'; '.join(parts)}", **fields)


# The iterators that have taken a batch from their workers: who owns a pid torch's SIGCHLD handler names.
_RUNNING: weakref.WeakSet[_WorkersIter] = weakref.WeakSet()


def _typed_death(exc: RuntimeError) -> WorkerDiedError | None:
    """torch's error for a dead worker, raised by its SIGCHLD handler, as the error of the iterator that owns it.

    The handler raises wherever the main thread is (often the user's training
    step, not the loader); ``None`` when no pipekit iterator owns the pid named.
    """
    if isinstance(exc, WorkerDiedError):
        return None
    found = re.search(r"\(pid(?:\(s\))? ([\d, ]+)\)", str(exc))
    pids = {int(p) for p in re.findall(r"\d+", found.group(1))} if found else set()
    for iterator in list(_RUNNING):
        if any(w.pid in pids for w in iterator.processes()):
            return iterator._describe_death(exc)
    return None


_SIGNALS = frozenset(int(s) for s in signal.Signals)
# How long a connection error from the data queue waits for a worker's death to show.
_DEATH_GRACE_S = 2.0
