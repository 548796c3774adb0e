"""A griffe extension that reads pipekit's docstring conventions (used by mkdocs.yml).

pipekit's docstrings are Google style with three habits griffe's Google parser does not know:

- ``Example:`` (singular) heads the doctest section; griffe knows ``Examples:``;
- one ``Args:`` entry may document several parameters that share a meaning: ``crs, res: ...``;
- Sphinx roles (``:class:`RasterDataset```, ``:func:`to_device```) name other objects.

This extension rewrites each docstring of ``pipekit`` before griffe parses it: the section
becomes ``Examples:``, a grouped entry becomes one entry per name (same description), and a role
becomes plain inline code. Pipes that torchdata builds in ``__new__`` (``unzip``, ``random_split``,
``round_robin_demux``) get their signature from ``__new__``. Nothing is silenced: a parameter that
really is missing from a signature still fails the strict build.

It also completes what static analysis cannot see of a module's exports: an ``__all__`` computed at
import time (``pipekit.pipes``), names loaded lazily by a module ``__getattr__``
(``pipekit.transforms``), and torch's own pipes that ``pipekit.pipes`` re-exports under torchdata's
names (``Mapper``, ``Filter``...: their classes are read from torch at run time, one module each,
instead of parsing all of torch).
"""

from __future__ import annotations

