"""S3 outages survived, failures named (issue 13, item 5), against a real SeaweedFS server that is
killed and started again mid-epoch (on the same port and data folder).

The storage options ask botocore for one attempt per request, so pipekit's own retry layer (and
not botocore's) is what carries the reads through the outage; the tests check it retried.
"""

from __future__ import annotations

import contextlib
import logging
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import pipekit
from pipekit import datasets
from pipekit.errors import ReadError
from pipekit.pipes import IterableWrapper
from pipekit.retry import RetryPolicy
from pipekit.synthetic import write_image_shards

pytestmark = [pytest.mark.s3, pytest.mark.slow]

SHARDS, PER_SHARD = 4, 6
OUTAGE = 4.0  # seconds
POLICY = RetryPolicy(attempts=60, max_seconds=60, base_delay=0.2, max_delay=1.0)


def _options(server: Any) -> dict[str, Any]:
    return {**server.storage_options, "config_kwargs": {"retries": {"max_attempts": 1, "mode": "standard"}},
            "skip_instance_cache": True}


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("outage-shards")
    write_image_shards(root, shards=SHARDS, per_shard=PER_SHARD, size=48, progress=False)
    return root


@pytest.fixture
def bucket(restartable_s3_server: Any, shards: Path) -> str:
    server = restartable_s3_server
    if not server.alive():  # a failed test left it down
        server.start_again()
    name = server.create_bucket()
    fs = server.fs()
    for s in range(SHARDS):
        fs.put(str(shards / f"shard-{s:06d}.tar"), f"{name}/train/shard-{s:06d}.tar")
    return name


def _members(shards: Path) -> list[tuple[str, bytes]]:
    out = []
    for s in range(SHARDS):
        with tarfile.open(shards / f"shard-{s:06d}.tar") as tar:
            out += [(f"shard-{s:06d}.tar/{m.name}", tar.extractfile(m).read()) for m in tar if m.isfile()]
    return out


