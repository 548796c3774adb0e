"""Tests of decode_image (ImageDecoder) and decode (Decoder)."""

from __future__ import annotations

import io
import json
import logging
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from rasterio.io import MemoryFile
from rasterio.transform import Affine

from pipekit.errors import DecodeError, ReadError
from pipekit.pipes import Decoder, ImageDecoder, IterableWrapper, StreamWrapper
from pipekit.testing import assert_resumes, resume_after


def encode(arr: np.ndarray, fmt: str, **kwargs) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, fmt, **kwargs)
    return buf.getvalue()


def geotiff(arr: np.ndarray) -> bytes:
    bands, height, width = arr.shape
    profile = {
        "driver": "GTiff",
        "width": width,
        "height": height,
        "count": bands,
        "dtype": str(arr.dtype),
        "crs": "EPSG:4326",
        "transform": Affine(0.1, 0, 10, 0, -0.1, 50),
    }
    with MemoryFile() as mem:
        with mem.open(**profile) as ds:
            ds.write(arr)
        return mem.read()


class Tracking(io.BytesIO):
    """A binary stream that records whether it was closed."""

    def __init__(self, data: bytes = b"") -> None:
        super().__init__(data)
        self.was_closed = False

    def close(self) -> None:
        self.was_closed = True
        super().close()


class FailingStream(io.RawIOBase):
    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        raise OSError("connection reset")


def double_bytes(data: bytes) -> bytes:
    return data * 2


def key_and_index(sample: dict) -> tuple[str, int]:
    return sample["__key__"], sample[".json"]["i"]


def word_count(data: bytes) -> int:
    return len(data.split())


RGB = np.random.default_rng(0).integers(0, 256, (4, 5, 3), dtype=np.uint8)


@pytest.fixture
def image_dir(tmp_path: Path) -> Path:
    (tmp_path / "a.png").write_bytes(encode(RGB, "PNG"))
    (tmp_path / "b.JPG").write_bytes(encode(RGB, "JPEG", quality=95))
    (tmp_path / "c.webp").write_bytes(encode(RGB, "WEBP", lossless=True))
    (tmp_path / "d.bmp").write_bytes(encode(RGB, "BMP"))
    (tmp_path / "e.gif").write_bytes(encode(RGB, "GIF"))
    return tmp_path


@pytest.fixture
def mixed_dir(tmp_path: Path) -> Path:
    (tmp_path / "x.json").write_bytes(b'{"label": "cat", "boxes": [[1, 2, 3, 4]]}')
    (tmp_path / "x.txt").write_bytes("caf\u00e9\n".encode())
    (tmp_path / "x.cls").write_bytes(b"7\n")
    buf = io.BytesIO()
    np.save(buf, np.arange(6, dtype=np.int32).reshape(2, 3))
    (tmp_path / "x.npy").write_bytes(buf.getvalue())
    buf = io.BytesIO()
    torch.save({"emb": torch.ones(2, dtype=torch.float16)}, buf)
    (tmp_path / "x.pth").write_bytes(buf.getvalue())
    (tmp_path / "x.tif").write_bytes(geotiff(np.arange(24, dtype=np.int16).reshape(2, 3, 4)))
    (tmp_path / "x.png").write_bytes(encode(RGB, "PNG"))
    (tmp_path / "x.bin").write_bytes(b"\x00\x01raw")
    return tmp_path


