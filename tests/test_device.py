"""Device feeding: to_device conversions and the prefetching DeviceLoader (CPU here; CUDA when present)."""

from __future__ import annotations

import warnings

import pytest
import torch

import pipekit
import pipekit.device as device_mod
from pipekit.device import DeviceLoader, default_scale, prefetch_to_device, to_device
from pipekit.pipes import IterableWrapper
from pipekit.transforms import compute_stats

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]
TOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def reference(x: torch.Tensor, scale: float, mean, std) -> torch.Tensor:
    c = x.shape[-3]
    m = torch.tensor(mean, dtype=torch.float64).view(c, 1, 1)
    s = torch.tensor(std, dtype=torch.float64).view(c, 1, 1)
    return ((x.double() / scale - m) / s).float()


def random_image(dtype, shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    high = {torch.uint8: 256, torch.int16: 32768, torch.uint16: 65536}[dtype]
    return torch.randint(0, high, shape, generator=g, dtype=torch.int64).to(dtype)


class TestToDevice:
    @pytest.mark.parametrize("device", DEVICES)
    @pytest.mark.parametrize("in_dtype", [torch.uint8, torch.uint16, torch.int16])
    @pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16, torch.bfloat16])
    @pytest.mark.parametrize("fused", [True, False])
    def test_values_match_reference(self, device, in_dtype, out_dtype, fused, monkeypatch):
        monkeypatch.setattr(device_mod, "_FUSED", fused)
        x = random_image(in_dtype, (4, 3, 8, 8))
        scale = default_scale(in_dtype)  # ImageNet statistics are for images in 0..1
        out = to_device({"image": x}, device, dtype=out_dtype, scale=scale, normalize=(MEAN, STD))["image"]
        assert out.dtype == out_dtype
        assert out.device.type == device
        expected = reference(x, scale, MEAN, STD)
        err = (out.float().cpu() - expected).abs().max().item()
        assert err <= TOL[out_dtype] * max(1.0, expected.abs().max().item())

    @pytest.mark.parametrize("device", DEVICES)
    def test_layouts(self, device):
        batch = to_device(torch.zeros(2, 3, 5, 7, dtype=torch.uint8), device)
        assert batch.is_contiguous(memory_format=torch.channels_last)
        series = to_device(torch.zeros(2, 4, 3, 5, 7, dtype=torch.uint8), device)
        assert series.is_contiguous(memory_format=torch.channels_last_3d)
        nchw = to_device(torch.zeros(2, 3, 5, 7, dtype=torch.uint8), device, channels_last=False)
        assert nchw.is_contiguous()
        single = to_device(torch.zeros(3, 5, 7, dtype=torch.uint8), device)
        assert single.is_contiguous() and single.shape == (3, 5, 7)

    def test_scale_only_and_custom_scale(self):
        x = torch.tensor([0, 5000, 10000], dtype=torch.int16).view(1, 3, 1, 1).expand(1, 3, 2, 2).contiguous()
        out = to_device(x, "cpu", scale=10000)
        assert torch.allclose(out[0, :, 0, 0], torch.tensor([0.0, 0.5, 1.0]))
        assert to_device(torch.full((1, 1, 1, 1), 255, dtype=torch.uint8), "cpu", scale=255).item() == 1.0

    def test_raw_statistics_normalise_a_uint16_batch(self):
        """Issue 15: stats from compute_stats (raw DN) + to_device's defaults gave a constant batch (std 0.0000)."""
        g = torch.Generator().manual_seed(0)
        base = torch.tensor([7500.0, 8200.0, 9100.0, 16000.0, 12000.0, 9800.0]).view(6, 1, 1)
        spread = torch.tensor([300.0, 450.0, 700.0, 2500.0, 1500.0, 1200.0]).view(6, 1, 1)
        samples = [
            {"image": (base + spread * torch.randn(6, 32, 32, generator=g)).round().clamp(0, 65535).to(torch.uint16)}
            for _ in range(16)
        ]
        stats = compute_stats(samples, progress=False)
        assert 7000 < stats.mean[0] < 8000  # raw units
        batch = {"image": torch.stack([s["image"] for s in samples])}
        out = to_device(batch, "cpu", normalize=(stats.mean, stats.std))["image"]
        per_band = out.transpose(0, 1).reshape(6, -1).double()
        torch.testing.assert_close(per_band.mean(1), torch.zeros(6, dtype=torch.float64), atol=1e-4, rtol=0)
        torch.testing.assert_close(per_band.std(1, correction=0), torch.ones(6, dtype=torch.float64), atol=1e-4, rtol=0)
        loaded = next(iter(DeviceLoader([batch], "cpu", normalize=(stats.mean, stats.std))))["image"]
        torch.testing.assert_close(loaded, out)

    def test_scale_maps_integers_to_unit_range_when_asked(self):
        x = torch.tensor([0, 32768, 65535], dtype=torch.uint16).view(1, 3, 1, 1)
        assert to_device(x, "cpu").flatten().tolist() == [0.0, 32768.0, 65535.0]
        assert to_device(x, "cpu", scale=default_scale(torch.uint16)).flatten().tolist() == [
            0.0,
            pytest.approx(32768 / 65535),
            1.0,
        ]

    def test_warns_when_unit_range_statistics_meet_raw_integers(self):
        x = torch.zeros(1, 3, 2, 2, dtype=torch.uint8)
        with pytest.warns(UserWarning, match="pass scale=255"):
            to_device(x, "cpu", normalize=(MEAN, STD))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            to_device(x, "cpu", normalize=(MEAN, STD), scale=255)  # asked: 0..1
            to_device(x, "cpu", normalize=(MEAN, STD), scale=1)  # raw values on purpose
            to_device(x, "cpu", normalize=([120.0] * 3, [60.0] * 3))  # raw statistics
            to_device(x.float(), "cpu", normalize=(MEAN, STD))  # float images: never scaled

    def test_masks_unchanged_and_other_entries_pass_through(self):
        mask = torch.randint(0, 20, (2, 6, 6), dtype=torch.uint8)
        batch = {
            "image": torch.zeros(2, 3, 6, 6, dtype=torch.uint8),
            "mask": mask,
            "image_sizes": torch.tensor([[3, 4, 6], [3, 6, 6]]),
            "crs": ["EPSG:32615", "EPSG:32615"],
        }
        out = to_device(batch, "cpu", mask_dtype=None)
        assert torch.equal(out["mask"], mask) and out["mask"].dtype == torch.uint8
        assert torch.equal(out["image_sizes"], batch["image_sizes"])
        assert out["crs"] == batch["crs"]
        assert to_device(batch, "cpu", mask_dtype=torch.long)["mask"].dtype == torch.long

    def test_padding_preserved(self):
        """Zero padding from pad_collate maps to the normalised value of 0, and sizes survive."""
        img = torch.zeros(2, 1, 4, 4, dtype=torch.uint8)
        img[0, :, :2, :2] = 200
        sizes = torch.tensor([[1, 2, 2], [1, 4, 4]])
        out = to_device({"image": img, "image_sizes": sizes}, "cpu", normalize=([0.5], [0.25]))
        assert torch.allclose(out["image"][0, :, 2:, :], torch.tensor(-2.0))
        assert out["image_sizes"].tolist() == [[1, 2, 2], [1, 4, 4]]

    def test_tuples_and_lists(self):
        x = torch.full((1, 3, 2, 2), 255, dtype=torch.uint8)
        out = to_device((x, torch.tensor([1])), "cpu")
        assert isinstance(out, tuple) and out[0].dtype == torch.float32 and out[1].dtype == torch.int64
        out = to_device([x, x], "cpu", keys=[1])
        assert out[0].dtype == torch.uint8 and out[1].dtype == torch.float32

    def test_errors(self):
        x = torch.zeros(1, 3, 2, 2, dtype=torch.uint8)
        with pytest.raises(ValueError, match="3 channels"):
            to_device(x, "cpu", normalize=([0.5, 0.5], [0.5, 0.5]))
        with pytest.raises(ValueError, match="std must be positive"):
            to_device(x, "cpu", normalize=(0.5, 0.0))
        with pytest.raises(TypeError, match="floating point"):
            to_device(x, "cpu", dtype=torch.int32)
        with pytest.raises(ValueError, match="channel axis"):
            to_device(torch.zeros(4, 4, dtype=torch.uint8), "cpu")

    @pytest.mark.parametrize("device", DEVICES)
    def test_channels_last_model_same_output(self, device):
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 1)
        ).eval().to(device)
        x = random_image(torch.uint8, (2, 3, 16, 16))
        a = to_device(x, device, scale=255, normalize=(MEAN, STD), channels_last=False)
        b = to_device(x, device, scale=255, normalize=(MEAN, STD), channels_last=True)
        # cuDNN convolves in TF32 by default, whose ~1e-3 relative error would hide a real difference: full fp32 here
        tf32 = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = False
        try:
            with torch.no_grad():
                ref = model(a)
                out = model.to(memory_format=torch.channels_last)(b)
        finally:
            torch.backends.cudnn.allow_tf32 = tf32
        assert torch.allclose(ref, out, atol=1e-5)


