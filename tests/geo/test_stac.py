"""STACDataset against real components: COGs written with rasterio, catalogs written with pystac (local disk
and the SeaweedFS S3 server), a real STAC API (``rustac serve``) searched with pystac-client, and
stac-geoparquet written by rustac."""

from __future__ import annotations

import copy
import functools
import http.server
import json
import pickle
import threading
from pathlib import Path

import numpy as np
import pystac
import pytest
import rasterio
import torch

import pipekit
from pipekit.datasets import RasterDataset, STACDataset
from pipekit.errors import DatasetNotFoundError, ParseError, ReadError
from pipekit.geo import BoundingBox, stack_samples
from pipekit.geo._bbox import from_slices
from pipekit.geo.samplers import GridGeoSampler, PreChippedGeoSampler, RandomBatchGeoSampler, RandomGeoSampler
from pipekit.synthetic.stac import (
    sentinel2_items,
    write_collection_files,
    write_geoparquet,
    write_label_raster,
    write_sentinel2_cogs,
    write_static_catalog,
)

SIZE = 256
N_ITEMS = 8  # 4 tiles (2 in UTM zone 31, 2 in zone 32) x 2 dates


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("stac")
    cogs = write_sentinel2_cogs(root / "cogs", size=SIZE)
    items = sentinel2_items(cogs, str(root / "cogs"), N_ITEMS, size=SIZE)
    catalog = write_static_catalog(items, str(root / "catalog"))
    parquet = write_geoparquet(items, str(root / "items.parquet"))
    labels = write_label_raster(root / "labels" / "labels.tif", size=SIZE)
    return {"root": root, "cogs": cogs, "items": items, "catalog": catalog, "parquet": parquet, "labels": labels}


def _rewrite(prefix: str, target: str, href: str) -> str:
    return href.replace(prefix, target)


