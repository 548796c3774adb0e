"""STACDataset on items shaped as providers publish them (Earth Search, Planetary Computer, Copernicus Data Space,
Planetary Computer's 3DEP COPC): the item JSON under ``tests/geo/stac_providers/`` (real field names, links, band
objects, projection fields; grids scaled down), their assets GeoTIFFs written here with each item's own CRS,
transform and shape."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import rasterio
import torch
from affine import Affine
from rasterio.warp import Resampling, reproject

from pipekit import _fast
from pipekit.datasets import RasterDataset, STACDataset
from pipekit.errors import ParseError, ReadError
from pipekit.geo.samplers import RandomGeoSampler

HERE = Path(__file__).parent / "stac_providers"
EARTH_SEARCH = "earth-search-v1-S2B_60KYF_20240105_0_L2A.json"
PLANETARY = "planetary-computer-S2A_MSIL2A_20240105T222541_R029_T01KAB.json"


def _crs_of(item: dict, asset: dict) -> str:
    fields = {**item["properties"], **asset}
    return fields.get("proj:code") or f"EPSG:{fields['proj:epsg']}"


def _dtype_of(asset: dict) -> str:
    band = (asset.get("raster:bands") or asset.get("bands") or [{}])[0]
    return band.get("data_type") or asset.get("data_type") or "uint16"


def write_item(name: str, folder: Path, seed: int = 0) -> dict:
    """Copy item ``name`` into ``folder`` and write each of its local assets as a GeoTIFF on the item's own grid."""
    folder.mkdir(parents=True, exist_ok=True)
    item = json.loads((HERE / name).read_text())
    rng = np.random.default_rng(seed)
    for asset in item["assets"].values():
        if not asset["href"].startswith("./") or not asset["href"].endswith(".tif"):
            continue
        height, width = asset["proj:shape"]
        bands = asset.get("raster:bands") or asset.get("bands") or [{}]
        dtype = _dtype_of(asset)
        nodata = (asset.get("raster:bands") or [{}])[0].get("nodata", asset.get("nodata"))
        low = 1 if np.dtype(dtype).kind == "u" else -1000
        data = rng.integers(low, 200, (len(bands), height, width)).astype(dtype)
        with rasterio.open(folder / asset["href"][2:], "w", driver="GTiff", width=width, height=height,
                           count=len(bands), dtype=dtype, crs=_crs_of(item, asset),
                           transform=Affine(*asset["proj:transform"][:6]), nodata=nodata) as dst:
            dst.write(data)
    (folder / name).write_text(json.dumps(item))
    return item


def direct_read(path: Path, crs: str, res: float, box: tuple[float, float, float, float], nodata: float = 0):
    """rasterio's own read of ``box`` (minx, maxx, miny, maxy) on a ``res`` grid in ``crs`` (nearest)."""
    minx, maxx, miny, maxy = box
    width, height = round((maxx - minx) / res), round((maxy - miny) / res)
    with rasterio.open(path) as src:
        out = np.full((height, width), nodata, dtype=src.dtypes[0])
        reproject(rasterio.band(src, 1), out, dst_transform=Affine(res, 0, minx, 0, -res, maxy), dst_crs=crs,
                  resampling=Resampling.nearest, src_nodata=src.nodata, dst_nodata=nodata)
    return out


@pytest.fixture(scope="module")
def fiji(tmp_path_factory):
    root = tmp_path_factory.mktemp("fiji")
    es = write_item(EARTH_SEARCH, root / "es")
    pc = write_item(PLANETARY, root / "pc", seed=1)
    return {"root": root, "es": es, "pc": pc, "es_json": root / "es" / EARTH_SEARCH, "pc_json": root / "pc" / PLANETARY}


# windows (minx, maxx, miny, maxy) west and east of 180 degrees, inside the Earth Search tile
WEST_4326 = (-179.9, -179.6, -17.6, -17.3)
EAST_4326 = (179.7, 179.95, -17.6, -17.35)


