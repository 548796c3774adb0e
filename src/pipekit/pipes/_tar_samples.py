"""``load_tar_samples``: WebDataset samples with their members' bytes, straight from tar archives.

``open_files_by_fsspec(mode="rb").load_tar_samples()`` yields what
``load_from_tar().webdataset()`` followed by reading every member stream
yields, ``{"__key__": "shard.tar/0001", ".jpg": b"...", ".cls": b"3"}``, in
one pipe: the members are cut from the archive as ``bytes`` and grouped as
they are read, without a stream object per member or two more pipes between
them.  :class:`~pipekit.datasets.TarShards` reads its shards with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from pipekit.errors import ParseError
from pipekit.pipes._archives import TarArchiveLoader
from pipekit.pipes._webdataset import _split
from pipekit.pipes.base import functional_datapipe

__all__ = ["TarSampleLoader"]


@functional_datapipe("load_tar_samples")
class TarSampleLoader(TarArchiveLoader):
    """Group the members of tar archives into WebDataset sample dicts holding each member's ``bytes``.

    The same samples as ``load_from_tar(mode, on_error=on_error).webdataset()``
    with every member stream read into ``bytes``: consecutive members sharing
    a key (the member's URL up to the first ``.`` of its file name) form one
    dict mapping each extension to the member's bytes, plus ``"__key__"``.
    Archives are read as :class:`~pipekit.pipes._archives.TarArchiveLoader`
    reads them (the same modes, member checks, truncation errors and
    ``on_error``), and the members are read as they are reached, so a sample
    holds no open stream and the archive is closed when its last sample has
    been yielded.  A member whose name has no extension is left out and
    recorded in ``self.skip_log`` (a :class:`~pipekit.errors.ParseError` of
    stage ``webdataset``); a repeated extension within one sample raises it.

    Use it when the samples are read whole anyway (decoding, a shuffle buffer
    of encoded samples); use ``load_from_tar().webdataset()`` to get streams
    and read members lazily (large members, or members a consumer skips).

    Args:
        datapipe: a pipe yielding ``(url, binary stream)`` tuples
            (``open_files_by_fsspec(mode="rb")``).
        mode: the ``tarfile.open`` mode (see ``load_from_tar``).
        on_error: ``"raise"`` (default) or ``"skip"`` (see ``load_from_tar``).

    Resume: the checkpoint is the archive being read and how many of its
    entries the samples yielded so far went through (``load_from_tar``'s
    state, taken at a sample boundary); a restored pipe opens that archive
    again with the nearest upstream ``reopen(url)``, skips those entries and
    continues with the next sample.

    Example:
        >>> import io, tarfile
        >>> from pipekit.pipes import IterableWrapper
        >>> buf = io.BytesIO()
        >>> members = [("0001.jpg", b"img1"), ("0001.cls", b"3"), ("0002.jpg", b"img2"), ("0002.cls", b"5")]
        >>> with tarfile.open(fileobj=buf, mode="w") as tar:
        ...     for name, data in members:
        ...         info = tarfile.TarInfo(name)
        ...         info.size = len(data)
        ...         tar.addfile(info, io.BytesIO(data))
        >>> _ = buf.seek(0)
        >>> for sample in IterableWrapper([("shard.tar", buf)]).load_tar_samples():
        ...     print(sample)
        {'__key__': 'shard.tar/0001', '.jpg': b'img1', '.cls': b'3'}
        {'__key__': 'shard.tar/0002', '.jpg': b'img2', '.cls': b'5'}
    """

    wrap_members = False

    def __init__(
        self, datapipe: Iterable[tuple[str, Any]], mode: str = "r:*", length: int = -1, *, on_error: str = "raise"
    ) -> None:
        super().__init__(datapipe, mode, length, on_error=on_error)
        self._state: tuple[str | None, int, str | None] = (None, 0, None)  # url, entries, the archive's stamp

    def state_dict(self) -> dict[str, Any]:
        url, entries, stamp = self._state
        if stamp is None:
            return {"url": url, "entries": entries}
        return {"url": url, "entries": entries, "stamp": stamp}  # a replaced archive is refused on resume

    def restore(self, state: dict[str, Any] | None) -> None:
        super().restore(state)
        stamp = None if state is None else state.get("stamp")
        self._state = (None, 0, None) if state is None else (
            state["url"], int(state["entries"]), stamp if isinstance(stamp, str) else None)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        key: str | None = None
        sample: dict[str, Any] | None = None
        for path, data in self._archive_members():
            k, suffix = _split(path)
            if not suffix:
                self.skip_log.record(
                    ParseError("group", path, "webdataset", "the name has no extension, so it cannot be a field")
                )
                continue
            if k == key:
                if suffix in sample:  # type: ignore[operator]
                    raise ParseError("group", path, "webdataset", f"sample {k!r} already has a {suffix!r} field")
                sample[suffix] = data  # type: ignore[index]
                continue
            if sample is not None:
                # the samples so far went through every entry before this member (of the archive it is in)
                self._state = (self._url, self._entries - 1, self._stamp)
                yield sample
            key, sample = k, {"__key__": k, suffix: data}
        if sample is not None:
            self._state = (None, 0, None)  # every archive read through
            yield sample
        self._state = (None, 0, None)