class TestImageDecoder:
    def test_decodes_files_opened_by_fsspec(self, image_dir: Path) -> None:
        paths = sorted(str(p) for p in image_dir.iterdir())
        out = dict(IterableWrapper(paths).open_files_by_fsspec(mode="rb").decode_image())
        assert list(out) == paths
        for path, img in out.items():
            assert img.dtype == torch.uint8 and img.shape == (3, 4, 5), path
        np.testing.assert_array_equal(out[paths[0]].permute(1, 2, 0).numpy(), RGB)  # a.png, lossless
        np.testing.assert_array_equal(out[paths[2]].permute(1, 2, 0).numpy(), RGB)  # c.webp lossless

    def test_mode(self, image_dir: Path) -> None:
        paths = sorted(str(p) for p in image_dir.iterdir())
        for mode, channels in (("GRAY", 1), ("rgba", 4), ("L", 1)):
            dp = IterableWrapper(paths).open_files_by_fsspec(mode="rb").decode_image(mode=mode)
            assert {img.shape for _, img in dp} == {(channels, 4, 5)}

    def test_reads_and_closes_streams(self) -> None:
        streams = [Tracking(encode(RGB, "PNG")), Tracking(encode(RGB, "BMP"))]
        dp = IterableWrapper([("s1.png", streams[0]), ("s2.bmp", streams[1])], deepcopy=False).decode_image()
        assert [url for url, _ in dp] == ["s1.png", "s2.bmp"]
        assert all(s.was_closed for s in streams)

    def test_accepts_buffers(self) -> None:
        data = encode(RGB, "PNG")
        items = [("b", data), ("ba", bytearray(data)), ("np", np.frombuffer(data, np.uint8))]
        out = list(IterableWrapper(items, deepcopy=False).decode_image())
        assert all(torch.equal(img, out[0][1]) for _, img in out)

    def test_raise_names_url_and_stage(self) -> None:
        good = encode(RGB, "PNG")
        dp = IterableWrapper([("ok.png", good), ("s3://bucket/bad.jpg", good[:40])]).decode_image()
        it = iter(dp)
        assert next(it)[0] == "ok.png"
        with pytest.raises(DecodeError) as info:
            next(it)
        assert (info.value.url, info.value.stage) == ("s3://bucket/bad.jpg", "decode_image")
        assert str(info.value).startswith("cannot decode image 's3://bucket/bad.jpg' in decode_image: ")

    def test_read_error(self) -> None:
        dp = IterableWrapper([("net.png", FailingStream())], deepcopy=False).decode_image()
        with pytest.raises(ReadError, match="connection reset") as info:
            list(dp)
        assert (info.value.url, info.value.stage) == ("net.png", "decode_image")

    def test_skip_logs_and_counts(self, caplog: pytest.LogCaptureFixture) -> None:
        good = encode(RGB, "PNG")
        items = [("1.png", good), ("2.png", b"garbage"), ("3.png", good), ("4.jpg", b""), ("5.png", FailingStream())]
        dp = IterableWrapper(items, deepcopy=False).decode_image(on_error="skip")
        with caplog.at_level(logging.WARNING, logger="pipekit"):
            assert [url for url, _ in dp] == ["1.png", "3.png"]
        assert dp.skip_log.count == 3
        assert [s.url for s in dp.skip_log.skipped] == ["2.png", "4.jpg", "5.png"]
        assert "empty" in dp.skip_log.skipped[1].reason
        assert sum("skipped" in r.getMessage() for r in caplog.records) == 3

    def test_validation(self) -> None:
        src = IterableWrapper([])
        with pytest.raises(ValueError, match="on_error"):
            ImageDecoder(src, on_error="ignore")
        with pytest.raises(ValueError, match="unknown image mode"):
            ImageDecoder(src, mode="HSV")
        with pytest.raises(TypeError, match="IterDataPipe"):
            ImageDecoder([("a", b"")])  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"\(url, stream_or_bytes\)"):
            list(IterableWrapper([b"no url"]).decode_image())
        with pytest.raises(TypeError, match="encoded image bytes"):
            list(IterableWrapper([("a.png", 42)]).decode_image(on_error="skip"))
        with pytest.raises(TypeError, match="text mode"):
            list(IterableWrapper([("a.png", io.StringIO("text"))], deepcopy=False).decode_image())

    def test_stream_wrappers_read_and_closed(self, image_dir: Path) -> None:
        # open_files_by_fsspec's streams are read through the wrapped file and closed via the wrapper.
        path = str(image_dir / "a.png")
        stream = StreamWrapper(Tracking((image_dir / "a.png").read_bytes()), name=path)
        [(url, img)] = list(IterableWrapper([(path, stream)], deepcopy=False).decode_image())
        assert url == path and img.shape == (3, 4, 5)
        assert stream.closed and stream.file_obj.was_closed

    def test_stream_wrapper_read_error_names_url_and_stage(self) -> None:
        stream = StreamWrapper(FailingStream(), name="s3://b/x.png")
        with pytest.raises(ReadError, match="connection reset") as info:
            list(IterableWrapper([("s3://b/x.png", stream)], deepcopy=False).decode_image())
        assert (info.value.url, info.value.stage) == ("s3://b/x.png", "decode_image")
        assert stream.closed  # closed even though the read failed
        text = StreamWrapper(io.StringIO("text"), name="t.png")
        with pytest.raises(TypeError, match="text mode"):
            list(IterableWrapper([("t.png", text)], deepcopy=False).decode_image())

    def test_child_stream_closes_its_parent(self) -> None:
        # A wrapper with a parent (an archive member) goes through StreamWrapper.close's bookkeeping.
        parent = StreamWrapper(Tracking(b"archive"))
        parent.close_on_last_child = True
        child = StreamWrapper(Tracking(encode(RGB, "PNG")), parent_stream=parent)
        out = list(IterableWrapper([("m.png", child)], deepcopy=False).decode_image())
        assert out[0][1].shape == (3, 4, 5)
        assert child.closed and parent.closed

    def test_len(self) -> None:
        assert len(IterableWrapper([("a", b"")] * 3).decode_image()) == 3
        with pytest.raises(TypeError, match="no valid length"):
            len(IterableWrapper([("a", b"")]).decode_image(on_error="skip"))

    def test_pickle(self) -> None:
        from torchvision.io import ImageReadMode

        dp = IterableWrapper([("a.png", encode(RGB, "PNG"))]).decode_image(mode=ImageReadMode.GRAY, on_error="skip")
        clone = pickle.loads(pickle.dumps(dp))
        assert clone.skip_log.count == 0
        assert next(iter(clone))[1].shape == (1, 4, 5)

    def test_resumes(self, image_dir: Path) -> None:
        paths = sorted(str(p) for p in image_dir.iterdir())

        def make():
            return IterableWrapper(paths).open_files_by_fsspec(mode="rb").decode_image()

        expected = list(make())
        for n in (0, 2, 4):
            head, rest = resume_after(make, n)
            got = head + rest
            assert [u for u, _ in got] == [u for u, _ in expected]
            assert all(torch.equal(a, b) for (_, a), (_, b) in zip(got, expected, strict=True))


