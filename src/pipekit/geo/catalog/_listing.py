"""Finding the files of a dataset: listing roots locally and through fsspec, and keeping those that match.

* :func:`find_files`: scan roots (directories, files, globs, fsspec URLs,
  lists of them) for ``filename_glob``, skip hidden files and GDAL's side
  files, keep the names matching ``filename_regex`` (:func:`find_paths`: the
  same as two lists, paths and matches; a local folder is listed with one
  ``os.scandir`` per folder and list comprehensions, no step per file in
  Python where a comprehension or a ``str`` method can do it);
* ``_Lister``: what one root stands for (a folder's files, a glob's, one
  file) and the files beside a file, locally or through fsspec;
* :func:`any_band_glob`: a ``filename_glob`` whose band placeholder matches any band;
* :func:`gc_paused`: the cyclic garbage collector off while 100,000 files
  are listed and indexed (it doubled the cost of listing them).

Remote listings are retried through transient failures (a server restart,
throttling) with :mod:`pipekit.retry`'s budget; when it runs out, a
:class:`~pipekit.errors.ReadError` names the root, the stage
(``<dataset>.listing``) and the attempts.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import gc
import glob as globlib
import itertools
import logging
import operator
import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from pipekit._fs import is_local, url_to_fs
from pipekit.errors import DatasetNotFoundError, ReadError
from pipekit.geo import io as geo_io

__all__ = ["any_band_glob", "find_files", "find_paths", "gc_paused"]

logger = logging.getLogger("pipekit.geo")

T = TypeVar("T")


def _as_list(root: Any) -> list[str]:
    if isinstance(root, (str, os.PathLike)):
        return [os.fspath(root)]
    if isinstance(root, Iterable):
        items = [os.fspath(r) for r in root]
        if not items:
            raise ValueError("root is an empty list")
        return items
    raise TypeError(f"root must be a path, URL, glob or a list of them, got {type(root).__name__}")


def _has_magic(path: str) -> bool:
    return any(c in path for c in "*?[")


class _Lister:
    """Lists files under local paths and fsspec URLs (one filesystem per protocol)."""

    def __init__(self, storage_options: Mapping[str, Any], retry: Any = None, name: str = "find_files") -> None:
        from pipekit.retry import resolve_retry

        self.storage_options = dict(storage_options)
        self._dirs: dict[str, set[str]] = {}
        self.policy = resolve_retry(retry)
        self.name = name
        self.stage = f"{name}.listing"

    def _retrying(self, fn: Callable[[], T], url: str) -> T:
        """``fn()`` (a remote listing) retried through transient failures; a ``ReadError`` naming ``url`` at the end."""
        return self.policy.call(fn, action="list", url=url, stage=self.stage)

    def _fs(self, url: str) -> tuple[Any, str]:

        return url_to_fs(url, self.storage_options)

    def expand(self, root: str, pattern: str) -> tuple[list[tuple[str, str]], bool]:
        """``(path, file name)`` of the files ``root`` stands for, and whether they were named (not found by a scan)."""
        paths, names, explicit = self.expand_lists(root, pattern)
        return list(zip(paths, names)), explicit

    def expand_lists(self, root: str, pattern: str) -> tuple[list[str], list[str], bool]:
        """:meth:`expand` as two lists (paths, file names); a local folder's are sorted by path."""
        if geo_io.is_local(root):
            path = geo_io.local_path(root)
            if os.path.isdir(path):
                return (*_scan_folder(path, pattern), False)
            if _has_magic(path):
                found = [p for p in globlib.glob(path, recursive=True) if os.path.isfile(p)]
                return found, [os.path.basename(p) for p in found], False
            if os.path.isfile(path):
                return [path], [os.path.basename(path)], True
            raise DatasetNotFoundError(f"Dataset not found: {self.name}: no such file or directory: {root!r}")
        found, explicit = self._retrying(lambda: self._expand_remote(root, pattern), root)
        return found, [p.rsplit("/", 1)[-1] for p in found], explicit

    def _expand_remote(self, root: str, pattern: str) -> tuple[list[str], bool]:
        fs, path = self._fs(root)
        fs.invalidate_cache(path)  # list what is there now, not an earlier listing fsspec kept
        if _has_magic(path):
            return [fs.unstrip_protocol(p) for p in fs.glob(path) if fs.isfile(p)], False
        if fs.isdir(path):
            base = path.rstrip("/")
            found = []
            for p in fs.find(base):
                fname = p.rsplit("/", 1)[-1]
                rel = p[len(base) + 1 :]
                if fnmatch.fnmatchcase(fname, pattern) or fnmatch.fnmatchcase(rel, pattern):
                    found.append(fs.unstrip_protocol(p))
            return found, False
        if fs.isfile(path):
            return [fs.unstrip_protocol(path)], True
        raise DatasetNotFoundError(f"Dataset not found: {self.name}: no such file or directory: {root!r}")

    def siblings(self, path: str) -> set[str]:
        """Names of the files in ``path``'s directory (listed once per directory)."""
        if geo_io.is_local(path):
            directory = os.path.dirname(geo_io.local_path(path)) or "."
        else:
            directory = path.rsplit("/", 1)[0]
        names = self._dirs.get(directory)
        if names is None:
            if geo_io.is_local(directory):
                try:
                    names = set(os.listdir(directory))
                except OSError:
                    names = set()
            else:
                fs, p = self._fs(directory)

                def ls() -> set[str]:
                    try:
                        return {e.rstrip("/").rsplit("/", 1)[-1] for e in fs.ls(p, detail=False)}
                    except FileNotFoundError:
                        return set()

                try:
                    names = self._retrying(ls, directory)
                except ReadError:
                    raise
                except OSError:
                    names = set()
            self._dirs[directory] = names
        return names


