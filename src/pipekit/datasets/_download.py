"""Getting a dataset's files: resumable, verified downloads and safe archive extraction.

TorchGeo 0.8 re-exports torchvision's helpers from ``torchgeo.datasets.utils``
(``download_url``, ``download_and_extract_archive``, ``extract_archive``,
``check_integrity``); these are pipekit's, with the same names, argument
names and defaults, and:

* :func:`download_url` takes ``http(s)://`` URLs and any fsspec URL
  (``s3://``, ``memory://``, ``file://`` or a local path) with
  ``storage_options``; it checks ``sha256=`` as well as ``md5=``; it writes to
  ``<file>.part`` and, after an interrupted transfer, continues from the
  partial file (an HTTP ``Range`` request, a seek for fsspec) instead of
  starting again; the file is moved into place only after its checksum
  matched.  Each try waits at most ``PIPEKIT_CONNECT_TIMEOUT`` (5 s) to
  connect and ``PIPEKIT_READ_TIMEOUT`` (15 s) for the next bytes, as every
  remote read of pipekit does (:mod:`pipekit.retry`), unless ``timeout=``
  says otherwise: a server that accepts and never answers fails the call,
  naming the URL, instead of hanging it.
* :func:`extract_archive` (:mod:`pipekit.datasets._extract`) refuses members
  that would land outside the destination (``..``, absolute paths, links
  pointing out of it, devices) and archives past its limits (bytes, members,
  expansion ratio), naming the archive and the member, before writing
  anything; a refusal while extracting leaves the destination as it was.

The partial-file rule: a ``.part`` file whose transfer was *interrupted*
is kept, so the next call resumes it; a ``.part`` file that was *complete*
but failed its checksum is deleted (resuming cannot repair it), and the
:class:`~pipekit.errors.HashError` names the URL and both digests.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import posixpath
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from pipekit.datasets._extract import extract_archive
from pipekit.errors import DatasetNotFoundError, HashError, ReadError, StageError
from pipekit.pipes._fsspec_io import _remote_fs
from pipekit.retry import default_timeouts

__all__ = [
    "calculate_md5",
    "check_integrity",
    "download_url",
    "extract_archive",
    "download_and_extract_archive",
]

_CHUNK = 1 << 20


def _digest(path: str | os.PathLike[str], algorithm: str, chunk_size: int = _CHUNK) -> str:
    h = hashlib.new(algorithm, usedforsecurity=False) if algorithm == "md5" else hashlib.new(algorithm)
    with open(path, "rb") as f:
        while chunk := f.read(chunk_size):
            h.update(chunk)
    return h.hexdigest()


def calculate_md5(fpath: str | os.PathLike[str], chunk_size: int = _CHUNK) -> str:
    """The MD5 hex digest of a file (torchvision's name).

    Example:
        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "a.txt")
        >>> _ = open(path, "wb").write(b"abc")
        >>> calculate_md5(path)
        '900150983cd24fb0d6963f7d28e17f72'
    """
    return _digest(fpath, "md5", chunk_size)


def check_integrity(fpath: str | os.PathLike[str], md5: str | None = None) -> bool:
    """Whether ``fpath`` is a file and, when ``md5`` is given, has that MD5 (torchvision's semantics).

    Example:
        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "a.txt")
        >>> check_integrity(path)
        False
        >>> _ = open(path, "wb").write(b"abc")
        >>> check_integrity(path), check_integrity(path, "900150983cd24fb0d6963f7d28e17f72")
        (True, True)
        >>> check_integrity(path, "0" * 32)
        False
    """
    if not os.path.isfile(fpath):
        return False
    if md5 is None:
        return True
    return calculate_md5(fpath) == md5.lower()


def _is_http(url: str) -> bool:
    return url.startswith(("http://", "https://"))


class _InterruptedError(Exception):
    """The transfer stopped before the end (the ``.part`` file holds what arrived)."""


class _ReadTimeout:
    """Waits ``connect`` seconds to connect (and, over TLS, to shake hands), then ``read`` seconds for each read."""

    sock: Any

    def __init__(self, *args: Any, connect: float, read: float, **kwargs: Any) -> None:
        kwargs["timeout"] = connect
        super().__init__(*args, **kwargs)  # type: ignore[call-arg]
        self._read_timeout = read

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]
        self.sock.settimeout(self._read_timeout)


class _TimedHTTPConnection(_ReadTimeout, http.client.HTTPConnection):
    """An HTTP connection with pipekit's connect and read timeouts."""


class _TimedHTTPSConnection(_ReadTimeout, http.client.HTTPSConnection):
    """:class:`_TimedHTTPConnection` over TLS."""


