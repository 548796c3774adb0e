"""pipekit.geo.catalog._headers: reading raster headers, one or many, and why a raster cannot be indexed."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
from affine import Affine
from rasterio.crs import CRS

from pipekit.errors import GeoReferenceError, ReadError
from pipekit.geo.catalog._headers import RasterHeader, read_header, read_headers
from pipekit.geo.io import RasterOpener

UTM15 = "EPSG:32615"


def write(rasters, path: Path, size: int = 16, res: float = 10.0, blocksize: int = 16, **kwargs) -> Path:
    """A small uint16 GeoTIFF in UTM 15N."""
    transform = Affine(res, 0.0, 500_000.0, 0.0, -res, 4_650_000.0)
    return rasters.write_tif(path, rasters.pattern(size, size), UTM15, transform, blocksize=blocksize, **kwargs)


class TestReadHeader:
    def test_fields_and_layout(self, rasters, tmp_path):
        path = write(rasters, tmp_path / "a.tif", size=32, res=10.0, nodata=0, blocksize=16)
        header = read_header(RasterOpener(), str(path), "test")
        assert (header.width, header.height, header.count, header.dtype, header.nodata) == (32, 32, 1, "uint16", 0)
        assert header.crs == CRS.from_string(UTM15) and header.georeferenced
        assert header.res == (10.0, 10.0)
        assert header.bounds == (500_000.0, 4_649_680.0, 500_320.0, 4_650_000.0)
        assert header.block_shape is None and header.index_error("test") is None
        layout = read_header(RasterOpener(), str(path), "test", layout=True)
        assert (layout.block_shape, layout.compression, layout.overviews) == ((16, 16), "deflate", 0)

    def test_unreadable_file_names_it_and_the_stage(self, tmp_path):
        broken = tmp_path / "broken.tif"
        broken.write_bytes(b"II*\x00 not a tiff")
        with pytest.raises(ReadError, match=re.escape(f"cannot open raster '{broken}' in Mine")):
            read_header(RasterOpener(), str(broken), "Mine")

    def test_why_a_raster_cannot_be_indexed(self):
        ok = RasterHeader("a.tif", CRS.from_string(UTM15), Affine(10, 0, 0, 0, -10, 0), 4, 4, 1, "uint8", None,
                          (0.0, -40.0, 40.0, 0.0))
        assert ok.index_error("X") is None
        for changes, kind, reason in [
            ({"crs": None}, GeoReferenceError, "has no CRS"),
            ({"crs": None, "has_gcps": True}, GeoReferenceError, "ground control points"),
            ({"transform": Affine.identity()}, GeoReferenceError, "no geotransform"),
            ({"count": 0}, ReadError, "has no bands"),
        ]:
            header = RasterHeader(**{**ok.__dict__, **changes})
            error = header.index_error("X")
            assert type(error) is kind and reason in str(error) and "'a.tif' in X" in str(error)
            assert header.georeferenced == ("count" in changes)

    def test_headers_in_order_local_on_a_pool_or_this_thread_remote_on_io_threads(self, rasters, tmp_path):
        import fsspec

        paths = [str(write(rasters, tmp_path / f"{k}.tif", size=8 + k)) for k in range(3)]
        threads: list[str] = []

        def width(url: str) -> int:
            threads.append(threading.current_thread().name)
            return read_header(RasterOpener(), url).width

        assert read_headers(paths, width, workers=1) == [8, 9, 10]
        assert set(threads) == {threading.current_thread().name}
        threads.clear()
        assert read_headers(paths, width, workers=3) == [8, 9, 10]  # local files on a pool when asked
        assert all(name.startswith("pipekit-geo-index") for name in threads)
        fs = fsspec.filesystem("memory")
        urls = []
        for k, path in enumerate(paths):
            fs.pipe(f"/discovery-test/{k}.tif", Path(path).read_bytes())
            urls.append(f"memory://discovery-test/{k}.tif")
        try:
            threads.clear()
            assert read_headers(urls, width) == [8, 9, 10]
            assert threading.current_thread().name not in threads
            assert all(name.startswith("pipekit-geo") for name in threads)
        finally:
            fs.rm("/discovery-test", recursive=True)
