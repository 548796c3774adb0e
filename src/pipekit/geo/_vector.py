"""Vector datasets: :class:`VectorDataset`, polygons (GeoPackage, GeoJSON, Shapefile, FlatGeobuf, GeoParquet) as labels.

Each file's features are read once per process (pyogrio/GDAL; GeoParquet
with geopandas), repaired where invalid, reprojected to the dataset CRS and
put in a shapely ``STRtree``; they live in a per-process cache
(:data:`pipekit.geo._vector_files._LAYERS`), never in the dataset object, so the dataset pickles to
DataLoader workers as its file table (paths, CRSs, boxes, times) and each
worker loads a file the first time a query needs it (forked workers inherit
the parent's cache).  ``dataset.index`` holds one row per file, as in
TorchGeo 0.8; a query asks the ``STRtree`` of each file it hits for the
features that intersect it, and rasterizes them onto the query grid
(:mod:`pipekit.geo._rasterize`).

Reading a file and the cache are in :mod:`pipekit.geo._vector_files`; answering a
query is :class:`~pipekit.geo._vector_sample.VectorSampling`'s, a base of ``VectorDataset``.
"""

from __future__ import annotations

import copy
import logging
import re
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import shapely
import torch
from rasterio.crs import CRS

from pipekit.errors import DatasetNotFoundError, ParseError, SkipLog, StageError, check_on_error
from pipekit.geo._base import GeoDataset, Sample, _crs_name, _to_crs, _to_res
from pipekit.geo._bbox import MAX_TIME, MIN_TIME
from pipekit.geo._index import GeoIndex
from pipekit.geo._rasterize import bad_coordinates
from pipekit.geo._read import transform_bounds_fast
from pipekit.geo._vector_files import (  # the names marked noqa are re-exported: their former home
    _LAYERS,
    _LAYERS_LOCK,
    _SIDECARS,
    _feature_times,
    _is_parquet,  # noqa: F401
    _Layer,
    _local_file,  # noqa: F401
    _not_vectors,
    clear_cache,  # noqa: F401
    read_vector,
)
from pipekit.geo._vector_sample import VectorSampling
from pipekit.geo.catalog._dates import date_interval
from pipekit.geo.catalog._listing import _split_name, find_files

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["VectorDataset"]

logger = logging.getLogger("pipekit.geo")

TASKS = ("semantic_segmentation", "object_detection", "instance_segmentation")


# ---------------------------------------------------------------------------------------------
# the dataset


