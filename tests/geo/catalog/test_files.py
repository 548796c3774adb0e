"""FileCatalog: the files of a raster dataset found, grouped into scenes, dated, and their table built."""

from __future__ import annotations

import logging
import math
import re
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest
import rasterio
from affine import Affine

from pipekit.datasets import RasterDataset
from pipekit.errors import DatasetNotFoundError, ParseError, ReadError
from pipekit.geo import BoundingBox
from pipekit.geo.catalog._dates import date_interval

UTM15 = "EPSG:32615"
ALBERS = "EPSG:5070"
X0, Y0 = 399_990.0, 4_650_030.0  # the grid of the conftest fixtures


def box(col: float, row: float, width: float, height: float, res: float = 30.0,
        x0: float = X0, y0: float = Y0) -> BoundingBox:
    """The box of ``width`` x ``height`` pixels whose top-left pixel is (col, row) of a grid at (x0, y0)."""
    return BoundingBox(x0 + col * res, x0 + (col + width) * res, y0 - (row + height) * res, y0 - row * res)


class Dated(RasterDataset):
    filename_glob = "scene_*.tif"
    filename_regex = r"""
        ^scene
        _(?P<date>\d{8})
        \.tif$
    """
    date_format = "%Y%m%d"


class TestDiscovery:
    def test_directory_is_searched_recursively_with_the_glob(self, tmp_path, rasters):
        t = Affine(30.0, 0.0, X0, 0.0, -30.0, Y0)
        rasters.write_tif(tmp_path / "a" / "scene_20210701.tif", rasters.pattern(20, 20), UTM15, t)
        rasters.write_tif(tmp_path / "a" / "b" / "scene_20210702.tif", rasters.pattern(20, 20), UTM15, t)
        rasters.write_tif(tmp_path / "other.tif", rasters.pattern(20, 20), UTM15, t)
        ds = Dated(tmp_path)
        assert sorted(Path(f).name for f in ds.files) == ["scene_20210701.tif", "scene_20210702.tif"]
        assert ds.files == sorted(ds.files)
        assert len(ds) == 2

    def test_hidden_and_gdal_side_files_are_not_rasters(self, tmp_path, rasters):
        t = Affine(30.0, 0.0, X0, 0.0, -30.0, Y0)
        rasters.write_tif(tmp_path / "scene.tif", rasters.pattern(20, 20), UTM15, t)
        (tmp_path / ".complete").touch()
        (tmp_path / ".DS_Store").write_bytes(b"junk")
        (tmp_path / "scene.tif.aux.xml").write_text("<PAMDataset/>")
        (tmp_path / "scene.tif.ovr").write_bytes(b"not an overview")
        ds = RasterDataset(tmp_path)  # the generic glob "*" sees every file
        assert [Path(f).name for f in ds.files] == ["scene.tif"]
        (tmp_path / "notes.txt").write_text("not a raster")
        with pytest.warns(UserWarning, match=r"left out 1 file.*notes\.txt"):  # anything else is reported
            ds = RasterDataset(tmp_path)
        assert [Path(f).name for f in ds.files] == ["scene.tif"] and ds.skip_log.count == 1

    def test_files_that_are_not_rasters_are_left_out_with_a_warning_naming_them(self, tmp_path, rasters):
        t = Affine(30.0, 0.0, X0, 0.0, -30.0, Y0)
        for day in ("01", "02", "03"):
            rasters.write_tif(tmp_path / f"scene_202107{day}.tif", rasters.pattern(20, 20), UTM15, t)
        (tmp_path / "scene_20210704.tif").write_bytes(b"")  # empty
        (tmp_path / "scene_20210705.tif").write_bytes(b"II*\x00 corrupt")  # a TIFF signature, then nothing
        good = (tmp_path / "scene_20210701.tif").read_bytes()
        (tmp_path / "scene_20210706.tif").write_bytes(good[:200])  # cut inside its first directory
        # TorchGeo leaves unreadable files out silently; pipekit leaves them out too, saying which and how many
        with pytest.warns(UserWarning, match=r"Dated: left out 3 file\(s\) of 6 that are not rasters GDAL can "
                                             r"read.*scene_20210704\.tif.*scene_20210705\.tif.*scene_20210706"):
            ds = Dated(tmp_path)
        assert len(ds) == 3 and ds.skip_log.count == 3
        assert [Path(s.url).name for s in ds.skip_log.skipped] == [f"scene_2021070{d}.tif" for d in (4, 5, 6)]
        assert ds[box(0, 0, 10, 10)]["image"].shape == (1, 10, 10)
        # on_error="skip" leaves them out as before (counted and logged, no warning needed)
        assert len(Dated(tmp_path, on_error="skip")) == 3
        # a file the listing found but that is gone is an I/O error, not a corrupt file: still raised
        for day in ("04", "05", "06"):
            (tmp_path / f"scene_202107{day}.tif").unlink()
        (tmp_path / "scene_20210707.tif").symlink_to(tmp_path / "nowhere.tif")
        with pytest.raises(ReadError, match=r"scene_20210707\.tif"):
            Dated(tmp_path)

    def test_regex_filters_names_and_dates_become_time_intervals(self, tmp_path, rasters):
        t = Affine(30.0, 0.0, X0, 0.0, -30.0, Y0)
        rasters.write_tif(tmp_path / "scene_20210701.tif", rasters.pattern(20, 20), UTM15, t)
        rasters.write_tif(tmp_path / "scene_notadate.tif", rasters.pattern(20, 20), UTM15, t)
        ds = Dated(tmp_path)
        assert len(ds) == 1
        day = datetime(2021, 7, 1, tzinfo=timezone.utc).timestamp()
        assert ds.bounds.mint == day
        assert ds.bounds.maxt == pytest.approx(day + 86400 - 1e-6)
        # a query at another time finds nothing
        with pytest.raises(IndexError, match="not within the index"):
            ds[box(0, 0, 10, 10).with_time(day + 2 * 86400, day + 3 * 86400)]
        assert ds[box(0, 0, 10, 10).with_time(day, day + 3600)]["image"].shape == (1, 10, 10)

    def test_start_stop_groups_and_open_intervals(self, tmp_path, rasters):
        class Ranged(RasterDataset):
            filename_regex = r"^r_(?P<start>\d{4})_(?P<stop>\d{4})\.tif$"
            date_format = "%Y"

        t = Affine(30.0, 0.0, X0, 0.0, -30.0, Y0)
        rasters.write_tif(tmp_path / "r_2019_2020.tif", rasters.pattern(20, 20), UTM15, t)
        ds = Ranged(tmp_path)
        assert ds.bounds.mint == datetime(2019, 1, 1, tzinfo=timezone.utc).timestamp()
        assert ds.bounds.maxt == pytest.approx(datetime(2021, 1, 1, tzinfo=timezone.utc).timestamp() - 1e-6)
        plain = RasterDataset(tmp_path)
        assert (plain.bounds.mint, plain.bounds.maxt) == (-math.inf, math.inf)

    def test_date_interval_precision(self):
        start, end = date_interval("2021", "%Y")
        assert datetime.fromtimestamp(start, timezone.utc) == datetime(2021, 1, 1, tzinfo=timezone.utc)
        assert end == pytest.approx(datetime(2022, 1, 1, tzinfo=timezone.utc).timestamp() - 1e-6)
        start, end = date_interval("202112", "%Y%m")
        assert end == pytest.approx(datetime(2022, 1, 1, tzinfo=timezone.utc).timestamp() - 1e-6)
        start, end = date_interval("20210701T101500", "%Y%m%dT%H%M%S")
        assert end - start == pytest.approx(1 - 1e-6)

    def test_unparsable_date_names_the_file(self, tmp_path, rasters):
        class BadDate(RasterDataset):
            filename_regex = r"^(?P<date>\d+)\.tif$"
            date_format = "%Y%m%d"

        t = Affine(30.0, 0.0, X0, 0.0, -30.0, Y0)
        rasters.write_tif(tmp_path / "2021999999.tif", rasters.pattern(20, 20), UTM15, t)
        with pytest.raises(ParseError, match=r"2021999999\.tif"):
            BadDate(tmp_path)

    def test_file_glob_and_list_roots_and_paths_alias(self, utm_scene, mosaic_pair):
        single = RasterDataset(utm_scene["path"])
        assert single.files == [str(utm_scene["path"])]
        globbed = RasterDataset(str(mosaic_pair["root"] / "*.tif"))
        assert len(globbed) == 2
        both = RasterDataset([utm_scene["path"], mosaic_pair["root"]], bands=[1])
        assert len(both) == 3
        with pytest.raises(ReadError, match=r"a\.tif' in RasterDataset: it has 1 band\(s\), the dataset reads 3"):
            RasterDataset([utm_scene["path"], mosaic_pair["root"]])
        alias = RasterDataset(paths=utm_scene["root"])
        assert alias.files == single.files
        with pytest.raises(TypeError, match="not both"):
            RasterDataset(utm_scene["root"], paths=utm_scene["root"])

    def test_no_files_names_root_and_glob(self, tmp_path):
        (tmp_path / "readme.txt").write_text("not a raster")
        # TorchGeo's DatasetNotFoundError and its "Dataset not found" (a FileNotFoundError, as before)
        with pytest.raises(DatasetNotFoundError, match=r"^Dataset not found: Dated: no files matching filename_glob "
                                                       + re.escape("'scene_*.tif'")) as info:
            Dated(tmp_path)
        assert str(tmp_path) in str(info.value)
        with pytest.raises(DatasetNotFoundError, match=r"^Dataset not found: RasterDataset: no such file or directory"):
            RasterDataset(tmp_path / "missing")

    def test_memory_filesystem_root(self, utm_scene):
        import fsspec

        fs = fsspec.filesystem("memory")
        fs.pipe("/geo-test-memory/scenes/scene.tif", utm_scene["path"].read_bytes())
        try:
            ds = RasterDataset("memory://geo-test-memory/scenes")
            assert len(ds.files) == 1
            assert ds.files[0].startswith("memory://") and ds.files[0].endswith("/geo-test-memory/scenes/scene.tif")
            got = ds[box(10, 20, 64, 32)]["image"].numpy()
            np.testing.assert_array_equal(got, utm_scene["array"][:, 20:52, 10:74])
        finally:
            fs.rm("/geo-test-memory", recursive=True)

    def test_chosen_crs_and_res_are_logged_once(self, utm_scene, caplog):
        with caplog.at_level(logging.INFO, logger="pipekit.geo"):
            RasterDataset(utm_scene["root"])
        messages = [r.getMessage() for r in caplog.records if "indexed" in r.getMessage()]
        assert len(messages) == 1
        assert "EPSG:32615" in messages[0] and "(30.0, 30.0)" in messages[0]


