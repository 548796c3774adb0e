"""A scene's band files read from S3 at once (issue 12): concurrent at the server, same pixels, same errors.

``RasterReader._read_parts`` opens and reads part ``k`` (the ``k``-th band
file) of a remote scene on I/O thread ``k`` (:func:`pipekit.geo.io.run_parts`).
A proxy in front of the S3 server holds every request back a little and
counts how many it holds at once: the band files of one sample overlap
there, where the serial path (the fast path ``concurrent_parts`` off) never
has two requests in flight.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import rasterio
from affine import Affine

from pipekit import _fast
from pipekit.datasets import Landsat8
from pipekit.errors import ReadError, SkippedReadError
from pipekit.geo import BoundingBox
from pipekit.geo import io as geo_io

pytestmark = pytest.mark.s3

SCENE = "LC08_L2SP_026031_20210701_20210708_02_T1"
BANDS = ["SR_B2", "SR_B3", "SR_B4", "SR_B5"]
TILE = 64
SIZE = 512
X0, Y0 = 399_990.0, 4_650_030.0


class DelayingProxy:
    """A TCP forwarder on 127.0.0.1 that holds each HTTP request back ``delay`` seconds and counts the overlap.

    ``max_held``: the most requests held back at the same time (from any connections).
    """

    def __init__(self, upstream: tuple[str, int], delay: float) -> None:
        self.upstream = upstream
        self.delay = delay
        self.held = 0
        self.max_held = 0
        self.requests = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def reset(self) -> None:
        with self._lock:
            self.max_held = self.held
            self.requests = 0

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(self.upstream)
        except OSError:
            client.close()
            return
        threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()
        self._pump(client, server, True)

    def _pump(self, src: socket.socket, dst: socket.socket, upward: bool) -> None:
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                if upward and b" HTTP/1.1\r\n" in data:  # a request starts: hold it back
                    with self._lock:
                        self.held += 1
                        self.requests += 1
                        self.max_held = max(self.max_held, self.held)
                    time.sleep(self.delay)
                    with self._lock:
                        self.held -= 1
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.close()


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Landsat 8 scene: four band files of 512 px in 64 px DEFLATE tiles, different values in each."""
    root = tmp_path_factory.mktemp("parts") / SCENE
    root.mkdir()
    rng = np.random.default_rng(0)
    for band in BANDS:
        with rasterio.open(
            root / f"{SCENE}_{band}.TIF",
            "w",
            driver="GTiff",
            width=SIZE,
            height=SIZE,
            count=1,
            dtype="uint16",
            crs="EPSG:32615",
            transform=Affine(30.0, 0.0, X0, 0.0, -30.0, Y0),
            nodata=0,
            tiled=True,
            blockxsize=TILE,
            blockysize=TILE,
            compress="deflate",
        ) as f:
            f.write(rng.integers(1, 60_000, (1, SIZE, SIZE), dtype=np.uint16))
    return root


@pytest.fixture
def serial(monkeypatch: pytest.MonkeyPatch):
    """Switch to the serial path (band files one after another on one I/O thread) inside ``with serial():``."""

    @contextlib.contextmanager
    def off():
        monkeypatch.setitem(_fast.state, "concurrent_parts", False)
        try:
            yield
        finally:
            monkeypatch.setitem(_fast.state, "concurrent_parts", True)

    return off


def _close_handles() -> None:
    """Close the cached handles of every I/O thread."""
    geo_io.run_parts(lambda k: geo_io.close_cached_handles(), geo_io.REMOTE_IO_THREADS)


@pytest.fixture(autouse=True)
def _fresh_handles():
    yield
    _close_handles()


def _upload(server: Any, scene: Path, broken: dict[str, int] | None = None) -> str:
    """The scene in a fresh bucket; ``broken``: band -> a tile (row-major) whose bytes are garbage there."""
    bucket = server.create_bucket()
    fs = server.fs()
    for path in sorted(scene.iterdir()):
        data = bytearray(path.read_bytes())
        band = path.stem.rsplit("_", 2)[-2] + "_" + path.stem.rsplit("_", 1)[-1]
        if broken and band in broken:
            tiles = SIZE // TILE
            row, col = divmod(broken[band], tiles)
            with rasterio.open(path) as src:
                offset = int(src.get_tag_item(f"BLOCK_OFFSET_{col}_{row}", "TIFF", bidx=1))
                size = int(src.get_tag_item(f"BLOCK_SIZE_{col}_{row}", "TIFF", bidx=1))
            data[offset : offset + size] = b"\xff" * size
        fs.pipe(f"{bucket}/l8/{SCENE}/{path.name}", bytes(data))
    return bucket