class TestAntimeridian:
    def test_item_across_180_in_epsg4326_has_two_footprints_one_each_side(self, fiji):
        ds = STACDataset([fiji["es"] | {"assets": _abs(fiji, "es")}], assets=["red"], crs="EPSG:4326", res=0.01)
        boxes = ds.geo_index.bounds
        assert len(ds) == 2 and ds.item_ids == [fiji["es"]["id"]] * 2
        assert (boxes[:, 0] <= boxes[:, 1]).all()
        east, west = sorted(boxes.tolist(), key=lambda b: -b[0])
        assert east[0] == pytest.approx(179.63, abs=0.01) and east[1] == 180.0
        assert west[0] == -180.0 and west[1] == pytest.approx(-179.45, abs=0.01)

    @pytest.mark.parametrize(("crs", "res", "boxes"), [
        ("EPSG:4326", 0.01, [WEST_4326, EAST_4326]),
        ("EPSG:3857", 1000.0, [(-20_027_000.0, -19_990_000.0, -1_980_000.0, -1_950_000.0),
                               (20_000_000.0, 20_030_000.0, -1_980_000.0, -1_950_000.0)]),
        ("EPSG:32760", 1000.0, [(790_000.0, 815_000.0, 8_050_000.0, 8_080_000.0),
                                (822_000.0, 860_000.0, 8_050_000.0, 8_080_000.0)]),
    ])
    def test_pixels_equal_rasterio_on_both_sides(self, fiji, crs, res, boxes, monkeypatch):
        """GDAL's warp gives rasterio's pixels exactly; the numpy warp (fast path) agrees as it does elsewhere."""
        ds = STACDataset(str(fiji["es_json"]), assets=["red"], crs=crs, res=res, dtype="native",
                         resampling="nearest")
        width = ds.bounds.maxx - ds.bounds.minx
        if crs == "EPSG:3857":
            assert len(ds) == 2 and all(b[1] - b[0] < 200_000 for b in ds.geo_index.bounds.tolist())
        elif crs == "EPSG:32760":
            assert len(ds) == 1 and width == 96_000
        for box in boxes:
            sample = ds[box[0]:box[1], box[2]:box[3]]["image"][0].numpy()
            expected = direct_read(fiji["root"] / "es" / "B04.tif", crs, res, box)
            assert (expected > 0).mean() > 0.9
            assert (sample == expected).mean() >= 0.995
            with monkeypatch.context() as m:
                m.setitem(_fast.state, "warp", False)
                assert np.array_equal(ds[box[0]:box[1], box[2]:box[3]]["image"][0].numpy(), expected)

    @pytest.mark.parametrize(("crs", "expected"), [("EPSG:4326", 0.018), ("EPSG:3857", 2100.0)])
    def test_default_resolution_is_the_grid_s_not_the_world_s(self, fiji, crs, expected):
        """A 2 km grid: about 0.018 degrees, 2.1 km in Web Mercator at 17 S (GDAL's suggestion over the whole
        crossing box spanned the world: 5.3 degrees, 589 km)."""
        ds = STACDataset(str(fiji["es_json"]), assets=["red"], crs=crs)
        assert ds.res[0] == pytest.approx(expected, rel=0.05)

    def test_random_samples_land_on_the_tile_in_geographic_crs(self, fiji):
        ds = STACDataset([fiji["es"] | {"assets": _abs(fiji, "es")}, fiji["pc"] | {"assets": _abs(fiji, "pc")}],
                         assets=["red"], crs="EPSG:4326", res=0.01, dtype="native")
        assert len(ds) == 4  # each tile split in two
        sampler = RandomGeoSampler(ds, size=16, length=12)
        on_tile = [float((ds[q]["image"] > 0).float().mean()) for q in sampler]
        assert min(on_tile) > 0.5

    def test_a_query_over_both_parts_reads_the_item_once(self, fiji):
        source = str(fiji["es_json"])
        mosaic = STACDataset(source, assets=["red"], crs="EPSG:4326", res=0.25, dtype="native")
        series = STACDataset(source, assets=["red"], crs="EPSG:4326", res=0.25, dtype="native", time_series=True)
        assert mosaic.bounds.minx == -180.0 and mosaic.bounds.maxx == 180.0
        whole = mosaic[mosaic.bounds]["image"]
        stack = series[series.bounds]
        assert stack["image"].shape[0] == 1 and torch.equal(stack["image"][0], whole)
        assert int((whole.int() > 0).sum()) > 0

    def test_raster_dataset_of_the_file_splits_too(self, fiji, monkeypatch):
        files = [str(fiji["root"] / "es" / "B04.tif"), str(fiji["root"] / "pc" / "B04.tif")]
        ds = RasterDataset(files, crs="EPSG:4326", res=0.01, dtype="native", resampling="nearest")
        assert len(ds) == 4 and (ds.geo_index.bounds[:, 0] <= ds.geo_index.bounds[:, 1]).all()
        assert sorted(ds.files) == sorted(files * 2)
        sample = ds[WEST_4326[0]:WEST_4326[1], WEST_4326[2]:WEST_4326[3]]["image"][0].numpy()
        assert (sample > 0).mean() > 0.9
        monkeypatch.setitem(_fast.state, "warp", False)
        alone = RasterDataset(files[:1], crs="EPSG:4326", res=0.01, dtype="native", resampling="nearest")
        window = alone[WEST_4326[0]:WEST_4326[1], WEST_4326[2]:WEST_4326[3]]["image"][0].numpy()
        assert np.array_equal(window, direct_read(Path(files[0]), "EPSG:4326", 0.01, WEST_4326))


    def test_saved_index_holds_a_multipolygon_and_reloads_both_parts(self, fiji, tmp_path):
        import geopandas

        path = str(fiji["root"] / "es" / "B04.tif")
        ds = RasterDataset(path, crs="EPSG:4326", res=0.01)
        where = ds.save_index(str(tmp_path / "index.parquet"))
        geometry = geopandas.read_parquet(where).geometry.iloc[0]
        assert geometry.geom_type == "MultiPolygon" and len(geometry.geoms) == 2
        again = RasterDataset(path, crs="EPSG:4326", res=0.01, index_cache=where)
        assert np.array_equal(again.geo_index.bounds, ds.geo_index.bounds)


