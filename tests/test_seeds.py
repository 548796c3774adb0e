"""pipekit._seeds: the seed functions random pipes and random transforms share, with no import cycle."""

from __future__ import annotations

import ast
import pathlib

import torch

import pipekit
from pipekit import _seeds
from pipekit.pipes import state
from pipekit.transforms import seeding

SRC = pathlib.Path(pipekit.__file__).parent


def test_old_import_paths_give_the_same_functions():
    assert state.draw_seed is _seeds.draw_seed
    for name in ("get_rank", "mix_seed", "pipe_stream_seed", "stream_seed", "worker_id"):
        assert getattr(seeding, name) is getattr(_seeds, name), name
    assert "draw_seed" in state.__all__
    assert set(_seeds.__all__) - {"draw_seed"} <= set(seeding.__all__)


def test_draw_seed_follows_torch_manual_seed():
    torch.manual_seed(5)
    a = [_seeds.draw_seed() for _ in range(3)]
    torch.manual_seed(5)
    assert [_seeds.draw_seed() for _ in range(3)] == a
    assert len(set(a)) == 3
    g = torch.Generator().manual_seed(1)
    assert _seeds.draw_seed(g) == _seeds.draw_seed(torch.Generator().manual_seed(1))


def test_pipe_stream_seed_mixes_worker_and_rank(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    s0 = _seeds.pipe_stream_seed(7)
    assert s0 == _seeds.pipe_stream_seed(7) != _seeds.pipe_stream_seed(8)
    monkeypatch.setenv("RANK", "1")
    assert _seeds.get_rank() == 1 and _seeds.pipe_stream_seed(7) != s0
    assert 0 <= s0 < 2**63


def test_stream_seed_differs_by_salt_and_from_pipe_seeds():
    assert _seeds.stream_seed(3, salt=1) == _seeds.stream_seed(3, salt=1) != _seeds.stream_seed(3, salt=2)
    assert _seeds.stream_seed(3) != _seeds.pipe_stream_seed(3)


def test_seeds_module_imports_no_pipekit_module():
    """Everything random in pipekit may import _seeds: it imports only the standard library, numpy and torch."""
    tree = ast.parse((SRC / "_seeds.py").read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported == {"__future__", "os", "numpy", "torch"}


def test_no_function_level_imports_between_state_and_seeding():
    """The cycle pipes.state <-> transforms.seeding is gone: neither imports the other inside a function."""
    for path in (SRC / "pipes" / "state.py", SRC / "transforms" / "seeding.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                inner = [n for n in ast.walk(node) if isinstance(n, ast.Import | ast.ImportFrom)]
                assert inner == [], f"{path.name}: {node.name} imports inside the function"