def uint8_batches(n, b=2):
    return [torch.full((b, 3, 4, 4), i, dtype=torch.uint8) for i in range(n)]


class TestDeviceLoader:
    @pytest.mark.parametrize("device", DEVICES)
    def test_every_batch_once_in_order(self, device):
        out = list(DeviceLoader(uint8_batches(7), device, normalize=None))
        assert [float(b[0, 0, 0, 0]) for b in out] == list(range(7))  # raw values: no rescaling by default
        assert all(b.device.type == device for b in out)
        assert all(b.is_contiguous(memory_format=torch.channels_last) for b in out)

    @pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
    @pytest.mark.parametrize("stage_pinned", [True, False])
    def test_cuda_dict_batches_arrive_whole_behind_slow_compute(self, stage_pinned):
        """Copies and conversions run on side streams: every batch must still arrive complete and in order
        while the caller's stream is busy, masks converted, other entries passed through."""
        n, b = 12, 16

        def batches():
            host = torch.empty(b, 3, 64, 64, dtype=torch.uint8)  # one host buffer, rewritten for every batch
            for i in range(n):
                host.fill_(i)
                image = host if stage_pinned else host.clone().pin_memory()
                yield {"image": image, "mask": torch.full((b, 64, 64), i, dtype=torch.uint8), "id": [i] * b}

        busy = torch.randn(2048, 2048, device="cuda")
        seen = []
        loader = DeviceLoader(batches(), "cuda", stage_pinned=stage_pinned, mask_dtype=torch.long)
        for batch in loader:
            for _ in range(4):  # keep the current stream busy while the next batch is copied and converted
                busy = torch.tanh(busy @ busy)
            i = batch["id"][0]
            assert batch["image"].dtype == torch.float32 and batch["mask"].dtype == torch.long
            assert batch["image"].is_contiguous(memory_format=torch.channels_last)
            assert torch.equal(batch["image"], torch.full_like(batch["image"], float(i)))
            assert torch.equal(batch["mask"], torch.full_like(batch["mask"], i))
            seen.append(i)
        assert seen == list(range(n))

    @pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
    def test_cuda_batches_made_on_the_gpu_are_converted_after_they_are_made(self):
        busy = torch.randn(2048, 2048, device="cuda")

        def batches():
            nonlocal busy
            for i in range(6):
                for _ in range(4):
                    busy = torch.tanh(busy @ busy)
                # the batch's value is known only once the slow work queued on the current stream has run
                yield (busy[:4, :3].abs() * 0 + i).to(torch.uint8).view(4, 3, 1, 1).expand(4, 3, 8, 8).contiguous()

        out = [float(b.mean()) for b in DeviceLoader(batches(), "cuda", scale=1)]
        assert out == [float(i) for i in range(6)]

    def test_len_and_functional_spelling(self):
        loader = prefetch_to_device(uint8_batches(3), "cpu")
        assert len(loader) == 3
        assert len(list(loader)) == 3

    def test_bad_kwargs_fail_early(self):
        with pytest.raises(TypeError):
            DeviceLoader(uint8_batches(1), "cpu", dtype=torch.int64)

    @pytest.mark.parametrize("num_workers", [0, 2])
    def test_resume_keeps_the_batch_in_flight(self, num_workers):
        def make():
            pipe = IterableWrapper(range(40)).shuffle(buffer_size=8).sharding_filter().batch(4).map(torch.tensor)
            return pipekit.DataLoader(pipe, num_workers=num_workers)

        torch.manual_seed(0)
        loader = DeviceLoader(make(), "cpu", keys=None)
        it = iter(loader)
        head = [next(it) for _ in range(3)]
        state = loader.state_dict()
        rest = list(it)
        resumed = DeviceLoader(make(), "cpu", keys=None)
        resumed.load_state_dict(state)
        again = list(resumed)
        assert [b.tolist() for b in again] == [b.tolist() for b in rest]
        assert sorted(v for b in head + again for v in b.tolist()) == list(range(40))


