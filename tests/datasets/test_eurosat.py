"""EuroSAT100 and EuroSATSpatial: EuroSAT's 100-chip archive and its longitude split, downloaded from a local mirror.

EuroSAT itself is tested in test_download.py (its download, extraction, plot and errors).
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import threading
import zipfile
from collections.abc import Iterator

import numpy as np
import pytest
import rasterio
import torch
from rasterio.transform import from_origin

import pipekit
from pipekit.datasets import DatasetNotFoundError, EuroSAT, EuroSAT100, EuroSATSpatial
from pipekit.errors import HashError

from .test_download import FileServer


@pytest.fixture
def server() -> Iterator[FileServer]:
    """test_download's Range-serving HTTP server, polled often so that its shutdown is quick."""
    srv = FileServer()
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()

CLASSES = ["AnnualCrop", "Forest"]


def _zip_of_chips() -> bytes:
    """Two classes x 3 chips of 13 bands (4x4), pixel values ``label * 100 + n``, laid out as EuroSAT's archives."""
    buf = io.BytesIO()
    profile = dict(driver="GTiff", width=4, height=4, count=13, dtype="uint16", crs="EPSG:32631",
                   transform=from_origin(0, 40, 10, 10))
    with zipfile.ZipFile(buf, "w") as zf:
        for label, name in enumerate(CLASSES):
            for n in range(1, 4):
                with rasterio.MemoryFile() as mem:
                    with mem.open(**profile) as ds:
                        ds.write(np.full((13, 4, 4), label * 100 + n, np.uint16))
                    zf.writestr(f"{EuroSAT.base_dir}/{name}/{name}_{n}.tif".replace(os.sep, "/"), mem.read())
    return buf.getvalue()


# which chips each split lists: EuroSAT100's lists and the spatial ones differ, so a wrong list shows
SPLITS = {
    EuroSAT100: {"train": [1, 2], "val": [3], "test": [1]},
    EuroSATSpatial: {"train": [1], "val": [2], "test": [2, 3]},
}


def _mirror(server: FileServer, base: type[EuroSAT]) -> type[EuroSAT]:
    data = _zip_of_chips()
    server.files[f"/eurosat/{base.filename}"] = data
    md5s = {}
    for split, numbers in SPLITS[base].items():
        text = "".join(f"{c}_{n}.jpg\n" for c in CLASSES for n in numbers).encode()
        server.files[f"/eurosat/{base.split_filenames[split]}"] = text
        md5s[split] = hashlib.md5(text).hexdigest()
    return type(base.__name__, (base,), {"url": server.url + "/eurosat/", "md5": hashlib.md5(data).hexdigest(),
                                         "split_md5s": md5s, "__module__": __name__})


@pytest.mark.parametrize("base", [EuroSAT100, EuroSATSpatial])
def test_download_verify_and_splits(server, tmp_path, base):
    local = _mirror(server, base)
    with pytest.raises(DatasetNotFoundError, match="use `download=True`"):
        local(tmp_path)
    for split, numbers in SPLITS[base].items():
        ds = local(tmp_path, split=split, download=True, checksum=True)
        assert len(ds) == 2 * len(numbers)
        assert [int(ds[i]["image"][0, 0, 0]) for i in range(len(ds))] == [
            label * 100 + n for label in range(2) for n in numbers]
        sample = ds[0]
        assert sample["image"].shape == (13, 4, 4) and sample["image"].dtype == torch.float32
        assert sample["label"].dtype == torch.int64 and sample["label"].shape == ()
    assert sorted(os.listdir(tmp_path)) == sorted(["ds", base.filename, *base.split_filenames.values()])
    # nothing is fetched again once the files are there
    requests = len(server.ranges)
    assert len(local(tmp_path, split="test", download=True, checksum=True)) == 2 * len(SPLITS[base]["test"])
    assert len(server.ranges) == requests


def test_wrong_checksum_and_resumed_download(server, tmp_path):
    local = _mirror(server, EuroSAT100)
    path = f"/eurosat/{EuroSAT100.filename}"
    server.drops[path] = 100  # the first transfer of the archive stops after 100 bytes: it is resumed
    ds = local(tmp_path, download=True, checksum=True)
    assert len(ds) == 4 and any(r == "bytes=100-" for r in server.ranges)
    server.files[path] = b"tampered"
    with pytest.raises(HashError, match=r"EuroSAT100\.zip.*md5 mismatch"):
        local(tmp_path / "again", download=True, checksum=True)
    assert not os.path.exists(tmp_path / "again" / "EuroSAT100.zip")


def test_pipe_resumes_exactly_and_two_workers(server, tmp_path):
    ds = _mirror(server, EuroSATSpatial)(tmp_path, split="test", download=True)

    def loader(workers: int = 0) -> pipekit.DataLoader:
        return pipekit.DataLoader(ds.pipe(train=True, batch_size=1), num_workers=workers)

    def values(batches) -> list[int]:
        return [int(b["image"][0, 0, 0, 0]) for b in batches]

    torch.manual_seed(5)
    full = values(loader())
    torch.manual_seed(5)
    first = loader()
    it = iter(first)
    head = [next(it)]
    state = pickle.loads(pickle.dumps(first.state_dict()))
    resumed = loader()
    resumed.load_state_dict(state)
    assert values(head) + values(resumed) == full
    assert sorted(full) == [2, 3, 102, 103]
    assert sorted(values(loader(workers=2))) == [2, 3, 102, 103]
