"""pipekit touches torch's DataPipe machinery in one module, ``pipekit.pipes._torch``.

Read from the package's source (imports and attribute names), so a new module
reaching into torch's DataPipe internals fails here, naming the line.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

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
    """_seeds.draw_seed (also pipes.state.draw_seed) is the only place that draws a seed from torch's generator."""
    offences = []
    for path in sorted(SRC.rglob("*.py")):
        if path == SRC / "_seeds.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "random_":
                offences.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert offences == [], "use pipekit._seeds.draw_seed:\n" + "\n".join(offences)


def test_one_restore_idiom():
    """The pending-restore idiom (``state, self._restore = self._restore, None``) lives in ResumablePipe only."""
    offences = []
    for path in sorted(SRC.rglob("*.py")):
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if "self._restore = self._restore" in line:
                offences.append(f"{path.relative_to(SRC)}:{lineno}")
    assert offences == []


class TestLoaderIteration:
    """Items pulled through pipekit.DataLoader skip torch's per-item iterator hook; nothing else changes."""

    @staticmethod
    def count_checks(monkeypatch):
        """Count the calls of torch's per-item check (``_check_iterator_valid``, called by its hook)."""
        from torch.utils.data.datapipes import _hook_iterator

        calls = []
        real = _hook_iterator._check_iterator_valid

        def counting(*args, **kwargs):
            calls.append(args[0])
            return real(*args, **kwargs)

        monkeypatch.setattr(_hook_iterator, "_check_iterator_valid", counting)
        return calls

    @staticmethod
    def pipe():
        from pipekit.pipes import IterableWrapper

        return IterableWrapper(range(40)).shuffle(buffer_size=8).sharding_filter().map(abs).batch(4).collate()

    def test_the_loader_skips_the_per_item_check(self, monkeypatch):
        calls = self.count_checks(monkeypatch)
        pipe = self.pipe()
        loader = pipekit.DataLoader(pipe)
        items = sorted(int(x) for batch in loader for x in batch)
        assert items == list(range(40))
        # torch still checks the loader's own wrapper once a batch, none of the pipeline's pipes.
        assert [type(dp).__name__ for dp in calls if dp is not loader.dataset] == []
        # Iterated directly, the same pipes go through torch's hook as before.
        assert sorted(int(x) for batch in pipe for x in batch) == list(range(40))
        assert len(calls) >= 40

    def test_a_second_iterator_still_invalidates_the_first_outside_the_loader(self):
        pipe = self.pipe()
        list(pipekit.DataLoader(pipe))  # the loader has switched these pipes' classes
        first = iter(pipe)
        next(first)
        second = iter(pipe)
        next(second)
        with pytest.raises(RuntimeError, match="invalidated because another iterator has been created"):
            next(first)

    def test_errors_name_the_pipe_as_torch_does(self):
        from pipekit.pipes import IterableWrapper

        def fail(x):
            if x == 3:
                raise ValueError(f"bad item {x}")
            return x

        def message(iterate):
            pipe = IterableWrapper(range(6)).map(fail).batch(2)
            with pytest.raises(ValueError) as info:
                iterate(pipe)
            return str(info.value)

        direct = message(list)
        through_loader = message(lambda pipe: list(pipekit.DataLoader(pipe)))
        assert "bad item 3" in through_loader
        assert "This exception is thrown by __iter__ of MapperIterDataPipe(" in through_loader
        assert through_loader == direct

    def test_the_profiler_still_records_each_pipe(self):
        import torch

        pipe = self.pipe()
        with torch.autograd.profiler.profile() as prof:
            list(pipekit.DataLoader(pipe))
        names = {event.name for event in prof.function_events}
        assert any(name.startswith("Mapper") for name in names), sorted(names)[:20]

    def test_workers_get_the_same_items(self):
        loader = pipekit.DataLoader(self.pipe(), num_workers=2)
        assert sorted(int(x) for batch in loader for x in batch) == list(range(40))

    def test_a_class_dill_pickles_by_value_after_a_loader_ran_it(self):
        """dill pickles a class it cannot import (defined in __main__ or a function) by value, with the globals
        its methods use: the loader's __iter__ must not make such a pipeline unpicklable."""
        import dill

        from pipekit.pipes import IterableWrapper
        from pipekit.pipes.base import IterDataPipe

        class Twice(IterDataPipe):
            def __init__(self, dp):
                self.dp = dp

            def __iter__(self):
                for x in self.dp:
                    yield 2 * x

        pipe = Twice(IterableWrapper(range(6))).map(lambda x: x + 1)
        assert list(pipekit.DataLoader(pipe)) == [1, 3, 5, 7, 9, 11]
        copy = dill.loads(dill.dumps(pipe))  # raised "cannot pickle '_Scope' object"
        assert type(copy.datapipe).__name__ == "Twice" and copy.datapipe is not pipe.datapipe
        # (iterating such a by-value copy fails in torch's own hook, with or without pipekit's loader:
        # dill's rebuilt class lacks IterDataPipe's class attributes; not pipekit's to mend)
