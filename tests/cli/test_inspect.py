"""``pipekit inspect``: rasters (local and S3), image folders and tar shards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import rasterio
from rasterio.warp import transform_bounds

from pipekit.synthetic.geo import LANDSAT8_BANDS

from .conftest import s3_options

SCENE = "LC08_L2SP_026031_20230715_20230725_02_T1"


def table_rows(out: str) -> dict[str, list[str]]:
    """The first table of the output, as ``{first column: cells}`` (columns split on 2+ spaces)."""
    import re

    lines = out.splitlines()
    rows = {}
    for line in lines[2:]:
        if not line.strip():
            break
        cells = re.split(r"\s{2,}", line.strip())
        rows[cells[0]] = cells
    return rows


def lonlat_of(path: Path) -> tuple[float, ...]:
    with rasterio.open(path) as ds:
        return tuple(transform_bounds(ds.crs, "EPSG:4326", *ds.bounds, densify_pts=21))


class TestRasters:
    def test_table_of_products(self, cli, rasters):
        code, out, err = cli("inspect", rasters)
        assert code == 0, err
        rows = table_rows(out)
        scene = f"landsat8/{SCENE}/{SCENE}_*.TIF"
        assert set(rows) == {"cdl/2023_30m_cdls.tif", scene, "s2/T15TVG_20210701T170859_*_*.tif",
                             "naip/m_4209055_ne_15_060_20190715.tif", "dem/elevation.tif", "scan.tif"}
        # file, product, CRS, res, size, bands, dtype, date, footprint, lon/lat, layout, bytes
        landsat = rows[scene]
        assert landsat[1:8] == ["landsat8", "EPSG:32615", "30", "256x256", "9: SR_B1..QA_PIXEL", "uint16",
                                "2023-07-15"]
        assert landsat[8] == "420000, 4652320, 427680, 4660000"
        assert landsat[10] == "blocks 256x256, deflate"
        assert rows["cdl/2023_30m_cdls.tif"][1:3] == ["cdl", "EPSG:5070"]
        assert rows["cdl/2023_30m_cdls.tif"][7] == "2023"
        s2 = rows["s2/T15TVG_20210701T170859_*_*.tif"]
        assert s2[1:8] == ["sentinel2", "EPSG:32615", "10", "64x64", "1: B04", "uint16", "2021-07-01T17:08:59"]
        naip = rows["naip/m_4209055_ne_15_060_20190715.tif"]
        assert naip[1:8] == ["naip", "EPSG:26915", "1", "60x80", "4: R,G,B,NIR", "uint8", "2019-07-15"]
        assert naip[10] == "blocks 16x16, deflate"
        dem = rows["dem/elevation.tif"]
        assert dem[1:7] == ["raster", "EPSG:4326", "0.01", "30x20", "1: 1", "float32"]
        assert dem[8] == "-94.0000, 41.9000, -93.7000, 42.1000"
        assert rows["scan.tif"][1:3] == ["raster", "none"]
        # summary
        assert f"{len(LANDSAT8_BANDS) + 5} raster file(s) in 6 entries" in out
        crs_line = next(line for line in out.splitlines() if line.startswith("CRS: "))
        assert crs_line.startswith("CRS: EPSG:32615 (2), ")
        assert sorted(crs_line[len("CRS: "):].split(", ")) == [
            "EPSG:26915 (1)", "EPSG:32615 (2)", "EPSG:4326 (1)", "EPSG:5070 (1)"]
        assert "1 raster(s) without a CRS or geotransform (not on the map), e.g. scan.tif" in out
        assert "1 other file(s) ignored, e.g. notes.txt" in out
        assert "dates: 2023 (cdl); 2023-07-15 (landsat8); 2019-07-15 (naip); 2021-07-01T17:08:59 (sentinel2)" in out

    def test_union_footprint_is_the_union_of_the_files(self, cli, rasters):
        code, out, _ = cli("inspect", rasters, "--json")
        assert code == 0
        report = json.loads(out)
        files = [p for p in rasters.rglob("*.tif") if p.name != "scan.tif"]
        files += list((rasters / "landsat8").rglob("*.TIF"))
        boxes = [lonlat_of(p) for p in files]
        expected = [min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes),
                    max(b[3] for b in boxes)]
        assert report["union_lonlat"] == pytest.approx(expected, abs=1e-9)
        assert report["union_crs"] is None  # several CRSs
        landsat = next(e for e in report["entries"] if e["product"] == "landsat8")
        assert landsat["bands"] == list(LANDSAT8_BANDS)
        assert len(landsat["files"]) == len(LANDSAT8_BANDS)
        assert landsat["bounds"] == [420000.0, 4652320.0, 427680.0, 4660000.0]
        assert report["errors"] == []

    def test_product_filter(self, cli, rasters):
        code, out, _ = cli("inspect", rasters, "--product", "landsat8", "--json")
        assert code == 0
        report = json.loads(out)
        assert [e["product"] for e in report["entries"]] == ["landsat8"]
        assert report["union_crs"] == "EPSG:32615"
        assert report["union"] == [420000.0, 4652320.0, 427680.0, 4660000.0]
        code, out, _ = cli("inspect", rasters, "--product", "raster", "--json")
        assert sorted(e["name"] for e in json.loads(out)["entries"]) == ["dem/elevation.tif", "scan.tif"]

    def test_product_absent(self, cli, rasters):
        code, out, err = cli("inspect", rasters / "landsat8", "--product", "cdl")
        assert code == 2 and out == ""
        assert err.strip() == (f"pipekit inspect: error: no cdl files (named like '*_30m_cdls.*') in "
                               f"'{rasters / 'landsat8'}'")

    def test_single_file(self, cli, rasters):
        path = rasters / "cdl" / "2023_30m_cdls.tif"
        code, out, _ = cli("inspect", path)
        assert code == 0
        assert list(table_rows(out)) == ["2023_30m_cdls.tif"]
        with rasterio.open(path) as ds:
            bounds = ", ".join(f"{v:.0f}" for v in ds.bounds)
        assert f"union footprint (EPSG:5070): {bounds}" in out

    def test_unreadable_raster_is_reported_with_status_1(self, cli, rasters, tmp_path):
        import shutil

        folder = tmp_path / "r"
        shutil.copytree(rasters / "dem", folder)
        (folder / "broken.tif").write_bytes(b"II*\x00 this is not a tiff")
        code, out, _ = cli("inspect", folder)
        assert code == 1
        rows = table_rows(out)
        assert rows["broken.tif"][8] == "unreadable (see below)"
        assert f"error: cannot open raster '{folder / 'broken.tif'}' in inspect: RasterioIOError: " in out
        assert rows["elevation.tif"][1] == "raster"

    def test_mixed_folder_and_kind(self, cli, image_folder, rasters, tmp_path):
        import shutil

        mixed = tmp_path / "mixed"
        shutil.copytree(image_folder, mixed)
        shutil.copy(rasters / "dem" / "elevation.tif", mixed / "elevation.tif")
        code, out, _ = cli("inspect", mixed, "--json")
        assert code == 0 and json.loads(out)["kind"] == "images"  # the most common kind
        assert json.loads(out)["skipped"] == ["elevation.tif"]
        code, out, _ = cli("inspect", mixed, "--kind", "rasters", "--json")
        assert code == 0
        report = json.loads(out)
        assert [e["name"] for e in report["entries"]] == ["elevation.tif"] and len(report["skipped"]) == 13
        code, _, err = cli("inspect", mixed, "--kind", "images", "--product", "cdl")
        assert code == 2 and "--product applies to rasters" in err

    def test_nothing_to_inspect(self, cli, tmp_path):
        (tmp_path / "a.txt").write_text("x")
        code, out, err = cli("inspect", tmp_path)
        assert code == 2 and out == ""
        assert "nothing to inspect" in err and "1 file(s)" in err and "\n" not in err.strip()


class TestImageFolder:
    def test_counts_formats_sizes(self, cli, image_folder):
        code, out, err = cli("inspect", image_folder)
        assert code == 0, err
        rows = table_rows(out)
        assert list(rows) == ["circle", "square", "stripes", "triangle"]
        assert rows["circle"][1:3] == ["4", "jpg 3, png 1"]
        assert rows["square"][1:3] == ["3", "jpg 3"]
        assert "13 image(s) in 4 class(es); formats: jpg 12, png 1" in out
        assert "images per class: 3 .. 4" in out

    def test_json_sizes_match_the_files(self, cli, image_folder):
        from PIL import Image

        code, out, _ = cli("inspect", image_folder, "--json")
        assert code == 0
        report = json.loads(out)
        assert report["kind"] == "images"
        sizes = [Image.open(p).size for p in image_folder.rglob("*.*") if p.suffix in (".jpg", ".png")]
        total = report["total"]
        assert total["count"] == 13 and total["sizes_sampled"] == 13
        assert total["min_size"] == [min(w for w, _ in sizes), min(h for _, h in sizes)]
        assert total["max_size"] == [max(w for w, _ in sizes), max(h for _, h in sizes)]
        assert total["modes"] == {"RGB": 12, "L": 1}
        assert report["classes"]["circle"]["formats"] == {"jpg": 3, "png": 1}

    def test_sample_limits_headers_read(self, cli, image_folder):
        code, out, _ = cli("inspect", image_folder, "--sample", "4", "--json")
        assert code == 0
        assert json.loads(out)["total"]["sizes_sampled"] == 4

    def test_corrupt_image_header(self, cli, tmp_path):
        (tmp_path / "cats").mkdir()
        (tmp_path / "cats" / "bad.jpg").write_bytes(b"not a jpeg")
        code, out, _ = cli("inspect", tmp_path)
        assert code == 1
        assert f"error: cannot read the image header of '{tmp_path / 'cats' / 'bad.jpg'}'" in out


class TestShards:
    def test_samples_classes_sizes(self, cli, shards):
        code, out, err = cli("inspect", shards)
        assert code == 0, err
        rows = table_rows(out)
        assert list(rows) == ["shard-000000.tar", "shard-000001.tar"]
        assert rows["shard-000000.tar"][1:3] == ["4", ".cls 4, .jpg 4"]
        assert "8 sample(s) in 2 shard(s)" in out
        assert "image sizes from 8 sampled image(s): 32x32; modes: RGB 8" in out

    def test_classes_match_the_cls_entries(self, cli, shards):
        import tarfile
        from collections import Counter

        expected = Counter()
        for path in sorted(shards.glob("*.tar")):
            with tarfile.open(path) as tar:
                for m in tar:
                    if m.name.endswith(".cls"):
                        expected[str(int(tar.extractfile(m).read()))] += 1
        code, out, _ = cli("inspect", shards, "--json")
        assert code == 0
        report = json.loads(out)
        assert report["classes"] == dict(expected)
        assert report["samples"] == 8 and report["unlabelled"] == 0

    def test_truncated_shard(self, cli, shards, tmp_path):
        data = (shards / "shard-000000.tar").read_bytes()
        (tmp_path / "cut.tar").write_bytes(data[: len(data) // 2 + 100])
        code, out, _ = cli("inspect", tmp_path)
        assert code == 1
        assert f"error: cannot read shard '{tmp_path / 'cut.tar'}'" in out


@pytest.mark.s3
class TestS3:
    def test_rasters_images_and_shards_in_a_bucket(self, cli, s3_server, rasters, image_folder, shards):
        bucket = s3_server.create_bucket()
        fs = s3_server.fs()
        fs.put(str(rasters / "landsat8"), f"{bucket}/geo/landsat8", recursive=True)
        fs.put(str(rasters / "cdl"), f"{bucket}/geo/cdl", recursive=True)
        fs.put(str(image_folder), f"{bucket}/imgs", recursive=True)
        fs.put(str(shards / "shard-000000.tar"), f"{bucket}/shards/shard-000000.tar")
        fs.invalidate_cache()
        opts = s3_options(s3_server)

        code, out, err = cli("inspect", f"s3://{bucket}/geo", *opts, "--json")
        assert code == 0, err
        report = json.loads(out)
        assert sorted(e["product"] for e in report["entries"]) == ["cdl", "landsat8"]
        local = json.loads(cli("inspect", rasters, "--product", "landsat8", "--json")[1])["entries"][0]
        remote = next(e for e in report["entries"] if e["product"] == "landsat8")
        assert remote["bounds"] == local["bounds"] and remote["bands"] == local["bands"]
        assert all(f.startswith(f"s3://{bucket}/geo/landsat8/") for f in remote["files"])
        assert report["errors"] == []

        code, out, err = cli("inspect", f"s3://{bucket}/imgs", *opts)
        assert code == 0, err
        assert "13 image(s) in 4 class(es)" in out

        code, out, err = cli("inspect", f"s3://{bucket}/shards", *opts)
        assert code == 0, err
        assert "4 sample(s) in 1 shard(s)" in out

    def test_missing_prefix(self, cli, s3_server):
        bucket = s3_server.create_bucket()
        code, _, err = cli("inspect", f"s3://{bucket}/nothing-here", *s3_options(s3_server))
        assert code == 2
        assert err.strip() == f"pipekit inspect: error: no such file or directory: 's3://{bucket}/nothing-here'"
