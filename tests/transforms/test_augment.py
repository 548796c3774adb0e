"""Sample-dict augmentation on torchvision v2 for multispectral images (pipekit.transforms._augment)."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest
import torch
from torch.utils.data import DataLoader, Dataset
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from pipekit.transforms import (
    Augment,
    ColorJitter,
    RandomBrightness,
    RandomChannelDropout,
    RandomContrast,
    RandomGamma,
    RandomGaussianNoise,
    RandomHue,
    RandomRot90,
    RandomSaturation,
    RGBOnly,
    TrivialAugment,
)

NEAREST = v2.InterpolationMode.NEAREST
BANDS = [7, 11, 13]


def make_sample(bands: int, h: int = 40, w: int = 48, seed: int = 0, dtype: torch.dtype = torch.float32) -> dict:
    """A sample whose mask, bands and box are all derived from the same content.

    band k = base + k (so band k - band 0 == k wherever the image is valid),
    mask = 1 + (base > 0.5) (so 0 marks pixels from outside the input),
    an object (mask value 3, base 2.0) with its exact box.
    """
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(0, 64, (h // 4, w // 4), generator=g) / 64  # exact sums in float32
    base = base.repeat_interleave(4, 0).repeat_interleave(4, 1)
    base[10:18, 12:30] = 2.0
    image = (base.unsqueeze(0) + torch.arange(bands).view(-1, 1, 1) + 1).to(dtype)
    mask = 1 + (base > 0.5).long() + (base == 2.0).long()
    boxes = torch.tensor([[12.0, 10.0, 30.0, 18.0]])
    return {
        "image": image,
        "mask": mask,
        "boxes": boxes,
        "labels": torch.tensor([3]),
        "crs": "EPSG:32633",
        "bounds": (0.0, 1.0, 2.0, 3.0),
        "meta": {"scene": "LC08", "cloud": 0.1},
    }


def assert_consistent(out: dict, bands: int, exact_box: bool = True, check_box: bool = True) -> None:
    image, mask = out["image"], out["mask"]
    assert image.shape[-3] == bands and image.shape[-2:] == mask.shape[-2:]
    valid = mask > 0
    assert valid.any()
    base = image[0] - 1
    # every band moved with band 0
    for k in range(1, bands):
        assert torch.equal((image[k] - image[0])[valid], torch.full_like(image[0][valid], float(k)))
    # the mask moved with the image content
    assert torch.equal(mask[valid], (1 + (base > 0.5).long() + (base == 2.0).long())[valid])
    assert (image[:, ~valid] == 0).all()  # outside the input: fill 0 in image and mask
    # the box moved with the object
    obj = (mask == 3).nonzero()
    if len(obj) and check_box:
        y0, x0 = obj.min(0).values.tolist()
        y1, x1 = (obj.max(0).values + 1).tolist()
        box = out["boxes"][0].tolist()
        if exact_box:
            assert box == pytest.approx([x0, y0, x1, y1], abs=1e-4)
        else:  # the box holds the object (boxes of rotated objects are their corners' envelope)
            assert box[0] <= x0 + 1 and box[1] <= y0 + 1 and box[2] >= x1 - 1 and box[3] >= y1 - 1


def assert_passthrough(out: dict, sample: dict) -> None:
    assert out["crs"] == "EPSG:32633" and out["bounds"] == (0.0, 1.0, 2.0, 3.0)
    assert out["meta"] is sample["meta"] and torch.equal(out["labels"], sample["labels"])
    for key in ("image", "mask", "boxes"):
        assert type(out[key]) is torch.Tensor  # plain tensors again


class SpyTrivialAugment(TrivialAugment):
    """Records the op it drew."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[str] = []

    def make_params(self, flat_inputs):
        params = super().make_params(flat_inputs)
        self.seen.append(params["op"])
        return params

    _get_params = make_params


