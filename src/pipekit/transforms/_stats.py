"""Streaming per-band statistics of a pipe: the numbers to give :class:`~pipekit.transforms.Normalize`.

:func:`compute_stats` reads samples (or batches) from any iterable and keeps,
per band, in constant memory:

* **count, mean, std**: exact up to float64 rounding.  Each sample's band
  values are summed in float64 (mean, then the sum of squared deviations from
  that mean) and merged into the running totals with Chan et al.'s parallel
  update (the pairwise form of Welford's algorithm), which does not lose
  precision as the count grows the way ``sum(x**2) - n * mean**2`` does.
* **min, max**: exact.
* **percentiles** from a per-band histogram:

  - integer data of at most 16 bits (uint8, int8, uint16, int16) is counted
    value by value, so percentiles are **exact** (``percentile_error`` 0);
  - other data (floats, int32...) goes into a fixed number of equal-width
    bins (``bins``, default 16384) whose range starts at the first sample's
    min..max and doubles whenever a value falls outside it (pairs of bins are
    merged).  An estimated percentile is within **one final bin width** of the
    exact value (``|estimate - exact| <= percentile_error[band]``, reported
    per band), because the order statistics it interpolates are located in
    their bin and placed inside it.

Percentiles follow ``numpy.percentile``'s default (linear) definition.  NaN and
infinite values, and ``nodata`` values when given, are left out of every
statistic (``count`` says how many values were used per band).

**Geo datasets.**  ``compute_stats(dataset, n)`` on a
:class:`~pipekit.geo.GeoDataset` (a ``RasterDataset``, ``landsat & cdl``...)
reads ``n`` patches drawn by a seeded :class:`~pipekit.geo.RandomGeoSampler`
(``size=256`` pixels, ``seed=0``; or pass any ``sampler=``), and leaves out the
dataset's ``nodata`` value (the fill of pixels no file covers) per band, as
well as NaN.

**Units.**  Statistics are of the values as they are, never rescaled: DN for
a uint16 Landsat image, 0..255 for uint8.  These are the units
:func:`pipekit.device.to_device` and :class:`~pipekit.transforms.Normalize`
work in by default (and TorchGeo's recipes normalise raw values with raw
statistics), so ``to_device(batch, "cuda", normalize=(stats.mean,
stats.std))`` or ``stats.normalize()`` gives mean 0, std 1 per band.  Only
for a ``to_device(..., scale=s)`` that maps images to other units would the
statistics need dividing by ``s``.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from pipekit.transforms._normalize import Normalize

__all__ = ["BandStats", "compute_stats"]

logger = logging.getLogger("pipekit")

_EXACT_DTYPES = {torch.uint8: (0, 256), torch.int8: (-128, 256), torch.int16: (-32768, 65536)}
if hasattr(torch, "uint16"):
    _EXACT_DTYPES[torch.uint16] = (0, 65536)


@dataclass
class BandStats:
    """Per-band statistics from :func:`compute_stats` (lists with one value per band).

    Attributes:
        count: values used per band (NaN/Inf and nodata left out).
        mean, std: exact mean and population standard deviation (``ddof=0``,
            as ``numpy.std``).
        min, max: exact extremes.
        percentiles: ``{q: [value per band]}`` for each requested percentile
            ``q`` (0..100).
        percentile_error: per band, the largest possible distance between an
            estimated percentile and the exact one (0.0 where exact).
        num_samples: how many samples were read.
    """

    count: list[int]
    mean: list[float]
    std: list[float]
    min: list[float]
    max: list[float]
    percentiles: dict[float, list[float]] = field(default_factory=dict)
    percentile_error: list[float] = field(default_factory=list)
    num_samples: int = 0

    def normalize(self, **kwargs: Any) -> Normalize:
        """A :class:`~pipekit.transforms.Normalize` with these means and standard deviations."""
        if any(c == 0 for c in self.count):
            empty = [i for i, c in enumerate(self.count) if c == 0]
            raise ValueError(f"BandStats.normalize: band(s) {empty} had no valid values")
        std = [s if s > 0 else 1.0 for s in self.std]
        return Normalize(self.mean, std, **kwargs)


def _length(sampler: Any) -> int | None:
    try:
        return len(sampler)
    except TypeError:
        return None


class _Histogram:
    """Per-band counts: exact for small integer dtypes, else fixed bins over a doubling range."""

    def __init__(self, channels: int, dtype: torch.dtype, bins: int) -> None:
        self.channels = channels
        self.exact = dtype in _EXACT_DTYPES
        if self.exact:
            self.offset, self.size = _EXACT_DTYPES[dtype]
            self.counts = torch.zeros(channels * self.size, dtype=torch.int64)
        else:
            self.size = bins
            self.counts = torch.zeros(channels * bins, dtype=torch.int64)
            self.lo = np.zeros(channels)
            self.width = np.zeros(channels)
            self.ready = np.zeros(channels, dtype=bool)

    def _expand(self, c: int, mn: float, mx: float) -> None:
        bins = self.size
        if not self.ready[c]:
            if mx > mn:
                self.lo[c], self.width[c] = mn, (mx - mn) / (bins - 1)
            else:
                w = max(abs(mn), 1.0) * 2.0**-20
                self.lo[c], self.width[c] = mn - w * bins / 2, w
            self.ready[c] = True
        counts = self.counts.view(self.channels, bins)
        for _ in range(4096):
            lo, w = self.lo[c], self.width[c]
            if mn >= lo and mx < lo + bins * w:
                return
            merged = counts[c].view(bins // 2, 2).sum(1)
            counts[c].zero_()
            if mn < lo:
                counts[c, bins // 2 :] = merged
                self.lo[c] = lo - bins * w
            else:
                counts[c, : bins // 2] = merged
            self.width[c] = 2 * w
        raise ValueError(f"compute_stats: cannot fit band {c}'s values {mn}..{mx} in a histogram")  # pragma: no cover

    def update(self, x: Tensor, valid: Tensor | None, mn: np.ndarray, mx: np.ndarray) -> None:
        c_idx = torch.arange(self.channels).view(-1, 1) * self.size
        if self.exact:
            idx = x.to(torch.int64) - self.offset + c_idx
        else:
            for c in range(self.channels):
                if math.isfinite(mn[c]):
                    self._expand(c, float(mn[c]), float(mx[c]))
            lo = torch.from_numpy(self.lo).view(-1, 1)
            w = torch.from_numpy(np.where(self.width > 0, self.width, 1.0)).view(-1, 1)
            idx = torch.floor((x.to(torch.float64) - lo) / w).clamp_(0, self.size - 1).to(torch.int64) + c_idx
        idx = idx[valid] if valid is not None else idx.flatten()
        self.counts += torch.bincount(idx, minlength=self.counts.numel())

    def percentiles(
        self, qs: Sequence[float], mn: np.ndarray, mx: np.ndarray
    ) -> tuple[dict[float, list[float]], list[float]]:
        counts = self.counts.view(self.channels, self.size).numpy()
        out: dict[float, list[float]] = {float(q): [] for q in qs}
        errors: list[float] = []
        for c in range(self.channels):
            cum = np.cumsum(counts[c])
            n = int(cum[-1]) if len(cum) else 0
            errors.append(0.0 if self.exact else float(self.width[c]))
            for q in qs:
                if n == 0:
                    out[float(q)].append(float("nan"))
                    continue
                h = float(q) / 100.0 * (n - 1)  # numpy's virtual index and interpolation, rounding included
                k0 = math.floor(h)
                k1 = min(k0 + 1, n - 1)
                v0, v1 = self._order_stat(c, k0, cum, counts[c]), self._order_stat(c, k1, cum, counts[c])
                t, d = h - k0, v1 - v0
                v = v0 + d * t if t < 0.5 else v1 - d * (1.0 - t)
                out[float(q)].append(float(min(max(v, mn[c]), mx[c])))
        return out, errors

    def _order_stat(self, c: int, k: int, cum: np.ndarray, counts: np.ndarray) -> float:
        j = int(np.searchsorted(cum, k, side="right"))
        if self.exact:
            return float(self.offset + j)
        before = int(cum[j - 1]) if j > 0 else 0
        inside = (k - before + 0.5) / int(counts[j])
        return float(self.lo[c] + self.width[c] * (j + inside))


def _image_of(item: Any, key: str | int, i: int) -> tuple[Tensor, Tensor | None]:
    """The item's image, and where it is masked (a numpy masked array's mask), or ``None``."""
    if isinstance(item, Mapping):
        if key not in item:
            raise KeyError(f"compute_stats: item {i} has no {key!r} entry (keys: {sorted(map(str, item))})")
        image = item[key]
    elif isinstance(item, (Tensor, np.ndarray)):
        image = item
    elif isinstance(item, Sequence) and isinstance(key, int) and not isinstance(key, bool):
        image = item[key]
    else:
        raise TypeError(
            f"compute_stats: item {i} is a {type(item).__name__}; expected a sample dict, an image tensor, "
            "or a tuple with key=<position of the image>"
        )
    masked: Tensor | None = None
    if isinstance(image, np.ma.MaskedArray):
        if image.mask is not np.ma.nomask:
            masked = torch.from_numpy(np.ma.getmaskarray(image).copy())
        image = np.ma.getdata(image)
    if isinstance(image, np.ndarray):
        image = torch.from_numpy(image)
    if not isinstance(image, Tensor):
        raise TypeError(f"compute_stats: item {i}'s image is a {type(image).__name__}, not a tensor")
    if image.dim() not in (3, 4):
        raise ValueError(
            f"compute_stats: item {i}'s image has shape {tuple(image.shape)}; expected [C, H, W] or [B, C, H, W]"
        )
    if image.dtype == torch.bool or image.is_complex():
        raise TypeError(f"compute_stats: item {i}'s image has unsupported dtype {image.dtype}")
    return image, masked


def _geo_module() -> Any:
    """:mod:`pipekit.geo` if it is imported (it must be, for a geo dataset to exist), else ``None``."""
    return sys.modules.get("pipekit.geo")


def _provides(dataset: Any, key: str | int) -> bool:
    """Whether a leaf geo dataset's samples hold ``key`` (``"image"`` for images, ``"mask"`` for masks)."""
    is_image = getattr(dataset, "is_image", None)
    if is_image is None:
        return key == "image"
    return key == ("image" if is_image else "mask")


