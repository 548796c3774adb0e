"""The old import path pipekit.pipes.cache (in_memory_cache, on_disk_cache and end_caching)."""

from __future__ import annotations

from pipekit.pipes import cache, disk_cache, memory_cache


def test_old_import_path_keeps_every_name():
    for module in (memory_cache, disk_cache):
        for name in module.__all__:
            assert getattr(cache, name) is getattr(module, name), name
    assert sorted(cache.__all__) == ["CacheError", "EndOnDiskCacheHolder", "InMemoryCacheHolder", "OnDiskCacheHolder"]
    moved_private = ["_sizeof", "_FileLock", "_as_path", "_chunks", "_expected_hash", "_file_digest", "_find_holder"]
    moved_private += ["_write_atomic", "_LIST_SUFFIX", "_LOCK_SUFFIX", "_HASH_TYPES", "_CHUNK"]
    for name in moved_private:
        assert hasattr(cache, name), name
