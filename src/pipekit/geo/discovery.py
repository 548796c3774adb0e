"""Finding the files of a raster dataset and what their names and headers say.

What a :class:`~pipekit.geo.raster.RasterDataset` does when it is built, in
functions of their own so that ``pipekit inspect`` shares them:

* :func:`find_files`: scan roots (directories, files, globs, fsspec URLs,
  lists of them) for ``filename_glob``, skip hidden files and GDAL's side
  files, keep the names matching ``filename_regex`` (:func:`find_paths`: the
  same as two lists, paths and matches; a local folder is listed with one
  ``os.scandir`` per folder and list comprehensions, no step per file in
  Python where a comprehension or a ``str`` method can do it);
* :func:`date_interval`: the time interval a date in a file name stands for
  (:func:`date_intervals`: of many names, each distinct date parsed once);
* :func:`group_scenes`: band files grouped into scenes (``separate_files``
  products such as Landsat and Sentinel-2);
* :func:`read_header` and :func:`read_headers`: what raster headers say
  (:class:`RasterHeader`), and why a raster cannot be indexed
  (:meth:`RasterHeader.index_error`, :class:`GeoReferenceError`); many
  headers are read on a thread pool, in order, with a progress bar for
  large folders (:func:`default_workers`);
* :class:`HeaderColumns` and ``_FileTable``: the per-file metadata of an
  index, in arrays (saved and reloaded by :mod:`pipekit.geo.index_cache`);
* :func:`gc_paused`: the cyclic garbage collector off while 100,000 files
  are listed and indexed (it doubled the cost of listing them).

Local GeoTIFF headers are parsed without GDAL by
:mod:`pipekit.geo.tiff_header` when a dataset is indexed (see there).

Remote listings are retried through transient failures (a server restart,
throttling) with :mod:`pipekit.retry`'s budget; when it runs out, a
:class:`~pipekit.errors.ReadError` names the root, the stage
(``<dataset>.listing``) and the attempts.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fnmatch
import functools
import gc
import glob as globlib
import itertools
import logging
import math
import operator
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

import numpy as np
from affine import Affine
from rasterio.crs import CRS

from pipekit.errors import ReadError, StageError
from pipekit.geo import io as geo_io
from pipekit.geo.read import apply_affine, transform_bounds_fast

__all__ = [
    "DatasetNotFoundError",
    "GeoReferenceError",
    "HeaderColumns",
    "RasterHeader",
    "any_band_glob",
    "DateColumn",
    "date_interval",
    "date_intervals",
    "default_workers",
    "find_files",
    "find_paths",
    "gc_paused",
    "group_scenes",
    "read_header",
    "read_headers",
]

logger = logging.getLogger("pipekit.geo")

T = TypeVar("T")

#: one scene of band files: ``{(band, *variants): (path, its filename_regex match)}``
Scene = dict[tuple[Any, ...], tuple[str, "re.Match[str]"]]


class GeoReferenceError(StageError, ValueError):
    """A raster cannot be placed on the map: it has no CRS or no geotransform."""


class DatasetNotFoundError(FileNotFoundError):
    """No file of a dataset was found (TorchGeo's name; a ``FileNotFoundError``, which pipekit raised before)."""


# ---------------------------------------------------------------------------------------------
# dates in file names


_PRECISION_STEPS = (
    ("%f", "microsecond"),
    ("%S", "second"),
    ("%s", "second"),
    ("%T", "second"),
    ("%M", "minute"),
    ("%H", "hour"),
    ("%I", "hour"),
    ("%d", "day"),
    ("%j", "day"),
    ("%m", "month"),
    ("%b", "month"),
    ("%B", "month"),
)


def date_interval(text: str, date_format: str) -> tuple[float, float]:
    """The time interval (POSIX seconds) a date string stands for at its format's precision.

    ``"2021"`` with ``"%Y"`` is the whole year 2021; ``"20210701"`` with
    ``"%Y%m%d"`` that day.  The end is one microsecond before the next period.

    Example:
        >>> from datetime import datetime, timezone
        >>> start, end = date_interval("20210701", "%Y%m%d")
        >>> datetime.fromtimestamp(start, timezone.utc).isoformat()
        '2021-07-01T00:00:00+00:00'
        >>> round(end - start, 6)
        86399.999999
    """
    return _date_interval(text, date_format)


@functools.lru_cache(maxsize=1 << 16)  # many files share a date; strptime costs ~10 us
def _date_interval(text: str, date_format: str) -> tuple[float, float]:
    start = datetime.strptime(text, date_format)
    if start.tzinfo is None:
        start = start.replace(tzinfo=timezone.utc)
    unit = "year"
    for directive, name in _PRECISION_STEPS:
        if directive in date_format:
            unit = name
            break
    if unit == "year":
        end = start.replace(year=start.year + 1, month=1, day=1, hour=0, minute=0, second=0, microsecond=0)
    elif unit == "month":
        year, month = (start.year + 1, 1) if start.month == 12 else (start.year, start.month + 1)
        end = start.replace(year=year, month=month, day=1, hour=0, minute=0, second=0, microsecond=0)
    else:
        step = {
            "day": timedelta(days=1),
            "hour": timedelta(hours=1),
            "minute": timedelta(minutes=1),
            "second": timedelta(seconds=1),
            "microsecond": timedelta(microseconds=1),
        }[unit]
        end = start + step
    return start.timestamp(), end.timestamp() - 1e-6


@dataclass
class DateColumn:
    """The time intervals of many date texts (:func:`date_intervals`), one row per text.

    Attributes:
        intervals: ``[n, 2]`` POSIX seconds (NaN where no date is given or it failed).
        given: the text is a date to parse (not ``None`` or empty).
        failed: it is given and could not be parsed (:meth:`error` says why).
    """

    intervals: np.ndarray
    given: np.ndarray
    failed: np.ndarray
    codes: np.ndarray
    errors: list[BaseException | None]

    def error(self, i: int) -> BaseException | None:
        """The exception :func:`date_interval` raised for text ``i`` (``None`` if it did not fail)."""
        return self.errors[int(self.codes[i])]


def date_intervals(texts: Sequence[str | None], date_format: str) -> DateColumn:
    """:func:`date_interval` of many texts, each distinct text parsed once (``None``/``""``: no date).

    Files of a dataset share few dates: 100,000 file names are not 100,000
    calls; the rows take their interval from their text's code.  Errors are
    kept, not raised: the caller reports the first row that needs a failed one.

    Example:
        >>> column = date_intervals(["2021", None, "2021", "20x1"], "%Y")
        >>> column.given.tolist(), column.failed.tolist(), column.intervals[0].tolist() == column.intervals[2].tolist()
        ([True, False, True, True], [False, False, False, True], True)
        >>> type(column.error(3)).__name__
        'ValueError'
    """
    code_of = {text: j for j, text in enumerate(dict.fromkeys(texts))}
    codes = np.fromiter(map(code_of.__getitem__, texts), dtype=np.int64, count=len(texts))
    m = len(code_of)
    intervals = np.full((m, 2), np.nan)
    given = np.zeros(m, dtype=bool)
    failed = np.zeros(m, dtype=bool)
    errors: list[BaseException | None] = [None] * m
    for j, text in enumerate(code_of):
        if not text:
            continue
        given[j] = True
        try:
            intervals[j] = _date_interval(text, date_format)
        except Exception as exc:  # kept for the caller, which raises it for the first file that needs it
            failed[j] = True
            errors[j] = exc
    return DateColumn(intervals[codes], given[codes], failed[codes], codes, errors)


# ---------------------------------------------------------------------------------------------
# scanning roots


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
        self.stage = f"{name}.listing"

    def _retrying(self, fn: Callable[[], T], url: str) -> T:
        """``fn()`` (a remote listing) retried through transient failures; a ``ReadError`` naming ``url`` at the end."""
        return self.policy.call(fn, action="list", url=url, stage=self.stage)

    def _fs(self, url: str) -> tuple[Any, str]:
        import fsspec

        return fsspec.core.url_to_fs(url, **self.storage_options)

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
            raise DatasetNotFoundError(f"no such file or directory: {root!r}")
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
        raise DatasetNotFoundError(f"no such file or directory: {root!r}")

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


def _is_local(path: str) -> bool:
    """:func:`pipekit.geo.io.is_local`, with a fast answer for plain paths (called per file)."""
    return ("://" not in path and "::" not in path) or geo_io.is_local(path)


def _split_name(path: str) -> tuple[str, str]:
    """``(directory with separator, file name)`` of a local path or URL."""
    if "://" not in path and "::" not in path:
        head, _, tail = path.rpartition(os.sep)
        if head and not head.endswith(os.sep):  # the common case, without os.path.split's cost
            return head + os.sep, tail
    if _is_local(path):
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
            f"{name}: no files matching filename_glob {pattern!r} and filename_regex found in {root!r}"
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
            f"{name}: no files matching filename_glob {pattern!r} and filename_regex found in {root!r}"
        )
    if origins is not None:
        origins.update(dict.fromkeys(paths, "scan"))
    return paths, matches


