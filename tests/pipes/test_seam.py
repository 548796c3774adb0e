"""pipekit touches torch's DataPipe machinery in one module, ``pipekit.pipes._torch``.

Read from the package's source (imports and attribute names), so a new module
reaching into torch's DataPipe internals fails here, naming the line.
"""

from __future__ import annotations

import ast
import pathlib

import pipekit

SRC = pathlib.Path(pipekit.__file__).parent
SEAM = SRC / "pipes" / "_torch.py"

# Modules of torch's DataPipe core: importing from them is the seam's job.
TORCH_DATAPIPE_MODULES = ("torch.utils.data.datapipes", "torch.utils.data.graph", "torch.utils.data.graph_settings")
# Names torch exports from torch.utils.data that belong to the DataPipe core.
TORCH_DATAPIPE_NAMES = {"IterDataPipe", "MapDataPipe", "functional_datapipe", "DataChunk", "IterableWrapper"}
# Private attributes of torch's DataPipes (and their loader wrapper) pipekit relies on.
PRIVATE_ATTRIBUTES = {
    "getstate_hook",
    "reduce_ex_hook",
    "set_getstate_hook",
    "_valid_iterator_id",
    "_snapshot_state",
    "_fast_forward_iterator",
    "_IterDataPipeSerializationWrapper",
    "_datapipe_iter",
    "register_datapipe_as_function",
    "traverse_dps",
}


def _offences(path: pathlib.Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    where = path.relative_to(SRC)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith(TORCH_DATAPIPE_MODULES):
                found.append(f"{where}:{node.lineno}: from {node.module} import ...")
            elif node.module == "torch.utils.data":
                names = {alias.name for alias in node.names} & TORCH_DATAPIPE_NAMES
                if names:
                    found.append(f"{where}:{node.lineno}: from torch.utils.data import {sorted(names)}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(TORCH_DATAPIPE_MODULES):
                    found.append(f"{where}:{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.Attribute):
            if node.attr in PRIVATE_ATTRIBUTES:
                found.append(f"{where}:{node.lineno}: .{node.attr}")
            dotted = ast.unparse(node)
            if dotted.startswith(TORCH_DATAPIPE_MODULES) or dotted in {
                f"torch.utils.data.{name}" for name in TORCH_DATAPIPE_NAMES
            }:
                found.append(f"{where}:{node.lineno}: {dotted}")
        elif isinstance(node, ast.Constant) and node.value in PRIVATE_ATTRIBUTES:
            found.append(f"{where}:{node.lineno}: {node.value!r}")  # getattr(dp, "_valid_iterator_id")
    return found


def test_only_the_seam_touches_torch_datapipe_machinery():
    offences = []
    for path in sorted(SRC.rglob("*.py")):
        if path != SEAM:
            offences.extend(_offences(path))
    assert offences == [], "use pipekit.pipes._torch (through pipekit.pipes.base) instead:\n" + "\n".join(offences)


def test_the_check_catches_an_offence(tmp_path):
    """The reader above does find each kind of reach into torch (so the test above can fail)."""
    bad = SRC / "pipes" / "_seam_probe_not_a_module.py"
    cases = [
        "from torch.utils.data.datapipes.utils.common import StreamWrapper\n",
        "import torch.utils.data.graph\n",
        "from torch.utils.data import IterDataPipe\n",
        "def f(dp):\n    return dp._valid_iterator_id\n",
        "def f(dp):\n    return getattr(dp, '_valid_iterator_id', None)\n",
        "import torch\nx = torch.utils.data.datapipes.iter.Mapper\n",
    ]
    try:
        for text in cases:
            bad.write_text(text)
            assert _offences(bad), text
    finally:
        bad.unlink(missing_ok=True)


def test_the_seam_is_imported_through_base():
    """Pipes import the bases from pipekit.pipes.base, which gets them from the seam."""
    from pipekit.pipes import _torch, base

    assert base.IterDataPipe is _torch.IterDataPipe
    assert base.MapDataPipe is _torch.MapDataPipe
    assert base.StreamWrapper is _torch.StreamWrapper


def test_one_way_to_draw_a_seed_from_torch():
    """pipes.state.draw_seed is the only place that draws a seed from torch's generator."""
    offences = []
    for path in sorted(SRC.rglob("*.py")):
        if path == SRC / "pipes" / "state.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "random_":
                offences.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert offences == [], "use pipekit.pipes.state.draw_seed:\n" + "\n".join(offences)


def test_one_restore_idiom():
    """The pending-restore idiom (``state, self._restore = self._restore, None``) lives in ResumablePipe only."""
    offences = []
    for path in sorted(SRC.rglob("*.py")):
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if "self._restore = self._restore" in line:
                offences.append(f"{path.relative_to(SRC)}:{lineno}")
    assert offences == []
