"""What the listing pipes do to each listed name: match masks, scan local folders, rebuild URLs, digest a listing.

Pure helpers of :class:`pipekit.pipes._fsspec_io.FSSpecFileLister` (``list_files_by_fsspec``).
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import posixpath
import re
from collections.abc import Callable, Sequence

__all__: list[str] = []


def _join_url(root: str, name: str) -> str:
    """Turn a path listed by fsspec back into a URL in the same form as ``root``.

    fsspec lists paths without their protocol (``bucket/key``, ``/dir/file``);
    the protocol, and any chained URL around it, is taken from ``root``.
    """
    if "://" in name:  # http(s) listings already give full URLs
        return name
    parts = root.split("::")
    # The part that carries the path: the first one with a "://", or the last (a bare path).
    idx = next((i for i, p in enumerate(parts) if "://" in p), len(parts) - 1)
    scheme = parts[idx].split("://", 1)[0] + "://" if "://" in parts[idx] else ""
    parts[idx] = scheme + name
    return "::".join(parts)


def _matcher(masks: Sequence[str]) -> Callable[[str], bool]:
    """A test of listed names against ``masks``, compiled once per listing.

    A name is kept if any mask matches: masks without ``/`` are matched
    against the name's last part, masks with ``/`` against the whole name, as
    by ``fnmatch.fnmatch``, which normalizes the case of both sides (``os.path.normcase``,
    which only changes anything on Windows) and looks its compiled pattern up
    in a cache on every call; this does the same normalization on the pattern
    once and on each name as it comes.
    """
    if not masks:
        return lambda name: True
    by_name = [re.compile(fnmatch.translate(os.path.normcase(m))).match for m in masks if "/" not in m]
    by_path = [re.compile(fnmatch.translate(os.path.normcase(m))).match for m in masks if "/" in m]
    normcase = os.path.normcase
    if normcase is posixpath.normcase:  # str -> the same str: skip the call per name
        normcase = str

    def match(name: str) -> bool:
        if by_name:
            base = normcase(name.rstrip("/").rsplit("/", 1)[-1])
            for fn in by_name:
                if fn(base) is not None:
                    return True
        if by_path:
            path = normcase(name)
            for fn in by_path:
                if fn(path) is not None:
                    return True
        return False

    return match


def _scan_local(path: str, recursive: bool) -> list[str] | None:
    """The non-directory entries under the local directory ``path``, as fsspec's local filesystem lists them.

    The same names as ``LocalFileSystem.find(path, withdirs=False)`` (with
    ``recursive``) or the non-directory entries of ``LocalFileSystem.ls(path)``:
    ``path`` joined with each entry's name, symbolic links (to files or to
    directories) and other special files included as files, directories
    followed only when they are real directories.  One ``os.scandir`` per
    directory, no ``stat`` per file (fsspec builds a full ``info`` dict per
    entry).  Returns ``None`` when a directory cannot be read (fsspec then
    decides what that means: an error for the root, an empty sub-directory
    for ``find``), so the caller lists through fsspec instead.
    """
    names: list[str] = []
    todo = [path]
    try:
        while todo:
            with os.scandir(todo.pop()) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        if recursive:
                            todo.append(entry.path)
                    else:
                        names.append(entry.path)
    except OSError:
        return None
    return names


def _listing_digest(urls: list[str]) -> str:
    """A 128-bit hash of a listing (its URLs in order): what a lister's checkpoint keeps instead of the URLs."""
    return hashlib.blake2b("\n".join(urls).encode("utf-8", "surrogateescape"), digest_size=16).hexdigest()
