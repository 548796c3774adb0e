"""Smoke tests: every script in examples/ runs end to end with tiny settings.

Most run in-process through their ``main(argv)``; the S3 example and the
``torchrun`` one run as subprocesses, as a user would run them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from pipekit.synthetic import write_image_folder, write_image_shards

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DATA = Path(__file__).resolve().parents[1] / "data"
SCRIPTS = sorted(p.stem for p in EXAMPLES.glob("*.py"))


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"pipekit_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    """Synthetic data sets go to a fresh cache folder, not the user's."""
    monkeypatch.setenv("PIPEKIT_CACHE", str(tmp_path / "cache"))


def test_every_example_has_a_smoke_test():
    assert set(SCRIPTS) == {
        "train_classifier", "landsat_cdl_segmentation", "sentinel2_ndvi", "stream_from_s3",
        "resume_from_checkpoint", "distributed_torchrun",
        "stac_training",
        "lightning_segmentation",  # its smoke test: tests/datamodules/test_lightning_example.py
    }


@pytest.mark.parametrize("name", SCRIPTS)
def test_help_and_docstring(name, capsys):
    module = load(name)
    assert module.__doc__ and len(module.__doc__.split("\n\n")) >= 2
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage:") and module.__doc__.split("\n\n")[0].split()[0] in out


def test_train_classifier(capsys):
    code = load("train_classifier").main(
        ["--per-class", "4", "--image-size", "32", "--batch-size", "4", "--epochs", "2", "--workers", "1"])
    out = capsys.readouterr().out
    assert code == 0
    assert "4 classes, 16 images" in out
    epochs = re.findall(r"epoch (\d): train loss ([\d.]+), \d+ samples/s, val accuracy ([\d.]+)% \((\d+) images\)", out)
    assert [e[0] for e in epochs] == ["1", "2"]
    assert all(e[3] == "4" for e in epochs)  # every validation image evaluated once
    assert "final val accuracy" in out


def test_train_classifier_on_a_given_folder(tmp_path, capsys):
    root = write_image_folder(tmp_path / "mine", per_class=3, size=40, progress=False)
    code = load("train_classifier").main(["--data", str(root), "--image-size", "32", "--batch-size", "4",
                                          "--epochs", "1", "--workers", "0", "--max-steps", "1"])
    assert code == 0 and "(12 images)" in capsys.readouterr().out


def test_landsat_cdl_segmentation(capsys):
    code = load("landsat_cdl_segmentation").main(
        ["--scene-size", "256", "--scenes", "1", "--patch", "32", "--batch-size", "4", "--steps", "6",
         "--log-every", "3", "--eval-patches", "4", "--workers", "0"])
    out = capsys.readouterr().out
    assert code == 0
    assert "channels=['SR_B1', 'SR_B2', 'SR_B3', 'SR_B4', 'SR_B5', 'SR_B6', 'SR_B7', 'ndvi']" in out
    # datasets.CDL(classes=...) maps the codes to labels 0..7 (named from the CDL's classes)
    assert ("classes: ['Background', 'Corn', 'Soybeans', 'Winter Wheat', 'Open Water', 'Developed/Low Intensity', "
            "'Deciduous Forest', 'Grass/Pasture']") in out
    losses = [float(x) for x in re.findall(r"step +\d+ +loss ([\d.]+)", out)]
    assert len(losses) == 2 and all(x > 0 for x in losses)
    assert re.search(r"pixel accuracy [\d.]+%, mean IoU [\d.]+%", out)


def test_sentinel2_ndvi(tmp_path, capsys):
    out_png = tmp_path / "figs" / "ndvi.png"
    code = load("sentinel2_ndvi").main(["--size", "256", "--patch", "128", "--out", str(out_png)])
    out = capsys.readouterr().out
    assert code == 0
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out_png.stat().st_size > 10_000
    assert "4 patches of 128 x 128 px" in out and len(re.findall(r"patch +\d+ +mean NDVI", out)) == 4
    assert "5 band files" in out and "T15TWG_20230715T165849_B11_20m.tif" not in out.split("e.g.")[0]
    per_class = dict(re.findall(r"^  (\w[\w/ ]*?) +mean NDVI ([+-][\d.]+)$", out, re.MULTILINE))
    assert float(per_class["Corn"]) > 0.6 and float(per_class["Deciduous Forest"]) > 0.6
    if "Open Water" in per_class:
        assert float(per_class["Open Water"]) < 0


