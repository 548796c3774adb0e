"""AppendIndex and the TorchGeo-named shortcuts (pipekit.transforms._spectral)."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import torch

from pipekit.geo import stack_samples
from pipekit.transforms import (
    AppendBandMath,
    AppendBNDVI,
    AppendEVI,
    AppendGBNDVI,
    AppendGNDVI,
    AppendGRNDVI,
    AppendIndex,
    AppendMNDWI,
    AppendNBR,
    AppendNDBI,
    AppendNDRE,
    AppendNDSI,
    AppendNDVI,
    AppendNDWI,
    AppendNormalizedDifferenceIndex,
    AppendRBNDVI,
    AppendSAVI,
    AppendSWI,
    AppendTriBandNormalizedDifferenceIndex,
)
from pipekit.transforms.indices import INDICES

# Landsat 8 reflective bands: coastal, blue, green, red, nir, swir1, swir2
LANDSAT8 = ("SR_B1", "SR_B2", "SR_B3", "SR_B4", "SR_B5", "SR_B6", "SR_B7")
CUDA = torch.cuda.is_available()

# shortcut class -> (index name, {TorchGeo keyword: role})
SHORTCUTS = {
    AppendNDVI: ("ndvi", {"index_nir": "nir", "index_red": "red"}),
    AppendNDWI: ("ndwi", {"index_green": "green", "index_nir": "nir"}),
    AppendMNDWI: ("mndwi", {"index_green": "green", "index_swir": "swir"}),
    AppendNDBI: ("ndbi", {"index_swir": "swir", "index_nir": "nir"}),
    AppendNDSI: ("ndsi", {"index_green": "green", "index_swir": "swir"}),
    AppendNBR: ("nbr", {"index_nir": "nir", "index_swir": "swir"}),
    AppendNDRE: ("ndre", {"index_nir": "nir", "index_vre1": "vre1"}),
    AppendGNDVI: ("gndvi", {"index_nir": "nir", "index_green": "green"}),
    AppendBNDVI: ("bndvi", {"index_nir": "nir", "index_blue": "blue"}),
    AppendSWI: ("swi", {"index_vre1": "vre1", "index_swir2": "swir2"}),
    AppendGRNDVI: ("grndvi", {"index_nir": "nir", "index_green": "green", "index_red": "red"}),
    AppendGBNDVI: ("gbndvi", {"index_nir": "nir", "index_green": "green", "index_blue": "blue"}),
    AppendRBNDVI: ("rbndvi", {"index_nir": "nir", "index_red": "red", "index_blue": "blue"}),
    AppendNormalizedDifferenceIndex: ("normalized_difference", {"index_a": "a", "index_b": "b"}),
    AppendTriBandNormalizedDifferenceIndex: (
        "tri_band_normalized_difference",
        {"index_a": "a", "index_b": "b", "index_c": "c"},
    ),
}


@pytest.fixture
def sample():
    g = torch.Generator().manual_seed(1)
    image = torch.randint(1, 10000, (7, 8, 8), generator=g).to(torch.float32)
    return {"image": image, "mask": torch.zeros(8, 8, dtype=torch.long), "crs": "EPSG:32633", "bounds": (0, 1, 2, 3)}


def np_nd(a, b):
    return (a - b) / (a + b)


class TestAppendIndex:
    def test_appends_a_channel_and_keeps_other_keys(self, sample):
        out = AppendIndex("ndvi", nir=4, red=3)(sample)
        assert out["image"].shape == (8, 8, 8)
        torch.testing.assert_close(out["image"][:7], sample["image"])
        arr = sample["image"].double().numpy()
        np.testing.assert_allclose(out["image"][7].numpy(), np_nd(arr[4], arr[3]), rtol=1e-6)
        assert out["mask"] is sample["mask"] and out["crs"] == "EPSG:32633" and out["bounds"] == (0, 1, 2, 3)
        assert sample["image"].shape == (7, 8, 8)  # input not modified

    def test_batch_equals_per_sample(self, sample):
        samples = [sample, {**sample, "image": sample["image"].flip(-1) * 0.5}]
        batch = stack_samples(samples)
        t = AppendNDWI(index_green=2, index_nir=4)
        out = t(batch)
        assert out["image"].shape == (2, 8, 8, 8)
        for i, s in enumerate(samples):
            torch.testing.assert_close(out["image"][i], t(s)["image"])
        assert out["crs"] == ["EPSG:32633", "EPSG:32633"]

    def test_tensor_input_has_torchgeos_shape(self, sample):
        """A bare [C, H, W] tensor comes back as a batch of one, as from TorchGeo's (kornia) classes (issue 15)."""
        image = sample["image"]
        out = AppendNDVI(4, 3)(image)
        assert out.shape == (1, 8, 8, 8)
        torch.testing.assert_close(out[0, :7], image)
        torch.testing.assert_close(out[0, 7:], INDICES["ndvi"].kernel(image, nir=4, red=3))
        batch = image.unsqueeze(0).expand(3, 7, 8, 8)
        assert AppendNDVI(4, 3)(batch).shape == (3, 8, 8, 8)
        series = image.expand(2, 3, 7, 8, 8)  # [B, T, C, H, W] keeps its dimensions
        assert AppendNDVI(4, 3)(series).shape == (2, 3, 8, 8, 8)
        kept = AppendNDVI(4, 3, keepdim=True)(image)
        assert kept.shape == (8, 8, 8)
        torch.testing.assert_close(kept, out[0])

    @pytest.mark.parametrize("cls", [AppendIndex, AppendEVI, AppendSAVI, AppendBandMath], ids=lambda c: c.__name__)
    def test_every_append_class_has_the_same_tensor_semantics(self, cls, sample):
        args = {AppendIndex: ("ndvi",), AppendBandMath: ("nir / red",)}.get(cls, ())
        bands = {"nir": 4, "red": 3, "blue": 1} if cls is AppendEVI else {"nir": 4, "red": 3}
        assert cls(*args, **bands)(sample["image"]).shape == (1, 8, 8, 8)
        assert cls(*args, **bands, keepdim=True)(sample["image"]).shape == (8, 8, 8)
        assert cls(*args, **bands)(sample)["image"].shape == (8, 8, 8)

    def test_tensor_names_from_bands_argument(self, sample):
        out = AppendNDVI(nir="SR_B5", red="SR_B4", bands=LANDSAT8)(sample["image"])
        torch.testing.assert_close(out, AppendNDVI(4, 3)(sample["image"]))

    def test_in_nn_sequential_like_torchgeo(self, sample):
        chain = torch.nn.Sequential(AppendNDBI(index_swir=5, index_nir=4), AppendNDVI(index_nir=4, index_red=3))
        assert chain(sample["image"]).shape == (1, 9, 8, 8)  # the second sees [1, 8, H, W]: a batch
        assert chain(stack_samples([sample, sample])["image"]).shape == (2, 9, 8, 8)

    def test_integer_images_become_float32_exactly(self):
        image = torch.tensor([[[65535, 0]], [[1, 0]]], dtype=torch.uint16)
        out = AppendNormalizedDifferenceIndex(0, 1)({"image": image})
        assert out["image"].dtype == torch.float32
        assert out["image"][:2].tolist() == [[[65535.0, 0.0]], [[1.0, 0.0]]]
        assert out["image"][2].tolist() == [[pytest.approx(65534 / 65536), 0.0]]

    def test_half_images_keep_their_dtype(self, sample):
        out = AppendNDVI(4, 3)({"image": sample["image"].half()})
        assert out["image"].dtype == torch.float16

    def test_options_reach_the_kernel(self):
        image = torch.tensor([[[0.0, 5.0, 0.0]], [[0.0, 1.0, 3.0]]])
        out = AppendNDVI(nir=0, red=1, nodata=3.0, fill=-2.0, nodata_out=-99.0)({"image": image})
        assert out["image"][2].flatten().tolist() == [-2.0, pytest.approx(4 / 6), -99.0]

    def test_band_math_formula(self, sample):
        out = AppendIndex("(nir - swir) / (nir + swir)", nir=4, swir=5)(sample)
        torch.testing.assert_close(out["image"][7], AppendNDBI(index_swir=4, index_nir=5)(sample)["image"][7])
        t = AppendBandMath("nir / red", nir=4, red=3, name="ratio")
        out = t({**sample, "bands": list(LANDSAT8)})
        assert out["bands"][-1] == "ratio"
        torch.testing.assert_close(out["image"][7], sample["image"][4] / sample["image"][3])
        single = AppendBandMath("nir", nir=4)(sample)
        torch.testing.assert_close(single["image"][7], sample["image"][4])

    def test_evi_and_savi_parameters(self, sample):
        x = sample["image"] / 10000
        s = {"image": x}
        out = AppendEVI(nir=4, red=3, blue=1, G=2.0)(s)["image"][7].double().numpy()
        a = x.double().numpy()
        np.testing.assert_allclose(out, 2.0 * (a[4] - a[3]) / (a[4] + 6 * a[3] - 7.5 * a[1] + 1), rtol=1e-5)
        out = AppendSAVI(nir=4, red=3, L=0.25)(s)["image"][7].double().numpy()
        np.testing.assert_allclose(out, 1.25 * (a[4] - a[3]) / (a[4] + a[3] + 0.25), rtol=1e-5)
        raw = AppendEVI(nir=4, red=3, blue=1, scale=1e-4)({"image": sample["image"]})["image"][7]
        torch.testing.assert_close(raw, AppendEVI(nir=4, red=3, blue=1)(s)["image"][7], rtol=1e-4, atol=1e-5)

    @pytest.mark.skipif(not CUDA, reason="needs CUDA")
    def test_runs_on_a_gpu_batch(self, sample):
        batch = stack_samples([sample, sample])
        t = AppendNDVI(4, 3).to("cuda")
        gpu = t({**batch, "image": batch["image"].cuda()})
        assert gpu["image"].device.type == "cuda"
        torch.testing.assert_close(gpu["image"].cpu(), t(batch)["image"])

    def test_is_a_module_without_state(self):
        t = AppendNDVI(4, 3)
        assert isinstance(t, torch.nn.Module)
        assert t.state_dict() == {}
        assert t.to("cpu") is t

    def test_pickles(self, sample):
        t = AppendNDVI(nir="SR_B5", red="SR_B4", bands=LANDSAT8, nodata=0)
        copy = pickle.loads(pickle.dumps(t))
        torch.testing.assert_close(copy(sample)["image"], t(sample)["image"])


