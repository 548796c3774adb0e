"""Write WebDataset tar shards: ``TarWriter``, ``ShardWriter`` and the ``write_shards`` pipe.

The classes have the ``webdataset`` library's interface, so a script writing
shards with ``webdataset`` works after changing its import::

    from pipekit.pipes import ShardWriter       # was: from webdataset import ShardWriter

    with ShardWriter("s3://bucket/train-%06d.tar", maxcount=10000, storage_options=opts) as sink:
        for i, (image, label) in enumerate(data):
            sink.write({"__key__": f"sample{i:08d}", "jpg": image, "cls": label})

Each sample becomes the tar members ``<key>.<extension>``, its values encoded by
extension (:mod:`pipekit.encoders`: images, arrays, tensors, JSON, text...), in
the layout :class:`pipekit.pipes.WebDataset` and :class:`pipekit.datasets.WebDataset`
read.  Shards go to any fsspec URL (local paths, ``s3://``, ``memory://``...).

``TarWriter`` (one shard) is in :mod:`pipekit.pipes._tar_writer`; this module
has ``ShardWriter`` (a sequence of shards) and ``write_shards``, and re-exports it.

**Atomic shards.**  Each shard is written under a hidden temporary name in its
final folder or prefix (``.train-000003.tar.tmp-<uuid>``) and moved into place
only when it is complete (``os.replace`` on a local disk; on S3 and other
fsspec filesystems the finished temporary object is moved, which S3 does as one
server-side copy).  A reader never sees a half-written shard under a final
name: a process killed while writing leaves the shards it finished, intact,
and at most a hidden temporary file.  ``datasets.WebDataset`` / ``TarShards``
and ``pipekit inspect`` ignore those (they list ``.tar`` files, never hidden ones).

Where pipekit differs from ``webdataset`` 1.0 on purpose:

* a ``with`` block left by an exception discards the shard being written (its
  temporary file is removed) instead of publishing it; the shards finished
  before stay;
* a shard is published as soon as it holds ``maxcount`` samples or
  ``maxsize`` bytes, not when the next sample arrives (the shards are the same);
* keys are checked: a key whose file name holds a dot (``"img.01"``) would be
  read back as another key and field, and an absolute key or one with ``..``
  cannot be read back at all, so both are refused;
* ``verbose`` messages go to stderr (``webdataset`` prints them to stdout);
* a stream returned by ``opener`` is closed when its shard is finished;
* ``encoder={...}`` adds to the default encoders (``webdataset`` replaces them,
  so extensions missing from the dict fail there);
* more encodings (see :mod:`pipekit.encoders`) and a ``storage_options``
  argument for fsspec URLs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import IO, Any

from pipekit.encoders import EncodeError
from pipekit.errors import SkipLog, check_on_error
from pipekit.pipes._shard_index import write_index
from pipekit.pipes._shard_names import (
    _check_pattern,
    _check_writer_fields,
    _warn_left_over,
    _writer_pattern,
    distributed_place,
)
from pipekit.pipes._tar_writer import _TAR_OPTIONS, TarWriter, _encoder_spec, _tar_mode
from pipekit.pipes.base import IterDataPipe, functional_datapipe
from pipekit.pipes.state import ResumablePipe

__all__ = ["ShardSaver", "ShardWriter", "TarWriter"]


class ShardWriter:
    """Write sample dicts into numbered tar shards (the ``webdataset`` library's ``ShardWriter``).

    Samples go to ``pattern % 0``, ``pattern % 1``, ... (``start_shard`` first);
    a shard is finished, and moved to its final name, once it holds
    ``maxcount`` samples or ``maxsize`` bytes of member contents (so it can
    exceed ``maxsize`` by one sample and the tar headers, as in ``webdataset``).
    Closing a writer that got no sample writes one empty shard, as ``webdataset`` does.

    Args:
        pattern: the shards' path or fsspec URL with a ``%d`` field, e.g.
            ``"s3://bucket/train-%06d.tar"`` (a ``.gz`` name gzips them).
        maxcount: samples per shard.
        maxsize: bytes of member contents per shard.
        post: called with each shard's name once it is in place (to upload
            it elsewhere, log it...).
        start_shard: the number of the first shard.
        verbose: ``1`` prints a line on stderr as each shard starts.
        opener: ``opener(name) -> binary stream`` to write each shard to
            instead of the name itself; the stream is closed when the shard is
            finished, and publishing it atomically is then the opener's concern.
        storage_options: fsspec options for the URLs (s3fs: ``key``,
            ``secret``, ``client_kwargs={"endpoint_url": ...}``).
        index: also write each shard's index beside it (``<shard>.idx.json``,
            published right after the shard), for random access with
            :class:`pipekit.datasets.IndexedShards` (see :mod:`pipekit.pipes._shard_index`);
            not with ``opener`` or compressed shards.
        **kw: :class:`TarWriter` options: ``encoder``, ``keep_meta``,
            ``compress``, ``mtime``, ``user``, ``group``, ``mode``, ``format``.

    Attributes:
        shards: the names of the shards finished so far, in order.
        fname: the name of the current (or last) shard.
        count, size: samples and bytes in the current shard.
        total: samples written.

    Used as a context manager, it is closed at the end of the block; a block
    left by an exception discards the shard being written (the finished ones stay).

    Example:
        >>> import tempfile, torch
        >>> from pipekit.pipes import IterableWrapper
        >>> root = tempfile.mkdtemp()
        >>> with ShardWriter(root + "/shard-%03d.tar", maxcount=2, verbose=0) as sink:
        ...     for i in range(5):
        ...         sink.write({"__key__": f"{i:04d}", "png": torch.full((3, 4, 4), i, dtype=torch.uint8), "cls": i})
        >>> [name.rsplit("/", 1)[1] for name in sink.shards]
        ['shard-000.tar', 'shard-001.tar', 'shard-002.tar']
        >>> urls = IterableWrapper([root + "/shard-{000..002}.tar"]).shard_expand()
        >>> samples = urls.open_files_by_fsspec(mode="rb").load_from_tar().webdataset().decode()
        >>> [(s["__key__"].rsplit("/", 1)[1], s[".cls"], s[".png"][0, 0, 0].item()) for s in samples]
        [('0000', 0, 0), ('0001', 1, 1), ('0002', 2, 2), ('0003', 3, 3), ('0004', 4, 4)]
    """

    def __init__(
        self,
        pattern: str | os.PathLike[str],
        maxcount: int = 100000,
        maxsize: float = 3e9,
        post: Callable[[str], Any] | None = None,
        start_shard: int = 0,
        verbose: int = 1,
        opener: Callable[[str], IO[bytes]] | None = None,
        *,
        storage_options: Mapping[str, Any] | None = None,
        index: bool = False,
        **kw: Any,
    ) -> None:
        stage = "ShardWriter"
        if isinstance(maxcount, bool) or not isinstance(maxcount, int) or maxcount < 1:
            raise ValueError(f"{stage}: maxcount must be an integer >= 1, got {maxcount!r}")
        if isinstance(maxsize, bool) or not isinstance(maxsize, int | float) or not maxsize > 0:
            raise ValueError(f"{stage}: maxsize must be a number of bytes > 0, got {maxsize!r}")
        if isinstance(start_shard, bool) or not isinstance(start_shard, int) or start_shard < 0:
            raise ValueError(f"{stage}: start_shard must be an integer >= 0, got {start_shard!r}")
        if post is not None and not callable(post):
            raise TypeError(f"{stage}: post must be callable or None, got {post!r}")
        if opener is not None and not callable(opener):
            raise TypeError(f"{stage}: opener must be callable or None, got {opener!r}")
        if storage_options is not None and not isinstance(storage_options, Mapping):
            raise TypeError(f"{stage}: storage_options must be a dict, got {type(storage_options).__name__}")
        unknown = sorted(set(kw) - set(_TAR_OPTIONS))
        if unknown:
            raise TypeError(f"{stage}: unexpected arguments {unknown}; TarWriter takes {list(_TAR_OPTIONS)}")
        _encoder_spec(kw.get("encoder", True), stage)
        self.pattern = _check_pattern(pattern, start_shard, stage)
        if index and opener is not None:
            raise ValueError(f"{stage}: index=True needs shards written by name, not through opener")
        if index and _tar_mode(self.pattern % start_shard, kw.get("compress")) != "w|":
            raise ValueError(f"{stage}: index=True needs uncompressed shards (a compressed shard cannot be read at "
                             f"an offset); {self.pattern!r} with compress={kw.get('compress')!r} is compressed")
        self.index = bool(index)
        self.maxcount = maxcount
        self.maxsize = maxsize
        self.post = post
        self.verbose = verbose
        self.opener = opener
        self.storage_options = dict(storage_options or {})
        self.kw = kw
        self.stage = stage
        self.shard = start_shard
        self.fname: str | None = None
        self.tarstream: TarWriter | None = None
        self.count = 0
        self.size = 0
        self.total = 0
        self.shards: list[str] = []
        self.closed = False
        self._opened: IO[bytes] | None = None

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def next_stream(self) -> None:
        """Finish the current shard and start the next one."""
        self.finish()
        self.fname = self.pattern % self.shard
        if self.verbose:
            print(f"# writing {self.fname} {self.count} {self.size / 1e9:.1f} GB {self.total}", file=sys.stderr)
        if self.opener is not None:
            self._opened = self.opener(self.fname)
            try:
                self.tarstream = TarWriter(self._opened, stage=self.stage, **self.kw)
            except BaseException:
                self._close_opened()
                raise
        else:
            self.tarstream = TarWriter(self.fname, storage_options=self.storage_options, stage=self.stage,
                                       _index=self.index, **self.kw)
        self.shard += 1
        self.count = 0
        self.size = 0

    def write(self, obj: Mapping[str, Any]) -> None:
        """Write one sample (see :meth:`TarWriter.write`); finish the shard when it is full."""
        if self.closed:
            raise ValueError(f"{self.stage}: write to a closed writer ({self.pattern!r})")
        if self.tarstream is None:
            self.next_stream()
        stream = self.tarstream
        try:
            size = stream.write(obj)  # type: ignore[union-attr]
        except BaseException:
            if stream.closed:  # type: ignore[union-attr]  # the write failed midway: the shard was discarded
                self.abort()
            raise
        self.count += 1
        self.total += 1
        self.size += size
        if self.count >= self.maxcount or self.size >= self.maxsize:
            self.finish()

    def finish(self) -> None:
        """Finish the current shard (move it to its final name, then call ``post``)."""
        if self.tarstream is None:
            return
        stream, self.tarstream = self.tarstream, None
        try:
            stream.close()
        finally:
            self._close_opened()
        if self.index:
            write_index(self.fname, stream.index_entries or [], self.storage_options, self.stage)  # type: ignore[arg-type]
        self.shards.append(self.fname)  # type: ignore[arg-type]
        if self.post is not None:
            self.post(self.fname)

    def _close_opened(self) -> None:
        opened, self._opened = self._opened, None
        if opened is not None:
            opened.close()

    def close(self) -> None:
        """Finish the last shard; with no sample written at all, write one empty shard (as ``webdataset``)."""
        if self.closed:
            return
        if self.tarstream is None and self.total == 0 and not self.shards:
            self.next_stream()
        self.finish()
        self.closed = True

    def abort(self) -> None:
        """Stop, discarding the shard being written (the finished ones stay)."""
        if self.closed:
            return
        self.closed = True
        stream, self.tarstream = self.tarstream, None
        try:
            if stream is not None:
                stream.abort()
        finally:
            self._close_opened()


@functional_datapipe("write_shards")
class ShardSaver(ResumablePipe):
    """Write the sample dicts of a pipe into tar shards and yield each shard's name when it is finished.

    A pipe form of :class:`ShardWriter` (same arguments, same files): it pulls
    samples, writes them, and yields ``pattern % n`` each time shard ``n`` is
    complete and in place, and the last one at the end.  An epoch with no sample
    writes one empty shard.

    Args:
        source_datapipe: yields sample dicts with a ``"__key__"``.
        pattern, maxcount, maxsize, start_shard: as :class:`ShardWriter`; the pattern may also
            hold ``{worker}`` and ``{rank}`` (see below).
        encoder: as :class:`TarWriter` (use module-level functions, so the pipe pickles).
        keep_meta: write fields starting with ``_`` too.
        storage_options: fsspec options for the shard URLs.
        index: write each shard's index beside it, as :class:`ShardWriter` does.
        on_error: ``"raise"`` raises :class:`~pipekit.encoders.EncodeError` for a
            sample that cannot be encoded; ``"skip"`` leaves it out, records it in
            ``self.skip_log`` and goes on (nothing of it is written).
        **tar_options: ``compress``, ``mtime``, ``user``, ``group``, ``mode``, ``format``.

    **Workers and ranks.**  In a DataLoader with several workers, or on several
    distributed ranks, each process writes its own shards: put ``{worker}``
    (the DataLoader worker id, ``0`` in the main process) and ``{rank}`` (the
    distributed rank: the process group's, else ``$RANK``, else that of the
    process that built the pipe; ``0`` without one) in the pattern, e.g.
    ``"out/train-{rank}-{worker}-%06d.tar"``.  A pattern without the field
    that tells the writers apart is refused with
    :class:`~pipekit.errors.ConfigurationError` when the epoch starts, before
    anything is written (one pattern in two workers would make them replace each
    other's shards, losing half the samples).  Shard the samples upstream
    (``.sharding_filter()``), or every worker writes all of them.

    **An earlier run.**  Shards are replaced by name, as ``webdataset`` does;
    at the end of an epoch, shards of the pattern numbered after the last one
    written (an earlier run wrote more) are named in a ``UserWarning``, since
    readers of the pattern or the folder would read them too (one listing of
    the folder per epoch and writer).

    Resume: the pipe yields only between shards, so its checkpoint is
    ``{"shard": number of the next shard, "total": samples written}``; a
    restored copy starts a new shard with that number and goes on with the
    samples after the last shard yielded.  A shard being written when the
    process stopped is written again from its first sample.

    Example:
        >>> import tempfile
        >>> from pipekit.pipes import IterableWrapper
        >>> root = tempfile.mkdtemp()
        >>> samples = IterableWrapper([{"__key__": f"{i:04d}", "json": {"i": i}} for i in range(5)])
        >>> [url.rsplit("/", 1)[1] for url in samples.write_shards(root + "/part-%02d.tar", maxcount=2)]
        ['part-00.tar', 'part-01.tar', 'part-02.tar']
    """

    state_keys = ("shard", "total")

    def __init__(
        self,
        source_datapipe: IterDataPipe[Mapping[str, Any]],
        pattern: str | os.PathLike[str],
        maxcount: int = 100000,
        maxsize: float = 3e9,
        start_shard: int = 0,
        *,
        encoder: bool | Mapping[str, Any] | Callable[[dict[str, Any]], dict[str, Any]] | None = True,
        keep_meta: bool = False,
        storage_options: Mapping[str, Any] | None = None,
        on_error: str = "raise",
        index: bool = False,
        **tar_options: Any,
    ) -> None:
        super().__init__()
        unknown = sorted(set(tar_options) - set(_TAR_OPTIONS))
        if unknown:
            raise TypeError(f"write_shards: unexpected arguments {unknown}")
        self.source_datapipe = source_datapipe
        self.pattern = os.fspath(pattern) if isinstance(pattern, os.PathLike) else pattern
        self.maxcount = maxcount
        self.maxsize = maxsize
        self.start_shard = start_shard
        self.storage_options = dict(storage_options or {})
        self.tar_options = {"encoder": encoder, "keep_meta": keep_meta, **tar_options}
        self.on_error = check_on_error(on_error)
        self.index = bool(index)
        self.skip_log = SkipLog("write_shards")
        if isinstance(self.pattern, str):
            _check_writer_fields(self.pattern, "write_shards")
        self._writer()  # checks the arguments now (it opens nothing until the first sample)
        self._shard = start_shard
        self._total = 0
        self._built_in = distributed_place()  # a DataLoader worker may not know its rank: this process's

    def _writer(self, pattern: str | None = None) -> ShardWriter:
        return ShardWriter(pattern or self.pattern, self.maxcount, self.maxsize, start_shard=self.start_shard,
                           verbose=0, storage_options=self.storage_options, index=self.index, **self.tar_options)

    def state_dict(self) -> dict[str, Any]:
        return {"shard": self._shard, "total": self._total}

    def restore(self, state: dict[str, Any] | None) -> None:
        if state is None:
            self._shard, self._total = self.start_shard, 0
        else:
            self._shard, self._total = int(state["shard"]), int(state["total"])

    def __iter__(self) -> Iterator[str]:
        writer = self._writer(_writer_pattern(self.pattern, "write_shards", self, self._built_in))
        writer.shard, writer.total = self._shard, self._total
        try:
            for sample in self.source_datapipe:
                try:
                    writer.write(sample)
                except EncodeError as exc:
                    if self.on_error == "raise":
                        raise
                    self.skip_log.record(exc)
                    continue
                if writer.tarstream is None:  # the sample filled the shard: it is in place
                    self._shard, self._total = writer.shard, writer.total
                    yield writer.shards[-1]
            done = len(writer.shards)
            writer.close()
            self._shard, self._total = writer.shard, writer.total
            _warn_left_over(writer.pattern, writer.shard, self.storage_options, "write_shards")
            if len(writer.shards) > done:
                yield writer.shards[-1]
        except BaseException:
            writer.abort()
            raise
