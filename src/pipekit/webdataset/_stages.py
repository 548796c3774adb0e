"""The ``webdataset`` library's filters as pipekit pipes: handlers, per-sample stages, batching, shard lists.

Each of the library's functional filters (``wds.shuffle(n)``, ``wds.to_tuple("jpg", "cls")``...) is a
:class:`Stage`, a picklable ``pipe -> pipe`` callable, so ``DataPipeline(source, stage, stage...)`` and the
fluid methods build the same pipeline of pipekit pipes.  Every pipe here is stateless or resumable, so a
``pipekit.DataLoader`` checkpoint of a pipeline made of them resumes exactly.
"""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from pipekit.errors import ParseError, SkipLog
from pipekit.pipes.base import IterDataPipe
from pipekit.pipes.state import ResumablePipe

__all__ = [
    "Stage",
    "batched",
    "default_collation_fn",
    "ignore_and_continue",
    "ignore_and_stop",
    "map",
    "map_dict",
    "map_tuple",
    "rename",
    "reraise_exception",
    "select",
    "shuffle",
    "slice",
    "to_tuple",
    "unbatched",
    "warn_and_continue",
    "warn_and_stop",
]

logger = logging.getLogger("pipekit")
_builtin_slice = slice


# ------------------------------------------------------------------------------------------------ handlers


def reraise_exception(exn: BaseException) -> bool:
    """The default handler: the error propagates (pipekit's typed errors name the file and stage)."""
    raise exn


def ignore_and_continue(exn: BaseException) -> bool:
    """Skip the item that failed and go on (the skip is counted in the stage's ``skip_log``)."""
    return True


def warn_and_continue(exn: BaseException) -> bool:
    """Warn, skip the item that failed and go on (counted in the stage's ``skip_log``)."""
    warnings.warn(repr(exn), stacklevel=2)
    return True


def ignore_and_stop(exn: BaseException) -> bool:
    """End the epoch at the first error, silently (the error is still counted in ``skip_log``)."""
    return False


def warn_and_stop(exn: BaseException) -> bool:
    """Warn and end the epoch at the first error (counted in ``skip_log``)."""
    warnings.warn(repr(exn), stacklevel=2)
    return False


CONTINUE_HANDLERS = (ignore_and_continue, warn_and_continue)


def _check_handler(handler: Any, where: str) -> Callable[[BaseException], bool]:
    if not callable(handler):
        raise TypeError(f"pipekit.webdataset.{where}: handler must be a function exn -> bool, got {handler!r:.80}")
    return handler


def _note(exc: BaseException, message: str) -> None:
    if hasattr(exc, "add_note"):
        exc.add_note(message)


def _sample_name(sample: Any) -> str:
    if isinstance(sample, dict):
        return str(sample.get("__url__", "")) + ":" + str(sample.get("__key__", "?"))
    return f"{type(sample).__name__} item"


class Stage:
    """A pipeline stage: ``stage(pipe) -> pipe``, picklable (the library's ``pipelinefilter`` result)."""

    is_pipe_stage = True  # called with the pipe itself (other callables are generator functions over items)

    def __init__(self, cls: type, *args: Any, **kwargs: Any) -> None:
        self.cls, self.args, self.kwargs = cls, args, kwargs

    def __call__(self, pipe: Any) -> IterDataPipe:
        return self.cls(as_pipe(pipe), *self.args, **self.kwargs)

    def __repr__(self) -> str:
        return f"Stage({self.cls.__name__})"


def as_pipe(source: Any) -> IterDataPipe:
    """``source`` as a pipe: a pipe as it is, a list (or other iterable) wrapped in ``IterableWrapper``."""
    if isinstance(source, IterDataPipe):
        return source
    from pipekit.pipes import IterableWrapper

    if isinstance(source, str | bytes) or not isinstance(source, Iterable):
        raise TypeError(f"pipekit.webdataset: expected a pipe or an iterable source, got {source!r:.80}")
    return IterableWrapper(source, deepcopy=False)


