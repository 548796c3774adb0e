"""``pipekit preview``: a raster sample drawn to a PNG (RGB stretch, CDL mask with its colours, an index)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from pipekit.datasets import CDL

from .conftest import s3_options

CORN = CDL.cmap[1][:3]
SOYBEANS = CDL.cmap[5][:3]
GRASS = CDL.cmap[176][:3]  # ordinal label 83: drawn in code 176's colour, not code 83's (water)


def png(path) -> np.ndarray:
    with Image.open(path) as img:
        assert img.format == "PNG"
        return np.asarray(img.convert("RGB"))


def has_colour(pixels: np.ndarray, rgb) -> bool:
    return bool((pixels == np.asarray(rgb, dtype=np.uint8)).all(axis=-1).any())


class TestCorpus:
    def test_rgb_index_and_mask(self, cli, small_corpus, tmp_path):
        out = tmp_path / "sample.png"
        code, stdout, err = cli("preview", small_corpus, "--out", out, "--size", 64)
        assert code == 0, err
        assert stdout.startswith(f"wrote {out}: RGB (SR_B4, SR_B3, SR_B2) + ndvi + cdl mask; 64x64 px of "
                                 "(Landsat8 & CDL) at (")
        assert "in EPSG:32615, 2023-07-15" in stdout
        pixels = png(out)
        assert pixels.shape[1] > 2.5 * pixels.shape[0]  # three panels side by side
        assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 500  # a stretched image, not a blank canvas
        # the mask is drawn in USDA's colours (corn and soybeans are the commonest synthetic classes)
        assert has_colour(pixels, CORN) and has_colour(pixels, SOYBEANS)

    def test_same_seed_same_picture(self, cli, small_corpus, tmp_path):
        paths = [tmp_path / f"{name}.png" for name in ("a", "b", "c")]
        for path, seed in zip(paths, (3, 3, 4)):
            code, _, err = cli("preview", small_corpus, "--out", path, "--size", 32, "--seed", seed)
            assert code == 0, err
        a, b, c = (png(p) for p in paths)
        assert np.array_equal(a, b)
        assert a.shape != c.shape or not np.array_equal(a, c)

    def test_no_index(self, cli, small_corpus, tmp_path):
        with_index, without = tmp_path / "with.png", tmp_path / "without.png"
        assert cli("preview", small_corpus, "--out", with_index, "--size", 32)[0] == 0
        code, stdout, _ = cli("preview", small_corpus, "--out", without, "--size", 32, "--index", "none")
        assert code == 0
        assert ": RGB (SR_B4, SR_B3, SR_B2) + cdl mask;" in stdout
        assert png(without).shape[1] < png(with_index).shape[1]

    def test_another_index(self, cli, small_corpus, tmp_path):
        code, stdout, err = cli("preview", small_corpus, "--out", tmp_path / "x.png", "--size", 32, "--index", "NDWI")
        assert code == 0, err
        assert "+ ndwi +" in stdout

    def test_mask_alone(self, cli, small_corpus, tmp_path):
        out = tmp_path / "cdl.png"
        code, stdout, err = cli("preview", small_corpus, "--out", out, "--size", 32, "--product", "cdl")
        assert code == 0, err
        assert f"wrote {out}: cdl mask; 32x32 px of CDL" in stdout
        assert has_colour(png(out), CORN)

    def test_mask_colours_are_those_of_the_codes(self, cli, small_corpus, tmp_path):
        out = tmp_path / "cdl.png"
        code, _, err = cli("preview", small_corpus, "--out", out, "--size", 128, "--product", "cdl")
        assert code == 0, err
        pixels = png(out)
        assert has_colour(pixels, CORN) and has_colour(pixels, GRASS)
        assert not has_colour(pixels, CDL.cmap[83][:3])  # code 83 (water) is not in the synthetic corpus

    def test_explicit_mask_folder(self, cli, small_corpus, tmp_path):
        code, stdout, err = cli("preview", small_corpus / "landsat8", "--mask", small_corpus / "cdl",
                                "--out", tmp_path / "x.png", "--size", 32)
        assert code == 0, err
        assert "+ ndvi + cdl mask; 32x32 px of (Landsat8 & CDL)" in stdout

    def test_patch_larger_than_the_scene_is_shrunk(self, cli, small_corpus, tmp_path):
        code, stdout, _ = cli("preview", small_corpus / "landsat8", "--out", tmp_path / "x.png", "--size", 1000)
        assert code == 0
        assert "256x256 px of Landsat8" in stdout
        assert stdout.strip().splitlines()[-1] == "note: patch shrunk to 256 px, the largest that fits a footprint"


class TestOtherRasters:
    def test_generic_single_band_raster(self, cli, rasters, tmp_path):
        out = tmp_path / "dem.png"
        code, stdout, err = cli("preview", rasters / "dem", "--out", out, "--size", 16)
        assert code == 0, err
        assert stdout.startswith(f"wrote {out}: band 1; 16x16 px of Raster")
        assert png(out).shape[1] < 1.5 * png(out).shape[0]  # one panel

    def test_generic_mask_beside_a_product(self, cli, small_corpus, tmp_path):
        import rasterio
        from rasterio.transform import from_origin

        labels = tmp_path / "labels"
        labels.mkdir()
        classes = np.repeat(np.arange(256, dtype=np.uint8)[None, :] // 64 + 1, 256, axis=0)[None]  # 4 stripes
        with rasterio.open(labels / "fields.tif", "w", driver="GTiff", width=256, height=256, count=1,
                           dtype="uint8", crs="EPSG:32615", transform=from_origin(420000, 4660000, 30, 30)) as dst:
            dst.write(classes)
        out = tmp_path / "x.png"
        code, stdout, err = cli("preview", small_corpus / "landsat8", "--mask", labels, "--mask-product", "raster",
                                "--out", out, "--size", 64, "--index", "none")
        assert code == 0, err
        assert "RGB (SR_B4, SR_B3, SR_B2) + raster mask; 64x64 px of (Landsat8 & Mask)" in stdout
        code, _, err = cli("preview", small_corpus / "landsat8", "--mask", labels, "--out", out)
        assert code == 2 and "pass --mask-product raster" in err

    def test_missing_band_files_are_named(self, cli, rasters, tmp_path):
        # the fixture's Sentinel-2 scene has B04 only; RGB needs B02 and B03 too, B02 is looked for first
        code, _, err = cli("preview", rasters / "s2", "--out", tmp_path / "x.png", "--index", "none")
        assert code == 1
        assert "\n" not in err.strip()
        assert "band 'B02' of the scene of 'T15TVG_20210701T170859_B04_10m.tif' is missing" in err


class TestBadInput:
    @pytest.mark.parametrize(("args", "message"), [
        (["--index", "ndre"], "--index ndre needs the nir, vre1 bands; landsat8 has no vre1 band known to pipekit"),
        (["--index", "greenness"], "unknown index 'greenness'; known indices: "),
        (["--product", "sentinel2"], "no sentinel2 files (named like 'T*_*_**.*') in "),
    ])
    def test_errors(self, cli, small_corpus, tmp_path, args, message):
        code, out, err = cli("preview", small_corpus, "--out", tmp_path / "x.png", *args)
        assert code == 2 and out == ""
        assert err.startswith("pipekit preview: error: ") and message in err
        assert "\n" not in err.strip()

    def test_nothing_to_sample_says_why(self, cli, small_corpus, tmp_path, monkeypatch):
        # a sampler with nothing to draw yields nothing and keeps the reason: said, not an AssertionError
        class Empty:
            empty_reason = "the roi does not intersect any footprint"

            def __init__(self, *args, **kwargs):
                pass

            def __iter__(self):
                return iter(())

        import pipekit.geo

        monkeypatch.setattr(pipekit.geo, "RandomGeoSampler", Empty)  # imported where the command runs
        code, out, err = cli("preview", small_corpus, "--out", tmp_path / "x.png")
        assert code == 2 and out == "" and not (tmp_path / "x.png").exists()
        assert "nothing to preview: the roi does not intersect any footprint" in err

    def test_out_must_be_png_in_an_existing_folder(self, cli, small_corpus, tmp_path):
        code, _, err = cli("preview", small_corpus, "--out", tmp_path / "x.jpg")
        assert code == 2 and "--out must name a .png file" in err
        code, _, err = cli("preview", small_corpus, "--out", tmp_path / "no" / "x.png")
        assert code == 2 and "the folder of --out does not exist" in err

    def test_out_is_required(self, cli, small_corpus):
        code, _, err = cli("preview", small_corpus)
        assert code == 2 and "--out" in err and "\n" not in err.strip()

    def test_image_folder_is_not_a_raster(self, cli, image_folder, tmp_path):
        code, _, err = cli("preview", image_folder, "--out", tmp_path / "x.png")
        assert code == 2
        assert "no raster files" in err and "pipekit inspect" in err


@pytest.mark.s3
def test_preview_from_s3(cli, s3_server, small_corpus, tmp_path):
    bucket = s3_server.create_bucket()
    s3_server.fs().put(str(small_corpus), f"{bucket}/corpus", recursive=True)
    out = tmp_path / "s3.png"
    code, stdout, err = cli("preview", f"s3://{bucket}/corpus", "--out", out, "--size", 32, *s3_options(s3_server))
    assert code == 0, err
    assert "+ ndvi + cdl mask; 32x32 px of (Landsat8 & CDL)" in stdout
    local = tmp_path / "local.png"
    assert cli("preview", small_corpus, "--out", local, "--size", 32)[0] == 0
    assert np.array_equal(png(out), png(local))
