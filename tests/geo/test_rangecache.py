"""The range cache of remote rasters (``cache_dir=``): same bytes, shared by processes, never stale, errors named.

Unit tests run over fsspec's ``memory://`` filesystem; the dataset tests read
COGs from the real S3 server (SeaweedFS on loopback) through the lean
fetcher (:mod:`pipekit.geo.rangefetch`) and compare with the same files on
local disk.
"""

from __future__ import annotations

import http.server
import multiprocessing
import pickle
import threading
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
import rasterio
import torch
from affine import Affine

from pipekit import _fast
from pipekit.datasets import Landsat8
from pipekit.errors import ReadError
from pipekit.geo import BoundingBox, RandomGeoSampler, stack_samples
from pipekit.geo import io as geo_io
from pipekit.geo.rangecache import RangeCache, RangeCacheError
from pipekit.geo.rangefetch import RangeFetcher, s3_fetcher
from pipekit.retry import is_transient

SCENE = "LC08_L2SP_026031_20210701_20210708_02_T1"
BANDS = ["SR_B2", "SR_B3", "SR_B4"]
TILE, SIZE = 64, 384
X0, Y0 = 399_990.0, 4_650_030.0


@pytest.fixture
def mem() -> Any:
    fs = fsspec.filesystem("memory")
    data = np.random.default_rng(0).integers(0, 256, 300_000, dtype=np.uint8).tobytes()
    fs.pipe("/rangecache/blob.bin", data)
    yield fs, data
    fs.rm("/rangecache", recursive=True)


def test_reads_equal_the_file_and_fetch_each_block_once(mem, tmp_path):
    fs, data = mem
    cache = RangeCache(tmp_path / "c", block_size=4096)
    before = cache.stats()
    f = cache.open(fs, "/rangecache/blob.bin", "memory://rangecache/blob.bin")
    rng = np.random.default_rng(1)
    for _ in range(200):
        start = int(rng.integers(0, len(data) + 10))
        n = int(rng.integers(0, 20_000))
        f.seek(start)
        assert f.read(n) == data[start : start + n]
    f.seek(-100, 2)
    assert f.read() == data[-100:]
    stats = cache.stats()
    fetched = stats["fetched_bytes"] - before["fetched_bytes"]
    assert fetched <= len(data)  # no block fetched twice
    # everything read again: from the mirror, nothing fetched
    f.seek(0)
    assert f.read() == data
    assert cache.stats()["fetched_bytes"] - before["fetched_bytes"] == len(data)
    again = cache.stats()["fetched_bytes"]
    f.seek(0)
    assert f.read() == data and cache.stats()["fetched_bytes"] == again
    f.close()


def _child_read(directory: str, queue: Any) -> None:
    fs = fsspec.filesystem("memory")
    cache = RangeCache(directory, block_size=4096)
    f = cache.open(fs, "/rangecache/blob.bin", "memory://rangecache/blob.bin")
    f.seek(1000)
    queue.put((f.read(50_000), cache.stats()["fetched_bytes"]))


def test_another_process_reads_what_one_fetched(mem, tmp_path):
    """A forked process (a DataLoader worker) finds the blocks the parent fetched: it fetches nothing."""
    fs, data = mem
    cache = RangeCache(tmp_path / "c", block_size=4096)
    f = cache.open(fs, "/rangecache/blob.bin", "memory://rangecache/blob.bin")
    f.seek(0)
    f.read(60_000)
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    p = ctx.Process(target=_child_read, args=(str(tmp_path / "c"), queue))
    p.start()
    got, fetched = queue.get(timeout=30)
    p.join(30)
    assert got == data[1000:51_000]
    assert fetched == 0


