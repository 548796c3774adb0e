"""``pipekit.geo.io.opener``: how a URL is opened (local, GDAL's /vsis3/ or /vsicurl/, fsspec); its GDAL environment."""

from __future__ import annotations

import logging
import os
import pickle
import re
import threading

import numpy as np
import pytest
import rasterio.env

from pipekit.datasets import RasterDataset
from pipekit.geo import BoundingBox
from pipekit.geo.io import RasterOpener
from pipekit.geo.io.opener import set_env_policy


class TestRasterOpener:
    def test_local_paths(self, tmp_path):
        opener = RasterOpener()
        assert opener.resolve(str(tmp_path / "a.tif")).kind == "local"
        resolved = opener.resolve(f"file://{tmp_path}/a.tif")
        assert (resolved.kind, resolved.path) == ("local", f"{tmp_path}/a.tif")

    def test_s3_with_s3fs_options_goes_to_vsis3(self):
        opener = RasterOpener({
            "key": "AK",
            "secret": "SK",
            "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000", "region_name": "eu-west-1"},
        })
        resolved = opener.resolve("s3://bucket/dir/scene.tif")
        assert resolved.kind == "vsi" and resolved.path == "/vsis3/bucket/dir/scene.tif"
        assert resolved.config["AWS_S3_ENDPOINT"] == "127.0.0.1:9000"
        assert resolved.config["AWS_HTTPS"] == "NO"
        assert resolved.config["AWS_VIRTUAL_HOSTING"] == "FALSE"
        assert resolved.config["AWS_REGION"] == "eu-west-1"
        assert resolved.config["GDAL_DISABLE_READDIR_ON_OPEN"] == "EMPTY_DIR"
        assert resolved.credentials == {"AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK"}
        anonymous = RasterOpener({"anon": True}).resolve("s3://bucket/a.tif")
        assert anonymous.config["AWS_NO_SIGN_REQUEST"] == "YES" and anonymous.credentials == {}
        assert RasterOpener({"endpoint_url": "https://s3.example.com"}).resolve("s3://b/a.tif").config[
            "AWS_HTTPS"] == "YES"

    def test_everything_else_goes_through_fsspec(self):
        opener = RasterOpener()
        assert opener.resolve("memory://bucket/a.tif").kind == "fsspec"
        assert opener.resolve("https://example.com/a.tif").path == "/vsicurl/https://example.com/a.tif"
        assert RasterOpener({"headers": {"x": "y"}}).resolve("https://example.com/a.tif").kind == "fsspec"
        # options GDAL cannot express, or vsi=False
        assert RasterOpener({"key": "k", "config_kwargs": {"x": 1}}).resolve("s3://b/a.tif").kind == "fsspec"
        assert RasterOpener({"key": "k"}, vsi=False).resolve("s3://b/a.tif").kind == "fsspec"
        with pytest.raises(ValueError, match="vsi=True"):
            RasterOpener(vsi=True).resolve("memory://bucket/a.tif")

    def test_validation_pickling_and_repr(self):
        with pytest.raises(TypeError, match="storage_options"):
            RasterOpener(["key"])
        with pytest.raises(TypeError, match="vsi"):
            RasterOpener(vsi="yes")
        opener = RasterOpener({"key": "k", "secret": "hidden"}, gdal_options={"GDAL_HTTP_TIMEOUT": 5})
        assert "hidden" not in repr(opener)
        clone = pickle.loads(pickle.dumps(opener))
        assert clone == opener and hash(clone) == hash(opener)
        assert clone.resolve("s3://b/a.tif").config["GDAL_HTTP_TIMEOUT"] == 5


def _in_a_thread(fn):
    """``fn()`` on a fresh thread (whose environment policy nobody set), its result or error."""
    out: dict = {}

    def run() -> None:
        try:
            out["result"] = fn()
        except BaseException as exc:  # raised below, in the test's thread
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    if "error" in out:
        raise out["error"]
    return out["result"]


def _timeout_opener(seconds: str = "17") -> RasterOpener:
    return RasterOpener(
        {"endpoint_url": "http://127.0.0.1:1", "key": "k", "secret": "s"}, gdal_options={"GDAL_HTTP_TIMEOUT": seconds}
    )


def _options() -> dict:
    return dict(rasterio.env.getenv()) if rasterio.env.hasenv() else {}


