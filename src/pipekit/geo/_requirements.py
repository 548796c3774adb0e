"""Imported first by :mod:`pipekit.geo`: the geo extra's packages every geo module needs, or an error naming the
extra (``pip install "pipekit[geo]"``) instead of a bare ``No module named 'rasterio'``."""

from pipekit._optional import import_optional

for _package in ("rasterio", "pyproj", "shapely", "pandas"):
    import_optional(_package, "pipekit.geo")