class TestSources:
    def test_static_catalog_indexes_every_item_with_its_projection_and_time(self, corpus):
        ds = STACDataset(corpus["catalog"], assets=["red", "nir"])
        assert len(ds) == N_ITEMS
        assert sorted(ds.item_ids) == sorted(i["id"] for i in corpus["items"])
        assert ds.crs.to_epsg() == 32631  # the first item's
        assert ds.res == (10.0, 10.0)
        frame = ds.index
        assert list(frame.columns[:2]) == ["filepath", "href"]
        first = corpus["items"][0]
        row = frame[frame["filepath"] == first["id"]]
        assert row["href"].iloc[0].endswith("T31TGN/B04.tif")
        interval = row.index[0]
        assert interval.left == interval.right  # a datetime, not a range
        assert ds.requests == N_ITEMS + 1  # the collection, then one request per item

    def test_sample_is_the_cog_window(self, corpus):
        ds = STACDataset(corpus["catalog"], assets=["red", "B08"])
        x0, y0 = 722_000.0, 5_271_000.0  # T31TGN's corner
        sample = ds[x0 + 100 : x0 + 420, y0 - 500 : y0 - 180]
        path = corpus["root"] / "cogs" / "T31TGN"
        with rasterio.open(path / "B04.tif") as red, rasterio.open(path / "B08.tif") as nir:
            window = rasterio.windows.Window(10, 18, 32, 32)
            expected = np.stack([red.read(1, window=window), nir.read(1, window=window)]).astype(np.float32)
        assert sample["image"].dtype == torch.float32
        assert np.array_equal(sample["image"].numpy(), expected)

    def test_mosaic_across_utm_zones_equals_raster_dataset_of_the_same_cogs(self, corpus):
        """The reads are RasterDataset's: the same files through a plain RasterDataset give the same pixels."""
        first_date = [i for i in corpus["items"] if "20240501" in i["id"]]
        stac = STACDataset(first_date, assets=["red"])
        files = [i["assets"]["B04"]["href"] for i in first_date]
        plain = RasterDataset(files, crs=stac.crs, res=stac.res)
        zones = {rasterio.open(f).crs.to_epsg() for f in files}
        assert zones == {32631, 32632}
        box = stac.bounds
        a, b = stac[box], plain[box]
        assert a["image"].shape == b["image"].shape
        assert torch.equal(a["image"], b["image"])
        # only the zone-32 tiles cover the east side (beyond the zone-31 tiles' edge, x > 724,560)
        east = stac[725_500:725_820, 5_269_500:5_269_820]
        assert (east["image"] > 0).float().mean() > 0.99
        # in the other zone's CRS, the same as the plain dataset there
        moved, plain32 = stac.to_crs("EPSG:32632", res=10), plain.to_crs("EPSG:32632", res=10)
        assert moved.index.crs.to_epsg() == 32632
        assert np.allclose(moved.index.total_bounds, plain32.index.total_bounds)
        box = moved.bounds
        assert torch.equal(moved[box]["image"], plain32[box]["image"])

    def test_api_search_pages_and_parameters(self, corpus, stac_server_factory, tmp_path):
        server = stac_server_factory(write_collection_files(corpus["items"], tmp_path))
        ds = STACDataset(server.url, assets=["red"], collections=["sentinel-2-l2a-synthetic"], limit=3)
        assert sorted(ds.item_ids) == sorted(i["id"] for i in corpus["items"])
        assert ds.requests >= 1 + 3  # the landing page (and conformance), then 3 pages of 3, 3, 2 items
        by_time = STACDataset(server.url, assets=["red"], datetime="2024-05-01/2024-05-02")
        assert sorted(by_time.item_ids) == sorted(i["id"] for i in corpus["items"] if "20240501" in i["id"])
        west = STACDataset(server.url, assets=["red"], bbox=[5.95, 47.5, 5.96, 47.56])
        assert west.item_ids and all("_T31" in i for i in west.item_ids)
        polygon = {"type": "Polygon", "coordinates": [[[5.95, 47.5], [5.96, 47.5], [5.96, 47.56], [5.95, 47.5]]]}
        assert STACDataset(server.url, assets=["red"], intersects=polygon).item_ids == west.item_ids
        assert len(STACDataset(server.url, assets=["red"], ids=[west.item_ids[0]])) == 1
        static = STACDataset(corpus["catalog"], assets=["red"])
        assert sorted(ds.item_ids) == sorted(static.item_ids)
        box = static.bounds
        assert torch.equal(ds[box]["image"], static[box]["image"])

    def test_api_without_search_parameters_is_detected_and_searched(self, corpus, stac_server_factory, tmp_path):
        server = stac_server_factory(write_collection_files(corpus["items"], tmp_path))
        ds = STACDataset(server.url, assets=["nir"])
        assert len(ds) == N_ITEMS

    def test_geoparquet_reads_one_file(self, corpus):
        ds = STACDataset(corpus["parquet"], assets=["red", "nir"])
        static = STACDataset(corpus["catalog"], assets=["red", "nir"])
        assert ds.requests == 1
        assert sorted(ds.item_ids) == sorted(static.item_ids)
        assert ds.index.sort_values("filepath")["geometry"].equals(static.index.sort_values("filepath")["geometry"])
        box = static.bounds
        assert torch.equal(ds[box]["image"], static[box]["image"])

    def test_pystac_items_and_catalog_objects(self, corpus):
        items = [pystac.Item.from_dict(copy.deepcopy(i)) for i in corpus["items"]]
        ds = STACDataset(items, assets=["green"])
        assert len(ds) == N_ITEMS
        catalog = pystac.Collection.from_file(corpus["catalog"])
        assert len(STACDataset(catalog, assets=["green"])) == N_ITEMS

    @pytest.mark.s3
    def test_static_catalog_and_cogs_on_s3(self, corpus, s3_server, s3_bucket):
        fs = s3_server.fs()
        fs.put(str(corpus["root"] / "cogs"), f"{s3_bucket}/cogs", recursive=True)
        items = sentinel2_items(corpus["cogs"], f"s3://{s3_bucket}/cogs", N_ITEMS, size=SIZE)
        href = write_static_catalog(items, f"s3://{s3_bucket}/catalog", s3_server.storage_options)
        ds = STACDataset(href, assets=["red", "nir"], storage_options=s3_server.storage_options)
        local = STACDataset(corpus["catalog"], assets=["red", "nir"])
        assert sorted(ds.item_ids) == sorted(local.item_ids)
        box = local.bounds
        assert torch.equal(ds[box]["image"], local[box]["image"])
        parquet = write_geoparquet(items, f"s3://{s3_bucket}/items.parquet", s3_server.storage_options)
        from_parquet = STACDataset(parquet, assets=["red", "nir"], storage_options=s3_server.storage_options)
        assert torch.equal(from_parquet[box]["image"], local[box]["image"])


