"""GDAL's configuration: the options of every reading process, those of remote files, and GDAL's HTTP retries.

:data:`GDAL_OPTIONS` is applied once per process (:func:`_configure_process`, called before the first
open); :data:`REMOTE_GDAL_OPTIONS` and :func:`_gdal_retry_options` make up the environment a remote
file is opened and read in (:meth:`pipekit.geo.io.opener.RasterOpener.resolve`, where a dataset's
``gdal_options`` override them).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from rasterio.env import set_gdal_config

from pipekit import malloc
from pipekit.retry import RetryPolicy, default_timeouts

__all__ = ["GDAL_OPTIONS", "REMOTE_GDAL_OPTIONS"]

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
    # come from pipekit's retry budget, its timeouts (GDAL_HTTP_CONNECTTIMEOUT, GDAL_HTTP_LOW_SPEED_TIME)
    # from pipekit's remote read timeouts: see _gdal_retry_options()
}

# HTTP answers GDAL retries by itself: throttling and server errors (never 403/404)
_GDAL_RETRY_CODES = "429,500,502,503,504"


def _gdal_retry_options(policy: RetryPolicy) -> dict[str, str]:
    """GDAL's HTTP retry and timeout options: ``policy``'s attempts and first delay (GDAL doubles it each
    time), and :func:`pipekit.retry.default_timeouts`.

    A server that accepts the connection and never answers would otherwise hold a ``/vsis3/`` or
    ``/vsicurl/`` read for minutes: ``GDAL_HTTP_CONNECTTIMEOUT`` is the connect timeout (default 5 s,
    ``PIPEKIT_CONNECT_TIMEOUT``), and a request that receives no byte for ``GDAL_HTTP_LOW_SPEED_TIME``
    seconds (``GDAL_HTTP_LOW_SPEED_LIMIT`` 1 byte/s; the read timeout, default 15 s,
    ``PIPEKIT_READ_TIMEOUT``) fails as a transient error, retried under ``policy``.  ``GDAL_HTTP_TIMEOUT``
    (a bound on a whole request, large reads included) is left unset.  A dataset's ``gdal_options``
    override any of them.
    """
    timeouts = default_timeouts()
    return {
        "GDAL_HTTP_MAX_RETRY": str(max(0, min(policy.attempts - 1, 3))),  # pipekit retries around it
        "GDAL_HTTP_RETRY_DELAY": f"{max(policy.base_delay, 0.1):g}",
        "GDAL_HTTP_RETRY_CODES": _GDAL_RETRY_CODES,
        "GDAL_HTTP_CONNECTTIMEOUT": f"{timeouts.connect:g}",
        "GDAL_HTTP_LOW_SPEED_TIME": f"{max(1, round(timeouts.read)):d}",  # curl counts whole seconds
        "GDAL_HTTP_LOW_SPEED_LIMIT": "1",
    }


_process_lock = threading.Lock()
_process_configured_pid: int | None = None


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
