"""Ranged GETs of S3 objects and HTTP files for :mod:`pipekit.geo.rangecache`, lean on CPU.

s3fs costs ~2.1 ms of CPU a ranged GET (aiobotocore over an event loop in
another thread); botocore's SigV4 signer over one urllib3 connection pool
~0.7-1.1 ms; the same signer over the standard library's ``http.client``,
one kept-alive connection per thread and server, ~0.4 ms
(``benchmarks/README.md``).  With the range cache a first pass makes ~3
requests a patch, so the difference is a tenth of the CPU a patch costs.
botocore comes with s3fs.

A fetcher is used where the request can be built without s3fs's discovery:
an explicit endpoint (MinIO, SeaweedFS, R2...) or region, and explicit
credentials or ``anon``.  Anything else (profiles, the default credential
chain, region redirects) goes through the fsspec filesystem as before.

Errors keep their meaning for :func:`pipekit.retry.is_transient`: 404 is a
``FileNotFoundError``, 403 a ``PermissionError``, a 5xx, a 429, a throttling
code or a lost connection a ``ConnectionError``; each names the URL.
"""

from __future__ import annotations

import http.client
import os
import re
import threading
import urllib.parse
from collections.abc import Mapping
from typing import Any

from pipekit.retry import _TRANSIENT_CODES  # S3 error codes of a busy or failing server


class RangeFetcher:
    """``fetcher(path, start, end)`` returns bytes ``[start, end)`` of ``path`` (fsspec's path: ``bucket/key``).

    Args:
        base: the URL a path is appended to (``http://host:port/`` for a
            path-style S3 endpoint; ``""`` for HTTP, whose paths are URLs).
        credentials: botocore ``Credentials`` to sign S3 requests with
            (``None``: unsigned).
        region: the S3 region signed for.
        headers: sent with every request (``x-amz-request-payer``...).
    """

    def __init__(
        self,
        base: str,
        credentials: Any = None,
        region: str = "us-east-1",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.base = base
        self.headers = dict(headers or {})
        self._signer = None
        if credentials is not None:
            import botocore.auth

            self._signer = botocore.auth.S3SigV4Auth(credentials, "s3", region)
        self._local = _Connections()

    def url(self, path: str) -> str:
        return self.base + urllib.parse.quote(path, safe="/-_.~") if self.base else path

    def _request(self, method: str, url: str, headers: dict[str, str], what: str) -> _Response:
        """The response to a signed ``method`` request (``what`` names it in errors); raises for a failed one."""
        if self._signer is not None:
            import botocore.awsrequest

            request = botocore.awsrequest.AWSRequest(method, url, headers=headers)
            self._signer.add_auth(request)
            headers = dict(request.headers.items())
        response = self._local.send(method, url, headers, what)
        status = response.status
        if status in (200, 206):
            return response
        code = _error_code(response.data)
        message = f"{method} {url}{what}: HTTP {status}{f' {code}' if code else ''}"
        if status == 404:
            raise FileNotFoundError(message)
        if status == 403:
            raise PermissionError(message)
        if status >= 500 or status == 429 or code in _TRANSIENT_CODES:
            raise ConnectionError(message)
        raise OSError(message)

    def __call__(self, path: str, start: int, end: int) -> bytes:
        headers = {**self.headers, "Range": f"bytes={start}-{end - 1}"}
        response = self._request("GET", self.url(path), headers, f" (bytes {start}-{end - 1})")
        if response.status == 200:  # the server ignored Range: the whole file came
            return response.data[start:end]
        return response.data

    def info(self, path: str) -> dict[str, Any]:
        """``{"size": ..., "ETag": ...}`` of ``path`` from a HEAD request (no ``"ETag"`` where the server sends none).

        The ETag is the header as sent, the string s3fs's and fsspec's HTTP
        ``info()`` report, so the range cache names a file's mirror the same
        either way.  Asked once per file and process: a DataLoader worker
        then needs no s3fs session (~0.5 s of CPU to start) to read through
        the cache.
        """
        headers = {**self.headers, "Accept-Encoding": "identity"}
        response = self._request("HEAD", self.url(path), headers, "")
        info: dict[str, Any] = {}
        length = response.headers.get("Content-Length")
        if length is not None and response.headers.get("Content-Encoding", "identity") in ("identity", ""):
            info["size"] = int(length)
        etag = response.headers.get("ETag")
        if etag:
            info["ETag"] = etag
        return info


class _Response:
    __slots__ = ("data", "headers", "status")

    def __init__(self, status: int, headers: Any, data: bytes) -> None:
        self.status, self.headers, self.data = status, headers, data


#: errors of a request sent down a kept-alive connection the server had already closed: sent again once, on a
#: new connection (GET and HEAD are idempotent)
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


class _Connections(threading.local):
    """This thread's kept-alive connections, one per server (``http.client``: not shared between threads).

    A forked process (a DataLoader worker) never sends down a connection
    it inherited: the connections are remembered with the process id, and
    the inherited ones are dropped unclosed (closing would not disturb the
    parent, but dropping is enough).
    """

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.open: dict[tuple[str, str], http.client.HTTPConnection] = {}

    def _connection(self, scheme: str, netloc: str) -> http.client.HTTPConnection:
        if self.pid != os.getpid():
            self.pid, self.open = os.getpid(), {}
        conn = self.open.get((scheme, netloc))
        if conn is None:
            kind = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
            conn = self.open[(scheme, netloc)] = kind(netloc, timeout=_TIMEOUT)
        return conn

    def send(self, method: str, url: str, headers: dict[str, str], what: str) -> _Response:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"{method} {url}{what}: not an http(s) URL")
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        again = True
        while True:
            conn = self._connection(parts.scheme, parts.netloc)
            reused = conn.sock is not None
            try:
                conn.request(method, target, headers=headers)
                response = conn.getresponse()
                data = response.read()
            except _STALE as exc:
                conn.close()
                if reused and again:
                    again = False
                    continue
                raise ConnectionError(f"{method} {url}{what} failed: {exc!r}") from exc
            except (OSError, http.client.HTTPException) as exc:  # refused, timed out, a broken answer
                conn.close()
                raise ConnectionError(f"{method} {url}{what} failed: {exc!r}") from exc
            return _Response(response.status, response.headers, data)