class TestAssets:
    def test_band_names_common_names_and_keys(self, corpus):
        by_key = STACDataset(corpus["items"], assets=["B04", "B08"])
        by_common = STACDataset(corpus["items"], assets=["red", "nir"])
        box = by_key.bounds
        assert torch.equal(by_key[box]["image"], by_common[box]["image"])
        assert by_common.asset_hrefs(0).keys() == {"B04", "B08"}

    def test_missing_asset_names_the_item_and_its_keys(self, corpus):
        with pytest.raises(
            ReadError,
            match=r"S2B_MSIL2A_20240501T103629_R108_T31TGN.*has no asset or band 'swir'"
            r".*\['B02', 'B03', 'B04', 'B08'\]",
        ):
            STACDataset(corpus["items"], assets=["red", "swir"])

    def test_missing_asset_skipped_and_counted(self, corpus):
        items = copy.deepcopy(corpus["items"])
        del items[1]["assets"]["B08"]
        ds = STACDataset(items, assets=["nir"], on_error="skip")
        assert len(ds) == N_ITEMS - 1
        assert ds.skip_log.count == 1
        assert items[1]["id"] not in ds.item_ids

    def test_mask_nodata_resampling_and_native_dtype(self, corpus):
        mask = STACDataset(corpus["items"], assets=["red"], is_image=False)
        box = BoundingBox(722_000, 722_320, 5_270_680, 5_271_000)
        sample = mask[box]
        assert "image" not in sample and sample["mask"].dtype == torch.int64 and sample["mask"].shape == (32, 32)
        assert mask.resampling.name == "nearest"
        native = STACDataset(corpus["items"], assets=["red"], dtype="native", resampling="bilinear")
        assert native[box]["image"].dtype == torch.uint16 and native.resampling.name == "bilinear"
        # outside every item: the fill value is the given nodata
        filled = STACDataset(corpus["items"][:1], assets=["red"], nodata=7)
        edge = filled[722_000 - 320 : 722_320, 5_270_680:5_271_000]
        assert (edge["image"][:, :, :32] == 7).all() and (edge["image"][:, :, 32:] != 7).any()

    def test_geoparquet_missing_asset_names_the_item_and_its_keys(self, corpus, tmp_path):
        """stac-geoparquet converts only the assets asked for; a row without one still names its real keys."""
        items = copy.deepcopy(corpus["items"])
        del items[3]["assets"]["B08"]
        parquet = write_geoparquet(items, str(tmp_path / "items.parquet"))
        with pytest.raises(
            ReadError,
            match=rf"item {items[3]['id']!r} has no asset or band 'nir'.*"
            r"\['B02', 'B03', 'B04'\]",
        ):
            STACDataset(parquet, assets=["red", "nir"])
        ds = STACDataset(parquet, assets=["red", "nir"], on_error="skip")
        assert len(ds) == N_ITEMS - 1 and ds.skip_log.count == 1
        assert ds.asset_hrefs(0) == {"B04": items[0]["assets"]["B04"]["href"], "B08": items[0]["assets"]["B08"]["href"]}

    def test_item_without_projection_extension_reads_the_header_once(self, corpus):
        items = copy.deepcopy(corpus["items"])
        for item in items:
            for key in ("proj:epsg", "proj:code", "proj:transform", "proj:shape"):
                del item["properties"][key]
        bare = STACDataset(items, assets=["red"])
        full = STACDataset(corpus["items"], assets=["red"])
        assert bare.crs == full.crs and bare.res == full.res
        assert np.allclose(bare.index.total_bounds, full.index.total_bounds)
        box = full.bounds
        assert torch.equal(bare[box]["image"], full[box]["image"])

    def test_item_without_projection_and_unreadable_asset(self, corpus, tmp_path):
        items = copy.deepcopy(corpus["items"][:2])
        del items[0]["properties"]["proj:code"], items[0]["properties"]["proj:epsg"]
        items[0]["assets"]["B04"]["href"] = str(tmp_path / "gone.tif")
        with pytest.raises(ReadError, match=r"gone\.tif.*item 'S2B_MSIL2A_20240501T103629_R108_T31TGN.*no projection"):
            STACDataset(items, assets=["red"])
        ds = STACDataset(items, assets=["red"], on_error="skip")
        assert len(ds) == 1 and ds.skip_log.count == 1

    def test_href_modifier_rewrites_at_read_time(self, corpus):
        items = copy.deepcopy(corpus["items"])
        real = str(corpus["root"] / "cogs")
        for item in items:
            for asset in item["assets"].values():
                asset["href"] = asset["href"].replace(real, "https://signed.invalid/cogs")
        modifier = functools.partial(_rewrite, "https://signed.invalid", real[:-5])
        ds = STACDataset(items, assets=["red"], href_modifier=modifier)
        assert ds.asset_hrefs(0)["B04"].startswith("https://signed.invalid/")
        ds = pickle.loads(pickle.dumps(ds))
        local = STACDataset(corpus["items"], assets=["red"])
        box = local.bounds
        assert torch.equal(ds[box]["image"], local[box]["image"])
        with pytest.raises(TypeError, match="href_modifier"):
            STACDataset(items, assets=["red"], href_modifier="nope")