class TestEnv:
    """``RasterOpener.env``: the remote file's GDAL environment, kept entered as long as the thread's policy says."""

    def test_new_env_carries_the_options_and_credentials_and_is_not_entered(self):
        resolved = _timeout_opener().resolve("s3://bucket/a.tif")
        env = _timeout_opener().new_env(resolved)
        assert not rasterio.env.hasenv()
        with env:
            inside = _options()
        assert inside["GDAL_HTTP_TIMEOUT"] == "17" and inside["AWS_S3_ENDPOINT"] == "127.0.0.1:1"
        assert inside["AWS_ACCESS_KEY_ID"] == "k" and inside["AWS_SECRET_ACCESS_KEY"] == "s"
        assert not rasterio.env.hasenv()

    def test_without_a_policy_entered_and_left_around_the_block(self):
        def probe() -> tuple[dict, dict]:
            a = _timeout_opener()
            with a.env(a.resolve("s3://bucket/a.tif")):
                inside = _options()
            return inside, _options()

        inside, after = _in_a_thread(probe)
        assert inside["GDAL_HTTP_TIMEOUT"] == "17"
        assert "GDAL_HTTP_TIMEOUT" not in after

    def test_the_threads_policy_decides_and_only_for_remote_files(self, tmp_path):
        def probe() -> list:
            calls: list = []

            def policy(resolved, make):
                calls.append(resolved.path)
                return make(resolved)

            set_env_policy(policy)
            try:
                a = _timeout_opener()
                with a.env(a.resolve("s3://bucket/a.tif")):
                    inside = _options()
                with a.env(a.resolve(str(tmp_path / "local.tif"))):
                    pass
            finally:
                set_env_policy(None)
            return [calls, inside]

        calls, inside = _in_a_thread(probe)
        assert calls == ["/vsis3/bucket/a.tif"]  # a local file enters nothing, whatever the policy
        assert inside["GDAL_HTTP_TIMEOUT"] == "17"
        # another thread's policy is not this one's
        a = _timeout_opener()
        with a.env(a.resolve("s3://bucket/a.tif")):
            pass
        assert "GDAL_HTTP_TIMEOUT" not in _options()


def _cog_patch(ds):
    b = ds.bounds
    return BoundingBox(b.minx + 10, b.minx + 10 + 64 * ds.res[0], b.maxy - 10 - 64 * ds.res[1], b.maxy - 10)


@pytest.mark.s3
class TestS3:
    def _upload(self, s3_server, data_dir) -> str:
        bucket = s3_server.create_bucket()
        s3_server.fs().put(str(data_dir / "cogeo.tif"), f"{bucket}/cogs/cogeo.tif")
        return bucket

    def test_gdal_vsis3_reads_windows_by_range(self, s3_server, data_dir, caplog):
        bucket = self._upload(s3_server, data_dir)
        local = RasterDataset(data_dir / "cogeo.tif")
        ds = RasterDataset(f"s3://{bucket}/cogs", storage_options=s3_server.storage_options,
                           gdal_options={"CPL_DEBUG": "ON"})
        assert ds.files == [f"s3://{bucket}/cogs/cogeo.tif"]
        assert ds._opener.resolve(ds.files[0]).kind == "vsi"
        q = _cog_patch(local)
        with caplog.at_level(logging.DEBUG, logger="rasterio"):
            got = ds[q]["image"].numpy()
        np.testing.assert_array_equal(got, local[q]["image"].numpy())
        ranges = [tuple(map(int, m)) for m in re.findall(r"Downloading (\d+)-(\d+)", caplog.text)]
        assert ranges, "GDAL made no range request"
        size = os.path.getsize(data_dir / "cogeo.tif")
        assert sum(end - start + 1 for start, end in ranges) < size / 2
        # the bottom-right corner too, through the same cached handle
        b = local.bounds
        corner = BoundingBox(b.maxx - 30, b.maxx, b.miny, b.miny + 30)
        np.testing.assert_array_equal(ds[corner]["image"].numpy(), local[corner]["image"].numpy())

    def test_fsspec_opener_reads_windows_by_range(self, s3_server, data_dir, monkeypatch):
        import s3fs.core

        bucket = self._upload(s3_server, data_dir)
        local = RasterDataset(data_dir / "cogeo.tif")
        ds = RasterDataset(f"s3://{bucket}/cogs", storage_options=s3_server.storage_options, vsi=False)
        assert ds._opener.resolve(ds.files[0]).kind == "fsspec"
        fetched: list[tuple[int, int]] = []
        original = s3fs.core.S3File._fetch_range

        def record(self, start, end):
            fetched.append((start, end))
            return original(self, start, end)

        monkeypatch.setattr(s3fs.core.S3File, "_fetch_range", record)
        q = _cog_patch(local)
        np.testing.assert_array_equal(ds[q]["image"].numpy(), local[q]["image"].numpy())
        size = os.path.getsize(data_dir / "cogeo.tif")
        assert fetched and sum(end - start for start, end in fetched) < size * 0.75
        assert any(start > 0 for start, _ in fetched)

    def test_s3_dataset_in_dataloader_workers(self, s3_server, data_dir):
        from torch.utils.data import DataLoader

        bucket = self._upload(s3_server, data_dir)
        local = RasterDataset(data_dir / "cogeo.tif")
        ds = RasterDataset(f"s3://{bucket}/cogs", storage_options=s3_server.storage_options)
        b = local.bounds
        step = 128 * local.res[0]
        boxes = [BoundingBox(b.minx + i * step, b.minx + (i + 1) * step, b.maxy - (j + 1) * step, b.maxy - j * step)
                 for i in range(4) for j in range(2)]
        # the parent reads first: its network connections must not leak into the forked workers
        np.testing.assert_array_equal(ds[boxes[0]]["image"].numpy(), local[boxes[0]]["image"].numpy())
        loader = DataLoader(ds, batch_size=None, sampler=boxes, num_workers=2)
        for q, sample in zip(boxes, loader):
            np.testing.assert_array_equal(sample["image"].numpy(), local[q]["image"].numpy())

    def test_missing_prefix_is_reported(self, s3_server):
        bucket = s3_server.create_bucket()
        with pytest.raises(FileNotFoundError, match=f"s3://{bucket}/nothing"):
            RasterDataset(f"s3://{bucket}/nothing", storage_options=s3_server.storage_options)
