"""STAC datasets: :class:`STACDataset`, a geo dataset of the assets of SpatioTemporal Asset Catalog items.

Items come from a static catalog, a STAC API search, a stac-geoparquet file
or ``pystac.Item`` objects (see :mod:`pipekit.geo._stac_items`).  Each item is
an index entry; its chosen assets are the bands of a scene, read as COG
windows by :class:`~pipekit.geo._raster.RasterDataset`'s machinery (GDAL
``/vsis3/``/``/vsicurl/`` or fsspec, warped into the dataset CRS, mosaicked
across items and UTM zones).  The dataset is a ``RasterDataset`` over a
:class:`~pipekit.geo.catalog.STACCatalog`, which keeps only arrays, item ids
and asset hrefs: it pickles to DataLoader workers without the items' JSON.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from rasterio.enums import Resampling

from pipekit.geo._base import Sample
from pipekit.geo._raster import RasterDataset
from pipekit.geo._stac_search import SEARCH_KEYS
from pipekit.geo.catalog._stac import STACCatalog, describe_source

# aliased, so re-exported: the names code imported from here before the catalog held them
from pipekit.geo.catalog._stac import _is_api as _is_api
from pipekit.geo.catalog._stac_assets import _band_names as _band_names
from pipekit.geo.catalog._stac_assets import _bands_of as _bands_of
from pipekit.geo.catalog._stac_assets import _proj_crs as _proj_crs
from pipekit.geo.catalog._stac_assets import _still_selects as _still_selects
from pipekit.geo.catalog._stac_assets import header_from_proj as header_from_proj
from pipekit.geo.catalog._stac_assets import select_assets as select_assets

__all__ = ["STACDataset"]


class STACDataset(RasterDataset):
    """A geo dataset of STAC items' assets: one index entry per item, its chosen assets as bands.

    Items come from ``source``:

    * a static ``catalog.json``/``collection.json`` (local path, ``s3://``, ``https://``...),
      walked by following its ``child`` and ``item`` links;
    * a STAC API's landing page (``http(s)://``), searched with pystac-client
      (``collections``, ``bbox``/``intersects``, ``datetime``, ``query``/``filter``
      ...; every page followed);
    * a stac-geoparquet file (``.parquet``), read with pyarrow;
    * an iterable of ``pystac.Item`` objects (or item dicts), or a ``pystac.Catalog``.

    Each item's footprint and grid come from the projection extension
    (``proj:code``/``proj:epsg``, ``proj:transform``, ``proj:shape`` of the
    first chosen asset, asset-level fields first); an item without them has
    that asset's header read once with rasterio.  Its time interval is its
    ``datetime``, or ``start_datetime``/``end_datetime``.  ``dataset.index``'s
    ``filepath`` column holds the item ids.

    Args:
        source: see above.
        assets: asset keys or band names (``eo:bands``/``bands`` ``name`` or
            ``common_name``: ``"red"``, ``"nir"``) read, in this order, as the
            sample's channels.
        crs: the dataset CRS (default: the first item's).
        res: pixel size (default: the first item's first asset's).
        transforms: a callable applied to every sample dict.
        is_image: samples hold ``"image"`` (default) or ``"mask"``.
        time_series: stack, rather than mosaic, the items a query's time
            overlaps (as :class:`RasterDataset`): ``sample["image"]`` is
            ``[T, C, H, W]`` (a mask ``[T, H, W]``), one step per distinct
            item time (the tiles of one date, in any UTM zone, are mosaicked
            into one step), oldest first, and ``sample["dates"]`` the ``[T]``
            float64 POSIX seconds of each step's start.
        nodata: override the assets' nodata value (also the fill value).
        dtype: as :class:`RasterDataset` (float32 images, int64 masks, or ``"native"``).
        resampling: as :class:`RasterDataset`.
        storage_options: fsspec options for the catalog, the parquet file and ``s3://`` assets.
        href_modifier: a picklable callable ``href -> href`` applied when an
            asset is opened (in the worker, so signed URLs are fresh).
        on_error: ``"raise"`` or ``"skip"``: items whose assets cannot be
            selected or indexed, and reads that fail, are counted in
            ``skip_log`` (a failed read leaves the query without sample, as
            :class:`RasterDataset`).
        collections, bbox, intersects, datetime, query, filter, max_items, limit, ids:
            STAC API search parameters (pystac-client's spellings).  An API
            evaluates them; on any other source they are evaluated client-side
            as each item is read (:class:`~pipekit.geo._stac_search.ItemFilter`:
            ``filter`` with the ``cql2`` package, ``query``'s comparisons and
            ``in``), selecting the same items an API would.
        client_options: extra arguments of ``pystac_client.Client.open`` (``headers``...).
        cache, vsi, gdal_options, cache_dir: as :class:`RasterDataset`.

    Raises:
        DatasetNotFoundError: no item could be indexed.
        ReadError: a document, item or asset cannot be read (names the item id and the href).
        ParseError: a catalog has a cycle or a document is not JSON (names the link); a search
            parameter is malformed, or a filter evaluated client-side is not CQL2 or cannot be evaluated.

    Example:
        >>> import datetime, tempfile, numpy as np, pystac, rasterio
        >>> from affine import Affine
        >>> root = tempfile.mkdtemp()
        >>> with rasterio.open(f"{root}/red.tif", "w", driver="GTiff", width=64, height=64, count=1,
        ...                    dtype="uint16", crs="EPSG:32631", transform=Affine(10, 0, 600000, 0, -10, 5300000)) as f:
        ...     f.write(np.full((1, 64, 64), 7, dtype="uint16"))
        >>> item = pystac.Item("S2A_MSIL2A_20240601T103031_T31UFU", {"type": "Point", "coordinates": [4.4, 47.8]},
        ...                    None, datetime.datetime(2024, 6, 1), {"proj:code": "EPSG:32631",
        ...                    "proj:transform": [10, 0, 600000, 0, -10, 5300000], "proj:shape": [64, 64]})
        >>> item.add_asset("B04", pystac.Asset(f"{root}/red.tif", extra_fields={
        ...     "eo:bands": [{"name": "B04", "common_name": "red"}]}))
        >>> ds = STACDataset([item], assets=["red"])
        >>> sample = ds[600000:600320, 5299680:5300000]
        >>> sample["image"].shape, float(sample["image"].max()), list(ds.index["filepath"])
        (torch.Size([1, 32, 32]), 7.0, ['S2A_MSIL2A_20240601T103031_T31UFU'])
    """

    def __init__(
        self,
        source: Any,
        assets: Sequence[str],
        crs: Any = None,
        res: Any = None,
        transforms: Callable[[Sample], Sample] | None = None,
        *,
        is_image: bool = True,
        time_series: bool = False,
        nodata: float | None = None,
        dtype: torch.dtype | str | None = None,
        resampling: Resampling | str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        href_modifier: Callable[[str], str] | None = None,
        on_error: str = "raise",
        collections: Any = None,
        bbox: Any = None,
        intersects: Any = None,
        datetime: Any = None,
        query: Any = None,
        filter: Any = None,
        max_items: int | None = None,
        limit: int | None = None,
        ids: Any = None,
        client_options: Mapping[str, Any] | None = None,
        cache: bool = True,
        vsi: bool | None = None,
        gdal_options: Mapping[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        try:
            import pystac  # noqa: F401
        except ImportError as exc:  # pragma: no cover - the test env has it
            raise ImportError(
                "STACDataset needs pystac (and pystac-client, pyarrow): pip install 'pipekit[stac]'"
            ) from exc
        if isinstance(assets, str) or not isinstance(assets, Sequence) or not assets:
            raise TypeError(f"assets must be a non-empty list of asset keys or band names, got {assets!r}")
        if href_modifier is not None and not callable(href_modifier):
            raise TypeError(f"href_modifier must be callable (href -> href), got {href_modifier!r}")
        if not isinstance(is_image, bool):
            raise TypeError(f"is_image must be a bool, got {is_image!r}")
        self.is_image = is_image
        local = locals()
        # what _make_catalog takes (the catalog is built inside RasterDataset.__init__)
        self.__dict__["_stac_args"] = (source, {k: local[k] for k in SEARCH_KEYS if local[k] is not None},
                                       dict(client_options or {}), href_modifier)
        super().__init__(
            describe_source(source),
            crs,
            res,
            list(assets),
            transforms,
            cache,
            storage_options,
            nodata=nodata,
            dtype=dtype,
            resampling=resampling,
            on_error=on_error,
            vsi=vsi,
            gdal_options=gdal_options,
            cache_dir=cache_dir,
            time_series=time_series,
        )

    def _make_catalog(self) -> STACCatalog:
        """The items of ``source``, their chosen assets the bands read."""
        source, search, client_options, href_modifier = self.__dict__.pop("_stac_args")
        return STACCatalog(
            source,
            self.bands,
            search=search,
            client_options=client_options,
            href_modifier=href_modifier,
            opener=self._opener,
            name=self.name,
            on_error=self.on_error,
            skip_log=self.skip_log,
        )

    def _check_bands(self, bands: Sequence[str] | None) -> list[Any]:
        chosen = list(bands or [])
        bad = [b for b in chosen if not isinstance(b, str) or not b]
        if bad:
            raise TypeError(f"assets are asset keys or band names (strings), got {bad}")
        if len(set(chosen)) != len(chosen):
            raise ValueError(f"assets must not repeat, got {chosen}")
        return chosen

    # -- what the entries are ---------------------------------------------------------------
    @property
    def assets(self) -> list[str]:
        """The asset keys or band names read, in channel order."""
        return list(self.bands)

    @property
    def href_modifier(self) -> Callable[[str], str] | None:
        """``href -> href`` applied when an asset is opened (``None``: the hrefs as they are)."""
        return self._catalog.href_modifier

    @href_modifier.setter
    def href_modifier(self, value: Callable[[str], str] | None) -> None:
        self._catalog.href_modifier = value

    @property
    def requests(self) -> int:
        """The documents read to find the items (catalogs, API pages, the parquet file)."""
        return self._catalog.requests

    @property
    def item_ids(self) -> list[str]:
        """The indexed items' ids (``dataset.index["filepath"]``)."""
        return self.files

    def asset_hrefs(self, i: int) -> dict[str, str]:
        """``{asset key: href}`` of index entry ``i`` (before ``href_modifier``)."""
        return self._catalog.asset_hrefs(int(self._entry_rows()[i]))
