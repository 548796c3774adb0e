"""pipekit._fast: every registered fast path gives what its reference path gives, on the pipeline it speeds up.

Each comparison runs one real pipeline twice, the fast path on and off, and compares the outputs exactly. A fast
path registered without a comparison here fails ``test_every_fast_path_is_compared``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from pipekit import _fast

COMPARED: set[str] = set()


def compares(*names: str) -> Any:
    COMPARED.update(names)
    return lambda fn: fn


def _both_ways(name: str, run: Any) -> tuple[Any, Any]:
    assert _fast.enabled(name)
    fast = run()
    with _fast.disabled(name):
        assert not _fast.enabled(name)
        reference = run()
    assert _fast.enabled(name)
    return fast, reference


def _assert_same(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b, err_msg=where)
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


# -- images ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    from pipekit.synthetic.images import write_image_shards

    return write_image_shards(tmp_path_factory.mktemp("shards"), shards=2, per_shard=12, size=48, progress=False)


@compares("tar_headers")
def test_tar_headers(shards):
    from pipekit.pipes import IterableWrapper

    def run() -> list[tuple[str, bytes]]:
        pipe = IterableWrapper([str(s) for s in shards]).open_files_by_fsspec(mode="rb").load_from_tar()
        return [(url.rsplit("/", 1)[1], stream.read()) for url, stream in pipe]

    fast, reference = _both_ways("tar_headers", run)
    assert len(fast) == 48
    assert fast == reference


@compares("direct_image_ops")
def test_direct_image_ops(shards):
    from pipekit import datasets

    def run() -> list[Any]:
        torch.manual_seed(0)
        ds = datasets.TarShards([str(s) for s in shards], size=32, batch_size=8, shuffle_buffer=10)
        return [batch for batch, _ in zip(ds, range(3))]

    fast, reference = _both_ways("direct_image_ops", run)
    assert fast[0][".jpg"].shape == (8, 3, 32, 32)
    _assert_same(fast, reference)


# -- rasters ---------------------------------------------------------------------------------------


@compares("simplejpeg")
def test_simplejpeg(shards):
    pytest.importorskip("simplejpeg")
    from pipekit import datasets

    def run() -> list[Any]:
        torch.manual_seed(0)
        ds = datasets.TarShards([str(s) for s in shards], size=32, batch_size=8, shuffle_buffer=10)
        return [batch for batch, _ in zip(ds, range(3))]

    fast, reference = _both_ways("simplejpeg", run)
    _assert_same(fast, reference)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pipekit.synthetic.geo import write_landsat_cdl_corpus

    return Path(write_landsat_cdl_corpus(tmp_path_factory.mktemp("geo"), size=192, scenes=1, progress=False))


def _samples(dataset: Any, n: int = 6, pixels: int = 40) -> list[Any]:
    from pipekit.samplers import RandomGeoSampler

    return [dataset[q] for q in RandomGeoSampler(dataset, size=pixels, length=n, seed=3)]


@compares("warp")
def test_warp(corpus):
    from pipekit.datasets import CDL, Landsat8

    def run() -> list[Any]:
        from pipekit.geo import close_cached_handles

        close_cached_handles()
        dataset = Landsat8(paths=corpus / "landsat8", bands=["SR_B4"]) & CDL(paths=corpus / "cdl")
        return _samples(dataset)

    fast, reference = _both_ways("warp", run)
    assert fast[0]["mask"].shape == (40, 40)
    _assert_same([s["mask"] for s in fast], [s["mask"] for s in reference])


@compares("geo_batch")
def test_geo_batch(corpus):
    from pipekit import DataLoader
    from pipekit.datasets import CDL, Landsat8
    from pipekit.geo import stack_samples
    from pipekit.samplers import RandomBatchGeoSampler

    def run() -> list[Any]:
        dataset = Landsat8(paths=corpus / "landsat8", bands=["SR_B4", "SR_B3"]) & CDL(paths=corpus / "cdl")
        sampler = RandomBatchGeoSampler(dataset, size=32, batch_size=3, length=6, seed=3)
        return list(DataLoader(dataset, batch_sampler=sampler, collate_fn=stack_samples))

    fast, reference = _both_ways("geo_batch", run)
    assert fast[0]["image"].shape == (3, 2, 32, 32)
    _assert_same([{k: b[k] for k in ("image", "mask")} for b in fast],
                 [{k: b[k] for k in ("image", "mask")} for b in reference])


def _s3_landsat(server: Any, corpus: Path, **kwargs: Any) -> Any:
    from pipekit.datasets import Landsat8

    bucket = server.create_bucket()
    fs = server.fs()
    for path in sorted((corpus / "landsat8").rglob("*.TIF")):
        fs.put_file(str(path), f"{bucket}/{path.relative_to(corpus).as_posix()}")
    return lambda: Landsat8(
        paths=f"s3://{bucket}/landsat8", bands=["SR_B2", "SR_B3", "SR_B4"], storage_options=server.storage_options,
        **kwargs,
    )


def _fresh_remote_handles() -> None:
    from pipekit.geo import io as geo_io

    geo_io.run_parts(lambda k: geo_io.close_cached_handles(), geo_io.REMOTE_IO_THREADS)
    geo_io.close_cached_handles()


@pytest.mark.s3
@compares("concurrent_parts", "lane_env")
@pytest.mark.parametrize("name", ["concurrent_parts", "lane_env"])
def test_remote_reads(s3_server, corpus, name):
    make = _s3_landsat(s3_server, corpus)

    def run() -> list[Any]:
        _fresh_remote_handles()
        return [s["image"] for s in _samples(make())]

    fast, reference = _both_ways(name, run)
    assert fast[0].shape == (3, 40, 40)
    _assert_same(fast, reference)
    _fresh_remote_handles()


@pytest.mark.s3
@compares("fetch", "prefetch_tiles")
@pytest.mark.parametrize("name", ["fetch", "prefetch_tiles"])
def test_range_cache(s3_server, corpus, tmp_path, name):
    runs = iter(range(2))

    def run() -> list[Any]:
        _fresh_remote_handles()  # a new cache folder each way: both fetch everything
        make = _s3_landsat(s3_server, corpus, cache_dir=tmp_path / f"cache{next(runs)}", crs="EPSG:5070")
        return [s["image"] for s in _samples(make())]

    fast, reference = _both_ways(name, run)
    _assert_same(fast, reference)
    _fresh_remote_handles()


def test_every_fast_path_is_compared():
    assert set(_fast.REGISTRY) == COMPARED


def test_the_environment_switch_turns_all_off():
    code = "from pipekit import _fast; print(sorted(n for n in _fast.REGISTRY if _fast.enabled(n)))"
    env = {**os.environ, "PIPEKIT_FAST_PATHS": "off"}
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)\
        .stdout.strip() == "[]"
    env["PIPEKIT_FAST_PATHS"] = "-warp,-fetch"
    on = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert "'warp'" not in on and "'fetch'" not in on and "'tar_headers'" in on


def test_an_unknown_name_is_refused():
    with pytest.raises(ValueError, match="unknown fast path 'warpp'"):
        _fast._from_environment("-warpp")
    with pytest.raises(KeyError, match="unknown fast path"):
        _fast.set_enabled("nope", False)