# ---------------------------------------------------------------------------------------------
# scenes of band files


def group_scenes(
    matched: Iterable[tuple[str, re.Match[str]]], variant_groups: Sequence[str] = ("resolution",)
) -> list[Scene]:
    """Band files grouped into scenes, each ``{(band, *variants): (path, match)}``.

    A scene is the files whose names agree in every ``filename_regex`` group
    except ``band`` and the ``variant_groups`` (e.g. Sentinel-2's
    ``resolution``), wherever they lie (Sentinel-2 Level-2A keeps its 10, 20
    and 60 m bands in sibling folders) -- unless two of them would hold the
    same band and variant, in which case each folder is a scene of its own.
    Scenes come in the order of their first file in ``matched`` (the
    folders of a split scene in sorted order); of files of one folder that
    agree in every group, the last one is kept.

    Example:
        >>> import re
        >>> regex = re.compile(r"(?P<scene>S[0-9])_(?P<band>B[0-9])(?:_(?P<resolution>[0-9]+m))?[.]tif$")
        >>> names = ["a/S1_B1.tif", "a/S1_B2.tif", "b/S1_B3_20m.tif", "a/S2_B1.tif"]
        >>> scenes = group_scenes([(n, regex.search(n)) for n in names])
        >>> [sorted(path for path, _ in scene.values()) for scene in scenes]
        [['a/S1_B1.tif', 'a/S1_B2.tif', 'b/S1_B3_20m.tif'], ['a/S2_B1.tif']]
        >>> sorted(scenes[0])
        [('B1', None), ('B2', None), ('B3', '20m')]
    """
    variants = tuple(variant_groups)
    groups: dict[tuple[Any, ...], dict[str, Scene]] = {}
    for path, match in matched:
        gd = match.groupdict()
        key = tuple(sorted((k, v) for k, v in gd.items() if k != "band" and k not in variants))
        band_variant = (gd.get("band"), *(gd.get(g) for g in variants))
        directory = _split_name(path)[0]
        groups.setdefault(key, {}).setdefault(directory, {})[band_variant] = (path, match)
    scenes: list[Scene] = []
    for dirs in groups.values():
        merged: Scene = {}
        collision = False
        for directory in sorted(dirs):
            for band_variant, found in dirs[directory].items():
                collision = collision or band_variant in merged
                merged[band_variant] = found
        scenes.extend([merged] if not collision else [dirs[d] for d in sorted(dirs)])
    return scenes