#: seconds a connection or a read may take before the request fails (a transient ``ConnectionError``)
_TIMEOUT = 60.0


def _error_code(body: bytes) -> str:
    match = re.search(rb"<Code>([^<]{1,64})</Code>", body[:4096])
    return match.group(1).decode(errors="replace") if match else ""


def s3_fetcher(config: Mapping[str, str], creds: Mapping[str, str]) -> RangeFetcher | None:
    """A fetcher for S3 with GDAL-style ``config`` and ``creds`` (see ``pipekit.geo.io``), or ``None``.

    ``None`` where s3fs should do the work: no explicit credentials and not
    anonymous, a profile, or neither an endpoint nor a region.
    """
    anon = config.get("AWS_NO_SIGN_REQUEST") == "YES"
    if config.get("AWS_PROFILE") or not (anon or creds.get("AWS_ACCESS_KEY_ID")):
        return None
    region = config.get("AWS_REGION")
    endpoint = config.get("AWS_S3_ENDPOINT")
    if endpoint:
        scheme = "http" if config.get("AWS_HTTPS") == "NO" else "https"
        base = f"{scheme}://{endpoint}/"
    elif region:
        base = f"https://s3.{region}.amazonaws.com/"
    else:
        return None
    credentials = None
    if not anon:
        import botocore.credentials

        credentials = botocore.credentials.Credentials(
            creds["AWS_ACCESS_KEY_ID"], creds.get("AWS_SECRET_ACCESS_KEY", ""), creds.get("AWS_SESSION_TOKEN")
        )
    headers = {"x-amz-request-payer": "requester"} if config.get("AWS_REQUEST_PAYER") == "requester" else {}
    return RangeFetcher(base, credentials, region or "us-east-1", headers)
