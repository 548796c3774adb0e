"""Retrying remote I/O through transient failures (server restarts, throttling, dropped connections).

A :class:`RetryPolicy` says which failures are worth another try
(:func:`is_transient`: refused, reset or timed-out connections, HTTP 5xx,
throttling) and how long to keep trying: exponential backoff with full jitter
(each wait is uniform in ``[0, min(max_delay, base_delay * 2**n)]``) under a
budget of ``attempts`` and ``max_seconds``.  A missing object (404) or a
refused permission (403) is never retried.  Each retry is logged as a warning
on the ``pipekit.retry`` logger with the URL; when the budget runs out a
:class:`~pipekit.errors.ReadError` names the URL, the stage and the attempts.

The default budget (10 attempts, 120 s) outlasts an object store restart of
about 30 s.  Set it for the whole process with the environment variables
``PIPEKIT_RETRY_ATTEMPTS`` and ``PIPEKIT_RETRY_SECONDS`` (``PIPEKIT_RETRY_ATTEMPTS=1``
turns retrying off), or per pipe with ``retry=``: a :class:`RetryPolicy`, an
int (attempts), ``False`` (no retries) or ``None`` (the default).

A server that accepts a connection and then stops answering must not hang a
read: every remote read pipekit makes (s3fs and HTTP through fsspec,
``read_from_http``, GDAL's ``/vsis3/`` and ``/vsicurl/``) waits at most
:data:`DEFAULT_CONNECT_TIMEOUT` (5 s) for a connection and
:data:`DEFAULT_READ_TIMEOUT` (15 s) for the next bytes of an answer; a try
that times out is a transient failure, retried under the policy above.  Set
them for the process with ``PIPEKIT_CONNECT_TIMEOUT`` and
``PIPEKIT_READ_TIMEOUT`` (seconds), or per pipe: s3fs's
``storage_options={"config_kwargs": {"connect_timeout": ..., "read_timeout": ...}}``,
HTTP's ``client_kwargs={"timeout": aiohttp.ClientTimeout(...)}``, ``read_from_http(timeout=...)``,
a geo dataset's ``gdal_options={"GDAL_HTTP_CONNECTTIMEOUT": ..., "GDAL_HTTP_LOW_SPEED_TIME": ...}``.

Example:
    >>> calls = []
    >>> def flaky() -> str:
    ...     calls.append(1)
    ...     if len(calls) < 3:
    ...         raise ConnectionResetError(104, "Connection reset by peer")
    ...     return "data"
    >>> policy = RetryPolicy(attempts=5, max_seconds=10, base_delay=0.001)
    >>> policy.call(flaky, action="read", url="s3://bucket/key", stage="doc")
    'data'
    >>> len(calls)
    3
    >>> def missing() -> None:
    ...     raise FileNotFoundError("s3://bucket/nokey")
    >>> policy.call(missing, action="open", url="s3://bucket/nokey", stage="doc")
    Traceback (most recent call last):
    ...
    FileNotFoundError: s3://bucket/nokey
"""

from __future__ import annotations

import errno
import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pipekit._redact import redact_secrets, redact_url
from pipekit.errors import ReadError, StageError

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_READ_TIMEOUT",
    "RetryPolicy",
    "Timeouts",
    "default_policy",
    "default_timeouts",
    "is_transient",
    "resolve_retry",
    "with_timeouts",
]

logger = logging.getLogger("pipekit.retry")

T = TypeVar("T")

# errnos of a connection that failed or broke, and of a server that is busy (s3fs maps 503/SlowDown to EBUSY)
_TRANSIENT_ERRNOS = frozenset(
    {
        errno.ECONNREFUSED,
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.ETIMEDOUT,
        errno.EPIPE,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.ENETDOWN,
        errno.ENETRESET,
        errno.EBUSY,
        errno.EAGAIN,
        getattr(errno, "EREMOTEIO", 121),  # s3fs: 500 InternalError
    }
)
# S3 error codes of a busy or failing server (besides any 5xx status)
_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "InternalError",
        "ServiceUnavailable",
        "503",
        "500",
    }
)
# never retried, whatever caused them: the object or the permission is not there
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError)