@functools.lru_cache(maxsize=64)
def _glob_matcher(pattern: str) -> Callable[[str], Any]:
    """``fnmatch.fnmatchcase(name, pattern)`` as one compiled regex's ``match`` (the same translation)."""
    return re.compile(fnmatch.translate(pattern)).match


def _is_dir(entry: os.DirEntry[str]) -> bool:
    """``entry.is_dir()``, ``False`` where it fails (as :func:`os.walk` and :func:`os.path.isdir` decide)."""
    try:
        return entry.is_dir()
    except OSError:
        return False


def _folder_entries(folder: str) -> list[os.DirEntry[str]] | None:
    """The entries of ``folder``, or ``None`` where it cannot be listed (:func:`os.walk` skips it then)."""
    try:
        scan = os.scandir(folder)
    except OSError:
        return None
    with scan:
        try:
            return list(scan)
        except OSError:  # os.walk yields nothing of a folder whose listing fails half-way
            return None


def _scan_folder(top: str, pattern: str) -> tuple[list[str], list[str]]:
    """The files under ``top`` (as :func:`os.walk` finds them) whose name, or path relative to ``top``, matches
    the glob ``pattern``: ``(paths, names)``, sorted by path.

    One :func:`os.scandir` per folder and list comprehensions instead of
    :func:`os.walk`'s per-entry loop; the paths are the entries' own
    (``DirEntry.path``: ``top`` joined with the name as ``os.walk`` joins it),
    not joined again.  The files of one folder are sorted by name (the
    same order as by path, and shorter strings to compare); files of several
    folders by path.  Symbolic links to folders are listed as folders and not
    followed, and a folder that cannot be listed is skipped, as ``os.walk``
    does.
    """
    match = _glob_matcher(pattern)
    folders: list[tuple[str, list[os.DirEntry[str]]]] = []  # (folder, its files matching the glob)
    todo = [(top, "")]
    while todo:
        folder, rel_dir = todo.pop()
        entries = _folder_entries(folder)
        if entries is None:
            continue
        try:
            is_dir = [e.is_dir() for e in entries]
        except OSError:
            is_dir = [_is_dir(e) for e in entries]
        files = entries
        if any(is_dir):
            files = [e for e, d in zip(entries, is_dir) if not d]
            for entry in itertools.compress(entries, is_dir):
                below = os.path.join(folder, entry.name)
                if not os.path.islink(below):  # a link to a folder is not followed (os.walk's default)
                    todo.append((below, rel_dir + entry.name + os.sep))
        if pattern != "*":  # "*" matches every name
            if rel_dir:
                files = [e for e in files if match(e.name) or match(rel_dir + e.name)]
            else:
                files = [e for e in files if match(e.name)]
        if files:
            folders.append((folder, files))
    if len(folders) == 1:  # one folder (the common case): sorted by name is sorted by path
        folder, files = folders[0]
        names = sorted([e.name for e in files])
        head = os.path.join(folder, "")  # what its entries' DirEntry.path start with
        return [head + n for n in names], names
    entries = [e for _, files in folders for e in files]
    paths = [e.path for e in entries]
    order = sorted(range(len(paths)), key=paths.__getitem__)
    return [paths[i] for i in order], [entries[i].name for i in order]


