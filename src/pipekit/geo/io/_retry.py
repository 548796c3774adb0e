"""Retrying opens and window reads of remote rasters after transient network failures.

GDAL retries each HTTP request a few times by itself (its options come from the same budget:
:func:`pipekit.geo.io._gdal_config._gdal_retry_options`); this module covers what it does not,
under :func:`pipekit.retry.default_policy`: an open (:func:`_retrying`, used by
:meth:`~pipekit.geo.io.opener.RasterOpener.open`) and a window read (:func:`retry_read`), telling a
lost connection from a truncated file (:func:`store_unreachable`).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import rasterio

from pipekit._fs import split_protocol, url_to_fs
from pipekit.errors import ReadError
from pipekit.geo.io._errors import error_reason
from pipekit.retry import default_policy, is_transient

if TYPE_CHECKING:
    from pipekit.geo.io.opener import RasterOpener

__all__ = ["is_transient_gdal", "retry_read", "store_unreachable"]

T = TypeVar("T")

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

    options = dict(opener.storage_options)
    if split_protocol(url)[0] in ("s3", "s3a"):  # one request: botocore's own retries would outlast short outages
        config = dict(options.get("config_kwargs") or {})
        config["retries"] = {"max_attempts": 1, "mode": "standard"}
        options["config_kwargs"] = config
    try:
        fs, path = url_to_fs(url, options)
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