class _Restart:
    """Kill the server now and start it again in ``outage`` seconds, on another thread.

    With ``seen_by_this_process``, the outage is timed from the first retry this process logs (at most 60 s after
    the kill), not from the kill: a reader held up (a long garbage collection, a loaded machine) still meets it.
    """

    def __init__(self, server: Any, outage: float, seen_by_this_process: bool = False) -> None:
        self.error: BaseException | None = None
        self.seen = threading.Event()
        if not seen_by_this_process:
            self.seen.set()
        self.handler = _OnRecord(self.seen)
        logging.getLogger("pipekit.retry").addHandler(self.handler)
        server.kill()
        self.thread = threading.Thread(target=self._run, args=(server, outage), daemon=True)
        self.thread.start()

    def _run(self, server: Any, outage: float) -> None:
        try:
            self.seen.wait(timeout=60)
            time.sleep(outage)
            server.start_again()
        except BaseException as exc:  # re-raised by join()
            self.error = exc
        finally:
            logging.getLogger("pipekit.retry").removeHandler(self.handler)

    def join(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise self.error


@contextlib.contextmanager
def _restarts() -> Iterator[list[_Restart]]:
    """Restarts started inside are joined on the way out; a restart that failed is the error reported."""
    started: list[_Restart] = []
    try:
        yield started
    except BaseException:
        for restart in started:
            restart.join()
        raise
    for restart in started:
        restart.join()


class _OnRecord(logging.Handler):
    """Sets ``event`` on any record it handles."""

    def __init__(self, event: threading.Event) -> None:
        super().__init__(logging.WARNING)
        self.event = event

    def emit(self, record: logging.LogRecord) -> None:
        self.event.set()


def _restart_later(server: Any, outage: float, seen_by_this_process: bool = False) -> _Restart:
    return _Restart(server, outage, seen_by_this_process)


def test_tar_members_through_an_outage_0_workers(restartable_s3_server, bucket, shards, caplog):
    """A shard read mid-member when the server dies continues at the byte it reached: nothing lost or repeated."""
    server = restartable_s3_server
    urls = [server.url(bucket, f"train/shard-{s:06d}.tar") for s in range(SHARDS)]
    pipe = IterableWrapper(urls).open_files_by_fsspec(
        mode="rb", kwargs_for_open={"block_size": 4096}, retry=POLICY, **_options(server)).load_from_tar()
    got = []
    with caplog.at_level(logging.WARNING, logger="pipekit.retry"), _restarts() as restarts:
        for url, stream in pipe:
            if len(got) == 3:
                restarts.append(_restart_later(server, OUTAGE, seen_by_this_process=True))
            got.append((url.split("/train/", 1)[1], stream.read()))
    assert got == _members(shards)
    retries = [r.getMessage() for r in caplog.records if r.name == "pipekit.retry"]
    assert retries and all("s3://" in m for m in retries)


@pytest.mark.parametrize("workers", [0, 2])
def test_tar_shards_dataset_through_an_outage(restartable_s3_server, bucket, shards, workers, monkeypatch):
    """datasets.TarShards through a DataLoader: every sample exactly once across a restart."""
    server = restartable_s3_server
    monkeypatch.setenv("PIPEKIT_RETRY_SECONDS", "60")
    ds = datasets.TarShards(f"s3://{bucket}/train/shard-{{000000..000003}}.tar", batch_size=1, shuffle_buffer=4,
                            storage_options=_options(server))
    torch.manual_seed(0)
    keys, killed_at, finished = [], 0.0, 0.0
    with _restarts() as restarts:
        for batch in pipekit.DataLoader(ds, num_workers=workers):
            if not restarts:
                killed_at = time.monotonic()
                restarts.append(_restart_later(server, OUTAGE))
            keys += batch["__key__"]
        finished = time.monotonic()
    assert finished - killed_at >= OUTAGE  # samples were still being read when the server came back
    assert len(keys) == SHARDS * PER_SHARD == len(set(keys))


def test_permanent_outage_names_url_stage_and_attempts(restartable_s3_server, bucket):
    server = restartable_s3_server
    url = server.url(bucket, "train/shard-000000.tar")
    policy = RetryPolicy(attempts=3, max_seconds=20, base_delay=0.1, max_delay=0.2)
    opened = next(iter(IterableWrapper([url]).open_files_by_fsspec(
        mode="rb", kwargs_for_open={"block_size": 4096}, retry=policy, **_options(server))))[1]
    opened.read(100)
    server.kill()
    try:
        start = time.monotonic()
        with pytest.raises(ReadError) as info:
            opened.read()
        assert time.monotonic() - start < 20
        err = info.value
        assert (err.url, err.stage, err.action) == (url, "open_files_by_fsspec", "read")
        assert "gave up after 3 attempts" in str(err)
        with pytest.raises(ReadError) as info:
            next(iter(IterableWrapper([url]).open_files_by_fsspec(mode="rb", retry=policy, **_options(server))))
        assert info.value.url == url and "gave up after 3 attempts" in str(info.value)
        root = server.url(bucket, "train")
        with pytest.raises(ReadError) as info:
            list(IterableWrapper([root]).list_files_by_fsspec(retry=policy, **_options(server)))
        assert (info.value.url, info.value.stage) == (root, "list_files_by_fsspec")
        assert "gave up after 3 attempts" in str(info.value)
    finally:
        server.start_again()


def test_missing_object_is_not_retried(restartable_s3_server, bucket, caplog):
    server = restartable_s3_server
    url = server.url(bucket, "train/no-such-shard.tar")
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="pipekit.retry"), pytest.raises(ReadError) as info:
        next(iter(IterableWrapper([url]).open_files_by_fsspec(mode="rb", retry=POLICY, **_options(server))))
    assert time.monotonic() - start < 5
    assert info.value.url == url and "FileNotFoundError" in str(info.value)
    assert not [r for r in caplog.records if r.name == "pipekit.retry"]


def test_two_workers_on_s3_leave_no_asyncio_errors(s3_server, shards, capfd, caplog):
    """Workers forked after the parent used S3 must not touch the parent's aiohttp sessions and loop."""
    name = s3_server.create_bucket()
    fs = s3_server.fs()
    for s in range(SHARDS):
        fs.put(str(shards / f"shard-{s:06d}.tar"), f"{name}/train/shard-{s:06d}.tar")
    ds = datasets.TarShards(f"s3://{name}/train/", batch_size=2, storage_options=s3_server.storage_options)
    for epoch in range(2):
        keys = [k for b in pipekit.DataLoader(ds, num_workers=2, persistent_workers=False) for k in b["__key__"]]
        assert len(keys) == SHARDS * PER_SHARD == len(set(keys)), epoch
    out, err = capfd.readouterr()
    text = out + err + caplog.text
    assert "Task exception was never retrieved" not in text
    assert "attached to a different loop" not in text


COG = Path(__file__).parent / "data" / "cogeo.tif"