# ------------------------------------------------------------------------------------------------ per-item stages


class HandledPipe(IterDataPipe):
    """Apply ``self.apply(item)`` to each item; on an error ask the ``handler`` (the library's contract).

    The handler re-raises (the default), returns ``True`` (skip the item: recorded in ``self.skip_log``) or
    ``False`` (end the epoch here: recorded too).  Holds nothing between items, so it is stateless.
    """

    stateless = True
    stage = "map"

    def __init__(self, source_datapipe: IterDataPipe, handler: Callable[[BaseException], bool]) -> None:
        super().__init__()
        self.source_datapipe = source_datapipe
        self.handler = _check_handler(handler, self.stage)
        self.skip_log = SkipLog(self.stage)

    def apply(self, item: Any) -> Any:
        raise NotImplementedError

    def __iter__(self) -> Iterator[Any]:
        for item in self.source_datapipe:
            try:
                out = self.apply(item)
            except Exception as exc:
                _note(exc, f"in pipekit.webdataset {self.stage}, on {_sample_name(item)}")
                go_on = self.handler(exc)
                self.skip_log.record(exc, _sample_name(item))
                if go_on:
                    continue
                return
            if out is _DROP:
                continue
            yield out


_DROP = object()


class MapStage(HandledPipe):
    """``.map(f)``: ``f(sample)``; a ``None`` result drops the sample, as in the library."""

    stage = "map"

    def __init__(
        self, source_datapipe: IterDataPipe, f: Callable[[Any], Any], handler: Any = reraise_exception
    ) -> None:
        super().__init__(source_datapipe, handler)
        if not callable(f):
            raise TypeError(f"pipekit.webdataset.map: f must be callable, got {f!r:.80}")
        self.f = f

    def apply(self, item: Any) -> Any:
        out = self.f(item)
        return _DROP if out is None else out


def _first_field(sample: dict[str, Any], spec: str, stage: str, missing_is_error: bool = True) -> Any:
    for name in spec.split(";"):
        if name in sample:
            return sample[name]
        if not name.startswith("__") and "." + name in sample:  # pipekit's own samples keep the dot
            return sample["." + name]
    if not missing_is_error:
        return None
    fields = sorted(k for k in sample if not k.startswith("__"))
    raise ParseError(
        "select fields of", _sample_name(sample), stage,
        f"the sample has no {' or '.join(repr(n) for n in spec.split(';'))} field (it has {fields})",
    )


class ToTuple(HandledPipe):
    """``.to_tuple("jpg;png", "cls")``: the named fields as a tuple (``;`` separates alternatives)."""

    stage = "to_tuple"

    def __init__(
        self, source_datapipe: IterDataPipe, *fields: str, handler: Any = reraise_exception,
        missing_is_error: bool = True,
    ) -> None:
        super().__init__(source_datapipe, handler)
        if not fields or not all(isinstance(f, str) for f in fields):
            raise TypeError(f"pipekit.webdataset.to_tuple: expected field names such as 'jpg;png', got {fields!r}")
        self.fields = fields
        self.missing_is_error = missing_is_error

    def apply(self, item: Any) -> Any:
        if not isinstance(item, dict):
            raise TypeError(f"to_tuple: expected a sample dict, got {type(item).__name__}")
        return tuple(_first_field(item, f, self.stage, self.missing_is_error) for f in self.fields)


class MapDict(HandledPipe):
    """``.map_dict(jpg=f, cls=g)``: apply each function to its field."""

    stage = "map_dict"

    def __init__(self, source_datapipe: IterDataPipe, handler: Any = reraise_exception, **fns: Callable) -> None:
        super().__init__(source_datapipe, handler)
        self.fns = fns

    def apply(self, item: Any) -> Any:
        out = dict(item)
        for key, fn in self.fns.items():
            name = key if key in out else "." + key
            if name in out:
                out[name] = fn(out[name])
        return out