def _box(col: int, row: int, pixels: int = 32) -> BoundingBox:
    """A box of ``pixels`` inside the tile at (col, row)."""
    x = X0 + 30.0 * (col * TILE + 8)
    y = Y0 - 30.0 * (row * TILE + 8)
    return BoundingBox(x, x + 30.0 * pixels, y - 30.0 * pixels, y)


def _s3_dataset(server: Any, bucket: str, endpoint: str | None = None, **kwargs: Any) -> Landsat8:
    options = server.storage_options
    if endpoint is not None:
        options["client_kwargs"]["endpoint_url"] = endpoint
    return Landsat8(paths=f"s3://{bucket}/l8", bands=BANDS, storage_options=options, **kwargs)


def test_band_files_are_requested_at_once(s3_server, scene, serial):
    """Requests for one sample's band files overlap at the server; the serial path has one in flight."""
    bucket = _upload(s3_server, scene)
    port = int(s3_server.endpoint_url.rsplit(":", 1)[1])
    proxy = DelayingProxy(("127.0.0.1", port), delay=0.15)
    try:
        ds = _s3_dataset(s3_server, bucket, proxy.endpoint_url)
        local = Landsat8(paths=scene.parent, bands=BANDS)
        with serial():
            proxy.reset()
            q = _box(0, 7)  # far from the headers (fetched when the dataset was indexed)
            np.testing.assert_array_equal(ds[q]["image"].numpy(), local[q]["image"].numpy())
            assert proxy.requests >= len(BANDS) and proxy.max_held == 1
        _close_handles()  # the serial path held every band file on one I/O thread
        for col, row in ((3, 4), (6, 2)):  # first the files' openings, then reads through the cached handles
            proxy.reset()
            q = _box(col, row)  # tiles no earlier read fetched
            np.testing.assert_array_equal(ds[q]["image"].numpy(), local[q]["image"].numpy())
            assert proxy.requests >= len(BANDS)
            assert proxy.max_held >= min(len(BANDS), geo_io.REMOTE_IO_THREADS)
        # each band file is held open on one I/O thread only: part k's
        counts = geo_io.run_parts(lambda k: geo_io.cached_handle_count(), geo_io.REMOTE_IO_THREADS)
        assert counts == [1] * len(BANDS) + [0] * (geo_io.REMOTE_IO_THREADS - len(BANDS))
    finally:
        proxy.close()


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"crs": "EPSG:5070"}, {"cache": False}, {"crs": "EPSG:5070", "cache": False}],
    ids=["native", "warped", "uncached", "warped-uncached"],
)
def test_same_pixels_as_the_serial_path(s3_server, scene, serial, kwargs):
    """Native windows, bands warped together (another CRS), handles opened per read: identical samples."""
    bucket = _upload(s3_server, scene)
    ds = _s3_dataset(s3_server, bucket, **kwargs)
    local = Landsat8(paths=scene.parent, bands=BANDS, **kwargs)
    b = ds.bounds
    span = 48 * ds.res[0]
    rng = np.random.default_rng(1)
    boxes = []
    for _ in range(6):
        x = b[0].start + rng.uniform(0, b[0].stop - b[0].start - span)
        y = b[1].start + rng.uniform(0, b[1].stop - b[1].start - span)
        boxes.append(BoundingBox(x, x + span, y, y + span))
    boxes.append(
        BoundingBox(b[0].stop - span / 2, b[0].stop + span / 2, b[1].start - span / 2, b[1].start + span / 2)
    )  # a corner: partly outside the scene
    concurrent = [ds[q]["image"].numpy() for q in boxes]
    with serial():
        serial_ds = _s3_dataset(s3_server, bucket, **kwargs)
        one_by_one = [serial_ds[q]["image"].numpy() for q in boxes]
    for q, got, expected in zip(boxes, concurrent, one_by_one):
        assert got.shape == (len(BANDS), 48, 48)
        np.testing.assert_array_equal(got, expected)
        np.testing.assert_array_equal(got, local[q]["image"].numpy())