# ---------------------------------------------------------------------------------------------
# raster headers


@dataclass
class RasterHeader:
    """What a raster's header says (see :func:`read_header`).

    Attributes:
        url: the file.
        crs: its CRS (``None`` if it has none).
        transform: its geotransform (the identity if it has none).
        width, height, count: pixels and bands.
        dtype: the first band's data type (``""`` without bands).
        nodata: the nodata value, or ``None``.
        bounds: ``(left, bottom, right, top)`` in its CRS, as rasterio reports them.
        has_gcps: it has ground control points (read only when it has no CRS).
        block_shape, compression, overviews, tags: its storage layout (band 1's
            ``(rows, cols)`` blocks, the ``compress`` creation option, how many
            overviews band 1 has, the dataset tags); only read with ``layout=True``.
    """

    url: str
    crs: CRS | None
    transform: Affine
    width: int
    height: int
    count: int
    dtype: str
    nodata: float | None
    bounds: tuple[float, float, float, float]
    has_gcps: bool = False
    block_shape: tuple[int, int] | None = None
    compression: str | None = None
    overviews: int = 0
    tags: dict[str, str] = field(default_factory=dict)

    @property
    def georeferenced(self) -> bool:
        """Whether the raster can be placed on the map: it has a CRS and a geotransform."""
        return self.crs is not None and bool(_wkt(self.crs)) and self.transform != Affine.identity()

    @property
    def res(self) -> tuple[float, float]:
        """``(xres, yres)``: the pixel size along its columns and rows, in CRS units (rotation-aware)."""
        t = self.transform
        return math.hypot(t.a, t.d), math.hypot(t.b, t.e)

    def index_error(self, stage: str) -> StageError | None:
        """Why this raster cannot be indexed by a geo dataset (no CRS, no geotransform, no bands), or ``None``."""
        if self.crs is None or not _wkt(self.crs):
            extra = " (it has ground control points; warp it to a CRS first, e.g. gdalwarp)" if self.has_gcps else ""
            return GeoReferenceError(
                "index raster", self.url, stage, f"the raster has no CRS, so it cannot be placed on the map{extra}"
            )
        if self.transform == Affine.identity():
            return GeoReferenceError(
                "index raster", self.url, stage, "the raster has no geotransform (pixel coordinates only)"
            )
        if self.count < 1:
            return ReadError("index raster", self.url, stage, "the raster has no bands")
        return None


