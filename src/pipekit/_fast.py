"""The fast paths: where pipekit keeps a faster implementation beside the reference one, and the switch for each.

A fast path is a second implementation of something the reference path already does right, kept because a
benchmark shows it pays. Both stay alive: the reference path is what the fast one is tested against, and what a
user falls back to when a fast path is suspected of a bug. Each one is registered here with why it exists, what
its reference is and the benchmark that justifies it; the code asks :func:`enabled` at the branch point.

The registered ones (:data:`REGISTRY` holds the same with the reasons):

* ``tar_headers``: plain tar headers parsed by pipekit, small members read whole (reference: ``tarfile``;
  ``benchmarks/shards.py``).
* ``direct_image_ops``: crop and flips drawn from the stream's own generator, kernels called directly
  (reference: torchvision v2 transforms under a swap of torch's global RNG; ``benchmarks/shards.py``).
* ``warp``: a numpy warp for nearest and bilinear resampling (reference: GDAL's warper;
  ``benchmarks/geo_sampling.py``).
* ``concurrent_parts``: a sample's band files read at once on I/O threads (reference: one after another;
  ``benchmarks/geo_sampling.py``).
* ``lane_env``: an I/O thread keeps a remote file's GDAL environment entered (reference: entered and left
  around every open and read; ``benchmarks/geo_sampling.py --s3-variants``).
* ``fetch``: range-cache misses fetched with botocore's signer over http.client (reference: the fsspec
  filesystem; ``benchmarks/geo_sampling.py --s3-variants ... cached``).
* ``prefetch_tiles``: a window's missing tiles fetched together before GDAL decodes them (reference: fetched
  as GDAL asks for them; same benchmark).
* ``simplejpeg``: JPEGs without EXIF decoded by the optional ``simplejpeg`` package where it is installed
  (reference: torchvision's ``decode_jpeg`` operator; ``benchmarks/shards.py --decode-ab``).
* ``geo_batch``: a DataLoader batch of geo samples read straight into one tensor per key, which
  ``stack_samples`` returns without copying (reference: ``dataset[key]`` per sample, then ``torch.stack``;
  ``benchmarks/geo_sampling.py``).

Every fast path gives the same output as its reference: ``tests/test_fast.py`` runs each affected pipeline both
ways and compares them, and fails for a registered path without such a comparison.

Switches:

* ``PIPEKIT_FAST_PATHS=off`` in the environment (read at import) turns every fast path off, in the main process
  and in DataLoader workers (they inherit the environment, and forked ones the state too);
  ``PIPEKIT_FAST_PATHS=-warp,-fetch`` turns off the ones named.
* :func:`set_enabled` / :func:`disabled` switch one at run time (tests, benchmarks); a DataLoader's forked
  workers inherit the state at the time they start.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["REGISTRY", "FastPath", "disabled", "enabled", "set_enabled"]


@dataclass(frozen=True)
class FastPath:
    """One registered fast path: its name, why it exists, its reference path and the benchmark behind it."""

    name: str
    why: str
    reference: str
    benchmark: str


REGISTRY: dict[str, FastPath] = {
    p.name: p
    for p in (
        FastPath(
            "tar_headers",
            "tarfile's header parsing and member objects cost more than the decode of small images",
            "tarfile.TarFile iteration",
            "benchmarks/shards.py",
        ),
        FastPath(
            "direct_image_ops",
            "swapping torch's global RNG (fork_rng) and v2's dispatch cost more than the crop itself",
            "torchvision.transforms.v2 under the augment stream's fork of torch's RNG",
            "benchmarks/shards.py",
        ),
        FastPath(
            "warp",
            "GDAL's warper sets up a transformer per window; nearest and bilinear are a gather in numpy",
            "rasterio.warp.reproject",
            "benchmarks/geo_sampling.py",
        ),
        FastPath(
            "concurrent_parts",
            "a sample from an object store waits for its slowest band file, not for the sum of them",
            "the band files read one after another",
            "benchmarks/geo_sampling.py",
        ),
        FastPath(
            "lane_env",
            "entering rasterio.Env costs ~85 us, once per file opened and band read",
            "rasterio.Env entered and left around every open and read",
            "benchmarks/geo_sampling.py --s3-variants local vsi vsi-envs",
        ),
        FastPath(
            "fetch",
            "botocore's signer over http.client costs ~0.7 ms of CPU a ranged GET against s3fs's 2.1",
            "the fsspec filesystem's ranged reads",
            "benchmarks/geo_sampling.py --s3-variants local cached",
        ),
        FastPath(
            "simplejpeg",
            "simplejpeg's libjpeg-turbo build decodes a 320x256 JPEG in ~10% less CPU than torchvision's, same pixels",
            "torchvision's decode_jpeg operator",
            "benchmarks/shards.py --decode-ab",
        ),
        FastPath(
            "geo_batch",
            "new tensors per sample, then torch.stack's copy into a batch, cost half a warm patch's CPU at 0 workers",
            "dataset[key] per sample, then torch.stack",
            "benchmarks/geo_sampling.py",
        ),
        FastPath(
            "prefetch_tiles",
            "a window's missing tiles fetched in one go instead of one request per tile GDAL asks for",
            "tiles fetched on demand as GDAL reads them",
            "benchmarks/geo_sampling.py --s3-variants local cached",
        ),
    )
}

ENVIRONMENT_VARIABLE = "PIPEKIT_FAST_PATHS"


def _from_environment(value: str | None) -> dict[str, bool]:
    state = dict.fromkeys(REGISTRY, True)
    if not value:
        return state
    value = value.strip()
    if value.lower() in ("0", "off", "false", "no", "none"):
        return dict.fromkeys(REGISTRY, False)
    if value.lower() in ("1", "on", "true", "yes", "all"):
        return state
    for word in value.split(","):
        word = word.strip()
        if not word:
            continue
        on = not word.startswith("-")
        name = word.lstrip("+-")
        if name not in REGISTRY:
            raise ValueError(
                f"{ENVIRONMENT_VARIABLE}={value!r}: unknown fast path {name!r} (known: {', '.join(REGISTRY)}; "
                "'off' turns all off)"
            )
        state[name] = on
    return state


state: dict[str, bool] = _from_environment(os.environ.get(ENVIRONMENT_VARIABLE))


def enabled(name: str) -> bool:
    """Whether the fast path ``name`` is on (a KeyError names an unregistered one)."""
    return state[name]


def set_enabled(name: str, on: bool) -> None:
    """Turn the fast path ``name`` on or off in this process (and in DataLoader workers forked after this)."""
    if name not in REGISTRY:
        raise KeyError(f"unknown fast path {name!r} (known: {', '.join(REGISTRY)})")
    state[name] = bool(on)


@contextlib.contextmanager
def disabled(*names: str) -> Iterator[None]:
    """Run a block with the fast paths ``names`` (all of them when none is named) off."""
    names = names or tuple(REGISTRY)
    before = {name: enabled(name) for name in names}
    try:
        for name in names:
            set_enabled(name, False)
        yield
    finally:
        for name, on in before.items():
            set_enabled(name, on)
