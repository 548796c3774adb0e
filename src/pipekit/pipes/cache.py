"""Caching: in memory (``in_memory_cache``) and on disk (``on_disk_cache`` ... ``end_caching``) (a re-export module).

The pipes that lived here are now in two modules; this module keeps every
name importable from its old path:

* :mod:`pipekit.pipes.memory_cache`: ``in_memory_cache`` (:class:`InMemoryCacheHolder`);
* :mod:`pipekit.pipes.disk_cache`: ``on_disk_cache`` (:class:`OnDiskCacheHolder`),
  ``end_caching`` (:class:`EndOnDiskCacheHolder`) and their file helpers.
"""

from __future__ import annotations

from pipekit.errors import CacheError
from pipekit.pipes.disk_cache import (
    _CHUNK,
    _HASH_TYPES,
    _LIST_SUFFIX,
    _LOCK_SUFFIX,
    EndOnDiskCacheHolder,
    OnDiskCacheHolder,
    _as_path,
    _chunks,
    _expected_hash,
    _file_digest,
    _FileLock,
    _find_holder,
    _write_atomic,
    fcntl,
    logger,
    msvcrt,
)
from pipekit.pipes.memory_cache import InMemoryCacheHolder, _sizeof

__all__ = ["CacheError", "EndOnDiskCacheHolder", "InMemoryCacheHolder", "OnDiskCacheHolder"]

# Private names that lived here, importable from the old path too.
_MOVED = (
    _CHUNK,
    _HASH_TYPES,
    _LIST_SUFFIX,
    _LOCK_SUFFIX,
    _as_path,
    _chunks,
    _expected_hash,
    _file_digest,
    _FileLock,
    _find_holder,
    _sizeof,
    _write_atomic,
    fcntl,
    logger,
    msvcrt,
)
