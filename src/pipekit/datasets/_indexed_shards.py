"""``datasets.IndexedShards``: WebDataset tar shards as a map-style dataset, sample ``i`` read with one ranged read.

The random-access counterpart of :class:`~pipekit.datasets.TarShards` (same
shards, same samples), for what streaming cannot do: ``dataset[i]``, a true
global shuffle (``RandomSampler``), ``DistributedSampler``.  Each shard needs
its index beside it (``<shard>.idx.json``, see :mod:`pipekit.pipes._shard_index`),
written by ``pipekit shard --index``, ``ShardWriter(..., index=True)`` /
``write_shards(..., index=True)``, or, for shards that exist already,
:func:`index_shards` (one pass over their tar headers).
"""

from __future__ import annotations

import bisect
import contextlib
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch.utils.data

from pipekit._fs import url_to_fs
from pipekit._validate import check_callable
from pipekit.datasets._tar_shards import expand_shard_urls
from pipekit.errors import IndexCacheError, ReadError
from pipekit.pipes._shard_index import (
    decode_index,
    fingerprint,
    fingerprint_of,
    index_url,
    same_shard,
    scan_tar,
    write_index,
)

__all__ = ["IndexedShards", "index_shards"]

_STAGE = "IndexedShards"
_HOW = ("make the indexes with pipekit.datasets.index_shards(urls) for existing shards, or write the shards "
        "with `pipekit shard --index` / ShardWriter(..., index=True)")


def _is_local(fs: Any) -> bool:
    protocol = fs.protocol
    return "file" in ((protocol,) if isinstance(protocol, str) else tuple(protocol))


def index_shards(
    urls: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    storage_options: Mapping[str, Any] | None = None,
    *,
    overwrite: bool = False,
) -> list[str]:
    """Index existing tar shards for :class:`IndexedShards`: write ``<shard>.idx.json`` beside each; returns their URLs.

    Each shard is read once, header by header (member data is skipped where the
    file can seek, so a local shard costs one read per member header).  A shard
    that already has an index matching it is left alone unless ``overwrite``.

    Args:
        urls: shards as :class:`~pipekit.datasets.TarShards` takes them (a brace
            pattern, a list, a glob, a folder or prefix), local or fsspec URLs.
        storage_options: fsspec options (s3fs credentials, ``client_kwargs``...).
        overwrite: index every shard again, even one whose index matches it.

    Example:
        >>> import tempfile
        >>> from pipekit.pipes import ShardWriter
        >>> root = tempfile.mkdtemp()
        >>> with ShardWriter(root + "/s-%02d.tar", maxcount=2, verbose=0) as sink:
        ...     for i in range(3):
        ...         sink.write({"__key__": f"{i:04d}", "cls": i})
        >>> [url.rsplit("/", 1)[1] for url in index_shards(root + "/s-{00..01}.tar")]
        ['s-00.tar.idx.json', 's-01.tar.idx.json']
    """
    written = []
    for url in expand_shard_urls(urls, storage_options):
        fs, path = url_to_fs(url, storage_options)
        out = index_url(url)
        if not overwrite:
            try:
                _load(fs, url, path, out, url_to_fs(out, storage_options)[1], check=True)
                written.append(out)
                continue
            except (ReadError, IndexCacheError):
                pass
        try:
            shard = fingerprint(fs, path)
            with fs.open(path, "rb", block_size=2**16) as f:
                samples = scan_tar(f, url, "index_shards")
        except ReadError:
            raise
        except Exception as exc:
            raise ReadError("index", url, "index_shards", f"{type(exc).__name__}: {exc}") from exc
        written.append(write_index(url, samples, storage_options, "index_shards", shard))
    return written


def _load(fs: Any, url: str, path: str, idx: str, idx_path: str, check: bool) -> list[Any]:
    """The samples of the index ``idx`` of shard ``url``, checked against the shard."""
    try:
        data: Any = fs.cat_file(idx_path)
    except Exception as exc:
        data = exc
    now: Any = None
    if check:
        try:
            now = fingerprint(fs, path)
        except Exception as exc:
            now = exc
    return _checked(data, now, url, idx, check)