#: ``id(crs) -> (crs, its WKT)`` of recent CRS objects: headers read fast share one CRS object per
#: kind of file, and ``to_wkt`` costs ~20-100 us (the CRS is held, so its id is not reused)
_WKT_CACHE: dict[int, tuple[CRS, str]] = {}
_WKT_CACHE_SIZE = 256


def _wkt(crs: CRS) -> str:
    """``crs.to_wkt()``, remembered for the CRS object (CRSs do not change)."""
    found = _WKT_CACHE.get(id(crs))
    if found is not None and found[0] is crs:
        return found[1]
    wkt = crs.to_wkt()
    if len(_WKT_CACHE) >= _WKT_CACHE_SIZE:
        _WKT_CACHE.clear()
    _WKT_CACHE[id(crs)] = (crs, wkt)
    return wkt


def read_header(
    opener: geo_io.RasterOpener, url: str, stage: str = "read_header", layout: bool = False
) -> RasterHeader:
    """Open ``url`` with ``opener``, read its header and close it again.

    ``layout=True`` also reads the storage layout (blocks, compression,
    overviews, tags), which only reports need.

    Raises:
        ReadError: the file cannot be opened (naming ``url`` and ``stage``).

    Example:
        >>> import tempfile, numpy as np, rasterio
        >>> from affine import Affine
        >>> from pipekit.geo.io import RasterOpener
        >>> path = f"{tempfile.mkdtemp()}/a.tif"
        >>> with rasterio.open(path, "w", driver="GTiff", width=4, height=2, count=1, dtype="uint8",
        ...                    crs="EPSG:32615", transform=Affine(10, 0, 500000, 0, -10, 4000000)) as f:
        ...     f.write(np.zeros((1, 2, 4), dtype="uint8"))
        >>> header = read_header(RasterOpener(), path)
        >>> header.crs.to_epsg(), header.res, header.bounds, header.georeferenced
        (32615, (10.0, 10.0), (500000.0, 3999980.0, 500040.0, 4000000.0), True)
    """
    ds = opener.open(url, stage)
    try:
        crs = ds.crs
        header = RasterHeader(
            url=url,
            crs=crs,
            transform=ds.transform,
            width=ds.width,
            height=ds.height,
            count=ds.count,
            dtype=ds.dtypes[0] if ds.count else "",
            nodata=ds.nodata,
            bounds=tuple(ds.bounds),
            has_gcps=bool(ds.gcps[0]) if crs is None else False,
        )
        if layout:
            header.block_shape = tuple(ds.block_shapes[0]) if ds.count else (0, 0)
            header.compression = ds.profile.get("compress")
            header.overviews = len(ds.overviews(1)) if ds.count else 0
            header.tags = dict(ds.tags())
    finally:
        ds.close()
    return header


