"""The torchdata and ``webdataset`` names pipekit deliberately lacks, and what to use instead: the tables.

Every form a user types names the pipekit way instead of a bare "no attribute":

* ``dp.iter.S3FileLister``, ``wds.RandomMix``: the module ``__getattr__`` of ``pipekit.pipes``, its
  ``iter``/``map`` namespaces and ``pipekit.webdataset`` raise :func:`missing_name`'s ``AttributeError``
  (:data:`REPLACEMENTS`);
* ``from pipekit.pipes import S3FileLister``: the same text in the ``ImportError`` that statement raises
  (:func:`missing_name` with the caller's frame; Python drops the ``AttributeError``'s message there);
* ``pipe.list_files_by_s3()`` (torchdata 0.9's functional names, :data:`FUNCTIONAL_NAMES`) and
  ``pipe.with_epoch(10)`` (the library's fluid methods, :data:`METHODS`): :func:`explain_missing_attribute`,
  installed on every iterable pipe when :mod:`pipekit.pipes` is imported;
* ``WebDataset(urls, handler=...)`` on a class that refuses the library's keyword:
  :func:`explain_unexpected_keywords` (:data:`KEYWORDS`).

The names stay missing: ``hasattr`` is False for each.  The migration guides list them, with reasons.
"""

from __future__ import annotations

import functools
import inspect
import opcode
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

from pipekit.pipes._torch import explain_missing_attributes

_F = TypeVar("_F", bound=Callable[..., Any])

__all__ = [
    "FUNCTIONAL_NAMES",
    "KEYWORDS",
    "METHODS",
    "REPLACEMENTS",
    "explain_missing_attribute",
    "explain_unexpected_keywords",
    "missing_name",
]

_FSSPEC_LIST = 'list_files_by_fsspec("s3://bucket/prefix/")'
_FSSPEC_OPEN = 'open_files_by_fsspec(mode="rb") on "s3://..." URLs (the s3 extra)'
_TO_SHARDS = "WebDataset shards (convert the records; pipekit.pipes.ShardWriter writes them)"

# (library, name) -> the pipekit way
REPLACEMENTS: dict[tuple[str, str], str] = {
    # torchdata 0.9's datapipes.iter / .map
    ("torchdata", "S3FileLister"): f"{_FSSPEC_LIST} (IterableWrapper([url]).list_files_by_fsspec())",
    ("torchdata", "S3FileLoader"): _FSSPEC_OPEN,
    ("torchdata", "AISFileLister"): f"{_FSSPEC_LIST} on the AIStore bucket's S3 API",
    ("torchdata", "AISFileLoader"): f"{_FSSPEC_OPEN} on the AIStore bucket's S3 API",
    ("torchdata", "IoPathFileLister"): "list_files_by_fsspec (fsspec reaches the same local and remote paths)",
    ("torchdata", "IoPathFileOpener"): "open_files_by_fsspec",
    ("torchdata", "IoPathSaver"): "save_by_fsspec",
    ("torchdata", "HuggingFaceHubReader"): "IterableWrapper(datasets.load_dataset(...)) (Hugging Face datasets)",
    ("torchdata", "GDriveReader"): "read_from_http on a direct download URL",
    ("torchdata", "OnlineReader"): "read_from_http (HttpReader)",
    ("torchdata", "DataFrameMaker"): "IterableWrapper over rows read with pyarrow or pandas",
    ("torchdata", "ParquetDataFrameLoader"): "IterableWrapper(pyarrow.parquet.read_table(path).to_pylist())",
    ("torchdata", "RarArchiveLoader"): "load_from_tar / load_from_zip (convert the .rar archives)",
    ("torchdata", "TFRecordLoader"): _TO_SHARDS,
    ("torchdata", "TFRecordExample"): _TO_SHARDS,
    ("torchdata", "TFRecordExampleSpec"): _TO_SHARDS,
    ("torchdata", "ShardingRoundRobinDispatcher"): "sharding_filter()",
    # the webdataset library
    ("webdataset", "MultiShardSample"): "several WebDatasets mixed with pipekit.pipes.SampleMultiplexer",
    ("webdataset", "RandomMix"): "pipekit.pipes.SampleMultiplexer({ds_a: 0.7, ds_b: 0.3})",
    ("webdataset", "RoundRobin"): "pipekit.pipes.Multiplexer (mux) or MultiplexerLongest (mux_longest)",
    ("webdataset", "ChoppedDataset"): "WebDataset(...).with_epoch(n)",
    ("webdataset", "DBCache"): "pipekit.pipes.InMemoryCacheHolder (in_memory_cache) or WebDataset(cache_dir=...)",
    ("webdataset", "LMDBCached"): "WebDataset(cache_dir=...) (local copies of the shards)",
    ("webdataset", "Cached"): "pipekit.pipes.InMemoryCacheHolder (in_memory_cache)",
    ("webdataset", "detshuffle"): "shuffle(n): pipekit's shuffles are seeded from the DataLoader, deterministic",
    ("webdataset", "xdecode"): 'decode(...) with functions (key, data) -> value, or map_dict(jpg=fn)',
    ("webdataset", "rsample"): "select(predicate) with a seeded random.Random, or pipekit.pipes.RandomSplitter",
    ("webdataset", "wids"): "datasets.WebDataset / WebDataset: random access into shards is not in this version",
    ("webdataset", "ShardList"): "SimpleShardList",
    ("webdataset", "gopen"): "fsspec.open(url) (pipe: URLs: WebDataset(['pipe:cmd args']))",
    ("webdataset", "torch_video"): "decode(fn) with a function (key, data) -> video of your own (torchvision.io)",
    ("webdataset", "torch_audio"): "decode(fn) with a function (key, data) -> audio of your own (torchaudio)",
    ("webdataset", "Continue"): "a handler returning True (ignore_and_continue)",
}