class _TimedHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, connect: float, read: float) -> None:
        super().__init__()
        self.timeouts = {"connect": connect, "read": read}

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_TimedHTTPConnection, req, **self.timeouts)


class _TimedHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, connect: float, read: float) -> None:
        super().__init__()
        self.timeouts = {"connect": connect, "read": read}

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_TimedHTTPSConnection, req, **self.timeouts)


def _redirect_opener(max_redirect_hops: int, timeouts: tuple[float, float]) -> urllib.request.OpenerDirector:
    handler = urllib.request.HTTPRedirectHandler()
    handler.max_redirections = max_redirect_hops  # type: ignore[attr-defined]
    return urllib.request.build_opener(handler, _TimedHTTPHandler(*timeouts), _TimedHTTPSHandler(*timeouts))


def _timeouts(timeout: float | None) -> tuple[float, float]:
    """(connect, read) seconds of a download: ``timeout`` for both, else pipekit's remote timeouts."""
    if timeout is not None:
        return float(timeout), float(timeout)
    timeouts = default_timeouts()
    return timeouts.connect, timeouts.read


def _http_once(url: str, part: str, max_redirect_hops: int, timeouts: tuple[float, float]) -> None:
    """One HTTP request, appending to ``part`` from its size on (``Range``) or rewriting it (200)."""
    have = os.path.getsize(part) if os.path.exists(part) else 0
    request = urllib.request.Request(url, headers={"User-Agent": "pipekit", "Accept-Encoding": "identity"})
    if have:
        request.add_header("Range", f"bytes={have}-")
    try:
        response = _redirect_opener(max_redirect_hops, timeouts).open(request)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:  # nothing after what we have: the partial file is complete
            return
        raise ReadError("download", url, "download_url", f"HTTP {exc.code} {exc.reason}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise _InterruptedError(_why(exc, timeouts)) from exc
    with response:
        if have and response.status == 206:
            start = _content_range_start(response.headers.get("Content-Range"))
            if start != have:
                raise ReadError("download", url, "download_url",
                                f"asked for bytes from {have}, the server sent a range starting at {start}")
            mode = "ab"
        else:  # 200: the server ignored the Range header, start again
            mode = "wb"
            have = 0
        length = response.headers.get("Content-Length")
        expected = have + int(length) if length is not None else None
        with open(part, mode) as out:
            try:
                while chunk := response.read(_CHUNK):
                    out.write(chunk)
            except (http.client.IncompleteRead, OSError) as exc:
                if isinstance(exc, http.client.IncompleteRead) and exc.partial:
                    out.write(exc.partial)
                raise _InterruptedError(_why(exc, timeouts)) from exc
    got = os.path.getsize(part)
    if expected is not None and got < expected:
        raise _InterruptedError(f"connection closed after {got} of {expected} bytes")


def _why(exc: BaseException, timeouts: tuple[float, float]) -> str:
    reason = getattr(exc, "reason", exc)
    if isinstance(reason, (TimeoutError, socket.timeout)):
        return f"timed out (connect timeout {timeouts[0]} s, read timeout {timeouts[1]} s)"
    return f"{type(exc).__name__}: {reason}"


def _content_range_start(value: str | None) -> int | None:
    # "bytes 100-199/200"
    if not value or not value.startswith("bytes "):
        return None
    try:
        return int(value[6:].split("-", 1)[0])
    except ValueError:
        return None


def _fsspec_once(url: str, part: str, storage_options: Mapping[str, Any]) -> None:
    """Copy an fsspec URL into ``part``, continuing after the bytes it already holds."""
    have = os.path.getsize(part) if os.path.exists(part) else 0
    try:
        # pipekit's remote timeouts filled in, and s3fs trying each request once (see _remote_fs)
        fs, path = _remote_fs(url, dict(storage_options))
        with fs.open(path, "rb") as src:
            size = getattr(src, "size", None)
            if have and size is not None and have > size:
                have = 0  # the source shrank: start again
            src.seek(have)
            with open(part, "ab" if have else "wb") as out:
                try:
                    while chunk := src.read(_CHUNK):
                        out.write(chunk)
                except OSError as exc:
                    raise _InterruptedError(f"{type(exc).__name__}: {exc}") from exc
    except FileNotFoundError as exc:
        raise ReadError("download", url, "download_url", "no such file") from exc
    except _InterruptedError:
        raise
    except OSError as exc:
        raise _InterruptedError(f"{type(exc).__name__}: {exc}") from exc


def download_url(
    url: str,
    root: str | os.PathLike[str],
    filename: str | os.PathLike[str] | None = None,
    md5: str | None = None,
    max_redirect_hops: int = 3,
    *,
    sha256: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    retries: int = 3,
    timeout: float | None = None,
) -> None:
    """Download ``url`` to ``root/filename``, resuming interrupted transfers and checking digests.

    Same signature and meaning as TorchGeo's (torchvision's) ``download_url``,
    plus keyword arguments.  A file already there that passes the checks is
    kept (nothing is downloaded).  Bytes go to ``root/filename.part``; when the
    transfer stops early (the connection drops, a read fails) the call
    retries up to ``retries`` times, each time asking for the rest only
    (HTTP ``Range: bytes=N-``; a seek for fsspec URLs), and a ``.part`` file
    left by an earlier, failed call is continued the same way.  Only a file
    that passed the checksums is renamed to ``root/filename``.

    Args:
        url: ``http(s)://`` URL, any fsspec URL (``s3://bucket/key``) or local path.
        root: the directory to download into (created).
        filename: the file name (default: the URL's last path component).
        md5: the expected MD5 hex digest, or ``None``.
        max_redirect_hops: HTTP redirects followed at most.
        sha256: the expected SHA-256 hex digest, or ``None``.
        storage_options: fsspec options for non-HTTP URLs (s3fs spelling for S3).
        retries: further attempts after an interrupted transfer.
        timeout: seconds an HTTP download may wait to connect and for the
            next bytes; ``None`` (default): ``PIPEKIT_CONNECT_TIMEOUT`` (5 s) to
            connect and ``PIPEKIT_READ_TIMEOUT`` (15 s) for each read (see
            :mod:`pipekit.retry`), which fsspec URLs (``s3://``...) get as well.
            A try that times out counts as an interrupted transfer.

    Raises:
        HashError: the downloaded bytes do not match ``md5`` / ``sha256`` (the
            message names the URL and both digests; the ``.part`` file is
            deleted, since it was complete).
        ReadError: the URL cannot be fetched (HTTP error status, no such object),
            or the transfer was still incomplete after ``retries`` retries (the
            ``.part`` file is kept for the next call).

    Example:
        >>> import os, tempfile
        >>> src = os.path.join(tempfile.mkdtemp(), "data.bin")
        >>> _ = open(src, "wb").write(b"abc")
        >>> root = tempfile.mkdtemp()
        >>> download_url(src, root, md5="900150983cd24fb0d6963f7d28e17f72")
        >>> sorted(os.listdir(root))
        ['data.bin']
        >>> download_url(src, root, "bad.bin", sha256="0" * 64)
        Traceback (most recent call last):
          ...
        pipekit.errors.HashError: cannot verify '...data.bin' in download_url: sha256 mismatch: expected 0...
    """
    if not isinstance(url, str) or not url:
        raise TypeError(f"download_url: url must be a non-empty string, got {url!r}")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"download_url: retries must be an int >= 0, got {retries!r}")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise ValueError(f"download_url: timeout must be a number of seconds > 0 or None, got {timeout!r}")
    root = os.path.expanduser(os.fspath(root))
    if not filename:
        filename = posixpath.basename(url.split("?", 1)[0].rstrip("/"))
        if not filename:
            raise ValueError(f"download_url: cannot name the file of {url!r}; pass filename=")
    fpath = os.path.join(root, os.fspath(filename))
    os.makedirs(os.path.dirname(fpath) or ".", exist_ok=True)
    if os.path.isfile(fpath) and _matches(fpath, md5, sha256):
        return
    part = fpath + ".part"
    options = dict(storage_options or {})
    last: _InterruptedError | None = None
    for attempt in range(retries + 1):
        try:
            if _is_http(url):
                _http_once(url, part, max_redirect_hops, _timeouts(timeout))
            else:
                _fsspec_once(url, part, options)
            last = None
            break
        except _InterruptedError as exc:
            last = exc
            if attempt < retries:
                time.sleep(min(0.1 * 2**attempt, 2.0))
    if last is not None:
        have = os.path.getsize(part) if os.path.exists(part) else 0
        raise ReadError("download", url, "download_url",
                        f"transfer interrupted {retries + 1} times ({last}); {have} bytes kept in {part!r}, "
                        "call again to resume") from last
    for algorithm, expected in (("md5", md5), ("sha256", sha256)):
        if expected is None:
            continue
        actual = _digest(part, algorithm)
        if actual != expected.lower():
            os.remove(part)
            raise HashError("verify", url, "download_url",
                            f"{algorithm} mismatch: expected {expected}, got {actual}",
                            expected=expected, actual=actual)
    os.replace(part, fpath)


