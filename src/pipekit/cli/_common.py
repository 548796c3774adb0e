"""What the subcommands share: errors, argument types, listing local folders and buckets."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipekit._fs import url_to_fs
from pipekit.errors import CliError

__all__ = [
    "CliError",
    "positive_int",
    "non_negative_int",
    "parse_storage_options",
    "add_storage_option_argument",
    "Listing",
    "list_files",
    "RASTER_EXTENSIONS",
    "IMAGE_EXTENSIONS",
    "file_kind",
    "one_line",
    "credentials_hint",
]


def positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return n


def non_negative_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value!r}")
    return n


def _option_value(text: str) -> Any:
    """``true``/``false``/numbers/JSON as such, anything else as the string."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_storage_options(items: Sequence[str] | None) -> dict[str, Any]:
    """``["key=abc", "client_kwargs.endpoint_url=http://h:1"]`` -> ``{"key": "abc", "client_kwargs": {...}}``.

    Dots in a key nest dictionaries; values are parsed as JSON when they can
    be (``anon=true``, ``max_concurrency=4``), else kept as strings.

    Example:
        >>> parse_storage_options(["anon=true", "client_kwargs.region_name=us-east-1"])
        {'anon': True, 'client_kwargs': {'region_name': 'us-east-1'}}
    """
    out: dict[str, Any] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise CliError(f"--storage-option takes KEY=VALUE, got {item!r}")
        parts = key.split(".")
        if any(not p for p in parts):
            raise CliError(f"--storage-option: bad key {key!r} in {item!r}")
        node = out
        for p in parts[:-1]:
            child = node.setdefault(p, {})
            if not isinstance(child, dict):
                raise CliError(f"--storage-option: {p!r} is given both as a value and as a group of options")
            node = child
        if isinstance(node.get(parts[-1]), dict):
            raise CliError(f"--storage-option: {key!r} is given both as a value and as a group of options")
        node[parts[-1]] = _option_value(value)
    return out


def add_storage_option_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-o", "--storage-option", action="append", default=[], metavar="KEY=VALUE",
        help="an fsspec option for remote URLs (repeatable), e.g. endpoint_url=http://localhost:8333, anon=true, "
             "client_kwargs.region_name=us-east-1; s3fs also reads the usual AWS_* environment variables",
    )


RASTER_EXTENSIONS = (".tif", ".tiff", ".jp2", ".img", ".vrt")
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".ppm", ".pgm")
SHARD_EXTENSIONS = (".tar", ".tar.gz", ".tgz")


def file_kind(name: str) -> str | None:
    """``"raster"``, ``"image"``, ``"shard"`` or ``None`` from a file name's extension."""
    lowered = name.lower()
    if lowered.endswith(SHARD_EXTENSIONS):
        return "shard"
    ext = os.path.splitext(lowered)[1]
    if ext in RASTER_EXTENSIONS:
        return "raster"
    if ext in IMAGE_EXTENSIONS:
        return "image"
    return None


@dataclass
class Listing:
    """The files under a path or URL.

    Attributes:
        root: what the user gave.
        fs: the fsspec filesystem.
        base: the root's path on ``fs`` (a folder, or the file itself).
        files: ``[(url, relative name, size in bytes)]``, sorted by name.
        is_file: the root is a single file.
    """

    root: str
    fs: Any
    base: str
    files: list[tuple[str, str, int]]
    is_file: bool

    @property
    def local(self) -> bool:
        return "file" in _protocols(self.fs)


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def list_files(root: str, storage_options: dict[str, Any] | None = None) -> Listing:
    """List a local folder, a bucket prefix or a single file (recursively).

    Raises:
        CliError: ``root`` does not exist (or the URL is malformed).
    """

    text = os.fspath(root)
    try:
        fs, path = url_to_fs(text, storage_options)
    except (ValueError, TypeError, ImportError) as exc:
        raise CliError(f"cannot open {text!r}: {one_line(exc)}") from exc
    local = "file" in _protocols(fs)

    def url(p: str) -> str:
        return p if local else fs.unstrip_protocol(p)

    try:
        if fs.isfile(path):
            info = fs.info(path)
            return Listing(text, fs, path, [(url(path), path.rsplit("/", 1)[-1], int(info.get("size") or 0))], True)
        if not fs.isdir(path):
            raise CliError(f"no such file or directory: {text!r}")
        base = path.rstrip("/")
        found = fs.find(base, detail=True)
    except CliError:
        raise
    except Exception as exc:
        hint = credentials_hint(exc, text)
        if hint is None:
            raise
        raise CliError(hint) from exc
    files = []
    for p, info in sorted(found.items()):
        if info.get("type", "file") != "file":
            continue
        rel = p[len(base):].lstrip("/") if p.startswith(base) else p
        if any(part.startswith(".") for part in rel.split("/")):
            continue  # hidden files and folders (.complete markers, .git...)
        files.append((url(p), rel, int(info.get("size") or 0)))
    return Listing(text, fs, base, files, False)


_NO_CREDENTIALS = ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError", "NoAuthTokenError")
_REFUSED = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken", "AccessDenied")


def credentials_hint(exc: BaseException, url: str) -> str | None:
    """A message saying how to pass credentials when ``exc`` (or its cause) is a credentials error, else ``None``.

    Example:
        >>> credentials_hint(ValueError("bad range"), "s3://b/x") is None
        True
    """
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return None
        name, text = type(seen).__name__, str(seen)
        if name in _NO_CREDENTIALS:
            what = f"no credentials ({name}: {one_line(seen)})"
            break
        if any(code in text for code in _REFUSED):
            what = f"the credentials were refused ({name}: {one_line(seen)})"
            break
        seen = seen.__cause__ or seen.__context__
    else:
        return None
    return (
        f"cannot read {url!r}: {what}. Pass them: -o anon=true for a public bucket; the AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) or AWS_PROFILE environment variables, with AWS_ENDPOINT_URL "
        "for a server other than AWS; or -o key=... -o secret=... (-o client_kwargs.endpoint_url=...). In Python, "
        'the same as storage_options={"anon": True} or {"key": ..., "secret": ...}'
    )


def one_line(exc: BaseException) -> str:
    """An exception as one line: its first non-empty line (torch appends 'This exception is thrown by...')."""
    text = str(exc).strip()
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    name = type(exc).__name__
    if not first:
        return name
    return first


def human_bytes(n: float) -> str:
    """``1536`` -> ``"1.5 KB"``.

    Example:
        >>> human_bytes(512), human_bytes(1536), human_bytes(3 * 2**30)
        ('512 B', '1.5 KB', '3.0 GB')
    """
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"  # pragma: no cover


def default_cache(path: Path | None) -> Path:
    from pipekit.synthetic import default_cache_dir

    return Path(path) if path is not None else default_cache_dir()
