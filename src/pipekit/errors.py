"""Exceptions raised by pipekit, and the bookkeeping behind ``on_error="skip"``.

Every error about a file or URL names it and the pipeline stage (the pipe's
functional name) that failed, for example::

    DecodeError: cannot decode image 's3://b/x.jpg' in decode_image: not a JPEG

Pipes that offer ``on_error="skip"`` log each skipped item, count it, and keep
the URL and reason in :attr:`SkipLog.skipped`, so nothing is lost silently.
``pipekit.DataLoader.skip_report()`` adds up the skip logs of a whole
pipeline, across DataLoader workers, into a :class:`SkipReport`.

Every exception pipekit defines is here, under :class:`PipekitError` (``except PipekitError`` catches them all),
and each is also the standard exception code written without pipekit would catch (in brackets), so
``except OSError`` around a read or ``except ValueError`` around a parse keeps working. The exception tree::

    PipekitError
        BandMathError (ValueError)
        CheckpointError (ValueError)
        CliError
        ConfigurationError (ValueError, RuntimeError)
        DatasetNotFoundError (FileNotFoundError)
        DependencyNotFoundError (ModuleNotFoundError)
        EmptyIntersectionError (ValueError, RuntimeError)
        FunctionalNameError
        NotGeoDatasetError (TypeError, ValueError)
        OpenerReadError (OSError)
        RGBBandsMissingError (ValueError)
        RangeCacheError (OSError)
        SourceReadError
        StageError
            ArchiveError (ValueError)
                CorruptStreamError (OSError, lzma.LZMAError, zlib.error)
                TruncatedStreamError (EOFError)
                UnknownFormatError (RuntimeError)
            CacheError (RuntimeError)
            DecodeError (ValueError)
            EncodeError (ValueError)
            GeoReferenceError (ValueError)
            HashError (ValueError, RuntimeError)
            IndexCacheError (ValueError)
            ParseError (ValueError)
                CSVParseError (csv.Error)
                JSONParseError (json.JSONDecodeError)
            ReadError (OSError)
                SkippedReadError
        UnsupportedItemError (TypeError, NotImplementedError)
        UnsupportedTiffError (ValueError)
        WorkerDiedError (RuntimeError)
        WorkerStateError (RuntimeError)

No message shows a secret: a URL's password or token, or a signed query's signature, in any pipekit error
(its message and ``args``) or skip report, is printed as ``***`` (:func:`pipekit._redact.redact_secrets`); the
``url`` attribute of an error keeps the URL as given, for the code that handles it.

A new exception goes here, under the closest class (:class:`StageError` when it is about an item in a pipeline
stage: it then names the file or URL and the stage), with the standard base a caller would catch;
``tests/test_errors.py`` checks that this tree matches the classes and that no module defines one elsewhere.
"""

from __future__ import annotations

import ast
import csv
import json
import logging
import lzma
import re
import threading
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pipekit._redact import redact_secrets, redact_secrets_of

__all__ = [
    "PipekitError",
    "FunctionalNameError",
    "StageError",
    "ReadError",
    "SkippedReadError",
    "DecodeError",
    "EncodeError",
    "ArchiveError",
    "ParseError",
    "JSONParseError",
    "CSVParseError",
    "CacheError",
    "HashError",
    "UnknownFormatError",
    "CorruptStreamError",
    "TruncatedStreamError",
    "UnsupportedItemError",
    "ConfigurationError",
    "DatasetNotFoundError",
    "GeoReferenceError",
    "SkipLog",
    "SkipReport",
    "SkippedItem",
    "WorkerDiedError",
    "WorkerStateError",
    "CheckpointError",
    "IndexCacheError",
    "BandMathError",
    "UnsupportedTiffError",
    "RangeCacheError",
    "OpenerReadError",
    "SourceReadError",
    "CliError",
    "EmptyIntersectionError",
    "DependencyNotFoundError",
    "NotGeoDatasetError",
    "check_on_error",
]

logger = logging.getLogger("pipekit")


