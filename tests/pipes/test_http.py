"""Tests of read_from_http (HttpReader) against a real HTTP server on loopback."""

from __future__ import annotations

import base64
import gc
import hashlib
import http.server
import io
import logging
import pickle
import tarfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import aiohttp
import pytest

from pipekit.errors import ReadError
from pipekit.pipes import IterableWrapper
from pipekit.pipes._http import HTTPReader, HttpReader
from pipekit.testing import assert_resumes, resume_after

LICENSE = b"BSD 3-Clause License\n\nCopyright (c) pipekit tests\nAll rights reserved.\n"
BIG = bytes(range(256)) * (3 * 4096)  # 3 MiB, larger than any read buffer


def make_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in [("a.txt", b"alpha"), ("b/c.bin", b"\x00\x01\x02")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@dataclass
class Server:
    base: str
    release: threading.Event
    requests: list[str] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)  # served by name; a test may replace one

    def url(self, path: str) -> str:
        return f"{self.base}/{path.lstrip('/')}"


def make_handler(files: dict[str, bytes], release: threading.Event, log: list[str]):
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, format, *args):  # keep the test output clean
            pass

        def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            log.append(self.path)
            path, _, query = self.path.partition("?")
            if path == "/slow-headers":  # answers only when the test ends
                release.wait(10)
                return self._send(200, b"late")
            if path == "/slow-body":  # sends part of the body, then stalls
                self.send_response(200)
                self.send_header("Content-Length", "100")
                self.end_headers()
                self.wfile.write(b"first part|")
                self.wfile.flush()
                release.wait(10)
                return None
            if path == "/status/500":
                return self._send(500, b"boom")
            if path == "/echo":
                return self._send(200, f"{self.headers.get('X-Token')}|{query}".encode())
            if path == "/private":
                expected = "Basic " + base64.b64encode(b"user:secret").decode()
                if self.headers.get("Authorization") != expected:
                    return self._send(401, b"no", {"WWW-Authenticate": 'Basic realm="t"'})
                return self._send(200, b"private data")
            if path == "/unsized":  # no Content-Length: the body ends when the connection closes
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"line one\nline two\n")
                return None
            body = files.get(path.lstrip("/"))
            if body is None:
                return self._send(404, b"not found")
            if path == "/private.bin":  # a file behind basic auth, as a user's URL would carry it
                expected = "Basic " + base64.b64encode(b"user:secret").decode()
                if self.headers.get("Authorization") != expected:
                    return self._send(401, b"no", {"WWW-Authenticate": 'Basic realm="t"'})
            # a version of the body, as web servers and object stores send it
            return self._send(200, body, {"ETag": f'"{hashlib.sha1(body).hexdigest()[:16]}"'})

    return Handler


@pytest.fixture
def server() -> Iterator[Server]:
    """A loopback HTTP server with files, slow routes, an auth route and a header echo."""
    files = {
        "LICENSE": LICENSE,
        "big.bin": BIG,
        "data.tar": make_tar(),
        "lines.txt": b"".join(f"line {i}\n".encode() for i in range(10)),
        "other.txt": b"x\ny\n",
    }
    release = threading.Event()
    log: list[str] = []
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), make_handler(files, release, log))
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    srv = Server(f"http://127.0.0.1:{httpd.server_address[1]}", release, log, files)
    yield srv
    release.set()
    httpd.shutdown()
    httpd.server_close()


def read_all(item):
    url, stream = item
    try:
        return url, stream.read()
    finally:
        stream.close()