class TestDecoder:
    def test_default_handlers_on_real_files(self, mixed_dir: Path) -> None:
        paths = sorted(str(p) for p in mixed_dir.iterdir())
        out = {Path(url).name: value for url, value in IterableWrapper(paths).open_files_by_fsspec(mode="rb").decode()}
        assert out["x.json"] == {"label": "cat", "boxes": [[1, 2, 3, 4]]}
        assert out["x.txt"] == "caf\u00e9\n"
        assert out["x.cls"] == 7
        assert isinstance(out["x.npy"], np.ndarray) and out["x.npy"].dtype == np.int32
        assert out["x.pth"]["emb"].dtype == torch.float16
        tif = out["x.tif"]
        assert isinstance(tif, torch.Tensor) and tif.dtype == torch.int16 and tif.shape == (2, 3, 4)
        assert torch.equal(tif.flatten(), torch.arange(24, dtype=torch.int16))
        assert out["x.png"].shape == (3, 4, 5)
        assert out["x.bin"] == b"\x00\x01raw"  # no handler: raw bytes

    def test_case_insensitive_and_urls(self) -> None:
        items = [("A/B.JSON", b"[1]"), ("s3://b/k.Cls?version=3", b"4"), ("dir.json/readme", b"x")]
        assert list(IterableWrapper(items).decode()) == [
            ("A/B.JSON", [1]),
            ("s3://b/k.Cls?version=3", 4),
            ("dir.json/readme", b"x"),  # only the last path component counts
        ]

    def test_webdataset_samples(self) -> None:
        sample = {
            "__key__": "shard-0/000017",
            "__url__": "s3://b/shard-0.tar",
            ".jpg": Tracking(encode(RGB, "JPEG")),
            ".cls": Tracking(b"12"),
            "json": Tracking(b'{"w": 5}'),
            ".seg.png": Tracking(encode(RGB[:, :, 0], "PNG")),
            ".unknown": Tracking(b"keep me"),
            ".txt": "already decoded",
        }
        streams = [v for v in sample.values() if isinstance(v, Tracking)]
        (out,) = list(IterableWrapper([sample], deepcopy=False).decode(image_mode="RGB"))
        assert out["__key__"] == "shard-0/000017" and out["__url__"] == "s3://b/shard-0.tar"
        assert out[".jpg"].shape == (3, 4, 5)
        assert out[".cls"] == 12 and out["json"] == {"w": 5}
        assert out[".seg.png"].shape == (3, 4, 5)  # image_mode applies to every image
        assert out[".unknown"] == b"keep me" and out[".txt"] == "already decoded"
        assert all(s.was_closed for s in streams)
        assert sample[".cls"] is streams[1]  # the input dict is not modified

    def test_longest_suffix_user_overrides(self) -> None:
        seg = encode(RGB[:, :, 0], "PNG")
        sample = {"__key__": "k", ".png": encode(RGB, "PNG"), ".seg.png": seg, ".txt": b"a b c"}
        dp = IterableWrapper([sample]).decode(handlers={"SEG.PNG": double_bytes, ".txt": word_count})
        (out,) = list(dp)
        assert out[".png"].shape == (3, 4, 5)
        assert out[".seg.png"] == seg * 2
        assert out[".txt"] == 3
        raw = IterableWrapper([sample]).decode(handlers={".seg.png": None})
        (out,) = list(raw)
        assert out[".seg.png"] == seg and out[".png"].shape == (3, 4, 5)
        dp = Decoder(IterableWrapper([]), handlers={"png": double_bytes})
        assert dp.find_handler("x.seg.png") == (".png", double_bytes)
        assert dp.find_handler("noext") == (None, None)

    def test_pt_refuses_arbitrary_pickles(self) -> None:
        buf = io.BytesIO()
        torch.save({"obj": Image.new("L", (1, 1))}, buf)
        dp = IterableWrapper([("evil.pt", buf.getvalue())]).decode()
        with pytest.raises(DecodeError, match="weights_only") as info:
            list(dp)
        assert (info.value.url, info.value.stage, info.value.action) == ("evil.pt", "decode", "decode")

    def test_errors_name_key_and_extension(self) -> None:
        samples = [{"__key__": "shard/0005", ".json": b"{broken", ".cls": b"1"}]
        with pytest.raises(DecodeError) as info:
            list(IterableWrapper(samples).decode())
        assert info.value.url == "shard/0005.json"
        assert str(info.value).startswith("cannot decode 'shard/0005.json' in decode: JSONDecodeError")
        with pytest.raises(DecodeError, match=r"'shard/0005\.png' in decode: .*empty"):
            list(IterableWrapper([{"__key__": "shard/0005", "png": b""}]).decode())

    def test_skip_drops_whole_sample_and_closes_streams(self) -> None:
        later = Tracking(b"3")
        bad = {"__key__": "s/1", ".json": Tracking(b"{oops"), ".cls": later}
        good = {"__key__": "s/2", ".json": Tracking(b"{}"), ".cls": Tracking(b"4")}
        dp = IterableWrapper([bad, good, ("t.json", b"[")], deepcopy=False).decode(on_error="skip")
        assert list(dp) == [{"__key__": "s/2", ".json": {}, ".cls": 4}]
        assert dp.skip_log.count == 2
        assert [s.url for s in dp.skip_log.skipped] == ["s/1.json", "t.json"]
        assert later.was_closed

    def test_read_error(self) -> None:
        dp = IterableWrapper([("x.json", FailingStream())], deepcopy=False).decode()
        with pytest.raises(ReadError, match="connection reset"):
            list(dp)

    def test_validation(self) -> None:
        src = IterableWrapper([])
        with pytest.raises(TypeError, match="dict"):
            Decoder(src, handlers=[double_bytes])  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="callable"):
            Decoder(src, handlers={".x": "not callable"})  # type: ignore[dict-item]
        with pytest.raises(ValueError, match="extension"):
            Decoder(src, handlers={".": double_bytes})
        with pytest.raises(ValueError, match="on_error"):
            Decoder(src, on_error="warn")
        with pytest.raises(ValueError, match="unknown image mode"):
            Decoder(src, image_mode="XYZ")
        with pytest.raises(TypeError, match=r"\(url, stream_or_bytes\)"):
            list(IterableWrapper(["path-only.json"]).decode())

    def test_len_and_pickle(self) -> None:
        dp = IterableWrapper([("a.json", b"[1]"), ("b.txt", b"x")]).decode(handlers={".txt": word_count})
        assert len(dp) == 2
        clone = pickle.loads(pickle.dumps(dp))
        assert list(clone) == [("a.json", [1]), ("b.txt", 1)]
        with pytest.raises(TypeError, match="no valid length"):
            len(IterableWrapper([]).decode(on_error="skip"))

    def test_tar_to_webdataset_to_decode(self, tmp_path: Path) -> None:
        archive = tmp_path / "shard-000.tar"
        with tarfile.open(archive, "w") as tar:
            for i in range(3):
                members = {f"{i:04d}.png": encode(RGB, "PNG"), f"{i:04d}.json": json.dumps({"i": i}).encode()}
                for name, data in members.items():
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))

        def make():
            files = IterableWrapper([str(archive)]).open_files_by_fsspec(mode="rb")
            return files.load_from_tar().webdataset().decode()

        samples = list(make())
        assert [s[".json"]["i"] for s in samples] == [0, 1, 2]
        assert all(s[".png"].shape == (3, 4, 5) for s in samples)
        assert samples[1]["__key__"].endswith("0001")

        def keys_only():
            return make().map(key_and_index)

        for n in (0, 1, 2):
            assert_resumes(keys_only, n)
