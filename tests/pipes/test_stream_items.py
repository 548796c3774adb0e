"""Tests of the helpers shared by the stream pipes (pipekit.pipes._stream_items): ChunkedReader."""

from __future__ import annotations

import io
import random

import pytest

from pipekit.pipes._stream_items import ChunkedReader


class CountingFile(io.BytesIO):
    """A BytesIO counting the reads and seeks made on it."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.reads: list[tuple[int, int]] = []  # (offset, size asked)
        self.seeks = 0

    def read(self, size: int | None = -1) -> bytes:
        self.reads.append((self.tell(), -1 if size is None else size))
        return super().read(size)

    def seek(self, offset: int, whence: int = 0) -> int:
        self.seeks += 1
        return super().seek(offset, whence)


DATA = bytes(random.Random(0).randbytes(10_000))


class TestChunkedReader:
    def test_random_reads_and_seeks_give_the_file_s_bytes(self):
        rng = random.Random(1)
        for chunk in (1, 7, 512, 4096, 20_000):
            ref = io.BytesIO(DATA)
            f = ChunkedReader(CountingFile(DATA), chunk_size=chunk)
            for _ in range(300):
                op = rng.random()
                if op < 0.5:
                    n = rng.choice([0, 1, 511, 512, 3000, -1])
                    assert f.read(n) == ref.read(n)
                elif op < 0.8:
                    pos = rng.randrange(0, len(DATA) + 50)
                    assert f.seek(pos) == ref.seek(pos)
                elif op < 0.9:
                    back = -rng.randrange(0, min(100, ref.tell()) + 1)
                    assert f.seek(back, io.SEEK_CUR) == ref.seek(back, io.SEEK_CUR)
                else:
                    assert f.seek(-10, io.SEEK_END) == ref.seek(-10, io.SEEK_END)
                assert f.tell() == ref.tell()

    def test_sequential_reading_reads_the_file_once_in_chunks(self):
        raw = CountingFile(DATA)
        f = ChunkedReader(raw, chunk_size=4096)
        out = b""
        while True:
            header = f.read(512)
            if not header:
                break
            out += header
        assert out == DATA
        assert [offset for offset, _ in raw.reads] == [0, 4096, 8192, 10_000]
        assert {size for _, size in raw.reads} == {4096}

    def test_look_back_within_the_kept_chunks_does_not_touch_the_file(self):
        raw = CountingFile(DATA)
        f = ChunkedReader(raw, chunk_size=4096)
        f.seek(5000)
        assert f.read(100) == DATA[5000:5100]  # reads 5000-9096
        f.seek(3000)
        assert f.read(100) == DATA[3000:3100]  # before the chunk: reads 3000-7096
        reads = len(raw.reads)
        f.seek(6000)
        assert f.read(2000) == DATA[6000:8000]  # across the two kept chunks
        f.seek(3050)
        assert f.read(10) == DATA[3050:3060]
        assert len(raw.reads) == reads

    def test_far_seek_reads_from_there_and_end_of_file(self):
        raw = CountingFile(DATA)
        f = ChunkedReader(raw, chunk_size=1000)
        assert f.read(10) == DATA[:10]
        f.seek(9_500)
        assert f.read() == DATA[9_500:]
        assert raw.reads[-2][0] == 9_500
        assert f.read(5) == b""
        f.seek(20_000)
        assert f.read(5) == b""
        buf = bytearray(8)
        f.seek(2)
        assert f.readinto(buf) == 8 and bytes(buf) == DATA[2:10]

    def test_errors_of_the_file_propagate(self):
        class Broken(io.BytesIO):
            def read(self, size=-1):
                raise ConnectionResetError(104, "reset by peer")

        f = ChunkedReader(Broken(DATA), chunk_size=100)
        with pytest.raises(ConnectionResetError):
            f.read(1)

    def test_arguments(self):
        with pytest.raises(ValueError, match="keep >= 2"):
            ChunkedReader(io.BytesIO(), keep=1)
        with pytest.raises(ValueError, match="whence"):
            ChunkedReader(io.BytesIO()).seek(0, 7)
        with pytest.raises(ValueError, match="negative"):
            ChunkedReader(io.BytesIO()).seek(-1)
