"""A shuffle buffer's checkpoint as positions plus a bounded re-read, instead of the buffered items.

A shuffle buffer of ``buffer_size`` encoded images put into every checkpoint
(torchdata's idiom: ``load_from_tar().webdataset().shuffle(n).decode()``) made
checkpoints of hundreds of MB, seconds to take and several copies of the buffer
in memory while they were made.  Most of those items can be read again.

So :class:`~pipekit.pipes._builtin.ResumableShuffler` numbers the items it
pulls from upstream (its *pulls*) and, every ``every`` pulls, keeps a snapshot
of the sub-pipeline above it (:class:`~pipekit.pipes._resume.SnapshotPlan`,
taken right after upstream yielded: every pipe above is paused at a yield, a
consistent point), dropping the snapshots older than a *window* of pulls.  Its
checkpoint holds the oldest snapshot kept (pull ``from``), the pull count
(``to``), for each buffer slot the pull number of its item, and the random
generator's state; not the items.  On resume it restores upstream to that
snapshot and reads forward from pull ``from`` to ``to``, keeping only the
buffered pull numbers in their slots (nothing is decoded: the shuffle comes
before ``decode``), then goes on as the uninterrupted run does.

Bounded: an item still buffered after more than ``window`` pulls (rare: with
the default window of 4 buffers, about e^-4, 2%, of a full buffer) is older
than every snapshot kept, so it is kept inline in the checkpoint (as before:
its bytes), and the re-read is at most ``window + every`` items.  When the
pipes above cannot be snapshotted alone (a ``fork``/``demux`` child or a split
shares them with another branch, a pipe runs threads or says it cannot be
replayed with a class attribute ``replayable = False``, or a snapshot fails) the
checkpoint holds the whole buffer inline, as it always did.  Files changed
between checkpoint and resume are still refused: the restored snapshot holds
the listing digest and archive stamps the pipes above check, and the record
holds the stamp of every archive the snapshots kept saw being read
(``"stamps"``: ``{url: "size:version"}``), which the re-read compares at each
of its own snapshots, so an archive read through inside the window (its
members still buffered) and replaced since is refused naming it
(:class:`~pipekit.errors.ArchiveError`), never re-read into the old
positions.  An archive read from start to end between two snapshots (fewer
samples than ``every`` pulls: ``window // 32``) is not seen by them.

The state is ``{"buffer": [inline items], "rng": state, "replay": {"upstream":
snapshot, "from": int, "to": int, "pulls": [pull number, or -1 for the next
inline item, per slot], "stamps": {archive url: stamp}}}``; without ``"replay"`` it is the inline form,
``{"buffer": [every item], "rng": state}``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from pipekit.errors import ArchiveError, CheckpointError

logger = logging.getLogger("pipekit")

REPLAY = "replay"
NEVER = 1 << 62  # the next snapshot of a shuffle that takes none


class ReplayLog:
    """The snapshots of the pipes above a shuffle, taken every ``every`` pulls and kept for ``window`` pulls.

    ``snapshots`` is a tuple of ``(pull count, pipeline snapshot)``, oldest
    first, replaced (never changed) when one is added, so a position that
    refers to it stays as it was.
    """

    __slots__ = ("every", "next_at", "plan", "snapshots", "window")

    def __init__(self, plan: Any, window: int, every: int) -> None:
        self.plan, self.window, self.every = plan, window, every
        self.snapshots: tuple[tuple[int, dict[str, Any]], ...] = ()
        self.next_at = 0

    def add(self, pulled: int, snapshot: dict[str, Any]) -> None:
        cut = pulled - self.window
        self.snapshots = (*(s for s in self.snapshots if s[0] >= cut), (pulled, snapshot))
        self.next_at = pulled + self.every

    def take(self, pulled: int) -> int:
        """Snapshot the pipes above after ``pulled`` pulls; the pull count of the next one (``NEVER``: failed)."""
        try:
            snapshot = self.plan.snapshot()
        except Exception as exc:  # a pipe above refused (an item it holds): keep the buffer inline
            logger.debug("shuffle: the pipes above cannot be snapshotted (%s): its buffer is kept inline", exc)
            snapshot = None
        if snapshot is None:
            self.snapshots = ()
            return NEVER
        self.add(pulled, snapshot)
        return self.next_at


def _shared(dp: Any) -> bool:
    """Whether ``dp`` may also be read by a branch other than the shuffle's (restoring it would move that one)."""
    from pipekit.pipes._resume import _STARTED_BY_CONSUMERS
    from pipekit.pipes._torch import is_child_pipe

    return isinstance(dp, _STARTED_BY_CONSUMERS) or is_child_pipe(dp)


