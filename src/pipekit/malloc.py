"""Tune glibc's allocator for processes that allocate large arrays per sample.

A geo sample is a few arrays of 0.5-2 MiB (a patch of six uint16 bands, its
float32 copy, an int64 mask).  With glibc's default settings such blocks come
and go with the heap: freeing them trims the top of the heap back to the
kernel, and the next sample faults the same pages in again, about a thousand
minor page faults per sample, which cost more than reading the patch itself
(measured in ``benchmarks/geo_sampling.py --profile``: 2.8 ms a sample before,
1.2 ms after).

:func:`tune` raises glibc's trim threshold and top pad so that a process keeps
up to :data:`MALLOC_OPTIONS` ``["M_TRIM_THRESHOLD"]`` bytes of freed heap for
reuse instead of returning it at once, and fixes the mmap threshold (which
glibc otherwise moves with the sizes it sees).  The cost is that memory: each
process that reads rasters (every DataLoader worker) may hold up to 64 MiB
more than it uses.  pipekit applies it once per process, the first time a
raster is opened; set the environment variable ``PIPEKIT_TUNE_MALLOC=0`` to
leave the allocator alone.  It does nothing on platforms without glibc.

Example:

    >>> from pipekit import malloc
    >>> isinstance(malloc.tune(), bool)
    True
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform
import threading

__all__ = ["MALLOC_OPTIONS", "ENV_VAR", "tune", "tuned"]

logger = logging.getLogger("pipekit")

#: glibc ``mallopt`` settings applied by :func:`tune` (bytes).
MALLOC_OPTIONS: dict[str, int] = {
    "M_MMAP_THRESHOLD": 32 * 2**20,  # blocks below this come from the heap (glibc's largest dynamic value)
    "M_TRIM_THRESHOLD": 64 * 2**20,  # free heap kept at the top before it is given back
    "M_TOP_PAD": 16 * 2**20,  # heap growth step
}
#: Environment variable that disables the tuning when set to ``0``, ``false`` or ``no``.
ENV_VAR = "PIPEKIT_TUNE_MALLOC"

_PARAMS = {"M_TRIM_THRESHOLD": -1, "M_TOP_PAD": -2, "M_MMAP_THRESHOLD": -3}
_lock = threading.Lock()
_tuned_pid: int | None = None
_result = False


def _glibc() -> ctypes.CDLL | None:
    if platform.system() != "Linux":
        return None
    libc_version = platform.libc_ver()[0]
    if libc_version != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") else None


def _disabled() -> bool:
    return os.environ.get(ENV_VAR, "1").strip().lower() in ("0", "false", "no", "off")


def tune() -> bool:
    """Apply :data:`MALLOC_OPTIONS` in this process (once per process; fork-aware).

    Returns:
        whether glibc accepted the settings: ``False`` where there is no glibc,
        when disabled by ``PIPEKIT_TUNE_MALLOC=0``, or when ``mallopt`` refused one.
    """
    global _tuned_pid, _result
    pid = os.getpid()
    if _tuned_pid == pid:
        return _result
    with _lock:
        if _tuned_pid == pid:
            return _result
        result = False
        if not _disabled():
            libc = _glibc()
            if libc is not None:
                result = True
                for name, value in MALLOC_OPTIONS.items():
                    if libc.mallopt(ctypes.c_int(_PARAMS[name]), ctypes.c_int(value)) != 1:
                        logger.warning("pipekit: glibc refused mallopt(%s, %d)", name, value)
                        result = False
                logger.debug("pipekit: malloc tuned in process %d: %s", pid, MALLOC_OPTIONS)
        _result = result
        _tuned_pid = pid
        return result


def tuned() -> bool:
    """Whether :func:`tune` has applied the settings in this process."""
    return _tuned_pid == os.getpid() and _result
