"""The pure kernels of pipekit.transforms.functional, and that the sample and batch ops share them."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from pipekit.transforms import functional as K

DTYPES = [torch.float32, torch.float64, torch.float16, torch.uint8, torch.int16]


def image(dtype: torch.dtype = torch.float32, shape: tuple[int, ...] = (5, 6, 6), seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(shape, generator=g)
    if dtype.is_floating_point:
        return x.to(dtype)
    info = torch.iinfo(dtype)
    return (x * (info.max - max(info.min, -1000)) + max(info.min, -1000)).round().to(dtype)


def test_kernels_do_not_import_torchvision():
    code = (
        "import sys\n"
        "import pipekit.transforms.functional, pipekit.transforms.batch_augment\n"
        "assert 'torchvision' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


class TestPhotometric:
    @pytest.mark.parametrize("dtype", DTYPES)
    def test_brightness_matches_the_formula_and_keeps_the_dtype(self, dtype):
        x = image(dtype)
        out = K.adjust_brightness(x, 1.5)
        assert out.dtype == dtype and out.shape == x.shape
        want = x.to(K.work_dtype(x)) * 1.5
        if dtype.is_floating_point:
            torch.testing.assert_close(out, want.to(dtype))
        else:
            info = torch.iinfo(dtype)
            assert torch.equal(out, want.round().clamp(info.min, info.max).to(dtype))

    def test_value_range_clamps_floats_only_when_given(self):
        x = torch.full((1, 1, 2), 0.8)
        assert K.adjust_brightness(x, 2.0).flatten().tolist() == pytest.approx([1.6, 1.6])
        assert K.adjust_brightness(x, 2.0, (0.0, 1.0)).flatten().tolist() == [1.0, 1.0]
        u = torch.full((1, 1, 1), 200, dtype=torch.uint8)
        assert K.adjust_brightness(u, 2.0).item() == 255
        assert K.adjust_brightness(u, 2.0, (0, 300)).item() == 255  # clipped to the dtype too
        assert K.adjust_brightness(u, 0.5, (0, 90)).item() == 90

    def test_parameters_broadcast_per_band_per_image_and_both(self):
        x = torch.ones(2, 3, 1, 1)
        per_band = K.adjust_brightness(x, torch.tensor([1.0, 2.0, 3.0]))
        assert per_band[:, :, 0, 0].tolist() == [[1, 2, 3], [1, 2, 3]]
        per_image = K.adjust_brightness(x, torch.tensor([[2.0], [3.0]]))
        assert per_image[:, :, 0, 0].tolist() == [[2, 2, 2], [3, 3, 3]]
        both = K.adjust_brightness(x, torch.arange(6.0).reshape(2, 3))
        assert both[:, :, 0, 0].tolist() == [[0, 1, 2], [3, 4, 5]]
        assert K.adjust_brightness(x, torch.tensor(4.0)).unique().tolist() == [4.0]  # 0-d: one number
        with pytest.raises(TypeError, match="a number or a tensor"):
            K.adjust_brightness(x, "2")

    def test_parameters_follow_the_image_to_its_device_and_dtype(self):
        x = image(torch.float64)
        out = K.adjust_contrast(x, torch.linspace(0.5, 1.5, 5, dtype=torch.float32))
        assert out.dtype == torch.float64

    @pytest.mark.parametrize("dtype", DTYPES)
    def test_contrast_uses_each_bands_own_mean(self, dtype):
        x = image(dtype, (2, 5, 6, 6))
        out = K.adjust_contrast(x, 0.0)  # every band collapses to its own mean
        xf = x.to(K.work_dtype(x))
        mean = xf.mean(dim=(-2, -1), keepdim=True).expand_as(xf)
        if dtype.is_floating_point:
            torch.testing.assert_close(out, mean.to(dtype))
        else:
            assert torch.equal(out, mean.round().to(dtype))
        torch.testing.assert_close(K.adjust_contrast(x, 1.0), x)  # up to rounding: (x - mean) + mean

    def test_gamma(self):
        x = torch.tensor([[[0.25, 1.0, 1.5, -0.5]]])
        assert K.adjust_gamma(x, 0.5).flatten().tolist() == [0.5, 1.0, 1.0, 0.0]  # clamped to (0, 1)
        assert K.adjust_gamma(x, 1.0, (-1.0, 2.0)).flatten().tolist() == [0.25, 1.0, 1.5, -0.5]
        u = torch.tensor([[[0, 64, 255]]], dtype=torch.uint8)
        assert K.adjust_gamma(u, 0.5).flatten().tolist() == [0, 128, 255]
        per_band = K.adjust_gamma(torch.full((2, 1, 1), 0.5), torch.tensor([1.0, 2.0]))
        assert per_band.flatten().tolist() == [0.5, 0.25]

    def test_gaussian_noise_scales_and_shifts_the_draws(self):
        x = torch.zeros(2, 3, 4, 4)
        noise = torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(0))
        out = K.add_gaussian_noise(x, noise, std=torch.tensor([[1.0], [0.0]]), mean=torch.tensor([[0.5], [0.0]]))
        torch.testing.assert_close(out[0], noise[0] + 0.5)
        assert torch.equal(out[1], x[1])  # zero std and mean: untouched
        assert not torch.equal(noise, out)  # the draws are not modified...
        before = noise.clone()
        K.add_gaussian_noise(x, noise, 2.0)
        assert torch.equal(noise, before)
        same = K.add_gaussian_noise(x, noise, 2.0, inplace=True)  # ...unless asked to reuse them
        assert same.data_ptr() == noise.data_ptr()
        with pytest.raises(ValueError, match="noise has shape"):
            K.add_gaussian_noise(x, noise[0], 1.0)

    def test_gaussian_noise_integer_images(self):
        x = torch.full((1, 2, 2), 250, dtype=torch.uint8)
        out = K.add_gaussian_noise(x, torch.tensor([[[1.0, -1.0], [0.04, -0.6]]]), std=10.0)
        assert out.dtype == torch.uint8 and out.flatten().tolist() == [255, 240, 250, 244]

    def test_channel_dropout(self):
        x = image(torch.uint8, (2, 4, 3, 3))
        out = K.channel_dropout(x, [1, 3], 7)
        assert (out[:, [1, 3]] == 7).all() and torch.equal(out[:, [0, 2]], x[:, [0, 2]])
        assert not (x[:, 1] == 7).all()  # the input is untouched
        with pytest.raises(ValueError, match=r"fill 0\.5 is not a valid torch\.uint8 value"):
            K.channel_dropout(x, [0], 0.5)

    def test_mixup_and_cutmix(self):
        x = torch.arange(3.0).reshape(3, 1, 1, 1).expand(3, 1, 4, 4)
        torch.testing.assert_close(K.mixup(x, 0.25), 0.25 * x + 0.75 * x.roll(1, 0))
        out = K.cutmix(x, 1, 0, 3, 2)
        assert torch.equal(out[:, :, 1:3, 0:2], x.roll(1, 0)[:, :, 1:3, 0:2])
        assert torch.equal(out[:, :, 0], x[:, :, 0]) and torch.equal(out[:, :, :, 2:], x[:, :, :, 2:])


class TestGeometric:
    @pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
    def test_flips(self, dtype):
        x = image(torch.float32, (3, 2, 4, 5)).gt(0.5).to(dtype)
        assert torch.equal(K.hflip(x), x.flip(-1)) and torch.equal(K.vflip(x), x.flip(-2))
        out = K.hflip(x, apply=torch.tensor([True, False, True]))
        assert torch.equal(out[0], x[0].flip(-1)) and torch.equal(out[1], x[1]) and torch.equal(out[2], x[2].flip(-1))
        out = K.vflip(x, apply=np.array([False, False, False]))
        assert torch.equal(out, x) and out.data_ptr() != x.data_ptr()
        with pytest.raises(ValueError, match="hflip: 2 per-image values need a batch"):
            K.hflip(x, apply=[True, False])

    def test_rot90_one_k_or_one_per_image(self):
        x = image(torch.float32, (4, 3, 5, 5))
        assert torch.equal(K.rot90(x, 3), torch.rot90(x, 3, dims=(-2, -1)))
        assert torch.equal(K.rot90(x[0], -1), torch.rot90(x[0], 3, dims=(-2, -1)))
        out = K.rot90(x, [0, 1, 2, 7])
        for i, k in enumerate([0, 1, 2, 3]):
            assert torch.equal(out[i], torch.rot90(x[i], k, dims=(-2, -1)))
        masks = x[:, 0] > 0.5  # [B, H, W]
        assert torch.equal(K.rot90(masks, torch.tensor([1, 1, 1, 1])), torch.rot90(masks, 1, dims=(-2, -1)))
        with pytest.raises(ValueError, match="need square images, got 5x6"):
            K.rot90(torch.zeros(2, 1, 5, 6), [0, 1])
        assert K.rot90(torch.zeros(2, 1, 5, 6), [0, 2]).shape == (2, 1, 5, 6)

    @pytest.mark.parametrize("k", [0, 1, 2, 3])
    def test_rot90_boxes_follow_the_pixels(self, k):
        h, w = 5, 7
        img = torch.zeros(h, w)
        img[1:3, 2:6] = 1  # the box XYXY (2, 1, 6, 3)
        boxes, canvas = K.rot90_boxes(torch.tensor([[2, 1, 6, 3]]), k, (h, w))
        rotated = K.rot90(img, k)
        assert canvas == tuple(rotated.shape)
        ys, xs = rotated.nonzero(as_tuple=True)
        assert boxes.tolist() == [[int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1]]

    def test_crop(self):
        x = image(torch.float32, (3, 2, 6, 7))
        assert torch.equal(K.crop(x, 1, 2, 3, 4), x[..., 1:4, 2:6])
        out = K.crop(x, torch.tensor([0, 3, 1]), np.array([4, 0, 2]), 3, 3)
        for i, (t, left) in enumerate([(0, 4), (3, 0), (1, 2)]):
            assert torch.equal(out[i], x[i, :, t : t + 3, left : left + 3])
        assert torch.equal(K.crop(x[:, 0], [0, 1, 2], 1, 2, 2)[2], x[2, 0, 2:4, 1:3])  # masks [B, H, W]
        with pytest.raises(ValueError, match="outside"):
            K.crop(x, 5, 0, 2, 2)
        with pytest.raises(ValueError, match="outside"):
            K.crop(x, [0, 0, 5], 0, 2, 2)

    def test_resized_crop_nearest_is_an_exact_gather(self):
        x = torch.arange(64.0).reshape(1, 1, 8, 8).expand(2, 3, 8, 8)
        out = K.resized_crop(x, [0, 4], [0, 2], [4, 4], [4, 4], (2, 2), "nearest")
        assert out.shape == (2, 3, 2, 2)
        assert out[0, 0].tolist() == [[9.0, 11.0], [25.0, 27.0]]  # pixel centres 1 and 3 of a 4-wide window
        assert out[1, 2].tolist() == [[43.0, 45.0], [59.0, 61.0]]
        mask = x[:, 0].long()
        assert torch.equal(K.resized_crop(mask, [0, 4], [0, 2], [4, 4], [4, 4], (2, 2), "nearest"), out[:, 0].long())

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.uint8])
    def test_resized_crop_of_the_whole_image_is_the_identity(self, dtype):
        x = image(dtype, (2, 3, 6, 6))
        for mode in ("bilinear", "nearest"):
            out = K.resized_crop(x, [0, 0], [0, 0], [6, 6], [6, 6], (6, 6), mode)
            assert out.dtype == dtype
            torch.testing.assert_close(out, x)
        torch.testing.assert_close(K.resized_crop(x[0], 0, 0, 6, 6, (6, 6)), x[0])  # one image, shared window

    def test_resized_crop_bilinear_is_linear_in_a_ramp(self):
        ramp = torch.arange(16, dtype=torch.float64).expand(1, 1, 16, 16)
        out = K.resized_crop(ramp, 0, 4, 16, 8, (16, 16))
        torch.testing.assert_close(out[0, 0, 0, 1:-1] - out[0, 0, 0, :-2], torch.full((14,), 0.5, dtype=torch.float64))
        with pytest.raises(ValueError, match="interpolation must be"):
            K.resized_crop(ramp, 0, 0, 4, 4, (2, 2), "bicubic")


class TestSharedBySampleAndBatchOps:
    """The same kernel, fed the same parameters by the sample op and the batch op, gives the same numbers."""

    def test_brightness_and_contrast(self):
        from pipekit.transforms import BatchRandomBrightness, BatchRandomContrast, RandomBrightness, RandomContrast

        x = image(torch.uint8, (3, 7, 8, 8))
        for sample_cls, batch_cls in ((RandomBrightness, BatchRandomBrightness), (RandomContrast, BatchRandomContrast)):
            batch_op, sample_op = batch_cls((0.5, 1.5), per_band=True), sample_cls((0.5, 1.5), per_band=True)
            batch_out = batch_op(x, np.random.default_rng(3))
            factors = batch_op._factors(np.random.default_rng(3), x, 0.5, 1.5, 1.0)  # the same draws: [B, C]
            assert factors.shape == (3, 7)
            for i in range(3):
                assert torch.equal(sample_op._band_op(x[i], {"factor": factors[i]}), batch_out[i])

    def test_rot90(self):
        from pipekit.transforms import BatchRandomRot90, RandomRot90

        x = image(torch.float32, (8, 3, 5, 5))
        out = BatchRandomRot90(seed=1)(x)
        for i in range(8):
            assert any(torch.equal(out[i], RandomRot90(k=(k,))(x[i])) for k in range(4))
