"""A local copy of each remote shard: ``TarShards(cache_dir=...)``.

Remote shards (S3, HTTP, any fsspec URL) are copied whole into ``cache_dir``
the first time they are opened and read from the local copy afterwards, as
the ``webdataset`` library's ``cache_dir`` and LitData's chunk cache do.
Unlike those, each open checks the copy against the remote object (its size
and ETag or modification time, one metadata request per shard and epoch), so
a shard replaced on the server is fetched again rather than read stale.

A stream read from a copy is stamped (:mod:`pipekit.pipes._stamps`) as the
object's version, not the copy's: a checkpoint taken mid-shard, or in a
pipeline whose resume reads shards again, resumes where the copy was made
again (another machine's empty ``cache_dir``) and refuses a shard changed on
the server since.  Only an object that tells no version (neither ETag nor
modification time) is stamped as its copy (refused if copied again: there is
no telling).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import posixpath
from typing import Any

from pipekit._fs import local_path, url_to_fs
from pipekit.errors import ReadError
from pipekit.pipes._disk_cache import _write_atomic
from pipekit.pipes._fsspec_io import FSSpecFileOpener
from pipekit.pipes.base import IterDataPipe, StreamWrapper

logger = logging.getLogger("pipekit")

STAGE = "TarShards cache"


def _stamp(url: str, info: dict[str, Any]) -> dict[str, Any]:
    """What identifies a version of the remote object: its size and ETag / modification time, as fsspec reports them."""
    version = None
    for key in ("ETag", "etag", "LastModified", "Last-Modified", "last_modified", "mtime", "updated"):
        if info.get(key) is not None:
            version = f"{key}={info[key]}"
            break
    return {"url": url, "size": info.get("size"), "version": version}


class _CopyOf(io.BufferedReader):
    """A local copy, read as ``open(path, "rb")`` reads it, whose ``details`` are the remote object's version.

    :func:`~pipekit.pipes._stamps.file_stamp` reads ``details`` as it does on fsspec's remote files: the
    stamp is ``"size:ETag=..."`` of the object, the same for every copy of one version of it.
    """

    def __init__(self, raw: io.FileIO, stamp: dict[str, Any]) -> None:
        super().__init__(raw)
        self.details = {"size": stamp["size"], "ETag": stamp["version"]}


class CachedShardOpener(FSSpecFileOpener):
    """``open_files_by_fsspec(mode="rb")`` that reads remote files from whole local copies in ``cache_dir``.

    Yields ``(url, stream)`` with the original URL (sample keys do not
    change), the stream reading the local copy.  A copy is made the first time
    a URL is opened: the remote file is read through the opener's retrying
    stream into a temporary file in ``cache_dir``, its size checked against
    the remote object's, and renamed into place with a small JSON record of
    the object's size and version next to it.  Each later open asks the
    storage for the object's metadata (retried like reads) and uses the copy
    only when it matches; otherwise the copy is made again.  Processes that
    copy the same shard at once (workers of different jobs) each write their
    own temporary file and the last rename wins, so a reader never sees a
    partial copy.  Local paths are opened in place.  ``reopen(url)`` (used by
    ``load_from_tar`` to resume) goes through the cache too.

    Errors name the URL and the stage ``"TarShards cache"`` (a missing object,
    a copy cut short, a full disk).
    """

    def __init__(
        self, source_datapipe: IterDataPipe[str], cache_dir: str | os.PathLike[str], storage_options: dict[str, Any]
    ) -> None:
        super().__init__(source_datapipe, mode="rb", storage_options=storage_options or None)
        self.cache_dir = os.fspath(cache_dir)

    def _opener(self) -> Any:
        return self.reopen

    def reopen(self, url: str) -> StreamWrapper:
        if not isinstance(url, str) or local_path(url) is not None:
            return super().reopen(url)
        local, stamp = self._up_to_date_copy(url)
        try:
            if stamp["version"] is None:  # stamped as the copy: its size and mtime
                file = open(local, "rb")  # noqa: SIM115 - closed downstream
            else:
                file = _CopyOf(io.FileIO(local, "rb"), stamp)
        except OSError as exc:
            raise ReadError("open", local, STAGE, exc) from exc
        return StreamWrapper(file, name=url)

    def path_for(self, url: str) -> str:
        """Where the copy of ``url`` lives: a hash of the URL and the object's name, in ``cache_dir``."""
        name = posixpath.basename(url.split("?", 1)[0].rstrip("/")) or "shard"
        return os.path.join(self.cache_dir, f"{hashlib.sha1(url.encode()).hexdigest()[:16]}-{name}")

    def local_copy(self, url: str) -> str:
        """The path of an up-to-date local copy of ``url``, made now if there is none."""
        return self._up_to_date_copy(url)[0]

    def _up_to_date_copy(self, url: str) -> tuple[str, dict[str, Any]]:
        """:meth:`local_copy`, and the object's stamp (:func:`_stamp`) the copy is of."""
        try:
            fs, path = url_to_fs(url, self.kwargs_for_connection)
            info = self.retry.call(lambda: fs.info(path), action="stat", url=url, stage=STAGE)
        except ReadError:
            raise
        except Exception as exc:  # a missing object, refused credentials...
            raise ReadError("stat", url, STAGE, exc) from exc
        stamp = _stamp(url, info)
        local = self.path_for(url)
        record = local + ".json"
        try:
            with open(record) as f:
                cached = json.load(f)
            if cached == stamp and os.path.getsize(local) == stamp["size"]:
                return local, stamp
        except (OSError, ValueError):
            pass  # no copy yet, or one cut short by a crash: make it (below)
        self._copy(url, local, stamp)
        return local, stamp

    def _copy(self, url: str, local: str, stamp: dict[str, Any]) -> None:
        """Copy ``url`` to ``local`` (atomically), then its record: the record is what makes the copy count."""
        try:
            os.makedirs(self.cache_dir, exist_ok=True)
        except OSError as exc:
            raise ReadError("copy", url, STAGE, f"{exc} (the cache folder {self.cache_dir!r})") from exc
        source = super().reopen(url)  # the opener's retrying stream: a dropped connection continues
        _write_atomic(local, source, binary=True, stage=STAGE)  # reads the stream through, closes it
        written = os.path.getsize(local)
        if stamp["size"] is not None and written != stamp["size"]:
            problem = f"copied {written} bytes, the object has {stamp['size']} (it changed or was cut)"
            raise ReadError("copy", url, STAGE, problem)  # no record: the next open copies it again
        _write_atomic(local + ".json", json.dumps(stamp), binary=False, stage=STAGE)
        logger.debug("TarShards: copied %s to %s (%d bytes)", url, local, written)
