"""The encoding kernels: each extension's encoding, and pipekit's decoders reading it back."""

from __future__ import annotations

import gzip
import io
import json
import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from pipekit.decoders import decode_image_bytes, decode_npy, decode_tiff, default_handlers
from pipekit.encoders import (
    EncodeError,
    default_encoders,
    encode_cls,
    encode_image,
    encode_json,
    encode_npy,
    encode_npz,
    encode_sample,
    encode_text,
    encode_tiff,
    encode_value,
    encoder_table,
    find_encoder,
)
from pipekit.errors import StageError


def decode(ext: str, data: bytes):
    """Decode ``data`` as pipekit's default ``decode`` does for ``ext``."""
    return default_handlers()[ext](data)


class TestSimpleValues:
    @pytest.mark.parametrize("value", [3, np.int64(3), torch.tensor(3), np.array(3)])
    def test_cls_numbers(self, value):
        assert encode_cls(value) == b"3"
        assert decode(".cls", encode_cls(value)) == 3

    def test_cls_refuses_arrays_and_non_ascii(self):
        with pytest.raises(TypeError, match="number or a str"):
            encode_cls(torch.tensor([1, 2]))
        with pytest.raises(ValueError, match="ASCII"):
            encode_cls("chat noir \u00e9")

    def test_text(self):
        assert decode(".txt", encode_text("naïve ☃")) == "naïve ☃"
        with pytest.raises(TypeError, match="str"):
            encode_text(3)

    def test_json_with_numpy_and_tensors(self):
        value = {"a": np.float32(0.5), "b": np.arange(3), "c": torch.tensor([[1, 2]]), "d": torch.tensor(4)}
        assert decode(".json", encode_json(value)) == {"a": 0.5, "b": [0, 1, 2], "c": [[1, 2]], "d": 4}

    def test_json_is_plain_json_dumps(self):
        value = {"caption": "café", "n": [1, 2.5, None]}
        assert encode_json(value) == json.dumps(value).encode()

    def test_json_refuses_other_objects(self):
        with pytest.raises(TypeError, match="not JSON serializable"):
            encode_json({"x": object()})

    @pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.float32, np.float64, np.bool_])
    def test_npy_round_trip(self, dtype):
        array = (np.arange(12).reshape(3, 4) % 3).astype(dtype)
        back = decode_npy(encode_npy(array))
        assert back.dtype == array.dtype and np.array_equal(back, array)

    def test_npy_takes_tensors_and_scalars(self):
        assert np.array_equal(decode_npy(encode_npy(torch.arange(4.0))), np.arange(4.0))
        assert decode_npy(encode_npy(np.float32(2.5))) == np.float32(2.5)

    def test_npy_is_numpy_save(self):
        array = np.random.default_rng(0).normal(size=(2, 3))
        buf = io.BytesIO()
        np.save(buf, array)
        assert encode_npy(array) == buf.getvalue()

    def test_npy_refuses_object_arrays(self):
        with pytest.raises(TypeError, match="object arrays"):
            encode_npy(np.array([{"a": 1}], dtype=object))

    def test_npz(self):
        back = decode(".npz", encode_npz({"x": np.arange(3), "y": torch.ones(2)}))
        assert set(back) == {"x", "y"} and np.array_equal(back["y"], np.ones(2, dtype=np.float32))
        with pytest.raises(TypeError, match="dict of arrays"):
            encode_npz(np.arange(3))

    def test_torch(self):
        value = {"w": torch.randn(3, 2), "n": 4}
        back = decode(".pth", default_encoders()[".pth"](value))
        assert torch.equal(back["w"], value["w"]) and back["n"] == 4
        assert default_encoders()[".pt"] is default_encoders()[".pth"]

    def test_pickle(self):
        value = {"a": (1, 2), "b": {3}}
        assert pickle.loads(default_encoders()[".pyd"](value)) == value


