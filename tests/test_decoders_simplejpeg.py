"""JPEGs decoded by the optional ``simplejpeg``: the same tensors as torchvision's decoder, or left to it.

The routing (which files and modes go to ``simplejpeg``, what happens when it refuses one) is tested with a
stand-in decoder everywhere; the pixels of the real package against torchvision's where it is installed.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

import pipekit._image_backends as backends
from pipekit._decode_checks import jpeg_frame, jpeg_size
from pipekit.decoders import decode_image_bytes
from pipekit.errors import DecodeError


def _jpeg(mode: str = "RGB", size: tuple[int, int] = (33, 17), seed: int = 0, **kwargs) -> bytes:
    rng = np.random.default_rng(seed)
    channels = {"L": 1, "RGB": 3, "CMYK": 4}[mode]
    arr = rng.integers(0, 256, (size[1], size[0], channels), dtype=np.uint8)
    smooth = np.cumsum(arr, axis=1, dtype=np.uint16).astype(np.uint8)  # some structure, not only noise
    image = Image.fromarray(smooth[:, :, 0] if channels == 1 else smooth, mode)
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=kwargs.pop("quality", 90), **kwargs)
    return buf.getvalue()


def _with_exif(orientation: int = 6) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return _jpeg(exif=exif.tobytes())


FILES = {
    "rgb 4:2:0": lambda: _jpeg(),
    "rgb 4:4:4": lambda: _jpeg(subsampling=0),
    "rgb 4:2:2": lambda: _jpeg(subsampling=1, size=(64, 48)),
    "progressive": lambda: _jpeg(progressive=True, size=(40, 30)),
    "gray": lambda: _jpeg("L"),
    "photo size": lambda: _jpeg(size=(320, 256), seed=3),
}
MODES = [None, "RGB", "GRAY", "RGBA", "GRAY_ALPHA"]


@pytest.fixture
def torchvision_only(monkeypatch):
    """Decode as without ``simplejpeg`` (the reference)."""

    def use() -> None:
        monkeypatch.setattr(backends, "_simplejpeg_decoder", lambda: None)
        monkeypatch.setattr("pipekit.decoders._simplejpeg_decoder", lambda: None)

    return use


@pytest.fixture
def stand_in(monkeypatch):
    """A ``simplejpeg.decode_jpeg`` stand-in (torchvision's decoder, HWC), recording the calls it gets."""
    from torchvision.io import ImageReadMode, decode_jpeg

    calls: list[str] = []

    def decode(data: bytes, colorspace: str, strict: bool = True) -> np.ndarray:
        assert strict
        calls.append(colorspace)
        mode = {"RGB": ImageReadMode.RGB, "GRAY": ImageReadMode.GRAY}[colorspace]
        out = decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=mode)
        if (data[-2:] != b"\xff\xd9") or colorspace not in ("RGB", "GRAY"):
            raise ValueError("strict: premature end of data")
        return out.permute(1, 2, 0).numpy().copy()

    monkeypatch.setattr(backends, "_simplejpeg_decoder", lambda: decode)
    monkeypatch.setattr("pipekit.decoders._simplejpeg_decoder", lambda: decode)
    return calls


class TestJpegFrame:
    @pytest.mark.parametrize(("mode", "components"), [("RGB", 3), ("L", 1), ("CMYK", 4)])
    def test_size_components_and_no_exif(self, mode, components):
        data = _jpeg(mode, size=(21, 9))
        assert jpeg_frame(data) == (21, 9, components, False)
        assert jpeg_frame(data)[:2] == jpeg_size(data)

    def test_an_exif_segment_is_seen(self):
        assert jpeg_frame(_with_exif()) == (33, 17, 3, True)

    def test_an_exif_segment_after_the_frame_header_is_seen(self):
        data = _with_exif()
        start = data.index(b"\xff\xe1")
        app1 = data[start : start + 2 + int.from_bytes(data[start + 2 : start + 4], "big")]
        rest = data[:start] + data[start + len(app1) :]
        sof = rest.index(b"\xff\xc0")
        after = sof + 2 + int.from_bytes(rest[sof + 2 : sof + 4], "big")
        moved = rest[:after] + app1 + rest[after:]  # libjpeg still reads it (before the scan): so does torchvision
        assert jpeg_frame(moved) == (33, 17, 3, True)

    def test_a_header_cut_before_the_scan_is_none(self):
        data = _jpeg()
        sos = data.index(b"\xff\xda")
        assert jpeg_frame(data[:sos]) is None
        assert jpeg_frame(data[:sos] + b"\xff\xda\x00") is None  # too short to read the scan header
        assert jpeg_frame(b"\xff\xd8\xff\xe0\x00") is None


