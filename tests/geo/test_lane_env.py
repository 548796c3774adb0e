"""The GDAL environment of remote files kept entered on pipekit's I/O threads (``geo_io.LANE_ENV``).

Entering ``rasterio.Env`` costs ~85 µs and a sample of a scene entered it
for every open and every band read; on an I/O thread it now stays entered
until a file with another environment (other options or credentials) is
read there.  These tests check that the environment in effect is always the
file's own: switching between datasets switches options and credentials.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import rasterio
import rasterio.env

from pipekit.datasets import RasterDataset
from pipekit.errors import ReadError
from pipekit.geo import BoundingBox
from pipekit.geo import io as geo_io
from pipekit.geo.io import RasterOpener


@pytest.fixture(autouse=True)
def _fresh_state():
    geo_io.close_cached_handles()
    yield
    geo_io.run_parts(lambda k: (geo_io.close_cached_handles(), geo_io.leave_lane_env()), geo_io.REMOTE_IO_THREADS)
    geo_io.close_cached_handles()


def _options_seen(opener: RasterOpener, url: str) -> dict:
    """The GDAL options in effect on an I/O thread inside ``opener``'s environment for ``url``, and after it."""

    def probe() -> dict:
        with opener.env(opener.resolve(url)):
            inside = dict(rasterio.env.getenv()) if rasterio.env.hasenv() else {}
        after = dict(rasterio.env.getenv()) if rasterio.env.hasenv() else {}
        return {"inside": inside, "after": after, "thread": threading.current_thread().name}

    return geo_io.run_remote(probe)


class TestLaneEnv:
    def test_kept_on_io_thread_and_switched_for_another_environment(self):
        a = RasterOpener(
            {"endpoint_url": "http://127.0.0.1:1", "key": "k", "secret": "s"}, gdal_options={"GDAL_HTTP_TIMEOUT": "17"}
        )
        b = RasterOpener(
            {"endpoint_url": "http://127.0.0.1:1", "key": "k", "secret": "s"}, gdal_options={"GDAL_HTTP_TIMEOUT": "23"}
        )
        seen = _options_seen(a, "s3://bucket/a.tif")
        assert seen["thread"].startswith("pipekit-geo-io")
        assert seen["inside"]["GDAL_HTTP_TIMEOUT"] == "17"
        assert seen["after"]["GDAL_HTTP_TIMEOUT"] == "17"  # kept entered for the next read
        seen = _options_seen(b, "s3://bucket/b.tif")
        assert seen["inside"]["GDAL_HTTP_TIMEOUT"] == "23"  # another dataset's options replace it
        seen = _options_seen(a, "s3://bucket/c.tif")
        assert seen["inside"]["GDAL_HTTP_TIMEOUT"] == "17"

    def test_left_on_request_and_never_kept_off_the_io_threads(self):
        opener = RasterOpener(
            {"endpoint_url": "http://127.0.0.1:1", "key": "k", "secret": "s"}, gdal_options={"GDAL_HTTP_TIMEOUT": "17"}
        )
        resolved = opener.resolve("s3://bucket/a.tif")
        with opener.env(resolved):  # the calling thread: entered and left as before
            assert rasterio.env.getenv()["GDAL_HTTP_TIMEOUT"] == "17"
        assert not rasterio.env.hasenv() or "GDAL_HTTP_TIMEOUT" not in rasterio.env.getenv()

        def enter_then_leave() -> bool:
            with opener.env(resolved):
                pass
            geo_io.leave_lane_env()
            return rasterio.env.hasenv()

        assert geo_io.run_remote(enter_then_leave) is False

    def test_switched_off_enters_per_block(self, monkeypatch):
        monkeypatch.setattr(geo_io, "LANE_ENV", False)
        opener = RasterOpener(
            {"endpoint_url": "http://127.0.0.1:1", "key": "k", "secret": "s"}, gdal_options={"GDAL_HTTP_TIMEOUT": "17"}
        )
        seen = _options_seen(opener, "s3://bucket/a.tif")
        assert seen["inside"]["GDAL_HTTP_TIMEOUT"] == "17"
        assert "GDAL_HTTP_TIMEOUT" not in seen["after"]

    def test_local_files_enter_nothing(self, tmp_path):
        opener = RasterOpener()
        seen = _options_seen(opener, str(tmp_path / "a.tif"))
        assert seen["inside"] == seen["after"] == {}


def _patch(ds: RasterDataset) -> BoundingBox:
    b = ds.bounds
    return BoundingBox(b.minx + 10, b.minx + 10 + 64 * ds.res[0], b.maxy - 10 - 64 * ds.res[1], b.maxy - 10)


@pytest.mark.s3
class TestLaneEnvOnS3:
    def test_same_pixels_and_each_dataset_reads_with_its_own_credentials(self, s3_server, data_dir):
        good_bucket, bad_bucket = s3_server.create_bucket(), s3_server.create_bucket()
        for bucket in (good_bucket, bad_bucket):
            s3_server.fs().put(str(data_dir / "cogeo.tif"), f"{bucket}/cogs/cogeo.tif")
        local = RasterDataset(data_dir / "cogeo.tif")
        q = _patch(local)
        good = RasterDataset(f"s3://{good_bucket}/cogs", storage_options=s3_server.storage_options)
        np.testing.assert_array_equal(good[q]["image"].numpy(), local[q]["image"].numpy())
        # a dataset with a wrong secret, read on the same I/O threads right after: the kept environment
        # (with good credentials) must not sign its requests
        wrong = RasterOpener({**s3_server.storage_options, "secret": "not-the-secret"})
        url = f"s3://{bad_bucket}/cogs/cogeo.tif"
        opened = geo_io.run_remote(lambda: _try_open(wrong, url))
        assert isinstance(opened, ReadError) and url in str(opened)
        # and the good dataset reads again (the environment switched back), equal to local disk
        b = local.bounds
        corner = BoundingBox(b.maxx - 30, b.maxx, b.miny, b.miny + 30)
        np.testing.assert_array_equal(good[corner]["image"].numpy(), local[corner]["image"].numpy())

    def test_switched_off_reads_the_same_pixels(self, s3_server, data_dir, monkeypatch):
        bucket = s3_server.create_bucket()
        s3_server.fs().put(str(data_dir / "cogeo.tif"), f"{bucket}/cogs/cogeo.tif")
        local = RasterDataset(data_dir / "cogeo.tif")
        q = _patch(local)
        ds = RasterDataset(f"s3://{bucket}/cogs", storage_options=s3_server.storage_options)
        kept = ds[q]["image"].numpy()
        geo_io.run_parts(lambda k: (geo_io.close_cached_handles(), geo_io.leave_lane_env()), geo_io.REMOTE_IO_THREADS)
        monkeypatch.setattr(geo_io, "LANE_ENV", False)
        np.testing.assert_array_equal(ds[q]["image"].numpy(), kept)
        np.testing.assert_array_equal(kept, local[q]["image"].numpy())


def _try_open(opener: RasterOpener, url: str) -> object:
    try:
        handle = geo_io.open_handle(opener, url, "test")
    except ReadError as exc:
        return exc
    handle.close()
    return handle
