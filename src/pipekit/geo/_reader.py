"""How a raster dataset reads one index entry: :class:`RasterReader`, the files of an entry onto a grid.

An index entry of a :class:`~pipekit.geo._raster.RasterDataset` is one file,
a scene of band files or a STAC item's assets: its *parts*, ``(url, 1-based
band indexes)``, each read into the next channels of the output.  The reader
decides how (on this thread, on GDAL's network I/O thread, or each part on
its own I/O lane at once), retries a remote read through an outage, evicts
the cached handles of a failed read, and turns a failure into the error the
dataset reports (``on_error``).  It holds no reference to the dataset: what
a read needs of the dataset's current settings comes in a
:class:`ReadSettings`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from rasterio.enums import Resampling

from pipekit import _fast
from pipekit.errors import ReadError, SkipLog, StageError
from pipekit.geo import io as geo_io
from pipekit.geo._read import (
    Grid,
    SkippedReadError,
    SourceReadError,
    native_offsets,
    read_into,
    read_stack_into,
)

__all__ = ["EntryLabel", "RasterReader", "ReadSettings"]

Parts = list[tuple[str, list[int]]]


@dataclass(frozen=True)
class ReadSettings:
    """What a read takes from the dataset as it is set now.

    Attributes:
        resampling: the resampling of reprojected or resized files.
        nodata: the nodata value that overrides the files' (``None``: each file's own).
        fill: the value of pixels no file covers.
        cache: keep file handles open between reads (per process and thread).
        on_error: ``"raise"`` or ``"skip"`` (counted in the reader's skip log, and
            :class:`~pipekit.geo._read.SkippedReadError` raised).
    """

    resampling: Resampling
    nodata: float | None
    fill: float
    cache: bool
    on_error: str


@dataclass(frozen=True)
class EntryLabel:
    """What an entry is, for the errors of its reads: ``what`` (e.g. ``"item 'S2A_...'"``) and each part's key.

    A failed read is reported as ``"<what> asset <key>: <reason>"`` (the key of
    the part whose URL failed, if any).
    """

    what: str
    keys: Sequence[str]


class RasterReader:
    """Reads the parts of index entries into output arrays: serial, on the I/O lanes, retried, errors named.

    Args:
        opener: how files are opened (:class:`pipekit.geo.io.RasterOpener`).
        stage: the name errors carry (the dataset's).
        skip_log: where reads skipped under ``on_error="skip"`` are counted.
        concurrent: let the band files of one remote entry be read each on its
            own I/O lane at once (:func:`pipekit.geo.io.run_parts`); otherwise a
            remote entry is read on the network I/O thread, part after part.

    Example:
        >>> import tempfile, numpy as np, rasterio
        >>> from affine import Affine
        >>> from rasterio.enums import Resampling
        >>> from pipekit.errors import SkipLog
        >>> from pipekit.geo import io as geo_io
        >>> from pipekit.geo import BoundingBox
        >>> from pipekit.geo._read import Grid
        >>> path = f"{tempfile.mkdtemp()}/a.tif"
        >>> with rasterio.open(path, "w", driver="GTiff", width=4, height=4, count=1, dtype="uint8",
        ...                    crs="EPSG:32615", transform=Affine(10, 0, 0, 0, -10, 40)) as f:
        ...     f.write(np.arange(16, dtype="uint8").reshape(1, 4, 4))
        >>> reader = RasterReader(geo_io.RasterOpener(), "demo", SkipLog("demo"))
        >>> grid = Grid.from_bbox(BoundingBox(0, 20, 20, 40), (10.0, 10.0), rasterio.crs.CRS.from_epsg(32615))
        >>> out = np.empty((1, 2, 2), dtype="uint8")
        >>> reader.read([(path, [1])], grid, out, None, False,
        ...             ReadSettings(Resampling.nearest, None, 0.0, False, "raise"))
        >>> out[0].tolist()
        [[0, 1], [4, 5]]
    """

    def __init__(self, opener: geo_io.RasterOpener, stage: str, skip_log: SkipLog, concurrent: bool = True) -> None:
        self.opener = opener
        self.stage = stage
        self.skip_log = skip_log
        self.concurrent = concurrent

    def read(
        self,
        parts: Parts,
        grid: Grid,
        out: np.ndarray,
        valid: np.ndarray | None,
        prefilled: bool,
        settings: ReadSettings,
        label: EntryLabel | None = None,
    ) -> None:
        """Read an entry's ``parts`` (``(url, band indexes)``) into ``out`` (and ``valid``), mosaicked first-valid.

        ``prefilled``: ``out`` already holds the fill value where nothing was
        read (else it is filled on failure only).

        Raises:
            ReadError: the read failed (names the file and ``label``), ``on_error="raise"``.
            SkippedReadError: the same under ``on_error="skip"`` (counted in the skip log).
        """
        if any(geo_io.uses_gdal_network(self.opener, url) for url, _ in parts):
            if self.concurrent and len(parts) > 1 and _fast.enabled("concurrent_parts") and not geo_io.on_io_thread():
                # the band files at once, each on its own I/O thread (geo_io.run_parts)
                self._read_parts(parts, grid, out, valid, prefilled, settings, label, concurrent=True)
            else:
                geo_io.run_remote(self._read_parts, parts, grid, out, valid, prefilled, settings, label)
        else:
            self._read_parts(parts, grid, out, valid, prefilled, settings, label)

    def _evict(self, parts: Parts, concurrent: bool, url: str | None = None) -> None:
        """Close the cached handles of the parts (of ``url`` only, if given), on the threads holding them."""
        opener = self.opener
        if concurrent:
            geo_io.run_parts(
                lambda k: geo_io.evict_handle(opener, parts[k][0]) if url is None or parts[k][0] == url else None,
                len(parts))
        elif url is not None:
            geo_io.evict_handle(opener, url)
        else:
            for part_url, _ in parts:
                geo_io.evict_handle(opener, part_url)

    def _read_parts(
        self, parts: Parts, grid: Grid, out: np.ndarray, valid: np.ndarray | None, prefilled: bool,
        settings: ReadSettings, label: EntryLabel | None, concurrent: bool = False,
    ) -> None:
        """Read the files ``parts`` of one index entry into ``out``, retried if remote; failures reported.

        ``concurrent``: part ``k`` is opened and read on I/O thread ``k`` (see
        :func:`pipekit.geo.io.run_parts`); its handle lives in that thread's
        cache, so it is evicted there.  Otherwise everything runs on this thread.
        """
        current = [parts[0][0]]

        def reopen() -> None:  # after a transient failure: open the files again
            if settings.cache:
                self._evict(parts, concurrent)

        try:
            if geo_io.is_local(parts[0][0]):
                self._read_once(parts, grid, out, valid, prefilled, settings, current, concurrent)
            else:  # a remote read outlives an outage longer than GDAL's own HTTP retries
                geo_io.retry_read(
                    lambda: self._read_once(parts, grid, out, valid, prefilled, settings, current, concurrent),
                    opener=self.opener, url=parts[0][0], stage=self.stage, recover=reopen)
        except Exception as exc:
            url = exc.url if isinstance(exc, SourceReadError | StageError) and exc.url else current[0]
            if not prefilled:
                out[...] = settings.fill
            if settings.cache:
                self._evict(parts, concurrent, url)
            if isinstance(exc, StageError):
                error = exc
            else:
                error = ReadError("read raster", url, self.stage, str(exc) if isinstance(exc, SourceReadError)
                                  else f"{type(exc).__name__}: {exc}")
            error = _labelled(error, parts, label)
            if settings.on_error == "raise":
                raise error from exc
            # on_error="skip": counted, and the query has no sample (never a zero-filled patch)
            self.skip_log.record(error)
            raise SkippedReadError(error.action, error.url, error.stage,
                                   f"{error.reason} (skipped: on_error='skip')") from exc

    def _read_once(
        self, parts: Parts, grid: Grid, out: np.ndarray, valid: np.ndarray | None, prefilled: bool,
        settings: ReadSettings, current: list[str], concurrent: bool = False,
    ) -> None:
        if concurrent:
            self._read_concurrently(parts, grid, out, valid, prefilled, settings, current)
            return
        opened: list[geo_io.RasterHandle] = []
        handles: list[tuple[geo_io.RasterHandle, list[int]]] = []
        try:
            for url, indexes in parts:
                current[0] = url
                if settings.cache:
                    h = geo_io.cached_handle(self.opener, url, self.stage)
                else:
                    h = geo_io.open_handle(self.opener, url, self.stage)
                    opened.append(h)
                handles.append((h, indexes))
            nodatas = [settings.nodata if settings.nodata is not None else h.nodata for h, _ in handles]
            read_stack_into(handles, nodatas, grid, out, valid, settings.resampling, settings.fill, prefilled)
        finally:
            for h in opened:
                h.close()

    def _read_concurrently(
        self, parts: Parts, grid: Grid, out: np.ndarray, valid: np.ndarray | None, prefilled: bool,
        settings: ReadSettings, current: list[str],
    ) -> None:
        """:meth:`_read_once` with part ``k`` opened and read on I/O thread ``k``, all parts at once.

        A part the grid reads natively (the scene's CRS and pixel size) is
        read in the same task that opens it: one round trip to the I/O
        threads per sample.  Parts to be warped are read once every part is
        open, as :func:`~pipekit.geo._read.read_stack_into` decides (bands on
        one grid warped together), their windows read at once again.
        """
        opened: list[geo_io.RasterHandle | None] = [None] * len(parts)
        resampling, fill, cache, opener, stage = (
            settings.resampling, settings.fill, settings.cache, self.opener, self.stage)
        offsets = np.cumsum([0] + [len(indexes) for _, indexes in parts]).tolist()

        def failed(k: int) -> None:  # the part whose error is raised: named if the error does not say
            current[0] = parts[k][0]

        def nodata(h: geo_io.RasterHandle) -> float | None:
            return settings.nodata if settings.nodata is not None else h.nodata

        def read_part(k: int, h: geo_io.RasterHandle) -> bool:
            part = slice(offsets[k], offsets[k + 1])
            return read_into(h, parts[k][1], grid, out[part], None if valid is None else valid[part], resampling,
                             nodata(h), fill, prefilled)

        def open_part(k: int) -> tuple[geo_io.RasterHandle | None, bool | None, BaseException | None, bool]:
            """``(handle, covered or None if not read yet, error, whether the error is the opening's)``."""
            url = parts[k][0]
            try:
                if cache:
                    h = geo_io.cached_handle(opener, url, stage)
                else:
                    h = opened[k] = geo_io.open_handle(opener, url, stage)
            except Exception as exc:
                return None, None, exc, True
            if native_offsets(h, grid, resampling) is None:
                return h, None, None, False  # warped: maybe with the other bands, once all are open
            try:
                return h, read_part(k, h), None, False
            except Exception as exc:
                return h, None, exc, False

        def close_part(k: int) -> None:
            h = opened[k]
            if h is not None:
                h.close()

        try:
            found = geo_io.run_parts(open_part, len(parts), failed)
            # the error a serial read raises: the first file that did not open, else the first read that failed
            for opening in (True, False):
                for k, (_, _, error, at_open) in enumerate(found):
                    if error is not None and at_open is opening:
                        failed(k)
                        raise error
            rest = [k for k, (_, covered, _, _) in enumerate(found) if covered is None]
            if len(rest) == len(parts):  # all warped: read_stack_into decides, part k's reads on thread k
                handles = [(h, indexes) for (h, _, _, _), (_, indexes) in zip(found, parts)]
                read_stack_into(handles, [nodata(h) for h, _ in handles], grid, out, valid, resampling,
                                fill, prefilled, run=lambda fn, count: geo_io.run_parts(fn, count, failed))
            elif rest:  # some bands in another grid: each warped on its own, as read_stack_into would
                geo_io.run_parts(lambda j: read_part(rest[j], found[rest[j]][0]), len(rest),
                                 lambda j: failed(rest[j]), lanes=rest)
        finally:
            if not cache:
                geo_io.run_parts(close_part, len(parts))


def _labelled(error: StageError, parts: Parts, label: EntryLabel | None) -> StageError:
    """``error`` naming what the entry is (``label``) and the key of the part that failed, if labelled."""
    if label is None:
        return error
    key = next((k for k, (url, _) in zip(label.keys, parts, strict=True) if url == error.url), None)
    what = label.what + (f" asset {key!r}" if key else "")
    return ReadError(error.action, error.url, error.stage, f"{what}: {error.reason}")
