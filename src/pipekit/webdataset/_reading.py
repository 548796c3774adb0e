"""Reading shards the ``webdataset`` library's way: ``pipe:`` URLs, and samples in the library's format.

``pipe:CMD ARGS`` URLs run ``CMD`` with its arguments (split like a shell would, with :func:`shlex.split`)
*without* a shell, and read the shard from its standard output; shell syntax (``|``, ``;``, ``&``,
redirections, ``$``, backquotes) is refused with an error naming the URL, since nothing would interpret it.
When the command ends with a non-zero exit status its standard error is reported in a
:class:`~pipekit.errors.ReadError` naming the URL.  Samples are the library's dicts: fields without the
leading dot (``"jpg"``), ``"__key__"`` without the shard URL, and ``"__url__"``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

# the pipe: URL machinery lives in pipes/, where the datasets.WebDataset recipe reads it too
from pipekit.pipes._shard_sources import PipeOpener, check_pipe_url, open_pipe
from pipekit.pipes.base import IterDataPipe

__all__ = ["PipeOpener", "WdsSamples", "check_pipe_url", "open_pipe"]

_TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")


class WdsSamples(IterDataPipe):
    """pipekit's tar samples as the library's dicts: ``"jpg"`` fields, ``"__key__"`` without the URL, ``"__url__"``.

    The shard URL is the longest known URL (``urls``) the key starts with, else the key up to its last
    ``.tar/`` (or ``.tgz/``...).  Stateless.

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> list(WdsSamples(IterableWrapper([{"__key__": "d/s.tar/k1", ".jpg": b"x"}]), ["d/s.tar"]))
        [{'__key__': 'k1', '__url__': 'd/s.tar', 'jpg': b'x'}]
    """

    stateless = True

    def __init__(self, source_datapipe: IterDataPipe, urls: Sequence[str] = ()) -> None:
        super().__init__()
        self.source_datapipe = source_datapipe
        self.urls = frozenset(urls)

    def _url(self, key: str) -> str | None:
        pos = len(key)
        while (pos := key.rfind("/", 0, pos)) > 0:
            if key[:pos] in self.urls:
                return key[:pos]
        found = max((key.rfind(s + "/") + len(s) for s in _TAR_SUFFIXES if s + "/" in key), default=-1)
        return None if found < 0 else key[:found]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for sample in self.source_datapipe:
            key = sample["__key__"]
            url = self._url(key)
            out: dict[str, Any] = {"__key__": key if url is None else key[len(url) + 1:], "__url__": url}
            for name, value in sample.items():
                if name != "__key__":
                    out[name[1:] if name.startswith(".") else name] = value
            yield out