# torchdata 0.9's functional names of the classes above (each class's ``@functional_datapipe``); all on iterable
# pipes: torchdata 0.9's map-style pipes had none of them.  HuggingFaceHubReader, TFRecordExample(Spec) had none.
FUNCTIONAL_NAMES: dict[str, str] = {
    "list_files_by_s3": "S3FileLister",
    "load_files_by_s3": "S3FileLoader",
    "list_files_by_ais": "AISFileLister",
    "load_files_by_ais": "AISFileLoader",
    "list_files_by_iopath": "IoPathFileLister",
    "open_files_by_iopath": "IoPathFileOpener",
    "save_by_iopath": "IoPathSaver",
    "read_from_gdrive": "GDriveReader",
    "read_from_remote": "OnlineReader",
    "dataframe": "DataFrameMaker",
    "load_parquet_as_df": "ParquetDataFrameLoader",
    "load_from_rar": "RarArchiveLoader",
    "load_from_tfrecord": "TFRecordLoader",
    "sharding_round_robin_dispatch": "ShardingRoundRobinDispatcher",
}

_WDS = "pipekit.webdataset (import pipekit.webdataset as wds) has it"

# The webdataset library's fluid methods (``FluidInterface``) -> the pipekit way on a pipekit pipe that lacks them
# (``datasets.WebDataset``, any pipe; ``pipekit.webdataset``'s pipelines have most of them).
METHODS: dict[str, str] = {
    "with_epoch": f"cycle().header(n) (n items per worker and rank an epoch; header(n) alone cuts one pass); {_WDS}",
    "with_length": f"set_length(n); {_WDS}",
    "to_tuple": f"map(lambda s: (s['.jpg'], s['.cls'])) (pipekit's samples key by '.ext'); {_WDS}",
    "map_tuple": f"map(fn, input_col=i) for position i; {_WDS}",
    "map_dict": f"map(fn, input_col='.jpg') for a key; {_WDS}",
    "batched": f"batch(n).collate() (pad_collate for mixed sizes); {_WDS}",
    "unbatched": f"unbatch(); {_WDS}",
    "listed": f"batch(n); {_WDS}",
    "unlisted": "unbatch()",
    "select": f"filter(predicate); {_WDS}",
    "rename": f"map(fn) returning the renamed sample; {_WDS}",
    "rename_keys": "map(fn) returning the renamed sample",
    "extract_keys": "map(lambda s: (s['.jpg'], s['.cls']))",
    "compose": f"call the stage on the pipe: stage(pipe); {_WDS}",
    "log_keys": "map(fn) with a fn that logs sample['__key__'] and returns the sample",
    "rsample": REPLACEMENTS["webdataset", "rsample"],
    "xdecode": REPLACEMENTS["webdataset", "xdecode"],
    "mcached": "in_memory_cache()",
    "lmdb_cached": "on_disk_cache(...), or datasets.WebDataset(cache_dir=...) (local copies of the shards)",
}

