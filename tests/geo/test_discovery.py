"""pipekit.geo.discovery: finding files, grouping band files into scenes, reading headers."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import numpy as np
import pytest
from affine import Affine
from rasterio.crs import CRS

from pipekit.errors import ReadError
from pipekit.geo.discovery import (
    GeoReferenceError,
    RasterHeader,
    any_band_glob,
    find_files,
    group_scenes,
    read_header,
    read_headers,
)
from pipekit.geo.io import RasterOpener

UTM15 = "EPSG:32615"
DATED = re.compile(r"(?P<name>[.a-z]+)_(?P<date>\d{8})\.tif")
BANDS = re.compile(r"^T(?P<tile>\w{5})_(?P<date>\d{8}T\d{6})_(?P<band>B\d\d)(?:_(?P<resolution>\d{2}m))?\.tif$")
S2 = "T15TVG_20210701T170859"


def write(rasters, path: Path, size: int = 16, res: float = 10.0, blocksize: int = 16, **kwargs) -> Path:
    """A small uint16 GeoTIFF in UTM 15N."""
    transform = Affine(res, 0.0, 500_000.0, 0.0, -res, 4_650_000.0)
    return rasters.write_tif(path, rasters.pattern(size, size), UTM15, transform, blocksize=blocksize, **kwargs)


def relative(root: Path, paths) -> list[str]:
    return sorted(str(Path(p).relative_to(root)) for p in paths)


class TestFindFiles:
    def test_scan_matches_names_and_skips_side_files(self, tmp_path):
        for name in ("a_20210701.tif", "sub/b_20210702.tif", "notes.txt", ".c_20210703.tif",
                     "a_20210701.tif.aux.xml", "a_20210701.tif.ovr", "other.tif"):
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_bytes(b"")
        found = find_files(tmp_path, "*", DATED)  # the regex would take the hidden file and the side files
        assert [(Path(p).name, m.group("date")) for p, m in found] == [
            ("a_20210701.tif", "20210701"), ("b_20210702.tif", "20210702")]
        assert [Path(p).name for p, _ in find_files(tmp_path, "*.tif", DATED)] == ["a_20210701.tif", "b_20210702.tif"]

    def test_side_files_found_among_many_names_in_any_case(self, tmp_path):
        """The one-regex look for side files over all names agrees with checking each name."""
        import re

        from pipekit.geo.discovery import _is_sidecar

        names = [f"t_{i:04d}.tif" for i in range(300)]
        extra = ["t_0001.tif.AUX.XML", "t_0002.TIF.Ovr", "t_0003.tif.msk", ".t_0004.tif", "t_0005.tif.aux",
                 "t_0006.ovr.tif", "msk", "t_0007.tif.aux.xml.tif"]
        for name in names + extra:
            (tmp_path / name).write_bytes(b"")
        found = find_files(tmp_path, "*", re.compile(r".*"))
        expected = sorted(str(tmp_path / n) for n in names + extra if not _is_sidecar(n))
        assert [p for p, _ in found] == expected
        assert "t_0005.tif.aux" in {Path(p).name for p, _ in found}  # GDAL's .aux is not skipped
        assert "t_0006.ovr.tif" in {Path(p).name for p, _ in found}
        # without any side file among the names the glob finds, every one is kept
        assert len(find_files(tmp_path, "t_0*.tif", re.compile(r".*"))) == 300 + 2  # t_0006.ovr.tif, t_0007...tif

    def test_globs_and_lists_of_roots(self, tmp_path):
        for name in ("x/a_20210701.tif", "y/b_20210702.tif"):
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_bytes(b"")
        assert relative(tmp_path, (p for p, _ in find_files(str(tmp_path / "*" / "*.tif"), "*", DATED))) == [
            "x/a_20210701.tif", "y/b_20210702.tif"]
        found = find_files([tmp_path / "x", tmp_path / "y" / "b_20210702.tif"], "*", DATED)
        assert relative(tmp_path, (p for p, _ in found)) == ["x/a_20210701.tif", "y/b_20210702.tif"]

    def test_a_named_band_file_brings_its_siblings(self, tmp_path):
        for band in ("B02", "B03", "B04"):
            (tmp_path / f"{S2}_{band}.tif").write_bytes(b"")
        named = tmp_path / f"{S2}_B03.tif"
        assert [m.group("band") for _, m in find_files(named, "*", BANDS)] == ["B03"]
        found = find_files(named, "*", BANDS, with_siblings=True)
        assert [m.group("band") for _, m in found] == ["B02", "B03", "B04"]

    def test_nothing_found_names_the_root_and_glob(self, tmp_path):
        (tmp_path / "notes.txt").write_text("x")
        with pytest.raises(FileNotFoundError, match=re.escape("'*.tif'")) as info:
            find_files(tmp_path, "*.tif", DATED, name="Dated")
        assert str(info.value).startswith("Dated: ") and repr(tmp_path) in str(info.value)
        with pytest.raises(FileNotFoundError, match="no such file or directory"):
            find_files(tmp_path / "missing", "*", DATED)

    def test_any_band_glob(self):
        assert any_band_glob("T*_*_{}*.*") == "T*_*_**.*"
        assert any_band_glob("*.tif") == "*.tif"


def scenes_of(paths: list[str], variant_groups=("resolution",)) -> list[list[str]]:
    matched = [(p, BANDS.match(p.rsplit("/", 1)[-1])) for p in sorted(paths)]
    return [sorted(path for path, _ in scene.values()) for scene in group_scenes(matched, variant_groups)]


class TestGroupScenes:
    def test_band_files_of_one_scene_across_sibling_folders(self):
        paths = [f"L2A/R10m/{S2}_B02_10m.tif", f"L2A/R10m/{S2}_B04_10m.tif", f"L2A/R20m/{S2}_B02_20m.tif",
                 f"L2A/R20m/{S2}_B05_20m.tif", "L2A/R10m/T15TVH_20210701T170859_B02_10m.tif"]
        assert scenes_of(paths) == [sorted(paths[:4]), [paths[4]]]
        scene = group_scenes([(p, BANDS.match(p.rsplit("/", 1)[-1])) for p in paths[:4]])[0]
        assert sorted(scene) == [("B02", "10m"), ("B02", "20m"), ("B04", "10m"), ("B05", "20m")]

    def test_copies_of_a_scene_are_split_per_folder(self):
        paths = [f"{copy}/{S2}_{band}.tif" for copy in ("copy1", "copy2") for band in ("B02", "B03")]
        assert scenes_of(paths) == [paths[:2], paths[2:]]

    def test_variant_groups_decide_what_may_differ(self):
        paths = [f"{S2}_B02_10m.tif", f"{S2}_B05_20m.tif"]
        assert scenes_of(paths) == [paths]
        assert scenes_of(paths, variant_groups=()) == [[paths[0]], [paths[1]]]


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


class TestInspectSharesTheDatasetsScenes:
    """``pipekit inspect`` groups band files with the datasets' code: an entry is a scene a dataset indexes."""

    def test_entries_are_the_scenes_of_the_datasets(self, rasters, tmp_path):
        from pipekit.cli._common import list_files
        from pipekit.cli.inspection_rasters import inspect_rasters
        from pipekit.datasets import Landsat8, Sentinel2

        landsat = "LC08_L2SP_026031_20230715_20230725_02_T1"
        for folder, band in (("a", "SR_B1"), ("a", "SR_B2"), ("b", "SR_B3")):  # one scene over two folders
            write(rasters, tmp_path / "landsat" / folder / f"{landsat}_{band}.TIF", res=30.0)
        for copy in ("copy1", "copy2"):  # two copies of one scene: a scene per folder
            for band in ("B02", "B03"):
                write(rasters, tmp_path / "s2" / copy / f"{S2}_{band}_10m.tif")
        write(rasters, tmp_path / "s2" / "copy1" / f"{S2}_B8A_20m.tif", size=8, res=20.0)

        report = inspect_rasters(list_files(str(tmp_path)), None, {})
        entries = {e.name: (e.product, sorted(f.url for f in e.files)) for e in report.entries}
        for cls, folder, bands in ((Landsat8, "landsat", ["SR_B1", "SR_B2", "SR_B3"]), (Sentinel2, "s2", ["B02"])):
            ds = cls(tmp_path / folder, bands=bands, res=30.0)
            read = [sorted(ds._files.band_path(i, b) for b in bands) for i in range(len(ds))]
            mine = [files for product, files in entries.values() if product == cls.__name__.lower()]
            assert len(mine) == len(ds)
            for files in read:
                assert sum(set(files) <= set(entry) for entry in mine) == 1
        assert relative(tmp_path, entries[f"landsat/a/{landsat}_*.TIF"][1]) == [
            f"landsat/a/{landsat}_SR_B1.TIF", f"landsat/a/{landsat}_SR_B2.TIF", f"landsat/b/{landsat}_SR_B3.TIF"]
        assert len(entries[f"s2/copy1/{S2}_*_*.tif"][1]) == 3 and len(entries[f"s2/copy2/{S2}_*_*.tif"][1]) == 2



