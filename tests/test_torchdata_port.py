"""torchdata 0.9 tutorial code runs on pipekit with only its import lines changed.

``TORCHDATA_CODE`` is written as torchdata 0.9's tutorials write it: ``dp.iter.FileLister``,
``FileOpener``, ``parse_csv``, ``load_from_tar``, ``shuffle`` then ``sharding_filter``, ``map``,
``batch``, a ``dp.map.SequenceWrapper`` lookup, and ``DataLoader2`` with
``MultiProcessingReadingService(num_workers=2)``, ``seed``, ``state_dict``, ``shutdown``.  The test
rewrites its import lines (docs/migration/torchdata.md's mapping, nothing else), imports the result as a module and
runs it on real CSV and tar files.
"""

from __future__ import annotations

import csv
import difflib
import importlib
import io
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

TORCHDATA_CODE = """
import os

import numpy as np
import torchdata.datapipes as dp
from torchdata.dataloader2 import DataLoader2, MultiProcessingReadingService
from torchdata.dataloader2.adapter import Shuffle
from torchdata.datapipes.iter import FileLister, FileOpener

LABEL_NAMES = ["cat", "dog", "bird"]


def filter_for_data(filename):
    return "sample_data" in filename and filename.endswith(".csv")


def row_processor(row):
    return {"label": np.array(row[0], np.int32), "data": np.array(row[1:], dtype=np.float64)}


def label_of(sample):
    return int(sample["label"])


def add_label_name(sample, name):
    return {**sample, "name": name}


def build_datapipes(root_dir="."):
    datapipe = dp.iter.FileLister(root_dir)
    datapipe = datapipe.filter(filter_fn=filter_for_data)
    datapipe = datapipe.open_files(mode="rt")
    datapipe = datapipe.parse_csv(delimiter=",", skip_lines=1)
    # Shuffle will happen as long as you do NOT set `shuffle=False` later in the DataLoader
    datapipe = datapipe.shuffle()
    datapipe = datapipe.sharding_filter()
    datapipe = datapipe.map(row_processor)
    datapipe = datapipe.zip_with_map(dp.map.SequenceWrapper(LABEL_NAMES), key_fn=label_of, merge_fn=add_label_name)
    datapipe = datapipe.batch(5)
    return datapipe


def decode_member(item):
    path, stream = item
    return os.path.basename(path), stream.read().decode()


def build_tar_datapipes(root_dir="."):
    datapipe = FileLister(root_dir, masks="*.tar")
    datapipe = FileOpener(datapipe, mode="b")
    datapipe = datapipe.load_from_tar()
    datapipe = datapipe.map(decode_member)
    datapipe = datapipe.shuffle(buffer_size=16)
    datapipe = datapipe.sharding_filter()
    datapipe = datapipe.batch(4)
    return datapipe


def train(root_dir, epochs=3):
    datapipe = build_datapipes(root_dir)
    rs = MultiProcessingReadingService(num_workers=2)
    dl = DataLoader2(datapipe, reading_service=rs)
    seen = []
    for epoch in range(epochs):
        dl.seed(epoch)
        seen.append([batch for batch in dl])
    dl.shutdown()
    return seen


def evaluate(root_dir):
    with DataLoader2(
        build_datapipes(root_dir),
        datapipe_adapter_fn=Shuffle(False),
        reading_service=MultiProcessingReadingService(num_workers=2),
    ) as dl:
        return list(dl)


def read_shards(root_dir, seed):
    dl = DataLoader2(build_tar_datapipes(root_dir), reading_service=MultiProcessingReadingService(num_workers=2))
    dl.seed(seed)
    batches = list(dl)
    dl.shutdown()
    return batches


def train_with_checkpoint(root_dir, stop_after):
    dl = DataLoader2(build_datapipes(root_dir), reading_service=MultiProcessingReadingService(num_workers=2))
    dl.seed(7)
    it = iter(dl)
    head = [next(it) for _ in range(stop_after)]
    state = dl.state_dict()
    rest = list(it)
    dl.shutdown()
    return head, state, rest


def resume(state):
    dl = DataLoader2.from_state(state, MultiProcessingReadingService(num_workers=2))
    rest = list(dl)
    dl.shutdown()
    return rest
"""

# docs/migration/torchdata.md's import mapping: the only lines the port changes.
IMPORT_MAP = {
    "import torchdata.datapipes as dp": "import pipekit.pipes as dp",
    "from torchdata.datapipes.iter import ": "from pipekit.pipes.iter import ",
    "from torchdata.datapipes.map import ": "from pipekit.pipes.map import ",
    "from torchdata.dataloader2.adapter import ": "from pipekit.adapters import ",
    "from torchdata.dataloader2 import ": "from pipekit import ",
}


