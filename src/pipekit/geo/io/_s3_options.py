"""S3 access for GDAL: s3fs-style ``storage_options`` turned into GDAL's ``AWS_*`` options and credentials.

:func:`_s3_gdal_options` says whether GDAL's ``/vsis3/`` can read with the given options (else
the file is read through fsspec); :class:`_Credentials` hands the credentials to ``rasterio.Env``.
The range cache's lean S3 fetcher (:func:`pipekit.geo.rangefetch.s3_fetcher`) takes the same pair.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import rasterio.session

_S3_OPTION_KEYS = {
    "key",
    "secret",
    "token",
    "anon",
    "endpoint_url",
    "client_kwargs",
    "region",
    "region_name",
    "requester_pays",
    "profile",
    "use_ssl",
    "aws_access_key_id",
    "aws_secret_access_key",
    "aws_session_token",
    "config_kwargs",
}
# botocore Config options GDAL has an equivalent of: the timeouts
_CONFIG_KWARGS = {"connect_timeout", "read_timeout"}
# s3fs options that only tune s3fs itself: harmless to leave out of GDAL's configuration.
_S3FS_ONLY_KEYS = {
    "skip_instance_cache",
    "use_listings_cache",
    "listings_expiry_time",
    "max_paths",
    "default_block_size",
    "default_fill_cache",
    "default_cache_type",
    "cache_regions",
    "max_concurrency",
    "asynchronous",
    "loop",
    "version_aware",
    "fixed_upload_size",
}


class _Credentials(rasterio.session.Session):
    """A rasterio session carrying GDAL's ``AWS_*`` options (rasterio.Env refuses them as plain options)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self._options = dict(options)

    @classmethod
    def hascreds(cls, config: Mapping[str, Any]) -> bool:
        return True

    @property
    def credentials(self) -> dict[str, str]:
        return dict(self._options)

    def get_credential_options(self) -> dict[str, str]:
        return dict(self._options)


def _s3_gdal_options(storage_options: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, str]] | None:
    """GDAL (config, credential) options equivalent to s3fs ``storage_options``, or ``None`` if not expressible.

    ``config_kwargs`` may hold botocore's ``connect_timeout`` and ``read_timeout`` (they become
    ``GDAL_HTTP_CONNECTTIMEOUT`` and ``GDAL_HTTP_LOW_SPEED_TIME``); other botocore options send the file
    to fsspec.
    """
    config: dict[str, str] = {}
    creds: dict[str, str] = {}
    client_kwargs = dict(storage_options.get("client_kwargs") or {})
    for key in storage_options:
        if key not in _S3_OPTION_KEYS and key not in _S3FS_ONLY_KEYS:
            return None
    if set(client_kwargs) - {"endpoint_url", "region_name"}:
        return None
    config_kwargs = dict(storage_options.get("config_kwargs") or {})
    if set(config_kwargs) - _CONFIG_KWARGS:
        return None
    # s3fs's timeouts as GDAL's: connecting, and no byte received for read_timeout seconds
    if config_kwargs.get("connect_timeout") is not None:
        config["GDAL_HTTP_CONNECTTIMEOUT"] = f"{float(config_kwargs['connect_timeout']):g}"
    if config_kwargs.get("read_timeout") is not None:
        config["GDAL_HTTP_LOW_SPEED_TIME"] = f"{max(1, round(float(config_kwargs['read_timeout']))):d}"
        config["GDAL_HTTP_LOW_SPEED_LIMIT"] = "1"
    key = storage_options.get("key", storage_options.get("aws_access_key_id"))
    secret = storage_options.get("secret", storage_options.get("aws_secret_access_key"))
    token = storage_options.get("token", storage_options.get("aws_session_token"))
    if key:
        creds["AWS_ACCESS_KEY_ID"] = str(key)
    if secret:
        creds["AWS_SECRET_ACCESS_KEY"] = str(secret)
    if token:
        creds["AWS_SESSION_TOKEN"] = str(token)
    if storage_options.get("anon"):
        config["AWS_NO_SIGN_REQUEST"] = "YES"
    elif key or secret:
        config["AWS_NO_SIGN_REQUEST"] = "NO"
    endpoint = storage_options.get("endpoint_url") or client_kwargs.get("endpoint_url")
    if endpoint:
        parts = urlsplit(str(endpoint))
        if not parts.netloc or parts.path not in ("", "/") or parts.query:
            return None
        config["AWS_S3_ENDPOINT"] = parts.netloc
        config["AWS_HTTPS"] = "NO" if parts.scheme == "http" else "YES"
        config["AWS_VIRTUAL_HOSTING"] = "FALSE"
    if storage_options.get("use_ssl") is False:
        config["AWS_HTTPS"] = "NO"
    region = storage_options.get("region") or storage_options.get("region_name") or client_kwargs.get("region_name")
    if region:
        config["AWS_REGION"] = str(region)
        config["AWS_DEFAULT_REGION"] = str(region)
    if storage_options.get("requester_pays"):
        config["AWS_REQUEST_PAYER"] = "requester"
    if storage_options.get("profile"):
        config["AWS_PROFILE"] = str(storage_options["profile"])
    return config, creds