def _matches(path: str, md5: str | None, sha256: str | None) -> bool:
    if md5 is not None and _digest(path, "md5") != md5.lower():
        return False
    return sha256 is None or _digest(path, "sha256") == sha256.lower()


def download_and_extract_archive(
    url: str,
    download_root: str | os.PathLike[str],
    extract_root: str | os.PathLike[str] | None = None,
    filename: str | os.PathLike[str] | None = None,
    md5: str | None = None,
    remove_finished: bool = False,
    *,
    sha256: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    max_bytes: int | None = None,
    max_members: int | None = None,
    max_ratio: int | None = None,
) -> None:
    """:func:`download_url` then :func:`extract_archive` (TorchGeo's / torchvision's signature).

    ``sha256`` and ``storage_options`` go to :func:`download_url`; ``max_bytes``, ``max_members`` and
    ``max_ratio`` to :func:`extract_archive` (``None``: its defaults, 256 GiB, 10 million members, 250).

    Example:
        >>> import io, os, tarfile, tempfile
        >>> tmp = tempfile.mkdtemp()
        >>> src = os.path.join(tmp, "a.tar")
        >>> with tarfile.open(src, "w") as tar:
        ...     info = tarfile.TarInfo("x.txt"); info.size = 2
        ...     tar.addfile(info, io.BytesIO(b"hi"))
        >>> download_and_extract_archive(src, os.path.join(tmp, "dl"))
        >>> sorted(os.listdir(os.path.join(tmp, "dl")))
        ['a.tar', 'x.txt']
    """
    download_root = os.path.expanduser(os.fspath(download_root))
    if extract_root is None:
        extract_root = download_root
    if not filename:
        filename = posixpath.basename(url.split("?", 1)[0].rstrip("/"))
    download_url(url, download_root, filename, md5, sha256=sha256, storage_options=storage_options)
    extract_archive(os.path.join(download_root, os.fspath(filename)), extract_root, remove_finished,
                    max_bytes=max_bytes, max_members=max_members, max_ratio=max_ratio)


