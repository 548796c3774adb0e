"""``pipekit inspect`` on rasters: a table of files and scenes with product, CRS, resolution, footprint...

Each raster's header is read, and the band files of a scene grouped, by
the code the geo datasets use (:func:`pipekit.geo.catalog._headers.read_headers`,
:func:`~pipekit.geo.catalog._headers.read_header`,
:func:`~pipekit.geo.catalog._scenes.group_scenes`), so that an entry of the table
is what a dataset of its product indexes as one scene.
"""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pipekit.cli._common import CliError, Listing, file_kind, human_bytes, one_line
from pipekit.cli._products import GENERIC, PRODUCTS, Product, detect_product, format_date
from pipekit.geo import io as geo_io
from pipekit.geo.catalog._headers import read_header, read_headers
from pipekit.geo.catalog._listing import any_band_glob
from pipekit.geo.catalog._scenes import group_scenes
from pipekit.geo.io import RasterOpener
from pipekit.profiling import format_table

__all__ = ["RasterMeta", "RasterEntry", "RasterReport", "inspect_rasters"]


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


def _read_meta(opener: RasterOpener, url: str, name: str, nbytes: int) -> RasterMeta:
    """The header of ``url`` as the table shows it (read with the datasets' :func:`read_header`)."""
    from rasterio.warp import transform_bounds

    meta = RasterMeta(url, name, nbytes)
    try:
        header = read_header(opener, url, "inspect", layout=True)
    except Exception as exc:
        meta.error = one_line(exc)
        return meta
    try:
        meta.width, meta.height, meta.count = header.width, header.height, header.count
        meta.dtype = header.dtype
        meta.nodata = header.nodata
        bh, bw = header.block_shape or (0, 0)
        blocks = f"blocks {bw}x{bh}"  # tiles (256x256) read windows cheaply; strips (Wx1) do not
        compress = str(header.compression or "uncompressed").lower()
        meta.layout = f"{blocks}, {compress}" + (f", {header.overviews} overviews" if header.overviews else "")
        meta.tag_date = header.tags.get("TIFFTAG_DATETIME")
        if header.georeferenced:  # what a dataset can index: a CRS and a geotransform
            crs = header.crs
            epsg = crs.to_epsg()
            meta.crs = f"EPSG:{epsg}" if epsg else crs.to_string()
            meta.geographic = bool(crs.is_geographic)
            meta.res = header.res
            meta.bounds = header.bounds
            meta.lonlat = tuple(transform_bounds(crs, "EPSG:4326", *header.bounds, densify_pts=21))
    except Exception as exc:
        meta.error = one_line(exc)
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


def _scene_name(name: str, match: Any, variant_groups: tuple[str, ...]) -> str:
    """The file's relative name with its band (and variant groups, e.g. resolution) replaced by ``*``."""
    head = name[: len(name) - len(name.rsplit("/", 1)[-1])]
    base = name[len(head):]
    spans = sorted((match.span(g) for g in ("band", *variant_groups)
                    if g in match.groupdict() and match.group(g)), reverse=True)
    for start, stop in spans:
        base = base[:start] + "*" + base[stop:]
    return head + base


def _in_scenes(product: Product | None, match: Any) -> bool:
    """Whether a file is one band of a scene of band files (a ``separate_files`` product)."""
    return product is not None and product.cls.separate_files and match is not None and "band" in match.groupdict()


def _scenes(candidates: list[tuple[str, str, int, Product | None, Any]]) -> dict[str, int]:
    """Scene numbers of the band files among ``candidates``, grouped per product as its dataset groups them."""
    by_product: dict[str, list[tuple[str, Any]]] = {}
    for url, _name, _n, product, match in candidates:
        if _in_scenes(product, match):
            by_product.setdefault(product.name, []).append((url, match))
    scene_of: dict[str, int] = {}
    number = 0
    for product_name, matched in by_product.items():
        matched.sort(key=lambda item: item[0])  # the datasets' order: sorted by path
        for scene in group_scenes(matched, tuple(PRODUCTS[product_name].cls.band_variant_groups)):
            for path, _ in scene.values():
                scene_of[path] = number
            number += 1
    return scene_of


def inspect_rasters(listing: Listing, product_name: str | None, storage_options: dict[str, Any]) -> RasterReport:
    """Read the header of every raster under ``listing`` and group the band files of scenes.

    Scenes are grouped as the product's dataset groups them (the files whose
    names differ only in the band and resolution, see
    :func:`~pipekit.geo.catalog._scenes.group_scenes`); a band file that a dataset
    would not read (another file of its folder holds the same band of the
    same scene) is listed among the files ignored.
    """
    from rasterio.errors import NotGeoreferencedWarning

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
            glob = any_band_glob(chosen.cls.filename_glob)
            raise CliError(f"no {product_name} files (named like {glob!r}) in {listing.root!r}")
        raise CliError(f"no raster files in {listing.root!r}")
    opener = RasterOpener(storage_options)
    named = {url: (name, nbytes) for url, name, nbytes, _, _ in candidates}
    with warnings.catch_warnings():
        # rasters without a CRS are reported in the table; rasterio's warning would only repeat it
        warnings.simplefilter("ignore", NotGeoreferencedWarning)
        first = candidates[0][0]
        # fsspec file objects reach GDAL through rasterio's Python-file handler: one thread (catalog._cached_headers)
        workers = 1 if not geo_io.is_local(first) and not geo_io.uses_gdal_network(opener, first) else None
        metas = read_headers([c[0] for c in candidates], lambda url: _read_meta(opener, url, *named[url]), workers)
    scene_of = _scenes(candidates)
    scene_entries: dict[int, RasterEntry] = {}
    entries: list[RasterEntry] = []
    for (url, name, _n, product, match), meta in zip(candidates, metas):
        cls = product.cls if product is not None else None
        date = None
        if match is not None and match.groupdict().get("date"):
            date = format_date(match.group("date"), cls.date_format)
        elif meta.tag_date:
            date = meta.tag_date.replace(":", "-", 2).replace(" ", "T")
        if _in_scenes(product, match):
            number = scene_of.get(url)
            if number is None:  # the same band of the same scene as another file of its folder
                skipped.append(name)
                continue
            entry = scene_entries.get(number)
            if entry is None:
                scene_name = _scene_name(name, match, tuple(cls.band_variant_groups))
                entry = scene_entries[number] = RasterEntry(scene_name, product.name, [], [], date)
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
