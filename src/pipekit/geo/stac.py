"""STAC datasets: :class:`STACDataset`, a geo dataset of the assets of SpatioTemporal Asset Catalog items.

Items come from a static catalog, a STAC API search, a stac-geoparquet file
or ``pystac.Item`` objects (see :mod:`pipekit.geo.stac_items`).  Each item is
an index entry; its chosen assets are the bands of a scene, read as COG
windows by :class:`~pipekit.geo.raster.RasterDataset`'s machinery (GDAL
``/vsis3/``/``/vsicurl/`` or fsspec, warped into the dataset CRS, mosaicked
across items and UTM zones).  The dataset keeps only arrays, item ids and
asset hrefs: it pickles to DataLoader workers without the items' JSON.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from affine import Affine
from rasterio.crs import CRS
from rasterio.enums import Resampling

from pipekit.errors import ReadError
from pipekit.geo.base import Sample, _fill_dtype
from pipekit.geo.discovery import DatasetNotFoundError, RasterHeader, _FileTable, read_header
from pipekit.geo.index import GeoIndex
from pipekit.geo.raster import RasterDataset
from pipekit.geo.read import Grid, transform_bounds_fast
from pipekit.geo.reader import EntryLabel, ReadSettings
from pipekit.geo.stac_items import (
    ItemRecord,
    is_geoparquet,
    read_geoparquet,
    records_from_items,
    search_api,
    walk_catalog,
)
from pipekit.geo.stac_search import SEARCH_KEYS, ItemFilter

__all__ = ["STACDataset"]


def _bands_of(asset: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """An asset's band list: STAC 1.1 ``bands``, else ``eo:bands``, else ``raster:bands``."""
    for key in ("bands", "eo:bands", "raster:bands"):
        value = asset.get(key)
        if value:
            return list(value)
    return []


def _band_names(band: Mapping[str, Any]) -> set[str]:
    return {str(v) for v in (band.get("name"), band.get("common_name"), band.get("eo:common_name")) if v}


def _still_selects(record: ItemRecord, wanted: Sequence[str], parts: Sequence[tuple[str, tuple[int, ...]]]) -> bool:
    """Whether ``parts`` (another item's selection) selects ``wanted`` in ``record`` too (as in one collection)."""
    for name, (key, indexes) in zip(wanted, parts):
        asset = record.assets.get(key)
        if asset is None:
            return False
        if key == name:
            if len(indexes) != max(1, len(_bands_of(asset))):
                return False
            continue
        bands = _bands_of(asset)
        if len(bands) > 1:  # a band of a multi-band asset: this item may hold it alone too (preferred)
            return False
        if len(indexes) != 1 or len(bands) < indexes[0] or name not in _band_names(bands[indexes[0] - 1]):
            return False
    return True


def select_assets(record: ItemRecord, wanted: Sequence[str]) -> list[tuple[str, tuple[int, ...]]]:
    """``(asset key, 1-based band indexes)`` of each wanted asset key or band name of an item.

    A name is an asset key (all its bands), else a band ``name`` or
    ``common_name`` (``"red"``, ``"nir"``) in an asset's ``eo:bands``/``bands``
    (single-band assets preferred over multi-band ones such as ``visual``).

    Raises:
        ReadError: the item has no such asset or band (names the item and its asset keys).

    Example:
        >>> from pipekit.geo.stac_items import ItemRecord
        >>> rec = ItemRecord("S2B_T31UFU", None, 0, 0, {}, {
        ...     "B04": {"href": "b04.tif", "eo:bands": [{"name": "B04", "common_name": "red"}]},
        ...     "visual": {"href": "tci.tif", "eo:bands": [{"name": "B04", "common_name": "red"},
        ...                                                {"name": "B03", "common_name": "green"}]}})
        >>> select_assets(rec, ["red", "visual"])
        [('B04', (1,)), ('visual', (1, 2))]
    """
    out = []
    for name in wanted:
        asset = record.assets.get(name)
        if asset is not None:
            out.append((name, tuple(range(1, max(1, len(_bands_of(asset))) + 1))))
            continue
        matches = []
        for key, fields in record.assets.items():
            bands = _bands_of(fields)
            for j, band in enumerate(bands):
                if name in _band_names(band):
                    matches.append((len(bands) > 1, key, j + 1))
        if not matches:
            where = f" (read from {record.href})" if record.href else ""
            raise ReadError(
                "select STAC asset",
                record.href or record.id,
                "STACDataset",
                f"item {record.id!r} has no asset or band {name!r}{where}; its assets are {sorted(record.assets)}",
            )
        _, key, index = min(matches)
        out.append((key, (index,)))
    return out


