"""``pipekit inspect`` on rasters: a table of files and scenes with product, CRS, resolution, footprint..."""

from __future__ import annotations

import concurrent.futures
import math
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pipekit.cli._common import CliError, Listing, file_kind, human_bytes, one_line
from pipekit.cli.products import GENERIC, PRODUCTS, Product, detect_product, format_date
from pipekit.profiling import format_table

__all__ = ["RasterMeta", "RasterEntry", "RasterReport", "inspect_rasters"]

_THREADS = 8


@dataclass
class RasterMeta:
    """What one raster file's header says."""

    url: str
    name: str
    nbytes: int
    crs: str | None = None
    res: tuple[float, float] | None = None
    width: int = 0
    height: int = 0
    count: int = 0
    dtype: str = ""
    nodata: float | None = None
    bounds: tuple[float, float, float, float] | None = None
    lonlat: tuple[float, float, float, float] | None = None
    geographic: bool = False
    layout: str = ""
    tag_date: str | None = None
    error: str | None = None


def _read_meta(opener: Any, url: str, name: str, nbytes: int) -> RasterMeta:
    from rasterio.warp import transform_bounds

    meta = RasterMeta(url, name, nbytes)
    try:
        ds = opener.open(url, "inspect")
    except Exception as exc:
        meta.error = one_line(exc)
        return meta
    try:
        meta.width, meta.height, meta.count = ds.width, ds.height, ds.count
        meta.dtype = ds.dtypes[0] if ds.count else ""
        meta.nodata = ds.nodata
        bh, bw = ds.block_shapes[0] if ds.count else (0, 0)
        blocks = f"blocks {bw}x{bh}"  # tiles (256x256) read windows cheaply; strips (Wx1) do not
        compress = str(ds.profile.get("compress") or "uncompressed").lower()
        overviews = ds.overviews(1) if ds.count else []
        meta.layout = f"{blocks}, {compress}" + (f", {len(overviews)} overviews" if overviews else "")
        meta.tag_date = ds.tags().get("TIFFTAG_DATETIME")
        if ds.crs is not None and ds.crs.to_wkt() and not ds.transform.is_identity:
            epsg = ds.crs.to_epsg()
            meta.crs = f"EPSG:{epsg}" if epsg else ds.crs.to_string()
            meta.geographic = bool(ds.crs.is_geographic)
            t = ds.transform
            meta.res = (math.hypot(t.a, t.d), math.hypot(t.b, t.e))
            left, bottom, right, top = ds.bounds
            meta.bounds = (left, bottom, right, top)
            meta.lonlat = tuple(transform_bounds(ds.crs, "EPSG:4326", left, bottom, right, top, densify_pts=21))
    except Exception as exc:
        meta.error = one_line(exc)
    finally:
        ds.close()
    return meta


@dataclass
class RasterEntry:
    """A row of the table: one file, or a scene of band files."""

    name: str
    product: str
    files: list[RasterMeta]
    bands: list[str]
    date: str | None

    @property
    def first(self) -> RasterMeta:
        ok = [f for f in self.files if f.error is None]
        return ok[0] if ok else self.files[0]

    @property
    def georeferenced(self) -> bool:
        return self.first.error is None and self.first.bounds is not None

    def footprint(self) -> tuple[float, float, float, float] | None:
        boxes = [f.bounds for f in self.files if f.bounds is not None and f.crs == self.first.crs]
        if not boxes:
            return None
        return (min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes))

    def lonlat(self) -> tuple[float, float, float, float] | None:
        boxes = [f.lonlat for f in self.files if f.lonlat is not None]
        if not boxes:
            return None
        return (min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes))

    def as_dict(self) -> dict[str, Any]:
        first = self.first
        return {
            "name": self.name,
            "product": self.product,
            "files": [f.url for f in self.files],
            "bands": self.bands,
            "crs": first.crs,
            "res": sorted({f.res for f in self.files if f.res is not None}),
            "width": first.width,
            "height": first.height,
            "dtype": first.dtype,
            "nodata": first.nodata,
            "date": self.date,
            "bounds": self.footprint(),
            "bounds_lonlat": self.lonlat(),
            "layout": first.layout,
            "bytes": sum(f.nbytes for f in self.files),
            "errors": {f.url: f.error for f in self.files if f.error},
        }


def _fmt_num(v: float) -> str:
    return f"{v:.6g}" if abs(v) < 1e6 else f"{v:.0f}"


def _fmt_bounds(b: tuple[float, float, float, float] | None, geographic: bool) -> str:
    if b is None:
        return "-"
    if geographic:
        return ", ".join(f"{v:.4f}" for v in b)
    return ", ".join(f"{v:.0f}" if abs(v) >= 1000 else f"{v:.4g}" for v in b)


