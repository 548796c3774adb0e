"""The old name of :mod:`pipekit.synthetic.geo` (the synthetic Landsat 8 + CDL corpus), kept for imports."""

from pipekit.synthetic.geo import CDL_CLASSES, LANDSAT8_BANDS, LandCover, write_landsat_cdl_corpus

__all__ = ["LandCover", "write_landsat_cdl_corpus", "LANDSAT8_BANDS", "CDL_CLASSES"]
