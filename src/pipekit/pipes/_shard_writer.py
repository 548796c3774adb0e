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

import logging
import os
import sys
import tarfile
import time
from collections.abc import Callable, Iterator, Mapping
from typing import IO, Any

from pipekit.encoders import EncodeError, encode_sample, encoder_table, field_name
from pipekit.errors import ReadError, SkipLog, check_on_error
from pipekit.pipes._atomic_file import _AtomicFile
from pipekit.pipes._shard_index import data_offset, write_index
from pipekit.pipes._shard_names import (
    _check_pattern,
    _check_writer_fields,
    _warn_left_over,
    _writer_pattern,
    distributed_place,
)
from pipekit.pipes.base import IterDataPipe, functional_datapipe
from pipekit.pipes.state import ResumablePipe

__all__ = ["ShardSaver", "ShardWriter", "TarWriter"]

logger = logging.getLogger("pipekit")

_TAR_OPTIONS = ("user", "group", "mode", "compress", "encoder", "keep_meta", "mtime", "format")


def _tar_mode(fileobj: Any, compress: bool | str | None) -> str:
    """The ``tarfile`` stream mode, as ``webdataset`` chooses it (from ``compress`` or the file name)."""
    name = fileobj if isinstance(fileobj, str) else ""
    if compress is False:
        return "w|"
    if compress is True or compress == "gz" or name.endswith("gz"):
        return "w|gz"
    if compress == "bz2" or name.endswith("bz2"):
        return "w|bz2"
    if compress == "xz" or name.endswith("xz"):
        return "w|xz"
    if compress not in (None, False):
        raise ValueError(f"compress must be None, True, False, 'gz', 'bz2' or 'xz', got {compress!r}")
    return "w|"


def _encoder_spec(encoder: Any, stage: str) -> tuple[Mapping[str, Any] | None, Callable[..., Any] | None]:
    """``(encoder table, custom function)`` for a ``TarWriter`` ``encoder`` argument (both ``None``: no encoding)."""
    if encoder is True:
        return encoder_table(), None
    if isinstance(encoder, Mapping):
        try:
            return encoder_table(encoder), None
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{stage}: {exc}") from None
    if callable(encoder):
        return None, encoder
    if encoder is False or encoder is None:
        return None, None
    raise TypeError(f"{stage}: encoder must be True, False, a dict of encoders or a function, got {encoder!r}")


def _check_key(key: Any, stage: str) -> str:
    """Refuse keys that would not read back as themselves (see the module docstring)."""
    if not isinstance(key, str) or not key:
        raise EncodeError("write", repr(key), stage, "'__key__' must be a non-empty str")
    parts = key.replace("\\", "/").split("/")
    hint = ""
    if "://" in key or ".tar/" in key:
        hint = (" (keys from pipekit's webdataset pipe start with the shard's URL: keep the part after it, "
                "e.g. key.rsplit('/', 1)[-1])")
    if key.startswith(("/", "\\")) or any(p in ("", ".", "..") for p in parts):
        raise EncodeError("write", key, stage, f"a key must be a relative path without empty, '.' or '..' "
                                               f"parts, or its tar members cannot be read back{hint}")
    if "." in parts[-1]:
        raise EncodeError("write", key, stage, f"the key's file name {parts[-1]!r} has a dot: readers split "
                                               f"'<key>.<extension>' at the first dot of the name, so it would "
                                               f"read back as another key{hint}")
    return key