def test_a_band_on_another_grid_is_warped_on_its_own_thread(s3_server, scene, serial, tmp_path):
    """Bands read natively and one band at 60 m (warped alone, after the others): as serially, as locally."""
    coarse = tmp_path / SCENE
    coarse.mkdir()
    for path in scene.iterdir():
        if not path.name.endswith("_SR_B4.TIF"):
            (coarse / path.name).write_bytes(path.read_bytes())
    rng = np.random.default_rng(2)
    with rasterio.open(
        coarse / f"{SCENE}_SR_B4.TIF",
        "w",
        driver="GTiff",
        width=SIZE // 2,
        height=SIZE // 2,
        count=1,
        dtype="uint16",
        crs="EPSG:32615",
        transform=Affine(60.0, 0.0, X0, 0.0, -60.0, Y0),
        nodata=0,
        tiled=True,
        blockxsize=TILE,
        blockysize=TILE,
    ) as f:
        f.write(rng.integers(1, 60_000, (1, SIZE // 2, SIZE // 2), dtype=np.uint16))
    bucket = _upload(s3_server, coarse)
    ds = _s3_dataset(s3_server, bucket)
    local = Landsat8(paths=tmp_path, bands=BANDS)
    boxes = [_box(c, r) for c, r in ((0, 0), (3, 5), (7, 7))]
    concurrent = [ds[q]["image"].numpy() for q in boxes]
    with serial():
        one_by_one = [_s3_dataset(s3_server, bucket)[q]["image"].numpy() for q in boxes]
    for q, got, expected in zip(boxes, concurrent, one_by_one):
        np.testing.assert_array_equal(got, expected)
        np.testing.assert_array_equal(got, local[q]["image"].numpy())
    counts = geo_io.run_parts(lambda k: geo_io.cached_handle_count(), geo_io.REMOTE_IO_THREADS)
    assert counts[1:] == [1, 1, 1]  # the 60 m band's handle stayed on its own thread (lane 0: serial's too)


@pytest.mark.parametrize("concurrent", [True, False], ids=["concurrent", "serial"])
def test_a_broken_band_is_named_with_its_stage(s3_server, scene, serial, concurrent):
    """A tile that cannot be decoded in bands 2 and 4: the error names band 2's s3:// URL (the first in band
    order, as the serial path does), the action and the stage; with on_error="skip" it is counted once."""
    bucket = _upload(s3_server, scene, broken={"SR_B3": 9, "SR_B5": 9})
    q = _box(1, 1)  # tile 9: row 1, column 1
    with contextlib.ExitStack() as stack:
        if not concurrent:
            stack.enter_context(serial())
        ds = _s3_dataset(s3_server, bucket)
        expected = f"s3://{bucket}/l8/{SCENE}/{SCENE}_SR_B3.TIF"
        with pytest.raises(ReadError) as info:
            ds[q]
        assert (info.value.url, info.value.stage, info.value.action) == (expected, "Landsat8", "read raster")
        assert "/vsis3/" not in str(info.value)
        ok = _box(3, 3)  # other tiles still read, through handles opened again
        assert ds[ok]["image"].shape == (len(BANDS), 32, 32)

        skipping = _s3_dataset(s3_server, bucket, on_error="skip")
        with pytest.raises(SkippedReadError) as info:
            skipping[q]
        assert (info.value.url, info.value.stage) == (expected, "Landsat8")
        assert skipping.skip_log.count == 1


def test_a_deleted_band_file_is_named_as_on_the_serial_path(s3_server, scene, serial):
    """A band file deleted after the dataset was indexed: that file's s3:// URL and the stage, as serially."""
    errors = []
    for concurrent in (False, True):
        bucket = _upload(s3_server, scene)
        with contextlib.ExitStack() as stack:
            if not concurrent:
                stack.enter_context(serial())
            ds = _s3_dataset(s3_server, bucket)
            missing = f"{bucket}/l8/{SCENE}/{SCENE}_SR_B4.TIF"
            s3_server.fs().rm(missing)
            start = time.monotonic()
            with pytest.raises(ReadError) as info:
                ds[_box(2, 5)]
            assert time.monotonic() - start < 15  # a 404 is not an outage
            assert (info.value.url, info.value.stage) == (f"s3://{missing}", "Landsat8")
            errors.append(info.value.action)
    assert errors[0] == errors[1]