class TestRouting:
    @pytest.mark.parametrize("mode", MODES)
    @pytest.mark.parametrize("name", sorted(FILES))
    def test_same_tensor_as_torchvision(self, name, mode, stand_in, torchvision_only):
        data = FILES[name]()
        got = decode_image_bytes(data, mode=mode)
        assert stand_in, "simplejpeg's path was not taken"
        torchvision_only()
        expected = decode_image_bytes(data, mode=mode)
        assert got.shape == expected.shape and got.dtype == expected.dtype
        assert torch.equal(got, expected)
        assert got.is_contiguous() == expected.is_contiguous()
        assert torch.equal(decode_image_bytes(data, mode=mode, contiguous=True), expected.contiguous())

    @pytest.mark.parametrize("data", [_with_exif(6), _jpeg("CMYK")], ids=["exif", "cmyk"])
    def test_exif_and_cmyk_files_go_to_torchvision(self, data, stand_in, torchvision_only):
        got = decode_image_bytes(data, mode="RGB")
        assert stand_in == []
        torchvision_only()
        assert torch.equal(got, decode_image_bytes(data, mode="RGB"))

    def test_a_file_simplejpeg_refuses_is_decoded_or_named_by_torchvision(self, stand_in, torchvision_only):
        data = _jpeg(size=(64, 64))
        cut = data[: len(data) // 2]  # strict simplejpeg refuses it; torchvision names it
        with pytest.raises(DecodeError) as got:
            decode_image_bytes(cut, url="s3://b/x.jpg", stage="decode")
        assert stand_in == ["RGB"]
        torchvision_only()
        with pytest.raises(DecodeError) as expected:
            decode_image_bytes(cut, url="s3://b/x.jpg", stage="decode")
        assert str(got.value) == str(expected.value) and "s3://b/x.jpg" in str(got.value)

    def test_the_pixel_limit_is_checked_before_decoding(self, stand_in):
        with pytest.raises(DecodeError, match="pixels"):
            decode_image_bytes(_jpeg(size=(64, 64)), max_pixels=64 * 63)
        assert stand_in == []


def test_simplejpeg_gives_torchvision_s_pixels(monkeypatch):
    simplejpeg = pytest.importorskip("simplejpeg")
    assert backends._simplejpeg_decoder() is simplejpeg.decode_jpeg
    for name, make in FILES.items():
        data = make()
        for mode in MODES:
            got = decode_image_bytes(data, mode=mode)
            with monkeypatch.context() as mp:
                mp.setattr("pipekit.decoders._simplejpeg_decoder", lambda: None)
                expected = decode_image_bytes(data, mode=mode)
            assert got.shape == expected.shape and torch.equal(got, expected), (name, mode)


def test_the_fast_path_switch_turns_simplejpeg_off(monkeypatch):
    from pipekit import _fast

    calls = []

    def decode(data: bytes, colorspace: str, strict: bool = True) -> np.ndarray:
        calls.append(colorspace)
        raise ValueError("refused")  # then torchvision decodes it

    monkeypatch.setattr(backends, "_simplejpeg_module", lambda: decode)
    data = _jpeg()
    monkeypatch.setitem(_fast.state, "simplejpeg", False)
    off = decode_image_bytes(data)
    assert calls == []
    monkeypatch.setitem(_fast.state, "simplejpeg", True)
    assert torch.equal(decode_image_bytes(data), off) and calls == ["RGB"]