def test_a_replaced_file_gets_a_new_mirror(tmp_path):
    fs = fsspec.filesystem("memory")
    fs.pipe("/rangecache2/f.bin", b"a" * 10_000)
    try:
        cache = RangeCache(tmp_path / "c", block_size=1024)
        f = cache.open(fs, "/rangecache2/f.bin", "memory://rangecache2/f.bin")
        assert f.read() == b"a" * 10_000
        fs.pipe("/rangecache2/f.bin", b"b" * 10_000)  # same size, a new version (memory: its creation time)
        import pipekit.geo.rangecache as rc

        rc._by_url.clear()  # a new process: the size and version are asked again
        g = cache.open(fs, "/rangecache2/f.bin", "memory://rangecache2/f.bin")
        assert g.read() == b"b" * 10_000
        assert len(list((tmp_path / "c").glob("*.data"))) == 2
    finally:
        fs.rm("/rangecache2", recursive=True)


class _FlakyFetch:
    """Fails the first ``fail`` calls, then fetches from ``data``; ``short``: sends one byte less once."""

    def __init__(self, data: bytes, fail: int = 0, short: bool = False) -> None:
        self.data, self.fail, self.short, self.calls = data, fail, short, 0

    def __call__(self, path: str, start: int, end: int) -> bytes:
        self.calls += 1
        if self.fail:
            self.fail -= 1
            raise ConnectionResetError(104, "Connection reset by peer")
        if self.short:
            self.short = False
            return self.data[start : end - 1]
        return self.data[start:end]


def test_a_failed_fetch_marks_nothing_and_the_next_read_fetches_again(mem, tmp_path):
    fs, data = mem
    cache = RangeCache(tmp_path / "c", block_size=4096)
    fetch = _FlakyFetch(data, fail=1)
    f = cache.open(fs, "/rangecache/blob.bin", "memory://rangecache/blob.bin", fetch)
    with pytest.raises(ConnectionResetError) as info:
        f.read(10_000)
    assert is_transient(info.value)
    f.seek(0)
    assert f.read(10_000) == data[:10_000]
    short = _FlakyFetch(data, short=True)
    g = cache.open(fs, "/rangecache/blob.bin", "memory://rangecache/blob.bin", short)
    g.seek(100_000)
    with pytest.raises(OSError, match=r"memory://rangecache/blob\.bin: asked for bytes 98304-102399, the server sent"):
        g.read(10)
    g.seek(100_000)
    assert g.read(10) == data[100_000:100_010]


def test_an_unusable_folder_is_named(mem, tmp_path):
    fs, _ = mem
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(RangeCacheError, match=r"range cache folder .*file/c: cannot be used"):
        RangeCache(tmp_path / "file" / "c")
    with pytest.raises(RangeCacheError, match=r"range cache folder .*file/c: cannot be used"):
        Landsat8(paths="memory://rangecache", cache_dir=tmp_path / "file" / "c")
    cache = RangeCache(tmp_path / "gone")
    (tmp_path / "gone").rmdir()
    (tmp_path / "gone").write_text("replaced by a file after the dataset was made")
    with pytest.raises(RangeCacheError, match=r"range cache folder .*gone: cannot hold a mirror of memory://"):
        cache.open(fs, "/rangecache/blob.bin", "memory://rangecache/blob.bin")
    with pytest.raises(ValueError, match="block_size"):
        RangeCache(tmp_path, block_size=100)


def test_opener_options(tmp_path):
    opener = geo_io.RasterOpener({"anon": True}, cache_dir=tmp_path)
    assert opener.resolve("s3://bucket/a.tif").kind == "fsspec"
    assert opener.resolve(str(tmp_path / "a.tif")).kind == "local"
    back = pickle.loads(pickle.dumps(opener))
    assert back == opener and back.cache_dir == str(tmp_path) and "cache_dir" in repr(back)
    assert back != geo_io.RasterOpener({"anon": True})
    with pytest.raises(ValueError, match="vsi=True"):
        geo_io.RasterOpener(cache_dir=tmp_path, vsi=True)
    with pytest.raises(TypeError, match="cache_dir must be a path"):
        geo_io.RasterOpener(cache_dir=3)