class TestShortcuts:
    @pytest.mark.parametrize("cls", list(SHORTCUTS), ids=lambda c: c.__name__)
    def test_torchgeo_argument_names(self, cls, sample):
        index, kwargs = SHORTCUTS[cls]
        positions = dict(zip(kwargs, [4, 3, 1]))
        out = cls(**positions)(sample)["image"][7]
        roles = {kwargs[k]: v for k, v in positions.items()}
        expected = INDICES[index].kernel(sample["image"], **roles)[0]
        torch.testing.assert_close(out, expected)
        # the same with plain role names, and positionally in TorchGeo's order
        torch.testing.assert_close(cls(**roles)(sample)["image"][7], expected)
        torch.testing.assert_close(cls(*positions.values())(sample)["image"][7], expected)

    def test_ndvi_against_numpy_with_landsat_names(self, sample):
        out = AppendNDVI(nir="SR_B5", red="SR_B4", bands=LANDSAT8)(sample)
        arr = sample["image"].double().numpy()
        np.testing.assert_allclose(out["image"][7].numpy(), np_nd(arr[4], arr[3]), rtol=1e-6)

    def test_a_band_given_twice_or_missing(self):
        with pytest.raises(TypeError, match="band 'nir' given twice"):
            AppendNDVI(index_nir=1, nir=2, red=3)
        with pytest.raises(TypeError, match="missing band 'red'"):
            AppendNDVI(nir=1)


