"""Tests of list_files_by_fsspec, open_files_by_fsspec and save_by_fsspec (local, memory://, http, S3)."""

from __future__ import annotations

import functools
import gc
import http.server
import os
import pickle
import threading
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest

from pipekit.errors import ReadError
from pipekit.pipes import FSSpecFileLister, FSSpecFileOpener, FSSpecSaver, IterableWrapper, Saver, fsspec_io
from pipekit.pipes._resume import restore_pipeline, snapshot_pipeline
from pipekit.testing import assert_resumes, resume_after

FILES = {
    "b.txt": b"bee",
    "a.txt": b"ay",
    "c.csv": b"x,y\n1,2\n",
    "sub/d.txt": b"dee",
    "sub/deeper/e.txt": b"ee",
}


def make_tree(root: Path) -> Path:
    for name, data in FILES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "tree")


@pytest.fixture
def memtree() -> Iterator[str]:
    """A directory in fsspec's global memory filesystem, removed afterwards."""
    fs = fsspec.filesystem("memory")
    base = f"/pipekit-test-{uuid.uuid4().hex[:8]}"
    for name, data in FILES.items():
        fs.pipe(f"{base}/{name}", data)
    yield base
    fs.rm(base, recursive=True)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # keep the test output clean
        pass


@pytest.fixture
def http_root(tree: Path) -> Iterator[str]:
    """A directory-listing HTTP server on loopback serving ``tree``."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(tree)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def s3_tree(s3_server, bucket: str) -> str:
    fs = s3_server.fs()
    for name, data in FILES.items():
        fs.pipe(f"{bucket}/tree/{name}", data)
    fs.invalidate_cache()
    return f"s3://{bucket}/tree"


class TestFSSpecFileLister:
    def test_local_sorted_files_only(self, tree: Path) -> None:
        got = list(FSSpecFileLister(str(tree)))
        assert got == [str(tree / "a.txt"), str(tree / "b.txt"), str(tree / "c.csv")]

    def test_deterministic_across_epochs(self, tree: Path) -> None:
        dp = FSSpecFileLister(str(tree), recursive=True)
        assert list(dp) == list(dp) == sorted(list(dp))

    def test_file_protocol_kept(self, tree: Path) -> None:
        got = list(FSSpecFileLister(f"file://{tree}", masks="*.txt"))
        assert got == [f"file://{tree}/a.txt", f"file://{tree}/b.txt"]

    def test_masks(self, tree: Path) -> None:
        assert list(FSSpecFileLister(str(tree), masks="*.csv")) == [str(tree / "c.csv")]
        got = list(FSSpecFileLister(str(tree), masks=["a*", "*.csv"]))
        assert got == [str(tree / "a.txt"), str(tree / "c.csv")]
        with pytest.warns(UserWarning, match="holds no files matching masks"):  # issue 13: not silently
            assert list(FSSpecFileLister(str(tree), masks="*.png")) == []
        # a mask with "/" matches the full path
        got = list(FSSpecFileLister(str(tree), masks="*/deeper/*", recursive=True))
        assert got == [str(tree / "sub/deeper/e.txt")]

    def test_recursive(self, tree: Path) -> None:
        got = list(FSSpecFileLister(str(tree), masks="*.txt", recursive=True))
        assert got == [str(tree / n) for n in ["a.txt", "b.txt", "sub/d.txt", "sub/deeper/e.txt"]]

    def test_file_root_yields_itself(self, tree: Path) -> None:
        assert list(FSSpecFileLister(str(tree / "sub/d.txt"))) == [str(tree / "sub/d.txt")]

    def test_several_roots_in_order(self, tree: Path) -> None:
        roots = [str(tree / "sub"), str(tree / "a.txt")]
        assert list(FSSpecFileLister(roots)) == [str(tree / "sub/d.txt"), str(tree / "a.txt")]
        assert list(FSSpecFileLister(IterableWrapper(roots))) == [str(tree / "sub/d.txt"), str(tree / "a.txt")]
        assert list(IterableWrapper(roots).list_files_by_fsspec()) == [str(tree / "sub/d.txt"), str(tree / "a.txt")]

    def test_missing_root_raises_naming_it(self, tree: Path) -> None:
        missing = str(tree / "nope")
        with pytest.raises(ReadError, match=r"nope.*list_files_by_fsspec") as info:
            list(FSSpecFileLister([str(tree / "sub"), missing]))
        assert info.value.url == missing
        assert info.value.stage == "list_files_by_fsspec"

    def test_missing_root_skipped_and_recorded(self, tree: Path) -> None:
        missing = str(tree / "nope")
        dp = FSSpecFileLister([missing, str(tree / "sub")], on_error="skip")
        assert list(dp) == [str(tree / "sub/d.txt")]
        assert dp.skip_log.count == 1
        assert dp.skip_log.skipped[0].url == missing

    def test_empty_folder_warns_once_naming_it(self, tree: Path, tmp_path: Path) -> None:
        """Issue 13: an empty folder (or a mask matching nothing) used to yield nothing silently."""
        empty = tmp_path / "empty"
        empty.mkdir()
        lister = FSSpecFileLister([str(empty), str(tree)])
        with pytest.warns(UserWarning, match=rf"list_files_by_fsspec: '{empty}' holds no files; it yields nothing"):
            assert list(lister) == [str(tree / "a.txt"), str(tree / "b.txt"), str(tree / "c.csv")]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert len(list(lister)) == 3  # once per folder: not again next epoch

    def test_mask_matching_nothing_warns(self, tree: Path, memtree: str) -> None:
        mem = f"memory://{memtree}"
        with pytest.warns(UserWarning, match=r"'.*' holds no files matching masks \['\*\.tar'\]") as record:
            assert list(FSSpecFileLister([str(tree), mem], masks="*.tar")) == []
        assert [str(w.message).split("'")[1] for w in record] == [str(tree), mem]  # one per folder
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert list(FSSpecFileLister(str(tree), masks="*.csv")) == [str(tree / "c.csv")]

    def test_memory(self, memtree: str) -> None:
        got = list(FSSpecFileLister(f"memory://{memtree}", masks="*.txt"))
        assert got == [f"memory://{memtree}/a.txt", f"memory://{memtree}/b.txt"]
        # the listed URLs open again
        opened = IterableWrapper(got).open_files_by_fsspec(mode="rb")
        assert [s.read() for _, s in opened] == [b"ay", b"bee"]

    def test_http_directory_listing(self, http_root: str) -> None:
        got = list(FSSpecFileLister(http_root))
        assert got == [http_root + "a.txt", http_root + "b.txt", http_root + "c.csv"]
        assert list(FSSpecFileLister(http_root, masks="*.csv")) == [http_root + "c.csv"]
        # a file URL yields itself
        assert list(FSSpecFileLister(http_root + "a.txt")) == [http_root + "a.txt"]

    def test_resume(self, tree: Path) -> None:
        roots = [str(tree), str(tree / "sub"), str(tree / "a.txt")]

        def make():
            return FSSpecFileLister(roots, recursive=True)

        total = len(list(make()))
        assert total == 5 + 2 + 1
        for n in (0, 1, 3, 5, 6, total - 1, total):
            assert_resumes(make, n)

    def test_resume_refuses_a_changed_listing(self, tree: Path) -> None:
        # Issue 35: the lister alone could continue after its last URL by name, but the positions
        # downstream (a shuffle's, each worker's share of the listing) count files of the old listing.
        def make():
            return FSSpecFileLister(str(tree), on_error="skip")

        pipe = make()
        it = iter(pipe)
        assert next(it) == str(tree / "a.txt")
        state = snapshot_pipeline(pipe)
        (tree / "0-new.txt").write_bytes(b"sorts first")  # would shift a position count
        fresh = make()
        restore_pipeline(fresh, state)
        with pytest.raises(ReadError, match=r"tree' in list_files_by_fsspec: the files under it changed .*3 files "
                                             r"then, 4 now"):
            list(fresh)  # even with on_error="skip": nothing would be skipped, files would be repeated
        assert next(iter(make())) == str(tree / "0-new.txt")  # an epoch started over lists the new files

    def test_loaded_state_is_reported_until_the_lister_starts(self, tree: Path) -> None:
        dp = FSSpecFileLister(str(tree))
        assert dp.datapipe is dp.source_datapipe
        state = {"root": str(tree), "last": str(tree / "a.txt")}
        dp.load_state_dict(state)
        assert dp.state_dict() == state  # a checkpoint taken before it runs keeps the position
        # the rest of the root, then the roots upstream (not restored here) from the start
        assert list(dp) == [str(tree / n) for n in ["b.txt", "c.csv", "a.txt", "b.txt", "c.csv"]]
        assert dp.state_dict() == {"root": None, "last": None}
        with pytest.raises(ValueError, match="not a FSSpecFileLister state"):
            dp.load_state_dict({"root": str(tree)})

    def test_pickle(self, tree: Path) -> None:
        dp = FSSpecFileLister(str(tree), masks="*.txt", key="k")
        clone = pickle.loads(pickle.dumps(dp))
        assert list(clone) == list(dp)
        assert clone.kwargs_for_connection == {"key": "k"}

    def test_bad_arguments(self, tree: Path) -> None:
        with pytest.raises(TypeError, match="root"):
            FSSpecFileLister(3)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="masks"):
            FSSpecFileLister(str(tree), masks=3)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="on_error"):
            FSSpecFileLister(str(tree), on_error="ignore")

    @pytest.mark.s3
    def test_s3(self, s3_server, s3_bucket: str) -> None:
        root = s3_tree(s3_server, s3_bucket)
        opts = s3_server.storage_options
        assert list(FSSpecFileLister(root, **opts)) == [f"{root}/a.txt", f"{root}/b.txt", f"{root}/c.csv"]
        assert list(FSSpecFileLister(root, masks="*.txt", recursive=True, storage_options=opts)) == [
            f"{root}/a.txt",
            f"{root}/b.txt",
            f"{root}/sub/d.txt",
            f"{root}/sub/deeper/e.txt",
        ]
        assert list(FSSpecFileLister(f"{root}/sub/d.txt", **opts)) == [f"{root}/sub/d.txt"]
        with pytest.raises(ReadError, match=r"nope.*list_files_by_fsspec"):
            list(FSSpecFileLister(f"{root}/nope", **opts))


def _after(make, n: int):
    """A pipe built by ``make()`` that has yielded its first ``n`` items (iterator kept alive)."""
    pipe = make()
    it = iter(pipe)
    for _ in range(n):
        next(it)
    pipe._test_iterator = it
    return pipe


def _list_both_ways(monkeypatch: pytest.MonkeyPatch, make) -> tuple[list[str], list[str]]:
    """What a lister built by ``make()`` yields with the os.scandir fast path for local roots, and through fsspec."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # roots where the masks match nothing
        fast = list(make())
        with monkeypatch.context() as m:
            m.setattr(fsspec_io, "_FAST_LOCAL", False)
            slow = list(make())
    return fast, slow