class MapTuple(HandledPipe):
    """``.map_tuple(f, g)``: apply the i-th function to the i-th element (``None`` leaves it)."""

    stage = "map_tuple"

    def __init__(self, source_datapipe: IterDataPipe, *fns: Callable | None, handler: Any = reraise_exception) -> None:
        super().__init__(source_datapipe, handler)
        self.fns = fns

    def apply(self, item: Any) -> Any:
        values = list(item)
        for i, fn in enumerate(self.fns[: len(values)]):
            if fn is not None:
                values[i] = fn(values[i])
        return tuple(values)


class Select(HandledPipe):
    """``.select(predicate)``: keep the samples for which ``predicate(sample)`` is true."""

    stage = "select"

    def __init__(
        self, source_datapipe: IterDataPipe, predicate: Callable[[Any], bool], handler: Any = reraise_exception
    ) -> None:
        super().__init__(source_datapipe, handler)
        self.predicate = predicate

    def apply(self, item: Any) -> Any:
        return item if self.predicate(item) else _DROP


class Rename(HandledPipe):
    """``.rename(image="jpg;png", label="cls")``: new field names (``keep=False`` drops the others)."""

    stage = "rename"

    def __init__(
        self, source_datapipe: IterDataPipe, handler: Any = reraise_exception, keep: bool = True, **names: str
    ) -> None:
        super().__init__(source_datapipe, handler)
        self.keep, self.names = keep, names

    def apply(self, item: Any) -> Any:
        old = {name for spec in self.names.values() for name in spec.split(";")}
        out = {k: v for k, v in item.items() if k.startswith("__") or (self.keep and k.lstrip(".") not in old)}
        for new, spec in self.names.items():
            out[new] = _first_field(item, spec, self.stage)
        return out


# ------------------------------------------------------------------------------------------------ batching


def default_collation_fn(samples: Sequence[Any], combine_tensors: bool = True, combine_scalars: bool = True) -> Any:
    """The library's collation: tuples column by column (numbers -> ``np.array``, tensors stacked), dicts by key.

    Example:
        >>> default_collation_fn([(1, "a"), (2, "b")])
        [array([1, 2]), ['a', 'b']]
    """
    if not samples:
        raise ValueError("pipekit.webdataset.default_collation_fn: no samples to collate")
    if isinstance(samples[0], dict):
        keys = samples[0].keys()
        return dict(zip(keys, _collate_columns([[s[k] for k in keys] for s in samples], combine_tensors,
                                               combine_scalars), strict=True))
    if not isinstance(samples[0], list | tuple):
        raise TypeError(
            "pipekit.webdataset.batched: default_collation_fn collates tuples or dicts, got "
            f"{type(samples[0]).__name__}"
            " (use .to_tuple(...) before .batched(), or pass collation_fn=)"
        )
    return _collate_columns(samples, combine_tensors, combine_scalars)


def _collate_columns(rows: Sequence[Sequence[Any]], combine_tensors: bool, combine_scalars: bool) -> list[Any]:
    out: list[Any] = []
    for column in zip(*rows, strict=True):
        first = column[0]
        if isinstance(first, int | float) and combine_scalars:
            out.append(np.array(list(column)))
        elif isinstance(first, torch.Tensor) and combine_tensors:
            try:
                out.append(torch.stack(list(column)))
            except RuntimeError as exc:
                shapes = sorted({tuple(t.shape) for t in column})
                raise ValueError(
                    f"pipekit.webdataset.batched: cannot stack tensors of shapes {shapes[:4]}: resize them to one size "
                    "first (e.g. .map_tuple(torchvision.transforms.v2.Resize((224, 224)), None)) or pass collation_fn="
                ) from exc
        elif isinstance(first, np.ndarray) and combine_tensors:
            out.append(np.array(list(column)))
        else:
            out.append(list(column))
    return out


