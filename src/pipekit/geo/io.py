"""Opening rasters: local paths, GDAL's ``/vsis3/`` and ``/vsicurl/``, or any fsspec filesystem.

A geo dataset never keeps an open file in itself (it is pickled to every
DataLoader worker).  It holds a :class:`RasterOpener`, a small picklable
description of *how* to open its files, and asks :func:`cached_handle` for a
handle when it reads.  Handles live in a per-process, per-thread LRU cache:

* created lazily, in the process (and thread) that reads, so a forked
  DataLoader worker never touches a handle of its parent: the cache is keyed
  by ``os.getpid()``, and a child that inherits its parent's cache leaves
  those handles alone (closing them could move the file offset the parent
  shares with it);
* bounded by a count and an estimated byte budget (see
  :func:`set_handle_budget`), closing the least recently used handles.

How a URL is opened (:meth:`RasterOpener.resolve`):

* a local path or ``file://`` URL: by GDAL directly;
* ``s3://bucket/key``: by GDAL's ``/vsis3/`` (HTTP range requests, so a
  window of a Cloud-Optimized GeoTIFF costs a few small requests), with the
  endpoint, region and credentials taken from ``storage_options`` (s3fs
  spelling: ``key``, ``secret``, ``token``, ``anon``, ``endpoint_url``,
  ``client_kwargs={"endpoint_url": ..., "region_name": ...}``);
* ``http(s)://``: by GDAL's ``/vsicurl/``;
* anything else (``memory://``, ``gs://``, ``zip://...``), or S3 with
  options GDAL cannot express, or ``vsi=False``: through fsspec, handing
  rasterio (>= 1.4) file objects with its ``opener=`` argument.

GDAL settings are chosen deliberately (:data:`GDAL_OPTIONS`, applied once
per process; :data:`REMOTE_GDAL_OPTIONS` for remote files) and can be
overridden per dataset with ``gdal_options``.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import itertools
import json
import logging
import math
import os
import queue
import re
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

import numpy as np
import rasterio
import rasterio.session
from rasterio.env import set_gdal_config

from pipekit import malloc
from pipekit.errors import ReadError
from pipekit.geo.rangecache import PositionedReader, RangeCache
from pipekit.geo.rangefetch import RangeFetcher, s3_fetcher
from pipekit.retry import RetryPolicy, default_policy, is_transient

__all__ = [
    "GDAL_OPTIONS",
    "REMOTE_GDAL_OPTIONS",
    "RasterOpener",
    "RasterHandle",
    "cached_handle",
    "open_handle",
    "set_handle_budget",
    "handle_budget",
    "close_cached_handles",
    "cached_handle_count",
    "split_protocol",
    "error_reason",
    "run_parts",
    "run_remote",
]

logger = logging.getLogger("pipekit.geo")

T = TypeVar("T")

#: GDAL configuration applied once in every process that reads rasters.
#: ``GDAL_CACHEMAX`` (in bytes: rasterio hands the number to GDAL as is) bounds
#: GDAL's block cache of decoded tiles per process; every DataLoader worker
#: has its own, so it is kept well below GDAL's default of 5% of the RAM.
GDAL_OPTIONS: dict[str, Any] = {
    "GDAL_CACHEMAX": 256 * 2**20,
    "GDAL_NUM_THREADS": "1",  # DataLoader workers are the parallelism
    "GTIFF_IMPLICIT_JPEG_OVR": "NO",
}

#: GDAL configuration in effect while remote files are opened and read.
REMOTE_GDAL_OPTIONS: dict[str, Any] = {
    "GDAL_DISABLE_READDIR_ON_OPEN": "EMPTY_DIR",  # no directory listing, no sidecar probing
    # no per-file VSI cache on top of /vsicurl/'s own region cache (CPL_VSIL_CURL_CACHE_SIZE, 16 MiB a process):
    # decoded tiles live in GDAL's block cache, and the second copy of every byte cost ~1-3 ms of CPU a
    # sample from S3 for the same bytes and requests (benchmarks/README.md, issue 12, 2026-11-26);
    # gdal_options={"VSI_CACHE": "TRUE", "VSI_CACHE_SIZE": ...} restores it
    "VSI_CACHE": "FALSE",
    "GDAL_HTTP_MULTIRANGE": "YES",
    "GDAL_HTTP_MERGE_CONSECUTIVE_RANGES": "YES",
    "CPL_VSIL_CURL_USE_HEAD": "NO",
    # GDAL's own HTTP retries (GDAL_HTTP_MAX_RETRY, GDAL_HTTP_RETRY_DELAY, GDAL_HTTP_RETRY_CODES)
    # come from pipekit's retry budget: see _gdal_retry_options()
}

# HTTP answers GDAL retries by itself: throttling and server errors (never 403/404)
_GDAL_RETRY_CODES = "429,500,502,503,504"


def _gdal_retry_options(policy: RetryPolicy) -> dict[str, str]:
    """GDAL's HTTP retry options for ``policy``: its attempts, its first delay (GDAL doubles it each time)."""
    return {
        "GDAL_HTTP_MAX_RETRY": str(max(0, min(policy.attempts - 1, 3))),  # pipekit retries around it
        "GDAL_HTTP_RETRY_DELAY": f"{max(policy.base_delay, 0.1):g}",
        "GDAL_HTTP_RETRY_CODES": _GDAL_RETRY_CODES,
    }


# GDAL's messages for a connection that failed or broke, or a server error / throttling answer
_GDAL_TRANSIENT = re.compile(
    r"(?i)couldn't connect|could not connect|connection refused|connection reset|timed out|timeout|"
    r"recv failure|send failure|empty reply|server returned nothing|"
    r"HTTP response code: (?:0|429|5\d\d)\b|curl error"
)


def is_transient_gdal(exc: BaseException) -> bool:
    """Whether a GDAL/rasterio error, or an error it was raised from, is a transient network failure."""
    if is_transient(exc):
        return True
    current: BaseException | None = exc
    seen: set[int] = set()
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, rasterio.errors.RasterioError) and _GDAL_TRANSIENT.search(str(current)):
            return True
        current = current.__cause__ if current.__cause__ is not None else current.__context__
    return False