# webdataset.WebDataset's keyword arguments -> the pipekit way, for a pipekit class that refuses them
# (:func:`explain_unexpected_keywords`).
KEYWORDS: dict[str, str] = {
    "resampled": "pipekit.webdataset.WebDataset(urls, resampled=True) (with .with_epoch(n))",
    "shardshuffle": "shuffle_shards=True",
    "detshuffle": "shuffle_shards=True: pipekit's shuffles are seeded from the DataLoader, deterministic",
    "seed": "torch.manual_seed(s) or the DataLoader's generator= (pipekit's shuffles follow them)",
    "handler": 'on_error="skip" (skips are counted in skip_log) or on_error="raise"',
    "nodesplitter": "nothing: sharding_filter hands each shard to one rank and DataLoader worker",
    "workersplitter": "nothing: sharding_filter hands each shard to one rank and DataLoader worker",
    "repeat": ".cycle() on the dataset",
    "cache_size": "cache_dir= (remote shards copied whole, checked on each open)",
    "url_to_name": "cache_dir= (it names the local copies)",
    "select_files": "transform= (a function sample -> sample) or decode={extension: fn}",
    "rename_files": "transform= (a function sample -> sample)",
    "empty_check": "pipekit.webdataset.WebDataset(urls, empty_check=...)",
    "verbose": "nothing: skipped items are logged and counted in skip_log",
    "mode": "pipekit.webdataset.WebDataset(urls, mode=...)",
}


def explain_unexpected_keywords(library: str) -> Callable[[_F], _F]:
    """Decorate a function (an ``__init__``) so that a ``library`` keyword argument it lacks names the pipekit way.

    The ``TypeError`` Python raises for an unexpected keyword argument gets, for one in :data:`KEYWORDS`, what to
    pass instead; the signature, accepted keywords and other errors are unchanged.

    Example:
        >>> class Shards:
        ...     @explain_unexpected_keywords("webdataset")
        ...     def __init__(self, urls, *, shuffle_shards=True): ...
        >>> Shards("a.tar", shardshuffle=100)
        Traceback (most recent call last):
        ...
        TypeError: Shards.__init__() got an unexpected keyword argument 'shardshuffle' (webdataset's \
WebDataset(..., shardshuffle=)): use shuffle_shards=True (see docs/migration/webdataset.md)
    """

    def decorate(function: _F) -> _F:
        accepted = _keyword_names(function)
        if accepted is None:  # it takes **kwargs: nothing is unexpected
            return function

        @functools.wraps(function)
        def checked(*args: Any, **kwargs: Any) -> Any:
            for keyword in kwargs.keys() - accepted:
                if keyword in KEYWORDS:
                    raise TypeError(
                        f"{function.__qualname__}() got an unexpected keyword argument {keyword!r} ({library}'s "
                        f"WebDataset(..., {keyword}=)): use {KEYWORDS[keyword]} (see docs/migration/{library}.md)"
                    ) from None
            return function(*args, **kwargs)

        return checked  # type: ignore[return-value]

    return decorate