class TestGeometric:
    @pytest.mark.parametrize("bands", BANDS)
    @pytest.mark.parametrize(
        "op",
        [
            v2.RandomHorizontalFlip(p=1.0),
            v2.RandomVerticalFlip(p=1.0),
            RandomRot90(k=(1,)),
            RandomRot90(k=(2,)),
            RandomRot90(k=(3,)),
            v2.RandomCrop((24, 20)),
            v2.CenterCrop((32, 36)),
        ],
        ids=["hflip", "vflip", "rot90", "rot180", "rot270", "crop", "center_crop"],
    )
    def test_exact_ops_move_image_mask_and_boxes_together(self, bands, op):
        sample = make_sample(bands)
        out = Augment([op], seed=0)(sample)
        assert_consistent(out, bands, exact_box=True)
        assert_passthrough(out, sample)

    @pytest.mark.parametrize("bands", BANDS)
    @pytest.mark.parametrize(
        "op",
        [
            v2.RandomRotation(40, interpolation=NEAREST),
            v2.RandomAffine(degrees=25, translate=(0.1, 0.1), scale=(0.8, 1.2), shear=10, interpolation=NEAREST),
            v2.RandomResizedCrop((32, 32), scale=(0.3, 1.0), interpolation=NEAREST, antialias=False),
            v2.ElasticTransform(alpha=30.0, sigma=4.0, interpolation=NEAREST),
            TrivialAugment(color=False),
        ],
        ids=["rotation", "affine", "resized_crop", "elastic", "trivial_geometric"],
    )
    def test_resampling_ops_move_image_and_mask_together(self, bands, op):
        for seed in range(4):
            sample = make_sample(bands, seed=seed)
            out = Augment([op], seed=seed)(sample)
            # torchvision moves a box's corners only, so elastically warped objects may leave it
            assert_consistent(out, bands, exact_box=False, check_box=not isinstance(op, v2.ElasticTransform))
            assert_passthrough(out, sample)

    @pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.uint16, torch.float16])
    def test_integer_and_half_images(self, dtype):
        sample = make_sample(11, dtype=torch.float32)
        sample["image"] = (sample["image"] * 10).to(dtype)
        ops = [RandomRot90(), v2.RandomAffine(20, interpolation=NEAREST), v2.RandomHorizontalFlip()]
        out = Augment(ops, seed=1)(sample)
        assert out["image"].dtype == dtype and out["image"].shape[0] == 11

    def test_rot90_boxes_in_every_format(self):
        sample = make_sample(7)
        xyxy = sample["boxes"]
        for fmt, key in (("XYWH", "bbox_xywh"), ("CXCYWH", "bbox_cxcywh")):
            s = {**sample, key: F.convert_bounding_box_format(xyxy, old_format="XYXY", new_format=fmt)}
            out = Augment([RandomRot90(k=(1,))], seed=0)(s)
            back = F.convert_bounding_box_format(out[key], old_format=fmt, new_format="XYXY")
            torch.testing.assert_close(back, out["boxes"])

    def test_non_square_rot90_swaps_the_canvas(self):
        sample = make_sample(7, h=40, w=48)
        out = Augment([RandomRot90(k=(1,))], seed=0)(sample)
        assert out["image"].shape == (7, 48, 40) and out["mask"].shape == (48, 40)

    def test_sanitize_boxes_keeps_labels_in_step(self):
        sample = make_sample(7)
        sample["boxes"] = torch.tensor([[12.0, 10.0, 30.0, 18.0], [0.0, 0.0, 4.0, 4.0]])
        sample["labels"] = torch.tensor([3, 5])
        out = Augment([v2.CenterCrop((20, 24)), v2.SanitizeBoundingBoxes()], seed=0)(sample)
        assert out["labels"].tolist() == [3] and out["boxes"].shape == (1, 4)

    def test_a_batch_gets_the_same_parameters(self):
        sample = make_sample(7)
        batch = {"image": torch.stack([sample["image"]] * 3), "mask": torch.stack([sample["mask"]] * 3)}
        out = Augment([v2.RandomAffine(30, interpolation=NEAREST)], seed=2)(batch)
        assert torch.equal(out["image"][0], out["image"][2]) and torch.equal(out["mask"][0], out["mask"][1])

    def test_tensor_input(self):
        x = torch.arange(6.0).reshape(1, 2, 3).expand(7, 2, 3)
        out = Augment([v2.RandomHorizontalFlip(p=1.0)])(x)
        assert type(out) is torch.Tensor and out[3].tolist() == [[2.0, 1.0, 0.0], [5.0, 4.0, 3.0]]


