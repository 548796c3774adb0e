"""Fingerprints of files, ``(size, stamp)``: how a saved index tells the files that changed since it was saved.

Local files: ``os.stat``'s size and ``st_mtime_ns``; remote ones: fsspec's
``ls(detail=True)`` (the ETag where the store gives one).  See
:mod:`pipekit.geo.catalog._saved_index`.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pipekit._fs import is_local, url_to_fs
from pipekit.geo import io as geo_io

__all__ = ["MtimeStamps", "fingerprint_columns", "fingerprints"]


def _stamp(entry: Mapping[str, Any]) -> str:
    for key in ("ETag", "etag", "md5", "LastModified", "last_modified", "mtime", "updated", "created"):
        value = entry.get(key)
        if value is not None:
            return f"{key}={value}"
    return ""


def fingerprints(
    paths: Sequence[str],
    storage_options: Mapping[str, Any] | None = None,
    retry: Any = None,
    stage: str = "index_cache",
) -> list[tuple[int, str] | None]:
    """``(size, stamp)`` of every path (``None`` where it cannot be had), in order.

    Local files: ``os.stat`` (the stamp is ``st_mtime_ns``).  Remote ones: one
    ``ls(detail=True)`` per folder (the ETag where the store gives one, else
    its modification time), retried through transient failures.

    Example:
        >>> import tempfile
        >>> path = f"{tempfile.mkdtemp()}/a.bin"
        >>> _ = open(path, "wb").write(b"12345")
        >>> size, stamp = fingerprints([path])[0]
        >>> size, stamp.startswith("mtime_ns=")
        (5, True)
    """
    sizes, stamps = fingerprint_columns(paths, storage_options, retry, stage)
    return [(size, stamp) if size >= 0 else None for size, stamp in zip(sizes.tolist(), stamps)]


def fingerprint_columns(
    paths: Sequence[str],
    storage_options: Mapping[str, Any] | None = None,
    retry: Any = None,
    stage: str = "index_cache",
) -> tuple[np.ndarray, list[str]]:
    """:func:`fingerprints` as columns: sizes (``int64``, ``-1`` where unknown) and stamps (``""`` there).

    Example:
        >>> import tempfile
        >>> path = f"{tempfile.mkdtemp()}/a.bin"
        >>> _ = open(path, "wb").write(b"12345")
        >>> sizes, stamps = fingerprint_columns([path, path + ".gone"])
        >>> sizes.tolist(), stamps[0].startswith("mtime_ns="), stamps[1]
        ([5, -1], True, '')
    """
    sizes, stamps = _fingerprint_columns(paths, storage_options, retry, stage)
    return sizes, stamps.tolist() if isinstance(stamps, MtimeStamps) else stamps


#: files stat'ed per batch by :func:`_stat_plain_paths` (their ``stat_result``\ s are dropped after each)
_STAT_BATCH = 2048


def _fingerprint_columns(
    paths: Sequence[str],
    storage_options: Mapping[str, Any] | None = None,
    retry: Any = None,
    stage: str = "index_cache",
) -> tuple[np.ndarray, Sequence[str]]:
    """:func:`fingerprint_columns`, with the stamps of plain local paths as :class:`MtimeStamps` (integers)."""
    joined = "\n".join(paths)
    if "://" not in joined and "::" not in joined:  # plain local paths only (the common case)
        return _stat_plain_paths(paths)
    n = len(paths)
    sizes = np.full(n, -1, dtype=np.int64)
    stamps = [""] * n
    folders: dict[str, list[int]] = {}
    stat = os.stat
    for i, path in enumerate(paths):
        if "://" not in path and "::" not in path:  # a plain local path
            try:
                st = stat(path)
            except OSError:
                continue
        elif is_local(path):
            try:
                st = stat(geo_io.local_path(path))
            except OSError:
                continue
        else:
            folders.setdefault(path.rsplit("/", 1)[0], []).append(i)
            continue
        sizes[i] = st.st_size
        stamps[i] = f"mtime_ns={st.st_mtime_ns}"
    if folders:

        from pipekit.retry import resolve_retry

        policy = resolve_retry(retry)
        for folder, rows in folders.items():
            fs, p = url_to_fs(folder, storage_options)
            fs.invalidate_cache(p)  # sizes and ETags as they are now, not from an earlier listing fsspec kept
            entries = policy.call(lambda fs=fs, p=p: fs.ls(p, detail=True), action="list", url=folder, stage=stage)
            by_name = {str(e.get("name", "")).rstrip("/").rsplit("/", 1)[-1]: e for e in entries}
            for i in rows:
                entry = by_name.get(paths[i].rsplit("/", 1)[-1])
                if entry is not None and entry.get("type", "file") != "directory" and entry.get("size") is not None:
                    sizes[i] = int(entry["size"])
                    stamps[i] = _stamp(entry)
    return sizes, stamps


def _stat_plain_paths(paths: Sequence[str]) -> tuple[np.ndarray, MtimeStamps]:
    """Sizes and :class:`MtimeStamps` of local paths (``-1`` and no stamp where ``os.stat`` fails).

    ``os.stat`` is mapped over batches of paths and only the two fields kept
    as integers: no loop step, no stamp text and no numpy item assignment per
    file (100,000 files: the ``stat`` calls themselves are most of the time).
    """
    n = len(paths)
    sizes = np.empty(n, dtype=np.int64)
    mtimes = np.empty(n, dtype=np.int64)
    size_of, mtime_of, stat = operator.attrgetter("st_size"), operator.attrgetter("st_mtime_ns"), os.stat
    for start in range(0, n, _STAT_BATCH):
        batch = paths[start : start + _STAT_BATCH]
        stop = start + len(batch)
        try:
            found = list(map(stat, batch))
        except OSError:  # a file gone (or unreadable) since it was listed: one by one
            for i, path in enumerate(batch, start):
                try:
                    st = stat(path)
                except OSError:
                    sizes[i], mtimes[i] = -1, 0
                    continue
                sizes[i], mtimes[i] = st.st_size, st.st_mtime_ns
            continue
        sizes[start:stop] = np.fromiter(map(size_of, found), dtype=np.int64, count=len(found))
        mtimes[start:stop] = np.fromiter(map(mtime_of, found), dtype=np.int64, count=len(found))
    return sizes, MtimeStamps(mtimes, sizes >= 0)


class MtimeStamps(Sequence[str]):
    """The stamps of local files, ``"mtime_ns=<st_mtime_ns>"`` (``""`` where unknown), kept as integers.

    A saved index is checked against them without a string per file
    (:meth:`SavedIndex.rows_of` compares them as Arrow strings built at
    once); the texts are made when the index is saved.

    Example:
        >>> import numpy as np
        >>> stamps = MtimeStamps(np.array([1700000000123456789, 0]), np.array([True, False]))
        >>> list(stamps), stamps[0], len(stamps)
        (['mtime_ns=1700000000123456789', ''], 'mtime_ns=1700000000123456789', 2)
    """

    def __init__(self, mtimes: np.ndarray, known: np.ndarray) -> None:
        self.mtimes = np.asarray(mtimes, dtype=np.int64)
        self.known = np.asarray(known, dtype=bool)

    def __len__(self) -> int:
        return len(self.mtimes)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return self.tolist()[i]
        return f"mtime_ns={int(self.mtimes[i])}" if self.known[i] else ""

    def __iter__(self) -> Any:
        return iter(self.tolist())

    def tolist(self) -> list[str]:
        """The stamps as text (as :func:`fingerprint_columns` gives them)."""
        return [f"mtime_ns={m}" if k else "" for m, k in zip(self.mtimes.tolist(), self.known.tolist())]

    def take(self, rows: Any) -> MtimeStamps:
        """The stamps of ``rows`` (an int array), in that order."""
        rows = np.asarray(rows, dtype=np.int64)
        return MtimeStamps(self.mtimes[rows], self.known[rows])

    def arrow(self) -> Any:
        """The stamps as a ``pyarrow`` string array (null where unknown), built without a Python string each."""
        import pyarrow as pa
        import pyarrow.compute as pc

        digits = pc.cast(pa.array(self.mtimes, type=pa.int64(), mask=~self.known), pa.string())
        return pc.binary_join_element_wise("mtime_ns=", digits, "")
