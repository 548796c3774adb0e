"""WebDataset-style samples: group tar members by key, and expand shard patterns.

A WebDataset shard is a tar archive whose members are named
``<key>.<extension>``; consecutive members sharing a key form one sample::

    urls = IterableWrapper(["shards-{000..099}.tar"]).shard_expand()
    samples = urls.open_files_by_fsspec(mode="rb").load_from_tar().webdataset()
    # {"__key__": "shards-000.tar/0001", ".jpg": <stream>, ".cls": <stream>}, ...
"""

from __future__ import annotations

import io
import itertools
import re
from collections.abc import Iterator
from typing import Any

from pipekit.errors import ParseError, SkipLog
from pipekit.pipes.base import IterDataPipe, StreamWrapper, functional_datapipe

__all__ = ["ShardExpander", "WebDataset"]

_KEY_SUFFIX = re.compile(r"^(.*?)(\.[^/]*)$")


def _split(path: str) -> tuple[str, str]:
    """Split a member path into its sample key and its extension (torchdata's rule).

    The extension is everything from the first ``.`` of the file name on
    (``".jpg"``, ``".seg.png"``); the key is everything before it, including
    the archive URL.  Backslashes are turned into ``/`` first.
    """
    p = path.replace("\\", "/")
    m = _KEY_SUFFIX.match(p)
    return (m.group(1), m.group(2)) if m else (p, "")


def _is_stream(value: Any) -> bool:
    return not isinstance(value, bytes | bytearray | str) and callable(getattr(value, "read", None))


@functional_datapipe("webdataset")
class WebDataset(IterDataPipe[dict[str, Any]]):
    """Group consecutive ``(path, data)`` items sharing a key into sample dicts.

    The key of a path is everything before the first ``.`` of its file name,
    the extension everything from that dot on: ``"s.tar/0001.seg.png"`` has
    key ``"s.tar/0001"`` and extension ``".seg.png"``.  Consecutive items with
    the same key become one dict mapping each extension to its data, plus
    ``"__key__"`` (torchdata 0.9's format).  Because the key includes the
    archive URL, a sample never spans two archives.  Paths without an
    extension cannot become a field; they are left out and recorded in
    ``self.skip_log``.  A repeated extension within one sample raises
    :class:`~pipekit.errors.ParseError`.

    Args:
        source_datapipe: a pipe yielding ``(path, data)`` pairs, usually
            ``load_from_tar()``; ``data`` is passed through as is (a stream,
            or whatever a ``map`` before this pipe made of it).

    Resume: the pipe looks one item ahead (it sees the first member of the
    next sample before yielding the current one), so its state holds the key
    and fields of that partial sample.  Field values that are streams are
    read into memory when the state is taken (the live pipeline then gets a
    ``BytesIO``-backed stream with the same bytes); other values are stored
    as they are and must be picklable.  Streams of a partial sample that is
    never handed out (the iteration failed or stopped early, or a new epoch
    began) are closed.

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> members = IterableWrapper([
        ...     ("s.tar/0001.jpg", b"img1"), ("s.tar/0001.cls", b"3"),
        ...     ("s.tar/0002.jpg", b"img2"), ("s.tar/0002.cls", b"5"),
        ... ])
        >>> for sample in members.webdataset():
        ...     print(sample)
        {'__key__': 's.tar/0001', '.jpg': b'img1', '.cls': b'3'}
        {'__key__': 's.tar/0002', '.jpg': b'img2', '.cls': b'5'}
    """

    def __init__(self, source_datapipe: IterDataPipe[tuple[str, Any]]) -> None:
        self.source_datapipe = source_datapipe
        self.skip_log = SkipLog("webdataset")
        self._key: str | None = None
        self._sample: dict[str, Any] | None = None
        self._owner: object | None = None
        self._restore: dict[str, Any] | None = None

    def reset(self) -> None:
        self._close_buffered()
        self._key, self._sample, self._owner = None, None, None

    def _close_buffered(self) -> None:
        """Close the streams of the partial sample: it was never handed out."""
        for suffix, value in (self._sample or {}).items():
            if suffix != "__key__" and _is_stream(value):
                close = getattr(value, "close", None)
                if callable(close):
                    close()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        restore, self._restore = self._restore, None
        owner = self._owner = object()  # this iterator owns the buffered sample
        if restore is not None and restore["key"] is not None:
            self._key = restore["key"]
            self._sample = {"__key__": restore["key"]}
            for suffix, is_stream, value in restore["fields"]:
                if is_stream:
                    value = StreamWrapper(io.BytesIO(value), name=restore["key"] + suffix)
                self._sample[suffix] = value
        try:
            yield from self._group()
        except BaseException:  # an error, or the iterator closed early
            if self._owner is owner:  # not a newer iterator's sample
                self._close_buffered()
                self._key, self._sample = None, None
            raise

    def _group(self) -> Iterator[dict[str, Any]]:
        for item in self.source_datapipe:
            if not isinstance(item, tuple | list) or len(item) != 2 or not isinstance(item[0], str):
                raise TypeError(f"webdataset: expected (path, data) pairs, got {type(item).__name__}: {item!r:.200}")
            path, data = item
            key, suffix = _split(path)
            if not suffix:
                self.skip_log.record(
                    ParseError("group", path, "webdataset", "the name has no extension, so it cannot be a field")
                )
                continue
            if key != self._key:
                done = self._sample
                self._key, self._sample = key, {"__key__": key, suffix: data}
                if done is not None:
                    yield done
                continue
            if suffix in self._sample:  # type: ignore[operator]
                raise ParseError("group", path, "webdataset", f"sample {key!r} already has a {suffix!r} field")
            self._sample[suffix] = data  # type: ignore[index]
        done, self._key, self._sample = self._sample, None, None
        if done is not None:
            yield done

    def state_dict(self) -> dict[str, Any]:
        fields: list[tuple[str, bool, Any]] = []
        if self._sample is not None and self._key is not None:
            for suffix, value in list(self._sample.items()):
                if suffix == "__key__":
                    continue
                if _is_stream(value):
                    data = value.read()
                    value.close()
                    # The live pipeline goes on with an equivalent stream over the bytes read.
                    self._sample[suffix] = StreamWrapper(io.BytesIO(data), name=self._key + suffix)
                    fields.append((suffix, True, data))
                else:
                    fields.append((suffix, False, value))
        return {"key": self._key, "fields": fields}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._restore = {"key": state["key"], "fields": list(state["fields"])}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(super().__getstate__())
        state["_key"], state["_sample"], state["_owner"] = None, None, None  # never pickle buffered streams
        return state