@pytest.fixture
def http_folder(corpus):
    """The COG folder served over HTTP on loopback (missing files answer 404, ``forbidden/`` 403)."""

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(corpus["root"] / "cogs"), **kwargs)

        def send_head(self):
            if self.path.startswith("/forbidden/"):
                self.send_error(403, "Forbidden")
                return None
            return super().send_head()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class TestReadErrors:
    @pytest.mark.parametrize(("path", "status"), [("missing/B04.tif", "404"), ("forbidden/B04.tif", "403")])
    def test_unreadable_href_names_item_asset_and_url(self, corpus, http_folder, path, status):
        items = copy.deepcopy(corpus["items"][:1])
        items[0]["assets"]["B04"]["href"] = f"{http_folder}/{path}"
        ds = STACDataset(items, assets=["red"])  # the projection extension: nothing read yet
        box = ds.bounds
        with pytest.raises(ReadError) as info:
            ds[box]
        text = str(info.value)
        assert f"{http_folder}/{path}" in text
        assert f"item {items[0]['id']!r} asset 'B04'" in text
        skipping = STACDataset(items, assets=["red"], on_error="skip")
        with pytest.raises(ReadError, match="skipped"):
            skipping[box]
        assert skipping.skip_log.count == 1

    def test_static_catalog_over_http(self, corpus, http_folder):
        items = sentinel2_items(corpus["cogs"], http_folder, N_ITEMS, size=SIZE)
        write_static_catalog(items, str(corpus["root"] / "cogs" / "http-catalog"))
        ds = STACDataset(f"{http_folder}/http-catalog/collection.json", assets=["red"])
        assert ds.requests == N_ITEMS + 2  # the root read to tell an API from a catalog, then the walk
        local = STACDataset(corpus["items"], assets=["red"])
        assert sorted(ds.item_ids) == sorted(local.item_ids)
        assert ds.asset_hrefs(0)["B04"].startswith(http_folder)
        box = local.bounds
        assert torch.equal(ds[box]["image"], local[box]["image"])

    def test_cogs_over_http_read_like_local(self, corpus, http_folder):
        real = str(corpus["root"] / "cogs")
        items = copy.deepcopy(corpus["items"])
        for item in items:
            for asset in item["assets"].values():
                asset["href"] = asset["href"].replace(real, http_folder)
        remote, local = STACDataset(items, assets=["red"]), STACDataset(corpus["items"], assets=["red"])
        box = local.bounds
        assert torch.equal(remote[box]["image"], local[box]["image"])


def _catalog(path: Path, cat_id: str, links: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({"type": "Catalog", "stac_version": "1.0.0", "id": cat_id, "description": cat_id, "links": links})
    )


class TestBadCatalogs:
    def test_cycle_names_the_link(self, tmp_path):
        _catalog(tmp_path / "catalog.json", "root", [{"rel": "child", "href": "./a/catalog.json"}])
        _catalog(tmp_path / "a" / "catalog.json", "a", [{"rel": "child", "href": "../catalog.json"}])
        with pytest.raises(ParseError, match=r"cycle: the 'child' link of '.*a/catalog.json' leads back"):
            STACDataset(str(tmp_path / "catalog.json"), assets=["red"])

    def test_broken_link_names_the_link(self, tmp_path):
        _catalog(tmp_path / "catalog.json", "root", [{"rel": "item", "href": "./nowhere/item.json"}])
        link = r"nowhere/item\.json.*broken link \(the 'item' link of '.*catalog\.json'\)"
        with pytest.raises(ReadError, match=link):
            STACDataset(str(tmp_path / "catalog.json"), assets=["red"])

    def test_empty_catalog(self, tmp_path):
        _catalog(tmp_path / "catalog.json", "root", [])
        with pytest.raises(DatasetNotFoundError, match="none of the 0 item"):
            STACDataset(str(tmp_path / "catalog.json"), assets=["red"])


