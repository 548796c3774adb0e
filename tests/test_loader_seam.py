"""pipekit touches the internals of torch's and torchdata's DataLoader in one module, ``pipekit._loader_seam``.

Read from the package's source (imports, attribute names, names given as
strings), so a module reaching into a private module or a private attribute
of torch's or torchdata's DataLoader machinery fails here, naming the line.
Inside the seam, the private names used must be exactly :data:`ALLOWED`: a
new one is added to the list on purpose, and one no longer used leaves it.
(torch's DataPipe core has its own seam and test: ``tests/pipes/test_seam.py``.)
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import pathlib

import pytest

import pipekit

SRC = pathlib.Path(pipekit.__file__).parent
SEAM = SRC / "_loader_seam.py"

# The packages of torch's and torchdata's DataLoader machinery.
ROOTS = ("torch.utils.data", "torchdata", "torch.multiprocessing")
# Their modules that are public API (every other module under ROOTS is internal).
PUBLIC_MODULES = {
    "torch.utils.data",
    "torch.utils.data.distributed",
    "torchdata",
    "torchdata.stateful_dataloader",
    "torchdata.nodes",
    "torch.multiprocessing",
}
# torch's DataPipe core: pipes/_torch.py's business, checked by tests/pipes/test_seam.py.
DATAPIPE_MODULES = ("torch.utils.data.datapipes", "torch.utils.data.graph", "torch.utils.data.graph_settings")
# torch's private C bindings (the shared-memory storage calls).
PRIVATE_PREFIXES = ("torch._C",)

# Private names of torch's and torchdata's loaders, iterators, workers, collate and storage transport:
# classes, methods and fields, internal functions, and the keys of the states torchdata's workers send.
# Used anywhere but the seam (as an attribute, a method defined, an imported name or a string) they fail.
KNOWN_PRIVATE = {
    # torch.utils.data.dataloader and torchdata's stateful_dataloader
    "_iterator_finished",
    "_InfiniteConstantSampler",
    "_DatasetKind",
    "_BaseDataLoaderIter",
    "_SingleProcessDataLoaderIter",
    "_MultiProcessingDataLoaderIter",
    "_StatefulBaseDataLoaderIter",
    "_StatefulSingleProcessDataLoaderIter",
    "_StatefulMultiProcessingDataLoaderIter",
    "_get_iterator",
    "_iterator",
    "_initial_iter_for_state_dict",
    "_auto_collation",
    "_dataset_kind",
    "_index_sampler",
    "_IterableDataset_len_called",
    "_num_yielded",
    # the multi-process iterator
    "_get_data",
    "_next_data",
    "_try_get_data",
    "_process_data",
    "_try_put_index",
    "_shutdown_workers",
    "_mark_worker_as_unavailable",
    "_persistent_workers",
    "_workers",
    "_workers_status",
    "_workers_done_event",
    "_index_queues",
    "_data_queue",
    "_worker_result_queue",
    "_worker_pids_set",
    "_pin_memory_thread",
    "_sampler_iter",
    "_send_idx",
    "_rcvd_idx",
    "_task_info",
    "_tasks_outstanding",
    "_worker_snapshots",
    "_dataset_fetcher",
    "_worker_loop",
    # torchdata's worker state (functions and the layout of what a worker sends)
    "try_to_serialize",
    "try_to_deserialize",
    "fetcher_state",
    "dataset_iter_state",
    "dataset_state",
    # torch.utils.data._utils.collate
    "default_collate_fn_map",
    "collate_tensor_fn",
    "collate_int_fn",
    "collate_float_fn",
    "collate_str_fn",
    "collate_numpy_array_fn",
    "collate_numpy_scalar_fn",
    # torch's shared-memory storages and their transport (torch.multiprocessing.reductions)
    "_new_shared",
    "_cdata",
    "_storage_Use_Count",
    "reduce_storage",
    "rebuild_storage_fd",
    "rebuild_storage_filename",
}

# What the seam uses: private modules (dotted) and private names.  Keep it exact (see the tests below).
ALLOWED = {
    # modules
    "torch._C",
    "torch.multiprocessing.reductions",
    "torch.utils.data._utils",
    "torch.utils.data.dataloader",
    "torchdata.stateful_dataloader.stateful_dataloader",
    "torchdata.stateful_dataloader.worker",
    # the sampler torch gives iterable datasets
    "_InfiniteConstantSampler",
    # the key of torchdata's state saying the epoch had ended
    "_iterator_finished",
    # the loader's hooks and fields
    "_get_iterator",
    "_iterator",
    "_initial_iter_for_state_dict",
    # the multi-process iterator's class, hooks and fields
    "_StatefulMultiProcessingDataLoaderIter",
    "_get_data",
    "_shutdown_workers",
    "_mark_worker_as_unavailable",
    "_persistent_workers",
    "_workers",
    "_workers_status",
    "_workers_done_event",  # an abandoned iterator's workers are told to stop at once
    "_index_queues",
    "_worker_snapshots",
    # the worker's result queue: found in torch's worker loop; multiprocessing's feeder hook and sending
    "_worker_loop",
    "_on_queue_feeder_error",
    "_sem",
    "_wlock",
    "_send_bytes",
    # torchdata's worker states
    "try_to_serialize",
    "fetcher_state",
    "dataset_iter_state",
    "dataset_state",
    # torch's default_collate
    "default_collate_fn_map",
    "collate_tensor_fn",
    "collate_int_fn",
    "collate_float_fn",
    # shared-memory storages
    "_new_shared",
    "_cdata",
    "_storage_Use_Count",
    "reduce_storage",
}

PRIVATE_NAMES = KNOWN_PRIVATE | {name for name in ALLOWED if "." not in name}
# pipekit's own attributes set on torch's objects are named so.
PIPEKIT_OWN = "_pipekit"


def _is_private_name(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


@functools.cache
def _is_module(dotted: str) -> bool:
    """Whether ``dotted`` names a module of an installed package, found on disk (importing nothing: importing
    arbitrary names of torch while the test suite runs was slow and had side effects)."""
    parts = dotted.split(".")
    spec = importlib.util.find_spec(parts[0])
    if spec is None or not spec.submodule_search_locations:
        return len(parts) == 1 and spec is not None
    for location in spec.submodule_search_locations:
        base = pathlib.Path(location).joinpath(*parts[1:])
        if (base / "__init__.py").is_file() or base.with_suffix(".py").is_file() or (
            len(parts) == 1 and base.is_dir()
        ):
            return True
        if any(base.parent.glob(base.name + ".*.so")):  # a compiled module
            return True
    return False


def _under(dotted: str, modules: tuple[str, ...]) -> bool:
    return any(dotted == m or dotted.startswith(m + ".") for m in modules)


def _private_module(dotted: str) -> str | None:
    """The private part of torch's or torchdata's loader that ``dotted`` names or reaches into, else ``None``.

    An internal module (``torch.utils.data.dataloader``), or a ``_``-name of a
    public one (``torch.utils.data._utils``), as far as ``dotted`` goes into it.
    """
    for prefix in PRIVATE_PREFIXES:
        if _under(dotted, (prefix,)):
            return prefix
    if not _under(dotted, ROOTS) or _under(dotted, DATAPIPE_MODULES):
        return None
    parts = dotted.split(".")
    for end in range(1, len(parts) + 1):
        prefix = ".".join(parts[:end])
        if not _under(prefix, ROOTS):  # "torch", "torch.utils"
            continue
        if _is_private_name(parts[end - 1]) or (_is_module(prefix) and prefix not in PUBLIC_MODULES):
            return prefix
        if not _is_module(prefix):  # a public name of a public module
            return None
    return None


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _uses(tree: ast.AST) -> list[tuple[int, str]]:
    """Every use, by line, of a private module of torch's or torchdata's loader or of one of PRIVATE_NAMES."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.ImportFrom) and node.module:
            if (module := _private_module(node.module)) is not None:
                found.append((line, module))
            for alias in node.names:
                if (module := _private_module(f"{node.module}.{alias.name}")) is not None and _is_module(module):
                    found.append((line, module))
                from_loader = _under(node.module, ROOTS) and not _under(node.module, DATAPIPE_MODULES)
                if alias.name in PRIVATE_NAMES or (from_loader and _is_private_name(alias.name)):
                    found.append((line, alias.name))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if (module := _private_module(alias.name)) is not None:
                    found.append((line, module))
        elif isinstance(node, ast.Attribute):
            if node.attr in PRIVATE_NAMES:
                found.append((line, node.attr))
            dotted = _dotted(node)
            if dotted is not None and (module := _private_module(dotted)) is not None:
                found.append((line, module))
        elif isinstance(node, ast.ClassDef):
            for item in node.body:  # overriding one of torch's private methods
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name in PRIVATE_NAMES:
                    found.append((item.lineno, item.name))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in PRIVATE_NAMES:
                found.append((line, node.value))  # getattr(it, "_workers"), a state's key
            elif (module := _private_module(node.value)) is not None and _is_module(node.value):
                found.append((line, module))  # importlib.import_module("torchdata...worker")
    return found