def _abs(fiji, key: str) -> dict:
    """The item's assets with absolute hrefs (for items passed as dicts)."""
    folder = fiji["root"] / key
    return {k: a | {"href": str(folder / a["href"][2:])} if a["href"].startswith("./") else a
            for k, a in fiji[key]["assets"].items()}


ES_STAC11 = "earth-search-c1-stac11-S2B_T31UFU_20240601T103629_L2A.json"
CDSE_S1 = "copernicus-cdse-stac11-sentinel-1-global-mosaics-33UUP.json"


def with_absolute_hrefs(item: dict, folder: Path) -> dict:
    assets = {k: a | {"href": str(folder / a["href"][2:])} if a["href"].startswith("./") else a
              for k, a in item["assets"].items()}
    return item | {"assets": assets}


@pytest.fixture(scope="module")
def stac11(tmp_path_factory):
    import rustac

    root = tmp_path_factory.mktemp("stac11")
    out = {"root": root}
    for key, name in (("es", ES_STAC11), ("s1", CDSE_S1)):
        item = write_item(name, root / key, seed=2)
        out[key] = root / key / name
        out[f"{key}_parquet"] = str(root / f"{key}.parquet")
        rustac.write_sync(out[f"{key}_parquet"], [with_absolute_hrefs(item, root / key)])
    return out


