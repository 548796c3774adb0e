"""list_files_by_fsspec's position without the credentials of its root: a checkpoint travels (to a bucket, a colleague,
a bug report) and must not carry the password of ``http://user:password@host/dir/``.

The files are listed from a loopback web server behind basic auth, the root URL carrying the user and password (as a
private mirror's URL does); fsspec's HTTP listing gives each file's URL with them.
"""

from __future__ import annotations

import base64
import os
import pickle
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest

import pipekit
from mirror_server import QuietFolderHandler, serve_folder
from pipekit.errors import CheckpointError, ReadError
from pipekit.pipes import IterableWrapper

SECRET = "s3cr3t-pw"


class _BasicAuth(QuietFolderHandler):
    def _allowed(self) -> bool:
        if self.headers.get("Authorization") == "Basic " + base64.b64encode(f"user:{SECRET}".encode()).decode():
            return True
        self.send_error(401)
        return False

    def do_GET(self) -> None:
        if self._allowed():
            super().do_GET()

    def do_HEAD(self) -> None:
        if self._allowed():
            super().do_HEAD()


@pytest.fixture
def private_root(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A folder of five files, and its URL with the user and password on a server that asks for them."""
    folder = tmp_path / "files"
    folder.mkdir()
    for i in range(5):
        (folder / f"f{i}.txt").write_bytes(b"x" * (i + 1))
    with serve_folder(folder, _BasicAuth) as url:
        yield folder, url.replace("http://", f"http://user:{SECRET}@") + "/"


def _listing(root: str):
    return IterableWrapper([root]).list_files_by_fsspec(masks="*.txt")


def _checkpoint(root: str, take: int) -> tuple[list, dict]:
    loader = pipekit.DataLoader(_listing(root))
    it = iter(loader)
    head = [next(it) for _ in range(take)]
    return head, loader.state_dict()


def _secret_free(state: dict) -> None:
    """No copy of the password in the checkpoint, nor in a compressed listing it holds."""
    raw = pickle.dumps(state)
    assert SECRET.encode() not in raw

    def walk(value):
        if isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list | tuple):
            for v in value:
                walk(v)
        elif isinstance(value, bytes):
            try:
                text = zlib.decompress(value)
            except zlib.error:
                return
            assert SECRET.encode() not in text

    walk(state)


@pytest.mark.timeout(60)
def test_a_checkpoint_holds_no_password_of_the_root_and_resumes_at_its_position(private_root):
    _, root = private_root
    full = list(pipekit.DataLoader(_listing(root)))
    assert len(full) == 5 and SECRET in full[0]  # listed with the credentials: each file can be opened
    head, state = _checkpoint(root, 2)
    _secret_free(state)
    resumed = pipekit.DataLoader(_listing(root))
    resumed.load_state_dict(pickle.loads(pickle.dumps(state)))
    assert head + list(resumed) == full


@pytest.mark.timeout(60)
def test_a_listing_changed_since_the_checkpoint_is_refused_naming_the_root_without_its_password(private_root):
    folder, root = private_root
    _, state = _checkpoint(root, 2)
    (folder / "f3.txt").unlink()
    resumed = pipekit.DataLoader(_listing(root))
    resumed.load_state_dict(state)
    with pytest.raises(ReadError, match=r"http://user:\*\*\*@127\.0\.0\.1:\d+/.*gone '.*f3\.txt") as info:
        list(resumed)
    assert SECRET not in str(info.value)
    assert "blake2b" not in str(info.value)  # the checkpoint's digest is for matching, not for the reader


@pytest.mark.timeout(60)
def test_a_root_not_in_the_resumed_pipeline_is_named(private_root):
    """Resumed with a pipeline listing another root, the checkpoint's root cannot be found again (its password is
    not in the checkpoint): refused naming it, not listed without credentials."""
    _, root = private_root
    _, state = _checkpoint(root, 2)
    resumed = pipekit.DataLoader(_listing(root.replace(SECRET, "other-pw")))
    resumed.load_state_dict(state)
    with pytest.raises(ReadError, match=r"http://user:\*\*\*@127\.0\.0\.1:\d+/.*without its credentials") as info:
        list(resumed)
    assert "blake2b" not in str(info.value)


def _read(item: tuple) -> tuple:
    url, stream = item
    try:
        return url.rsplit("/", 1)[-1], stream.read()
    finally:
        stream.close()


def _replayed(root: str):
    """fork cannot report its position: the resume replays the listing and opens the files read before again."""
    a, b = _listing(root).open_files_by_fsspec(mode="rb").map(_read).fork(2)
    return a.zip(b)


@pytest.mark.timeout(60)
def test_a_replayed_pipeline_over_the_listing_keeps_no_password_and_refuses_a_changed_file(private_root):
    """The replay's checks (the listing's position, the stamps of the files opened) hold the URLs without the
    password too; an unchanged replay is exact, a file replaced since is refused naming it without the password."""
    folder, root = private_root
    full = list(pipekit.DataLoader(_replayed(root)))
    loader = pipekit.DataLoader(_replayed(root))
    it = iter(loader)
    head = [next(it) for _ in range(2)]
    state = pickle.loads(pickle.dumps(loader.state_dict()))
    _secret_free(state)
    resumed = pipekit.DataLoader(_replayed(root))
    resumed.load_state_dict(state)
    assert head + list(resumed) == full
    path = folder / "f1.txt"
    path.write_bytes(b"y" * path.stat().st_size)
    os.utime(path, (path.stat().st_atime, path.stat().st_mtime + 10))  # Last-Modified counts whole seconds
    resumed = pipekit.DataLoader(_replayed(root))
    resumed.load_state_dict(state)
    with pytest.raises(CheckpointError, match=r"'http://user:\*\*\*@127\.0\.0\.1:\d+/f1\.txt.*changed") as info:
        list(resumed)
    assert SECRET not in str(info.value)
    assert "blake2b" not in str(info.value)
