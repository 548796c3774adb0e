"""Shard sources shared by the ``datasets.WebDataset`` recipe and :mod:`pipekit.webdataset`.

* ``pipe:CMD ARGS`` URLs (the ``webdataset`` library's): ``CMD`` runs with its arguments (split like a shell
  would, with :func:`shlex.split`) *without* a shell, and the shard is read from its standard output; shell
  syntax (``|``, ``;``, ``&``, redirections, ``$``, backquotes) is refused with an error naming the URL, since
  nothing would interpret it.  When the command ends with a non-zero exit status its standard error is
  reported in a :class:`~pipekit.errors.ReadError` naming the URL.
* :class:`ResampledShardList` (``resampled=True``): an endless stream of shards drawn with replacement, each
  DataLoader worker and rank drawing its own.
"""

from __future__ import annotations

import io
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

from pipekit.errors import ReadError
from pipekit.pipes.base import IterDataPipe, StreamWrapper
from pipekit.pipes.state import SeededPipe

__all__ = ["PipeOpener", "ResampledShardList", "check_pipe_url", "is_pipe_url", "open_pipe"]

_SHELL_SYNTAX = ("|", ";", "&", "<", ">", "$", "`", "(", ")", "\n")
_STAGE = "tarfile_to_samples"


def is_pipe_url(url: Any) -> bool:
    """Whether ``url`` is a ``pipe:`` URL."""
    return isinstance(url, str) and url.startswith("pipe:")


def check_pipe_url(url: str, where: str = "pipekit.webdataset") -> list[str]:
    """The argument list a ``pipe:`` URL runs; ``ValueError`` naming the URL for shell syntax or no command.

    Example:
        >>> check_pipe_url("pipe:curl -s -L 'http://host/shard 0.tar'")
        ['curl', '-s', '-L', 'http://host/shard 0.tar']
    """
    command = url[len("pipe:"):]
    bad = sorted({c for c in _SHELL_SYNTAX if c in command})
    if bad:
        raise ValueError(
            f"{where}: {url!r} uses shell syntax ({' '.join(repr(c) for c in bad)}), but pipe: URLs run "
            "the command with its arguments, without a shell; put the pipeline in a script and name the script, "
            "or read the URL with fsspec (s3://, https://...) instead"
        )
    try:
        args = shlex.split(command)
    except ValueError as exc:
        raise ValueError(f"{where}: cannot split the command of {url!r}: {exc}") from None
    if not args:
        raise ValueError(f"{where}: {url!r} names no command")
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

    def __init__(self, source_datapipe: IterDataPipe, where: str = "pipekit.webdataset") -> None:
        super().__init__()
        self.source_datapipe = source_datapipe
        self.where = where

    def reopen(self, url: str) -> StreamWrapper:
        return open_pipe(url)

    def __iter__(self) -> Iterator[tuple[str, StreamWrapper]]:
        for url in self.source_datapipe:
            if not is_pipe_url(url):
                raise ValueError(
                    f"{self.where}: {url!r} is not a pipe: URL, but the shard list mixes pipe: and other URLs; "
                    "use one kind per dataset"
                )
            yield url, open_pipe(url)


class ResampledShardList(SeededPipe):
    """An endless stream of shards drawn at random from ``urls``, with replacement (``resampled=True``).

    Each worker and rank draws its own stream (the epoch seed is mixed with the worker id and rank), so no
    split is needed (:meth:`apply_sharding` does nothing: the source is its own sharding point) and every
    process reads as many samples as it is asked for: equal-length epochs across ranks.  Resume: the draws
    made, and the generator's state.  An epoch opens a shard again each time it is drawn, so a resumed epoch
    reads again shards read before the checkpoint (``rereads``): :class:`pipekit.DataLoader` has the openers
    stamp each shard (:mod:`pipekit.pipes._stamps`), and one replaced since the checkpoint raises
    :class:`~pipekit.errors.CheckpointError` naming it when it is drawn again.

    Example:
        >>> shards = ResampledShardList(["s-0.tar", "s-1.tar", "s-2.tar"], nshards=5).set_seed(0)
        >>> len(list(shards)), set(shards) <= {"s-0.tar", "s-1.tar", "s-2.tar"}
        (5, True)
    """

    seed_per_worker = True
    rereads = True  # draws with replacement: the shards of an epoch are opened again (pipes/_stamps.py)
    state_keys = ("count",)

    def __init__(self, urls: Sequence[str], nshards: int = sys.maxsize, seed: int | None = None,
                 where: str = "pipekit.webdataset.ResampledShards") -> None:
        super().__init__()
        self.urls = list(urls)
        if not self.urls:
            raise ValueError(f"{where}: no shard URLs")
        self.nshards = nshards
        self._count = 0
        if seed is not None:
            self.set_seed(seed)

    def apply_sharding(self, num_of_instances: int, instance_id: int, sharding_group: Any = None) -> None:
        """Each process draws its own shards: nothing to split (this makes the source a sharding point)."""

    def state_dict(self) -> dict[str, Any]:
        return {"count": self._count}

    def restore(self, state: dict[str, Any] | None) -> None:
        self._count = 0 if state is None else int(state["count"])

    def __iter__(self) -> Iterator[str]:
        while self._count < self.nshards:
            self._count += 1
            yield self.rng.choice(self.urls)
