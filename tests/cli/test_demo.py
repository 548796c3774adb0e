"""``pipekit demo``: the synthetic corpus is written on first run, a model trains, the loss falls."""

from __future__ import annotations

import re

import pytest
import torch

from pipekit.cli._demo import DEMO_CLASSES, TinyUNet


def losses(out: str) -> tuple[float, float]:
    match = re.search(r"loss (fell|did not fall) from ([\d.]+) to ([\d.]+)", out)
    assert match, out
    return float(match.group(2)), float(match.group(3))


class TestDemo:
    def test_first_run_writes_the_corpus_then_trains(self, cli, tmp_path):
        cache = tmp_path / "cache"
        threads = torch.get_num_threads()
        code, out, err = cli("demo", "--steps", 3, "--workers", 0, "--size", 64, "--cache", cache, "--no-progress",
                             "--threads", 1)
        assert code == 0, err
        corpus = cache / "landsat-cdl-v1"
        assert (corpus / ".complete").exists()
        assert len(list((corpus / "landsat8").rglob("LC08_L2SP_*_SR_B4.TIF"))) == 2
        assert (corpus / "cdl" / "2023_30m_cdls.tif").exists()
        assert out.startswith(f"pipekit demo: synthetic Landsat 8 & CDL corpus in {corpus}\n")
        assert ("  pipeline: GeoSamplerPipe -> sharding_filter -> read_geo -> append_index -> augment -> batch -> "
                "collate(stack_samples)") in out
        assert "channels SR_B2, SR_B3, SR_B4, SR_B5, SR_B6, SR_B7, ndvi" in out
        assert "reprojected from EPSG:5070 to EPSG:32615" in out
        assert "DeviceLoader(cpu, normalize on the device)" in out
        assert f"7 channels -> {len(DEMO_CLASSES)} classes (background + Corn, Soybeans" in out
        assert re.search(r"^step 1: loss [\d.]+$", out, flags=re.M)
        assert re.search(r"^step 3: loss [\d.]+ \(mean of the last 3 steps: [\d.]+\)$", out, flags=re.M)
        assert re.search(r"^throughput: [\d.]+ samples/s \(32 samples of 7x64x64 in [\d.]+ s, 0 workers, cpu\)$",
                         out, flags=re.M)
        assert torch.get_num_threads() == threads  # restored

    def test_loss_falls(self, cli, demo_cache):
        code, out, err = cli("demo", "--steps", 25, "--workers", 0, "--size", 32, "--batch-size", 8,
                             "--cache", demo_cache, "--no-progress", "--threads", 1)
        assert code == 0, err
        first, last = losses(out)
        assert "loss fell from" in out
        assert last < 0.6 * first
        accuracy = float(re.search(r"pixel accuracy on the last 5 batches: ([\d.]+)%", out).group(1))
        assert accuracy > 50.0  # 7 classes: chance is ~14%

    def test_with_workers(self, cli, demo_cache):
        code, out, err = cli("demo", "--steps", 4, "--workers", 2, "--size", 32, "--batch-size", 4,
                             "--cache", demo_cache, "--no-progress", "--threads", 1)
        assert code == 0, err
        assert "pipekit.DataLoader(2 workers)" in out
        assert re.search(r"\(12 samples of 7x32x32 in [\d.]+ s, 2 workers, cpu\)", out)

    def test_progress_bar_goes_to_stderr(self, cli, demo_cache):
        code, out, err = cli("demo", "--steps", 2, "--workers", 0, "--size", 32, "--batch-size", 2,
                             "--cache", demo_cache, "--threads", 1)
        assert code == 0
        assert "training" in err and "step 1: loss" in out


class TestBadInput:
    def test_size_must_be_a_multiple_of_4(self, cli, tmp_path):
        code, out, err = cli("demo", "--size", 30, "--cache", tmp_path)
        assert code == 2 and out == ""
        assert err.strip() == "pipekit demo: error: --size must be a multiple of 4 (the U-Net halves it twice), got 30"

    def test_patch_larger_than_the_scenes(self, cli, demo_cache):
        code, _, err = cli("demo", "--size", 4096, "--cache", demo_cache, "--workers", 0, "--no-progress")
        assert code == 2 and err.startswith("pipekit demo: error: cannot sample 4096x4096 patches: ")
        assert "\n" not in err.strip()

    @pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
    def test_cuda_without_a_gpu(self, cli, tmp_path):
        code, _, err = cli("demo", "--device", "cuda", "--cache", tmp_path)
        assert code == 2 and "no CUDA device is available" in err

    def test_bad_learning_rate(self, cli, tmp_path):
        code, _, err = cli("demo", "--lr", "-1", "--cache", tmp_path)
        assert code == 2 and "--lr must be positive" in err


def test_tiny_unet_shapes():
    model = TinyUNet(7, 8)
    out = model(torch.zeros(2, 7, 16, 24))
    assert out.shape == (2, 8, 16, 24)
