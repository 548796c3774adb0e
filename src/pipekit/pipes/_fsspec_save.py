"""Save files on any filesystem fsspec supports: ``save_by_fsspec`` (:class:`FSSpecSaver`) and ``save_to_disk``.

Split from :mod:`pipekit.pipes._fsspec_io` (which imports both classes back, so they are importable there as
before); the filesystems, storage options and timeouts are that module's.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from pipekit._fs import fs_is_local, url_to_fs
from pipekit.errors import ReadError
from pipekit.pipes._fsspec_io import _OBJECT_STORES, _protocols, _reason, _storage_options
from pipekit.pipes.base import IterDataPipe, functional_datapipe

__all__ = ["FSSpecSaver", "Saver"]

@functional_datapipe("save_by_fsspec")
class FSSpecSaver(IterDataPipe[str]):
    """Write ``(meta, data)`` items to files and yield the paths written.

    The target is ``filepath_fn(meta)`` (or ``meta`` itself when
    ``filepath_fn`` is ``None``); missing parent directories are created.
    Writes are atomic where the filesystem allows it, so a reader never sees a
    half-written file: local files (and other filesystems with directories)
    are written under a temporary name in the same directory and then renamed;
    object stores (S3, GCS, Azure, memory) only create the object when the
    upload completes.  Append modes (``"a"``, ``"ab"``) write in place.

    Args:
        source_datapipe: a pipe yielding ``(meta, data)`` tuples; ``data`` is
            ``bytes`` for binary modes and ``str`` for text modes.
        mode: ``"w"`` (text, the default, as in torchdata), ``"wb"``, ``"a"``
            or ``"ab"``.
        filepath_fn: maps ``meta`` to the target path or URL.
        kwargs_for_open: extra arguments for ``fs.open()`` (``encoding``...).
        storage_options: fsspec storage options (merged with ``kwargs``).
        kwargs: more storage options (credentials, ``client_kwargs``...).

    Write failures raise :class:`~pipekit.errors.ReadError` naming the path
    and ``save_by_fsspec``.  The pipe is stateless for resume.

    Example:
        >>> import fsspec
        >>> from pipekit.pipes import IterableWrapper
        >>> items = IterableWrapper([("1.txt", b"DATA1"), ("2.txt", b"DATA2")])
        >>> list(items.save_by_fsspec(mode="wb", filepath_fn=lambda name: "memory://saver_doc/" + name))
        ['memory://saver_doc/1.txt', 'memory://saver_doc/2.txt']
        >>> fsspec.filesystem("memory").cat("/saver_doc/2.txt")
        b'DATA2'
    """

    stateless = True

    def __init__(
        self,
        source_datapipe: IterDataPipe[tuple[Any, bytes | bytearray | str]],
        mode: str = "w",
        filepath_fn: Callable[[Any], str] | None = None,
        *,
        kwargs_for_open: dict[str, Any] | None = None,
        storage_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(mode, str) or mode not in ("w", "wb", "wt", "a", "ab", "at"):
            raise ValueError(f'mode must be "w", "wb", "wt", "a", "ab" or "at", got {mode!r}')
        if filepath_fn is not None and not callable(filepath_fn):
            raise TypeError(f"filepath_fn must be callable or None, got {type(filepath_fn).__name__}")
        if kwargs_for_open is not None and not isinstance(kwargs_for_open, dict):
            raise TypeError(f"kwargs_for_open must be a dict or None, got {type(kwargs_for_open).__name__}")
        self.source_datapipe = source_datapipe
        self.mode = mode
        self.filepath_fn = filepath_fn
        self.kwargs_for_open: dict[str, Any] = dict(kwargs_for_open or {})
        self.kwargs_for_connection = _storage_options(storage_options, kwargs)

    def _check_data(self, filepath: str, data: Any) -> None:
        binary = "b" in self.mode
        ok = isinstance(data, bytes | bytearray | memoryview) if binary else isinstance(data, str)
        if not ok:
            need = "bytes" if binary else "str"
            raise TypeError(
                f"save_by_fsspec: data for {filepath!r} is {type(data).__name__}, "
                f"but mode {self.mode!r} writes {need}"
            )

    def _write(self, filepath: str, data: Any) -> None:
        fs, path = url_to_fs(filepath, self.kwargs_for_connection)
        if "a" in self.mode or set(_protocols(fs)) & _OBJECT_STORES:
            if fs_is_local(fs) or not set(_protocols(fs)) & _OBJECT_STORES:
                fs.makedirs(fs._parent(path), exist_ok=True)
            with fs.open(path, self.mode, **self.kwargs_for_open) as f:
                f.write(data)
            return
        parent = fs._parent(path)
        fs.makedirs(parent, exist_ok=True)
        tmp = posixpath.join(parent, f".{posixpath.basename(path)}.{uuid.uuid4().hex}.pipekit-tmp")
        try:
            with fs.open(tmp, self.mode, **self.kwargs_for_open) as f:
                f.write(data)
            if fs_is_local(fs):
                os.replace(tmp, path)  # atomic on POSIX and Windows
            else:
                fs.mv(tmp, path)
        except BaseException:
            try:
                if fs.exists(tmp):
                    fs.rm(tmp)
            except Exception:  # best effort; the original error matters
                pass
            raise

    def __iter__(self) -> Iterator[str]:
        for item in self.source_datapipe:
            if not isinstance(item, tuple | list) or len(item) != 2:
                raise TypeError(f"save_by_fsspec: expected (meta, data) tuples, got {type(item).__name__}")
            meta, data = item
            filepath = meta if self.filepath_fn is None else self.filepath_fn(meta)
            if not isinstance(filepath, str):
                raise TypeError(
                    f"save_by_fsspec: the target path must be a str, got {type(filepath).__name__}: {filepath!r}"
                )
            self._check_data(filepath, data)
            try:
                self._write(filepath, data)
            except Exception as exc:
                raise ReadError("write", filepath, "save_by_fsspec", _reason(exc)) from exc
            yield filepath

    def __len__(self) -> int:
        return len(self.source_datapipe)  # type: ignore[arg-type]


@functional_datapipe("save_to_disk")
class Saver(IterDataPipe[str]):
    """Write ``(meta, data)`` items to local files and yield the paths written (functional name: ``save_to_disk``).

    The target is ``filepath_fn(meta)`` (or ``meta`` itself when
    ``filepath_fn`` is ``None``); missing parent directories are created and
    an existing file is replaced.  Each file is written under a temporary
    name in the target's directory and then renamed over the target
    (``os.replace``), so a reader never sees a half-written file and a failed
    write leaves the old file intact.  For other filesystems use
    :class:`FSSpecSaver` (``save_by_fsspec``).

    Args:
        source_datapipe: a pipe yielding ``(meta, data)`` tuples; ``data`` is
            ``bytes`` for binary modes and ``str`` for text modes.
        mode: ``"w"`` (text, the default, as in torchdata), ``"wb"`` or
            ``"wt"``; torchdata's shorthands ``"b"`` and ``"t"`` mean ``"wb"``
            and ``"wt"``.
        filepath_fn: maps ``meta`` to the target path (a ``str`` or
            ``os.PathLike``).

    Yields each target path as a ``str``, as given (relative paths stay
    relative).  Write failures raise :class:`~pipekit.errors.ReadError` naming
    the path and ``save_to_disk``.  The pipe is stateless for resume.

    Example:
        >>> import os, tempfile
        >>> from pipekit.pipes import IterableWrapper
        >>> root = tempfile.mkdtemp()
        >>> def filepath_fn(name: str) -> str:
        ...     return os.path.join(root, os.path.basename(name))
        >>> name_to_data = {"1.txt": b"DATA1", "2.txt": b"DATA2", "3.txt": b"DATA3"}
        >>> source_dp = IterableWrapper(sorted(name_to_data.items()))
        >>> saver_dp = source_dp.save_to_disk(filepath_fn=filepath_fn, mode="wb")
        >>> res_file_paths = list(saver_dp)
        >>> [os.path.relpath(p, root) for p in res_file_paths]
        ['1.txt', '2.txt', '3.txt']
        >>> open(res_file_paths[1], "rb").read()
        b'DATA2'
    """

    stateless = True

    def __init__(
        self,
        source_datapipe: IterDataPipe[tuple[Any, bytes | bytearray | str]],
        mode: str = "w",
        filepath_fn: Callable[[Any], str | os.PathLike] | None = None,
    ) -> None:
        if not isinstance(mode, str) or mode not in ("w", "wb", "wt", "b", "t"):
            raise ValueError(f'mode must be "w", "wb" or "wt" (or torchdata\'s "b", "t"), got {mode!r}')
        if filepath_fn is not None and not callable(filepath_fn):
            raise TypeError(f"filepath_fn must be callable or None, got {type(filepath_fn).__name__}")
        self.source_datapipe = source_datapipe
        self.mode = mode if "w" in mode else "w" + mode
        self.filepath_fn = filepath_fn

    def _write(self, path: str, data: bytes | bytearray | memoryview | str) -> None:
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        tmp = os.path.join(parent, f".{os.path.basename(path)}.{uuid.uuid4().hex}.pipekit-tmp")
        try:
            with open(tmp, self.mode.replace("w", "x")) as f:  # "x": never clobber another writer's file
                f.write(data)
            os.replace(tmp, path)  # atomic on POSIX and Windows
        except BaseException:
            with contextlib.suppress(OSError):  # best effort (it may not exist); the original error matters
                os.unlink(tmp)
            raise

    def __iter__(self) -> Iterator[str]:
        binary = "b" in self.mode
        for item in self.source_datapipe:
            if not isinstance(item, tuple | list) or len(item) != 2:
                raise TypeError(f"save_to_disk: expected (meta, data) tuples, got {type(item).__name__}")
            meta, data = item
            target = meta if self.filepath_fn is None else self.filepath_fn(meta)
            if not isinstance(target, str | os.PathLike):
                raise TypeError(
                    f"save_to_disk: the target path must be a str or os.PathLike, "
                    f"got {type(target).__name__}: {target!r}"
                )
            path = os.fspath(target)
            if not isinstance(path, str):
                raise TypeError(f"save_to_disk: the target path must be a str, got bytes: {path!r}")
            ok = isinstance(data, bytes | bytearray | memoryview) if binary else isinstance(data, str)
            if not ok:
                need = "bytes" if binary else "str"
                raise TypeError(
                    f"save_to_disk: data for {path!r} is {type(data).__name__}, but mode {self.mode!r} writes {need}"
                )
            if not path or path.endswith(("/", os.sep)):
                raise ReadError("write", path, "save_to_disk", "the target path names no file")
            try:
                self._write(path, data)
            except Exception as exc:
                raise ReadError("write", path, "save_to_disk", _reason(exc)) from exc
            yield path

    def __len__(self) -> int:
        return len(self.source_datapipe)  # type: ignore[arg-type]
