"""Reading STAC items from their sources: static catalogs, STAC API searches, stac-geoparquet, pystac Items.

Every source ends as a list of :class:`ItemRecord`: the few fields a
:class:`~pipekit.geo._stac.STACDataset` indexes (id, collection, time
interval, projection fields, assets with absolute hrefs), never the items'
whole JSON.

* :func:`walk_catalog`: a static ``catalog.json``/``collection.json``,
  local or any fsspec URL, read through pystac's ``StacIO`` backed by fsspec
  (``FsspecStacIO``, defined on first use: importing this module does not
  import pystac); ``child`` and ``item`` links are followed, a cycle or a
  broken link is an error naming the link;
* :func:`search_api`: a STAC API's ``/search`` through pystac-client, pages followed;
* :func:`~pipekit.geo._stac_geoparquet.read_geoparquet`: a stac-geoparquet file, read column-wise with
  pyarrow (no per-item request; its own module);
* :func:`records_from_items`: ``pystac.Item`` objects or item dicts.
"""

from __future__ import annotations

import concurrent.futures
import json
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from pipekit.errors import ParseError, ReadError, StageError

if TYPE_CHECKING:
    from pipekit.geo._stac_search import ItemFilter

__all__ = [
    "ItemRecord",
    "FsspecStacIO",  # noqa: F822 - defined on first use (module __getattr__)
    "walk_catalog",
    "search_api",
    "read_geoparquet",  # noqa: F822 - in pipekit.geo._stac_geoparquet (module __getattr__)
    "records_from_items",
    "is_geoparquet",
]

#: item properties kept from each item (the projection extension's, STAC 1.0 and 1.1 spellings)
PROJ_KEYS = ("proj:epsg", "proj:code", "proj:transform", "proj:shape", "proj:wkt2", "proj:projjson")
#: item properties kept besides: STAC 1.1 common metadata an asset may inherit (its own comes first)
COMMON_KEYS = ("data_type", "nodata")
ITEM_KEYS = PROJ_KEYS + COMMON_KEYS


@dataclass
class ItemRecord:
    """What an index entry needs of a STAC item.

    Attributes:
        id: the item id.
        collection: its collection id (``None`` if it names none).
        start, end: its time interval, POSIX seconds (``datetime`` gives a zero-length one).
        proj: its projection-extension properties (``proj:code``/``proj:epsg``, ``proj:transform``, ``proj:shape``)
            and the common metadata its assets inherit (``data_type``, ``nodata``).
        assets: asset key -> asset fields (``href`` absolute; ``eo:bands``/``bands``,
            ``raster:bands``, asset-level ``proj:*``, ``data_type`` and ``nodata`` kept).
        href: where the item was read from (for error messages), if known.
    """

    id: str
    collection: str | None
    start: float
    end: float
    proj: dict[str, Any] = field(default_factory=dict)
    assets: dict[str, dict[str, Any]] = field(default_factory=dict)
    href: str | None = None


def is_geoparquet(source: Any) -> bool:
    """Whether ``source`` names a stac-geoparquet file (by its extension)."""
    return isinstance(source, (str, os.PathLike)) and str(source).lower().endswith((".parquet", ".geoparquet"))


# ---------------------------------------------------------------------------------------------
# time


def parse_time(text: str | None, what: str, item_id: str, href: str | None = None) -> float | None:
    """An RFC 3339 timestamp as POSIX seconds (``None`` stays ``None``).

    Raises:
        ParseError: not a time (an impossible date such as February 30th included); names the item's
            file (``href``) and id.
    """
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError as exc:
        raise ParseError(
            "read STAC item", href or item_id, "STACDataset",
            f"item {item_id!r}: {what} {text!r} is not an RFC 3339 time ({exc})",
        ) from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.timestamp()


def item_interval(item_id: str, props: Mapping[str, Any], href: str | None = None) -> tuple[float, float]:
    """An item's ``(start, end)`` in POSIX seconds: ``start_datetime``/``end_datetime``, else ``datetime`` twice."""
    start = parse_time(props.get("start_datetime"), "start_datetime", item_id, href)
    end = parse_time(props.get("end_datetime"), "end_datetime", item_id, href)
    moment = parse_time(props.get("datetime"), "datetime", item_id, href)
    if start is None:
        start = moment
    if end is None:
        end = moment
    return (-math.inf if start is None else start, math.inf if end is None else end)


# ---------------------------------------------------------------------------------------------
# item dicts and pystac Items