#: folders with at least this many files get a progress bar (``progress=None``)
PROGRESS_MIN_FILES = 5_000

#: the most threads that read remote headers (I/O-bound: waiting on the network)
REMOTE_WORKERS = 16

#: files one task of the thread pool reads (under one GDAL environment)
_CHUNK = 64


def default_workers(local: bool = True) -> int:
    """Threads that read headers when ``workers=None``: ``PIPEKIT_INDEX_WORKERS``, else a choice by machine.

    Remote headers: :data:`REMOTE_WORKERS` (the threads wait on the network).
    Local headers: one thread per usable core up to 8 on machines with at
    least 4 cores, else 1.  Opening a small local GeoTIFF costs ~0.5 ms of
    CPU, most of it in rasterio's Python-level code that holds the GIL; on 2
    cores threads were slower than one loop (1,000 files: 1.26 s with 2
    threads, 0.99 s in one; see ``benchmarks/index_build.py``).

    Example:
        >>> default_workers(local=False)
        16
    """
    value = os.environ.get("PIPEKIT_INDEX_WORKERS", "").strip()
    if value:
        try:
            workers = int(value)
        except ValueError:
            raise ValueError(f"PIPEKIT_INDEX_WORKERS must be a positive integer, got {value!r}") from None
        if workers < 1:
            raise ValueError(f"PIPEKIT_INDEX_WORKERS must be a positive integer, got {value!r}")
        return workers
    if not local:
        return REMOTE_WORKERS
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return min(8, cores) if cores >= 4 else 1


def check_workers(workers: Any) -> int | None:
    """``workers`` if it is ``None`` or a positive int (``TypeError``/``ValueError`` otherwise)."""
    if workers is None:
        return None
    if isinstance(workers, bool) or not isinstance(workers, int):
        raise TypeError(f"index_workers must be a positive int or None, got {workers!r}")
    if workers < 1:
        raise ValueError(f"index_workers must be a positive int or None, got {workers!r}")
    return workers


def read_headers(
    paths: Sequence[str],
    read: Callable[[str], T],
    workers: int | None = None,
    progress: bool | None = None,
    desc: str = "index",
) -> list[T]:
    """``read(path)`` for every path, in the order of ``paths``, on a pool of threads.

    Args:
        paths: local paths or URLs.
        read: what to do with one of them (its exceptions propagate: the
            first one in the order of ``paths``; make it return errors to
            handle them all).
        workers: threads (``None``: :func:`default_workers`; 1: on this
            thread, for local files).  Remote headers are read on threads
            started from pipekit's GDAL network I/O threads, never on the
            calling thread (see :mod:`pipekit.geo.io`).
        progress: show a tqdm progress bar (``None``: only for
            :data:`PROGRESS_MIN_FILES` files or more).
        desc: the progress bar's label.

    Local files are opened with ``GDAL_DISABLE_READDIR_ON_OPEN=TRUE``: GDAL
    then looks for side files (``.aux.xml``, ``.ovr``, world files...) with
    one ``stat`` each instead of listing the whole folder at every open
    (which cost ~40% of the time in a folder of 1,000 files); the same
    result as GDAL's own fallback for folders of more than 1,000 files.

    Example:
        >>> read_headers(["b", "a", "c"], str.upper, workers=2)
        ['B', 'A', 'C']
    """
    remote = not all(geo_io.is_local(p) for p in paths)
    if workers is None:
        workers = default_workers(local=not remote)
    workers = max(1, min(workers, len(paths)))
    bar = _progress_bar(len(paths), progress, desc)
    try:
        if remote:
            # on GDAL's network threads: never on this thread (see pipekit.geo.io)
            return list(geo_io.run_remote(lambda: _map_threads(read, paths, workers, bar, False)))
        return _map_threads(read, paths, workers, bar, True)
    finally:
        if bar is not None:
            bar.close()