class TestStac11AssetFields:
    """STAC 1.1 puts ``data_type`` and ``nodata`` on the asset (common metadata), not in ``raster:bands``."""

    @pytest.mark.parametrize("form", ["json", "parquet"])
    def test_visual_asset_level_data_type_gives_its_native_dtype(self, stac11, form):
        source = str(stac11["es"]) if form == "json" else stac11["es_parquet"]
        ds = STACDataset(source, assets=["visual"], dtype="native")
        sample = ds[ds.bounds]
        assert sample["image"].dtype == torch.uint8 and sample["image"].shape[0] == 3
        with rasterio.open(stac11["root"] / "es" / "TCI.tif") as src:
            assert np.array_equal(sample["image"].numpy(), src.read())
        assert STACDataset(source, assets=["red"], dtype="native")[ds.bounds]["image"].dtype == torch.uint16

    @pytest.mark.parametrize("form", ["json", "parquet"])
    def test_sentinel1_mosaic_fills_outside_the_scene_with_the_asset_nodata(self, stac11, form):
        source = str(stac11["s1"]) if form == "json" else stac11["s1_parquet"]
        ds = STACDataset(source, assets=["VV", "VH"], dtype="native")
        image = ds[280_000:320_000, 5_460_000:5_500_000]["image"].numpy()  # the west half is outside the scene
        assert image.dtype == np.int16
        assert (image[:, :, :10] == -32768).all()
        assert (image[:, :, 10:] != -32768).all()

    def test_precedence_band_then_asset_then_item(self):
        """Each place the 1.0 and 1.1 specifications allow, the most specific first (docs/guides/stac.md's table)."""
        from pipekit.geo._stac_items import record_from_dict
        from pipekit.geo.catalog._stac_assets import header_from_proj

        def item(props: dict, asset: dict) -> dict:
            grid = {"proj:code": "EPSG:32633", "proj:transform": [10, 0, 0, 0, -10, 0], "proj:shape": [4, 4]}
            return {"type": "Feature", "id": "x", "properties": {"datetime": "2024-01-01T00:00:00Z", **grid, **props},
                    "assets": {"VV": {"href": "vv.tif", **asset}}}

        cases = [  # (item properties, asset fields, expected (dtype, nodata))
            ({"data_type": "float64", "nodata": 1}, {}, ("float64", 1.0)),
            ({"data_type": "float64", "nodata": 1}, {"data_type": "int16", "nodata": -32768}, ("int16", -32768.0)),
            ({}, {"data_type": "int16", "nodata": -32768, "bands": [{"name": "VV", "nodata": -9999}]},
             ("int16", -9999.0)),
            ({}, {"nodata": 5, "bands": [{"nodata": 6}], "raster:bands": [{"nodata": 7, "data_type": "uint8"}]},
             ("uint8", 7.0)),
            ({}, {"bands": [{"name": "VV", "nodata": "nan", "data_type": "float32"}]}, ("float32", None)),
        ]
        for props, asset, (dtype, nodata) in cases:
            header = header_from_proj(record_from_dict(item(props, asset)), "VV", "vv.tif")
            assert header.dtype == dtype
            assert (np.isnan(header.nodata) if nodata is None else header.nodata == nodata), (props, asset)


COPC = "planetary-computer-3dep-lidar-copc-USGS_LPC_HI_Oahu.json"


def _catalog_of(items: list[dict], root: Path) -> str:
    """A self-contained static collection of ``items`` (pystac's layout) under ``root``."""
    from pipekit.synthetic.stac import write_static_catalog

    return write_static_catalog([i | {"links": []} for i in items], str(root), collection_id="c")


