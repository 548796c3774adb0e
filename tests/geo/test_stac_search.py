"""STAC search parameters: against a real STAC API that evaluates CQL2 (``rustac serve`` over stac-geoparquet, its
DuckDB backend) and client-side on the same items as a static catalog, stac-geoparquet and item dicts: the same
selection, checked against the items' own fields."""

from __future__ import annotations

import copy
import datetime as dt

import pystac
import pytest
import shapely.geometry

from pipekit.datasets import STACDataset
from pipekit.errors import DatasetNotFoundError, ParseError, ReadError
from pipekit.geo._stac_search import ItemFilter, query_to_cql2
from pipekit.synthetic.stac import sentinel2_items, write_geoparquet, write_sentinel2_cogs, write_static_catalog
from stacserver import RustacNotFoundError, start_stac_server

pytestmark = pytest.mark.filterwarnings("ignore::pystac_client.warnings.DoesNotConformTo")  # rustac lists no filter

SIZE = 128
N_ITEMS = 16  # 4 tiles (2 in UTM zone 31, 2 in zone 32) x 4 dates, 5 days apart from 2024-05-01
#: a box over the north-west tile (T31TGN) only
NORTH_WEST = [5.95, 47.52, 5.96, 47.56]


def _day(item):
    return dt.date.fromisoformat(item["properties"]["datetime"][:10])


def _cloud(item):
    return item["properties"].get("eo:cloud_cover")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("stac-search")
    cogs = write_sentinel2_cogs(root / "cogs", size=SIZE)
    items = sentinel2_items(cogs, str(root / "cogs"), N_ITEMS, size=SIZE, seed=3)
    del items[5]["properties"]["eo:cloud_cover"]  # an item without the property a filter compares
    items[6]["properties"]["platform"] = "sentinel-2a"
    return {
        "root": root,
        "items": items,
        "catalog": write_static_catalog(items, str(root / "catalog")),
        "parquet": write_geoparquet(items, str(root / "items.parquet")),
    }


@pytest.fixture(scope="module")
def api(corpus, tmp_path_factory):
    """``rustac serve`` over the corpus' stac-geoparquet (DuckDB backend: ``filter`` is evaluated as SQL)."""
    try:
        server = start_stac_server([corpus["parquet"]], tmp_path_factory.mktemp("stac-api"))
    except RustacNotFoundError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server
    finally:
        server.stop()


def _expected(items, keep):
    return sorted(i["id"] for i in items if keep(i))


#: (search parameters, the items they select, by the items' own fields)
CASES = {
    "cloud-text": ({"filter": "eo:cloud_cover < 10"}, lambda i: _cloud(i) is not None and _cloud(i) < 10),
    "cloud-json-and-or": (
        {
            "filter": {
                "op": "or",
                "args": [
                    {
                        "op": "and",
                        "args": [
                            {"op": "<", "args": [{"property": "eo:cloud_cover"}, 50]},
                            {"op": "=", "args": [{"property": "s2:mgrs_tile"}, "32TKT"]},
                        ],
                    },
                    {"op": "=", "args": [{"property": "platform"}, "sentinel-2a"]},
                ],
            }
        },
        lambda i: (
            (_cloud(i) is not None and _cloud(i) < 50 and "_T32TKT_" in i["id"])
            or i["properties"]["platform"] == "sentinel-2a"
        ),
    ),
    "datetime": (
        {"datetime": "2024-05-04/2024-05-12"},
        lambda i: dt.date(2024, 5, 4) <= _day(i) <= dt.date(2024, 5, 12),
    ),
    "bbox": ({"bbox": NORTH_WEST}, lambda i: "_T31TGN_" in i["id"]),
    "intersects": (
        {"intersects": shapely.geometry.mapping(shapely.geometry.box(*NORTH_WEST))},
        lambda i: "_T31TGN_" in i["id"],
    ),
    "filter-datetime-bbox": (
        {"filter": "eo:cloud_cover >= 20", "datetime": "2024-05-06/..", "bbox": [5.95, 47.45, 6.05, 47.51]},
        lambda i: (
            _cloud(i) is not None
            and _cloud(i) >= 20
            and _day(i) >= dt.date(2024, 5, 6)
            and ("_T31TGM_" in i["id"] or "_T32TKS_" in i["id"])
        ),
    ),
    "ids-collections": (
        {
            "ids": [
                "S2B_MSIL2A_20240506T103629_R108_T31TGN_20240506T120000",
                "S2B_MSIL2A_20240516T103629_R108_T32TKS_20240516T120000",
                "not-an-item",
            ],
            "collections": ["sentinel-2-l2a-synthetic"],
        },
        lambda i: i["id"].endswith(("T31TGN_20240506T120000", "T32TKS_20240516T120000")),
    ),
}


