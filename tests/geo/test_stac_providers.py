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

    def test_random_samples_land_on_the_tile_in_geographic_crs(self, fiji):
        ds = STACDataset([fiji["es"] | {"assets": _abs(fiji, "es")}, fiji["pc"] | {"assets": _abs(fiji, "pc")}],
                         assets=["red"], crs="EPSG:4326", res=0.01, dtype="native")
        assert len(ds) == 4  # each tile split in two
        sampler = RandomGeoSampler(ds, size=16, length=12)
        on_tile = [float((ds[q]["image"] > 0).float().mean()) for q in sampler]
        assert min(on_tile) > 0.5

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