class TestSavedSearches:
    """``stac-client search --save`` writes an ItemCollection (a GeoJSON FeatureCollection of items)."""

    def test_item_collection_saved_from_a_rustac_search(self, fiji, stac_server_factory, tmp_path):
        from pystac_client import Client

        from pipekit.synthetic.stac import write_collection_files

        items = [with_absolute_hrefs(fiji[k], fiji["root"] / k) for k in ("es", "pc")]
        server = stac_server_factory(write_collection_files(items, tmp_path / "api", collection_id="sentinel-2-l2a"))
        east = [-179.53, -17.5, -179.47, -17.4]  # east of 180 degrees, on the zone-60 tile only
        api = STACDataset(server.url, assets=["red"], bbox=east, crs="EPSG:4326", res=0.01)
        assert set(api.item_ids) == {fiji["es"]["id"]}
        saved = tmp_path / "search.json"
        Client.open(server.url).search(collections=["sentinel-2-l2a"], max_items=10).item_collection().save_object(
            dest_href=str(saved))
        assert json.loads(saved.read_text())["type"] == "FeatureCollection"
        ds = STACDataset(str(saved), assets=["red"], crs="EPSG:4326", res=0.01)
        assert sorted(set(ds.item_ids)) == sorted(i["id"] for i in items) and len(ds) == 4
        box = (179.8, 179.9, -17.5, -17.4)
        assert torch.equal(ds[box[0]:box[1], box[2]:box[3]]["image"], api[box[0]:box[1], box[2]:box[3]]["image"])
        # the same search evaluated on the saved file selects what the API did, across 180 degrees too
        assert set(STACDataset(str(saved), assets=["red"], bbox=east).item_ids) == set(api.item_ids)
        across = [179.9, -17.5, -179.9, -17.4]  # a bbox across 180 degrees (rustac's server refuses it as invalid)
        assert set(STACDataset(str(saved), assets=["red"], bbox=across).item_ids) == {i["id"] for i in items}

    def test_feature_collection_with_relative_hrefs(self, fiji, tmp_path):
        doc = {"type": "FeatureCollection", "features": [dict(fiji["es"])]}
        folder = fiji["root"] / "es"
        (folder / "saved.geojson").write_text(json.dumps(doc))
        ds = STACDataset(str(folder / "saved.geojson"), assets=["red"])
        assert ds.item_ids == [fiji["es"]["id"]] and ds.asset_hrefs(0)["red"] == str(folder / "B04.tif")

    def test_geojson_that_is_not_items_is_refused_naming_what_it_is(self, tmp_path):
        plain = {"type": "FeatureCollection", "features": [
            {"type": "Feature", "properties": {"name": "field 1"},
             "geometry": {"type": "Point", "coordinates": [0, 0]}}]}
        (tmp_path / "fields.geojson").write_text(json.dumps(plain))
        with pytest.raises(ParseError, match=r"fields.geojson.*FeatureCollection of 1 feature.*not STAC items"):
            STACDataset(str(tmp_path / "fields.geojson"), assets=["red"])
        (tmp_path / "other.json").write_text(json.dumps({"type": "Topology", "objects": {}}))
        with pytest.raises(ParseError, match=r"other.json.*not a STAC catalog, collection, item or item collection"):
            STACDataset(str(tmp_path / "other.json"), assets=["red"])


class TestBrokenDocuments:
    @pytest.fixture
    def catalog(self, fiji, tmp_path):
        items = []
        for n in range(3):
            item = with_absolute_hrefs(fiji["es"], fiji["root"] / "es")
            items.append(item | {"id": f"{item['id']}_{n}"})
        href = _catalog_of(items, tmp_path / "cat")
        return href, [tmp_path / "cat" / i["id"] / f"{i['id']}.json" for i in items]

    def test_truncated_item_skipped_counted_and_named(self, catalog):
        href, files = catalog
        files[1].write_text(files[1].read_text()[:200])
        with pytest.raises(ParseError, match="not JSON"):
            STACDataset(href, assets=["red"])
        ds = STACDataset(href, assets=["red"], on_error="skip")
        assert len(ds.item_ids) == 2 and ds.skip_log.count == 1
        assert ds.skip_log.skipped[0].url == str(files[1]) and "not JSON" in ds.skip_log.skipped[0].reason

    def test_impossible_datetime_is_a_parse_error_naming_file_and_stage(self, catalog):
        href, files = catalog
        doc = json.loads(files[2].read_text())
        doc["properties"]["datetime"] = "2024-02-30T22:25:48Z"
        files[2].write_text(json.dumps(doc))
        with pytest.raises(ParseError) as info:
            STACDataset(href, assets=["red"])
        assert info.value.url == str(files[2]) and info.value.stage == "STACDataset"
        assert "2024-02-30T22:25:48Z" in info.value.reason and doc["id"] in info.value.reason
        ds = STACDataset(href, assets=["red"], on_error="skip")
        assert len(ds.item_ids) == 2 and ds.skip_log.skipped[0].url == str(files[2])

    def test_empty_id_refused(self, catalog):
        href, files = catalog
        doc = json.loads(files[0].read_text())
        doc["id"] = ""
        files[0].write_text(json.dumps(doc))
        with pytest.raises(ParseError, match="empty id") as info:
            STACDataset(href, assets=["red"])
        assert info.value.url == str(files[0])
        ds = STACDataset(href, assets=["red"], on_error="skip")
        assert len(ds.item_ids) == 2 and ds.skip_log.count == 1


