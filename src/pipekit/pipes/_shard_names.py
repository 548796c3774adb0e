"""Shard names: the pattern's fields, the names each writer uses, and the shards of a pattern that exist.

A pattern holds one ``%d`` field for the shard number (``"out/train-%06d.tar"``)
and, for ``write_shards``, the fields ``{worker}`` and ``{rank}``, filled in per
process so that DataLoader workers and distributed ranks never write the same
names (see :class:`pipekit.pipes._shard_writer.ShardSaver`).
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from collections.abc import Mapping
from typing import Any

import torch

from pipekit._fs import url_to_fs
from pipekit._seeds import get_rank
from pipekit.errors import ConfigurationError
from pipekit.pipes.base import IterDataPipe

__all__: list[str] = []

logger = logging.getLogger("pipekit")


def _check_pattern(pattern: Any, start_shard: int, stage: str) -> str:
    if isinstance(pattern, os.PathLike):
        pattern = os.fspath(pattern)
    if not isinstance(pattern, str):
        raise TypeError(f"{stage}: pattern must be a str such as 'shards/train-%06d.tar', got {pattern!r}")
    try:
        first, second = pattern % start_shard, pattern % (start_shard + 1)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{stage}: pattern {pattern!r} must hold one %d-style field for the shard number, "
                         f"e.g. 'shards/train-%06d.tar' ({exc})") from None
    if first == second:
        raise ValueError(f"{stage}: pattern {pattern!r} gives the same name for every shard; "
                         "use a %d-style field, e.g. 'shards/train-%06d.tar'")
    return pattern


_NUMBER_FIELD = re.compile(r"%(0?)(\d*)d")


def scan_shards(
    pattern: str, start: int, storage_options: Mapping[str, Any] | None = None
) -> tuple[dict[int, str], dict[int, list[str]]] | None:
    """``(shards, temporaries)`` of ``pattern`` numbered ``start`` or more that exist, by shard number.

    ``shards`` are named as ``pattern`` names them; ``temporaries`` are the
    hidden files a writer killed mid-shard leaves beside them
    (``.train-000003.tar.tmp-<uuid>``).  ``None`` when they cannot be listed
    (the shard number is in a folder name).  Raises what listing the folder raises.
    """
    folder, slash, name = pattern.rpartition("/")
    fields = list(_NUMBER_FIELD.finditer(name))
    if "%" in folder or len(fields) != 1 or name.count("%") != 1:
        return None
    m = fields[0]
    names = re.compile(r"(\.?)" + re.escape(name[:m.start()]) + r"\s*(\d+)" + re.escape(name[m.end():])
                       + r"(\.tmp-[0-9a-f]{32})?")
    fs, path = url_to_fs(folder or ("/" if slash else "."), storage_options)
    fs.invalidate_cache(path)
    entries = fs.ls(path, detail=False) if fs.isdir(path) else []
    shards: dict[int, str] = {}
    temporaries: dict[int, list[str]] = {}
    for entry in sorted(str(e) for e in entries):
        base = entry.rstrip("/").rsplit("/", 1)[-1]
        hit = names.fullmatch(base)
        if hit is None or bool(hit[1]) != bool(hit[3]) or int(hit[2]) < start:
            continue
        number, url = int(hit[2]), f"{folder}{slash}{base}"
        if name % number != base.removeprefix(".").removesuffix(hit[3] or ""):
            continue
        if hit[3]:
            temporaries.setdefault(number, []).append(url)
        else:
            shards[number] = url
    return shards, temporaries


def following(shards: Mapping[int, str], after: int) -> list[str]:
    """The shards numbered ``after``, ``after + 1``... up to the first missing number.

    What an earlier, longer run left after a run that ended at ``after - 1``;
    shards past a gap belong to another range (another job's ``start_shard``).
    """
    out = []
    while after in shards:
        out.append(shards[after])
        after += 1
    return out


def _warn_left_over(pattern: str, after: int, storage_options: Mapping[str, Any], stage: str) -> None:
    """Warn when shards of ``pattern`` numbered ``after``, ``after + 1``... exist: an earlier, longer run left them."""
    try:
        scan = scan_shards(pattern, after, storage_options)
    except Exception as exc:
        logger.warning("%s: could not look for shards of %r left from an earlier run: %s", stage, pattern, exc)
        return
    left = [] if scan is None else following(scan[0], after)
    if left:
        named = ", ".join(left[:10]) + (f" ... ({len(left)} in all)" if len(left) > 10 else "")
        warnings.warn(f"{stage}: {len(left)} shard(s) of {pattern!r} after the ones this epoch wrote are left from "
                      f"an earlier run: {named}; readers of the pattern or the folder would read them too: remove "
                      "them (pipekit shard --overwrite does)", UserWarning, stacklevel=3)


_WRITER_FIELD = re.compile(r"\{(\w*)\}")
_WRITER_FIELDS = ("worker", "rank")


def _check_writer_fields(pattern: str, stage: str) -> None:
    """Refuse ``{name}`` fields of a ``write_shards`` pattern other than ``{worker}`` and ``{rank}``."""
    unknown = sorted({m[1] for m in _WRITER_FIELD.finditer(pattern)} - set(_WRITER_FIELDS))
    if unknown:
        raise ValueError(f"{stage}: pattern {pattern!r} has the field(s) " + ", ".join(f"{{{u}}}" for u in unknown)
                         + "; the fields a pattern may hold are {worker}, {rank} (and the %d shard number)")


def distributed_place() -> tuple[int, int] | None:
    """``(ranks, rank)`` as this process knows them: its process group's, else ``$WORLD_SIZE`` and ``$RANK``.

    ``None`` when neither says (a single process, or a DataLoader worker of a
    rank started without those variables: workers have no process group).
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return int(torch.distributed.get_world_size()), int(torch.distributed.get_rank())
    try:
        return max(1, int(os.environ["WORLD_SIZE"])), get_rank()
    except (KeyError, ValueError):
        return None


def _sharded_ranks(pipe: IterDataPipe, workers: int) -> int:
    """How many ranks the DataLoader told the sharding point upstream of ``pipe`` about (1 when none did).

    A DataLoader gives each sharding point ``num_workers * world_size`` instances.
    """
    from pipekit.pipes._resume import pipeline_pipes  # resume imports the pipe modules

    for dp in pipeline_pipes(pipe):
        n = getattr(dp, "num_of_instances", None)
        if callable(getattr(dp, "apply_sharding", None)) and isinstance(n, int) and n > 1 and n % workers == 0:
            return n // workers
    return 1


def _writer_pattern(pattern: str, stage: str, pipe: IterDataPipe, built_in: tuple[int, int] | None) -> str:
    """``pattern`` with ``{worker}`` and ``{rank}`` filled in for this process.

    Several writers (DataLoader workers, distributed ranks) given one pattern
    would write the same shard names, each replacing the others' shards: a
    pattern that does not tell them apart is refused, before anything is written.
    The rank is this process's (:func:`distributed_place`), else the one of the
    process that built the pipe (``built_in``); the number of ranks is also
    read from the sharding point upstream.
    """
    info = torch.utils.data.get_worker_info()
    workers, worker = (1, 0) if info is None else (int(info.num_workers), int(info.id))
    place = distributed_place() or built_in
    ranks = max(place[0] if place else 1, _sharded_ranks(pipe, workers))
    rank = place[1] if place else None
    missing = []
    if workers > 1 and "{worker}" not in pattern:
        missing.append(("{worker}", f"{workers} DataLoader workers"))
    if ranks > 1 and "{rank}" not in pattern:
        missing.append(("{rank}", f"{ranks} ranks"))
    if missing:
        fields = "".join(f"{field}-" for field, _ in missing)
        at = pattern.rfind("%")  # the shard number's field
        example = pattern[:at] + fields + pattern[at:]
        raise ConfigurationError(
            f"{stage}: pattern {pattern!r} runs in " + " and ".join(where for _, where in missing)
            + ", which would all write the same shard names and replace each other's shards (losing their "
            "samples); put " + " and ".join(field for field, _ in missing) + f" in the pattern, e.g. {example!r}, "
            "so that each writes its own shards (or write from one process: num_workers=0)")
    if "{rank}" in pattern and rank is None:
        if ranks > 1:
            raise ConfigurationError(
                f"{stage}: pattern {pattern!r} has {{rank}}, but this DataLoader worker of one of {ranks} ranks cannot "
                "tell its rank: build the pipe after torch.distributed.init_process_group(), or set RANK and "
                "WORLD_SIZE in the environment (torchrun does)")
        rank = 0
    return pattern.replace("{worker}", str(worker)).replace("{rank}", str(rank))