def _absolute(href: str, base: str | None) -> str:
    if base is None or "://" in href or os.path.isabs(href):
        return href
    from pystac.utils import make_absolute_href

    return make_absolute_href(href, base)


def record_from_dict(item: Mapping[str, Any], base: str | None = None) -> ItemRecord:
    """An :class:`ItemRecord` of an item's JSON dict (relative asset hrefs resolved against ``base``)."""
    item_id = str(item.get("id"))
    if item.get("type") != "Feature" or "id" not in item:
        raise ParseError(
            "read STAC item", base, "STACDataset", f"not a STAC item (type {item.get('type')!r}, id {item.get('id')!r})"
        )
    if not item_id.strip():
        raise ParseError("read STAC item", base or "<item>", "STACDataset",
                         f"the item has an empty id {item.get('id')!r} (assets {sorted(item.get('assets') or {})})")
    props = item.get("properties") or {}
    start, end = item_interval(item_id, props, base)
    assets = {}
    for key, asset in (item.get("assets") or {}).items():
        fields = dict(asset)
        fields["href"] = _absolute(str(asset.get("href", "")), base)
        assets[key] = fields
    proj = {k: props[k] for k in ITEM_KEYS if props.get(k) is not None}
    return ItemRecord(item_id, item.get("collection"), start, end, proj, assets, base)


def records_from_items(
    items: Iterable[Any], keep: ItemFilter | None = None, on_skip: Callable[[StageError], None] | None = None,
    base: str | None = None,
) -> list[ItemRecord]:
    """Records of ``pystac.Item`` objects or item dicts (those ``keep`` selects, if given).

    ``on_skip``: given, an item that cannot be read (a malformed time, an
    empty id) is passed to it and left out; otherwise its error is raised.
    ``base``: where item dicts were read from (relative asset hrefs resolve against it).

    Example:
        >>> import pystac, datetime
        >>> item = pystac.Item("S2A_T31UFU_20240101", None, None, datetime.datetime(2024, 1, 1), {})
        >>> item.add_asset("red", pystac.Asset("s3://bucket/red.tif"))
        >>> [(r.id, r.assets["red"]["href"]) for r in records_from_items([item])]
        [('S2A_T31UFU_20240101', 's3://bucket/red.tif')]
    """
    import pystac

    records = []
    for item in items:
        if isinstance(item, pystac.Item):
            props = item.properties
            start, end = item_interval(item.id, {**props, "datetime": props.get("datetime")}, item.get_self_href())
            assets = {}
            for key, asset in item.assets.items():
                fields = dict(asset.extra_fields)
                fields["href"] = asset.get_absolute_href() or asset.href
                if asset.media_type:
                    fields["type"] = asset.media_type
                assets[key] = fields
            if keep and not keep.matches(item.to_dict(include_self_link=False, transform_hrefs=False), (start, end)):
                continue
            proj = {k: props[k] for k in ITEM_KEYS if props.get(k) is not None}
            records.append(ItemRecord(item.id, item.collection_id, start, end, proj, assets, item.get_self_href()))
        elif isinstance(item, Mapping):
            try:
                record = record_from_dict(item, base)
            except ParseError as exc:
                if on_skip is None:
                    raise
                on_skip(exc)
                continue
            if not keep or keep.matches(item, (record.start, record.end)):
                records.append(record)
        else:
            raise TypeError(f"items must be pystac.Item objects or item dicts, got {type(item).__name__}")
        if keep and keep.max_items is not None and len(records) >= keep.max_items:
            break
    return records


# ---------------------------------------------------------------------------------------------
# static catalogs


def _storage_options_for(href: str, storage_options: Mapping[str, Any] | None) -> dict[str, Any]:
    return dict(storage_options or {}) if "://" in href and not href.startswith("file://") else {}


_STAC_IO_CLASS: type | None = None