class TestBandInGlob:
    """TorchGeo's custom-dataset form: ``filename_glob`` names the first band, the others are found beside it."""

    class S2(RasterDataset):  # the TorchGeo custom raster dataset tutorial's class
        filename_glob = "T*_B02_10m.tif"
        filename_regex = r"^.{6}_(?P<date>\d{8}T\d{6})_(?P<band>B0[\d])"
        date_format = "%Y%m%dT%H%M%S"
        is_image = True
        separate_files = True
        all_bands = ("B02", "B03", "B04", "B08")
        rgb_bands = ("B04", "B03", "B02")

    @pytest.fixture
    def tiles(self, tmp_path):
        from pipekit.synthetic.geo import write_sentinel2_tile

        root = tmp_path / "sentinel"
        # 20 m copies beside the 10 m files: the band substituted in the scene file's name picks the 10 m ones
        write_sentinel2_tile(root, "T15TVG", "20220718T170859", (420_000.0, 4_660_000.0), 2520.0,
                             bands=("B02", "B03", "B04", "B08"), resolutions=(10, 20))
        write_sentinel2_tile(root, "T15TVG", "20220902T170901", (421_280.0, 4_659_000.0), 2520.0,
                             bands=("B02", "B03", "B04", "B08"), seed=1)
        return root

    def test_each_glob_match_is_a_scene_and_the_other_bands_are_found(self, tiles):
        ds = self.S2(tiles)
        assert len(ds) == 2
        assert [Path(f).name for f in ds.files] == ["T15TVG_20220718T170859_B02_10m.tif",
                                                    "T15TVG_20220902T170901_B02_10m.tif"]
        assert ds.res == (10.0, 10.0)
        first = BoundingBox(420_000.0, 420_640.0, 4_659_360.0, 4_660_000.0, *date_interval("20220718", "%Y%m%d"))
        image = ds[first]["image"]
        assert image.shape == (4, 64, 64)
        for k, band in enumerate(ds.bands):
            with rasterio.open(tiles / f"T15TVG_20220718T170859_{band}_10m.tif") as src:
                np.testing.assert_array_equal(image[k].numpy(), src.read(1)[:64, :64])

    def test_band_order_and_subset(self, tiles):
        ds = self.S2(tiles, bands=["B08", "B04"])
        q = BoundingBox(420_000.0, 420_320.0, 4_659_680.0, 4_660_000.0)
        with rasterio.open(tiles / "T15TVG_20220718T170859_B08_10m.tif") as src:
            np.testing.assert_array_equal(ds[q]["image"][0].numpy(), src.read(1)[:32, :32])

    def test_a_missing_band_file_is_reported_or_skipped(self, tiles):
        (tiles / "T15TVG_20220902T170901_B03_10m.tif").unlink()
        with pytest.raises(ReadError, match=r"cannot find band file '.*T15TVG_20220902T170901_B03_10m.tif'"):
            self.S2(tiles)
        skipping = self.S2(tiles, on_error="skip")
        assert len(skipping) == 1 and skipping.skip_log.count == 1

    def test_placeholder_glob_still_works(self, tiles):
        class Placeholder(self.S2):
            filename_glob = "T*_{}_10m.tif"

        ds = Placeholder(tiles)
        assert len(ds) == 2 and ds.files == self.S2(tiles).files