class Batched(IterDataPipe):
    """``.batched(n)``: groups of ``n`` items collated with ``collation_fn`` (``partial=False`` drops the rest).

    It yields only at group boundaries, holding nothing at a ``yield``, so it is stateless.
    """

    stateless = True

    def __init__(
        self, source_datapipe: IterDataPipe, batchsize: int, collation_fn: Callable | None = default_collation_fn,
        partial: bool = True,
    ) -> None:
        super().__init__()
        from pipekit._validate import check_int

        self.source_datapipe = source_datapipe
        self.batchsize = check_int(batchsize, "batchsize", "pipekit.webdataset.batched", minimum=1)
        self.collation_fn = collation_fn
        self.partial = partial

    def __iter__(self) -> Iterator[Any]:
        batch: list[Any] = []
        for item in self.source_datapipe:
            batch.append(item)
            if len(batch) == self.batchsize:
                done, batch = batch, []
                yield done if self.collation_fn is None else self.collation_fn(done)
        if batch and self.partial:
            yield batch if self.collation_fn is None else self.collation_fn(batch)


class Unbatched(ResumablePipe):
    """``.unbatched()``: the samples of each batch (a tuple/list of columns, a dict of columns, or a list).

    Resume: the checkpoint holds the samples of the current batch not yet yielded.
    """

    state_keys = ("rest",)

    def __init__(self, source_datapipe: IterDataPipe) -> None:
        super().__init__()
        self.source_datapipe = source_datapipe
        self._rest: list[Any] = []

    def state_dict(self) -> dict[str, Any]:
        return {"rest": list(self._rest)}

    def restore(self, state: dict[str, Any] | None) -> None:
        self._rest = [] if state is None else list(state["rest"])

    def _drain(self) -> Iterator[Any]:
        while self._rest:
            yield self._rest.pop(0)

    def __iter__(self) -> Iterator[Any]:
        yield from self._drain()
        for batch in self.source_datapipe:
            self._rest = _rows(batch)
            yield from self._drain()


def _rows(batch: Any) -> list[Any]:
    if isinstance(batch, dict):
        keys = list(batch)
        n = len(batch[keys[0]]) if keys else 0
        return [{k: batch[k][i] for k in keys} for i in range(n)]
    if isinstance(batch, tuple | list) and batch and all(_is_column(c) for c in batch):
        return [tuple(column[i] for column in batch) for i in range(len(batch[0]))]
    if isinstance(batch, list):
        return list(batch)
    raise TypeError(f"pipekit.webdataset.unbatched: expected a batch (columns or a list), got {type(batch).__name__}")


def _is_column(value: Any) -> bool:
    return isinstance(value, torch.Tensor | np.ndarray | list | tuple) and len(value) > 0


class Slice(ResumablePipe):
    """``.slice(start, stop, step)``: ``itertools.islice`` of the items.  Resume: the items seen."""

    state_keys = ("seen",)

    def __init__(self, source_datapipe: IterDataPipe, *args: int | None) -> None:
        super().__init__()
        self.source_datapipe = source_datapipe
        self.range = _builtin_slice(*args)
        self._seen = 0

    def state_dict(self) -> dict[str, Any]:
        return {"seen": self._seen}

    def restore(self, state: dict[str, Any] | None) -> None:
        self._seen = 0 if state is None else int(state["seen"])

    def __iter__(self) -> Iterator[Any]:
        start, stop, step = self.range.indices(sys.maxsize)
        if self._seen >= stop:
            return
        for item in self.source_datapipe:
            i = self._seen
            self._seen += 1
            if i >= start and (i - start) % step == 0:
                yield item
            if self._seen >= stop:
                return