def _is_transient_one(exc: BaseException) -> bool:
    try:
        import botocore.exceptions as bce
    except ImportError:  # pragma: no cover - s3fs brings botocore
        bce = None
    if bce is not None:
        if isinstance(exc, bce.ClientError):
            response = getattr(exc, "response", None) or {}
            code = str((response.get("Error") or {}).get("Code", ""))
            status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            return code in _TRANSIENT_CODES or (isinstance(status, int) and (status >= 500 or status == 429))
        if isinstance(exc, bce.ConnectionError | bce.HTTPClientError | bce.ResponseStreamingError):
            return True  # EndpointConnectionError, ConnectionClosedError, Connect/ReadTimeoutError...
    try:
        import aiohttp
    except ImportError:  # pragma: no cover
        aiohttp = None
    if aiohttp is not None and isinstance(
        exc, aiohttp.ClientConnectionError | aiohttp.ClientPayloadError | aiohttp.ServerTimeoutError
    ):
        return True
    if isinstance(exc, ConnectionError | TimeoutError):
        return True
    return isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a failure that may go away if the call is tried again.

    Looks at ``exc`` and the errors it was raised from (``__cause__`` and
    ``__context__``): s3fs turns botocore's errors into ``OSError``\\ s, and
    pipekit's stages wrap them in :class:`~pipekit.errors.StageError`.  A
    ``FileNotFoundError`` or ``PermissionError`` (404, 403) is never transient.

    Example:
        >>> is_transient(ConnectionRefusedError(111, "Connection refused"))
        True
        >>> is_transient(FileNotFoundError("s3://bucket/key"))
        False
        >>> is_transient(ValueError("bad header"))
        False
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, _PERMANENT):
            # fsspec's HTTP filesystem reports any failure to stat a URL, a timeout included, as
            # FileNotFoundError raised from it: the failure it was raised from decides
            return _masked_failure(current) is not None
        if not isinstance(current, StageError) and _is_transient_one(current):
            return True
        current = current.__cause__ if current.__cause__ is not None else current.__context__
    return False


def _masked_failure(exc: BaseException) -> BaseException | None:
    """The transient network failure a ``FileNotFoundError`` was raised from (``raise ... from``), if any."""
    cause = exc.__cause__
    if type(exc) is FileNotFoundError and cause is not None and not isinstance(cause, _PERMANENT) \
            and is_transient(cause):
        return cause
    return None