@contextlib.contextmanager
def gc_paused() -> Any:
    """Python's cyclic garbage collector off for a while (as it was again afterwards; nests).

    Listing and indexing 100,000 files creates a few hundred thousand
    long-lived tuples, strings and match objects; each generation-0
    collection on the way traverses the young ones again, and the full
    collections they trigger traverse everything: with the collector on,
    ``find_files`` over 100,000 names took twice as long (0.74 s vs 0.36 s of
    CPU on the shared development machine).  Nothing built here forms
    reference cycles worth collecting early.

    Example:
        >>> import gc
        >>> with gc_paused():
        ...     gc.isenabled()
        False
        >>> gc.isenabled()
        True
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _split_name(path: str) -> tuple[str, str]:
    """``(directory with separator, file name)`` of a local path or URL."""
    if "://" not in path and "::" not in path:
        head, _, tail = path.rpartition(os.sep)
        if head and not head.endswith(os.sep):  # the common case, without os.path.split's cost
            return head + os.sep, tail
    if is_local(path):
        head, tail = os.path.split(path)
        return (head + os.sep if head else ""), tail
    head, _, tail = path.rpartition("/")
    return head + "/", tail


_SIDECAR_SUFFIXES = (".aux.xml", ".ovr", ".msk")


def _any_sidecar(names: list[str]) -> bool:
    """Whether a hidden file or GDAL side file may be among ``names`` (``True`` too if a name holds a newline).

    Looked for in all the names at once, lower-cased and one per line:
    substring searches for a line that starts with ``.`` or ends with a side
    file's suffix (calling :func:`_is_sidecar` per name cost ~40% of
    listing 100,000 files; one regex over the lines ~30 ms).
    """
    lines = "\n" + "\n".join(names).lower() + "\n"
    if lines.count("\n") != len(names) + 1:
        return True
    return "\n." in lines or any(suffix + "\n" in lines for suffix in _SIDECAR_SUFFIXES)


def _is_sidecar(name: str) -> bool:
    """Hidden files (``.complete``, ``.DS_Store``) and GDAL's side files found next to rasters."""
    return name.startswith(".") or name.lower().endswith(_SIDECAR_SUFFIXES)


def any_band_glob(filename_glob: str) -> str:
    """``filename_glob`` with its band placeholder ``{}`` matching any band (scenes are grouped later).

    Example:
        >>> any_band_glob("LC08_*_{}.*")
        'LC08_*_*.*'
    """
    return filename_glob.replace("{}", "*")


