"""A loopback HTTP mirror for the downloadable datasets' tests (``from mirror_server import serve``).

Serves ``files`` (path -> bytes) with ``Range: bytes=N-`` support and records each request's path and
Range header; ``status[path] = code`` answers that path with an error (401 for a host that needs a login).
:func:`serve_folder` serves a real folder instead, as a plain web server does (``HEAD``, ``Content-Length``,
``Last-Modified``). Nothing here touches the internet.
"""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class Mirror(http.server.ThreadingHTTPServer):
    """The server: ``files``, ``status`` and the ``requests`` it got as ``(path, Range header or None)``."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.files: dict[str, bytes] = {}
        self.status: dict[str, int] = {}
        self.requests: list[tuple[str, str | None]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Mirror

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        from urllib.parse import unquote

        path = unquote(self.path.split("?", 1)[0])
        header = self.headers.get("Range")
        self.server.requests.append((path, header))
        data = self.server.files.get(path)
        if path in self.server.status or data is None:
            self.send_error(self.server.status.get(path, 404))
            return
        start = int(header.removeprefix("bytes=").split("-", 1)[0]) if header else 0
        if start >= len(data) and header:
            self.send_response(416)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = data[start:]
        self.send_response(206 if header else 200)
        self.send_header("Content-Length", str(len(body)))
        if header:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        self.wfile.write(body)


@contextmanager
def serve() -> Iterator[Mirror]:
    """A running :class:`Mirror`, shut down on exit."""
    server = Mirror()
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


class QuietFolderHandler(http.server.SimpleHTTPRequestHandler):
    """Python's file server without its log lines (subclass it to add headers or a login)."""

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def serve_folder(
    directory: str | Path, handler: type[http.server.SimpleHTTPRequestHandler] = QuietFolderHandler
) -> Iterator[str]:
    """The files of ``directory`` on a loopback web server: yields its base URL (no slash at the end)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(directory)))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
