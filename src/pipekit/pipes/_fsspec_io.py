"""List, open and save files on any filesystem fsspec supports.

Local paths, ``file://``, ``memory://``, ``s3://`` (with ``s3fs``), ``http(s)://``
and chained URLs (``simplecache::s3://...``) all work the same way; storage
options (credentials, endpoints) are passed as keyword arguments, exactly like
torchdata's ``FSSpecFileLister``/``FSSpecFileOpener``/``FSSpecSaver``::

    urls = FSSpecFileLister("s3://bucket/shards", masks="*.tar", key=..., secret=...)
    streams = urls.open_files_by_fsspec(mode="rb", key=..., secret=...)

Streams are yielded wrapped in torch's :class:`StreamWrapper` (re-exported
here, as ``torchdata.datapipes.utils.StreamWrapper`` was), which closes the file
when the wrapper is closed or garbage collected.
"""

from __future__ import annotations

import io
import os
import stat
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from fsspec.implementations.local import LocalFileSystem as _LocalFileSystem

from pipekit._fs import fs_is_local, listing_change, listing_record, local_path, url_to_fs
from pipekit._redact import checkpoint_url, redact_secrets, resolve_checkpoint_url, shown_url
from pipekit.errors import ReadError, SkipLog, check_on_error
from pipekit.pipes._builtin import IterableWrapper
from pipekit.pipes._list_match import _join_url, _matcher, _scan_local
from pipekit.pipes._opening import is_http, open_each, open_http
from pipekit.pipes._retrying_file import RetryingFile
from pipekit.pipes._stamps import StampLog, upstream_strings
from pipekit.pipes.base import IterDataPipe, StreamWrapper, functional_datapipe
from pipekit.pipes.state import ResumablePipe
from pipekit.retry import RetryPolicy, resolve_retry, with_timeouts

# RetryingFile is imported from this module, not re-exported by pipekit.pipes (whose export list is locked);
# open_each (the loop of the opening pipes) too, from pipekit.pipes._opening
__all__ = ["FSSpecFileLister", "FSSpecFileOpener", "FSSpecSaver", "Saver", "StreamWrapper"]

# Object stores write an object only when the file is closed (a single PUT or a
# completed multipart upload), so a reader never sees a partial object.
_OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss", "memory"})


# A forked process (a DataLoader worker) inherits the parent's s3fs instances, cached by fsspec or
# garbage not yet collected.  fsspec drops its cache in the child; when such an instance is then
# collected there, s3fs's finalizer (``S3FileSystem.close_session``) closes the parent's aiohttp
# session -- created on the parent's event loop -- from the child: if the child's own fsspec loop is
# running at that moment, the close becomes a task on the child's loop and fails with "Task
# exception was never retrieved ... got Future attached to a different loop".  The child never uses
# those sessions (their loop belongs to the parent), so their finalizers are detached after a fork;
# the parent still closes its sessions.  (Closing the connector from the child is no option either:
# its transports would unregister the parent's sockets from the epoll instance both processes share.)
def _detach_inherited_session_finalizers() -> None:  # runs in a forked child
    registry = getattr(weakref.finalize, "_registry", None)
    if not isinstance(registry, dict):
        _S3_FILESYSTEMS.clear()
        return
    for finalizer, info in list(registry.items()):
        func = getattr(info, "func", None)
        if getattr(func, "__module__", "").startswith("s3fs") and getattr(func, "__name__", "") == "close_session":
            finalizer.detach()
    _S3_FILESYSTEMS.clear()  # the parent's (their loop and sessions are the parent's), finalizers detached


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_detach_inherited_session_finalizers)


# Local roots are listed with os.scandir where that gives exactly what fsspec's local filesystem
# lists (POSIX paths: on Windows fsspec rewrites separators and drives).
_FAST_LOCAL = os.sep == "/"