def find_files(
    root: Any,
    pattern: str,
    regex: re.Pattern[str],
    storage_options: Mapping[str, Any] | None = None,
    *,
    with_siblings: bool = False,
    name: str = "find_files",
    all_siblings: bool = False,
    origins: dict[str, str] | None = None,
    retry: Any = None,
) -> list[tuple[str, re.Match[str]]]:
    """The files ``root`` stands for whose names match ``regex``, sorted by path, with their matches.

    ``root`` is a directory (searched recursively for files whose name, or
    path relative to it, matches the glob ``pattern``), a file, a glob, an
    fsspec URL or a list of them.  Hidden files and GDAL's side files
    (``.*``, ``*.aux.xml``, ``*.ovr``, ``*.msk``) found by a scan are
    skipped; a file named explicitly is kept, and with ``with_siblings``
    (products with one file per band) the files beside it are candidates too
    -- beside every file found with ``all_siblings`` (TorchGeo's
    ``filename_glob`` that names one band: the other bands lie beside its
    files).  ``regex`` is matched against file names (not paths).  ``name``
    is the dataset named in log messages and errors.  ``origins``, when
    given, receives each matched path's origin: ``"scan"`` (found by the
    glob), ``"file"`` (named) or ``"sibling"``.  Remote listings that fail
    transiently (a server restart, throttling) are retried with ``retry``
    (a :class:`~pipekit.retry.RetryPolicy`, an int, ``False`` or ``None``:
    the default budget, see :mod:`pipekit.retry`).

    Raises:
        FileNotFoundError: a root does not exist; :class:`DatasetNotFoundError` (a
            ``FileNotFoundError``) when no file matches (names ``root`` and ``pattern``).
        ReadError: a remote listing still fails when the retry budget runs out
            (names the root, the stage ``<name>.listing`` and the attempts).

    Example:
        >>> import os, re, tempfile
        >>> root = tempfile.mkdtemp()
        >>> for f in ("a_2021.tif", "b_2022.tif", "notes.txt", ".hidden_2020.tif", "a_2021.tif.aux.xml"):
        ...     open(os.path.join(root, f), "w").close()
        >>> found = find_files(root, "*", re.compile(r"(?P<name>[a-z])_(?P<date>[0-9]{4})[.]tif$"))
        >>> [(os.path.basename(path), match.group("date")) for path, match in found]
        [('a_2021.tif', '2021'), ('b_2022.tif', '2022')]
    """
    paths, matches = find_paths(
        root,
        pattern,
        regex,
        storage_options,
        with_siblings=with_siblings,
        name=name,
        all_siblings=all_siblings,
        origins=origins,
        retry=retry,
    )
    return list(zip(paths, matches))


def find_paths(
    root: Any,
    pattern: str,
    regex: re.Pattern[str],
    storage_options: Mapping[str, Any] | None = None,
    *,
    with_siblings: bool = False,
    name: str = "find_files",
    all_siblings: bool = False,
    origins: dict[str, str] | None = None,
    retry: Any = None,
) -> tuple[list[str], list[re.Match[str]]]:
    """:func:`find_files` as two lists, the paths and their matches (no pair per file to build and unpack).

    Example:
        >>> import os, re, tempfile
        >>> root = tempfile.mkdtemp()
        >>> for f in ("b_2022.tif", "a_2021.tif", ".hidden_2020.tif"):
        ...     open(os.path.join(root, f), "w").close()
        >>> paths, matches = find_paths(root, "*.tif", re.compile(r"[a-z]_(?P<date>[0-9]{4})[.]tif$"))
        >>> [os.path.basename(p) for p in paths], [m.group("date") for m in matches]
        (['a_2021.tif', 'b_2022.tif'], ['2021', '2022'])
    """
    with gc_paused():
        return _find_files(root, pattern, regex, storage_options, with_siblings, name, all_siblings, origins, retry)


