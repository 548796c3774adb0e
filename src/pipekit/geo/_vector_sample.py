"""How a :class:`~pipekit.geo._vector.VectorDataset` answers a query: the features it meets, rasterized.

:class:`VectorSampling` is a base of ``VectorDataset``: it asks the ``STRtree`` of each file the query hits for the
features that intersect it (and its time interval), and rasterizes them onto the query grid
(:mod:`pipekit.geo._rasterize`): a semantic mask, or boxes, labels and instance masks.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import shapely
import torch

from pipekit.geo._base import Arrays, Sample
from pipekit.geo._bbox import BoundingBox
from pipekit.geo._rasterize import FAR_PIXELS, burn_mask, instance_masks, pixel_boxes
from pipekit.geo._read import Grid


class VectorSampling:
    """The query half of :class:`~pipekit.geo._vector.VectorDataset` (see the module docstring)."""

    # -- queries ---------------------------------------------------------------------------------
    def _features(self, bbox: BoundingBox, grid: Grid | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The geometries (dataset CRS) and labels of the features meeting ``bbox``, in file then feature order.

        With ``grid``, GeoJSON-like mappings instead of shapely geometries (for rasterizing onto it), except
        for features that may reach past :data:`~pipekit.geo._rasterize.FAR_PIXELS` pixels from it, which stay
        geometries (the rasterizing kernels clip them; GDAL burns nothing for them).
        """
        mappings = grid is not None
        hits = self.geo_index.query(bbox)
        rows = np.sort(self._entry_rows()[hits])
        box = shapely.box(bbox.minx, bbox.miny, bbox.maxx, bbox.maxy)
        reach = np.inf
        if grid is not None:  # a feature reaching further from the origin may reach past FAR_PIXELS from the grid
            res = min(abs(grid.transform.a), abs(grid.transform.e)) or 1e-300
            reach = FAR_PIXELS * res - max(abs(bbox.minx), abs(bbox.maxx), abs(bbox.miny), abs(bbox.maxy))
        geoms: list[np.ndarray] = []
        labels: list[np.ndarray] = []
        for row in rows.tolist():
            layer = self._layer(row)
            idx = np.sort(layer.tree.query(box, predicate="intersects"))
            if layer.times is not None and len(idx):
                t = layer.times[idx]
                idx = idx[(t[:, 0] <= bbox.maxt_s) & (t[:, 1] >= bbox.mint_s)]
            if mappings:
                part = np.empty(len(idx), dtype=object)
                part[:] = layer.shapes(idx)
                far = layer.reach[idx] > reach
                part[far] = layer.geometries[idx[far]]  # geometries, which the rasterizing kernels clip
                geoms.append(part)
            else:
                geoms.append(layer.geometries[idx])
            labels.append(self._labels(row, layer)[idx])
        if not geoms:
            return np.empty(0, dtype=object), np.empty(0, dtype=np.int64)
        return np.concatenate(geoms), np.concatenate(labels)

    def _getitem(self, bbox: BoundingBox, grid: Grid, bounds: Any) -> Sample:
        if len(self.geo_index.query(bbox)) == 0:
            raise self._missing(bbox)
        shape = (grid.height, grid.width)
        sample: Sample = {}
        if self.task == "semantic_segmentation":
            geoms, labels = self._features(bbox, grid)
            mask = burn_mask(geoms, labels, grid.transform, shape, self.all_touched)
            sample["mask"] = torch.from_numpy(mask).to(self.dtype)
        else:
            geoms, labels = self._features(bbox)
            boxes = pixel_boxes(geoms, grid.transform, shape)
            keep = ~np.isnan(boxes).any(axis=1)
            if self.task == "instance_segmentation":
                masks = instance_masks(geoms[keep], grid.transform, shape, self.all_touched)
                covered = masks.reshape(len(masks), shape[0] * shape[1]).any(axis=1)  # -1 fails for 0 masks
                keep[np.flatnonzero(keep)[~covered]] = False
                sample["mask"] = torch.from_numpy(np.ascontiguousarray(masks[covered]))
            sample["bbox_xyxy"] = torch.from_numpy(np.ascontiguousarray(boxes[keep]))
            sample["label"] = torch.from_numpy(labels[keep].astype(np.int32))
        sample["crs"] = self.crs
        sample["bounds"] = bounds
        sample["transform"] = grid.transform
        return sample

    def _read(self, bbox: BoundingBox, grid: Grid, track_valid: bool) -> Arrays | None:
        """The semantic mask (for mosaics, ``a | b``): valid where a feature lies."""
        if self.task != "semantic_segmentation":
            raise ValueError(f"{self.name}: only task='semantic_segmentation' can be mosaicked (a | b)")
        if len(self.geo_index.query(bbox)) == 0:
            return None
        geoms, labels = self._features(bbox, grid)
        shape = (grid.height, grid.width)
        mask = burn_mask(geoms, labels, grid.transform, shape, self.all_touched)[None]
        valid = None
        if track_valid:
            valid = burn_mask(geoms, np.ones(len(geoms), dtype=np.int64), grid.transform, shape,
                              self.all_touched)[None].astype(bool)
        return {"mask": (mask, valid)}

    def _layers(self) -> dict[str, int]:
        return {"mask": 1}

    def _dtypes(self) -> dict[str, torch.dtype | None]:
        return {"mask": self.dtype}
