"""WebDataset-style samples: group tar members by key, and expand shard patterns.

A WebDataset shard is a tar archive whose members are named
``<key>.<extension>``; consecutive members sharing a key form one sample::

    urls = IterableWrapper(["shards-{000..099}.tar"]).shard_expand()
    samples = urls.open_files_by_fsspec(mode="rb").load_from_tar().webdataset()
    # {"__key__": "shards-000.tar/0001", ".jpg": <stream>, ".cls": <stream>}, ...
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from typing import Any

from pipekit.errors import ParseError, SkipLog
from pipekit.pipes._stream_items import MemoryMember
from pipekit.pipes.base import IterDataPipe, StreamWrapper, functional_datapipe
from pipekit.pipes.state import ResumablePipe

__all__ = ["ShardExpander", "WebDataset"]

_KEY_SUFFIX = re.compile(r"^(.*?)(\.[^/]*)$")


def _split(path: str) -> tuple[str, str]:
    """Split a member path into its sample key and its extension (torchdata's rule).

    The extension is everything from the first ``.`` of the file name on
    (``".jpg"``, ``".seg.png"``); the key is everything before it, including
    the archive URL.  Backslashes are turned into ``/`` first.
    """
    p = path.replace("\\", "/")
    if "\n" in p:  # (the pattern's "." stops at line breaks: keep its answer for such names)
        m = _KEY_SUFFIX.match(p)
        return (m.group(1), m.group(2)) if m else (p, "")
    dot = p.find(".", p.rfind("/") + 1)  # the pattern's answer, without a regular expression per member
    return (p, "") if dot == -1 else (p[:dot], p[dot:])


def _is_stream(value: Any) -> bool:
    return not isinstance(value, bytes | bytearray | str) and callable(getattr(value, "read", None))


@functional_datapipe("webdataset")
class WebDataset(ResumablePipe):
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
    next sample before yielding the current one), so its state,
    ``{"key": ..., "fields": [(extension, is_stream, value), ...]}``, holds
    the key and fields of that partial sample; a restored copy starts from
    that partial sample and completes it with the next items from upstream.
    Field values that are streams are read into memory when the state is
    taken (the live pipeline then gets a ``BytesIO``-backed stream with the
    same bytes); other values are stored as they are and must be picklable.
    Streams of a partial sample that is never handed out (the iteration
    failed or stopped early, or a new epoch began) are closed; the partial
    sample is never pickled with the pipe.

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

    state_keys = ("key", "fields")
    _runtime = ("_key", "_sample", "_owner")  # the buffered sample may hold open streams

    def __init__(self, source_datapipe: IterDataPipe[tuple[str, Any]]) -> None:
        super().__init__()
        self.source_datapipe = source_datapipe
        self.skip_log = SkipLog("webdataset")
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._key: str | None = None
        self._sample: dict[str, Any] | None = None
        self._owner: object | None = None

    def restore(self, state: dict[str, Any] | None) -> None:
        self._close_buffered()  # a previous iterator's look-ahead, never handed out
        self._init_runtime()
        if state is not None and state["key"] is not None:
            key = state["key"]
            self._key = key
            self._sample = {"__key__": key}
            for suffix, is_stream, value in state["fields"]:
                self._sample[suffix] = StreamWrapper(MemoryMember(value), name=key + suffix) if is_stream else value

    def _close_buffered(self) -> None:
        """Close the streams of the partial sample: it was never handed out."""
        for suffix, value in (self._sample or {}).items():
            if suffix != "__key__" and _is_stream(value):
                close = getattr(value, "close", None)
                if callable(close):
                    close()

    def __iter__(self) -> Iterator[dict[str, Any]]:
        owner = self._owner = object()  # this iterator owns the buffered sample
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
                    self._sample[suffix] = StreamWrapper(MemoryMember(data), name=self._key + suffix)
                    fields.append((suffix, True, data))
                else:
                    fields.append((suffix, False, value))
        return {"key": self._key, "fields": fields}


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
class ShardExpander(ResumablePipe):
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

    Resume: the checkpoint is ``{"pattern": pattern being expanded or None,
    "yielded": names of it yielded}``; a restored copy expands that pattern
    again (names are computed, nothing is listed), continues after those
    names, then expands the next patterns from upstream.

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> list(IterableWrapper(["ds-{00..05}.tar"]).shard_expand())
        ['ds-00.tar', 'ds-01.tar', 'ds-02.tar', 'ds-03.tar', 'ds-04.tar', 'ds-05.tar']
        >>> list(IterableWrapper(["imgs_{0..1}.tar", "labels_{0..1}.tar"]).shard_expand())
        ['imgs_0.tar', 'imgs_1.tar', 'labels_0.tar', 'labels_1.tar']
    """

    state_keys = ("pattern", "yielded")

    def __init__(self, source_datapipe: IterDataPipe[str]) -> None:
        super().__init__()
        self.source_datapipe = source_datapipe
        self._pattern: str | None = None
        self._yielded = 0
        self._resume: tuple[str, int] | None = None

    def state_dict(self) -> dict[str, Any]:
        return {"pattern": self._pattern, "yielded": self._yielded}

    def check_state(self, state: dict[str, Any]) -> None:
        try:
            int(state["yielded"])
        except (TypeError, ValueError):
            raise ValueError(f"not a ShardExpander state (yielded is not a count): {state!r:.200}") from None

    def restore(self, state: dict[str, Any] | None) -> None:
        self._pattern, self._yielded = None, 0
        if state is None or state["pattern"] is None:
            self._resume = None
        else:
            self._resume = (state["pattern"], int(state["yielded"]))

    def _expand(self, pattern: str, skip: int) -> Iterator[str]:
        self._pattern, self._yielded = pattern, skip
        for name in itertools.islice(shard_expand(pattern), skip, None):
            self._yielded += 1
            yield name

    def __iter__(self) -> Iterator[str]:
        resume, self._resume = self._resume, None  # the pattern to continue, set by restore()
        if resume is not None:
            yield from self._expand(*resume)
        for pattern in self.source_datapipe:
            yield from self._expand(pattern, 0)
        self._pattern, self._yielded = None, 0
