"""Decompression bombs: every decode path checks an image's declared size against a pixel limit first.

The files are real: a small JPEG whose SOF header is patched to declare 60000x60000 pixels, WebP, PNG
(8 and 16 bit), GIF, BMP and TIFF files written by Pillow, a tiled sparse 60000x60000 GeoTIFF written by
rasterio (a few hundred KB on disk, 3.6 GB once decoded), and ``.npy`` files whose header declares more
data than they hold.  A refused image raises :class:`~pipekit.errors.DecodeError` naming the file, the
declared size and the limit before any pixel buffer is allocated.
"""

from __future__ import annotations

import io
import pickle
import struct
import time
import zipfile
import zlib
from pathlib import Path

import numpy as np
import numpy.lib.format as npy_format
import pytest
from PIL import Image

import pipekit.decoders as decoders
from pipekit.decoders import decode_image_bytes, decode_npy, decode_npz, decode_tiff
from pipekit.errors import DecodeError
from pipekit.pipes import Decoder, ImageDecoder, IterableWrapper

W, H = 10, 6  # 60 pixels


def encode(fmt: str, size: tuple[int, int] = (W, H), mode: str = "RGB", **kwargs: object) -> bytes:
    rng = np.random.default_rng(0)
    channels = {"RGB": 3, "RGBA": 4, "L": 1}[mode]
    arr = rng.integers(0, 255, (size[1], size[0], channels), dtype=np.uint8)
    img = Image.fromarray(arr[:, :, 0] if mode == "L" else arr, mode)
    buf = io.BytesIO()
    img.save(buf, fmt, **kwargs)
    return buf.getvalue()


