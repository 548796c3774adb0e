"""What a URL names: its protocol, and whether it is a local file (and which path)."""

from __future__ import annotations

import os

__all__ = ["is_local", "local_path", "split_protocol"]


def split_protocol(url: str) -> tuple[str | None, str]:
    """``("s3", "bucket/key")`` for ``"s3://bucket/key"``; ``(None, path)`` for a local path."""
    url = os.fspath(url)
    if "://" in url:
        protocol, rest = url.split("://", 1)
        if protocol and protocol.replace("+", "").replace("-", "").isalnum():
            return protocol.lower(), rest
    return None, url


def is_local(url: str) -> bool:
    protocol, _ = split_protocol(url)
    return protocol in (None, "file", "local") and "::" not in url


def local_path(url: str) -> str:
    protocol, rest = split_protocol(url)
    if protocol in ("file", "local"):
        return rest if rest.startswith("/") else "/" + rest
    return url