def _fmt_res(files: list[RasterMeta]) -> str:
    values = sorted({round(r, 9) for f in files if f.res is not None for r in f.res})
    if not values:
        return "-"
    if len(values) == 1:
        return _fmt_num(values[0])
    return f"{_fmt_num(values[0])}-{_fmt_num(values[-1])}"


def _fmt_bands(bands: list[str]) -> str:
    if len(bands) <= 4:
        return f"{len(bands)}: {','.join(bands)}"
    return f"{len(bands)}: {bands[0]}..{bands[-1]}"


@dataclass
class RasterReport:
    root: str
    entries: list[RasterEntry]
    skipped: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[str]:
        return [f.error if f.url in f.error else f"cannot read {f.url}: {f.error}"
                for e in self.entries for f in e.files if f.error]

    def union(self) -> tuple[tuple[float, float, float, float] | None, str | None, tuple | None]:
        """(lon/lat union, the common CRS or None, union in that CRS)."""
        geo = [e for e in self.entries if e.georeferenced]
        boxes = [b for b in (e.lonlat() for e in geo) if b is not None]
        lonlat = None
        if boxes:
            lonlat = (min(b[0] for b in boxes), min(b[1] for b in boxes),
                      max(b[2] for b in boxes), max(b[3] for b in boxes))
        crss = {e.first.crs for e in geo}
        if len(crss) == 1:
            native = [b for b in (e.footprint() for e in geo) if b is not None]
            union = (min(b[0] for b in native), min(b[1] for b in native),
                     max(b[2] for b in native), max(b[3] for b in native))
            return lonlat, next(iter(crss)), union
        return lonlat, None, None

    def as_dict(self) -> dict[str, Any]:
        lonlat, crs, native = self.union()
        return {
            "kind": "rasters",
            "root": self.root,
            "entries": [e.as_dict() for e in self.entries],
            "files": sum(len(e.files) for e in self.entries),
            "union_lonlat": lonlat,
            "union_crs": crs,
            "union": native,
            "errors": self.errors,
            "skipped": self.skipped,
        }

    def render(self) -> str:
        rows = [("file", "product", "CRS", "res", "size", "bands", "dtype", "date", "footprint (CRS)",
                 "footprint (lon/lat W,S,E,N)", "layout", "bytes")]
        for e in self.entries:
            f = e.first
            if f.error is not None and len(e.files) == 1:
                rows.append((e.name, e.product, "-", "-", "-", "-", "-", e.date or "-", "unreadable (see below)",
                             "-", "-", human_bytes(f.nbytes)))
                continue
            rows.append((
                e.name, e.product, f.crs or "none", _fmt_res(e.files), f"{f.width}x{f.height}", _fmt_bands(e.bands),
                f.dtype, e.date or "-", _fmt_bounds(e.footprint(), f.geographic), _fmt_bounds(e.lonlat(), True),
                f.layout, human_bytes(sum(x.nbytes for x in e.files)),
            ))
        lines = [format_table(rows), ""]
        nfiles = sum(len(e.files) for e in self.entries)
        products = Counter(e.product for e in self.entries)
        what = ", ".join(f"{n} {p}" for p, n in products.items())
        scenes = sum(1 for e in self.entries if len(e.files) > 1)
        lines.append(f"{nfiles} raster file(s) in {len(self.entries)} entr{'y' if len(self.entries) == 1 else 'ies'}"
                     f" ({what}){f'; {scenes} scene(s) of separate band files' if scenes else ''}")
        crss = Counter(e.first.crs for e in self.entries if e.georeferenced)
        if crss:
            lines.append("CRS: " + ", ".join(f"{c} ({n})" for c, n in crss.most_common()))
        by_product: dict[str, list[str]] = {}
        for e in self.entries:
            if e.date:
                by_product.setdefault(e.product, []).append(e.date)
        if by_product:
            spans = []
            for product, dates in sorted(by_product.items()):
                dates.sort()
                spans.append(f"{dates[0]}" + (f" .. {dates[-1]}" if dates[-1] != dates[0] else "") + f" ({product})")
            lines.append("dates: " + "; ".join(spans))
        lonlat, crs, native = self.union()
        if lonlat is not None:
            lines.append(f"union footprint (lon/lat W,S,E,N): {_fmt_bounds(lonlat, True)}")
        if native is not None:
            lines.append(f"union footprint ({crs}): {_fmt_bounds(native, crs == 'EPSG:4326')}")
        ungeo = [e.name for e in self.entries if not e.georeferenced and e.first.error is None]
        if ungeo:
            lines.append(f"{len(ungeo)} raster(s) without a CRS or geotransform (not on the map), e.g. {ungeo[0]}")
        if self.skipped:
            lines.append(f"{len(self.skipped)} other file(s) ignored, e.g. {self.skipped[0]}")
        for err in self.errors:
            lines.append(f"error: {err}")
        return "\n".join(lines)


