"""The JPEG device path: encoded batches from the workers, decode + crop + flip + normalise on the device.

On the CPU the device path must give the CPU path's images (``TarShards(size=...)`` then ``to_device``) for
the same seed, resume exactly, name a corrupt file and refuse a huge declared size; on CUDA (when present) it
runs nvJPEG and stays within a few levels of the CPU path.
"""

from __future__ import annotations

import io
import struct
import tarfile

import pytest
import torch
from PIL import Image

import pipekit
from pipekit import datasets
from pipekit._jpeg_device import PARAMS_KEY, JpegCropParams, decode_jpeg_crops, jpeg_crop_stage
from pipekit.decoders import decode_image_bytes
from pipekit.device import DeviceLoader, to_device
from pipekit.errors import DecodeError
from pipekit.pipes import IterableWrapper

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
SIZE = 16


def _jpeg(seed: int, size: tuple[int, int] = (40, 30), exif_orientation: int | None = None) -> bytes:
    g = torch.Generator().manual_seed(seed)
    w, h = size
    base = torch.randint(0, 256, (h // 5 + 1, w // 5 + 1, 3), generator=g, dtype=torch.uint8).numpy()
    image = Image.fromarray(base).resize((w, h), Image.BILINEAR)  # smooth: JPEG keeps it close
    buf = io.BytesIO()
    if exif_orientation is None:
        image.save(buf, "JPEG", quality=90)
    else:
        exif = Image.Exif()
        exif[0x0112] = exif_orientation
        image.save(buf, "JPEG", quality=90, exif=exif.tobytes())
    return buf.getvalue()


def _write_shards(root, shards: int = 2, per_shard: int = 6, bad: dict[str, bytes] | None = None) -> str:
    for s in range(shards):
        with tarfile.open(root / f"shard-{s:06d}.tar", "w") as tar:
            for i in range(per_shard):
                key = f"sample{s}{i:03d}"
                jpg = (bad or {}).get(key) or _jpeg(s * 100 + i, (40 + 4 * i, 30 + 2 * s))
                for ext, data in ((".jpg", jpg), (".cls", str(i % 3).encode())):
                    info = tarfile.TarInfo(key + ext)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return str(root / f"shard-{{000000..{shards - 1:06d}}}.tar")


def _device_recipe(urls: str, batch_size: int = 4) -> datasets.TarShards:
    """TarShards with the device stage in place of decode + augment + collate (what decode_device= would build)."""
    return datasets.TarShards(
        urls, batch_size=None, shuffle_buffer=8, decode=lambda p: jpeg_crop_stage(p, SIZE, batch_size=batch_size)
    )


def _corrupt(data: bytes) -> bytes:
    """The JPEG's headers up to its frame header, then its end: the size reads, the decode fails."""
    pos = 2
    while data[pos + 1] not in (0xC0, 0xC2):
        pos += 2 + struct.unpack_from(">H", data, pos + 2)[0]
    end = pos + 2 + struct.unpack_from(">H", data, pos + 2)[0]
    return data[:end] + b"\xff\xd9"


def _huge(data: bytes) -> bytes:
    """The JPEG declaring 60000 x 60000 pixels in its frame header."""
    pos = 2
    while data[pos + 1] not in (0xC0, 0xC2):
        pos += 2 + struct.unpack_from(">H", data, pos + 2)[0]
    return data[: pos + 5] + struct.pack(">HH", 60000, 60000) + data[pos + 9 :]


def test_device_path_equals_the_cpu_path(tmp_path):
    urls = _write_shards(tmp_path)
    torch.manual_seed(0)
    cpu = [to_device(b, "cpu", keys=".jpg", scale=255, normalize=(MEAN, STD))
           for b in datasets.TarShards(urls, batch_size=4, shuffle_buffer=8, size=SIZE)]
    torch.manual_seed(0)
    dev = list(DeviceLoader(_device_recipe(urls), "cpu", decode="jpeg", size=SIZE, keys=".jpg", scale=255,
                            normalize=(MEAN, STD)))
    assert [b["__key__"] for b in dev] == [b["__key__"] for b in cpu]
    for a, b in zip(dev, cpu):
        assert torch.equal(a[".cls"], b[".cls"])
        assert a[".jpg"].shape == b[".jpg"].shape == (4, 3, SIZE, SIZE) or a[".jpg"].shape[0] < 4
        assert a[".jpg"].is_contiguous(memory_format=torch.channels_last)
        # same libjpeg call, same resize kernel, same params: equal up to float rounding
        torch.testing.assert_close(a[".jpg"], b[".jpg"], atol=1e-5, rtol=0)


@pytest.mark.parametrize("orientation", [6, 3])
def test_exif_orientation_matches_the_cpu_decoder(orientation):
    data = _jpeg(7, (48, 20), exif_orientation=orientation)
    sample = next(iter(JpegCropParams(IterableWrapper([{"__key__": "k", ".jpg": data}]), SIZE).set_seed(3)))
    top, left, h, w, flip, orient, nbytes = sample[PARAMS_KEY].tolist()
    assert orient == orientation and nbytes == len(data)
    ref = decode_image_bytes(data)  # applies the orientation
    assert top + h <= ref.shape[1] and left + w <= ref.shape[2]
    from torchvision.transforms.v2 import functional as F

    expected = F.resized_crop_image(ref, top, left, h, w, size=[SIZE, SIZE], antialias=True)
    expected = F.horizontal_flip_image(expected) if flip else expected
    out = decode_jpeg_crops(sample[".jpg"], sample[PARAMS_KEY][None], SIZE)
    assert torch.equal(out[0], expected)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_mid_epoch_gives_the_same_params_and_images(tmp_path, num_workers):
    urls = _write_shards(tmp_path, shards=2, per_shard=8)

    def make() -> DeviceLoader:
        loader = pipekit.DataLoader(_device_recipe(urls, batch_size=2), num_workers=num_workers)
        return DeviceLoader(loader, "cpu", decode="jpeg", size=SIZE, keys=".jpg", scale=255)

    torch.manual_seed(0)
    loader = make()
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    state = loader.state_dict()
    rest = list(it)
    resumed = make()
    resumed.load_state_dict(state)
    again = list(resumed)
    assert [b["__key__"] for b in again] == [b["__key__"] for b in rest]
    for a, b in zip(again, rest):
        assert torch.equal(a[PARAMS_KEY], b[PARAMS_KEY])
        assert torch.equal(a[".jpg"], b[".jpg"])
    keys = sorted(k for b in head + again for k in b["__key__"])
    assert len(keys) == 16 and len(set(keys)) == 16  # nothing lost or repeated


def test_a_corrupt_jpeg_in_a_batch_names_its_key(tmp_path):
    urls = _write_shards(tmp_path, shards=1, per_shard=4, bad={"sample0002": _corrupt(_jpeg(1))})
    loader = DeviceLoader(_device_recipe(urls), "cpu", decode="jpeg", size=SIZE, keys=".jpg")
    with pytest.raises(DecodeError, match=r"shard-000000\.tar/sample0002") as info:
        list(loader)
    assert info.value.stage == "decode_jpeg_crops"


def test_a_huge_declared_size_is_refused_before_decoding(tmp_path):
    urls = _write_shards(tmp_path, shards=1, per_shard=3, bad={"sample0001": _huge(_jpeg(2))})
    with pytest.raises(DecodeError, match=r"sample0001.*60000x60000 pixels.*pixel limit") as info:
        list(_device_recipe(urls))
    assert info.value.stage == "jpeg_crop_params"
    # the kernel checks the header itself too
    good, huge = _jpeg(3), _huge(_jpeg(3))
    datas = [torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in (good, huge)]
    params = torch.tensor([[0, 0, 30, 40, 0, 1, len(good)], [0, 0, 30, 40, 0, 1, len(huge)]])
    with pytest.raises(DecodeError, match=r"'b'.*pixel limit"):
        decode_jpeg_crops(datas, params, SIZE, keys=["a", "b"])


def test_on_error_skip_drops_and_counts_the_bad_samples(tmp_path):
    bad = {"sample0001": _huge(_jpeg(2)), "sample0002": _corrupt(_jpeg(1))}
    urls = _write_shards(tmp_path, shards=1, per_shard=5, bad=bad)
    shards = datasets.TarShards(urls, batch_size=None, shuffle_buffer=8, decode=lambda p: jpeg_crop_stage(
        p, SIZE, batch_size=5, on_error="skip"))
    loader = DeviceLoader(shards, "cpu", decode="jpeg", size=SIZE, keys=".jpg", on_error="skip")
    (batch,) = list(loader)
    keys = [k.rsplit("/", 1)[1] for k in batch["__key__"]]
    assert sorted(keys) == ["sample0000", "sample0003", "sample0004"]
    assert batch[".jpg"].shape[0] == batch[".cls"].shape[0] == batch[PARAMS_KEY].shape[0] == 3
    assert batch[".cls"].tolist() == [int(k[-3:]) % 3 for k in keys]  # the labels stay with their images
    assert loader.skip_log.count == 1 and "sample0002" in loader.skip_log.skipped[0].url
    (crop_params,) = [p for p in _pipes(shards) if isinstance(p, JpegCropParams)]
    assert crop_params.skip_log.count == 1 and "sample0001" in crop_params.skip_log.skipped[0].url


def _pipes(recipe):
    from torch.utils.data.graph import traverse_dps

    found, todo = [], [traverse_dps(recipe.source_datapipe)]
    while todo:
        for _, (pipe, sub) in todo.pop().items():
            found.append(pipe)
            todo.append(sub)
    return found


def test_the_image_entry_defaults_to_jpg_and_is_converted(tmp_path):
    urls = _write_shards(tmp_path, shards=1, per_shard=4)
    (batch,) = list(DeviceLoader(_device_recipe(urls), "cpu", decode="jpeg", size=SIZE, scale=255))
    assert batch[".jpg"].dtype == torch.float32 and batch[".jpg"].shape == (4, 3, SIZE, SIZE)
    assert float(batch[".jpg"].max()) <= 1.0


def test_arguments_are_checked():
    with pytest.raises(TypeError, match="size="):
        DeviceLoader([], "cpu", decode="jpeg")
    with pytest.raises(ValueError, match="decode must be"):
        DeviceLoader([], "cpu", decode="png", size=8)
    with pytest.raises(TypeError, match="JpegCropParams"):
        list(DeviceLoader([{"image": torch.zeros(1, 3, 2, 2, dtype=torch.uint8)}], "cpu", decode="jpeg", size=8))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (nvJPEG)")
def test_cuda_path_is_within_a_few_levels_of_the_cpu_path(tmp_path):
    urls = _write_shards(tmp_path)
    torch.manual_seed(0)
    cpu = list(DeviceLoader(_device_recipe(urls), "cpu", decode="jpeg", size=SIZE, keys=".jpg", scale=1))
    torch.manual_seed(0)
    gpu = list(DeviceLoader(_device_recipe(urls), "cuda", decode="jpeg", size=SIZE, keys=".jpg", scale=1))
    assert [b["__key__"] for b in gpu] == [b["__key__"] for b in cpu]
    for a, b in zip(gpu, cpu):
        assert a[".jpg"].device.type == "cuda"
        diff = (a[".jpg"].cpu() - b[".jpg"]).abs()
        # nvJPEG's IDCT/upsampling and the GPU resize round differently: a few levels of 255
        assert float(diff.mean()) <= 2.0 and float(diff.max()) <= 48


def test_tar_shards_decode_device_is_the_device_stage(tmp_path):
    """``TarShards(decode_device=...)`` builds what ``_device_recipe`` builds by hand: the same batches."""
    urls = _write_shards(tmp_path)
    torch.manual_seed(0)
    by_hand = list(DeviceLoader(_device_recipe(urls), "cpu", decode="jpeg", size=SIZE, keys=".jpg", scale=255))
    torch.manual_seed(0)
    recipe = datasets.TarShards(urls, batch_size=4, shuffle_buffer=8, size=SIZE, decode_device="cpu")
    assert recipe.decode_device == torch.device("cpu")
    built = list(DeviceLoader(recipe, "cpu", decode="jpeg", size=SIZE, keys=".jpg", scale=255))
    assert [b["__key__"] for b in built] == [b["__key__"] for b in by_hand]
    for a, b in zip(built, by_hand):
        assert torch.equal(a[".jpg"], b[".jpg"]) and torch.equal(a[".cls"], b[".cls"])


@pytest.mark.parametrize("kwargs", [
    {"train": False, "size": SIZE}, {"size": None}, {"size": SIZE, "trivial_augment": True},
    {"size": SIZE, "decode_threads": 2}, {"size": SIZE, "transform": lambda s: s},
])
def test_tar_shards_decode_device_refuses_what_it_cannot_do(tmp_path, kwargs):
    urls = _write_shards(tmp_path)
    with pytest.raises(ValueError, match="TarShards: decode_device="):
        datasets.TarShards(urls, decode_device="cpu", **kwargs)


def test_tar_shards_names_the_replacement_of_a_webdataset_keyword(tmp_path):
    urls = _write_shards(tmp_path)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'handler'.*on_error="):
        datasets.WebDataset(urls, handler=print)