def _find_files(
    root: Any,
    pattern: str,
    regex: re.Pattern[str],
    storage_options: Mapping[str, Any] | None,
    with_siblings: bool,
    name: str,
    all_siblings: bool,
    origins: dict[str, str] | None,
    retry: Any,
) -> tuple[list[str], list[re.Match[str]]]:
    lister = _Lister(storage_options or {}, retry, name)
    roots = _as_list(root)
    if len(roots) == 1 and not (with_siblings or all_siblings):
        paths, names, explicit = lister.expand_lists(roots[0], pattern)
        if not explicit:  # one folder or glob (the common case): no duplicates, no siblings
            return _match_scan(paths, names, pattern, regex, name, root, origins)
    # where each candidate came from: "scan" (a directory or glob), "file" (named), "sibling"
    candidates: dict[str, str] = {}
    names_of: dict[str, str] = {}  # each candidate's file name (known from the listing: not split again)
    sidecars = 0
    for item in roots:
        found, explicit = lister.expand(item, pattern)
        if explicit:
            for path, fname in found:
                candidates[path] = "file"
                names_of[path] = fname
            continue
        # hidden files and GDAL's side files are not rasters of their own
        kept = [
            (path, fname)
            for path, fname in found  # _is_sidecar, inlined (called per file)
            if not (fname[:1] == "." or fname.lower().endswith(_SIDECAR_SUFFIXES))
        ]
        sidecars += len(found) - len(kept)
        if not candidates:  # the common case (one folder): no duplicates to look for
            candidates = dict.fromkeys([path for path, _ in kept], "scan")
            names_of = dict(kept)
            continue
        for path, fname in kept:
            if path not in candidates:
                candidates[path] = "scan"
                names_of[path] = fname
    if sidecars:
        logger.info("%s: skipped %d hidden or GDAL side file(s) (.*, *.aux.xml, *.ovr, *.msk)", name, sidecars)
    if with_siblings or all_siblings:
        # the other bands of a file named explicitly (or of every file found) lie beside it
        for path in [p for p, origin in candidates.items() if all_siblings or origin == "file"]:
            directory = _split_name(path)[0]
            for sibling in sorted(lister.siblings(path)):
                if not _is_sidecar(sibling):
                    candidates.setdefault(directory + sibling, "sibling")
                    names_of.setdefault(directory + sibling, sibling)
    order = sorted(candidates)
    matches = list(map(regex.match, [names_of[path] for path in order]))
    kept_paths = [path for path, match in zip(order, matches) if match is not None]
    kept_matches = [match for match in matches if match is not None]
    ignored: list[str] = []
    if len(kept_paths) < len(order):
        for path, match in zip(order, matches):
            if match is None:
                if candidates[path] == "file":
                    logger.warning("%s: ignoring %r: its name does not match filename_regex", name, path)
                if candidates[path] != "sibling":
                    ignored.append(path)
    if origins is not None:
        origins.update((path, candidates[path]) for path in kept_paths)
    if ignored:
        logger.info(
            "%s: %d file(s) found by filename_glob %r do not match filename_regex, e.g. %s",
            name,
            len(ignored),
            pattern,
            ignored[:3],
        )
    if not kept_paths:
        raise DatasetNotFoundError(
            f"Dataset not found: {name}: no files matching filename_glob {pattern!r} and filename_regex found in "
            f"{root!r}"
        )
    return kept_paths, kept_matches


def _match_scan(
    paths: list[str],
    names: list[str],
    pattern: str,
    regex: re.Pattern[str],
    name: str,
    root: Any,
    origins: dict[str, str] | None,
) -> tuple[list[str], list[re.Match[str]]]:
    """:func:`find_paths` for the files of one scan: their paths and names, each path once."""
    # hidden files and GDAL's side files are not rasters of their own: looked for with one regex over all
    # the names (calling _is_sidecar per name cost ~40% of listing 100,000 files), each name checked only
    # when there is one (or when a name holds a newline)
    if _any_sidecar(names):
        keep = [not _is_sidecar(n) for n in names]
        if not all(keep):
            logger.info(
                "%s: skipped %d hidden or GDAL side file(s) (.*, *.aux.xml, *.ovr, *.msk)", name, len(keep) - sum(keep)
            )
            paths = list(itertools.compress(paths, keep))
            names = list(itertools.compress(names, keep))
    if any(map(operator.gt, paths, paths[1:])):  # a glob's files (a folder's come sorted): sorted by path
        order = sorted(range(len(paths)), key=paths.__getitem__)
        paths = [paths[i] for i in order]
        names = [names[i] for i in order]
    matches = list(map(regex.match, names))
    if None in matches:
        ignored = [path for path, match in zip(paths, matches) if match is None]
        logger.info(
            "%s: %d file(s) found by filename_glob %r do not match filename_regex, e.g. %s",
            name,
            len(ignored),
            pattern,
            ignored[:3],
        )
        paths = [path for path, match in zip(paths, matches) if match is not None]
        matches = [match for match in matches if match is not None]
    if not paths:
        raise DatasetNotFoundError(
            f"Dataset not found: {name}: no files matching filename_glob {pattern!r} and filename_regex found in "
            f"{root!r}"
        )
    if origins is not None:
        origins.update(dict.fromkeys(paths, "scan"))
    return paths, matches
