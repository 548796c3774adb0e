"""Per-sample augmentation of collated batches (pipekit.transforms.batch_augment)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from pipekit.transforms import (
    BatchCompose,
    BatchRandomBrightness,
    BatchRandomChoice,
    BatchRandomContrast,
    BatchRandomCrop,
    BatchRandomGaussianNoise,
    BatchRandomHorizontalFlip,
    BatchRandomResizedCrop,
    BatchRandomRot90,
    BatchRandomVerticalFlip,
    CutMix,
    MixUp,
    Normalize,
)

CUDA = torch.cuda.is_available()


def coded_batch(b: int = 16, c: int = 13, h: int = 12, w: int = 12) -> dict:
    """image[i, k, y, x] encodes (i, k, y, x) uniquely; mask[i] encodes (y, x); labels i % 5."""
    i = torch.arange(b).view(b, 1, 1, 1)
    k = torch.arange(c).view(1, c, 1, 1)
    y = torch.arange(h).view(1, 1, h, 1)
    x = torch.arange(w).view(1, 1, 1, w)
    image = (i * 1_000_000 + k * 10_000 + y * 100 + x).double()
    mask = (y * 100 + x).expand(b, 1, h, w)[:, 0].clone()
    return {"image": image, "mask": mask, "label": torch.arange(b) % 5, "id": list(range(b))}


def rot(x, k):
    return torch.rot90(x, k, dims=(-2, -1))


class TestFlips:
    @pytest.mark.parametrize(("cls", "dim"), [(BatchRandomHorizontalFlip, -1), (BatchRandomVerticalFlip, -2)])
    def test_each_sample_flipped_or_not_with_its_mask(self, cls, dim):
        batch = coded_batch(b=64)
        out = cls(p=0.5, seed=0)(batch)
        flipped = []
        for i in range(64):
            if torch.equal(out["image"][i], batch["image"][i]):
                assert torch.equal(out["mask"][i], batch["mask"][i])
                flipped.append(False)
            else:
                assert torch.equal(out["image"][i], batch["image"][i].flip(dim))
                assert torch.equal(out["mask"][i], batch["mask"][i].flip(dim))
                flipped.append(True)
        assert 10 < sum(flipped) < 54
        assert out["id"] == batch["id"] and torch.equal(out["label"], batch["label"])

    def test_p_zero_and_one(self):
        batch = coded_batch()
        assert torch.equal(BatchRandomHorizontalFlip(p=0.0, seed=0)(batch)["image"], batch["image"])
        assert torch.equal(BatchRandomHorizontalFlip(p=1.0, seed=0)(batch)["image"], batch["image"].flip(-1))

    def test_masks_with_a_channel_axis(self):
        batch = coded_batch()
        batch["mask"] = batch["mask"].unsqueeze(1).repeat(1, 2, 1, 1)
        out = BatchRandomHorizontalFlip(p=1.0, seed=0)(batch)
        assert torch.equal(out["mask"], batch["mask"].flip(-1))

    def test_input_is_not_modified(self):
        batch = coded_batch()
        before = batch["image"].clone()
        BatchCompose([BatchRandomHorizontalFlip(), BatchRandomRot90(), BatchRandomCrop(6)], seed=0)(batch)
        assert torch.equal(batch["image"], before)


class TestRot90:
    def test_each_sample_rotated_by_its_own_k(self):
        batch = coded_batch(b=32)
        out = BatchRandomRot90(seed=1)(batch)
        ks = []
        for i in range(32):
            k = next(k for k in range(4) if torch.equal(out["image"][i], rot(batch["image"][i], k)))
            assert torch.equal(out["mask"][i], rot(batch["mask"][i], k))
            ks.append(k)
        assert set(ks) == {0, 1, 2, 3}

    def test_allowed_multiples(self):
        batch = coded_batch(b=16, h=8, w=12)
        out = BatchRandomRot90(k=(0, 2), seed=0)(batch)
        for i in range(16):
            assert any(torch.equal(out["image"][i], rot(batch["image"][i], k)) for k in (0, 2))
        with pytest.raises(ValueError, match="needs square images, got 8x12; use k=\\(0, 2\\)"):
            BatchRandomRot90(seed=0)(batch)


class TestCrops:
    def test_random_crop_takes_an_exact_window_per_sample(self):
        batch = coded_batch(b=20, h=12, w=14)
        out = BatchRandomCrop((5, 7), seed=2)(batch)
        assert out["image"].shape == (20, 13, 5, 7) and out["mask"].shape == (20, 5, 7)
        offsets = set()
        for i in range(20):
            corner = int(out["image"][i, 0, 0, 0]) - i * 1_000_000
            top, left = divmod(corner, 100)
            offsets.add((top, left))
            assert torch.equal(out["image"][i], batch["image"][i, :, top : top + 5, left : left + 7])
            assert torch.equal(out["mask"][i], batch["mask"][i, top : top + 5, left : left + 7])
        assert len(offsets) > 10

    def test_random_crop_too_large(self):
        with pytest.raises(ValueError, match="crop size \\(13, 4\\) is larger than the images \\(12x12\\)"):
            BatchRandomCrop((13, 4), seed=0)(coded_batch())

    def test_resized_crop_of_the_whole_image_is_the_identity(self):
        batch = coded_batch(b=4)
        out = BatchRandomResizedCrop(12, scale=(1.0, 1.0), ratio=(1.0, 1.0), seed=0)(batch)
        torch.testing.assert_close(out["image"], batch["image"])
        assert torch.equal(out["mask"], batch["mask"])

    def test_resized_crop_keeps_mask_and_image_together(self):
        batch = coded_batch(b=16, h=24, w=24)
        out = BatchRandomResizedCrop(10, scale=(0.2, 0.9), interpolation="nearest", seed=3)(batch)
        assert out["image"].shape == (16, 13, 10, 10)
        # nearest sampling: every output pixel is an input pixel, the same for image and mask
        yx = (out["image"][:, 0] % 10_000).long()
        assert torch.equal(yx, out["mask"])
        for k in (1, 12):
            assert torch.equal(out["image"][:, k] - out["image"][:, 0], torch.full_like(out["image"][:, 0], k * 10_000))

    def test_resized_crop_scale_and_ratio(self):
        b, h, w = 64, 64, 64
        ramp = torch.arange(w, dtype=torch.float64).expand(b, 1, h, w).clone()
        out = BatchRandomResizedCrop(16, scale=(0.25, 0.25), ratio=(1.0, 1.0), seed=4)(ramp)
        slope = (out[:, 0, :, -1] - out[:, 0, :, 0]) / 15  # input pixels per output pixel, along x
        torch.testing.assert_close(slope, torch.full_like(slope, 32 / 16))  # crop width 32 = sqrt(0.25) * 64

    def test_integer_images_keep_their_dtype(self):
        x = torch.randint(0, 60000, (4, 11, 16, 16)).to(torch.uint16)
        out = BatchRandomResizedCrop(8, seed=0)(x)
        assert out.dtype == torch.uint16 and out.shape == (4, 11, 8, 8)


class TestMixUp:
    def test_blends_images_and_labels_with_one_lambda(self):
        batch = {"image": torch.rand(6, 7, 4, 4), "label": torch.tensor([0, 1, 2, 3, 4, 0])}
        out = MixUp(alpha=0.4, num_classes=5, seed=0)(batch)
        onehot = torch.nn.functional.one_hot(batch["label"], 5).float()
        lam = float(out["label"][1, 1])  # sample 1 is class 1, its partner (sample 0) class 0
        torch.testing.assert_close(out["image"], batch["image"] * lam + batch["image"].roll(1, 0) * (1 - lam))
        torch.testing.assert_close(out["label"], onehot * lam + onehot.roll(1, 0) * (1 - lam))

    def test_soft_labels(self):
        soft = torch.softmax(torch.rand(4, 3), 1)
        out = MixUp(seed=0)({"image": torch.rand(4, 3, 2, 2), "label": soft})
        torch.testing.assert_close(out["label"].sum(1), torch.ones(4))

    def test_refusals(self):
        with pytest.raises(ValueError, match="holds masks \\['mask'\\], which cannot be blended; use CutMix"):
            MixUp(num_classes=5, seed=0)(coded_batch())
        with pytest.raises(TypeError, match="images must be floating point"):
            MixUp(num_classes=5, seed=0)(
                {"image": torch.zeros(2, 3, 2, 2, dtype=torch.uint8), "label": torch.tensor([0, 1])}
            )
        with pytest.raises(KeyError, match="no 'label' entry"):
            MixUp(num_classes=5, seed=0)({"image": torch.rand(2, 3, 2, 2)})
        with pytest.raises(ValueError, match="integer labels need num_classes"):
            MixUp(seed=0)({"image": torch.rand(2, 3, 2, 2), "label": torch.tensor([0, 1])})
        with pytest.raises(ValueError, match=r"labels must be within 0\.\.1"):
            MixUp(num_classes=2, seed=0)({"image": torch.rand(2, 3, 2, 2), "label": torch.tensor([0, 2])})
        with pytest.raises(ValueError, match="alpha must be positive"):
            MixUp(alpha=0)


class TestCutMix:
    def test_pastes_one_box_from_the_next_sample(self):
        batch = coded_batch(b=8, h=16, w=16)
        for seed in range(5):
            out = CutMix(num_classes=5, seed=seed)(batch)
            rolled = batch["image"].roll(1, 0)
            changed = (out["image"] != batch["image"]).any(dim=(0, 1))
            assert torch.equal(out["image"][:, :, changed], rolled[:, :, changed])
            assert torch.equal(out["image"][:, :, ~changed], batch["image"][:, :, ~changed])
            rows, cols = changed.nonzero(as_tuple=True)
            if len(rows):
                area = (rows.max() - rows.min() + 1) * (cols.max() - cols.min() + 1)
                assert int(changed.sum()) == int(area)  # a rectangle
            # masks: same box, pasted from the next sample's mask
            assert torch.equal(out["mask"][:, changed], batch["mask"].roll(1, 0)[:, changed])
            # label weights follow the pasted area exactly
            frac = float(changed.sum()) / 256
            onehot = torch.nn.functional.one_hot(batch["label"], 5).float()
            torch.testing.assert_close(out["label"], onehot * (1 - frac) + onehot.roll(1, 0) * frac)

    def test_integer_images_and_no_labels(self):
        batch = {"image": torch.randint(0, 255, (4, 3, 8, 8), dtype=torch.uint8), "mask": torch.zeros(4, 8, 8)}
        out = CutMix(seed=0)(batch)
        assert out["image"].dtype == torch.uint8 and "label" not in out


class TestRandomness:
    @pytest.mark.parametrize(
        "make",
        [
            lambda s: BatchRandomHorizontalFlip(seed=s),
            lambda s: BatchRandomRot90(seed=s),
            lambda s: BatchRandomCrop(7, seed=s),
            lambda s: BatchRandomResizedCrop(7, seed=s),
            lambda s: CutMix(num_classes=5, seed=s),
        ],
    )
    def test_same_seed_same_output(self, make):
        batch = coded_batch()
        a, b, c = make(0)(batch), make(0)(batch), make(1)(batch)
        assert torch.equal(a["image"], b["image"]) and torch.equal(a["mask"], b["mask"])
        assert not torch.equal(a["image"], c["image"])

    def test_compose_and_choice(self):
        batch = coded_batch()
        batch.pop("mask")
        ops = lambda: [BatchRandomHorizontalFlip(), BatchRandomRot90(), Normalize(0.0, 1000.0)]  # noqa: E731
        a = BatchCompose(ops(), seed=5)(batch)
        b = BatchCompose(ops(), seed=5)(batch)
        assert torch.equal(a["image"], b["image"]) and a["image"].abs().max() < 20_000
        choice = BatchRandomChoice([MixUp(num_classes=5), CutMix(num_classes=5)], p=[1, 3], seed=0)
        out = choice({"image": torch.rand(4, 3, 8, 8), "label": torch.tensor([0, 1, 2, 3])})
        assert out["label"].shape == (4, 5)

    def test_choice_uses_both(self):
        flip = BatchRandomHorizontalFlip(p=1.0)
        vflip = BatchRandomVerticalFlip(p=1.0)
        choice = BatchRandomChoice([flip, vflip], seed=0)
        x = coded_batch()["image"]
        results = {"h" if torch.equal(choice(x), x.flip(-1)) else "v" for _ in range(20)}
        assert results == {"h", "v"}

    def test_explicit_generator(self):
        x = coded_batch()["image"]
        a = BatchRandomRot90()(x, np.random.default_rng(3))
        b = BatchRandomRot90()(x, np.random.default_rng(3))
        assert torch.equal(a, b)

    @pytest.mark.skipif(not CUDA, reason="needs CUDA")
    def test_cuda_matches_cpu(self):
        batch = coded_batch()
        ops = lambda: BatchCompose([BatchRandomHorizontalFlip(), BatchRandomRot90(), BatchRandomResizedCrop(8)], seed=9)  # noqa: E731
        cpu = ops()(batch)
        gpu = ops()({**batch, "image": batch["image"].cuda(), "mask": batch["mask"].cuda()})
        assert gpu["image"].device.type == "cuda"
        torch.testing.assert_close(gpu["image"].cpu(), cpu["image"])
        assert torch.equal(gpu["mask"].cpu(), cpu["mask"])

    @pytest.mark.parametrize(
        "op",
        [
            BatchRandomHorizontalFlip(seed=1),
            BatchRandomRot90(seed=1),
            BatchRandomCrop(5, seed=1),
            BatchRandomResizedCrop(5, seed=1),
            CutMix(num_classes=5, seed=1),
            BatchCompose([BatchRandomVerticalFlip(), BatchRandomCrop(5)], seed=1),
        ],
        ids=lambda op: type(op).__name__,
    )
    def test_pickles(self, op):
        copy = pickle.loads(pickle.dumps(op))
        batch = coded_batch()
        assert torch.equal(copy(batch)["image"], op(batch)["image"])


class TestErrors:
    def test_boxes_are_refused(self):
        batch = {**coded_batch(), "boxes": [torch.zeros(1, 4)] * 16}
        with pytest.raises(ValueError, match="holds boxes \\['boxes'\\], which batch-level ops cannot move"):
            BatchRandomHorizontalFlip(seed=0)(batch)

    def test_shapes(self):
        with pytest.raises(ValueError, match="must be a \\[B, C, H, W\\] tensor, got \\(3, 4, 4\\)"):
            BatchRandomHorizontalFlip(seed=0)(torch.zeros(3, 4, 4))
        with pytest.raises(ValueError, match="batch\\['mask'\\] must be \\[B, H, W\\] or \\[B, K, H, W\\]"):
            BatchRandomHorizontalFlip(seed=0)({"image": torch.zeros(2, 3, 4, 4), "mask": torch.zeros(2, 5, 5)})
        with pytest.raises(KeyError, match="no 'image' entry"):
            BatchRandomHorizontalFlip(seed=0)({"x": torch.zeros(2, 3, 4, 4)})
        with pytest.raises(TypeError, match="expects a batch dict"):
            BatchRandomHorizontalFlip(seed=0)([torch.zeros(2, 3, 4, 4)])

    def test_arguments(self):
        with pytest.raises(ValueError, match="p must be a probability"):
            BatchRandomHorizontalFlip(p=2)
        with pytest.raises(ValueError, match="size must be a positive int"):
            BatchRandomCrop(0)
        with pytest.raises(ValueError, match="scale must be a \\(min, max\\) pair"):
            BatchRandomResizedCrop(4, scale=(0.5, 0.1))
        with pytest.raises(ValueError, match="interpolation must be 'bilinear' or 'nearest'"):
            BatchRandomResizedCrop(4, interpolation="bicubic")
        with pytest.raises(TypeError, match="transforms must be a non-empty list"):
            BatchCompose([])
        with pytest.raises(TypeError, match=r"transform 0 must be a torch\.nn\.Module"):
            BatchCompose([lambda b: b])
        with pytest.raises(ValueError, match="p must hold 2 non-negative weights"):
            BatchRandomChoice([MixUp(), CutMix()], p=[1.0])


class TestPhotometric:
    def test_brightness_per_sample_and_per_band(self):
        batch = {"image": torch.ones(16, 13, 4, 4), "mask": torch.ones(16, 4, 4, dtype=torch.long)}
        out = BatchRandomBrightness((0.5, 1.5), seed=0)(batch)
        factors = out["image"][:, :, 0, 0]
        assert torch.equal(out["image"], factors.view(16, 13, 1, 1).expand(16, 13, 4, 4))
        assert (factors == factors[:, :1]).all() and len(set(factors[:, 0].tolist())) == 16
        assert ((factors >= 0.5) & (factors <= 1.5)).all()
        assert torch.equal(out["mask"], batch["mask"])
        per_band = BatchRandomBrightness((0.5, 1.5), per_band=True, seed=0)(batch)["image"][:, :, 0, 0]
        assert len(set(per_band.flatten().tolist())) == 16 * 13

    def test_brightness_probability_and_integer_clamp(self):
        x = torch.full((40, 3, 2, 2), 200, dtype=torch.uint8)
        out = BatchRandomBrightness((2.0, 2.0), p=0.5, seed=1)(x)
        assert out.dtype == torch.uint8
        changed = (out == 255).flatten(1).all(1)
        unchanged = (out == 200).flatten(1).all(1)
        assert bool((changed | unchanged).all()) and 5 < int(changed.sum()) < 35

    def test_contrast_per_sample_mean(self):
        x = torch.rand(8, 7, 6, 6, generator=torch.Generator().manual_seed(0))
        out = BatchRandomContrast((0.3, 1.7), seed=2)(x)
        mean = x.mean(dim=(-2, -1), keepdim=True)
        # each (sample, band)'s factor, fitted over all its pixels (one pixel can sit on the mean)
        f = ((out - mean) * (x - mean)).sum(dim=(-2, -1)) / ((x - mean) ** 2).sum(dim=(-2, -1))
        torch.testing.assert_close(out, mean + f.view(8, 7, 1, 1) * (x - mean))
        torch.testing.assert_close(f, f[:, :1].expand(8, 7))

    def test_gaussian_noise(self):
        x = torch.zeros(8, 13, 32, 32)
        out = BatchRandomGaussianNoise(std=[0.01 * (k + 1) for k in range(13)], mean=1.0, seed=3)(x)
        torch.testing.assert_close(
            out.std(dim=(0, 2, 3)), torch.tensor([0.01 * (k + 1) for k in range(13)]), rtol=0.05, atol=0
        )
        assert abs(float(out.mean()) - 1.0) < 0.01
        some = BatchRandomGaussianNoise(std=1.0, p=0.5, seed=4)(x)
        noisy = (some != 0).flatten(1).any(1)
        assert 0 < int(noisy.sum()) < 8
        assert torch.equal(some, BatchRandomGaussianNoise(std=1.0, p=0.5, seed=4)(x))
        with pytest.raises(ValueError, match="std has 2 values but the images have 13 bands"):
            BatchRandomGaussianNoise(std=[0.1, 0.2], seed=0)(x)

    def test_boxes_are_fine_for_photometric_ops(self):
        batch = {"image": torch.rand(2, 3, 4, 4), "boxes": [torch.zeros(1, 4)] * 2}
        out = BatchRandomBrightness(seed=0)(batch)
        assert out["boxes"] is batch["boxes"]
