"""``pipekit inspect`` on vector files (GeoPackage, GeoJSON, Shapefile, FlatGeobuf, GeoParquet).

For each layer of each file: feature count, geometry types, CRS, bounds and
attribute names and types, read from the file's header with pyogrio where
the format keeps them there (GeoParquet is read with geopandas).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pipekit.cli._common import CliError, Listing, human_bytes, one_line
from pipekit.geo._vector import _SIDECARS
from pipekit.profiling import format_table

__all__ = ["VECTOR_EXTENSIONS", "is_vector", "describe_vector", "VectorReport", "inspect_vectors"]

#: extensions of the vector files ``inspect`` and ``preview`` read (a Shapefile by its ``.shp``)
VECTOR_EXTENSIONS = (".gpkg", ".geojson", ".shp", ".fgb", ".parquet", ".geoparquet", ".gml", ".kml")


def is_vector(name: str) -> bool:
    """Whether a file name has a vector file's extension.

    Example:
        >>> is_vector("fields.GPKG"), is_vector("fields.dbf"), is_vector("b4.tif")
        (True, False, False)
    """
    return name.lower().endswith(VECTOR_EXTENSIONS)


def _crs_text(crs: Any) -> str:
    if crs is None:
        return "-"
    from pyproj import CRS

    c = CRS.from_user_input(crs)
    epsg = c.to_epsg()
    return f"EPSG:{epsg}" if epsg else c.name


def describe_vector(url: str, storage_options: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One dict per layer of a vector file.

    Keys: ``layer``, ``features``, ``geometry_types``, ``crs``, ``bounds``, ``attributes`` (name: dtype).

    Raises:
        pipekit.errors.ReadError: the file cannot be read (names it).
    """
    from pipekit.errors import ReadError
    from pipekit.geo._vector import _is_parquet, _local_file

    try:
        with _local_file(url, storage_options or {}) as path:
            if _is_parquet(path):
                import geopandas

                frame = geopandas.read_parquet(path)
                geom_types = Counter(t for t in frame.geometry.geom_type.dropna())
                attrs = {c: str(t) for c, t in frame.dtypes.items() if c != frame.geometry.name}
                return [{"layer": None, "features": len(frame), "geometry_types": dict(geom_types),
                         "crs": _crs_text(frame.crs), "bounds": [float(v) for v in frame.total_bounds],
                         "attributes": attrs}]
            import pyogrio

            out = []
            for name, _ in pyogrio.list_layers(path):
                info = pyogrio.read_info(path, layer=name, force_feature_count=True, force_total_bounds=True)
                attrs = {str(f): str(t) for f, t in zip(info["fields"], info["dtypes"])}
                out.append({"layer": str(name), "features": int(info["features"]),
                            "geometry_types": {str(info["geometry_type"]): int(info["features"])},
                            "crs": _crs_text(info["crs"]), "bounds": [float(v) for v in info["total_bounds"]],
                            "attributes": attrs})
            return out
    except Exception as exc:
        raise ReadError("inspect vector file", url, "inspect", one_line(exc)) from exc


@dataclass
class VectorReport:
    root: str
    layers: list[tuple[str, int, dict[str, Any]]]  # (file name, size, layer description)
    skipped: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": "vectors", "root": self.root,
                "layers": [{"file": name, "bytes": size, **desc} for name, size, desc in self.layers],
                "errors": self.errors, "skipped": self.skipped}

    def render(self) -> str:
        rows = [("file", "layer", "features", "geometry", "CRS", "bounds (minx, miny, maxx, maxy)", "size")]
        for name, size, d in self.layers:
            geoms = ", ".join(f"{k} {v}" if len(d["geometry_types"]) > 1 else k for k, v in d["geometry_types"].items())
            digits = 6 if d["crs"] == "EPSG:4326" else 1
            bounds = ", ".join(f"{v:.{digits}f}" for v in d["bounds"])
            rows.append((name, d["layer"] or "-", str(d["features"]), geoms or "-", d["crs"], bounds,
                         human_bytes(size)))
        lines = [format_table(rows, align="llrllll"), ""]
        for name, _, d in self.layers:
            attrs = ", ".join(f"{k} ({t})" for k, t in d["attributes"].items()) or "none"
            lines.append(f"{name}{' layer ' + d['layer'] if d['layer'] else ''} attributes: {attrs}")
        total = sum(d["features"] for _, _, d in self.layers)
        files = len({name for name, _, _ in self.layers})
        lines.append(f"{total} feature(s) in {len(self.layers)} layer(s) of {files} vector file(s)")
        if self.skipped:
            lines.append(f"{len(self.skipped)} other file(s) ignored, e.g. {self.skipped[0]}")
        for err in self.errors:
            lines.append(f"error: {err}")
        return "\n".join(lines)


def inspect_vectors(listing: Listing, storage_options: dict[str, Any] | None = None) -> VectorReport:
    """Describe every layer of the vector files of a listing."""
    layers: list[tuple[str, int, dict[str, Any]]] = []
    skipped: list[str] = []
    errors: list[str] = []
    for url, name, nbytes in listing.files:
        if not is_vector(name):
            if not name.lower().endswith(_SIDECARS):  # a Shapefile's .dbf/.shx/.prj are part of its .shp
                skipped.append(name)
            continue
        try:
            for desc in describe_vector(url, storage_options):
                layers.append((name, nbytes, desc))
        except Exception as exc:
            errors.append(str(exc))
    if not layers and not errors:
        raise CliError(f"no vector files ({', '.join(VECTOR_EXTENSIONS)}) in {listing.root!r}")
    return VectorReport(listing.root, layers, skipped, errors)
