"""The bases every pipekit pipe is built on.

Every pipekit pipe derives from :class:`IterDataPipe` or :class:`MapDataPipe`
as imported from *this* module and registers its functional name with
:func:`functional_datapipe` from *this* module.  They come from torch through
:mod:`pipekit.pipes._torch`, the only module that touches torch's DataPipe
machinery (so should torch drop its DataPipe core, only that module changes).
For resumable and seeded pipes, see :mod:`pipekit.pipes.state`.

Besides re-exporting the bases (and torch's :class:`StreamWrapper`, which
streams yielded by pipes are wrapped in), this module

* refuses a functional name that is already taken, with an error naming both
  owners (torch's own decorator raises a bare ``Exception``);
* defines the resume protocol (:class:`Resumable`) that stateful pipes
  implement so that :class:`pipekit.DataLoader` can snapshot and restore a
  pipeline's position without replaying it.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar, runtime_checkable

from pipekit.errors import FunctionalNameError
from pipekit.pipes._torch import IterDataPipe, MapDataPipe, StreamWrapper, register_as_function, registry
from pipekit.pipes._torch import torch_functional_datapipe as _torch_functional_datapipe

__all__ = [
    "IterDataPipe",
    "MapDataPipe",
    "Resumable",
    "StreamWrapper",
    "functional_datapipe",
    "registered_names",
    "owner_of",
]

T = TypeVar("T", bound=type)


def _owner_class(names: dict[str, Any], name: str) -> type | None:
    fn = names.get(name)
    if fn is None:
        return None
    # torch stores functools.partial(class_function, cls, ...) objects.
    for arg in getattr(fn, "args", ()):
        if isinstance(arg, type):
            return arg
    return None


def _qualname(cls: type | None) -> str:
    if cls is None:
        return "<unknown>"
    return f"{cls.__module__}.{cls.__qualname__}"


def owner_of(name: str, kind: str = "iter") -> str | None:
    """Return the dotted name of the class registered under functional ``name``.

    ``kind`` is ``"iter"`` for IterDataPipe names and ``"map"`` for MapDataPipe
    names.  Returns ``None`` when the name is free.
    """
    names = registry(kind)
    if name not in names:
        return None
    return _qualname(_owner_class(names, name))


def registered_names(kind: str = "iter") -> list[str]:
    """Sorted functional names currently registered for ``kind`` (``iter``/``map``)."""
    return sorted(registry(kind))


class functional_datapipe:  # noqa: N801 - mirrors torch's decorator name
    """Register a DataPipe class under a functional name, refusing clashes.

    Used exactly like torch's decorator::

        @functional_datapipe("decode_image")
        class ImageDecoder(IterDataPipe): ...

    Registering a name that another class already owns raises
    :class:`~pipekit.errors.FunctionalNameError` naming both classes.
    Re-registering the *same* class (same module and qualified name, as after
    a module reload) is allowed and replaces the old entry.

    ``on="iter"`` or ``on="map"`` registers the name on the *other* kind of
    pipe than the class is: ``to_map_datapipe`` is a MapDataPipe called on
    iterable pipes, ``to_iter_datapipe`` the reverse.

    ``replaces=`` is the one way to take over a name torch registered for
    one of its own pipes (pipekit uses it for ``batch``, ``shuffle``,
    ``unbatch`` and ``sharding_filter``, to validate their arguments): it
    must be the torch class that owns the name now, and the decorated class
    must subclass it, so every existing use keeps working::

        @functional_datapipe("batch", replaces=torch_batcher_class)
        class BatcherIterDataPipe(torch_batcher_class): ...

    A name owned by anything else (another pipekit pipe, a user's pipe, a
    different torch class) still raises :class:`~pipekit.errors.FunctionalNameError`.
    """

    def __init__(self, name: str, on: str | None = None, *, replaces: type | None = None) -> None:
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"functional name must be a Python identifier, got {name!r}")
        if on not in (None, "iter", "map"):
            raise ValueError(f'on must be None, "iter" or "map", got {on!r}')
        if replaces is not None and not (isinstance(replaces, type) and replaces.__module__.startswith("torch.")):
            raise TypeError(f"replaces must be one of torch's own DataPipe classes, got {replaces!r}")
        self.name = name
        self.on = on
        self.replaces = replaces

    def __call__(self, cls: T) -> T:
        if not (issubclass(cls, IterDataPipe) or issubclass(cls, MapDataPipe)):
            raise TypeError(
                f"functional_datapipe({self.name!r}) can only decorate an IterDataPipe or "
                f"MapDataPipe subclass, got {_qualname(cls)}"
            )
        on = self.on or ("iter" if issubclass(cls, IterDataPipe) else "map")
        names = registry(on)
        kind = "IterDataPipe" if on == "iter" else "MapDataPipe"
        if self.replaces is not None and not issubclass(cls, self.replaces):
            raise TypeError(
                f"functional_datapipe({self.name!r}, replaces={_qualname(self.replaces)}): "
                f"{_qualname(cls)} must subclass the class it replaces"
            )
        if self.name in names:
            existing = _owner_class(names, self.name)
            if _qualname(existing) != _qualname(cls) and not (self.replaces is not None and existing is self.replaces):
                raise FunctionalNameError(
                    f"{kind} functional name {self.name!r} is already registered by "
                    f"{_qualname(existing)}; cannot register it again for {_qualname(cls)}"
                )
            del names[self.name]
        if self.on is None:
            _torch_functional_datapipe(self.name)(cls)
        else:
            register_as_function(on, self.name, cls)
        cls.functional_name = self.name  # type: ignore[attr-defined]
        return cls


class _ResumableMeta(type(Protocol)):  # type: ignore[misc]
    """``isinstance(x, Resumable)`` without re-deriving the protocol's members on every call.

    :class:`pipekit.DataLoader` asks it of every stateful pipe for every
    checkpoint (with workers: every batch).  typing's check collects the
    protocol's members by walking its MRO and then, for a class that does not
    define them, goes through ``IterDataPipe.__getattr__`` (the functional-name
    table): 30-70 µs a call.  When the object's *class* is a subclass of the
    protocol (it defines both methods; the answer is cached by ``abc`` per
    class), the answer is ``True`` whatever typing's version, and this says so
    at once; every other object gets typing's own check, instance attributes
    included.
    """

    def __instancecheck__(cls, instance: Any) -> bool:
        if cls.__dict__.get("_is_protocol") and cls.__subclasscheck__(type(instance)):
            return True
        return super().__instancecheck__(instance)


@runtime_checkable
class Resumable(Protocol, metaclass=_ResumableMeta):
    """A pipe that can snapshot and restore its position.

    ``state_dict()`` is called between two items, right after the pipeline's
    last pipe yielded one.  It returns a small picklable dict describing this
    pipe's *own* position (items it consumed and buffered, RNG state); the
    pipes upstream of it report their own positions.

    ``load_state_dict(state)`` is called on a freshly built copy of the pipe
    before iteration; the *next* iterator created on the pipe resumes from
    that position instead of starting over, and the one after that starts a
    new epoch as usual.
    """

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
