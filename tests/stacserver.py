"""A real STAC API server for the tests: ``rustac serve`` (in-memory backend) on loopback.

The ``rustac`` package (in the ``dev`` extra) installs the ``rustac`` binary
into the environment's ``bin`` folder.  :func:`start_stac_server` starts it
on a free loopback port with the collections and item collections of the
given JSON files loaded, waits until ``/search`` answers, and returns a
:class:`StacServer`; ``stop()`` terminates it (killed after a timeout).

Tests use it through the ``stac_server_factory`` fixture of ``tests/conftest.py``::

    def test_search(stac_server_factory, tmp_path):
        paths = write_collection_files(items, tmp_path)
        server = stac_server_factory(paths)
        ds = STACDataset(server.url, assets=["red"], collections=["c"])

The memory backend answers ``collections``, ``ids``, ``bbox``,
``intersects``, ``datetime`` and paging (``limit`` + ``next`` links); it
does not conform to the ``query`` or ``filter`` extensions.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from s3server import _die_with_parent, _free_ports

__all__ = ["StacServer", "RustacNotFoundError", "find_rustac", "start_stac_server"]


class RustacNotFoundError(RuntimeError):
    """The ``rustac`` binary of the ``rustac`` package is not installed."""


def find_rustac() -> str:
    """Path of the ``rustac`` binary: ``$PIPEKIT_RUSTAC``, the environment's ``bin`` folder, or ``PATH``."""
    for path in (
        os.environ.get("PIPEKIT_RUSTAC"),
        str(Path(sys.executable).parent / "rustac"),
        str(Path(sysconfig.get_path("scripts")) / "rustac"),
        shutil.which("rustac"),
    ):
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise RustacNotFoundError(
        f"the 'rustac' binary was not found (looked in $PIPEKIT_RUSTAC, next to {sys.executable} and on PATH); "
        "it comes from the 'rustac' package of the 'dev' extra"
    )


@dataclass
class StacServer:
    """A running ``rustac serve``.

    Attributes:
        url: the API's landing page, ``http://127.0.0.1:<port>/``.
        log_path: the server's log file.
    """

    url: str
    log_path: Path
    process: subprocess.Popen = field(repr=False)

    def log_tail(self, n: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        return ""

    def stop(self, timeout: float = 5.0) -> None:
        """Terminate the server; kill it if it still runs after ``timeout`` s."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=timeout)


def start_stac_server(hrefs: list[str], log_dir: str | Path, timeout: float = 60.0) -> StacServer:
    """Serve the collections/item collections in ``hrefs`` on a free loopback port; wait until it answers."""
    (port,) = _free_ports(1)
    log_path = Path(log_dir) / f"rustac-{port}.log"
    cmd = [find_rustac(), "serve", "--addr", f"127.0.0.1:{port}", "--create-collections", *map(str, hrefs)]
    log = open(log_path, "wb")  # noqa: SIM115 - the child writes it for its whole life
    try:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
    finally:
        log.close()
    server = StacServer(f"http://127.0.0.1:{port}/", log_path, process)
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"rustac serve exited with {process.returncode}: {' '.join(cmd)}\n{server.log_tail()}")
        try:
            with urllib.request.urlopen(server.url + "search?limit=1", timeout=5) as response:
                json.loads(response.read())
            return server
        except OSError:
            if time.monotonic() > deadline:
                server.stop()
                raise TimeoutError(f"rustac serve did not answer within {timeout} s\n{server.log_tail()}") from None
            time.sleep(0.1)
