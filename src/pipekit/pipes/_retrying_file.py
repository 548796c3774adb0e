"""``RetryingFile``: a binary file object that reopens its remote file and seeks back when a read fails transiently.

:class:`~pipekit.pipes.FSSpecFileOpener` (``open_files_by_fsspec``) wraps remote binary streams in it; it is
importable from :mod:`pipekit.pipes._fsspec_io` too.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from typing import Any

from pipekit.retry import RetryPolicy


class RetryingFile(io.RawIOBase):
    """A binary file object that survives transient failures of the remote file under it.

    Reads go to ``open_fn()``'s file; when one fails transiently (see
    :func:`pipekit.retry.is_transient`), the file is opened again with
    ``open_fn`` and sought to the byte offset this object had reached, and
    the read is tried again, under ``policy``'s budget.  So a reader streaming
    through it (``load_from_tar``) neither loses nor repeats a byte across a
    server restart.  When the budget runs out,
    :class:`~pipekit.errors.ReadError` names ``url``, ``stage`` and the
    attempts.  Attributes it does not define (``size``, ``path``...) come
    from the current underlying file.

    Example:
        >>> import fsspec
        >>> from pipekit.retry import RetryPolicy
        >>> fsspec.filesystem("memory").pipe("/retrying_doc/a.bin", b"0123456789")
        >>> opened = []
        >>> class Flaky(io.BytesIO):  # its first read fails as if the connection were reset
        ...     def read(self, size=-1):
        ...         if len(opened) == 1:
        ...             raise ConnectionResetError(104, "Connection reset by peer")
        ...         return super().read(size)
        >>> def open_fn():
        ...     opened.append(1)
        ...     return Flaky(fsspec.filesystem("memory").cat("/retrying_doc/a.bin"))
        >>> f = RetryingFile(open_fn, "memory://retrying_doc/a.bin", "doc", RetryPolicy(base_delay=0.001))
        >>> f.read(4), f.read(), len(opened)
        (b'0123', b'456789', 2)
    """

    def __init__(self, open_fn: Callable[[], Any], url: str, stage: str, policy: RetryPolicy,
                 file: Any = None) -> None:
        super().__init__()
        self._open_fn = open_fn
        self._url = url
        self._stage = stage
        self._policy = policy
        self._pos = 0
        self._file = file if file is not None else policy.call(open_fn, action="open", url=url, stage=stage)
        self.name = url

    def _recover(self) -> None:
        old, self._file = self._file, None
        with contextlib.suppress(Exception):  # the broken file's own close may fail the same way
            old.close()
        file = self._open_fn()
        if self._pos:
            file.seek(self._pos)
        self._file = file

    def _call(self, fn: Callable[[], Any], action: str = "read") -> Any:
        return self._policy.call(fn, action=action, url=self._url, stage=self._stage, recover=self._recover)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        if self._file is None:
            self._recover_or_raise()
        data = self._call(lambda: self._file.read(-1 if size is None else size))
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)

    def _recover_or_raise(self) -> None:
        if self.closed:
            raise ValueError("I/O operation on closed file")
        # the budget ran out while reopening earlier: reopen before going on
        self._policy.call(self._recover, action="open", url=self._url, stage=self._stage)

    def seek(self, offset: int, whence: int = 0) -> int:
        if self._file is None:
            self._recover_or_raise()
        self._pos = self._call(lambda: self._file.seek(offset, whence), action="seek")
        return self._pos

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        if not self.closed:
            file, self._file = self._file, None
            if file is not None:
                file.close()
        super().close()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        file = self.__dict__.get("_file")
        if file is None:
            raise AttributeError(name)
        return getattr(file, name)
