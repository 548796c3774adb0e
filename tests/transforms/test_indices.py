"""pipekit.transforms.indices: TorchGeo 0.8's ``torchgeo.transforms.indices`` module, class by class.

The side-by-side class runs only where TorchGeo imports (the bench environment:
``$VB/bin/python -m pytest tests/transforms/test_indices.py``).
"""

from __future__ import annotations

import inspect

import pytest
import torch

import pipekit.transforms
from pipekit.transforms import index_kernels, indices, spectral

# TorchGeo 0.8.1's torchgeo.transforms.indices: class -> its constructor's arguments, in order
TORCHGEO_08 = {
    "AppendNormalizedDifferenceIndex": ("index_a", "index_b"),
    "AppendNBR": ("index_nir", "index_swir"),
    "AppendNDBI": ("index_swir", "index_nir"),
    "AppendNDSI": ("index_green", "index_swir"),
    "AppendNDVI": ("index_nir", "index_red"),
    "AppendNDWI": ("index_green", "index_nir"),
    "AppendSWI": ("index_vre1", "index_swir2"),
    "AppendGNDVI": ("index_nir", "index_green"),
    "AppendBNDVI": ("index_nir", "index_blue"),
    "AppendNDRE": ("index_nir", "index_vre1"),
    "AppendTriBandNormalizedDifferenceIndex": ("index_a", "index_b", "index_c"),
    "AppendGRNDVI": ("index_nir", "index_green", "index_red"),
    "AppendGBNDVI": ("index_nir", "index_green", "index_blue"),
    "AppendRBNDVI": ("index_nir", "index_red", "index_blue"),
}


def reference(image: torch.Tensor, positions: tuple[int, ...]) -> torch.Tensor:
    """``(A - (B [+ C])) / (A + B [+ C])`` in float64, as ``[..., 1, H, W]``."""
    x = image.double()
    a = x[..., positions[0], :, :]
    d = sum(x[..., p, :, :] for p in positions[1:])
    return ((a - d) / (a + d)).unsqueeze(-3)