@pytest.fixture
def odd_tree(tmp_path: Path) -> Path:
    """A tree with what a fast local listing could get wrong: links, hidden and special files, odd names."""
    root = make_tree(tmp_path / "odd")
    (root / ".hidden").write_bytes(b"h")
    (root / "sub" / ".hid").mkdir()
    (root / "sub" / ".hid" / "x.txt").write_bytes(b"x")
    (root / "spaced name [1].txt").write_bytes(b"s")
    (root / "empty").mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "o.txt").write_bytes(b"o")
    (root / "link_to_dir").symlink_to(outside, target_is_directory=True)
    (root / "link_to_file.txt").symlink_to(root / "a.txt")
    (root / "broken.txt").symlink_to(tmp_path / "nowhere")
    os.mkfifo(root / "sub" / "fifo")
    return root


class TestLocalListingFastPath:
    """Local roots are listed with os.scandir (issue 12): exactly what the fsspec path lists, in the same order."""

    @pytest.mark.parametrize("recursive", [False, True])
    @pytest.mark.parametrize("masks", ["", "*.txt", ["*.csv", ".*"], "*/deeper/*", "*/sub/*", "[ab]*", "*[[]1]*"])
    def test_same_urls_as_fsspec(
        self, odd_tree: Path, monkeypatch: pytest.MonkeyPatch, recursive: bool, masks: str | list[str]
    ) -> None:
        for root in (str(odd_tree), f"{odd_tree}/", f"file://{odd_tree}", f"{odd_tree}/sub", f"{odd_tree}//sub/."):
            fast, slow = _list_both_ways(
                monkeypatch, lambda root=root: FSSpecFileLister(root, masks=masks, recursive=recursive)
            )
            assert fast == slow, root
        assert fast or masks  # the comparison is not between two empty lists

    def test_relative_and_home_roots(self, odd_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.chdir(odd_tree.parent)
        monkeypatch.setenv("HOME", str(odd_tree.parent))
        for root in ("odd", "./odd/", "odd/sub", "~/odd", ".", "odd/a.txt", "./odd/a.txt"):
            fast, slow = _list_both_ways(monkeypatch, lambda root=root: FSSpecFileLister(root, recursive=True))
            assert fast == slow, root
            assert fast

    def test_the_listing_names_links_and_special_files_like_fsspec(self, odd_tree: Path) -> None:
        got = list(FSSpecFileLister(str(odd_tree), recursive=True))
        # links are files, never followed; the fifo is listed; hidden files and directories too
        for name in ("link_to_dir", "link_to_file.txt", "broken.txt", "sub/fifo", ".hidden", "sub/.hid/x.txt"):
            assert str(odd_tree / name) in got
        assert not any("o.txt" in url for url in got)
        assert got == sorted(got)

    def test_root_that_is_a_file_or_a_link(self, odd_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        for root in (
            f"{odd_tree}/a.txt",
            f"{odd_tree}/link_to_file.txt",
            f"{odd_tree}/link_to_dir",
            f"file://{odd_tree}/sub/fifo",
        ):
            fast, slow = _list_both_ways(monkeypatch, lambda root=root: FSSpecFileLister(root, recursive=True))
            assert fast == slow, root

    def test_same_errors_as_fsspec(self, odd_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        for root in (f"{odd_tree}/nope", f"{odd_tree}/broken.txt", f"file://{odd_tree}/nope"):
            errors = []
            for fast in (True, False):
                monkeypatch.setattr(fsspec_io, "_FAST_LOCAL", fast)
                with pytest.raises(ReadError) as info:
                    list(FSSpecFileLister(root))
                errors.append((str(info.value), info.value.url, info.value.stage))
            assert errors[0] == errors[1]
            assert errors[0][1:] == (root, "list_files_by_fsspec")

    def test_unreadable_directory_goes_through_fsspec(self, odd_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A directory os.scandir cannot read is listed by fsspec, which decides what it means (here: empty)."""
        real_scandir = os.scandir

        def scandir(path):
            if str(path).endswith("deeper"):
                raise PermissionError(13, "Permission denied", str(path))
            return real_scandir(path)

        monkeypatch.setattr(os, "scandir", scandir)  # for both paths: fsspec lists with os.scandir too
        calls = []
        real_url_to_fs = fsspec.core.url_to_fs
        monkeypatch.setattr(fsspec.core, "url_to_fs", lambda *a, **k: calls.append(a) or real_url_to_fs(*a, **k))
        fast, slow = _list_both_ways(monkeypatch, lambda: FSSpecFileLister(str(odd_tree), recursive=True))
        assert calls == [(str(odd_tree),), (str(odd_tree),)]  # the fast path gave up and asked fsspec
        assert fast == slow
        assert str(odd_tree / "sub/d.txt") in fast
        assert not any("deeper" in url for url in fast)

    def test_storage_options_go_through_fsspec(self, tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        calls = []
        real_url_to_fs = fsspec.core.url_to_fs
        monkeypatch.setattr(fsspec.core, "url_to_fs", lambda *a, **k: calls.append(k) or real_url_to_fs(*a, **k))
        assert list(FSSpecFileLister(str(tree), auto_mkdir=False)) == list(FSSpecFileLister(str(tree)))
        assert calls == [{"auto_mkdir": False}]

    def test_resume_is_exact(self, odd_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        def make():
            return FSSpecFileLister([str(odd_tree), f"file://{odd_tree}/sub"], recursive=True)

        for n in (0, 1, 5, 12, len(list(make()))):
            assert_resumes(make, n)
        # a checkpoint taken with one path resumes with the other: the positions are the same URLs
        head, _ = resume_after(make, 7)
        monkeypatch.setattr(fsspec_io, "_FAST_LOCAL", False)
        state = snapshot_pipeline(_after(make, 7))
        monkeypatch.setattr(fsspec_io, "_FAST_LOCAL", True)
        fresh = make()
        restore_pipeline(fresh, state)
        assert head + list(fresh) == list(make())


class TestFSSpecFileOpener:
    def test_read_text_and_binary(self, tree: Path) -> None:
        urls = [str(tree / "a.txt"), str(tree / "c.csv")]
        got = [(u, s.read()) for u, s in IterableWrapper(urls).open_files_by_fsspec()]
        assert got == [(urls[0], "ay"), (urls[1], "x,y\n1,2\n")]
        got = [(u, s.read()) for u, s in FSSpecFileOpener(IterableWrapper(urls), mode="rb")]
        assert got == [(urls[0], b"ay"), (urls[1], b"x,y\n1,2\n")]

    def test_kwargs_for_open(self, tmp_path: Path) -> None:
        path = tmp_path / "latin.txt"
        path.write_bytes("café".encode("latin-1"))
        dp = IterableWrapper([str(path)]).open_files_by_fsspec(kwargs_for_open={"encoding": "latin-1"})
        assert [s.read() for _, s in dp] == ["café"]

    def test_stream_named_after_url(self, tree: Path) -> None:
        ((url, stream),) = list(IterableWrapper([str(tree / "a.txt")]).open_files_by_fsspec(mode="rb"))
        assert stream.name == url
        assert stream.read() == b"ay"  # still open after the pipe is exhausted: the consumer holds it
        stream.close()
        assert stream.closed

    def test_dropped_streams_are_closed(self, tree: Path) -> None:
        files = []
        for _, stream in IterableWrapper([str(tree / "a.txt"), str(tree / "b.txt")]).open_files_by_fsspec("rb"):
            stream.read()
            files.append(stream.file_obj)
        del stream
        gc.collect()
        assert [f.closed for f in files] == [True, True]

    def test_streams_closed_on_error(self, tree: Path) -> None:
        urls = [str(tree / "a.txt"), str(tree / "b.txt"), str(tree / "missing.txt")]
        it = iter(IterableWrapper(urls).open_files_by_fsspec(mode="rb"))
        held = [next(it)[1], next(it)[1]]
        with pytest.raises(ReadError, match=r"missing\.txt.*open_files_by_fsspec") as info:
            next(it)
        assert info.value.url == urls[2]
        assert len(held) == 2
        assert all(s.closed for s in held)

    def test_early_stop_keeps_held_streams_and_closes_dropped_ones(self, tree: Path) -> None:
        urls = [str(tree / "a.txt"), str(tree / "b.txt"), str(tree / "c.csv")]
        it = iter(IterableWrapper(urls).open_files_by_fsspec(mode="rb"))
        _, first = next(it)
        dropped = next(it)[1].file_obj  # the consumer does not keep this stream
        del it  # stop early (like `break` or `header`)
        gc.collect()
        assert dropped.closed
        assert first.read() == b"ay"  # still usable, as in torchdata
        first.close()
        # `for ... break` keeps the item it broke on usable too
        for _, kept in IterableWrapper(urls).open_files_by_fsspec(mode="rb"):  # noqa: B007
            break
        gc.collect()
        assert kept.read() == b"ay"

    def test_streams_closed_on_upstream_error(self, tree: Path) -> None:
        def urls():
            yield str(tree / "a.txt")
            raise RuntimeError("upstream broke")

        it = iter(FSSpecFileOpener(IterableWrapper(urls(), deepcopy=False), mode="rb"))
        _, held = next(it)
        with pytest.raises(RuntimeError, match="upstream broke"):
            next(it)
        assert held.closed

    def test_skip(self, tree: Path) -> None:
        urls = [str(tree / "missing.txt"), str(tree / "a.txt")]
        dp = IterableWrapper(urls).open_files_by_fsspec(mode="rb", on_error="skip")
        assert [(u, s.read()) for u, s in dp] == [(urls[1], b"ay")]
        assert dp.skip_log.count == 1
        assert dp.skip_log.skipped[0].url == urls[0]
        assert dp.skip_log.skipped[0].stage == "open_files_by_fsspec"

    def test_memory_and_reopen(self, memtree: str) -> None:
        url = f"memory://{memtree}/sub/d.txt"
        dp = IterableWrapper([url]).open_files_by_fsspec(mode="rb")
        assert [(u, s.read()) for u, s in dp] == [(url, b"dee")]
        again = dp.reopen(url)
        assert again.read() == b"dee"
        assert again.name == url
        with pytest.raises(ReadError, match="open_files_by_fsspec"):
            dp.reopen(f"memory://{memtree}/none")

    @pytest.mark.parametrize(("mode", "kwargs"), [("rb", None), ("r", None), ("rt", {"encoding": "latin-1"})])
    def test_local_files_read_as_reopen_and_fsspec_read_them(
        self, odd_tree: Path, mode: str, kwargs: dict | None
    ) -> None:
        """Issue 12: the per-epoch local opener gives the same streams as reopen() and as fsspec."""
        names = ["a.txt", "sub/deeper/e.txt", "link_to_file.txt", "spaced name [1].txt"]
        urls = [str(odd_tree / n) for n in names] + [f"file://{odd_tree}/c.csv"]
        dp = IterableWrapper(urls).open_files_by_fsspec(mode=mode, kwargs_for_open=kwargs)
        got = [(url, type(s.file_obj), s.name, s.read()) for url, s in dp]
        again = [(url, type(s.file_obj), s.name, s.read()) for url, s in ((u, dp.reopen(u)) for u in urls)]
        assert got == again
        for (*_, data), url in zip(got, urls, strict=True):
            with fsspec.open(url, mode=mode, **(kwargs or {})) as f:
                assert data == f.read()

    def test_local_open_errors_as_reopen(self, odd_tree: Path) -> None:
        for name in ("nope.txt", "broken.txt", "sub"):  # missing, a broken link, a directory
            url = str(odd_tree / name)
            dp = IterableWrapper([url]).open_files_by_fsspec(mode="rb")
            with pytest.raises(ReadError) as from_pipe:
                list(dp)
            with pytest.raises(ReadError) as from_reopen:
                dp.reopen(url)
            # (torch's iterator hook adds a line naming the pipe to errors raised while iterating)
            assert str(from_pipe.value).split("\nThis exception is thrown by")[0] == str(from_reopen.value)
            assert (from_pipe.value.url, from_pipe.value.stage) == (url, "open_files_by_fsspec")
        with pytest.raises(TypeError, match="a URL must be a str"):
            list(IterableWrapper([odd_tree / "a.txt"]).open_files_by_fsspec(mode="rb"))

    def test_many_held_streams_closed_on_error(self, tmp_path: Path) -> None:
        """The streams still open are closed on an error however many were opened (the weak list is pruned)."""
        urls = []
        for i in range(300):
            (tmp_path / f"{i}.bin").write_bytes(b"%d" % i)
            urls.append(str(tmp_path / f"{i}.bin"))
        it = iter(IterableWrapper([*urls, str(tmp_path / "missing")]).open_files_by_fsspec(mode="rb"))
        held = []
        for i in range(300):
            _, stream = next(it)
            if i % 3 == 0:
                held.append(stream)  # the others are dropped (closed when collected) or closed here
            elif i % 3 == 1:
                stream.close()
        with pytest.raises(ReadError, match="missing"):
            next(it)
        assert len(held) == 100
        assert all(s.closed for s in held)

    def test_len_and_stateless(self, tree: Path) -> None:
        dp = IterableWrapper([str(tree / "a.txt")] * 3).open_files_by_fsspec()
        assert len(dp) == 3
        assert FSSpecFileOpener.stateless is True

    def test_bad_arguments(self) -> None:
        with pytest.raises(ValueError, match="read mode"):
            IterableWrapper([]).open_files_by_fsspec(mode="w")
        with pytest.raises(ValueError, match="read mode"):
            IterableWrapper([]).open_files_by_fsspec(mode="r+")
        with pytest.raises(TypeError, match="kwargs_for_open"):
            IterableWrapper([]).open_files_by_fsspec(kwargs_for_open="utf-8")

    def test_pickle(self, tree: Path) -> None:
        dp = IterableWrapper([str(tree / "a.txt")]).open_files_by_fsspec(mode="rb", anon=True)
        clone = pickle.loads(pickle.dumps(dp))
        assert clone.mode == "rb"
        assert clone.kwargs_for_connection == {"anon": True}
        assert [s.read() for _, s in FSSpecFileOpener(IterableWrapper([str(tree / "a.txt")]), "rb")] == [b"ay"]

    @pytest.mark.s3
    def test_s3(self, s3_server, s3_bucket: str) -> None:
        root = s3_tree(s3_server, s3_bucket)
        opts = s3_server.storage_options
        urls = FSSpecFileLister(root, masks="*.txt", recursive=True, **opts)
        got = {u: s.read() for u, s in urls.open_files_by_fsspec(mode="rb", **opts)}
        assert got == {f"{root}/{n}": d for n, d in FILES.items() if n.endswith(".txt")}
        with pytest.raises(ReadError, match=r"missing.*open_files_by_fsspec"):
            list(IterableWrapper([f"{root}/missing"]).open_files_by_fsspec(mode="rb", **opts))


class TestFSSpecSaver:
    def test_write_bytes_and_return_paths(self, tmp_path: Path) -> None:
        items = IterableWrapper([("1.txt", b"DATA1"), ("deep/er/2.txt", b"DATA2")])
        dp = items.save_by_fsspec(mode="wb", filepath_fn=lambda name: str(tmp_path / "out" / name))
        got = list(dp)
        assert got == [str(tmp_path / "out/1.txt"), str(tmp_path / "out/deep/er/2.txt")]
        assert (tmp_path / "out/1.txt").read_bytes() == b"DATA1"
        assert (tmp_path / "out/deep/er/2.txt").read_bytes() == b"DATA2"
        assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["1.txt", "deep"]  # no temp files left

    def test_text_default_and_meta_as_path(self, tmp_path: Path) -> None:
        target = str(tmp_path / "t.txt")
        assert list(FSSpecSaver(IterableWrapper([(target, "héllo")]))) == [target]
        assert Path(target).read_text(encoding="utf-8") == "héllo"

    def test_overwrite_is_atomic_on_failure(self, tmp_path: Path) -> None:
        target = tmp_path / "t.txt"
        target.write_text("old content")
        # ascii cannot encode "é": the write fails half-way through
        dp = IterableWrapper([(str(target), "x" * 10000 + "é")]).save_by_fsspec(kwargs_for_open={"encoding": "ascii"})
        with pytest.raises(ReadError, match=r"t\.txt.*save_by_fsspec") as info:
            list(dp)
        assert info.value.url == str(target)
        assert target.read_text() == "old content"
        assert os.listdir(tmp_path) == ["t.txt"]

    def test_replaces_existing_file_by_rename(self, tmp_path: Path) -> None:
        target = tmp_path / "t.bin"
        target.write_bytes(b"old")
        with open(target, "rb") as reader:  # a reader holding the old file sees it whole
            list(IterableWrapper([(str(target), b"new")]).save_by_fsspec(mode="wb"))
            assert reader.read() == b"old"
        assert target.read_bytes() == b"new"

    def test_append(self, tmp_path: Path) -> None:
        target = str(tmp_path / "log.txt")
        list(IterableWrapper([(target, "a"), (target, "b")]).save_by_fsspec(mode="a"))
        assert Path(target).read_text() == "ab"

    def test_wrong_data_type(self, tmp_path: Path) -> None:
        target = tmp_path / "t.bin"
        with pytest.raises(TypeError, match=r"t\.bin.*str.*bytes"):
            list(IterableWrapper([(str(target), "text")]).save_by_fsspec(mode="wb"))
        assert not target.exists()

    def test_memory(self) -> None:
        base = f"memory://pipekit-save-{uuid.uuid4().hex[:8]}"
        got = list(IterableWrapper([("x/1.bin", b"one")]).save_by_fsspec("wb", lambda n: f"{base}/{n}"))
        assert got == [f"{base}/x/1.bin"]
        assert fsspec.open(got[0], "rb").open().read() == b"one"
        fsspec.filesystem("memory").rm(base.removeprefix("memory://"), recursive=True)

    def test_bad_arguments(self) -> None:
        with pytest.raises(ValueError, match="mode"):
            IterableWrapper([]).save_by_fsspec(mode="r")
        with pytest.raises(TypeError, match="filepath_fn"):
            IterableWrapper([]).save_by_fsspec(filepath_fn="x")

    def test_stateless_and_pickle(self, tmp_path: Path) -> None:
        assert FSSpecSaver.stateless is True
        dp = IterableWrapper([(str(tmp_path / "p.txt"), "p")]).save_by_fsspec(mode="w")
        clone = pickle.loads(pickle.dumps(dp))
        assert list(clone) == [str(tmp_path / "p.txt")]
        assert len(clone) == 1

    def test_resume_through_saver(self, tmp_path: Path) -> None:
        def make():
            items = IterableWrapper([(f"{i}.txt", str(i)) for i in range(5)])
            return items.save_by_fsspec(filepath_fn=lambda n: str(tmp_path / n))

        head, rest = resume_after(make, 2)
        assert head + rest == [str(tmp_path / f"{i}.txt") for i in range(5)]

    @pytest.mark.s3
    def test_s3(self, s3_server, s3_bucket: str) -> None:
        opts = s3_server.storage_options
        items = IterableWrapper([("a/1.bin", b"one"), ("b/2.bin", b"two")])
        got = list(items.save_by_fsspec("wb", lambda n: f"s3://{s3_bucket}/out/{n}", **opts))
        assert got == [f"s3://{s3_bucket}/out/a/1.bin", f"s3://{s3_bucket}/out/b/2.bin"]
        fs = s3_server.fs()
        fs.invalidate_cache()
        assert fs.cat(f"{s3_bucket}/out/a/1.bin") == b"one"
        assert sorted(fs.find(f"{s3_bucket}/out")) == [f"{s3_bucket}/out/a/1.bin", f"{s3_bucket}/out/b/2.bin"]


class TestSaver:
    def test_torchdata_example(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.chdir(tmp_path)

        def filepath_fn(name: str) -> str:
            return os.path.join(".", os.path.basename(name))

        name_to_data = {"1.txt": b"DATA1", "2.txt": b"DATA2", "3.txt": b"DATA3"}
        source_dp = IterableWrapper(sorted(name_to_data.items()))
        saver_dp = source_dp.save_to_disk(filepath_fn=filepath_fn, mode="wb")
        assert list(saver_dp) == ["./1.txt", "./2.txt", "./3.txt"]
        assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == name_to_data  # no temp files left

    def test_text_default_meta_as_path_and_parents(self, tmp_path: Path) -> None:
        target = tmp_path / "a" / "b" / "t.txt"
        assert list(Saver(IterableWrapper([(str(target), "héllo\n")]))) == [str(target)]
        assert target.read_text(encoding="utf-8") == "héllo\n"

    def test_pathlike_targets_yield_str(self, tmp_path: Path) -> None:
        got = list(IterableWrapper([("x", b"1")]).save_to_disk("wb", lambda n: tmp_path / n))
        assert got == [str(tmp_path / "x")]

    def test_torchdata_mode_shorthand(self, tmp_path: Path) -> None:
        dp = IterableWrapper([(str(tmp_path / "b.bin"), b"\x00\xff")]).save_to_disk(mode="b")
        assert dp.mode == "wb"
        list(dp)
        assert (tmp_path / "b.bin").read_bytes() == b"\x00\xff"

    def test_relative_path_without_directory(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.chdir(tmp_path)  # torchdata failed here: os.makedirs("")
        assert list(IterableWrapper([("plain.txt", "p")]).save_to_disk()) == ["plain.txt"]
        assert (tmp_path / "plain.txt").read_text() == "p"

    def test_replaces_existing_file_by_rename(self, tmp_path: Path) -> None:
        target = tmp_path / "t.bin"
        target.write_bytes(b"old")
        with open(target, "rb") as reader:  # a reader holding the old file sees it whole
            list(IterableWrapper([(str(target), b"new")]).save_to_disk(mode="wb"))
            assert reader.read() == b"old"
        assert target.read_bytes() == b"new"
        assert os.listdir(tmp_path) == ["t.bin"]

    def test_failed_write_keeps_old_file(self, tmp_path: Path) -> None:
        target = tmp_path / "t.txt"
        target.write_text("old content")
        # the write fails half-way, after the temp file exists: a lone surrogate cannot be encoded
        dp = IterableWrapper([(str(target), "x" * 10000 + "\udc80")]).save_to_disk()
        with pytest.raises(ReadError, match=r"cannot write '.*t\.txt' in save_to_disk: UnicodeEncodeError") as info:
            list(dp)
        assert info.value.url == str(target)
        assert target.read_text() == "old content"
        assert os.listdir(tmp_path) == ["t.txt"]

    def test_unwritable_directory(self, tmp_path: Path) -> None:
        (tmp_path / "file").write_text("I am a file")
        target = str(tmp_path / "file" / "below.txt")
        with pytest.raises(ReadError, match=r"below\.txt' in save_to_disk"):
            list(IterableWrapper([(target, "x")]).save_to_disk())

    def test_wrong_data_type(self, tmp_path: Path) -> None:
        target = tmp_path / "t.bin"
        with pytest.raises(TypeError, match=r"t\.bin.*str.*bytes"):
            list(IterableWrapper([(str(target), "text")]).save_to_disk(mode="wb"))
        with pytest.raises(TypeError, match=r"t\.bin.*bytes.*str"):
            list(IterableWrapper([(str(target), b"bytes")]).save_to_disk(mode="w"))
        assert not target.exists()

    def test_bad_items(self, tmp_path: Path) -> None:
        with pytest.raises(TypeError, match="expected \\(meta, data\\) tuples"):
            list(IterableWrapper(["just a string"]).save_to_disk())
        with pytest.raises(TypeError, match="target path must be a str"):
            list(IterableWrapper([(1, "x")]).save_to_disk())
        with pytest.raises(ReadError, match="names no file"):
            list(IterableWrapper([(str(tmp_path) + "/", "x")]).save_to_disk())

    def test_bad_arguments(self) -> None:
        for mode in ("r", "a", "ab", "w+"):
            with pytest.raises(ValueError, match="mode"):
                IterableWrapper([]).save_to_disk(mode=mode)
        with pytest.raises(TypeError, match="filepath_fn"):
            IterableWrapper([]).save_to_disk(filepath_fn="x")

    def test_stateless_len_and_pickle(self, tmp_path: Path) -> None:
        assert Saver.stateless is True
        dp = IterableWrapper([(str(tmp_path / "p.txt"), "p")]).save_to_disk()
        clone = pickle.loads(pickle.dumps(dp))
        assert len(clone) == 1
        assert list(clone) == [str(tmp_path / "p.txt")]

    def test_resume_through_saver(self, tmp_path: Path) -> None:
        def make():
            return IterableWrapper([(f"{i}.txt", str(i)) for i in range(5)]).save_to_disk(
                filepath_fn=functools.partial(os.path.join, str(tmp_path))
            )

        head, rest = resume_after(make, 2)
        assert head + rest == [str(tmp_path / f"{i}.txt") for i in range(5)]