def _checked(data: Any, now: Any, url: str, idx: str, check: bool) -> list[Any]:
    """The samples of an index file's ``data`` (or the error reading it), checked against the shard's fingerprint."""
    if isinstance(data, FileNotFoundError):
        raise ReadError("open index", idx, _STAGE, f"the shard {url!r} has no index; {_HOW}") from None
    if isinstance(data, BaseException):
        raise ReadError("open index", idx, _STAGE, f"{type(data).__name__}: {data}") from data
    doc = decode_index(data, idx, _STAGE)
    if check:
        if isinstance(now, FileNotFoundError) or now is None:
            raise ReadError("open", url, _STAGE, f"no such shard (its index {idx!r} exists)") from None
        if isinstance(now, BaseException):
            raise ReadError("open", url, _STAGE, f"{type(now).__name__}: {now}") from now
        why = same_shard(doc, now)
        if why is not None:
            raise IndexCacheError("use index", idx, _STAGE, f"stale: it does not match the shard {url!r} ({why}); "
                                                           f"the shard was rewritten after it was indexed: {_HOW}")
    return doc["samples"]


def _load_all(urls: list[str], storage_options: dict[str, Any], check: bool) -> tuple[list[str], list[list[Any]]]:
    """``(paths, samples)`` of the shards ``urls``; remote indexes are fetched together, and the shards' sizes
    and ETags come from one listing per folder, not one request per shard."""
    located = [url_to_fs(url, storage_options) for url in urls]
    paths = [path for _, path in located]
    out: list[list[Any] | None] = [None] * len(urls)
    groups: dict[int, tuple[Any, list[int]]] = {}
    for n, (fs, _) in enumerate(located):
        groups.setdefault(id(fs), (fs, []))[1].append(n)
    for fs, ns in groups.values():
        idx_paths = {n: url_to_fs(index_url(urls[n]), storage_options)[1] for n in ns}
        if _is_local(fs) or len(ns) == 1:
            for n in ns:
                out[n] = _load(fs, urls[n], paths[n], index_url(urls[n]), idx_paths[n], check)
            continue
        try:
            got = fs.cat(list(idx_paths.values()), on_error="return")
        except Exception as exc:
            got = {p: exc for p in idx_paths.values()}
        infos: dict[str, Any] = {}
        if check:
            for parent in sorted({paths[n].rsplit("/", 1)[0] for n in ns}):
                try:
                    fs.invalidate_cache(parent)
                    infos.update((e["name"].rstrip("/"), e) for e in fs.ls(parent, detail=True))
                except Exception:  # each shard is then asked on its own, below
                    continue
        for n in ns:
            data = got.get(idx_paths[n], got.get(fs._strip_protocol(idx_paths[n]), FileNotFoundError(idx_paths[n])))
            now: Any = None
            if check:
                info = infos.get(fs._strip_protocol(paths[n]).rstrip("/"))
                try:
                    now = fingerprint_of(info) if info is not None else fingerprint(fs, paths[n])
                except Exception as exc:
                    now = exc
            out[n] = _checked(data, now, urls[n], index_url(urls[n]), check)
    return paths, out  # type: ignore[return-value]


class _Table:
    """The samples of all the indexes in numpy arrays and one bytes object.

    Not millions of Python lists: DataLoader workers touching those would copy
    them page by page (reference counts), each worker its own copy.
    """

    def __init__(self) -> None:
        self.samples = 0
        self.extensions: dict[str, int] = {}
        self.keys: list[bytes] = []
        self.member_ext: list[int] = []
        self.member_offset: list[int] = []
        self.member_size: list[int] = []
        self.first_member: list[int] = [0]

    def add(self, samples: list[Any], idx: str) -> None:
        try:
            for key, members in samples:
                if not members or not isinstance(key, str):
                    raise ValueError(f"sample {key!r} has no members")
                self.keys.append(key.encode("utf-8"))
                for ext, offset, size in members:
                    self.member_ext.append(self.extensions.setdefault(str(ext), len(self.extensions)))
                    self.member_offset.append(int(offset))
                    self.member_size.append(int(size))
                self.first_member.append(len(self.member_offset))
                self.samples += 1
        except (TypeError, ValueError) as exc:
            raise IndexCacheError("read shard index", idx, _STAGE, f"corrupt: {type(exc).__name__}: {exc}") from exc

    def freeze(self) -> _Frozen:
        key_ends = np.cumsum([len(k) for k in self.keys], dtype=np.int64)
        return _Frozen(
            b"".join(self.keys), np.concatenate([np.zeros(1, np.int64), key_ends]),
            tuple(self.extensions), np.asarray(self.member_ext, np.int32), np.asarray(self.member_offset, np.int64),
            np.asarray(self.member_size, np.int64), np.asarray(self.first_member, np.int64),
        )


