"""Checking that a replay reached the checkpoint: the resume of pipelines that cannot report their position.

A pipeline holding a pipe that cannot report its position (``fork``,
``demux``) is checkpointed by counting its items and resumed by replaying
that many from the start of the epoch.  If the files changed in between (one
deleted, or replaced by other contents), the replay reads other data and lands
somewhere else: items would be repeated or lost without a word.

So a counted position also holds a *check*: the position fields of the pipes
that can report theirs (:data:`FIELDS`: a source's count, the listing's
digest, the archive being read and its stamp; scalars only), taken with the count.  After
the replay the same fields are taken again; any difference raises
:class:`~pipekit.errors.CheckpointError` naming it (the archive that changed,
the files of a listing added or gone), instead of resuming elsewhere.  A
worker keeps its counted positions and sends one only when a checkpoint asks
(as it does snapshots: :mod:`pipekit._worker_states`), so the check holds a
listing's compressed names too, to name the files added or gone.

And the files themselves: in a pipeline resumed by replaying, or with a
``cycle`` (whose later passes open the files of the earlier ones again), the
pipes that open files stamp each one in a :class:`~pipekit.pipes._stamps.StampLog`
(:func:`start_stamps`); a position holds the record of the files stamped by
then (:data:`STAMPS`), and the resumed epoch refuses a file read before the
checkpoint that is gone or was replaced since, naming it, when it is read
again (and, after a replay, those the replay did not read again).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

from pipekit._fs import listing_change
from pipekit.errors import CheckpointError
from pipekit.pipes._stamps import StampLog

__all__ = ["ENDED", "FIELDS", "STAMPS", "check_replay", "replay_check", "replay_end", "start_stamps"]

ENDED = "ended"  # the key of a counted position taken after its iterator ended (the pulls that found the end done)
STAMPS = "stamps"  # the key of a position holding the stamps of the files opened before it (pipes/_stamps.py)

#: The fields of a pipe's state that say where in the data it is (sources, listers, archive loaders, shards).
FIELDS = ("root", "done", "last", "digest", "count", "url", "entries", "stamp", "yielded", "seen")
_PLAIN = (int, str, bool, type(None))


def replay_check(pipes: list[Any], stages: list[str]) -> list[Any]:
    """``[[pipe index, stage, {field: value}], ...]`` for the pipes that report a position (plain data)."""
    check = []
    for i, dp in enumerate(pipes):
        fields = _fields(dp)
        if fields:
            check.append([i, stages[i] if i < len(stages) else type(dp).__name__, fields])
    return check


def _fields(dp: Any) -> dict[str, Any] | None:
    state_dict = getattr(type(dp), "state_dict", None)
    if not callable(state_dict) or not callable(getattr(type(dp), "load_state_dict", None)):
        return None
    if not any(key in FIELDS for key in getattr(type(dp), "state_keys", ())):
        return None
    try:
        state = dp.state_dict()
    except Exception:  # a pipe that cannot report now: nothing to compare
        return None
    if not isinstance(state, dict):
        return None
    fields = {k: state[k] for k in FIELDS if k in state and isinstance(state[k], _PLAIN)}
    if isinstance(state.get("names"), bytes):
        fields["names"] = state["names"]  # a listing, compressed: to name the files a changed one lost or gained
    return fields or None


def check_replay(check: Any, pipes: list[Any], stages: list[str], replayed: int,
                 stamps: StampLog | None = None) -> None:
    """Raise :class:`~pipekit.errors.CheckpointError` if the pipes are not where ``check`` says they were.

    ``stamps``: the epoch's log, which checked the files the replay opened again; the files read before
    the checkpoint that it did not open again are checked first (:meth:`StampLog.check_replayed`).
    """
    if stamps is not None:
        stamps.check_replayed(replayed)
    if not isinstance(check, list):
        return
    now = {entry[0]: entry[2] for entry in replay_check(pipes, stages)}
    differences = []
    for i, stage, then in sorted(check, key=lambda entry: -entry[0]):  # from the source: the first change first
        here = now.get(i, {})
        changed = [k for k in then if k != "names" and here.get(k) != then[k]]
        if changed:
            differences.append(_describe(stage, then, here, changed))
    if differences:
        raise CheckpointError(
            f"pipekit.DataLoader: resuming by replaying {replayed} items (a pipe of the pipeline cannot report its "
            f"position) did not reach the checkpoint's position: the data changed since the checkpoint: "
            f"{'; '.join(differences[:3])}; resume from a checkpoint taken on these files, or start the epoch over"
        )


def replay_end(next_item: Callable[[], Any], replayed: int) -> None:
    """After replaying the ``replayed`` items of a position taken once the epoch had ended, find the end again.

    The pipes pulled on past the last item to find the end (a ``sharding_filter`` dropping the other workers'
    items, a ``header`` at its limit): the position's check was taken after those pulls, so the replay makes
    them too (one more ``next_item()``, which must end), then is checked.
    """
    try:
        next_item()
    except StopIteration:
        return
    raise CheckpointError(
        f"pipekit.DataLoader: resuming by replaying {replayed} items: the epoch had ended there at the checkpoint, "
        "and the replay found more items: the data changed since the checkpoint; resume from a checkpoint taken on "
        "these files, or start the epoch over"
    )


def _describe(stage: str, then: dict[str, Any], now: dict[str, Any], changed: list[str]) -> str:
    if "stamp" in changed and then.get("url") == now.get("url") and then.get("url") is not None:
        return (f"{stage}: {then['url']!r} changed since the checkpoint (size:version {then['stamp']} then, "
                f"{now.get('stamp')} now)")
    if "url" in changed:
        return f"{stage}: the checkpoint was in {then.get('url')!r}, the replay reached {now.get('url')!r}"
    if "digest" in changed:
        change = None
        names = now.get("names")
        if isinstance(names, bytes) and isinstance(then.get("digest"), str):
            try:
                urls = zlib.decompress(names).decode("utf-8", "surrogateescape").split("\n")
            except (zlib.error, UnicodeError):
                urls = None
            change = listing_change(then, urls) if urls is not None else None
        return (f"{stage}: the files under {then.get('root')!r} changed since the checkpoint ("
                + (change or f"{then.get('count')} files then, {now.get('count')} now") + ")")
    shown = ", ".join(f"{k} {then.get(k)!r} then, {now.get(k)!r} after the replay" for k in changed)
    return f"{stage}: {shown}"


def start_stamps(pipes: list[Any], capable: bool, pending: dict[str, Any] | None) -> StampLog | None:
    """Give the pipes that open files (``stamps_files``) the epoch's :class:`StampLog`, or ``None``.

    A log only where a resume reads files again: the pipeline is resumed by replaying (not ``capable`` of
    snapshots) or holds a pipe that reads its source again within an epoch (``rereads``: ``cycle``,
    ``ResampledShardList``).  A resumed epoch's log expects the stamps of ``pending`` (the checkpoint's position).
    """
    stamping = [dp for dp in pipes if getattr(type(dp), "stamps_files", False)]
    log = None
    if stamping and (not capable or any(getattr(type(dp), "rereads", False) for dp in pipes)):
        log = StampLog()
        if pending is not None:
            log.expect(pending.get(STAMPS), carry=pending.get("mode") == "snapshot")
    for dp in stamping:
        dp._stamp_log = log
    return log
