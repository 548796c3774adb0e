"""Check file contents against known hashes: torchdata's ``HashChecker`` (``check_hash``)."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator, Mapping
from typing import Any

from pipekit.errors import HashError, ReadError, StageError
from pipekit.pipes.base import IterDataPipe, StreamWrapper, functional_datapipe

__all__ = ["HashChecker", "HashError"]

_STAGE = "check_hash"
_CHUNK = 1 << 20
# Algorithms every Python has, with fixed-size digests (shake_* need a length).
HASH_TYPES = tuple(sorted(a for a in hashlib.algorithms_guaranteed if not a.startswith("shake")))


def _close(stream: Any) -> None:
    close = getattr(stream, "close", None)
    if callable(close):
        close()


@functional_datapipe("check_hash")
class HashChecker(IterDataPipe[tuple[str, Any]]):
    """Check that each file's content has the expected hash (functional name: ``check_hash``).

    Takes ``(file_name, data)`` items, where ``data`` is ``bytes``, ``str``
    (hashed as UTF-8) or a binary stream, hashes the data, compares the hex
    digest with ``hash_dict[file_name]`` (case-insensitively) and yields the
    item unchanged, a stream wrapped in a :class:`StreamWrapper`.  A mismatch,
    or a file with no entry in ``hash_dict``, raises :class:`HashError`
    naming the file, the expected and the actual hash.

    Streams are read to the end to hash them.  With ``rewind=True`` the
    stream yielded reads from where it started: a seekable stream is sought
    back, and a stream that cannot seek (HTTP) is kept in memory while it is
    hashed and a ``BytesIO`` of its content is yielded in its place (the
    original is closed).  With ``rewind=False`` the consumed stream is
    yielded as is, for pipelines that only need the check.

    Args:
        source_datapipe: a pipe yielding ``(file_name, data)`` tuples.
        hash_dict: maps each file name to its expected hex digest.
        hash_type: a :mod:`hashlib` algorithm, ``"sha256"`` (default) or
            ``"md5"`` as in torchdata, or any other guaranteed one
            (``"sha1"``, ``"sha512"``, ``"blake2b"``...).
        rewind: rewind (or buffer) streams after hashing them (see above).

    Text-mode streams are refused with a ``TypeError`` (their newline
    translation would change the hash): open files with ``mode="rb"``.
    The pipe is stateless for resume.

    Example:
        >>> import hashlib, io
        >>> from pipekit.pipes import IterableWrapper
        >>> data = b"DATA1"
        >>> hash_dict = {"1.txt": hashlib.sha256(data).hexdigest()}
        >>> dp = IterableWrapper([("1.txt", io.BytesIO(data))]).check_hash(hash_dict)
        >>> [(name, stream.read()) for name, stream in dp]
        [('1.txt', b'DATA1')]
        >>> list(IterableWrapper([("1.txt", b"corrupt")]).check_hash(hash_dict))
        Traceback (most recent call last):
            ...
        pipekit.errors.HashError: cannot verify '1.txt' in check_hash: sha256 mismatch: expected ..., got ...
    """

    stateless = True

    def __init__(
        self,
        source_datapipe: IterDataPipe[tuple[str, Any]],
        hash_dict: Mapping[str, str],
        hash_type: str = "sha256",
        rewind: bool = True,
    ) -> None:
        if not isinstance(hash_dict, Mapping):
            raise TypeError(f"hash_dict must be a mapping of file names to hex digests, got {type(hash_dict).__name__}")
        bad = [k for k, v in hash_dict.items() if not isinstance(v, str)]
        if bad:
            raise TypeError(f"hash_dict values must be hex digest strings; not for {bad[:3]!r}")
        if not isinstance(hash_type, str) or hash_type.lower() not in HASH_TYPES:
            raise ValueError(f"Invalid hash_type requested, should be one of {list(HASH_TYPES)}, got {hash_type!r}")
        if not isinstance(rewind, bool):
            raise TypeError(f"rewind must be a bool, got {type(rewind).__name__}")
        self.source_datapipe = source_datapipe
        self.hash_dict: dict[str, str] = {k: v.strip().lower() for k, v in hash_dict.items()}
        self.hash_type = hash_type.lower()
        self.rewind = rewind

    def _hash_stream(self, file_name: str, stream: Any, digest: Any) -> Any:
        """Hash ``stream`` to its end; return what to yield in its place."""
        start: int | None = None
        if self.rewind:
            try:
                start = stream.tell() if stream.seekable() else None
            except (AttributeError, OSError, ValueError):
                start = None
        buffer: io.BytesIO | None = io.BytesIO() if self.rewind and start is None else None
        read = getattr(stream, "read", None)
        chunks = iter(lambda: read(_CHUNK), None) if callable(read) else iter(stream)
        first = True
        try:
            for chunk in chunks:
                if not chunk:
                    if callable(read):
                        break  # EOF
                    continue
                if isinstance(chunk, str):
                    raise TypeError(
                        f"{_STAGE}: {file_name!r} is a text-mode stream; newline translation would change its "
                        "hash, open it in binary mode (mode='rb')"
                    )
                digest.update(chunk)
                if first and start is not None:
                    # Some streams say they are seekable but cannot go back (streamed HTTP): find out now.
                    first = False
                    try:
                        stream.seek(start)
                        stream.seek(start + len(chunk))
                    except (OSError, ValueError):
                        start, buffer = None, io.BytesIO()
                if buffer is not None:
                    buffer.write(chunk)
        except (TypeError, StageError):
            raise
        except Exception as exc:
            raise ReadError("read", file_name, _STAGE, f"{type(exc).__name__}: {exc}") from exc
        if not self.rewind:
            return stream
        if start is not None:
            stream.seek(start)
            return stream
        assert buffer is not None
        _close(stream)
        buffer.seek(0)
        return buffer

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        for item in self.source_datapipe:
            if not isinstance(item, tuple | list) or len(item) != 2:
                raise TypeError(f"{_STAGE}: expected (file_name, data) tuples, got {type(item).__name__}")
            file_name, data = item
            expected = self.hash_dict.get(file_name)
            if expected is None:
                _close(data)
                reason = f"Unspecified hash for file: no entry in hash_dict ({file_name!r})"
                raise HashError("verify", str(file_name), _STAGE, reason)
            digest = hashlib.new(self.hash_type)
            if isinstance(data, str):
                digest.update(data.encode("utf-8"))
                out: Any = data
            elif isinstance(data, bytes | bytearray | memoryview):
                digest.update(data)
                out = data
            else:
                try:
                    out = self._hash_stream(str(file_name), data, digest)
                except BaseException:
                    _close(data)
                    raise
            actual = digest.hexdigest()
            if actual != expected:
                _close(out)  # a stream (bytes and str have no close)
                _close(data)
                raise HashError(
                    "verify",
                    str(file_name),
                    _STAGE,
                    f"{self.hash_type} mismatch: expected {expected}, got {actual}",
                    expected=expected,
                    actual=actual,
                )
            if not isinstance(out, str | bytes | bytearray | memoryview) and not isinstance(out, StreamWrapper):
                out = StreamWrapper(out, name=getattr(out, "name", None) or str(file_name))
            yield file_name, out

    def __len__(self) -> int:
        return len(self.source_datapipe)  # type: ignore[arg-type]
