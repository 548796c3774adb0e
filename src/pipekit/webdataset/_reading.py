"""Reading shards the ``webdataset`` library's way: ``pipe:`` URLs, and samples in the library's format.

``pipe:CMD ARGS`` URLs run ``CMD`` with its arguments (split like a shell would, with :func:`shlex.split`)
*without* a shell, and read the shard from its standard output; shell syntax (``|``, ``;``, ``&``,
redirections, ``$``, backquotes) is refused with an error naming the URL, since nothing would interpret it.
When the command ends with a non-zero exit status its standard error is reported in a
:class:`~pipekit.errors.ReadError` naming the URL.  Samples are the library's dicts: fields without the
leading dot (``"jpg"``), ``"__key__"`` without the shard URL, and ``"__url__"``.
"""

from __future__ import annotations

import io
import shlex
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

from pipekit.errors import ReadError
from pipekit.pipes.base import IterDataPipe, StreamWrapper

__all__ = ["PipeOpener", "WdsSamples", "check_pipe_url", "open_pipe"]

_SHELL_SYNTAX = ("|", ";", "&", "<", ">", "$", "`", "(", ")", "\n")
_STAGE = "tarfile_to_samples"
_TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")


def check_pipe_url(url: str) -> list[str]:
    """The argument list a ``pipe:`` URL runs; ``ValueError`` naming the URL for shell syntax or no command.

    Example:
        >>> check_pipe_url("pipe:curl -s -L 'http://host/shard 0.tar'")
        ['curl', '-s', '-L', 'http://host/shard 0.tar']
    """
    command = url[len("pipe:"):]
    bad = sorted({c for c in _SHELL_SYNTAX if c in command})
    if bad:
        raise ValueError(
            f"pipekit.webdataset: {url!r} uses shell syntax ({' '.join(repr(c) for c in bad)}), but pipe: URLs run "
            "the command with its arguments, without a shell; put the pipeline in a script and name the script, "
            "or read the URL with fsspec (s3://, https://...) instead"
        )
    try:
        args = shlex.split(command)
    except ValueError as exc:
        raise ValueError(f"pipekit.webdataset: cannot split the command of {url!r}: {exc}") from None
    if not args:
        raise ValueError(f"pipekit.webdataset: {url!r} names no command")
    return args


class _ProcessReader(io.RawIOBase):
    """The standard output of a ``pipe:`` command; at its end, a non-zero exit status raises ``ReadError``."""

    def __init__(self, url: str, args: list[str]) -> None:
        super().__init__()
        self.url = url
        # a file, not a pipe: a chatty command cannot block on it; closed in close()
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115
        try:
            self._proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._stderr)
        except OSError as exc:
            self._stderr.close()
            raise ReadError("run", url, _STAGE, f"cannot start {args[0]!r}: {exc}") from exc
        self._checked = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = self._proc.stdout.readinto(buffer)  # type: ignore[union-attr]
        if n == 0:
            self._check()
        return n

    def _check(self) -> None:
        if self._checked:
            return
        self._checked = True
        status = self._proc.wait()
        if status != 0:
            self._stderr.seek(0)
            tail = self._stderr.read()[-2000:].decode("utf-8", "replace").strip()
            reason = f"the command exited with status {status}: {tail or '(no stderr)'}"
            raise ReadError("read", self.url, _STAGE, reason)

    def close(self) -> None:
        if not self.closed:
            if self._proc.poll() is None:  # closed before the end (an early stop): end the command
                self._proc.kill()
            self._proc.wait()
            if self._proc.stdout is not None:
                self._proc.stdout.close()
            self._stderr.close()
        super().close()


def open_pipe(url: str) -> StreamWrapper:
    """Run a ``pipe:`` URL's command and return a buffered stream of its standard output."""
    return StreamWrapper(io.BufferedReader(_ProcessReader(url, check_pipe_url(url)), 1 << 20), name=url)


class PipeOpener(IterDataPipe):
    """``(url, stream)`` for each ``pipe:`` URL (the command's standard output); ``reopen(url)`` runs it again."""

    stateless = True

    def __init__(self, source_datapipe: IterDataPipe) -> None:
        super().__init__()
        self.source_datapipe = source_datapipe

    def reopen(self, url: str) -> StreamWrapper:
        return open_pipe(url)

    def __iter__(self) -> Iterator[tuple[str, StreamWrapper]]:
        for url in self.source_datapipe:
            if not str(url).startswith("pipe:"):
                raise ValueError(
                    f"pipekit.webdataset: {url!r} is not a pipe: URL, but the shard list mixes pipe: and other URLs; "
                    "use one kind per dataset"
                )
            yield url, open_pipe(url)


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
