"""``pipekit inspect`` on STAC: a static catalog/collection, a STAC API, or a stac-geoparquet file.

Reports the item count, the collections, the time span, the assets (how many
items hold each, its bands' names and common names, media type, the data type
and nodata it declares, read as :class:`~pipekit.datasets.STACDataset` reads
them: band, asset, item) and the CRSs of the items (from the projection extension).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from pipekit.cli._common import CliError
from pipekit.profiling import format_table

__all__ = ["StacReport", "inspect_stac", "looks_like_stac"]


def looks_like_stac(path: str, storage_options: dict[str, Any] | None = None) -> bool:
    """Whether ``pipekit inspect`` should read ``path`` as STAC: a ``.json`` document holding
    ``stac_version``, a ``.parquet`` file with STAC's ``assets`` and ``stac_version`` columns
    (stac-geoparquet; a plain GeoParquet file is a vector file), or an ``http(s)://`` URL that names
    no file (an API's landing page)."""
    lower = path.lower().rstrip("/")
    if lower.endswith(".json"):
        return _peek_json_is_stac(path, storage_options or {})
    if lower.endswith((".parquet", ".geoparquet")):
        return _parquet_is_stac(path, storage_options or {})
    if lower.startswith(("http://", "https://")):
        last = lower.split("://", 1)[1].split("/")[-1] if "/" in lower.split("://", 1)[1] else ""
        return "." not in last
    return False


def _peek_json_is_stac(path: str, storage_options: dict[str, Any]) -> bool:
    """A STAC document names its ``stac_version`` (GeoJSON that is not STAC does not); a file that
    cannot be read is handed to the STAC reader, whose error names it."""
    import fsspec

    try:
        with fsspec.open(path, "rb", **storage_options) as f:
            head = f.read(1 << 16)
    except Exception:
        return True
    return b'"stac_version"' in head or b'"type": "Catalog"' in head or b'"type":"Catalog"' in head


def _parquet_is_stac(path: str, storage_options: dict[str, Any]) -> bool:
    import fsspec
    import pyarrow.parquet as pq

    try:
        with fsspec.open(path, "rb", **storage_options) as f:
            names = set(pq.read_schema(f).names)
    except Exception:
        return True
    return "assets" in names and ("stac_version" in names or "stac_extensions" in names)


def _time(seconds: float) -> str:
    if seconds in (float("inf"), float("-inf")):
        return "open"
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class AssetStats:
    key: str
    items: int = 0
    bands: list[str] = field(default_factory=list)
    media_type: str | None = None
    data_type: str | None = None  # declared: a band's, the asset's (STAC 1.1) or the item's
    nodata: Any = None


@dataclass
class StacReport:
    source: str
    kind: str
    items: int
    collections: Counter
    start: float | None
    end: float | None
    assets: list[AssetStats]
    crs: Counter
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": "stac",
            "source": self.source,
            "source_kind": self.kind,
            "items": self.items,
            "collections": dict(self.collections),
            "time_span": None if self.start is None else [_time(self.start), _time(self.end)],
            "assets": {a.key: {"items": a.items, "bands": a.bands, "type": a.media_type, "data_type": a.data_type,
                               "nodata": a.nodata} for a in self.assets},
            "crs": dict(self.crs),
            "errors": self.errors,
        }

    def render(self) -> str:
        lines = [f"{self.source}: {self.kind}, {self.items} item(s)"]
        lines.append("collections: " + (", ".join(f"{c} ({n})" for c, n in self.collections.most_common()) or "none"))
        if self.start is not None:
            lines.append(f"time span: {_time(self.start)} .. {_time(self.end)}")
        lines.append("CRS: " + (", ".join(f"{c} ({n})" for c, n in self.crs.most_common()) or "none"))
        lines.append("")
        rows = [("asset", "items", "bands", "type", "data type", "nodata")]
        for a in self.assets:
            rows.append((a.key, str(a.items), ", ".join(a.bands) or "-", a.media_type or "-", a.data_type or "-",
                         "-" if a.nodata is None else str(a.nodata)))
        lines.append(format_table(rows, align="lrllll"))
        for error in self.errors:
            lines.append(f"error: {error}")
        return "\n".join(lines)


def inspect_stac(path: str, storage_options: dict[str, Any] | None = None) -> StacReport:
    """Read the items of ``path`` (catalog, API or stac-geoparquet) and summarise them."""
    from pipekit.errors import StageError
    from pipekit.geo._stac import _bands_of, _is_api, _proj_crs
    from pipekit.geo._stac_geoparquet import read_geoparquet
    from pipekit.geo._stac_items import FsspecStacIO, is_geoparquet, search_api, walk_catalog
    from pipekit.geo.catalog._stac_assets import raster_field

    try:
        if is_geoparquet(path):
            kind, records = "stac-geoparquet", read_geoparquet(path, storage_options)
        elif path.startswith(("http://", "https://")) and _is_api(path, {}):
            kind, records = "STAC API", search_api(path, {})
        else:
            kind, records = "static catalog", walk_catalog(path, storage_options,
                                                           stac_io=FsspecStacIO(storage_options))
    except StageError as exc:
        raise CliError(str(exc)) from None
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot read STAC from {path!r}: {exc}") from None
    assets: dict[str, AssetStats] = {}
    crs: Counter = Counter()
    starts = [r.start for r in records]
    ends = [r.end for r in records]
    for record in records:
        item_crs = set()
        for key, asset in record.assets.items():
            stats = assets.setdefault(key, AssetStats(key))
            stats.items += 1
            if not stats.bands:
                names = []
                for band in _bands_of(asset):
                    name = str(band.get("name") or "")
                    common = band.get("common_name") or band.get("eo:common_name")
                    names.append(f"{name} ({common})" if common and name else name or str(common or ""))
                stats.bands = [n for n in names if n]
            stats.media_type = stats.media_type or asset.get("type")
            if stats.data_type is None:
                stats.data_type = raster_field(record, asset, "data_type")
            if stats.nodata is None:
                stats.nodata = raster_field(record, asset, "nodata")
            fields = {**record.proj, **{k: v for k, v in asset.items() if str(k).startswith("proj:")}}
            try:
                found = _proj_crs(fields)
            except Exception:
                found = None
            if found is not None and "data" in (asset.get("roles") or ["data"]):
                epsg = found.to_epsg()
                item_crs.add(f"EPSG:{epsg}" if epsg else found.to_string())
        for name in item_crs or {"unknown (no projection extension)"}:
            crs[name] += 1
    return StacReport(
        source=os.fspath(path), kind=kind, items=len(records),
        collections=Counter(r.collection or "(none)" for r in records),
        start=min(starts) if starts else None, end=max(ends) if ends else None,
        assets=sorted(assets.values(), key=lambda a: a.key), crs=crs,
    )