def _protocols(fs: Any) -> tuple[str, ...]:
    proto = fs.protocol
    return (proto,) if isinstance(proto, str) else tuple(proto)


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _storage_options(storage_options: dict[str, Any] | None, kwargs: dict[str, Any]) -> dict[str, Any]:
    if storage_options is not None and not isinstance(storage_options, dict):
        raise TypeError(f"storage_options must be a dict or None, got {type(storage_options).__name__}")
    return {**(storage_options or {}), **kwargs}


# s3fs filesystems of the listing and opening pipes, per process and storage options (see _remote_fs)
_S3_FILESYSTEMS: dict[tuple[int, str], Any] = {}


def _remote_fs(url: str, storage_options: dict[str, Any]) -> tuple[Any, str]:
    """``(filesystem, path)`` for ``url``, reads bounded by :func:`pipekit.retry.with_timeouts`.

    A plain ``s3://`` URL gets a filesystem of its own (one per process and storage options) that
    tries each request once: s3fs retries a timed-out request 5 times, and 5 times more around
    each file read, so a silent server held a read for 25 read timeouts before pipekit's
    :class:`~pipekit.retry.RetryPolicy` (with its warning) could act; here a try is one request.
    fsspec's shared instance, which the user's own code may hold, is left as it is.
    """
    options = with_timeouts(url, storage_options)
    if "::" in url or not url.startswith(("s3://", "s3a://")):
        return url_to_fs(url, options)
    from fsspec.utils import tokenize

    key = (os.getpid(), tokenize(options))
    fs = _S3_FILESYSTEMS.get(key)
    if fs is None:
        fs, _ = url_to_fs(url, {**options, "skip_instance_cache": True})
        fs.retries = 1  # an instance attribute over s3fs's class default of 5
        _S3_FILESYSTEMS[key] = fs
    return fs, fs._strip_protocol(url)


