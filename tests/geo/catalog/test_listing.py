"""pipekit.geo.catalog._listing: finding files (scans, globs, lists of roots, siblings, side files)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipekit.geo.catalog._listing import any_band_glob, find_files

DATED = re.compile(r"(?P<name>[.a-z]+)_(?P<date>\d{8})\.tif")
BANDS = re.compile(r"^T(?P<tile>\w{5})_(?P<date>\d{8}T\d{6})_(?P<band>B\d\d)(?:_(?P<resolution>\d{2}m))?\.tif$")
S2 = "T15TVG_20210701T170859"


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

        from pipekit.geo.catalog._listing import _is_sidecar

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
        assert str(info.value).startswith("Dataset not found: Dated: ") and repr(tmp_path) in str(info.value)
        with pytest.raises(FileNotFoundError, match="no such file or directory"):
            find_files(tmp_path / "missing", "*", DATED)

    def test_any_band_glob(self):
        assert any_band_glob("T*_*_{}*.*") == "T*_*_**.*"
        assert any_band_glob("*.tif") == "*.tif"


class TestListingWithoutPerFileSteps:
    """find_paths' one-scandir-per-folder listing equals the per-file code."""

    @staticmethod
    def _walk_reference(top: Path, pattern: str, regex) -> list[tuple[str, str]]:
        """What find_files did before: os.walk, fnmatch on the name or relative path, side files, sorted."""
        import fnmatch
        import os

        from pipekit.geo.catalog._listing import _is_sidecar

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
        from pipekit.geo.catalog._listing import find_paths

        regex = re.compile(r"[a-zA-Z-]+_(?P<date>\d{8})")
        expected = self._walk_reference(tree, pattern, regex)
        paths, matches = find_paths(tree, pattern, regex)
        assert list(zip(paths, [m.group(0) for m in matches])) == expected
        assert [(p, m.group(0)) for p, m in find_files(tree, pattern, regex)] == expected

    def test_one_folder_of_names_in_any_order_and_a_glob(self, tmp_path):
        from pipekit.geo.catalog._listing import find_paths

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
        from pipekit.geo.catalog._listing import _any_sidecar, _is_sidecar

        if any(_is_sidecar(n) for n in names):
            assert _any_sidecar(names)  # may say True otherwise (a name with a newline): names then checked one by one
        elif not any("\n" in n for n in names):
            assert not _any_sidecar(names)
