"""``pipekit inspect`` on STAC: a static catalog (local and S3), a STAC API (rustac serve), stac-geoparquet."""

from __future__ import annotations

import json

import pytest

from pipekit.synthetic.stac import (
    sentinel2_items,
    write_collection_files,
    write_geoparquet,
    write_sentinel2_cogs,
    write_static_catalog,
)

from .conftest import s3_options

N_ITEMS = 6


@pytest.fixture(scope="module")
def stac_corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("stac-inspect")
    cogs = write_sentinel2_cogs(root / "cogs", size=256, tiles=["T31TGN", "T32TKT"])
    items = sentinel2_items(cogs, str(root / "cogs"), N_ITEMS, size=256)
    # the last item is a range (start/end_datetime) without the projection extension
    last = items[-1]["properties"]
    for key in ("proj:epsg", "proj:code", "proj:transform", "proj:shape"):
        del last[key]
    last["start_datetime"], last["end_datetime"] = "2024-05-10T00:00:00Z", "2024-06-30T00:00:00Z"
    return {"root": root, "cogs": cogs, "items": items,
            "catalog": write_static_catalog(items, str(root / "catalog")),
            "parquet": write_geoparquet(items, str(root / "items.parquet"))}


def _check(report: dict, kind: str) -> None:
    assert report["kind"] == "stac" and report["source_kind"] == kind
    assert report["items"] == N_ITEMS
    assert report["collections"] == {"sentinel-2-l2a-synthetic": N_ITEMS}
    assert report["time_span"] == ["2024-05-01T10:36:29Z", "2024-06-30T00:00:00Z"]
    assert report["assets"]["B08"] == {"items": N_ITEMS, "bands": ["B08 (nir)"],
                                       "type": "image/tiff; application=geotiff; profile=cloud-optimized",
                                       "data_type": "uint16", "nodata": 0}
    assert report["crs"] == {"EPSG:32631": 3, "EPSG:32632": 2, "unknown (no projection extension)": 1}


def test_static_catalog_table(cli, stac_corpus):
    code, out, err = cli("inspect", stac_corpus["catalog"])
    assert code == 0, err
    assert f"static catalog, {N_ITEMS} item(s)" in out
    assert "time span: 2024-05-01T10:36:29Z .. 2024-06-30T00:00:00Z" in out
    assert "EPSG:32631 (3), EPSG:32632 (2)" in out
    assert any(line.split()[:4] == ["B04", str(N_ITEMS), "B04", "(red)"] for line in out.splitlines())


def test_static_catalog_and_geoparquet_json(cli, stac_corpus):
    code, out, err = cli("inspect", stac_corpus["catalog"], "--json")
    assert code == 0, err
    _check(json.loads(out), "static catalog")
    code, out, err = cli("inspect", stac_corpus["parquet"], "--json")
    assert code == 0, err
    _check(json.loads(out), "stac-geoparquet")


def test_stac_api(cli, stac_corpus, stac_server_factory, tmp_path):
    server = stac_server_factory(write_collection_files(stac_corpus["items"], tmp_path))
    code, out, err = cli("inspect", server.url, "--json")
    assert code == 0, err
    _check(json.loads(out), "STAC API")


def test_broken_catalog_is_a_one_line_error(cli, tmp_path):
    (tmp_path / "catalog.json").write_text(json.dumps({
        "type": "Catalog", "stac_version": "1.0.0", "id": "c", "description": "c",
        "links": [{"rel": "child", "href": "./missing/catalog.json"}]}))
    code, _, err = cli("inspect", tmp_path / "catalog.json")
    assert code == 2  # a CliError: one line, no traceback
    assert "missing/catalog.json" in err and "broken link" in err


@pytest.mark.s3
def test_static_catalog_on_s3(cli, stac_corpus, s3_server, s3_bucket):
    href = write_static_catalog(stac_corpus["items"], f"s3://{s3_bucket}/catalog", s3_server.storage_options)
    code, out, err = cli("inspect", href, "--json", *s3_options(s3_server))
    assert code == 0, err
    _check(json.loads(out), "static catalog")


def test_stac11_asset_level_data_type_and_nodata(cli, tmp_path):
    """A Copernicus Data Space Sentinel-1 mosaic (STAC 1.1): data type and nodata on the asset, as the dataset reads."""
    from pathlib import Path

    item = json.loads((Path(__file__).parents[1] / "geo" / "stac_providers" /
                       "copernicus-cdse-stac11-sentinel-1-global-mosaics-33UUP.json").read_text())
    (tmp_path / "item.json").write_text(json.dumps(item))
    code, out, err = cli("inspect", str(tmp_path / "item.json"), "--json")
    assert code == 0, err
    vv = json.loads(out)["assets"]["VV"]
    assert (vv["data_type"], vv["nodata"]) == ("int16", -32768)
    code, out, err = cli("inspect", str(tmp_path / "item.json"))
    rows = [line.split() for line in out.splitlines()]
    assert any(row[:2] == ["VV", "1"] and row[-2:] == ["int16", "-32768"] for row in rows)
