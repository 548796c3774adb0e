"""Read files over HTTP(S): torchdata's ``HttpReader`` (``read_from_http``).

Each URL is fetched with a single streaming ``GET`` through fsspec's HTTP
filesystem (``aiohttp``), as torchdata's reader streamed a single ``requests``
response: the body is read as the consumer reads the stream, never loaded
whole.  Request options (``headers``, ``auth``, ``params``, ``cookies``,
``allow_redirects``, ``proxy``, ``ssl``...) are keyword arguments, as in
torchdata; ``client_kwargs`` configures fsspec's ``aiohttp`` session.
For random access over HTTP (``load_from_zip``), open the URLs with
``open_files_by_fsspec(mode="rb")`` instead, which uses range requests.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import inspect
import io
from collections.abc import Iterator
from typing import Any

import fsspec
from fsspec.asyn import sync

from pipekit.errors import ReadError, SkipLog, check_on_error
from pipekit.pipes._opening import open_each
from pipekit.pipes._stamps import StampLog, http_version
from pipekit.pipes.base import IterDataPipe, StreamWrapper, functional_datapipe
from pipekit.retry import default_timeouts

__all__ = ["HttpReader", "HTTPReader"]

_STAGE = "read_from_http"

# Options that configure fsspec's HTTPFileSystem (its aiohttp session) rather than each request.
_FS_OPTIONS = frozenset({"client_kwargs", "get_client", "encoded"})
# requests-style names torchdata users pass, translated to aiohttp's (see _request_kwargs).
_REQUESTS_OPTIONS = frozenset({"auth", "verify", "stream"})


@functools.cache
def _aiohttp_request_options() -> frozenset[str] | None:
    """The keyword arguments aiohttp's requests accept, or None if they cannot be read."""
    import aiohttp

    try:
        params = inspect.signature(aiohttp.ClientSession._request).parameters
    except (TypeError, ValueError):  # pragma: no cover - depends on aiohttp internals
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):  # pragma: no cover
        return None
    return frozenset(params) - {"self", "method", "str_or_url"}


def _reason(exc: BaseException, timeout: float | None) -> str:
    import aiohttp

    if isinstance(exc, FileNotFoundError):
        return "HTTP 404 Not Found"
    if isinstance(exc, aiohttp.ClientResponseError):
        return f"HTTP {exc.status} {exc.message}".rstrip()
    if isinstance(exc, asyncio.TimeoutError | TimeoutError):
        return f"timed out (timeout={timeout} s)" if timeout is not None else "timed out"
    return f"{type(exc).__name__}: {exc}"


def _response_details(response: Any) -> dict[str, Any]:
    """What a response's headers say of the version of its body: its size, ETag and Last-Modified (if sent)."""
    headers = getattr(response, "headers", None) or {}
    length = headers.get("Content-Length")
    return {"size": int(length) if length and length.isdigit() else None, **http_version(headers)}


class _HttpRaw(io.RawIOBase):
    """A raw, non-seekable binary stream over an fsspec ``HTTPStreamFile``.

    ``io.BufferedReader`` on top of it gives correct ``readline`` and line
    iteration (fsspec's streaming file seeks back after ``readline``, which a
    stream cannot do).  Read failures (a timeout, a dropped connection) raise
    :class:`~pipekit.errors.ReadError` naming the URL.  ``details``: the
    version of the body the response announced (``size``, ``ETag``,
    ``LastModified``), as fsspec's files carry it, for
    :func:`~pipekit.pipes._stamps.file_stamp`.
    """

    def __init__(self, file: Any, url: str, timeout: float | None) -> None:
        super().__init__()
        self._file = file
        self.name = url
        self._timeout = timeout
        self.details = _response_details(getattr(file, "r", None))

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readinto(self, buffer: Any) -> int:
        try:
            data = self._file.read(len(buffer))
        except Exception as exc:
            raise ReadError("read", self.name, _STAGE, _reason(exc, self._timeout)) from exc
        n = len(data)
        buffer[:n] = data
        return n

    def close(self) -> None:
        if not self.closed:
            try:
                self._file.close()
            finally:
                super().close()


