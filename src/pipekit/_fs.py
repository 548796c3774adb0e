"""Paths and URLs: the one answer to "is this local?", fsspec filesystems from options, class-folder listings.

Every module that needs one of these asks here, so a URL is local (or not) the same way everywhere:

* :func:`split_protocol`: ``"s3://b/k"`` -> ``("s3", "b/k")``; a plain path -> ``(None, path)``.
* :func:`is_local`: a plain path or a ``file://`` / ``local://`` URL, not a chained URL (``simplecache::...``).
* :func:`local_path`: the filesystem path of a local URL, else ``None``.
* :func:`url_to_fs`: ``fsspec.core.url_to_fs`` with ``storage_options`` that may be ``None`` or any mapping.
* :func:`fs_is_local`: whether an fsspec filesystem is the local one.
* :func:`list_class_folders`: ``root/<class>/<file>`` listings (image folders, chip datasets), local or remote.
* :func:`listing_record` / :func:`listing_change`: what a checkpoint keeps of a listing its positions count
  (a digest, the count and, up to :data:`LISTING_NAMES_LIMIT` compressed bytes, the names), and on resume
  which files were added or removed since.
* :func:`redact_url` / :func:`redact_secrets`: a URL (or any text naming URLs) without the secrets it may
  carry (a password or token in its user part, a signed query's signature or token), for messages: every
  :class:`~pipekit.errors.PipekitError` and skip report goes through them (defined in :mod:`pipekit._redact`,
  which :mod:`pipekit.errors` imports without importing this module).

Example:
    >>> split_protocol("s3://bucket/key.tif"), is_local("s3://bucket/key.tif"), is_local("/data/a.tif")
    (('s3', 'bucket/key.tif'), False, True)
    >>> local_path("file:///data/a.tif"), local_path("data/a.tif"), local_path("memory://a.tif")
    ('/data/a.tif', 'data/a.tif', None)
"""

from __future__ import annotations

import hashlib
import os
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipekit._redact import redact_secrets, redact_url, shown_url

__all__ = [
    "ClassFolders",
    "fs_is_local",
    "is_local",
    "list_class_folders",
    "listing_change",
    "listing_record",
    "local_path",
    "redact_secrets",
    "redact_url",
    "split_protocol",
    "url_to_fs",
]

_LOCAL_PROTOCOLS = (None, "file", "local")


def split_protocol(url: str | os.PathLike[str]) -> tuple[str | None, str]:
    """``("s3", "bucket/key")`` for ``"s3://bucket/key"``; ``(None, path)`` for a local path."""
    url = os.fspath(url)
    if "://" in url:
        protocol, rest = url.split("://", 1)
        if protocol and protocol.replace("+", "").replace("-", "").isalnum():
            return protocol.lower(), rest
    return None, url


def is_local(url: str | os.PathLike[str]) -> bool:
    """Whether ``url`` names a file on this machine: a plain path or a ``file://``/``local://`` URL, unchained."""
    url = os.fspath(url)
    if "://" not in url and "::" not in url:  # the common case, answered without parsing
        return True
    return split_protocol(url)[0] in _LOCAL_PROTOCOLS and "::" not in url


def local_path(url: str | os.PathLike[str]) -> str | None:
    """The filesystem path of a local ``url`` (``file:///a`` -> ``/a``; a plain path as it is), else ``None``."""
    url = os.fspath(url)
    if "://" not in url and "::" not in url:
        return url
    protocol, rest = split_protocol(url)
    if protocol in _LOCAL_PROTOCOLS and "::" not in url:
        return rest if rest.startswith("/") else "/" + rest
    return None


def url_to_fs(url: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None) -> tuple[Any, str]:
    """``(filesystem, path)`` for ``url`` (``fsspec.core.url_to_fs``), ``storage_options`` ``None`` or a mapping."""
    import fsspec

    return fsspec.core.url_to_fs(os.fspath(url), **dict(storage_options or {}))


def fs_is_local(fs: Any) -> bool:
    """Whether the fsspec filesystem ``fs`` is the local one."""
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    return "file" in protocols or "local" in protocols


@dataclass
class ClassFolders:
    """A ``root/<class>/<file>`` listing: ``prefix`` (the root, ending with a separator), the sorted class
    names, and each class's non-hidden files (sorted; sub-folders belong to their top folder's class)."""

    prefix: str
    classes: list[str]
    files: dict[str, list[str]] = field(default_factory=dict)


def _walk_files(top: str, where: str) -> list[str]:
    """The non-hidden files under ``top``, following links to folders, each folder once.

    A link to a folder already walked (back to its own folder or a parent: a loop; or to a folder of
    the same class listed before) is not followed again, with a warning naming it: plain
    ``os.walk(followlinks=True)`` goes round a loop until the path is too long, listing every file
    dozens of times.
    """
    import warnings

    found: list[str] = []
    seen: set[tuple[int, int]] = set()
    for dirpath, dirnames, names in os.walk(top, followlinks=True):
        try:
            st = os.stat(dirpath)
        except OSError:
            continue
        seen.add((st.st_dev, st.st_ino))
        keep = []
        for d in dirnames:
            if d.startswith("."):
                continue
            sub = os.path.join(dirpath, d)
            if os.path.islink(sub):
                try:
                    target = os.stat(sub)
                except OSError:
                    continue
                if (target.st_dev, target.st_ino) in seen:  # (os.walk is top-down: every ancestor is seen)
                    warnings.warn(f"{where}: {sub!r} links to a folder already listed (a loop, or a second "
                                  "way to the same files); not followed", UserWarning, stacklevel=4)
                    continue
            keep.append(d)
        dirnames[:] = keep
        found.extend(os.path.join(dirpath, n) for n in names if not n.startswith("."))
    return found