class TestAPI:
    """The search parameters sent to a real STAC API that evaluates them."""

    @pytest.mark.parametrize("case", sorted(CASES))
    def test_selects_exactly_the_matching_items(self, corpus, api, case):
        search, keep = CASES[case]
        expected = _expected(corpus["items"], keep)
        assert 0 < len(expected) < N_ITEMS, expected  # every case selects some items, not all
        ds = STACDataset(api.url, assets=["red"], **search)
        assert sorted(ds.item_ids) == expected

    def test_invalid_filter_names_the_url_and_stage(self, api):
        with pytest.raises(ReadError) as info:
            STACDataset(api.url, assets=["red"], filter={"op": "<<<", "args": [{"property": "eo:cloud_cover"}, 10]})
        text = str(info.value)
        assert api.url in text and "search STAC API" in text and "STACDataset" in text
        assert "<<<" in text  # the server's own reason
        # not CQL2 at all: refused before any request, naming the API
        with pytest.raises(
            ParseError,
            match=r"(?s)parse STAC search filter '?http://127\.0\.0\.1:\d+/'?.*"
            r"eo:cloud_cover <<< 10.*not valid CQL2.*expected",
        ):
            STACDataset(api.url, assets=["red"], filter="eo:cloud_cover <<< 10")

    def test_query_extension_unimplemented_by_the_server_is_a_clear_error(self, api):
        with pytest.raises(ReadError, match=r"search STAC API.*127\.0\.0\.1.*query is not implemented"):
            STACDataset(api.url, assets=["red"], query={"eo:cloud_cover": {"lt": 10}})


class TestClientSide:
    """The same parameters on sources without a server: the same items as the API selects."""

    @pytest.mark.parametrize("case", sorted(CASES))
    @pytest.mark.parametrize("source", ["catalog", "parquet", "dicts", "pystac"])
    def test_same_selection_as_the_api(self, corpus, api, case, source):
        search, keep = CASES[case]
        if source in ("catalog", "parquet"):
            origin = corpus[source]
        elif source == "dicts":
            origin = corpus["items"]
        else:
            origin = [pystac.Item.from_dict(copy.deepcopy(i)) for i in corpus["items"]]
        ds = STACDataset(origin, assets=["red"], **search)
        expected = _expected(corpus["items"], keep)
        assert sorted(ds.item_ids) == expected
        assert sorted(STACDataset(api.url, assets=["red"], **search).item_ids) == expected

    @pytest.mark.parametrize("source", ["catalog", "parquet", "dicts"])
    def test_query_is_the_filter_of_its_comparisons(self, corpus, api, source):
        """``query`` (which the server lacks) selects what the equivalent CQL2 filter selects on the API."""
        filtered = STACDataset(api.url, assets=["red"], filter="eo:cloud_cover < 40 AND platform = 'sentinel-2b'")
        origin = corpus["items"] if source == "dicts" else corpus[source]
        query = {"eo:cloud_cover": {"lt": 40}, "platform": {"eq": "sentinel-2b"}}
        by_query = STACDataset(origin, assets=["red"], query=query)
        as_text = STACDataset(origin, assets=["red"], query=["eo:cloud_cover<40", "platform=sentinel-2b"])
        expected = _expected(
            corpus["items"],
            lambda i: _cloud(i) is not None and _cloud(i) < 40 and i["properties"]["platform"] == "sentinel-2b",
        )
        assert sorted(filtered.item_ids) == sorted(by_query.item_ids) == sorted(as_text.item_ids) == expected
        in_list = STACDataset(origin, assets=["red"], query={"platform": {"in": ["sentinel-2a"]}})
        assert in_list.item_ids == [corpus["items"][6]["id"]]

    @pytest.mark.parametrize("source", ["catalog", "parquet", "dicts"])
    def test_max_items_keeps_the_first_matches(self, corpus, source):
        origin = corpus["items"] if source == "dicts" else corpus[source]
        ds = STACDataset(origin, assets=["red"], bbox=NORTH_WEST, max_items=2)
        firsts = [i["id"] for i in corpus["items"] if "_T31TGN_" in i["id"]][:2]
        assert sorted(ds.item_ids) == sorted(firsts)

    def test_pixels_of_a_filtered_geoparquet_are_those_of_the_same_items(self, corpus):
        parquet = STACDataset(corpus["parquet"], assets=["red", "nir"], filter="eo:cloud_cover < 30")
        kept = [i for i in corpus["items"] if _cloud(i) is not None and _cloud(i) < 30]
        plain = STACDataset(kept, assets=["red", "nir"])
        assert sorted(parquet.item_ids) == sorted(i["id"] for i in kept)
        box = plain.bounds
        assert (parquet[box]["image"] == plain[box]["image"]).all()

    def test_nothing_selected_names_the_search(self, corpus):
        with pytest.raises(DatasetNotFoundError, match=r"none of the 0 item.*matching the search.*eo:cloud_cover < 0"):
            STACDataset(corpus["parquet"], assets=["red"], filter="eo:cloud_cover < 0")


