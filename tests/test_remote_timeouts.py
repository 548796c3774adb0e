"""A server that accepts connections and stops answering fails remote reads in bounded time (issue 35).

Each test points a reader at a loopback TCP server that accepts every connection and then never
answers (or, as a stand-in for S3, answers ``HEAD`` and goes silent on ``GET``), with short
timeouts set through the environment (``PIPEKIT_CONNECT_TIMEOUT``, ``PIPEKIT_READ_TIMEOUT``) or
the reader's options, and checks that the read fails with a :class:`~pipekit.errors.ReadError`
naming the URL, after the retry policy's warning, well within the test's timeout.  Without
timeouts each of these reads hung for minutes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import pytest

from pipekit.errors import ReadError
from pipekit.retry import DEFAULT_CONNECT_TIMEOUT, DEFAULT_READ_TIMEOUT, RetryPolicy, Timeouts, with_timeouts

POLICY = RetryPolicy(attempts=2, max_seconds=30, base_delay=0.01, max_delay=0.01)


class SilentServer:
    """Accepts TCP connections on 127.0.0.1 and never answers them.

    With ``head_ok=True`` it answers a ``HEAD`` request (an object of ``size`` bytes, as S3 would)
    and stays silent on everything else, so an open succeeds and the first read hangs.
    """

    def __init__(self, head_ok: bool = False, size: int = 10240) -> None:
        self.head_ok = head_ok
        self.size = size
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections: list[socket.socket] = []
        self.requests: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        try:
            while not self._stop.is_set():
                data = conn.recv(65536)
                if not data:
                    return
                buf += data
                while b"\r\n\r\n" in buf:
                    head, buf = buf.split(b"\r\n\r\n", 1)
                    self.requests.append(head.split(b"\r\n", 1)[0])
                    if self.head_ok and head.startswith(b"HEAD "):
                        conn.sendall(
                            b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nContent-Type: application/x-tar\r\n"
                            b'ETag: "0123456789abcdef0123456789abcdef"\r\n'
                            b"Last-Modified: Sat, 28 Nov 2026 09:00:00 GMT\r\nAccept-Ranges: bytes\r\n\r\n" % self.size
                        )
                    # anything else: never answered
        except OSError:
            return

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        for conn in self.connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()


@pytest.fixture
def silent() -> Iterator[SilentServer]:
    server = SilentServer()
    yield server
    server.close()


@pytest.fixture
def head_only() -> Iterator[SilentServer]:
    server = SilentServer(head_ok=True)
    yield server
    server.close()


@pytest.fixture
def short_timeouts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPEKIT_CONNECT_TIMEOUT", "0.5")
    monkeypatch.setenv("PIPEKIT_READ_TIMEOUT", "0.5")
    monkeypatch.setenv("PIPEKIT_RETRY_ATTEMPTS", "2")
    monkeypatch.setenv("PIPEKIT_RETRY_SECONDS", "30")


def _s3_options(server: SilentServer) -> dict:
    # skip_instance_cache: a fresh s3fs per test, so no connection or listing cache outlives its server
    return {"endpoint_url": server.endpoint, "key": "k", "secret": "s", "skip_instance_cache": True}


def _in_fresh_process(body: str) -> str:
    """Run ``body`` in a new Python process with the test's timeouts; its error and pipekit.retry's warnings.

    These checks run in a process of their own: fsspec keeps one event loop and its filesystem instances per
    process, and in the whole suite what earlier tests left there (a filesystem made without timeouts, a
    stuck coroutine) made them hang although the code under test times out (tracked in issue 35's note).
    """
    code = (
        "import logging, sys\n"
        "logging.basicConfig(stream=sys.stdout, level=logging.WARNING, format='retry: %(message)s')\n"
        "from pipekit.pipes import IterableWrapper\n"
        "from pipekit.retry import RetryPolicy\n"
        "POLICY = RetryPolicy(attempts=2, max_seconds=30, base_delay=0.01, max_delay=0.01)\n"
        "try:\n" + textwrap.indent(body.strip(), "    ") + "\n"
        "except Exception as exc:\n"
        "    print(f'{type(exc).__name__}: {exc}', flush=True)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=80,
                          env={**os.environ})
    lines = proc.stdout.strip().splitlines()
    error = [line for line in lines if not line.startswith("retry: ")]
    warnings = [line for line in lines if line.startswith("retry: ")]
    return "\n".join(error + warnings)


def _retried(caplog: pytest.LogCaptureFixture, url: str) -> bool:
    return any(r.name == "pipekit.retry" and url in r.getMessage() for r in caplog.records)


class TestDefaults:
    def test_documented_defaults(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.delenv("PIPEKIT_CONNECT_TIMEOUT", raising=False)
        monkeypatch.delenv("PIPEKIT_READ_TIMEOUT", raising=False)
        assert Timeouts.from_env() == Timeouts(DEFAULT_CONNECT_TIMEOUT, DEFAULT_READ_TIMEOUT) == Timeouts(5.0, 15.0)

    def test_environment(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("PIPEKIT_CONNECT_TIMEOUT", "2")
        monkeypatch.setenv("PIPEKIT_READ_TIMEOUT", "7.5")
        assert Timeouts.from_env() == Timeouts(2.0, 7.5)
        monkeypatch.setenv("PIPEKIT_READ_TIMEOUT", "0")
        with pytest.raises(ValueError, match="read timeout must be a positive number"):
            Timeouts.from_env()

    def test_s3_options_filled_in_and_kept(self) -> None:
        options = with_timeouts("s3://bucket/key", {"key": "k"})
        assert options["config_kwargs"] == {
            "connect_timeout": DEFAULT_CONNECT_TIMEOUT,
            "read_timeout": DEFAULT_READ_TIMEOUT,
            "retries": {"total_max_attempts": 1},
        }
        assert options["key"] == "k"
        mine = {"config_kwargs": {"read_timeout": 60, "retries": {"max_attempts": 3}}}
        kept = with_timeouts("s3://bucket/key", mine)["config_kwargs"]
        assert kept["read_timeout"] == 60 and kept["retries"] == {"max_attempts": 3}
        assert mine == {"config_kwargs": {"read_timeout": 60, "retries": {"max_attempts": 3}}}  # not mutated
        chained = with_timeouts("simplecache::s3://bucket/key", {"s3": {"anon": True}})
        assert chained["s3"]["anon"] is True and chained["s3"]["config_kwargs"]["read_timeout"] == DEFAULT_READ_TIMEOUT
        assert with_timeouts("memory://a/b", {}) == {} and with_timeouts("/a/b", {"x": 1}) == {"x": 1}

    def test_http_options(self) -> None:
        import aiohttp

        timeout = with_timeouts("https://host/a.tar", {})["client_kwargs"]["timeout"]
        assert timeout.sock_connect == DEFAULT_CONNECT_TIMEOUT and timeout.sock_read == DEFAULT_READ_TIMEOUT
        assert timeout.total is None  # a whole download is not cut
        mine = aiohttp.ClientTimeout(total=5)
        assert with_timeouts("http://host/a", {"client_kwargs": {"timeout": mine}})["client_kwargs"]["timeout"] is mine


@pytest.mark.slow  # each waits out real timeouts against a silent server
@pytest.mark.timeout(90)
class TestFsspecS3:
    def test_open_against_a_silent_server(self, silent: SilentServer, short_timeouts: None) -> None:
        url = "s3://bucket/shard-000000.tar"
        start = time.monotonic()
        out = _in_fresh_process(f"""
dp = IterableWrapper([{url!r}]).open_files_by_fsspec(mode="rb", retry=POLICY, **{_s3_options(silent)!r})
list(dp)
""")
        assert time.monotonic() - start < 60
        assert out.startswith("ReadError:") and url in out and "open_files_by_fsspec" in out, out
        assert "gave up after 2 attempts" in out, out
        assert any(line.startswith("retry: ") and url in line for line in out.splitlines()), out  # warned first
        assert silent.requests  # the server was reached: it is the silence that timed out

    def test_tar_read_stalls_after_the_open(self, head_only: SilentServer, short_timeouts: None) -> None:
        url = "s3://bucket/shard-000000.tar"
        start = time.monotonic()
        out = _in_fresh_process(f"""
dp = IterableWrapper([{url!r}]).open_files_by_fsspec(mode="rb", retry=POLICY, **{_s3_options(head_only)!r})
list(dp.load_from_tar())
""")
        assert time.monotonic() - start < 60
        assert url in out and "gave up after 2 attempts" in out, out
        assert any(r.startswith(b"GET ") for r in head_only.requests)
        assert any(line.startswith("retry: ") and url in line for line in out.splitlines()), out

    def test_timeouts_from_storage_options(self, silent: SilentServer, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("PIPEKIT_CONNECT_TIMEOUT", "600")
        monkeypatch.setenv("PIPEKIT_READ_TIMEOUT", "600")  # would outlast the test: the options must win
        options = {**_s3_options(silent), "config_kwargs": {"connect_timeout": 0.5, "read_timeout": 0.5}}
        out = _in_fresh_process(f"""
dp = IterableWrapper(["s3://bucket/a.tar"]).open_files_by_fsspec(mode="rb", retry=False, **{options!r})
list(dp)
""")
        assert out.startswith("ReadError:") and "s3://bucket/a.tar" in out, out

    def test_listing_against_a_silent_server(self, silent: SilentServer, short_timeouts: None) -> None:
        out = _in_fresh_process(f"""
from pipekit.pipes import FSSpecFileLister
lister = FSSpecFileLister("s3://bucket/train", retry=POLICY, **{_s3_options(silent)!r})
list(lister)
""")
        assert out.startswith("ReadError:") and re.search(r"s3://bucket/train.*list_files_by_fsspec", out), out


@pytest.mark.slow  # each waits out real timeouts against a silent server
@pytest.mark.timeout(60)
class TestHttp:
    def test_fsspec_http_open(self, silent: SilentServer, short_timeouts: None,
                              caplog: pytest.LogCaptureFixture) -> None:
        url = f"{silent.endpoint}/shard-000000.tar"
        out = _in_fresh_process(f"""
dp = IterableWrapper([{url!r}]).open_files_by_fsspec(mode="rb", retry=POLICY)
list(dp)
""")
        assert out.startswith("ReadError:") and url in out and "Timeout" in out, out  # not "FileNotFoundError"
        assert any(line.startswith("retry: ") and url in line for line in out.splitlines()), out  # warned first

    def test_read_from_http_default_timeout(self, silent: SilentServer, short_timeouts: None) -> None:
        url = f"{silent.endpoint}/data.txt"
        start = time.monotonic()
        out = _in_fresh_process(f"""
list(IterableWrapper([{url!r}]).read_from_http())
""")
        assert time.monotonic() - start < 30
        assert out.startswith("ReadError:") and "data.txt' in read_from_http: timed out" in out, out

@pytest.mark.slow  # each waits out real timeouts against a silent server
@pytest.mark.timeout(90)
class TestGdal:
    """GDAL's /vsis3/ and /vsicurl/ reads of a geo dataset, through its opener."""

    @pytest.mark.slow
    def test_vsis3(self, silent: SilentServer, short_timeouts: None, caplog: pytest.LogCaptureFixture) -> None:
        pytest.importorskip("rasterio")
        from pipekit.geo import RasterOpener

        opener = RasterOpener({"endpoint_url": silent.endpoint, "key": "k", "secret": "s"})
        url = "s3://bucket/scene.tif"
        assert opener.resolve(url).kind == "vsi"
        start = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="pipekit.retry"), pytest.raises(ReadError) as info:
            opener.open(url, stage="RasterDataset")
        assert time.monotonic() - start < 60
        assert url in str(info.value) and "RasterDataset" in str(info.value)
        assert _retried(caplog, url)

    def test_vsicurl(self, silent: SilentServer, short_timeouts: None) -> None:
        pytest.importorskip("rasterio")
        from pipekit.geo import RasterOpener

        url = f"{silent.endpoint}/scene.tif"
        opener = RasterOpener()
        assert opener.resolve(url).kind == "vsi"
        with pytest.raises(ReadError, match=r"scene\.tif"):
            opener.open(url, stage="RasterDataset")

    def test_s3_timeouts_from_storage_options(self) -> None:
        pytest.importorskip("rasterio")
        from pipekit.geo import RasterOpener

        options = {"key": "k", "secret": "s", "config_kwargs": {"connect_timeout": 2, "read_timeout": 9}}
        resolved = RasterOpener(options).resolve("s3://bucket/a.tif")
        assert resolved.kind == "vsi"
        assert resolved.config["GDAL_HTTP_CONNECTTIMEOUT"] == "2"
        assert resolved.config["GDAL_HTTP_LOW_SPEED_TIME"] == "9"
        default = RasterOpener({"key": "k", "secret": "s"}).resolve("s3://bucket/a.tif").config
        assert default["GDAL_HTTP_CONNECTTIMEOUT"] == "5" and default["GDAL_HTTP_LOW_SPEED_TIME"] == "15"
        mine = RasterOpener({"key": "k"}, gdal_options={"GDAL_HTTP_LOW_SPEED_TIME": "99"}).resolve("s3://b/a.tif")
        assert mine.config["GDAL_HTTP_LOW_SPEED_TIME"] == "99"