# fsspec file objects handed to rasterio's opener: each read fetches what GDAL
# asks for (a header, a tile) plus a small read-ahead for the header's many
# small reads, instead of s3fs's default 5 MB read-ahead.
_FSSPEC_BLOCK_SIZE = 64 * 2**10

#: the range cache (``cache_dir=``) fetches S3 and HTTP misses with botocore's signer over urllib3
#: (:mod:`pipekit.geo.rangefetch`) instead of through fsspec, where the options allow; False: fsspec
FAST_FETCH = True
#: the range cache fetches the tiles of a window read before GDAL decodes them (False: as GDAL reads them)
PREFETCH_TILES = True

_LOCAL_HANDLE_COST = 64 * 2**10

_S3_OPTION_KEYS = {
    "key",
    "secret",
    "token",
    "anon",
    "endpoint_url",
    "client_kwargs",
    "region",
    "region_name",
    "requester_pays",
    "profile",
    "use_ssl",
    "aws_access_key_id",
    "aws_secret_access_key",
    "aws_session_token",
}
# s3fs options that only tune s3fs itself: harmless to leave out of GDAL's configuration.
_S3FS_ONLY_KEYS = {
    "skip_instance_cache",
    "use_listings_cache",
    "listings_expiry_time",
    "max_paths",
    "default_block_size",
    "default_fill_cache",
    "default_cache_type",
    "cache_regions",
    "max_concurrency",
    "asynchronous",
    "loop",
    "version_aware",
    "fixed_upload_size",
}


def error_reason(exc: BaseException) -> str:
    """``"Type: message"`` of ``exc``, followed by GDAL's own reasons from its exception chain.

    rasterio raises e.g. ``RasterioIOError("Read failed. See previous
    exception for details.")`` and chains GDAL's errors (``CPLE_*``, each
    the cause of the one before) behind it: their messages, outermost first
    and without repeats, are appended as ``(GDAL: ... <- ...)``, so the
    reason says what actually failed (a truncated tile, a bad JPEG stream).

    Example:
        >>> class CPLE_AppDefinedError(Exception):  # rasterio's class: (error class, errno, message)
        ...     pass
        >>> try:
        ...     try:
        ...         raise CPLE_AppDefinedError(3, 1, "TIFFFillTile:Read error at tile 3")
        ...     except CPLE_AppDefinedError as gdal:
        ...         raise OSError("Read failed. See previous exception for details.") from gdal
        ... except OSError as exc:
        ...     print(error_reason(exc))
        OSError: Read failed. See previous exception for details. (GDAL: TIFFFillTile:Read error at tile 3)
    """
    reason = f"{type(exc).__name__}: {exc}"
    seen = [str(exc)]
    gdal: list[str] = []
    cause = exc.__cause__ or exc.__context__
    for _ in range(32):  # chains are short; a cycle must not loop forever
        if cause is None:
            break
        if type(cause).__name__.startswith("CPLE_"):  # rasterio's wrappers of GDAL's CPLErr
            message = str(cause.args[2] if len(cause.args) >= 3 else cause).strip()
            if message and not any(message in known for known in seen):
                gdal.append(message)
                seen.append(message)
        cause = cause.__cause__ or cause.__context__
    if gdal:
        reason += f" (GDAL: {' <- '.join(gdal)})"
    return reason


def split_protocol(url: str) -> tuple[str | None, str]:
    """``("s3", "bucket/key")`` for ``"s3://bucket/key"``; ``(None, path)`` for a local path."""
    url = os.fspath(url)
    if "://" in url:
        protocol, rest = url.split("://", 1)
        if protocol and protocol.replace("+", "").replace("-", "").isalnum():
            return protocol.lower(), rest
    return None, url


def is_local(url: str) -> bool:
    protocol, _ = split_protocol(url)
    return protocol in (None, "file", "local") and "::" not in url


def local_path(url: str) -> str:
    protocol, rest = split_protocol(url)
    if protocol in ("file", "local"):
        return rest if rest.startswith("/") else "/" + rest
    return url


