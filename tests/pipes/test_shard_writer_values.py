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