class TestListingWithoutPerFileSteps:
    """find_paths' one-scandir-per-folder listing, and the file table's helpers, equal the per-file code."""

    @staticmethod
    def _walk_reference(top: Path, pattern: str, regex) -> list[tuple[str, str]]:
        """What find_files did before: os.walk, fnmatch on the name or relative path, side files, sorted."""
        import fnmatch
        import os

        from pipekit.geo.discovery import _is_sidecar

        found = []
        for dirpath, _, names in os.walk(top):
            rel = os.path.relpath(dirpath, top)
            rel = "" if rel == os.curdir else rel + os.sep
            for n in names:
                if fnmatch.fnmatchcase(n, pattern) or (rel and fnmatch.fnmatchcase(rel + n, pattern)):
                    found.append((os.path.join(dirpath, n), n))
        kept = sorted((p, n) for p, n in found if not _is_sidecar(n))
        return [(p, regex.match(n).group(0)) for p, n in kept if regex.match(n)]

    @pytest.fixture
    def tree(self, tmp_path: Path) -> Path:
        import os

        names = [
            "b_20210702.tif",
            "a_20210701.tif",
            "sub/c_20210703.tif",
            "sub/deeper/a_20210704.tif",
            "sub2/x_20210705.tif",
            "sub/.hidden_20210701.tif",
            "a_20210701.tif.aux.xml",
            "notes.txt",
            "a-b_20210706.tif",
            "sub.tif/z_20210707.tif",
            "Z_20210708.tif",
        ]
        for name in names:
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_bytes(b"")
        (tmp_path / "elsewhere").mkdir()
        (tmp_path / "elsewhere" / "e_20210709.tif").write_bytes(b"")
        os.symlink(tmp_path / "elsewhere", tmp_path / "linked")  # a link to a folder: listed, not followed
        os.symlink(tmp_path / "a_20210701.tif", tmp_path / "l_20210710.tif")  # a link to a file: a file
        return tmp_path

    @pytest.mark.parametrize("pattern", ["*", "*.tif", "sub/*.tif", "*/deeper/*", "a_*"])
    def test_find_paths_equals_the_walk_of_before(self, tree, pattern):
        from pipekit.geo.discovery import find_paths

        regex = re.compile(r"[a-zA-Z-]+_(?P<date>\d{8})")
        expected = self._walk_reference(tree, pattern, regex)
        paths, matches = find_paths(tree, pattern, regex)
        assert list(zip(paths, [m.group(0) for m in matches])) == expected
        assert [(p, m.group(0)) for p, m in find_files(tree, pattern, regex)] == expected

    def test_one_folder_of_names_in_any_order_and_a_glob(self, tmp_path):
        from pipekit.geo.discovery import find_paths

        names = [f"t_{(i * 7919) % 1000:04d}.tif" for i in range(1000)]
        for name in names:
            (tmp_path / name).write_bytes(b"")
        paths, _ = find_paths(tmp_path, "*", re.compile(".*"))
        assert paths == sorted(str(tmp_path / n) for n in names)
        globbed, _ = find_paths(str(tmp_path / "t_00*.tif"), "*", re.compile(".*"))  # a glob's files, sorted
        assert globbed == sorted(str(tmp_path / n) for n in names if n.startswith("t_00"))

    @pytest.mark.parametrize(
        "names",
        [
            ["a.tif", "b.tif"],
            [".a.tif", "b.tif"],
            ["a.tif", "b.TIF.AUX.XML"],
            ["a.tif.Ovr"],
            ["a.msk", "b"],
            ["a.tif.aux", "b.ovr.tif"],
            ["x\n.y", "z"],
            ["ok"],
            ["a.tif.aux.xml2"],
            ["msk", "ovr", ".x"],
        ],
    )
    def test_any_sidecar_agrees_with_each_name(self, names):
        from pipekit.geo.discovery import _any_sidecar, _is_sidecar

        if any(_is_sidecar(n) for n in names):
            assert _any_sidecar(names)  # may say True otherwise (a name with a newline): names then checked one by one
        elif not any("\n" in n for n in names):
            assert not _any_sidecar(names)

    @pytest.mark.parametrize(
        "paths",
        [
            [],
            ["/d/a.tif"],
            ["/d/t_01.tif", "/d/t_02.tif", "/d/t_10.tif"],
            ["/d/t_10.tif", "/d/t_02.tif", "/d/x.tif"],
            ["/d/a.tif", "/e/b.tif"],
            ["a.tif", "b.tif"],
            ["/d/a\0.tif", "/d/a\0/d/a.tif"],
            ["/d/a", "/d/a", "/d/ab"],
            ["s3://b/p/x_1.tif", "s3://b/p/x_2.tif"],
            ["/d/a.tif", "/d/a.tif\0/d/b", "/d/a.tif"],
        ],
    )
    def test_strip_prefix_equals_commonprefix(self, paths):
        import os

        from pipekit.geo.discovery import _strip_prefix

        prefix, names = _strip_prefix(list(paths))
        expected = os.path.commonprefix(paths) if len(paths) > 1 else ""  # noqa: RUF071
        assert prefix == expected
        assert names == [p[len(expected) :] for p in paths]

    def test_date_intervals_equal_date_interval(self):
        from pipekit.geo.discovery import date_interval, date_intervals

        texts = ["20210701", None, "", "20210701", "20211301", "20200229", "20210229", "20200229"]
        column = date_intervals(texts, "%Y%m%d")
        for k, text in enumerate(texts):
            assert column.given[k] == bool(text)
            if text in ("20211301", "20210229"):  # no such month, no such day
                assert column.failed[k] and column.error(k) is not None
                with pytest.raises(ValueError, match=re.escape(str(column.error(k)))):
                    date_interval(text, "%Y%m%d")
                continue
            assert not column.failed[k] and column.error(k) is None
            if not text:
                assert np.isnan(column.intervals[k]).all()
            else:
                assert tuple(column.intervals[k].tolist()) == date_interval(text, "%Y%m%d")

    def test_footprints_equal_the_corner_reduction(self):
        from pipekit.geo.discovery import HeaderColumns, _FileTable

        rng = np.random.default_rng(0)
        n = 500
        transforms = np.column_stack(
            [
                rng.uniform(-30, 30, n),
                rng.uniform(-5, 5, n),
                rng.uniform(-1e6, 1e6, n),
                rng.uniform(-5, 5, n),
                rng.uniform(-30, 30, n),
                rng.uniform(-1e6, 1e6, n),
            ]
        )
        transforms[::3, 1] = transforms[::3, 3] = 0.0  # north-up ones too
        shapes = rng.integers(1, 5000, (n, 2))
        columns = HeaderColumns(
            [CRS.from_string(UTM15)],
            np.zeros(n),
            ["uint8"],
            np.zeros(n),
            transforms,
            shapes,
            np.ones(n),
            np.full(n, np.nan),
            np.zeros(n, dtype=bool),
        )
        table = _FileTable.from_columns([f"/d/{i}.tif" for i in range(n)], columns, np.zeros((n, 2)), None, {})
        out = table.footprints(CRS.from_string(UTM15))
        # the computation before: corners stacked into [N, 4] and reduced along that axis
        t = transforms
        h, w = shapes[:, 0].astype(np.float64), shapes[:, 1].astype(np.float64)
        cols = np.stack([np.zeros_like(w), w, np.zeros_like(w), w], axis=1)
        rows = np.stack([np.zeros_like(h), np.zeros_like(h), h, h], axis=1)
        xs = t[:, 0:1] * cols + t[:, 1:2] * rows + t[:, 2:3]
        ys = t[:, 3:4] * cols + t[:, 4:5] * rows + t[:, 5:6]
        expected = np.column_stack([xs.min(axis=1), xs.max(axis=1), ys.min(axis=1), ys.max(axis=1)])
        np.testing.assert_array_equal(out, expected)
        for i in range(0, n, 50):
            left, bottom, right, top = table.native_bounds(i)
            np.testing.assert_allclose(out[i], [left, right, bottom, top], rtol=1e-12)
