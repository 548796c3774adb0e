"""Opening rasters: local paths, GDAL's ``/vsis3/`` and ``/vsicurl/``, or any fsspec filesystem.

A geo dataset never keeps an open file in itself (it is pickled to every
DataLoader worker).  It holds a :class:`RasterOpener`, a small picklable
description of *how* to open its files, and asks :func:`cached_handle` for a
handle when it reads.  Handles live in a per-process, per-thread LRU cache:

* created lazily, in the process (and thread) that reads, so a forked
  DataLoader worker never touches a handle of its parent: the cache is keyed
  by ``os.getpid()``, and a child that inherits its parent's cache leaves
  those handles alone (closing them could move the file offset the parent
  shares with it);
* bounded by a count and an estimated byte budget (see
  :func:`set_handle_budget`), closing the least recently used handles.

How a URL is opened (:meth:`RasterOpener.resolve`):

* a local path or ``file://`` URL: by GDAL directly;
* ``s3://bucket/key``: by GDAL's ``/vsis3/`` (HTTP range requests, so a
  window of a Cloud-Optimized GeoTIFF costs a few small requests), with the
  endpoint, region and credentials taken from ``storage_options`` (s3fs
  spelling: ``key``, ``secret``, ``token``, ``anon``, ``endpoint_url``,
  ``client_kwargs={"endpoint_url": ..., "region_name": ...}``);
* ``http(s)://``: by GDAL's ``/vsicurl/``;
* anything else (``memory://``, ``gs://``, ``zip://...``), or S3 with
  options GDAL cannot express, or ``vsi=False``: through fsspec, handing
  rasterio (>= 1.4) file objects with its ``opener=`` argument.

GDAL settings are chosen deliberately (:data:`GDAL_OPTIONS`, applied once
per process; :data:`REMOTE_GDAL_OPTIONS` for remote files) and can be
overridden per dataset with ``gdal_options``.

The package, module by module (each decides one thing; the names below are
all importable from ``pipekit.geo.io`` too):

================================  ==============================================================
``opener``                        how a URL is opened (:class:`RasterOpener`, ``resolve``,
                                  ``open``) and its GDAL environment (``new_env``); how long
                                  that stays entered is the calling thread's policy
                                  (``set_env_policy``)
``handles``                       :class:`RasterHandle`, the per-thread handle LRU and its
                                  budget, closing handles at exit
``lanes``                         the GDAL network I/O threads (:func:`run_remote`,
                                  :func:`run_parts`, ``uses_gdal_network``) and the GDAL
                                  environment each keeps entered (their env policy);
                                  ``REMOTE_IO_THREADS``
``_gdal_config``                  :data:`GDAL_OPTIONS`, :data:`REMOTE_GDAL_OPTIONS`, GDAL's
                                  HTTP retries, applying the options once per process
``_s3_options``                   s3fs ``storage_options`` -> GDAL's ``AWS_*`` options
``_fsspec``                       the fsspec file objects rasterio's ``opener=`` receives
``_errors``                       :func:`error_reason`, and fsspec read failures kept from
                                  GDAL and raised afterwards (``OpenerReadError``)
``_retry``                        retrying opens and window reads (``retry_read``)
``_prefetch``                     fetching a window's tiles into the range cache at once
================================  ==============================================================

Dependencies run one way (whether a URL is local is :mod:`pipekit._fs`'s answer):
``_errors``, ``_gdal_config``, ``_s3_options``
<- ``_fsspec``, ``_retry`` <- ``opener`` <- ``lanes``, ``_prefetch`` <- ``handles``.

The fast paths this package takes (``fetch``, ``prefetch_tiles``, ``lane_env``, ``concurrent_parts``) are
switched in :mod:`pipekit._fast`, with the others. ``REMOTE_IO_THREADS`` (``lanes``) and the GDAL options
(``_gdal_config``) are set in their own modules.
"""

from __future__ import annotations

from pipekit._fs import is_local as is_local
from pipekit._fs import local_path as local_path
from pipekit._fs import split_protocol
from pipekit.geo.io._errors import OpenerReadError as OpenerReadError
from pipekit.geo.io._errors import error_reason
from pipekit.geo.io._errors import surfacing_opener_errors as surfacing_opener_errors
from pipekit.geo.io._gdal_config import GDAL_OPTIONS, REMOTE_GDAL_OPTIONS
from pipekit.geo.io._gdal_config import _gdal_retry_options as _gdal_retry_options
from pipekit.geo.io._prefetch import _TilePrefetcher as _TilePrefetcher
from pipekit.geo.io._retry import is_transient_gdal as is_transient_gdal
from pipekit.geo.io._retry import retry_read as retry_read
from pipekit.geo.io._retry import store_unreachable as store_unreachable
from pipekit.geo.io._s3_options import _s3_gdal_options as _s3_gdal_options
from pipekit.geo.io.handles import (
    RasterHandle,
    cached_handle,
    cached_handle_count,
    close_cached_handles,
    handle_budget,
    open_handle,
    set_handle_budget,
)
from pipekit.geo.io.handles import evict_handle as evict_handle
from pipekit.geo.io.lanes import REMOTE_IO_THREADS as REMOTE_IO_THREADS
from pipekit.geo.io.lanes import leave_lane_env as leave_lane_env
from pipekit.geo.io.lanes import on_io_thread as on_io_thread
from pipekit.geo.io.lanes import run_parts, run_remote
from pipekit.geo.io.lanes import uses_gdal_network as uses_gdal_network
from pipekit.geo.io.opener import RasterOpener

__all__ = [
    "GDAL_OPTIONS",
    "REMOTE_GDAL_OPTIONS",
    "RasterOpener",
    "RasterHandle",
    "cached_handle",
    "open_handle",
    "set_handle_budget",
    "handle_budget",
    "close_cached_handles",
    "cached_handle_count",
    "split_protocol",
    "error_reason",
    "run_parts",
    "run_remote",
]