def _nodata_values(dataset: Any, key: str | int) -> set[float | None]:
    """The ``nodata`` of every leaf dataset of a composition that provides ``key``."""
    children = getattr(dataset, "datasets", None)
    if children:
        found: set[float | None] = set()
        for child in children:
            found |= _nodata_values(child, key)
        return found
    if not _provides(dataset, key):
        return set()
    value = getattr(dataset, "nodata", None)
    return {None if value is None else float(value)}


def _geo_nodata(dataset: Any, key: str | int) -> float | None:
    values = _nodata_values(dataset, key)
    if len(values) > 1:
        shown = sorted(values, key=lambda v: (v is None, v if v is not None else 0.0))
        raise ValueError(
            f"compute_stats: the datasets of {getattr(dataset, 'name', type(dataset).__name__)} that provide "
            f"{key!r} have different nodata values {shown}; pass nodata= (a number, or None for none)"
        )
    return next(iter(values), None)


def _geo_samples(dataset: Any, sampler: Iterable[Any], batch_type: type) -> Iterator[Any]:
    """``dataset[query]`` for each query of ``sampler`` (each query of each list, for a batch sampler)."""
    for drawn in sampler:
        queries = drawn if isinstance(sampler, batch_type) or isinstance(drawn, list) else (drawn,)
        for query in queries:
            yield dataset[query]


