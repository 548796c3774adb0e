"""Spectral index kernels (pipekit.transforms.index_kernels) against direct numpy computations."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import torch

from pipekit.transforms import index_kernels
from pipekit.transforms.index_kernels import (
    INDICES,
    BandMathError,
    band_math,
    evi,
    ndvi,
    normalized_difference,
    parse_band_math,
    savi,
    tri_band_normalized_difference,
)

CUDA = torch.cuda.is_available()

# role -> numpy formula over a dict of float64 band arrays
ND = {
    "ndvi": ("nir", "red"),
    "ndwi": ("green", "nir"),
    "mndwi": ("green", "swir"),
    "ndbi": ("swir", "nir"),
    "ndsi": ("green", "swir"),
    "nbr": ("nir", "swir"),
    "ndre": ("nir", "vre1"),
    "gndvi": ("nir", "green"),
    "bndvi": ("nir", "blue"),
    "swi": ("vre1", "swir2"),
    "normalized_difference": ("a", "b"),
}
TRI = {
    "grndvi": ("nir", "green", "red"),
    "gbndvi": ("nir", "green", "blue"),
    "rbndvi": ("nir", "red", "blue"),
    "tri_band_normalized_difference": ("a", "b", "c"),
}


def np_nd(a, b):
    with np.errstate(divide="ignore", invalid="ignore"):
        out = (a - b) / (a + b)
    return np.where(a + b == 0, 0.0, out)


def np_tri(a, b, c):
    with np.errstate(divide="ignore", invalid="ignore"):
        out = (a - (b + c)) / (a + b + c)
    return np.where(a + b + c == 0, 0.0, out)


@pytest.fixture
def image():
    g = torch.Generator().manual_seed(0)
    return torch.rand(13, 16, 16, generator=g, dtype=torch.float64) * 2 - 0.3  # includes negatives


def positions_for(roles, seed=0):
    rng = np.random.default_rng(seed)
    return dict(zip(roles, rng.choice(13, size=len(roles), replace=False).tolist()))


class TestFormulas:
    @pytest.mark.parametrize("name", sorted(ND))
    def test_normalized_differences_match_numpy(self, image, name):
        roles = ND[name]
        pos = positions_for(roles, seed=len(name))
        out = INDICES[name].kernel(image, **pos)
        arr = image.numpy()
        expected = np_nd(arr[pos[roles[0]]], arr[pos[roles[1]]])
        assert out.shape == (1, 16, 16)
        np.testing.assert_allclose(out[0].numpy(), expected, rtol=1e-12, atol=1e-12)

    @pytest.mark.parametrize("name", sorted(TRI))
    def test_tri_band_indices_match_numpy(self, image, name):
        roles = TRI[name]
        pos = positions_for(roles, seed=len(name))
        out = INDICES[name].kernel(image, **pos)
        arr = image.numpy()
        expected = np_tri(*(arr[pos[r]] for r in roles))
        np.testing.assert_allclose(out[0].numpy(), expected, rtol=1e-12, atol=1e-12)

    def test_registry_roles_match_the_table(self):
        for name, roles in {**ND, **TRI}.items():
            assert INDICES[name].roles == roles
        assert INDICES["evi"].roles == ("nir", "red", "blue")
        assert INDICES["savi"].roles == ("nir", "red")

    def test_named_indices_read_the_documented_bands(self):
        # Hand-made: bands 0..3 hold 1, 2, 3, 4; each index's value tells which bands it read in which order.
        img = torch.arange(1.0, 5.0).reshape(4, 1, 1)
        assert float(index_kernels.ndvi(img, nir=3, red=0)) == pytest.approx(3 / 5)
        assert float(index_kernels.ndwi(img, green=1, nir=3)) == pytest.approx(-2 / 6)
        assert float(index_kernels.ndbi(img, swir=2, nir=3)) == pytest.approx(-1 / 7)
        assert float(index_kernels.nbr(img, nir=3, swir=2)) == pytest.approx(1 / 7)
        assert float(index_kernels.swi(img, vre1=0, swir2=3)) == pytest.approx(-3 / 5)
        assert float(index_kernels.grndvi(img, nir=3, green=1, red=0)) == pytest.approx((4 - 3) / 7)
        # positional order is the role order
        assert float(index_kernels.ndvi(img, 3, 0)) == pytest.approx(3 / 5)

    def test_evi_standard_coefficients(self, image):
        arr = np.abs(image.numpy())
        x = torch.from_numpy(arr)
        out = evi(x, nir=7, red=3, blue=1)
        n, r, b = arr[7], arr[3], arr[1]
        expected = 2.5 * (n - r) / (n + 6 * r - 7.5 * b + 1)
        np.testing.assert_allclose(out[0].numpy(), expected, rtol=1e-12)
        # hand-made
        one = torch.tensor([[[0.5]], [[0.1]], [[0.05]]])
        assert float(evi(one, 0, 1, 2)) == pytest.approx(2.5 * 0.4 / (0.5 + 0.6 - 0.375 + 1.0), rel=1e-6)
        custom = evi(x, nir=7, red=3, blue=1, G=2.0, C1=5.0, C2=7.0, L=0.5)
        np.testing.assert_allclose(custom[0].numpy(), 2.0 * (n - r) / (n + 5 * r - 7 * b + 0.5), rtol=1e-12)

    def test_savi(self, image):
        arr = np.abs(image.numpy())
        x = torch.from_numpy(arr)
        for soil in (0.5, 0.25, 1.0):
            out = savi(x, nir=2, red=5, L=soil)
            expected = (1 + soil) * (arr[2] - arr[5]) / (arr[2] + arr[5] + soil)
            np.testing.assert_allclose(out[0].numpy(), expected, rtol=1e-12)

    def test_scale_and_offset_are_applied_before_the_formula(self):
        raw = torch.tensor([[[20000, 8000]], [[12000, 8000]]], dtype=torch.uint16)  # nir, red
        out = ndvi(raw, nir=0, red=1, scale=0.0000275, offset=-0.2)
        refl = raw.double().numpy() * 0.0000275 - 0.2
        np.testing.assert_allclose(out[0].numpy(), np_nd(refl[0], refl[1]), rtol=1e-6)
        # scale alone does not change a normalized difference
        torch.testing.assert_close(ndvi(raw, nir=0, red=1, scale=1e-4), ndvi(raw, nir=0, red=1))

    def test_negative_positions_count_from_the_end(self, image):
        torch.testing.assert_close(ndvi(image, nir=-1, red=-2), ndvi(image, nir=12, red=11))


class TestZeroDenominatorsAndNodata:
    def test_zero_denominator_gives_fill_never_nan_or_inf(self):
        img = torch.tensor([[[0.0, 1.0, 2.0]], [[0.0, -1.0, 2.0]]])
        out = normalized_difference(img, 0, 1)
        assert out.flatten().tolist() == [0.0, 0.0, 0.0]
        out = normalized_difference(img, 0, 1, fill=-5.0)
        assert out.flatten().tolist() == [-5.0, -5.0, 0.0]
        for name in INDICES:
            roles = INDICES[name].roles
            zeros = torch.zeros(len(roles), 4, 4)
            if name in ("evi", "savi"):
                continue  # their L term keeps the denominator away from 0 at 0 reflectance
            result = INDICES[name].kernel(zeros, **{r: i for i, r in enumerate(roles)})
            assert torch.isfinite(result).all(), name
            assert (result == 0).all(), name

    def test_evi_and_savi_zero_denominators(self):
        # nir + 6 red - 7.5 blue + 1 == 0  with nir=0.5, red=0, blue=0.2
        img = torch.tensor([[[0.5]], [[0.0]], [[0.2]]], dtype=torch.float64)
        assert float(evi(img, 0, 1, 2)) == 0.0
        assert float(evi(img, 0, 1, 2, fill=7.0)) == 7.0
        img = torch.tensor([[[-0.25]], [[-0.25]]], dtype=torch.float64)
        assert float(savi(img, 0, 1)) == 0.0

    def test_nodata_in_any_input_band_stays_nodata(self):
        img = torch.tensor([[[5, 0, 3, 3]], [[1, 3, 0, 1]], [[0, 0, 0, 0]]], dtype=torch.int16)
        out = normalized_difference(img, 0, 1, nodata=0)
        assert out.dtype == torch.float32
        vals = out.flatten().tolist()
        assert vals[0] == pytest.approx(4 / 6)
        assert math.isnan(vals[1]) and math.isnan(vals[2])
        assert vals[3] == pytest.approx(0.5)
        # band 2 (all zero) is not read by the index: it does not matter
        out = normalized_difference(img, 0, 1, nodata=0, nodata_out=-9999.0)
        assert out.flatten().tolist()[1:3] == [-9999.0, -9999.0]

    def test_nan_and_inf_inputs_are_nodata(self):
        img = torch.tensor([[[float("nan"), float("inf"), 1.0]], [[1.0, 1.0, 3.0]]])
        out = ndvi(img, nir=0, red=1)
        assert math.isnan(out[0, 0, 0]) and math.isnan(out[0, 0, 1])
        assert float(out[0, 0, 2]) == pytest.approx(-0.5)
        out = ndvi(img, nir=0, red=1, nodata_out=0.0)
        assert out.flatten().tolist()[:2] == [0.0, 0.0]

    def test_nodata_is_checked_on_raw_values(self):
        raw = torch.tensor([[[0, 100]], [[50, 50]]], dtype=torch.uint16)
        out = ndvi(raw, 0, 1, nodata=0, scale=1e-4, offset=0.1)
        assert math.isnan(out[0, 0, 0])
        assert torch.isfinite(out[0, 0, 1])

    def test_nan_nodata_value(self):
        img = torch.tensor([[[float("nan"), 2.0]], [[1.0, 1.0]]])
        out = ndvi(img, 0, 1, nodata=float("nan"), nodata_out=-1.0)
        assert out.flatten().tolist() == [-1.0, pytest.approx(1 / 3)]


class TestDtypesShapesDevices:
    @pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
    def test_float_dtypes_are_kept(self, image, dtype):
        x = image.abs().to(dtype)
        out = ndvi(x, nir=4, red=2)
        assert out.dtype == dtype
        ref = np_nd(x.double().numpy()[4], x.double().numpy()[2])
        tol = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 1e-6, torch.float64: 1e-12}[dtype]
        np.testing.assert_allclose(out[0].double().numpy(), ref, atol=tol, rtol=tol)

    def test_half_inputs_are_computed_in_float32(self):
        # a + b = 90000 overflows float16 (max 65504); computed in float32 the index is exact.
        x = torch.tensor([[[60000.0]], [[30000.0]]], dtype=torch.float16)
        out = normalized_difference(x, 0, 1)
        assert out.dtype == torch.float16
        assert float(out) == pytest.approx(1 / 3, rel=1e-3)

    def test_half_results_are_clamped_finite(self):
        x = torch.tensor([[[1.0]], [[1.0]]], dtype=torch.float16)
        out = band_math(x, "a * 1000000", a=0)
        assert out.dtype == torch.float16
        assert float(out) == float(torch.finfo(torch.float16).max)

    @pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.uint16, torch.int32])
    def test_integer_inputs_give_float32(self, dtype):
        x = torch.tensor([[[200, 10]], [[100, 10]]]).to(dtype)
        out = ndvi(x, 0, 1)
        assert out.dtype == torch.float32
        assert out.flatten().tolist() == [pytest.approx(1 / 3), 0.0]

    def test_batches_and_leading_dims(self, image):
        batch = torch.stack([image, image * 0.5 + 0.1, image.flip(-1)])
        out = ndvi(batch, nir=7, red=3)
        assert out.shape == (3, 1, 16, 16)
        for i in range(3):
            torch.testing.assert_close(out[i], ndvi(batch[i], nir=7, red=3))
        series = torch.stack([batch, batch])  # [T, B, C, H, W]
        assert ndvi(series, nir=7, red=3).shape == (2, 3, 1, 16, 16)

    def test_output_appends_with_cat(self, image):
        out = torch.cat((image, evi(image.abs(), 7, 3, 1)), dim=-3)
        assert out.shape == (14, 16, 16)

    @pytest.mark.skipif(not CUDA, reason="needs CUDA")
    @pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.uint16])
    def test_cuda_matches_cpu(self, image, dtype):
        x = (image.abs() * 1000).to(dtype)
        for name, spec in INDICES.items():
            pos = {r: i for i, r in enumerate(spec.roles)}
            cpu = spec.kernel(x, **pos)
            gpu = spec.kernel(x.cuda(), **pos)
            assert gpu.device.type == "cuda" and gpu.dtype == cpu.dtype
            torch.testing.assert_close(gpu.cpu(), cpu, msg=name)


class TestBandMath:
    def test_formula_matches_numpy(self, image):
        arr = image.abs().numpy()
        x = torch.from_numpy(arr)
        out = band_math(x, "(nir - red) / (nir + red)", nir=7, red=3)
        torch.testing.assert_close(out, ndvi(x, nir=7, red=3))
        out = band_math(x, "2.5 * (nir - red) / (nir + 6 * red - 7.5 * blue + 1)", nir=7, red=3, blue=1)
        torch.testing.assert_close(out, evi(x, 7, 3, 1))
        out = band_math(x, "sqrt(abs(a - b)) ** 2 + -c + max(a, 0.5) - min(b, c) + exp(log(a))", a=0, b=1, c=2)
        a, b, c = arr[0], arr[1], arr[2]
        expected = np.sqrt(np.abs(a - b)) ** 2 - c + np.maximum(a, 0.5) - np.minimum(b, c) + np.exp(np.log(a))
        np.testing.assert_allclose(out[0].numpy(), expected, rtol=1e-10)

    def test_zero_division_and_non_finite_give_fill(self):
        x = torch.tensor([[[1.0, 0.0, 4.0]], [[0.0, 0.0, 2.0]]])
        assert band_math(x, "a / b", a=0, b=1).flatten().tolist() == [0.0, 0.0, 2.0]
        assert band_math(x, "a / b", a=0, b=1, fill=-1).flatten().tolist() == [-1.0, -1.0, 2.0]
        assert band_math(x, "a / 0", a=0).flatten().tolist() == [0.0, 0.0, 0.0]
        assert band_math(x, "sqrt(b - a)", a=0, b=1).flatten().tolist() == [0.0, 0.0, 0.0]  # sqrt(<0) -> fill
        assert band_math(x, "log(b)", b=1).flatten().tolist() == [0.0, 0.0, pytest.approx(math.log(2))]

    def test_nodata(self):
        x = torch.tensor([[[1.0, -9.0]], [[2.0, 2.0]]])
        out = band_math(x, "a + b", a=0, b=1, nodata=-9)
        assert out[0, 0, 0] == 3.0 and math.isnan(out[0, 0, 1])

    @pytest.mark.parametrize(
        "expression",
        [
            "__import__('os').system('echo hi')",
            "a.real",
            "a[0]",
            "(lambda: 1)()",
            "a if b else c",
            "a == b",
            "'text'",
            "True + a",
            "open('x')",
            "a @ b",
            "a // b",
            "[a]",
            "max(a, b, c)",
            "sqrt",
            "a +",
        ],
    )
    def test_only_arithmetic_is_allowed(self, expression):
        with pytest.raises(BandMathError):
            band_math(torch.ones(3, 2, 2), expression, a=0, b=1, c=2)

    def test_errors_name_the_problem(self):
        x = torch.ones(3, 2, 2)
        with pytest.raises(ValueError, match=r"uses band\(s\) \['nir'\] with no position"):
            band_math(x, "nir - red", red=0)
        with pytest.raises(BandMathError, match="uses no band"):
            band_math(x, "1 + 2")
        with pytest.raises(BandMathError, match="function 'pow' is not allowed"):
            band_math(x, "pow(a, 2)", a=0)
        with pytest.raises(TypeError, match="expression must be a string"):
            band_math(x, 3)

    def test_parse_reports_band_names_in_order(self):
        assert parse_band_math("swir2 * 2 - (nir + swir2)")[1] == ("swir2", "nir")

    def test_huge_constant_powers_do_not_hang(self):
        x = torch.ones(1, 1, 1)
        assert float(band_math(x, "a + 9 ** 9 ** 9", a=0)) == 0.0  # overflow -> non-finite -> fill


class TestErrors:
    def test_band_out_of_range(self, image):
        with pytest.raises(IndexError, match="ndvi: band nir=13 is out of range for an image with 13 bands"):
            ndvi(image, nir=13, red=0)

    def test_band_must_be_an_integer(self, image):
        with pytest.raises(TypeError, match="band red must be an integer position"):
            ndvi(image, nir=1, red="B04")
        with pytest.raises(TypeError, match="band a must be an integer"):
            normalized_difference(image, 1.0, 2)

    def test_missing_and_unknown_bands(self, image):
        with pytest.raises(TypeError, match="missing band position"):
            ndvi(image, nir=1)
        with pytest.raises(TypeError, match="unexpected keyword argument 'swir'"):
            ndvi(image, nir=1, red=2, swir=3)
        with pytest.raises(TypeError, match="multiple values for band 'nir'"):
            ndvi(image, 1, 2, nir=3)

    def test_image_shape_and_dtype(self):
        with pytest.raises(ValueError, match="band axis at -3"):
            ndvi(torch.ones(4, 4), 0, 1)
        with pytest.raises(TypeError, match="real number tensor"):
            ndvi(torch.ones(2, 4, 4, dtype=torch.bool), 0, 1)
        with pytest.raises(TypeError, match=r"must be a torch\.Tensor"):
            ndvi(np.ones((2, 4, 4)), 0, 1)

    def test_bad_options(self, image):
        with pytest.raises(ValueError, match="fill must be finite"):
            ndvi(image, 0, 1, fill=float("nan"))
        with pytest.raises(TypeError, match="scale must be a number"):
            ndvi(image, 0, 1, scale="x")

    def test_tri_band_arguments(self, image):
        out = tri_band_normalized_difference(image, 0, 1, 2)
        assert out.shape == (1, 16, 16)


def test_kernels_pickle_by_name():
    for spec in INDICES.values():
        assert pickle.loads(pickle.dumps(spec.kernel)) is spec.kernel
