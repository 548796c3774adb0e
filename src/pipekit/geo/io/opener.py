"""How a dataset opens its rasters: :class:`RasterOpener`, a picklable description, and what it resolves a URL to.

:meth:`RasterOpener.resolve` turns a URL into a :class:`_Resolved`: how it is opened (``"local"``,
GDAL's ``"vsi"`` filesystems, or ``"fsspec"``), the path GDAL sees, and the GDAL options and
credentials of its environment.  :meth:`RasterOpener.open` opens it (retrying transient network
failures: :mod:`pipekit.geo.io._retry`).

The opener makes a remote file's GDAL environment (:meth:`RasterOpener.new_env`) but does not
decide how long it stays entered: :meth:`RasterOpener.env` asks the calling thread's policy
(:func:`set_env_policy`), which pipekit's I/O threads set to keep it entered between reads
(:mod:`pipekit.geo.io.lanes`); a thread without one enters and leaves it around each block.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

import rasterio

from pipekit import _fast
from pipekit._fs import is_local, local_path, split_protocol, url_to_fs
from pipekit.errors import ReadError
from pipekit.geo.io._errors import error_reason, surfacing_opener_errors
from pipekit.geo.io._fsspec import _FsspecOpener, _shared_opener
from pipekit.geo.io._gdal_config import REMOTE_GDAL_OPTIONS, _configure_process, _gdal_retry_options
from pipekit.geo.io._retry import _retrying
from pipekit.geo.io._s3_options import _Credentials, _s3_gdal_options
from pipekit.geo.rangecache import RangeCache
from pipekit.geo.rangefetch import RangeFetcher, s3_fetcher
from pipekit.retry import default_policy

__all__ = ["EnvPolicy", "RasterOpener", "set_env_policy"]



class _Resolved:
    __slots__ = ("config", "credentials", "env_key", "kind", "path")

    def __init__(self, kind: str, path: str, config: dict[str, Any], credentials: dict[str, str]) -> None:
        self.kind = kind
        self.path = path
        self.config = config
        self.credentials = credentials
        # identifies the GDAL environment of the file: an I/O thread keeps it entered (see pipekit.geo.io.lanes)
        self.env_key = json.dumps([kind == "fsspec", config, credentials], sort_keys=True, default=repr)

    def __repr__(self) -> str:
        return f"_Resolved({self.kind!r}, {self.path!r})"


#: ``policy(resolved, new_env)``: the context manager a block that reads the remote file ``resolved``
#: runs in, where ``new_env(resolved)`` makes a fresh ``rasterio.Env`` for it
EnvPolicy = Callable[[_Resolved, Callable[[_Resolved], rasterio.Env]], contextlib.AbstractContextManager[Any]]

_env_policies = threading.local()


def set_env_policy(policy: EnvPolicy | None) -> None:
    """Decide how :meth:`RasterOpener.env` enters remote files' GDAL environments on the calling thread.

    ``None`` (every thread's default): a fresh ``rasterio.Env`` entered and
    left around each block.  pipekit's I/O threads set a policy that keeps
    the last one entered (:mod:`pipekit.geo.io.lanes`).
    """
    _env_policies.policy = policy


class RasterOpener:
    """How a dataset opens its rasters; picklable, holds no handle.

    Args:
        storage_options: fsspec options for remote URLs (s3fs spelling for S3).
        vsi: ``None`` (default) opens S3 and HTTP(S) URLs with GDAL's
            ``/vsis3/``/``/vsicurl/`` when ``storage_options`` can be
            expressed as GDAL options, and everything else through fsspec;
            ``True`` insists on GDAL (``ValueError`` where impossible);
            ``False`` always goes through fsspec.
        gdal_options: extra GDAL configuration for this dataset's remote
            files (overrides :data:`REMOTE_GDAL_OPTIONS`).
        cache_dir: a local folder where the byte ranges read from remote
            files are kept (:class:`pipekit.geo.rangecache.RangeCache`):
            DataLoader workers share what any of them fetched, and later
            runs read it from local disk.  Remote files are then read
            through fsspec (``vsi=True`` is refused).  ``None`` (default):
            no disk cache.

    Example:
        >>> from pipekit.geo.io import RasterOpener
        >>> opener = RasterOpener({"endpoint_url": "http://localhost:8333", "key": "k", "secret": "s"})
        >>> opener.resolve("s3://bucket/scene.tif").path
        '/vsis3/bucket/scene.tif'
        >>> opener.resolve("s3://bucket/scene.tif").config["AWS_S3_ENDPOINT"]
        'localhost:8333'
        >>> opener.resolve("memory://data/scene.tif").kind
        'fsspec'
    """

    def __init__(
        self,
        storage_options: Mapping[str, Any] | None = None,
        vsi: bool | None = None,
        gdal_options: Mapping[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if storage_options is not None and not isinstance(storage_options, Mapping):
            raise TypeError(f"storage_options must be a mapping, got {type(storage_options).__name__}")
        if vsi not in (None, True, False):
            raise TypeError(f"vsi must be None, True or False, got {vsi!r}")
        if gdal_options is not None and not isinstance(gdal_options, Mapping):
            raise TypeError(f"gdal_options must be a mapping, got {type(gdal_options).__name__}")
        if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
            raise TypeError(f"cache_dir must be a path, got {type(cache_dir).__name__}")
        if cache_dir is not None and vsi is True:
            raise ValueError("cache_dir reads remote files through fsspec; it cannot be combined with vsi=True")
        self.storage_options = dict(storage_options or {})
        self.vsi = vsi
        self.gdal_options = {str(k): v for k, v in (gdal_options or {}).items()}
        self.cache = RangeCache(cache_dir) if cache_dir is not None else None
        self.cache_dir = self.cache.directory if self.cache is not None else None
        self.key = json.dumps(
            [self.storage_options, vsi, self.gdal_options, self.cache_dir], sort_keys=True, default=repr
        )
        self._resolved: dict[str, _Resolved] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {
            "storage_options": self.storage_options,
            "vsi": self.vsi,
            "gdal_options": self.gdal_options,
            "cache_dir": self.cache_dir,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["storage_options"], state["vsi"], state["gdal_options"], state.get("cache_dir"))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RasterOpener) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        shown = {
            k: ("***" if k in ("secret", "token", "aws_secret_access_key") else v)
            for k, v in self.storage_options.items()
        }
        cache = f", cache_dir={self.cache_dir!r}" if self.cache_dir is not None else ""
        return f"RasterOpener(storage_options={shown!r}, vsi={self.vsi!r}{cache})"

    # -- resolution ------------------------------------------------------------
    def resolve(self, url: str) -> _Resolved:
        """How ``url`` is opened: ``kind`` (``"local"``, ``"vsi"``, ``"fsspec"``), the GDAL ``path``, ``config``."""
        url = os.fspath(url)
        cached = self._resolved.get(url)
        if cached is not None:
            return cached
        resolved = self._resolve(url)
        if len(self._resolved) < 100_000:
            self._resolved[url] = resolved
        return resolved

    def _resolve(self, url: str) -> _Resolved:
        if is_local(url):
            return _Resolved("local", local_path(url), {}, {})
        protocol, rest = split_protocol(url)
        remote = {**REMOTE_GDAL_OPTIONS, **_gdal_retry_options(default_policy()), **self.gdal_options}
        if self.cache is not None:  # the disk cache sits under fsspec's reads
            return _Resolved("fsspec", url, remote, {})
        if self.vsi is not False and "::" not in url:
            if protocol in ("s3", "s3a"):
                options = _s3_gdal_options(self.storage_options)
                if options is not None:
                    config, creds = options
                    return _Resolved("vsi", "/vsis3/" + rest, {**remote, **config}, creds)
            elif protocol in ("http", "https") and not self.storage_options:
                return _Resolved("vsi", "/vsicurl/" + url, remote, {})
        if self.vsi is True:
            raise ValueError(
                f"cannot open {url!r} with GDAL's virtual filesystems (vsi=True): GDAL handles s3:// with "
                "storage_options among key/secret/token/anon/endpoint_url/client_kwargs/region, and "
                "http(s):// without storage_options; pass vsi=None to fall back to fsspec"
            )
        return _Resolved("fsspec", url, remote, {})

    def env(self, resolved: _Resolved) -> contextlib.AbstractContextManager[Any]:
        """The GDAL environment to open and read a resolved remote file in (a no-op for local files).

        How long it stays entered is the calling thread's choice (:func:`set_env_policy`): on one of
        pipekit's I/O threads (:func:`~pipekit.geo.io.lanes.run_remote`) it stays entered after the
        block, until a file with another environment is read there (entering ``rasterio.Env`` costs
        ~85 µs, and a sample of a scene enters it once for every file it opens and every band it reads).
        """
        if resolved.kind == "local":
            return contextlib.nullcontext()
        policy = getattr(_env_policies, "policy", None)
        if policy is not None:
            return policy(resolved, self.new_env)
        return self.new_env(resolved)

    def new_env(self, resolved: _Resolved) -> rasterio.Env:
        """A fresh ``rasterio.Env`` with ``resolved``'s GDAL options and credentials (not entered)."""
        session = _Credentials(resolved.credentials) if resolved.credentials else None
        if session is None:
            return rasterio.Env(**resolved.config)
        return rasterio.Env(session=session, **resolved.config)

    def fsspec_opener(self, url: str) -> tuple[_FsspecOpener, str]:

        fs, path = url_to_fs(url, self.storage_options)
        return _shared_opener(fs, self.cache, lambda: self._fetcher(url)), path

    def _fetcher(self, url: str) -> RangeFetcher | None:
        """The lean fetcher of the range cache's misses for ``url``'s store, where one applies."""
        if self.cache is None or "::" in url or not _fast.enabled("fetch"):
            return None
        protocol = split_protocol(url)[0]
        if protocol in ("s3", "s3a"):
            options = _s3_gdal_options(self.storage_options)
            return s3_fetcher(*options) if options is not None else None
        if protocol in ("http", "https") and not self.storage_options:
            return RangeFetcher("")
        return None

    def open(self, url: str, stage: str = "RasterOpener") -> rasterio.io.DatasetReader:
        """Open ``url`` (uncached; the caller closes it).

        Raises:
            ReadError: naming ``url`` and ``stage`` when it cannot be opened.
        """
        _configure_process()
        resolved = self.resolve(url)

        def open_once() -> rasterio.io.DatasetReader:
            with self.env(resolved):
                if resolved.kind == "fsspec":
                    opener, path = self.fsspec_opener(url)
                    with surfacing_opener_errors(url):
                        return rasterio.open(path, opener=opener)
                return rasterio.open(resolved.path)

        try:
            if resolved.kind == "local":
                return open_once()
            return _retrying(open_once, "open raster", url, stage)
        except ReadError:
            raise
        except Exception as exc:
            reason = error_reason(exc)
            if resolved.kind == "fsspec":
                with contextlib.suppress(Exception):
                    opener, path = self.fsspec_opener(url)
                    if not opener.fs.exists(path):
                        reason = "no such file"
            elif resolved.kind == "local" and not os.path.exists(resolved.path):
                reason = "no such file"
            raise ReadError("open raster", url, stage, reason) from exc