def port(code: str) -> str:
    lines = []
    for line in code.splitlines():
        for old, new in IMPORT_MAP.items():
            if line.startswith(old):
                line = new + line[len(old) :]
                break
        lines.append(line)
    return "\n".join(lines) + "\n"


ROWS_PER_FILE = 12
FILES = 3


def write_csvs(root: Path) -> list[list[float]]:
    """sample_data0..2.csv (label, two features; row r of file f has id f * 100 + r), and files to filter out."""
    rows = []
    for f in range(FILES):
        with open(root / f"sample_data{f}.csv", "w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(["label", "x", "y"])
            for r in range(ROWS_PER_FILE):
                row = [(f + r) % 3, f * 100 + r, (f * 100 + r) / 4]
                writer.writerow(row)
                rows.append(row)
    (root / "other.csv").write_text("label,x,y\n9,9,9\n")
    (root / "sample_data_notes.txt").write_text("not a csv\n")
    return rows


def write_tars(root: Path) -> list[str]:
    names = []
    for shard in range(2):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for k in range(5):
                name = f"s{shard}-{k}.txt"
                data = f"shard {shard} member {k}".encode()
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                names.append(name)
        (root / f"shard-{shard}.tar").write_bytes(buf.getvalue())
    return names


@pytest.fixture(scope="module")
def tutorial(tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    """The ported tutorial, imported from a real module file (its functions pickle by reference)."""
    where = tmp_path_factory.mktemp("port")
    (where / "torchdata_tutorial_port.py").write_text(port(TORCHDATA_CODE))
    sys.path.insert(0, str(where))
    try:
        yield importlib.import_module("torchdata_tutorial_port")
    finally:
        sys.path.remove(str(where))
        sys.modules.pop("torchdata_tutorial_port", None)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[float]], list[str]]:
    root = tmp_path_factory.mktemp("tutorial-data")
    return root, write_csvs(root), write_tars(root)


def samples(batches: list[list[dict]]) -> list[tuple[int, float, float, str]]:
    return [(int(s["label"]), *s["data"].tolist(), s["name"]) for b in batches for s in b]


def expected(rows: list[list[float]]) -> list[tuple[int, float, float, str]]:
    names = ["cat", "dog", "bird"]
    return [(int(label), float(x), float(y), names[int(label)]) for label, x, y in rows]


def test_only_import_lines_change() -> None:
    ported = port(TORCHDATA_CODE)
    changed = [
        line[1:]
        for line in difflib.unified_diff(TORCHDATA_CODE.splitlines(), ported.splitlines(), lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    assert changed, "the port changed nothing: this test would prove nothing"
    assert all(line.startswith(("import ", "from ")) for line in changed), changed
    assert "torchdata" not in ported


def test_training_epochs_see_every_row_once(tutorial: ModuleType, data) -> None:
    root, rows, _ = data
    epochs = tutorial.train(str(root))
    for batches in epochs:
        assert [len(b) for b in batches] == [5, 5, 5, 5, 5, 5, 3, 3]  # each worker batches its 18 rows
        sample = batches[0][0]
        assert sample["label"].dtype == np.int32 and sample["data"].dtype == np.float64  # as made, not converted
        assert sorted(samples(batches)) == sorted(expected(rows))
    orders = [samples(batches) for batches in epochs]
    assert len({tuple(o) for o in orders}) == 3, "each epoch is shuffled differently"
    assert [samples(b) for b in tutorial.train(str(root))] == orders, "dl.seed(epoch) makes the run repeat"


def test_evaluation_without_shuffle_follows_torchdatas_layout(tutorial: ModuleType, data) -> None:
    """Worker w gets rows w, w + 2, ... and batches them; the main process takes one batch from each in turn."""
    root, rows, _ = data
    per_worker = [expected(rows)[w::2] for w in range(2)]
    batches = [[shard[i : i + 5] for i in range(0, len(shard), 5)] for shard in per_worker]
    interleaved = [sample for pair in zip(*batches) for batch in pair for sample in batch]
    assert samples(tutorial.evaluate(str(root))) == interleaved


def test_tar_shards(tutorial: ModuleType, data) -> None:
    root, _, names = data
    batches = tutorial.read_shards(str(root), seed=1)
    got = [item for batch in batches for item in batch]
    assert sorted(name for name, _ in got) == sorted(names)
    assert all(text == f"shard {name[1]} member {name[3]}" for name, text in got)
    assert tutorial.read_shards(str(root), seed=1) == batches
    assert tutorial.read_shards(str(root), seed=2) != batches


@pytest.mark.parametrize("stop_after", [1, 4])
def test_checkpoint_resumes_mid_epoch(tutorial: ModuleType, data, stop_after: int) -> None:
    root, rows, _ = data
    head, state, rest = tutorial.train_with_checkpoint(str(root), stop_after)
    assert sorted(samples(head + rest)) == sorted(expected(rows))
    assert samples(tutorial.resume(state)) == samples(rest)