@functional_datapipe("list_files_by_fsspec")
class FSSpecFileLister(ResumablePipe):
    """List the files under one or more roots, on any filesystem fsspec supports.

    For each root, yields the URL of every file in it, in sorted order, with
    the root's protocol kept: ``s3://bucket/dir`` lists ``s3://bucket/dir/a``,
    ``memory://d`` lists ``memory:///d/a`` and a plain local path lists plain
    absolute paths.  A root that is a file yields itself.  Directories are not
    yielded (with ``recursive=True`` their files are).

    Args:
        root: a root URL, a list of them, or a pipe yielding them.
        masks: a Unix shell pattern or a list of them (``"*.tar"``); a file is
            kept if any pattern matches.  Patterns without ``/`` match the file
            name, patterns with ``/`` the full listed path.  ``""`` keeps all.
        recursive: also list the files in sub-directories.
        on_error: ``"raise"`` (default) raises :class:`~pipekit.errors.ReadError`
            for a missing or unreadable root; ``"skip"`` records it in
            ``self.skip_log`` and goes on.
        retry: how a listing that fails transiently (a server restart,
            throttling) is retried: a :class:`~pipekit.retry.RetryPolicy`,
            an int (attempts), ``False`` (never) or ``None`` (the default
            policy, see :mod:`pipekit.retry`).  A missing root is not retried.
        storage_options: fsspec storage options (merged with ``kwargs``).
            ``s3://`` and ``http(s)://`` reads wait at most 5 s to connect and
            15 s for the next bytes (:data:`pipekit.retry.DEFAULT_CONNECT_TIMEOUT`,
            :data:`~pipekit.retry.DEFAULT_READ_TIMEOUT`, set by ``PIPEKIT_CONNECT_TIMEOUT``
            and ``PIPEKIT_READ_TIMEOUT``; per pipe by s3fs's ``config_kwargs``
            ``connect_timeout``/``read_timeout`` or HTTP's ``client_kwargs["timeout"]``),
            then fail the try, which ``retry`` retries (see :func:`pipekit.retry.with_timeouts`).
        kwargs: more storage options (credentials, ``client_kwargs``...).

    A root that is an empty folder, or whose files all miss ``masks``, yields
    nothing: the pipe warns (a ``UserWarning`` naming the folder and the
    masks) the first time it lists that root, so a wrong path or pattern is
    not mistaken for an empty epoch.

    Resume: the checkpoint is ``{"root": the root being listed, "last": the
    last URL yielded, "digest": a 128-bit hash of that root's listing,
    "count": its number of files, "names": the listing, zlib-compressed}``
    (``names`` only while it compresses to at most
    :data:`pipekit._fs.LISTING_NAMES_LIMIT` bytes, 1 MiB: the checkpoint stays
    bounded for any number of files); a restored copy lists
    that root again, continues after that URL, then lists the next roots.
    If the root's listing is not the one the checkpoint was taken on (a file
    added, deleted or renamed, read or not), resuming raises
    :class:`~pipekit.errors.ReadError` naming the root, the counts and the
    files added and gone (when the checkpoint holds the names), even
    with ``on_error="skip"``: the positions of the pipes downstream (a
    shuffle's, each DataLoader worker's share of the files) count files of
    that listing, and would repeat some and skip others.  A checkpoint
    without a digest (taken before it was recorded) resumes by name, as
    before.  A root with credentials (``http://user:password@host/dir/``,
    a signed URL) is kept, with its files, as
    :func:`~pipekit._redact.checkpoint_url` gives it: without them, with a
    digest of the whole; the resumed copy finds it again among the roots of
    its source (a root none matches is refused, naming it).

    Example:
        >>> import fsspec
        >>> fs = fsspec.filesystem("memory")
        >>> for name in ["b.txt", "a.txt", "c.csv", "sub/d.txt"]:
        ...     fs.pipe(f"/lister_doc/{name}", b"x")
        >>> list(FSSpecFileLister("memory://lister_doc", masks="*.txt"))
        ['memory:///lister_doc/a.txt', 'memory:///lister_doc/b.txt']
        >>> list(FSSpecFileLister("memory://lister_doc", masks="*.txt", recursive=True))
        ['memory:///lister_doc/a.txt', 'memory:///lister_doc/b.txt', 'memory:///lister_doc/sub/d.txt']
    """

    state_keys = ("root", "last")

    def __init__(
        self,
        root: str | Sequence[str] | IterDataPipe,
        masks: str | list[str] = "",
        *,
        recursive: bool = False,
        on_error: str = "raise",
        retry: RetryPolicy | int | bool | None = None,
        storage_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.retry = resolve_retry(retry)
        if isinstance(root, str):
            root = [root]
        if isinstance(root, IterDataPipe):
            self.source_datapipe: IterDataPipe = root
        elif isinstance(root, Sequence) and all(isinstance(r, str) for r in root):
            self.source_datapipe = IterableWrapper(list(root), deepcopy=False)
        else:
            raise TypeError(f"root must be a str, a sequence of str or an IterDataPipe, got {type(root).__name__}")
        if isinstance(masks, str):
            masks = [masks] if masks else []
        if not isinstance(masks, list | tuple) or not all(isinstance(m, str) for m in masks):
            raise TypeError(f"masks must be a str or a list of str, got {masks!r}")
        if not isinstance(recursive, bool):
            raise TypeError(f"recursive must be a bool, got {type(recursive).__name__}")
        self.masks: list[str] = [m for m in masks if m]
        self.recursive = recursive
        self.on_error = check_on_error(on_error)
        self.kwargs_for_connection = _storage_options(storage_options, kwargs)
        self.skip_log = SkipLog("list_files_by_fsspec")
        self._warned_empty: set[str] = set()  # roots already reported as holding no (matching) file
        self._root: str | None = None
        self._last: str | None = None
        self._urls: list[str] = []  # the listing of _root
        self._record: dict[str, Any] | None = None  # its checkpoint record, made by the first state_dict()
        self._resume: tuple[str, str | None, dict[str, Any]] | None = None

    @property
    def datapipe(self) -> IterDataPipe:
        """The pipe of roots (torchdata's attribute name; same as ``source_datapipe``)."""
        return self.source_datapipe

    def _list(self, root: str) -> list[str]:
        if not isinstance(root, str):
            raise TypeError(f"list_files_by_fsspec: a root must be a str, got {type(root).__name__}: {root!r}")
        if local_path(root) is not None:
            return self._list_once(root)
        return self.retry.call(lambda: self._list_once(root), action="list", url=root, stage="list_files_by_fsspec")

    def _list_once(self, root: str) -> list[str]:
        if _FAST_LOCAL and not self.kwargs_for_connection:
            local = local_path(root)
            if local is not None:
                urls = self._list_local(root, local)
                if urls is not None:
                    return urls
        try:
            fs, path = _remote_fs(root, self.kwargs_for_connection)
            if not fs_is_local(fs):
                # each listing asks the store: a listing cached by an earlier epoch (or by the checkpointed
                # run, in a resume) would hide files added, deleted or replaced since, and their new ETags
                fs.invalidate_cache(path)
            try:
                info = fs.info(path)
            except FileNotFoundError:
                if not fs.exists(path):
                    raise ReadError("list", root, "list_files_by_fsspec", "no such file or directory") from None
                info = {"type": "directory"}
            is_dir = info.get("type") == "directory"
            if not is_dir and any(p in ("http", "https") for p in _protocols(fs)):
                is_dir = fs.isdir(path)  # every URL is a "file" to HTTP; a page with links is a directory
            if not is_dir:
                return [root]
            if self.recursive:
                names = fs.find(path, withdirs=False, detail=False)
            else:
                names = [e["name"] for e in fs.ls(path, detail=True) if e.get("type") != "directory"]
        except ReadError:
            raise
        except Exception as exc:
            raise ReadError("list", root, "list_files_by_fsspec", _reason(exc)) from exc
        base = path.rstrip("/")
        match = _matcher(self.masks)
        # Some filesystems list the directory itself next to its files.
        urls = [_join_url(root, n) for n in names if n.rstrip("/") != base and match(n)]
        return sorted(urls)

    def _list_local(self, root: str, local: str) -> list[str] | None:
        """List a plain local path or ``file://`` URL with ``os.scandir``, as the fsspec path would.

        The same URLs, in the same order, as listing through fsspec's local
        filesystem (``tests/pipes/test_fsspec_io.py`` compares them), several
        times cheaper: no filesystem object, no ``info`` dict and ``stat`` per
        file.  ``None`` when the root is not a readable directory or file
        here (missing, unreadable, a broken link): the fsspec path then lists
        it, and raises the same errors as always.
        """
        path = _LocalFileSystem._strip_protocol(local)
        try:
            st = os.stat(path)  # follows a link, as fsspec's info() does for the root
        except OSError:
            return None
        if not stat.S_ISDIR(st.st_mode):
            return [root]
        names = _scan_local(path, self.recursive)
        if names is None:
            return None
        match = _matcher(self.masks)
        if root.startswith("file://"):
            return sorted(["file://" + n for n in names if match(n)])
        return sorted([n for n in names if match(n)])

    def state_dict(self) -> dict[str, Any]:
        if self._root is None:
            return {"root": None, "last": None}
        if self._record is None:  # once per root: later checkpoints of the same listing reuse it
            self._record = listing_record(_kept(self._root, self._urls))
        last = self._last if self._last is None else checkpoint_url(self._last)
        return {"root": checkpoint_url(self._root), "last": last, **self._record}

    def restore(self, state: dict[str, Any] | None) -> None:
        self._root = self._last = None
        self._urls, self._record = [], None
        if state is None or state["root"] is None:
            self._resume = None
        else:
            self._resume = (state["root"], state["last"], {k: state[k] for k in ("digest", "count", "names")
                                                           if k in state})

    def __iter__(self) -> Iterator[str]:
        resume, self._resume = self._resume, None  # the root to continue, set by restore()
        if resume is not None:
            yield from self._yield_root(self._root_of(resume[0]), after=resume[1], expected=resume[2])
        for root in self.source_datapipe:
            yield from self._yield_root(root, after=None)
        self._root = self._last = None
        self._urls, self._record = [], None

    def _root_of(self, key: str) -> str:
        """The root a checkpoint names by ``key`` (:func:`~pipekit._redact.checkpoint_url`): one of the source's."""
        root = resolve_checkpoint_url(key, upstream_strings(self.source_datapipe))
        if root is None:
            raise ReadError(
                "resume listing", shown_url(key), "list_files_by_fsspec",
                "the checkpoint holds this root without its credentials, and no root of the pipeline's source "
                "matches it: resume with the pipeline the checkpoint was taken from",
            )
        return root

    def _yield_root(self, root: str, after: str | None, expected: dict[str, Any] | None = None) -> Iterator[str]:
        self._root, self._last = root, after
        self._urls, self._record = [], None
        try:
            urls = self._list(root)
        except ReadError as exc:
            if self.on_error == "raise":
                raise
            self.skip_log.record(exc)
            return
        self._urls = urls
        if expected is not None and expected.get("digest") is not None:
            self._check_listing(root, after, urls, expected)
        if after is not None:  # kept without its credentials (a digest at its end): the file listed
            found = resolve_checkpoint_url(after, urls)
            if found is None:
                raise ReadError("resume listing", root, "list_files_by_fsspec",
                                f"{after!r}, the last file read, is gone; resume from a checkpoint taken on these "
                                "files, or start the epoch over")
            self._last = after = found
        if not urls and root not in self._warned_empty:
            self._warned_empty.add(root)
            matching = f" matching masks {self.masks}" if self.masks else ""
            warnings.warn(
                f"list_files_by_fsspec: {root!r} holds no files{matching}"
                f"{' (recursive)' if self.recursive else ''}; it yields nothing",
                UserWarning,
                stacklevel=2,
            )
        for url in urls:
            if after is not None and url <= after:
                continue
            self._last = url
            yield url

    def _check_listing(self, root: str, last: str | None, urls: list[str], expected: dict[str, Any]) -> None:
        """Refuse to resume ``root`` when its listing is not the one the checkpoint's positions count."""
        kept = _kept(root, urls)
        change = listing_change(expected, kept)
        if change is None or (kept is not urls and listing_change(expected, urls) is None):  # (taken with them)
            return
        gone = f"; {last!r}, the last file read, is gone" if last is not None and last not in set(kept) else ""
        raise ReadError(
            "resume listing", root, "list_files_by_fsspec",
            f"the files under it changed since the checkpoint ({change}{gone}): the positions "
            "downstream (a shuffle's, each DataLoader worker's share) count files of the old listing and would "
            "repeat some files and skip others; resume from a checkpoint taken on these files, or start the "
            "epoch over",
        )


def _kept(root: str, urls: list[str]) -> list[str]:
    """The listing as a checkpoint keeps it: ``urls`` itself, or, under a root with credentials, each URL
    without them (:func:`~pipekit._redact.checkpoint_url`)."""
    if redact_secrets(root) == root:
        return urls
    return [checkpoint_url(url) for url in urls]


_BUILTIN_OPEN_KWARGS = {"encoding", "errors", "newline"}


@functional_datapipe("open_files_by_fsspec")
class FSSpecFileOpener(IterDataPipe[tuple[str, StreamWrapper]]):
    """Open each URL with fsspec and yield ``(url, stream)``.

    The stream is a :class:`StreamWrapper` around the fsspec file object
    (seekable for local, memory and S3 files), named after the URL.  It stays
    open for the pipes downstream (``load_from_tar``, decoders...) and is
    closed when they close it or drop it (the wrapper closes its file when it
    is garbage collected).  If the iteration fails (an open error, an error
    raised upstream), every stream this pipe opened that is still open is
    closed before the error propagates.  When the pipe is exhausted, or its
    iterator is closed or dropped early (``header``, ``break``,
    ``next(iter(pipe))``), streams still held downstream stay usable, as in
    torchdata: buffering pipes (``shuffle``, ``batch``, ``webdataset``) hand
    them out after this pipe has finished, and the consumer may still be
    reading them; the rest are closed as soon as they are dropped.

    Args:
        source_datapipe: a pipe yielding URLs.
        mode: the read mode, ``"r"`` (text, the default, as in torchdata) or
            ``"rb"``.
        kwargs_for_open: extra arguments for ``fs.open()`` (``encoding``,
            ``block_size``...).
        on_error: ``"raise"`` (default) raises :class:`~pipekit.errors.ReadError`
            naming the URL; ``"skip"`` records the URL in ``self.skip_log``.
        retry: how remote files survive transient failures (a server
            restart, throttling, a dropped connection): a
            :class:`~pipekit.retry.RetryPolicy`, an int (attempts), ``False``
            (never) or ``None`` (the default policy, see :mod:`pipekit.retry`).
            Remote binary streams are :class:`RetryingFile`\\ s: a failed
            read reopens the file and continues at the byte it had reached.
            Local files are opened directly.  A missing file is not retried.
        storage_options: fsspec storage options (merged with ``kwargs``).
            ``s3://`` and ``http(s)://`` reads wait at most 5 s to connect and
            15 s for the next bytes (:data:`pipekit.retry.DEFAULT_CONNECT_TIMEOUT`,
            :data:`~pipekit.retry.DEFAULT_READ_TIMEOUT`, set by ``PIPEKIT_CONNECT_TIMEOUT``
            and ``PIPEKIT_READ_TIMEOUT``; per pipe by s3fs's ``config_kwargs``
            ``connect_timeout``/``read_timeout`` or HTTP's ``client_kwargs["timeout"]``),
            then fail the try, which ``retry`` retries (see :func:`pipekit.retry.with_timeouts`).
        kwargs: more storage options (credentials, ``client_kwargs``...).

    The pipe is stateless for resume (one stream per URL).  Pipes that need
    to open an input again to resume it (``load_from_tar``) call
    :meth:`reopen`, which opens a URL with this pipe's mode and options.  In a
    pipeline whose resume reads files again (one resumed by replaying its
    items, or with a ``cycle``), :class:`pipekit.DataLoader` has it stamp each
    file it opens (:mod:`pipekit.pipes._stamps`): a file read before a
    checkpoint and changed since raises :class:`~pipekit.errors.CheckpointError`
    naming it when the resumed run opens it again.

    Example:
        >>> import fsspec
        >>> from pipekit.pipes import IterableWrapper
        >>> fsspec.filesystem("memory").pipe("/opener_doc/a.txt", b"hello")
        >>> for url, stream in IterableWrapper(["memory://opener_doc/a.txt"]).open_files_by_fsspec(mode="rb"):
        ...     print(url, stream.read())
        memory://opener_doc/a.txt b'hello'
    """

    stateless = True
    stamps_files = True  # the loader gives it a StampLog where a resume reads files again (pipes/_stamps.py)
    _stamp_log: StampLog | None = None

    def __init__(
        self,
        source_datapipe: IterDataPipe[str],
        mode: str = "r",
        *,
        kwargs_for_open: dict[str, Any] | None = None,
        on_error: str = "raise",
        retry: RetryPolicy | int | bool | None = None,
        storage_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.retry = resolve_retry(retry)
        if not isinstance(mode, str) or not mode.startswith("r") or set(mode) - set("rbt") or len(mode) > 2:
            raise ValueError(f'mode must be a read mode ("r", "rb" or "rt"), got {mode!r}')
        if kwargs_for_open is not None and not isinstance(kwargs_for_open, dict):
            raise TypeError(f"kwargs_for_open must be a dict or None, got {type(kwargs_for_open).__name__}")
        self.source_datapipe = source_datapipe
        self.mode = mode
        self.kwargs_for_open: dict[str, Any] = dict(kwargs_for_open or {})
        self.kwargs_for_connection = _storage_options(storage_options, kwargs)
        self.on_error = check_on_error(on_error)
        self.skip_log = SkipLog("open_files_by_fsspec")

    def reopen(self, url: str) -> StreamWrapper:
        """Open ``url`` again with this pipe's mode, open arguments and storage options."""
        if not isinstance(url, str):
            raise TypeError(f"open_files_by_fsspec: a URL must be a str, got {type(url).__name__}: {url!r}")
        try:
            local = local_path(url) if set(self.kwargs_for_open) <= _BUILTIN_OPEN_KWARGS else None
            if local is not None:
                # Plain local files: Python's own open() is several times cheaper than
                # resolving a filesystem per URL, and just as seekable (~ expanded, as fsspec does).
                if local.startswith("~"):
                    local = os.path.expanduser(local)
                file = open(local, self.mode, **self.kwargs_for_open)  # noqa: SIM115 - closed downstream
            else:
                fs, path = _remote_fs(url, self.kwargs_for_connection)
                if (fs_is_local(fs) or "memory" in _protocols(fs) or self.retry.attempts == 1
                        or "compression" in self.kwargs_for_open):
                    if "compression" not in self.kwargs_for_open and is_http(fs):  # its version kept, text too
                        file = open_http(fs, path, self.kwargs_for_open, self.mode)
                    else:
                        file = fs.open(path, self.mode, **self.kwargs_for_open)
                else:
                    file = self._open_retrying(fs, path, url)
        except ReadError:
            raise
        except Exception as exc:
            raise ReadError("open", url, "open_files_by_fsspec", _reason(exc)) from exc
        return StreamWrapper(file, name=url)

    def _open_retrying(self, fs: Any, path: str, url: str) -> Any:
        text_kwargs = {k: v for k, v in self.kwargs_for_open.items() if k in _BUILTIN_OPEN_KWARGS}
        binary_kwargs = {k: v for k, v in self.kwargs_for_open.items() if k not in _BUILTIN_OPEN_KWARGS}

        http = is_http(fs)

        def open_fn() -> Any:
            return open_http(fs, path, binary_kwargs) if http else fs.open(path, "rb", **binary_kwargs)

        raw = RetryingFile(open_fn, url, "open_files_by_fsspec", self.retry)
        if "b" in self.mode:
            return raw
        return io.TextIOWrapper(io.BufferedReader(raw), **text_kwargs)

    def __iter__(self) -> Iterator[tuple[str, StreamWrapper]]:
        yield from open_each(self.source_datapipe, self._opener(), self.on_error, self.skip_log, self._stamp_log)

    def _opener(self) -> Callable[[str], StreamWrapper]:
        """:meth:`reopen`, with what is the same for every URL of this epoch decided once.

        Plain local paths and ``file://`` URLs are opened with Python's
        ``open()`` as :meth:`reopen` opens them (same stream, same
        :class:`~pipekit.errors.ReadError` naming the URL and stage); every
        other URL, and anything that is not a str, goes through :meth:`reopen`.
        """
        kwargs = dict(self.kwargs_for_open)
        if not set(kwargs) <= _BUILTIN_OPEN_KWARGS:
            return self.reopen
        mode, reopen = self.mode, self.reopen

        def open_one(url: str) -> StreamWrapper:
            if type(url) is str and "://" not in url and "::" not in url:  # a plain path (local_path, inline)
                local: str | None = url
            else:
                local = local_path(url) if type(url) is str else None
            if local is None:
                return reopen(url)
            if local.startswith("~"):  # as fsspec's local filesystem (and the lister) read it
                local = os.path.expanduser(local)
            try:
                file = open(local, mode, **kwargs)  # noqa: SIM115 - closed downstream
            except Exception as exc:
                raise ReadError("open", url, "open_files_by_fsspec", _reason(exc)) from exc
            return StreamWrapper(file, name=url)

        return open_one

    def __len__(self) -> int:
        return len(self.source_datapipe)  # type: ignore[arg-type]


# The savers live in their own module (this one was past 880 lines), importable from here as before; and
# torch's list_files, resumable and checking its listing on resume (registered in torch's place on import).
from pipekit.pipes import _file_lister  # noqa: E402, F401
from pipekit.pipes._fsspec_save import FSSpecSaver, Saver  # noqa: E402