def _stac_io_class() -> type:
    """:class:`FsspecStacIO`, defined on first use (``pipekit.datasets`` does not import pystac until it is needed)."""
    global _STAC_IO_CLASS
    if _STAC_IO_CLASS is not None:
        return _STAC_IO_CLASS
    import pystac

    class FsspecStacIO(pystac.StacIO):
        """pystac's ``StacIO`` reading and writing through fsspec (``s3://``, ``https://``, local paths...).

        Args:
            storage_options: fsspec options for remote hrefs (s3fs spelling for S3).

        ``requests`` counts the documents read.
        """

        def __init__(self, storage_options: Mapping[str, Any] | None = None) -> None:
            super().__init__()
            self.storage_options = dict(storage_options or {})
            self.requests = 0

        def read_text(self, source: Any, *args: Any, **kwargs: Any) -> str:
            import fsspec

            href = str(source.get_absolute_href() if hasattr(source, "get_absolute_href") else source)
            self.requests += 1
            options = _storage_options_for(href, self.storage_options)
            with fsspec.open(href, "rt", encoding="utf-8", **options) as f:
                return f.read()

        def write_text(self, dest: Any, txt: str, *args: Any, **kwargs: Any) -> None:
            import fsspec

            href = str(dest.get_absolute_href() if hasattr(dest, "get_absolute_href") else dest)
            if "://" not in href:
                os.makedirs(os.path.dirname(os.path.abspath(href)), exist_ok=True)
            with fsspec.open(href, "wt", encoding="utf-8", **_storage_options_for(href, self.storage_options)) as f:
                f.write(txt)

    FsspecStacIO.__module__ = __name__
    _STAC_IO_CLASS = FsspecStacIO
    return FsspecStacIO


def __getattr__(name: str) -> Any:
    if name == "FsspecStacIO":
        return _stac_io_class()
    if name == "read_geoparquet":  # its own module (pyarrow), named here as before
        from pipekit.geo._stac_geoparquet import read_geoparquet

        return read_geoparquet
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _read_document(stac_io: Any, href: str, linked_from: str | None, rel: str) -> dict[str, Any]:
    where = f" (the {rel!r} link of {linked_from!r})" if linked_from else ""
    try:
        text = stac_io.read_text(href)
    except FileNotFoundError as exc:
        raise ReadError("read STAC document", href, "STACDataset", f"broken link{where}: not found ({exc})") from exc
    except Exception as exc:
        raise ReadError("read STAC document", href, "STACDataset", f"{type(exc).__name__}: {exc}{where}") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ParseError("parse STAC document", href, "STACDataset", f"not JSON: {exc}{where}") from exc


def walk_catalog(
    href: str,
    storage_options: Mapping[str, Any] | None = None,
    threads: int = 16,
    stac_io: Any = None,
    keep: ItemFilter | None = None,
    on_skip: Callable[[StageError], None] | None = None,
) -> list[ItemRecord]:
    """The items of a static catalog or collection (its ``child`` and ``item`` links followed), or of a saved search.

    ``href`` may also be an item, or a saved search: an ItemCollection
    (``stac-client search --save``) or any GeoJSON FeatureCollection of items.

    Args:
        href: a ``catalog.json``/``collection.json`` (or an item), local or an fsspec URL.
        storage_options: fsspec options for remote hrefs.
        threads: items read concurrently (they are one request each).
        stac_io: the ``FsspecStacIO`` to read with (its ``requests`` counts the documents read).
        keep: an :class:`~pipekit.geo._stac_search.ItemFilter`: only the items it selects are returned
            (every item is still read: a static catalog has no index to search).
        on_skip: given (``on_error="skip"``), a child or item document that cannot be read or parsed
            (missing, truncated, an impossible time, an empty id) is passed to it and left out; the walk goes on.

    Raises:
        ReadError: a document cannot be read (a broken link names the link and the document holding it).
        ParseError: a document is not JSON, or the catalog has a cycle (names the link closing it); the
            root is not a STAC document (names what it is).

    Example:
        >>> import pystac, tempfile, datetime
        >>> root = tempfile.mkdtemp()
        >>> cat = pystac.Catalog("demo", "a demo")
        >>> _ = cat.add_item(pystac.Item("a", None, None, datetime.datetime(2024, 5, 1), {}))
        >>> cat.normalize_hrefs(root)
        >>> cat.save(pystac.CatalogType.SELF_CONTAINED)
        >>> [r.id for r in walk_catalog(f"{root}/catalog.json")]
        ['a']
    """
    from pystac.utils import make_absolute_href

    stac_io = stac_io or _stac_io_class()(storage_options)
    href = str(href)
    if "://" not in href:
        href = os.path.abspath(href)
    seen: set[str] = set()
    item_links: list[tuple[str, str]] = []
    records: list[ItemRecord] = []
    stack: list[tuple[str, str | None, str]] = [(href, None, "root")]
    while stack:
        current, parent, rel = stack.pop()
        if current in seen:
            raise ParseError(
                "walk STAC catalog",
                current,
                "STACDataset",
                f"the catalog has a cycle: the {rel!r} link of {parent!r} leads back to it",
            )
        seen.add(current)
        try:
            doc = _read_document(stac_io, current, parent, rel)
            if doc.get("type") == "Feature":
                record = _kept(record_from_dict(doc, current), doc, keep)
                if record is not None:
                    records.append(record)
                continue
        except (ReadError, ParseError) as exc:
            if on_skip is None or parent is None:
                raise
            on_skip(exc)
            continue
        if parent is None and doc.get("type") == "FeatureCollection":
            return _saved_search(doc, current, keep, on_skip)
        if parent is None and doc.get("type") not in ("Catalog", "Collection") and "links" not in doc:
            raise ParseError(
                "walk STAC catalog", current, "STACDataset",
                f"not a STAC catalog, collection, item or item collection (a JSON document of type "
                f"{doc.get('type')!r} with keys {sorted(doc)[:8]})",
            )
        children = []
        for link in doc.get("links") or []:
            kind = link.get("rel")
            if kind not in ("child", "item") or not link.get("href"):
                continue
            target = make_absolute_href(str(link["href"]), current)
            if kind == "child":
                children.append((target, current, "child"))
            else:
                item_links.append((target, current))
        stack.extend(reversed(children))

    def load(link: tuple[str, str]) -> ItemRecord | StageError | None:
        target, parent = link
        try:
            doc = _read_document(stac_io, target, parent, "item")
            return _kept(record_from_dict(doc, target), doc, keep)
        except (ReadError, ParseError) as exc:
            if on_skip is None:
                raise
            return exc  # recorded in link order, in this thread

    if threads > 1 and len(item_links) > 1:
        with concurrent.futures.ThreadPoolExecutor(min(threads, len(item_links))) as pool:
            loaded = list(pool.map(load, item_links))
    else:
        loaded = [load(link) for link in item_links]
    for result in loaded:
        if isinstance(result, StageError):
            on_skip(result)  # type: ignore[misc]
        elif result is not None:
            records.append(result)
    if keep and keep.max_items is not None:
        del records[keep.max_items :]
    return records