class _Credentials(rasterio.session.Session):
    """A rasterio session carrying GDAL's ``AWS_*`` options (rasterio.Env refuses them as plain options)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self._options = dict(options)

    @classmethod
    def hascreds(cls, config: Mapping[str, Any]) -> bool:
        return True

    @property
    def credentials(self) -> dict[str, str]:
        return dict(self._options)

    def get_credential_options(self) -> dict[str, str]:
        return dict(self._options)


def _s3_gdal_options(storage_options: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, str]] | None:
    """GDAL (config, credential) options equivalent to s3fs ``storage_options``, or ``None`` if not expressible."""
    config: dict[str, str] = {}
    creds: dict[str, str] = {}
    client_kwargs = dict(storage_options.get("client_kwargs") or {})
    for key in storage_options:
        if key not in _S3_OPTION_KEYS and key not in _S3FS_ONLY_KEYS:
            return None
    if set(client_kwargs) - {"endpoint_url", "region_name"}:
        return None
    key = storage_options.get("key", storage_options.get("aws_access_key_id"))
    secret = storage_options.get("secret", storage_options.get("aws_secret_access_key"))
    token = storage_options.get("token", storage_options.get("aws_session_token"))
    if key:
        creds["AWS_ACCESS_KEY_ID"] = str(key)
    if secret:
        creds["AWS_SECRET_ACCESS_KEY"] = str(secret)
    if token:
        creds["AWS_SESSION_TOKEN"] = str(token)
    if storage_options.get("anon"):
        config["AWS_NO_SIGN_REQUEST"] = "YES"
    elif key or secret:
        config["AWS_NO_SIGN_REQUEST"] = "NO"
    endpoint = storage_options.get("endpoint_url") or client_kwargs.get("endpoint_url")
    if endpoint:
        parts = urlsplit(str(endpoint))
        if not parts.netloc or parts.path not in ("", "/") or parts.query:
            return None
        config["AWS_S3_ENDPOINT"] = parts.netloc
        config["AWS_HTTPS"] = "NO" if parts.scheme == "http" else "YES"
        config["AWS_VIRTUAL_HOSTING"] = "FALSE"
    if storage_options.get("use_ssl") is False:
        config["AWS_HTTPS"] = "NO"
    region = storage_options.get("region") or storage_options.get("region_name") or client_kwargs.get("region_name")
    if region:
        config["AWS_REGION"] = str(region)
        config["AWS_DEFAULT_REGION"] = str(region)
    if storage_options.get("requester_pays"):
        config["AWS_REQUEST_PAYER"] = "requester"
    if storage_options.get("profile"):
        config["AWS_PROFILE"] = str(storage_options["profile"])
    return config, creds


class OpenerReadError(OSError):
    """A read of an fsspec file that failed under GDAL (raised from the fsspec error itself).

    rasterio hands GDAL a Python file object; an exception escaping its
    ``read`` reaches GDAL's C++ code, which can abort the whole process
    (``std::length_error``).  pipekit's file objects therefore never raise
    into GDAL: the failed call returns a short read, its error is kept, and
    :func:`surfacing_opener_errors` raises it once the rasterio call returns.
    """


_opener_failures = threading.local()


def _record_opener_failure(exc: BaseException) -> None:
    if getattr(_opener_failures, "error", None) is None:  # the first failure is the cause of the rest
        _opener_failures.error = exc


def _take_opener_failure() -> BaseException | None:
    error = getattr(_opener_failures, "error", None)
    _opener_failures.error = None
    return error


@contextlib.contextmanager
def surfacing_opener_errors(url: str) -> Iterator[None]:
    """Raise the failure of an fsspec read that GDAL saw as a short read, while rasterio ran in this block.

    The error raised is an :class:`OpenerReadError` naming ``url``, raised
    from the fsspec error (so :func:`pipekit.retry.is_transient` sees a lost
    connection); GDAL's own reason follows in its message.  A block that
    succeeded although a read failed (GDAL may give up on an overview or a
    mask quietly) raises too: its result may lack data.
    """
    _opener_failures.error = None
    try:
        yield
    except Exception as exc:
        failure = _take_opener_failure()
        if failure is None:
            raise
        raise OpenerReadError(
            f"reading {url} failed: {type(failure).__name__}: {failure} (GDAL: {type(exc).__name__}: {exc})"
        ) from failure
    failure = _take_opener_failure()
    if failure is not None:
        raise OpenerReadError(f"reading {url} failed: {type(failure).__name__}: {failure}") from failure


class _PositionedFile(PositionedReader):
    """A read-only view of an fsspec file with its own position.

    Some filesystems (``memory://``) hand out the *same* file object for
    every ``open``; rasterio and GDAL need one object (and position) per
    handle.  Reads seek and read under the underlying file's lock.
    """

    def __init__(self, raw: Any, lock: threading.Lock, size: int | None) -> None:
        super().__init__()
        self._raw = raw
        self._lock = lock
        self._size = size

    def _end(self) -> int | None:
        if self._size is None:
            try:
                with self._lock:
                    self._size = self._raw.seek(0, 2)
            except Exception as exc:  # never into GDAL: see OpenerReadError
                _record_opener_failure(exc)
                return None
        return self._size

    def read(self, size: int = -1) -> bytes:
        try:
            with self._lock:
                self._raw.seek(self._pos)
                data = self._raw.read(size)
        except Exception as exc:  # never into GDAL (it can abort the process): a short read, raised later
            _record_opener_failure(exc)
            return b""
        self._pos += len(data)
        return data

    def close(self) -> None:
        if not self.closed:
            with contextlib.suppress(Exception):
                if not getattr(self._raw, "_pipekit_shared", False):
                    self._raw.close()
        super().close()


class _FsspecOpener:
    """The filesystem-like object rasterio's ``opener=`` receives (one per filesystem and process)."""

    def __init__(self, fs: Any, cache: RangeCache | None = None, fetch: RangeFetcher | None = None) -> None:
        self.fs = fs
        self.cache = cache
        self.fetch = fetch
        self._locks: dict[int, threading.Lock] = {}
        self._guard = threading.Lock()
        self.shared_files = type(fs).__name__ == "MemoryFileSystem"

    def open(self, path: str, mode: str = "rb", **kwargs: Any) -> io.RawIOBase:
        if "r" not in mode or "+" in mode or "w" in mode:
            raise PermissionError(f"pipekit opens rasters read-only, not with mode {mode!r}: {path}")
        if self.cache is not None:
            try:  # a failed read: a short read for GDAL, raised by surfacing_opener_errors
                url = self.fs.unstrip_protocol(path)
                return self.cache.open(self.fs, path, url, self.fetch, _record_opener_failure)
            except Exception as exc:  # rasterio keeps only the errno: surfacing_opener_errors raises this one
                _record_opener_failure(exc)
                raise
        try:
            raw = self.fs.open(path, "rb", block_size=_FSSPEC_BLOCK_SIZE, cache_type="readahead")
        except TypeError:
            raw = self.fs.open(path, "rb")
        if self.shared_files:
            raw._pipekit_shared = True
        with self._guard:
            lock = self._locks.setdefault(id(raw), threading.Lock()) if self.shared_files else threading.Lock()
        return _PositionedFile(raw, lock, getattr(raw, "size", None))

    def isfile(self, path: str) -> bool:
        return self.fs.isfile(path)

    def isdir(self, path: str) -> bool:
        return self.fs.isdir(path)

    def ls(self, path: str) -> list[str]:
        return self.fs.ls(path, detail=False)

    def mtime(self, path: str) -> int:
        return 0

    def modified(self, path: str) -> Any:
        # rasterio's stat asks for it (its mtime); not worth a request: GDAL reads the file regardless
        raise NotImplementedError

    def size(self, path: str) -> int:
        return self.fs.size(path)


_process_lock = threading.Lock()
_process_configured_pid: int | None = None
_fsspec_openers: dict[tuple[int, str], _FsspecOpener] = {}


def _configure_process() -> None:
    """Apply :data:`GDAL_OPTIONS` once per process (rasterio sets them as GDAL config options).

    Also tunes glibc's allocator (:func:`pipekit.malloc.tune`): samples are large
    arrays that the default settings page in afresh every time.
    """
    global _process_configured_pid
    pid = os.getpid()
    if _process_configured_pid == pid:
        return
    with _process_lock:
        if _process_configured_pid != pid:
            for key, value in GDAL_OPTIONS.items():
                set_gdal_config(key, value)
            malloc.tune()
            _process_configured_pid = pid


class RasterOpener:
    """How a dataset opens its rasters; picklable, holds no handle.

    Args:
        storage_options: fsspec options for remote URLs (s3fs spelling for S3).
        vsi: ``None`` (default) opens S3 and HTTP(S) URLs with GDAL's
            ``/vsis3/``/``/vsicurl/`` when ``storage_options`` can be
            expressed as GDAL options, and everything else through fsspec;
            ``True`` insists on GDAL (``ValueError`` where impossible);
            ``False`` always goes through fsspec.
        gdal_options: extra GDAL configuration for this dataset's remote
            files (overrides :data:`REMOTE_GDAL_OPTIONS`).
        cache_dir: a local folder where the byte ranges read from remote
            files are kept (:class:`pipekit.geo.rangecache.RangeCache`):
            DataLoader workers share what any of them fetched, and later
            runs read it from local disk.  Remote files are then read
            through fsspec (``vsi=True`` is refused).  ``None`` (default):
            no disk cache.

    Example:
        >>> from pipekit.geo.io import RasterOpener
        >>> opener = RasterOpener({"endpoint_url": "http://localhost:8333", "key": "k", "secret": "s"})
        >>> opener.resolve("s3://bucket/scene.tif").path
        '/vsis3/bucket/scene.tif'
        >>> opener.resolve("s3://bucket/scene.tif").config["AWS_S3_ENDPOINT"]
        'localhost:8333'
        >>> opener.resolve("memory://data/scene.tif").kind
        'fsspec'
    """

    def __init__(
        self,
        storage_options: Mapping[str, Any] | None = None,
        vsi: bool | None = None,
        gdal_options: Mapping[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if storage_options is not None and not isinstance(storage_options, Mapping):
            raise TypeError(f"storage_options must be a mapping, got {type(storage_options).__name__}")
        if vsi not in (None, True, False):
            raise TypeError(f"vsi must be None, True or False, got {vsi!r}")
        if gdal_options is not None and not isinstance(gdal_options, Mapping):
            raise TypeError(f"gdal_options must be a mapping, got {type(gdal_options).__name__}")
        if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
            raise TypeError(f"cache_dir must be a path, got {type(cache_dir).__name__}")
        if cache_dir is not None and vsi is True:
            raise ValueError("cache_dir reads remote files through fsspec; it cannot be combined with vsi=True")
        self.storage_options = dict(storage_options or {})
        self.vsi = vsi
        self.gdal_options = {str(k): v for k, v in (gdal_options or {}).items()}
        self.cache = RangeCache(cache_dir) if cache_dir is not None else None
        self.cache_dir = self.cache.directory if self.cache is not None else None
        self.key = json.dumps(
            [self.storage_options, vsi, self.gdal_options, self.cache_dir], sort_keys=True, default=repr
        )
        self._resolved: dict[str, _Resolved] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {
            "storage_options": self.storage_options,
            "vsi": self.vsi,
            "gdal_options": self.gdal_options,
            "cache_dir": self.cache_dir,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["storage_options"], state["vsi"], state["gdal_options"], state.get("cache_dir"))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RasterOpener) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        shown = {
            k: ("***" if k in ("secret", "token", "aws_secret_access_key") else v)
            for k, v in self.storage_options.items()
        }
        cache = f", cache_dir={self.cache_dir!r}" if self.cache_dir is not None else ""
        return f"RasterOpener(storage_options={shown!r}, vsi={self.vsi!r}{cache})"

    # -- resolution ------------------------------------------------------------
    def resolve(self, url: str) -> _Resolved:
        """How ``url`` is opened: ``kind`` (``"local"``, ``"vsi"``, ``"fsspec"``), the GDAL ``path``, ``config``."""
        url = os.fspath(url)
        cached = self._resolved.get(url)
        if cached is not None:
            return cached
        resolved = self._resolve(url)
        if len(self._resolved) < 100_000:
            self._resolved[url] = resolved
        return resolved

    def _resolve(self, url: str) -> _Resolved:
        if is_local(url):
            return _Resolved("local", local_path(url), {}, {})
        protocol, rest = split_protocol(url)
        remote = {**REMOTE_GDAL_OPTIONS, **_gdal_retry_options(default_policy()), **self.gdal_options}
        if self.cache is not None:  # the disk cache sits under fsspec's reads
            return _Resolved("fsspec", url, remote, {})
        if self.vsi is not False and "::" not in url:
            if protocol in ("s3", "s3a"):
                options = _s3_gdal_options(self.storage_options)
                if options is not None:
                    config, creds = options
                    return _Resolved("vsi", "/vsis3/" + rest, {**remote, **config}, creds)
            elif protocol in ("http", "https") and not self.storage_options:
                return _Resolved("vsi", "/vsicurl/" + url, remote, {})
        if self.vsi is True:
            raise ValueError(
                f"cannot open {url!r} with GDAL's virtual filesystems (vsi=True): GDAL handles s3:// with "
                "storage_options among key/secret/token/anon/endpoint_url/client_kwargs/region, and "
                "http(s):// without storage_options; pass vsi=None to fall back to fsspec"
            )
        return _Resolved("fsspec", url, remote, {})

    def env(self, resolved: _Resolved) -> contextlib.AbstractContextManager[Any]:
        """The GDAL environment to open and read a resolved remote file in.

        On one of pipekit's I/O threads (:func:`run_remote`), the environment
        stays entered after the block, until a file with another environment
        is read there: entering ``rasterio.Env`` costs ~85 µs, and a sample of
        a scene enters it once for every file it opens and every band it reads.
        """
        if resolved.kind == "local":
            return contextlib.nullcontext()
        if LANE_ENV and on_io_thread():
            _enter_lane_env(resolved, self._new_env)
            return contextlib.nullcontext()
        return self._new_env(resolved)

    def _new_env(self, resolved: _Resolved) -> rasterio.Env:
        session = _Credentials(resolved.credentials) if resolved.credentials else None
        if session is None:
            return rasterio.Env(**resolved.config)
        return rasterio.Env(session=session, **resolved.config)

    def fsspec_opener(self, url: str) -> tuple[_FsspecOpener, str]:
        import fsspec

        fs, path = fsspec.core.url_to_fs(url, **self.storage_options)
        key = (os.getpid(), f"{id(fs)} {self.cache!r}")
        opener = _fsspec_openers.get(key)
        if opener is None or opener.fs is not fs:
            opener = _fsspec_openers[key] = _FsspecOpener(fs, self.cache, self._fetcher(url))
        return opener, path

    def _fetcher(self, url: str) -> RangeFetcher | None:
        """The lean fetcher of the range cache's misses for ``url``'s store, where one applies."""
        if self.cache is None or "::" in url or not FAST_FETCH:
            return None
        protocol = split_protocol(url)[0]
        if protocol in ("s3", "s3a"):
            options = _s3_gdal_options(self.storage_options)
            return s3_fetcher(*options) if options is not None else None
        if protocol in ("http", "https") and not self.storage_options:
            return RangeFetcher("")
        return None

    def open(self, url: str, stage: str = "RasterOpener") -> rasterio.io.DatasetReader:
        """Open ``url`` (uncached; the caller closes it).

        Raises:
            ReadError: naming ``url`` and ``stage`` when it cannot be opened.
        """
        _configure_process()
        resolved = self.resolve(url)

        def open_once() -> rasterio.io.DatasetReader:
            with self.env(resolved):
                if resolved.kind == "fsspec":
                    opener, path = self.fsspec_opener(url)
                    with surfacing_opener_errors(url):
                        return rasterio.open(path, opener=opener)
                return rasterio.open(resolved.path)

        try:
            if resolved.kind == "local":
                return open_once()
            return _retrying(open_once, "open raster", url, stage)
        except ReadError:
            raise
        except Exception as exc:
            reason = error_reason(exc)
            if resolved.kind == "fsspec":
                with contextlib.suppress(Exception):
                    opener, path = self.fsspec_opener(url)
                    if not opener.fs.exists(path):
                        reason = "no such file"
            elif resolved.kind == "local" and not os.path.exists(resolved.path):
                reason = "no such file"
            raise ReadError("open raster", url, stage, reason) from exc


def _retrying(fn: Callable[[], T], action: str, url: str, stage: str) -> T:
    """``fn()`` under the default retry policy, GDAL's network errors counted as transient.

    GDAL retries HTTP requests itself (:func:`_gdal_retry_options`); this outer
    loop covers what it does not (a refused connection while a server restarts).
    """
    return default_policy().call(fn, action=action, url=url, stage=stage, transient=is_transient_gdal)


# GDAL's words for a read that got fewer bytes than it asked for (a lost connection, or a truncated file)
_SHORT_READ = re.compile(r"(?i)read error at|got \d+ bytes, expected|unexpected end|short read")


def store_unreachable(opener: RasterOpener, url: str) -> bool:
    """Whether asking the server about ``url`` (a ``HEAD``, through fsspec) fails transiently right now.

    GDAL reports a window read that lost its connection as a short read
    (``got 0 bytes, expected N``), as it would a truncated file: this probe
    tells the two apart.
    """
    import fsspec

    options = dict(opener.storage_options)
    if split_protocol(url)[0] in ("s3", "s3a"):  # one request: botocore's own retries would outlast short outages
        config = dict(options.get("config_kwargs") or {})
        config["retries"] = {"max_attempts": 1, "mode": "standard"}
        options["config_kwargs"] = config
    try:
        fs, path = fsspec.core.url_to_fs(url, **options)
        with contextlib.suppress(Exception):
            fs.invalidate_cache(path)
        fs.info(path)
    except Exception as exc:
        return is_transient(exc)
    return False


def retry_read(
    fn: Callable[[], T], *, opener: RasterOpener, url: str, stage: str, recover: Callable[[], None] | None = None
) -> T:
    """``fn()`` (a window read of remote rasters) tried again after transient failures, under the default budget.

    GDAL retries each HTTP request a few times by itself; this covers an
    outage longer than that (an object store restarting).  A failure is
    transient when GDAL names a network error, or when the server of the file
    that failed cannot be reached (:func:`store_unreachable`); a short read
    while the server answers is tried once more (it may just have come back).  ``recover``
    runs before each retry (close the cached handles, so the files are opened
    again).  A 404/403, a truncated or corrupt file, or an open that already
    spent its own retry budget is not retried.  When the budget runs out, the
    :class:`~pipekit.errors.ReadError` names the file that failed (the ``url``
    attribute of the last error, else ``url``), the stage and the attempts.
    """

    reachable_failures = [0]

    def transient(exc: BaseException) -> bool:
        if isinstance(exc, ReadError) and exc.action == "open raster":
            return False  # RasterOpener.open retried it already
        if is_transient_gdal(exc):
            return True
        failed = getattr(exc, "url", None)
        if store_unreachable(opener, failed if isinstance(failed, str) else url):
            return True
        # the server answers: a short read may be a connection lost just before it came back, so one
        # more try with the file opened again; a failure that repeats, or a decoding error, is the file's own
        if not _SHORT_READ.search(error_reason(exc)):
            return False
        reachable_failures[0] += 1
        return reachable_failures[0] == 1

    try:
        return default_policy().call(
            fn, action="read raster", url=url, stage=stage, recover=recover, transient=transient
        )
    except ReadError as exc:
        failed = getattr(exc.__cause__, "url", None)
        if exc.action == "read raster" and exc.url == url and isinstance(failed, str) and failed != url:
            raise ReadError(exc.action, failed, exc.stage, exc.reason) from exc.__cause__
        raise


#: Keep the GDAL environment of the last remote file entered on each I/O thread (see
#: :meth:`RasterOpener.env`); ``False`` enters and leaves it around every open and read, as before.
LANE_ENV = True

_lane_envs = threading.local()


def _enter_lane_env(resolved: _Resolved, make: Callable[[_Resolved], rasterio.Env]) -> None:
    """Make ``resolved``'s GDAL environment the one entered on this I/O thread (leaving another first)."""
    if getattr(_lane_envs, "key", None) == resolved.env_key and rasterio.env.hasenv():
        return
    leave_lane_env()
    env = make(resolved)
    env.__enter__()
    _lane_envs.env, _lane_envs.key = env, resolved.env_key


def leave_lane_env() -> None:
    """Leave the GDAL environment this thread keeps entered, if any (see :meth:`RasterOpener.env`)."""
    env = getattr(_lane_envs, "env", None)
    _lane_envs.env = _lane_envs.key = None
    if env is not None and rasterio.env.hasenv():  # (an outer environment that ended took it along)
        env.__exit__(None, None, None)


class _Resolved:
    __slots__ = ("config", "credentials", "env_key", "kind", "path")

    def __init__(self, kind: str, path: str, config: dict[str, Any], credentials: dict[str, str]) -> None:
        self.kind = kind
        self.path = path
        self.config = config
        self.credentials = credentials
        # identifies the GDAL environment of the file: an I/O thread keeps it entered (see _enter_lane_env)
        self.env_key = json.dumps([kind == "fsspec", config, credentials], sort_keys=True, default=repr)

    def __repr__(self) -> str:
        return f"_Resolved({self.kind!r}, {self.path!r})"


_handle_tokens = itertools.count()


class RasterHandle:
    """An open raster and the metadata a read needs, looked up once when it was opened."""

    __slots__ = (
        "__weakref__",
        "cost",
        "count",
        "crs",
        "ds",
        "dtype",
        "height",
        "nodata",
        "np_dtype",
        "opener",
        "prefetch",
        "remote",
        "resolved",
        "reusable",
        "same_crs",
        "token",
        "transform",
        "url",
        "width",
    )

    def __init__(self, url: str, ds: Any, opener: RasterOpener, resolved: _Resolved) -> None:
        self.url = url
        self.ds = ds
        self.opener = opener
        self.resolved = resolved
        self.crs = ds.crs
        self.transform = ds.transform
        self.width = ds.width
        self.height = ds.height
        self.count = ds.count
        self.dtype = ds.dtypes[0] if ds.count else "uint8"
        self.np_dtype = np.dtype(self.dtype)
        self.nodata = ds.nodata
        self.remote = resolved.kind != "local"
        self.same_crs: dict[str, bool] = {}
        # identifies this opening in per-process caches of derived data (pipekit.geo.warpcache);
        # ``reusable``: held by the handle cache, so such data may be used again
        self.token = next(_handle_tokens)
        self.reusable = False
        if resolved.kind == "local":
            self.cost = _LOCAL_HANDLE_COST
        elif resolved.kind == "vsi":
            cache = str(resolved.config.get("VSI_CACHE", "FALSE")).upper() in ("TRUE", "YES", "ON", "1")
            self.cost = _LOCAL_HANDLE_COST + (int(resolved.config.get("VSI_CACHE_SIZE", 25 * 2**20)) if cache else 0)
        else:
            self.cost = _LOCAL_HANDLE_COST + 4 * _FSSPEC_BLOCK_SIZE
        self.prefetch: _TilePrefetcher | None = None
        if resolved.kind == "fsspec" and opener.cache is not None and PREFETCH_TILES and ds.driver == "GTiff":
            self.prefetch = _TilePrefetcher(self, *opener.fsspec_opener(url))

    def env(self) -> contextlib.AbstractContextManager[Any]:
        """The GDAL environment reads of this handle run in (a no-op for local files)."""
        if not self.remote:
            return contextlib.nullcontext()
        if self.resolved.kind == "fsspec":
            return _fsspec_read_env(self.opener.env(self.resolved), self.url)
        return self.opener.env(self.resolved)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ds.close()

    def __repr__(self) -> str:
        return f"RasterHandle({self.url!r})"


class _TilePrefetcher:
    """Fetch the tiles a window read will decode into the range cache first, all at once.

    GDAL reads a window's tiles one after another through a Python file
    object (one round trip each); their byte ranges are in the TIFF's tile
    index (GDAL's ``BLOCK_OFFSET_x_y`` / ``BLOCK_SIZE_x_y`` items), so the
    missing ones are fetched together before GDAL asks.  Only a speed-up: a
    read the prediction misses (an overview, a mask) is fetched on demand.
    """

    def __init__(self, handle: RasterHandle, opener: _FsspecOpener, path: str) -> None:
        self.ds = handle.ds
        self.url = handle.url
        self.opener, self.path = opener, path
        self.blocks = {i: shape for i, shape in zip(self.ds.indexes, self.ds.block_shapes, strict=True)}
        self.interleaved = self.ds.interleaving is not None and self.ds.interleaving.name == "PIXEL"
        self.tiles: dict[tuple[int, int, int], tuple[int, int] | None] = {}
        self.off = False
        self.mirror: Any = None

    def _tile(self, band: int, x: int, y: int) -> tuple[int, int] | None:
        key = (band, x, y)
        if key not in self.tiles:
            offset = self.ds.get_tag_item(f"BLOCK_OFFSET_{x}_{y}", "TIFF", bidx=band)
            size = self.ds.get_tag_item(f"BLOCK_SIZE_{x}_{y}", "TIFF", bidx=band)
            self.tiles[key] = (int(offset), int(offset) + int(size)) if offset and size and int(size) else None
        return self.tiles[key]

    def __call__(self, indexes: Sequence[int], window: Any) -> None:
        col0, row0 = max(int(window.col_off), 0), max(int(window.row_off), 0)
        col1 = min(math.ceil(window.col_off + window.width), self.ds.width)
        row1 = min(math.ceil(window.row_off + window.height), self.ds.height)
        if col1 <= col0 or row1 <= row0:
            return
        if self.off:
            return
        ranges = []
        try:
            for band in indexes[:1] if self.interleaved else indexes:
                bh, bw = self.blocks[band]
                for y in range(row0 // bh, (row1 - 1) // bh + 1):
                    for x in range(col0 // bw, (col1 - 1) // bw + 1):
                        tile = self._tile(band, x, y)
                        if tile is not None:
                            ranges.append(tile)
        except (rasterio.errors.RasterioError, ValueError, KeyError) as exc:
            # a TIFF whose tile index GDAL does not expose: its tiles are fetched as GDAL reads them (a
            # failed fetch is not lost here: it was recorded and is raised when the read's block ends)
            logger.debug("%s: no tile prefetch (%s)", self.url, exc)
            self.off = True
            return
        if ranges:
            if self.mirror is None:  # the file is open, so its mirror exists: found once, not per read
                cache = self.opener.cache
                assert cache is not None
                self.mirror = cache.mirror(self.opener.fs, self.path, self.opener.fs.unstrip_protocol(self.path))
            self.mirror.ensure(self.opener.fs, self.path, ranges, self.opener.fetch)


@contextlib.contextmanager
def _fsspec_read_env(env: contextlib.AbstractContextManager[Any], url: str) -> Iterator[None]:
    with env, surfacing_opener_errors(url):
        yield


def open_handle(opener: RasterOpener, url: str, stage: str = "RasterOpener") -> RasterHandle:
    """Open ``url`` and wrap it in a :class:`RasterHandle` (uncached; call ``close()``)."""
    ds = opener.open(url, stage)
    return RasterHandle(url, ds, opener, opener.resolve(url))


# -- the per-process, per-thread handle cache -----------------------------------------------

_budget = {
    "max_files": int(os.environ.get("PIPEKIT_GEO_MAX_OPEN_FILES", "128")),
    "max_bytes": int(os.environ.get("PIPEKIT_GEO_MAX_HANDLE_BYTES", str(1 << 30))),
}


def set_handle_budget(max_files: int | None = None, max_bytes: int | None = None) -> None:
    """Bound the open raster handles of each reading thread (in each process).

    Args:
        max_files: most open files (default 128, or ``PIPEKIT_GEO_MAX_OPEN_FILES``).
        max_bytes: most estimated memory held by their caches (default 1 GiB,
            or ``PIPEKIT_GEO_MAX_HANDLE_BYTES``): a local file counts 64 KiB,
            a remote one its ``VSI_CACHE_SIZE`` or fsspec block cache as well.
    """
    for name, value in (("max_files", max_files), ("max_bytes", max_bytes)):
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
            _budget[name] = value


def handle_budget() -> dict[str, int]:
    """The current budget, ``{"max_files": ..., "max_bytes": ...}``."""
    return dict(_budget)


class _HandleCache:
    __slots__ = ("__weakref__", "entries", "lane", "nbytes", "pid")

    def __init__(self) -> None:
        self.pid = os.getpid()
        # the I/O lane this cache belongs to (None: another thread); its handles are closed there
        self.lane: int | None = getattr(_local, "io_lane_index", None)
        self.entries: OrderedDict[tuple[str, str], RasterHandle] = OrderedDict()
        self.nbytes = 0

    def get(self, opener: RasterOpener, url: str, stage: str) -> RasterHandle:
        key = (opener.key, url)
        handle = self.entries.get(key)
        if handle is not None:
            self.entries.move_to_end(key)
            return handle
        handle = open_handle(opener, url, stage)
        handle.reusable = True
        self.entries[key] = handle
        self.nbytes += handle.cost
        self._shrink()
        return handle

    def evict(self, opener: RasterOpener, url: str) -> None:
        handle = self.entries.pop((opener.key, url), None)
        if handle is not None:
            self.nbytes -= handle.cost
            handle.close()

    def _shrink(self) -> None:
        while len(self.entries) > 1 and (
            len(self.entries) > _budget["max_files"] or self.nbytes > _budget["max_bytes"]
        ):
            _, old = self.entries.popitem(last=False)
            self.nbytes -= old.cost
            old.close()

    def clear(self) -> None:
        while self.entries:
            _, old = self.entries.popitem(last=False)
            old.close()
        self.nbytes = 0


_local = threading.local()
# Caches inherited from a parent process through fork: kept referenced and never
# closed in the child (closing would touch file descriptions the parent shares).
_inherited: list[_HandleCache] = []
# Every cache of this process, closed at exit while fsspec and GDAL are still alive.
_caches: weakref.WeakSet[_HandleCache] = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    pid = os.getpid()
    lanes = _remote_pool if _remote_pool is not None and _remote_pool.pid == pid else None
    for cache in list(_caches):
        if cache.pid == pid:
            with contextlib.suppress(Exception):
                if (
                    cache.lane is not None
                    and lanes is not None
                    and lanes.lanes[cache.lane].is_alive()
                    and any(h.resolved.kind == "fsspec" for h in list(cache.entries.values()))
                ):
                    # on the lane that opened them: rasterio keeps the Python file objects of a dataset
                    # opened with opener= per thread, and closing one elsewhere fails ("I/O error");
                    # a lane stuck in a read is not waited for long: the process is ending
                    batch = _Batch(lambda _, c=cache: c.clear(), 1, 1)
                    lanes.lanes[cache.lane].jobs.put((batch, [0]))
                    if batch.done.acquire(timeout=5.0):
                        continue
                else:
                    cache.clear()


def _cache() -> _HandleCache:
    cache = getattr(_local, "cache", None)
    pid = os.getpid()
    if cache is None or cache.pid != pid:
        if cache is not None:
            _inherited.append(cache)
        cache = _local.cache = _HandleCache()
        _caches.add(cache)
    return cache


def cached_handle(opener: RasterOpener, url: str, stage: str = "RasterOpener") -> RasterHandle:
    """The open handle of ``url`` for this process and thread, opening it if needed."""
    return _cache().get(opener, url, stage)


def evict_handle(opener: RasterOpener, url: str) -> None:
    """Close and forget this thread's handle of ``url`` (after a failed read)."""
    _cache().evict(opener, url)


# -- GDAL's network I/O on dedicated threads ---------------------------------------------------
#
# GDAL keeps its HTTP connections (for /vsis3/, /vsicurl/) in thread-local storage.  A forked
# DataLoader worker inherits a copy of the forking thread's storage, and so would send its
# requests down the very sockets its parent (and its sibling workers) use, mixing up the
# replies.  All of pipekit's GDAL network I/O therefore runs on threads of its own: threads do
# not survive a fork, so every process starts with fresh connections.

REMOTE_IO_THREADS = 4

#: Read the files of one sample (the band files of a scene) at once, each on
#: its own I/O thread (:func:`run_parts`), instead of one after another: a
#: sample from an object store then waits for its slowest file, not for the
#: sum of them.  ``False`` restores the serial reads (benchmarks compare them).
CONCURRENT_PARTS = True


class _Batch:
    """The parts of one :func:`run_parts` call: their results and errors, and a latch the last lane opens.

    Each lane runs its share of the parts one after another
    (:meth:`run`); the lane that finishes last releases :attr:`done`, which
    the caller waits on.  Cheaper than a future per part: no condition
    variables, no waiter objects, one queue entry per lane.
    """

    __slots__ = ("cancelled", "done", "errors", "fn", "results", "tokens")

    def __init__(self, fn: Callable[[int], Any], count: int, groups: int) -> None:
        self.fn = fn
        self.results: list[Any] = [None] * count
        self.errors: list[BaseException | None] = [None] * count
        self.tokens = list(range(groups))  # list.pop is atomic: the lane that pops 0 is the last one
        self.done = threading.Lock()
        self.done.acquire()
        self.cancelled = False  # the caller was interrupted: parts not started yet are dropped

    def run(self, parts: list[int]) -> None:
        try:
            for k in parts:
                if self.cancelled:
                    break
                try:
                    self.results[k] = self.fn(k)
                except BaseException as exc:  # handed to the caller, which raises it in part order
                    self.errors[k] = exc
        finally:
            if self.tokens.pop() == 0:
                self.done.release()

    def wait(self) -> None:
        """Block until every lane has run its parts (parts not started are dropped if interrupted)."""
        try:
            self.done.acquire()
        except BaseException:
            self.cancelled = True
            self.done.acquire()  # parts already running write into the caller's arrays: let them finish
            raise


class _Lane(threading.Thread):
    """One GDAL network I/O thread: runs ``(batch, parts)`` jobs from its queue, in order."""

    def __init__(self, k: int) -> None:
        # daemon: an idle lane waiting on its queue must not keep the interpreter from exiting
        super().__init__(name=f"pipekit-geo-io-{k}", daemon=True)
        self.index = k
        self.jobs: queue.SimpleQueue[tuple[_Batch, list[int]] | None] = queue.SimpleQueue()
        self.running = False

    def run(self) -> None:
        _local.io_lane = True
        _local.io_lane_index = self.index
        jobs = self.jobs
        while True:
            job = jobs.get()
            if job is None:
                return
            self.running = True
            try:
                job[0].run(job[1])
            finally:
                self.running = False

    def load(self) -> int:
        """Jobs queued or running on this lane."""
        return self.jobs.qsize() + self.running


class _Lanes:
    """This process's GDAL network I/O threads: ``REMOTE_IO_THREADS`` lanes, each one thread with a job queue.

    Each lane is one thread, with its own handle cache (:func:`cached_handle`
    is per thread): part ``k`` of a read always goes to lane ``k %
    REMOTE_IO_THREADS``, so the file of a scene's ``k``-th band is opened on
    one lane only and its handle found there again on the next sample.
    """

    def __init__(self, count: int) -> None:
        self.pid = os.getpid()
        self.lanes = [_Lane(k) for k in range(count)]
        for lane in self.lanes:
            lane.start()

    def run(self, fn: Callable[[int], T], count: int, lane_of: Callable[[int], int]) -> _Batch:
        """Run ``fn(0), ..., fn(count - 1)``, ``fn(k)`` on lane ``lane_of(k)``; returns the finished batch."""
        groups: dict[int, list[int]] = {}
        for k in range(count):
            groups.setdefault(lane_of(k) % len(self.lanes), []).append(k)
        batch = _Batch(fn, count, len(groups))
        for lane, parts in groups.items():
            self.lanes[lane].jobs.put((batch, parts))
        batch.wait()
        return batch

    def idlest(self) -> int:
        """The lane with the fewest jobs queued or running (the first of them: one caller keeps to lane 0)."""
        loads = [lane.load() for lane in self.lanes]
        return loads.index(min(loads))


_remote_pool: _Lanes | None = None
_remote_lock = threading.Lock()


def _remote_lanes() -> _Lanes:
    global _remote_pool
    pid = os.getpid()
    lanes = _remote_pool
    if lanes is None or lanes.pid != pid:
        with _remote_lock:
            lanes = _remote_pool
            if lanes is None or lanes.pid != pid:
                # lanes inherited through fork have no threads: never touch them
                lanes = _remote_pool = _Lanes(REMOTE_IO_THREADS)
    return lanes


def on_io_thread() -> bool:
    """Whether the calling thread is one of pipekit's GDAL network I/O threads."""
    return getattr(_local, "io_lane", False)


def run_remote(fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(*args)`` on one of this process's GDAL network I/O threads (the idlest) and return its result."""
    if on_io_thread():
        return fn(*args)
    lanes = _remote_lanes()
    lane = lanes.idlest()
    batch = lanes.run(lambda _: fn(*args), 1, lambda _: lane)
    error = batch.errors[0]
    if error is not None:
        raise error
    return batch.results[0]


def run_parts(
    fn: Callable[[int], T], count: int, failed: Callable[[int], None] | None = None, lanes: Sequence[int] | None = None
) -> list[T]:
    """``[fn(0), ..., fn(count - 1)]``, each ``fn(k)`` on I/O thread ``k % REMOTE_IO_THREADS``, all at once.

    The parts of one read (the band files of a scene): GDAL releases the GIL
    while it waits on the network, so the requests of the parts overlap.
    Returns when every part has finished (none still writes into the
    caller's arrays).  If parts failed, ``failed(k)`` is called with the
    first of them in part order and its error raised, as a serial loop would.
    On an I/O thread already, the parts run here, one after another
    (``failed(k)`` for the one that raised).  ``lanes``: run
    ``fn(k)`` on thread ``lanes[k] % REMOTE_IO_THREADS`` instead (where
    part ``lanes[k]`` of an earlier call left its handle).  Parts that
    share a thread run on it one after another, in part order.
    """
    if on_io_thread():
        out = []
        for k in range(count):
            try:
                out.append(fn(k))
            except BaseException:
                if failed is not None:
                    failed(k)
                raise
        return out
    batch = _remote_lanes().run(fn, count, (lambda k: k) if lanes is None else lanes.__getitem__)
    for k, error in enumerate(batch.errors):
        if error is not None:
            if failed is not None:
                failed(k)
            raise error
    return batch.results


def uses_gdal_network(opener: RasterOpener, url: str) -> bool:
    """Whether ``url``'s reads wait on the network inside GDAL (so they run on the I/O threads).

    GDAL's ``/vsis3/`` and ``/vsicurl/``, and files read through the range
    cache (``cache_dir=``): its misses are fetched while GDAL waits, with
    the GIL released.
    """
    if is_local(url):
        return False
    kind = opener.resolve(url).kind
    return kind == "vsi" or (kind == "fsspec" and opener.cache is not None)


def cached_handle_count() -> int:
    """How many handles this process and thread hold open."""
    return len(_cache().entries)


def close_cached_handles() -> None:
    """Close every handle this process and thread holds."""
    _cache().clear()
