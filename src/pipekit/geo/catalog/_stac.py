"""What the entries of a :class:`~pipekit.geo._stac.STACDataset` are: :class:`STACCatalog`, the items of a STAC source.

The catalog reads the items (a static catalog, a STAC API search, a
stac-geoparquet file or ``pystac`` items: :mod:`pipekit.geo._stac_items`),
selects each item's assets (:mod:`pipekit.geo.catalog._stac_assets`), takes
their grid from the projection extension (or reads the first asset's header)
and builds the file table: one row per item, its id as the ``filepath``.  It
keeps the item ids and the asset hrefs (hrefs shared by items stored once),
never the items' JSON.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from rasterio.crs import CRS

from pipekit.errors import DatasetNotFoundError, ParseError, ReadError, SkipLog, StageError
from pipekit.geo import io as geo_io
from pipekit.geo._antimeridian import footprint_parts
from pipekit.geo._reader import EntryLabel
from pipekit.geo._stac_geoparquet import read_geoparquet
from pipekit.geo._stac_items import (
    ItemRecord,
    is_geoparquet,
    records_from_items,
    search_api,
    walk_catalog,
)
from pipekit.geo._stac_search import ItemFilter
from pipekit.geo.catalog._headers import RasterHeader, read_header
from pipekit.geo.catalog._stac_assets import (
    _still_selects,
    header_from_proj,
    media_type_note,
    not_raster,
    select_assets,
)
from pipekit.geo.catalog._table import _FileTable, join_parts

__all__ = ["STACCatalog", "describe_source"]


class STACCatalog:
    """The items of a STAC source: one entry per item, its chosen assets the bands read.

    Args:
        source: a catalog/collection path or URL, a STAC API URL, a
            stac-geoparquet file, a ``pystac.Catalog`` or an iterable of items.
        assets: asset keys or band names read, in channel order.
        search: STAC API search parameters (evaluated client-side on other sources).
        client_options: extra arguments of ``pystac_client.Client.open``.
        href_modifier: ``href -> href`` applied when an asset is opened.
        opener: how assets are opened (:class:`pipekit.geo.io.RasterOpener`).
        name: the dataset's name (errors).
        on_error: ``"raise"`` or ``"skip"`` for items that cannot be indexed.
        skip_log: where skipped items are counted.

    :meth:`build` reads the items (``requests`` counts the documents fetched);
    ``table`` is then the file table.
    """

    #: an item's assets are read one after the other (on the network I/O thread if remote)
    concurrent = False

    def __init__(
        self,
        source: Any,
        assets: Sequence[str],
        *,
        search: Mapping[str, Any],
        client_options: Mapping[str, Any],
        href_modifier: Callable[[str], str] | None,
        opener: geo_io.RasterOpener,
        name: str,
        on_error: str,
        skip_log: SkipLog,
    ) -> None:
        self._source = source
        self.root = describe_source(source)
        self.bands = list(assets)
        self.search = dict(search)
        self.client_options = dict(client_options)
        self.href_modifier = href_modifier
        self.opener = opener
        self.name = name
        self.on_error = on_error
        self.skip_log = skip_log
        self.requests = 0
        self.table: _FileTable

    def skip_or_raise(self, error: StageError) -> None:
        """Raise ``error`` (``on_error="raise"``) or count it in the skip log."""
        if self.on_error == "raise":
            raise error
        self.skip_log.record(error)

    @property
    def _on_skip(self) -> Callable[[StageError], None] | None:
        """Where a source's unreadable documents go under ``on_error="skip"`` (``None``: they raise)."""
        return self.skip_log.record if self.on_error == "skip" else None

    # -- reading the items ----------------------------------------------------------------------
    def _item_filter(self, source: str) -> ItemFilter | None:
        """The search parameters, evaluated client-side on a source that is not an API (``None``: none given)."""
        keep = ItemFilter(self.search, source) if self.search else None
        return keep if keep else None

    def _records(self) -> list[ItemRecord]:
        source = self._source
        storage_options = self.opener.storage_options
        if isinstance(source, (str, os.PathLike)):
            href = os.fspath(source)
            if is_geoparquet(href):
                self.requests += 1
                return read_geoparquet(href, storage_options, self.bands, self._item_filter(href))
            is_url = href.startswith(("http://", "https://"))
            self.requests += is_url  # the landing page or root document, read to tell an API from a static catalog
            if is_url and _is_api(href, self.client_options):
                counter = [0]
                try:
                    return search_api(href, self.search, self.client_options, counter)
                finally:
                    self.requests += counter[0]
            from pipekit.geo._stac_items import FsspecStacIO

            stac_io = FsspecStacIO(storage_options)
            try:
                return walk_catalog(href, storage_options, stac_io=stac_io, keep=self._item_filter(href),
                                    on_skip=self._on_skip)
            finally:
                self.requests += stac_io.requests
        what = describe_source(source)
        try:
            import pystac

            if isinstance(source, pystac.Catalog):
                return records_from_items(source.get_items(recursive=True), self._item_filter(what), self._on_skip)
        except ImportError:  # pragma: no cover
            pass
        if isinstance(source, Iterable) and not isinstance(source, (bytes, Mapping)):
            return records_from_items(source, self._item_filter(what), self._on_skip)
        raise TypeError(
            "source must be a catalog/collection path or URL, a STAC API URL, a stac-geoparquet file, "
            f"a pystac.Catalog or an iterable of pystac.Items, got {type(source).__name__}"
        )

    def build(self, time_interval: Any = None) -> _FileTable:
        """Read the items and build the file table (also kept as ``table``); the source is then let go.

        ``time_interval`` is not used: an item's time is its ``datetime`` (or
        ``start_datetime``/``end_datetime``).

        Raises:
            DatasetNotFoundError: no item could be indexed.
            ValueError: an item id appears twice, or the items' assets give different channel counts.
        """
        records = self._records()
        ids: list[str] = []
        headers: list[RasterHeader] = []
        times: list[tuple[float, float]] = []
        hrefs: list[tuple[str, ...]] = []
        layouts: dict[tuple[tuple[str, tuple[int, ...]], ...], int] = {}
        layout_ids: list[int] = []
        seen: dict[str, str | None] = {}
        previous = None
        for record in records:
            if not record.id.strip():  # a stac-geoparquet row or a pystac Item (item JSON is checked as it is read)
                self.skip_or_raise(ParseError("read STAC item", record.href or self.root, "STACDataset",
                                              f"an item has an empty id {record.id!r}"))
                continue
            if record.id in seen:
                raise ValueError(
                    f"{self.name}: item id {record.id!r} appears twice (collections {seen[record.id]!r} and "
                    f"{record.collection!r}); pass the items of one collection, or dedupe them"
                )
            seen[record.id] = record.collection
            if previous is not None and _still_selects(record, self.bands, previous):
                parts = previous
            else:
                try:
                    parts = previous = select_assets(record, self.bands)
                except ReadError as exc:
                    self.skip_or_raise(exc)
                    continue
            item_hrefs = tuple(str(record.assets[key]["href"]) for key, _ in parts)
            refused = not_raster(record, parts, item_hrefs)
            if refused is not None:
                self.skip_or_raise(refused)
                continue
            header = header_from_proj(record, parts[0][0], item_hrefs[0])
            if header is None:
                header = self._header_of(record, parts[0][0], item_hrefs[0])
                if header is None:
                    continue
            layout = tuple(parts)
            ids.append(record.id)
            headers.append(header)
            times.append((record.start, record.end))
            hrefs.append(item_hrefs)
            layout_ids.append(layouts.setdefault(layout, len(layouts)))
        if not ids:
            searched = f" matching the search {self.search}" if self.search else ""
            raise DatasetNotFoundError(
                f"{self.name}: none of the {len(records)} item(s) of {self.root!r}{searched} could be indexed "
                f"({self.skip_log.count} skipped, see skip_log)"
            )
        found = list(layouts)
        counts = [sum(len(idx) for _, idx in layout) for layout in found]
        if len(set(counts)) > 1:  # name the first item of two layouts that differ
            first = layout_ids.index(0)
            other = next(row for row, k in enumerate(layout_ids) if counts[k] != counts[0])
            raise ValueError(
                f"{self.name}: the items' assets {self.bands} give different channel counts: {counts[0]} in item "
                f"{ids[first]!r} (asset bands {dict(found[0])}), {counts[layout_ids[other]]} in item "
                f"{ids[other]!r} ({dict(found[layout_ids[other]])}); a multi-band asset differs between items: "
                "choose single bands by name"
            )
        flat = [h for item in hrefs for h in item]
        prefix = os.path.commonprefix(flat) if len(flat) > 1 else ""  # noqa: RUF071
        self._href_prefix = prefix
        # hrefs shared by items (a tile's COGs, a mosaic) are stored once: a table of strings and an index array
        unique: dict[str, int] = {}
        width = max(len(item) for item in hrefs)
        self._href_ids = np.full((len(hrefs), width), -1, dtype=np.int32)
        for row, item in enumerate(hrefs):
            for col, h in enumerate(item):
                self._href_ids[row, col] = unique.setdefault(h[len(prefix) :], len(unique))
        self._href_table = list(unique)
        self._layouts = list(layouts)
        self._layout_ids = np.asarray(layout_ids, dtype=np.int32)
        self.table = _FileTable(ids, headers, np.asarray(times, dtype=np.float64).reshape(-1, 2), None, {})
        self._source = None  # the items are indexed: nothing of their JSON is kept
        return self.table

    def _header_of(self, record: ItemRecord, key: str, href: str) -> RasterHeader | None:
        """The header of an asset without the projection extension, read once with rasterio."""
        url = self.modified(href)
        try:
            header = read_header(self.opener, url, self.name)
            error = header.index_error(self.name)
        except ReadError as exc:
            error = exc
        if error is not None:
            self.skip_or_raise(
                ReadError(
                    error.action,
                    error.url,
                    error.stage,
                    f"item {record.id!r} asset {key!r}{media_type_note(record.assets[key])} (no projection "
                    f"extension): {error.reason}",
                )
            )
            return None
        return header

    # -- what the dataset reads ---------------------------------------------------------------------
    def native_dtypes(self) -> list[str]:
        """The data types of the items' first assets."""
        return list(self.table.dtypes)

    def layout(self, bands: Sequence[Any]) -> tuple[list[int], int]:
        """``([], channels of a sample)``: each item's parts carry their own band indexes."""
        return [], sum(len(idx) for _, idx in self._layouts[0])

    def href(self, row: int, col: int) -> str:
        """The href of asset ``col`` of item ``row`` (before ``href_modifier``)."""
        return self._href_prefix + self._href_table[int(self._href_ids[row, col])]

    def modified(self, href: str) -> str:
        """``href`` through ``href_modifier`` (what is opened)."""
        return href if self.href_modifier is None else str(self.href_modifier(href))

    def asset_hrefs(self, row: int) -> dict[str, str]:
        """``{asset key: href}`` of item ``row`` (before ``href_modifier``)."""
        layout = self._layouts[int(self._layout_ids[row])]
        return {key: self.href(row, col) for col, (key, _) in enumerate(layout)}

    def parts(self, row: int, bands: Sequence[Any], indexes: list[int]) -> tuple[list[tuple[str, list[int]]],
                                                                                   EntryLabel]:
        """The assets of item ``row`` (URLs through ``href_modifier``) and their band indexes, labelled by the item."""
        layout = self._layouts[int(self._layout_ids[row])]
        parts = [(self.modified(self.href(row, col)), list(idx)) for col, (_, idx) in enumerate(layout)]
        return parts, EntryLabel(f"item {self.table.path(row)!r}", [key for key, _ in layout])

    def footprints(self, crs: CRS) -> np.ndarray:
        """``[n, 4]`` footprints of the items in ``crs`` (an item split at the antimeridian gives its first part)."""
        return self.footprint_entries(crs)[0][: len(self.table)]

    def footprint_entries(self, crs: CRS) -> tuple[np.ndarray, np.ndarray | None]:
        """``([m, 4] footprints, [m] rows)`` of the items in ``crs``: one per item, then second parts.

        Each distinct grid is reprojected once (shared by a tile's items).
        An item crossing the antimeridian has two footprints in a CRS cut
        there (``EPSG:4326``, ``EPSG:3857``), one on each side, as the STAC
        specification splits such a geometry; in its own UTM zone, one.
        ``rows`` is ``None`` when no footprint is split.
        """
        table = self.table
        keys = np.column_stack([table.crs_ids, table.transforms, table.shapes]).astype(np.float64)
        unique, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
        footprints = np.empty((len(unique), 4), dtype=np.float64)
        split: dict[int, list[tuple[float, float, float, float]]] = {}
        for k, row in enumerate(first.tolist()):
            left, bottom, right, top = table.native_bounds(row)
            if table.crs(row) != crs:
                (left, bottom, right, top), *rest = footprint_parts(table.crs(row), crs, left, bottom, right, top)
                if rest:
                    split[k] = [(w, e, s, n) for w, s, e, n in rest]
            footprints[k] = (left, right, bottom, top)
        rows = [row for row, k in enumerate(inverse.tolist()) if k in split for _ in split[k]] if split else []
        extra = [box for k in inverse.tolist() if k in split for box in split[k]] if split else []
        return join_parts(footprints[inverse], rows, extra)

    def frame_columns(self, rows: np.ndarray) -> dict[str, list[str]]:
        """``dataset.index``'s columns for ``rows``: ``filepath`` (the item ids) and ``href`` (the first asset's)."""
        return {"filepath": [self.table.path(int(r)) for r in rows], "href": [self.href(int(r), 0) for r in rows]}


def _is_api(url: str, client_options: Mapping[str, Any]) -> bool:
    """Whether ``url`` is a STAC API landing page (it conforms to item search or links a ``search``)."""
    import json
    import urllib.request

    headers = dict(client_options.get("headers") or {})
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=60) as response:
            doc = json.loads(response.read())
    except Exception as exc:
        raise ReadError("open STAC source", url, "STACDataset", f"{type(exc).__name__}: {exc}") from exc
    conforms = " ".join(str(c) for c in doc.get("conformsTo") or [])
    return "item-search" in conforms or any(link.get("rel") == "search" for link in doc.get("links") or [])


def describe_source(source: Any) -> str:
    """A short text for ``source`` (what the dataset keeps of it: never the items)."""
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    try:
        return f"<{len(source)} STAC items>"
    except TypeError:
        return f"<{type(source).__name__} of STAC items>"
