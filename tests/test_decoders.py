"""Tests of pipekit.decoders: image decoding for every format, modes, EXIF, errors; per-extension decoders."""

from __future__ import annotations

import io
import os
import pickle
import struct
import zlib

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps, features
from rasterio.io import MemoryFile
from rasterio.transform import Affine

from pipekit.decoders import (
    decode_cls,
    decode_image_bytes,
    decode_json,
    decode_npy,
    decode_npz,
    decode_text,
    decode_tiff,
    decode_torch,
    default_handlers,
    image_format,
    normalize_image_mode,
)
from pipekit.errors import DecodeError

H, W = 6, 10


def encode(img: Image.Image, fmt: str, **kwargs) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kwargs)
    return buf.getvalue()


def png16(arr: np.ndarray) -> bytes:
    """A 16-bit PNG (gray, gray+alpha, RGB or RGBA) written by hand: Pillow cannot write 16-bit colour."""
    h, w, c = arr.shape
    color_type = {1: 0, 2: 4, 3: 2, 4: 6}[c]
    raw = b"".join(b"\x00" + arr[y].astype(">u2").tobytes() for y in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", w, h, 16, color_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def hwc(t: torch.Tensor) -> np.ndarray:
    return t.permute(1, 2, 0).numpy()


@pytest.fixture(scope="module")
def rgb() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (H, W, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def rgba(rgb: np.ndarray) -> np.ndarray:
    alpha = np.random.default_rng(1).integers(0, 256, (H, W, 1), dtype=np.uint8)
    return np.concatenate([rgb, alpha], axis=2)


def smooth_rgb() -> np.ndarray:
    """A smooth picture: lossy codecs keep it close."""
    y, x = np.mgrid[0:32, 0:48]
    return np.stack([x * 5, y * 7, (x + y) * 3], axis=2).astype(np.uint8)


class TestFormats:
    def test_png_rgb_rgba_gray_exact(self, rgb: np.ndarray, rgba: np.ndarray) -> None:
        for arr in (rgb, rgba, rgb[:, :, 0]):
            out = decode_image_bytes(encode(Image.fromarray(arr), "PNG"), contiguous=True)
            expected = arr if arr.ndim == 3 else arr[:, :, None]
            assert out.dtype == torch.uint8 and out.shape == (expected.shape[2], H, W)
            assert out.is_contiguous()
            np.testing.assert_array_equal(hwc(out), expected)

    def test_palette_png_gives_colours(self) -> None:
        # torchvision 0.29's decode_png returns palette indices here; pipekit must give colours.
        arr = np.zeros((2, 3, 3), np.uint8)
        arr[0, 0] = (255, 0, 0)
        arr[1, 2] = (0, 0, 255)
        pal = Image.fromarray(arr).convert("P")
        out = decode_image_bytes(encode(pal, "PNG"))
        np.testing.assert_array_equal(hwc(out), arr)
        with_trns = decode_image_bytes(encode(pal, "PNG", transparency=0))
        assert with_trns.shape[0] == 4

    def test_png_16bit_gray(self) -> None:
        arr = np.random.default_rng(2).integers(0, 65536, (H, W), dtype=np.uint16)
        out = decode_image_bytes(encode(Image.fromarray(arr), "PNG"))
        assert out.dtype == torch.uint16 and out.shape == (1, H, W)
        np.testing.assert_array_equal(out[0].numpy(), arr)

    @pytest.mark.parametrize("channels", [2, 3, 4])
    def test_png_16bit_colour_keeps_16_bits(self, channels: int) -> None:
        arr = np.random.default_rng(3).integers(0, 65536, (H, W, channels), dtype=np.uint16)
        out = decode_image_bytes(png16(arr))
        assert out.dtype == torch.uint16 and out.shape == (channels, H, W)
        np.testing.assert_array_equal(hwc(out), arr)

    def test_jpeg(self) -> None:
        arr = smooth_rgb()
        out = decode_image_bytes(encode(Image.fromarray(arr), "JPEG", quality=95))
        assert out.dtype == torch.uint8 and out.shape == (3, 32, 48)
        assert np.abs(hwc(out).astype(int) - arr).mean() < 3
        gray = decode_image_bytes(encode(Image.fromarray(arr[:, :, 1]), "JPEG", quality=95))
        assert gray.shape == (1, 32, 48)

    def test_webp_lossless_and_lossy(self, rgb: np.ndarray, rgba: np.ndarray) -> None:
        np.testing.assert_array_equal(hwc(decode_image_bytes(encode(Image.fromarray(rgb), "WEBP", lossless=True))), rgb)
        out = decode_image_bytes(encode(Image.fromarray(rgba), "WEBP", lossless=True))
        assert out.shape == (4, H, W)
        np.testing.assert_array_equal(hwc(out)[:, :, 3], rgba[:, :, 3])
        lossy = decode_image_bytes(encode(Image.fromarray(smooth_rgb()), "WEBP", quality=90))
        assert lossy.shape == (3, 32, 48) and np.abs(hwc(lossy).astype(int) - smooth_rgb()).mean() < 4

    @pytest.mark.parametrize("fmt", ["GIF", "WEBP"])
    def test_animation_gives_first_frame(self, fmt: str) -> None:
        frames = [Image.fromarray(np.full((H, W, 3), v, np.uint8)) for v in (10, 200, 90)]
        kwargs = {"lossless": True} if fmt == "WEBP" else {}
        data = encode(frames[0], fmt, save_all=True, append_images=frames[1:], duration=50, **kwargs)
        out = decode_image_bytes(data)
        assert out.shape == (3, H, W)
        assert torch.all(out == 10)

    def test_gif_transparency_becomes_alpha(self) -> None:
        arr = np.zeros((4, 4, 4), np.uint8)
        arr[..., 0] = 200
        arr[..., 3] = 255
        arr[0, 0] = 0  # one transparent pixel
        out = decode_image_bytes(encode(Image.fromarray(arr), "GIF"))
        assert out.shape == (4, 4, 4)
        assert out[3, 0, 0] == 0 and torch.all(out[3].flatten()[1:] == 255)

    def test_bmp_and_tiff_exact(self, rgb: np.ndarray) -> None:
        for fmt in ("BMP", "TIFF"):
            out = decode_image_bytes(encode(Image.fromarray(rgb), fmt))
            np.testing.assert_array_equal(hwc(out), rgb)

    def test_tiff_16bit_and_first_page(self, rgb: np.ndarray) -> None:
        arr = np.random.default_rng(4).integers(0, 65536, (H, W), dtype=np.uint16)
        out = decode_image_bytes(encode(Image.fromarray(arr), "TIFF"))
        assert out.dtype == torch.uint16
        np.testing.assert_array_equal(out[0].numpy(), arr)
        pages = [Image.fromarray(rgb), Image.fromarray(255 - rgb)]
        out = decode_image_bytes(encode(pages[0], "TIFF", save_all=True, append_images=pages[1:]))
        np.testing.assert_array_equal(hwc(out), rgb)

    def test_float_tiff_points_to_decode_tiff(self) -> None:
        data = encode(Image.fromarray(np.ones((H, W), np.float32)), "TIFF")
        with pytest.raises(DecodeError, match="decode_tiff"):
            decode_image_bytes(data)

    @pytest.mark.skipif(not features.check("avif"), reason="Pillow built without AVIF")
    def test_avif(self) -> None:
        out = decode_image_bytes(encode(Image.fromarray(smooth_rgb()), "AVIF", quality=90))
        assert out.shape == (3, 32, 48) and np.abs(hwc(out).astype(int) - smooth_rgb()).mean() < 6

    def test_heic_is_refused_clearly(self) -> None:
        fake = b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic" + b"\x00" * 32
        assert image_format(fake) == "heic"
        with pytest.raises(DecodeError, match="HEIC"):
            decode_image_bytes(fake, url="x.heic")

    def test_input_buffer_types(self, rgb: np.ndarray) -> None:
        data = encode(Image.fromarray(rgb), "PNG")
        ref = decode_image_bytes(data)
        as_array = np.frombuffer(data, np.uint8)
        buffers = (bytearray(data), memoryview(data), as_array, torch.from_numpy(as_array.copy()))
        for buf in buffers:
            assert torch.equal(decode_image_bytes(buf), ref)
        with pytest.raises(TypeError, match="uint8"):
            decode_image_bytes(np.frombuffer(data, np.uint8).astype(np.int16))
        with pytest.raises(TypeError, match="encoded image bytes"):
            decode_image_bytes("not bytes")  # type: ignore[arg-type]

    def test_format_sniffing(self, rgb: np.ndarray) -> None:
        img = Image.fromarray(rgb)
        for fmt in ("JPEG", "PNG", "GIF", "WEBP", "BMP", "TIFF"):
            assert image_format(encode(img, fmt)) == {"JPEG": "jpeg"}.get(fmt, fmt.lower())
        assert image_format(b"plain text") is None


class TestModes:
    @pytest.fixture
    def rgba_png(self, rgba: np.ndarray) -> bytes:
        return encode(Image.fromarray(rgba), "PNG")

    def test_gray_matches_pillow(self, rgba_png: bytes, rgba: np.ndarray) -> None:
        expected = np.array(Image.fromarray(rgba).convert("L"))
        for mode in ("GRAY", "gray", "L"):
            out = decode_image_bytes(rgba_png, mode=mode)
            assert out.shape == (1, H, W)
            np.testing.assert_array_equal(out[0].numpy(), expected)

    def test_rgb_rgba_la(self, rgba_png: bytes, rgba: np.ndarray, rgb: np.ndarray) -> None:
        np.testing.assert_array_equal(hwc(decode_image_bytes(rgba_png, mode="RGB")), rgba[:, :, :3])
        np.testing.assert_array_equal(hwc(decode_image_bytes(rgba_png, mode="rgba")), rgba)
        la = decode_image_bytes(rgba_png, mode="LA")
        np.testing.assert_array_equal(hwc(la), np.array(Image.fromarray(rgba).convert("LA")))
        opaque = decode_image_bytes(encode(Image.fromarray(rgb), "PNG"), mode="RGBA")
        assert opaque.shape == (4, H, W) and torch.all(opaque[3] == 255)
        gray3 = decode_image_bytes(encode(Image.fromarray(rgb[:, :, 0]), "PNG"), mode="RGB", contiguous=True)
        assert torch.equal(gray3[0], gray3[1]) and torch.equal(gray3[1], gray3[2])
        assert gray3.is_contiguous()

    def test_every_format_honours_mode(self, rgb: np.ndarray) -> None:
        img = Image.fromarray(rgb)
        for fmt in ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF"):
            data = encode(img, fmt)
            for mode, channels in (("GRAY", 1), ("LA", 2), ("RGB", 3), ("RGBA", 4)):
                out = decode_image_bytes(data, mode=mode)
                assert out.shape == (channels, H, W), (fmt, mode)
                packed = decode_image_bytes(data, mode=mode, contiguous=True)
                assert packed.is_contiguous()
                assert torch.equal(packed, out)

    def test_16bit_modes_keep_uint16(self) -> None:
        arr = np.random.default_rng(5).integers(0, 65536, (H, W, 3), dtype=np.uint16)
        gray = decode_image_bytes(png16(arr), mode="GRAY")
        assert gray.dtype == torch.uint16 and gray.shape == (1, H, W)
        wide = arr.astype(np.int64)
        expected = (wide[..., 0] * 19595 + wide[..., 1] * 38470 + wide[..., 2] * 7471 + 32768) >> 16
        np.testing.assert_array_equal(gray[0].numpy(), expected.astype(np.uint16))
        rgba = decode_image_bytes(png16(arr), mode="RGBA")
        assert rgba.dtype == torch.uint16 and torch.all(rgba[3] == 65535)

    def test_torchvision_read_mode(self, rgba_png: bytes) -> None:
        from torchvision.io import ImageReadMode

        assert decode_image_bytes(rgba_png, mode=ImageReadMode.RGB).shape == (3, H, W)
        assert decode_image_bytes(rgba_png, mode=ImageReadMode.GRAY_ALPHA).shape == (2, H, W)
        assert decode_image_bytes(rgba_png, mode=ImageReadMode.UNCHANGED).shape == (4, H, W)
        assert normalize_image_mode(ImageReadMode.RGB_ALPHA) == 4

    def test_invalid_modes(self, rgba_png: bytes) -> None:
        with pytest.raises(ValueError, match="unknown image mode"):
            decode_image_bytes(rgba_png, mode="CMYK")
        with pytest.raises(TypeError, match="image mode"):
            decode_image_bytes(rgba_png, mode=3)


class TestExifOrientation:
    @pytest.mark.parametrize("orientation", range(1, 9))
    @pytest.mark.parametrize(("fmt", "kwargs", "tolerance"), [
        ("PNG", {}, 0),
        ("WEBP", {"lossless": True}, 0),
        ("TIFF", {}, 0),
        ("JPEG", {"quality": 95}, 8),
    ])
    def test_matches_pillow_exif_transpose(self, orientation: int, fmt: str, kwargs: dict, tolerance: int) -> None:
        arr = smooth_rgb()[:8, :12].copy()
        arr[0, 0] = (255, 255, 255)  # a marker corner
        exif = Image.Exif()
        exif[0x0112] = orientation
        data = encode(Image.fromarray(arr), fmt, exif=exif.tobytes(), **kwargs)
        expected = np.array(ImageOps.exif_transpose(Image.open(io.BytesIO(data))))
        out = decode_image_bytes(data, contiguous=True)
        assert hwc(out).shape == expected.shape
        assert np.abs(hwc(out).astype(int) - expected.astype(int)).max() <= tolerance
        if orientation in (5, 6, 7, 8):
            assert out.shape == (3, 12, 8)
        assert out.is_contiguous()


class TestJpegOperator:
    """JPEGs go straight to torchvision's CPU operator; the public function where the operator is missing."""

    @pytest.fixture
    def rotated_jpegs(self) -> list[bytes]:
        arr = smooth_rgb()
        exif = Image.Exif()
        exif[0x0112] = 6
        return [
            encode(Image.fromarray(arr), "JPEG", quality=90),
            encode(Image.fromarray(arr), "JPEG", quality=90, exif=exif.tobytes()),
            encode(Image.fromarray(arr[:, :, 0]), "JPEG", quality=90),
            encode(Image.fromarray(arr).convert("CMYK"), "JPEG", quality=90),
        ]

    @staticmethod
    def public_call(data: bytes, mode: str | None) -> torch.Tensor:
        from torchvision.io import ImageReadMode, decode_jpeg

        tv_mode = {None: ImageReadMode.UNCHANGED, "RGB": ImageReadMode.RGB, "L": ImageReadMode.GRAY}[mode]
        raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        return decode_jpeg(raw, mode=tv_mode, apply_exif_orientation=True)

    @pytest.mark.parametrize("mode", [None, "RGB", "L"])
    def test_same_pixels_as_torchvision_decode_jpeg(self, rotated_jpegs: list[bytes], mode: str | None) -> None:
        for data in rotated_jpegs:
            expected = self.public_call(data, mode)
            if mode is None and expected.shape[0] == 4:
                continue  # CMYK kept as four channels by torchvision; pipekit's None mode gives RGB
            assert torch.equal(decode_image_bytes(data, mode=mode), expected)

    def test_without_the_operator_the_public_function_is_used(
        self, rotated_jpegs: list[bytes], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        import pipekit.decoders as decoders

        direct = [decode_image_bytes(data, mode="RGB") for data in rotated_jpegs]
        monkeypatch.setattr(decoders, "_jpeg_operator", lambda: None)  # as if the extension had not loaded
        monkeypatch.setattr(decoders, "_simplejpeg_decoder", lambda: None)  # torchvision's path for every file
        decoders._tv_jpeg.cache_clear()
        try:
            calls = []
            import torchvision.io

            real = torchvision.io.decode_jpeg
            monkeypatch.setattr(torchvision.io, "decode_jpeg", lambda *a, **k: calls.append(k) or real(*a, **k))
            fallback = [decode_image_bytes(data, mode="RGB") for data in rotated_jpegs]
        finally:
            monkeypatch.undo()
            decoders._tv_jpeg.cache_clear()
        assert len(calls) == len(rotated_jpegs) and all(k["apply_exif_orientation"] for k in calls)
        assert all(torch.equal(a, b) for a, b in zip(direct, fallback))
        assert fallback[1].shape == (3, 48, 32)  # orientation 6 applied on the fallback path too


class TestErrors:
    def test_empty(self) -> None:
        with pytest.raises(DecodeError, match="empty") as info:
            decode_image_bytes(b"", url="s3://b/empty.png")
        err = info.value
        assert (err.url, err.stage, err.action) == ("s3://b/empty.png", "decode_image", "decode image")

    @pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF"])
    def test_truncated(self, fmt: str) -> None:
        data = encode(Image.fromarray(smooth_rgb()), fmt)
        with pytest.raises(DecodeError) as info:
            decode_image_bytes(data[: len(data) // 2], url=f"x.{fmt.lower()}", stage="my_stage")
        err = info.value
        assert (err.url, err.stage) == (f"x.{fmt.lower()}", "my_stage")
        assert str(err).startswith(f"cannot decode image 'x.{fmt.lower()}' in my_stage: ")
        assert "/__w/" not in str(err)  # torchvision's C++ source locations are dropped
        assert isinstance(err.__cause__, Exception)

    def test_not_an_image(self) -> None:
        with pytest.raises(DecodeError, match="not a recognised image format"):
            decode_image_bytes(b"just some text, not pixels", url="notes.jpg")

    @pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
    def test_corrupt_pngs_do_not_crash_the_process(self) -> None:
        # torchvision 0.29's decode_png segfaults on such files; each is decoded in a forked child
        # so that a crash shows as a failed test instead of killing the test run.
        for data in [encode(Image.fromarray(smooth_rgb()), "PNG"), png16(smooth_rgb().astype(np.uint16) * 257)]:
            rng = np.random.default_rng(6)
            for trial in range(12):
                bad = bytearray(data)
                start = int(rng.integers(40, len(bad) - 60))
                bad[start : start + 50] = bytes(b ^ 0xFF for b in bad[start : start + 50])
                if trial % 2:
                    bad = bad[: int(rng.integers(30, len(bad)))]
                pid = os.fork()
                if pid == 0:  # pragma: no cover - child
                    try:
                        decode_image_bytes(bytes(bad))
                        os._exit(0)
                    except DecodeError:
                        os._exit(1)
                    except BaseException:
                        os._exit(2)
                _, status = os.waitpid(pid, 0)
                assert os.WIFEXITED(status), f"decoding a corrupt PNG killed the process (trial {trial})"
                assert os.WEXITSTATUS(status) in (0, 1), "a corrupt PNG raised something other than DecodeError"

    def test_decode_error_pickles(self) -> None:
        with pytest.raises(DecodeError) as info:
            decode_image_bytes(b"\xff\xd8\xff\x00garbage", url="a.jpg")
        clone = pickle.loads(pickle.dumps(info.value))
        assert (clone.url, clone.stage, clone.reason) == ("a.jpg", "decode_image", info.value.reason)


class TestExtensionDecoders:
    def test_text_and_cls(self) -> None:
        assert decode_text("\ufeffhé\n".encode()) == "hé\n"
        assert decode_cls(b" 42\n") == 42 and decode_cls(b"-3") == -3
        assert decode_cls(b"dog\n") == "dog"
        with pytest.raises(UnicodeDecodeError):
            decode_text(b"\xff\xfe\xfa")

    def test_json(self) -> None:
        assert decode_json(b'\xef\xbb\xbf{"a": [1, null]}') == {"a": [1, None]}
        with pytest.raises(ValueError):
            decode_json(b"{not json")

    def test_npy_npz_refuse_pickles(self) -> None:
        arr = np.arange(6, dtype=np.float32).reshape(2, 3)
        buf = io.BytesIO()
        np.save(buf, arr)
        out = decode_npy(buf.getvalue())
        assert out.dtype == np.float32 and np.array_equal(out, arr)
        buf = io.BytesIO()
        np.savez(buf, a=arr, b=np.array([1, 2], np.int64))
        out_z = decode_npz(buf.getvalue())
        assert set(out_z) == {"a", "b"} and np.array_equal(out_z["a"], arr)
        buf = io.BytesIO()
        np.save(buf, np.array([{"x": 1}], dtype=object), allow_pickle=True)
        with pytest.raises(ValueError, match="allow_pickle"):
            decode_npy(buf.getvalue())

    def test_torch_weights_only(self) -> None:
        buf = io.BytesIO()
        torch.save({"w": torch.arange(3), "meta": {"n": 1}}, buf)
        out = decode_torch(buf.getvalue())
        assert torch.equal(out["w"], torch.arange(3)) and out["meta"] == {"n": 1}
        buf = io.BytesIO()
        torch.save(Image.new("L", (1, 1)), buf)  # an arbitrary pickled object
        with pytest.raises(pickle.UnpicklingError, match="weights_only"):
            decode_torch(buf.getvalue())

    @pytest.mark.parametrize("dtype", ["uint8", "int16", "uint16", "float32"])
    def test_tiff_keeps_bands_and_dtype(self, dtype: str) -> None:
        arr = (np.arange(3 * 4 * 5) % 100).reshape(3, 4, 5).astype(dtype)
        profile = {
            "driver": "GTiff", "width": 5, "height": 4, "count": 3, "dtype": dtype,
            "crs": "EPSG:32631", "transform": Affine(10, 0, 500000, 0, -10, 4000000),
        }
        with MemoryFile() as mem:
            with mem.open(**profile) as ds:
                ds.write(arr)
            blob = mem.read()
        out = decode_tiff(blob)
        assert out.shape == (3, 4, 5) and str(out.dtype) == f"torch.{dtype}"
        np.testing.assert_array_equal(out.numpy(), arr)

    def test_tiff_corrupt(self) -> None:
        with pytest.raises(Exception, match=r"(?i)tiff|not recognized|format"):
            decode_tiff(b"II*\x00garbage")

    def test_default_handlers(self) -> None:
        handlers = default_handlers()
        for ext in (".json", ".txt", ".cls", ".npy", ".npz", ".pt", ".pth", ".tif", ".tiff", ".jpg", ".jpeg",
                    ".png", ".webp", ".gif", ".bmp"):
            assert ext in handlers
        assert ".pickle" not in handlers and ".pyd" not in handlers
        assert all(key == key.lower() and key.startswith(".") for key in handlers)
        gray = default_handlers(image_mode="GRAY")[".png"]
        png = encode(Image.fromarray(smooth_rgb()), "PNG")
        assert gray(png).shape == (1, 32, 48)
        pickle.loads(pickle.dumps(default_handlers(image_mode="RGB")))  # workers get a copy
        with pytest.raises(ValueError):
            default_handlers(image_mode="bogus")