class TestErrors:
    @pytest.mark.parametrize("source", ["catalog", "parquet"])
    def test_invalid_cql2_names_the_source_and_stage(self, corpus, source):
        with pytest.raises(
            ParseError,
            match=r"(?s)parse STAC search filter.*(collection\.json|items\.parquet)"
            r".*eo:cloud_cover <<< 10.*not valid CQL2",
        ):
            STACDataset(corpus[source], assets=["red"], filter="eo:cloud_cover <<< 10")

    @pytest.mark.parametrize("source", ["catalog", "parquet", "dicts"])
    def test_expression_cql2_cannot_evaluate_is_an_error_not_an_empty_selection(self, corpus, source):
        origin = corpus["items"] if source == "dicts" else corpus[source]
        with pytest.raises(
            ParseError,
            match=r"filter STAC items.*cannot be evaluated on item 'S2B_MSIL2A_.*"
            r"frobnicate",
        ):
            STACDataset(origin, assets=["red"], filter={"op": "frobnicate", "args": [{"property": "eo:cloud_cover"}]})
        with pytest.raises(ParseError, match=r"cannot be evaluated on item .*values of different types"):
            STACDataset(origin, assets=["red"], filter="platform < 3")

    def test_unsupported_query_operator(self, corpus):
        with pytest.raises(ParseError, match=r"parse STAC search query.*'startsWith'.*LIKE"):
            STACDataset(corpus["items"], assets=["red"], query={"platform": {"startsWith": "sentinel"}})

    def test_malformed_datetime_names_the_source(self, corpus):
        with pytest.raises(ParseError, match=r"parse STAC search parameters.*collection\.json.*garbage"):
            STACDataset(corpus["catalog"], assets=["red"], datetime="garbage")


class TestItemFilter:
    def test_missing_property_does_not_match(self):
        keep = ItemFilter({"filter": "eo:cloud_cover < 10 OR platform = 'x'"}, "items")
        assert not keep.matches({"type": "Feature", "id": "a", "geometry": None, "properties": {"platform": "y"}})
        assert keep.matches({"type": "Feature", "id": "a", "geometry": None, "properties": {"platform": "x"}})

    def test_interval_items_intersect_the_datetime_asked(self):
        keep = ItemFilter({"datetime": "2024-05-10/2024-05-20"}, "items")
        item = {
            "type": "Feature",
            "id": "a",
            "geometry": None,
            "properties": {
                "datetime": None,
                "start_datetime": "2024-05-01T00:00:00Z",
                "end_datetime": "2024-05-11T00:00:00Z",
            },
        }
        assert keep.matches(item)
        item["properties"]["end_datetime"] = "2024-05-09T00:00:00Z"
        assert not keep.matches(item)
        assert not keep.matches({"type": "Feature", "id": "b", "geometry": None, "properties": {}})

    def test_antimeridian_bbox(self):
        keep = ItemFilter({"bbox": [170, -10, -170, 10]}, "items")
        east = {"type": "Feature", "id": "e", "properties": {}, "geometry": {"type": "Point", "coordinates": [175, 0]}}
        mid = {"type": "Feature", "id": "m", "properties": {}, "geometry": {"type": "Point", "coordinates": [0, 0]}}
        assert keep.matches(east) and not keep.matches(mid)

    def test_query_to_cql2_reads_text_numbers(self):
        assert query_to_cql2({"eo:cloud_cover": {"lt": "10"}}, numeric_strings=True) == {
            "op": "<",
            "args": [{"property": "eo:cloud_cover"}, 10],
        }
        assert query_to_cql2({"s2:tile": {"eq": "10"}}) == {"op": "=", "args": [{"property": "s2:tile"}, "10"]}