def test_resume_from_checkpoint(capsys):
    code = load("resume_from_checkpoint").main(
        ["--per-class", "4", "--image-size", "32", "--batch-size", "3", "--stop-after", "2", "--workers", "2"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "interrupted after 2 batches (6 samples" in out
    assert "check: 16 of 16 samples, 0 repeated, 0 lost, order identical" in out and "PASSED" in out


def test_resume_refuses_a_stop_past_the_epoch(capsys):
    with pytest.raises(SystemExit, match="must be less than"):
        load("resume_from_checkpoint").main(
            ["--per-class", "2", "--image-size", "32", "--batch-size", "4", "--stop-after", "5", "--workers", "0"])


def _run(cmd: list[str], cwd: Path | None = None, extra_env: dict[str, str] | None = None
         ) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=cwd)


@pytest.mark.distributed
def test_distributed_torchrun_reads_each_sample_once(tmp_path):
    root = write_image_folder(tmp_path / "data", per_class=5, size=40, progress=False)
    for path in sorted(root.rglob("*.jpg"))[::3]:  # 13 images left: rank 0 gets one more batch than rank 1
        path.unlink()
    out_dir = tmp_path / "seen"
    result = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                   str(EXAMPLES / "distributed_torchrun.py"), "--tiny", "--batch-size", "3",
                   "--data", str(root), "--out", str(out_dir)])
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count(": exactly once") == 2  # two epochs
    assert "rank 0: 7, rank 1: 6" in result.stdout
    files = [json.loads((out_dir / f"rank{r}.json").read_text())["files"] for r in range(2)]
    assert not set(files[0]) & set(files[1])
    assert sorted(files[0] + files[1]) == sorted(str(p) for p in root.rglob("*.jpg"))


def test_distributed_without_torchrun_explains(capsys):
    assert load("distributed_torchrun").main([]) == 2
    assert "torchrun" in capsys.readouterr().err


@pytest.mark.s3
def test_stream_from_s3(s3_server, tmp_path):
    bucket = s3_server.create_bucket()
    fs = s3_server.fs()
    for path in write_image_shards(tmp_path / "shards", shards=4, per_shard=8, size=72, progress=False):
        fs.put(str(path), f"{bucket}/shards/{path.name}")
    fs.put(str(DATA / "cogeo.tif"), f"{bucket}/cogs/cogeo.tif")
    # credentials from the environment, as the script documents
    result = _run([sys.executable, str(EXAMPLES / "stream_from_s3.py"), "--bucket", bucket,
                   "--endpoint-url", s3_server.endpoint_url, "--region", s3_server.region,
                   "--patch", "256", "--batch-size", "4", "--image-size", "32"],
                  cwd=tmp_path, extra_env={"AWS_ACCESS_KEY_ID": s3_server.key,
                                           "AWS_SECRET_ACCESS_KEY": s3_server.secret})
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "TarShards(4 shards, train, batch_size=4)" in out
    assert ".jpg (4, 3, 32, 32) torch.uint8" in out
    assert "32 samples (32 distinct) in 8 batches" in out
    assert "16 of 16 patches in 4 batches" in out
    assert f"done: 32 samples from tar shards and 16 patches from COGs on s3://{bucket}" in out


@pytest.mark.parametrize(("source", "workers"), [("catalog", "0"), ("geoparquet", "0"), ("api", "2")])
def test_stac_training(source, workers, capsys):
    code = load("stac_training").main(["--source", source, "--tile-size", "256", "--patch", "32", "--steps", "3",
                                        "--batch-size", "4", "--workers", workers])
    out = capsys.readouterr().out
    assert code == 0
    assert re.search(rf"{source}: 8 items in EPSG \[32631, 32632\] \(\d+ requests\), read in EPSG:32631", out)
    assert "trained on 12 patches of 32x32 px" in out and "nothing skipped" in out


@pytest.mark.s3
def test_stac_training_on_s3(s3_server, s3_bucket, capsys):
    so = s3_server.storage_options
    code = load("stac_training").main(["--bucket", s3_bucket, "--endpoint-url", so["client_kwargs"]["endpoint_url"],
                                        "--key", so["key"], "--secret", so["secret"], "--tile-size", "256",
                                        "--patch", "32", "--steps", "2", "--batch-size", "4", "--workers", "0"])
    out = capsys.readouterr().out
    assert code == 0 and "catalog: 8 items" in out and "trained on 8 patches" in out