def _offences(path: pathlib.Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    where = path.relative_to(SRC) if path.is_relative_to(SRC) else path
    return [f"{where}:{line}: {name}" for line, name in sorted(set(_uses(tree)))]


def _seam_private_names(text: str | None = None) -> set[str]:
    """The private names the seam (or ``text``) uses: those :func:`_uses` finds, and every other ``_``-name it
    reads from torch's or torchdata's objects (an attribute, a name given to getattr) that it does not define."""
    tree = ast.parse(SEAM.read_text() if text is None else text)
    used = {name for _, name in _uses(tree)}
    own = {PIPEKIT_OWN}
    for node in tree.body:  # the seam's own module-level names
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            own.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom):
            own.update(alias.asname for alias in node.names if alias.asname)
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Attribute) and _is_private_name(node.attr):
            dotted = _dotted(node)
            if dotted is None or _private_module(dotted) != dotted:  # torch._C is a module, found above
                name = node.attr
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _is_private_name(node.args[1].value)
        ):
            name = node.args[1].value
        elif isinstance(node, ast.ImportFrom) and node.module:
            used.update(a.name for a in node.names if _is_private_name(a.name) and a.name not in own)
        if name is not None and name not in own and not name.startswith(PIPEKIT_OWN):
            used.add(name)
    return used