class TestImages:
    def test_png_from_chw_uint8_tensor_round_trips(self):
        img = torch.randint(0, 256, (3, 5, 7), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
        assert torch.equal(decode_image_bytes(encode_image(img, "png")), img)

    @pytest.mark.parametrize("channels", [1, 2, 3, 4])
    def test_png_channels(self, channels):
        img = torch.randint(0, 256, (channels, 4, 6), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
        assert torch.equal(decode_image_bytes(encode_image(img, "png")), img)

    def test_png_from_hwc_array_and_hw_array(self):
        rng = np.random.default_rng(0)
        hwc = rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)
        assert torch.equal(decode_image_bytes(encode_image(hwc, "png")), torch.from_numpy(hwc).permute(2, 0, 1))
        hw = rng.integers(0, 256, (5, 7), dtype=np.uint8)
        assert torch.equal(decode_image_bytes(encode_image(hw, "png")), torch.from_numpy(hw)[None])

    def test_png_uint16_gray(self):
        img = torch.arange(0, 60000, 1000, dtype=torch.int32).reshape(1, 6, 10).to(torch.uint16)
        back = decode_image_bytes(encode_image(img, "png"))
        assert back.dtype == torch.uint16 and torch.equal(back, img)

    def test_float_images_are_scaled_and_truncated_as_webdataset(self):
        array = np.array([[0.0, 0.5, 1.0]], dtype=np.float32)
        back = decode_image_bytes(encode_image(array, "png"))
        assert back.tolist() == [[[0, 127, 255]]]  # 0.5 * 255 = 127.5, truncated
        assert torch.equal(decode_image_bytes(encode_image(torch.from_numpy(array)[None], "png")), back)

    def test_float_images_out_of_range_are_refused(self):
        with pytest.raises(ValueError, match=r"\[0, 1\]"):
            encode_image(np.full((2, 2), 1.5, dtype=np.float32), "png")

    def test_pil_image(self):
        im = Image.new("RGB", (4, 3), (10, 20, 30))
        assert decode_image_bytes(encode_image(im, "png"))[:, 0, 0].tolist() == [10, 20, 30]

    def test_jpeg_is_quality_100(self):
        rng = np.random.default_rng(0)
        array = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(array).save(buf, format="JPEG", quality=100)
        assert encode_image(array, "jpg") == buf.getvalue()
        assert encode_image(array, "jpeg") == buf.getvalue()

    def test_webp_is_lossless(self):
        img = torch.randint(0, 256, (3, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
        assert torch.equal(decode_image_bytes(encode_image(img, "webp")), img)

    @pytest.mark.parametrize(("ext", "magic"), [("ppm", b"P6"), ("pgm", b"P5"), ("bmp", b"BM")])
    def test_other_formats(self, ext, magic):
        channels = 1 if ext == "pgm" else 3
        img = torch.randint(0, 256, (channels, 4, 5), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
        data = default_encoders()["." + ext](img)
        assert data.startswith(magic)
        assert torch.equal(decode_image_bytes(data), img)

    def test_ambiguous_layouts_are_refused(self):
        with pytest.raises(ValueError, match="channels-last"):
            encode_image(np.zeros((3, 8, 8), dtype=np.uint8), "png")
        with pytest.raises(ValueError, match="CHW with 1 to 4 channels"):
            encode_image(torch.zeros(8, 8, 3, dtype=torch.uint8), "png")
        with pytest.raises(TypeError, match="uint8, uint16 or floating point"):
            encode_image(np.zeros((4, 4), dtype=np.int64), "png")
        with pytest.raises(TypeError, match="PIL image"):
            encode_image([[0, 1]], "png")

    def test_tiff_from_tensors_keeps_bands_and_dtype(self):
        for tensor in (torch.rand(5, 4, 3), torch.arange(24, dtype=torch.int16).reshape(2, 3, 4)):
            back = decode_tiff(encode_tiff(tensor))
            assert back.dtype == tensor.dtype and torch.equal(back, tensor)
        assert decode_tiff(encode_tiff(torch.ones(3, 4))).shape == (1, 3, 4)

    def test_tiff_from_arrays_uses_pillow_as_webdataset(self):
        array = np.random.default_rng(0).integers(0, 256, (4, 5, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(array).save(buf, format="TIFF", quality=100)
        assert encode_tiff(array) == buf.getvalue()
        assert torch.equal(decode_tiff(encode_tiff(array)), torch.from_numpy(array).permute(2, 0, 1))


class TestTable:
    def test_default_extensions(self):
        table = default_encoders()
        for ext in (".cls", ".index", ".txt", ".html", ".json", ".npy", ".npz", ".pth", ".pt", ".pyd", ".pickle",
                    ".jpg", ".jpeg", ".png", ".webp", ".bmp", ".ppm", ".pgm", ".pbm", ".tif", ".tiff"):
            assert ext in table, ext

    def test_every_decodable_default_reads_back(self):
        """What the encoders write for each extension pipekit's decoder knows comes back through it."""
        img = torch.randint(0, 256, (3, 4, 4), dtype=torch.uint8, generator=torch.Generator().manual_seed(4))
        values = {".cls": 7, ".txt": "hello", ".json": {"a": [1]}, ".npy": np.arange(3), ".pth": torch.ones(2),
                  ".png": img, ".webp": img, ".bmp": img, ".tif": img.float()}
        handlers = default_handlers()
        for ext, value in values.items():
            back = handlers[ext](default_encoders()[ext](value))
            if isinstance(value, torch.Tensor | np.ndarray):
                assert np.array_equal(np.asarray(back), np.asarray(value)), ext
            else:
                assert back == value, ext

    def test_encoder_table_adds_and_overrides(self):
        table = encoder_table({"PNG": None, "seg.png": bytes})
        assert table[".png"] is None and table[".seg.png"] is bytes and ".jpg" in table
        with pytest.raises(TypeError, match="callable"):
            encoder_table({"png": 3})
        with pytest.raises(ValueError, match="extensions"):
            encoder_table({".": bytes})

    def test_longest_extension_wins(self):
        table = {".png": "png", ".seg.png": "seg"}
        assert find_encoder("x.seg.png", table) == "seg"
        assert find_encoder("seg.png", table) == "seg"
        assert find_encoder("other.png", table) == "png"
        assert find_encoder("npy", table) is None


class TestEncodeValue:
    def test_bytes_str_and_streams_pass_whatever_the_extension(self):
        assert encode_value(b"raw", "jpg") == b"raw"
        assert encode_value(bytearray(b"ba"), "npy") == b"ba"
        assert encode_value("text", "png") == b"text"
        stream = io.BytesIO(b"streamed")
        assert encode_value(stream, "jpg") == b"streamed"
        assert stream.closed

    def test_text_stream_is_refused(self):
        with pytest.raises(TypeError, match="binary mode"):
            encode_value(io.StringIO("x"), "txt")

    def test_gz_suffix(self):
        data = encode_value(np.arange(3), "npy.gz")
        assert decode_npy(gzip.decompress(data)).tolist() == [0, 1, 2]
        assert encode_value(np.arange(3), "npy.gz") == data  # no time stamp in the gzip header
        assert gzip.decompress(encode_value(b"abc", "bin.gz")) == b"abc"

    def test_compound_extension_uses_the_last_part(self):
        img = torch.zeros(1, 2, 2, dtype=torch.uint8)
        assert encode_value(img, "seg.png") == encode_image(img, "png")

    def test_unknown_extension(self):
        with pytest.raises(ValueError, match="no encoder for the extension 'dat'"):
            encode_value(np.arange(2), "dat")

    def test_none_in_the_table_takes_only_bytes(self):
        table = encoder_table({"png": None})
        assert encode_value(b"x", "png", table) == b"x"
        with pytest.raises(ValueError, match="no encoder"):
            encode_value(torch.zeros(1, 2, 2, dtype=torch.uint8), "png", table)

    def test_encoder_returning_non_bytes(self):
        with pytest.raises(TypeError, match="not bytes"):
            encode_value(3, "x", {".x": str})


class TestEncodeSample:
    def test_fields_lose_their_dot_and_meta_is_dropped(self):
        out = encode_sample({"__key__": "k", ".cls": 1, "txt": "a", "__url__": "s.tar", "_hidden": "h"})
        assert out == {"__key__": "k", "cls": b"1", "txt": b"a"}

    def test_keep_meta(self):
        out = encode_sample({"__key__": "k", "__url__": "s.tar"}, keep_meta=True)
        assert out == {"__key__": "k", "__url__": b"s.tar"}
        with pytest.raises(EncodeError, match="must be str"):
            encode_sample({"__key__": "k", "_n": 3}, keep_meta=True)

    def test_error_names_key_field_and_stage(self):
        with pytest.raises(EncodeError) as info:
            encode_sample({"__key__": "s/0001", "png": np.zeros((2, 2), dtype=np.int64)}, stage="ShardWriter")
        err = info.value
        assert isinstance(err, StageError) and isinstance(err, ValueError)
        assert (err.url, err.stage) == ("s/0001.png", "ShardWriter")
        assert str(err).startswith("cannot encode 's/0001.png' in ShardWriter: TypeError: image pixels")
        assert isinstance(err.__cause__, TypeError)

    def test_pillow_errors_are_wrapped(self):
        with pytest.raises(EncodeError, match=r"'s\.jpg'") as info:
            encode_sample({"__key__": "s", "jpg": Image.new("RGBA", (2, 2))})
        assert isinstance(info.value.__cause__, OSError)

    def test_bad_samples(self):
        with pytest.raises(ValueError, match="__key__"):
            encode_sample({"jpg": b""})
        with pytest.raises(TypeError, match="must be a dict"):
            encode_sample([("__key__", "k")])
        with pytest.raises(ValueError, match="twice"):
            encode_sample({"__key__": "k", "jpg": b"", ".jpg": b""})

    def test_error_pickles_with_its_fields(self):
        err = EncodeError("encode", "k.png", "ShardWriter", "bad")
        back = pickle.loads(pickle.dumps(err))
        assert (back.url, back.stage, back.reason) == ("k.png", "ShardWriter", "bad")