class TestPhotometric:
    @pytest.mark.parametrize("bands", BANDS)
    def test_brightness(self, bands):
        sample = make_sample(bands)
        out = Augment([RandomBrightness((1.5, 1.5))])(sample)
        torch.testing.assert_close(out["image"], sample["image"] * 1.5)
        assert torch.equal(out["mask"], sample["mask"]) and torch.equal(out["boxes"], sample["boxes"])
        per_band = Augment([RandomBrightness((0.5, 1.5), per_band=True)], seed=3)(sample)["image"]
        factors = (per_band / sample["image"]).amax(dim=(1, 2))
        torch.testing.assert_close(factors, (per_band / sample["image"]).amin(dim=(1, 2)))  # one factor per band
        assert len(set(factors.tolist())) == bands and ((factors >= 0.5) & (factors <= 1.5)).all()

    @pytest.mark.parametrize("bands", BANDS)
    def test_contrast_per_band_mean(self, bands):
        sample = make_sample(bands)
        x = sample["image"]
        out = Augment([RandomContrast((0.5, 0.5))])(sample)["image"]
        mean = x.mean(dim=(1, 2), keepdim=True)
        torch.testing.assert_close(out, mean + 0.5 * (x - mean))

    @pytest.mark.parametrize("bands", BANDS)
    def test_gamma(self, bands):
        x = torch.rand(bands, 8, 8)
        torch.testing.assert_close(RandomGamma(2.0)(x), x**2)
        y = torch.randint(0, 10001, (bands, 8, 8)).to(torch.uint16)
        out = RandomGamma(0.5, value_range=(0, 10000))(y)
        expected = ((y.double() / 10000) ** 0.5 * 10000).round().to(torch.uint16)
        assert out.dtype == torch.uint16 and (out.int() - expected.int()).abs().max() <= 1

    @pytest.mark.parametrize("bands", BANDS)
    def test_gaussian_noise(self, bands):
        torch.manual_seed(0)
        x = torch.zeros(bands, 64, 64)
        out = RandomGaussianNoise(std=0.2, mean=1.0)(x)
        assert abs(float(out.std()) - 0.2) < 0.01 and abs(float(out.mean()) - 1.0) < 0.01
        stds = [0.01 * (k + 1) for k in range(bands)]
        out = RandomGaussianNoise(std=stds)(x)
        torch.testing.assert_close(out.std(dim=(1, 2)), torch.tensor(stds), rtol=0.1, atol=0)
        ints = RandomGaussianNoise(std=50.0)(torch.full((bands, 8, 8), 10, dtype=torch.uint8))
        assert ints.dtype == torch.uint8 and int(ints.min()) == 0  # clamped at the dtype's range

    @pytest.mark.parametrize("bands", BANDS)
    def test_gaussian_blur_any_band_count(self, bands):
        x = torch.rand(bands, 16, 16)
        out = Augment([v2.GaussianBlur(5, sigma=1.5)])({"image": x})["image"]
        for k in (0, bands - 1):
            torch.testing.assert_close(out[k], F.gaussian_blur(x[k : k + 1], [5, 5], [1.5, 1.5])[0])

    @pytest.mark.parametrize("bands", BANDS)
    def test_channel_dropout(self, bands):
        x = torch.rand(bands, 8, 8) + 1
        for seed in range(5):
            out = Augment([RandomChannelDropout((1, 3), fill=-1.0, p=1.0)], seed=seed)({"image": x})["image"]
            dropped = [k for k in range(bands) if (out[k] == -1).all()]
            kept = [k for k in range(bands) if torch.equal(out[k], x[k])]
            assert 1 <= len(dropped) <= 3 and len(dropped) + len(kept) == bands

    def test_integer_clamping_and_float_range(self):
        ints = torch.full((7, 2, 2), 200, dtype=torch.uint8)
        assert RandomBrightness((2.0, 2.0))(ints).unique().tolist() == [255]
        floats = torch.full((7, 2, 2), 0.8)
        assert RandomBrightness((2.0, 2.0))(floats).unique().tolist() == [
            pytest.approx(1.6)
        ]  # reflectance > 1 survives
        assert RandomBrightness((2.0, 2.0), value_range=(0, 1))(floats).unique().tolist() == [1.0]
        normed = torch.full((7, 2, 2), -0.5)
        assert RandomContrast((2.0, 2.0))(normed).unique().tolist() == [-0.5]

    def test_probability(self):
        x = torch.ones(7, 2, 2)
        outs = [Augment([RandomBrightness((2.0, 2.0), p=0.5)], seed=s)({"image": x})["image"] for s in range(40)]
        changed = sum(bool((o == 2).all()) for o in outs)
        assert 5 < changed < 35 and all(bool((o == 1).all()) or bool((o == 2).all()) for o in outs)


