"""The geo index at scale (issue 12): headers read in parallel, the index saved to GeoParquet and reloaded,
stale files detected; remote listings retried through an S3 outage (issue 13)."""

from __future__ import annotations

import logging
import os
import pickle
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from affine import Affine

from pipekit.datasets import RasterDataset
from pipekit.errors import GeoReferenceError, ReadError
from pipekit.geo.catalog import DEFAULT_NAME, CachedHeaders, IndexCacheError, read_index
from pipekit.geo.catalog._headers import read_headers

from .conftest import ALBERS, UTM15, write_tif

X0, Y0 = 399_990.0, 4_650_030.0


def _write(root: Path, k: int, crs: str = UTM15, dtype: str = "uint16", nodata: float | None = 0) -> Path:
    t = Affine(30.0, 0.0, X0 + 300.0 * (k % 7), 0.0, -30.0, Y0 - 300.0 * (k // 7))
    if crs == ALBERS:
        t = Affine(30.0, 0.0, 100_000.0 + 300.0 * k, 0.0, -30.0, 2_100_000.0)
    data = (np.arange(16 * 16).reshape(1, 16, 16) % 200 + k).astype(dtype)
    return write_tif(root / f"tile_{k:03d}.tif", data, crs, t, nodata=nodata, compress=None, tiled=False)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "tiles"
    for k in range(30):
        _write(root, k, crs=ALBERS if k % 10 == 3 else UTM15, dtype="uint8" if k % 4 == 1 else "uint16",
               nodata=None if k % 5 == 2 else 0)
    return root


def _same(a: RasterDataset, b: RasterDataset) -> None:
    assert a.files == b.files
    assert a.geo_index == b.geo_index
    assert (a.crs, a.res) == (b.crs, b.res)
    fa, fb = a._files, b._files
    assert [c.to_wkt() for c in fa.crs_list] == [c.to_wkt() for c in fb.crs_list]
    assert fa.dtypes == fb.dtypes
    for name in ("crs_ids", "dtype_ids", "transforms", "shapes", "counts", "has_nodata", "times"):
        np.testing.assert_array_equal(getattr(fa, name), getattr(fb, name), err_msg=name)
    np.testing.assert_array_equal(fa.nodata, fb.nodata)
    assert a.index.equals(b.index)


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files whose headers a dataset build reads (parsed directly or opened with rasterio)."""
    calls: list[str] = []
    real = CachedHeaders._header_or_error

    def counting(self, path, *args, **kwargs):
        calls.append(path)
        return real(self, path, *args, **kwargs)

    monkeypatch.setattr(CachedHeaders, "_header_or_error", counting)
    return calls


class TestParallelHeaders:
    def test_parallel_index_equals_the_serial_one(self, folder):
        serial = RasterDataset(folder, index_workers=1)
        for workers in (2, 8):
            _same(RasterDataset(folder, index_workers=workers), serial)
        assert len(serial.files) == 30 and len(serial._files.crs_list) == 2

    def test_bad_files_reported_in_path_order_whatever_the_threads(self, folder):
        (folder / "tile_005.tif").write_bytes(b"not a tiff")  # unreadable
        write_tif(folder / "tile_017.tif", np.ones((1, 8, 8), "uint8"), None, Affine.identity(),
                  compress=None, tiled=False)  # no CRS
        (folder / "tile_024.tif").write_bytes(b"")
        runs = []
        for workers in (1, 4):
            ds = RasterDataset(folder, on_error="skip", index_workers=workers)
            runs.append((ds.files, ds.geo_index, [(s.url, s.reason) for s in ds.skip_log.skipped]))
            # with on_error="raise", files that are not rasters are left out (with a warning, as TorchGeo leaves
            # them out): the error raised is the first other one, in path order
            with pytest.raises(GeoReferenceError) as info:
                RasterDataset(folder, index_workers=workers)
            assert info.value.url == str(folder / "tile_017.tif")
        assert runs[0][0] == runs[1][0] and runs[0][1] == runs[1][1] and runs[0][2] == runs[1][2]
        assert [Path(u).name for u, _ in runs[0][2]] == ["tile_005.tif", "tile_017.tif", "tile_024.tif"]
        assert len(runs[0][0]) == 27

    def test_an_unplaceable_raster_raises_naming_it_with_threads(self, folder):
        write_tif(folder / "tile_011.tif", np.ones((1, 8, 8), "uint8"), None, Affine.identity(),
                  compress=None, tiled=False)
        with pytest.raises(GeoReferenceError, match=r"tile_011\.tif"):
            RasterDataset(folder, index_workers=4)

    def test_read_headers_keeps_order_and_raises_the_first_error(self):
        def slow_upper(s: str) -> str:
            time.sleep(0.002 * (5 - len(s)))
            if s.startswith("x"):
                raise ValueError(s)
            return s.upper()

        paths = [c * (1 + i % 4) for i, c in enumerate("abcdefghij")] * 20
        assert read_headers(paths, slow_upper, workers=4) == [p.upper() for p in paths]
        with pytest.raises(ValueError, match=r"^xx$"):
            read_headers(["a", "b", "xx", "c", "x"], slow_upper, workers=3)

    def test_progress_bar_only_when_asked_or_large(self, folder, capsys):
        RasterDataset(folder)
        assert "reading headers" not in capsys.readouterr().err
        RasterDataset(folder, progress=True)
        assert "RasterDataset: reading headers" in capsys.readouterr().err

    def test_bad_arguments(self, folder):
        with pytest.raises(ValueError, match="index_workers"):
            RasterDataset(folder, index_workers=0)
        with pytest.raises(TypeError, match="index_workers"):
            RasterDataset(folder, index_workers=2.5)
        with pytest.raises(TypeError, match="index_cache"):
            RasterDataset(folder, index_cache=3)
        with pytest.raises(ValueError, match="one folder"):
            RasterDataset([folder / "tile_000.tif", folder / "tile_001.tif"], index_cache=True)


class TestSavedIndex:
    def test_round_trip_opens_no_file(self, folder, tmp_path, opened):
        built = RasterDataset(folder)
        where = built.save_index(tmp_path / "saved.parquet")
        assert where == str(tmp_path / "saved.parquet")
        opened.clear()
        loaded = RasterDataset(folder, index_cache=where)
        assert opened == []
        _same(loaded, built)
        # a real GeoParquet file: footprints in the dataset CRS
        import geopandas

        frame = geopandas.read_parquet(where)
        assert len(frame) == 30 and frame.crs.equals(built.crs.to_wkt())
        np.testing.assert_allclose(np.sort(frame.total_bounds), np.sort(np.asarray(built.index.total_bounds)))

    def test_next_to_the_data(self, folder, opened):
        first = RasterDataset(folder, index_cache=True)
        assert (folder / DEFAULT_NAME).is_file() and len(opened) == 30
        opened.clear()
        again = RasterDataset(folder, index_cache=True)
        assert opened == [] and str(folder / DEFAULT_NAME) not in again.files
        _same(again, first)

    def test_changed_added_and_removed_files_are_detected(self, folder, opened):
        RasterDataset(folder, index_cache=True)
        touched = _write(folder, 4, dtype="uint16", nodata=7)  # rewritten: other pixels, nodata 7
        st = os.stat(touched)
        os.utime(touched, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
        _write(folder, 30)
        (folder / "tile_012.tif").unlink()
        opened.clear()
        with_cache = RasterDataset(folder, index_cache=True)
        assert sorted(Path(p).name for p in opened) == ["tile_004.tif", "tile_030.tif"]
        fresh = RasterDataset(folder)
        _same(with_cache, fresh)
        assert with_cache._files.file_nodata(with_cache.files.index(str(touched))) == 7.0
        assert str(folder / "tile_012.tif") not in with_cache.files
        saved = read_index(str(folder / DEFAULT_NAME))
        assert len(saved) == 30 and str(folder / "tile_012.tif") not in saved.rows
        opened.clear()
        RasterDataset(folder, index_cache=True)
        assert opened == []

    def test_same_size_same_second_touch_is_detected(self, folder, opened):
        """Only the mtime changes (nanoseconds): the file is read again."""
        RasterDataset(folder, index_cache=True)
        path = folder / "tile_009.tif"
        st = os.stat(path)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
        opened.clear()
        RasterDataset(folder, index_cache=True)
        assert [Path(p).name for p in opened] == ["tile_009.tif"]

    @pytest.mark.parametrize("content", [b"garbage, not parquet", b"PAR1" + b"\0" * 40 + b"PAR1", b""])
    def test_corrupt_cache_warns_and_rebuilds(self, folder, content, opened):
        expected = RasterDataset(folder)
        (folder / DEFAULT_NAME).write_bytes(content)
        opened.clear()
        with pytest.warns(UserWarning, match=f"{DEFAULT_NAME}.*(not a readable GeoParquet index|corrupt)"):
            ds = RasterDataset(folder, index_cache=True)
        assert len(opened) == 30
        _same(ds, expected)
        opened.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            RasterDataset(folder, index_cache=True)  # rewritten: valid again
        assert opened == []

    def test_another_parquet_file_is_not_taken_for_an_index(self, folder, tmp_path):
        import pandas as pd

        other = tmp_path / "other.parquet"
        pd.DataFrame({"filepath": ["a"], "size": [1]}).to_parquet(other)
        with pytest.raises(IndexCacheError, match=r"not a readable GeoParquet index|not a pipekit raster index"):
            read_index(str(other))
        with pytest.warns(UserWarning, match="other.parquet"):
            RasterDataset(folder, index_cache=other)

    def test_tampered_rows_are_refused(self, folder, tmp_path):
        import pyarrow as pa
        import pyarrow.parquet as pq

        where = RasterDataset(folder).save_index(tmp_path / "i.parquet")
        table = pq.read_table(where)
        i = table.schema.get_field_index("width")
        table = table.set_column(i, "width", pa.array(np.zeros(table.num_rows, dtype=np.int64)))
        pq.write_table(table, where)
        with pytest.raises(IndexCacheError, match="corrupt"):
            read_index(where)

    def test_pickles_without_the_fingerprints(self, folder):
        ds = RasterDataset(folder, index_cache=True)
        plain = RasterDataset(folder)
        copy = pickle.loads(pickle.dumps(ds))
        assert copy._cached_headers.record is None and ds._cached_headers.record is not None
        query = ds.geo_index[0]
        np.testing.assert_array_equal(copy[query]["image"].numpy(), plain[query]["image"].numpy())
        assert len(pickle.dumps(ds)) < 1.2 * len(pickle.dumps(plain))
        with pytest.raises(RuntimeError, match="unpickled"):
            copy.save_index()

    def test_separate_files_landsat_reloads_equal(self, tmp_path, opened):
        from datetime import date

        from pipekit.datasets import Landsat8
        from pipekit.synthetic.geo import landsat_scene_id, write_landsat_scene

        for k in range(3):
            scene = landsat_scene_id("LC08", "026031", date(2023, 7, 1 + 8 * k))
            write_landsat_scene(tmp_path / "l8", scene, (X0 + 3000 * k, Y0), size=32, seed=k)
        first = Landsat8(tmp_path / "l8", index_cache=True)
        opened.clear()
        again = Landsat8(tmp_path / "l8", index_cache=True)
        assert opened == []
        _same(again, first)
        query = again.bounds
        np.testing.assert_array_equal(again[query]["image"].numpy(), first[query]["image"].numpy())


def _upload(server, folder: Path, names: list[str], prefix: str = "tiles") -> str:
    bucket = server.create_bucket()
    fs = server.fs()
    for name in names:
        fs.put(str(folder / name), f"{bucket}/{prefix}/{name}")
    return f"s3://{bucket}/{prefix}"


@pytest.mark.s3
class TestS3Root:
    def test_saved_next_to_the_data_on_s3_and_reloaded(self, s3_server, folder, opened):
        names = [f"tile_{k:03d}.tif" for k in range(6)]
        root = _upload(s3_server, folder, names)
        options = s3_server.storage_options
        first = RasterDataset(root, storage_options=options, index_cache=True)
        assert s3_server.fs().exists(f"{root[5:]}/{DEFAULT_NAME}") and len(opened) == 6
        opened.clear()
        again = RasterDataset(root, storage_options=options, index_cache=True)
        assert opened == []
        _same(again, first)
        assert again.files == [f"{root}/{n}" for n in names]
        # an object replaced by other content (another ETag) is read again (its new bytes, not GDAL's
        # cached ones); the others are not
        s3_server.fs().put(str(folder / "tile_013.tif"), f"{root[5:]}/tile_002.tif")
        opened.clear()
        third = RasterDataset(root, storage_options=options, index_cache=True)
        assert opened == [f"{root}/tile_002.tif"]
        fresh = RasterDataset(root, storage_options=options, vsi=False)
        assert third.geo_index[2] != first.geo_index[2]
        _same(third, fresh)


def _outage_options(server) -> dict:
    # one botocore attempt per request: pipekit's retries (not botocore's) carry the listing through
    return {**server.storage_options, "config_kwargs": {"retries": {"max_attempts": 1, "mode": "standard"}},
            "skip_instance_cache": True}


@pytest.mark.s3
@pytest.mark.slow
class TestListingThroughAnOutage:
    """Issue 13: a dataset built while S3 is down retries its listing, and names the root when it gives up."""

    def test_built_while_the_server_restarts(self, restartable_s3_server, folder, monkeypatch, caplog):
        server = restartable_s3_server
        if not server.alive():
            server.start_again()
        root = _upload(server, folder, ["tile_000.tif", "tile_001.tif", "tile_002.tif"])
        monkeypatch.setenv("PIPEKIT_RETRY_ATTEMPTS", "60")
        monkeypatch.setenv("PIPEKIT_RETRY_SECONDS", "60")
        result: dict = {}

        def build() -> None:
            try:
                result["ds"] = RasterDataset(root, storage_options=_outage_options(server))
            except BaseException as exc:  # reported below
                result["error"] = exc

        server.kill()
        with caplog.at_level(logging.WARNING, logger="pipekit.retry"):
            thread = threading.Thread(target=build, daemon=True)
            thread.start()
            time.sleep(3.0)
            assert thread.is_alive()  # still retrying the listing
            server.start_again()
            thread.join(120)
        assert "error" not in result, result.get("error")
        assert [Path(p).name for p in result["ds"].files] == ["tile_000.tif", "tile_001.tif", "tile_002.tif"]
        retries = [r.getMessage() for r in caplog.records if r.name == "pipekit.retry"]
        assert any("RasterDataset.listing" in m for m in retries)
        # the listing's retries, and any of the headers' (a server just back may answer 500 for a moment)
        assert all(m.startswith("RasterDataset") and root in m for m in retries), retries

    def test_permanently_down_names_the_root_stage_and_attempts(self, restartable_s3_server, tmp_path, monkeypatch):
        from datetime import date

        from pipekit.datasets import Landsat8
        from pipekit.synthetic.geo import landsat_scene_id, write_landsat_scene

        server = restartable_s3_server
        if not server.alive():
            server.start_again()
        scene = landsat_scene_id("LC08", "026031", date(2023, 7, 1))
        write_landsat_scene(tmp_path / "l8", scene, (X0, Y0), size=16)
        bucket = server.create_bucket()
        server.fs().put(str(tmp_path / "l8" / scene), f"{bucket}/l8/{scene}", recursive=True)
        root = f"s3://{bucket}/l8"
        assert len(Landsat8(paths=root, storage_options=_outage_options(server))) == 1
        monkeypatch.setenv("PIPEKIT_RETRY_ATTEMPTS", "3")
        monkeypatch.setenv("PIPEKIT_RETRY_SECONDS", "20")
        server.kill()
        try:
            start = time.monotonic()
            with pytest.raises(ReadError) as info:
                Landsat8(paths=root, storage_options=_outage_options(server))
            assert time.monotonic() - start < 30
            err = info.value
            assert (err.url, err.stage, err.action) == (root, "Landsat8.listing", "list")
            assert "gave up after 3 attempts" in str(err) and root in str(err)
        finally:
            server.start_again()


class TestReloadWithoutPerFileObjects:
    """A saved index compared with the listing in columns (Arrow, integers) gives what the per-file code gave."""

    def test_local_stamps_are_the_texts_of_before(self, folder):
        from pipekit.geo.catalog._fingerprints import MtimeStamps, _fingerprint_columns, fingerprint_columns

        paths = [*sorted(str(p) for p in folder.iterdir()), str(folder / "gone.tif")]
        sizes, stamps = _fingerprint_columns(paths)
        assert isinstance(stamps, MtimeStamps)
        expected = [(os.stat(p).st_size, f"mtime_ns={os.stat(p).st_mtime_ns}") for p in paths[:-1]] + [(-1, "")]
        assert list(zip(sizes.tolist(), stamps)) == expected
        assert list(zip(*fingerprint_columns(paths))) == [(s, t) for s, t in expected]
        # a file:// URL among them: the loop of before, the same fingerprints
        url_sizes, url_stamps = _fingerprint_columns([f"file://{paths[0]}", *paths[1:]])
        assert isinstance(url_stamps, list) and list(zip(url_sizes.tolist(), url_stamps)) == expected
        assert stamps.arrow().to_pylist() == [t or None for _, t in expected]
        assert stamps.take([2, 0]).tolist() == [expected[2][1], expected[0][1]]

    def test_rows_of_with_integer_stamps_equals_rows_of_with_texts(self, folder, tmp_path):
        from pipekit.geo.catalog._fingerprints import _fingerprint_columns

        where = RasterDataset(folder).save_index(tmp_path / "i.parquet")
        paths = sorted(str(p) for p in folder.iterdir())
        touched = folder / "tile_004.tif"
        st = os.stat(touched)
        os.utime(touched, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
        cases = [paths, paths[::-1], paths[3:], [*paths, str(folder / "new.tif")], paths[:10] + paths[11:]]
        for case in cases:
            saved = read_index(where)
            sizes, stamps = _fingerprint_columns(case)
            fast = saved.rows_of(case, sizes, stamps)
            slow = read_index(where).rows_of(case, sizes, list(stamps))
            np.testing.assert_array_equal(fast, slow)
        saved = read_index(where)
        sizes, stamps = _fingerprint_columns(paths)
        rows = saved.rows_of(paths, sizes, stamps)
        assert rows[paths.index(str(touched))] == -1 and (np.delete(rows, paths.index(str(touched))) >= 0).all()

    def test_saved_paths_out_of_order_are_accepted_and_repeated_ones_refused(self, folder, tmp_path):
        import pyarrow as pa
        import pyarrow.parquet as pq

        where = RasterDataset(folder).save_index(tmp_path / "i.parquet")
        table = pq.read_table(where)
        reversed_rows = table.take(pa.array(np.arange(table.num_rows)[::-1]))
        pq.write_table(reversed_rows, where)
        saved = read_index(where)
        assert saved.paths == sorted(saved.paths, reverse=True) and len(saved.rows) == 30
        assert RasterDataset(folder, index_cache=where).files == RasterDataset(folder).files
        i = table.schema.get_field_index("filepath")
        paths = table.column("filepath").to_pylist()
        pq.write_table(table.set_column(i, "filepath", pa.array([paths[0], *paths[:-1]])), where)
        with pytest.raises(IndexCacheError, match="appears twice"):
            read_index(where)

    def test_merge_of_one_whole_part_equals_the_general_merge(self, folder):
        from pipekit.geo.catalog._cached_headers import _merge

        columns = read_index(RasterDataset(folder).save_index(folder / "i.parquet")).columns
        n = len(columns)
        order = np.r_[3:n, 0:3]  # first use of the CRSs and dtypes in another order than their lists'
        shuffled = columns.take(order)
        whole = _merge([(shuffled, np.arange(n))], n)
        split = _merge(
            [
                (shuffled.take(np.arange(0, n, 2)), np.arange(0, n, 2)),
                (shuffled.take(np.arange(1, n, 2)), np.arange(1, n, 2)),
            ],
            n,
        )
        assert [c.to_wkt() for c in whole.crs_list] == [c.to_wkt() for c in split.crs_list]
        assert whole.dtypes == split.dtypes
        for name in ("crs_ids", "dtype_ids", "transforms", "shapes", "counts", "nodata", "has_nodata"):
            np.testing.assert_array_equal(getattr(whole, name), getattr(split, name), err_msg=name)
        assert whole.crs_ids[0] == 0 and whole.dtype_ids[0] == 0  # renumbered by first use