_RANGE = re.compile(r"\{(\d+)\.\.(\d+)\}")
_BRACES = re.compile(r"\{[^{}]*\}")


def _parse(pattern: str) -> list[Any]:
    """Split a shard pattern into literal parts and numeric ranges (with zero-padding width)."""
    for m in _BRACES.finditer(pattern):
        if ".." in m.group() and not _RANGE.fullmatch(m.group()):
            raise ValueError(
                f"shard_expand: malformed range {m.group()!r} in {pattern!r}; expected {{low..high}} "
                "with decimal bounds, e.g. 'shards-{000..099}.tar'"
            )
    parts: list[Any] = []
    pos = 0
    for m in _RANGE.finditer(pattern):
        lo_s, hi_s = m.groups()
        if len(lo_s) == len(hi_s) and lo_s.startswith("0"):
            width = len(hi_s)
        elif len(lo_s) <= len(hi_s):
            if lo_s.startswith("0") and lo_s != "0":
                raise ValueError(
                    f"shard_expand: in {pattern!r}, the low bound {lo_s!r} starts with 0 but is shorter "
                    f"than the high bound {hi_s!r}; zero-padded bounds must have the same width"
                )
            width = 0
        else:
            raise ValueError(
                f"shard_expand: in {pattern!r}, the low bound {lo_s!r} is longer than the high bound {hi_s!r}"
            )
        lo, hi = int(lo_s), int(hi_s)
        if lo > hi:
            raise ValueError(f"shard_expand: in {pattern!r}, the range {m.group()!r} is empty (low > high)")
        parts.append(pattern[pos : m.start()])
        parts.append((range(lo, hi + 1), width))
        pos = m.end()
    parts.append(pattern[pos:])
    return parts