_CRS_CACHE: dict[Any, CRS] = {}


def _proj_crs(fields: Mapping[str, Any]) -> CRS | None:
    for key in ("proj:code", "proj:epsg", "proj:wkt2", "proj:projjson"):
        value = fields.get(key)
        if value is None:
            continue
        cache_key = value if isinstance(value, (str, int)) else repr(value)
        crs = _CRS_CACHE.get(cache_key)
        if crs is None:
            if key == "proj:epsg":
                crs = CRS.from_epsg(int(value))
            elif key == "proj:projjson":
                crs = CRS.from_dict(value)
            else:
                crs = CRS.from_user_input(value)
            _CRS_CACHE[cache_key] = crs
        return crs
    return None


def header_from_proj(record: ItemRecord, key: str, href: str) -> RasterHeader | None:
    """The raster header the projection extension gives an item's asset (``None`` if it lacks any part).

    Asset-level ``proj:*`` fields override the item's; ``raster:bands``
    (or 1.1 ``bands``) give the data type and nodata.
    """
    asset = record.assets[key]
    fields = {**record.proj, **{k: v for k, v in asset.items() if k.startswith("proj:")}}
    try:
        crs = _proj_crs(fields)
    except Exception:
        return None
    transform = fields.get("proj:transform")
    shape = fields.get("proj:shape")
    if crs is None or not transform or len(transform) < 6 or not shape or len(shape) != 2:
        return None
    affine = Affine(*[float(v) for v in list(transform)[:6]])
    height, width = int(shape[0]), int(shape[1])
    bands = _bands_of(asset)
    dtype = ""
    nodata = None
    for band in asset.get("raster:bands") or bands:
        dtype = str(band.get("data_type") or "")
        nodata = band.get("nodata")
        break
    if nodata is not None:
        try:
            nodata = float(nodata)
        except (TypeError, ValueError):  # "nan", "inf" strings
            nodata = float(str(nodata))
    left, top = affine.c, affine.f
    right, bottom = affine.c + affine.a * width + affine.b * height, affine.f + affine.d * width + affine.e * height
    bounds = (min(left, right), min(top, bottom), max(left, right), max(top, bottom))
    return RasterHeader(href, crs, affine, width, height, max(1, len(bands)), dtype or "float32", nodata, bounds)


