"""The package's shape holds: small modules and classes, and no import cycle between its packages.

Read from the source (no import of the modules), so a change that breaks the shape fails here, naming the
module or the import lines that close a cycle. CONTRIBUTING.md ("The house") says why each rule exists.
"""

from __future__ import annotations

import ast
import itertools
import pathlib

import pipekit

SRC = pathlib.Path(pipekit.__file__).parent

#: A module past ~600 lines is a signal to split it by concern; past this it fails.
MAX_MODULE_LINES = 700

#: A class past ~300 lines is a signal to split it by concern; past this it fails.
MAX_CLASS_LINES = 500


def _modules() -> list[pathlib.Path]:
    return sorted(SRC.rglob("*.py"))


def _unit(module: str) -> str:
    """The unit a module belongs to for the cycle check: its subpackage (``pipes``, ``geo``, ...), or the module
    itself for a module at the top of the package (``errors``, ``loader``, ...)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "pipekit"


def _imports(path: pathlib.Path) -> list[tuple[str, int]]:
    """Every pipekit module ``path`` imports, at any depth (a function-level import is still a dependency)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("pipekit"):
            if node.module == "pipekit":
                found.extend((f"pipekit.{alias.name}", node.lineno) for alias in node.names)
            else:
                found.append((node.module, node.lineno))
        elif isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names if alias.name.startswith("pipekit."))
    return found


def _graph() -> dict[str, dict[str, list[str]]]:
    graph: dict[str, dict[str, list[str]]] = {}
    for path in _modules():
        rel = path.relative_to(SRC.parent).with_suffix("")
        module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        here = _unit(module)
        if here == "pipekit":
            continue  # the top-level __init__ and __main__ gather everything; they are the roots
        for target, line in _imports(path):
            there = _unit(target)
            if there != here and there != "pipekit":
                graph.setdefault(here, {}).setdefault(there, []).append(f"{rel}.py:{line}")
    return graph


def _cycle(graph: dict[str, dict[str, list[str]]]) -> list[str] | None:
    """One cycle of units, as a list ``[a, b, ..., a]``, or ``None``."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, {})):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_module_is_too_long():
    long = {
        str(path.relative_to(SRC)): n
        for path in _modules()
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}, f"split these modules by concern (over {MAX_MODULE_LINES} lines): {long}"


def test_no_class_is_too_long():
    long = {}
    for path in _modules():
        text = path.read_text()
        if text.count("\n") < MAX_CLASS_LINES:  # no class of it can be too long: not parsed (the suite's time)
            continue
        for node in ast.walk(ast.parse(text, filename=str(path))):
            if isinstance(node, ast.ClassDef) and (n := node.end_lineno - node.lineno + 1) > MAX_CLASS_LINES:
                long[f"{path.relative_to(SRC)}:{node.name}"] = n
    assert long == {}, f"split these classes by concern (over {MAX_CLASS_LINES} lines): {long}"


def test_no_import_cycle_between_packages():
    graph = _graph()
    cycle = _cycle(graph)
    if cycle:
        where = [f"{a} -> {b}: {', '.join(graph[a][b][:3])}" for a, b in itertools.pairwise(cycle)]
        raise AssertionError("import cycle between pipekit's packages:\n" + "\n".join(where))


def test_the_cycle_check_finds_a_cycle():
    assert _cycle({"a": {"b": ["x"]}, "b": {"c": ["y"]}, "c": {"a": ["z"]}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b": ["x"]}, "b": {"c": ["y"]}}) is None