@pytest.mark.slow  # each waits out real timeouts against a silent server
@pytest.mark.timeout(60)
class TestDownloads:
    """``datasets.download_url`` (the TorchGeo datasets' downloads) honours the same timeouts."""

    def test_http_download_default_timeouts(self, silent: SilentServer, short_timeouts: None, tmp_path) -> None:
        from pipekit.datasets.utils import download_url

        url = f"{silent.endpoint}/data.zip"
        start = time.monotonic()
        with pytest.raises(ReadError) as info:
            download_url(url, tmp_path, retries=1)
        assert time.monotonic() - start < 20  # 2 tries of 0.5 s (it was 60 s a try)
        assert url in str(info.value) and "download_url" in str(info.value) and "timed out" in str(info.value)
        # the server's thread records a request when it gets to read it: on a loaded machine, after the client gave up
        deadline = time.monotonic() + 10
        while len(silent.requests) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(silent.requests) == 2

    def test_s3_download_default_timeouts(self, head_only: SilentServer, short_timeouts: None, tmp_path) -> None:
        out = _in_fresh_process(f"""
from pipekit.datasets.utils import download_url
download_url("s3://bucket/data.zip", {str(tmp_path)!r}, retries=0, storage_options={_s3_options(head_only)!r})
""")
        assert out.startswith("ReadError:") and "s3://bucket/data.zip" in out and "download_url" in out, out