class TestBandNames:
    def test_names_from_the_transform(self, sample):
        out = AppendNDVI(nir="SR_B5", red="SR_B4", bands=LANDSAT8)(sample)
        torch.testing.assert_close(out["image"], AppendNDVI(4, 3)(sample)["image"])
        assert "bands" not in out

    def test_names_from_the_sample_are_extended(self, sample):
        s = {**sample, "bands": list(LANDSAT8)}
        out = AppendNDVI(nir="SR_B5", red="SR_B4")(s)
        assert out["bands"] == [*LANDSAT8, "ndvi"]
        assert s["bands"] == list(LANDSAT8)  # not modified in place
        # a second index can read the first by name
        out2 = AppendIndex("ndvi - ndwi", ndvi="ndvi", ndwi="SR_B1", name="diff")(out)
        assert out2["bands"][-1] == "diff"
        torch.testing.assert_close(out2["image"][8], out["image"][7] - out["image"][0])

    def test_batch_names_per_sample(self, sample):
        batch = stack_samples([{**sample, "bands": list(LANDSAT8)}, {**sample, "bands": list(LANDSAT8)}])
        out = AppendNDSI(green="SR_B3", swir="SR_B6")(batch)
        assert out["bands"] == [[*LANDSAT8, "ndsi"], [*LANDSAT8, "ndsi"]]
        torch.testing.assert_close(out["image"][:, 7:], AppendNDSI(2, 5)(batch)["image"][:, 7:])

    def test_batch_with_different_bands_is_refused(self, sample):
        other = list(LANDSAT8[::-1])
        batch = stack_samples([{**sample, "bands": list(LANDSAT8)}, {**sample, "bands": other}])
        with pytest.raises(ValueError, match="samples of the batch have different bands"):
            AppendNDVI(nir="SR_B5", red="SR_B4")(batch)

    def test_batch_with_one_shared_list(self, sample):
        batch = {"image": torch.stack([sample["image"]] * 2), "bands": list(LANDSAT8)}
        out = AppendNDVI(nir="SR_B5", red="SR_B4")(batch)
        assert out["bands"] == [*LANDSAT8, "ndvi"]

    def test_unknown_name(self, sample):
        with pytest.raises(ValueError, match=r"band nir='B08' is not one of the bands \['SR_B1'"):
            AppendNDVI(nir="B08", red="SR_B4", bands=LANDSAT8)(sample)

    def test_names_without_band_names(self, sample):
        with pytest.raises(ValueError, match="given by name, but the band names are unknown; pass bands="):
            AppendNDVI(nir="SR_B5", red="SR_B4")(sample)

    def test_conflicting_names(self, sample):
        s = {**sample, "bands": list(LANDSAT8[::-1])}
        with pytest.raises(ValueError, match="disagree with the bands the transform was built with"):
            AppendNDVI(nir="SR_B5", red="SR_B4", bands=LANDSAT8)(s)

    def test_bad_bands_argument(self):
        with pytest.raises(TypeError, match="bands must be a list of band names"):
            AppendNDVI(1, 2, bands="SR_B1")
        with pytest.raises(ValueError, match="duplicate names"):
            AppendNDVI(1, 2, bands=["a", "a"])