class TestVectorisedFileTable:
    """The file table's times and band spans, built without a per-file loop, equal what the loop gave."""

    class Ranged(RasterDataset):
        filename_regex = r"^t_(?:(?P<date>\d{8})|(?P<start>\d{8})?-(?P<stop>\d{8})?)_(?P<k>\d+)\.tif$"
        date_format = "%Y%m%d"

    @staticmethod
    def _loop_times(ds: RasterDataset, paths: list[str], matches: list) -> np.ndarray:
        """The per-file loop ``_build_file_table`` ran before (one ``_time_interval`` per file)."""
        times = np.empty((len(paths), 2))
        for k, (path, match) in enumerate(zip(paths, matches)):
            times[k] = ds._time_interval(path, match)
        return times

    @staticmethod
    def _outcome(fn):
        try:
            return fn()
        except Exception as exc:
            return type(exc), str(exc)

    @pytest.fixture
    def ranged(self, tmp_path, rasters) -> RasterDataset:
        t = Affine(30.0, 0.0, X0, 0.0, -30.0, Y0)
        rasters.write_tif(tmp_path / "t_20210701_0.tif", rasters.pattern(8, 8), UTM15, t)
        return self.Ranged(tmp_path)

    @pytest.mark.parametrize(
        "names",
        [
            [
                "t_20210701_0.tif",
                "t_20210701_1.tif",
                "t_20210702_2.tif",
                "t_20200101-20201231_3.tif",
                "t_-20201231_4.tif",
                "t_20200101-_5.tif",
                "t_-_6.tif",
            ],
            # the first file whose date fails is named, whichever group holds it (a stop, then a date)
            ["t_20210101-20211399_2.tif", "t_20210701_0.tif", "t_20211301_1.tif"],
            ["t_20210701_0.tif", "t_20211301_1.tif", "t_20211301_2.tif", "t_20211401_3.tif"],
            ["t_20210701_0.tif", "t_20211301-20219999_1.tif", "t_20211301_2.tif"],  # the start fails first
            ["t_20210701_0.tif"] * 3,  # one date for many files
            # beyond datetime's range: not a ValueError, raised as the loop raised it
            ["t_20210701_0.tif", "t_99991231_1.tif", "t_20211301_2.tif"],
        ],
    )
    def test_times_equal_the_per_file_loop(self, ranged, tmp_path, names):
        paths = [str(tmp_path / n) for n in names]
        matches = [ranged._regex.match(n) for n in names]
        expected = self._outcome(lambda: self._loop_times(ranged, paths, matches))
        actual = self._outcome(lambda: ranged._catalog.file_times(paths, matches))
        if isinstance(expected, np.ndarray):
            np.testing.assert_array_equal(actual, expected)
        else:
            assert expected[0] in (ParseError, OverflowError) and actual == expected

    def test_undated_regex_spans_all_time_and_dated_dataset_equals_loop(self, tmp_path, rasters):
        t = Affine(30.0, 0.0, X0, 0.0, -30.0, Y0)
        for name in (
            "t_20210701_0.tif",
            "t_20210701_1.tif",
            "t_20200101-20201231_2.tif",
            "t_-_3.tif",
            "t_-20201231_4.tif",
        ):
            rasters.write_tif(tmp_path / name, rasters.pattern(8, 8), UTM15, t)
        ds = self.Ranged(tmp_path)
        matches = [ds._regex.match(Path(p).name) for p in ds.files]
        np.testing.assert_array_equal(ds._files.times, self._loop_times(ds, ds.files, matches))
        plain = RasterDataset(tmp_path)
        assert np.isneginf(plain._files.times[:, 0]).all() and np.isposinf(plain._files.times[:, 1]).all()

    def test_an_overridden_time_interval_is_asked_per_file(self, tmp_path, rasters):
        class Shifted(self.Ranged):
            def _time_interval(self, path, match):
                start, stop = super()._time_interval(path, match)
                return start + 1.0, stop + 1.0

        t = Affine(30.0, 0.0, X0, 0.0, -30.0, Y0)
        rasters.write_tif(tmp_path / "t_20210701_0.tif", rasters.pattern(8, 8), UTM15, t)
        day = datetime(2021, 7, 1, tzinfo=timezone.utc).timestamp()
        assert Shifted(tmp_path)._files.times[0, 0] == day + 1.0

    def test_band_spans_and_overrides_equal_the_per_file_loop(self, tmp_path):
        from pipekit.geo.catalog._band_files import band_columns
        from pipekit.geo.catalog._listing import _split_name

        regex = re.compile(r"^s(?P<scene>\d)_(?P<band>B\d)(?:_(?P<resolution>\d+m))?\.tif$", re.VERBOSE)
        paths = [str(tmp_path / "a" / "s1_B1.tif"), str(tmp_path / "b" / "s2_B1_20m.tif"), "s3://bucket/x/s3_B1.tif"]
        bands_of = [
            {"B1": paths[0], "B2": str(tmp_path / "a" / "s1_B2.tif")},
            {"B1": paths[1], "B2": str(tmp_path / "c" / "s2_B2_10m.tif")},
            {"B1": paths[2], "B2": "s3://bucket/x/s3_B2.tif"},
        ]
        matches = [regex.match(p.replace("\\", "/").rsplit("/", 1)[-1]) for p in paths]
        spans, overrides = band_columns(paths, matches, bands_of)
        expected_spans, expected_overrides = [], {}
        for k, (path, match) in enumerate(zip(paths, matches)):  # the loop _build_file_table ran before
            offset = len(_split_name(path)[0])
            start, stop = match.span("band")
            expected_spans.append((offset + start, offset + stop))
            for band, other in bands_of[k].items():
                if other != path[: offset + start] + band + path[offset + stop :]:
                    expected_overrides[(k, band)] = other
        assert spans.tolist() == [list(s) for s in expected_spans] and spans.dtype == np.int64
        assert overrides == expected_overrides == {(1, "B2"): str(tmp_path / "c" / "s2_B2_10m.tif")}