class TestNonRasterAssets:
    @pytest.fixture
    def copc(self, tmp_path):
        item = json.loads((HERE / COPC).read_text())
        (tmp_path / "cloud.copc.laz").write_bytes(b"LASF" + bytes(400))
        (tmp_path / "footprints.gpkg").write_bytes(b"SQLite format 3\x00" + bytes(400))
        return with_absolute_hrefs(item, tmp_path)

    @pytest.mark.parametrize(("asset", "media_type"), [("data", "application/vnd.laszip+copc"),
                                                       ("footprints", "application/geopackage+sqlite3")])
    def test_error_names_the_media_type(self, copc, asset, media_type):
        with pytest.raises(ReadError) as info:
            STACDataset([copc], assets=[asset])
        message = str(info.value)
        assert media_type in message and copc["id"] in message and repr(asset) in message
        assert copc["assets"][asset]["href"] in message


class TestGeoparquetForms:
    """The same provider items as stac-geoparquet (written by rustac): the same entries, pixels and errors."""

    def test_antimeridian_items(self, fiji, tmp_path):
        import rustac

        items = [with_absolute_hrefs(fiji[k], fiji["root"] / k) for k in ("es", "pc")]
        rustac.write_sync(str(tmp_path / "fiji.parquet"), items)
        from_parquet = STACDataset(str(tmp_path / "fiji.parquet"), assets=["red"], crs="EPSG:4326", res=0.01)
        from_json = STACDataset(items, assets=["red"], crs="EPSG:4326", res=0.01)
        assert len(from_parquet) == 4 and np.allclose(from_parquet.geo_index.bounds, from_json.geo_index.bounds)
        for box in (WEST_4326, EAST_4326):
            q = (slice(box[0], box[1]), slice(box[2], box[3]))
            assert torch.equal(from_parquet[q]["image"], from_json[q]["image"])

    def test_non_raster_asset_and_empty_id(self, fiji, tmp_path):
        import rustac

        copc = with_absolute_hrefs(json.loads((HERE / COPC).read_text()), tmp_path)
        raster = with_absolute_hrefs(fiji["es"], fiji["root"] / "es")
        rustac.write_sync(str(tmp_path / "copc.parquet"), [copc])
        with pytest.raises(ReadError, match=r"'data' \(media type 'application/vnd.laszip\+copc'\) is not a raster"):
            STACDataset(str(tmp_path / "copc.parquet"), assets=["data"])
        rustac.write_sync(str(tmp_path / "ids.parquet"), [raster, raster | {"id": ""}])
        with pytest.raises(ParseError, match="empty id"):
            STACDataset(str(tmp_path / "ids.parquet"), assets=["red"])
        ds = STACDataset(str(tmp_path / "ids.parquet"), assets=["red"], on_error="skip")
        assert ds.item_ids == [raster["id"]] and ds.skip_log.count == 1