def png16_rgb(width: int = W, height: int = H) -> bytes:
    """A 16-bit RGB PNG written by hand (Pillow cannot write one): decoded by torchvision, not Pillow."""
    raw = b"".join(b"\x00" + bytes(6 * width) for _ in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 16, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def jpeg_declaring(width: int, height: int) -> bytes:
    """A real 16x16 JPEG whose start-of-frame header is patched to declare ``width`` x ``height``."""
    data = bytearray(encode("JPEG", (16, 16)))
    pos = 2
    while data[pos + 1] not in (0xC0, 0xC1, 0xC2):  # walk the segments to the SOF
        pos += 2 + int.from_bytes(data[pos + 2 : pos + 4], "big")
    data[pos + 5 : pos + 9] = struct.pack(">HH", height, width)
    return bytes(data)


@pytest.fixture(scope="module")
def sparse_tiff(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A tiled 60000x60000 GeoTIFF with no tile written (``SPARSE_OK``): small on disk, 3.6 GB decoded."""
    import rasterio
    from rasterio.transform import Affine

    path = tmp_path_factory.mktemp("sparse") / "sparse.tif"
    profile = {"driver": "GTiff", "width": 60000, "height": 60000, "count": 1, "dtype": "uint8", "tiled": True,
               "blockxsize": 512, "blockysize": 512, "sparse_ok": True, "crs": "EPSG:4326",
               "transform": Affine(1e-4, 0, 0, 0, -1e-4, 0)}
    with rasterio.open(path, "w", **profile):
        pass
    return Path(path).read_bytes()


class TestDefaultLimit:
    def test_the_default_is_pillows_own_error_threshold(self) -> None:
        # Pillow refuses images over twice its MAX_IMAGE_PIXELS (89,478,485): one ceiling for every format
        assert decoders.MAX_IMAGE_PIXELS == 2 * 89_478_485 == 2 * Image.MAX_IMAGE_PIXELS

    @pytest.mark.timeout(60)
    def test_a_632_byte_jpeg_declaring_60000x60000_is_refused_before_decoding(self) -> None:
        bomb = jpeg_declaring(60000, 60000)
        assert len(bomb) < 1000
        start = time.perf_counter()
        with pytest.raises(DecodeError) as info:
            decode_image_bytes(bomb, url="s3://b/bomb.jpg")
        assert time.perf_counter() - start < 1.0  # the header only: nothing decoded or allocated
        err = info.value
        assert (err.url, err.stage) == ("s3://b/bomb.jpg", "decode_image")
        assert "60000x60000" in err.reason and "178,956,970" in err.reason and "max_pixels" in err.reason

    @pytest.mark.timeout(60)
    def test_a_jpeg_declaring_20000x20000_is_refused(self) -> None:
        with pytest.raises(DecodeError, match="20000x20000"):
            decode_image_bytes(jpeg_declaring(20000, 20000), url="big.jpg")

    @pytest.mark.timeout(60)
    def test_a_sparse_60000x60000_tiff_is_refused_by_both_tiff_decoders(self, sparse_tiff: bytes) -> None:
        assert len(sparse_tiff) < 2_000_000
        with pytest.raises(DecodeError, match="60000x60000") as info:
            decode_tiff(sparse_tiff)
        assert "178,956,970" in info.value.reason
        with pytest.raises(DecodeError, match="60000x60000"):
            decode_image_bytes(sparse_tiff, url="sparse.tif")

    def test_an_image_at_the_limit_decodes(self) -> None:
        img = decode_image_bytes(jpeg_declaring(16, 16), max_pixels=256)
        assert tuple(img.shape) == (3, 16, 16)


# every backend: torchvision's JPEG operator, Pillow (PNG, GIF, BMP, TIFF), torchvision's WebP and 16-bit PNG
FILES = {
    "jpeg": lambda: encode("JPEG"),
    "png": lambda: encode("PNG"),
    "png16": png16_rgb,
    "webp": lambda: encode("WEBP", lossless=True),
    "webp_lossy": lambda: encode("WEBP", quality=80),
    "webp_alpha": lambda: encode("WEBP", mode="RGBA", lossless=True),
    "gif": lambda: encode("GIF"),
    "bmp": lambda: encode("BMP"),
    "tiff": lambda: encode("TIFF"),
}


class TestEveryFormat:
    @pytest.mark.parametrize("kind", sorted(FILES))
    def test_max_pixels_per_call(self, kind: str) -> None:
        data = FILES[kind]()
        assert tuple(decode_image_bytes(data, max_pixels=W * H).shape[1:]) == (H, W)
        with pytest.raises(DecodeError, match=f"{W}x{H}") as info:
            decode_image_bytes(data, url=f"x.{kind}", max_pixels=W * H - 1)
        assert str(W * H - 1) in info.value.reason

    @pytest.mark.parametrize("kind", sorted(FILES))
    def test_the_module_setting(self, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(decoders, "MAX_IMAGE_PIXELS", W * H - 1)
        with pytest.raises(DecodeError, match="MAX_IMAGE_PIXELS"):
            decode_image_bytes(FILES[kind](), url=f"x.{kind}")
        monkeypatch.setattr(decoders, "MAX_IMAGE_PIXELS", None)  # None: no limit, as Pillow's
        assert tuple(decode_image_bytes(FILES[kind]()).shape[1:]) == (H, W)

    def test_a_limit_above_pillows_names_pillows_setting(self) -> None:
        # a PNG declaring 20000x20000 (Pillow decodes PNG): Pillow's own threshold refuses it too
        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

        header = struct.pack(">IIBBBBB", 20000, 20000, 8, 2, 0, 0, 0)
        png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 100))
        png += chunk(b"IEND", b"")
        with pytest.raises(DecodeError, match="20000x20000") as info:
            decode_image_bytes(png, url="x.png")
        assert "max_pixels" in info.value.reason
        with pytest.raises(DecodeError, match=r"PIL\.Image\.MAX_IMAGE_PIXELS"):
            decode_image_bytes(png, url="x.png", max_pixels=10**12)

    @pytest.mark.parametrize("bad", [0, -1, 1.5, "many", True])
    def test_bad_max_pixels(self, bad: object) -> None:
        with pytest.raises((TypeError, ValueError), match="max_pixels"):
            decode_image_bytes(encode("PNG"), max_pixels=bad)

    def tiff(self, bands: int) -> bytes:
        from rasterio.io import MemoryFile

        with MemoryFile() as mem:
            with mem.open(driver="GTiff", width=W, height=H, count=bands, dtype="uint16") as ds:
                ds.write(np.ones((bands, H, W), dtype=np.uint16))
            return mem.read()

    def test_decode_tiff_per_call(self) -> None:
        blob = self.tiff(4)
        assert tuple(decode_tiff(blob, max_pixels=W * H).shape) == (4, H, W)
        with pytest.raises(DecodeError, match=f"{W}x{H}"):
            decode_tiff(blob, max_pixels=W * H - 1)

    def test_decode_tiff_counts_bands_beyond_four(self) -> None:
        # 1000 bands of a 10000x10000 TIFF are 100 MP but 100 G samples: a band counts as a quarter image
        with pytest.raises(DecodeError, match="5 bands of 10x6 pixels"):
            decode_tiff(self.tiff(5), max_pixels=W * H)
        assert tuple(decode_tiff(self.tiff(5), max_pixels=W * H * 5 // 4).shape) == (5, H, W)


class TestNpyHeaders:
    def npy_declaring(self, shape: tuple[int, ...], payload: int = 64) -> bytes:
        buf = io.BytesIO()
        npy_format.write_array_header_1_0(buf, {"descr": "<f8", "fortran_order": False, "shape": shape})
        return buf.getvalue() + bytes(payload)

    @pytest.mark.timeout(60)
    @pytest.mark.parametrize("shape", [(100000, 100000), (10000, 10000)])
    def test_a_header_declaring_more_than_the_file_holds_is_refused_before_allocating(self, shape) -> None:
        with pytest.raises(DecodeError, match="declares") as info:
            decode_npy(self.npy_declaring(shape))
        assert "64 bytes" in info.value.reason
        assert not isinstance(info.value.__cause__, MemoryError)

    def test_a_true_header_still_loads(self) -> None:
        buf = io.BytesIO()
        np.save(buf, np.arange(6, dtype=np.float32).reshape(2, 3))
        assert decode_npy(buf.getvalue()).tolist() == [[0, 1, 2], [3, 4, 5]]


class TestNpz:
    def npz(self, shape: tuple[int, ...], payload: int | None = None) -> bytes:
        """An .npz of one float64 array ``x`` of ``shape``, all zeros, with ``payload`` bytes of data (default: all)."""
        size = int(np.prod(shape)) * 8 if payload is None else payload
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf, zf.open("x.npy", "w", force_zip64=True) as out:
            npy_format.write_array_header_1_0(out, {"descr": "<f8", "fortran_order": False, "shape": shape})
            while size:
                out.write(bytes(min(size, 1 << 20)))
                size -= min(size, 1 << 20)
        return buf.getvalue()

    @pytest.mark.timeout(60)
    def test_a_member_declaring_more_than_it_holds_is_refused_before_allocating(self) -> None:
        with pytest.raises(DecodeError, match=r"'x\.npy'.*declares") as info:
            decode_npz(self.npz((100000, 100000), payload=64))
        assert not isinstance(info.value.__cause__, MemoryError)

    @pytest.mark.timeout(60)
    def test_a_small_npz_expanding_past_the_ratio_is_refused(self) -> None:
        bomb = self.npz((16 << 20,))  # 128 MiB of zeros in about 130 KB
        assert len(bomb) < 1 << 20
        with pytest.raises(DecodeError, match=r"'x\.npy'.*max_ratio=250"):
            decode_npz(bomb)
        assert decode_npz(bomb, max_ratio=10**6)["x"].shape == (16 << 20,)

    def test_an_ordinary_npz_loads(self) -> None:
        buf = io.BytesIO()
        np.savez_compressed(buf, a=np.zeros((100, 100)), b=np.arange(3))
        out = decode_npz(buf.getvalue())
        assert out["a"].shape == (100, 100) and out["b"].tolist() == [0, 1, 2]


class TestPipes:
    def test_decode_image_max_pixels(self) -> None:
        items = [("a.jpg", encode("JPEG")), ("bomb.jpg", jpeg_declaring(60000, 60000)), ("b.png", encode("PNG"))]
        pipe = IterableWrapper(items).decode_image(on_error="skip")
        assert [url for url, _ in pipe] == ["a.jpg", "b.png"]
        assert pipe.skip_log.skipped[0].url == "bomb.jpg" and "60000x60000" in pipe.skip_log.skipped[0].reason
        small = ImageDecoder(IterableWrapper(items[:1]), max_pixels=W * H - 1)
        clone = pickle.loads(pickle.dumps(small))
        with pytest.raises(DecodeError, match=r"a\.jpg' in decode_image: .*max_pixels"):
            list(clone)

    def test_the_pipe_keeps_the_limit_it_was_built_with(self, monkeypatch: pytest.MonkeyPatch) -> None:
        # spawned DataLoader workers import pipekit afresh: the limit travels with the pickled pipe
        monkeypatch.setattr(decoders, "MAX_IMAGE_PIXELS", W * H - 1)
        pipe = IterableWrapper([("a.png", encode("PNG"))]).decode_image()
        monkeypatch.setattr(decoders, "MAX_IMAGE_PIXELS", 2 * 89_478_485)
        with pytest.raises(DecodeError, match="max_pixels"):
            list(pickle.loads(pickle.dumps(pipe)))

    @pytest.mark.timeout(60)
    def test_decode_max_pixels(self, sparse_tiff: bytes) -> None:
        samples = [{"__key__": "s/0", ".jpg": jpeg_declaring(60000, 60000), ".cls": b"1"}]
        with pytest.raises(DecodeError, match=r"s/0\.jpg' in decode: .*60000x60000"):
            list(IterableWrapper(samples).decode())
        with pytest.raises(DecodeError, match=r"sparse\.tif' in decode: .*60000x60000"):
            list(IterableWrapper([("d/sparse.tif", sparse_tiff)]).decode())
        small = Decoder(IterableWrapper([("a.png", encode("PNG")), ("b.tif", encode("TIFF"))]), max_pixels=W * H)
        assert [tuple(v.shape[-2:]) for _, v in small] == [(H, W), (H, W)]
        tiny = Decoder(IterableWrapper([("b.tif", encode("TIFF"))]), max_pixels=W * H - 1, on_error="skip")
        assert list(pickle.loads(pickle.dumps(tiny))) == []
