"""``list_files``: torch's ``FileLister``, resumable, and refusing a changed listing on resume.

torch's ``FileLister`` holds no position, so a pipeline holding it was checkpointed by counting its
items and replayed on resume: a file deleted or added between checkpoint and resume shifted every
position after it (files read twice, others never) without a word.  This subclass, registered in its
place under ``list_files`` (``functional_datapipe(..., replaces=...)``), lists each root exactly as
torch does and checkpoints ``{"root", "done", "digest", "count"[, "names"]}``: the root being listed,
how many of its files were yielded, and :func:`pipekit._fs.listing_record` of its listing.  A restored
copy lists that root again and, if the listing is the checkpoint's, skips the files yielded and goes on;
otherwise it raises :class:`~pipekit.errors.ReadError` naming the root and the files added and gone.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pipekit._fs import listing_change, listing_record
from pipekit.errors import ReadError
from pipekit.pipes._torch import FileLister as TorchFileLister
from pipekit.pipes.base import IterDataPipe, functional_datapipe
from pipekit.pipes.state import ResumablePipe

__all__ = ["FileListerIterDataPipe"]


@functional_datapipe("list_files", replaces=TorchFileLister)
class FileListerIterDataPipe(ResumablePipe, TorchFileLister):
    """Yield the paths of the files under local roots (functional name: ``list_files``); torch's, resumable.

    Same arguments and output as torch's ``FileLister`` (each root's files
    in ``os.walk`` order, sorted per directory unless ``non_deterministic``).
    Resume: see the module docstring; a root whose files changed since the
    checkpoint raises :class:`~pipekit.errors.ReadError` naming them.  With
    ``non_deterministic=True`` the order is the filesystem's, which a resumed
    run cannot check: the root resumes by count, unchecked.

    Example:
        >>> import os, tempfile
        >>> from pipekit.pipes import IterableWrapper
        >>> root = tempfile.mkdtemp()
        >>> for name in ("b.txt", "a.txt", "c.csv"):
        ...     _ = open(os.path.join(root, name), "w").write("x")
        >>> [os.path.basename(p) for p in IterableWrapper([root]).list_files(masks="*.txt")]
        ['a.txt', 'b.txt']
    """

    state_keys = ("root", "done")

    def __init__(
        self,
        root: str | Sequence[str] | IterDataPipe = ".",
        masks: str | list[str] = "",
        *,
        recursive: bool = False,
        abspath: bool = False,
        non_deterministic: bool = False,
        length: int = -1,
    ) -> None:
        super().__init__(root, masks, recursive=recursive, abspath=abspath, non_deterministic=non_deterministic,
                         length=length)
        self._root: str | None = None
        self._done = 0
        self._urls: list[str] = []
        self._record: dict[str, Any] | None = None
        self._resume: tuple[str, int, dict[str, Any]] | None = None

    def _list(self, root: str) -> list[str]:
        return list(TorchFileLister(root, self.masks, recursive=self.recursive, abspath=self.abspath,
                                    non_deterministic=self.non_deterministic))

    def state_dict(self) -> dict[str, Any]:
        if self._root is None:
            return {"root": None, "done": 0}
        if self._record is None:  # once per root
            self._record = listing_record(self._urls)
        return {"root": self._root, "done": self._done, **self._record}

    def restore(self, state: dict[str, Any] | None) -> None:
        self._root, self._done, self._urls, self._record = None, 0, [], None
        if state is None or state["root"] is None:
            self._resume = None
        else:
            record = {k: state[k] for k in ("digest", "count", "names") if k in state}
            self._resume = (state["root"], int(state["done"]), record)

    def __iter__(self) -> Iterator[str]:
        resume, self._resume = self._resume, None
        if resume is not None:
            yield from self._yield_root(resume[0], resume[1], resume[2])
        for root in self.datapipe:
            yield from self._yield_root(root, 0, None)
        self._root, self._done, self._urls, self._record = None, 0, [], None

    def _yield_root(self, root: str, skip: int, expected: dict[str, Any] | None) -> Iterator[str]:
        self._root, self._done, self._record = root, skip, None
        self._urls = urls = self._list(root)
        if expected is not None and not self.non_deterministic:
            change = listing_change(expected, urls)
            if change is not None:
                raise ReadError(
                    "resume listing", root, "list_files",
                    f"the files under it changed since the checkpoint ({change}): the positions downstream "
                    "count files of the old listing and would repeat some files and skip others; resume from "
                    "a checkpoint taken on these files, or start the epoch over",
                )
        for url in urls[skip:]:
            self._done += 1
            yield url