def _cog_dataset(server: Any) -> tuple[Any, Any, Any]:
    from pipekit.datasets import RasterDataset
    from pipekit.geo import BoundingBox

    name = server.create_bucket()
    server.fs().put(str(COG), f"{name}/cogs/cogeo.tif")
    local = RasterDataset(COG)
    ds = RasterDataset(f"s3://{name}/cogs", storage_options=server.storage_options)
    b = local.bounds
    query = BoundingBox(b.minx + 10, b.minx + 10 + 64 * local.res[0], b.maxy - 10 - 64 * local.res[1], b.maxy - 10)
    return ds, local, query


def test_cog_opened_through_an_outage(restartable_s3_server, monkeypatch):
    """A COG on S3 (GDAL /vsis3/) opened while the server restarts: retried, the right pixels."""
    import numpy as np

    server = restartable_s3_server
    if not server.alive():
        server.start_again()
    monkeypatch.setenv("PIPEKIT_RETRY_SECONDS", "60")
    ds, local, query = _cog_dataset(server)
    with _restarts() as restarts:
        restarts.append(_restart_later(server, OUTAGE))
        got = ds[query]["image"].numpy()
    np.testing.assert_array_equal(got, local[query]["image"].numpy())


def test_cog_permanent_outage_names_the_s3_url(restartable_s3_server, monkeypatch):
    """A window read that fails for good names the s3:// URL (not GDAL's /vsis3/ path) and the stage."""
    server = restartable_s3_server
    if not server.alive():
        server.start_again()
    ds, _, query = _cog_dataset(server)
    monkeypatch.setenv("PIPEKIT_RETRY_ATTEMPTS", "2")
    server.kill()
    try:
        # a window read through a handle opened before the outage: GDAL's retries, then the s3:// URL named
        with pytest.raises(ReadError) as info:
            ds[query]
        assert (info.value.url, info.value.stage) == (ds.files[0], "RasterDataset")
        assert "gave up after 2 attempts" in str(info.value)  # pipekit's retries, after GDAL's own
    finally:
        server.start_again()


def _child_uses_s3(options: dict[str, Any], bucket: str) -> None:
    import gc
    import sys

    import fsspec
    from fsspec.asyn import get_loop, sync

    # asyncio reports a failed task through its logger; pytest's capture would swallow it in a child
    reports: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: reports.append(record.getMessage() + str(record.exc_info))  # type: ignore[method-assign]
    logging.getLogger("asyncio").addHandler(handler)

    fs, _ = fsspec.core.url_to_fs(f"s3://{bucket}", **options)  # fsspec drops the inherited instances

    async def collect() -> None:
        gc.collect()  # garbage collection while the child's own fsspec loop runs, as in a worker

    sync(get_loop(), collect)
    assert fs.cat(f"{bucket}/x") == b"1"
    time.sleep(0.3)  # let a stray task fail and report before the process ends
    sync(get_loop(), collect)  # a task that failed is reported when it is collected
    reports = [r for r in reports if "different loop" in r or "never retrieved" in r]
    if reports:
        print("\n".join(reports), file=sys.__stderr__, flush=True)
        sys.exit(3)


def test_forked_child_leaves_the_parents_s3_session_alone(s3_server, capfd):
    """The cause of "Task exception was never retrieved ... attached to a different loop" with workers:
    the parent's cached s3fs instance, dropped and finalized in the child, closed the parent's aiohttp
    session on the child's loop."""
    import gc
    import multiprocessing

    import fsspec
    import s3fs

    import pipekit.pipes._fsspec_io  # noqa: F401 - registers the fork handler

    name = s3_server.create_bucket()
    fs, _ = fsspec.core.url_to_fs(f"s3://{name}", **s3_server.storage_options)
    fs.pipe(f"{name}/x", b"1")
    gc.disable()  # an instance with a live session that is garbage, not yet collected, when the child forks
    try:
        garbage = s3fs.S3FileSystem(**s3_server.storage_options, skip_instance_cache=True)
        garbage.ls(name)
        garbage.self_reference = garbage  # a cycle: only the cycle collector frees it
        del garbage
        child = multiprocessing.get_context("fork").Process(
            target=_child_uses_s3, args=(s3_server.storage_options, name))
        child.start()
    finally:
        gc.enable()
    child.join(60)
    assert child.exitcode == 0, "the child reported asyncio errors (exit code 3) or failed"
    out, err = capfd.readouterr()
    assert "attached to a different loop" not in out + err
    assert "Task exception was never retrieved" not in out + err


# -- COG window reads through an outage longer than GDAL's own HTTP retries (issue 13, item 1) --------

L8_SCENE = "LC08_L2SP_026031_20210701_20210708_02_T1"
L8_BANDS = ["SR_B2", "SR_B3", "SR_B4"]
LONG_OUTAGE = 10.0  # seconds: GDAL's own retries (3, from 0.5 s doubling) give up after ~3.5 s