def test_move_then_convert_equals_to_device():
    """DeviceLoader's CUDA path moves a batch (device_mod._move) on one stream and converts it (to_device) on
    another: the two steps together must give what to_device gives in one, for every batch structure."""
    from collections import OrderedDict, namedtuple

    Pair = namedtuple("Pair", "image label")
    image = torch.arange(2 * 3 * 4 * 4, dtype=torch.uint8).view(2, 3, 4, 4)
    mask = torch.ones(2, 4, 4, dtype=torch.uint8)
    batches = [
        {"image": image, "mask": mask, "id": ["a", "b"], "n": 3},
        OrderedDict(image=image, mask=mask),
        (image, torch.tensor([1, 2])),
        [image, "x"],
        Pair(image, torch.tensor([5, 6])),
        image,
    ]
    kwargs = {"scale": 255, "normalize": ([0.5] * 3, [0.25] * 3), "mask_dtype": torch.long}
    for batch in batches:
        moved = device_mod._move(batch, torch.device("cpu"), True)
        assert type(moved) is (dict if isinstance(batch, dict) else type(batch))
        two_steps = to_device(moved, "cpu", **kwargs)
        one_step = to_device(batch, "cpu", **kwargs)
        assert type(two_steps) is type(one_step)
        flat_a = list(device_mod._tensors(two_steps))
        flat_b = list(device_mod._tensors(one_step))
        assert len(flat_a) == len(flat_b) > 0
        for a, b in zip(flat_a, flat_b):
            assert a.dtype == b.dtype and torch.equal(a, b)
            assert a.is_contiguous(memory_format=torch.channels_last) == b.is_contiguous(
                memory_format=torch.channels_last
            )


def test_pinned_ring_stages_every_cpu_tensor_of_a_batch(monkeypatch):
    """The staging ring's walk over a batch (CUDA only in use): each CPU tensor copied into a ring buffer,
    the structure and the other entries kept. Pinned buffers need CUDA, so plain ones stand in here."""
    from collections import namedtuple

    ring = device_mod._PinnedRing()
    buffers = []

    def buffer_for(t):
        buffers.append(torch.empty_like(t))
        return buffers[-1]

    monkeypatch.setattr(ring, "_buffer_for", buffer_for)
    Pair = namedtuple("Pair", "image label")
    image, label = torch.arange(6, dtype=torch.uint8).view(1, 6), torch.tensor([3])
    staged = ring.stage({"pair": Pair(image, label), "ids": ["a"], "more": [image, 7]})
    assert type(staged["pair"]) is Pair and staged["ids"] == ["a"] and staged["more"][1] == 7
    assert len(buffers) == 3
    assert all(
        any(s is b for b in buffers) for s in (staged["pair"].image, staged["pair"].label, staged["more"][0])
    )
    assert torch.equal(staged["pair"].image, image) and torch.equal(staged["more"][0], image)
    assert torch.equal(staged["pair"].label, label)