def _progress_bar(total: int, progress: bool | None, desc: str) -> Any:
    if progress is None:
        progress = total >= PROGRESS_MIN_FILES
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="file", dynamic_ncols=True, mininterval=0.5)


def _read_chunk(read: Callable[[str], T], chunk: Sequence[str], bar: Any, local: bool) -> list[T]:
    import rasterio

    # one GDAL environment for the chunk: rasterio.open reuses it (its options are thread-local)
    env = rasterio.Env(GDAL_DISABLE_READDIR_ON_OPEN="TRUE") if local else contextlib.nullcontext()
    with env:
        out = [read(p) for p in chunk]
    if bar is not None:
        bar.update(len(chunk))
    return out


def _map_threads(read: Callable[[str], T], paths: Sequence[str], workers: int, bar: Any, local: bool) -> list[T]:
    if not paths:
        return []
    if workers <= 1 or len(paths) == 1:
        out: list[T] = []
        for start in range(0, len(paths), _CHUNK):
            out.extend(_read_chunk(read, paths[start : start + _CHUNK], bar, local))
        return out
    # remote: a file per task (each waits on the network); local: chunks (less pool overhead)
    size = _CHUNK if local else 1
    chunks = [paths[start : start + size] for start in range(0, len(paths), size)]
    with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="pipekit-geo-index") as pool:
        futures = [pool.submit(_read_chunk, read, chunk, bar, local) for chunk in chunks]
        try:
            out = []
            for future in futures:  # in order: the first error of the paths' order is raised
                out.extend(future.result())
            return out
        finally:
            for future in futures:
                future.cancel()


# ---------------------------------------------------------------------------------------------
# the file table


def _strip_prefix(paths: list[str]) -> tuple[str, list[str]]:
    """The leading string all ``paths`` share (not path components), and the paths without it.

    Sorted paths (a listing) share the prefix of their first and last: that
    is checked and the rest cut in one pass over the joined paths (``str``
    methods, no slice per path); anything else takes ``os.path.commonprefix``.

    Example:
        >>> _strip_prefix(["/data/t_01.tif", "/data/t_02.tif"])
        ('/data/t_0', ['1.tif', '2.tif'])
    """
    if len(paths) < 2:
        return "", list(paths)
    # the paths' common prefix is that of the first and last when every path starts with it (always if sorted)
    prefix = os.path.commonprefix([paths[0], paths[-1]])  # noqa: RUF071
    if not prefix:
        return "", list(paths)
    joined = "\0".join(paths)
    cut = "\0" + prefix
    # no path holds NUL (so each one follows a separator) and each separator is followed by the prefix
    if joined.count("\0") == len(paths) - 1 and joined.startswith(prefix) and joined.count(cut) == len(paths) - 1:
        return prefix, joined[len(prefix) :].split(cut)
    prefix = os.path.commonprefix(paths)  # noqa: RUF071
    return prefix, (list(map(operator.itemgetter(slice(len(prefix), None)), paths)) if prefix else list(paths))


