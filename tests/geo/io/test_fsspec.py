"""``pipekit.geo.io._fsspec``: fsspec files for rasterio, one position per handle (failures: tests/geo/test_io.py)."""

from __future__ import annotations

import threading

import fsspec
import numpy as np
import pytest

from pipekit.geo.io import RasterOpener, handles


class TestFsspecFiles:
    def test_memory_files_are_independent_per_handle(self, utm_scene):
        fs = fsspec.filesystem("memory")
        fs.pipe("/geo-io-test/scene.tif", utm_scene["path"].read_bytes())
        try:
            opener = RasterOpener()
            url = "memory://geo-io-test/scene.tif"
            a = handles.open_handle(opener, url)
            b = handles.open_handle(opener, url)
            window = ((0, 8), (0, 8))
            np.testing.assert_array_equal(a.ds.read(1, window=window), b.ds.read(1, window=window))
            a.close()
            np.testing.assert_array_equal(b.ds.read(1, window=window), utm_scene["array"][0, :8, :8])
            b.close()
            errors = []

            def worker():
                try:
                    for _ in range(10):
                        h = handles.cached_handle(opener, url)
                        assert (h.ds.read(2, window=window) == utm_scene["array"][1, :8, :8]).all()
                except Exception as exc:  # pragma: no cover - reported below
                    errors.append(exc)

            threads = [threading.Thread(target=worker) for _ in range(3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert errors == []
        finally:
            fs.rm("/geo-io-test", recursive=True)

    def test_open_failure_names_the_url(self, tmp_path):
        from pipekit.errors import ReadError

        with pytest.raises(ReadError, match=r"cannot open raster 'memory://nowhere/missing\.tif' in X: no such file"):
            handles.open_handle(RasterOpener(), "memory://nowhere/missing.tif", "X")
        with pytest.raises(ReadError, match=r"missing\.tif' in RasterOpener: no such file"):
            handles.open_handle(RasterOpener(), str(tmp_path / "missing.tif"))
