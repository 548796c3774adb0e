"""Shard indexes: where each sample's members lie in a tar shard, for reading sample ``i`` with one ranged read.

One index per shard, beside it: ``train-000003.tar`` -> ``train-000003.tar.idx.json``.
One file per shard (not one for the set) because shards are written and
published one at a time, by several workers or ranks at once
(``write_shards`` with ``{worker}``/``{rank}``) or by separate jobs
(``--start-shard``): each writer publishes its own shard's index without
coordinating with the others, and a set is any list of shards.

The format (JSON, versioned, small: about 40 bytes per member)::

    {"format": "pipekit.shard-index", "version": 1,
     "shard": "train-000003.tar",          # the shard's file name
     "size": 1048576,                      # the shard's size in bytes
     "mtime": 1764300000.5,                # its modification time (local files), or null
     "etag": "\\"9a0364b9e99bb480dd25e1f0284c8555\\"",   # its ETag (object stores), or null
     "samples": [["0001", [["cls", 512, 1], ["jpg", 1536, 4022]]], ...]}

Each sample is ``[key, [[extension, offset, size], ...]]``: the key (the
member names' part before the first dot of the file name, as readers group
them), and per member its extension (after that dot) and the byte offset and
size of its data in the tar.  A sample's members are consecutive in the tar,
so the bytes from its first member's data to its last member's end are one
ranged read.

**Stale indexes.**  The shard's size, and its ETag (object stores) or mtime
(local files), are recorded when the index is made; a reader compares them
with the shard's and refuses an index that does not match
(:class:`~pipekit.errors.IndexCacheError` naming both files), so a shard
rewritten after its index was made is never read at wrong offsets.  A writer
publishes a shard first and its index right after (each atomically, under a
temporary name): a process killed in between leaves a shard without an
index, which readers report as missing.  Compressed shards (``.tar.gz``...)
cannot be indexed: offsets into a compressed stream cannot be read directly.
"""

from __future__ import annotations

import contextlib
import json
import math
import tarfile
from collections.abc import Mapping, Sequence
from typing import Any

from pipekit._fs import url_to_fs
from pipekit.errors import IndexCacheError, ReadError
from pipekit.pipes._atomic_file import _AtomicFile

__all__: list[str] = []

FORMAT = "pipekit.shard-index"
VERSION = 1
INDEX_SUFFIX = ".idx.json"

# one sample: (key, [(extension, data offset, size), ...])
Sample = tuple[str, list[tuple[str, int, int]]]


def index_url(shard_url: str) -> str:
    """The index of ``shard_url``: ``"s3://b/train-000003.tar"`` -> ``"s3://b/train-000003.tar.idx.json"``."""
    return shard_url + INDEX_SUFFIX