class TarWriter:
    """Write sample dicts into one WebDataset tar file (the ``webdataset`` library's ``TarWriter``).

    ``write({"__key__": "a/b", "png": image, "output.png": image2})`` adds the
    members ``a/b.output.png`` and ``a/b.png`` (fields in sorted order), each
    value encoded by its extension (:mod:`pipekit.encoders`).  Field names may
    carry a leading dot (``".png"``, as :class:`pipekit.pipes.WebDataset`
    yields them).  Fields starting with ``_`` are left out unless ``keep_meta``.

    Args:
        fileobj: a path or fsspec URL (written atomically: under a temporary
            name, moved into place by :meth:`close`), or a binary stream
            (written to and left open).
        user, group, mode: the owner names and permission bits of the members.
        compress: ``True``/``"gz"``, ``"bz2"``, ``"xz"``, or ``False``; ``None``
            (default) compresses when the file name ends with ``gz``, ``bz2`` or ``xz``.
        encoder: ``True`` (the default encoders), ``False`` (values must
            already be bytes), a dict ``{extension: fn(value) -> bytes}`` added
            to the defaults, or a function ``sample -> sample`` of bytes.
        keep_meta: also write fields starting with ``_`` (they must be ``str``).
        mtime: the members' modification time (default: the time of writing);
            fix it for reproducible files.
        format: the tar format, ``tarfile.USTAR_FORMAT`` (default), ``"PAX_FORMAT"``...
        storage_options: fsspec options for ``fileobj`` URLs (credentials, ``client_kwargs``...).

    Used as a context manager, it is closed at the end of the block; a block
    left by an exception discards the file instead (nothing appears under its
    name; a stream is finished as by :meth:`close`).

    Example:
        >>> import io, tarfile
        >>> buf = io.BytesIO()
        >>> with TarWriter(buf, mtime=0) as sink:
        ...     sink.write({"__key__": "0001", "cls": 3, "txt": "a cat"})
        6
        >>> with tarfile.open(fileobj=io.BytesIO(buf.getvalue())) as tar:
        ...     [(m.name, tar.extractfile(m).read()) for m in tar]
        [('0001.cls', b'3'), ('0001.txt', b'a cat')]
    """

    def __init__(
        self,
        fileobj: str | os.PathLike[str] | IO[bytes],
        user: str = "bigdata",
        group: str = "bigdata",
        mode: int = 0o0444,
        compress: bool | str | None = None,
        encoder: bool | Mapping[str, Any] | Callable[[dict[str, Any]], dict[str, Any]] | None = True,
        keep_meta: bool = False,
        mtime: float | None = None,
        format: Any = None,
        *,
        storage_options: Mapping[str, Any] | None = None,
        stage: str = "TarWriter",
        _index: bool = False,
    ) -> None:
        if isinstance(fileobj, os.PathLike):
            fileobj = os.fspath(fileobj)
        if not isinstance(fileobj, str) and not callable(getattr(fileobj, "write", None)):
            raise TypeError(f"{stage}: fileobj must be a path, a URL or a binary stream, got {type(fileobj).__name__}")
        tar_format = getattr(tarfile, format, format) if format else tarfile.USTAR_FORMAT
        if tar_format not in (tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
            raise ValueError(f"{stage}: unknown tar format {format!r}; use 'USTAR_FORMAT', 'GNU_FORMAT' or "
                             "'PAX_FORMAT' (or the tarfile constants)")
        tarmode = _tar_mode(fileobj, compress)
        self.stage = stage
        self.user = user
        self.group = group
        self.mode = mode
        self.compress = compress
        self.keep_meta = bool(keep_meta)
        self.mtime = mtime
        self.format = tar_format
        self._encoders, self._custom = _encoder_spec(encoder, stage)
        self.name = fileobj if isinstance(fileobj, str) else getattr(fileobj, "name", "<stream>")
        self._target: _AtomicFile | None = None
        if isinstance(fileobj, str):
            self._target = _AtomicFile(fileobj, storage_options, stage)
            stream: IO[bytes] = self._target.open()
        else:
            stream = fileobj
        self.stream = stream
        try:
            self.tarstream = tarfile.open(fileobj=stream, mode=tarmode, format=tar_format)  # noqa: SIM115 (closed by close())
        except BaseException:
            if self._target is not None:
                self._target.discard()
            raise
        self.closed = False
        self._last_key: str | None = None
        # per sample (key, [(extension, data offset, size), ...]) for a shard index (ShardWriter(index=True))
        self.index_entries: list[tuple[str, list[tuple[str, int, int]]]] | None = (
            [] if _index and tarmode == "w|" else None)

    # -- context manager -------------------------------------------------------------

    def __enter__(self) -> TarWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    # -- writing ---------------------------------------------------------------------

    def encode(self, sample: Mapping[str, Any]) -> dict[str, bytes]:
        """The fields of ``sample`` as ``{extension: bytes}`` (plus ``"__key__"``), as :meth:`write` stores them."""
        if not isinstance(sample, Mapping):
            raise TypeError(f"{self.stage}: a sample must be a dict, got {type(sample).__name__}: {sample!r:.200}")
        if "__key__" not in sample:
            raise ValueError(f"{self.stage}: a sample must have a '__key__' (it has {sorted(map(str, sample))})")
        key = sample["__key__"]
        if self._custom is not None:
            sample = self._custom(dict(sample))
            if not isinstance(sample, Mapping) or "__key__" not in sample:
                raise TypeError(f"{self.stage}: the encoder must return a sample dict with a '__key__', "
                                f"got {type(sample).__name__}")
            key = sample["__key__"]
        elif self._encoders is not None:
            sample = encode_sample(sample, self._encoders, self.keep_meta, stage=self.stage)
        out: dict[str, bytes] = {}
        for name, value in sample.items():
            if name == "__key__":
                continue
            field = field_name(name)
            if name.startswith("_"):
                if not self.keep_meta:
                    continue
                if isinstance(value, str):
                    value = value.encode("utf-8")
            if not field or field in out:
                raise EncodeError("write", f"{key}.{field}", self.stage, f"empty or repeated field name {name!r}")
            if isinstance(value, bytearray | memoryview):
                value = bytes(value)
            if not isinstance(value, bytes):
                raise EncodeError("write", f"{key}.{field}", self.stage,
                                  f"the value is {type(value).__name__}, not bytes, after encoding")
            out[field] = value
        return {"__key__": key, **out}

    def write(self, obj: Mapping[str, Any]) -> int:
        """Write one sample; returns the bytes of its members' contents (headers not counted).

        The sample is encoded, and its member headers are built, before
        anything is written: a sample that fails (:class:`~pipekit.encoders.EncodeError`)
        leaves the file as it was and the writer usable.
        """
        if self.closed:
            raise ValueError(f"{self.stage}: write to a closed writer ({self.name!r})")
        encoded = self.encode(obj)
        key = _check_key(encoded["__key__"], self.stage)
        if key == self._last_key:
            raise EncodeError("write", key, self.stage, "the previous sample has the same key; readers would "
                                                        "merge the two (consecutive samples need distinct keys)")
        now = time.time()
        members = []
        for field in sorted(k for k in encoded if k != "__key__"):
            data = encoded[field]
            info = tarfile.TarInfo(f"{key}.{field}")
            info.size = len(data)
            info.mtime = self.mtime if self.mtime is not None else now  # type: ignore[assignment]
            info.mode = self.mode
            info.uname = self.user
            info.gname = self.group
            try:
                info.tobuf(self.format, self.tarstream.encoding, self.tarstream.errors)
            except ValueError as exc:  # a name too long for the format, a bad mode...
                raise EncodeError("write", info.name, self.stage, f"{exc} (format=tarfile.PAX_FORMAT takes "
                                                                  "long names)") from exc
            members.append((info, data))
        total = 0
        placed = []
        for info, data in members:
            try:
                self.tarstream.addfile(info, _BytesReader(data))
            except BaseException as exc:  # part of a sample may be written: the file is never published
                self.abort()
                if isinstance(exc, Exception):
                    raise ReadError("write", self.name, self.stage, f"{type(exc).__name__}: {exc}") from exc
                raise
            total += info.size
            placed.append((info.name[len(key) + 1:], data_offset(self.tarstream.offset, info.size), info.size))
        if self.index_entries is not None:
            self.index_entries.append((key, placed))
        self._last_key = key
        return total

    def close(self) -> None:
        """Finish the tar file and, for a path or URL, move it to its final name."""
        if self.closed:
            return
        self.closed = True
        try:
            self.tarstream.close()
        except Exception as exc:
            if self._target is not None:
                self._target.discard()
            raise ReadError("write", self.name, self.stage, f"{type(exc).__name__}: {exc}") from exc
        if self._target is not None:
            self._target.publish()

    def abort(self) -> None:
        """Stop without publishing: a path or URL's temporary file is removed (a stream gets the archive's end)."""
        if self.closed:
            return
        self.closed = True
        try:
            self.tarstream.close()  # once closed, tarfile never writes to the file again
        except Exception as exc:  # the file is thrown away (or was broken already): say so, go on
            logger.warning("%s: could not finish the tar stream of %r: %s", self.stage, self.name, exc)
        if self._target is not None:
            self._target.discard()


class _BytesReader:
    """The ``read(n)`` that ``tarfile.addfile`` needs, over bytes, without copying them into a BytesIO."""

    def __init__(self, data: bytes) -> None:
        self._view = memoryview(data)
        self._pos = 0

    def read(self, n: int = -1) -> bytes:
        end = len(self._view) if n is None or n < 0 else min(len(self._view), self._pos + n)
        chunk = self._view[self._pos:end].tobytes()
        self._pos = end
        return chunk


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
