"""examples/lightning_segmentation.py runs end to end with tiny settings, and resumes from its last checkpoint."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

pytest.importorskip("lightning")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lightning_segmentation.py"


def load():
    spec = importlib.util.spec_from_file_location("pipekit_example_lightning_segmentation", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # writes a small raster corpus and trains for a few steps: ~10 s
@pytest.mark.filterwarnings("ignore")
def test_lightning_segmentation_trains_and_resumes(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PIPEKIT_CACHE", str(tmp_path / "cache"))
    example = load()
    small = ["--scene-size", "128", "--patch", "16", "--batch-size", "4", "--epoch-patches", "12",
             "--val-batches", "1", "--checkpoints", str(tmp_path / "ckpt")]
    assert example.main([*small, "--steps", "5"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"5 steps in [\d.]+ s, train loss [\d.]+, val loss [\d.]+, val pixel accuracy [\d.]+%", out)
    assert "(regions; seed 0)" in out and (tmp_path / "ckpt" / "last.ckpt").exists()
    assert example.main([*small, "--steps", "7", "--resume", "last"]) == 0
    assert re.search(r"^7 steps in", capsys.readouterr().out, re.M)