class _Frozen:
    def __init__(self, keys: bytes, key_starts: Any, extensions: tuple[str, ...], member_ext: Any,
                 member_offset: Any, member_size: Any, first_member: Any) -> None:
        self.keys, self.key_starts, self.extensions = keys, key_starts, extensions
        self.member_ext, self.member_offset, self.member_size = member_ext, member_offset, member_size
        self.first_member = first_member

    def sample(self, i: int) -> tuple[str, list[tuple[str, int, int]]]:
        key = self.keys[self.key_starts[i]:self.key_starts[i + 1]].decode("utf-8")
        lo, hi = int(self.first_member[i]), int(self.first_member[i + 1])
        return key, [(self.extensions[self.member_ext[m]], int(self.member_offset[m]), int(self.member_size[m]))
                     for m in range(lo, hi)]


class IndexedShards(torch.utils.data.Dataset):
    """WebDataset tar shards as a map-style dataset: ``dataset[i]`` reads sample ``i`` with one ranged read.

    The samples are those the streaming readers give, in the shards' order:
    ``{"__key__": "<shard URL>/<key>", ".jpg": b"...", ".cls": b"3"}`` (the
    members' bytes, as ``load_tar_samples`` yields them; ``transform`` decodes
    or augments them).  ``len(dataset)`` is the number of samples, so torch's
    ``RandomSampler`` (a true global shuffle), ``DistributedSampler`` and
    :class:`pipekit.DataLoader` (any number of workers, exact resume) work as
    with any map-style dataset.

    Each shard needs its index (``<shard>.idx.json``): see :func:`index_shards`.
    The indexes are read, and checked against their shards (size, and ETag or
    mtime), when the dataset is built: a missing index raises
    :class:`~pipekit.errors.ReadError`, a stale or corrupt one
    :class:`~pipekit.errors.IndexCacheError`, each naming the shard, the index
    and how to make it.  A shard cut short later raises ``ReadError`` when a
    sample past its end is read.  Files are opened lazily in the process that
    reads (each DataLoader worker its own), never pickled.

    Args:
        urls: shards as :class:`~pipekit.datasets.TarShards` takes them (a brace
            pattern, a list, a glob, a folder or prefix), local or fsspec URLs.
        storage_options: fsspec options for the shards (s3fs: ``key``, ``secret``,
            ``client_kwargs={"endpoint_url": ...}``).
        transform: applied to each sample dict (e.g. a decoder).
        check: compare each index with its shard when the dataset is built
            (one ``info`` call per shard); ``False`` skips it.

    Example:
        >>> import tempfile
        >>> from pipekit.pipes import ShardWriter
        >>> root = tempfile.mkdtemp()
        >>> with ShardWriter(root + "/s-%02d.tar", maxcount=2, verbose=0, index=True) as sink:
        ...     for i in range(5):
        ...         sink.write({"__key__": f"{i:04d}", "cls": i, "txt": "abc"[: i % 3 + 1]})
        >>> ds = IndexedShards(root + "/s-{00..02}.tar")
        >>> len(ds), ds[3]["__key__"].rsplit("/", 1)[1], ds[3][".cls"], ds[-1][".txt"]
        (5, '0003', b'3', b'ab')
    """

    def __init__(
        self,
        urls: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        storage_options: Mapping[str, Any] | None = None,
        *,
        transform: Callable[[dict[str, Any]], Any] | None = None,
        check: bool = True,
    ) -> None:
        if storage_options is not None and not isinstance(storage_options, Mapping):
            raise TypeError(f"{_STAGE}: storage_options must be a dict, got {type(storage_options).__name__}")
        check_callable(transform, "transform", _STAGE)
        self.storage_options = dict(storage_options or {})
        self.transform = transform
        self.shards = expand_shard_urls(urls, self.storage_options)
        self._ends: list[int] = []
        table = _Table()
        self._paths, indexes = _load_all(self.shards, self.storage_options, check)
        for url, samples in zip(self.shards, indexes, strict=True):
            table.add(samples, index_url(url))
            self._ends.append(table.samples)
        self._table = table.freeze()
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._pid: int | None = None
        self._fs: dict[int, Any] = {}
        self._files: dict[int, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_pid=None, _fs={}, _files={})  # opened again, lazily, in the process that reads
        return state

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def _locate(self, index: int) -> tuple[int, int]:
        if isinstance(index, bool) or not isinstance(index, int):
            try:
                index = int(index.__index__())  # numpy and tensor integers
            except AttributeError:
                raise TypeError(f"{_STAGE}: an index must be an integer, got {type(index).__name__}") from None
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"{_STAGE}: index {index} out of range for {n} samples")
        return bisect.bisect_right(self._ends, index), index

    def _fs_of(self, shard: int) -> Any:
        pid = os.getpid()
        if self._pid != pid:  # a new process (a DataLoader worker): nothing inherited is used
            self._pid, self._fs, self._files = pid, {}, {}
        fs = self._fs.get(shard)
        if fs is None:
            fs = self._fs[shard] = url_to_fs(self.shards[shard], self.storage_options)[0]
        return fs

    def _read(self, shard: int, start: int, end: int) -> bytes:
        fs = self._fs_of(shard)
        if _is_local(fs):
            fd = self._files.get(shard)
            if fd is None:
                fd = self._files[shard] = os.open(self._paths[shard], os.O_RDONLY)
            return os.pread(fd, end - start, start)
        return fs.cat_file(self._paths[shard], start=start, end=end)

    def _span(self, index: int) -> tuple[int, str, list[Any], int, int]:
        """``(shard, key, members, start, end)``: where sample ``index`` lies."""
        shard, index = self._locate(index)
        key, members = self._table.sample(index)
        return shard, key, members, members[0][1], members[-1][1] + members[-1][2]

    def _sample(self, span: tuple[int, str, list[Any], int, int], data: Any) -> Any:
        shard, key, members, start, end = span
        url = self.shards[shard]
        if isinstance(data, BaseException):
            raise ReadError("read", url, _STAGE, f"bytes {start}-{end} of sample {key!r}: "
                                                 f"{type(data).__name__}: {data}") from data
        if len(data) != end - start:
            raise ReadError("read", url, _STAGE, f"the shard is truncated: sample {key!r} lies at bytes {start}-{end}, "
                                                 f"only {len(data)} of its {end - start} bytes were read; rewrite the "
                                                 "shard, then index it again")
        view = memoryview(data)
        sample: dict[str, Any] = {"__key__": f"{url}/{key}"}
        for ext, offset, size in members:
            sample["." + ext] = view[offset - start:offset - start + size].tobytes()
        return self.transform(sample) if self.transform is not None else sample

    def __getitem__(self, index: int) -> Any:
        span = self._span(index)
        try:
            data: Any = self._read(span[0], span[3], span[4])
        except Exception as exc:
            data = exc
        return self._sample(span, data)

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """The samples at ``indices``, as ``[self[i] for i in indices]``; a DataLoader's batches come through here.

        Remote shards' ranges are requested together (fsspec ``cat_ranges``,
        concurrent on S3), still one ranged read per sample.
        """
        spans = [self._span(i) for i in indices]
        filesystems = [self._fs_of(span[0]) for span in spans]
        fs = next((f for f in filesystems if not _is_local(f)), None)
        remote = [n for n, f in enumerate(filesystems) if fs is not None and f is fs]  # one filesystem's, together
        data: list[Any] = [None] * len(spans)
        if len(remote) > 1:
            try:
                got = fs.cat_ranges([self._paths[spans[n][0]] for n in remote], [spans[n][3] for n in remote],
                                    [spans[n][4] for n in remote], on_error="return")
            except Exception as exc:
                got = [exc] * len(remote)
            for n, value in zip(remote, got, strict=True):
                data[n] = value
        out = []
        for n, span in enumerate(spans):
            if data[n] is None:
                try:
                    data[n] = self._read(span[0], span[3], span[4])
                except Exception as exc:
                    data[n] = exc
            out.append(self._sample(span, data[n]))
        return out

    def __del__(self) -> None:
        if getattr(self, "_pid", None) == os.getpid():
            for fd in self._files.values():
                with contextlib.suppress(OSError):
                    os.close(fd)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self.shards)} shards, {len(self)} samples)"
