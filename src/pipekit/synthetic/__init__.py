"""Synthetic corpora for demos, benchmarks and tests: real encoded files, made locally.

Nothing here downloads anything.  Each writer is deterministic for a seed and
skips work when the corpus already exists (a ``.complete`` marker is written
last, so an interrupted run is redone rather than half-used).

* :mod:`pipekit.synthetic.images`: image folders (class per folder) and
  WebDataset tar shards of JPEGs;
* :mod:`pipekit.synthetic.geo`: a Landsat 8 + CDL corpus with real product
  file names, CRSs and GeoTIFF layouts.

For checking that a pipe you wrote resumes exactly, see :mod:`pipekit.testing`.
"""

from pipekit.synthetic.images import CLASSES, default_cache_dir, make_image, write_image_folder, write_image_shards

__all__ = [
    "CLASSES",
    "default_cache_dir",
    "make_image",
    "write_image_folder",
    "write_image_shards",
    "write_landsat_cdl_corpus",
]


def __getattr__(name: str):  # the geo writer imports rasterio: load it on first use
    if name == "write_landsat_cdl_corpus":
        from pipekit.synthetic.geo import write_landsat_cdl_corpus

        return write_landsat_cdl_corpus
    raise AttributeError(f"module 'pipekit.synthetic' has no attribute {name!r}")
