"""RasterReader: an index entry's parts read onto a grid, failures reported as the dataset's errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from affine import Affine
from rasterio.crs import CRS
from rasterio.enums import Resampling

from pipekit.errors import ReadError, SkipLog
from pipekit.geo import BoundingBox
from pipekit.geo import io as geo_io
from pipekit.geo._read import Grid, SkippedReadError
from pipekit.geo._reader import EntryLabel, RasterReader, ReadSettings

from .conftest import UTM15, pattern, write_tif

X0, Y0 = 399_990.0, 4_650_030.0


def _settings(**changes) -> ReadSettings:
    fields = {"resampling": Resampling.nearest, "nodata": None, "fill": 0.0, "cache": True, "on_error": "raise"}
    fields.update(changes)
    return ReadSettings(**fields)


@pytest.fixture
def bands(tmp_path: Path) -> list[Path]:
    t = Affine(30.0, 0.0, X0, 0.0, -30.0, Y0)
    return [write_tif(tmp_path / f"b{k}.tif", pattern(16, 16, seed=k), UTM15, t) for k in range(3)]


def _grid(res: float = 30.0) -> Grid:
    return Grid.from_bbox(BoundingBox(X0, X0 + 240.0, Y0 - 240.0, Y0), (res, res), CRS.from_string(UTM15))


def _reader(name: str = "Demo") -> RasterReader:
    return RasterReader(geo_io.RasterOpener(), name, SkipLog(name))


class TestReads:
    def test_parts_fill_their_channels_in_order(self, bands):
        grid = _grid()
        out = np.empty((3, grid.height, grid.width), dtype=np.uint16)
        _reader().read([(str(p), [1]) for p in bands], grid, out, None, False, _settings())
        for k in range(3):
            np.testing.assert_array_equal(out[k], pattern(16, 16, seed=k)[0, :8, :8])

    def test_valid_mask_and_prefilled_output(self, bands):
        grid = Grid.from_bbox(BoundingBox(X0 - 120.0, X0 + 120.0, Y0 - 240.0, Y0), (30.0, 30.0),
                              CRS.from_string(UTM15))
        out = np.full((1, grid.height, grid.width), 7, dtype=np.uint16)
        valid = np.zeros(out.shape, dtype=bool)
        _reader().read([(str(bands[0]), [1])], grid, out, valid, True, _settings(fill=7.0))
        assert not valid[..., :4].any() and valid[..., 4:].all()
        assert (out[..., :4] == 7).all()

    def test_without_cache_no_handle_is_kept(self, bands):
        before = geo_io.cached_handle_count()
        grid = _grid()
        out = np.empty((1, grid.height, grid.width), dtype=np.uint16)
        _reader().read([(str(bands[1]), [1])], grid, out, None, False, _settings(cache=False))
        assert geo_io.cached_handle_count() == before


class TestFailures:
    def test_a_missing_file_is_a_read_error_naming_it_and_the_stage(self, bands, tmp_path):
        grid = _grid()
        out = np.empty((2, grid.height, grid.width), dtype=np.uint16)
        gone = str(tmp_path / "gone.tif")
        with pytest.raises(ReadError) as info:
            _reader("Product").read([(str(bands[0]), [1]), (gone, [1])], grid, out, None, False,
                                    _settings(fill=5.0))
        assert info.value.url == gone and info.value.stage == "Product"
        assert not isinstance(info.value, SkippedReadError)
        assert (out == 5).all()  # not prefilled: the fill value where the read failed

    def test_skip_counts_and_raises_skipped(self, tmp_path):
        reader = _reader()
        grid = _grid()
        out = np.empty((1, grid.height, grid.width), dtype=np.uint16)
        with pytest.raises(SkippedReadError, match="skipped: on_error='skip'"):
            reader.read([(str(tmp_path / "gone.tif"), [1])], grid, out, None, False, _settings(on_error="skip"))
        assert reader.skip_log.count == 1

    def test_a_label_names_the_entry_and_the_part(self, bands, tmp_path):
        grid = _grid()
        out = np.empty((2, grid.height, grid.width), dtype=np.uint16)
        gone = str(tmp_path / "gone.tif")
        label = EntryLabel("item 'S2A_X'", ["B04", "B08"])
        with pytest.raises(ReadError, match=r"item 'S2A_X' asset 'B08': ") as info:
            _reader().read([(str(bands[0]), [1]), (gone, [1])], grid, out, None, False, _settings(), label)
        assert info.value.url == gone

    def test_the_readers_pickle_with_the_dataset(self, bands):
        import pickle

        from pipekit.datasets import RasterDataset

        ds = RasterDataset(bands[0].parent)
        copy = pickle.loads(pickle.dumps(ds))
        assert isinstance(copy._reader, RasterReader) and copy._reader.opener is copy._opener
        assert copy._reader.skip_log is copy.skip_log
