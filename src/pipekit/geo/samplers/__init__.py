"""Samplers that pick the query boxes of a geo dataset (TorchGeo's sampler semantics).

A geo dataset is indexed by boxes in space and time (TorchGeo 0.8's slices),
not by integers, so a sampler decides *where* the patches come from:

* :class:`RandomGeoSampler`: random patches, footprints chosen in proportion
  to their area (training);
* :class:`GridGeoSampler`: a regular grid covering every pixel of every
  footprint (evaluation, prediction);
* :class:`RandomBatchGeoSampler`: batches of random patches, each batch from
  one footprint (a batch sampler; reads stay within one file);
* :class:`PreChippedGeoSampler`: one box per footprint (datasets already cut
  into chips).

Each is a ``torch.utils.data.Sampler`` (pass it as ``sampler=`` or
``batch_sampler=`` of a DataLoader, with the dataset itself) and offers
:meth:`GeoSampler.as_pipe`, a resumable pipe of its boxes for pipe-native
pipelines (``sampler.as_pipe().sharding_filter().read_geo(dataset)``).
As in TorchGeo 0.8, a box is yielded as ``(slice(xmin, xmax), slice(ymin,
ymax), slice(tmin, tmax))`` with ``pandas.Timestamp`` times; the same
samplers are importable from :mod:`pipekit.samplers`, TorchGeo's module name.

Only ``dataset.geo_index`` (the :class:`~pipekit.geo._index.GeoIndex` of the
footprints; a ``GeoIndex`` or TorchGeo ``GeoDataFrame`` ``.index`` is read
otherwise) and ``dataset.res`` (``(xres, yres)`` or one number) are read;
the dataset itself is not kept, so samplers pickle cheaply.

Patches and the pixel grid
    Sizes in pixels (the default) become CRS units with the dataset's
    resolution: a ``size=(h, w)`` patch is ``h * yres`` high and ``w * xres``
    wide, so the dataset returns exactly ``h x w`` pixels.  Patch positions are
    whole pixels away from the footprint's top-left corner ``(minx, maxy)``,
    so they stay on the footprint's pixel grid and nothing is resampled.  With
    an ``roi``, footprints are clipped to it and the clipped sides moved
    inwards to the nearest pixel edge of the footprint's grid (so the grid
    stays aligned); footprints that only touch the roi are dropped.

Randomness
    Each epoch draws one seed (from ``generator``, from ``seed=``, or from
    torch's global RNG) and derives every box from it, in chunks, with numpy.
    The iterators are resumable: ``state_dict()`` is the epoch seed and the
    count of boxes yielded, which is how :class:`pipekit.DataLoader` resumes
    both the sampler form and the pipe form exactly.

The samplers live in modules by concern: :mod:`~pipekit.geo.samplers._base`
(units, argument checks, the :class:`GeoSampler` base class and its
resumable epoch iterator), :mod:`~pipekit.geo.samplers._time_windows`
(``time_window=``), :mod:`~pipekit.geo.samplers._random_patches`,
:mod:`~pipekit.geo.samplers._grid`, :mod:`~pipekit.geo.samplers._prechipped`
and :mod:`~pipekit.geo.samplers._pipe` (:class:`GeoSamplerPipe`); this
package re-exports them all.
"""

from __future__ import annotations

# the samplers, and (aliased, so re-exported) the private helpers they and GeoSamplerPipe share, importable
# from here as before the split
from pipekit.geo.samplers._base import _CHUNK as _CHUNK
from pipekit.geo.samplers._base import _SEED_MASK as _SEED_MASK
from pipekit.geo.samplers._base import _TOL as _TOL
from pipekit.geo.samplers._base import BatchGeoSampler, GeoSampler, Units, get_random_bounding_box, tile_to_chips
from pipekit.geo.samplers._base import _boxes as _boxes
from pipekit.geo.samplers._base import _generator as _generator
from pipekit.geo.samplers._base import _pair as _pair
from pipekit.geo.samplers._base import _resolution as _resolution
from pipekit.geo.samplers._base import _roi as _roi
from pipekit.geo.samplers._base import _rows_cols as _rows_cols
from pipekit.geo.samplers._base import _SamplerIterator as _SamplerIterator
from pipekit.geo.samplers._base import _to_tuple as _to_tuple
from pipekit.geo.samplers._base import _toi as _toi
from pipekit.geo.samplers._base import _units as _units
from pipekit.geo.samplers._base import dataset_index as dataset_index
from pipekit.geo.samplers._distributed import DistributedGeoSampler
from pipekit.geo.samplers._grid import GridGeoSampler
from pipekit.geo.samplers._pipe import GeoSamplerPipe
from pipekit.geo.samplers._prechipped import PreChippedGeoSampler
from pipekit.geo.samplers._random_patches import RandomBatchGeoSampler, RandomGeoSampler

__all__ = [
    "Units",
    "GeoSampler",
    "BatchGeoSampler",
    "RandomGeoSampler",
    "GridGeoSampler",
    "RandomBatchGeoSampler",
    "PreChippedGeoSampler",
    "GeoSamplerPipe",
    "DistributedGeoSampler",
    "tile_to_chips",
    "get_random_bounding_box",
]
