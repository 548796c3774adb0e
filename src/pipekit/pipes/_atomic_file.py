"""Files written atomically: under a hidden temporary name beside the final one, moved into place when complete.

Used for tar shards and their indexes (:mod:`pipekit.pipes._shard_writer`,
:mod:`pipekit.pipes._shard_index`): ``os.replace`` on a local disk; on S3 and
other fsspec filesystems the finished temporary object is moved, which S3 does
as one server-side copy.
"""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
import uuid
from collections.abc import Mapping
from typing import IO, Any

from pipekit._fs import url_to_fs
from pipekit.errors import ReadError

__all__: list[str] = []

logger = logging.getLogger("pipekit")


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


class _AtomicFile:
    """One output file written under a hidden temporary name beside its final name, moved there by ``publish()``."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None, stage: str) -> None:
        self.url = url
        self.stage = stage
        try:
            self.fs, self.path = url_to_fs(url, storage_options)
        except Exception as exc:
            raise ReadError("open", url, stage, f"{type(exc).__name__}: {exc}") from exc
        self.local = "file" in _protocols(self.fs)
        join, split = (os.path.join, os.path.split) if self.local else (posixpath.join, posixpath.split)
        parent, name = split(self.path)
        self.parent = parent
        self.tmp = join(parent, f".{name}.tmp-{uuid.uuid4().hex}")
        self.file: IO[bytes] | None = None

    def open(self) -> IO[bytes]:
        try:
            if self.local:
                if self.parent:
                    os.makedirs(self.parent, exist_ok=True)
                self.file = open(self.tmp, "xb")  # noqa: SIM115 (closed by publish() or discard())
            else:
                self.file = self.fs.open(self.tmp, "wb")
        except Exception as exc:
            raise ReadError("write", self.url, self.stage, f"{type(exc).__name__}: {exc}") from exc
        return self.file  # type: ignore[return-value]

    def publish(self) -> None:
        """Close the temporary file and move it to the final name."""
        file, self.file = self.file, None
        if file is None:
            return
        try:
            if self.local:
                file.flush()
                os.fsync(file.fileno())
                file.close()
                os.replace(self.tmp, self.path)  # atomic on POSIX and Windows
            else:
                file.close()  # the temporary object is complete
                self.fs.mv(self.tmp, self.path)
        except BaseException as exc:
            self._remove_tmp(file)
            if isinstance(exc, Exception):
                raise ReadError("write", self.url, self.stage, f"{type(exc).__name__}: {exc}") from exc
            raise

    def discard(self) -> None:
        """Close and remove the temporary file; nothing appears under the final name."""
        file, self.file = self.file, None
        if file is not None:
            self._remove_tmp(file)

    def _remove_tmp(self, file: IO[bytes]) -> None:
        try:
            file.close()  # for object stores this uploads the temporary object, removed just below
        except Exception as exc:
            logger.warning("%s: could not close the temporary file %r of %r: %s", self.stage, self.tmp, self.url, exc)
        try:
            if self.local:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.tmp)
            elif self.fs.exists(self.tmp):
                self.fs.rm(self.tmp)
        except Exception as exc:  # the error that led here matters more; say what is left behind
            logger.warning("%s: could not remove the temporary file %r: %s", self.stage, self.tmp, exc)
