"""``pipekit shard SRC DST``: write WebDataset tar shards from an image folder, a folder of samples or a pipe.

SRC is one of

* an **image folder** (``root/<class>/<image>``, torchvision's ``ImageFolder``
  layout): one sample per image, ``{"jpg" (or "png"...): the file's bytes,
  unchanged, "cls": class index}``, the classes numbered as
  :class:`pipekit.datasets.ImageFolder` numbers them (sorted folder names);
* a **folder of samples**: files named ``<key>.<extension>`` (``0001.jpg``,
  ``0001.json``...) grouped by key into samples, their bytes unchanged;
* a **pipe spec** ``MODULE:FUNCTION`` or ``FILE.py:FUNCTION``: the function
  is called without arguments and returns an iterable (a pipe, a generator,
  a list) of sample dicts with a ``"__key__"``, encoded by extension as
  :class:`pipekit.pipes.ShardWriter` does.  ``MODULE`` is imported with the
  current folder on ``sys.path``.

Folders may be local or fsspec URLs (``s3://bucket/prefix`` with
``--storage-option``).  DST is a pattern with a ``%d`` field
(``out/train-%06d.tar``, ``s3://bucket/train-%06d.tar``) or a folder, where
the shards are named ``shard-%06d.tar``.  Each shard appears under its name
only once complete (see :mod:`pipekit.pipes._shard_writer`).

With ``--layout auto`` (the default) a folder is read as an image folder when
every image is inside a class folder and no other file shares an image's key;
other files (a ``README.txt``) are then ignored and listed.  Otherwise (a
``0001.txt`` beside ``0001.jpg``, an image outside a class folder, no image) it
is a folder of samples, and no labels are written.  The layout chosen, and why, is printed on stderr.

A run never replaces an existing shard without ``--overwrite``: the first
shard's name is checked before anything is written, and each next one before
it is started.  With ``--overwrite``, the shards of the pattern that follow the
last one written (up to the first missing number: what an earlier, longer run
left) are removed once the run succeeds, each named on stderr, so a reader of
the pattern never mixes two runs; so are the hidden temporary files a killed
run left among them.  Shards past a gap (another job's ``--start-shard``
range) are left alone; without ``--overwrite`` the shards that follow are named.
A run that fails keeps the shards it finished and says which.  A source that
gives no sample is an error, and no (empty) shard is written.

With ``--index`` each shard gets its index, ``<shard>.idx.json``, published
right after it (see :mod:`pipekit.pipes._shard_index`), for
:class:`pipekit.datasets.IndexedShards`; ``--overwrite`` then also removes the
indexes of the earlier run's shards it removes.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import random
import re
import sys
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pipekit._fs import url_to_fs
from pipekit.cli._common import (
    CliError,
    add_storage_option_argument,
    list_files,
    non_negative_int,
    one_line,
    parse_storage_options,
    positive_int,
)

__all__ = ["add_parser", "run", "parse_size", "brace_pattern"]

_SPEC = re.compile(r"(?P<target>[^:]+):(?P<attr>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")
_MODULE = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
_SIZE = re.compile(r"\s*(?P<number>\d+(?:\.\d*)?(?:[eE][+-]?\d+)?)\s*(?P<unit>[kKmMgGtT]?i?[bB]?)\s*")
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def parse_size(text: str) -> float:
    """A byte count: ``"3e9"``, ``"500MB"`` (decimal units), ``"1GiB"`` (binary units), ``"100k"``.

    Example:
        >>> parse_size("3e9"), parse_size("500MB"), parse_size("1GiB"), parse_size("64k")
        (3000000000.0, 500000000.0, 1073741824.0, 64000.0)
    """
    m = _SIZE.fullmatch(text)
    if m is None:
        raise argparse.ArgumentTypeError(f"expected a size in bytes such as 3e9, 500MB or 1GiB, got {text!r}")
    unit = m["unit"].lower()
    if unit in ("b", "ib"):
        unit = ""
    prefix = unit[:1]
    scale = 1024 ** (" kmgt".index(prefix)) if unit.endswith(("ib", "i")) and prefix else _UNITS[prefix]
    value = float(m["number"]) * scale
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a size > 0, got {text!r}")
    return value


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "shard",
        help="write WebDataset tar shards from an image folder, a folder of samples or a pipe",
        description=(
            "Writes the samples of SRC into numbered WebDataset tar shards.  SRC is an image folder "
            "(root/<class>/<image>: each image's bytes, unchanged, plus its class index as .cls), a folder of "
            "sample files named <key>.<extension> (grouped by key), or a pipe spec MODULE:FUNCTION or "
            "FILE.py:FUNCTION whose function returns an iterable of sample dicts with a '__key__' (encoded by "
            "extension, like pipekit.pipes.ShardWriter).  DST is a pattern with a %d field "
            "(out/train-%06d.tar, s3://bucket/train-%06d.tar) or a folder (shard-%06d.tar in it).  Each shard "
            "is written under a temporary name and renamed once complete."
        ),
    )
    p.add_argument("src", metavar="SRC", help="an image folder, a folder of samples, or MODULE:FUNCTION")
    p.add_argument("dst", metavar="DST", help="a shard pattern with %%d (out/train-%%06d.tar) or a folder")
    p.add_argument("--layout", choices=["auto", "imagefolder", "samples"], default="auto",
                   help="how to read a SRC folder (default: an image folder when every image is inside a class "
                        "folder and no other file shares an image's key, other files being ignored and reported; "
                        "else a folder of samples); the layout chosen, and why, is printed")
    p.add_argument("--maxcount", type=positive_int, default=100000,
                   help="samples per shard (default 100000)")
    p.add_argument("--maxsize", type=parse_size, default=3e9,
                   help="bytes per shard, e.g. 3e9, 500MB, 1GiB (default 3e9); a shard ends once it holds that much")
    p.add_argument("--start-shard", type=non_negative_int, default=0, help="number of the first shard (default 0)")
    p.add_argument("--shuffle", action="store_true",
                   help="write a folder's samples in a random order (recommended for training data)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="the seed of --shuffle (default 0)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace shards that already exist, and remove the shards of DST's pattern that follow the "
                        "last one written, up to the first missing number (an earlier, longer run's), and the "
                        "temporary files a killed run left among them, naming each; without it an existing shard "
                        "makes the command fail before that shard is written")
    p.add_argument("--index", action="store_true",
                   help="also write each shard's index beside it (<shard>.idx.json: the offset and size of each "
                        "sample's members), for random access with pipekit.datasets.IndexedShards; shards must be "
                        "uncompressed")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_storage_option_argument(p)
    p.set_defaults(func=run)


# ---------------------------------------------------------------------------
# sources
# ---------------------------------------------------------------------------


@dataclass
class _Source:
    """What to write: samples (lazily), how many when known, and what to say about them."""

    samples: Iterable[Mapping[str, Any]]
    total: int | None
    description: str
    notes: list[str] = field(default_factory=list)


def _pipe_spec(src: str) -> re.Match[str] | None:
    if "://" in src or os.path.exists(src):
        return None
    m = _SPEC.fullmatch(src)
    if m is None:
        return None
    target = m["target"]
    return m if target.endswith(".py") or _MODULE.fullmatch(target) else None


def _load_spec(src: str, m: re.Match[str]) -> _Source:
    target, attr = m["target"], m["attr"]
    if target.endswith(".py"):
        path = os.path.abspath(target)
        if not os.path.isfile(path):
            raise CliError(f"no such file: {target!r} (in the pipe spec {src!r})")
        name = "pipekit_shard_spec_" + re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise CliError(f"cannot import {target!r} (in the pipe spec {src!r})")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # so pipes defined there pickle, as in a normal module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(name, None)
            raise CliError(f"cannot import {target!r}: {type(exc).__name__}: {one_line(exc)}") from exc
    else:
        cwd = os.getcwd()
        added = cwd not in sys.path
        if added:
            sys.path.insert(0, cwd)
        try:
            module = importlib.import_module(target)
        except Exception as exc:
            raise CliError(f"cannot import {target!r} (in the pipe spec {src!r}): {type(exc).__name__}: "
                           f"{one_line(exc)}") from exc
        finally:
            if added:
                sys.path.remove(cwd)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise CliError(f"{target!r} has no attribute {attr!r} (in the pipe spec {src!r})")
        obj = getattr(obj, part)
    if callable(obj):
        obj = obj()
    if isinstance(obj, str | bytes | Mapping) or not isinstance(obj, Iterable):
        raise CliError(f"{src} must return an iterable of sample dicts (a pipe, a generator, a list), "
                       f"got {type(obj).__name__}")
    try:
        total: int | None = len(obj)  # type: ignore[arg-type]
    except TypeError:
        total = None
    return _Source(obj, total, f"the samples of {src}")


_IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def _split(name: str) -> tuple[str, str]:
    """``"a/b/0001.seg.png"`` -> ``("a/b/0001", "seg.png")``: the key and the extension (first dot of the name)."""
    folder, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), (ext if dot else "")


def _reader(listing: Any) -> Any:
    fs = listing.fs

    def read(url: str) -> bytes:
        if listing.local:
            with open(url, "rb") as f:
                return f.read()
        return fs.cat_file(url)

    return read


def _auto_layout(listing: Any) -> tuple[str, str]:
    """``(layout, why)`` for ``--layout auto``.

    A folder of samples when a file that is not an image shares its key with
    an image (``0001.jpg`` and ``0001.txt``: a sample of several fields), when
    an image lies outside a class folder, or when there is no image at all;
    else an image folder, whose other files (a ``README.txt``) are ignored and
    reported.
    """
    names = [name for _, name, _ in listing.files]
    images = [n for n in names if n.lower().endswith(_IMAGE_EXTENSIONS)]
    if not images:
        return "samples", f"there is no image file ({', '.join(_IMAGE_EXTENSIONS)})"
    loose = [n for n in images if "/" not in n]
    if loose:
        return "samples", f"{loose[0]!r} is not in a class folder (root/<class>/<image>)"
    by_key = {_split(n)[0]: n for n in reversed(images)}  # the first image of each key
    for name in names:
        if not name.lower().endswith(_IMAGE_EXTENSIONS) and _split(name)[0] in by_key:
            key = _split(name)[0]
            return "samples", f"{by_key[key]!r} and {name!r} share the key {key!r} (a sample of several files)"
    return "imagefolder", "every image is in a class folder and no other file shares an image's key"


def _layout_note(layout: str, why: str | None) -> str:
    """The line saying which layout SRC is read with, and why (``why`` is ``None`` for an explicit ``--layout``)."""
    if layout == "imagefolder":
        what = "root/<class>/<image>, labels from the class folders"
        if why is None:
            return f"layout: image folder (--layout imagefolder): {what}"
        return f"layout: image folder ({what}): {why}; --layout samples writes each file as a field of a sample instead"
    what = "<key>.<extension> files grouped by key"
    if why is None:
        return f"layout: folder of samples (--layout samples): {what}; no class labels (.cls) are written"
    return (f"layout: folder of samples ({what}): {why}; no class labels (.cls) are written (--layout imagefolder "
            "reads root/<class>/<image> with labels)")


def _image_folder(src: str, listing: Any, storage_options: dict[str, Any], order: random.Random | None) -> _Source:
    from pipekit.datasets._imagefolder import _list_classes

    try:
        prefix, classes, files = _list_classes(src, _IMAGE_EXTENSIONS, storage_options, allow_empty=True)
    except FileNotFoundError as exc:
        raise CliError(one_line(exc)) from None
    if not files:
        raise CliError(f"no class folders with images (root/<class>/<image>) in {src!r}")
    empty = sorted(set(classes) - {classes[label] for _, label in files})
    if empty:
        raise CliError(f"class folder {empty[0]!r} of {src!r} has no image files ({', '.join(_IMAGE_EXTENSIONS)}): "
                       "move it out of SRC (the class numbers follow the sorted folder names, as "
                       "pipekit.datasets.ImageFolder numbers them), or use --layout samples")
    keys: dict[str, str] = {}
    entries = []
    for url, label in files:
        rel = url[len(prefix):].replace(os.sep, "/")
        folder, _, base = rel.rpartition("/")
        stem, ext = os.path.splitext(base)
        key = f"{folder}/{stem.replace('.', '_')}"
        if key in keys:
            raise CliError(f"{keys[key]!r} and {rel!r} would have the same sample key {key!r}; rename one")
        keys[key] = rel
        ext = ext[1:].lower()
        entries.append((key, "jpg" if ext == "jpeg" else ext, url, label))
    if order is not None:
        order.shuffle(entries)
    read = _reader(listing)
    images = {url for url, _ in files}
    notes = [f"{len(classes)} classes: " + ", ".join(f"{name}={i}" for i, name in enumerate(classes))]
    ignored = [name for url, name, _ in listing.files if url not in images]
    if ignored:
        notes.append(f"ignored {len(ignored)} file(s) that are not images in a class folder: "
                     + ", ".join(ignored[:5]) + (" ..." if len(ignored) > 5 else ""))
    formats = Counter(ext for _, ext, _, _ in entries)
    if len(formats) > 1:
        notes.append("images are stored under several fields (" + ", ".join(f".{e}: {n}" for e, n in
                     sorted(formats.items())) + "); pipelines reading one field need one format")

    def samples() -> Iterator[dict[str, Any]]:
        for key, ext, url, label in entries:
            yield {"__key__": key, ext: read(url), "cls": label}

    return _Source(samples(), len(entries), f"{len(entries)} images of {src}", notes)


def _sample_folder(src: str, listing: Any, order: random.Random | None) -> _Source:
    groups: dict[str, dict[str, str]] = {}
    for url, name, _ in listing.files:
        key, ext = _split(name)
        if not ext:
            raise CliError(f"{name!r} in {src!r} has no extension, so it cannot be a field of a sample "
                           "(<key>.<extension>); move it away or use --layout imagefolder")
        groups.setdefault(key, {})[ext] = url
    keys = sorted(groups)
    if order is not None:
        order.shuffle(keys)
    read = _reader(listing)

    def samples() -> Iterator[dict[str, Any]]:
        for key in keys:
            yield {"__key__": key, **{ext: read(url) for ext, url in sorted(groups[key].items())}}

    return _Source(samples(), len(keys), f"{len(keys)} samples of {src}")


def _source(args: argparse.Namespace, storage_options: dict[str, Any]) -> _Source:
    m = _pipe_spec(args.src)
    if m is not None:
        if args.shuffle:
            raise CliError("--shuffle applies to folders; shuffle inside the pipe of a pipe spec")
        if args.layout != "auto":
            raise CliError("--layout applies to folders, not to a pipe spec")
        return _load_spec(args.src, m)
    listing = list_files(args.src, storage_options)
    if listing.is_file:
        raise CliError(f"{args.src!r} is a file; SRC must be a folder or a pipe spec MODULE:FUNCTION")
    if not listing.files:
        raise CliError(f"no files in {args.src!r}")
    order = random.Random(args.seed) if args.shuffle else None
    layout, why = args.layout, None
    if layout == "auto":
        layout, why = _auto_layout(listing)
    if layout == "imagefolder":
        source = _image_folder(args.src, listing, storage_options, order)
    else:
        source = _sample_folder(args.src, listing, order)
    source.notes.insert(0, _layout_note(layout, why))
    return source


# ---------------------------------------------------------------------------
# destination
# ---------------------------------------------------------------------------

_FIELD = re.compile(r"%(0?)(\d*)d")


def brace_pattern(pattern: str, first: int, last: int) -> str:
    """The shard names ``pattern % first`` ... ``pattern % last`` as one brace pattern for readers.

    Example:
        >>> brace_pattern("out/train-%06d.tar", 0, 12)
        'out/train-{000000..000012}.tar'
        >>> brace_pattern("s-%d.tar", 3, 3)
        's-3.tar'
    """
    if first == last:
        return pattern % first
    fields = list(_FIELD.finditer(pattern))
    if len(fields) != 1 or pattern.count("%") != 1:
        return f"{pattern % first} ... {pattern % last}"
    m = fields[0]
    if m[2] and not m[1]:  # padded with spaces: no brace range names those
        return f"{pattern % first} ... {pattern % last}"
    width = int(m[2]) if m[2] else 0
    lo, hi = str(first).zfill(width), str(last).zfill(width)
    if len(lo) != len(hi) and lo.startswith("0"):  # s-05 ... s-100: no one brace range names those
        return f"{pattern % first} ... {pattern % last}"
    return f"{pattern[:m.start()]}{{{lo}..{hi}}}{pattern[m.end():]}"


def _destination(dst: str) -> str:
    if "%" in dst:
        return dst
    name = dst.rstrip("/").rsplit("/", 1)[-1]
    if name.lower().endswith((".tar", ".tgz", ".gz", ".bz2", ".xz")):
        stem = dst[: -len(".tar")] if dst.lower().endswith(".tar") else dst
        raise CliError(f"DST {dst!r} names one file; give a pattern with a %d field for the shard number, "
                       f"e.g. {stem + '-%06d.tar'!r}, or a folder")
    return dst.rstrip("/") + "/shard-%06d.tar"


def _scan(pattern: str, start: int, storage_options: dict[str, Any]) -> tuple[dict[int, str], dict[int, list[str]]]:
    """The shards of ``pattern`` from ``start`` on, and the temporary files beside them (empty when not listable)."""
    from pipekit.pipes._shard_names import scan_shards

    try:
        scan = scan_shards(pattern, start, storage_options)
    except Exception as exc:
        folder = pattern.rpartition("/")[0] or "."
        raise CliError(f"cannot list {folder!r}: {type(exc).__name__}: {one_line(exc)}") from exc
    if scan is None:
        print(f"the shard number is in a folder name of {pattern!r}: shards of an earlier run beyond the ones this "
              "run writes are not looked for", file=sys.stderr)
        return {}, {}
    return scan


def _named(urls: list[str], most: int = 10) -> str:
    return ", ".join(urls[:most]) + (f" ... ({len(urls)} in all)" if len(urls) > most else "")


def _check_free(name: str, storage_options: dict[str, Any]) -> None:
    """Refuse to replace the shard ``name`` (without ``--overwrite``)."""
    try:
        fs, path = url_to_fs(name, storage_options)
        exists = fs.exists(path)
    except Exception as exc:
        raise CliError(f"cannot open {name!r}: {type(exc).__name__}: {one_line(exc)}") from exc
    if exists:
        raise CliError(f"{name!r} already exists; pass --overwrite to replace the shards, or write elsewhere")


def _exists(url: str, storage_options: dict[str, Any]) -> bool:
    try:
        fs, path = url_to_fs(url, storage_options)
        return bool(fs.exists(path))
    except Exception:
        return False


def _remove(urls: list[str], what: str, storage_options: dict[str, Any]) -> None:
    """Remove ``urls`` (``what`` they are, for the messages), saying which."""
    for url in urls:
        try:
            fs, path = url_to_fs(url, storage_options)
            if fs.exists(path):
                fs.rm(path)
        except Exception as exc:
            raise CliError(f"cannot remove {url!r}, {what} (readers of the pattern would read it too): "
                           f"{type(exc).__name__}: {one_line(exc)}") from exc
    print(f"removed {len(urls)} {what}: {_named(urls)}", file=sys.stderr)


# ---------------------------------------------------------------------------
# the command
# ---------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from pipekit.pipes._shard_names import _check_pattern, following
    from pipekit.pipes._shard_writer import ShardWriter

    storage_options = parse_storage_options(args.storage_option)
    pattern = _destination(args.dst)
    try:
        _check_pattern(pattern, args.start_shard, "pipekit shard")
    except ValueError as exc:
        raise CliError(str(exc).removeprefix("pipekit shard: ")) from None
    source = _source(args, storage_options)
    if not args.overwrite:
        _check_free(pattern % args.start_shard, storage_options)
    shards, temporaries = _scan(pattern, args.start_shard, storage_options) if args.overwrite else ({}, {})
    for note in source.notes:
        print(note, file=sys.stderr)
    bar = tqdm(total=source.total, desc=f"writing {source.description}", unit="sample", file=sys.stderr,
               disable=args.no_progress, dynamic_ncols=True)

    finished = [0]  # samples in the finished shards

    def done(name: str) -> None:
        finished[0] = writer.total
        bar.set_postfix_str(f"{len(writer.shards)} shard(s), last {name.rsplit('/', 1)[-1]}", refresh=False)

    try:
        writer = ShardWriter(pattern, maxcount=args.maxcount, maxsize=args.maxsize, post=done,
                             start_shard=args.start_shard, verbose=0, storage_options=storage_options,
                             index=args.index)
    except ValueError as exc:
        raise CliError(str(exc).removeprefix("ShardWriter: ").replace("index=True", "--index")) from None
    first = args.start_shard
    try:
        with bar, writer:
            for sample in source.samples:
                if writer.tarstream is None and not args.overwrite:  # a shard starts: never over an existing one
                    _check_free(pattern % writer.shard, storage_options)
                writer.write(sample)
                bar.update(1)
            if writer.total == 0:  # not the one empty shard ShardWriter writes then: an empty data set is an error
                writer.abort()
                raise CliError(f"{args.src} gave no sample; no shard written")
    except BaseException:
        if writer.shards:  # say what the failed run leaves, so that no reader takes it for the whole data set
            print(f"{len(writer.shards)} shard(s) with {finished[0]} sample(s) were finished before the error and "
                  f"stay: {brace_pattern(pattern, first, first + len(writer.shards) - 1)}", file=sys.stderr)
        left = following(shards, first + len(writer.shards))
        if left:
            print(f"{len(left)} shard(s) of an earlier run are left as they were: {_named(left)}", file=sys.stderr)
        raise
    last = first + len(writer.shards) - 1
    if args.overwrite:
        stale = following(shards, last + 1)
        if stale:
            _remove(stale, "shard(s) of an earlier run that this run did not replace", storage_options)
            indexes = [url + ".idx.json" for url in stale if _exists(url + ".idx.json", storage_options)]
            if indexes:
                _remove(indexes, "index(es) of those shards", storage_options)
        killed = [url for n, urls in sorted(temporaries.items()) if n <= last + len(stale) + 1 for url in urls]
        if killed:
            _remove(killed, "temporary file(s) of an interrupted run", storage_options)
    else:
        after = following(_scan(pattern, last + 1, storage_options)[0], last + 1)
        if after:
            print(f"{len(after)} shard(s) of the pattern follow the ones this run wrote, from another run: "
                  f"{_named(after)}; readers of the pattern or the folder would read them too (--overwrite removes "
                  "them)", file=sys.stderr)
    print(f"wrote {writer.total} sample(s) in {len(writer.shards)} shard(s): {brace_pattern(pattern, first, last)}")
    return 0