# ---------------------------------------------------------------------------------------------- for the datasets
# The benchmark datasets (VHR10, UCMerced, RESISC45...) fetch their files through these two, so that every failed
# or refused download, and every dataset not found, says which file to fetch by hand and where to put it.


def manual_fetch_hint(files: Sequence[tuple[str, str, str | None]]) -> str:
    """How to get ``files`` (``(url, destination path, md5 or None)`` each) without pipekit's download.

    Example:
        >>> manual_fetch_hint([("https://host/a.zip", "/data/a.zip", "0" * 32)])
        "to get the data by hand, download https://host/a.zip (md5 00000000000000000000000000000000) to '/data/a.zip'"
    """
    parts = []
    for url, path, md5 in files:
        digest = f" (md5 {md5})" if md5 else ""
        parts.append(f"{url}{digest} to {path!r}")
    return "to get the data by hand, download " + "; ".join(parts)


def fetch_for_dataset(
    dataset: str,
    url: str,
    root: str | os.PathLike[str],
    filename: str,
    md5: str | None = None,
    *,
    verify: bool = True,
    extract: bool = False,
) -> None:
    """:func:`download_url` (then :func:`extract_archive` into ``root`` when ``extract``) for the dataset ``dataset``.

    ``md5`` is checked when ``verify`` (a dataset's ``checksum=True``), and named in the
    message of a failure either way.

    A failure keeps its type (:class:`~pipekit.errors.ReadError` for a refused or failed
    transfer, a login page included; :class:`~pipekit.errors.HashError` for wrong bytes;
    an :class:`~pipekit.errors.ArchiveError` for an archive that cannot be extracted) and
    its URL, is reported in the stage ``dataset``, and its message ends with
    :func:`manual_fetch_hint` for the file.
    """
    root = os.fspath(root)
    path = os.path.join(root, filename)
    try:
        download_url(url, root, filename, md5 if verify else None)
        if extract:
            extract_archive(path, root)
    except StageError as exc:
        hint = manual_fetch_hint([(url, path, md5)])
        if extract:
            hint += " and extract it there"
        new = type(exc)(exc.action, exc.url, dataset, f"{exc.reason}; {hint}, then construct {dataset} again")
        if isinstance(exc, HashError) and isinstance(new, HashError):
            new.expected, new.actual = exc.expected, exc.actual
        raise new from exc


def dataset_not_found(
    dataset: str, root: str, files: Sequence[tuple[str, str, str | None]], download: bool
) -> DatasetNotFoundError:
    """TorchGeo's "Dataset not found" error for ``root``, with :func:`manual_fetch_hint` for ``files``."""
    if download:
        head = f"{dataset}: Dataset not found in `root={root!r}` and cannot be downloaded"
    else:
        head = (f"{dataset}: Dataset not found in `root={root!r}` and `download=False`, either specify a different "
                "`root` or use `download=True` to automatically download the dataset")
    return DatasetNotFoundError(f"{head}; {manual_fetch_hint(files)}")
