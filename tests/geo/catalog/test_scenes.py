"""pipekit.geo.catalog._scenes: band files grouped into scenes, by the datasets and by ``pipekit inspect``."""

from __future__ import annotations

import re
from pathlib import Path

from affine import Affine

from pipekit.geo.catalog._scenes import group_scenes

UTM15 = "EPSG:32615"
BANDS = re.compile(r"^T(?P<tile>\w{5})_(?P<date>\d{8}T\d{6})_(?P<band>B\d\d)(?:_(?P<resolution>\d{2}m))?\.tif$")
S2 = "T15TVG_20210701T170859"


def write(rasters, path: Path, size: int = 16, res: float = 10.0, blocksize: int = 16, **kwargs) -> Path:
    """A small uint16 GeoTIFF in UTM 15N."""
    transform = Affine(res, 0.0, 500_000.0, 0.0, -res, 4_650_000.0)
    return rasters.write_tif(path, rasters.pattern(size, size), UTM15, transform, blocksize=blocksize, **kwargs)


def relative(root: Path, paths) -> list[str]:
    return sorted(str(Path(p).relative_to(root)) for p in paths)


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


class TestInspectSharesTheDatasetsScenes:
    """``pipekit inspect`` groups band files with the datasets' code: an entry is a scene a dataset indexes."""

    def test_entries_are_the_scenes_of_the_datasets(self, rasters, tmp_path):
        from pipekit.cli._common import list_files
        from pipekit.cli._inspection_rasters import inspect_rasters
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
