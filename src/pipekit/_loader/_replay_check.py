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
the files of a listing added or gone), instead of resuming elsewhere.  A file
replaced by other contents that no pipe stamps (plain files opened by
``open_files_by_fsspec``) is seen only when it moves a count.
"""

from __future__ import annotations

from typing import Any

from pipekit.errors import CheckpointError

__all__ = ["FIELDS", "check_replay", "replay_check"]

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
    # scalars only (a listing's names, up to a MB, would travel with every batch of a worker)
    fields = {k: state[k] for k in FIELDS if k in state and isinstance(state[k], _PLAIN)}
    return fields or None


def check_replay(check: Any, pipes: list[Any], stages: list[str], replayed: int) -> None:
    """Raise :class:`~pipekit.errors.CheckpointError` if the pipes are not where ``check`` says they were."""
    if not isinstance(check, list):
        return
    now = {entry[0]: entry[2] for entry in replay_check(pipes, stages)}
    differences = []
    for i, stage, then in sorted(check, key=lambda entry: -entry[0]):  # from the source: the first change first
        here = now.get(i, {})
        changed = [k for k in then if here.get(k) != then[k]]
        if changed:
            differences.append(_describe(stage, then, here, changed))
    if differences:
        raise CheckpointError(
            f"pipekit.DataLoader: resuming by replaying {replayed} items (a pipe of the pipeline cannot report its "
            f"position) did not reach the checkpoint's position: the data changed since the checkpoint: "
            f"{'; '.join(differences[:3])}; resume from a checkpoint taken on these files, or start the epoch over"
        )


def _describe(stage: str, then: dict[str, Any], now: dict[str, Any], changed: list[str]) -> str:
    if "stamp" in changed and then.get("url") == now.get("url") and then.get("url") is not None:
        return (f"{stage}: {then['url']!r} changed since the checkpoint (size:version {then['stamp']} then, "
                f"{now.get('stamp')} now)")
    if "url" in changed:
        return f"{stage}: the checkpoint was in {then.get('url')!r}, the replay reached {now.get('url')!r}"
    if "digest" in changed:
        return (f"{stage}: the files under {then.get('root')!r} changed since the checkpoint ({then.get('count')} "
                f"files then, {now.get('count')} now)")
    shown = ", ".join(f"{k} {then.get(k)!r} then, {now.get(k)!r} after the replay" for k in changed)
    return f"{stage}: {shown}"