class VectorDataset(VectorSampling, GeoDataset):
    """A geo dataset of vector files (polygons as labels): features rasterized onto each query's grid.

    TorchGeo 0.8's ``VectorDataset``: the same arguments, class attributes
    (``filename_glob``, ``filename_regex`` with an optional ``date`` group,
    ``date_format``), ``get_label`` hook and sample keys:

    * ``task="semantic_segmentation"``: ``"mask"``, int64 ``[H, W]``: 0 where
      no feature lies, else the label of the last feature there (features
      are burned in file order, then feature order);
    * ``task="object_detection"``: ``"bbox_xyxy"``, float32 ``[N, 4]`` pixel
      boxes of the features that meet the query, clipped to it, and
      ``"label"``, int32 ``[N]``;
    * ``task="instance_segmentation"``: ``"mask"``, uint8 ``[N, H, W]``
      (one binary mask per feature), ``"bbox_xyxy"`` and ``"label"``; a
      feature that covers no pixel of the patch is left out of all three
      (TorchGeo keeps its box and label but drops its mask, so the three
      can disagree in length);

    plus ``"crs"``, ``"bounds"`` (the query) and ``"transform"``.

    Differences from TorchGeo, by design: files are read once per process
    (TorchGeo reads every file a query hits, on every query); features are
    selected by exact intersection with the query in the dataset CRS
    (TorchGeo transforms only the query's two corners to the file's CRS and
    selects by envelope); ``date_attribute`` gives features their own
    times; local files that are not vector files GDAL reads are left out
    as TorchGeo does, but with a warning naming them and their count (in
    ``self.skip_log`` too; TorchGeo is silent), and other unreadable files
    (gone, remote) raise a :class:`~pipekit.errors.ReadError` naming them
    (``on_error="skip"`` skips and counts them); invalid geometries (a bow-tie
    polygon) are repaired with ``shapely.make_valid`` and reported in a
    warning naming the file and feature ids (``on_invalid="raise"`` raises
    a :class:`~pipekit.errors.ParseError` instead); null or empty
    geometries are left out with a warning naming them; a feature with NaN,
    infinite or huge coordinates raises naming it (or is skipped, ``on_error``),
    and one reaching far from a query is clipped before it is burned (GDAL
    burns nothing for a polygon reaching past 2**31 pixels).

    Args:
        paths: a directory (searched recursively for ``filename_glob``), a
            file, a glob, an fsspec URL (``s3://``, ``memory://``) or a list of them.
        crs: the dataset CRS (default: the first file's, else EPSG:4326).
        res: pixel size of samples in CRS units, a number or ``(xres, yres)``
            (TorchGeo's default ``(0.0001, 0.0001)``).
        transforms: a callable applied to every sample dict.
        label_name: the attribute holding each feature's integer label
            (default: every feature is 1).
        task: ``"semantic_segmentation"``, ``"object_detection"`` or
            ``"instance_segmentation"``.
        layer: the layer of a multi-layer file (name or index; default the first).
        all_touched: burn every pixel a polygon touches, not only those whose
            centre it covers.
        date_attribute: an attribute holding each feature's date (datetime
            values, or strings in ``date_format``); queries then see only the
            features of their time.
        on_invalid: ``"repair"`` (default) or ``"raise"``.
        on_error: ``"raise"`` (default) or ``"skip"`` for unreadable files and for features with NaN,
            infinite or huge (beyond +-1e10, :data:`~pipekit.geo._rasterize.MAX_COORDINATE`)
            coordinates, also once reprojected: raised as a :class:`~pipekit.errors.ParseError` naming
            the file, the feature (position and fid) and why, or left out and counted in ``skip_log``.
        storage_options: fsspec options for remote paths (s3fs spelling for S3).

    Raises:
        DatasetNotFoundError: no file found.
        ReadError: a file cannot be read (names it).
        ValueError: an unknown ``task`` or ``on_invalid``.

    Example:
        >>> import tempfile, geopandas, shapely
        >>> from pipekit.datasets import VectorDataset
        >>> root = tempfile.mkdtemp()
        >>> fields = geopandas.GeoDataFrame({"crop": [1, 5]}, crs="EPSG:32615", geometry=[
        ...     shapely.box(500000, 4000000, 500100, 4000100), shapely.box(500100, 4000000, 500200, 4000050)])
        >>> fields.to_file(f"{root}/fields.gpkg")
        >>> ds = VectorDataset(root, res=10, label_name="crop")
        >>> sample = ds[500000:500200, 4000000:4000100]
        >>> sample["mask"].shape, sample["mask"].dtype, sample["mask"].unique().tolist()
        (torch.Size([10, 20]), torch.int64, [0, 1, 5])
    """

    filename_glob: str = "*"
    filename_regex: str = ".*"
    date_format: str = "%Y%m%d"
    cmap: Mapping[int, Any] | None = None
    class_names: Mapping[int, str] | None = None

    def __init__(
        self,
        paths: Any = "data",
        crs: Any = None,
        res: Any = (0.0001, 0.0001),
        transforms: Callable[[Sample], Sample] | None = None,
        label_name: str | None = None,
        task: str = "semantic_segmentation",
        layer: str | int | None = None,
        *,
        all_touched: bool = False,
        date_attribute: str | None = None,
        on_invalid: str = "repair",
        on_error: str = "raise",
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        if task not in TASKS:
            raise ValueError(f"Invalid task: {task!r}. Must be one of {list(TASKS)}")
        if on_invalid not in ("repair", "raise"):
            raise ValueError(f'on_invalid must be "repair" or "raise", got {on_invalid!r}')
        if transforms is not None and not callable(transforms):
            raise TypeError(f"transforms must be callable, got {type(transforms).__name__}")
        if layer is not None and (isinstance(layer, bool) or not isinstance(layer, (str, int))):
            raise TypeError(f"layer must be a layer name or index, got {layer!r}")
        self.paths = paths
        self.transforms = transforms
        self.label_name = label_name
        self.task = task
        self.layer = layer
        self.all_touched = bool(all_touched)
        self.date_attribute = date_attribute
        self.on_invalid = on_invalid
        self.on_error = check_on_error(on_error)
        self.skip_log = SkipLog(self.name)
        self.storage_options = dict(storage_options or {})
        self._res = _to_res(res)
        try:
            regex = re.compile(self.filename_regex, re.VERBOSE)
        except re.error as exc:
            raise ValueError(f"{self.name}.filename_regex is not a valid regex: {exc}") from None

        matched = find_files(paths, self.filename_glob, regex, self.storage_options, name=self.name)
        matched = [(p, m) for p, m in matched if not _split_name(p)[1].lower().endswith(_SIDECARS)]
        given = None if crs is None else _to_crs(crs)
        self._crs = given  # type: ignore[assignment]  (set from the first file below when not given)
        self._paths: list[str] = []
        self._source_crs: list[str] = []
        self._native: list[tuple[float, float, float, float]] = []
        self._file_times: list[tuple[float, float]] = []
        boxes = []
        self._left_out: list[StageError] = []
        for path, match in matched:
            frame = self._read_or_skip(path)
            if frame is None:
                continue
            source = frame.crs if frame.crs is not None else (self._crs or CRS.from_epsg(4326))
            source = _to_crs(source.to_wkt() if hasattr(source, "to_wkt") else source)
            if self._crs is None:
                self._crs = source
            times = self._times_from_name(path, match)
            layer_data = self._layer_for(path, source.to_wkt(), self._crs, frame)
            if len(layer_data.geometries) == 0:
                logger.warning("%s: %r has no features with a geometry; left out of the index", self.name, path)
                continue
            minx, miny, maxx, maxy = layer_data.bounds
            if layer_data.times is not None:
                times = (float(layer_data.times[:, 0].min()), float(layer_data.times[:, 1].max()))
            self._paths.append(path)
            self._source_crs.append(source.to_wkt())
            self._native.append(tuple(float(v) for v in frame.total_bounds))  # type: ignore[arg-type]
            self._file_times.append(times)
            boxes.append((minx, maxx, miny, maxy, *times))
        self._warn_left_out(len(matched))
        if not boxes:
            raise DatasetNotFoundError(f"{self.name}: no readable vector file with features in {paths!r}")
        self._rows: np.ndarray | None = None
        self.geo_index = GeoIndex(np.array(boxes, dtype=np.float64))
        logger.info("%s: indexed %d vector file(s); CRS %s, res %s", self.name, len(self._paths),
                    _crs_name(self._crs), self._res)

    # -- TorchGeo's hooks ---------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        """The dtype of semantic masks: int64 (TorchGeo's ``torch.long``)."""
        return torch.long

    def get_label(self, feature: pd.Series) -> int:
        """The integer label a feature is burned with (0: not rendered); override for custom labels.

        Args:
            feature: the feature's attributes (a row of the file's ``GeoDataFrame``).
        """
        if self.label_name:
            return int(feature[self.label_name])
        return 1

    @property
    def files(self) -> list[str]:
        """The indexed files."""
        return [self._paths[int(i)] for i in self._entry_rows()]

    def _entry_rows(self) -> np.ndarray:
        return np.arange(len(self._paths)) if self._rows is None else self._rows

    # -- loading -------------------------------------------------------------------------------
    def _read_or_skip(self, path: str) -> Any:
        """The file's features; ``None`` for a file skipped (``on_error="skip"``) or not a vector file.

        A local file whose content GDAL cannot read as vectors is left out under
        ``on_error="raise"`` too, as TorchGeo does, but counted in ``skip_log``
        and named in a warning once the files are indexed; anything else (a
        file gone, a remote read) is raised.
        """
        try:
            return read_vector(path, self.layer, self.storage_options, self.name)
        except StageError as exc:
            if self.on_error == "raise":
                if not _not_vectors(exc, path):
                    raise
                self._left_out.append(exc)
            self.skip_log.record(exc)
            return None

    def _warn_left_out(self, found: int) -> None:
        if not self._left_out:
            return
        shown = "; ".join(f"{e.url!r} ({e.reason})" for e in self._left_out[:5])
        more = f"; and {len(self._left_out) - 5} more" if len(self._left_out) > 5 else ""
        warnings.warn(
            f"{self.name}: left out {len(self._left_out)} file(s) of {found} that are not vector files GDAL can "
            f"read: {shown}{more} (counted in skip_log; on_error='skip' leaves them out without this warning)",
            UserWarning,
            stacklevel=3,
        )

    def _times_from_name(self, path: str, match: re.Match[str]) -> tuple[float, float]:
        date = match.groupdict().get("date")
        if not date:
            return MIN_TIME, MAX_TIME
        try:
            return date_interval(date, self.date_format)
        except ValueError as exc:
            raise ParseError("parse the date of", path, self.name,
                             f"{exc} (date_format {self.date_format!r})") from exc

    def _bad_features(self, path: str, geoms: np.ndarray, fids: np.ndarray, positions: np.ndarray,
                      when: str = "") -> np.ndarray | None:
        """The features to keep, or ``None`` for all: those with NaN, infinite or huge coordinates raise a
        :class:`~pipekit.errors.ParseError` naming the file, the feature and why, or are skipped and counted
        (``on_error``)."""
        bad = bad_coordinates(geoms)
        if not bad:
            return None
        errors = [ParseError("read the features of", path, self.name,
                             f"feature {int(positions[i])} (fid {fids[i]}) has {why}{when}; "
                             "on_error='skip' leaves such features out") for i, why in bad.items()]
        if self.on_error == "raise":
            raise errors[0] if len(errors) == 1 else ParseError(
                errors[0].action, path, self.name, f"{errors[0].reason} ({len(errors) - 1} more such feature(s))")
        for error in errors:
            self.skip_log.record(error)
        keep = np.ones(len(geoms), dtype=bool)
        keep[list(bad)] = False
        return keep

    def _build_layer(self, path: str, frame: Any) -> _Layer:
        """The features of ``frame`` valid and non-empty, in the file's CRS, with an STRtree."""
        geoms = np.asarray(frame.geometry.array, dtype=object)
        fids = np.asarray(frame.index)
        positions = np.arange(len(geoms))
        missing = shapely.is_missing(geoms) | shapely.is_empty(geoms)
        if missing.any():
            logger.warning("%s: %r: %d feature(s) without a geometry left out (feature ids %s)", self.name, path,
                           int(missing.sum()), fids[missing][:10].tolist())
            keep = ~missing
            geoms, fids, frame, positions = geoms[keep], fids[keep], frame[keep], positions[keep]
        keep = self._bad_features(path, geoms, fids, positions)
        if keep is not None:
            geoms, fids, frame, positions = geoms[keep], fids[keep], frame[keep], positions[keep]
        invalid = ~shapely.is_valid(geoms)
        if invalid.any():
            ids = fids[invalid][:10].tolist()
            reasons = [shapely.is_valid_reason(g) for g in geoms[invalid][:3]]
            if self.on_invalid == "raise":
                raise ParseError("check the geometries of", path, self.name,
                                 f"{int(invalid.sum())} invalid geometr(y/ies), feature ids {ids}: {reasons}")
            logger.warning("%s: %r: repaired %d invalid geometr(y/ies) with shapely.make_valid (feature ids %s: %s)",
                           self.name, path, int(invalid.sum()), ids, reasons)
            geoms = geoms.copy()
            geoms[invalid] = shapely.make_valid(geoms[invalid])
        feature_times = None
        if self.date_attribute is not None:
            if self.date_attribute not in frame.columns:
                raise ParseError("read the date attribute of", path, self.name,
                                 f"no attribute {self.date_attribute!r}; it has {list(frame.columns)}")
            feature_times = _feature_times(frame[self.date_attribute], self.date_format, path, self.name)
        attributes = frame.drop(columns=frame.geometry.name).reset_index(drop=True)
        return _Layer(geoms, shapely.STRtree(geoms), attributes, feature_times, fids, positions)

    def _reprojected(self, path: str, layer: _Layer, source: CRS, target: CRS) -> _Layer:
        """``layer``'s features (in ``source``) in ``target``: every vertex transformed, a new STRtree; a feature
        that comes back with infinite or huge coordinates (no place in ``target``) raises or is skipped."""
        from pyproj import Transformer

        transformer = Transformer.from_crs(source, target, always_xy=True)
        geoms = shapely.transform(layer.geometries,
                                  lambda xy: np.column_stack(transformer.transform(xy[:, 0], xy[:, 1])))
        out = _Layer(geoms, shapely.STRtree(geoms), layer.attributes, layer.times, layer.fids, layer.positions)
        keep = self._bad_features(path, geoms, layer.fids, out.positions,
                                  f" once reprojected to {_crs_name(target)} (it has no place there)")
        return out if keep is None else out.subset(keep)

    def _key(self, path: str, crs_wkt: str) -> tuple[Any, ...]:
        return (path, self.layer, crs_wkt, self.date_attribute, self.date_format, self.on_invalid)

    def _layer_for(self, path: str, source_wkt: str, target: CRS, frame: Any = None) -> _Layer:
        """``path``'s features in ``target``: from this process's cache, else reprojected from the file's own
        CRS (cached too), else read (``frame``, when the caller has just read it) -- at most once per process."""
        target_wkt = target.to_wkt()
        layer = _LAYERS.get(self._key(path, target_wkt))
        if layer is not None:
            return layer
        native = _LAYERS.get(self._key(path, source_wkt))
        if native is None:
            if frame is None:
                frame = read_vector(path, self.layer, self.storage_options, self.name)
            native = self._build_layer(path, frame)
            with _LAYERS_LOCK:
                native = _LAYERS.setdefault(self._key(path, source_wkt), native)
        source = _to_crs(source_wkt)
        if source == target:
            return native
        layer = self._reprojected(path, native, source, target)
        with _LAYERS_LOCK:
            return _LAYERS.setdefault(self._key(path, target_wkt), layer)

    def _layer(self, row: int) -> _Layer:
        """File ``row``'s features in the dataset CRS (read on the first use in this process)."""
        return self._layer_for(self._paths[row], self._source_crs[row], self._crs)

    def _labels(self, row: int, layer: _Layer) -> np.ndarray:
        """The label of every feature of file ``row`` (``get_label`` of each, computed once per process)."""
        cache = self.__dict__.setdefault("_label_cache", {})
        key = (row, id(layer))
        labels = cache.get(key)
        if labels is None:
            attrs = layer.attributes
            if type(self).get_label is VectorDataset.get_label:
                if self.label_name:
                    if self.label_name not in attrs.columns:
                        raise ParseError("read the labels of", self._paths[row], self.name,
                                         f"no attribute {self.label_name!r}; it has {list(attrs.columns)}")
                    labels = attrs[self.label_name].to_numpy().astype(np.int64)
                else:
                    labels = np.ones(len(attrs), dtype=np.int64)
            else:
                labels = np.array([self.get_label(r) for _, r in attrs.iterrows()], dtype=np.int64)
            cache[key] = labels
        return labels

    # -- index, CRS, pickling --------------------------------------------------------------------
    def _frame(self) -> Any:
        """TorchGeo 0.8's index: one row per file, ``filepath``, the box of its features, its time interval."""
        from pipekit.geo._frame import frame_from_index

        return frame_from_index(self.geo_index, self._crs, {"filepath": self.files})

    def _set_frame(self, frame: Any) -> None:
        from pipekit.geo._frame import index_from_frame

        if "filepath" not in getattr(frame, "columns", ()):
            raise ValueError(f"{self.name}.index needs its 'filepath' column to know which files the rows are")
        rows_of = {p: i for i, p in enumerate(self._paths)}
        unknown = [p for p in frame["filepath"] if p not in rows_of]
        if unknown:
            raise ValueError(f"{self.name}.index: {len(unknown)} filepath(s) are not files of this dataset, "
                             f"e.g. {unknown[0]!r}")
        index = index_from_frame(frame, self._crs)
        self._rows = np.array([rows_of[p] for p in frame["filepath"]], dtype=np.int64)
        self.geo_index = index

    def _retargeted(self, crs: CRS, res: tuple[float, float]) -> VectorDataset:
        clone = copy.copy(self)
        for key in ("_crs_key", "_frame_cache", "_extent_cache", "_label_cache"):
            clone.__dict__.pop(key, None)
        clone._res = res
        if crs != self._crs:
            clone._crs = crs
            boxes = np.empty((len(self._paths), 6), dtype=np.float64)
            for i, (left, bottom, right, top) in enumerate(self._native):
                source = _to_crs(self._source_crs[i])
                if source != crs:
                    left, bottom, right, top = transform_bounds_fast(source, crs, left, bottom, right, top)
                boxes[i] = (left, right, bottom, top, *self._file_times[i])
            if self._rows is not None:
                boxes = boxes[self._rows]
            clone.geo_index = GeoIndex(boxes)
        return clone

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.pop("_label_cache", None)  # recomputed per process, like the features themselves
        return state

    def _plot_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {}
        if self.cmap is not None:
            spec["cmap"] = self.cmap
        if self.class_names is not None:
            spec["class_names"] = self.class_names
        return spec
