"""A real STAC API server for the tests: ``rustac serve`` on loopback, in-memory or over stac-geoparquet (DuckDB).

The ``rustac`` package (in the ``dev`` extra) installs the ``rustac`` binary
into the environment's ``bin`` folder.  :func:`start_stac_server` starts it
on a free loopback port, waits until ``/search`` answers, and returns a
:class:`StacServer`; ``stop()`` terminates it (killed after a timeout).

* Given collection and item-collection JSON files, it serves them from its
  in-memory backend: ``collections``, ``ids``, ``bbox``, ``intersects``,
  ``datetime`` and paging (``limit`` + ``next`` links).  That backend
  answers every ``filter`` with no item, and does not implement ``query``.
* Given one stac-geoparquet file, it serves it with its DuckDB backend,
  which evaluates CQL2 ``filter`` (text and JSON) as SQL; ``query`` answers
  500 "query is not implemented".  DuckDB loads its ``spatial``, ``icu``
  and ``parquet`` extensions, which it would download at start-up (no
  network here): :func:`duckdb_home` lays the extension files of the
  ``duckdb-extension-*`` packages (``dev`` extra, the version matching the
  DuckDB that rustac bundles: rustac 0.9.17 <-> DuckDB v1.5.5) into a
  private ``$HOME/.duckdb/extensions/<version>/<platform>/`` for the server.

Tests use it through the ``stac_server_factory`` fixture of ``tests/conftest.py``::

    def test_search(stac_server_factory, tmp_path):
        paths = write_collection_files(items, tmp_path)
        server = stac_server_factory(paths)  # or [write_geoparquet(items, ...)] for filters
        ds = STACDataset(server.url, assets=["red"], collections=["c"])
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from s3server import _die_with_parent, _free_ports

__all__ = ["StacServer", "RustacNotFoundError", "find_rustac", "duckdb_home", "start_stac_server"]

#: the DuckDB extensions rustac's DuckDB backend loads
DUCKDB_EXTENSIONS = ("spatial", "icu", "parquet")


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


def _duckdb_platform() -> str:
    machine = platform.machine().lower()
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)
    return f"{'osx' if sys.platform == 'darwin' else 'linux'}_{arch}"


def duckdb_home(rustac: str, folder: str | Path) -> Path:
    """A ``$HOME`` for ``rustac serve``'s DuckDB backend, holding the extensions it would otherwise download.

    The extension files come from the ``duckdb-extension-{spatial,icu,parquet}``
    packages installed next to ``rustac`` (its environment's site-packages) or
    on ``sys.path``; each lands under the DuckDB version its package names.

    Raises:
        RustacNotFoundError: an extension package is missing (names the packages and where it looked).
    """
    env_root = Path(rustac).resolve().parent.parent
    roots = [*glob.glob(str(env_root / "lib" / "python*" / "site-packages")), *sys.path]
    home = Path(folder)
    for name in DUCKDB_EXTENSIONS:
        found = []
        for root in roots:
            found = sorted(
                glob.glob(
                    os.path.join(root, f"duckdb_extension_{name}", "extensions", "v*", f"{name}.duckdb_extension")
                )
            )
            if found:
                break
        if not found:
            raise RustacNotFoundError(
                f"the DuckDB {name!r} extension was not found (looked for duckdb_extension_{name} in "
                f"{env_root} and on sys.path); rustac serve's DuckDB backend needs the "
                f"duckdb-extension-{{{','.join(DUCKDB_EXTENSIONS)}}} packages of the 'dev' extra"
            )
        source = Path(found[-1])
        target = home / ".duckdb" / "extensions" / source.parent.name / _duckdb_platform() / source.name
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            shutil.copyfile(source, target)
    return home


def start_stac_server(hrefs: list[str], log_dir: str | Path, timeout: float = 60.0) -> StacServer:
    """Serve ``hrefs`` on a free loopback port; wait until it answers.

    ``hrefs``: collection/item-collection JSON files (the in-memory backend),
    or one stac-geoparquet file (the DuckDB backend, which evaluates ``filter``).
    """
    (port,) = _free_ports(1)
    log_path = Path(log_dir) / f"rustac-{port}.log"
    rustac = find_rustac()
    hrefs = [str(h) for h in hrefs]
    env = None
    if len(hrefs) == 1 and hrefs[0].endswith(".parquet"):
        home = duckdb_home(rustac, Path(log_dir) / "duckdb-home")
        env = {**os.environ, "HOME": str(home)}
        cmd = [rustac, "serve", "--addr", f"127.0.0.1:{port}", "--use-duckdb", "true", hrefs[0]]
    else:
        cmd = [rustac, "serve", "--addr", f"127.0.0.1:{port}", "--create-collections", *hrefs]
    log = open(log_path, "wb")  # noqa: SIM115 - the child writes it for its whole life
    try:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent, env=env)
    finally:
        log.close()
    server = StacServer(f"http://127.0.0.1:{port}/", log_path, process)
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"rustac serve exited with {process.returncode}: {' '.join(cmd)}\n{server.log_tail()}")
        try:
            with urllib.request.urlopen(server.url + "search?limit=1", timeout=40) as response:
                json.loads(response.read())
            return server
        except urllib.error.HTTPError as exc:  # it answers, but cannot search (DuckDB without its extensions)
            server.stop()
            hint = ""
            if env is not None:
                placed = sorted(str(p.relative_to(env["HOME"])) for p in Path(env["HOME"]).rglob("*.duckdb_extension"))
                hint = (
                    f" (DuckDB's extensions must be those of the DuckDB version rustac bundles; {placed} were "
                    "laid out: pin rustac and the duckdb-extension-* packages to matching versions)"
                )
            raise RuntimeError(
                f"rustac serve answers /search with {exc.code}: {exc.read()[:300]!r}{hint}: "
                f"{' '.join(cmd)}\n{server.log_tail()}"
            ) from None
        except OSError:
            if time.monotonic() > deadline:
                server.stop()
                raise TimeoutError(f"rustac serve did not answer within {timeout} s\n{server.log_tail()}") from None
            time.sleep(0.1)