class TestRGBOnly:
    @pytest.mark.parametrize(
        ("op", "what"),
        [
            (RandomHue(0.2), "RandomHue: hue"),
            (RandomSaturation(0.5), "RandomSaturation: saturation"),
            (ColorJitter(saturation=0.4), "ColorJitter: saturation"),
            (ColorJitter(hue=0.1), "ColorJitter: hue"),
            (TrivialAugment(), "TrivialAugment: TrivialAugment's colour ops"),
            (RGBOnly(v2.RandomGrayscale(1.0)), "RGBOnly: RandomGrayscale"),
        ],
    )
    @pytest.mark.parametrize("bands", BANDS)
    def test_refuses_multispectral_without_rgb_bands(self, op, what, bands):
        with pytest.raises(
            ValueError, match=f"{what} needs an RGB image \\(3 bands\\) but the image has {bands} bands"
        ):
            Augment([op], seed=0)(make_sample(bands))

    @pytest.mark.parametrize(
        "op",
        [
            RandomHue(0.3, rgb_bands=(3, 2, 1)),
            RandomSaturation((0.2, 0.2), rgb_bands=(3, 2, 1)),
            ColorJitter(brightness=0.3, saturation=0.5, hue=0.2, rgb_bands=(3, 2, 1)),
            RGBOnly(v2.ColorJitter(saturation=0.5, hue=0.3), rgb_bands=(3, 2, 1)),
            RGBOnly(v2.RandomGrayscale(1.0), rgb_bands=(3, 2, 1)),
            RGBOnly(v2.RandomPosterize(2, p=1.0), (3, 2, 1)),
        ],
    )
    def test_applies_to_the_chosen_bands_only(self, op):
        g = torch.Generator().manual_seed(0)
        sample = {"image": torch.rand(13, 16, 16, generator=g), "mask": torch.ones(16, 16, dtype=torch.long)}
        out = Augment([op], seed=1)(sample)
        untouched = [0, *range(4, 13)]
        if not isinstance(op, ColorJitter):  # ColorJitter's brightness changes all bands
            assert torch.equal(out["image"][untouched], sample["image"][untouched])
        assert not torch.equal(out["image"][1:4], sample["image"][1:4])
        assert torch.equal(out["mask"], sample["mask"])

    def test_rgb_bands_by_name(self):
        names = ["B01", "B02", "B03", "B04", "B05", "B06", "B07"]
        x = torch.rand(7, 8, 8)
        by_name = RandomSaturation((0.0, 0.0), rgb_bands=("B04", "B03", "B02"), bands=names)(x)
        by_pos = RandomSaturation((0.0, 0.0), rgb_bands=(3, 2, 1))(x)
        torch.testing.assert_close(by_name, by_pos)
        with pytest.raises(ValueError, match="are names; pass bands="):
            RandomSaturation(rgb_bands=("B04", "B03", "B02"))
        with pytest.raises(ValueError, match="band red='B99' is not one of the bands"):
            RandomSaturation(rgb_bands=("B99", "B03", "B02"), bands=names)(x)

    def test_three_band_images_need_no_rgb_bands(self):
        sample = {"image": torch.rand(3, 16, 16)}
        for op in (
            RandomHue(0.2),
            ColorJitter(0.2, 0.2, 0.2, 0.1),
            TrivialAugment(),
            v2.ColorJitter(0.2, 0.2, 0.2, 0.1),
        ):
            assert Augment([op], seed=0)(sample)["image"].shape == (3, 16, 16)

    @pytest.mark.parametrize(
        ("op", "name"),
        [
            (v2.ColorJitter(brightness=0.2), "ColorJitter"),
            (v2.TrivialAugmentWide(), "TrivialAugmentWide"),
            (v2.RandomApply([v2.RandomGrayscale()], p=0.1), "RandomGrayscale"),
            (v2.Compose([v2.RandomHorizontalFlip(), v2.RandAugment()]), "RandAugment"),
        ],
    )
    def test_torchvision_rgb_ops_are_refused_before_running(self, op, name):
        expected = f"torchvision's {name} only accept\\(s\\) 1- or 3-band images, but sample\\['image'\\] has 11 bands"
        with pytest.raises(ValueError, match=expected):
            Augment([op], seed=0)(make_sample(11))

    def test_rgb_only_refuses_geometric_transforms(self):
        with pytest.raises(ValueError, match="RGBOnly: RandomResizedCrop changed the RGB bands"):
            Augment([RGBOnly(v2.RandomResizedCrop(4), rgb_bands=(3, 2, 1))])(make_sample(7))

    def test_trivial_augment_draws_every_op_and_keeps_consistency(self):
        ops = set()
        aug = TrivialAugment(rgb_bands=(3, 2, 1), fill=0.0)
        for seed in range(150):
            spy = SpyTrivialAugment(rgb_bands=(3, 2, 1))
            sample = make_sample(7, seed=seed % 3)
            out = Augment([spy], seed=seed)(sample)
            ops.add(spy.seen[0])
            if spy.seen[0] in TrivialAugment._GEOMETRIC:
                assert_consistent(out, 7, exact_box=False)
            else:  # colour ops: other bands and the mask untouched
                untouched = [0, 4, 5, 6]
                assert torch.equal(out["image"][untouched], sample["image"][untouched])
                assert torch.equal(out["mask"], sample["mask"])
        assert ops == set(aug.ops)