class TestHttpReader:
    def test_yields_url_and_binary_stream(self, server: Server) -> None:
        url = server.url("LICENSE")
        [(got_url, stream)] = list(HttpReader(IterableWrapper([url])))
        assert got_url == url
        assert stream.name == url
        assert stream.read() == LICENSE
        assert not stream.seekable()
        stream.close()
        assert stream.closed

    def test_torchdata_example_readlines(self, server: Server) -> None:
        file_url = server.url("LICENSE")
        http_reader_dp = HttpReader(IterableWrapper([file_url]), timeout=120)
        path, line = next(iter(http_reader_dp.readlines()))
        assert (path, line) == (file_url, b"BSD 3-Clause License")

    def test_functional_form_several_urls_in_order(self, server: Server) -> None:
        urls = [server.url("other.txt"), server.url("LICENSE")]
        got = list(IterableWrapper(urls).read_from_http().map(read_all))
        assert got == [(urls[0], b"x\ny\n"), (urls[1], LICENSE)]
        assert HTTPReader is HttpReader

    def test_streams_big_body_and_lines(self, server: Server) -> None:
        [(_, stream)] = list(HttpReader(IterableWrapper([server.url("big.bin")])))
        digest = hashlib.sha256()
        while chunk := stream.read(100_000):
            digest.update(chunk)
        assert digest.hexdigest() == hashlib.sha256(BIG).hexdigest()
        [(_, stream)] = list(HttpReader(IterableWrapper([server.url("lines.txt")])))
        assert list(stream) == [f"line {i}\n".encode() for i in range(10)]

    def test_body_without_content_length(self, server: Server) -> None:
        [(_, stream)] = list(HttpReader(IterableWrapper([server.url("unsized")])))
        assert stream.readline() == b"line one\n"
        assert stream.read() == b"line two\n"

    def test_one_get_per_url(self, server: Server) -> None:
        list(HttpReader(IterableWrapper([server.url("LICENSE")])).map(read_all))
        assert server.requests == ["/LICENSE"]  # no HEAD, no range requests

    def test_tar_over_http(self, server: Server) -> None:
        dp = IterableWrapper([server.url("data.tar")]).read_from_http().load_from_tar()
        got = {name.rsplit("/", 1)[-1]: stream.read() for name, stream in dp}
        assert got == {"a.txt": b"alpha", "c.bin": b"\x00\x01\x02"}

    def test_404_raises_naming_url_and_stage(self, server: Server) -> None:
        url = server.url("missing.txt")
        with pytest.raises(ReadError, match=r"cannot fetch '.*/missing\.txt' in read_from_http: HTTP 404") as info:
            list(HttpReader(IterableWrapper([url])))
        assert info.value.url == url
        assert info.value.stage == "read_from_http"
        assert isinstance(info.value, OSError)

    def test_server_error_status(self, server: Server) -> None:
        with pytest.raises(ReadError, match=r"status/500' in read_from_http: HTTP 500"):
            list(HttpReader(IterableWrapper([server.url("status/500")])))

    def test_timeout_waiting_for_response(self, server: Server) -> None:
        start = time.monotonic()
        with pytest.raises(ReadError, match=r"slow-headers' in read_from_http: timed out \(timeout=0.3 s\)"):
            list(HttpReader(IterableWrapper([server.url("slow-headers")]), timeout=0.3))
        assert time.monotonic() - start < 5

    def test_timeout_while_reading_body(self, server: Server) -> None:
        [(url, stream)] = list(HttpReader(IterableWrapper([server.url("slow-body")]), timeout=0.3))
        assert stream.read(11) == b"first part|"
        with pytest.raises(ReadError, match=r"cannot read '.*/slow-body' in read_from_http: timed out") as info:
            stream.read()
        assert info.value.url == url
        stream.close()

    def test_skip_on_error_records_and_logs(self, server: Server, caplog: pytest.LogCaptureFixture) -> None:
        urls = [server.url("missing"), server.url("LICENSE"), server.url("slow-headers"), server.url("other.txt")]
        dp = HttpReader(IterableWrapper(urls), timeout=0.3, skip_on_error=True)
        with caplog.at_level(logging.WARNING, logger="pipekit"):
            got = [read_all(item) for item in dp]
        assert got == [(urls[1], LICENSE), (urls[3], b"x\ny\n")]
        assert dp.skip_log.count == 2
        assert [s.url for s in dp.skip_log.skipped] == [urls[0], urls[2]]
        assert dp.skip_log.skipped[0].reason == "HTTP 404 Not Found"
        assert "timed out" in dp.skip_log.skipped[1].reason
        assert sum("read_from_http: skipped" in r.getMessage() for r in caplog.records) == 2

    def test_on_error_spelling(self, server: Server) -> None:
        dp = IterableWrapper([server.url("missing"), server.url("LICENSE")]).read_from_http(on_error="skip")
        assert [url for url, _ in dp] == [server.url("LICENSE")]
        assert dp.skip_on_error is True
        with pytest.raises(ValueError, match="contradicts"):
            HttpReader(IterableWrapper([]), skip_on_error=True, on_error="raise")
        with pytest.raises(ValueError, match="on_error"):
            HttpReader(IterableWrapper([]), on_error="ignore")

    def test_headers_and_query_params(self, server: Server) -> None:
        dp = HttpReader(IterableWrapper([server.url("echo")]), headers={"X-Token": "abc"}, params={"q": "1"})
        assert [read_all(item)[1] for item in dp] == [b"abc|q=1"]

    def test_requests_style_auth(self, server: Server) -> None:
        url = server.url("private")
        with pytest.raises(ReadError, match="HTTP 401"):
            list(HttpReader(IterableWrapper([url])))
        query_params = {"auth": ("user", "secret"), "allow_redirects": True}
        dp = HttpReader(IterableWrapper([url]), timeout=120, **query_params)
        assert [read_all(item)[1] for item in dp] == [b"private data"]

    def test_not_an_http_url(self, server: Server) -> None:
        with pytest.raises(ReadError, match=r"'ftp://x/y' in read_from_http: not an http"):
            list(HttpReader(IterableWrapper(["ftp://x/y"])))
        dp = HttpReader(IterableWrapper(["file:///etc/hostname", server.url("LICENSE")]), skip_on_error=True)
        assert len([url for url, _ in dp]) == 1
        with pytest.raises(TypeError, match="must be a str"):
            list(HttpReader(IterableWrapper([42])))

    def test_bad_arguments(self) -> None:
        src = IterableWrapper([])
        with pytest.raises(ValueError, match="timeout"):
            HttpReader(src, timeout=0)
        with pytest.raises(TypeError, match="timeout"):
            HttpReader(src, timeout="10")
        with pytest.raises(TypeError, match="skip_on_error"):
            HttpReader(src, skip_on_error="yes")
        with pytest.raises(TypeError, match=r"unknown request option\(s\) \['colour'\]"):
            HttpReader(src, colour="red")
        with pytest.raises(TypeError, match="client_kwargs"):
            HttpReader(src, client_kwargs=[1])
        with pytest.raises(ValueError, match="not both"):
            HttpReader(src, timeout=1, client_kwargs={"timeout": aiohttp.ClientTimeout(total=1)})

    def test_session_timeout_from_client_kwargs(self, server: Server) -> None:
        client_kwargs = {"timeout": aiohttp.ClientTimeout(sock_read=0.3)}
        with pytest.raises(ReadError, match=r"slow-headers' in read_from_http: timed out"):
            list(HttpReader(IterableWrapper([server.url("slow-headers")]), client_kwargs=client_kwargs))

    def test_streams_closed_on_upstream_error(self, server: Server) -> None:
        def urls():
            yield server.url("LICENSE")
            raise RuntimeError("upstream broke")

        it = iter(HttpReader(IterableWrapper(urls(), deepcopy=False)))
        _, stream = next(it)
        assert not stream.closed
        with pytest.raises(RuntimeError, match="upstream broke"):
            next(it)
        assert stream.closed

    def test_dropped_streams_are_closed(self, server: Server) -> None:
        dp = HttpReader(IterableWrapper([server.url("LICENSE")]))
        [(_, stream)] = list(dp)
        raw = stream.file_obj.raw
        del stream
        gc.collect()
        assert raw.closed

    def test_reopen(self, server: Server) -> None:
        dp = HttpReader(IterableWrapper([]), headers={"X-Token": "t"})
        stream = dp.reopen(server.url("echo"))
        assert stream.read() == b"t|"
        stream.close()
        with pytest.raises(ReadError, match="404"):
            dp.reopen(server.url("nope"))

    def test_len_and_stateless(self) -> None:
        assert HttpReader.stateless is True
        assert len(HttpReader(IterableWrapper(["a", "b"]))) == 2

    def test_pickle(self, server: Server) -> None:
        dp = HttpReader(IterableWrapper([server.url("private")]), timeout=5, auth=("user", "secret"))
        clone = pickle.loads(pickle.dumps(dp))
        assert clone.timeout == 5
        assert [read_all(item)[1] for item in clone] == [b"private data"]

    def test_resume_between_files(self, server: Server) -> None:
        urls = [server.url("other.txt"), server.url("LICENSE"), server.url("lines.txt")]

        def make():
            return IterableWrapper(urls).read_from_http().map(read_all)

        head, rest = resume_after(make, 1)
        assert [u for u, _ in head + rest] == urls

    @pytest.mark.parametrize("n", [0, 3, 10, 11])
    def test_resume_mid_file_reopens_over_http(self, server: Server, n: int) -> None:
        urls = [server.url("lines.txt"), server.url("other.txt")]

        def make():
            return IterableWrapper(urls).read_from_http(timeout=10).readlines()

        assert_resumes(make, n)


