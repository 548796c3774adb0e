"""``pipekit inspect s3://...`` without credentials says how to pass them, instead of botocore's bare error."""

from __future__ import annotations

import pytest
from botocore.exceptions import NoCredentialsError

import pipekit.cli._common as common
from pipekit.cli import main


class _NoCredentialsFS:
    protocol = ("s3", "s3a")

    def isfile(self, path: str) -> bool:
        raise NoCredentialsError()

    isdir = exists = isfile


@pytest.fixture
def no_credentials(monkeypatch):
    monkeypatch.setattr(common, "url_to_fs", lambda url, options=None: (_NoCredentialsFS(), url.split("://", 1)[1]))


def test_inspect_without_credentials_says_how_to_pass_them(no_credentials, capsys):
    assert main(["inspect", "s3://bucket/train/"]) == 2
    err = capsys.readouterr().err
    assert "pipekit inspect: error: cannot read 's3://bucket/train/': no credentials (NoCredentialsError" in err
    for hint in ("-o anon=true", "AWS_ACCESS_KEY_ID", "AWS_PROFILE", "-o key=", 'storage_options={"anon": True}'):
        assert hint in err


def test_other_errors_are_left_alone(monkeypatch):
    assert common.credentials_hint(ValueError("bad"), "s3://b/x") is None
    assert "anon=true" in common.credentials_hint(PermissionError("InvalidAccessKeyId"), "s3://b/x")