class PipekitError(Exception):
    """Base class of all pipekit errors.

    Its message (the text arguments) is kept without the secrets of the URLs it names (see the module docstring).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # keywords are the built-in base's (ImportError's name= and path=, for DependencyNotFoundError)
        super().__init__(*(redact_secrets(a) if isinstance(a, str) else a for a in args), **kwargs)


class FunctionalNameError(PipekitError):
    """A functional DataPipe name is already registered by another class."""


class StageError(PipekitError):
    """An item failed in a pipeline stage.

    Attributes:
        url: the file or URL the item came from (or a description of the item).
        stage: the functional name of the pipe that failed.
        action: what the stage was doing (``"decode image"``, ``"open"``...).
        reason: a short description of the failure.
    """

    def __init__(self, action: str, url: str | None = None, stage: str | None = None, reason: object = None) -> None:
        if url is None and stage is None and reason is None:
            # One argument: torch's DataLoader re-raising a worker's error as ``type(message)``,
            # where the message ends with the worker's traceback.  Keep the fields it names.
            self._from_message(action)
            return
        self.action = action
        self.url = url  # type: ignore[assignment]
        self.stage = stage  # type: ignore[assignment]
        # a cause may repeat the URL in a form no URL pattern recognises (a filesystem that strips the scheme)
        text = str(reason) if not isinstance(reason, str) else reason
        self.reason = redact_secrets_of(text, url) if isinstance(url, str) else text
        super().__init__(f"cannot {action} {url!r} in {stage}: {self.reason}")

    def _from_message(self, message: str) -> None:
        # The last match is the error as it was raised; earlier ones are chained causes.
        pattern = re.compile(rf"^(?:[\w.]+\.)?{re.escape(type(self).__name__)}: {_STAGE_MESSAGE}", re.MULTILINE)
        found = max(pattern.finditer(message), key=lambda m: m.start(), default=None)
        if found is None:
            self.action, self.url, self.stage, self.reason = "", "<unknown>", "<unknown>", message
        else:
            self.action = found["action"]
            try:
                self.url = ast.literal_eval(found["url"])
            except (ValueError, SyntaxError):
                self.url = found["url"][1:-1]
            self.stage = found["stage"]
            rest = message[found.end() :].rstrip("\n").split("\n")
            self.reason = "\n".join(line for line in rest if not line.startswith(_TORCH_NOTE))
        Exception.__init__(self, redact_secrets(message))

    def __reduce__(self):  # keep all fields when crossing DataLoader worker pipes
        return (type(self), (self.action, self.url, self.stage, self.reason))


_TORCH_NOTE = "This exception is thrown by __iter__ of "  # the note torch adds to errors from pipes

# "<Type>: cannot <action> '<url>' in <stage>: " (the reason follows, to the end) in a re-raised worker traceback
_STAGE_MESSAGE = (
    r"cannot (?P<action>.+?) (?P<url>'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\") in (?P<stage>[^\s:]+): "
)


class ReadError(StageError, OSError):
    """A file or URL could not be listed, opened, read or written."""


class SkippedReadError(ReadError):
    """A read that failed under ``on_error="skip"``, already counted in the reader's ``skip_log``: no sample.

    A geo dataset (``RasterDataset(on_error="skip")``) never turns a failed
    read into a (zero-filled) sample: ``dataset[query]`` raises this
    :class:`ReadError` after counting the failure, and ``read_geo`` drops the
    query (counting it in its own ``skip_log`` too), whatever ``read_geo``'s
    own ``on_error``.  Also importable from :mod:`pipekit.geo._read`.
    """


class IndexCacheError(StageError, ValueError):
    """A saved index (``index_cache=``, or a shard index ``<shard>.idx.json``) cannot be used.

    Unreadable, corrupt, stale (its shard changed since), or not a pipekit index of this version.
    """


class GeoReferenceError(StageError, ValueError):
    """A raster cannot be placed on the map: it has no CRS or no geotransform."""


class DatasetNotFoundError(PipekitError, FileNotFoundError):
    """No file of a dataset was found (TorchGeo's name; a ``FileNotFoundError``, which pipekit raised before)."""


class DecodeError(StageError, ValueError):
    """Bytes could not be decoded into an image, array, or document."""


class EncodeError(StageError, ValueError):
    """A value could not be encoded into the bytes of a file (``cannot encode 'key.ext' in <stage>: ...``).

    A ``ValueError``, like the errors the ``webdataset`` library's writer raises.
    """


class ArchiveError(StageError, ValueError):
    """An archive is corrupt, or holds a member that is refused (absolute path, ``..``)."""


class ParseError(StageError, ValueError):
    """A text, CSV or JSON document could not be parsed."""


class _JSONDecodeErrorFields(json.JSONDecodeError):
    """``json.JSONDecodeError`` whose constructor takes the one formatted message :class:`StageError` passes."""

    def __init__(self, *args: object) -> None:
        ValueError.__init__(self, *args)


class JSONParseError(ParseError, _JSONDecodeErrorFields):
    """A JSON document could not be parsed (``parse_json_files``).

    Also a :class:`json.JSONDecodeError`, the error torchdata's ``JsonParser``
    let through, with its fields: ``msg`` (the parser's message), ``doc``
    (the text), ``pos``, ``lineno`` and ``colno`` (where parsing stopped).
    """

    def __init__(
        self,
        action: str,
        url: str | None = None,
        stage: str | None = None,
        reason: object = None,
        doc: str = "",
        pos: int = 0,
        msg: str | None = None,
    ) -> None:
        super().__init__(action, url, stage, reason)
        self.msg = msg if msg is not None else self.reason
        self.doc = doc
        self.pos = pos
        self.lineno = doc.count("\n", 0, pos) + 1
        self.colno = pos - doc.rfind("\n", 0, pos)

    @classmethod
    def from_decode_error(cls, action: str, url: str, stage: str, exc: json.JSONDecodeError) -> JSONParseError:
        """The error for ``exc``, raised by :func:`json.loads` on the document at ``url``."""
        reason = f"line {exc.lineno} column {exc.colno}: {exc.msg}"
        return cls(action, url, stage, reason, doc=exc.doc, pos=exc.pos, msg=exc.msg)

    def __reduce__(self):
        return (type(self), (self.action, self.url, self.stage, self.reason, self.doc, self.pos, self.msg))


class CSVParseError(ParseError, csv.Error):
    """A CSV document could not be parsed (``parse_csv``, ``parse_csv_as_dict``).

    Also a :class:`csv.Error`, the error torchdata's CSV parsers let through.
    """


class UnknownFormatError(ArchiveError, RuntimeError):
    """The compression or archive format of a file cannot be told from its name (``decompress``).

    Also a ``RuntimeError``, the error torchdata's ``Decompressor`` raised.
    """


class CorruptStreamError(ArchiveError, OSError, lzma.LZMAError, zlib.error):
    """The data of a gzip, bz2 or xz stream is damaged (``decompress``, ``load_from_bz2``, ``load_from_xz``).

    Also an instance of each error the codecs raise for damaged data and that
    torchdata let through: ``OSError`` (bz2, ``gzip.BadGzipFile``),
    ``lzma.LZMAError`` (xz) and ``zlib.error`` (gzip's deflate data).
    """


class TruncatedStreamError(ArchiveError, EOFError):
    """A gzip, bz2 or xz stream ends before its end marker.

    Also the ``EOFError`` the codecs raise, which torchdata let through.
    """


class UnsupportedItemError(PipekitError, TypeError, NotImplementedError):
    """An item is of a type the pipe does not handle (``add_index`` on an item that is not a dict).

    A ``TypeError`` (the item is of the wrong type) and a ``NotImplementedError``,
    the error torchdata raised in the same case.
    """


class ConfigurationError(PipekitError, ValueError, RuntimeError):
    """Arguments that leave a pipe nothing to produce (``unzip`` told to skip every column).

    A ``ValueError`` (the arguments are wrong) and a ``RuntimeError``, the error
    torchdata raised in the same case.
    """


class RGBBandsMissingError(PipekitError, ValueError):
    """A plot needs a dataset's RGB bands and its ``bands`` lack one (TorchGeo 0.8's name; a ``ValueError``)."""


class DependencyNotFoundError(PipekitError, ModuleNotFoundError):
    """A package or command a feature needs is not installed (TorchGeo 0.8's ``lazy_import``, ``which``).

    A ``ModuleNotFoundError``, as pipekit's own missing optional packages; its
    message says what to install.
    """


class EmptyIntersectionError(PipekitError, ValueError, RuntimeError):
    """``a & b`` of geo datasets that share no area (or, unless ``spatial_only``, no time where they do).

    A ``ValueError`` (pipekit's earlier error) and a ``RuntimeError``, the error
    TorchGeo 0.8 raises in the same case.
    """


class NotGeoDatasetError(PipekitError, TypeError, ValueError):
    """``a & b`` or ``a | b`` with an operand that is not a geo dataset.

    A ``TypeError`` (pipekit's earlier error) and a ``ValueError``, the error
    TorchGeo 0.8 raises in the same case.
    """


class CacheError(StageError, RuntimeError):
    """A file of the on-disk cache failed its hash check or the cache layout is inconsistent.

    A ``RuntimeError``, like the errors torchdata raised in the same situations.
    """


class HashError(StageError, ValueError, RuntimeError):
    """A file's content does not match its expected hash, or no hash is known for it.

    A ``RuntimeError``, like the error torchdata raised, and a ``ValueError``
    (the data is wrong, not the program).  ``expected`` and ``actual`` hold
    the two hex digests (``None`` when unknown).
    """

    def __init__(
        self,
        action: str,
        url: str | None = None,
        stage: str | None = None,
        reason: object = None,
        expected: str | None = None,
        actual: str | None = None,
    ) -> None:
        super().__init__(action, url, stage, reason)
        self.expected = expected
        self.actual = actual

    def __reduce__(self):
        return (type(self), (self.action, self.url, self.stage, self.reason, self.expected, self.actual))


class BandMathError(PipekitError, ValueError):
    """A band_math formula is not allowed or does not parse (:func:`pipekit.transforms.index_kernels.band_math`)."""


class UnsupportedTiffError(PipekitError, ValueError):
    """A TIFF the fast header reader does not describe exactly (rasterio reads it instead); internal, never raised
    to a user."""


class RangeCacheError(PipekitError, OSError):
    """The range cache folder (``cache_dir=``) could not be used (not writable, disk full): raised naming it."""


class OpenerReadError(PipekitError, OSError):
    """A read of an fsspec file that failed under GDAL (raised from the fsspec error itself).

    rasterio hands GDAL a Python file object; an exception escaping its
    ``read`` reaches GDAL's C++ code, which can abort the whole process
    (``std::length_error``).  pipekit's file objects therefore never raise
    into GDAL: the failed call returns a short read, its error is kept, and
    :func:`pipekit.geo.io.surfacing_opener_errors` raises it once the rasterio call returns.
    """


class SourceReadError(PipekitError):
    """Reading pixels of one file failed; ``url`` names the file, ``__cause__`` is GDAL's error.

    The message is ``reason``: GDAL's own (see :func:`pipekit.geo.io.error_reason`), or the error's type and text.
    Internal: a geo dataset turns it into a :class:`ReadError` naming the dataset.
    """

    def __init__(self, url: str, error: BaseException, reason: str | None = None) -> None:
        super().__init__(reason if reason is not None else f"{type(error).__name__}: {error}")
        self.url = url
        self.error = error

    def __reduce__(self):
        return (type(self), (self.url, self.error, str(self)))


class CliError(PipekitError):
    """A user-facing error about the command line or its inputs: printed as one line, exit status 2."""


class WorkerDiedError(PipekitError, RuntimeError):
    """A DataLoader worker process ended without an error of its own (killed by a signal, out of memory...).

    A ``RuntimeError``, like the error torch raises in that case, whose
    message it extends with what pipekit knows.

    Attributes:
        worker_id: the worker's number (``None`` when unknown).
        pid: its process id (``None`` when unknown).
        signal: the signal that ended it (``"SIGKILL"``), or ``None``.
        url: the last file or archive member it reported opening (``None`` when unknown).
        stage: the pipe that opened ``url``.
    """

    def __init__(
        self,
        message: str,
        worker_id: int | None = None,
        pid: int | None = None,
        signal: str | None = None,
        url: str | None = None,
        stage: str | None = None,
    ) -> None:
        super().__init__(message)
        self.worker_id = worker_id
        self.pid = pid
        self.signal = signal
        self.url = url
        self.stage = stage

    def __reduce__(self):
        return (type(self), (str(self), self.worker_id, self.pid, self.signal, self.url, self.stage))


class CheckpointError(PipekitError, ValueError):
    """A ``pipekit.DataLoader`` checkpoint that does not fit the loader it is loaded into.

    Raised by ``load_state_dict()``: the state is empty or not a DataLoader's,
    or was taken from another pipeline (its pipes, in order, differ) or with
    another number of workers; the message names what differs.
    """


class WorkerStateError(PipekitError, RuntimeError):
    """``pipekit.DataLoader.state_dict()`` could not collect a worker's position.

    A worker did not answer within the loader's ``state_timeout`` (frozen, or
    stopped), exited before answering, or no longer keeps the position asked
    for; the message names the worker(s) and the cause.

    Attributes:
        workers: the ids of the workers whose positions are missing.
    """

    def __init__(self, message: str, workers: list[int] | None = None) -> None:
        super().__init__(message)
        self.workers = list(workers or [])

    def __reduce__(self):
        return (type(self), (str(self), self.workers))


def check_on_error(on_error: str) -> str:
    """Validate an ``on_error`` argument (``"raise"`` or ``"skip"``)."""
    if on_error not in ("raise", "skip"):
        raise ValueError(f'on_error must be "raise" or "skip", got {on_error!r}')
    return on_error


@dataclass(frozen=True)
class SkippedItem:
    """One item a pipe skipped: where it came from and why."""

    url: str
    stage: str
    reason: str


@dataclass
class SkipLog:
    """Counts and remembers the items a pipe skipped under ``on_error="skip"``.

    Each skip is logged as a warning on the ``pipekit`` logger.  ``count`` is
    the total; ``skipped`` keeps the first ``max_kept`` items in full.  With
    several DataLoader workers every worker holds its own copy of the pipe,
    so counts are per worker process.
    """

    stage: str
    max_kept: int = 1000
    count: int = 0
    skipped: list[SkippedItem] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def record(self, error: StageError | BaseException, url: str | None = None) -> None:
        reason = error.reason if isinstance(error, StageError) else f"{type(error).__name__}: {error}"
        where = url if url is not None else getattr(error, "url", "<unknown>")
        where, reason = redact_secrets(str(where)), redact_secrets(str(reason))  # both are shown and sent
        with self._lock:
            self.count += 1
            if len(self.skipped) < self.max_kept:
                self.skipped.append(SkippedItem(str(where), self.stage, reason))
        logger.warning("%s: skipped %r (%s); %d skipped so far", self.stage, where, reason, self.count)

    def reset(self) -> None:
        with self._lock:
            self.count = 0
            self.skipped.clear()

    def summary(self, first: int = 10) -> dict[str, Any]:
        """This log as plain data: ``{"stage", "count", "items": {i: [url, stage, reason]}}`` for the first items.

        Small and made of builtins only (``torch.load(weights_only=True)``
        reads it); DataLoader workers send it to the main process with each
        batch, and torchdata sends only what changed, so items are keyed by
        their number.
        """
        with self._lock:
            items = {i: [s.url, s.stage, s.reason] for i, s in enumerate(self.skipped[:first])}
            return {"stage": self.stage, "count": self.count, "items": items}

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("_lock", None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


@dataclass(frozen=True)
class SkipReport:
    """What the pipes of a pipeline skipped, added up (``pipekit.DataLoader.skip_report()``).

    Attributes:
        counts: items skipped per stage (functional name), e.g. ``{"load_from_tar": 1, "decode": 3}``.
        skipped: the first skipped items of each pipe (and worker), with URL, stage and reason.
    """

    counts: dict[str, int] = field(default_factory=dict)
    skipped: list[SkippedItem] = field(default_factory=list)

    @property
    def count(self) -> int:
        """All items skipped."""
        return sum(self.counts.values())

    @classmethod
    def from_summaries(cls, summaries: Iterable[dict[str, Any]]) -> SkipReport:
        """Add up :meth:`SkipLog.summary` dicts (from several pipes and workers)."""
        counts: dict[str, int] = {}
        skipped: list[SkippedItem] = []
        for summary in summaries:
            if not summary.get("count"):
                continue
            stage = str(summary["stage"])
            counts[stage] = counts.get(stage, 0) + int(summary["count"])
            items = summary.get("items") or {}
            for key in sorted(items):
                url, item_stage, reason = items[key]
                skipped.append(SkippedItem(str(url), str(item_stage), str(reason)))
        return cls(counts, skipped)

    def __str__(self) -> str:
        if not self.count:
            return "nothing skipped"
        stages = ", ".join(f"{stage}: {n}" for stage, n in sorted(self.counts.items()))
        lines = [f"{self.count} item{'' if self.count == 1 else 's'} skipped ({stages})"]
        lines += [f"  {s.stage}: {s.url!r}: {s.reason}" for s in self.skipped]
        return "\n".join(lines)
