"""Pipes that read geo datasets: ``read_geo`` maps query boxes to samples."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pipekit.errors import ReadError, SkipLog, SkippedReadError, StageError, check_on_error
from pipekit.geo._bbox import BoundingBox
from pipekit.pipes.base import IterDataPipe, functional_datapipe

__all__ = ["GeoReader"]


@functional_datapipe("read_geo")
class GeoReader(IterDataPipe):
    """Read ``dataset[bbox]`` for each query box of the source pipe (functional name: ``read_geo``).

    The source is usually a geo sampler's pipe
    (:meth:`~pipekit.geo.samplers.GeoSampler.as_pipe`), possibly after
    ``sharding_filter``: TorchGeo 0.8's ``(slice x, slice y, slice t)``
    queries, or :class:`~pipekit.geo.BoundingBox` objects; an item that is a
    list of queries (from a batch sampler) becomes the list of their samples.  Stateless: the position
    lives in the source.  A failing query raises
    :class:`~pipekit.errors.ReadError` naming the box (and chaining the
    dataset's own exception), or, with ``on_error="skip"``, is recorded in
    :attr:`skip_log` and skipped.  A query whose read the dataset itself
    skipped (a ``RasterDataset(on_error="skip")`` raises
    :class:`~pipekit.errors.SkippedReadError`) is always dropped and
    counted in :attr:`skip_log`: a failed read never becomes a sample.  For
    an item that is a list of boxes, one failed box drops the whole item.

    ``len()`` is the source's length, as torch gives it for a map; it raises
    ``TypeError`` (as torch does for a length it cannot know) when queries
    may be dropped: with ``on_error="skip"``, or over a dataset (or a
    composition of datasets) that skips failed reads.

    Args:
        source_datapipe: a pipe of queries (slices or
            :class:`~pipekit.geo.BoundingBox`, or lists of them, or anything
            the dataset accepts as a key).
        dataset: the geo dataset to read from (anything indexable by the
            source's items).
        on_error: ``"raise"`` (default) or ``"skip"``.

    Example:
        >>> from types import SimpleNamespace
        >>> from pipekit.geo._index import GeoIndex
        >>> from pipekit.geo._pipes import GeoReader
        >>> from pipekit.geo.samplers import GridGeoSampler
        >>> class Areas:  # a stand-in dataset: the sample is the query's area
        ...     index, res = GeoIndex([[0, 20, 0, 10]]), (1.0, 1.0)
        ...     def __getitem__(self, query):
        ...         x, y, t = query
        ...         return {"area": (x.stop - x.start) * (y.stop - y.start)}
        >>> ds = Areas()
        >>> list(GridGeoSampler(ds, size=10).as_pipe().read_geo(ds))
        [{'area': 100.0}, {'area': 100.0}]
    """

    stateless = True

    def __init__(self, source_datapipe: IterDataPipe, dataset: Any, on_error: str = "raise") -> None:
        if not hasattr(dataset, "__getitem__"):
            raise TypeError(f"read_geo needs an indexable dataset, got {type(dataset).__name__}")
        self.source_datapipe = source_datapipe
        self.dataset = dataset
        self.on_error = check_on_error(on_error)
        self.skip_log = SkipLog("read_geo")

    def _read(self, key: Any) -> Any:
        try:
            return self.dataset[key]
        except Exception as exc:
            reason = exc.reason if isinstance(exc, StageError) else f"{type(exc).__name__}: {exc}"
            if isinstance(exc, StageError):
                reason = f"{reason} (reading {exc.url!r} in {exc.stage})"
            name = type(self.dataset).__name__
            raise ReadError(f"read {name} at", _describe(key), "read_geo", reason) from exc

    def __iter__(self) -> Iterator[Any]:
        for item in self.source_datapipe:
            try:
                if isinstance(item, list) and not all(isinstance(k, slice) for k in item):  # a batch sampler's list
                    out: Any = [self._read(key) for key in item]
                else:
                    out = self._read(item)
            except ReadError as err:
                if self.on_error == "raise" and not isinstance(err.__cause__, SkippedReadError):
                    raise
                self.skip_log.record(err)
                continue
            yield out

    def __len__(self) -> int:
        if self.on_error == "skip":
            raise TypeError("read_geo(on_error='skip') has no len(): items may be skipped")
        if _skips_reads(self.dataset):
            raise TypeError(f"read_geo over {type(self.dataset).__name__} with on_error='skip' has no len(): "
                            "queries whose reads fail are dropped")
        return len(self.source_datapipe)


def _skips_reads(dataset: Any, depth: int = 0) -> bool:
    """Whether ``dataset``, or a dataset it is composed of (``.datasets``), drops failed reads."""
    if getattr(dataset, "on_error", None) == "skip":
        return True
    parts = getattr(dataset, "datasets", None)
    if depth > 16 or not isinstance(parts, list | tuple):
        return False
    return any(_skips_reads(d, depth + 1) for d in parts)


def _describe(key: Any) -> str:
    """A query key in full precision (``BoundingBox``'s repr rounds to 6 digits)."""
    if isinstance(key, BoundingBox):
        return (
            f"BoundingBox(minx={key.minx!r}, maxx={key.maxx!r}, miny={key.miny!r}, maxy={key.maxy!r}, "
            f"mint={key.mint!r}, maxt={key.maxt!r})"
        )
    return repr(key)