# -- files read again by a resume (a replay, a later pass of a cycle): stamped by their ETag ---------------


def _forked_http(urls: list[str]):
    """fork cannot report its position: pipekit.DataLoader resumes it by replaying, fetching the files again."""
    a, b = IterableWrapper(urls).read_from_http(timeout=10).map(read_all).fork(2)
    return a.zip(b)


def _served(server: Server, names: list[str]) -> list[str]:
    for i, name in enumerate(names):
        server.files[name] = bytes([i]) * (10 + i)
    return [server.url(name) for name in names]


def _checkpoint(make, take: int) -> tuple[list, dict]:
    import pipekit

    loader = pipekit.DataLoader(make())
    it = iter(loader)
    head = [next(it) for _ in range(take)]
    return head, pickle.loads(pickle.dumps(loader.state_dict()))


def _resumed(make, state: dict) -> list:
    import pipekit

    loader = pipekit.DataLoader(make())
    loader.load_state_dict(state)
    return list(loader)


class TestHttpStamps:
    @pytest.mark.timeout(60)
    def test_a_replayed_resume_refuses_a_file_changed_on_the_server(self, server: Server) -> None:
        """Replaced on the server (same size, another ETag) after the checkpoint, a file read before it used to be
        replayed with its new bytes: the resumed run silently differed from the run the checkpoint was taken from."""
        from pipekit.errors import CheckpointError

        urls = _served(server, ["a.bin", "b.bin", "c.bin"])
        _, state = _checkpoint(lambda: _forked_http(urls), 2)
        server.files["b.bin"] = b"\xff" * len(server.files["b.bin"])
        with pytest.raises(CheckpointError, match=r"read_from_http: '" + urls[1] + "' changed since the checkpoint"):
            _resumed(lambda: _forked_http(urls), state)

    @pytest.mark.timeout(60)
    def test_a_replayed_resume_of_unchanged_files_is_exact(self, server: Server) -> None:
        import pipekit

        urls = _served(server, ["a.bin", "b.bin", "c.bin"])
        full = list(pipekit.DataLoader(_forked_http(urls)))
        head, state = _checkpoint(lambda: _forked_http(urls), 2)
        assert head + _resumed(lambda: _forked_http(urls), state) == full

    @pytest.mark.timeout(60)
    def test_a_url_with_credentials_is_stamped_without_them(self, server: Server) -> None:
        """The stamps travel in every checkpoint: a password in the URL must not (and still resumes exactly)."""
        import pipekit
        from pipekit.errors import CheckpointError

        server.files["private.bin"] = b"private bytes"
        urls = _served(server, ["a.bin", "b.bin"])
        urls.insert(1, server.url("private.bin").replace("://", "://user:secret@"))
        full = list(pipekit.DataLoader(_forked_http(urls)))
        assert full[1][0][1] == b"private bytes"  # the URL's credentials were sent
        head, state = _checkpoint(lambda: _forked_http(urls), 2)
        assert b"secret" not in pickle.dumps(state)
        assert head + _resumed(lambda: _forked_http(urls), state) == full
        server.files["private.bin"] = b"PRIVATE BYTES"
        with pytest.raises(CheckpointError, match=r"'http://user:\*\*\*@127\.0\.0\.1:\d+/private\.bin") as info:
            _resumed(lambda: _forked_http(urls), state)
        assert "secret" not in str(info.value)
        assert "blake2b" not in str(info.value)  # the checkpoint's digest is for matching, not for the reader

    def test_a_stream_is_stamped_from_its_response_headers(self, server: Server) -> None:
        from pipekit.pipes._stamps import file_stamp

        etag = f'"{hashlib.sha1(LICENSE).hexdigest()[:16]}"'
        (_, stream), (_, unsized) = IterableWrapper([server.url("LICENSE"), server.url("unsized")]).read_from_http()
        assert file_stamp(stream) == f"{len(LICENSE)}:{etag}"
        assert file_stamp(unsized) is None  # neither a size nor a version: nothing to stamp
        assert server.requests == ["/LICENSE", "/unsized"]  # from the GET's headers: no request of its own
        stream.close()
        unsized.close()