def image_with_zero_denominators(shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """Positive bands in 0.01..1, with pixel (0, 0) all zeros (every denominator 0)."""
    g = torch.Generator().manual_seed(seed)
    image = 0.01 + 0.99 * torch.rand(shape, generator=g)
    image[..., 0, 0] = 0.0
    return image


class TestModule:
    def test_has_every_torchgeo_class_with_its_arguments(self):
        for name, args in TORCHGEO_08.items():
            cls = getattr(indices, name)
            assert cls is getattr(spectral, name) is getattr(pipekit.transforms, name)
            params = list(inspect.signature(cls).parameters.values())
            assert tuple(p.name for p in params[: len(args)]) == args, name
            assert all(p.kind is p.POSITIONAL_OR_KEYWORD for p in params[: len(args)]), name
            assert name in indices.__all__

    def test_kernels_keep_their_old_import_path(self):
        for name in index_kernels.__all__:
            assert getattr(indices, name) is getattr(index_kernels, name), name
        from pipekit.transforms.indices import INDICES, band_math, ndvi  # the pre-issue-15 spelling

        assert INDICES is index_kernels.INDICES and ndvi is index_kernels.ndvi and band_math is index_kernels.band_math

    @pytest.mark.parametrize("name", list(TORCHGEO_08))
    def test_call_semantics(self, name):
        positions = (4, 3, 1)[: len(TORCHGEO_08[name])]
        t = getattr(indices, name)(*positions)
        image = image_with_zero_denominators((6, 5, 7))
        out = t(image)
        assert out.shape == (1, 7, 5, 7)
        torch.testing.assert_close(out[0, :6], image)
        expected = reference(image, positions)
        expected[..., 0, 0] = 0.0  # zero denominator: 0, never NaN or Inf
        torch.testing.assert_close(out[0, 6:].double(), expected)
        batch = torch.stack([image, image.flip(-1)])
        assert t(batch).shape == (2, 7, 5, 7)
        torch.testing.assert_close(t(batch)[1], t(image.flip(-1))[0])
        sample = {"image": image, "label": 3}
        got = t(sample)
        assert got["image"].shape == (7, 5, 7) and got["label"] == 3
        torch.testing.assert_close(got["image"], out[0])


@pytest.fixture(scope="module")
def tg():
    return pytest.importorskip("torchgeo.transforms.indices")


class TestSideBySideWithTorchGeo:
    """The same calls on pipekit's and TorchGeo's classes: the same shapes, the same values where denominators
    are not zero; where they are, pipekit's documented 0 (TorchGeo's 1e-10 gives 0 in float32, NaN in float16)."""

    @pytest.mark.parametrize("name", list(TORCHGEO_08))
    @pytest.mark.parametrize("shape", [(13, 9, 11), (4, 13, 9, 11)], ids=["CHW", "BCHW"])
    def test_same_shapes_and_values(self, tg, name, shape):
        args = TORCHGEO_08[name]
        kwargs = dict(zip(args, (7, 3, 11)))
        ours, theirs = getattr(indices, name)(**kwargs), getattr(tg, name)(**kwargs)
        image = image_with_zero_denominators(shape, seed=len(name))
        a, b = ours(image), theirs(image)
        batch_dims = (1,) if len(shape) == 3 else shape[:1]
        assert a.shape == b.shape == (*batch_dims, 14, 9, 11)
        assert a.dtype == b.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # includes the 0/0 pixel: 0 in both in float32
        # chained, as in TorchGeo's tutorial
        chain_ours = torch.nn.Sequential(ours, getattr(indices, name)(**kwargs))
        chain_theirs = torch.nn.Sequential(theirs, getattr(tg, name)(**kwargs))
        torch.testing.assert_close(chain_ours(image), chain_theirs(image), rtol=1e-5, atol=1e-6)

    @pytest.mark.parametrize("name", ["AppendNDVI", "AppendGRNDVI"])
    @pytest.mark.parametrize("keepdim", [None, False, True])
    def test_inside_kornia_augmentation_sequential(self, tg, name, keepdim):
        kornia_aug = pytest.importorskip("kornia.augmentation")
        kwargs = dict(zip(TORCHGEO_08[name], (7, 3, 11)))
        batch = {"image": image_with_zero_denominators((2, 13, 8, 8)), "mask": torch.zeros(2, 1, 8, 8)}
        sample = {"image": image_with_zero_denominators((13, 8, 8))}
        results = []
        for module in (indices, tg):
            torch.manual_seed(0)
            aug = kornia_aug.AugmentationSequential(
                getattr(module, name)(**kwargs), kornia_aug.RandomHorizontalFlip(p=0.5), data_keys=None, keepdim=keepdim
            )
            results.append((aug(dict(batch)), aug(dict(sample))))
        (ours_b, ours_s), (theirs_b, theirs_s) = results
        for key in ("image", "mask"):
            torch.testing.assert_close(ours_b[key], theirs_b[key])
        if keepdim:
            # kornia hands its keepdim only to its own augmentations: a single [C, H, W] image needs
            # pipekit's transform built with keepdim=True there (documented in pipekit.transforms._spectral)
            assert ours_s["image"].shape == (1, 14, 8, 8) and theirs_s["image"].shape == (14, 8, 8)
            torch.manual_seed(0)
            aug = kornia_aug.AugmentationSequential(
                getattr(indices, name)(**kwargs, keepdim=True), kornia_aug.RandomHorizontalFlip(p=0.5), data_keys=None,
                keepdim=True,
            )
            ours_s = aug(dict(sample))
        torch.testing.assert_close(ours_s["image"], theirs_s["image"])

    def test_documented_differences_at_zero_denominators(self, tg):
        ours, theirs = indices.AppendNDVI(index_nir=0, index_red=1), tg.AppendNDVI(index_nir=0, index_red=1)
        # pixel 0: 0 / 0; pixel 1: nir = -red (signed, normalised data); pixel 2: an ordinary one
        image = torch.tensor([[[0.0, 0.3, 0.5]], [[0.0, -0.3, 0.25]]])
        assert ours(image)[0, 2].tolist() == [[0.0, 0.0, pytest.approx(1 / 3)]]
        tg_float = theirs(image)[0, 2]
        assert tg_float[0, 0] == 0.0 and abs(float(tg_float[0, 1])) > 1e9  # TorchGeo: 0.6 / 1e-10
        tg_half = theirs(image.half())[0, 2]
        assert tg_half[0, 0].isnan() and tg_half[0, 1].isinf()  # 1e-10 rounds to 0 in float16
        ours_half = ours(image.half())[0, 2]
        assert ours_half.dtype == torch.float16 and ours_half[0, :2].tolist() == [0.0, 0.0]
