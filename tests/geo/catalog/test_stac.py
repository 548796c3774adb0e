"""STACCatalog: STAC items as the entries of a dataset, without a dataset: table, parts, labels, hrefs."""

from __future__ import annotations

import datetime

import numpy as np
import pytest
from rasterio.crs import CRS

from pipekit.errors import SkipLog
from pipekit.geo import io as geo_io
from pipekit.geo._reader import EntryLabel
from pipekit.geo.catalog import STACCatalog

pystac = pytest.importorskip("pystac")

UTM31 = "EPSG:32631"


def _item(name: str, x0: float, root: str = "s3://bucket/tiles") -> pystac.Item:
    item = pystac.Item(name, {"type": "Point", "coordinates": [4.4, 47.8]}, None, datetime.datetime(2024, 6, 1),
                       {"proj:code": UTM31, "proj:transform": [10, 0, x0, 0, -10, 5300000], "proj:shape": [64, 64]})
    for key, common in (("B04", "red"), ("B08", "nir")):
        item.add_asset(key, pystac.Asset(f"{root}/{name}/{key}.tif", extra_fields={
            "eo:bands": [{"name": key, "common_name": common}]}))
    return item


def _catalog(items, assets=("red", "nir"), **changes) -> STACCatalog:
    options = {"search": {}, "client_options": {}, "href_modifier": None, "opener": geo_io.RasterOpener(),
               "name": "STACDataset", "on_error": "raise", "skip_log": SkipLog("STACDataset")}
    options.update(changes)
    return STACCatalog(items, list(assets), **options)


class TestBuild:
    def test_one_row_per_item_with_its_grid_from_the_projection_extension(self):
        catalog = _catalog([_item("a", 600000), _item("b", 600640)])
        table = catalog.build()
        assert [table.path(i) for i in range(len(table))] == ["a", "b"]
        assert catalog.table is table and catalog.root == "<2 STAC items>"
        footprints = catalog.footprints(CRS.from_string(UTM31))
        np.testing.assert_array_equal(footprints[0], [600000, 600640, 5299360, 5300000])
        assert catalog.layout(["red", "nir"]) == ([], 2)
        assert catalog.native_dtypes() == ["float32"]

    def test_the_source_is_let_go_once_built(self):
        catalog = _catalog([_item("a", 600000)])
        catalog.build()
        assert catalog._source is None

    def test_parts_are_the_assets_through_the_href_modifier_labelled_by_the_item(self):
        catalog = _catalog([_item("a", 600000)], href_modifier=lambda h: h + "?signed")
        catalog.build()
        parts, label = catalog.parts(0, ["red", "nir"], [])
        assert parts == [("s3://bucket/tiles/a/B04.tif?signed", [1]), ("s3://bucket/tiles/a/B08.tif?signed", [1])]
        assert label == EntryLabel("item 'a'", ["B04", "B08"])
        assert catalog.asset_hrefs(0) == {"B04": "s3://bucket/tiles/a/B04.tif", "B08": "s3://bucket/tiles/a/B08.tif"}

    def test_frame_columns_are_the_ids_and_first_hrefs(self):
        catalog = _catalog([_item("a", 600000), _item("b", 600640)])
        catalog.build()
        assert catalog.frame_columns(np.array([1, 0])) == {
            "filepath": ["b", "a"], "href": ["s3://bucket/tiles/b/B04.tif", "s3://bucket/tiles/a/B04.tif"]}

    def test_an_item_without_the_asset_is_skipped_or_raised(self):
        items = [_item("a", 600000), _item("b", 600640)]
        del items[1].assets["B08"]
        with pytest.raises(Exception, match="item 'b' has no asset or band 'nir'"):
            _catalog(items).build()
        log = SkipLog("STACDataset")
        catalog = _catalog(items, on_error="skip", skip_log=log)
        catalog.build()
        assert len(catalog.table) == 1 and log.count == 1
