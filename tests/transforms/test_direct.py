"""pipekit.transforms._direct: torchvision's crop and flips from a generator, equal to the transforms."""

from __future__ import annotations

import pytest
import torch
from torchvision.transforms import v2

from pipekit.transforms._direct import direct_image_ops
from pipekit.transforms.seeding import RandomStream

SHAPES = [(3, 256, 320), (3, 20, 900), (3, 900, 20), (1, 5, 5), (3, 1, 1), (3, 224, 224), (2, 3, 7, 9)]


def _images(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for shape in SHAPES:
        hwc = torch.randint(0, 256, (*shape[:-3], shape[-2], shape[-1], shape[-3]), dtype=torch.uint8, generator=g)
        out.append(hwc.movedim(-1, -3))  # a channels-last view, as decode_jpeg returns
        out.append(out[-1].contiguous())
    return out


OPS = {
    "train": lambda: [v2.RandomResizedCrop(24), v2.RandomHorizontalFlip()],
    "ratio_scale": lambda: [v2.RandomResizedCrop((12, 30), scale=(0.5, 0.9), ratio=(0.2, 5.0), antialias=False)],
    "flips": lambda: [v2.RandomVerticalFlip(0.3), v2.RandomHorizontalFlip(1.0), v2.RandomVerticalFlip(0.0)],
    "nearest": lambda: [v2.RandomResizedCrop(8, interpolation=v2.InterpolationMode.NEAREST), v2.RandomVerticalFlip()],
}


@pytest.mark.parametrize("name", sorted(OPS))
@pytest.mark.parametrize("seed", [0, 7])
def test_same_images_and_stream_as_the_transforms(name, seed):
    ops = OPS[name]()
    steps = direct_image_ops(ops)
    assert steps is not None and len(steps) == len(ops)
    reference, direct = RandomStream(seed), RandomStream(seed)
    for _ in range(6):  # enough draws to cover the crop's retries and its central-crop fallback
        for image in _images(seed):
            with reference.torch_global():
                expected = image
                for op in ops:
                    expected = op(expected)
            got = image
            for step in steps:
                got = step(got, direct.generator())
            assert got.shape == expected.shape and got.stride() == expected.stride()
            assert torch.equal(got, expected)
    assert torch.equal(direct.state_dict()["torch"], reference.state_dict()["torch"])


def test_the_central_crop_fallback_is_reached_and_matches():
    op = v2.RandomResizedCrop(4, scale=(0.99, 1.0), ratio=(3.0, 4.0))  # never fits a tall image: fallback
    (step,) = direct_image_ops([op])
    image = torch.arange(40 * 6, dtype=torch.uint8).reshape(1, 40, 6)
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    assert torch.equal(step(image, g), op(image))
    assert torch.equal(g.get_state(), torch.get_rng_state())  # 10 failed tries drawn from each


class _MyCrop(v2.RandomResizedCrop):
    pass


@pytest.mark.parametrize(
    "ops", [[v2.ColorJitter(0.5)], [v2.RandomHorizontalFlip(), _MyCrop(8)], [v2.TrivialAugmentWide()]]
)
def test_other_ops_or_subclasses_are_not_taken(ops):
    assert direct_image_ops(ops) is None


def test_an_empty_list_is_no_steps():
    assert direct_image_ops([]) == []


@pytest.mark.parametrize("name", sorted(OPS))
def test_steps_pickle_and_draw_the_same(name):
    import pickle

    steps = direct_image_ops(OPS[name]())
    copies = pickle.loads(pickle.dumps(steps))
    image = _images(3)[0]
    outs = []
    for chain in (steps, copies):
        g = torch.Generator().manual_seed(5)
        out = image
        for step in chain:
            out = step(out, g)
        outs.append(out)
    assert torch.equal(outs[0], outs[1])


def test_a_uint8_crop_is_resized_without_torchvision_s_layers(monkeypatch):
    """The usual training sample (a decoded JPEG's channels-last uint8 view, cropped smaller than the image)
    goes straight to torch's kernel, with the pixels and layout torchvision's resize gives it."""
    import pipekit.transforms._direct as direct

    op = v2.RandomResizedCrop(24)
    (step,) = direct_image_ops([op])
    image = torch.randint(0, 256, (50, 60, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    image = image.movedim(-1, -3)
    g = torch.Generator().manual_seed(2)
    torch.manual_seed(2)
    expected = op(image)
    monkeypatch.setattr(direct.F, "resized_crop_image", lambda *a, **k: pytest.fail("torchvision's path taken"))
    got = step(image, g)
    assert torch.equal(got, expected) and got.stride() == expected.stride()
