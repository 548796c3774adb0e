"""Normalize (pipekit.transforms._normalize) against numpy."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from pipekit.transforms import Normalize, normalize

CUDA = torch.cuda.is_available()
MEAN = [120.0, 3000.5, -7.0, 0.25, 55.0]
STD = [10.0, 1500.0, 3.5, 0.125, 0.7]


def np_normalize(x: np.ndarray, mean, std) -> np.ndarray:
    shape = (-1, 1, 1)
    return (x.astype(np.float64) - np.asarray(mean).reshape(shape)) / np.asarray(std).reshape(shape)


@pytest.fixture
def images():
    g = torch.Generator().manual_seed(0)
    return {
        torch.uint8: torch.randint(0, 256, (5, 6, 7), generator=g, dtype=torch.uint8),
        torch.int16: torch.randint(-3000, 3000, (5, 6, 7), generator=g).to(torch.int16),
        torch.uint16: torch.randint(0, 65536, (5, 6, 7), generator=g).to(torch.uint16),
        torch.float32: torch.randn(5, 6, 7, generator=g) * 100,
        torch.float64: torch.randn(5, 6, 7, generator=g, dtype=torch.float64) * 100,
        torch.float16: (torch.randn(5, 6, 7, generator=g) * 10).half(),
        torch.bfloat16: (torch.randn(5, 6, 7, generator=g) * 10).bfloat16(),
    }


class TestNormalize:
    @pytest.mark.parametrize(
        "dtype", [torch.uint8, torch.int16, torch.uint16, torch.float32, torch.float64, torch.float16, torch.bfloat16]
    )
    def test_matches_numpy(self, images, dtype):
        x = images[dtype]
        out = Normalize(MEAN, STD)(x)
        expected_dtype = dtype if dtype.is_floating_point else torch.float32
        assert out.dtype == expected_dtype
        ref = np_normalize(x.double().numpy(), MEAN, STD)
        tol = {torch.float16: 5e-3, torch.bfloat16: 3e-2, torch.float64: 1e-12}.get(expected_dtype, 1e-5)
        np.testing.assert_allclose(out.double().numpy(), ref, rtol=tol, atol=tol * np.abs(ref).max())

    @pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
    def test_output_dtype(self, images, dtype):
        out = Normalize(MEAN, STD, dtype=dtype)(images[torch.uint8])
        assert out.dtype == dtype
        ref = np_normalize(images[torch.uint8].numpy(), MEAN, STD)
        np.testing.assert_allclose(out.double().numpy(), ref, rtol=3e-2, atol=3e-2)

    def test_scalar_mean_and_std_apply_to_every_band(self, images):
        out = Normalize(100.0, 50.0)(images[torch.uint8])
        np.testing.assert_allclose(out.numpy(), (images[torch.uint8].numpy() - 100.0) / 50.0, rtol=1e-6, atol=1e-6)

    def test_batches_samples_and_keys(self, images):
        x = torch.stack([images[torch.uint8], images[torch.uint8].flip(-1)])
        norm = Normalize(MEAN, STD)
        out = norm({"image": x, "mask": torch.ones(2, 6, 7), "id": ["a", "b"]})
        assert out["image"].shape == (2, 5, 6, 7)
        torch.testing.assert_close(out["image"][1], norm(x[1]))
        assert out["id"] == ["a", "b"] and torch.equal(out["mask"], torch.ones(2, 6, 7))
        custom = Normalize(MEAN, STD, key="x")({"x": x[0]})
        torch.testing.assert_close(custom["x"], norm(x[0]))

    def test_channels_last_is_kept(self, images):
        x = torch.stack([images[torch.uint8]] * 2).contiguous(memory_format=torch.channels_last)
        out = Normalize(MEAN, STD)(x)
        assert out.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(out, Normalize(MEAN, STD)(x.contiguous()))

    def test_inverse(self, images):
        norm = Normalize(MEAN, STD)
        x = images[torch.float64]
        torch.testing.assert_close(norm.inverse(norm(x)), x)
        back = norm.inverse({"image": norm(images[torch.uint16]), "k": 1})
        assert back["k"] == 1
        torch.testing.assert_close(back["image"].round().to(torch.uint16), images[torch.uint16])

    def test_unfused_fallback_gives_the_same_values(self, images, monkeypatch):
        x = images[torch.uint16]
        fused = Normalize(MEAN, STD)(x)

        def refuse(*args, **kwargs):
            raise RuntimeError("no mixed-dtype kernel")

        monkeypatch.setattr(normalize.torch, "addcmul", refuse)
        torch.testing.assert_close(Normalize(MEAN, STD)(x), fused)

    @pytest.mark.skipif(not CUDA, reason="needs CUDA")
    @pytest.mark.parametrize("dtype", [torch.uint8, torch.uint16, torch.float16])
    def test_cuda_matches_cpu(self, images, dtype):
        norm = Normalize(MEAN, STD)
        gpu = norm(images[dtype].cuda())
        assert gpu.device.type == "cuda"
        torch.testing.assert_close(gpu.cpu(), norm(images[dtype]))

    def test_pickles_without_device_caches(self, images):
        norm = Normalize(MEAN, STD)
        norm(images[torch.uint8])
        assert norm._cache
        copy = pickle.loads(pickle.dumps(norm))
        assert copy._cache == {}
        torch.testing.assert_close(copy(images[torch.uint8]), norm(images[torch.uint8]))
        assert norm.to("cpu") is norm


class TestErrors:
    def test_std_must_be_positive_and_finite(self):
        with pytest.raises(ValueError, match="std must be positive"):
            Normalize([0.0, 1.0], [1.0, 0.0])
        with pytest.raises(ValueError, match="mean must be finite"):
            Normalize([float("nan")], [1.0])
        with pytest.raises(TypeError, match="must hold numbers"):
            Normalize(["a"], [1.0])
        with pytest.raises(ValueError, match="is empty"):
            Normalize([], [1.0])

    def test_band_count(self, images):
        with pytest.raises(ValueError, match="mean has 2 values but std has 3"):
            Normalize([1, 2], [1, 2, 3])
        with pytest.raises(ValueError, match="mean/std have 2 values but the image has 5 bands"):
            Normalize([1, 2], [1, 2])(images[torch.uint8])

    def test_inputs(self):
        with pytest.raises(TypeError, match="dtype must be a floating point type"):
            Normalize(0, 1, dtype=torch.int32)
        with pytest.raises(ValueError, match="band axis at -3"):
            Normalize(0, 1)(torch.ones(4, 4))
        with pytest.raises(KeyError, match="has no 'image' entry"):
            Normalize(0, 1)({"x": torch.ones(1, 2, 2)})
        with pytest.raises(TypeError, match="expects a sample dict or an image tensor"):
            Normalize(0, 1)("image")
        with pytest.raises(TypeError, match="unsupported image dtype"):
            Normalize(0, 1)(torch.ones(1, 2, 2, dtype=torch.bool))