def _product(ranges: list[range]) -> Iterator[tuple[int, ...]]:
    """``itertools.product`` without materialising the ranges (they can be huge)."""
    if not ranges:
        yield ()
        return
    for i in ranges[0]:
        for rest in _product(ranges[1:]):
            yield (i, *rest)


def shard_expand(pattern: str) -> Iterator[str]:
    """Lazily expand the numeric brace ranges of a shard pattern.

    ``"s-{00..02}.tar"`` gives ``s-00.tar``, ``s-01.tar``, ``s-02.tar``; several
    ranges give every combination, the last range varying fastest.  Bounds
    of equal width starting with ``0`` are zero-padded.  A pattern without
    ranges gives itself.  Raises ``ValueError`` for malformed or empty ranges.

    >>> list(shard_expand("d{0..1}/s-{08..10}.tar"))
    ['d0/s-08.tar', 'd0/s-09.tar', 'd0/s-10.tar', 'd1/s-08.tar', 'd1/s-09.tar', 'd1/s-10.tar']
    """
    if not isinstance(pattern, str):
        raise TypeError(f"shard_expand: a pattern must be a str, got {type(pattern).__name__}: {pattern!r}")
    parts = _parse(pattern)
    literals = parts[0::2]
    ranges = parts[1::2]
    for combo in _product([r for r, _ in ranges]):
        out = [literals[0]]
        for (_, width), i, literal in zip(ranges, combo, literals[1:]):
            out.append(str(i).zfill(width))
            out.append(literal)
        yield "".join(out)


@functional_datapipe("shard_expand")
class ShardExpander(IterDataPipe[str]):
    """Expand shard patterns with numeric brace ranges into shard names.

    ``"imagenet-{000000..001199}.tar"`` becomes the 1200 names
    ``imagenet-000000.tar`` ... ``imagenet-001199.tar``, without asking any
    storage system (so the list is reproducible, and works over HTTP where
    listing does not).  Several ranges in one pattern give every combination;
    bounds of equal width starting with ``0`` are zero-padded; a pattern
    without ranges is passed through.  Malformed ranges (``{1..}``,
    ``{a..z}``, ``{05..100}``, ``{9..1}``) raise ``ValueError`` naming the
    pattern and ``shard_expand``.  Unlike torchdata, a one-element range
    (``{3..3}``) is accepted.

    Args:
        source_datapipe: a pipe yielding shard patterns.

    Resume: records the pattern being expanded and how many names it has
    yielded; a restored copy expands it again and continues after them.

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> list(IterableWrapper(["ds-{00..05}.tar"]).shard_expand())
        ['ds-00.tar', 'ds-01.tar', 'ds-02.tar', 'ds-03.tar', 'ds-04.tar', 'ds-05.tar']
        >>> list(IterableWrapper(["imgs_{0..1}.tar", "labels_{0..1}.tar"]).shard_expand())
        ['imgs_0.tar', 'imgs_1.tar', 'labels_0.tar', 'labels_1.tar']
    """

    def __init__(self, source_datapipe: IterDataPipe[str]) -> None:
        self.source_datapipe = source_datapipe
        self._pattern: str | None = None
        self._yielded = 0
        self._restore: dict[str, Any] | None = None

    def reset(self) -> None:
        self._pattern, self._yielded = None, 0

    def _expand(self, pattern: str, skip: int) -> Iterator[str]:
        self._pattern, self._yielded = pattern, skip
        for name in itertools.islice(shard_expand(pattern), skip, None):
            self._yielded += 1
            yield name

    def __iter__(self) -> Iterator[str]:
        restore, self._restore = self._restore, None
        if restore is not None and restore["pattern"] is not None:
            yield from self._expand(restore["pattern"], restore["yielded"])
        for pattern in self.source_datapipe:
            yield from self._expand(pattern, 0)
        self._pattern, self._yielded = None, 0

    def state_dict(self) -> dict[str, Any]:
        return {"pattern": self._pattern, "yielded": self._yielded}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._restore = {"pattern": state["pattern"], "yielded": int(state["yielded"])}