@functional_datapipe("read_from_http")
class HttpReader(IterDataPipe[tuple[str, StreamWrapper]]):
    """Fetch each HTTP(S) URL and yield ``(url, stream)`` (functional name: ``read_from_http``).

    The stream is a binary, non-seekable :class:`StreamWrapper` (named after
    the URL) over the response body, read as the consumer reads it; line
    iteration and ``readline`` work.  The request is sent and its status
    checked when the pipe reaches the URL, so a missing file or a refused
    request fails (or is skipped) there, before anything is yielded for it.

    Args:
        source_datapipe: a pipe yielding ``http://`` or ``https://`` URLs.
        timeout: seconds to wait to connect and, afterwards, between two
            reads of the body (like ``requests``' timeout).  It does not
            bound a whole download.  ``None`` (the default) waits
            :data:`pipekit.retry.DEFAULT_CONNECT_TIMEOUT` (5 s) to connect and
            :data:`pipekit.retry.DEFAULT_READ_TIMEOUT` (15 s) between reads
            (``PIPEKIT_CONNECT_TIMEOUT``, ``PIPEKIT_READ_TIMEOUT``), so a server
            that accepts the connection and never answers fails the URL with
            :class:`~pipekit.errors.ReadError` instead of hanging.  (An
            ``aiohttp.ClientTimeout`` in ``client_kwargs["timeout"]`` may be
            given instead; ``aiohttp.ClientTimeout(total=None)`` waits forever.)
        skip_on_error: ``False`` (default) raises
            :class:`~pipekit.errors.ReadError` naming the URL, the stage and
            the reason (``HTTP 404 Not Found``, a timeout...); ``True`` skips
            the URL, logs it and records it in ``self.skip_log`` (torchdata
            only warned).
        on_error: pipekit's spelling of the same choice, ``"raise"`` or
            ``"skip"``; give one or the other.
        kwargs: request options for ``aiohttp``: ``headers``, ``params``,
            ``cookies``, ``allow_redirects``, ``proxy``, ``ssl``... The
            ``requests`` spellings torchdata accepted also work: ``auth`` as a
            ``(user, password)`` tuple and ``verify=False``.  ``client_kwargs``
            (for ``aiohttp.ClientSession``), ``get_client`` and ``encoded``
            configure fsspec's HTTP filesystem.

    Only fetching is skipped on error: a failure while the consumer reads a
    stream raises ``ReadError`` from the read.  The pipe is stateless for
    resume; :meth:`reopen` fetches a URL again with the same options (archive
    loaders resuming mid-archive use it).  In a pipeline whose resume fetches
    files again (one resumed by replaying its items, or with a ``cycle``),
    :class:`pipekit.DataLoader` has it stamp each response by its size and
    ``ETag`` (else ``Last-Modified``) (:mod:`pipekit.pipes._stamps`): a file
    fetched before a checkpoint and changed on the server since raises
    :class:`~pipekit.errors.CheckpointError` naming its URL (without its
    credentials) when the resumed run fetches it again.

    Example:
        >>> import functools, http.server, pathlib, tempfile, threading
        >>> from pipekit.pipes import IterableWrapper
        >>> root = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (root / "LICENSE").write_bytes(b"BSD 3-Clause License\\n\\nCopyright\\n")
        >>> class Quiet(http.server.SimpleHTTPRequestHandler):
        ...     def log_message(self, *args): pass
        >>> server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=root))
        >>> threading.Thread(target=server.serve_forever, daemon=True).start()
        >>> file_url = f"http://127.0.0.1:{server.server_address[1]}/LICENSE"
        >>> url, stream = next(iter(HttpReader(IterableWrapper([file_url]), timeout=10)))
        >>> url == file_url, stream.readline()
        (True, b'BSD 3-Clause License\\n')
        >>> stream.close()
        >>> reader = IterableWrapper([file_url + ".missing", file_url]).read_from_http(skip_on_error=True)
        >>> [url.rsplit("/", 1)[-1] for url, _ in reader], reader.skip_log.count
        (['LICENSE'], 1)
        >>> server.shutdown(); server.server_close()
    """

    stateless = True
    stamps_files = True  # the loader gives it a StampLog where a resume reads files again (pipes/_stamps.py)
    _stamp_log: StampLog | None = None

    def __init__(
        self,
        source_datapipe: IterDataPipe[str],
        timeout: float | None = None,
        skip_on_error: bool = False,
        *,
        on_error: str | None = None,
        **kwargs: Any,
    ) -> None:
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, int | float):
                raise TypeError(f"timeout must be a number of seconds or None, got {type(timeout).__name__}")
            if not timeout > 0:
                raise ValueError(f"timeout must be > 0, got {timeout!r}")
        if not isinstance(skip_on_error, bool):
            raise TypeError(f"skip_on_error must be a bool, got {type(skip_on_error).__name__}")
        if on_error is not None:
            check_on_error(on_error)
            if skip_on_error and on_error == "raise":
                raise ValueError('skip_on_error=True contradicts on_error="raise"; give one of them')
        allowed = _aiohttp_request_options()
        if allowed is not None:
            unknown = sorted(set(kwargs) - allowed - _FS_OPTIONS - _REQUESTS_OPTIONS)
            if unknown:
                raise TypeError(
                    f"read_from_http: unknown request option(s) {unknown}; pass aiohttp request options "
                    "(headers, params, cookies, auth, allow_redirects, proxy, ssl, ...) or client_kwargs"
                )
        client_kwargs = kwargs.get("client_kwargs")
        if client_kwargs is not None and not isinstance(client_kwargs, dict):
            raise TypeError(f"client_kwargs must be a dict, got {type(client_kwargs).__name__}")
        if timeout is not None and client_kwargs and "timeout" in client_kwargs:
            raise ValueError("give timeout= or client_kwargs['timeout'], not both")
        self.source_datapipe = source_datapipe
        self.timeout = timeout
        self.on_error = on_error if on_error is not None else ("skip" if skip_on_error else "raise")
        self.skip_on_error = self.on_error == "skip"
        self.query_params: dict[str, Any] = dict(kwargs)
        self.skip_log = SkipLog(_STAGE)

    def _request_kwargs(self) -> dict[str, Any]:
        import aiohttp

        out = {k: v for k, v in self.query_params.items() if k not in _FS_OPTIONS and k != "stream"}
        auth = out.get("auth")
        if isinstance(auth, tuple | list) and not isinstance(auth, aiohttp.BasicAuth):
            if len(auth) != 2 or not all(isinstance(a, str) for a in auth):
                raise TypeError("read_from_http: auth must be a (user, password) pair of str or an aiohttp.BasicAuth")
            # requests' basic auth, sent as the header aiohttp now recommends
            token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode("ascii")
            out["headers"] = {**(out.get("headers") or {}), "Authorization": f"Basic {token}"}
            del out["auth"]
        if "verify" in out:
            verify = out.pop("verify")
            if verify is False:
                out["ssl"] = False
            elif verify is not True:
                raise TypeError("read_from_http: verify must be a bool; pass an ssl.SSLContext as ssl=")
        if self.timeout is not None or "timeout" not in (self.query_params.get("client_kwargs") or {}):
            # Like requests, bound connecting and each read, not the whole body (aiohttp's session
            # default would cut every download at 5 minutes).
            connect, read = self._timeouts()
            out["timeout"] = aiohttp.ClientTimeout(total=None, sock_connect=connect, sock_read=read)
        return out

    def _timeouts(self) -> tuple[float | None, float | None]:
        """(connect, read) seconds: ``timeout`` for both, else pipekit's defaults; (None, None) when
        ``client_kwargs["timeout"]`` decides."""
        if self.timeout is not None:
            return self.timeout, self.timeout
        if "timeout" in (self.query_params.get("client_kwargs") or {}):
            return None, None
        timeouts = default_timeouts()
        return timeouts.connect, timeouts.read

    def _shown_timeout(self) -> float | None:
        connect, read = self._timeouts()
        return None if read is None else (read if connect == read else max(connect or 0, read))

    def reopen(self, url: str) -> StreamWrapper:
        """Fetch ``url`` again with this pipe's timeout and request options."""
        if not isinstance(url, str):
            raise TypeError(f"{_STAGE}: a URL must be a str, got {type(url).__name__}: {url!r}")
        if not url.lower().startswith(("http://", "https://")):
            raise ReadError("fetch", url, _STAGE, "not an http:// or https:// URL")
        from fsspec.implementations.http import HTTPStreamFile

        try:
            fs = fsspec.filesystem("http", **{k: v for k, v in self.query_params.items() if k in _FS_OPTIONS})
            session = sync(fs.loop, fs.set_session)
            file = HTTPStreamFile(fs, url, mode="rb", loop=fs.loop, session=session, **self._request_kwargs())
        except TypeError:
            raise
        except Exception as exc:
            raise ReadError("fetch", url, _STAGE, _reason(exc, self._shown_timeout())) from exc
        raw = _HttpRaw(file, url, self._shown_timeout())
        return StreamWrapper(io.BufferedReader(raw, buffer_size=1 << 16), name=url)

    def __iter__(self) -> Iterator[tuple[str, StreamWrapper]]:
        yield from open_each(self.source_datapipe, self.reopen, self.on_error, self.skip_log, self._stamp_log)

    def __len__(self) -> int:
        return len(self.source_datapipe)  # type: ignore[arg-type]


HTTPReader = HttpReader
"""torchdata's other spelling (``HTTPReaderIterDataPipe``)."""