def _saved_search(
    doc: Mapping[str, Any], href: str, keep: ItemFilter | None, on_skip: Callable[[StageError], None] | None
) -> list[ItemRecord]:
    """The items of a saved search: an ItemCollection or GeoJSON FeatureCollection file (relative hrefs resolved)."""
    features = [f for f in doc.get("features") or [] if isinstance(f, Mapping)]
    if features and not any("stac_version" in f or "assets" in f for f in features):
        raise ParseError(
            "read saved STAC search", href, "STACDataset",
            f"a GeoJSON FeatureCollection of {len(features)} feature(s) that are not STAC items (none has "
            "'stac_version' or 'assets'): pass a catalog, an ItemCollection or a FeatureCollection of items",
        )
    records = records_from_items(features, keep, on_skip, base=href)
    return records


def _kept(record: ItemRecord, doc: Mapping[str, Any], keep: ItemFilter | None) -> ItemRecord | None:
    return record if not keep or keep.matches(doc, (record.start, record.end)) else None


# ---------------------------------------------------------------------------------------------
# STAC API search


def search_api(
    url: str,
    search: Mapping[str, Any],
    client_options: Mapping[str, Any] | None = None,
    counter: list[int] | None = None,
) -> list[ItemRecord]:
    """The items a STAC API search returns (pystac-client; every page followed).

    Args:
        url: the API's landing page.
        search: ``ItemSearch`` parameters (``collections``, ``bbox``, ``intersects``, ``datetime``,
            ``query``, ``filter``, ``max_items``, ``limit``...).
        client_options: extra keyword arguments of ``pystac_client.Client.open`` (``headers``...).
        counter: a one-element list incremented per HTTP request (pages included).
    """
    from pystac_client import Client

    from pipekit.geo._stac_search import parse_filter

    if search.get("filter") is not None:
        parse_filter(search["filter"], url)  # a clear error before any request
    options = dict(client_options or {})
    modifier = options.pop("request_modifier", None)

    def count(request: Any) -> Any:
        if counter is not None:
            counter[0] += 1
        return modifier(request) if modifier is not None else request

    try:
        client = Client.open(url, request_modifier=count, **options)
        results = client.search(**dict(search))
        return [record_from_dict(item) for item in results.items_as_dicts()]
    except (ReadError, ParseError):
        raise
    except Exception as exc:
        raise ReadError("search STAC API", url, "STACDataset", f"{type(exc).__name__}: {exc}") from exc