class STACDataset(RasterDataset):
    """A geo dataset of STAC items' assets: one index entry per item, its chosen assets as bands.

    Items come from ``source``:

    * a static ``catalog.json``/``collection.json`` (local path, ``s3://``, ``https://``...),
      walked by following its ``child`` and ``item`` links;
    * a STAC API's landing page (``http(s)://``), searched with pystac-client
      (``collections``, ``bbox``/``intersects``, ``datetime``, ``query``/``filter``
      ...; every page followed);
    * a stac-geoparquet file (``.parquet``), read with pyarrow;
    * an iterable of ``pystac.Item`` objects (or item dicts), or a ``pystac.Catalog``.

    Each item's footprint and grid come from the projection extension
    (``proj:code``/``proj:epsg``, ``proj:transform``, ``proj:shape`` of the
    first chosen asset, asset-level fields first); an item without them has
    that asset's header read once with rasterio.  Its time interval is its
    ``datetime``, or ``start_datetime``/``end_datetime``.  ``dataset.index``'s
    ``filepath`` column holds the item ids.

    Args:
        source: see above.
        assets: asset keys or band names (``eo:bands``/``bands`` ``name`` or
            ``common_name``: ``"red"``, ``"nir"``) read, in this order, as the
            sample's channels.
        crs: the dataset CRS (default: the first item's).
        res: pixel size (default: the first item's first asset's).
        transforms: a callable applied to every sample dict.
        is_image: samples hold ``"image"`` (default) or ``"mask"``.
        time_series: stack, rather than mosaic, the items a query's time
            overlaps (as :class:`RasterDataset`): ``sample["image"]`` is
            ``[T, C, H, W]`` (a mask ``[T, H, W]``), one step per distinct
            item time (the tiles of one date, in any UTM zone, are mosaicked
            into one step), oldest first, and ``sample["dates"]`` the ``[T]``
            float64 POSIX seconds of each step's start.
        nodata: override the assets' nodata value (also the fill value).
        dtype: as :class:`RasterDataset` (float32 images, int64 masks, or ``"native"``).
        resampling: as :class:`RasterDataset`.
        storage_options: fsspec options for the catalog, the parquet file and ``s3://`` assets.
        href_modifier: a picklable callable ``href -> href`` applied when an
            asset is opened (in the worker, so signed URLs are fresh).
        on_error: ``"raise"`` or ``"skip"``: items whose assets cannot be
            selected or indexed, and reads that fail, are counted in
            ``skip_log`` (a failed read leaves the query without sample, as
            :class:`RasterDataset`).
        collections, bbox, intersects, datetime, query, filter, max_items, limit, ids:
            STAC API search parameters (pystac-client's spellings).  An API
            evaluates them; on any other source they are evaluated client-side
            as each item is read (:class:`~pipekit.geo.stac_search.ItemFilter`:
            ``filter`` with the ``cql2`` package, ``query``'s comparisons and
            ``in``), selecting the same items an API would.
        client_options: extra arguments of ``pystac_client.Client.open`` (``headers``...).
        cache, vsi, gdal_options, cache_dir: as :class:`RasterDataset`.

    Raises:
        DatasetNotFoundError: no item could be indexed.
        ReadError: a document, item or asset cannot be read (names the item id and the href).
        ParseError: a catalog has a cycle or a document is not JSON (names the link); a search
            parameter is malformed, or a filter evaluated client-side is not CQL2 or cannot be evaluated.

    Example:
        >>> import datetime, tempfile, numpy as np, pystac, rasterio
        >>> from affine import Affine
        >>> root = tempfile.mkdtemp()
        >>> with rasterio.open(f"{root}/red.tif", "w", driver="GTiff", width=64, height=64, count=1,
        ...                    dtype="uint16", crs="EPSG:32631", transform=Affine(10, 0, 600000, 0, -10, 5300000)) as f:
        ...     f.write(np.full((1, 64, 64), 7, dtype="uint16"))
        >>> item = pystac.Item("S2A_MSIL2A_20240601T103031_T31UFU", {"type": "Point", "coordinates": [4.4, 47.8]},
        ...                    None, datetime.datetime(2024, 6, 1), {"proj:code": "EPSG:32631",
        ...                    "proj:transform": [10, 0, 600000, 0, -10, 5300000], "proj:shape": [64, 64]})
        >>> item.add_asset("B04", pystac.Asset(f"{root}/red.tif", extra_fields={
        ...     "eo:bands": [{"name": "B04", "common_name": "red"}]}))
        >>> ds = STACDataset([item], assets=["red"])
        >>> sample = ds[600000:600320, 5299680:5300000]
        >>> sample["image"].shape, float(sample["image"].max()), list(ds.index["filepath"])
        (torch.Size([1, 32, 32]), 7.0, ['S2A_MSIL2A_20240601T103031_T31UFU'])
    """

    _concurrent_parts = False  # an item's assets are read one after the other (on the network I/O thread if remote)

    def __init__(
        self,
        source: Any,
        assets: Sequence[str],
        crs: Any = None,
        res: Any = None,
        transforms: Callable[[Sample], Sample] | None = None,
        *,
        is_image: bool = True,
        time_series: bool = False,
        nodata: float | None = None,
        dtype: torch.dtype | str | None = None,
        resampling: Resampling | str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        href_modifier: Callable[[str], str] | None = None,
        on_error: str = "raise",
        collections: Any = None,
        bbox: Any = None,
        intersects: Any = None,
        datetime: Any = None,
        query: Any = None,
        filter: Any = None,
        max_items: int | None = None,
        limit: int | None = None,
        ids: Any = None,
        client_options: Mapping[str, Any] | None = None,
        cache: bool = True,
        vsi: bool | None = None,
        gdal_options: Mapping[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        try:
            import pystac  # noqa: F401
        except ImportError as exc:  # pragma: no cover - the test env has it
            raise ImportError(
                "STACDataset needs pystac (and pystac-client, pyarrow): pip install 'pipekit[stac]'"
            ) from exc
        if isinstance(assets, str) or not isinstance(assets, Sequence) or not assets:
            raise TypeError(f"assets must be a non-empty list of asset keys or band names, got {assets!r}")
        if href_modifier is not None and not callable(href_modifier):
            raise TypeError(f"href_modifier must be callable (href -> href), got {href_modifier!r}")
        if not isinstance(is_image, bool):
            raise TypeError(f"is_image must be a bool, got {is_image!r}")
        self.is_image = is_image
        self.href_modifier = href_modifier
        local = locals()
        self._search = {k: local[k] for k in SEARCH_KEYS if local[k] is not None}
        self._client_options = dict(client_options or {})
        self._source = source
        self.requests = 0
        super().__init__(
            _describe(source),
            crs,
            res,
            list(assets),
            transforms,
            cache,
            storage_options,
            nodata=nodata,
            dtype=dtype,
            resampling=resampling,
            on_error=on_error,
            vsi=vsi,
            gdal_options=gdal_options,
            cache_dir=cache_dir,
            time_series=time_series,
        )
        del self._source  # the items are indexed: nothing of their JSON is kept

    # -- configuration ------------------------------------------------------------------------
    def _check_bands(self, bands: Sequence[str] | None) -> list[Any]:
        chosen = list(bands or [])
        bad = [b for b in chosen if not isinstance(b, str) or not b]
        if bad:
            raise TypeError(f"assets are asset keys or band names (strings), got {bad}")
        if len(set(chosen)) != len(chosen):
            raise ValueError(f"assets must not repeat, got {chosen}")
        return chosen

    @property
    def assets(self) -> list[str]:
        """The asset keys or band names read, in channel order."""
        return list(self.bands)

    # -- indexing -----------------------------------------------------------------------------
    def _item_filter(self, source: str) -> ItemFilter | None:
        """The search parameters, evaluated client-side on a source that is not an API (``None``: none given)."""
        keep = ItemFilter(self._search, source) if self._search else None
        return keep if keep else None

    def _records(self) -> list[ItemRecord]:
        source = self._source
        if isinstance(source, (str, os.PathLike)):
            href = os.fspath(source)
            if is_geoparquet(href):
                self.requests += 1
                return read_geoparquet(href, self.storage_options, self.bands, self._item_filter(href))
            is_url = href.startswith(("http://", "https://"))
            self.requests += is_url  # the landing page or root document, read to tell an API from a static catalog
            if is_url and _is_api(href, self._client_options):
                counter = [0]
                try:
                    return search_api(href, self._search, self._client_options, counter)
                finally:
                    self.requests += counter[0]
            from pipekit.geo.stac_items import FsspecStacIO

            stac_io = FsspecStacIO(self.storage_options)
            try:
                return walk_catalog(href, self.storage_options, stac_io=stac_io, keep=self._item_filter(href))
            finally:
                self.requests += stac_io.requests
        what = _describe(source)
        try:
            import pystac

            if isinstance(source, pystac.Catalog):
                return records_from_items(source.get_items(recursive=True), self._item_filter(what))
        except ImportError:  # pragma: no cover
            pass
        if isinstance(source, Iterable) and not isinstance(source, (bytes, Mapping)):
            return records_from_items(source, self._item_filter(what))
        raise TypeError(
            "source must be a catalog/collection path or URL, a STAC API URL, a stac-geoparquet file, "
            f"a pystac.Catalog or an iterable of pystac.Items, got {type(source).__name__}"
        )

    def _build_file_table(self) -> _FileTable:
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
                    self._skip_or_raise(exc)
                    continue
            item_hrefs = tuple(str(record.assets[key]["href"]) for key, _ in parts)
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
            searched = f" matching the search {self._search}" if self._search else ""
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
        table = _FileTable(ids, headers, np.asarray(times, dtype=np.float64).reshape(-1, 2), None, {})
        self._check_table(table)
        return table

    def _build_index(self, crs: CRS) -> GeoIndex:
        """RasterDataset's index, reprojecting each distinct grid once (the items of a tile share theirs)."""
        table = self._files
        keys = np.column_stack([table.crs_ids, table.transforms, table.shapes]).astype(np.float64)
        unique, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
        footprints = np.empty((len(unique), 4), dtype=np.float64)
        for k, row in enumerate(first.tolist()):
            left, bottom, right, top = table.native_bounds(row)
            if table.crs(row) != crs:
                left, bottom, right, top = transform_bounds_fast(table.crs(row), crs, left, bottom, right, top)
            footprints[k] = (left, right, bottom, top)
        boxes = np.empty((len(table), 6), dtype=np.float64)
        boxes[:, :4] = footprints[inverse.reshape(-1)]
        boxes[:, 4:] = table.times
        if self._rows is not None:
            boxes = boxes[self._rows]
        return GeoIndex(boxes)

    def _header_of(self, record: ItemRecord, key: str, href: str) -> RasterHeader | None:
        """The header of an asset without the projection extension, read once with rasterio."""
        url = self._modified(href)
        try:
            header = read_header(self._opener, url, self.name)
            error = header.index_error(self.name)
        except ReadError as exc:
            error = exc
        if error is not None:
            self._skip_or_raise(
                ReadError(
                    error.action,
                    error.url,
                    error.stage,
                    f"item {record.id!r} asset {key!r} (no projection extension): {error.reason}",
                )
            )
            return None
        return header

    def _check_table(self, table: _FileTable, band_dtypes: Sequence[str] = ()) -> None:
        natives = [np.dtype(d) for d in table.dtypes]
        native = np.result_type(*natives) if natives else np.dtype(np.float32)
        if self.nodata is not None:
            fill = float(self.nodata)
        else:
            first = table.file_nodata(0)
            fill = first if first is not None else 0.0
        self._fill_value = fill
        self._np_dtype = _fill_dtype(native, fill)
        self._indexes = []
        self._channels = sum(len(idx) for _, idx in self._layouts[0])

    # -- what the entries are ---------------------------------------------------------------
    @property
    def item_ids(self) -> list[str]:
        """The indexed items' ids (``dataset.index["filepath"]``)."""
        return self.files

    def asset_hrefs(self, i: int) -> dict[str, str]:
        """``{asset key: href}`` of index entry ``i`` (before ``href_modifier``)."""
        row = int(self._entry_rows()[i])
        layout = self._layouts[int(self._layout_ids[row])]
        return {key: self._href(row, col) for col, (key, _) in enumerate(layout)}

    def _href(self, row: int, col: int) -> str:
        return self._href_prefix + self._href_table[int(self._href_ids[row, col])]

    def _modified(self, href: str) -> str:
        return href if self.href_modifier is None else str(self.href_modifier(href))

    def _frame(self) -> Any:
        from pipekit.geo.frame import frame_from_index

        rows = self._entry_rows()
        first = [self._href(int(r), 0) for r in rows]
        return frame_from_index(self.geo_index, self._crs, {"filepath": self.files, "href": first})

    # -- reading ------------------------------------------------------------------------------
    def _read_entry(self, i: int, grid: Grid, out: np.ndarray, valid: np.ndarray | None, prefilled: bool,
                    settings: ReadSettings | None = None) -> None:
        layout = self._layouts[int(self._layout_ids[i])]
        parts = [(self._modified(self._href(i, col)), list(idx)) for col, (_, idx) in enumerate(layout)]
        label = EntryLabel(f"item {self._files.path(i)!r}", [key for key, _ in layout])
        self._reader.read(parts, grid, out, valid, prefilled, settings or self._read_settings(), label)


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


def _describe(source: Any) -> str:
    """A short text for ``source`` (what the dataset keeps of it: never the items)."""
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    try:
        return f"<{len(source)} STAC items>"
    except TypeError:
        return f"<{type(source).__name__} of STAC items>"
