"""Items whose assets differ (keys, multi-band assets): each item's assets are chosen from its own fields, from
stac-geoparquet as from item dicts (the geoparquet reader once chose them from the first row)."""

from __future__ import annotations

import copy

import pytest
import torch

from pipekit.datasets import STACDataset
from pipekit.synthetic.stac import sentinel2_items, write_geoparquet, write_sentinel2_cogs

SIZE = 128
N_ITEMS = 8


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("stac-layouts")
    cogs = write_sentinel2_cogs(root / "cogs", size=SIZE)
    return {"root": root, "items": sentinel2_items(cogs, str(root / "cogs"), N_ITEMS, size=SIZE)}


def _renamed(items, start):
    """Items ``start:`` with their assets under other keys (``B04`` -> ``B04_10m``...), as a processing baseline
    change renames them."""
    items = copy.deepcopy(items)
    for item in items[start:]:
        item["assets"] = {f"{key}_10m": asset for key, asset in item["assets"].items()}
    return items


@pytest.mark.parametrize("start", [0, 3])  # all rows renamed, or every row after the third
def test_geoparquet_rows_choose_their_own_assets(corpus, tmp_path, start):
    items = _renamed(corpus["items"], start)
    parquet = write_geoparquet(items, str(tmp_path / "items.parquet"))
    ds = STACDataset(parquet, assets=["red", "nir"])
    dicts = STACDataset(items, assets=["red", "nir"])
    assert len(ds) == len(dicts) == N_ITEMS
    by_id = {ds.item_ids[i]: ds.asset_hrefs(i) for i in range(len(ds))}
    assert by_id == {dicts.item_ids[i]: dicts.asset_hrefs(i) for i in range(len(dicts))}
    assert set(by_id[items[-1]["id"]]) == {"B04_10m", "B08_10m"}
    if start:
        assert set(by_id[items[0]["id"]]) == {"B04", "B08"}
    box = dicts.bounds
    assert torch.equal(ds[box]["image"], dicts[box]["image"])


def test_geoparquet_prefers_a_single_band_asset_in_every_row(corpus, tmp_path):
    """The first rows hold ``red`` only in a multi-band ``visual`` asset, the others also as the single-band
    ``B04``: those rows read B04, as items read any other way."""
    items = copy.deepcopy(corpus["items"])
    for k, item in enumerate(items):
        visual = {
            "href": item["assets"]["B04"]["href"],
            "eo:bands": [{"name": "B04", "common_name": "red"}, {"name": "B03", "common_name": "green"}],
        }
        item["assets"]["visual"] = visual
        if k < 2:
            del item["assets"]["B04"]
    parquet = write_geoparquet(items, str(tmp_path / "items.parquet"))
    ds = STACDataset(parquet, assets=["red"])
    dicts = STACDataset(items, assets=["red"])
    keys = {ds.item_ids[i]: set(ds.asset_hrefs(i)) for i in range(len(ds))}
    assert keys == {dicts.item_ids[i]: set(dicts.asset_hrefs(i)) for i in range(len(dicts))}
    assert keys[items[0]["id"]] == {"visual"} and keys[items[2]["id"]] == {"B04"}
    box = dicts.bounds
    assert torch.equal(ds[box]["image"], dicts[box]["image"])


def test_different_channel_counts_name_two_items(corpus, tmp_path):
    items = copy.deepcopy(corpus["items"])
    items[5]["assets"]["B04"]["eo:bands"] = [{"name": "B04", "common_name": "red"}, {"name": "X"}]
    parquet = write_geoparquet(items, str(tmp_path / "items.parquet"))
    for source in (items, parquet):
        with pytest.raises(
            ValueError,
            match=rf"different channel counts: 1 in item {items[0]['id']!r}.*"
            rf"2 in item {items[5]['id']!r}",
        ):
            STACDataset(source, assets=["B04"])
