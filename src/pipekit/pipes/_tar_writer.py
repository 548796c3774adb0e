"""``TarWriter``: one WebDataset tar shard, written atomically, samples encoded by extension.

Public as :class:`pipekit.pipes.TarWriter` (and in :mod:`pipekit.webdataset`); :mod:`pipekit.pipes._shard_writer`
says how shards are written and where pipekit differs from ``webdataset``.  The ``tarfile`` stream mode, the
``encoder`` argument and the key checks here are ``ShardWriter``'s too.
"""

from __future__ import annotations

import logging
import os
import tarfile
import time
from collections.abc import Callable, Mapping
from typing import IO, Any

from pipekit.encoders import EncodeError, encode_sample, encoder_table, field_name
from pipekit.errors import ReadError
from pipekit.pipes._atomic_file import _AtomicFile
from pipekit.pipes._shard_index import data_offset

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