@pytest.fixture(scope="module")
def landsat_scene(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Landsat 8 scene of uncompressed 64-pixel tiles of noise: windows read after the outage are not cached."""
    import numpy as np
    import rasterio
    from affine import Affine

    root = tmp_path_factory.mktemp("outage-landsat") / L8_SCENE
    root.mkdir()
    rng = np.random.default_rng(0)
    transform = Affine(30.0, 0.0, 399_990.0, 0.0, -30.0, 4_650_030.0)
    for band in L8_BANDS:
        with rasterio.open(root / f"{L8_SCENE}_{band}.TIF", "w", driver="GTiff", width=512, height=512, count=1,
                           dtype="uint16", crs="EPSG:32615", transform=transform, nodata=0, tiled=True,
                           blockxsize=64, blockysize=64) as f:
            f.write(rng.integers(1, 60_000, (1, 512, 512), dtype=np.uint16))
    return root


def _landsat_samples(ds: Any, workers: int, on_sample: Any = None) -> list[tuple[str, bytes]]:
    from pipekit.geo import RandomGeoSampler

    torch.manual_seed(0)
    sampler = RandomGeoSampler(ds, size=32, length=40)
    got = []
    for sample in pipekit.DataLoader(ds, batch_size=None, sampler=sampler, num_workers=workers):
        if on_sample is not None:
            on_sample()
        got.append((repr(sample["bounds"]), sample["image"].numpy().tobytes()))
    return got


@pytest.mark.parametrize("outage", [LONG_OUTAGE, 25.0], ids=["10s", "25s-default-budget"])
def test_cog_window_reads_through_a_long_outage_2_workers(restartable_s3_server, landsat_scene, monkeypatch,
                                                          outage):
    """Landsat8 on S3 + RandomGeoSampler + 2 workers: the server is down longer than GDAL retries (10 s;
    25 s under the default budget), and every sample still arrives exactly once, as in an uninterrupted run."""
    from pipekit.datasets import Landsat8

    server = restartable_s3_server
    if not server.alive():
        server.start_again()
    monkeypatch.delenv("PIPEKIT_RETRY_ATTEMPTS", raising=False)
    if outage == LONG_OUTAGE:
        monkeypatch.setenv("PIPEKIT_RETRY_SECONDS", "90")
    else:  # item 2: the default budget (10 attempts, 120 s) outlasts a ~25 s restart
        monkeypatch.delenv("PIPEKIT_RETRY_SECONDS", raising=False)
    name = server.create_bucket()
    server.fs().put(str(landsat_scene), f"{name}/l8/", recursive=True)
    ds = Landsat8(paths=f"s3://{name}/l8", bands=L8_BANDS, storage_options=server.storage_options)
    assert len(ds.files) == 1
    expected = _landsat_samples(ds, 2)
    assert len(expected) == 40 == len(set(expected))

    ds = Landsat8(paths=f"s3://{name}/l8", bands=L8_BANDS, storage_options=server.storage_options)
    killed_at = []
    with _restarts() as restarts:
        def kill_once() -> None:
            if not restarts:
                killed_at.append(time.monotonic())
                restarts.append(_restart_later(server, outage))

        got = _landsat_samples(ds, 2, kill_once)
        finished = time.monotonic()
    assert finished - killed_at[0] >= outage  # samples were still being read when the server came back
    assert [b for b, _ in got] == [b for b, _ in expected]
    assert got == expected  # every sample exactly once, the same pixels


def test_corrupt_cog_on_s3_is_not_retried_for_long(restartable_s3_server, caplog):
    """A remote file that is broken (not the server): tried once more at most, then skipped and counted."""
    from pipekit.datasets import RasterDataset
    from pipekit.errors import SkippedReadError
    from pipekit.geo import BoundingBox

    server = restartable_s3_server
    if not server.alive():
        server.start_again()
    name = server.create_bucket()
    server.fs().put(str(Path(__file__).parent / "data" / "corrupt.tif"), f"{name}/c/corrupt.tif")
    ds = RasterDataset(f"s3://{name}/c", storage_options=server.storage_options, on_error="skip")
    b = ds.bounds
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="pipekit.retry"), pytest.raises(SkippedReadError) as info:
        ds[BoundingBox(b.maxx - 100, b.maxx, b.miny, b.miny + 100)]  # the tile that cannot be decoded
    assert time.monotonic() - start < 10
    assert info.value.url == ds.files[0] and ds.skip_log.count == 1
    assert len([r for r in caplog.records if r.name == "pipekit.retry"]) <= 1
