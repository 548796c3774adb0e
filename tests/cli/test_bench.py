"""``pipekit bench``: a recipe's throughput and the own time of every pipe of its chain."""

from __future__ import annotations

import json
import re

import pytest

from pipekit import datasets
from pipekit.pipes._resume import pipeline_pipes
from pipekit.profiling import stage_name


def stage_table(out: str) -> list[list[str]]:
    """The rows of the per-stage table (``#, stage, pipe, items, own s, share, ms/item[, mark]``)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("#  stage"))
    rows = []
    for line in lines[start + 2:]:
        if not line.strip():
            break
        rows.append(re.split(r"\s{2,}", line.strip()))
    return rows


def chain_names(recipe) -> list[str]:
    return [stage_name(dp) for dp in reversed(pipeline_pipes(recipe.pipe))]


class TestImageFolder:
    def test_stage_table_matches_the_chain(self, cli, image_folder):
        code, out, err = cli("bench", image_folder, "--batches", 3, "--batch-size", 2, "--size", 24, "--workers", 0)
        assert code == 0, err
        assert out.startswith(f"pipekit bench: imagefolder on {image_folder} (13 images in 4 classes), "
                              "batches of 2, 24x24 px")
        rows = stage_table(out)
        expected = chain_names(datasets.ImageFolder(image_folder, size=24, batch_size=2))
        assert [r[1] for r in rows] == expected
        assert expected[:4] == ["ListSource", "sharding_filter", "open_files_by_fsspec", "decode_image"]
        assert expected[-2:] == ["batch", "collate(collate)"]
        by_name = {r[1]: r for r in rows}
        assert by_name["decode_image"][3] == "6"  # 3 batches of 2 images after the warm-up batch
        assert by_name["batch"][3] == "3"
        assert sum(r[-1] == "<- slowest" for r in rows) == 1
        assert "in this process: 3 batches (6 samples) in " in out
        assert "with 0" not in out  # --workers 0: in this process only
        assert re.search(r"slowest stage: \S+ \(\d+% of the pipeline's own time, [\d.]+ ms per item\)", out)
        assert "1 torch thread(s)" in out

    def test_json(self, cli, image_folder):
        code, out, _ = cli("bench", image_folder, "--batches", 2, "--batch-size", 4, "--size", 16, "--workers", 0,
                           "--eval", "--json")
        assert code == 0
        report = json.loads(out)
        assert report["recipe"] == "imagefolder" and report["workers"] is None
        stages = report["in_process"]["stages"]
        assert [s["name"] for s in stages] == chain_names(
            datasets.ImageFolder(image_folder, train=False, size=16, batch_size=4))
        assert report["in_process"]["batches"] == 2 and report["in_process"]["samples"] == 8
        assert all(s["self_seconds"] >= 0 for s in stages)


    def test_threads_restored(self, cli, image_folder):
        import torch

        threads = torch.get_num_threads()
        code, out, _ = cli("bench", image_folder, "--batches", 1, "--batch-size", 2, "--size", 16, "--workers", 0,
                           "--threads", 3)
        assert code == 0 and "3 torch thread(s)" in out
        assert torch.get_num_threads() == threads


class TestWebDataset:
    def test_with_workers(self, cli, shards):
        code, out, err = cli("bench", shards, "--batches", 2, "--batch-size", 2, "--size", 16, "--workers", 2)
        assert code == 0, err
        assert out.startswith(f"pipekit bench: webdataset on {shards} (2 shards)")
        rows = stage_table(out)
        names = [r[1] for r in rows]
        assert names == chain_names(datasets.TarShards(str(shards), size=16, batch_size=2))
        assert {"load_tar_samples", "decode", "shuffle"} <= set(names)
        assert re.search(r"with 2 DataLoader worker\(s\): 2 batches \(4 samples\) in [\d.]+ s: ", out)


class TestGeo:
    def test_landsat_and_cdl_folder(self, cli, small_corpus):
        code, out, err = cli("bench", small_corpus, "--batches", 2, "--batch-size", 4, "--size", 32, "--workers", 0)
        assert code == 0, err
        assert out.startswith(f"pipekit bench: geo on {small_corpus} (landsat8 & cdl, ")
        names = [r[1] for r in stage_table(out)]
        assert names == ["GeoSamplerPipe", "sharding_filter", "read_geo", "append_index", "augment", "batch",
                         "collate(stack_samples)"]

    def test_images_without_labels(self, cli, small_corpus):
        code, out, err = cli("bench", small_corpus / "landsat8", "--batches", 1, "--batch-size", 2, "--size", 16,
                             "--workers", 0)
        assert code == 0, err
        assert "(landsat8 only: no label product found)" in out
        assert [r[1] for r in stage_table(out)] == ["GeoSamplerPipe", "sharding_filter", "read_geo", "batch",
                                                    "collate(stack_samples)"]

    def test_built_in_data(self, cli, demo_cache):
        code, out, err = cli("bench", "geo", "--cache", demo_cache, "--batches", 1, "--batch-size", 2,
                             "--size", 16, "--workers", 0)
        assert code == 0, err
        assert out.startswith(f"pipekit bench: geo on {demo_cache / 'landsat-cdl-v1'} (landsat8 & cdl")


class TestBadInput:
    def test_recipe_contradiction(self, cli):
        code, _, err = cli("bench", "geo", "--recipe", "webdataset")
        assert code == 2 and "contradicts" in err and "\n" not in err.strip()

    def test_nothing_to_bench(self, cli, tmp_path):
        (tmp_path / "a.txt").write_text("x")
        code, _, err = cli("bench", tmp_path, "--workers", 0)
        assert code == 2 and "cannot tell which recipe fits" in err

    def test_wrong_recipe_for_the_data(self, cli, shards):
        code, _, err = cli("bench", shards, "--recipe", "imagefolder", "--workers", 0)
        assert code == 2
        assert err.startswith(f"pipekit bench: error: cannot build the imagefolder recipe on '{shards}': ")
        assert "\n" not in err.strip()

    @pytest.mark.parametrize("option", ["--batches", "--batch-size", "--size"])
    def test_non_positive(self, cli, option):
        code, _, err = cli("bench", "geo", option, "0")
        assert code == 2 and option in err