_AUTO = "auto"
_DEFAULT_SIZE = 256


def compute_stats(
    pipe: Iterable[Any],
    num_samples: int | None = None,
    *,
    key: str | int = "image",
    percentiles: Sequence[float] = (1.0, 99.0),
    bins: int = 16384,
    nodata: float | str | None = _AUTO,
    sampler: Iterable[Any] | None = None,
    size: float | tuple[float, float] | None = None,
    seed: int | None = 0,
    progress: bool = True,
) -> BandStats:
    """Per-band count, mean, std, min, max and percentiles of the images of a pipe or geo dataset, in one pass.

    Statistics are in the data's own units (never rescaled), the units
    :func:`pipekit.device.to_device` and :class:`~pipekit.transforms.Normalize`
    work in by default: ``to_device(batch, device, normalize=(stats.mean,
    stats.std))`` gives mean 0, std 1 (see the module docstring).

    Args:
        pipe: any iterable of samples ``{"image": [C, H, W]}``, batches
            ``{"image": [B, C, H, W]}``, image tensors (or numpy arrays;
            masked arrays leave their masked values out), or tuples (then
            pass ``key=`` the image's position).  Or a geo dataset
            (:class:`~pipekit.geo.GeoDataset`: a ``RasterDataset``, ``landsat &
            cdl``...): then patches drawn by ``sampler`` are read with
            ``dataset[query]``.
        num_samples: stop after this many samples (a batch counts as ``B``
            samples; only the samples needed are used).  ``None`` reads the
            whole pipe (for a geo dataset: the sampler's whole epoch; the
            default sampler's is as many patches as tile the dataset).
        key: the entry holding the image.
        percentiles: which percentiles (0..100) to estimate.
        bins: histogram bins per band for data that is not 8- or 16-bit
            integers (an even number >= 16); more bins, smaller error.
        nodata: a value to leave out, per band (as well as NaN and Inf).
            ``"auto"`` (default): a geo dataset's ``nodata`` (of the datasets
            of a composition that provide ``key``), nothing for other pipes.
            ``None``: leave out only NaN and Inf.
        sampler: geo datasets only: where to read patches (any geo sampler, or
            an iterable of queries).  Default: ``RandomGeoSampler(dataset,
            size, length=num_samples, seed=seed)``.
        size: geo datasets only: the default sampler's patch size in pixels
            (a number or ``(height, width)``; default 256).
        seed: geo datasets only: the default sampler's seed (default 0, so
            the statistics are the same every run; ``None`` draws from
            torch's global generator).
        progress: show a tqdm progress bar (samples read).

    Returns:
        a :class:`BandStats`; ``stats.normalize()`` builds the matching
        :class:`~pipekit.transforms.Normalize`.  Exactness: see the module
        docstring (mean/std exact, percentiles exact for 8/16-bit integers and
        otherwise within ``stats.percentile_error``).

    Example:
        >>> import torch
        >>> from pipekit.transforms import compute_stats
        >>> samples = [{"image": torch.full((2, 4, 4), float(i))} for i in range(4)]
        >>> stats = compute_stats(samples, percentiles=(50,), progress=False)
        >>> stats.mean, [round(s, 4) for s in stats.std], stats.num_samples
        ([1.5, 1.5], [1.118, 1.118], 4)

        On a geo dataset (here a 64 x 64 GeoTIFF whose nodata is 0):

        >>> import tempfile, numpy as np, rasterio
        >>> from affine import Affine
        >>> from pipekit.datasets import RasterDataset
        >>> root = tempfile.mkdtemp()
        >>> data = np.arange(1, 64 * 64 + 1, dtype="uint16").reshape(1, 64, 64)
        >>> data[:, :, :8] = 0
        >>> with rasterio.open(f"{root}/a.tif", "w", driver="GTiff", width=64, height=64, count=1, dtype="uint16",
        ...                    nodata=0, crs="EPSG:32615", transform=Affine(10, 0, 500000, 0, -10, 4000640)) as f:
        ...     f.write(data)
        >>> stats = compute_stats(RasterDataset(root, nodata=0), 8, size=32, progress=False)
        >>> stats.num_samples, stats.min[0] > 0
        (8, True)
    """
    if num_samples is not None and (
        isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1
    ):
        raise ValueError(f"compute_stats: num_samples must be a positive int or None, got {num_samples!r}")
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 16 or bins % 2:
        raise ValueError(f"compute_stats: bins must be an even int >= 16, got {bins!r}")
    qs = [float(q) for q in percentiles]
    bad = [q for q in qs if not 0.0 <= q <= 100.0]
    if bad:
        raise ValueError(f"compute_stats: percentiles must be within 0..100, got {bad}")
    geo = _geo_module()
    source_name = "the pipe"
    if geo is not None and isinstance(pipe, geo.GeoDataset):
        dataset = pipe
        source_name = f"the sampler of {dataset.name}"
        if isinstance(nodata, str) and nodata == _AUTO:
            nodata = _geo_nodata(dataset, key)
        if sampler is None:
            sampler = geo.RandomGeoSampler(
                dataset, size=_DEFAULT_SIZE if size is None else size, length=num_samples, seed=seed
            )
        elif size is not None:
            raise TypeError("compute_stats: size= sets the default sampler's patch size; with sampler=, leave it out")
        total = num_samples if num_samples is not None else _length(sampler)
        pipe = _geo_samples(dataset, sampler, geo.BatchGeoSampler)
    else:
        if sampler is not None or size is not None:
            raise TypeError(
                f"compute_stats: sampler= and size= apply to a geo dataset (pipekit.geo.GeoDataset), "
                f"not to a {type(pipe).__name__}"
            )
        if isinstance(nodata, str) and nodata == _AUTO:
            nodata = None
        total = num_samples
    if nodata is not None:
        if isinstance(nodata, bool) or not isinstance(nodata, (int, float)):
            raise TypeError(f"compute_stats: nodata must be a number, None or 'auto', got {nodata!r}")
        nodata = float(nodata)

    channels = 0
    first_dtype: torch.dtype | None = None
    hist: _Histogram | None = None
    n = mean = m2 = mn = mx = np.zeros(0)
    seen = 0
    bar = tqdm(total=total, desc="compute_stats", unit="sample", disable=not progress)
    try:
        for i, item in enumerate(pipe):
            image, masked = _image_of(item, key, i)
            if image.dim() == 3:
                image = image.unsqueeze(0)
                masked = None if masked is None else masked.unsqueeze(0)
            if num_samples is not None and seen + image.shape[0] > num_samples:
                image = image[: num_samples - seen]
                masked = None if masked is None else masked[: num_samples - seen]
            image = image.detach().cpu()
            if hist is None:
                channels, first_dtype = image.shape[1], image.dtype
                hist = _Histogram(channels, image.dtype, bins)
                n = np.zeros(channels)
                mean = np.zeros(channels)
                m2 = np.zeros(channels)
                mn = np.full(channels, np.inf)
                mx = np.full(channels, -np.inf)
            if image.shape[1] != channels:
                raise ValueError(f"compute_stats: item {i} has {image.shape[1]} bands, the first item had {channels}")
            if hist.exact and image.dtype != first_dtype:
                raise ValueError(
                    f"compute_stats: item {i} has dtype {image.dtype}, the first item had {first_dtype}; "
                    "exact integer histograms need one dtype"
                )
            x = image.transpose(0, 1).reshape(channels, -1)
            valid: Tensor | None = None
            if x.is_floating_point():
                valid = torch.isfinite(x)
            if nodata is not None and not math.isnan(nodata):
                ok = x != nodata
                valid = ok if valid is None else valid & ok
            if masked is not None:
                ok = ~masked.expand(image.shape).transpose(0, 1).reshape(channels, -1)
                valid = ok if valid is None else valid & ok
            xd = x.to(torch.float64)
            if valid is not None:
                nb = valid.sum(1).to(torch.float64)
                zeros = torch.zeros((), dtype=torch.float64)
                s = torch.where(valid, xd, zeros).sum(1)
                mb = s / nb.clamp(min=1)
                dev = torch.where(valid, xd - mb.view(-1, 1), zeros)
                bmin = torch.where(valid, xd, torch.tensor(math.inf, dtype=torch.float64)).amin(1)
                bmax = torch.where(valid, xd, torch.tensor(-math.inf, dtype=torch.float64)).amax(1)
            else:
                nb = torch.full((channels,), float(xd.shape[1]), dtype=torch.float64)
                mb = xd.mean(1)
                dev = xd - mb.view(-1, 1)
                bmin, bmax = xd.amin(1), xd.amax(1)
            m2b = (dev * dev).sum(1).numpy()
            nb_np, mb_np = nb.numpy(), mb.numpy()
            total = n + nb_np
            has = nb_np > 0
            delta = mb_np - mean
            safe_total = np.where(total > 0, total, 1.0)
            new_mean = np.where(has, mean + delta * nb_np / safe_total, mean)
            new_m2 = np.where(has, m2 + m2b + delta * delta * n * nb_np / safe_total, m2)
            n, mean, m2 = total, new_mean, new_m2
            bmin_np, bmax_np = bmin.numpy(), bmax.numpy()
            mn = np.minimum(mn, bmin_np)
            mx = np.maximum(mx, bmax_np)
            hist.update(x, valid, np.where(has, bmin_np, np.inf), np.where(has, bmax_np, -np.inf))
            seen += image.shape[0]
            bar.update(image.shape[0])
            if num_samples is not None and seen >= num_samples:
                break
    finally:
        bar.close()
    if hist is None:
        raise ValueError(f"compute_stats: {source_name} yielded no samples")
    if num_samples is not None and seen < num_samples:
        logger.warning("compute_stats: asked for %d samples, %s had only %d", num_samples, source_name, seen)
    count = [int(c) for c in n]
    nan = float("nan")
    std = [math.sqrt(m2[c] / n[c]) if n[c] > 0 else nan for c in range(channels)]
    pct, errors = hist.percentiles(qs, mn, mx)
    return BandStats(
        count=count,
        mean=[float(mean[c]) if n[c] > 0 else nan for c in range(channels)],
        std=std,
        min=[float(mn[c]) if n[c] > 0 else nan for c in range(channels)],
        max=[float(mx[c]) if n[c] > 0 else nan for c in range(channels)],
        percentiles=pct,
        percentile_error=errors,
        num_samples=seen,
    )
