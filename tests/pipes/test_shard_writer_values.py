"""Values that cannot be written faithfully are refused by name, never written as something else."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from pipekit.encoders import EncodeError, encode_image
from pipekit.pipes import TarWriter


@pytest.mark.parametrize("image", [
    torch.tensor([[0.5, float("nan")], [0.0, 1.0]]),
    np.array([[[0.2, 0.3, np.nan]]], dtype=np.float32),
])
def test_a_nan_pixel_is_refused_not_written_as_zero(image) -> None:
    with pytest.raises(ValueError, match="NaN"):
        encode_image(image, "png")
    sink = TarWriter(io.BytesIO())
    with pytest.raises(EncodeError, match=r"'k1\.png'.*NaN"):
        sink.write({"__key__": "k1", "png": image})


@pytest.mark.parametrize(("extension", "image", "lost"), [
    ("webp", np.full((2, 2), 60000, np.uint16), "16-bit"),  # Pillow saturates it to 255
    ("bmp", np.arange(16, dtype=np.uint8).reshape(2, 2, 4), "alpha"),  # read back as RGB
    ("ppm", np.arange(16, dtype=np.uint8).reshape(2, 2, 4), "alpha"),
    ("ppm", torch.arange(16, dtype=torch.uint8).reshape(4, 2, 2), "alpha"),
])
def test_a_format_that_would_drop_part_of_the_image_is_refused(extension: str, image, lost: str) -> None:
    with pytest.raises(ValueError, match=rf"{lost}.*png"):
        encode_image(image, extension)
    sink = TarWriter(io.BytesIO())
    with pytest.raises(EncodeError, match=rf"'k1\.{extension}'"):
        sink.write({"__key__": "k1", extension: image})


@pytest.mark.parametrize(("extension", "image"), [
    ("webp", np.arange(16, dtype=np.uint8).reshape(2, 2, 4)),
    ("bmp", np.arange(12, dtype=np.uint8).reshape(2, 2, 3)),
    ("ppm", np.full((2, 2), 60000, np.uint16)),
    ("png", np.full((2, 2), 60000, np.uint16)),
])
def test_formats_that_keep_the_image_still_write_it(extension: str, image) -> None:
    from PIL import Image

    with Image.open(io.BytesIO(encode_image(image, extension))) as back:
        assert np.array_equal(np.asarray(back), image)