class TestRandomness:
    def test_same_seed_same_output(self):
        ops = [v2.RandomAffine(30), RandomRot90(), RandomBrightness(0.3, per_band=True), RandomGaussianNoise(0.1)]
        sample = make_sample(13)
        a = Augment(ops, seed=7)(sample)
        b = Augment(ops, seed=7)(sample)
        c = Augment(ops, seed=8)(sample)
        assert torch.equal(a["image"], b["image"]) and torch.equal(a["mask"], b["mask"])
        assert not torch.equal(a["image"], c["image"])

    def test_calls_continue_the_stream_and_leave_the_global_rng(self):
        aug = Augment([RandomBrightness(0.5)], seed=1)
        x = {"image": torch.ones(7, 2, 2)}
        torch.manual_seed(0)
        expected = torch.rand(2)
        torch.manual_seed(0)
        first, second = aug(x)["image"], aug(x)["image"]
        assert not torch.equal(first, second)
        assert torch.equal(torch.rand(2), expected)

    def test_pickled_copies_reproduce(self):
        aug = Augment([v2.RandomAffine(30), RandomRot90(), TrivialAugment(rgb_bands=(3, 2, 1))], seed=4)
        copy = pickle.loads(pickle.dumps(aug))
        sample = make_sample(7)
        assert torch.equal(aug(sample)["image"], copy(sample)["image"])

    @pytest.mark.parametrize(
        "op",
        [
            RandomBrightness(0.2),
            RandomContrast(0.2),
            RandomGamma(),
            RandomGaussianNoise(0.1),
            RandomChannelDropout(),
            RandomHue(0.1, rgb_bands=(3, 2, 1)),
            RandomSaturation(0.1, rgb_bands=(3, 2, 1)),
            ColorJitter(0.1, 0.1, 0.1, 0.1, rgb_bands=(3, 2, 1)),
            RGBOnly(v2.RandomGrayscale(), rgb_bands=(3, 2, 1)),
            RandomRot90(),
            TrivialAugment(rgb_bands=(3, 2, 1)),
        ],
        ids=lambda op: type(op).__name__,
    )
    def test_every_op_pickles(self, op):
        copy = pickle.loads(pickle.dumps(op))
        assert type(copy) is type(op)
        torch.manual_seed(0)
        a = op(torch.rand(7, 8, 8))
        torch.manual_seed(0)
        b = copy(torch.rand(7, 8, 8))
        assert torch.equal(a, b)


class SampleDataset(Dataset):
    def __init__(self, augment: Augment) -> None:
        self.augment = augment

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        out = self.augment(make_sample(7, h=16, w=16, seed=0))  # the same input every time
        return out["image"]


class TestDataLoader:
    def run(self, seed: int) -> list[torch.Tensor]:
        torch.manual_seed(123)  # transforms built after seeding torch get the same salts
        aug = Augment([v2.RandomAffine(30), RandomBrightness(0.3, per_band=True)])
        loader = DataLoader(
            SampleDataset(aug),
            batch_size=None,
            num_workers=2,
            generator=torch.Generator().manual_seed(seed),
            multiprocessing_context="fork",
        )
        return list(loader)

    def test_two_transforms_in_one_worker_draw_different_numbers(self):
        x = {"image": torch.ones(7, 4, 4)}
        a, b = Augment([RandomBrightness(0.5)]), Augment([RandomBrightness(0.5)])
        assert not torch.equal(a(x)["image"], b(x)["image"])

    def test_workers_draw_their_own_reproducible_streams(self):
        a, b, c = self.run(0), self.run(0), self.run(1)
        assert all(torch.equal(x, y) for x, y in zip(a, b))
        assert not all(torch.equal(x, y) for x, y in zip(a, c))
        # items 0 and 1 come from worker 0 and worker 1 (first item of each): different augmentations
        assert not torch.equal(a[0], a[1])
        assert len({tuple(x.flatten().tolist()) for x in a}) == 8