def _env_number(name: str, kind: type, default: Any) -> Any:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {value!r}") from None


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry a remote call that failed transiently.

    Args:
        attempts: the most tries in all (1: no retries).
        max_seconds: no new try starts later than this many seconds after the first.
        base_delay: the backoff's first cap in seconds; the n-th wait is uniform
            in ``[0, min(max_delay, base_delay * 2**n)]`` (full jitter).
        max_delay: the largest wait between two tries.
    """

    attempts: int = 10
    max_seconds: float = 120.0
    base_delay: float = 0.5
    max_delay: float = 10.0

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int) or self.attempts < 1:
            raise ValueError(f"attempts must be a positive integer, got {self.attempts!r}")
        for name in ("max_seconds", "base_delay", "max_delay"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"{name} must be a non-negative number, got {value!r}")

    @classmethod
    def from_env(cls) -> RetryPolicy:
        """The policy set by ``PIPEKIT_RETRY_ATTEMPTS`` and ``PIPEKIT_RETRY_SECONDS`` (defaults otherwise)."""
        return cls(
            attempts=_env_number("PIPEKIT_RETRY_ATTEMPTS", int, cls.attempts),
            max_seconds=_env_number("PIPEKIT_RETRY_SECONDS", float, cls.max_seconds),
        )

    def delay(self, retry: int) -> float:
        """The wait before retry number ``retry`` (0 for the first retry): full jitter."""
        return random.uniform(0.0, min(self.max_delay, self.base_delay * 2.0**retry))

    def call(self, fn: Callable[[], T], *, action: str, url: str, stage: str,
             recover: Callable[[], None] | None = None,
             transient: Callable[[BaseException], bool] | None = None) -> T:
        """``fn()``, tried again after each transient failure while the budget lasts.

        ``recover`` (if given) runs before each retry (reopen a file, seek);
        its own transient failures count as failed tries.  ``transient``
        replaces :func:`is_transient` as the test of a failure (GDAL's errors
        need their own).  A failure that is not transient propagates unchanged.  When the budget runs out, raises
        :class:`~pipekit.errors.ReadError` ``cannot <action> '<url>' in
        <stage>: <last error> (gave up after N attempts in S s)`` from the
        last error.
        """
        transient = transient or is_transient
        start = time.monotonic()
        tries = 0
        while True:
            tries += 1
            try:
                if tries > 1 and recover is not None:
                    recover()
                return fn()
            except Exception as exc:
                if not transient(exc):
                    raise
                elapsed = time.monotonic() - start
                wait = self.delay(tries - 1)
                if tries >= self.attempts or elapsed + wait > self.max_seconds:
                    reason = (
                        f"{_reason(exc)} (gave up after {tries} attempt{'s' if tries != 1 else ''} "
                        f"in {elapsed:.1f} s)"
                    )
                    raise ReadError(action, url, stage, reason) from exc
                failed = getattr(exc, "url", None)  # the file that failed, when a call reads several
                logger.warning(
                    "%s: cannot %s %r (%s); retry %d of %d in %.2f s",
                    stage, action, redact_url(failed if isinstance(failed, str) and failed else url),
                    redact_secrets(_reason(exc)), tries,
                    self.attempts - 1, wait,
                )
                time.sleep(wait)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, StageError):
        return exc.reason
    masked = _masked_failure(exc) if isinstance(exc, FileNotFoundError) else None
    if masked is not None:
        exc = masked
    return f"{type(exc).__name__}: {exc}"


def default_policy() -> RetryPolicy:
    """The process-wide default: :meth:`RetryPolicy.from_env`."""
    return RetryPolicy.from_env()


#: Seconds a remote read waits for the server to accept a connection (``PIPEKIT_CONNECT_TIMEOUT``).
DEFAULT_CONNECT_TIMEOUT = 5.0
#: Seconds a remote read waits for the next bytes of an answer (``PIPEKIT_READ_TIMEOUT``).
DEFAULT_READ_TIMEOUT = 15.0


@dataclass(frozen=True)
class Timeouts:
    """How long a remote read waits for a connection (``connect``) and for the next bytes (``read``), in seconds.

    Example:
        >>> Timeouts(connect=2, read=10).read
        10
    """

    connect: float = DEFAULT_CONNECT_TIMEOUT
    read: float = DEFAULT_READ_TIMEOUT

    def __post_init__(self) -> None:
        for name in ("connect", "read"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"{name} timeout must be a positive number of seconds, got {value!r}")

    @classmethod
    def from_env(cls) -> Timeouts:
        """The timeouts set by ``PIPEKIT_CONNECT_TIMEOUT`` and ``PIPEKIT_READ_TIMEOUT`` (defaults otherwise)."""
        return cls(
            connect=_env_number("PIPEKIT_CONNECT_TIMEOUT", float, cls.connect),
            read=_env_number("PIPEKIT_READ_TIMEOUT", float, cls.read),
        )


def default_timeouts() -> Timeouts:
    """The process-wide remote read timeouts: :meth:`Timeouts.from_env`."""
    return Timeouts.from_env()


_S3_PROTOCOLS = frozenset({"s3", "s3a"})
_HTTP_PROTOCOLS = frozenset({"http", "https"})


def with_timeouts(url: str, storage_options: dict[str, Any]) -> dict[str, Any]:
    """``storage_options`` for opening ``url`` with fsspec, with the remote read timeouts filled in.

    For ``s3://`` (s3fs): ``config_kwargs`` ``connect_timeout`` and
    ``read_timeout`` from :func:`default_timeouts`, and botocore's own retries
    off (``retries={"total_max_attempts": 1}``: s3fs retries a timed-out
    request 5 times, then :class:`RetryPolicy` takes over with its warning;
    botocore's 5 tries inside each of s3fs's made a dead server cost over 6
    minutes a call).  For ``http(s)://``: ``client_kwargs["timeout"]`` an
    ``aiohttp.ClientTimeout`` bounding connecting and each read (not a whole
    download).  What the caller set is kept; other protocols are returned
    unchanged.  In a chained URL (``simplecache::s3://...``) the options go to
    the remote protocol's own entry.

    Example:
        >>> with_timeouts("s3://bucket/key", {})["config_kwargs"]["read_timeout"] == default_timeouts().read
        True
        >>> with_timeouts("s3://b/k", {"config_kwargs": {"read_timeout": 2}})["config_kwargs"]["read_timeout"]
        2
        >>> with_timeouts("/local/file", {})
        {}
    """
    if "://" not in url:
        return storage_options
    chained = "::" in url
    inner = url.rsplit("::", 1)[-1] if chained else url
    protocol = inner.split("://", 1)[0].lower()
    if protocol not in _S3_PROTOCOLS and protocol not in _HTTP_PROTOCOLS:
        return storage_options
    own = dict(storage_options.get(protocol) or {}) if chained else dict(storage_options)
    timeouts = default_timeouts()
    if protocol in _S3_PROTOCOLS:
        config = dict(own.get("config_kwargs") or {})
        config.setdefault("connect_timeout", timeouts.connect)
        config.setdefault("read_timeout", timeouts.read)
        config.setdefault("retries", {"total_max_attempts": 1})
        own["config_kwargs"] = config
    else:
        client = dict(own.get("client_kwargs") or {})
        if "timeout" not in client:
            import aiohttp

            client["timeout"] = aiohttp.ClientTimeout(
                total=None, sock_connect=timeouts.connect, sock_read=timeouts.read
            )
        own["client_kwargs"] = client
    return {**storage_options, protocol: own} if chained else own


def resolve_retry(retry: RetryPolicy | int | bool | None) -> RetryPolicy:
    """The policy a ``retry=`` argument means.

    ``None``: :func:`default_policy`; ``False``: no retries (one attempt);
    an int: that many attempts with the default time budget; a
    :class:`RetryPolicy`: itself.

    Example:
        >>> resolve_retry(False).attempts
        1
        >>> resolve_retry(3).attempts
        3
    """
    if retry is None or retry is True:
        return default_policy()
    if retry is False:
        return RetryPolicy(attempts=1)
    if isinstance(retry, RetryPolicy):
        return retry
    if isinstance(retry, int):
        if retry < 1:
            raise ValueError(f"retry must be a positive int (the most attempts), a RetryPolicy, a bool or None, "
                             f"got {retry}")
        return RetryPolicy(attempts=retry, max_seconds=default_policy().max_seconds)
    raise TypeError(f"retry must be a RetryPolicy, an int, a bool or None, got {type(retry).__name__}")