class _FileTable:
    """Per-file metadata in arrays (cheap to pickle for 100,000 files)."""

    def __init__(
        self,
        paths: list[str],
        headers: list[RasterHeader],
        times: np.ndarray,
        band_spans: np.ndarray | None,
        band_overrides: dict[tuple[int, str], str],
    ) -> None:
        columns = HeaderColumns.from_headers(headers)
        self._set(paths, columns, times, band_spans, band_overrides)

    @classmethod
    def from_columns(
        cls,
        paths: list[str],
        columns: HeaderColumns,
        times: np.ndarray,
        band_spans: np.ndarray | None,
        band_overrides: dict[tuple[int, str], str],
    ) -> _FileTable:
        """A table from headers already in columns (a saved index, :mod:`pipekit.geo.index_cache`)."""
        table = cls.__new__(cls)
        table._set(paths, columns, times, band_spans, band_overrides)
        return table

    def _set(
        self,
        paths: list[str],
        columns: HeaderColumns,
        times: np.ndarray,
        band_spans: np.ndarray | None,
        band_overrides: dict[tuple[int, str], str],
    ) -> None:
        self.prefix, self.names = _strip_prefix(paths)
        self.crs_list = columns.crs_list
        self.crs_ids = columns.crs_ids
        self.dtypes = columns.dtypes
        self.dtype_ids = columns.dtype_ids
        self.transforms = columns.transforms
        self.shapes = columns.shapes
        self.counts = columns.counts
        self.nodata = columns.nodata
        self.has_nodata = columns.has_nodata
        self.times = times
        self.band_spans = band_spans
        self.band_overrides = band_overrides

    def __len__(self) -> int:
        return len(self.names)

    def path(self, i: int) -> str:
        return self.prefix + self.names[i]

    def band_path(self, i: int, band: str) -> str:
        override = self.band_overrides.get((i, band))
        if override is not None:
            return override
        path = self.path(i)
        start, stop = self.band_spans[i]
        return path[:start] + band + path[stop:]

    def crs(self, i: int) -> CRS:
        return self.crs_list[int(self.crs_ids[i])]

    def transform(self, i: int) -> Affine:
        return Affine(*self.transforms[i])

    def native_bounds(self, i: int) -> tuple[float, float, float, float]:
        """``(left, bottom, right, top)`` of file ``i`` in its own CRS (rotation-aware)."""
        t = self.transform(i)
        h, w = self.shapes[i]
        xs, ys = zip(*(apply_affine(t, c, r) for c, r in ((0, 0), (w, 0), (0, h), (w, h))))
        return min(xs), min(ys), max(xs), max(ys)

    def file_nodata(self, i: int) -> float | None:
        return float(self.nodata[i]) if self.has_nodata[i] else None

    def res(self, i: int) -> tuple[float, float]:
        t = self.transform(i)
        return math.hypot(t.a, t.d), math.hypot(t.b, t.e)

    def footprints(self, crs: CRS) -> np.ndarray:
        """``[N, 4]`` (minx, maxx, miny, maxy) of every file in ``crs`` (densified edge transforms)."""
        out = np.empty((len(self), 4), dtype=np.float64)
        if not len(self):
            return out
        a, b, c, d, e, f = (np.ascontiguousarray(column) for column in self.transforms.T)
        h, w = self.shapes[:, 0].astype(np.float64), self.shapes[:, 1].astype(np.float64)
        zero = np.zeros_like(w)
        # the four corners (0, 0), (w, 0), (0, h), (w, h) of every file, vectorised (rotation-aware); one
        # elementwise min/max per pair of corners (reducing along a short axis of [N, 4] cost 4x as much)
        corners = ((zero, zero), (w, zero), (zero, h), (w, h))
        xs = [a * col + b * row + c for col, row in corners]
        ys = [d * col + e * row + f for col, row in corners]
        out[:, 0] = np.minimum(np.minimum(xs[0], xs[1]), np.minimum(xs[2], xs[3]))
        out[:, 1] = np.maximum(np.maximum(xs[0], xs[1]), np.maximum(xs[2], xs[3]))
        out[:, 2] = np.minimum(np.minimum(ys[0], ys[1]), np.minimum(ys[2], ys[3]))
        out[:, 3] = np.maximum(np.maximum(ys[0], ys[1]), np.maximum(ys[2], ys[3]))
        for k, file_crs in enumerate(self.crs_list):
            if file_crs == crs:
                continue
            for i in np.flatnonzero(self.crs_ids == k).tolist():
                minx, maxx, miny, maxy = out[i]
                left, bottom, right, top = transform_bounds_fast(file_crs, crs, minx, miny, maxx, maxy)
                out[i] = (left, right, bottom, top)
        return out


