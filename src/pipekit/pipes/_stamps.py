"""What the files a pipeline opened in an epoch were: stamps kept with a checkpoint and checked on resume.

A resume that reads files again reaches the checkpoint's position only if those files are still what
they were: a *counted* position (a pipeline with ``fork``, ``demux``, ``unbatch``...) is reached by
replaying the epoch's items from its start, a later pass of ``cycle`` opens the files of the passes
before it again, and shards drawn with replacement (``TarShards(resampled=True)``) are drawn again.  A file
read before the checkpoint and replaced since would be replayed, or read again, with its new contents, where
the run the checkpoint was taken from read the old ones.

So, in such pipelines, :class:`pipekit.DataLoader` gives the pipes that open files
(``open_files_by_fsspec``, ``read_from_http``, the archive loaders: their class sets ``stamps_files = True``) a
:class:`StampLog` for the epoch.  Each file opened is *stamped* (:func:`file_stamp`:
``"size:ETag"``, ``"size:mtime"``... from the open stream, without a request or ``stat`` of its own), a
position records how many files were stamped by then, and a checkpoint holds their :func:`stamp_record`
(a digest and a count, plus the ``(url, stamp)`` pairs zlib-compressed while they fit in
:data:`STAMP_NAMES_LIMIT`; a URL with credentials as :func:`~pipekit._redact.checkpoint_url` gives
it, without them and with a digest of the whole).  A resumed epoch's log
:meth:`~StampLog.expect`\\ s the checkpoint's stamps: a file opened again with another stamp raises
:class:`~pipekit.errors.CheckpointError` naming it, both stamps and the stage, whatever ``on_error``
says; after a replay, the files read before the checkpoint that the replay did not open again are
looked at (local ones: gone, or changed) by :meth:`~StampLog.check_replayed`.

A pipeline that neither replays nor cycles gets no log: its pipes stamp nothing, and pay one ``is None``
test per file.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import zlib
from collections.abc import Iterator
from typing import Any

from pipekit._fs import local_path
from pipekit._redact import checkpoint_url, redact_url, shown_url
from pipekit.errors import CheckpointError
from pipekit.pipes.base import StreamWrapper

__all__ = [
    "STAMP_NAMES_LIMIT", "StampLog", "StampsAt", "file_stamp", "http_version", "same_file", "stamp_record",
    "upstream_strings",
]

#: The most bytes a checkpoint keeps of the compressed ``(url, stamp)`` pairs of the files opened before its
#: position, per process (10,000 local files take about 90 kB); past it only their digest and count.
STAMP_NAMES_LIMIT = 1 << 20

_S_IFMT, _S_IFREG = 0o170000, stat.S_IFREG  # stat.S_ISREG without its call


def http_version(headers: Any) -> dict[str, str]:
    """The version an HTTP server told of a file (``ETag``, ``Last-Modified``), as ``details`` for :func:`file_stamp`.

    ``headers``: a response's headers, or fsspec's HTTP ``info()`` (which keeps them under the same names).

    Example:
        >>> http_version({"ETag": '"v1"', "Last-Modified": "Sat, 28 Nov 2026 10:00:00 GMT", "Content-Length": "3"})
        {'ETag': '"v1"', 'LastModified': 'Sat, 28 Nov 2026 10:00:00 GMT'}
    """
    version = {}
    if headers.get("ETag"):
        version["ETag"] = headers["ETag"]
    if headers.get("Last-Modified"):
        version["LastModified"] = headers["Last-Modified"]
    return version


def file_stamp(stream: Any) -> str | None:
    """``"size:version"`` of the file under ``stream``, from what its open already knows, or ``None``.

    fsspec's remote files (s3fs, HTTP, GCS...) carry the ``info()`` their open fetched: the size and the
    ETag (else the modification time), and ``read_from_http``'s streams those of their response's headers;
    a local file gets one ``fstat`` of its descriptor.  Wrappers
    (:class:`StreamWrapper`, buffered and text readers, :class:`~pipekit.pipes._retrying_file.RetryingFile`)
    are looked through.  ``None`` where the stream tells nothing (an in-memory or decompressed one).
    """
    obj = stream
    for _ in range(8):
        if isinstance(obj, StreamWrapper):
            obj = obj.file_obj
            continue
        details = getattr(obj, "details", None)
        if isinstance(details, dict):
            version = next((details[k] for k in ("ETag", "etag", "generation", "LastModified", "mtime", "updated")
                            if details.get(k) not in (None, "")), None)
            size = details.get("size")
            return None if version is None and size is None else f"{size}:{version}"
        try:
            st = os.fstat(obj.fileno())
        except (OSError, ValueError, AttributeError, TypeError):  # io.UnsupportedOperation is both
            pass
        else:
            if stat.S_ISREG(st.st_mode):
                return f"{st.st_size}:{st.st_mtime_ns}"
        inner = getattr(obj, "raw", None) or getattr(obj, "buffer", None)
        if inner is None or inner is obj:
            return None
        obj = inner
    return None


def upstream_strings(pipe: Any, most: int = 32) -> Iterator[str]:
    """The strings held by the lists of the pipes upstream of ``pipe`` (URLs, roots), lazily: where a URL a
    checkpoint keeps without its credentials is found again (:func:`~pipekit._redact.resolve_checkpoint_url`)."""
    for _ in range(most):
        if pipe is None:
            return
        iterable = getattr(pipe, "iterable", None)
        if isinstance(iterable, list | tuple):
            yield from (item for item in iterable if isinstance(item, str))
        state = getattr(pipe, "__dict__", {})
        pipe = state.get("source_datapipe", state.get("datapipe"))


def _path_stamp(url: str) -> str | None:
    """The stamp of a local file now (as :func:`file_stamp` gives it), ``"gone"``, or ``None`` when not local."""
    path = local_path(url)
    if path is None:
        return None
    try:
        st = os.stat(os.path.expanduser(path))
    except FileNotFoundError:
        return "gone"
    except OSError:
        return None
    return f"{st.st_size}:{st.st_mtime_ns}" if stat.S_ISREG(st.st_mode) else None


def _joined(entries: list[tuple[str, str]]) -> bytes:
    return "\n".join(f"{url}\t{stamp}" for url, stamp in entries).encode("utf-8", "surrogateescape")


def stamp_record(entries: list[tuple[str, str]], limit: int = STAMP_NAMES_LIMIT) -> dict[str, Any]:
    """What a checkpoint keeps of the files stamped before its position: ``{"digest", "count"[, "names"]}``.

    ``names``: the ``url<TAB>stamp`` lines, zlib-compressed (bytes: ``torch.load(weights_only=True)`` loads
    them), kept while they compress to at most ``limit`` bytes.

    Example:
        >>> record = stamp_record([("/d/a.bin", "3:17"), ("/d/b.bin", "4:17")])
        >>> sorted(record), record["count"]
        (['count', 'digest', 'names'], 2)
    """
    raw = _joined(entries)
    record: dict[str, Any] = {"digest": hashlib.blake2b(raw, digest_size=16).hexdigest(), "count": len(entries)}
    names = zlib.compress(raw, 6)
    if len(names) <= limit:
        record["names"] = names
    return record


def same_file(then: str, now: str) -> bool:
    """Whether stamp ``now`` may be of the file stamped ``then``: the same stamp, or ``then`` told the size alone
    (``"size:None"``: an HTTP file stamped before its server's version was read) and ``now`` is of that size.

    Example:
        >>> same_file("3:17", "3:17"), same_file("3:None", '3:"etag"'), same_file("3:None", '4:"etag"')
        (True, True, False)
    """
    return then == now or (then.endswith(":None") and now.startswith(then[:-4]))  # "3:" (a size holds no colon)


def _some(items: list[str], most: int = 5) -> str:
    return "; ".join(items[:most]) + (f" and {len(items) - most} more" if len(items) > most else "")


_ADVICE = ("resume from a checkpoint taken on these files, or start the epoch over")


class StampLog:
    """The files a pipeline opened in one epoch (in one process), each with its stamp, in order.

    Given to the pipes that open files by :class:`pipekit.DataLoader` (never pickled with them: a pickled
    log is ``None``).  A file opened twice is logged once, with its first stamp.
    """

    __slots__ = ("_entries", "_expected", "_index", "_record")

    def __init__(self) -> None:
        self._entries: list[tuple[str, str]] = []  # append-only: a position is a length of it
        self._index: dict[str, str] = {}
        self._expected: dict[str, str] | None = None  # the checkpoint's stamps, by URL (a resumed epoch)
        self._record: dict[str, Any] | None = None

    def __reduce__(self) -> Any:
        return (_no_log, ())

    def __len__(self) -> int:
        return len(self._entries)

    def opened(self, url: str, stream: Any, stage: str) -> None:
        """Log ``url``, just opened as ``stream`` by ``stage`` (closed if its stamp is not the checkpoint's: raises)."""
        file = stream.file_obj if type(stream) is StreamWrapper else stream
        stamp: str | None = None
        if type(file) is io.BufferedReader:  # a local file opened with open(): one fstat, few calls (per file)
            try:
                st = os.fstat(file.fileno())
            except (OSError, ValueError):  # a buffered reader over another raw stream (HTTP's): no descriptor
                stamp = file_stamp(stream)
            else:
                stamp = f"{st.st_size}:{st.st_mtime_ns}" if st.st_mode & _S_IFMT == _S_IFREG else None
        else:
            stamp = file_stamp(stream)
        if stamp is None:
            return
        url = checkpoint_url(url)  # the record is kept with checkpoints: a URL's credentials are not
        if url not in self._index:
            self._index[url] = stamp
            self._entries.append((url, stamp))
        if self._expected is not None:
            try:
                self._check(url, stamp, stage)
            except CheckpointError:
                stream.close()
                raise

    def note(self, url: str, stamp: str | None, stage: str) -> None:
        """Log ``url`` with ``stamp`` (``None``: nothing to tell, not logged); raises if the checkpoint's differs."""
        if stamp is None:
            return
        url = checkpoint_url(url)
        if url not in self._index:
            self._index[url] = stamp
            self._entries.append((url, stamp))
        if self._expected is not None:
            self._check(url, stamp, stage)

    def _check(self, url: str, stamp: str, stage: str) -> None:
        then = self._expected.get(url) if self._expected is not None else None
        if then is not None and not same_file(then, stamp):
            raise CheckpointError(
                f"{stage}: {shown_url(redact_url(url))!r} changed since the checkpoint (size:version {then} then, "
                f"{stamp} now): it was read before the checkpoint and is read again after it (by the replay that "
                "resumes a pipeline counting its items, by a later pass of a cycle, or drawn again from resampled "
                f"shards), with other contents than the run the checkpoint was taken from read; {_ADVICE}"
            )

    def at(self, lazy: bool) -> dict[str, Any] | StampsAt:
        """The record of the files logged so far (lazy: a :class:`StampsAt` that makes it when asked)."""
        position = StampsAt(self, len(self._entries))
        return position if lazy else position.materialize()

    def expect(self, record: Any, carry: bool) -> None:
        """Check the files opened from now on against ``record`` (a checkpoint's :func:`stamp_record`).

        ``carry``: the files of ``record`` count as opened in this epoch (a position restored as it was, not
        replayed: a checkpoint taken later in the epoch holds them too).
        """
        if not isinstance(record, dict):
            return
        self._record = record
        names = record.get("names")
        self._expected = {}
        if isinstance(names, bytes):
            try:
                text = zlib.decompress(names).decode("utf-8", "surrogateescape")
            except (zlib.error, UnicodeError):
                return
            for line in text.split("\n") if text else ():
                url, _, stamp = line.rpartition("\t")
                self._expected[url] = stamp
        if carry:
            for url, stamp in self._expected.items():
                if url not in self._index:
                    self._index[url] = stamp
                    self._entries.append((url, stamp))

    def check_replayed(self, replayed: int) -> None:
        """After a replay of ``replayed`` items: refuse if a file read before the checkpoint is gone or changed.

        The files the replay opened again were checked as they were opened; those it did not open (gone from
        a listing, or read ahead by the run the checkpoint was taken from) are looked at now where they are
        local.  Without the checkpoint's names (past :data:`STAMP_NAMES_LIMIT`) the replay's first files are
        compared with the checkpoint's by digest.
        """
        record, expected = self._record, self._expected
        if record is None or expected is None:
            return
        if not expected:
            count = record.get("count")
            if isinstance(count, int) and count and record.get("names") is None:
                digest = hashlib.blake2b(_joined(self._entries[:count]), digest_size=16).hexdigest()
                if len(self._entries) < count or digest != record.get("digest"):
                    raise CheckpointError(
                        f"pipekit.DataLoader: resuming by replaying {replayed} items: the {count} files read before "
                        f"the checkpoint are not the ones the replay read ({min(count, len(self._entries))} "
                        f"read; too many to name); a file changed, was added or is gone since; {_ADVICE}"
                    )
            return
        changed = []
        for url, then in expected.items():
            if url in self._index:
                continue
            now = _path_stamp(url)
            if now is not None and now != then:
                what = "is gone" if now == "gone" else f"changed (size:version {then} then, {now} now)"
                changed.append(f"{redact_url(url)!r} {what}")
        if changed:
            raise CheckpointError(
                f"pipekit.DataLoader: resuming by replaying {replayed} items (a pipe of the pipeline cannot report "
                f"its position): files read before the checkpoint changed since: {_some(changed)}; the replay "
                f"would not reach the checkpoint's position; {_ADVICE}"
            )

    def unread(self) -> list[str]:
        """The files of the checkpoint's record this epoch has not opened (yet)."""
        if not self._expected:
            return []
        return [url for url in self._expected if url not in self._index]


def _no_log() -> None:
    return None


class StampsAt:
    """The record of a :class:`StampLog` at a position (its first ``count`` entries), made when asked.

    A DataLoader worker keeps its positions and sends one only when a checkpoint asks for it: the record
    (a digest over thousands of files) is made then, in the answering thread (the log only grows, and
    its first entries never change).
    """

    __slots__ = ("count", "log")

    def __init__(self, log: StampLog, count: int) -> None:
        self.log, self.count = log, count

    def materialize(self) -> dict[str, Any]:
        return stamp_record(self.log._entries[: self.count])