def list_class_folders(
    root: str,
    storage_options: Mapping[str, Any] | None,
    where: str,
    not_found: type[FileNotFoundError] = FileNotFoundError,
    absolute: bool = False,
) -> ClassFolders:
    """The class folders of ``root`` (a local path or any fsspec URL) and every non-hidden file under each.

    Hidden names (starting with ``.``) are left out at every level; local folders are walked following
    symbolic links, as torchvision's ``ImageFolder`` does. Local files are listed as paths (``root`` joined as
    given, ``~`` expanded; made absolute with ``absolute=True``), remote ones as full URLs.

    Raises:
        not_found: ``root`` is not a folder (message ``"<where>: no such directory: <root>"``, or that it is
            a file).
        pipekit.errors.ReadError: listing a remote ``root`` failed otherwise, naming it.
    """
    path = local_path(root)
    if path is not None:
        path = os.path.expanduser(path)
        if absolute:
            path = os.path.abspath(path)
        if not os.path.isdir(path):
            if os.path.isfile(path):  # e.g. an image of the folder given by mistake: not "no such directory"
                raise not_found(f"{where}: {root!r} is a file, not a folder of class folders (root/<class>/<file>)")
            raise not_found(f"{where}: no such directory: {root!r}")
        classes = sorted(e.name for e in os.scandir(path) if e.is_dir() and not e.name.startswith("."))
        files: dict[str, list[str]] = {}
        for name in classes:
            files[name] = sorted(_walk_files(os.path.join(path, name), where))
        return ClassFolders(os.path.join(path, ""), classes, files)

    from pipekit.errors import ReadError

    try:
        fs, path = url_to_fs(root, storage_options)
        path = path.rstrip("/")
        entries = fs.ls(path, detail=True)
    except FileNotFoundError:
        raise not_found(f"{where}: no such directory: {root!r}") from None
    except Exception as exc:
        raise ReadError("list", root, where, f"{type(exc).__name__}: {exc}") from exc
    names = (e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries if e.get("type") == "directory")
    classes = sorted(n for n in names if not n.startswith("."))
    files = {}
    for name in classes:
        found = [p for p in fs.find(f"{path}/{name}") if not p.rsplit("/", 1)[-1].startswith(".")]
        files[name] = sorted(fs.unstrip_protocol(p) for p in found)
    return ClassFolders(fs.unstrip_protocol(path) + "/", classes, files)


#: The most compressed bytes of names a listing's checkpoint record keeps (about 100,000 typical paths; a
#: larger listing keeps its digest and count only, and a change is then reported without the names).
LISTING_NAMES_LIMIT = 1 << 20


def listing_digest(urls: Sequence[str]) -> str:
    """A 128-bit hash of a listing (its URLs in order)."""
    return hashlib.blake2b("\n".join(urls).encode("utf-8", "surrogateescape"), digest_size=16).hexdigest()


def listing_record(urls: Sequence[str], limit: int = LISTING_NAMES_LIMIT) -> dict[str, Any]:
    """What a checkpoint keeps of a listing whose positions it counts: ``{"digest", "count"[, "names"]}``.

    ``names`` (the URLs, newline-joined and zlib-compressed: bytes, which ``torch.load(weights_only=True)``
    loads) is kept when it compresses to at most ``limit`` bytes, so that a changed listing can be reported
    naming the files (:func:`listing_change`).

    Example:
        >>> record = listing_record(["/d/a.jpg", "/d/b.jpg"])
        >>> sorted(record), record["count"]
        (['count', 'digest', 'names'], 2)
    """
    raw = "\n".join(urls).encode("utf-8", "surrogateescape")
    record: dict[str, Any] = {"digest": hashlib.blake2b(raw, digest_size=16).hexdigest(), "count": len(urls)}
    if len(raw) <= 16 * limit:  # (sorted paths compress about 14-fold: past that, not worth the time)
        names = zlib.compress(raw, 6)
        if len(names) <= limit:
            record["names"] = names
    return record


def _some(names: list[str], most: int = 5) -> str:
    shown = ", ".join(repr(n) for n in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def listing_change(record: Mapping[str, Any], urls: Sequence[str]) -> str | None:
    """``None`` when ``urls`` is the listing ``record`` was made of, else what changed, naming the files.

    Example:
        >>> record = listing_record(["/d/a.jpg", "/d/b.jpg", "/d/c.jpg"])
        >>> listing_change(record, ["/d/a.jpg", "/d/b.jpg", "/d/c.jpg"]) is None
        True
        >>> listing_change(record, ["/d/a.jpg", "/d/c.jpg", "/d/e.jpg"])
        "3 files then, 3 now: gone '/d/b.jpg'; new '/d/e.jpg'"
    """
    if listing_digest(urls) == record.get("digest"):
        return None
    count = record.get("count")
    then = f"{count} files then" if isinstance(count, int) else "another listing then"
    head = f"{then}, {len(urls)} now"
    names = record.get("names")
    if not isinstance(names, bytes):
        return head
    try:
        old = zlib.decompress(names).decode("utf-8", "surrogateescape")
    except (zlib.error, UnicodeError):
        return head
    before = old.split("\n") if old or count else []
    now = set(urls)
    then = set(before)
    gone = [shown_url(u) for u in before if u not in now]  # (checkpoint URLs: named without their digests)
    new = [shown_url(u) for u in urls if u not in then]
    parts = ([f"gone {_some(gone)}"] if gone else []) + ([f"new {_some(new)}"] if new else [])
    if not parts:
        parts = ["the same files in another order"]
    return f"{head}: " + "; ".join(parts)