def replay_log(pipe: Any, start: bool) -> ReplayLog | None:
    """A log for the shuffle ``pipe``'s pass about to start, or ``None`` when its upstream cannot be replayed.

    ``start``: the pass starts an epoch (its first snapshot is the pipes
    above, not started yet).  Call before the pipes above start.
    """
    window = int(getattr(pipe, "replay_window", 0) * pipe.buffer_size)
    if window <= 0:
        return None
    from pipekit.pipes._resume import SnapshotPlan, epoch_marks, pending_seeds, pipeline_pipes

    pipes = pipe.__dict__.get("_upstream_pipes")
    if pipes is None:  # walked once (torch's walk pickles each pipe, its source list too), then reused
        try:
            pipes = pipeline_pipes(pipe.datapipe)
        except Exception:  # a graph torch cannot walk: keep the items inline
            return None
        pipe._upstream_pipes = pipes
    if any(_shared(dp) or callable(getattr(type(dp), "pause", None)) or getattr(type(dp), "replayable", True) is False
           for dp in pipes):
        return None
    plan = SnapshotPlan(pipes, epoch_marks(pipes), pending_seeds(pipes))
    if not plan.capable:
        return None
    log = ReplayLog(plan, window, max(1, window // 32))
    # the first snapshot once the pipes above have started (after the first pull), never of them not yet
    # started: a pipe above that draws its seed when its pass starts (a second pass under ``cycle``, a new
    # epoch) would draw another one on resume; the first item stays inline (``start`` is kept for callers)
    del start
    log.next_at = 1
    return log


def replay_state(
    buffer: list[Any], pulls: list[int] | None, rng: Any, pulled: int, snapshots: tuple[Any, ...] | None
) -> dict[str, Any]:
    """The checkpoint of a buffer whose items have pull numbers ``pulls`` (see the module docstring)."""
    if not snapshots or pulls is None:
        return {"buffer": list(buffer), "rng": rng}
    start, upstream = snapshots[0]
    inline, slots = [], []
    for item, number in zip(buffer, pulls, strict=True):
        if number >= start:
            slots.append(number)
        else:
            slots.append(-1)
            inline.append(item)
    stamps: dict[str, str] = {}
    for _, snapshot in snapshots:
        stamps.update(archive_stamps(snapshot))
    replay = {"upstream": upstream, "from": start, "to": pulled, "pulls": slots, "stamps": stamps}
    return {"buffer": inline, "rng": rng, REPLAY: replay}


def archive_stamps(snapshot: dict[str, Any]) -> dict[str, str]:
    """``{url: stamp}`` of the archives a snapshot of the pipes above finds being read (archive loaders' states)."""
    found = {}
    for state in snapshot.get("states") or ():
        if isinstance(state, dict) and isinstance(state.get("url"), str) and isinstance(state.get("stamp"), str):
            found[state["url"]] = state["stamp"]
    return found


def _check_window(snapshot: dict[str, Any], stamps: dict[str, str], log: ReplayLog) -> None:
    """Refuse a re-read that is reading an archive the checkpoint's window saw with another stamp."""
    for url, now in archive_stamps(snapshot).items():
        then = stamps.get(url)
        if then is not None and then != now:
            raise ArchiveError(
                "resume archive", url, _stages(snapshot, log).get(url, "shuffle"),
                f"the file changed since the checkpoint (size:version {then} then, {now} now) and samples read "
                "from it sit in the shuffle buffer: re-read, they would be other samples; resume from a "
                "checkpoint taken on this file, or start the epoch over",
            )


def _stages(snapshot: dict[str, Any], log: ReplayLog) -> dict[str, str]:
    """The stage name of the pipe reading each archive of ``snapshot`` (``load_from_tar``...), by URL."""
    pipes = {entry[0]: entry[1] for entry in getattr(log.plan, "_entries", ())}
    out = {}
    for i, state in enumerate(snapshot.get("states") or ()):
        if isinstance(state, dict) and isinstance(state.get("url"), str):
            dp = pipes.get(i)
            out[state["url"]] = getattr(dp, "stage", None) or type(dp).__name__
    return out


def check_replay(state: dict[str, Any]) -> None:
    """Raise ``ValueError`` when ``state[REPLAY]`` is not a replay record of a shuffle."""
    replay = state[REPLAY]
    if not isinstance(replay, dict) or not {"upstream", "from", "to", "pulls"} <= set(replay):
        raise ValueError(f"not a shuffle replay record: {replay!r:.200}")
    inline = sum(1 for p in replay["pulls"] if p < 0)
    if inline != len(state["buffer"]):
        raise ValueError(f"shuffle: {inline} inline slots but {len(state['buffer'])} inline items")


def restore_upstream(pipe: Any, snapshot: dict[str, Any]) -> list[tuple[Any, str, str]]:
    """Load a pipeline snapshot of the pipes above the shuffle ``pipe`` (before they start).

    Returns the archives the checkpoint was reading with their stamps (``(pipe, url, stamp)``, taken from the
    positions the whole pipeline's restore loaded into those pipes, which this replaces): the re-read starts
    before they were opened, so :func:`check_stamps` compares them once it has reached the checkpoint.
    """
    from pipekit.pipes._resume import _FRESH, pipeline_pipes
    from pipekit.pipes.state import PendingState

    pipes = pipeline_pipes(pipe.datapipe)
    classes = [type(dp).__qualname__ for dp in pipes]
    if classes != snapshot.get("classes"):
        raise CheckpointError(
            "shuffle: cannot restore the pipes above the shuffle buffer: the pipeline has changed since the "
            f"checkpoint (checkpoint pipes {snapshot.get('classes')}, current pipes {classes})"
        )
    stamps = []
    for dp in pipes:
        pending = getattr(dp, "_pending", None)
        if isinstance(pending, dict) and isinstance(pending.get("url"), str) and isinstance(pending.get("stamp"), str):
            stamps.append((dp, pending["url"], pending["stamp"], pipe))
    for dp, state in zip(pipes, snapshot["states"], strict=True):
        if state is None:
            continue
        if state.get(_FRESH):
            if isinstance(dp, PendingState):
                dp._pending = None  # a later position loaded by the whole pipeline's restore: not started then
            if state.get("seed") is not None:
                dp.set_seed(state["seed"])
            continue
        dp.load_state_dict(state)
    return stamps


def check_stamps(stamps: list[tuple[Any, str, str]]) -> None:
    """Refuse a re-read that reached the checkpoint inside an archive other than the one it recorded.

    Each ``(pipe, url, stamp, shuffle)`` is an archive loader the checkpoint found reading ``url`` with that
    stamp (size and version); after the re-read the loader must be reading the same file, unchanged.  Unless
    the shuffle's input had ended at the checkpoint (it was emptying its buffer): its last pull ran the pipes
    above to their end (a filter or ``sharding_filter`` dropping the items after the last it passed), past the
    item the re-read stops at, and the re-read cannot reach that position, nor needs to.
    """
    for dp, url, stamp, *shuffle in stamps:
        stage = getattr(dp, "stage", type(dp).__name__)
        now_url, now = _reading(dp)
        if now_url != url and shuffle and _input_ended(shuffle[0]):
            continue
        if now_url != url:
            raise ArchiveError(
                "resume archive", url, stage,
                f"re-reading the shuffle buffer's input reached the checkpoint in {now_url!r}, not in this archive: "
                "the files changed since the checkpoint; resume from a checkpoint taken on these files, or start "
                "the epoch over",
            )
        if now is not None and now != stamp:
            raise ArchiveError(
                "resume archive", url, stage,
                f"the file changed since the checkpoint (size:version {stamp} then, {now} now): the shuffle buffer "
                "re-read from it would hold other samples; resume from a checkpoint taken on this file, or start "
                "the epoch over",
            )


def _input_ended(shuffle: Any) -> bool:
    """Whether the refilled ``shuffle`` was emptying its buffer at the checkpoint (its input had ended).

    Checkpoints are taken between the items a shuffle yields: while its input lasts a full buffer stays
    full (each item yielded is replaced by the one pulled); with fewer items than pulls, it has yielded
    some of its last buffer after its input ended.
    """
    buffer, pulled = getattr(shuffle, "_buffer", None), getattr(shuffle, "_pulled", 0)
    size = getattr(shuffle, "buffer_size", 0)
    return isinstance(buffer, list) and len(buffer) < size and pulled > len(buffer)


def _reading(dp: Any) -> tuple[str | None, str | None]:
    """The archive (URL, stamp) an archive loader is at after the re-read.

    A loader the re-read never pulled (a ``header`` above had taken its items before the snapshot the
    re-read starts from) was not started: it is still at the position the snapshot loaded (pending) or
    the one its restore kept for its first pull, which is where it was at the checkpoint.
    """
    pending = getattr(dp, "_pending", None)
    if isinstance(pending, dict):
        url, stamp = pending.get("url"), pending.get("stamp")
        return (url if isinstance(url, str) else None), (stamp if isinstance(stamp, str) else None)
    resume = getattr(dp, "_resume", None)
    if getattr(dp, "_url", None) is None and isinstance(resume, tuple) and len(resume) == 3:
        return resume[0], resume[2]
    return getattr(dp, "_url", None), getattr(dp, "_stamp", None)


def refill(
    it: Iterator[Any], state: dict[str, Any], log: ReplayLog | None
) -> tuple[list[Any], list[int], int]:
    """Read the pipes above from the restored snapshot up to the checkpoint: the buffer, its pulls, the count.

    ``it`` is the iterator on the pipes above (restored by
    :func:`restore_upstream`); ``log`` (if any) takes its snapshots on the way,
    as the uninterrupted run did.
    """
    replay = state[REPLAY]
    start, end, slots = int(replay["from"]), int(replay["to"]), list(replay["pulls"])
    stamps = replay.get("stamps") if isinstance(replay.get("stamps"), dict) else {}
    inline = iter(state["buffer"])
    buffer: list[Any] = [next(inline) if p < 0 else None for p in slots]
    wanted = {p: i for i, p in enumerate(slots) if p >= 0}
    if log is not None:
        log.add(start, replay["upstream"])
    next_at = log.next_at if log is not None else NEVER
    for pulled in range(start + 1, end + 1):
        try:
            item = next(it)
        except StopIteration:
            raise CheckpointError(
                f"shuffle: resuming the shuffle buffer re-reads items {start} to {end - 1} of its input, which "
                f"ended after {pulled - 1}: the data changed since the checkpoint"
            ) from None
        i = wanted.get(pulled - 1)
        if i is not None:
            buffer[i] = item
        if pulled >= next_at and log is not None:
            next_at = log.take(pulled)
            if stamps and log.snapshots and log.snapshots[-1][0] == pulled:
                # the same pulls as the checkpointed run's snapshots: an archive they saw must be the same file
                _check_window(log.snapshots[-1][1], stamps, log)
    return buffer, slots, end
