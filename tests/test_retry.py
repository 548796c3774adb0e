"""The retry policy: which failures are transient, backoff with jitter, the budget, the final error."""

from __future__ import annotations

import errno
import logging

import pytest
from botocore.exceptions import ClientError, ConnectTimeoutError, EndpointConnectionError, ReadTimeoutError

from pipekit.errors import ReadError, StageError
from pipekit.retry import RetryPolicy, is_transient, resolve_retry


def _client_error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}},
                       "GetObject")


def _s3fs_translated(code: str, status: int) -> OSError:
    from s3fs.errors import translate_boto_error

    return translate_boto_error(_client_error(code, status))


@pytest.mark.parametrize(
    "exc",
    [
        EndpointConnectionError(endpoint_url="http://127.0.0.1:1/b/k"),
        ConnectTimeoutError(endpoint_url="http://127.0.0.1:1/b/k"),
        ReadTimeoutError(endpoint_url="http://127.0.0.1:1/b/k"),
        ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"),
        ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"),
        TimeoutError("timed out"),
        OSError(errno.ECONNRESET, "reset"),
        _client_error("SlowDown", 503),
        _client_error("Throttling", 400),
        _client_error("InternalError", 500),
        _client_error("Whatever", 502),
        _s3fs_translated("SlowDown", 503),
        _s3fs_translated("InternalError", 500),
    ],
    ids=repr,
)
def test_transient(exc: BaseException) -> None:
    assert is_transient(exc)


@pytest.mark.parametrize(
    "exc",
    [
        FileNotFoundError("b/k"),
        PermissionError("denied"),
        _client_error("NoSuchKey", 404),
        _client_error("AccessDenied", 403),
        _s3fs_translated("NoSuchKey", 404),
        _s3fs_translated("AccessDenied", 403),
        ValueError("not a tar file"),
        OSError(errno.EINVAL, "bad"),
    ],
    ids=repr,
)
def test_not_transient(exc: BaseException) -> None:
    assert not is_transient(exc)


def test_transient_through_wrapping_errors() -> None:
    """pipekit's stages wrap botocore's errors; the cause decides."""
    wrapped = ReadError("open", "s3://b/k", "stage", "x")
    wrapped.__cause__ = EndpointConnectionError(endpoint_url="http://127.0.0.1:1/b/k")
    assert is_transient(wrapped)
    assert not is_transient(ReadError("open", "s3://b/k", "stage", "x"))
    # a missing file stays permanent even when raised while handling a connection error
    missing = FileNotFoundError("b/k")
    missing.__context__ = ConnectionResetError(errno.ECONNRESET, "reset")
    assert not is_transient(missing)