class TestErrors:
    def test_unknown_index(self):
        with pytest.raises(ValueError, match="unknown index 'ndvii'; known indices: bndvi, evi"):
            AppendIndex("ndvii", nir=1, red=2)

    def test_unexpected_arguments(self):
        with pytest.raises(TypeError, match=r"unexpected argument\(s\) \['swir'\]"):
            AppendIndex("ndvi", nir=1, red=2, swir=3)
        with pytest.raises(TypeError, match=r"unexpected argument\(s\) \['L'\]"):
            AppendIndex("ndvi", nir=1, red=2, L=0.5)

    def test_bad_band_spec(self):
        with pytest.raises(TypeError, match="band nir must be a position"):
            AppendNDVI(nir=1.5, red=2)

    def test_band_out_of_range_names_the_transform(self, sample):
        with pytest.raises(IndexError, match="AppendNDVI: ndvi: band nir=9 is out of range for an image with 7 bands"):
            AppendNDVI(nir=9, red=2)(sample)

    def test_sample_without_image(self):
        with pytest.raises(KeyError, match="has no 'image' entry"):
            AppendNDVI(1, 2)({"mask": torch.zeros(2, 2)})
        with pytest.raises(TypeError, match="must be a tensor"):
            AppendNDVI(1, 2)({"image": np.zeros((3, 2, 2))})
        with pytest.raises(TypeError, match="expects a sample dict or an image tensor"):
            AppendNDVI(1, 2)([1, 2])

    def test_bad_keepdim(self):
        with pytest.raises(TypeError, match="keepdim must be a bool"):
            AppendNDVI(4, 3, keepdim=1)

    def test_bad_options(self):
        with pytest.raises(ValueError, match="fill must be finite"):
            AppendNDVI(1, 2, fill=math.inf)
        with pytest.raises(TypeError, match="nodata must be a number"):
            AppendNDVI(1, 2, nodata="0")
        with pytest.raises(ValueError, match="is a named index"):
            AppendBandMath("ndvi", nir=1)