def _keyword_names(function: Callable[..., Any]) -> frozenset[str] | None:
    """The names ``function`` accepts as keywords; ``None`` when it takes ``**kwargs``."""
    parameters = inspect.signature(function).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    return frozenset(p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def explain_missing_attribute(pipe: Any, name: str) -> AttributeError | None:
    """The ``AttributeError`` for ``pipe.name`` when ``name`` is a torchdata functional name or a webdataset method.

    Installed on every iterable pipe (:func:`pipekit.pipes._torch.explain_missing_attributes`): it runs only where
    torch's own lookup failed, so registered names and methods are never affected.

    Example:
        >>> from pipekit.pipes import IterableWrapper
        >>> IterableWrapper(["s3://bucket/"]).list_files_by_s3()
        Traceback (most recent call last):
        ...
        AttributeError: 'IterableWrapper' object has no attribute 'list_files_by_s3' (torchdata's S3FileLister): ...
    """
    cls = FUNCTIONAL_NAMES.get(name)
    if cls is not None:
        library, what, form = "torchdata", REPLACEMENTS["torchdata", cls], cls
        lacks = f"pipekit deliberately has no {cls}"
    elif name in METHODS:
        library, what, form = "webdataset", METHODS[name], f".{name}()"
        lacks = f"{type(pipe).__name__} has no {name}"
    else:
        return None
    return AttributeError(
        f"{type(pipe).__name__!r} object has no attribute {name!r} ({library}'s {form}): {lacks}; use {what} "
        f"(see docs/migration/{library}.md)"
    )


_IMPORT_FROM = opcode.opmap["IMPORT_FROM"]


def _importing_from(frame: FrameType | None) -> bool:
    """Whether ``frame`` is executing ``from module import name`` (its current instruction is ``IMPORT_FROM``).

    CPython 3.10-3.13 look ``name`` up on the module for ``from module import name`` and, when the lookup
    raises ``AttributeError``, drop it (no ``__cause__``, no ``__context__``) for a generic "cannot import name";
    any other exception goes through.  Telling the statement apart from ``getattr``/``hasattr`` (whose caller
    executes a call) lets the module ``__getattr__`` raise the ``ImportError`` itself, with the replacement,
    for the statement only.
    """
    if frame is None:
        return False
    code, i = frame.f_code.co_code, frame.f_lasti
    if not 0 <= i < len(code):
        return False
    while code[i] == opcode.EXTENDED_ARG and i + 2 < len(code):  # 3.10 points at an argument's prefix
        i += 2
    return code[i] == _IMPORT_FROM


def missing_name(
    library: str, module: str, name: str, caller: FrameType | None = None
) -> AttributeError | ImportError:
    """The error for ``module.name`` (a module ``__getattr__``'s), naming the replacement when ``name`` is in the table.

    Pass the module ``__getattr__``'s caller (``sys._getframe(1)``) as ``caller``: where it is executing
    ``from module import name`` and ``name`` is in the table, the error is the ``ImportError`` that statement
    raises, with the replacement (Python would replace an ``AttributeError`` by its generic message); ``getattr``
    and ``hasattr`` still get an ``AttributeError``.

    Example:
        >>> str(missing_name("torchdata", "pipekit.pipes.iter", "S3FileLister"))[:88]
        "module 'pipekit.pipes.iter' has no attribute 'S3FileLister' (torchdata's S3FileLister): "
    """
    what = REPLACEMENTS.get((library, name))
    message = f"module {module!r} has no attribute {name!r}"
    if what is None:
        return AttributeError(message)
    why = f"({library}'s {name}): pipekit deliberately has no {name}; use {what} (see docs/migration/{library}.md)"
    if _importing_from(caller):
        path = getattr(sys.modules.get(module), "__file__", None)
        return ImportError(f"cannot import name {name!r} from {module!r} {why}", name=module, path=path)
    return AttributeError(f"{message} {why}")


explain_missing_attributes("iter", FUNCTIONAL_NAMES.keys() | METHODS.keys(), explain_missing_attribute)