class CheckEmpty(ResumablePipe):
    """``empty_check=True``: an epoch that yields no sample raises, as the library's check does."""

    state_keys = ("count",)

    def __init__(self, source_datapipe: IterDataPipe, where: str = "WebDataset") -> None:
        super().__init__()
        self.source_datapipe = source_datapipe
        self.where = where
        self._count = 0

    def state_dict(self) -> dict[str, Any]:
        return {"count": self._count}

    def restore(self, state: dict[str, Any] | None) -> None:
        self._count = 0 if state is None else int(state["count"])

    def __iter__(self) -> Iterator[Any]:
        for item in self.source_datapipe:
            self._count += 1
            yield item
        if self._count == 0:
            raise ValueError(
                f"pipekit.webdataset.{self.where}: no samples found in this process's share of the dataset; "
                "perhaps there are fewer shards than workers x ranks (use resampled=True, more shards, fewer "
                "workers), or turn the check off with empty_check=False"
            )


class GeneratorStage(IterDataPipe):
    """A user's generator function ``f(iterator) -> iterator`` used as a stage (the library's plain stages).

    pipekit cannot see inside it, so a checkpoint of a pipeline holding one resumes by replaying items (with a
    warning).  Shard-list stages receive ``{"url": url}`` dicts, as in the library, and may yield dicts or URLs.
    """

    def __init__(self, source_datapipe: IterDataPipe, f: Callable[[Iterator[Any]], Iterable[Any]],
                 urls: bool = False) -> None:
        super().__init__()
        self.source_datapipe = source_datapipe
        self.f = f
        self.urls = urls

    def __iter__(self) -> Iterator[Any]:
        if not self.urls:
            yield from self.f(iter(self.source_datapipe))
            return
        for out in self.f({"url": url} for url in self.source_datapipe):
            yield out["url"] if isinstance(out, dict) else out


# ------------------------------------------------------------------------------------------------ the filters


def shuffle(bufsize: int = 1000, initial: int = 100, rng: Any = None, handler: Any = None) -> Stage:
    """``wds.shuffle(n)``: pipekit's resumable ``shuffle(buffer_size=n)`` (``initial``/``rng`` are not used)."""
    from pipekit.pipes import Shuffler

    return Stage(Shuffler, buffer_size=bufsize)


def map(f: Callable[[Any], Any], handler: Any = reraise_exception) -> Stage:
    """``wds.map(f)``."""
    return Stage(MapStage, f, handler=handler)


def to_tuple(*fields: str, handler: Any = reraise_exception, missing_is_error: bool = True) -> Stage:
    """``wds.to_tuple("jpg;png", "cls")``."""
    return Stage(ToTuple, *fields, handler=handler, missing_is_error=missing_is_error)


def map_dict(handler: Any = reraise_exception, **fns: Callable) -> Stage:
    """``wds.map_dict(jpg=f)``."""
    return Stage(MapDict, handler=handler, **fns)


def map_tuple(*fns: Callable | None, handler: Any = reraise_exception) -> Stage:
    """``wds.map_tuple(f, g)``."""
    return Stage(MapTuple, *fns, handler=handler)


def select(predicate: Callable[[Any], bool], handler: Any = reraise_exception) -> Stage:
    """``wds.select(predicate)``."""
    return Stage(Select, predicate, handler=handler)


def rename(handler: Any = reraise_exception, keep: bool = True, **names: str) -> Stage:
    """``wds.rename(image="jpg;png")``."""
    return Stage(Rename, handler=handler, keep=keep, **names)


def batched(batchsize: int, collation_fn: Callable | None = default_collation_fn, partial: bool = True) -> Stage:
    """``wds.batched(n)``."""
    return Stage(Batched, batchsize, collation_fn=collation_fn, partial=partial)


def unbatched() -> Stage:
    """``wds.unbatched()``."""
    return Stage(Unbatched)


def slice(*args: int | None) -> Stage:
    """``wds.slice(stop)`` / ``wds.slice(start, stop, step)``."""
    return Stage(Slice, *args)