def test_s3_fetcher_applies_where_the_request_is_known():
    assert s3_fetcher({"AWS_S3_ENDPOINT": "h:1", "AWS_HTTPS": "NO"}, {"AWS_ACCESS_KEY_ID": "k"}).base == "http://h:1/"
    assert s3_fetcher({"AWS_REGION": "eu-west-1", "AWS_NO_SIGN_REQUEST": "YES"}, {}) is not None
    assert s3_fetcher({}, {"AWS_ACCESS_KEY_ID": "k"}) is None  # no endpoint, no region: s3fs finds the region
    assert s3_fetcher({"AWS_REGION": "r"}, {}) is None  # the default credential chain: s3fs's
    assert s3_fetcher({"AWS_REGION": "r", "AWS_PROFILE": "p"}, {"AWS_ACCESS_KEY_ID": "k"}) is None


class _Status(http.server.BaseHTTPRequestHandler):
    status = 503

    def do_GET(self) -> None:
        body = b"<Error><Code>SlowDown</Code></Error>"
        self.send_response(self.status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize(
    ("status", "kind", "transient"),
    [(503, ConnectionError, True), (404, FileNotFoundError, False), (403, PermissionError, False)],
)
def test_http_errors_keep_their_meaning(status, kind, transient):
    handler = type("H", (_Status,), {"status": status})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/x.tif"
        with pytest.raises(kind, match=rf"GET {url} \(bytes 0-9\): HTTP {status}") as info:
            RangeFetcher("")(url, 0, 10)
        assert is_transient(info.value) is transient
    finally:
        server.shutdown()
        server.server_close()


# -- datasets on the S3 server -----------------------------------------------------------------


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Landsat 8 scene: three band files of 384 px in 64 px DEFLATE tiles."""
    root = tmp_path_factory.mktemp("rc") / SCENE
    root.mkdir()
    rng = np.random.default_rng(0)
    for band in BANDS:
        with rasterio.open(
            root / f"{SCENE}_{band}.TIF", "w", driver="GTiff", width=SIZE, height=SIZE, count=1, dtype="uint16",
            crs="EPSG:32615", transform=Affine(30.0, 0.0, X0, 0.0, -30.0, Y0), nodata=0, tiled=True,
            blockxsize=TILE, blockysize=TILE, compress="deflate",
        ) as f:
            f.write(rng.integers(1, 60_000, (1, SIZE, SIZE), dtype=np.uint16))
    return root


@pytest.fixture(autouse=True)
def _fresh_handles():
    yield
    geo_io.run_parts(lambda k: geo_io.close_cached_handles(), geo_io.REMOTE_IO_THREADS)
    geo_io.close_cached_handles()


def _upload(server: Any, scene: Path) -> str:
    bucket = server.create_bucket()
    fs = server.fs()
    for path in sorted(scene.iterdir()):
        fs.put_file(str(path), f"{bucket}/l8/{SCENE}/{path.name}")
    return bucket


def _boxes(ds: Any, n: int, pixels: int = 48, seed: int = 1) -> list[BoundingBox]:
    b = ds.bounds
    span = pixels * ds.res[0]
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = b[0].start + rng.uniform(0, b[0].stop - b[0].start - span)
        y = b[1].start + rng.uniform(0, b[1].stop - b[1].start - span)
        out.append(BoundingBox(x, x + span, y, y + span))
    return out


@pytest.mark.s3
@pytest.mark.parametrize("prefetch", [True, False], ids=["prefetch", "on-demand"])
@pytest.mark.parametrize("kwargs", [{}, {"crs": "EPSG:5070"}], ids=["native", "warped"])
def test_same_pixels_as_local_disk(s3_server, scene, tmp_path, monkeypatch, prefetch, kwargs):
    monkeypatch.setitem(_fast.state, "prefetch_tiles", prefetch)
    bucket = _upload(s3_server, scene)
    ds = Landsat8(paths=f"s3://{bucket}/l8", bands=BANDS, storage_options=s3_server.storage_options,
                  cache_dir=tmp_path / "cache", **kwargs)
    local = Landsat8(paths=scene.parent, bands=BANDS, **kwargs)
    for q in _boxes(ds, 16):  # each sample's band files on the I/O lanes at once
        got = ds[q]["image"].numpy()
        assert got.shape == (len(BANDS), 48, 48)
        np.testing.assert_array_equal(got, local[q]["image"].numpy())
    assert list((tmp_path / "cache").glob("*.data"))


@pytest.mark.s3
def test_workers_share_what_they_fetched(s3_server, scene, tmp_path):
    """After a pass with 2 workers, the main process reads the same patches without fetching a byte."""
    bucket = _upload(s3_server, scene)
    cache_dir = tmp_path / "cache"
    ds = Landsat8(paths=f"s3://{bucket}/l8", bands=BANDS, storage_options=s3_server.storage_options,
                  cache_dir=cache_dir)
    sampler = list(RandomGeoSampler(ds, size=40, length=24, seed=3))  # the same boxes in every pass
    loader = torch.utils.data.DataLoader(ds, batch_size=4, sampler=sampler, collate_fn=stack_samples, num_workers=2)
    first = torch.cat([b["image"] for b in loader])
    cache = RangeCache(cache_dir)
    before = cache.stats()["fetched_bytes"]
    again = torch.cat([b["image"] for b in torch.utils.data.DataLoader(ds, batch_size=4, sampler=sampler,
                                                                        collate_fn=stack_samples)])
    assert torch.equal(first, again)
    assert cache.stats()["fetched_bytes"] == before  # every tile came from the mirror the workers filled
    local = Landsat8(paths=scene.parent, bands=BANDS)
    expected = torch.cat([b["image"] for b in torch.utils.data.DataLoader(local, batch_size=4, sampler=sampler,
                                                                           collate_fn=stack_samples)])
    assert torch.equal(first, expected)


@pytest.mark.s3
def test_a_wrong_secret_is_named(s3_server, scene, tmp_path):
    bucket = _upload(s3_server, scene)
    ds = Landsat8(paths=f"s3://{bucket}/l8", bands=BANDS, storage_options=s3_server.storage_options,
                  cache_dir=tmp_path / "cache")
    q = _boxes(ds, 1)[0]
    geo_io.run_parts(lambda k: geo_io.close_cached_handles(), geo_io.REMOTE_IO_THREADS)
    bad = {**s3_server.storage_options, "secret": "wrong"}
    ds2 = pickle.loads(pickle.dumps(ds))
    ds2._opener = geo_io.RasterOpener(bad, None, {}, tmp_path / "other-cache")
    with pytest.raises(ReadError, match=rf"cannot open raster 's3://{bucket}/l8/{SCENE}/.*PermissionError"):
        ds2[q]
    # the lean fetcher's own answer to a wrong signature
    config, creds = geo_io._s3_gdal_options(bad)
    fetch = s3_fetcher(config, creds)
    with pytest.raises(PermissionError, match=rf"GET http://.*/{bucket}/l8/{SCENE}/.*: HTTP 403 SignatureDoesNotMatch"):
        fetch(f"{bucket}/l8/{SCENE}/{SCENE}_SR_B2.TIF", 0, 100)
    good = s3_fetcher(*geo_io._s3_gdal_options(s3_server.storage_options))
    assert good(f"{bucket}/l8/{SCENE}/{SCENE}_SR_B2.TIF", 0, 4) in (b"II*\x00", b"MM\x00*")


@pytest.mark.s3
def test_a_file_deleted_after_opening_is_named(s3_server, scene, tmp_path):
    """A tile fetched after the object is gone: the read fails naming the file (GDAL sees a short read)."""
    bucket = _upload(s3_server, scene)
    ds = Landsat8(paths=f"s3://{bucket}/l8", bands=BANDS, storage_options=s3_server.storage_options,
                  cache_dir=tmp_path / "cache")
    first = _boxes(ds, 1, pixels=16, seed=5)[0]
    ds[first]  # the files are open, their headers in the mirror
    s3_server.fs().rm(f"{bucket}/l8/{SCENE}/{SCENE}_SR_B3.TIF")
    far = BoundingBox(X0 + 30.0 * 330, X0 + 30.0 * 346, Y0 - 30.0 * 346, Y0 - 30.0 * 330)  # tiles not yet fetched
    with pytest.raises(ReadError, match=rf"s3://{bucket}/l8/{SCENE}/{SCENE}_SR_B3\.TIF.*HTTP 404"):
        ds[far]


@pytest.mark.s3
def test_a_tile_index_gdal_does_not_expose_leaves_reads_on_demand(s3_server, scene, tmp_path, monkeypatch):
    def no_index(self, band, x, y):
        raise ValueError("no BLOCK_OFFSET item")

    monkeypatch.setattr(geo_io._TilePrefetcher, "_tile", no_index)
    bucket = _upload(s3_server, scene)
    ds = Landsat8(paths=f"s3://{bucket}/l8", bands=BANDS, storage_options=s3_server.storage_options,
                  cache_dir=tmp_path / "cache")
    local = Landsat8(paths=scene.parent, bands=BANDS)
    for q in _boxes(ds, 3):
        np.testing.assert_array_equal(ds[q]["image"].numpy(), local[q]["image"].numpy())


@pytest.mark.s3
def test_a_lost_connection_is_retried(s3_server, scene, tmp_path, monkeypatch):
    """A fetch that fails once (a dropped connection) is retried by the read's policy: the sample is whole."""
    bucket = _upload(s3_server, scene)
    ds = Landsat8(paths=f"s3://{bucket}/l8", bands=BANDS, storage_options=s3_server.storage_options,
                  cache_dir=tmp_path / "cache")
    local = Landsat8(paths=scene.parent, bands=BANDS)
    real = RangeFetcher.__call__
    failures = []

    def flaky(self, path, start, end):
        if not failures:
            failures.append(path)
            raise ConnectionError(f"GET {path}: connection reset (injected)")
        return real(self, path, start, end)

    monkeypatch.setattr(RangeFetcher, "__call__", flaky)
    q = _boxes(ds, 1, seed=9)[0]
    np.testing.assert_array_equal(ds[q]["image"].numpy(), local[q]["image"].numpy())
    assert failures  # the failure happened, and was retried


def test_a_store_that_hides_the_size_is_named(tmp_path):
    class NoSize:
        def info(self, path: str) -> dict[str, Any]:
            return {"name": path, "size": None, "type": "file"}

    with pytest.raises(OSError, match=r"https://example\.org/a\.tif: the store does not report the file's size"):
        RangeCache(tmp_path).open(NoSize(), "https://example.org/a.tif", "https://example.org/a.tif")


@pytest.mark.s3
def test_a_bad_file_is_named_through_two_workers(s3_server, scene, tmp_path):
    """A band file whose tiles are damaged, read through the cache in a worker: the main process sees its URL."""
    bucket = s3_server.create_bucket()
    fs = s3_server.fs()
    for path in sorted(scene.iterdir()):
        data = bytearray(path.read_bytes())
        if "SR_B3" in path.name:
            with rasterio.open(path) as src:
                for row in range(SIZE // TILE):
                    for col in range(SIZE // TILE):
                        offset = int(src.get_tag_item(f"BLOCK_OFFSET_{col}_{row}", "TIFF", bidx=1))
                        size = int(src.get_tag_item(f"BLOCK_SIZE_{col}_{row}", "TIFF", bidx=1))
                        data[offset : offset + size] = b"\xff" * size
        fs.pipe(f"{bucket}/l8/{SCENE}/{path.name}", bytes(data))
    ds = Landsat8(paths=f"s3://{bucket}/l8", bands=BANDS, storage_options=s3_server.storage_options,
                  cache_dir=tmp_path / "cache")
    loader = torch.utils.data.DataLoader(ds, batch_size=2, sampler=_boxes(ds, 4), collate_fn=stack_samples,
                                         num_workers=2)
    with pytest.raises(Exception, match=rf"s3://{bucket}/l8/{SCENE}/{SCENE}_SR_B3\.TIF") as info:
        list(loader)
    assert "Landsat8" in str(info.value)  # the stage


@pytest.mark.s3
def test_reads_through_the_cache_ask_s3fs_nothing(s3_server, scene, tmp_path, monkeypatch):
    """Sizes, versions and tiles come through the lean fetcher: a DataLoader worker never starts an s3fs
    session (~0.5 s of CPU in each worker, a tenth of a 2-worker first pass), and its mirrors are the ones
    s3fs's answers name, so the main process and the workers share them."""
    import s3fs

    import pipekit.geo.rangecache as rc

    bucket = _upload(s3_server, scene)
    cache_dir = tmp_path / "cache"
    key = f"{bucket}/l8/{SCENE}/{SCENE}_SR_B2.TIF"
    by_s3fs = RangeCache(cache_dir).mirror(s3_server.fs(), key, f"s3://{key}")  # size and version from s3fs
    ds = Landsat8(paths=f"s3://{bucket}/l8", bands=BANDS, storage_options=s3_server.storage_options,
                  cache_dir=cache_dir)
    local = Landsat8(paths=scene.parent, bands=BANDS)
    queries = _boxes(ds, 4)

    asked: list[str] = []
    call_s3 = s3fs.S3FileSystem._call_s3

    async def counted(self: Any, method: str, *args: Any, **kwargs: Any) -> Any:
        asked.append(method)
        return await call_s3(self, method, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", counted)  # every request s3fs sends (dircache aside)
    # as in a fresh worker: no file open, no size or version known yet
    geo_io.run_parts(lambda k: geo_io.close_cached_handles(), geo_io.REMOTE_IO_THREADS)
    monkeypatch.setattr(rc, "_by_url", {})
    monkeypatch.setattr(rc, "_mirrors", {})
    for q in queries:
        np.testing.assert_array_equal(ds[q]["image"].numpy(), local[q]["image"].numpy())
    assert asked == []
    by_head = RangeCache(cache_dir).mirror(s3_server.fs(), key, f"s3://{key}", s3_fetcher(
        *geo_io._s3_gdal_options(s3_server.storage_options)))
    assert (by_head.size, by_head.version) == (by_s3fs.size, by_s3fs.version)
    assert len(list(cache_dir.glob("*.data"))) == len(BANDS)  # one mirror per file, whoever asked


@pytest.mark.s3
def test_a_missing_object_is_named_by_the_head_request(s3_server):
    bucket = s3_server.create_bucket()
    fetch = s3_fetcher(*geo_io._s3_gdal_options(s3_server.storage_options))
    with pytest.raises(FileNotFoundError, match=rf"HEAD http://.*/{bucket}/gone\.tif: HTTP 404"):
        fetch.info(f"{bucket}/gone.tif")
    s3_server.fs().pipe(f"{bucket}/here.tif", b"x" * 1000)
    info = fetch.info(f"{bucket}/here.tif")
    assert info["size"] == 1000 and info["ETag"] == s3_server.fs().info(f"{bucket}/here.tif")["ETag"]


class _OneAnswerPerConnection(http.server.BaseHTTPRequestHandler):
    """Keeps the connection alive in its answer, then closes it: as a server does with an idle connection."""

    protocol_version = "HTTP/1.1"
    connections = 0
    body = bytes(range(256)) * 4

    def setup(self) -> None:
        type(self).connections += 1
        super().setup()

    def do_GET(self) -> None:
        start, end = (int(x) for x in self.headers["Range"].removeprefix("bytes=").split("-"))
        data = self.body[start : end + 1]
        self.send_response(206)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.close_connection = True

    def log_message(self, *args: Any) -> None:
        pass


def _child_fetch(fetch: RangeFetcher, url: str, queue: Any) -> None:
    queue.put(fetch(url, 10, 20))


def test_a_connection_the_server_closed_is_opened_again(tmp_path):
    """The fetcher keeps a connection per thread alive; one the server closed meanwhile costs no failed read,
    and a forked process (a DataLoader worker) opens its own instead of sharing its parent's socket."""
    handler = type("H", (_OneAnswerPerConnection,), {"connections": 0})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/x.tif"
        fetch = RangeFetcher("")
        assert fetch(url, 0, 4) == bytes(range(4))
        assert fetch(url, 300, 310) == bytes(range(44, 54))  # its kept-alive connection was closed
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        p = ctx.Process(target=_child_fetch, args=(fetch, url, queue))
        p.start()
        assert queue.get(timeout=30) == bytes(range(10, 20))
        p.join(30)
        assert handler.connections == 3
    finally:
        server.shutdown()
        server.server_close()
