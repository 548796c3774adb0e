"""``pipekit inspect`` and ``pipekit preview`` on vector files (GeoPackage, Shapefile, GeoParquet...)."""

from __future__ import annotations

import json
from pathlib import Path

import geopandas
import numpy as np
import pytest
import shapely
from PIL import Image

X0, Y0 = 420_000.0, 4_652_320.0  # lower-left corner of the small corpus's Landsat scene (UTM 15N)


def fields(n: int = 12) -> geopandas.GeoDataFrame:
    rng = np.random.default_rng(0)
    geoms = []
    for k in range(n):
        x, y = X0 + 600 * (k % 4) + 100, Y0 + 600 * (k // 4) + 100
        geoms.append(shapely.box(x, y, x + 400, y + 300))
    geoms[0] = geoms[0].difference(shapely.box(X0 + 200, Y0 + 200, X0 + 300, Y0 + 300))  # a hole
    return geopandas.GeoDataFrame({"crop": rng.integers(1, 5, n), "name": [f"f{k}" for k in range(n)]},
                                  geometry=geoms, crs="EPSG:32615")


@pytest.fixture
def vectors(tmp_path: Path) -> Path:
    root = tmp_path / "vectors"
    root.mkdir()
    fields().to_file(root / "fields.gpkg", engine="pyogrio")
    (root / "shp").mkdir()
    fields(4).to_crs("EPSG:4326").to_file(root / "shp" / "parcels.shp", engine="pyogrio")
    fields(3).to_parquet(root / "fields.parquet")
    return root


class TestInspect:
    def test_one_geopackage(self, cli, vectors):
        code, out, err = cli("inspect", vectors / "fields.gpkg")
        assert code == 0, err
        assert "fields.gpkg" in out and "Polygon" in out and "EPSG:32615" in out
        row = next(line for line in out.splitlines() if line.startswith("fields.gpkg"))
        assert " 12 " in row and "420100.0, 4652420.0, 422300.0, 4653920.0" in row
        assert "attributes: crop (int64), name (object)" in out
        assert "12 feature(s) in 1 layer(s) of 1 vector file(s)" in out

    def test_one_geoparquet_file_is_a_vector_file_not_stac_geoparquet(self, cli, vectors):
        # a .parquet file may also be stac-geoparquet: its columns decide
        code, out, err = cli("inspect", vectors / "fields.parquet", "--json")
        assert code == 0, err
        report = json.loads(out)
        assert report["kind"] == "vectors" and report["layers"][0]["features"] == 3

    def test_folder_of_formats_as_json(self, cli, vectors):
        code, out, err = cli("inspect", vectors, "--json")
        assert code == 0, err
        report = json.loads(out)
        assert report["kind"] == "vectors" and report["errors"] == [] and report["skipped"] == []
        by_file = {layer["file"]: layer for layer in report["layers"]}
        assert set(by_file) == {"fields.gpkg", "fields.parquet", "shp/parcels.shp"}
        assert by_file["shp/parcels.shp"]["crs"] == "EPSG:4326" and by_file["shp/parcels.shp"]["features"] == 4
        assert by_file["fields.parquet"]["features"] == 3
        assert by_file["fields.parquet"]["geometry_types"] == {"Polygon": 3}
        assert set(by_file["fields.gpkg"]["attributes"]) == {"crop", "name"}

    def test_corrupt_vector_file_is_an_error_naming_it(self, cli, vectors):
        (vectors / "broken.geojson").write_text('{"type": "FeatureCollection", "features": [')
        code, out, _ = cli("inspect", vectors)
        assert code == 1
        assert "error: " in out and "broken.geojson" in out and "inspect vector file" in out


class TestPreview:
    def test_polygons_alone(self, cli, vectors, tmp_path):
        out = tmp_path / "fields.png"
        code, stdout, err = cli("preview", vectors / "fields.gpkg", "--out", out, "--label-name", "crop", "--size", 64)
        assert code == 0, err
        assert "vector mask" in stdout and out.exists()
        assert Image.open(out).format == "PNG"

    @pytest.mark.slow
    def test_polygons_beside_the_image(self, cli, small_corpus, vectors, tmp_path):
        out = tmp_path / "both.png"
        code, stdout, err = cli("preview", small_corpus / "landsat8", "--mask", vectors / "fields.gpkg",
                                "--label-name", "crop", "--out", out, "--size", 64, "--index", "none")
        assert code == 0, err
        assert "vector mask" in stdout and "RGB" in stdout
        width, height = Image.open(out).size
        assert width > height  # two panels side by side
