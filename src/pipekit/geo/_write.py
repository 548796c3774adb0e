"""Writing a predicted patch as a georeferenced GeoTIFF.

:func:`write_geotiff` takes what a model produced for a sample (a numpy
array or torch tensor, ``[H, W]`` or ``[C, H, W]``) and the sample's
``crs`` and ``transform``, and writes a tiled, compressed GeoTIFF that any
GIS (or :class:`~pipekit.datasets.RasterDataset`) opens at the right place.
Local paths are written directly; other fsspec URLs (``s3://``,
``memory://``) are written in memory and uploaded in one piece.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import rasterio
import torch
from affine import Affine
from rasterio.crs import CRS

from pipekit._fs import is_local, local_path, url_to_fs
from pipekit.errors import ReadError

__all__ = ["write_geotiff"]

_COMPRESSIONS = {"deflate", "lzw", "zstd", "lzma", "packbits", "none", "webp", "jpeg", "lerc"}


def _to_array(data: Any) -> np.ndarray:
    if isinstance(data, torch.Tensor):
        data = data.detach().cpu()
        if data.dtype == torch.bool:
            data = data.to(torch.uint8)
        elif data.dtype in (torch.bfloat16, torch.float16):
            data = data.float()
        data = data.numpy()
    array = np.asarray(data)
    if array.dtype == bool:
        array = array.astype(np.uint8)
    if array.ndim == 2:
        array = array[None]
    if array.ndim != 3:
        raise ValueError(f"write_geotiff takes an [H, W] or [C, H, W] array, got shape {array.shape}")
    if 0 in array.shape:
        raise ValueError(f"write_geotiff got an empty array of shape {array.shape}")
    if array.dtype == np.int64:
        lo, hi = (array.min(), array.max())
        for candidate in (np.uint8, np.int16, np.int32):
            info = np.iinfo(candidate)
            if info.min <= lo and hi <= info.max:
                return array.astype(candidate)
    if array.dtype == np.float16:
        array = array.astype(np.float32)
    return np.ascontiguousarray(array)


def write_geotiff(
    path: str | os.PathLike[str],
    data: Any,
    crs: Any,
    transform: Affine | tuple[float, ...],
    nodata: float | None = None,
    *,
    compress: str = "deflate",
    blocksize: int = 256,
    dtype: Any = None,
    band_names: list[str] | None = None,
    colormap: Mapping[int, tuple[int, ...]] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    overwrite: bool = True,
) -> str:
    """Write ``data`` as a tiled, compressed GeoTIFF georeferenced by ``crs`` and ``transform``.

    Args:
        path: a local path or an fsspec URL.
        data: ``[H, W]`` or ``[C, H, W]`` numpy array or torch tensor (moved
            to the CPU; ``int64`` labels are stored in the smallest integer
            type that holds them, booleans as ``uint8``).
        crs: the CRS (a rasterio ``CRS``, ``"EPSG:..."``, WKT...), e.g. ``sample["crs"]``.
        transform: the affine transform of the patch, e.g. ``sample["transform"]``.
        nodata: the nodata value to record, if any.
        compress: GDAL compression (``deflate`` by default; a horizontal
            predictor is used for integers, a floating-point one for floats).
        blocksize: tile size (a multiple of 16).
        dtype: store as this dtype instead.
        band_names: descriptions of the bands.
        colormap: ``{value: (r, g, b[, a])}`` for a one-band ``uint8`` mask.
        storage_options: fsspec options for remote URLs.
        overwrite: replace an existing file (``FileExistsError`` if false).

    Returns:
        the path written.

    Example:
        >>> import tempfile, numpy as np, rasterio
        >>> from affine import Affine
        >>> path = write_geotiff(tempfile.mkdtemp() + "/pred.tif", np.ones((2, 32, 32), "float32"),
        ...                      "EPSG:32615", Affine(10, 0, 500000, 0, -10, 4000000))
        >>> with rasterio.open(path) as f:
        ...     f.crs.to_epsg(), f.transform.c, f.count, f.profile["tiled"], f.profile["compress"]
        (32615, 500000.0, 2, True, 'deflate')
    """
    array = _to_array(data)
    if dtype is not None:
        array = array.astype(np.dtype(dtype))
    try:
        crs = crs if isinstance(crs, CRS) else CRS.from_user_input(crs)
    except Exception as exc:
        raise ValueError(f"write_geotiff: not a CRS: {crs!r}") from exc
    if not isinstance(transform, Affine):
        values = tuple(float(v) for v in transform)
        if len(values) not in (6, 9):
            raise ValueError(f"write_geotiff: transform must be an Affine or 6 numbers, got {transform!r}")
        transform = Affine(*values[:6])
    if compress.lower() not in _COMPRESSIONS:
        raise ValueError(f"unknown compression {compress!r}; choose one of {sorted(_COMPRESSIONS)}")
    if blocksize < 16 or blocksize % 16:
        raise ValueError(f"blocksize must be a positive multiple of 16, got {blocksize}")
    if band_names is not None and len(band_names) != array.shape[0]:
        raise ValueError(f"{len(band_names)} band names for {array.shape[0]} bands")
    count, height, width = array.shape
    profile: dict[str, Any] = {
        "driver": "GTiff",
        "width": width,
        "height": height,
        "count": count,
        "dtype": array.dtype.name,
        "crs": crs,
        "transform": transform,
        "nodata": nodata,
        "tiled": True,
        "blockxsize": blocksize,
        "blockysize": blocksize,
        "interleave": "pixel" if count <= 4 else "band",
    }
    if compress.lower() != "none":
        profile["compress"] = compress.lower()
        if compress.lower() in ("deflate", "lzw", "zstd", "lzma"):
            profile["predictor"] = 3 if np.issubdtype(array.dtype, np.floating) else 2
    if max(width, height) > 65536 or array.nbytes > 3 * 2**30:
        profile["BIGTIFF"] = "IF_SAFER"

    def _write(ds: Any) -> None:
        ds.write(array)
        if band_names is not None:
            for k, name in enumerate(band_names, start=1):
                ds.set_band_description(k, name)
        if colormap is not None:
            if count != 1 or array.dtype not in (np.uint8, np.uint16):
                raise ValueError("a colormap needs a one-band uint8 or uint16 raster")
            ds.write_colormap(1, {int(k): tuple(v) for k, v in colormap.items()})

    target = os.fspath(path)
    if is_local(target):
        local = local_path(target)
        if not overwrite and os.path.exists(local):
            raise FileExistsError(f"write_geotiff: {local!r} exists (overwrite=False)")
        directory = os.path.dirname(local)
        if directory:
            os.makedirs(directory, exist_ok=True)
        try:
            with rasterio.open(local, "w", **profile) as ds:
                _write(ds)
        except rasterio.errors.RasterioError as exc:
            raise ReadError("write GeoTIFF", local, "write_geotiff", f"{type(exc).__name__}: {exc}") from exc
        return local

    fs, fs_path = url_to_fs(target, storage_options)
    if not overwrite and fs.exists(fs_path):
        raise FileExistsError(f"write_geotiff: {target!r} exists (overwrite=False)")
    with rasterio.MemoryFile() as memfile:
        with memfile.open(**profile) as ds:
            _write(ds)
        payload = memfile.read()
    try:
        with fs.open(fs_path, "wb") as f:
            f.write(payload)
    except Exception as exc:
        raise ReadError("write GeoTIFF", target, "write_geotiff", f"{type(exc).__name__}: {exc}") from exc
    return target