class TestErrors:
    def test_sample_checks(self):
        aug = Augment([v2.RandomHorizontalFlip()])
        with pytest.raises(KeyError, match="has no 'image' entry"):
            aug({"mask": torch.zeros(2, 2)})
        with pytest.raises(ValueError, match=r"must be a \[C, H, W\] tensor, got \(4, 4\)"):
            aug({"image": torch.zeros(4, 4)})
        with pytest.raises(ValueError, match=r"must hold boxes as \[N, 4\]"):
            aug({"image": torch.zeros(3, 4, 4), "boxes": torch.zeros(4)})
        with pytest.raises(TypeError, match="expects a sample dict or an image tensor"):
            aug([torch.zeros(3, 4, 4)])

    def test_construction_checks(self):
        with pytest.raises(TypeError, match="transform 1 is not callable"):
            Augment([v2.RandomHorizontalFlip(), "flip"])
        with pytest.raises(ValueError, match="box format of 'boxes' must be XYXY"):
            Augment([], box_keys={"boxes": "XYXYXYXY"})
        with pytest.raises(ValueError, match="p must be a probability"):
            RandomBrightness(p=1.5)
        with pytest.raises(ValueError, match="brightness must be non-negative"):
            RandomBrightness(-0.1)
        with pytest.raises(ValueError, match="gamma must be positive"):
            RandomGamma((0.0, 1.0))
        with pytest.raises(ValueError, match="hue must lie within"):
            RandomHue((0.0, 0.7))
        with pytest.raises(TypeError, match="rgb_bands must be three bands"):
            RandomHue(rgb_bands=(1, 2))
        with pytest.raises(ValueError, match="num_channels must be an int >= 1"):
            RandomChannelDropout(0)

    def test_runtime_checks_name_the_op(self):
        with pytest.raises(ValueError, match="cannot drop up to 7 of 7 bands"):
            RandomChannelDropout(7, p=1.0)(torch.rand(7, 2, 2))
        with pytest.raises(ValueError, match="std has 2 values but the image has 7 bands"):
            RandomGaussianNoise([0.1, 0.2])(torch.rand(7, 2, 2))
        with pytest.raises(ValueError, match=r"fill -1\.0 is not a valid torch\.uint8 value"):
            RandomChannelDropout(1, fill=-1, p=1.0)(torch.ones(7, 2, 2, dtype=torch.uint8))
        with pytest.raises(IndexError, match="rgb band 9 is out of range for an image with 7 bands"):
            RandomHue(0.1, rgb_bands=(9, 2, 1))(torch.rand(7, 2, 2))

    def test_failures_inside_a_step_say_which_step(self):
        def broken(data):
            raise RuntimeError("boom")

        with pytest.raises(RuntimeError, match="boom") as info:
            Augment([v2.RandomHorizontalFlip(), broken])({"image": torch.zeros(3, 2, 2)})
        notes = getattr(info.value, "__notes__", ["in Augment step 1 (function)"])
        assert "in Augment step 1 (function)" in notes

    def test_boxes_tv_tensor_direct(self):
        boxes = tv_tensors.BoundingBoxes([[0, 0, 1, 2]], format="XYXY", canvas_size=(2, 3))
        assert RandomRot90(k=(2,))(boxes).tolist() == [[2, 0, 3, 2]]


def test_importing_transforms_does_not_import_torchvision():
    code = (
        "import sys, pipekit\n"
        "before = 'torchvision' in sys.modules\n"
        "import pipekit.transforms, pipekit.pipes._sample_transforms\n"
        "from pipekit.transforms import AppendNDVI, BatchRandomCrop, Normalize, compute_stats\n"
        "assert ('torchvision' in sys.modules) == before, 'pipekit.transforms imported torchvision eagerly'\n"
        "from pipekit.transforms import Augment\n"
        "assert 'torchvision' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
