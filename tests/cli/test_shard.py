"""``pipekit shard``: an image folder, a folder of samples or a pipe spec to shards, local and on S3."""

from __future__ import annotations

import os
import re
import shutil
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from pipekit import datasets
from pipekit.cli._shard import brace_pattern, parse_size

from .conftest import s3_options

SUMMARY = re.compile(r"^wrote (\d+) sample\(s\) in (\d+) shard\(s\): (.+)$")


def summary(out: str) -> tuple[int, int, str]:
    m = SUMMARY.match(out.strip().splitlines()[-1])
    assert m is not None, out
    return int(m[1]), int(m[2]), m[3]


def image_files(root: Path) -> dict[str, tuple[bytes, str]]:
    """``{relative path without extension: (bytes, class folder)}`` of an image folder."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and not any(part.startswith(".") for part in rel.split("/")):
            out[rel.rsplit(".", 1)[0]] = (path.read_bytes(), rel.split("/", 1)[0])
    return out


def tar_names(path: Path) -> list[str]:
    with tarfile.open(path) as tar:
        return tar.getnames()


def all_keys(folder: Path) -> list[str]:
    """The sample keys of every ``.tar`` file in ``folder``, as a reader of ``folder/*.tar`` sees them."""
    keys = []
    for path in sorted(folder.glob("*.tar")):
        keys.extend(sorted({n.split(".", 1)[0] for n in tar_names(path)}))
    return keys


class TestImageFolder:
    def test_images_and_labels(self, cli, image_folder: Path, tmp_path: Path) -> None:
        dst = tmp_path / "out"
        code, out, err = cli("shard", image_folder, dst, "--maxcount", "5")
        assert code == 0, err
        total, shards, pattern = summary(out)
        assert (total, shards, pattern) == (13, 3, f"{dst}/shard-{{000000..000002}}.tar")
        assert sorted(os.listdir(dst)) == [f"shard-00000{i}.tar" for i in range(3)]
        assert "4 classes: circle=0, square=1, stripes=2, triangle=3" in err
        assert "several fields (.jpg: 12, .png: 1)" in err  # the fixture's extra PNG

        files = image_files(image_folder)
        classes = datasets.ImageFolder(str(image_folder), train=False).class_to_idx
        got = list(datasets.WebDataset(pattern, train=False, batch_size=None, decode=False))
        assert len(got) == 13
        for sample in got:
            key = sample["__key__"].split(".tar/", 1)[1]
            data, folder = files[key]
            image = sample.get(".jpg", sample.get(".png"))
            assert image == data  # the file's bytes, not re-encoded
            assert sample[".cls"] == str(classes[folder]).encode()

    def test_decoded_through_the_recipe(self, cli, image_folder: Path, tmp_path: Path) -> None:
        code, out, _ = cli("shard", image_folder, tmp_path / "o", "--no-progress")
        assert code == 0
        _, _, pattern = summary(out)
        samples = list(datasets.WebDataset(pattern, train=False, batch_size=None))
        jpgs = [s for s in samples if ".jpg" in s]
        assert len(jpgs) == 12 and all(s[".jpg"].dtype == torch.uint8 and s[".jpg"].shape[0] == 3 for s in jpgs)
        assert sorted({s[".cls"] for s in samples}) == [0, 1, 2, 3]

    def test_order_and_shuffle(self, cli, image_folder: Path, tmp_path: Path) -> None:
        def keys(folder: Path, *extra: str) -> list[str]:
            code, _, err = cli("shard", image_folder, folder, "--no-progress", *extra)
            assert code == 0, err
            return [n.rsplit(".", 1)[0] for n in tar_names(folder / "shard-000000.tar") if n.endswith(".cls")]

        plain = keys(tmp_path / "a")
        assert plain == sorted(plain)
        shuffled = keys(tmp_path / "b", "--shuffle", "--seed", "3")
        assert sorted(shuffled) == plain and shuffled != plain
        assert keys(tmp_path / "c", "--shuffle", "--seed", "3") == shuffled

    def test_progress_bar(self, cli, image_folder: Path, tmp_path: Path) -> None:
        code, _, err = cli("shard", image_folder, tmp_path / "o")
        assert code == 0
        assert "writing 13 images of" in err and "13/13" in err
        code, _, err = cli("shard", image_folder, tmp_path / "p", "--no-progress")
        assert code == 0 and "13/13" not in err


class TestLayout:
    @pytest.mark.parametrize("stray", ["README.txt", "circle/notes.txt"])
    def test_a_stray_text_file_keeps_the_image_folder_layout(self, cli, image_folder: Path, tmp_path: Path,
                                                            stray: str) -> None:
        src = tmp_path / "imgs"
        shutil.copytree(image_folder, src)
        (src / stray).write_text("how this data set was made")
        code, out, err = cli("shard", src, tmp_path / "out", "--no-progress")
        assert code == 0, err
        assert summary(out)[:2] == (13, 1)
        assert "layout: image folder" in err and "every image is in a class folder" in err
        assert f"ignored 1 file(s) that are not images in a class folder: {stray}" in err
        names = tar_names(tmp_path / "out" / "shard-000000.tar")
        assert sum(n.endswith(".cls") for n in names) == 13  # every image keeps its label
        assert not any(n.endswith(".txt") for n in names)

    def test_the_chosen_layout_and_why_for_a_folder_of_samples(self, cli, tmp_path: Path) -> None:
        src = tmp_path / "src"
        (src / "part").mkdir(parents=True)
        (src / "part" / "0000.png").write_bytes(b"PNG0")
        (src / "part" / "0000.txt").write_text("a caption")
        code, _, err = cli("shard", src, tmp_path / "out", "--no-progress")
        assert code == 0, err
        assert "layout: folder of samples" in err and "'part/0000.png' and 'part/0000.txt'" in err
        assert "no class labels (.cls) are written" in err and "--layout imagefolder" in err

    def test_images_outside_class_folders_say_why_there_are_no_labels(self, cli, tmp_path: Path) -> None:
        src = tmp_path / "src"
        (src / "cat").mkdir(parents=True)
        (src / "cat" / "a.jpg").write_bytes(b"JPG")
        (src / "b.jpg").write_bytes(b"JPG")
        code, _, err = cli("shard", src, tmp_path / "out", "--no-progress")
        assert code == 0, err
        assert "layout: folder of samples" in err and "'b.jpg' is not in a class folder" in err
        assert "no class labels (.cls) are written" in err

    def test_dotted_image_names_and_masks_stay_an_image_folder(self, cli, tmp_path: Path) -> None:
        src = tmp_path / "src"
        (src / "cat").mkdir(parents=True)
        (src / "dog").mkdir()
        for name in ("cat/photo.2021.jpg", "cat/photo.2022.jpg", "dog/0001.jpg", "dog/0001.seg.png"):
            (src / name).write_bytes(b"IMG")
        code, out, err = cli("shard", src, tmp_path / "out", "--no-progress")
        assert code == 0, err
        assert "layout: image folder" in err and summary(out)[0] == 4
        names = tar_names(tmp_path / "out" / "shard-000000.tar")
        assert sum(n.endswith(".cls") for n in names) == 4

    def test_a_folder_without_images_names_the_fix(self, cli, image_folder: Path, tmp_path: Path) -> None:
        src = tmp_path / "imgs"
        shutil.copytree(image_folder, src)
        (src / "docs").mkdir()
        (src / "docs" / "notes.md").write_text("how this data set was made")
        code, out, err = cli("shard", src, tmp_path / "out", "--no-progress")
        assert code == 2 and out == ""
        assert "class folder 'docs'" in err and "has no image files" in err
        assert "allow_empty" not in err and "move it out of" in err and "--layout samples" in err
        assert not (tmp_path / "out").exists()

    def test_an_explicit_layout_is_named(self, cli, image_folder: Path, tmp_path: Path) -> None:
        code, _, err = cli("shard", image_folder, tmp_path / "o", "--layout", "samples", "--no-progress")
        assert code == 0, err
        assert "layout: folder of samples (--layout samples)" in err


class TestSampleFolder:
    def test_files_grouped_by_key(self, cli, tmp_path: Path) -> None:
        src = tmp_path / "src"
        (src / "part").mkdir(parents=True)
        for i in range(3):
            (src / "part" / f"{i:04d}.txt").write_text(f"caption {i}")
            (src / "part" / f"{i:04d}.seg.png").write_bytes(b"PNG%d" % i)
        (src / "part" / "0001.json").write_text('{"a": 1}')
        (src / ".hidden").write_text("ignored")
        code, out, err = cli("shard", src, tmp_path / "out" / "s-%03d.tar", "--no-progress")
        assert code == 0, err
        assert summary(out) == (3, 1, f"{tmp_path}/out/s-000.tar")
        assert tar_names(tmp_path / "out" / "s-000.tar") == [
            "part/0000.seg.png", "part/0000.txt",
            "part/0001.json", "part/0001.seg.png", "part/0001.txt",
            "part/0002.seg.png", "part/0002.txt",
        ]
        with tarfile.open(tmp_path / "out" / "s-000.tar") as tar:
            assert tar.extractfile("part/0001.json").read() == b'{"a": 1}'

    def test_layout_samples_for_images_in_folders(self, cli, image_folder: Path, tmp_path: Path) -> None:
        code, _, err = cli("shard", image_folder, tmp_path / "o", "--layout", "samples", "--no-progress")
        assert code == 0, err
        names = tar_names(tmp_path / "o" / "shard-000000.tar")
        assert len(names) == 13 and not any(n.endswith(".cls") for n in names)

    def test_file_without_extension(self, cli, tmp_path: Path) -> None:
        src = tmp_path / "src"
        src.mkdir()
        (src / "README").write_text("x")
        code, out, err = cli("shard", src, tmp_path / "out")
        assert code == 2 and out == ""
        assert err.startswith("pipekit shard: error: 'README' in ") and "no extension" in err


SPEC_MODULE = '''
import numpy as np
import torch
from pipekit.pipes import IterableWrapper


def samples():
    return IterableWrapper([{"__key__": f"k{i:03d}", "npy": np.full(4, i), "cls": i, "png": torch.full((3, 2, 2), i,
                            dtype=torch.uint8)} for i in range(7)])


def generator():
    for i in range(3):
        yield {"__key__": f"g{i}", "json": {"i": i}}


def broken():
    return [{"__key__": "b0", "png": np.zeros((2, 2), dtype=np.int64)}]


def nothing():
    return iter([])


def broken_late():
    for i in range(5):
        yield {"__key__": f"l{i}", "cls": i}
    yield {"__key__": "bad", "png": np.zeros((2, 2), dtype=np.int64)}


NOT_ITERABLE = 3
'''


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "make_samples.py"
    path.write_text(SPEC_MODULE)
    return path


class TestPipeSpec:
    def test_file_spec(self, cli, spec_file: Path, tmp_path: Path) -> None:
        code, out, err = cli("shard", f"{spec_file}:samples", tmp_path / "out" / "p-%02d.tar", "--maxcount", "3")
        assert code == 0, err
        assert summary(out) == (7, 3, f"{tmp_path}/out/p-{{00..02}}.tar")
        got = list(datasets.WebDataset(f"{tmp_path}/out/p-{{00..02}}.tar", train=False, batch_size=None))
        assert [s[".cls"] for s in got] == list(range(7))
        assert all(np.array_equal(s[".npy"], np.full(4, s[".cls"])) for s in got)
        assert all(torch.equal(s[".png"], torch.full((3, 2, 2), s[".cls"], dtype=torch.uint8)) for s in got)
        assert "7/7" in err  # the pipe has a length: the bar shows it

    def test_module_spec_from_the_current_folder(self, cli, spec_file: Path, tmp_path: Path,
                                                 monkeypatch) -> None:
        monkeypatch.chdir(tmp_path)
        code, out, err = cli("shard", "make_samples:generator", "out", "--no-progress")
        assert code == 0, err
        assert summary(out) == (3, 1, "out/shard-000000.tar")
        assert tar_names(tmp_path / "out" / "shard-000000.tar") == ["g0.json", "g1.json", "g2.json"]

    def test_encoding_error_fails_and_leaves_no_shard(self, cli, spec_file: Path, tmp_path: Path) -> None:
        code, out, err = cli("shard", f"{spec_file}:broken", tmp_path / "out")
        assert code == 1 and out == ""
        assert "EncodeError: cannot encode 'b0.png' in ShardWriter: TypeError: image pixels" in err
        assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []

    @pytest.mark.parametrize(("spec", "message"), [
        ("{file}:missing", "has no attribute 'missing'"),
        ("{file}:NOT_ITERABLE", "must return an iterable of sample dicts"),
        ("{tmp}/nowhere.py:f", "no such file"),
        ("no_such_module_xyz:f", "cannot import 'no_such_module_xyz'"),
    ])
    def test_bad_specs(self, cli, spec_file: Path, tmp_path: Path, spec: str, message: str) -> None:
        code, out, err = cli("shard", spec.format(file=spec_file, tmp=tmp_path), tmp_path / "out")
        assert code == 2 and out == ""
        assert err.startswith("pipekit shard: error: ") and "\n" not in err.strip()
        assert message in err

    def test_a_pipe_yielding_nothing_fails_and_writes_nothing(self, cli, spec_file: Path, tmp_path: Path) -> None:
        code, out, err = cli("shard", f"{spec_file}:nothing", tmp_path / "out", "--no-progress")
        assert code == 2 and out == ""
        assert f"{spec_file}:nothing gave no sample; no shard written" in err
        assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []

    def test_shuffle_is_for_folders(self, cli, spec_file: Path, tmp_path: Path) -> None:
        code, _, err = cli("shard", f"{spec_file}:samples", tmp_path / "out", "--shuffle")
        assert code == 2 and "--shuffle applies to folders" in err


class TestDestination:
    def test_existing_shards_need_overwrite(self, cli, image_folder: Path, tmp_path: Path) -> None:
        assert cli("shard", image_folder, tmp_path / "o", "--no-progress")[0] == 0
        code, out, err = cli("shard", image_folder, tmp_path / "o", "--no-progress")
        assert code == 2 and out == ""
        assert "already exists; pass --overwrite" in err
        code, _, err = cli("shard", image_folder, tmp_path / "o", "--no-progress", "--overwrite")
        assert code == 0, err

    def test_overwrite_with_fewer_shards_removes_the_stale_ones(self, cli, image_folder: Path,
                                                                tmp_path: Path) -> None:
        dst = tmp_path / "o"
        assert cli("shard", image_folder, dst, "--no-progress", "--maxcount", "5")[0] == 0
        assert len(os.listdir(dst)) == 3
        (dst / "notes.txt").write_text("kept")  # not a shard of the pattern
        code, out, err = cli("shard", image_folder, dst, "--no-progress", "--overwrite", "--maxcount", "20")
        assert code == 0, err
        assert summary(out)[:2] == (13, 1)
        assert sorted(os.listdir(dst)) == ["notes.txt", "shard-000000.tar"]
        assert f"removed 2 shard(s) of an earlier run that this run did not replace: {dst}/shard-000001.tar, " \
               f"{dst}/shard-000002.tar" in err
        keys = all_keys(dst)
        assert len(keys) == len(set(keys)) == 13

    def test_overwrite_removes_the_temporary_files_of_a_killed_run(self, cli, image_folder: Path,
                                                                   tmp_path: Path) -> None:
        dst = tmp_path / "o"
        assert cli("shard", image_folder, dst, "--no-progress", "--maxcount", "3")[0] == 0  # shards 0 to 4
        (dst / "shard-000004.tar").unlink()
        killed = dst / f".shard-000004.tar.tmp-{'0a' * 16}"  # as if killed while writing shard 4
        killed.write_bytes(b"half a shard")
        other = dst / f".other-000004.tar.tmp-{'0a' * 16}"  # not of this pattern
        other.write_bytes(b"x")
        code, _, err = cli("shard", image_folder, dst, "--no-progress")
        assert code == 2 and killed.exists()  # only --overwrite removes anything
        code, _, err = cli("shard", image_folder, dst, "--no-progress", "--overwrite")
        assert code == 0, err
        assert "removed 3 shard(s) of an earlier run that this run did not replace" in err
        assert f"removed 1 temporary file(s) of an interrupted run: {killed}" in err
        assert sorted(os.listdir(dst)) == [other.name, "shard-000000.tar"]

    def test_a_later_existing_shard_is_never_replaced_without_overwrite(self, cli, image_folder: Path,
                                                                         tmp_path: Path) -> None:
        dst = tmp_path / "o"
        assert cli("shard", image_folder, dst, "--no-progress", "--maxcount", "5", "--start-shard", "1")[0] == 0
        before = {n: (dst / n).read_bytes() for n in os.listdir(dst)}
        code, out, err = cli("shard", image_folder, dst, "--no-progress", "--maxcount", "5")
        assert code == 2 and out == ""
        assert f"'{dst}/shard-000001.tar' already exists; pass --overwrite" in err
        assert f"1 shard(s) with 5 sample(s) were finished before the error and stay: {dst}/shard-000000.tar" in err
        assert {n: (dst / n).read_bytes() for n in os.listdir(dst) if n != "shard-000000.tar"} == before

    def test_jobs_writing_disjoint_ranges_of_one_pattern(self, cli, image_folder: Path, tmp_path: Path) -> None:
        dst = tmp_path / "o"
        assert cli("shard", image_folder, dst, "--no-progress", "--maxcount", "7", "--start-shard", "5")[0] == 0
        code, _, err = cli("shard", image_folder, dst, "--no-progress", "--maxcount", "7")  # shards 0 and 1
        assert code == 0, err
        assert "follow the ones this run wrote" not in err  # 5 and 6 are past a gap
        assert sorted(os.listdir(dst)) == [f"shard-00000{i}.tar" for i in (0, 1, 5, 6)]
        code, _, err = cli("shard", image_folder, dst, "--no-progress", "--maxcount", "20", "--overwrite")
        assert code == 0, err
        assert f"removed 1 shard(s) of an earlier run that this run did not replace: {dst}/shard-000001.tar\n" in err
        assert sorted(os.listdir(dst)) == [f"shard-00000{i}.tar" for i in (0, 5, 6)]  # the other job's stay

    def test_a_shorter_run_names_the_shards_that_follow_it(self, cli, image_folder: Path, tmp_path: Path) -> None:
        dst = tmp_path / "o"
        assert cli("shard", image_folder, dst, "--no-progress", "--maxcount", "5", "--start-shard", "1")[0] == 0
        before = {n: (dst / n).read_bytes() for n in os.listdir(dst)}
        code, _, err = cli("shard", image_folder, dst, "--no-progress", "--maxcount", "20")  # shard 0 only
        assert code == 0, err
        assert f"3 shard(s) of the pattern follow the ones this run wrote, from another run: {dst}/shard-000001.tar, " \
               f"{dst}/shard-000002.tar, {dst}/shard-000003.tar; readers" in err
        assert {n: (dst / n).read_bytes() for n in os.listdir(dst) if n != "shard-000000.tar"} == before

    def test_shards_before_the_start_are_kept(self, cli, image_folder: Path, tmp_path: Path) -> None:
        dst = tmp_path / "o"
        assert cli("shard", image_folder, dst, "--no-progress")[0] == 0
        code, _, err = cli("shard", image_folder, dst, "--no-progress", "--start-shard", "1")
        assert code == 0, err  # appending after the existing shards
        code, _, err = cli("shard", image_folder, dst, "--no-progress", "--start-shard", "1", "--overwrite",
                           "--maxcount", "20")
        assert code == 0, err
        assert "removed" not in err
        assert sorted(os.listdir(dst)) == ["shard-000000.tar", "shard-000001.tar"]

    def test_a_failure_says_which_shards_were_finished(self, cli, spec_file: Path, tmp_path: Path) -> None:
        code, out, err = cli("shard", f"{spec_file}:broken_late", tmp_path / "out", "--maxcount", "2",
                             "--no-progress")
        assert code == 1 and out == ""
        assert "EncodeError: cannot encode 'bad.png'" in err
        finished = [f"{tmp_path}/out/shard-00000{i}.tar" for i in range(2)]
        assert sorted(str(p) for p in (tmp_path / "out").iterdir()) == finished
        assert f"2 shard(s) with 4 sample(s) were finished before the error and stay: " \
               f"{tmp_path}/out/shard-{{000000..000001}}.tar" in err

    def test_single_file_destination_is_refused(self, cli, image_folder: Path, tmp_path: Path) -> None:
        code, _, err = cli("shard", image_folder, tmp_path / "train.tar")
        assert code == 2 and "names one file" in err and "train-%06d.tar" in err

    def test_bad_pattern(self, cli, image_folder: Path, tmp_path: Path) -> None:
        code, _, err = cli("shard", image_folder, tmp_path / "s-%d-%d.tar")
        assert code == 2 and "%d-style field" in err

    def test_start_shard_maxsize_and_gz(self, cli, image_folder: Path, tmp_path: Path) -> None:
        code, out, err = cli("shard", image_folder, tmp_path / "s-%04d.tar.gz", "--start-shard", "7",
                             "--maxsize", "2k", "--no-progress")
        assert code == 0, err
        total, shards, pattern = summary(out)
        assert total == 13 and shards > 1 and pattern == f"{tmp_path}/s-{{0007..{6 + shards:04d}}}.tar.gz"
        with open(tmp_path / "s-0007.tar.gz", "rb") as f:
            assert f.read(2) == b"\x1f\x8b"

    def test_missing_source(self, cli, tmp_path: Path) -> None:
        code, out, err = cli("shard", tmp_path / "nowhere", tmp_path / "out")
        assert code == 2 and out == ""
        assert err.strip() == f"pipekit shard: error: no such file or directory: '{tmp_path / 'nowhere'}'"

    @pytest.mark.parametrize("value", ["0", "-1", "lots", "5XB"])
    def test_bad_sizes(self, cli, tmp_path: Path, value: str) -> None:
        code, _, err = cli("shard", tmp_path, tmp_path / "out", "--maxsize", value)
        assert code == 2 and "--maxsize" in err


@pytest.mark.s3
class TestS3:
    def test_image_folder_from_and_to_s3(self, cli, image_folder: Path, s3_server: Any, s3_bucket: str) -> None:
        fs = s3_server.fs()
        fs.put(str(image_folder), f"{s3_bucket}/imgs", recursive=True)
        fs.invalidate_cache()
        dst = f"s3://{s3_bucket}/shards/train-%06d.tar"
        code, out, err = cli("shard", f"s3://{s3_bucket}/imgs", dst, "--maxcount", "8", "--no-progress",
                             *s3_options(s3_server))
        assert code == 0, err
        assert summary(out) == (13, 2, f"s3://{s3_bucket}/shards/train-{{000000..000001}}.tar")
        fs.invalidate_cache()
        assert sorted(fs.ls(f"{s3_bucket}/shards", detail=False)) == [
            f"{s3_bucket}/shards/train-00000{i}.tar" for i in range(2)]
        got = list(datasets.WebDataset(summary(out)[2], train=False, batch_size=None, decode=False,
                                       storage_options=s3_server.storage_options))
        files = image_files(image_folder)
        assert sorted(s["__key__"].split(".tar/", 1)[1] for s in got) == sorted(files)
        for s in got:
            data, _ = files[s["__key__"].split(".tar/", 1)[1]]
            assert s.get(".jpg", s.get(".png")) == data

        code, _, err = cli("shard", f"s3://{s3_bucket}/imgs", dst, "--no-progress", *s3_options(s3_server))
        assert code == 2 and "already exist" in err and "--overwrite" in err
        code, out, err = cli("shard", f"s3://{s3_bucket}/imgs", dst, "--no-progress", "--overwrite",
                             *s3_options(s3_server))
        assert code == 0, err
        assert f"removed 1 shard(s) of an earlier run that this run did not replace: s3://{s3_bucket}/shards/" \
               "train-000001.tar" in err
        fs.invalidate_cache()
        assert fs.ls(f"{s3_bucket}/shards", detail=False) == [f"{s3_bucket}/shards/train-000000.tar"]


class TestHelpers:
    def test_parse_size(self) -> None:
        assert parse_size("3e9") == 3e9
        assert parse_size("1.5GB") == 1.5e9
        assert parse_size("2MiB") == 2 * 2**20
        assert parse_size("10 kb") == 10_000
        assert parse_size("512") == 512

    def test_brace_pattern(self) -> None:
        assert brace_pattern("a/s-%06d.tar", 0, 3) == "a/s-{000000..000003}.tar"
        assert brace_pattern("s-%d.tar", 8, 12) == "s-{8..12}.tar"
        assert brace_pattern("s-%5d.tar", 0, 1) == "s-    0.tar ... s-    1.tar"
        assert brace_pattern("s-%03d.tar", 4, 4) == "s-004.tar"
        assert brace_pattern("s-%02d.tar", 5, 100) == "s-05.tar ... s-100.tar"

    def test_brace_pattern_expands_back_to_the_names(self) -> None:
        from pipekit.pipes._webdataset import shard_expand

        for pattern, first, last in (("s-%06d.tar", 0, 12), ("s-%d.tar", 3, 11), ("s-%02d.tar", 98, 100)):
            assert list(shard_expand(brace_pattern(pattern, first, last))) == [
                pattern % i for i in range(first, last + 1)]


class TestIndex:
    def test_index_gives_random_access_to_the_same_samples(self, cli, image_folder: Path, tmp_path: Path) -> None:
        dst = tmp_path / "o"
        code, out, err = cli("shard", image_folder, dst, "--no-progress", "--maxcount", "5", "--index")
        assert code == 0, err
        pattern = summary(out)[2]
        assert sorted(os.listdir(dst)) == sorted(f"shard-00000{i}.tar{x}" for i in range(3) for x in ("", ".idx.json"))
        streamed = list(datasets.WebDataset(pattern, train=False, batch_size=None, decode=False))
        indexed = datasets.IndexedShards(pattern)
        assert [indexed[i] for i in range(len(indexed))] == streamed
        code, out, err = cli("shard", image_folder, dst, "--no-progress", "--overwrite", "--maxcount", "20",
                             "--index")
        assert code == 0, err
        assert sorted(os.listdir(dst)) == ["shard-000000.tar", "shard-000000.tar.idx.json"]
        assert f"removed 2 index(es) of those shards: {dst}/shard-000001.tar.idx.json" in err
        assert len(datasets.IndexedShards(str(dst))) == 13

    def test_index_needs_uncompressed_shards(self, cli, image_folder: Path, tmp_path: Path) -> None:
        code, _, err = cli("shard", image_folder, tmp_path / "s-%03d.tar.gz", "--no-progress", "--index")
        assert code == 2 and "--index needs uncompressed shards" in err