class HeaderColumns:
    """The index-relevant fields of many :class:`RasterHeader`\\ s, in arrays (CRSs and dtypes as codes).

    Attributes:
        crs_list, crs_ids: the distinct CRSs and each file's position in that list.
        dtypes, dtype_ids: the distinct data types and each file's.
        transforms: ``[N, 6]`` ``(a, b, c, d, e, f)``; shapes: ``[N, 2]`` ``(height, width)``;
        counts: bands; nodata, has_nodata: the nodata value (``NaN`` where it has none).
    """

    def __init__(
        self,
        crs_list: list[CRS],
        crs_ids: np.ndarray,
        dtypes: list[str],
        dtype_ids: np.ndarray,
        transforms: np.ndarray,
        shapes: np.ndarray,
        counts: np.ndarray,
        nodata: np.ndarray,
        has_nodata: np.ndarray,
    ) -> None:
        self.crs_list = crs_list
        self.crs_ids = np.asarray(crs_ids, dtype=np.int32)
        self.dtypes = dtypes
        self.dtype_ids = np.asarray(dtype_ids, dtype=np.int16)
        self.transforms = np.asarray(transforms, dtype=np.float64).reshape(-1, 6)
        self.shapes = np.asarray(shapes, dtype=np.int64).reshape(-1, 2)
        self.counts = np.asarray(counts, dtype=np.int32)
        self.nodata = np.asarray(nodata, dtype=np.float64)
        self.has_nodata = np.asarray(has_nodata, dtype=bool)

    def __len__(self) -> int:
        return len(self.crs_ids)

    @classmethod
    def from_headers(cls, headers: Sequence[RasterHeader]) -> HeaderColumns:
        n = len(headers)
        crs_list: list[CRS] = []
        crs_keys: dict[str, int] = {}
        crs_ids = np.empty(n, dtype=np.int32)
        dtypes: list[str] = []
        dtype_ids = np.empty(n, dtype=np.int16)
        transforms = np.empty((n, 6), dtype=np.float64)
        shapes = np.empty((n, 2), dtype=np.int64)
        counts = np.empty(n, dtype=np.int32)
        nodata = np.full(n, np.nan, dtype=np.float64)
        has_nodata = np.zeros(n, dtype=bool)
        for i, header in enumerate(headers):
            wkt = _wkt(header.crs)
            if wkt not in crs_keys:
                crs_keys[wkt] = len(crs_list)
                crs_list.append(header.crs)
            crs_ids[i] = crs_keys[wkt]
            if header.dtype not in dtypes:
                dtypes.append(header.dtype)
            dtype_ids[i] = dtypes.index(header.dtype)
            t = header.transform
            transforms[i] = (t.a, t.b, t.c, t.d, t.e, t.f)
            shapes[i] = (header.height, header.width)
            counts[i] = header.count
            if header.nodata is not None:
                nodata[i] = header.nodata
                has_nodata[i] = True
        return cls(crs_list, crs_ids, dtypes, dtype_ids, transforms, shapes, counts, nodata, has_nodata)

    def take(self, rows: Any) -> HeaderColumns:
        """The columns of ``rows`` (an int array), in that order (the CRS and dtype lists are kept)."""
        rows = np.asarray(rows, dtype=np.int64)
        return HeaderColumns(
            self.crs_list,
            self.crs_ids[rows],
            self.dtypes,
            self.dtype_ids[rows],
            self.transforms[rows],
            self.shapes[rows],
            self.counts[rows],
            self.nodata[rows],
            self.has_nodata[rows],
        )

    def header(self, i: int, url: str) -> RasterHeader:
        """Row ``i`` as a :class:`RasterHeader` (the fields an index needs; the bounds computed)."""
        t = Affine(*self.transforms[i].tolist())
        h, w = (int(v) for v in self.shapes[i])
        xs, ys = zip(*(apply_affine(t, c, r) for c, r in ((0, 0), (w, 0), (0, h), (w, h))))
        return RasterHeader(
            url=url,
            crs=self.crs_list[int(self.crs_ids[i])],
            transform=t,
            width=w,
            height=h,
            count=int(self.counts[i]),
            dtype=self.dtypes[int(self.dtype_ids[i])],
            nodata=float(self.nodata[i]) if self.has_nodata[i] else None,
            bounds=(min(xs), min(ys), max(xs), max(ys)),
        )