import importlib
import inspect
import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|func|meth|attr|mod|data|obj|exc|ref|py:\w+):`~?([^`]+)`")
_SECTION = re.compile(r"^(\s*)Example:\s*$", re.M)


_ARGS = re.compile(r"^(\s*)(Args|Arguments|Parameters|Params):\s*$")
_ENTRY = re.compile(r"^(\*{0,2}[A-Za-z_]\w*(?:\s*,\s*\*{0,2}[A-Za-z_]\w*)*)\s*(\([^)]*\))?:(\s.*)?$")


def _split_args(block: list[str], indent: str) -> list[tuple[list[str], list[str]]]:
    """Split the lines of an ``Args:`` section into entries: (names, lines with the first one's names cut)."""
    entries: list[tuple[list[str], list[str]]] = []
    for line in block:
        text = line[len(indent) :] if line.startswith(indent) else " "
        match = None if text.startswith((" ", "\t")) else _ENTRY.match(text)
        if match:
            names = [n.strip() for n in match.group(1).split(",")]
            annotation = f" {match.group(2)}" if match.group(2) else ""
            entries.append((names, [f"{annotation}:{match.group(3) or ''}"]))
        elif entries:
            entries[-1][1].append(line)
        else:
            entries.append(([], [line]))
    return entries


def rewrite(
    text: str,
    parameters: set[str] | None = None,
    var_keyword: bool = False,
    inherited: dict[str, str] | None = None,
) -> str:
    """Turn pipekit's docstring conventions into what griffe's Google parser reads.

    ``parameters`` (the signature's names) and ``var_keyword`` (it takes ``**kwargs``) let
    entries of ``Args:`` that the signature passes on through ``**kwargs`` move to a
    ``Keyword Args:`` section, which is what they are, with their annotation from the
    ``__init__`` of a base class that takes them (``inherited``: name -> annotation).
    """
    text = _ROLE.sub(r"``\1``", text)
    text = _SECTION.sub(r"\1Examples:", text)
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        header = _ARGS.match(lines[i])
        if header is None:
            out.append(lines[i])
            i += 1
            continue
        base = header.group(1)
        out.append(lines[i])
        i += 1
        block: list[str] = []
        while i < len(lines) and (not lines[i].strip() or lines[i].startswith((base + " ", base + "\t"))):
            if not lines[i].strip() and (i + 1 >= len(lines) or not lines[i + 1].startswith(base + " ")):
                break
            block.append(lines[i])
            i += 1
        if not block:
            continue
        indent = block[0][: len(block[0]) - len(block[0].lstrip())]
        kept: list[str] = []
        passed_on: list[str] = []
        for names, body in _split_args(block, indent):
            if not names:
                kept.extend(body)
                continue
            for name in names:
                bare = name.lstrip("*")
                target, first = kept, body[0]
                if parameters is not None and var_keyword and bare not in parameters:
                    target = passed_on
                    if first.startswith(":") and bare in (inherited or {}):
                        first = f" ({inherited[bare]}){first}"
                target.append(f"{indent}{name}{first}")
                target.extend(body[1:])
        out.extend(kept)
        if passed_on:
            out.append("")
            out.append(f"{base}Keyword Args:")
            out.extend(passed_on)
    return "\n".join(out)


def _foreign_class(obj: type, loader: Any = None) -> griffe.Class | None:
    """griffe's model of a class defined outside pipekit (torch's pipes), by inspecting its one module.

    Each call inspects afresh: every module exporting the class gets its own model (its own path).
    Its docstring is parsed like pipekit's, without griffe's warnings: torch's docstrings are not
    ours to fix (types left to the signature, parameters of ``__new__``), and would fail the
    strict build.
    """
    options = dict(getattr(loader, "docstring_options", None) or {})
    options["warnings"] = False
    found: Any = griffe.inspect(
        obj.__module__,
        docstring_parser=getattr(loader, "docstring_parser", None),
        docstring_options=options,  # type: ignore[arg-type]
    )
    for part in obj.__qualname__.split("."):
        found = found.members.get(part)
        if found is None:
            return None
    return found if isinstance(found, griffe.Class) else None


def complete_exports(module: griffe.Module, loader: Any = None) -> None:
    """Give ``module`` its run-time ``__all__`` and a member for every name in it."""
    runtime = importlib.import_module(module.path)
    exports = getattr(runtime, "__all__", None)
    if exports is None:
        return
    module.exports = list(exports)
    for name in exports:
        value = getattr(runtime, name)
        member = module.members.get(name)
        if inspect.ismodule(value) or (member is not None and _resolves(member)):
            continue
        origin = getattr(value, "__module__", None) or ""
        qualname = getattr(value, "__qualname__", None)
        if origin.startswith("pipekit") and qualname:
            module.set_member(name, griffe.Alias(name, f"{origin}.{qualname}", parent=module))
        elif inspect.isclass(value):
            model = _foreign_class(value, loader)
            if model is not None:
                model.name = name
                model.parent = module
                if model.docstring is not None:  # torch's docstrings, read with pipekit's conventions
                    model.docstring.value = rewrite(model.docstring.value)
                module.set_member(name, model)
        else:  # a constant loaded lazily: the submodule that defines it
            defined = [
                sub.members[name]
                for sub in _modules(module)
                if sub is not module and name in sub.members and not sub.members[name].is_alias
            ]
            if defined:
                module.set_member(name, griffe.Alias(name, defined[0].path, parent=module))


def _resolves(member: Any) -> bool:
    if not isinstance(member, griffe.Alias):
        return True
    try:
        member.final_target  # noqa: B018
    except (griffe.AliasResolutionError, griffe.CyclicAliasError):
        return False
    return True


def _modules(module: griffe.Module) -> list[griffe.Module]:
    found = [module]
    for member in module.members.values():
        if isinstance(member, griffe.Module) and not member.is_alias:
            found.extend(_modules(member))
    return found


class PipekitDocstrings(griffe.Extension):
    """Rewrite pipekit's docstrings as they are loaded (see the module's docstring)."""

    def on_package(self, *, pkg: griffe.Module, loader: Any = None, **kwargs: Any) -> None:
        if pkg.path != "pipekit":
            return
        for module in _modules(pkg):
            if not any(part.startswith("_") for part in module.path.split(".")):
                complete_exports(module, loader)

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is None or not obj.path.startswith("pipekit"):
            return
        parameters: set[str] | None = None
        var_keyword = False
        try:
            signature = obj.parameters if isinstance(obj, (griffe.Function, griffe.Class)) else None
        except Exception:  # an __init__ inherited from a base not loaded yet: no signature to check
            signature = None
        if signature is not None:
            parameters = {p.name for p in signature}
            var_keyword = any(p.kind is griffe.ParameterKind.var_keyword for p in signature)
        inherited: dict[str, str] = {}
        if isinstance(obj, griffe.Class):
            try:
                bases = obj.mro()
            except Exception:  # a base outside the loaded packages
                bases = []
            for base in bases:
                init = base.members.get("__init__")
                for param in getattr(init, "parameters", []):
                    if param.annotation is not None:
                        inherited.setdefault(param.name, str(param.annotation))
        obj.docstring.value = rewrite(obj.docstring.value, parameters, var_keyword, inherited)

    def on_class_members(self, *, cls: griffe.Class, **kwargs: Any) -> None:
        new = cls.members.get("__new__")
        if isinstance(new, griffe.Function) and "__init__" not in cls.members:
            init = griffe.Function(
                "__init__",
                lineno=new.lineno,
                endlineno=new.endlineno,
                parameters=new.parameters,
                returns=None,
                docstring=None,
                parent=cls,
            )
            init.labels = set(new.labels)
            cls.set_member("__init__", init)