def data_offset(offset_after: int, size: int) -> int:
    """Where a member's data starts, from the tar's offset after adding it (data padded to 512-byte blocks)."""
    return offset_after - math.ceil(size / tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE


def split_name(name: str) -> tuple[str, str]:
    """``"a/0001.seg.png"`` -> ``("a/0001", "seg.png")``: the key and extension readers give a member name."""
    name = name.replace("\\", "/")
    dot = name.find(".", name.rfind("/") + 1)
    return (name, "") if dot == -1 else (name[:dot], name[dot + 1:])


def fingerprint(fs: Any, path: str) -> dict[str, Any]:
    """``{"size", "mtime", "etag"}`` of a shard as the filesystem reports it now (``None`` where it gives none)."""
    with contextlib.suppress(Exception):  # a filesystem without a cache: nothing to refresh
        fs.invalidate_cache(path)
    return fingerprint_of(fs.info(path))


def fingerprint_of(info: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`fingerprint` from an fsspec ``info()`` or detailed listing entry."""
    mtime = info.get("mtime")
    etag = info.get("ETag", info.get("etag"))
    return {"size": int(info["size"]), "mtime": float(mtime) if isinstance(mtime, int | float) else None,
            "etag": str(etag) if etag is not None else None}


def same_shard(recorded: Mapping[str, Any], now: Mapping[str, Any]) -> str | None:
    """Why the shard ``now`` is not the one an index ``recorded`` (``None`` when it is)."""
    if recorded.get("size") != now["size"]:
        return f"the index is of a shard of {recorded.get('size')} bytes, the shard has {now['size']}"
    if recorded.get("etag") is not None and now["etag"] is not None:
        if recorded["etag"] != now["etag"]:
            return f"the index is of the shard with ETag {recorded['etag']}, the shard's is {now['etag']}"
    elif recorded.get("mtime") is not None and now["mtime"] is not None and recorded["mtime"] != now["mtime"]:
        return f"the index is of the shard modified at {recorded['mtime']}, the shard was modified at {now['mtime']}"
    return None


def encode_index(shard_url: str, samples: Sequence[Sample], shard: Mapping[str, Any]) -> bytes:
    """The index file's bytes for ``samples`` of the shard whose :func:`fingerprint` is ``shard``."""
    doc = {"format": FORMAT, "version": VERSION, "shard": shard_url.rstrip("/").rsplit("/", 1)[-1],
           "size": shard["size"], "mtime": shard["mtime"], "etag": shard["etag"],
           "samples": [[key, [list(m) for m in members]] for key, members in samples]}
    return json.dumps(doc, separators=(",", ":")).encode("utf-8")


def write_index(shard_url: str, samples: Sequence[Sample], storage_options: Mapping[str, Any] | None,
                stage: str, shard: Mapping[str, Any] | None = None) -> str:
    """Write the index of the (published) shard ``shard_url`` atomically beside it; returns the index's URL.

    ``shard`` is the shard's :func:`fingerprint` (taken now when ``None``).
    """
    if shard is None:
        try:
            fs, path = url_to_fs(shard_url, storage_options)
            shard = fingerprint(fs, path)
        except Exception as exc:
            raise ReadError("index", shard_url, stage, f"cannot read the shard's size: {type(exc).__name__}: {exc}") \
                from exc
    url = index_url(shard_url)
    target = _AtomicFile(url, storage_options, stage)
    file = target.open()
    try:
        file.write(encode_index(shard_url, samples, shard))
    except BaseException:
        target.discard()
        raise
    target.publish()
    return url


def scan_tar(fileobj: Any, url: str, stage: str) -> list[Sample]:
    """The samples of an uncompressed tar, from its headers (member data is skipped, not read)."""
    samples: list[Sample] = []
    try:
        with tarfile.open(fileobj=fileobj, mode="r:") as tar:
            for info in tar:
                if not info.isfile():
                    continue
                key, ext = split_name(info.name)
                if not ext:
                    continue  # readers leave it out too (no field name)
                if samples and samples[-1][0] == key:
                    samples[-1][1].append((ext, info.offset_data, info.size))
                else:
                    samples.append((key, [(ext, info.offset_data, info.size)]))
    except tarfile.ReadError as exc:
        raise ReadError("index", url, stage, f"not an uncompressed tar ({exc}); compressed shards cannot be read "
                                             "at an offset, so they cannot be indexed") from exc
    return samples


def decode_index(data: bytes, url: str, stage: str) -> dict[str, Any]:
    """The checked document of an index file (``IndexCacheError`` naming ``url`` when it is not one)."""
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise IndexCacheError("read shard index", url, stage, f"corrupt: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise IndexCacheError("read shard index", url, stage, f"not a pipekit shard index (format {FORMAT!r})")
    if doc.get("version") != VERSION:
        raise IndexCacheError("read shard index", url, stage, f"version {doc.get('version')!r}, this pipekit reads "
                                                              f"version {VERSION}: index the shards again")
    if not isinstance(doc.get("samples"), list) or not isinstance(doc.get("size"), int):
        raise IndexCacheError("read shard index", url, stage, "corrupt: no 'samples' list or 'size'")
    return doc