class TestDataset:
    def test_pickles_small_without_item_json(self, corpus):
        items = sentinel2_items(corpus["cogs"], str(corpus["root"] / "cogs"), 1000, size=SIZE)
        ds = STACDataset(items, assets=["red", "green", "blue", "nir"])
        blob = pickle.dumps(ds)
        assert b"eo:cloud_cover" not in blob and b"common_name" not in blob
        # ~213 bytes an item (RasterDataset's per-file arrays, the ids, the hrefs once): items' JSON is >10x that
        assert len(blob) < 250_000, len(blob)
        assert len(blob) * 10 < len(json.dumps(items))
        clone = pickle.loads(blob)
        box = BoundingBox(722_000, 722_320, 5_270_680, 5_271_000)
        assert torch.equal(clone[box]["image"], ds[box]["image"])

    def test_composes_with_labels_and_other_stac_datasets(self, corpus):
        images = STACDataset(corpus["catalog"], assets=["red", "nir"])
        labels = RasterDataset(corpus["labels"])
        labels.is_image = False
        both = images & labels
        sample = both[722_000:722_320, 5_270_680:5_271_000]
        assert sample["image"].shape == (2, 32, 32) and sample["mask"].shape == (32, 32)
        assert sample["mask"].dtype == torch.int64
        first = STACDataset([i for i in corpus["items"] if "_T31" in i["id"]], assets=["red"])
        second = STACDataset([i for i in corpus["items"] if "_T32" in i["id"]], assets=["red"])
        union = first | second
        whole = STACDataset(corpus["items"], assets=["red"])
        box = whole.bounds
        assert torch.equal(union[box]["image"], whole[box]["image"])

    def test_filtering_the_index_restricts_the_items(self, corpus):
        ds = STACDataset(corpus["items"], assets=["red"])
        frame = ds.index
        ds.index = frame[frame["filepath"].str.contains("_T32") & frame["filepath"].str.contains("20240506")]
        assert len(ds) == 2 and all("_T32" in i and "20240506" in i for i in ds.item_ids)
        assert {h["B04"].split("/")[-2] for h in (ds.asset_hrefs(0), ds.asset_hrefs(1))} == {"T32TKT", "T32TKS"}
        with pytest.raises(IndexError):
            ds[722_000:722_320, 5_270_680:5_271_000]  # zone 31 only: no longer indexed
        kept = [i for i in corpus["items"] if "_T32" in i["id"] and "20240506" in i["id"]]
        only = STACDataset(kept, assets=["red"], crs=ds.crs, res=ds.res)
        box = only.bounds
        assert torch.equal(ds[box]["image"], only[box]["image"])

    @pytest.mark.parametrize("sampler", ["random", "grid", "batch", "prechipped"])
    def test_every_sampler(self, corpus, sampler):
        ds = STACDataset(corpus["parquet"], assets=["red", "nir"])
        torch.manual_seed(0)
        if sampler == "random":
            queries = list(RandomGeoSampler(ds, size=32, length=6))
        elif sampler == "grid":
            queries = list(GridGeoSampler(ds, size=128, stride=128))
        elif sampler == "batch":
            queries = [q for batch in RandomBatchGeoSampler(ds, size=32, batch_size=3, length=6) for q in batch]
        else:
            queries = list(PreChippedGeoSampler(ds))
        assert queries
        for query in queries[:8]:
            sample = ds[query]
            assert sample["image"].shape[0] == 2

    @pytest.mark.slow
    @pytest.mark.parametrize("num_workers", [0, 2])
    def test_dataloader_resumes_exactly(self, corpus, num_workers):
        images = STACDataset(corpus["catalog"], assets=["red", "nir"])
        labels = RasterDataset(corpus["labels"])
        labels.is_image = False
        data = images & labels

        def make():
            pipe = RandomGeoSampler(data, size=16, length=24).as_pipe().sharding_filter().read_geo(data)
            return pipekit.DataLoader(pipe.batch(2).collate(stack_samples), num_workers=num_workers)

        torch.manual_seed(5)
        full = list(make())
        torch.manual_seed(5)
        loader = make()
        it = iter(loader)
        head = [next(it) for _ in range(4)]
        state = pickle.loads(pickle.dumps(loader.state_dict()))
        del it, loader
        resumed = make()
        resumed.load_state_dict(state)
        got = head + list(resumed)
        assert len(got) == len(full) == 12
        for a, b in zip(got, full):
            assert [from_slices(x) for x in a["bounds"]] == [from_slices(x) for x in b["bounds"]]
            assert torch.equal(a["image"], b["image"]) and torch.equal(a["mask"], b["mask"])