def test_retries_until_success_and_logs_the_url(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []
    recovered: list[int] = []

    def fn() -> str:
        calls.append(1)
        if len(calls) < 4:
            raise ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
        return "ok"

    policy = RetryPolicy(attempts=5, max_seconds=30, base_delay=0.001)
    with caplog.at_level(logging.WARNING, logger="pipekit.retry"):
        assert policy.call(fn, action="read", url="s3://b/k", stage="st", recover=lambda: recovered.append(1)) == "ok"
    assert len(calls) == 4 and len(recovered) == 3
    retries = [r for r in caplog.records if r.name == "pipekit.retry"]
    assert len(retries) == 3 and all("s3://b/k" in r.getMessage() for r in retries)


def test_budget_of_attempts_names_url_stage_and_attempts() -> None:
    calls: list[int] = []

    def fn() -> None:
        calls.append(1)
        raise EndpointConnectionError(endpoint_url="http://127.0.0.1:1/b/k")

    with pytest.raises(ReadError) as info:
        RetryPolicy(attempts=3, max_seconds=30, base_delay=0.001).call(fn, action="read", url="s3://b/k", stage="st")
    assert len(calls) == 3
    err = info.value
    assert (err.url, err.stage, err.action) == ("s3://b/k", "st", "read")
    assert "gave up after 3 attempts" in str(err) and "EndpointConnectionError" in str(err)
    assert isinstance(err.__cause__, EndpointConnectionError)
    assert isinstance(err, StageError) and isinstance(err, OSError)


def test_budget_of_seconds() -> None:
    calls: list[int] = []

    def fn() -> None:
        calls.append(1)
        raise TimeoutError("timed out")

    # the first wait is at most 0.05 s, then the caps grow past the 0.2 s budget
    with pytest.raises(ReadError, match="gave up after"):
        RetryPolicy(attempts=1000, max_seconds=0.2, base_delay=0.05, max_delay=0.1).call(
            fn, action="open", url="s3://b/k", stage="st")
    assert 1 < len(calls) < 1000


def test_permanent_error_is_not_retried() -> None:
    calls: list[int] = []

    def fn() -> None:
        calls.append(1)
        raise FileNotFoundError("b/k")

    with pytest.raises(FileNotFoundError):
        RetryPolicy(attempts=5, base_delay=0.001).call(fn, action="open", url="s3://b/k", stage="st")
    assert len(calls) == 1


def test_full_jitter_within_caps() -> None:
    policy = RetryPolicy(base_delay=0.5, max_delay=4.0)
    for n, cap in [(0, 0.5), (1, 1.0), (2, 2.0), (3, 4.0), (10, 4.0)]:
        delays = [policy.delay(n) for _ in range(200)]
        assert all(0 <= d <= cap for d in delays)
        assert max(delays) > cap / 2  # spread over the range, not a fixed wait


def test_env_and_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPEKIT_RETRY_ATTEMPTS", "4")
    monkeypatch.setenv("PIPEKIT_RETRY_SECONDS", "7.5")
    assert resolve_retry(None) == RetryPolicy(attempts=4, max_seconds=7.5)
    assert resolve_retry(2) == RetryPolicy(attempts=2, max_seconds=7.5)
    assert resolve_retry(False).attempts == 1
    custom = RetryPolicy(attempts=9)
    assert resolve_retry(custom) is custom
    monkeypatch.setenv("PIPEKIT_RETRY_ATTEMPTS", "many")
    with pytest.raises(ValueError, match="PIPEKIT_RETRY_ATTEMPTS"):
        resolve_retry(None)
    with pytest.raises(ValueError):
        RetryPolicy(attempts=0)
    with pytest.raises(TypeError):
        resolve_retry("3")  # type: ignore[arg-type]


@pytest.mark.parametrize("retry", [0, -1])
def test_a_retry_count_below_one_is_refused_naming_the_argument(retry: int) -> None:
    """``open_files_by_fsspec(retry=0)`` said ``attempts must be a positive integer``: no ``attempts`` was passed."""
    with pytest.raises(ValueError, match=rf"retry must be a positive int \(the most attempts\).*got {retry}"):
        resolve_retry(retry)


def test_default_survives_a_30_second_restart() -> None:
    policy = RetryPolicy()
    assert policy.max_seconds >= 60 and policy.attempts >= 6


def test_gdal_errors_and_options() -> None:
    import rasterio.errors

    from pipekit.geo.io import _gdal_retry_options, is_transient_gdal

    refused = rasterio.errors.RasterioIOError("CURL error: Couldn't connect to server")
    assert is_transient_gdal(refused)
    assert is_transient_gdal(rasterio.errors.RasterioIOError("HTTP response code: 503"))
    assert not is_transient_gdal(rasterio.errors.RasterioIOError("HTTP response code: 404"))
    assert not is_transient_gdal(rasterio.errors.RasterioIOError("'x.tif' not recognized as a supported file format"))
    options = _gdal_retry_options(RetryPolicy(attempts=10, base_delay=0.5))
    assert options["GDAL_HTTP_MAX_RETRY"] == "3" and options["GDAL_HTTP_RETRY_DELAY"] == "0.5"
    assert "404" not in options["GDAL_HTTP_RETRY_CODES"] and "503" in options["GDAL_HTTP_RETRY_CODES"]
    assert _gdal_retry_options(RetryPolicy(attempts=1))["GDAL_HTTP_MAX_RETRY"] == "0"


def test_retry_warnings_do_not_print_url_secrets(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []

    def fn() -> str:
        calls.append(1)
        if len(calls) < 2:
            raise ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
        return "ok"

    url = "https://user:hunter2@example.com/data.tar?X-Amz-Signature=deadbeef&part=1"
    policy = RetryPolicy(attempts=3, max_seconds=30, base_delay=0.001)
    with caplog.at_level(logging.WARNING, logger="pipekit.retry"):
        assert policy.call(fn, action="read", url=url, stage="st") == "ok"
    (message,) = [r.getMessage() for r in caplog.records if r.name == "pipekit.retry"]
    assert "example.com/data.tar" in message
    assert "hunter2" not in message and "deadbeef" not in message
