r"""stac-geoparquet: the items of a stac-geoparquet file as :class:`~pipekit.geo._stac_items.ItemRecord`\ s.

Read column-wise with pyarrow, one file read and no per-item request: only
the columns a dataset uses (ids, times, projection and common-metadata
properties, assets), and of the assets only those a dataset may select;
a search evaluated client-side (:class:`~pipekit.geo._stac_search.ItemFilter`)
selects rows before any asset is converted to Python.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from pipekit.errors import ParseError, ReadError
from pipekit.geo._stac_items import COMMON_KEYS, ITEM_KEYS, ItemRecord, _storage_options_for, parse_time

if TYPE_CHECKING:
    from pipekit.geo._stac_search import ItemFilter

__all__ = ["read_geoparquet"]


_ITEM_COLUMNS = ("id", "collection", "datetime", "start_datetime", "end_datetime", "assets", *ITEM_KEYS)


def _seconds(column: Any) -> list[float | None]:
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_timestamp(column.type):
        micros = pc.cast(pc.cast(column, pa.timestamp("us", tz="UTC")), pa.int64())
        return [None if v is None else v / 1e6 for v in micros.to_pylist()]
    return [None if v is None else parse_time(v, "datetime", "?") for v in column.to_pylist()]


#: the asset fields a dataset uses (the rest -- titles, roles, checksums... -- are left in the file)
_ASSET_FIELDS = ("href", "type", "bands", "eo:bands", "raster:bands", *COMMON_KEYS)


def _band_names_in(child: Any) -> set[str]:
    """Every band ``name``/``common_name`` an asset column carries in any row (``bands`` or ``eo:bands``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    names: set[str] = set()
    fields = [f.name for f in child.type]
    for band_key in ("bands", "eo:bands"):
        if band_key not in fields:
            continue
        lists = child.field(band_key)
        if not (pa.types.is_list(lists.type) or pa.types.is_large_list(lists.type)):
            continue
        flat = pc.list_flatten(lists)
        if not pa.types.is_struct(flat.type):
            continue
        for sub in ("name", "common_name", "eo:common_name"):
            if flat.type.get_field_index(sub) >= 0:
                names.update(str(v) for v in pc.unique(flat.field(sub)).to_pylist() if v is not None)
    return names


def _asset_columns(assets: Any, wanted: Sequence[str] | None) -> list[dict[str, Any] | None]:
    """Per row, ``{asset key: fields}`` -- converting only the assets ``wanted`` may select: its asset keys, and
    every asset whose bands carry a wanted band name in any row (each row's own assets are then chosen per row,
    by :func:`~pipekit.geo._stac.select_assets`, as for items read any other way); the other assets present in
    a row are kept as empty placeholders (their keys still show in error messages)."""
    keys = [field.name for field in assets.type]
    if wanted is None:
        chosen = set(keys)
    else:
        # a wanted name may be one item's asset key and another's band name (Earth Search's "red" asset,
        # Planetary Computer's "B04" asset whose band is "red"): every asset carrying it is converted
        chosen = {name for name in wanted if name in keys}
        carrying = [key for key in keys if key not in chosen and _band_names_in(assets.field(key)).intersection(wanted)]
        chosen.update(carrying)
    n = len(assets)
    valid_rows = assets.is_valid().to_pylist()
    rows: list[dict[str, Any] | None] = [{} if ok else None for ok in valid_rows]
    for key in keys:
        child = assets.field(key)
        present = child.is_valid().to_pylist()
        if key not in chosen:
            for i in range(n):
                if present[i] and rows[i] is not None:
                    rows[i][key] = {}
            continue
        fields = {
            f.name: child.field(f.name).to_pylist()
            for f in child.type
            if wanted is None or f.name in _ASSET_FIELDS or f.name.startswith("proj:")
        }
        for i in range(n):
            if present[i] and rows[i] is not None:
                rows[i][key] = {f: values[i] for f, values in fields.items() if values[i] is not None}
    return rows


def _python_value(value: Any) -> Any:
    """A parquet cell as an item property would hold it (timestamps as RFC 3339 text)."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")
    return value


def _filter_rows(table: Any, keep: ItemFilter) -> Any:
    """The rows of ``table`` that ``keep`` selects (its ``max_items`` first), as a pyarrow table."""
    import pyarrow as pa

    n = table.num_rows
    ids = [str(v) for v in table.column("id").to_pylist()]
    collections = table.column("collection").to_pylist() if "collection" in table.column_names else [None] * n
    times = {
        c: _seconds(table.column(c)) if c in table.column_names else [None] * n
        for c in ("datetime", "start_datetime", "end_datetime")
    }
    names = sorted(keep.properties - {"id", "collection", "geometry"})
    values = {c: [_python_value(v) for v in table.column(c).to_pylist()] for c in names if c in table.column_names}
    geometries: list[Any] = [None] * n
    if keep.needs_geometry and "geometry" in table.column_names:
        import shapely

        column = table.column("geometry").combine_chunks()
        geometries = list(shapely.from_wkb(column.to_numpy(zero_copy_only=False)))
    mask = []
    kept = 0
    for i in range(n):
        if keep.max_items is not None and kept >= keep.max_items:
            mask.append(False)
            continue
        start = times["start_datetime"][i]
        end = times["end_datetime"][i]
        moment = times["datetime"][i]
        start, end = moment if start is None else start, moment if end is None else end
        props = {c: column[i] for c, column in values.items() if column[i] is not None}
        item = {
            "type": "Feature",
            "id": ids[i],
            "collection": collections[i],
            "geometry": geometries[i],
            "properties": props,
        }
        ok = keep.matches(item, (-math.inf if start is None else start, math.inf if end is None else end))
        kept += ok
        mask.append(ok)
    return table.filter(pa.array(mask, type=pa.bool_()))


def read_geoparquet(
    href: str,
    storage_options: Mapping[str, Any] | None = None,
    assets: Sequence[str] | None = None,
    keep: ItemFilter | None = None,
) -> list[ItemRecord]:
    """The items of a stac-geoparquet file, read column-wise with pyarrow (one file read, no per-item request).

    Args:
        href: the file, local or an fsspec URL.
        storage_options: fsspec options for a remote ``href``.
        assets: the asset keys or band names a dataset reads; only those
            assets' fields are converted to Python (the others' keys are kept).
        keep: an :class:`~pipekit.geo._stac_search.ItemFilter`: only the rows it
            selects are returned (the columns its ``filter``/``query`` name are read too).

    Raises:
        ReadError: the file cannot be read.
        ParseError: it has no ``id`` or ``assets`` column (not stac-geoparquet).
    """
    import fsspec
    import pyarrow.parquet as pq

    href = str(href)
    try:
        with fsspec.open(href, "rb", **_storage_options_for(href, storage_options)) as f:
            schema = pq.read_schema(f)
            wanted = list(_ITEM_COLUMNS)
            if keep:
                wanted += sorted(keep.properties) + (["geometry"] if keep.needs_geometry else [])
            columns = [c for c in dict.fromkeys(wanted) if c in schema.names]
            f.seek(0)
            table = pq.read_table(f, columns=columns)
    except Exception as exc:
        raise ReadError("read stac-geoparquet", href, "STACDataset", f"{type(exc).__name__}: {exc}") from exc
    for needed in ("id", "assets"):
        if needed not in table.column_names:
            raise ParseError(
                "read stac-geoparquet",
                href,
                "STACDataset",
                f"no {needed!r} column: not a stac-geoparquet file (columns {table.column_names})",
            )
    if keep:
        table = _filter_rows(table, keep)
    n = table.num_rows
    ids = [str(v) for v in table.column("id").to_pylist()]
    collections = table.column("collection").to_pylist() if "collection" in columns else [None] * n
    times = {
        c: _seconds(table.column(c)) if c in columns else [None] * n
        for c in ("datetime", "start_datetime", "end_datetime")
    }
    proj = {k: table.column(k).to_pylist() for k in ITEM_KEYS if k in columns}
    asset_rows = _asset_columns(table.column("assets").combine_chunks(), assets)
    records = []
    for i in range(n):
        start = times["start_datetime"][i]
        end = times["end_datetime"][i]
        moment = times["datetime"][i]
        start = moment if start is None else start
        end = moment if end is None else end
        item_assets = asset_rows[i] or {}
        records.append(
            ItemRecord(
                ids[i],
                collections[i],
                -math.inf if start is None else start,
                math.inf if end is None else end,
                {k: values[i] for k, values in proj.items() if values[i] is not None},
                item_assets,
                href,
            )
        )
    return records