def test_only_the_seam_touches_loader_internals():
    offences = []
    for path in sorted(SRC.rglob("*.py")):
        if path != SEAM:
            offences.extend(_offences(path))
    assert offences == [], "use pipekit._loader_seam instead:\n" + "\n".join(offences)


def test_every_private_name_the_seam_uses_is_allowed():
    unlisted = sorted(_seam_private_names() - ALLOWED)
    assert unlisted == [], f"pipekit._loader_seam uses private names not in ALLOWED: {unlisted}"


def test_every_allowed_name_is_still_used():
    unused = sorted(ALLOWED - _seam_private_names())
    assert unused == [], f"ALLOWED lists names pipekit._loader_seam no longer uses: {unused}"


CASES = [
    "from torch.utils.data.dataloader import _InfiniteConstantSampler\n",
    "from torch.utils.data.dataloader import DataLoader\n",  # a public class, from an internal module
    "from torch.utils.data._utils import collate\n",
    "from torch.utils.data import _utils\n",
    "import torch.utils.data._utils.collate\n",
    "from torchdata.stateful_dataloader.stateful_dataloader import _StatefulMultiProcessingDataLoaderIter\n",
    "from torchdata.stateful_dataloader import worker\n",
    "from torch.multiprocessing import reductions\n",
    "import torch\nfn = torch.utils.data._utils.collate.default_convert\n",
    "import torch\nn = torch._C._storage_Use_Count(0)\n",
    "def f(it):\n    return it._workers_status\n",
    "def f(it):\n    return getattr(it, '_worker_snapshots', None)\n",
    "def f(state):\n    return state.get('dataset_iter_state')\n",
    "def f(m):\n    m.try_to_serialize = None\n",
    "class It:\n    def _get_data(self):\n        return 1\n",
    "import importlib\nm = importlib.import_module('torchdata.stateful_dataloader.worker')\n",
]


@pytest.mark.parametrize("text", CASES)
def test_the_check_catches_an_offence(text):
    """The reader above finds each kind of reach into the loader's internals (so the first test can fail)."""
    bad = SRC / "_loader_seam_probe_not_a_module.py"
    try:
        bad.write_text(text)
        assert _offences(bad), text
    finally:
        bad.unlink(missing_ok=True)


@pytest.mark.parametrize(
    "text",
    [
        "import torch\ninfo = torch.utils.data.get_worker_info()\n",
        "from torch.utils.data import default_collate, get_worker_info\n",
        "from torchdata.stateful_dataloader import StatefulDataLoader\n",
        "from torch.utils.data.datapipes.iter import Mapper\n",  # the DataPipe seam's (tests/pipes/test_seam.py)
        "class P:\n    def __init__(self):\n        self._it = None\n",
    ],
)
def test_the_check_lets_public_names_through(text):
    assert _uses(ast.parse(text)) == [], text


def test_a_new_private_name_in_the_seam_is_found():
    """The seam's reader finds a private attribute it was not told about (so the allow-list test can fail)."""
    text = (
        "from torch.utils.data.dataloader import _DatasetKind\n"
        "_OWN = 1\n"
        "def _own(it):\n"
        "    it._pipekit_mark = _OWN\n"
        "    return it._some_new_field, getattr(it, '_another'), it._iterator\n"
    )
    assert _seam_private_names(text) == {
        "torch.utils.data.dataloader",
        "_DatasetKind",
        "_some_new_field",
        "_another",
        "_iterator",
    }


def test_the_iterator_hooks_reach_torch():
    """A subclass's override of an honestly named hook is what torch calls, with nothing in between."""
    from pipekit._loader._workers import _WorkersIter
    from pipekit._loader_seam import WorkersIterBase

    assert _WorkersIter._get_data is _WorkersIter.get_data
    assert _WorkersIter._shutdown_workers is _WorkersIter.shutdown_workers
    assert _WorkersIter._mark_worker_as_unavailable is _WorkersIter.mark_worker_unavailable
    # the base's honest names are torch's own functions
    assert WorkersIterBase.get_data is WorkersIterBase._get_data


def test_the_docstring_names_every_global_change():
    """Each function of the seam that changes torch, torchdata or the process for everyone is in its list."""
    from pipekit import _loader_seam

    doc = _loader_seam.__doc__
    for name in ("patch_try_to_serialize", "replace_default_collate_fns", "register_storage_reducer"):
        assert f":func:`{name}`" in doc, name
    assert ":func:`ignore_set_vital_warning`" in doc
    assert "torch.set_num_threads" in doc and "pipekit.pipes._torch" in doc
