"""What a failed open or read says: GDAL's own reasons, and the fsspec read errors GDAL must never see.

:func:`error_reason` spells out an exception with the GDAL errors chained behind it.  pipekit's
fsspec file objects (:mod:`pipekit.geo.io._fsspec`, the range cache) never raise into GDAL: they
record their failure here (:func:`_record_opener_failure`, one per thread) and return a short
read, and :func:`surfacing_opener_errors` raises it, as an :class:`OpenerReadError`, once the
rasterio call returns.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from pipekit.errors import OpenerReadError

__all__ = ["OpenerReadError", "error_reason", "surfacing_opener_errors"]


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
