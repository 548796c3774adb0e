"""Secrets in URLs: a URL, or any text naming URLs, without the passwords, tokens and signatures it carries.

The one place messages are cleaned: every :class:`~pipekit.errors.PipekitError`
message and skip report goes through :func:`redact_secrets`; other modules
reach these functions through :mod:`pipekit._fs` (the URL helpers).  Imports
nothing of pipekit's, so :mod:`pipekit.errors` can use it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from urllib.parse import quote, unquote

__all__ = [
    "REDACTED", "SECRET_PARAMS", "checkpoint_url", "redact_secrets", "redact_secrets_of", "redact_url",
    "resolve_checkpoint_url", "secrets_of",
]


REDACTED = "***"

#: Query parameters whose values are secrets (compared without case): AWS, GCS and Azure signed URLs
#: (``X-Amz-Signature``, ``X-Goog-Signature``, ``sig``), their credentials and session tokens, and the usual
#: names of tokens, keys and passwords.
SECRET_PARAMS = frozenset({
    "x-amz-signature", "x-amz-credential", "x-amz-security-token",
    "x-goog-signature", "x-goog-credential", "googleaccessid",
    "signature", "sig", "token", "access_token", "id_token", "refresh_token", "auth", "authorization",
    "key", "api_key", "apikey", "api-key", "secret", "client_secret", "password", "passwd", "pwd",
    "sas", "sessiontoken", "session_token", "credential", "credentials",
})

# "scheme://user:password@" or "scheme://token@" (in a URL anywhere in a text)
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^\s/?#@'\"]+)@")
# "?name=value" or "&name=value" (or ";", as some signers write)
_PARAM = re.compile(r"(?P<sep>[?&;])(?P<name>[^=&;#\s'\"?]+)=(?P<value>[^&;#\s'\"]*)")


def _hide_userinfo(match: re.Match[str]) -> str:
    user, colon, _ = match["userinfo"].partition(":")
    # a password after the user name; without one, the user part itself is often a token (https://ghp_...@github)
    return f"{match['scheme']}{user}:{REDACTED}@" if colon else f"{match['scheme']}{REDACTED}@"


def _hide_param(match: re.Match[str]) -> str:
    if match["name"].lower() in SECRET_PARAMS and match["value"]:
        return f"{match['sep']}{match['name']}={REDACTED}"
    return match[0]


def redact_secrets(text: str) -> str:
    """``text`` with the secrets of the URLs it names replaced by ``***`` (see :func:`redact_url`).

    Example:
        >>> redact_secrets("cannot open 's3://AKIA1:s3cr3t@b/k.tar' (status 403)")
        "cannot open 's3://AKIA1:***@b/k.tar' (status 403)"
    """
    if "@" not in text and "=" not in text:  # the common case: nothing that could be a secret, no regex
        return text
    if "@" in text:
        text = _USERINFO.sub(_hide_userinfo, text)
    if "=" in text:
        text = _PARAM.sub(_hide_param, text)
    return text


def redact_url(url: str) -> str:
    """``url`` without its secrets: a password (or a token as the user part) and signed query values.

    Everything else stays, so the file is still recognisable: the scheme,
    host, path, the user name and the query parameters that are not secrets
    (:data:`SECRET_PARAMS` lists the names whose values are hidden).

    Example:
        >>> redact_url("https://alice:hunter2@host/a.tar")
        'https://alice:***@host/a.tar'
        >>> redact_url("https://b.s3.amazonaws.com/k?X-Amz-Expires=60&X-Amz-Signature=ab12")
        'https://b.s3.amazonaws.com/k?X-Amz-Expires=60&X-Amz-Signature=***'
    """
    return redact_secrets(url)


def secrets_of(url: str) -> list[str]:
    """The secrets ``url`` carries: its password (or a token as the user part) and its signed query values.

    Example:
        >>> secrets_of("s3://AKIA1:s3cr3t@b/k.tar?X-Amz-Signature=ab12&size=3")
        ['s3cr3t', 'ab12']
    """
    if "@" not in url and "=" not in url:
        return []
    found = []
    for match in _USERINFO.finditer(url):
        user, colon, password = match["userinfo"].partition(":")
        found.append(password if colon else user)
    for match in _PARAM.finditer(url):
        if match["name"].lower() in SECRET_PARAMS:
            found.append(match["value"])
    return [secret for secret in found if secret and secret != REDACTED]


def redact_secrets_of(text: str, url: str | None) -> str:
    """``text`` as :func:`redact_secrets` gives it, and without the secrets of ``url`` wherever they appear.

    A cause's message may repeat the URL in a form no URL pattern recognises: a filesystem that strips the
    scheme (``FileNotFoundError: /AKIA1:s3cr3t@b/k.tar``), a decoded or quoted copy.

    Example:
        >>> redact_secrets_of("FileNotFoundError: /AKIA1:s3cr3t@b/k.tar", "memory://AKIA1:s3cr3t@b/k.tar")
        'FileNotFoundError: /AKIA1:***@b/k.tar'
    """
    text = redact_secrets(text)
    if not url:
        return text
    for secret in secrets_of(url):
        for form in {secret, unquote(secret), quote(secret, safe="")}:
            if len(form) >= 3:  # never a character or two of ordinary text
                text = text.replace(form, REDACTED)
    return text


_DIGEST = re.compile(r" \(blake2b ([0-9a-f]{32})\)$")


def checkpoint_url(url: str) -> str:
    """``url`` as a checkpoint may hold it: itself, or without its secrets and with a digest of the whole.

    A position naming a file by its URL is compared with the file a resumed run reads; the digest keeps
    that comparison exact without the credentials in clear in the checkpoint, and
    :func:`resolve_checkpoint_url` finds the URL again among the pipeline's own.

    Example:
        >>> checkpoint_url("/data/a.tar")
        '/data/a.tar'
        >>> checkpoint_url("s3://AKIA1:s3cr3t@b/k.tar")[:40]
        's3://AKIA1:***@b/k.tar (blake2b 78b40812'
    """
    redacted = redact_secrets(url)
    if redacted == url:
        return url
    digest = hashlib.blake2b(url.encode("utf-8", "surrogateescape"), digest_size=16, person=b"pipekit-url")
    return f"{redacted} (blake2b {digest.hexdigest()})"


def shown_url(key: str) -> str:
    """A :func:`checkpoint_url` as a message shows it: without the digest, which is for matching, not for a reader.

    Example:
        >>> shown_url(checkpoint_url("s3://AKIA1:s3cr3t@b/k.tar"))
        's3://AKIA1:***@b/k.tar'
        >>> shown_url("/data/a.tar")
        '/data/a.tar'
    """
    head, sep, tail = key.rpartition(" (blake2b ")
    return head if sep and tail.endswith(")") else key


def resolve_checkpoint_url(key: str, candidates: Iterable[str]) -> str | None:
    """The URL whose :func:`checkpoint_url` is ``key``: ``key`` itself when it holds no digest, else one of
    ``candidates`` (URLs, or roots the URL is under), or ``None`` when none is.

    Example:
        >>> key = checkpoint_url("s3://AKIA1:s3cr3t@b/d/k.tar")
        >>> resolve_checkpoint_url(key, ["s3://AKIA1:s3cr3t@b/d/"])
        's3://AKIA1:s3cr3t@b/d/k.tar'
    """
    found = _DIGEST.search(key)
    if found is None:
        return key
    redacted = key[: found.start()]
    for candidate in candidates:
        shown = redact_secrets(candidate)
        if shown == redacted:
            url = candidate
        elif redacted.startswith(shown) and shown != candidate:
            url = candidate + redacted[len(shown):]
        else:
            continue
        if checkpoint_url(url) == key:
            return url
    return None