def _scene_key(product: Product, match: Any, name: str) -> tuple[Any, ...]:
    groups = {k: v for k, v in match.groupdict().items() if k not in ("band", "resolution")}
    directory = name.rsplit("/", 1)[0] if "/" in name else ""
    # Sentinel-2 Level-2A keeps the bands of one scene in sibling folders (R10m, R20m, R60m)
    where = directory.rsplit("/", 1)[0] if product.name == "sentinel2" and "/" in directory else directory
    return (product.name, where, tuple(sorted(groups.items())))


def _scene_name(name: str, match: Any) -> str:
    """The file's relative name with its band (and resolution) replaced by ``*``."""
    head = name[: len(name) - len(name.rsplit("/", 1)[-1])]
    base = name[len(head):]
    spans = sorted((match.span(g) for g in ("band", "resolution")
                    if g in match.groupdict() and match.group(g)), reverse=True)
    for start, stop in spans:
        base = base[:start] + "*" + base[stop:]
    return head + base


def inspect_rasters(listing: Listing, product_name: str | None, storage_options: dict[str, Any]) -> RasterReport:
    """Read the header of every raster under ``listing`` and group the band files of scenes."""
    from rasterio.errors import NotGeoreferencedWarning

    from pipekit.geo.io import RasterOpener

    chosen = PRODUCTS.get(product_name) if product_name not in (None, GENERIC) else None
    candidates: list[tuple[str, str, int, Product | None, Any]] = []
    skipped: list[str] = []
    for url, name, nbytes in listing.files:
        base = name.rsplit("/", 1)[-1]
        if file_kind(base) != "raster":
            skipped.append(name)
            continue
        product, match = detect_product(base)
        if product_name is not None:
            if chosen is not None:
                match = chosen.match(base)
                product = chosen if match is not None else None
                if product is None:
                    skipped.append(name)
                    continue
            elif product is not None:  # --product raster: the rasters no product claims
                skipped.append(name)
                continue
        candidates.append((url, name, nbytes, product, match))
    if not candidates:
        if product_name is not None and chosen is not None:
            glob = chosen.cls.filename_glob.replace("{}", "*")
            raise CliError(f"no {product_name} files (named like {glob!r}) in {listing.root!r}")
        raise CliError(f"no raster files in {listing.root!r}")
    opener = RasterOpener(storage_options)
    with warnings.catch_warnings():
        # rasters without a CRS are reported in the table; rasterio's warning would only repeat it
        warnings.simplefilter("ignore", NotGeoreferencedWarning)
        with concurrent.futures.ThreadPoolExecutor(min(_THREADS, len(candidates)),
                                                   thread_name_prefix="pipekit-inspect") as pool:
            metas = list(pool.map(lambda c: _read_meta(opener, c[0], c[1], c[2]), candidates))
    groups: dict[tuple[Any, ...], RasterEntry] = {}
    entries: list[RasterEntry] = []
    for (_url, name, _n, product, match), meta in zip(candidates, metas):
        cls = product.cls if product is not None else None
        date = None
        if match is not None and match.groupdict().get("date"):
            date = format_date(match.group("date"), cls.date_format)
        elif meta.tag_date:
            date = meta.tag_date.replace(":", "-", 2).replace(" ", "T")
        if product is not None and cls.separate_files and match is not None and "band" in match.groupdict():
            key = _scene_key(product, match, name)
            entry = groups.get(key)
            if entry is None:
                entry = groups[key] = RasterEntry(_scene_name(name, match), product.name, [], [], date)
                entries.append(entry)
            entry.files.append(meta)
            entry.bands.append(match.group("band"))
            continue
        if product is not None and cls.all_bands and len(cls.all_bands) == meta.count:
            bands = list(cls.all_bands)
        else:
            bands = [str(i) for i in range(1, meta.count + 1)]
        entries.append(RasterEntry(name, product.name if product else GENERIC, [meta], bands, date))
    for entry in entries:
        if len(entry.files) > 1 and entry.product in PRODUCTS:
            order = list(PRODUCTS[entry.product].cls.all_bands)
            paired = sorted(zip(entry.bands, entry.files),
                            key=lambda bf: order.index(bf[0]) if bf[0] in order else len(order))
            entry.bands = [b for b, _ in paired]
            entry.files = [f for _, f in paired]
    return RasterReport(listing.root, entries, skipped)
