"""What the archive loaders share: :class:`ArchiveLoader`, the base of ``load_from_tar`` and ``load_from_zip``.

The walk over the archives from upstream (each ``(url, stream)`` item, its member streams closing the
archive stream when done), the errors (``on_error``, the skip log, an archive holding no file), the
per-member byte limit (``max_member_bytes``, whose default is
:data:`pipekit.pipes._archives.MAX_MEMBER_BYTES`) and resume (the position, reopening the archive being
read, the check that it did not change).  How a tar or a zip is read member by member is the subclasses'
part, in :mod:`pipekit.pipes._archives`, whose docstring describes both loaders and their resume.
"""

from __future__ import annotations

import posixpath
import warnings
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

from pipekit._redact import checkpoint_url, redact_url, resolve_checkpoint_url, shown_url
from pipekit._validate import check_int
from pipekit.errors import ArchiveError, CheckpointError, SkipLog, check_on_error
from pipekit.pipes._stamps import StampLog, file_stamp, same_file, upstream_strings
from pipekit.pipes._stream_items import check_pair, note_opened, reopen_stream
from pipekit.pipes.base import StreamWrapper
from pipekit.pipes.state import ResumablePipe

__all__ = ["ArchiveLoader"]


class ArchiveLoader(ResumablePipe):
    """Base of the archive loaders (``load_from_tar``, ``load_from_zip``): iteration, errors and resume.

    A subclass sets ``stage`` (its functional name) and implements
    ``_members(url, stream, skip)``, which yields ``(member_url,
    member_stream)`` for the entries of one archive after the first ``skip``
    and keeps ``self._entries`` at the number of entries gone through
    (directories and refused members included).

    Resume: the checkpoint is ``{"url": archive being read or None,
    "entries": entries of it gone through, "stamp": what the archive was}``
    (a URL with credentials or a signed query is kept without its secrets and
    with a digest of the whole, :func:`pipekit._redact.checkpoint_url`; the
    restored loader finds the URL again in the list of the pipes upstream)
    (``"size:ETag"``, ``"size:mtime"``... from the open stream, without a
    request or ``stat`` of its own; left out where the stream tells nothing,
    a decompressed or in-memory one).  A restored loader opens that archive
    again (see :mod:`pipekit.pipes._archives`), and if the reopened file's stamp is
    not the checkpoint's (the file was replaced or rewritten) raises
    :class:`~pipekit.errors.ArchiveError` naming the archive, both stamps
    and the stage, whatever ``on_error`` says: the entry count would land
    inside another file.  Otherwise it skips those entries, yields the rest,
    then goes on with the next archives from upstream.  Where a resume reads
    archives again (a replayed pipeline, a ``cycle``), each archive opened is
    also stamped in the epoch's log (:mod:`pipekit.pipes._stamps`): one read
    before the checkpoint and changed since is refused when read again.

    Args:
        datapipe: a pipe yielding ``(url, binary stream)`` tuples.
        length: the nominal length reported by ``len()`` (``-1``: none).
        on_error: ``"raise"`` or ``"skip"`` (see the loaders).
        max_member_bytes: the most bytes a member may declare (default
            :data:`~pipekit.pipes._archives.MAX_MEMBER_BYTES`, 1 GiB); a larger one is refused before
            it is read (see the loaders).
    """

    stage: ClassVar[str] = ""
    state_keys = ("url", "entries")
    stamps_files = True  # the loader gives it a StampLog where a resume reads files again (pipes/_stamps.py)
    _stamp_log: StampLog | None = None

    def __init__(self, datapipe: Iterable[tuple[str, Any]], length: int = -1, *, on_error: str = "raise",
                 max_member_bytes: int | None = None) -> None:
        super().__init__()
        if not isinstance(length, int) or isinstance(length, bool) or length < -1:
            raise ValueError(f"length must be -1 (unknown) or a non-negative int, got {length!r}")
        self.source_datapipe = datapipe
        self.length = length
        self.on_error = check_on_error(on_error)
        self.max_member_bytes = check_int(max_member_bytes, "max_member_bytes", self.stage, minimum=1,
                                          allow_none=True)
        self.skip_log = SkipLog(self.stage)
        self._url: str | None = None
        self._entries = 0
        self._stamp: str | None = None  # _url's stamp (see file_stamp)
        self._resume: tuple[str, int, str | None] | None = None

    @property
    def datapipe(self) -> Iterable[tuple[str, Any]]:
        """The upstream pipe (torchdata's attribute name; same as ``source_datapipe``)."""
        return self.source_datapipe

    # -- resume --------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        if self._stamp is None:
            return {"url": self._url, "entries": self._entries}
        return {"url": self._url, "entries": self._entries, "stamp": self._stamp}

    def check_state(self, state: dict[str, Any]) -> None:
        if state["url"] is not None and not isinstance(state["url"], str):
            raise ValueError(f"not a {type(self).__name__} state (url is not a str): {state!r:.200}")
        try:
            int(state["entries"])
        except (TypeError, ValueError):
            raise ValueError(f"not a {type(self).__name__} state (entries is not a count): {state!r:.200}") from None

    def restore(self, state: dict[str, Any] | None) -> None:
        self._url, self._entries, self._stamp = None, 0, None
        if state is None or state["url"] is None:
            self._resume = None
        else:
            stamp = state.get("stamp")
            self._resume = (state["url"], int(state["entries"]), stamp if isinstance(stamp, str) else None)

    # -- iteration -----------------------------------------------------------------------------------

    def _members(self, url: str, stream: Any, skip: int) -> Iterator[tuple[str, Any]]:
        raise NotImplementedError(f"{type(self).__name__} must implement _members(url, stream, skip)")

    def _fail(self, exc: ArchiveError) -> None:
        if self.on_error == "raise":
            raise exc
        self.skip_log.record(exc)

    def _warn_empty(self, url: str) -> None:
        """Say (once per archive and pipe) that an archive holds no file: not mistaken for data read."""
        warned = self.__dict__.setdefault("_warned_empty", set())
        if url in warned:
            return
        warned.add(url)
        warnings.warn(f"{self.stage}: {redact_url(url)!r} holds no files (members that are files); it yields nothing",
                      UserWarning, stacklevel=3)

    def member_limit(self) -> int:
        """The per-member byte limit: ``max_member_bytes``, else :data:`~pipekit.pipes._archives.MAX_MEMBER_BYTES`."""
        return self.max_member_bytes if self.max_member_bytes is not None else _archives.MAX_MEMBER_BYTES

    def _too_large(self, url: str, name: str, size: int) -> bool:
        """Refuse (raise, or count under skip) a member declaring more than the limit, before it is read."""
        limit = self.member_limit()
        if size <= limit:
            return False
        self._fail(ArchiveError(
            "load member", url, self.stage,
            f"member {name!r} declares {size:,} bytes, over max_member_bytes={limit:,} (a decompression bomb?); "
            f"if the archive is trusted, pass a larger max_member_bytes= to {self.stage}",
        ))
        return True

    def _member_url(self, url: str, name: str) -> str:
        if "/" not in name and "\\" not in name and name not in ("", ".", ".."):
            return url + "/" + name  # a plain file name: normpath would return it as it is
        return url + "/" + posixpath.normpath(name.replace("\\", "/")).lstrip("/")

    def _url_of(self, key: str) -> str:
        """The archive URL a checkpoint names by ``key`` (:func:`~pipekit._redact.checkpoint_url`).

        A URL with credentials is kept without them in the checkpoint: it is found again among the URLs
        and roots the pipes upstream hold (an ``IterableWrapper``'s list, a lister's roots).
        """
        url = resolve_checkpoint_url(key, upstream_strings(self.source_datapipe))
        if url is None:
            raise ArchiveError(
                "reopen archive", shown_url(key), self.stage,
                "the checkpoint holds this URL without its credentials, and no URL or root of the pipeline's "
                "source matches it: resume with the pipeline the checkpoint was taken from",
            )
        return url

    def _load(self, url: str, stream: Any, skip: int, stamp: str | None = None) -> Iterator[tuple[str, Any]]:
        self._url, self._entries = checkpoint_url(url), skip  # the position: no credentials in clear
        self._stamp = stamp if stamp is not None else file_stamp(stream)
        if self._stamp_log is not None:
            try:
                self._stamp_log.note(url, self._stamp, self.stage)
            except CheckpointError:
                stream.close()
                raise
        note_opened(url, self.stage)
        skipped, yielded = self.skip_log.count, 0
        # looked up now: a generator left inside an archive may be finalised at interpreter exit, once this
        # module's globals are None, and its cleanup must not look them up (nor match ``except ArchiveError``)
        autoclose = stream.autoclose if isinstance(stream, StreamWrapper) else None
        try:
            for member in self._members(url, stream, skip):
                yielded += 1
                yield member
            if not (yielded or skip or self.skip_log.count != skipped):
                self._warn_empty(url)
        except GeneratorExit:
            raise
        except ArchiveError as exc:
            self._fail(exc)
        finally:
            if autoclose is not None:
                autoclose()  # closes now, or when the last member stream is closed
        self._url, self._entries, self._stamp = None, 0, None

    def __iter__(self) -> Iterator[tuple[str, StreamWrapper]]:
        yield from self._archive_members()

    def _archive_members(self) -> Iterator[tuple[str, Any]]:
        """The members of the archive to continue (after a restore), then of each archive from upstream.

        A plain method, not ``__iter__``, so a subclass's ``__iter__`` can go
        through the members without starting a second iterator of this pipe.
        """
        resume, self._resume = self._resume, None  # the archive to continue, set by restore()
        if resume is not None:
            key, entries, stamp = resume
            try:
                url = self._url_of(key)
                stream = reopen_stream(self.source_datapipe, url, self.stage)
            except ArchiveError as exc:
                self._fail(exc)
            else:
                now = file_stamp(stream) if stamp is not None else None
                if now is not None and not same_file(stamp, now):
                    stream.close()
                    raise ArchiveError(
                        "resume archive", url, self.stage,
                        f"the file changed since the checkpoint (size:version {stamp} then, {now} now): its "
                        f"{entries} entries gone through would be counted in another file; resume from a "
                        "checkpoint taken on this file, or start the epoch over",
                    )
                yield from self._load(url, stream, entries, now)
        for item in self.source_datapipe:
            url, stream = check_pair(item, self.stage)
            yield from self._load(url, stream, 0)

    def __len__(self) -> int:
        if self.length == -1:
            raise TypeError(f"{type(self).__name__} instance doesn't have valid length")
        return self.length


# The default per-member limit is a setting of the loaders' module (``pipekit.pipes._archives.MAX_MEMBER_BYTES``,
# read at each member, so setting it there changes the default); that module imports this one, so it comes last.
from pipekit.pipes import _archives  # noqa: E402
